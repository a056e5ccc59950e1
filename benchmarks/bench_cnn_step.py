"""The CNN training step (bench_targets.py's) with the Triton convolution template against cuDNN, per step.

    python benchmarks/bench_cnn_step.py --json cnn_step.json            # H200: about 90 s
    python benchmarks/bench_cnn_step.py --device cpu --quick             # a smoke run (Triton's interpreter)

For IEEE float32 and for `allow_tf32`, the step compiled with option `conv_template` "measure" (the
default: per convolution the fastest of cuDNN and the template's variants, measured on the first run),
"library" (cuDNN and a generated epilogue) and "triton" (codegen/convolution.py wherever it applies):
its loss against float64, the median step time (CUDA events, CUDA-graph replay), every measured
choice with each candidate's time and, with `--profile`, the slowest steps (each timed alone) and every GPU
kernel of the replayed step (torch.profiler: µs per step, their sum against the step's time). Then
the template's launch blocks for the two forward convolutions alone, and PyTorch eager. The script
stops starting new work after `--budget` seconds; every row is written to the JSON as it comes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402
from bench_distributed import TorchCNN, cnn_graph, cnn_weights  # noqa: E402

ROWS: list[dict] = []


def record(path: str | None, row: dict) -> None:
    ROWS.append(row)
    print(" ".join(f"{k}={v}" for k, v in row.items() if k not in ("steps", "choices", "gpu_kernels")), flush=True)
    for step, choice in row.get("choices", {}).items():
        print(f"     {step}: {choice}", flush=True)
    if row.get("steps"):
        total = sum(s["ms"] for s in row["steps"])
        print(f"     sum of steps {total:.4f} ms over {len(row['steps'])} steps", flush=True)
    for k in row.get("gpu_kernels", []):
        print(f"     {k['us']:9.2f} us  x{k.get('per_step', '')}  {k['kernel']}", flush=True)
    for s in row.get("steps", [])[:40]:
        print(f"     {s['ms']:8.4f} ms  {s['kind']:12} {s['step']}  {s.get('chosen') or ''}", flush=True)
    if path:
        env = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}
        with open(path, "w") as f:
            json.dump({"environment": env, "rows": ROWS}, f, indent=1, default=str)


def step_rows(exe, feeds) -> list[dict]:
    report = exe.profile(feeds, repeats=3)
    chosen = {s.name: getattr(s.run, "chosen", None) for s in exe.steps}
    rows = [{"step": r["step"], "kind": r["kind"], "ms": r["ms"], "chosen": chosen.get(r["step"])}
            for r in report.rows]
    return sorted(rows, key=lambda r: -r["ms"])


def kernel_rows(exe, feeds, replays: int = 10) -> list[dict]:
    """Every GPU kernel of the replayed step (torch.profiler over `replays` runs): µs per step by kernel name,
    slowest first, after a row "all kernels" with their sum (the step's time less this is launch gaps)."""
    from torch.profiler import ProfilerActivity, profile

    exe.run(feeds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            exe.run(feeds)
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0 and e.count >= replays:
            rows.append({"kernel": e.key[:90], "us": round(us / replays, 2), "per_step": e.count // replays})
    rows.sort(key=lambda r: -r["us"])
    return [{"kernel": "all kernels", "us": round(sum(r["us"] for r in rows), 2), "per_step": len(rows)}] + rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--profile", action="store_true", help="also time every step of each executable")
    p.add_argument("--blocks", action="store_true", help="also the template's launch blocks, layer by layer")
    p.add_argument("--modes", nargs="+", default=["measure", "library", "triton"])
    p.add_argument("--budget", type=float, default=95.0, help="seconds after which no new case starts")
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    started = time.perf_counter()
    batch = 2 if args.quick else 1024
    reps = 3 if args.quick else 30
    weights = cnn_weights(np.random.default_rng(0))
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(batch, 1, 28, 28, generator=gen).to(dev)
    ys = torch.randint(0, 10, (batch,), generator=gen).to(dev)
    reference = torch.nn.functional.cross_entropy(TorchCNN(weights).double()(xs.cpu().double()), ys.cpu()).item()
    cases = [(tf32, mode) for tf32 in (True, False) for mode in args.modes]
    for tf32, mode in cases:
        if time.perf_counter() - started > args.budget:
            break
        name = f"stitchml {'tf32' if tf32 else 'ieee'} conv_template={mode}"
        try:
            g, x, y, loss, steps = cnn_graph(weights, batch, None)
            t0 = time.perf_counter()
            exe = g.compile({x: sm.TensorType(tuple(xs.shape), sm.float32), y: sm.TensorType(tuple(ys.shape), sm.int64)},
                            [loss], steps, device=str(dev), options={"allow_tf32": tf32, "conv_template": mode})
            feeds = {x: xs, y: ys}
            first = exe.run(feeds)[loss].item()
            err = abs(first - reference) / abs(reference)
            assert err < (1e-2 if tf32 else 1e-4), (name, first, reference)
            ms = median_ms(lambda: exe.run(feeds), dev, reps)
            row = {"case": name, "ms": round(ms, 4), "loss_rel_err": f"{err:.1e}",
                   "compile_s": round(time.perf_counter() - t0, 1), "kernels": exe.kernel_count,
                   "replay": exe._graph_state is not None}
            # every measured choice: what it kept and what each candidate took when measured (ms)
            row["choices"] = {s.name: {"chosen": s.run.chosen, **{k: round(v, 4) for k, v in s.run.timings.items()},
                                       **{f"{k} failed": v[:200] for k, v in s.run.failures.items()}}
                              for s in exe.steps if getattr(s.run, "chosen", None)}
            if args.profile and dev.type == "cuda":
                row["steps"] = step_rows(exe, feeds)
                try:
                    row["gpu_kernels"] = kernel_rows(exe, feeds)
                except Exception as e:  # noqa: BLE001  (the profiler is optional; the step times stand)
                    row["gpu_kernels"] = [{"kernel": f"profiler failed: {type(e).__name__}: {e}"[:200], "us": 0}]
            record(args.json, row)
        except Exception as e:  # noqa: BLE001  (one failing case must not lose the others' figures)
            record(args.json, {"case": name, "failed": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
    if args.blocks:
        layer_blocks(dev, batch, reps, args, started)
    if time.perf_counter() - started < args.budget:
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            model = TorchCNN(weights).to(dev)
            opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)

            def step():
                opt.zero_grad(set_to_none=True)
                lo = torch.nn.functional.cross_entropy(model(xs), ys)
                lo.backward()
                opt.step()
                return lo

            err = abs(step().item() - reference) / abs(reference)
            record(args.json, {"case": "torch eager tf32", "ms": round(median_ms(step, dev, reps), 4),
                               "loss_rel_err": f"{err:.1e}"})
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


def layer_blocks(dev, batch, reps, args, started) -> None:
    """conv + bias + ReLU (and the ReLU's mask, as the training step keeps it) alone, per launch blocks."""
    layers = [((batch, 1, 28, 28), 32, [(128, 32, 16, 4, 1), (256, 32, 16, 8, 1), (64, 32, 16, 4, 1)]),
              ((batch, 32, 14, 14), 64, [(128, 64, 32, 4, 3), (128, 64, 32, 8, 3), (64, 64, 32, 4, 3),
                                         (128, 32, 32, 4, 3), (256, 64, 32, 8, 3)])]
    for shape, cout, variants in layers:
        rng = torch.Generator().manual_seed(1)
        a = torch.randn(shape, generator=rng).to(dev)
        wt = (torch.randn(cout, shape[1], 3, 3, generator=rng) * 0.1).to(dev)
        bias = torch.randn(cout, generator=rng).to(dev)
        want = torch.relu(torch.nn.functional.conv2d(a.double(), wt.double(), bias.double(), padding=1))
        for tf32 in (True, False):
            for blocks in [None] + variants:
                if time.perf_counter() - started > args.budget:
                    return
                g = sm.Graph()
                x = g.placeholder(shape, sm.float32, name="x")
                w = g.placeholder(tuple(wt.shape), sm.float32, name="w")
                b = g.placeholder((cout,), sm.float32, name="b")
                pre = g.convolution2d(x, w, sm.Convolution2DDescriptor(padding="same")) + g.reshape(b, (1, cout, 1, 1))
                out, mask = g.relu(pre), pre > 0.0
                options = {"allow_tf32": tf32, "conv_template": "library" if blocks is None else "triton"}
                if blocks is not None:
                    options["conv_blocks"] = blocks
                feeds = {x: a, w: wt, b: bias}
                name = f"conv {shape}->{cout} {'tf32' if tf32 else 'ieee'} {blocks or 'cuDNN + epilogue'}"
                try:
                    exe = g.compile(feeds, [out, mask], device=str(dev), options=options)
                    got = exe.run(feeds)[out].torch().double()
                    err = float((got - want).norm() / want.norm())
                    ms = median_ms(lambda: exe.run(feeds), dev, reps)
                    record(args.json, {"case": name, "ms": round(ms, 4), "rel_err": f"{err:.1e}"})
                except Exception as e:  # noqa: BLE001
                    record(args.json, {"case": name, "failed": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"})


if __name__ == "__main__":
    sys.exit(main())
