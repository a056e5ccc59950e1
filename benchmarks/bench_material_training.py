"""Training throughput of the neural material (texels per second): StitchML's training graph of
`stitchml demo neural-materials` against the same model in PyTorch eager and torch.compile, and in
JAX (jax.jit of the whole step) where JAX is installed.

    $ PYTHONPATH=$PWD python benchmarks/bench_material_training.py --json material_training.json   # CUDA
    $ PYTHONPATH=$PWD TRITON_INTERPRET=1 python benchmarks/bench_material_training.py --device cpu --quick

One training step: both latent grids quantized (noise of one step, as in the first part of training;
rounding costs the same), upsampled bilinearly to every texel, the 10->32->6 decoder, mean squared
error against the material, backward, Adam on latents and decoder. Every contender starts from the
same values; before timing, three steps with straight-through rounding (deterministic) are run in
each and their losses compared with StitchML's ("loss rel. diff"). Times: median of one step between
CUDA events after warm-up (host work included: a training loop pays it; JAX's step blocks until it
is done, so the events bracket its wall time), wall time on the CPU. texels/s = texels per step /
step time. About a minute on an H200 (sizes 1024 and 2048).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX, if present, must leave PyTorch memory


def step_time(fn, device: str, warmup: int, reps: int) -> float:
    """Median seconds of one `fn()` after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


class TorchMaterial:
    """The demo's training step in PyTorch from `values`: both latent grids, then the decoder's weights and
    biases (the initial values of a StitchML training graph)."""

    def __init__(self, values: list[np.ndarray], layout, target: torch.Tensor, weights: np.ndarray,
                 device: str) -> None:
        self.params = [torch.tensor(v, device=device, requires_grad=True) for v in values]
        self.layout, self.target = layout, target
        self.weights = torch.from_numpy(weights).to(device)
        self.optimizer = torch.optim.Adam(self.params, lr=0.05)

    def loss(self, noise: torch.Tensor) -> torch.Tensor:
        L, s = self.layout.levels, self.layout.size
        grids = []
        for v in self.params[:2]:
            c = v.clamp(-1.0, 1.0)
            jitter = (torch.rand(v.shape, device=v.device) - 0.5) / L
            rounding = ((c * L).round() / L - c).detach()
            q = c + noise * jitter + (1.0 - noise) * rounding
            grids.append(torch.nn.functional.interpolate(q[None], size=(s, s), mode="bilinear", align_corners=False)[0])
        h = torch.cat(grids).reshape(-1, s * s).T
        decoder = self.params[2:]
        for i, act in enumerate(self.layout.spec.activations):
            h = h @ decoder[2 * i] + decoder[2 * i + 1]
            if act == "relu":
                h = torch.relu(h)
        return ((h - self.target) ** 2 * self.weights).mean()

    def stepper(self, loss_fn):
        def step(lr: float, noise: torch.Tensor) -> torch.Tensor:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(noise)
            loss.backward()
            self.optimizer.step()
            return loss
        return step


