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

from ..errors import DataError, ShapeError
from . import shading_fast
from .language import mlp_apply, mlp_load
from .spec import MLPSpec

CHANNELS = 8  # written per texel: base color RGB, normal xyz, roughness, zero


def default_group(block: int, num_warps: int) -> int:
    """Texels the word kernel samples together by default (`shade`'s group): the most, of 1, 2 and 4,
    that leave a group per thread. Fewer groups than threads would repeat each group's work on several
    threads and move it through shared memory (sm_90 SASS from Triton 3.6, before the half conversion:
    582 instructions a texel for fours at 256 texels x 4 warps, against 304 for pairs, 358 for single
    texels, 240 for fours at 2 warps; with it, pairs at 4 warps 256, fours at 2 warps 214)."""
    return max(g for g in (1, 2, 4) if g == 1 or block // g >= 32 * num_warps)


@triton.jit
def _taps(py, px, rows, cols, scale):
    """Texel indices of the four bilinear taps of a (rows, cols) grid at pixel centres (half-pixel
    convention, edges repeat), and the weights along y and x."""
    fy = (py + 0.5) * scale - 0.5
    fx = (px + 0.5) * scale - 0.5
    y0f = tl.floor(fy)
    x0f = tl.floor(fx)
    y0 = tl.minimum(tl.maximum(y0f.to(tl.int32), 0), rows - 1)
    x0 = tl.minimum(tl.maximum(x0f.to(tl.int32), 0), cols - 1)
    y1 = tl.maximum(tl.minimum(y0f.to(tl.int32) + 1, rows - 1), 0)
    x1 = tl.maximum(tl.minimum(x0f.to(tl.int32) + 1, cols - 1), 0)
    return y0 * cols + x0, y0 * cols + x1, y1 * cols + x0, y1 * cols + x1, fy - y0f, fx - x0f


@triton.jit
def _shading_channels(y, OUT_P: tl.constexpr):
    """The 8 written channels (BLOCK, 8) from the decoder's (BLOCK, OUT_P) float32 outputs r, g, b,
    normal x, normal y, roughness: colour and roughness clamped to [0, 1], the normal's z rebuilt and
    the normal made unit (a normal whose xy is longer than 1 gets z = 0 and is scaled to unit)."""
    co = tl.arange(0, OUT_P)[None, :]
    nx = tl.sum(tl.where(co == 3, y, 0.0), axis=1)
    ny = tl.sum(tl.where(co == 4, y, 0.0), axis=1)
    rough = tl.sum(tl.where(co == 5, y, 0.0), axis=1)
    nz = tl.sqrt(tl.maximum(1.0 - nx * nx - ny * ny, 0.0))
    inv = 1.0 / tl.maximum(tl.sqrt(nx * nx + ny * ny + nz * nz), 1e-8)
    unit = tl.where(co == 3, nx[:, None], tl.where(co == 4, ny[:, None], nz[:, None])) * inv[:, None]
    clamped = tl.minimum(tl.maximum(tl.where(co < 3, y, rough[:, None]), 0.0), 1.0)
    return tl.where((co < 3) | (co == 6), clamped, tl.where((co >= 3) & (co < 6), unit, 0.0))


@triton.jit
def _shade_kernel(lat_ptr, w_ptr, out_ptr, height, width, coarse_offset, BLOCK: tl.constexpr, C_FINE: tl.constexpr,
                  C_COARSE: tl.constexpr, LEVELS: tl.constexpr, MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr,
                  MLP_P1: tl.constexpr, MLP_P2: tl.constexpr, MLP_P3: tl.constexpr, MLP_P4: tl.constexpr,
                  MLP_A0: tl.constexpr, MLP_A1: tl.constexpr, MLP_A2: tl.constexpr, MLP_A3: tl.constexpr,
                  MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr, OUT_P: tl.constexpr):
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    for block in tl.range(tl.program_id(0), tl.cdiv(height * width, BLOCK), tl.num_programs(0)):
        t = block * BLOCK + tl.arange(0, BLOCK)  # int32: 64-bit division is slow on the GPU
        texel = t < height * width
        py = (t // width).to(tl.float32)
        px = (t % width).to(tl.float32)
        # Input channel c comes from the fine grid (size/2) or the coarse one (size/4): taps and weights
        # are computed once per grid and texel, then picked per channel.
        f00, f01, f10, f11, fwy, fwx = _taps(py, px, height // 2, width // 2, 0.5)
        c00, c01, c10, c11, cwy, cwx = _taps(py, px, height // 4, width // 4, 0.25)
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
        out = _shading_channels(y, OUT_P)
        co = tl.arange(0, OUT_P)[None, :]
        tl.store(out_ptr + t[:, None].to(tl.int64) * 8 + co, out.to(out_ptr.dtype.element_ty),
                 mask=texel[:, None] & (co < 8))


def check_latents(latents: torch.Tensor, levels: int) -> None:
    """Raise `DataError` unless `latents` is an integer tensor whose values all lie in [-levels, levels]."""
    if latents.dtype != torch.int8:
        raise DataError(f"shade: expected int8 latents, got {latents.dtype}")
    if latents.numel():
        low, high = (int(v) for v in torch.aminmax(latents))
        if low < -levels or high > levels:
            raise DataError(f"shade: latents must lie in [-{levels}, {levels}] (levels={levels}), "
                            f"found values from {low} to {high}")


def shade(latents: torch.Tensor, packed: torch.Tensor, size: int | tuple[int, int], fine: int, coarse: int,
          levels: int, spec: MLPSpec, *, block: int | None = None, num_warps: int | None = None,
          programs: int | None = None,
          stages: int = 1, out: torch.Tensor | None = None, packed_store: bool | None = None,
          group: int | None = None, check_range: bool = True) -> torch.Tensor:
    """Decode every texel of a material `size` texels square, or (height, width):
    (height * width, 8) [r, g, b, nx, ny, nz, roughness, 0], row by row.

    `latents` (int8, flat) holds the fine grid (height/2, width/2, fine) then the coarse grid
    (height/4, width/4, coarse), channels last, as integers in [-levels, levels]; `packed` is
    `spec.pack(...)` of a decoder taking fine + coarse inputs and giving 6 outputs. `programs` caps the
    grid: persistent programs load the decoder once and loop over blocks of `block` texels (default
    256 on the fast path, else 128), prefetching with `stages` pipeline stages (the fast kernel only).
    On the fast path the defaults are the fastest measured on an H200 at 3840x2160 (`tune_shader.py`):
    256 texels (`block`), 8 programs per multiprocessor on CUDA (`programs`), and 4 warps when `levels`
    is at most 8, else 2 (`num_warps`; 4 off the fast path), with the group `default_group` gives:
    pairs of texels at 4 warps (119 µs against 130 µs for the previous kernel's best), fours at 2
    warps (131 µs). When both channel counts are multiples of 4 and the decoder's padded widths allow
    (`shading_fast.fits`), the latents are read as 32-bit words and filtered as integers
    (`shading_fast.shade_words_kernel`); the results are the same. There, half-precision outputs are
    stored two channels to a 32-bit word (`packed_store`, default: when `out` is float16), and when
    `block` divides the width, `group` (2 or 4; 1 turns it off; default `default_group`) consecutive
    texels are sampled together, sharing the latent columns they fall between. Latents are expected
    within [-levels, levels]; with levels at most 8 the fast path converts the filtered sums to the
    decoder's halves two at a time and relies on it, so `check_range` (default) reads the latents' least
    and greatest values first and raises `DataError` for a latent outside the range (one small
    reduction and a wait for its result); a caller that decodes the same latents every frame checks
    them once (`check_latents`) and passes `check_range=False`.
    """
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    n_fine, n_coarse = (height // 2) * (width // 2) * fine, (height // 4) * (width // 4) * coarse
    if height % 4 or width % 4 or height < 4 or width < 4 or latents.dim() != 1 \
            or latents.numel() != n_fine + n_coarse:
        raise ShapeError(f"shade: expected a flat latent buffer of {n_fine} + {n_coarse} elements for a "
                         f"{height}x{width} material (extents multiples of 4), got {tuple(latents.shape)}")
    if spec.widths[0] != fine + coarse or spec.widths[-1] != 6:
        raise ShapeError(f"shade: expected a decoder from {fine + coarse} inputs to 6 outputs, got {spec}")
    if check_range:
        check_latents(latents, levels)
    texels = height * width
    if out is None:
        out = torch.empty((texels, CHANNELS), dtype=torch.float32, device=latents.device)
    if out.shape != (texels, CHANNELS) or not out.is_contiguous():
        raise ShapeError(f"shade: expected a contiguous output ({texels}, {CHANNELS}), got {tuple(out.shape)}")
    fast = shading_fast.fits(spec, fine, coarse) and latents.data_ptr() % 4 == 0
    block = block or (256 if fast else 128)
    # levels <= 8: the half conversion, whose dot at 4 warps (wgmma) measured 119 µs against 203 µs at 2
    # (mma.sync); above 8 the float32 lanes measured 131 µs at 2 warps with fours
    num_warps = num_warps or (2 if fast and levels > 8 else 4)
    if programs is None and fast and latents.is_cuda:
        programs = 8 * torch.cuda.get_device_properties(latents.device).multi_processor_count
    blocks = triton.cdiv(texels, block)
    grid = (max(1, min(blocks, programs or blocks)),)
    if fast:
        halves = out.dtype == torch.float16
        if packed_store and not halves:
            raise ShapeError(f"shade: packed stores write float16 outputs, got {out.dtype}")
        if group not in (None, 1, 2, 4):
            raise ShapeError(f"shade: group must be 1, 2 or 4 texels, got {group}")
        row_blocks = width // block if width % block == 0 else 0
        shading_fast.shade_words_kernel[grid](
            latents, packed, out, height, width, n_fine // 4, BLOCK=block, FW=fine // 4, CW=coarse // 4,
            LEVELS=levels, ROW_BLOCKS=row_blocks, STAGES=stages,
            PACKED=halves if packed_store is None else packed_store,
            GROUP=(default_group(block, num_warps) if group is None else group) if row_blocks else 1,
            num_warps=num_warps,
            **spec.constexprs("MLP_"))
    else:
        _shade_kernel[grid](
            latents, packed, out, height, width, n_fine, BLOCK=block, C_FINE=fine, C_COARSE=coarse,
            LEVELS=levels, OUT_P=spec.padded[-1], num_warps=num_warps, **spec.constexprs("MLP_"))
    return out


def shade_plain(features: torch.Tensor, packed: torch.Tensor, spec: MLPSpec, *, block: int = 128,
                num_warps: int = 4, programs: int | None = None, stages: int = 1,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """`shade`'s decoder and outputs on plain per-texel features, contiguous (texels, 16), zeros past the
    decoder's inputs: (texels, 8) like `shade`, from the same kernel without the latent sampling (to
    measure what the compression costs). The decoder must suit the fast kernel (`shading_fast.fits`)."""
    if not shading_fast.fits(spec, 0, 0):
        raise ShapeError(f"shade_plain: expected a decoder from at most 16 inputs through a hidden layer to 6 "
                         f"outputs at program scope, got {spec}")
    if features.dim() != 2 or features.shape[1] != 16 or not features.is_contiguous():
        raise ShapeError(f"shade_plain: expected contiguous features (texels, 16), got {tuple(features.shape)}")
    texels = features.shape[0]
    if out is None:
        out = torch.empty((texels, CHANNELS), dtype=torch.float32, device=features.device)
    blocks = triton.cdiv(texels, block)
    shading_fast.shade_plain_kernel[(max(1, min(blocks, programs or blocks)),)](
        features, packed, out, texels, BLOCK=block, STAGES=stages, EVEN=texels % block == 0, num_warps=num_warps,
        **spec.constexprs("MLP_"))
    return out
