"""The LSTM-cell template: one step of an LSTM layer, the gate products and the update, in one kernel.

    gates = x @ A + h @ B [+ bias]      A (I, 4H), B (H, 4H): W_ihᵀ, W_hhᵀ read through their strides
                                        (h any (B, K) with B (K, 4H): the kernel only sums two products)
    c' = σ(f) c + σ(i) tanh(g)          gates split i, f, g, o (PyTorch's order)
    h' = σ(o) tanh(c')

One program computes BLOCK_H hidden units of BLOCK_B batch rows: the four
gate columns of those units (4 · BLOCK_H columns of A and B), so the gates
never leave registers and one launch replaces two products, their sum and
the pointwise update. At batch 1 the step is a matrix-vector product bound
by reading the weights, so the hidden units are spread over enough programs
to keep every SM loading (BLOCK_H small); each program keeps a
(BLOCK_B, BLOCK_K, BLOCK_H) partial product per gate and reduces it once
after the K loop. From batch 16 on the partial products are `tl.dot` tiles
(IEEE float32, never TF32).

`x` may come from a gather: with `gather` the first two inputs are a table
(N, I) and int indices (B,), and row b of x is table[index[b]] (negative
indices count from the end). An index outside [-N, N) reads zeros and flags
the run (`err`, see codegen/common.py), which then raises as the gather would.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import as_dtype
from ..registry import lookup
from .common import Layout, header, tl_type
from .pointwise import KernelSource


@dataclass(frozen=True)
class LstmSpec:
    """What the pass found: whether there is a bias, and whether x is gathered from a table."""

    bias: bool
    gather: bool


@dataclass(frozen=True)
class LstmBlocks:
    """Launch blocks: batch rows, hidden units and reduction depth per program, warps, and whether the
    partial products are `tl.dot` tiles."""

    batch: int
    hidden: int
    depth: int
    warps: int
    dot: bool


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def blocks(batch: int, hidden: int, dtype: str, interpret: bool, options: dict) -> LstmBlocks:
    """The launch blocks for a (batch, hidden) step. `options` may set lstm_dot, lstm_block_batch,
    lstm_block_hidden, lstm_block_depth and lstm_warps (benchmarks tune them; tests force `tl.dot`)."""
    dot = options.get("lstm_dot", batch >= 16 and dtype == "float32" and not interpret)
    if dot:  # tl.dot tiles are at least 16 x 16
        b, h, k, w = 16 if batch <= 16 or interpret else 32, 16, 32, 4
    else:
        b = min(_pow2(batch), 8)
        h, k, w = 4 if batch <= 2 else 8, max(16, 128 // b), 4
        if interpret:  # small tiles: the interpreter's time grows with them
            h, k = min(h, _pow2(hidden)), 32
    return LstmBlocks(options.get("lstm_block_batch", b), options.get("lstm_block_hidden", h),
                      options.get("lstm_block_depth", k), options.get("lstm_warps", w), dot)


def _accumulate(gate: int, source: str, weights: str, lay: Layout, hidden: int, dot: bool, precision: str) -> str:
    """The lines adding one K tile of `source` (a (BLOCK_B, BLOCK_K) tile) times gate `gate`'s columns of
    `weights` to that gate's accumulator."""
    cols = f"({gate * hidden} + units)" if gate else "units"
    load = (f"        w = tl.load({weights} + ks[:, None] * {lay.strides[0]} + {cols}[None, :] * {lay.strides[1]},\n"
            f"                    mask=k_ok[:, None] & unit_ok[None, :], other=0.0)\n")
    if dot:
        return load + f"        acc{gate} = tl.dot({source}, w, acc{gate}{precision})\n"
    return load + f"        acc{gate} += {source}[:, :, None] * w[None, :, :]\n"


