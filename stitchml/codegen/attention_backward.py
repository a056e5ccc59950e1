"""The attention template's backward: dQ, dKᵀ and dV of softmax(Q Kᵀ · scale [+ mask]) V, FlashAttention-2 style.

The forward stored each row's log-sum-exp (base 2), so a tile of probabilities
is recomputed exactly as P = exp2(S - lse) without a pass over the row. With
Δ = rowsum(P ∘ dP) and dS = P ∘ (dO Vᵀ - Δ):

* one kernel per BLOCK_M queries walks the keys: dQ += dS K;
* one kernel per BLOCK_N keys walks the queries: dV += Pᵀ dO, dKᵀ += Qᵀ dS.
  It works on the transposed tiles (Sᵀ = K Qᵀ, Pᵀ, dSᵀ), so that the float32
  tiles it multiplies are left operands as computed, never transposed.

The dQ kernel runs first: it takes Δ = rowsum(dO ∘ O) from O in float32 (the
forward stores it unrounded for half types) and stores Δ in a float32 scratch
that the dK/dV kernel reads, so each tile costs it three products (S, dP, dQ)
where summing Δ = rowsum(P ∘ dP) in its own loop would take a fourth (Σ P K).
Δ is the diagonal of dO Oᵀ, a tile product of the same operands in the same
order as dO Vᵀ: where a query's softmax is one key (the first row of a causal
mask) O is that key's V, Δ equals dP bit for bit and dQ is exactly 0, as the
formula is. Products of a half type carry the float32 operand as two halves
(hi + lo), as the forward does (attention.product). A causal kernel applies
the mask only on the tiles that cross the diagonal (see attention.py); bounds
checks appear only where a tile can overhang. Inputs: Q, Kᵀ, V[, mask], lse,
O in float32, dO; outputs dQ, dKᵀ (stored as (d, S) or, when its buffer is
(S, d), as dK) and dV; then the Δ scratch.
"""
from __future__ import annotations

from ..dtypes import as_dtype
from . import attention
from .attention import (LOG2E, AttentionSpec, Tiles, across, batch_offset, batch_strides, below, down, guard, load,
                        pow2, product)
from .common import Layout, header, tl_type
from .pointwise import KernelSource


