"""Host launchers over the device functions: an MLP applied to every row of a matrix (per pixel).

    y = mlp_rows(x, spec.pack(weights, x.device), spec)   # x (rows, widths[0]) -> y (rows, widths[-1])

Import after setting TRITON_INTERPRET=1 to run on the CPU (Triton reads it when decorating).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import ShapeError
from .descriptor import PROGRAM
from .language import mlp_apply, mlp_load
from .spec import MLPSpec


@triton.jit
def _mlp_rows_kernel(x_ptr, w_ptr, y_ptr, rows, IN: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
                     MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr, MLP_P1: tl.constexpr, MLP_P2: tl.constexpr,
                     MLP_P3: tl.constexpr, MLP_P4: tl.constexpr, MLP_A0: tl.constexpr, MLP_A1: tl.constexpr,
                     MLP_A2: tl.constexpr, MLP_A3: tl.constexpr, MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr,
                     OUT_P: tl.constexpr, STAGES: tl.constexpr, EVEN: tl.constexpr):
    # Weights are loaded once per program; a grid smaller than the row blocks makes the programs
    # persistent, each looping over blocks pid, pid + programs, ...
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    i = tl.arange(0, BLOCK)[:, None]
    ci = tl.arange(0, MLP_P0)[None, :]
    co = tl.arange(0, OUT_P)[None, :]
    for block in tl.range(tl.program_id(0), tl.cdiv(rows, BLOCK), tl.num_programs(0), num_stages=STAGES):
        # 64-bit arithmetic only on the block's scalar start; per-element offsets stay int32.
        start = tl.cast(block, tl.int64) * BLOCK
        xb = x_ptr + start * IN
        yb = y_ptr + start * OUT
        # EVEN (rows a multiple of BLOCK) drops the row mask; without padding there is no column mask
        # either, so rows load and store as whole vectors.
        if EVEN:
            if IN == MLP_P0:
                x = tl.load(xb + i * IN + ci)
            else:
                x = tl.load(xb + i * IN + ci, mask=ci < IN, other=0.0)
        else:
            x = tl.load(xb + i * IN + ci, mask=(i < rows - start) & (ci < IN), other=0.0)
        y = mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, MLP_LAYERS, MLP_A0, MLP_A1, MLP_A2, MLP_A3, MLP_SCOPE,
                      MLP_REDUCED).to(y_ptr.dtype.element_ty)
        if EVEN:
            if OUT == OUT_P:
                tl.store(yb + i * OUT + co, y)
            else:
                tl.store(yb + i * OUT + co, y, mask=co < OUT)
        else:
            tl.store(yb + i * OUT + co, y, mask=(i < rows - start) & (co < OUT))


def launch_settings(spec: MLPSpec, device: torch.device | str) -> tuple[int, int, int | None, int]:
    """(rows per block, warps, programs or None for one per block, pipeline stages) for `spec` on `device`:
    the fastest settings of benchmarks/sweep_shader.py on an H200 (fp16, 1080p and 4K frames). A narrow
    network is bound by memory and wants plain programs of 256 rows; a wider one by its dots, and
    persistent programs (weights loaded once, the next block's rows prefetched) hide the loads behind them.
    """
    if spec.scope != PROGRAM:
        return 16, 4, None, 1
    if torch.device(device).type != "cuda":
        return 128, 4, None, 1
    widest = max(spec.padded[1:-1], default=spec.padded[-1])
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if widest <= 16:
        return 256, 4, None, 1
    if widest <= 64:
        return 128, 4, 8 * sms, 3
    return 64, 4, 16 * sms, 3


def mlp_rows(x: torch.Tensor, packed: torch.Tensor, spec: MLPSpec, *, block: int | None = None,
             num_warps: int = 4, programs: int | None = None, stages: int = 1,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """`spec` applied to each row of the contiguous (rows, widths[0]) `x`; the result has x's dtype.

    Without `block`, every setting comes from `launch_settings` (measured). Otherwise: `block` rows per
    step; `programs` caps the grid (persistent programs, weights loaded once each; default one program
    per block); `stages` > 1 lets Triton prefetch the next block's rows.
    """
    if x.dim() != 2 or x.shape[1] != spec.widths[0] or not x.is_contiguous():
        raise ShapeError(f"mlp_rows: expected contiguous inputs (rows, {spec.widths[0]}), got {tuple(x.shape)}")
    if packed.dtype != spec.dtype or packed.numel() != spec.packed_numel or packed.device != x.device:
        raise ShapeError(f"mlp_rows: expected {spec.packed_numel} packed {spec.dtype} weights on {x.device} "
                         f"(spec.pack), got {packed.numel()} {packed.dtype} on {packed.device}")
    if block is None:
        block, num_warps, programs, stages = launch_settings(spec, x.device)
    if spec.scope == PROGRAM and block < 16:
        raise ShapeError(f"mlp_rows: program scope needs at least 16 rows per program, got block={block}")
    rows = x.shape[0]
    if out is None:
        out = torch.empty((rows, spec.widths[-1]), dtype=x.dtype, device=x.device)
    blocks = triton.cdiv(rows, block)
    _mlp_rows_kernel[(max(1, min(blocks, programs or blocks)),)](
        x, packed, out, rows, IN=spec.widths[0], OUT=spec.widths[-1], BLOCK=block, OUT_P=spec.padded[-1],
        STAGES=stages, EVEN=rows % block == 0, num_warps=num_warps, **spec.constexprs("MLP_"))
    return out
