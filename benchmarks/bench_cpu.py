"""The native CPU backend against PyTorch eager and torch.compile on the CPU, in one process.

    python benchmarks/bench_cpu.py --json results/bench_cpu.json
    python benchmarks/bench_cpu.py --quick            # small sizes, a check that it runs

Workloads (the CPU backend's targets): GeLU built from primitives at 1M and 16M float32 elements, with
the machine's copy bandwidth (a large `clone`, bytes read + written) beside it; softmax, layer norm and an
RMSNorm written from primitives at 4096 x 1024; the digit classifier's training step (the demo's network,
Adam) at batch 64 and 128, against eager and a torch.compile'd network (`--only training`: that alone).
Every StitchML result is checked against PyTorch first. Times are medians of
wall-clock calls after warm-up, contenders interleaved round by round so that a busy machine slows them
alike; all use the same number of threads (`--threads`, default: every core). On a machine other work
shares, `--threads 1 --clock thread` times the calling thread's CPU time instead of the wall clock.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import stitchml as sm  # noqa: E402
from stitchml.demos import mnist  # noqa: E402

F = torch.nn.functional


CLOCK = time.perf_counter  # --clock thread: time.thread_time


def timed(contenders: dict, rounds: int, warmup: int = 2) -> dict:
    """Median ms per contender, calls interleaved round by round."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    times = {k: [] for k in contenders}
    for _ in range(rounds):
        for name, fn in contenders.items():
            t = CLOCK()
            fn()
            times[name].append((CLOCK() - t) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def compiled(fn, args, no_compile: bool):
    """torch.compile of `fn`, compiled now (its compile time apart), or None."""
    if no_compile:
        return None, None
    c = torch.compile(fn)
    t = time.perf_counter()
    c(*args)
    return c, time.perf_counter() - t


def torch_step(net, optimizer, images: torch.Tensor, labels: torch.Tensor):
    """One PyTorch training step of `net` (cross-entropy, `optimizer`) on fixed data, as a callable."""
    def run():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(images), labels)
        loss.backward()
        optimizer.step()
        return loss
    return run


def compiled_step(net: torch.nn.Module, optimizer, images: torch.Tensor, labels: torch.Tensor):
    """A training step whose network is torch.compile'd, compiled now (the first step, its compile time apart)."""
    run = torch_step(torch.compile(net), optimizer, images, labels)
    t = time.perf_counter()
    run()
    return run, time.perf_counter() - t


def row_ops(args, only: tuple = ()) -> list[dict]:
    n_rows, width = (256, 256) if args.quick else (4096, 1024)
    x = torch.randn(n_rows, width)
    out = []
    cases = {
        "softmax": (lambda g, t: g.softmax(t, axis=-1), lambda t: torch.softmax(t, -1)),
        "layer norm": (lambda g, t: g.layer_normalization(t), lambda t: F.layer_norm(t, (width,))),
        "rms norm": (lambda g, t: t * g.reverse_square_root(g.reduction_mean(t * t, axes=-1, keep_dims=True) + 1e-6),
                     lambda t: t * torch.rsqrt((t * t).mean(-1, keepdim=True) + 1e-6)),
    }
    for name, (build, ref) in cases.items():
        if only and name not in only:
            continue
        g = sm.Graph()
        p = g.placeholder((n_rows, width), name="x")
        y = build(g, p)
        exe = g.compile({p: sm.TensorType((n_rows, width), sm.float32)}, [y], device="cpu")
        feeds = {p: sm.TensorData(x)}
        got = exe.run(feeds)[y].torch()
        err = ((got.double() - ref(x.double())).norm() / ref(x.double()).norm()).item()
        contenders = {"stitchml": lambda: exe.run(feeds), "torch eager": lambda: ref(x)}
        c, compile_s = compiled(ref, (x,), args.no_compile)
        if c is not None:
            contenders["torch.compile"] = lambda: c(x)
        ms = timed(contenders, args.rounds)
        out.append({"workload": f"{name} {n_rows}x{width}", "rel_err": err, "kernels": exe.kernel_count,
                    "backends": sorted({s.kind for s in exe.steps}), "ms": ms, "torch_compile_s": compile_s,
                    "bytes": 2 * x.numel() * 4})
    return out


def gelu(args) -> list[dict]:
    out = []
    for n in ((1 << 16,) if args.quick else (1 << 20, 1 << 24)):
        x = torch.randn(n)
        g = sm.Graph()
        p = g.placeholder((n,), name="x")
        y = 0.5 * p * (1.0 + g.erf(p * 0.7071067811865476))
        exe = g.compile({p: sm.TensorType((n,), sm.float32)}, [y], device="cpu")
        feeds = {p: sm.TensorData(x)}

        def ref(t):
            return 0.5 * t * (1.0 + torch.erf(t * 0.7071067811865476))

        got = exe.run(feeds)[y].torch()
        err = ((got.double() - ref(x.double())).norm() / ref(x.double()).norm()).item()
        contenders = {"stitchml": lambda: exe.run(feeds), "torch eager": lambda: ref(x), "torch gelu": lambda: F.gelu(x),
                      "copy": lambda: x.clone()}
        c, compile_s = compiled(ref, (x,), args.no_compile)
        if c is not None:
            contenders["torch.compile"] = lambda: c(x)
        ms = timed(contenders, args.rounds)
        out.append({"workload": f"gelu {n}", "rel_err": err, "kernels": exe.kernel_count, "ms": ms,
                    "torch_compile_s": compile_s, "bytes": 2 * n * 4,
                    "copy_gb_s": 2 * n * 4 / ms["copy"] / 1e6, "stitchml_gb_s": 2 * n * 4 / ms["stitchml"] / 1e6})
    return out


