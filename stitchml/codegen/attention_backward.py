"""The attention template's backward: dQ, dKᵀ and dV of softmax(Q Kᵀ · scale [+ mask]) V, FlashAttention-2 style.

The forward stored each row's log-sum-exp (base 2), so a tile of probabilities
is recomputed exactly as P = exp2(S - lse) without a pass over the row. With
Δ = rowsum(P ∘ dP) and dS = P ∘ (dO Vᵀ - Δ):

* one kernel per BLOCK_M queries walks the keys: dQ += dS K;
* one kernel per BLOCK_N keys walks the queries: dV += Pᵀ dO, dKᵀ += Qᵀ dS.

The dQ kernel runs first: it sums Δ = rowsum(P ∘ dP) in its loop over the keys
(dQ = Σ (P ∘ dP) K - Δ Σ P K) and stores Δ in a float32 scratch that the dK/dV
kernel reads; Δ as rowsum(dO ∘ O) would need O unrounded and would differ
from P ∘ dP by the order of its sum, which leaves rounding noise where the
exact gradient is 0. Products of a half type carry the float32 operand as two
halves (hi + lo), as the forward does (attention._product). Inputs: Q, Kᵀ,
V[, mask], lse, dO; outputs dQ, dKᵀ (stored as (d, S) or, when its buffer is
(S, d), as dK) and dV; then the Δ scratch.
"""
from __future__ import annotations

from ..dtypes import as_dtype
from .attention import LOG2E, AttentionSpec, _batch_offset, _batch_strides, _pow2, blocks
from .common import Layout, header, tl_type
from .pointwise import KernelSource


def _mm(acc: str, left: str, right: str, rounded: str, dtype: str, split: bool, widen: str) -> str:
    """Lines adding left @ right to `acc`; the operand named by `rounded` ("left" or "right") is a float32
    tile rounded to the operands' type for the product, the other one is as loaded."""
    if dtype == "float32":
        return f"        {acc} = tl.dot({left}, {right}, {acc}, input_precision=\"ieee\")"
    elem = tl_type(as_dtype(dtype))
    tile = left if rounded == "left" else right

    def dot(part: str) -> str:
        return f"tl.dot({part}, {right}, {acc})" if rounded == "left" else f"tl.dot({left}, {part}, {acc})"
    if not split:
        return f"        {acc} = {dot(f'({tile}).to({elem}){widen}')}"
    return (f"        hi = ({tile}).to({elem})\n        lo = (({tile}) - hi.to(tl.float32)).to({elem})\n"
            f"        {acc} = {dot('hi' + widen)}\n        {acc} = {dot('lo' + widen)}")


