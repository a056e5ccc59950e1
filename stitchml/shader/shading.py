"""A shading kernel that decodes a neural material per pixel: it samples two quantized latent grids
bilinearly, runs the decoder MLP in registers and writes shading-ready channels (base color, unit
normal, roughness). The example of `language.mlp` inside a user's own kernel, used by
`stitchml demo neural-materials` and benchmarks/bench_shader.py.

Import after setting TRITON_INTERPRET=1 to run on the CPU (Triton reads it when decorating).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import ShapeError
from .language import mlp_apply, mlp_load
from .spec import MLPSpec

CHANNELS = 8  # written per texel: base color RGB, normal xyz, roughness, zero


@triton.jit
def _taps(py, px, extent, scale):
    """Texel indices of the four bilinear taps of a grid `extent` texels wide at pixel centres (half-pixel
    convention, edges repeat), and the weights along y and x."""
    fy = (py + 0.5) * scale - 0.5
    fx = (px + 0.5) * scale - 0.5
    y0f = tl.floor(fy)
    x0f = tl.floor(fx)
    y0 = tl.minimum(tl.maximum(y0f.to(tl.int32), 0), extent - 1)
    x0 = tl.minimum(tl.maximum(x0f.to(tl.int32), 0), extent - 1)
    y1 = tl.maximum(tl.minimum(y0f.to(tl.int32) + 1, extent - 1), 0)
    x1 = tl.maximum(tl.minimum(x0f.to(tl.int32) + 1, extent - 1), 0)
    return y0 * extent + x0, y0 * extent + x1, y1 * extent + x0, y1 * extent + x1, fy - y0f, fx - x0f


@triton.jit
def _shade_kernel(lat_ptr, w_ptr, out_ptr, size, coarse_offset, BLOCK: tl.constexpr, C_FINE: tl.constexpr,
                  C_COARSE: tl.constexpr, LEVELS: tl.constexpr, MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr,
                  MLP_P1: tl.constexpr, MLP_P2: tl.constexpr, MLP_P3: tl.constexpr, MLP_P4: tl.constexpr,
                  MLP_A0: tl.constexpr, MLP_A1: tl.constexpr, MLP_A2: tl.constexpr, MLP_A3: tl.constexpr,
                  MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr, OUT_P: tl.constexpr):
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    for block in tl.range(tl.program_id(0), tl.cdiv(size * size, BLOCK), tl.num_programs(0)):
        t = block * BLOCK + tl.arange(0, BLOCK)  # int32: 64-bit division is slow on the GPU
        texel = t < size * size
        py = (t // size).to(tl.float32)
        px = (t % size).to(tl.float32)
        # Input channel c comes from the fine grid (size/2) or the coarse one (size/4): taps and weights
        # are computed once per grid and texel, then picked per channel.
        f00, f01, f10, f11, fwy, fwx = _taps(py, px, size // 2, 0.5)
        c00, c01, c10, c11, cwy, cwx = _taps(py, px, size // 4, 0.25)
        c = tl.arange(0, MLP_P0)[None, :]
        fine = c < C_FINE
        live = texel[:, None] & (c < C_FINE + C_COARSE)
        fc = c
        cc = coarse_offset + c - C_FINE
        v00 = tl.load(lat_ptr + tl.where(fine, f00[:, None] * C_FINE + fc, c00[:, None] * C_COARSE + cc), mask=live,
                      other=0).to(tl.float32)
        v01 = tl.load(lat_ptr + tl.where(fine, f01[:, None] * C_FINE + fc, c01[:, None] * C_COARSE + cc), mask=live,
                      other=0).to(tl.float32)
        v10 = tl.load(lat_ptr + tl.where(fine, f10[:, None] * C_FINE + fc, c10[:, None] * C_COARSE + cc), mask=live,
                      other=0).to(tl.float32)
        v11 = tl.load(lat_ptr + tl.where(fine, f11[:, None] * C_FINE + fc, c11[:, None] * C_COARSE + cc), mask=live,
                      other=0).to(tl.float32)
        wx = tl.where(fine, fwx[:, None], cwx[:, None])
        wy = tl.where(fine, fwy[:, None], cwy[:, None])
        top = v00 + (v01 - v00) * wx
        bottom = v10 + (v11 - v10) * wx
        x = (top + (bottom - top) * wy) * (1.0 / LEVELS)
        y = mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, MLP_LAYERS, MLP_A0, MLP_A1, MLP_A2, MLP_A3, MLP_SCOPE,
                      MLP_REDUCED)
        # Decoder outputs: r, g, b, normal x, normal y, roughness; the normal's z is rebuilt and the normal made unit.
        co = tl.arange(0, OUT_P)[None, :]
        nx = tl.sum(tl.where(co == 3, y, 0.0), axis=1)
        ny = tl.sum(tl.where(co == 4, y, 0.0), axis=1)
        rough = tl.sum(tl.where(co == 5, y, 0.0), axis=1)
        nz = tl.sqrt(tl.maximum(1.0 - nx * nx - ny * ny, 0.0))
        inv = 1.0 / tl.maximum(tl.sqrt(nx * nx + ny * ny + nz * nz), 1e-8)
        unit = tl.where(co == 3, nx[:, None], tl.where(co == 4, ny[:, None], nz[:, None])) * inv[:, None]
        clamped = tl.minimum(tl.maximum(tl.where(co < 3, y, rough[:, None]), 0.0), 1.0)
        out = tl.where((co < 3) | (co == 6), clamped, tl.where((co >= 3) & (co < 6), unit, 0.0))
        tl.store(out_ptr + t[:, None].to(tl.int64) * 8 + co, out.to(out_ptr.dtype.element_ty),
                 mask=texel[:, None] & (co < 8))


def shade(latents: torch.Tensor, packed: torch.Tensor, size: int, fine: int, coarse: int, levels: int,
          spec: MLPSpec, *, block: int = 128, num_warps: int = 4, programs: int | None = None,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode every texel of a size x size material: (size * size, 8) [r, g, b, nx, ny, nz, roughness, 0].

    `latents` (int8, flat) holds the fine grid (size/2, size/2, fine) then the coarse grid
    (size/4, size/4, coarse), channels last, as integers in [-levels, levels]; `packed` is
    `spec.pack(...)` of a decoder taking fine + coarse inputs and giving 6 outputs. `programs` caps the
    grid: persistent programs load the decoder once and loop over blocks of `block` texels.
    """
    n_fine, n_coarse = (size // 2) ** 2 * fine, (size // 4) ** 2 * coarse
    if size % 4 or latents.dim() != 1 or latents.numel() != n_fine + n_coarse:
        raise ShapeError(f"shade: expected a flat latent buffer of {n_fine} + {n_coarse} elements for size {size}, "
                         f"got {tuple(latents.shape)}")
    if spec.widths[0] != fine + coarse or spec.widths[-1] != 6:
        raise ShapeError(f"shade: expected a decoder from {fine + coarse} inputs to 6 outputs, got {spec}")
    if out is None:
        out = torch.empty((size * size, CHANNELS), dtype=torch.float32, device=latents.device)
    blocks = triton.cdiv(size * size, block)
    _shade_kernel[(max(1, min(blocks, programs or blocks)),)](
        latents, packed, out, size, n_fine, BLOCK=block, C_FINE=fine, C_COARSE=coarse, LEVELS=levels,
        OUT_P=spec.padded[-1], num_warps=num_warps, **spec.constexprs("MLP_"))
    return out
