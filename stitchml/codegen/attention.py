"""The attention template: softmax(Q Kᵀ · scale [+ mask]) V in one kernel, FlashAttention-style.

One program computes BLOCK_M query rows of one batch entry. It walks the keys
BLOCK_N at a time: the scores of a tile are computed with `tl.dot` in float32,
and an online softmax keeps the running row maximum `m`, the running sum `l`
and the unnormalised output `acc`, rescaling both by exp(m_old - m_new) when
the maximum grows. No L x S matrix is ever in memory. A causal kernel walks
the key tiles left of its diagonal without the mask, then the diagonal ones
with it, and skips those above; its programs start with the longest rows. An
additive mask is loaded tile by tile through its (possibly broadcast)
strides. Extents are compiled in, so bounds checks appear only where a tile
can overhang: keys past S score -inf, head dimensions past d load as 0.

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


@dataclass(frozen=True)
class Tiles:
    """Launch shape of one attention kernel: a program's query rows and key columns per step, its warps,
    and the software-pipeline depth of its loop over the other side."""

    block_m: int
    block_n: int
    warps: int
    stages: int


# Measured on an H200 (Triton 3.6, float16, split products; benchmarks/tune_attention.py, results in
# benchmarks/results/tune_attention_h200_2026-12-01.json), per kernel, head dimension bucket (≤ 64, larger) and
# causal or not. "dkv" walks query tiles of block_m for block_n keys, "dq" and "forward" walk key tiles of
# block_n for block_m queries. The backward's two float32 accumulators (and the two halves of each product)
# favour small tiles at 4 warps. With Δ out of the dQ kernel's loop (three products per step, not four) the
# table's dQ and dK/dV tiles stayed the fastest of benchmarks/profile_attention_backward.py's candidates at
# L = 16k, d = 64 and L = 4k, d = 128 (results/profile_attention_backward_h200_2026-12-02.json).
GPU_TILES: dict[tuple[str, bool, bool], Tiles] = {
    ("forward", True, False): Tiles(128, 64, 4, 3),
    ("forward", True, True): Tiles(64, 64, 4, 3),
    ("forward", False, False): Tiles(64, 64, 4, 3),
    ("forward", False, True): Tiles(64, 64, 4, 3),
    ("dq", True, False): Tiles(64, 64, 4, 3),
    ("dq", True, True): Tiles(64, 64, 4, 3),
    ("dq", False, False): Tiles(64, 64, 4, 2),
    ("dq", False, True): Tiles(64, 32, 4, 3),
    ("dkv", True, False): Tiles(32, 128, 4, 3),
    ("dkv", True, True): Tiles(32, 64, 4, 3),
    ("dkv", False, False): Tiles(64, 64, 4, 2),
    ("dkv", False, True): Tiles(64, 128, 8, 3),
}


def pow2(n: int, least: int = 16) -> int:
    """The power of two at least `n` (and `least`): a tile extent that covers n."""
    return max(least, 1 << max(n - 1, 0).bit_length())


def tiles(kernel: str, length: int, keys: int, head: int, causal: bool, interpret: bool) -> Tiles:
    """The tiles of `kernel` ("forward", "dq" or "dkv") for L = `length` queries, S = `keys` keys and head
    dimension `head`: GPU_TILES on a GPU; under the interpreter tiles no larger than the problem, so small
    tests stay fast."""
    if interpret:
        return Tiles(min(64, pow2(length)), min(64, pow2(keys)), 4, 1)
    return GPU_TILES[(kernel, head <= 64, causal)]


def batch_offset(batch: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """The element offset of batch entry `pid_b` (row-major over `batch`) in an input with these strides."""
    terms = []
    inner = 1
    for extent, stride in reversed(list(zip(batch, strides))):
        if stride and extent > 1:
            index = f"(pid_b // {inner}) % {extent}" if inner > 1 else f"pid_b % {extent}"
            terms.append(f"({index}).to(tl.int64) * {stride}")
        inner *= extent
    return " + ".join(terms) or "0"


def batch_strides(lay: Layout, batch: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of `lay`'s batch dimensions read as `batch` (missing and extent-1 dimensions: 0)."""
    own = lay.shape[:-2]
    lead = len(batch) - len(own)
    return (0,) * lead + tuple(0 if d == 1 else s for d, s in zip(own, lay.strides[:-2]))