def generate(name: str, spec: AttentionSpec, layouts: list[Layout], out_shapes: list[tuple[int, ...]], dtype: str,
             interpret: bool, split: bool = True) -> tuple[KernelSource, KernelSource]:
    """(the dKᵀ/dV kernel, the dQ kernel) for inputs of the given layouts (Q, Kᵀ, V[, mask], lse, dO)."""
    q, kt, v = layouts[:3]
    do_lay = layouts[-1]
    dkt_shape = out_shapes[1]
    batch = tuple(out_shapes[2][:-2])  # dV's batch is the broadcast batch of the forward
    length, head = q.shape[-2], q.shape[-1]
    keys, value_dim = kt.shape[-1], v.shape[-1]
    block_m, block_n, warps = blocks(length, keys, max(head, value_dim), interpret)
    nbatch = 1
    for d in batch:
        nbatch *= d
    offsets = [_batch_offset(batch, _batch_strides(lay, batch)) for lay in layouts[:3]]
    do_off = _batch_offset(batch, _batch_strides(do_lay, batch))
    widen = ".to(tl.float32)" if interpret and dtype == "bfloat16" else ""
    elem = tl_type(as_dtype(dtype))
    factor = (1 / spec.scale if spec.divide else spec.scale)
    mask_args, mask_base, mask_lines = [], "0", ""
    if spec.mask:
        mask_args = ["mask_ptr"]
        m = layouts[3].broadcast_to(tuple(batch) + (length, keys))
        mask_base = _batch_offset(batch, _batch_strides(m, batch))
        mask_lines = f"""
        bias = tl.load(mask_ptr + mask_base + rows[:, None] * {m.strides[-2]} + cols[None, :] * {m.strides[-1]},
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        s = s + bias.to(tl.float32) * {LOG2E!r}"""
    causal = "\n        s = tl.where(rows[:, None] >= cols[None, :], s, float(\"-inf\"))" if spec.causal else ""
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    # dKᵀ's buffer: (d, S) row-major, or (S, d) when the graph's product computes dK itself
    kt_rows = dkt_shape[-2:] == (head, keys)
    dkt_at = f"dims[:, None] * {keys} + cols[None, :]" if kt_rows else f"cols[None, :] * {head} + dims[:, None]"
    args = ", ".join(["q_ptr", "kt_ptr", "v_ptr"] + mask_args + ["lse_ptr", "do_ptr", "dq_ptr", "dkt_ptr", "dv_ptr",
                                                                  "delta_ptr"])
    common = f"""
    pid_b = tl.program_id(1)
    q_base = {offsets[0]}
    kt_base = {offsets[1]}
    v_base = {offsets[2]}
    mask_base = {mask_base}
    do_base = {do_off}
    dims = tl.arange(0, BLOCK_D)
    vdims = tl.arange(0, BLOCK_E)"""

    def rows_block(indent: str) -> str:
        """Loads of a tile of query rows: Q, dO and lse."""
        text = f"""
rows_ok_q = tl.load(q_ptr + q_base + rows[:, None] * {q.strides[-2]} + dims[None, :] * {q.strides[-1]},
                    mask=row_ok[:, None] & (dims[None, :] < {head}), other=0.0){widen}
do = tl.load(do_ptr + do_base + rows[:, None] * {do_lay.strides[-2]} + vdims[None, :] * {do_lay.strides[-1]},
             mask=row_ok[:, None] & (vdims[None, :] < {value_dim}), other=0.0){widen}
lse = tl.load(lse_ptr + pid_b.to(tl.int64) * {length} + rows, mask=row_ok, other=0.0)
lse = tl.where(lse == float("-inf"), 0.0, lse)"""
        return "\n".join(indent + line for line in text.strip("\n").split("\n")).replace("rows_ok_q", "q")

    def cols_block(indent: str) -> str:
        """Loads of a tile of keys: Kᵀ and V."""
        text = f"""
kt = tl.load(kt_ptr + kt_base + dims[:, None] * {kt.strides[-2]} + cols[None, :] * {kt.strides[-1]},
             mask=(dims[:, None] < {head}) & col_ok[None, :], other=0.0){widen}
vt = tl.load(v_ptr + v_base + cols[:, None] * {v.strides[-2]} + vdims[None, :] * {v.strides[-1]},
             mask=col_ok[:, None] & (vdims[None, :] < {value_dim}), other=0.0){widen}"""
        return "\n".join(indent + line for line in text.strip("\n").split("\n"))

    probabilities = f"""
        s = tl.dot(q, kt{precision}) * {factor * LOG2E!r}{mask_lines}{causal}
        s = tl.where(row_ok[:, None] & col_ok[None, :], s, float("-inf"))
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(vt){precision})
        ds = p * (dp - delta[:, None])"""
    # dQ = Σ_j P (dP - Δ) K = Σ_j (P ∘ dP) K - Δ Σ_j P K, with Δ = Σ_j P ∘ dP summed in the same loop: a
    # query whose softmax is one key (the first row of a causal mask) gets exactly 0, as the formula does
    # Δ sums P ∘ dP as the product below sees it (two halves, or one), so that dQ of a one-key softmax is 0
    as_multiplied = ""
    if dtype != "float32":
        as_multiplied = (f"\n        hi = pdp.to({elem})\n        pdp = hi.to(tl.float32) + (pdp - hi.to(tl.float32))"
                         f".to({elem}).to(tl.float32)" if split else f"\n        pdp = pdp.to({elem}).to(tl.float32)")
    q_loop = f"""
        s = tl.dot(q, kt{precision}) * {factor * LOG2E!r}{mask_lines}{causal}
        s = tl.where(row_ok[:, None] & col_ok[None, :], s, float("-inf"))
        p = tl.exp2(s - lse[:, None])
        dp = tl.dot(do, tl.trans(vt){precision})
        pdp = p * dp{as_multiplied}
        delta += tl.sum(pdp, 1)"""
    start_m = "(pid_n * BLOCK_N // BLOCK_M) * BLOCK_M" if spec.causal else "0"
    kv_src = header(f"attention backward (dK, dV) kernel {name}", interpret) + f'''

@triton.jit
def {name}_dkv({args}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               BLOCK_E: tl.constexpr):
    pid_n = tl.program_id(0){common}
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < {keys}
{cols_block("    ")}
    dv = tl.zeros([BLOCK_N, BLOCK_E], tl.float32)
    dkt = tl.zeros([BLOCK_D, BLOCK_N], tl.float32)
    for start in range({start_m}, {length}, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_ok = rows < {length}
{rows_block("        ")}
        delta = tl.load(delta_ptr + pid_b.to(tl.int64) * {length} + rows, mask=row_ok, other=0.0){probabilities}
{_mm("dv", "tl.trans(p)", "do", "left", dtype, split, widen)}
{_mm("dkt", "tl.trans(q)", "ds", "right", dtype, split, widen)}
    out_base = pid_b.to(tl.int64)
    tl.store(dv_ptr + out_base * {keys * value_dim} + cols[:, None] * {value_dim} + vdims[None, :],
             dv.to({elem}), mask=col_ok[:, None] & (vdims[None, :] < {value_dim}))
    tl.store(dkt_ptr + out_base * {keys * head} + {dkt_at}, (dkt * {factor!r}).to({elem}),
             mask=(dims[:, None] < {head}) & col_ok[None, :])
'''
    end = f"tl.minimum({keys}, (pid_m + 1) * BLOCK_M)" if spec.causal else str(keys)
    q_src = header(f"attention backward (dQ) kernel {name}", interpret) + f'''

@triton.jit
def {name}_dq({args}, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              BLOCK_E: tl.constexpr):
    pid_m = tl.program_id(0){common}
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < {length}
{rows_block("    ")}
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    pk = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    delta = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, {end}, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < {keys}
{cols_block("        ")}{q_loop}
{_mm("dq", "pdp", "tl.trans(kt)", "left", dtype, split, widen)}
{_mm("pk", "p", "tl.trans(kt)", "left", dtype, split, widen)}
    dq = dq - delta[:, None] * pk
    tl.store(delta_ptr + pid_b.to(tl.int64) * {length} + rows, delta, mask=row_ok)
    tl.store(dq_ptr + pid_b.to(tl.int64) * {length * head} + rows[:, None] * {head} + dims[None, :],
             (dq * {factor!r}).to({elem}), mask=row_ok[:, None] & (dims[None, :] < {head}))
'''
    constexprs = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_D": _pow2(head), "BLOCK_E": _pow2(value_dim)}
    kv = KernelSource(f"{name}_dkv", kv_src, ((keys + block_n - 1) // block_n, nbatch), warps, constexprs,
                      "attention")
    dq = KernelSource(f"{name}_dq", q_src, ((length + block_m - 1) // block_m, nbatch), warps, constexprs,
                      "attention")
    return kv, dq