def generate(name: str, spec: LstmSpec, layouts: list[Layout], batch: int, hidden: int, dtype: str,
             interpret: bool, options: dict) -> KernelSource:
    """Triton source of the cell for inputs of the given layouts: x (or table and indices), A, h, B, c[, bias].
    Outputs h' and c', (batch, hidden) row-major. With `gather`, options["first_check"] is the flag code of
    an out-of-range index."""
    first_check = options.get("first_check", 0)
    lays = list(layouts)
    x = lays.pop(0)
    index = lays.pop(0) if spec.gather else None
    a, h, b, c = lays[:4]
    bias = lays[4] if spec.bias else None
    width = a.shape[0]
    cfg = blocks(batch, hidden, dtype, interpret, options)
    elem = tl_type(as_dtype(dtype))
    precision = ', input_precision="ieee"' if dtype == "float32" else ""
    shape = "(BLOCK_B, BLOCK_H)" if cfg.dot else "(BLOCK_B, BLOCK_K, BLOCK_H)"
    args = ["x_ptr"] + (["index_ptr"] if spec.gather else []) + ["a_ptr", "h_ptr", "b_ptr", "c_ptr"] + \
        (["bias_ptr"] if spec.bias else []) + ["h_out", "c_out"] + (["err"] if spec.gather else [])
    if spec.gather:
        rows_of_x = f"""    index = tl.load(index_ptr + rows * {index.strides[0]}, mask=row_ok, other=0).to(tl.int64)
    index = tl.where(index < 0, index + {x.shape[0]}, index)
    x_ok = row_ok & (index >= 0) & (index < {x.shape[0]})
    tl.atomic_min(err + rows * 0, {first_check}, mask=row_ok & ~x_ok)
    x_rows = index * {x.strides[0]}
"""
    else:
        rows_of_x = f"    x_ok = row_ok\n    x_rows = rows.to(tl.int64) * {x.strides[0]}\n"

    def loop(source_ptr: str, rows: str, ok: str, src: Layout, weights: str, lay: Layout, extent: int) -> str:
        body = "".join(_accumulate(k, "v", weights, lay, hidden, cfg.dot, precision) for k in range(4))
        return f"""    for k0 in range(0, {extent}, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < {extent}
        v = tl.load({source_ptr} + {rows}[:, None] + ks[None, :] * {src.strides[1]}, mask={ok}[:, None] & k_ok[None, :],
                    other=0.0)
{body}"""

    finish = "\n".join(f"    g{k} = acc{k}" if cfg.dot else f"    g{k} = tl.sum(acc{k}, axis=1)" for k in range(4))
    if spec.bias:
        finish += "\n" + "\n".join(
            f"    g{k} += tl.load(bias_ptr + ({k * hidden} + units) * {bias.strides[-1]}, mask=unit_ok, "
            f"other=0.0)[None, :]" for k in range(4))
    products = loop("x_ptr", "x_rows", "x_ok", x, "a_ptr", a, width) + \
        loop("h_ptr", "h_rows", "row_ok", h, "b_ptr", b, b.shape[0])
    sigmoid, tanh = lookup("sigmoid").triton, lookup("tanh").triton
    src = header(f"LSTM cell kernel {name}", interpret) + f'''

@triton.jit
def {name}({", ".join(args)}, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_B + tl.arange(0, BLOCK_B)
    units = tl.program_id(0) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < {batch}
    unit_ok = units < {hidden}
{rows_of_x}    h_rows = rows.to(tl.int64) * {h.strides[0]}
    acc0 = tl.zeros({shape}, {elem})
    acc1 = tl.zeros({shape}, {elem})
    acc2 = tl.zeros({shape}, {elem})
    acc3 = tl.zeros({shape}, {elem})
{products}{finish}
    both = row_ok[:, None] & unit_ok[None, :]
    c = tl.load(c_ptr + rows[:, None].to(tl.int64) * {c.strides[0]} + units[None, :] * {c.strides[1]}, mask=both,
                other=0.0).to({elem})
    c_next = {sigmoid.format("g1")} * c + {sigmoid.format("g0")} * {tanh.format("g2")}
    h_next = {sigmoid.format("g3")} * {tanh.format("c_next")}
    out = rows[:, None].to(tl.int64) * {hidden} + units[None, :]
    tl.store(h_out + out, h_next.to({elem}), mask=both)
    tl.store(c_out + out, c_next.to({elem}), mask=both)
'''
    grid = ((hidden + cfg.hidden - 1) // cfg.hidden, (batch + cfg.batch - 1) // cfg.batch)
    constexprs = {"BLOCK_B": cfg.batch, "BLOCK_H": cfg.hidden, "BLOCK_K": cfg.depth}
    return KernelSource(name, src, grid, cfg.warps, constexprs, "lstm_cell")
