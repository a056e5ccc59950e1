"""The attention template: softmax(Q Kᵀ · scale [+ mask]) V in one kernel, FlashAttention-style.

One program computes BLOCK_M query rows of one batch entry. It walks the keys
BLOCK_N at a time: the scores of a tile are computed with `tl.dot` in float32,
and an online softmax keeps the running row maximum `m`, the running sum `l`
and the unnormalised output `acc`, rescaling both by exp(m_old - m_new) when
the maximum grows. No L x S matrix is ever in memory. A causal mask skips the
key tiles above the diagonal altogether; an additive mask is loaded tile by
tile through its (possibly broadcast) strides. Partial tiles are masked: keys
past S score -inf, head dimensions past d load as 0.

Inputs, in this order: Q (..., L, d), Kᵀ (..., d, S) (a transposed view of K
is read through its strides, no copy), V (..., S, e) and, when present, the
mask (broadcastable to (..., L, S)). Batch dimensions broadcast (stride 0).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import as_dtype
from .common import Layout, header, tl_type
from .pointwise import KernelSource

LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256  # beyond this one tile of Q, K and V outgrows the registers and shared memory of a GPU


@dataclass(frozen=True)
class AttentionSpec:
    """What the attention pass found: the scale, how it is applied, and the mask."""

    scale: float  # scores are Q Kᵀ * scale, or Q Kᵀ / scale with `divide`
    divide: bool
    mask: bool  # an additive mask tensor is the fourth input
    causal: bool  # keys after the query's position are masked out (top-left aligned)


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(n - 1, 0).bit_length())


def blocks(length: int, keys: int, head: int, interpret: bool) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps). On a GPU 128 x 64 tiles (64 x 64 for d > 64 keep registers in bounds);
    under the interpreter tiles no larger than the problem, so small tests stay fast."""
    if interpret:
        return min(64, _pow2(length)), min(64, _pow2(keys)), 4
    if head <= 64:
        return 128, 64, 4
    return 64, 64, 4