class TorchClassifier(torch.nn.Module):
    """The digit classifier of stitchml.demos.mnist, in PyTorch, with the same weights."""

    def __init__(self, model: mnist.Classifier, flat: int):
        super().__init__()
        values = [torch.from_numpy(model.graph.variable_value(v).numpy().copy()) for v in model.parameters]
        self.params = torch.nn.ParameterList([torch.nn.Parameter(v) for v in values])
        self.flat = flat

    def forward(self, x):
        w1, b1, w2, b2, d1, e1, d2, e2 = self.params
        h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1.reshape(-1), padding="same")), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, w2, b2.reshape(-1), padding="same")), 2)
        return F.relu(h.reshape(-1, self.flat) @ d1 + e1) @ d2 + e2


def training(args) -> list[dict]:
    out = []
    shape = (1, 8, 8) if args.quick else (1, 28, 28)
    flat = 32 * (shape[1] // 4) * (shape[2] // 4)
    for batch in ((16,) if args.quick else (64, 128)):
        model = mnist.build(shape, 10, seed=0, learning_rate=1e-3)
        torch_model = TorchClassifier(model, flat)
        opt = torch.optim.Adam(torch_model.parameters(), 1e-3)
        compiled_model = TorchClassifier(model, flat)  # its own copy of the weights and of Adam's state
        compiled_opt = torch.optim.Adam(compiled_model.parameters(), 1e-3)
        rng = np.random.default_rng(0)
        images = rng.random((batch, *shape), dtype=np.float32)
        labels = rng.integers(0, 10, batch).astype(np.int64)
        exe = model.graph.compile({model.images: sm.TensorType((batch, *shape), sm.float32),
                                   model.labels: sm.TensorType((batch,), sm.int64)}, [model.loss], model.updates,
                                  device="cpu")
        feeds = {model.images: sm.TensorData(torch.from_numpy(images)), model.labels: sm.TensorData(torch.from_numpy(labels))}
        ti, tl = torch.from_numpy(images), torch.from_numpy(labels)

        first_ours = exe.run(feeds)[model.loss].item()
        eager_step = torch_step(torch_model, opt, ti, tl)
        first_torch = eager_step().item()
        contenders = {"stitchml": lambda: exe.run(feeds), "torch eager": eager_step}
        # torch.compile of the network (forward and, through AOTAutograd, backward); Adam's step stays eager
        c, compile_s = (None, None) if args.no_compile else compiled_step(compiled_model, compiled_opt, ti, tl)
        if c is not None:
            contenders["torch.compile"] = c
        ms = timed(contenders, args.rounds)
        out.append({"workload": f"digit classifier step {shape[1]}x{shape[2]} batch {batch}",
                    "first_loss": [first_ours, first_torch], "kernels": exe.kernel_count,
                    "backends": sorted({s.kind for s in exe.steps}), "ms": ms, "torch_compile_s": compile_s})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--clock", choices=["wall", "thread"], default="wall",
                   help="thread: the calling thread's CPU time (with --threads 1 all the work runs there), which "
                        "other work on a shared machine disturbs far less than the wall clock")
    p.add_argument("--only", choices=["gelu", "rows", "softmax", "training"], action="append",
                   help="run only these workloads (repeatable; default: all; softmax: the rows' softmax alone)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    if args.clock == "thread":
        if args.threads != 1:
            p.error("--clock thread needs --threads 1 (other threads' time is not the calling thread's)")
        global CLOCK
        CLOCK = time.thread_time
    if args.quick:
        args.rounds = 3
    torch.set_num_threads(args.threads)
    os.environ.pop("TRITON_INTERPRET", None)  # the native backend, not Triton's interpreter
    parts = {"gelu": gelu, "rows": row_ops, "softmax": lambda a: row_ops(a, ("softmax",)), "training": training}
    if args.only and "rows" in args.only:
        args.only = [o for o in args.only if o != "softmax"]  # rows includes it
    rows = [r for name, part in parts.items() if not args.only or name in args.only for r in part(args)]
    print(f"{'workload':44} {'stitchml':>10} {'eager':>10} {'compile':>10}   ms; x eager, x compile")
    for r in rows:
        ms = r["ms"]
        eager = ms["torch eager"]
        comp = ms.get("torch.compile")
        extra = f"  copy {ms['copy']:.3f} ms, {r['stitchml_gb_s']:.1f} of {r['copy_gb_s']:.1f} GB/s" if "copy" in ms else ""
        print(f"{r['workload']:44} {ms['stitchml']:10.3f} {eager:10.3f} {comp if comp else float('nan'):10.3f}   "
              f"{eager / ms['stitchml']:.2f}x, {comp / ms['stitchml'] if comp else float('nan'):.2f}x{extra}")
    env = {"machine": platform.processor() or platform.machine(), "cores": os.cpu_count(), "threads": args.threads,
           "clock": args.clock,
           "torch": torch.__version__, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=1)
    bad = [r["workload"] for r in rows if r.get("rel_err", 0) > 1e-5]
    if bad:
        print("FAIL: results differ from PyTorch:", ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