def jax_stepper(values: list[np.ndarray], layout, target: np.ndarray, weights: np.ndarray, device: str):
    """The same step in JAX (jit of loss, gradients and Adam), or None without JAX; the returned
    function blocks until its step is done, so it is timed like the others."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    where = jax.devices("cpu" if device == "cpu" else None)[0]
    L, s, acts = layout.levels, layout.size, layout.spec.activations

    def loss_fn(params, noise, key):
        grids = []
        for i, v in enumerate(params[:2]):
            c = jnp.clip(v, -1.0, 1.0)
            jitter = (jax.random.uniform(jax.random.fold_in(key, i), v.shape) - 0.5) / L
            rounding = jax.lax.stop_gradient(jnp.round(c * L) / L - c)
            q = c + noise * jitter + (1.0 - noise) * rounding
            grids.append(jax.image.resize(q, (v.shape[0], s, s), method="linear"))
        h = jnp.concatenate(grids).reshape(-1, s * s).T
        for i, act in enumerate(acts):
            h = h @ params[2 + 2 * i] + params[3 + 2 * i]
            if act == "relu":
                h = jax.nn.relu(h)
        return jnp.mean((h - goal) ** 2 * jnp.asarray(weights))

    @jax.jit
    def step(state, lr, noise, count):
        params, m, v = state
        loss, grads = jax.value_and_grad(loss_fn)(params, noise, jax.random.fold_in(jax.random.PRNGKey(0), count))
        t = (count + 1).astype(jnp.float32)
        m = [0.9 * a + 0.1 * g for a, g in zip(m, grads)]
        v = [0.999 * a + 0.001 * g * g for a, g in zip(v, grads)]
        params = [p - lr * (a / (1 - 0.9 ** t)) / (jnp.sqrt(b / (1 - 0.999 ** t)) + 1e-8)
                  for p, a, b in zip(params, m, v)]
        return (params, m, v), loss

    goal = jax.device_put(target, where)
    params = [jax.device_put(x, where) for x in values]
    state = [(params, [jnp.zeros_like(x) for x in params], [jnp.zeros_like(x) for x in params]), 0]

    def run(noise: float):
        state[0], loss = step(state[0], 0.05, noise, state[1])
        state[1] += 1
        return loss.block_until_ready()

    return run


def bench_size(size: int, device: str, warmup: int, reps: int, compile_torch: bool, use_jax: bool) -> dict:
    from stitchml.demos import neural_materials as nm

    layout = nm.Layout(size)
    material = nm.make_material(size)
    target = torch.from_numpy(material.targets().reshape(-1, nm.OUTPUTS)).to(device)
    t = nm.training_graph(layout, seed=0)
    weights = nm.output_weights(nm.WEIGHTS)  # the loss weights the graph was built with
    start = [t.graph.variable_value(v).numpy() for v in [t.fine, t.coarse] + t.net.parameters]
    eager = TorchMaterial(start, layout, target, weights, device)
    compiled = TorchMaterial(start, layout, target, weights, device) if compile_torch else None
    feeds = {t.target: target, t.learning_rate: np.float32(0.05), t.noise: np.float32(0.0)}

    def stitchml_step(noise: float):
        feeds[t.noise] = np.float32(noise)
        return t.graph.run(feeds, [t.loss], t.updates, device=device)[t.loss]

    rounding, noisy = torch.zeros((), device=device), torch.ones((), device=device)
    eager_step = eager.stepper(eager.loss)
    contenders = {"stitchml": stitchml_step,
                  "torch eager": lambda noise: eager_step(0.05, noisy if noise else rounding)}
    if compiled is not None:
        compiled_step = compiled.stepper(torch.compile(compiled.loss))
        contenders["torch.compile"] = lambda noise: compiled_step(0.05, noisy if noise else rounding)
    jax_step = jax_stepper(start, layout, target.cpu().numpy(), weights, device) if use_jax else None
    if jax_step is not None:
        contenders["jax.jit"] = jax_step
    # Same start, three deterministic steps each: the losses must agree before the times mean anything.
    losses = {name: [float(fn(0.0).item()) for _ in range(3)] for name, fn in contenders.items()}
    row = {"size": size, "texels": size * size,
           "layout": f"{layout.fine}@/2 + {layout.coarse}@/4, {layout.spec.widths}"}
    for name, fn in contenders.items():
        seconds = step_time(lambda: fn(1.0), device, warmup, reps)
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses[name], losses["stitchml"]))
        row[name] = {"step_ms": seconds * 1e3, "texels_per_s": size * size / seconds, "loss_rel_diff": diff,
                     "losses": losses[name]}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="one small material, few steps (to check the script)")
    parser.add_argument("--sizes", type=int, nargs="+", help="texels per side (default 1024 2048; quick: 32)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--no-jax", action="store_true", help="leave JAX out")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu --quick")
    sizes = args.sizes or ([32] if args.quick else [1024, 2048])
    warmup, reps = (1, 3) if args.quick else (5, 20)
    env = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
           "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}
    print(env, flush=True)
    rows = []
    print(f"{'size':>6} {'contender':<14} {'step ms':>9} {'texels/s':>10} {'vs eager':>9} {'loss rel. diff':>15}")
    for size in sizes:
        row = bench_size(size, args.device, warmup, reps, compile_torch=not args.no_compile, use_jax=not args.no_jax)
        rows.append(row)
        base = row["torch eager"]["step_ms"]
        for name in ("stitchml", "torch eager", "torch.compile", "jax.jit"):
            if name in row:
                r = row[name]
                print(f"{size:>6} {name:<14} {r['step_ms']:>9.3f} {r['texels_per_s']:>10.3g} "
                      f"{base / r['step_ms']:>8.2f}x {r['loss_rel_diff']:>15.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=1)
    # Adam's first steps move by about the learning rate whatever a gradient's size, so float rounding
    # shows in the losses; a different model would differ by far more than 1e-2.
    bad = [(r["size"], n) for r in rows for n in ("torch eager", "torch.compile", "jax.jit")
           if n in r and not r[n]["loss_rel_diff"] < 1e-2]
    if bad:
        print(f"losses disagree with StitchML's: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