def _batch_offset(batch: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """The element offset of batch entry `pid_b` (row-major over `batch`) in an input with these strides."""
    terms = []
    inner = 1
    for extent, stride in reversed(list(zip(batch, strides))):
        if stride and extent > 1:
            index = f"(pid_b // {inner}) % {extent}" if inner > 1 else f"pid_b % {extent}"
            terms.append(f"({index}).to(tl.int64) * {stride}")
        inner *= extent
    return " + ".join(terms) or "0"


def _batch_strides(lay: Layout, batch: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of `lay`'s batch dimensions read as `batch` (missing and extent-1 dimensions: 0)."""
    own = lay.shape[:-2]
    lead = len(batch) - len(own)
    return (0,) * lead + tuple(0 if d == 1 else s for d, s in zip(own, lay.strides[:-2]))


def _product(dtype: str, split: bool, interpret: bool) -> str:
    """The line that adds P V to `acc`. For half types P (float32 in [0, 1]) is rounded to V's type for
    the tensor cores; with `split` it is carried as two halves, hi + lo, so P keeps about twice the
    bits (an error of ~2**-22 instead of 2**-11 per probability, which the float32 tolerance of a
    composite needs), at the cost of a second product per tile."""
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    if dtype == "float32":
        return f" + tl.dot(p, vt{precision})"
    elem = tl_type(as_dtype(dtype))
    widen = ".to(tl.float32)" if interpret and dtype == "bfloat16" else ""
    if not split:
        return f" + tl.dot(p.to({elem}){widen}, vt)"
    return (f"\n        p_hi = p.to({elem})\n        p_lo = (p - p_hi.to(tl.float32)).to({elem})\n"
            f"        acc = tl.dot(p_hi{widen}, vt, acc)\n        acc = tl.dot(p_lo{widen}, vt, acc)")


def generate(name: str, spec: AttentionSpec, layouts: list[Layout], out_shape: tuple[int, ...], dtype: str,
             interpret: bool, split: bool = True, lse: bool = False) -> KernelSource:
    """Triton source of the forward kernel for inputs of the given layouts (Q, Kᵀ, V[, mask]).

    `dtype` is the element type name of Q, K and V ("float16", "bfloat16" or "float32"). `split`: see
    `_product`. `lse`: the kernel also stores each row's log-sum-exp of the scores, in base-2 units, as a
    float32 (batch..., L) output after O, which the backward kernels (attention_backward.py) read."""
    q, kt, v = layouts[:3]
    batch = tuple(out_shape[:-2])
    length, head = q.shape[-2], q.shape[-1]
    keys, value_dim = kt.shape[-1], v.shape[-1]
    block_m, block_n, warps = blocks(length, keys, max(head, value_dim), interpret)
    nbatch = 1
    for d in batch:
        nbatch *= d
    # float32 operands: full-precision products (tf32 would round them to 10 bits)
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    offsets = [_batch_offset(batch, _batch_strides(lay, batch)) for lay in layouts]
    args = ["q_ptr", "kt_ptr", "v_ptr"] + (["mask_ptr"] if spec.mask else []) + ["out_ptr"] + \
        (["lse_ptr"] if lse else [])
    mask_lines = ""
    if spec.mask:
        m = layouts[3].broadcast_to(out_shape)
        mask_lines = f"""
        bias = tl.load(mask_ptr + mask_base + rows[:, None] * {m.strides[-2]} + cols[None, :] * {m.strides[-1]},
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        s = s + bias.to(tl.float32) * {LOG2E!r}"""
    causal = "\n        s = tl.where(rows[:, None] >= cols[None, :], s, float(\"-inf\"))" if spec.causal else ""
    end = f"tl.minimum({keys}, (pid_m + 1) * BLOCK_M)" if spec.causal else str(keys)
    # scores are kept in base-2 units, s * log2(e), so each exponential is one exp2 (the scale folds it in)
    factor = (1 / spec.scale if spec.divide else spec.scale) * LOG2E
    scale = f"s * {factor!r}"
    out = Layout.contiguous(out_shape)
    product = _product(dtype, split, interpret)
    elem = tl_type(as_dtype(dtype))
    # the interpreter holds bfloat16 as raw 16-bit integers, which its tl.dot multiplies as integers:
    # there the operands are widened to float32 after loading (values unchanged, products exact)
    widen = ".to(tl.float32)" if interpret and dtype == "bfloat16" else ""
    store_lse = f"""
    tl.store(lse_ptr + pid_b.to(tl.int64) * {length} + rows, m_i + tl.log2(l_i), mask=row_ok)""" if lse else ""
    src = header(f"attention kernel {name}", interpret) + f'''

@triton.jit
def {name}({", ".join(args)}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
           BLOCK_E: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_b = tl.program_id(1)
    q_base = {offsets[0]}
    kt_base = {offsets[1]}
    v_base = {offsets[2]}
    mask_base = {offsets[3] if spec.mask else "0"}
    out_base = pid_b.to(tl.int64) * {length * value_dim}
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_E)
    row_ok = rows < {length}
    q = tl.load(q_ptr + q_base + rows[:, None] * {q.strides[-2]} + dims[None, :] * {q.strides[-1]},
                mask=row_ok[:, None] & (dims[None, :] < {head}), other=0.0){widen}
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32)
    for start in range(0, {end}, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < {keys}
        kt = tl.load(kt_ptr + kt_base + dims[:, None] * {kt.strides[-2]} + cols[None, :] * {kt.strides[-1]},
                     mask=(dims[:, None] < {head}) & col_ok[None, :], other=0.0){widen}
        s = tl.dot(q, kt{precision})
        s = {scale}{mask_lines}{causal}
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with every score -inf so far shifts by 0, not by -inf (which would make NaN of exp(-inf + inf))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v_ptr + v_base + cols[:, None] * {v.strides[-2]} + vdims[None, :] * {v.strides[-1]},
                     mask=col_ok[:, None] & (vdims[None, :] < {value_dim}), other=0.0){widen}
        acc = acc * alpha[:, None]{product}
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(out_ptr + out_base + rows[:, None] * {out.strides[-2]} + vdims[None, :],
             o.to({elem}), mask=row_ok[:, None] & (vdims[None, :] < {value_dim})){store_lse}
'''
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": _pow2(head), "BLOCK_E": _pow2(value_dim)}
    grid = ((length + block_m - 1) // block_m, nbatch)
    return KernelSource(name, src, grid, warps, constexprs, "attention")
