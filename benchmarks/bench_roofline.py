"""Roofline per kernel of a transformer MLP block, beside PyTorch eager and torch.compile.

    python benchmarks/bench_roofline.py --json roofline.json             # CUDA, transformer sizes
    python benchmarks/bench_roofline.py --device cpu --quick             # CPU, small sizes

The block (layer norm, a projection with bias and GeLU, a second projection, a residual add, a softmax over
the features) is compiled once; `Executable.profile` gives each step's time, bytes and FLOPs from the IR,
achieved bandwidth and FLOP/s as fractions of the device's measured copy bandwidth and bfloat16 matrix
throughput, sorted by the time left on the table. The whole block is also timed (CUDA-event medians after
warm-up) for StitchML, PyTorch eager and torch.compile, after a check against PyTorch in float64.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402


def torch_block(x, w1, b1, w2):
    h = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (x.shape[-1],)) @ w1 + b1, approximate="tanh")
    return torch.softmax(x + h @ w2, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    device = args.device
    tokens, width, dtype = (64, 32, torch.float32) if args.quick else (8192, 1024, torch.bfloat16)
    reps = 5 if args.quick else 30
    gen = torch.Generator().manual_seed(0)
    feeds_t = [torch.randn(tokens, width, generator=gen), torch.randn(width, 4 * width, generator=gen) / width ** 0.5,
               torch.randn(4 * width, generator=gen) * 0.1, torch.randn(4 * width, width, generator=gen) / (2 * width)]
    feeds_t = [t.to(device=device, dtype=dtype) for t in feeds_t]
    sdt = sm.as_dtype(dtype)
    g = sm.Graph("mlp")
    x, w1, b1, w2 = (g.placeholder(tuple(t.shape), sdt, name=n) for t, n in zip(feeds_t, ("x", "w1", "b1", "w2")))
    h = g.gelu(g.layer_normalization(x) @ w1 + b1, approximate="tanh")
    y = g.softmax(x + h @ w2)
    feeds = dict(zip((x, w1, b1, w2), feeds_t))
    exe = g.compile(feeds, [y], device=device)
    got = exe.run(feeds)[y].torch()
    ref = torch_block(*[t.double() for t in feeds_t])
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
    report = exe.profile(feeds, repeats=reps)
    compiled = torch.compile(torch_block)
    totals = {"stitchml": median_ms(lambda: exe.run(feeds), device, reps),
              "torch eager": median_ms(lambda: torch_block(*feeds_t), device, reps),
              "torch.compile": median_ms(lambda: compiled(*feeds_t), device, reps)}
    print(f"{tokens} tokens x {width} features, {str(dtype).replace('torch.', '')}, {device}")
    print(report)
    print("whole block, median ms: " + ", ".join(f"{k} {v:.4f}" for k, v in totals.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": report.device, "tokens": tokens, "width": width, "dtype": str(dtype),
                       "copy_bytes_per_s": report.copy_bytes_per_s, "matmul_flops_per_s": report.matmul_flops_per_s,
                       "steps": report.rows, "block_ms": totals}, f, indent=1)


if __name__ == "__main__":
    main()