def guard(*conditions: str, store: bool = False) -> str:
    """The mask argument of a load (with `other=0.0`) or a store from the bounds checks that apply ("" where
    none does)."""
    used = [c for c in conditions if c]
    if not used:
        return ""
    return f", mask={' & '.join(used)}" + ("" if store else ", other=0.0")


def load(base: str, down_index: str, down_stride: int, across_index: str, across_stride: int, *checks: str,
         widen: str = "") -> str:
    """A tile's load: element [i, j] at base + down_index[i] * down_stride + across_index[j] * across_stride,
    under the bounds checks that apply, widened (see `generate`)."""
    at = f"{base} + {down_index}[:, None] * {down_stride} + {across_index}[None, :] * {across_stride}"
    return f"tl.load({at}{guard(*checks)}){widen}"


def below(index: str, extent: int, block: int) -> str:
    """The bounds check `index < extent`, or "" when a tile of `block` never overhangs `extent`."""
    return "" if extent % block == 0 else f"({index} < {extent})"


def down(check: str) -> str:
    """A check over a tile's first axis, broadcast along its second."""
    return f"{check}[:, None]" if check else ""


def across(check: str) -> str:
    """A check over a tile's second axis, broadcast along its first."""
    return f"{check}[None, :]" if check else ""


def product(acc: str, left: str, right: str, dtype: str, split: bool, widen: str, indent: str = "        ") -> str:
    """Lines adding left @ right to `acc`, where `left` is a float32 tile of the kernel (probabilities, or
    their gradient) and `right` a loaded operand. float32: a full-precision product (tf32 would round to 10
    bits). Half types: `left` is rounded to the operands' type for the tensor cores; with `split` it is
    carried as two halves, hi + lo, so it keeps about twice the bits (an error of ~2**-22 instead of
    2**-11 per element, which the float32 tolerance of a composite needs), at the cost of a second
    product."""
    if dtype == "float32":
        return f"{indent}{acc} = tl.dot({left}, {right}, {acc}, input_precision=\"ieee\")"
    elem = tl_type(as_dtype(dtype))
    if not split:
        return f"{indent}{acc} = tl.dot(({left}).to({elem}){widen}, {right}, {acc})"
    return (f"{indent}hi = ({left}).to({elem})\n{indent}lo = (({left}) - hi.to(tl.float32)).to({elem})\n"
            f"{indent}{acc} = tl.dot(hi{widen}, {right}, {acc})\n{indent}{acc} = tl.dot(lo{widen}, {right}, {acc})")


