"""Device functions for users' `@triton.jit` kernels: matmul2d at an execution scope, tile loads from
tensor views, bilinear sampling of latent grids, and a whole MLP kept in registers
(`mlp`, or `mlp_load` once and `mlp_apply` per row block in a persistent kernel).

Shapes, scopes and layer widths are `tl.constexpr`: a mismatch fails when the kernel is compiled
(or, under TRITON_INTERPRET=1, when it first runs), with a message naming the descriptor. The
host-side objects (`Matmul2dDescriptor.constexprs`, `MLPSpec.constexprs`) expand into these
constants. Triton reads TRITON_INTERPRET when a function is decorated, so set it before importing
this module to run kernels on the CPU.

    @triton.jit
    def shade(x_ptr, w_ptr, out_ptr, MM_M: tl.constexpr, MM_N: tl.constexpr, MM_K: tl.constexpr,
              MM_TRANSPOSE_LEFT: tl.constexpr, MM_TRANSPOSE_RIGHT: tl.constexpr,
              MM_REDUCED_PRECISION: tl.constexpr, MM_SCOPE: tl.constexpr):
        x = load_tile(x_ptr, MM_M, MM_K, MM_K, 1)
        w = load_tile(w_ptr, MM_K, MM_N, MM_N, 1)
        y = matmul2d(x, w, MM_M, MM_N, MM_K, MM_TRANSPOSE_LEFT, MM_TRANSPOSE_RIGHT, MM_REDUCED_PRECISION, MM_SCOPE)
        store_tile(out_ptr, y, MM_M, MM_N, MM_N, 1)
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

# Compiled for an NVIDIA GPU (not Triton's interpreter): hidden ReLU layers may use PTX directly.
_PTX = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


@triton.jit
def matmul2d(left, right, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, TRANSPOSE_LEFT: tl.constexpr,
             TRANSPOSE_RIGHT: tl.constexpr, REDUCED_PRECISION: tl.constexpr, SCOPE: tl.constexpr):
    """``op(left) @ op(right)`` as a float32 (M, N) tile; the descriptor's fields as constexprs.

    SCOPE "thread": broadcast multiply and a sum over K (per-thread FMAs, any extents);
    SCOPE "program": one tl.dot over the program's warps (tensor cores, extents ≥ 16).
    """
    tl.static_assert((SCOPE == "thread") or (SCOPE == "program"),
                     "matmul2d: Matmul2dDescriptor scope must be thread or program")
    if TRANSPOSE_LEFT:
        tl.static_assert(left.shape[0] == K,
                         "matmul2d: left operand (transposed) must be (K, M) of the Matmul2dDescriptor")
        tl.static_assert(left.shape[1] == M,
                         "matmul2d: left operand (transposed) must be (K, M) of the Matmul2dDescriptor")
        a = tl.trans(left)
    else:
        tl.static_assert(left.shape[0] == M, "matmul2d: left operand must be (M, K) of the Matmul2dDescriptor")
        tl.static_assert(left.shape[1] == K, "matmul2d: left operand must be (M, K) of the Matmul2dDescriptor")
        a = left
    if TRANSPOSE_RIGHT:
        tl.static_assert(right.shape[0] == N,
                         "matmul2d: right operand (transposed) must be (N, K) of the Matmul2dDescriptor")
        tl.static_assert(right.shape[1] == K,
                         "matmul2d: right operand (transposed) must be (N, K) of the Matmul2dDescriptor")
        b = tl.trans(right)
    else:
        tl.static_assert(right.shape[0] == K, "matmul2d: right operand must be (K, N) of the Matmul2dDescriptor")
        tl.static_assert(right.shape[1] == N, "matmul2d: right operand must be (K, N) of the Matmul2dDescriptor")
        b = right
    if REDUCED_PRECISION:
        a = a.to(tl.float16)
        b = b.to(tl.float16)
    if SCOPE == "program":
        tl.static_assert(M >= 16, "matmul2d: program scope (tl.dot) needs the Matmul2dDescriptor M >= 16")
        tl.static_assert(N >= 16, "matmul2d: program scope (tl.dot) needs the Matmul2dDescriptor N >= 16")
        tl.static_assert(K >= 16, "matmul2d: program scope (tl.dot) needs the Matmul2dDescriptor K >= 16")
        if a.dtype == tl.float16 and b.dtype == tl.float16:
            out = tl.dot(a, b, out_dtype=tl.float32)  # products of halves are exact in float32
        else:
            out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    return out


@triton.jit
def load_tile(ptr, ROWS: tl.constexpr, COLS: tl.constexpr, row_stride, col_stride):
    """The (ROWS, COLS) tile of a strided view starting at `ptr` (a rank-2 tensor view)."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    return tl.load(ptr + r[:, None] * row_stride + c[None, :] * col_stride)