def generate(name: str, spec: AttentionSpec, layouts: list[Layout], out_shapes: list[tuple[int, ...]], dtype: str,
             interpret: bool, split: bool = True, dkv_tile: Tiles | None = None,
             dq_tile: Tiles | None = None) -> tuple[KernelSource, KernelSource]:
    """(the dKᵀ/dV kernel, the dQ kernel) for inputs of the given layouts (Q, Kᵀ, V[, mask], lse, O, dO).
    `dkv_tile`, `dq_tile`: their launch shapes (default: attention.tiles)."""
    q, kt, v = layouts[:3]
    o_lay, do_lay = layouts[-2:]
    dkt_shape = out_shapes[1]
    batch = tuple(out_shapes[2][:-2])  # dV's batch is the broadcast batch of the forward
    length, head = q.shape[-2], q.shape[-1]
    keys, value_dim = kt.shape[-1], v.shape[-1]
    widest = max(head, value_dim)
    kv_t = dkv_tile or attention.tiles("dkv", length, keys, widest, spec.causal, interpret)
    q_t = dq_tile or attention.tiles("dq", length, keys, widest, spec.causal, interpret)
    block_d, block_e = pow2(head), pow2(value_dim)
    nbatch = 1
    for d in batch:
        nbatch *= d
    offsets = [batch_offset(batch, batch_strides(lay, batch)) for lay in layouts[:3]]
    do_off = batch_offset(batch, batch_strides(do_lay, batch))
    o_off = batch_offset(batch, batch_strides(o_lay, batch))
    do_strides = do_lay.strides[-2:]
    widen = ".to(tl.float32)" if interpret and dtype == "bfloat16" else ""
    elem = tl_type(as_dtype(dtype))
    factor = (1 / spec.scale if spec.divide else spec.scale)
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    dim_ok = below("dims", head, block_d)
    vdim_ok = below("vdims", value_dim, block_e)
    mask_base = "0"
    if spec.mask:
        m = layouts[3].broadcast_to(tuple(batch) + (length, keys))
        mask_base = batch_offset(batch, batch_strides(m, batch))
    # dKᵀ's buffer: (d, S) row-major, or (S, d) when the graph's product computes dK itself
    kt_rows = dkt_shape[-2:] == (head, keys)
    dk_at = f"cols[:, None] + dims[None, :] * {keys}" if kt_rows else f"cols[:, None] * {head} + dims[None, :]"
    args = ", ".join(["q_ptr", "kt_ptr", "v_ptr"] + (["mask_ptr"] if spec.mask else []) +
                     ["lse_ptr", "o_ptr", "do_ptr", "dq_ptr", "dkt_ptr", "dv_ptr", "delta_ptr"])
    common = f"""
    pid_b = tl.program_id(1)
    q_base = {offsets[0]}
    kt_base = {offsets[1]}
    v_base = {offsets[2]}
    mask_base = {mask_base}
    do_base = {do_off}
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_E)"""
    def dq_loop(start: str, end: str, diagonal: bool) -> str:
        """Steps over key tiles for a block of queries: dQ's sum."""
        row_ok, col_ok = below("rows", length, q_t.block_m), below("cols", keys, q_t.block_n)
        bias_checks = (down(row_ok), across(col_ok))
        bias = ""
        if spec.mask:
            bias = f"""
        bias = {load("mask_ptr + mask_base", "rows", m.strides[-2], "cols", m.strides[-1], *bias_checks)}
        s = s + bias.to(tl.float32) * {LOG2E!r}"""
        causal = "\n        s = tl.where(rows[:, None] >= cols[None, :], s, float(\"-inf\"))" if diagonal else ""
        bounds = f"\n        s = tl.where({across(col_ok)}, s, float(\"-inf\"))" if col_ok else ""
        kt_checks, vt_checks = (down(dim_ok), across(col_ok)), (down(vdim_ok), across(col_ok))
        return f"""
    for start in tl.range({start}, {end}, BLOCK_N, num_stages={q_t.stages}):
        cols = start + tl.arange(0, BLOCK_N)
        kt = {load("kt_ptr + kt_base", "dims", kt.strides[-2], "cols", kt.strides[-1], *kt_checks, widen=widen)}
        vt = {load("v_ptr + v_base", "vdims", v.strides[-1], "cols", v.strides[-2], *vt_checks, widen=widen)}
        s = tl.dot(q, kt{precision}) * {factor * LOG2E!r}{bias}{causal}{bounds}
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, vt{precision})
        ds = p * (dp - delta[:, None])
{product("dq", "ds", "tl.trans(kt)", dtype, split, widen)}"""

    def dkv_loop(start: str, end: str, diagonal: bool) -> str:
        """Steps over query tiles for a block of keys, on transposed tiles (keys down, queries across)."""
        row_ok, col_ok = below("rows", length, kv_t.block_m), below("cols", keys, kv_t.block_n)
        bias_checks = (down(col_ok), across(row_ok))
        bias = ""
        if spec.mask:
            bias = f"""
        bias = {load("mask_ptr + mask_base", "cols", m.strides[-1], "rows", m.strides[-2], *bias_checks)}
        st = st + bias.to(tl.float32) * {LOG2E!r}"""
        causal = "\n        st = tl.where(rows[None, :] >= cols[:, None], st, float(\"-inf\"))" if diagonal else ""
        bounds = f"\n        st = tl.where({across(row_ok)}, st, float(\"-inf\"))" if row_ok else ""
        qt_checks, do_checks = (down(dim_ok), across(row_ok)), (down(row_ok), across(vdim_ok))
        return f"""
    for start in tl.range({start}, {end}, BLOCK_M, num_stages={kv_t.stages}):
        rows = start + tl.arange(0, BLOCK_M)
        qt = {load("q_ptr + q_base", "dims", q.strides[-1], "rows", q.strides[-2], *qt_checks, widen=widen)}
        do = {load("do_ptr + do_base", "rows", do_strides[0], "vdims", do_strides[1], *do_checks, widen=widen)}
        lse = tl.load(lse_ptr + pid_b.to(tl.int64) * {length} + rows{guard(row_ok)})
        lse = tl.where(lse == float("-inf"), 0.0, lse)
        delta = tl.load(delta_ptr + pid_b.to(tl.int64) * {length} + rows{guard(row_ok)})
        st = tl.dot(k, qt{precision}) * {factor * LOG2E!r}{bias}{causal}{bounds}
        pt = tl.exp2(st - lse[None, :])
        dpt = tl.dot(v, tl.trans(do){precision})
        dst = pt * (dpt - delta[None, :])
{product("dv", "pt", "do", dtype, split, widen)}
{product("dk", "dst", "tl.trans(qt)", dtype, split, widen)}"""

    col_ok_kv = below("cols", keys, kv_t.block_n)
    k_checks, v_checks = (down(col_ok_kv), across(dim_ok)), (down(col_ok_kv), across(vdim_ok))
    dv_value = f"dv.to({elem}){guard(down(col_ok_kv), across(vdim_ok), store=True)}"
    dk_guard = guard(down(col_ok_kv), across(dim_ok), store=True)
    if spec.causal:
        # query tiles that reach below the block's last key need no mask; those crossing the diagonal do
        loops = f"""
    first = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    unmasked = tl.minimum(((pid_n + 1) * BLOCK_N + BLOCK_M - 1) // BLOCK_M * BLOCK_M, {length})""" + \
            dkv_loop("first", "unmasked", True) + dkv_loop("unmasked", str(length), False)
    else:
        loops = dkv_loop("0", str(length), False)
    kv_src = header(f"attention backward (dK, dV) kernel {name}", interpret) + f'''

@triton.jit
def {name}_dkv({args}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_E: tl.constexpr):
    pid_n = tl.program_id(0){common}
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = {load("kt_ptr + kt_base", "cols", kt.strides[-1], "dims", kt.strides[-2], *k_checks, widen=widen)}
    v = {load("v_ptr + v_base", "cols", v.strides[-2], "vdims", v.strides[-1], *v_checks, widen=widen)}
    dv = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32){loops}
    out_base = pid_b.to(tl.int64)
    tl.store(dv_ptr + out_base * {keys * value_dim} + cols[:, None] * {value_dim} + vdims[None, :], {dv_value})
    tl.store(dkt_ptr + out_base * {keys * head} + {dk_at}, (dk * {factor!r}).to({elem}){dk_guard})
'''
    row_ok_q = below("rows", length, q_t.block_m)
    q_checks, q_do_checks = (down(row_ok_q), across(dim_ok)), (down(row_ok_q), across(vdim_ok))
    if spec.causal:
        loops = f"""
    diagonal = tl.minimum((pid_m * BLOCK_M // BLOCK_N) * BLOCK_N, {keys})""" + dq_loop("0", "diagonal", False) + \
            dq_loop("diagonal", f"tl.minimum({keys}, (pid_m + 1) * BLOCK_M)", True)
        pid_m = "tl.num_programs(0) - 1 - tl.program_id(0)"  # the longest rows first
    else:
        loops, pid_m = dq_loop("0", str(keys), False), "tl.program_id(0)"
    o_checks = (down(vdim_ok), across(row_ok_q))
    if dtype == "float32":
        delta = f"tl.dot(do, ot{precision})"
    else:  # O's two halves, each multiplied as V is in dP
        delta = (f"tl.dot(do, ot.to({elem}){widen})\n    ot = (ot - ot.to({elem}).to(tl.float32)).to({elem}){widen}"
                 "\n    delta = tl.dot(do, ot, delta)")
    q_src = header(f"attention backward (dQ) kernel {name}", interpret) + f'''

@triton.jit
def {name}_dq({args}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_E: tl.constexpr):
    pid_m = {pid_m}{common}
    o_base = {o_off}
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = {load("q_ptr + q_base", "rows", q.strides[-2], "dims", q.strides[-1], *q_checks, widen=widen)}
    do = {load("do_ptr + do_base", "rows", do_lay.strides[-2], "vdims", do_lay.strides[-1], *q_do_checks, widen=widen)}
    lse = tl.load(lse_ptr + pid_b.to(tl.int64) * {length} + rows{guard(row_ok_q)})
    lse = tl.where(lse == float("-inf"), 0.0, lse)
    ot = {load("o_ptr + o_base", "vdims", o_lay.strides[-1], "rows", o_lay.strides[-2], *o_checks)}
    delta = {delta}
    own = tl.arange(0, BLOCK_M)
    delta = tl.sum(tl.where(own[:, None] == own[None, :], delta, 0.0), 1)  # the diagonal: rowsum(dO ∘ O)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32){loops}
    tl.store(delta_ptr + pid_b.to(tl.int64) * {length} + rows, delta{guard(row_ok_q, store=True)})
    tl.store(dq_ptr + pid_b.to(tl.int64) * {length * head} + rows[:, None] * {head} + dims[None, :],
             (dq * {factor!r}).to({elem}){guard(down(row_ok_q), across(dim_ok), store=True)})
'''
    kv = KernelSource(f"{name}_dkv", kv_src, ((keys + kv_t.block_n - 1) // kv_t.block_n, nbatch), kv_t.warps,
                      {"BLOCK_M": kv_t.block_m, "BLOCK_N": kv_t.block_n, "BLOCK_D": block_d, "BLOCK_E": block_e},
                      "attention")
    dq = KernelSource(f"{name}_dq", q_src, ((length + q_t.block_m - 1) // q_t.block_m, nbatch), q_t.warps,
                      {"BLOCK_M": q_t.block_m, "BLOCK_N": q_t.block_n, "BLOCK_D": block_d, "BLOCK_E": block_e},
                      "attention")
    return kv, dq