def generate(name: str, spec: AttentionSpec, layouts: list[Layout], out_shape: tuple[int, ...], dtype: str,
             interpret: bool, split: bool = True, lse: bool = False, tile: Tiles | None = None) -> KernelSource:
    """Triton source of the forward kernel for inputs of the given layouts (Q, Kᵀ, V[, mask]).

    `dtype` is the element type name of Q, K and V ("float16", "bfloat16" or "float32"). `split`: see
    `product`. `lse`: the kernel also stores each row's log-sum-exp of the scores, in base-2 units, as a
    float32 (batch..., L) output after O, and for half types O before its rounding, as float32, after
    that: the backward kernels (attention_backward.py) read both. `tile`: the launch shape (default:
    `tiles`)."""
    q, kt, v = layouts[:3]
    batch = tuple(out_shape[:-2])
    length, head = q.shape[-2], q.shape[-1]
    keys, value_dim = kt.shape[-1], v.shape[-1]
    t = tile or tiles("forward", length, keys, max(head, value_dim), spec.causal, interpret)
    block_d, block_e = pow2(head), pow2(value_dim)
    nbatch = 1
    for d in batch:
        nbatch *= d
    # float32 operands: full-precision products (tf32 would round them to 10 bits)
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    offsets = [batch_offset(batch, batch_strides(lay, batch)) for lay in layouts]
    unrounded = lse and dtype != "float32"
    args = ["q_ptr", "kt_ptr", "v_ptr"] + (["mask_ptr"] if spec.mask else []) + ["out_ptr"] + \
        (["lse_ptr"] if lse else []) + (["o32_ptr"] if unrounded else [])
    row_ok = below("rows", length, t.block_m)
    col_ok = below("cols", keys, t.block_n)
    dim_ok = below("dims", head, block_d)
    vdim_ok = below("vdims", value_dim, block_e)
    kt_checks, v_checks = (down(dim_ok), across(col_ok)), (down(col_ok), across(vdim_ok))
    q_checks, bias_checks = (down(row_ok), across(dim_ok)), (down(row_ok), across(col_ok))
    mask_lines = ""
    if spec.mask:
        m = layouts[3].broadcast_to(out_shape)
        mask_lines = f"""
        bias = {load("mask_ptr + mask_base", "rows", m.strides[-2], "cols", m.strides[-1], *bias_checks)}
        s = s + bias.to(tl.float32) * {LOG2E!r}"""
    # scores are kept in base-2 units, s * log2(e), so each exponential is one exp2 (the scale folds it in)
    factor = (1 / spec.scale if spec.divide else spec.scale) * LOG2E
    elem = tl_type(as_dtype(dtype))
    # the interpreter holds bfloat16 as raw 16-bit integers, which its tl.dot multiplies as integers:
    # there the operands are widened to float32 after loading (values unchanged, products exact)
    widen = ".to(tl.float32)" if interpret and dtype == "bfloat16" else ""
    store_guard = guard(down(row_ok), across(vdim_ok), store=True)

    def loop(start: str, end: str, diagonal: bool) -> str:
        """Steps over key tiles from `start` to `end`, with the causal mask on `diagonal` ones."""
        causal = "\n        s = tl.where(rows[:, None] >= cols[None, :], s, float(\"-inf\"))" if diagonal else ""
        bounds = f"\n        s = tl.where({across(col_ok)}, s, float(\"-inf\"))" if col_ok else ""
        return f"""
    for start in tl.range({start}, {end}, BLOCK_N, num_stages={t.stages}):
        cols = start + tl.arange(0, BLOCK_N)
        kt = {load("kt_ptr + kt_base", "dims", kt.strides[-2], "cols", kt.strides[-1], *kt_checks, widen=widen)}
        s = tl.dot(q, kt{precision}) * {factor!r}{mask_lines}{causal}{bounds}
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row with every score -inf so far shifts by 0, not by -inf (which would make NaN of exp(-inf + inf))
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - shift[:, None])
        alpha = tl.exp2(m_i - shift)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = {load("v_ptr + v_base", "cols", v.strides[-2], "vdims", v.strides[-1], *v_checks, widen=widen)}
        acc = acc * alpha[:, None]
{product("acc", "p", "vt", dtype, split, widen)}
        m_i = m_new"""

    if spec.causal:
        # key tiles wholly left of the block's first row need no mask; those crossing the diagonal do
        loops = f"\n    diagonal = tl.minimum((pid_m * BLOCK_M // BLOCK_N) * BLOCK_N, {keys})" + \
            loop("0", "diagonal", False) + loop("diagonal", f"tl.minimum({keys}, (pid_m + 1) * BLOCK_M)", True)
        pid_m = "tl.num_programs(0) - 1 - tl.program_id(0)"  # the longest rows first: fewer idle SMs at the end
    else:
        loops, pid_m = loop("0", str(keys), False), "tl.program_id(0)"
    store_lse = f"""
    tl.store(lse_ptr + pid_b.to(tl.int64) * {length} + rows, m_i + tl.log2(l_i){guard(row_ok, store=True)})""" \
        if lse else ""
    if unrounded:
        store_lse += f"""
    tl.store(o32_ptr + out_base + rows[:, None] * {value_dim} + vdims[None, :], o{store_guard})"""
    src = header(f"attention kernel {name}", interpret) + f'''

@triton.jit
def {name}({", ".join(args)}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
           BLOCK_E: tl.constexpr):
    pid_m = {pid_m}
    pid_b = tl.program_id(1)
    q_base = {offsets[0]}
    kt_base = {offsets[1]}
    v_base = {offsets[2]}
    mask_base = {offsets[3] if spec.mask else "0"}
    out_base = pid_b.to(tl.int64) * {length * value_dim}
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_E)
    q = {load("q_ptr + q_base", "rows", q.strides[-2], "dims", q.strides[-1], *q_checks, widen=widen)}
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_E], tl.float32){loops}
    o = acc / l_i[:, None]
    tl.store(out_ptr + out_base + rows[:, None] * {value_dim} + vdims[None, :], o.to({elem}){store_guard}){store_lse}
'''
    constexprs = {"BLOCK_M": t.block_m, "BLOCK_N": t.block_n, "BLOCK_D": block_d, "BLOCK_E": block_e}
    grid = ((length + t.block_m - 1) // t.block_m, nbatch)
    return KernelSource(name, src, grid, t.warps, constexprs, "attention")
