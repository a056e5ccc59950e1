"""Attention written from primitives, softmax(Q Kᵀ/√d) V, against SDPA, torch.compile and JAX.

    python benchmarks/bench_attention.py --json attention.json      # CUDA, float16, the three shapes below
    python benchmarks/bench_attention.py --device cpu --quick       # CPU, small sizes
    python benchmarks/bench_attention.py --no-one-rounding          # without the split=False forward timings
    python benchmarks/bench_attention.py --shape 1,8,16384,64       # one shape (B,H,L,d; repeatable, in order)

Per shape, causal and not, forward and forward+backward (gradients of sum(O * dO) with respect to Q, K
and V): StitchML compiles the formula from primitives (the attention pass fuses the forward into one
kernel, and a training step's backward into two), F.scaled_dot_product_attention with the flash
backend, torch.compile of the same formula in PyTorch, and JAX (jax.nn.dot_product_attention under
jit) when it imports. The forward is also timed with `options={"attention_split": False}`
(probabilities rounded once to float16, one product fewer per tile). Medians of CUDA-event timings
after warm-up (the wall clock on the CPU, block_until_ready for JAX). StitchML's forward is checked
against SDPA in float32 first; the steps it launches are counted.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with PyTorch here

import torch  # noqa: E402
import torch.nn.attention  # noqa: E402  (sdpa_kernel, to pin the flash backend)
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402

SHAPES = [(4, 16, 1024, 64), (2, 16, 4096, 128), (1, 8, 16384, 64)]
QUICK = [(1, 2, 64, 16)]


def formula(q, k, v, causal: bool):
    """The primitive formula in PyTorch (what torch.compile gets)."""
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def stitch_graph(shape, dtype, causal: bool, device: str, backward: bool, options: dict | None = None):
    """(executable, feeds, outputs) of the formula built from primitives."""
    g = sm.Graph("attention")
    sdt = sm.as_dtype(dtype)
    q, k, v = (g.placeholder(shape, sdt, name=n) for n in "qkv")
    s = g.matrix_multiplication(q, g.transpose(k, 2, 3)) * (1 / math.sqrt(shape[-1]))
    if causal:
        n = shape[-2]
        s = s + g.constant(torch.full((n, n), float("-inf"), dtype=dtype).triu(1))
    o = g.matrix_multiplication(g.softmax(s, axis=-1), v)
    gen = torch.Generator().manual_seed(0)
    feeds = {t: torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for t in (q, k, v)}
    outs = [o]
    if backward:
        do = g.placeholder(shape, sdt, name="do")
        feeds[do] = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
        grads = g.gradients(g.reduction_sum(o * do), [q, k, v])
        outs += [grads[q], grads[k], grads[v]]
    return g.compile(feeds, outs, device=device, options=options), feeds, outs


def jax_runner(shape, causal: bool, backward: bool):
    """A zero-argument function that runs JAX's attention once and waits, or None without JAX."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    b, h, n, d = shape
    key = jax.random.PRNGKey(0)
    q, k, v, do = (jax.random.normal(jax.random.fold_in(key, i), (b, n, h, d), jnp.float16) for i in range(4))

    def fwd(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal)

    if backward:  # dO an argument, not a constant that XLA would fold at compile time (seconds at 4k)
        step = jax.jit(jax.grad(lambda q, k, v, do: jnp.sum(fwd(q, k, v).astype(jnp.float32) * do),
                                argnums=(0, 1, 2)))
        return lambda: jax.block_until_ready(step(q, k, v, do))
    fn = jax.jit(fwd)
    return lambda: jax.block_until_ready(fn(q, k, v))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--one-rounding", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the forward with attention_split=False (one more compile per row)")
    ap.add_argument("--shape", action="append", default=None, help="B,H,L,d (repeatable; default: SHAPES)")
    args = ap.parse_args(argv)
    device = args.device
    dtype = torch.float16 if device == "cuda" else torch.float32
    shapes = QUICK if args.quick else [tuple(int(n) for n in s.split(",")) for s in args.shape] if args.shape \
        else SHAPES
    reps = 3 if args.quick else 10
    compiled = torch.compile(formula, dynamic=True) if device == "cuda" else None
    rows = []
    env = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "dtype": str(dtype)}
    cols = ["stitchml_ms", "stitchml_one_rounding_ms", "sdpa_ms", "torch_compile_ms", "torch_eager_formula_ms",
            "jax_ms"]
    print(f"attention, {str(dtype).replace('torch.', '')}, {device}; median ms")
    print(f"{'shape':>20} {'causal':>6} {'pass':>7} {'steps':>5} " + " ".join(f"{c[:-3][:14]:>14}" for c in cols)
          + "  x SDPA", flush=True)

    def show(r: dict) -> None:
        cells = " ".join(f"{r[c]:14.4f}" if c in r else f"{'-':>14}" for c in cols)
        print(f"{str(tuple(r['shape'])):>20} {str(r['causal']):>6} {r['pass']:>7} {r['stitchml_steps']:>5} {cells}"
              f"  {r['stitchml_ms'] / r['sdpa_ms']:.2f}", flush=True)

    def save() -> None:  # after every row: what a time limit cuts short is kept
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"environment": env, "results": rows}, f, indent=1)

    for shape in shapes:
        for causal in (False, True):
            for backward in (False, True):
                exe, feeds, outs = stitch_graph(shape, dtype, causal, device, backward)
                q, k, v = (feeds[t] for t in list(feeds)[:3])
                kernels = sum(1 for s in exe.steps if s.kind not in ("view",))
                fused = any(s.kind == "attention" for s in exe.steps)
                row = {"shape": list(shape), "causal": causal, "pass": "fwd+bwd" if backward else "fwd",
                       "stitchml_steps": kernels, "fused": fused}
                if not backward:
                    got = exe.run(feeds)[outs[0]].torch().float()
                    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
                    row["max_error_vs_sdpa_fp32"] = (got - want).abs().max().item()
                tq, tk, tv = (t.detach().clone().requires_grad_(backward) for t in (q, k, v))
                do = feeds[list(feeds)[3]] if backward else None

                def torch_run(fn):
                    def run():
                        o = fn(tq, tk, tv)
                        if backward:
                            torch.autograd.grad(o, (tq, tk, tv), do)
                    return run

                def sdpa(a, b, c):
                    if device != "cuda":
                        return F.scaled_dot_product_attention(a, b, c, is_causal=causal)
                    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                        return F.scaled_dot_product_attention(a, b, c, is_causal=causal)

                row["stitchml_ms"] = median_ms(lambda: exe.run(feeds), device, reps)
                if not backward and args.one_rounding:  # the probabilities rounded once (as FlashAttention does)
                    once, once_feeds, _ = stitch_graph(shape, dtype, causal, device, False, {"attention_split": False})
                    row["stitchml_one_rounding_ms"] = median_ms(lambda: once.run(once_feeds), device, reps)
                    once = once_feeds = None
                row["sdpa_ms"] = median_ms(torch_run(sdpa), device, reps)
                row["torch_eager_formula_ms"] = median_ms(torch_run(lambda a, b, c: formula(a, b, c, causal)), device, reps)
                if compiled is not None:
                    row["torch_compile_ms"] = median_ms(torch_run(lambda a, b, c: compiled(a, b, c, causal)), device, reps)
                jax_fn = jax_runner(shape, causal, backward) if device == "cuda" else None
                if jax_fn is not None:
                    row["jax_ms"] = median_ms(jax_fn, "cpu", reps)  # wall clock around block_until_ready
                rows.append(row)
                show(row)
                save()
                exe = feeds = outs = None  # free the arena before the next compile
                if device == "cuda":
                    torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
