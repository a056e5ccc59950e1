"""Shape buckets on a stream of variable sizes: compiles and total time.

A stream of runs with random batch sizes (1-512) and sequence lengths (1-1024) goes through one small
attention-like block (layer norm, a projection, GeLU, a softmax over the sequence, a weighted sum over the
sequence), run by:

* StitchML with shape buckets (batch and length rounded up to the bucket edges, one executable per bucket);
* StitchML without buckets (one executable per distinct shape);
* torch.compile(dynamic=True);
* PyTorch eager (no compiles: the floor for the host work).

Each contender gets the same stream and a time budget; one that runs out of budget stops and its total is
projected from the runs it made (marked "projected"). Every 50th run is checked against PyTorch eager in
float64.

    python benchmarks/bench_buckets.py --json buckets.json            # CUDA, 1,000 runs
    python benchmarks/bench_buckets.py --device cpu --quick           # CPU, small sizes, a short stream
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402


def stream(n: int, max_batch: int, max_length: int, seed: int = 0) -> list[tuple[int, int]]:
    rng = np.random.default_rng(seed)
    return [(int(b), int(s)) for b, s in zip(rng.integers(1, max_batch + 1, n), rng.integers(1, max_length + 1, n))]


def torch_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[-1],)) @ w)
    return (torch.softmax(h, 1) * h).sum(1)


def stitch_block(width: int):
    g = sm.Graph("block")
    x = g.placeholder((-1, -1, width), sm.float32, name="x")
    w = g.placeholder((width, width), sm.float32, name="w")
    h = g.gelu(g.layer_normalization(x) @ w)
    return g, x, w, g.reduction_sum(g.softmax(h, 1) * h, 1)


def run_stream(name: str, step, sizes, inputs, budget: float, check, device: str) -> dict:
    """Run `step(x, w)` over the stream until done or out of budget; wall time including compiles."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    done, error = 0, ""
    try:
        for i, (b, s) in enumerate(sizes):
            x, w = inputs(b, s)
            out = step(x, w)
            if i % 50 == 0:
                check(out, x, w, f"{name} run {i} ({b}x{s})")
            done += 1
            if time.perf_counter() - start > budget:
                break
    except Exception as e:  # noqa: BLE001  (a contender that fails is reported, the others still run)
        error = f"{type(e).__name__}: {e}"[:200]
    sync()
    elapsed = time.perf_counter() - start
    total = elapsed if done == len(sizes) or not done else elapsed / done * len(sizes)
    return {"contender": name, "runs": done, "of": len(sizes), "seconds": elapsed, "total_seconds": total,
            "projected": done < len(sizes), "error": error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes and a short stream (CPU check)")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--budget", type=float, default=15.0, help="seconds per contender before projecting")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = args.device
    width, max_batch, max_length, runs = (8, 16, 32, min(args.runs, 40)) if args.quick else (64, 512, 1024, args.runs)
    batch_edges = [max_batch // 8, max_batch // 4, max_batch // 2, max_batch]
    length_edges = [max_length // 8, max_length // 4, max_length // 2, max_length]
    sizes = stream(runs, max_batch, max_length)
    gen = torch.Generator(device="cpu").manual_seed(0)
    w = (torch.randn(width, width, generator=gen) / width ** 0.5).to(device)

    def inputs(b, s):
        return torch.randn(b, s, width, device=device), w

    def check(out, x, w_, what):
        ref = torch_block(x.double(), w_.double())
        got = out.torch() if isinstance(out, sm.TensorData) else out
        torch.testing.assert_close(got.double(), ref, rtol=1e-3, atol=1e-3, msg=lambda m: f"{what}: {m}")

    rows = []
    for label, buckets in (("stitchml buckets", True), ("stitchml no buckets", False)):
        g, x, wp, y = stitch_block(width)
        spec = {x: {0: batch_edges, 1: length_edges}} if buckets else None

        def step(xv, wv, g=g, x=x, wp=wp, y=y, spec=spec):
            return g.run({x: xv, wp: wv}, [y], device=device, compiled=True, buckets=spec)[y]

        row = run_stream(label, step, sizes, inputs, args.budget, check, device)
        row["compiles"] = sum(line.startswith("compiled") for line in g.compile_log)
        rows.append(row)
    torch._dynamo.reset()
    compiled = torch.compile(torch_block, dynamic=True)
    counters = torch._dynamo.utils.counters
    row = run_stream("torch.compile dynamic", compiled, sizes, inputs, args.budget, check, device)
    row["compiles"] = int(counters["stats"]["unique_graphs"])
    rows.append(row)
    row = run_stream("torch eager", torch_block, sizes, inputs, args.budget, check, device)
    row["compiles"] = 0
    rows.append(row)

    print(f"{runs} runs, batch 1-{max_batch}, length 1-{max_length}, width {width}, device {device}; "
          f"buckets: batch {batch_edges}, length {length_edges}")
    print(f"{'contender':24} {'runs':>9} {'compiles':>9} {'total s':>10}  note")
    for r in rows:
        note = ("projected from the runs made; " if r["projected"] else "") + r["error"]
        print(f"{r['contender']:24} {r['runs']:>5}/{r['of']:<3} {r['compiles']:>9} {r['total_seconds']:>10.2f}  {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "runs": runs, "width": width, "batch_edges": batch_edges,
                       "length_edges": length_edges, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