@triton.jit
def store_tile(ptr, value, ROWS: tl.constexpr, COLS: tl.constexpr, row_stride, col_stride):
    """Store a (ROWS, COLS) tile into a strided view, converted to the buffer's dtype."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    tl.store(ptr + r[:, None] * row_stride + c[None, :] * col_stride, value.to(ptr.dtype.element_ty))


@triton.jit
def _activate(h, ACT: tl.constexpr):
    tl.static_assert((ACT == "none") or (ACT == "relu") or (ACT == "sigmoid") or (ACT == "tanh"),
                     "mlp: MLPSpec activation must be none, relu, sigmoid or tanh")
    if ACT == "relu":
        h = tl.maximum(h, 0.0)
    elif ACT == "sigmoid":
        h = tl.sigmoid(h)
    elif ACT == "tanh":
        h = 2.0 * tl.sigmoid(2.0 * h) - 1.0  # tanh without libdevice, so the interpreter runs it too
    return h


@triton.jit
def _dense(h, w, b, ACT: tl.constexpr, SCOPE: tl.constexpr, REDUCED: tl.constexpr):
    y = matmul2d(h, w, h.shape[0], w.shape[1], w.shape[0], False, False, REDUCED, SCOPE)
    return _activate(y + b.to(tl.float32)[None, :], ACT)


@triton.jit
def _hidden(h, w, b, ACT: tl.constexpr, SCOPE: tl.constexpr, REDUCED: tl.constexpr):
    """A layer whose output feeds another layer. With half operands the next dot rounds it to half
    anyway: a ReLU then rounds and clamps in one instruction per two values (cvt.rn.relu.f16x2.f32)
    instead of a max per value and a conversion per two. (A NaN stays NaN, as torch.relu keeps it.)
    REDUCED 2 sums in half, from the bias, and a ReLU is a max per two halves."""
    if (REDUCED == 2) and (SCOPE == "program"):
        # Summed in half from the bias (MLPSpec precision "float16-sums").
        y = tl.dot(h.to(tl.float16), w.to(tl.float16), acc=tl.broadcast_to(b.to(tl.float16)[None, :],
                                                                            (h.shape[0], w.shape[1])),
                   out_dtype=tl.float16)
        if _PTX and (ACT == "relu"):
            out = tl.inline_asm_elementwise("max.NaN.f16x2 $0, $1, $2;", "=r,r,r", [y, tl.zeros_like(y)],
                                            dtype=tl.float16, is_pure=True, pack=2)
        else:
            out = _activate(y.to(tl.float32), ACT).to(tl.float16)
    elif _PTX and REDUCED and (ACT == "relu"):
        y = matmul2d(h, w, h.shape[0], w.shape[1], w.shape[0], False, False, REDUCED, SCOPE) + \
            b.to(tl.float32)[None, :]
        out = tl.inline_asm_elementwise("cvt.rn.relu.f16x2.f32 $0, $2, $1;", "=r,r,r", [y], dtype=tl.float16,
                                        is_pure=True, pack=2)
    else:
        out = _dense(h, w, b, ACT, SCOPE, REDUCED)
    return out


@triton.jit
def mlp_load(w_ptr, LAYERS: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
             P4: tl.constexpr):
    """Load an MLPSpec's weights and biases from the buffer `MLPSpec.pack` makes: per layer the
    (P[l], P[l+1]) weights row-major, then the P[l+1] biases. Returns (w0, b0, w1, b1, w2, b2, w3, b3),
    layers past LAYERS being placeholders, for `mlp_apply`: a persistent kernel loads once and applies
    to many row blocks."""
    tl.static_assert((LAYERS >= 1) and (LAYERS <= 4), "mlp: an MLPSpec has 1 to 4 layers")
    O1 = P0 * P1 + P1  # constexpr arithmetic: the layers' offsets in the packed buffer
    O2 = O1 + P1 * P2 + P2
    O3 = O2 + P2 * P3 + P3
    w0 = load_tile(w_ptr, P0, P1, P1, 1)
    b0 = tl.load(w_ptr + P0 * P1 + tl.arange(0, P1))
    w1, b1, w2, b2, w3, b3 = b0, b0, b0, b0, b0, b0
    if LAYERS >= 2:
        w1 = load_tile(w_ptr + O1, P1, P2, P2, 1)
        b1 = tl.load(w_ptr + O1 + P1 * P2 + tl.arange(0, P2))
    if LAYERS >= 3:
        w2 = load_tile(w_ptr + O2, P2, P3, P3, 1)
        b2 = tl.load(w_ptr + O2 + P2 * P3 + tl.arange(0, P3))
    if LAYERS >= 4:
        w3 = load_tile(w_ptr + O3, P3, P4, P4, 1)
        b3 = tl.load(w_ptr + O3 + P3 * P4 + tl.arange(0, P4))
    return w0, b0, w1, b1, w2, b2, w3, b3


@triton.jit
def mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, LAYERS: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr,
              A2: tl.constexpr, A3: tl.constexpr, SCOPE: tl.constexpr, REDUCED: tl.constexpr):
    """Run the chain on the rows of `x` (BLOCK, P0) with weights from `mlp_load`; (BLOCK, P[LAYERS]) float32.
    Activations stay in registers between layers."""
    tl.static_assert(x.shape[1] == w0.shape[0], "mlp: input rows must be (BLOCK, P0), the MLPSpec padded input width")
    # Every layer but the last goes through _hidden (matmul2d converts its input: no float32 round trip).
    if LAYERS == 1:
        h = _dense(x, w0, b0, A0, SCOPE, REDUCED)
    else:
        h = _hidden(x, w0, b0, A0, SCOPE, REDUCED)
    if LAYERS == 2:
        h = _dense(h, w1, b1, A1, SCOPE, REDUCED)
    elif LAYERS > 2:
        h = _hidden(h, w1, b1, A1, SCOPE, REDUCED)
    if LAYERS == 3:
        h = _dense(h, w2, b2, A2, SCOPE, REDUCED)
    elif LAYERS > 3:
        h = _hidden(h, w2, b2, A2, SCOPE, REDUCED)
    if LAYERS == 4:
        h = _dense(h, w3, b3, A3, SCOPE, REDUCED)
    return h


@triton.jit
def mlp(x, w_ptr, LAYERS: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
        P4: tl.constexpr, A0: tl.constexpr, A1: tl.constexpr, A2: tl.constexpr, A3: tl.constexpr,
        SCOPE: tl.constexpr, REDUCED: tl.constexpr):
    """Run an MLPSpec's chain on the rows of `x` (BLOCK, P0) and return (BLOCK, P[LAYERS]) float32:
    `mlp_load` then `mlp_apply`. Launch with `**spec.constexprs(prefix)` for the widths (padded),
    activations, scope and precision."""
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, LAYERS, P0, P1, P2, P3, P4)
    return mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, LAYERS, A0, A1, A2, A3, SCOPE, REDUCED)


@triton.jit
def sample_bilinear(ptr, y, x, height, width, row_stride, col_stride, C: tl.constexpr):
    """Bilinear samples (BLOCK, C) of a (height, width, C) latent grid at continuous texel coordinates
    `y`, `x` (BLOCK,) (texel centres at integers + 0.5 as in the half-pixel convention); edges clamp.

    Channels are contiguous (stride 1); stored integers or halves are returned as float32 values.
    """
    fy = y - 0.5
    fx = x - 0.5
    y0f = tl.floor(fy)
    x0f = tl.floor(fx)
    wy = (fy - y0f)[:, None]
    wx = (fx - x0f)[:, None]
    y0 = tl.minimum(tl.maximum(y0f.to(tl.int32), 0), height - 1)
    x0 = tl.minimum(tl.maximum(x0f.to(tl.int32), 0), width - 1)
    y1 = tl.minimum(tl.maximum(y0f.to(tl.int32) + 1, 0), height - 1)
    x1 = tl.minimum(tl.maximum(x0f.to(tl.int32) + 1, 0), width - 1)
    c = tl.arange(0, C)[None, :]
    v00 = tl.load(ptr + (y0 * row_stride + x0 * col_stride)[:, None] + c).to(tl.float32)
    v01 = tl.load(ptr + (y0 * row_stride + x1 * col_stride)[:, None] + c).to(tl.float32)
    v10 = tl.load(ptr + (y1 * row_stride + x0 * col_stride)[:, None] + c).to(tl.float32)
    v11 = tl.load(ptr + (y1 * row_stride + x1 * col_stride)[:, None] + c).to(tl.float32)
    top = v00 + (v01 - v00) * wx
    bottom = v10 + (v11 - v10) * wx
    return top + (bottom - top) * wy
