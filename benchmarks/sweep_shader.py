"""Sweep of launch settings and load/store variants for `mlp_rows` on one GPU (what chose its defaults).

    $ PYTHONPATH=$PWD python benchmarks/sweep_shader.py        # needs CUDA; prints one table

Variants: "rows" is `stitchml.shader.kernels.mlp_rows` (int32 element offsets, no masks when the rows
fill whole blocks; "default" is its `launch_settings`); "bptr" loads and stores through
`tl.make_block_ptr`, one program per block (host tensor descriptors, i.e. TMA, measured no faster in
an earlier run). Settings: rows per block x warps, and /pN sS for N persistent programs per SM with
S pipeline stages. Each variant is checked against the float64 reference before it is timed; times
are GPU time per call from CUDA-graph replays (bench_shader.median_us).
"""
from __future__ import annotations

import sys

import numpy as np
import torch
import triton
import triton.language as tl

from bench_shader import RESOLUTIONS, median_us
from stitchml.shader import MLPSpec
from stitchml.shader.kernels import mlp_rows
from stitchml.shader.language import mlp_apply, mlp_load

SHAPES = [((16, 64, 16), ("relu", "none")), ((16, 64, 64, 8), ("relu", "relu", "none")),
          ((16, 16, 16), ("relu", "none")), ((16, 32, 16), ("relu", "none"))]
ROWS_SETTINGS = [(64, 4, None, 1), (128, 4, None, 1), (128, 8, None, 1), (256, 4, None, 1), (256, 8, None, 1),
                 (512, 8, None, 1), (128, 4, 4, 2), (128, 4, 8, 1), (128, 4, 8, 3), (256, 8, 4, 3), (256, 4, 4, 3),
                 (256, 4, 8, 3), (64, 4, 16, 3), (128, 4, 16, 3)]
OTHER_SETTINGS = [(128, 4, None, 1), (256, 8, None, 1), (256, 4, None, 1)]


@triton.jit
def _bptr_kernel(x_ptr, w_ptr, y_ptr, rows, IN: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
                 MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr, MLP_P1: tl.constexpr, MLP_P2: tl.constexpr,
                 MLP_P3: tl.constexpr, MLP_P4: tl.constexpr, MLP_A0: tl.constexpr, MLP_A1: tl.constexpr,
                 MLP_A2: tl.constexpr, MLP_A3: tl.constexpr, MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr,
                 OUT_P: tl.constexpr):
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    start = tl.program_id(0) * BLOCK
    xp = tl.make_block_ptr(x_ptr, (rows, IN), (IN, 1), (start, 0), (BLOCK, MLP_P0), (1, 0))
    x = tl.load(xp, boundary_check=(0, 1), padding_option="zero")
    y = mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, MLP_LAYERS, MLP_A0, MLP_A1, MLP_A2, MLP_A3, MLP_SCOPE,
                  MLP_REDUCED)
    yp = tl.make_block_ptr(y_ptr, (rows, OUT), (OUT, 1), (start, 0), (BLOCK, OUT_P), (1, 0))
    tl.store(yp, y.to(y_ptr.dtype.element_ty), boundary_check=(0, 1))


def launchers(spec, x, packed, y):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = x.shape[0]
    yield "rows default", lambda: mlp_rows(x, packed, spec, out=y)  # launch_settings
    for block, warps, per_sm, stages in ROWS_SETTINGS:
        name = f"rows {block}x{warps}w" + (f"/p{per_sm}s{stages}" if per_sm else "")
        yield name, lambda b=block, w=warps, p=per_sm, s=stages: mlp_rows(
            x, packed, spec, block=b, num_warps=w, programs=p and p * sms, stages=s, out=y)
    for block, warps, _, _ in OTHER_SETTINGS:
        yield f"bptr {block}x{warps}w", lambda b=block, w=warps: _bptr_kernel[(triton.cdiv(rows, b),)](
            x, packed, y, rows, IN=spec.widths[0], OUT=spec.widths[-1], BLOCK=b, OUT_P=spec.padded[-1],
            num_warps=w, **spec.constexprs("MLP_"))


def main() -> int:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for widths, acts in SHAPES:
        spec = MLPSpec(widths, acts, "float16", "program")
        rng = np.random.default_rng(0)
        weights = [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
                   for a, b in zip(widths, widths[1:])]
        packed = spec.pack(weights, "cuda")
        for res, rows in RESOLUTIONS.items():
            x = torch.randn(rows, widths[0], device="cuda", dtype=torch.float16)
            y = torch.empty(rows, widths[-1], device="cuda", dtype=torch.float16)
            src = torch.empty(rows * (widths[0] + widths[-1]) // 4, device="cuda", dtype=torch.float32)
            dst = torch.empty_like(src)
            copy = median_us(lambda: dst.copy_(src))
            idx = torch.cat([torch.arange(2048, device="cuda"), torch.arange(rows - 2048, rows, device="cuda")])
            ref = spec.reference(x[idx].double(), weights)
            results = []
            for name, call in launchers(spec, x, packed, y):
                try:
                    y.fill_(float("nan"))
                    call()
                    err = (y[idx].double() - ref).abs().max().item()
                    if not err < 1e-2:
                        print(f"  {name}: WRONG (max err {err})")
                        continue
                    results.append((median_us(call), name))
                except Exception as e:  # noqa: BLE001  (a failed variant is reported, the sweep goes on)
                    print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            results.sort()
            print(f"{'->'.join(map(str, widths))} {res}: copy {copy:.1f} us; " + "; ".join(
                f"{n} {t:.1f} ({copy / t:.0%})" for t, n in results[:6]), flush=True)
            print("   others: " + ", ".join(f"{n} {t:.0f}" for t, n in results[6:]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
