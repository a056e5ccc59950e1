"""The product-arg-max template: argmax over the last axis of a pointwise function of h @ W, in one kernel.

One program computes BLOCK_B rows: the whole row of the product (N columns,
at most MAX_COLUMNS: one tile), the pointwise epilogue on it in registers
(the registry's Triton expressions, as the pointwise template emits them),
and the index of each row's maximum, stored as int64. This is how a token is
picked from an output layer (greedy: the logits; Gumbel-max sampling: logits
/ T plus the step's noise), so the logits never reach memory and one launch
replaces the product, its epilogue and the arg maximum.

As torch.argmax: the first index of the maximum; a NaN counts as the maximum
(the first NaN wins). Operands of the epilogue broadcast to (B, N); one made
by `gather(table, i, axis=0)` with a scalar i is read in place at row i of the
table (negative i counts from the end; an i outside [-len, len) reads zeros
and flags the run, which then raises as the gather would).
"""
from __future__ import annotations

from ..ir import Tensor
from .common import Layout, compute_dtype, expression, header, literal, tl_type
from .pointwise import KernelSource

MAX_COLUMNS = 2048  # a row of the product lives in registers


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def epilogue(body, layout_of: dict, arg_of: dict, frame: tuple[int, int], first_check: int
             ) -> tuple[list[str], str, list]:
    """The lines computing the arg maximum's operand from the product `p` (BLOCK_B, BLOCK_N) in registers:
    the body's pointwise ops, their operands loaded as `layout_of` and `arg_of` (placeholder id -> Layout,
    argument name) say. The code reads `rows`, `cols` and `both`, and flags `err` with codes from
    `first_check` on. Returns (lines, the operand's expression, the gathers it flags)."""
    product = next(op for op in body.operations if op.op == "matrix_multiplication")
    arg = body.outputs[0].op
    checks: list = []
    lines: list[str] = []
    value: dict[int, str] = {product.outputs[0].id: "p"}

    def elem_of(t: Tensor) -> str:
        return tl_type(compute_dtype(t.dtype))

    def load(t: Tensor) -> str:
        if t.id in value:
            return value[t.id]
        var = f"x{len(value)}"
        if t.op.op == "gather":
            table, index = t.op.inputs
            lay = layout_of[table.id]
            rest = Layout(lay.shape[1:], lay.strides[1:]).broadcast_to(frame)
            code = first_check + len(checks)
            checks.append(t.op)
            lines.append(f"""    row = tl.load({arg_of[index.id]}).to(tl.int64)
    row = tl.where(row < 0, row + {lay.shape[0]}, row)
    row_ok = (row >= 0) & (row < {lay.shape[0]})
    tl.atomic_min(err, {code}, mask=~row_ok)
    {var} = tl.load({arg_of[table.id]} + row * {lay.strides[0]} + rows[:, None] * {rest.strides[0]}
                + cols[None, :] * {rest.strides[1]}, mask=both & row_ok, other=0).to({elem_of(t)})""")
        else:
            lay = layout_of[t.id].broadcast_to(frame)
            if lay.strides == (0, 0):
                lines.append(f"    {var} = tl.load({arg_of[t.id]}).to({elem_of(t)})")
            else:
                lines.append(f"    {var} = tl.load({arg_of[t.id]} + rows[:, None] * {lay.strides[0]} + cols[None, :] * "
                             f"{lay.strides[1]}, mask=both, other=0).to({elem_of(t)})")
        value[t.id] = var
        return var

    for k, op in enumerate(body.operations):
        if op.op in ("placeholder", "matrix_multiplication", "gather") or op is arg:
            continue
        out = op.outputs[0]
        if op.op == "constant":
            value[out.id] = literal(op.attrs["value"], out.dtype)
            continue
        args = [load(t) for t in op.inputs]
        lines.append(f"    v{k} = {expression(op, args)}")
        value[out.id] = f"v{k}"
    return lines, load(arg.inputs[0]), checks


def arg_max(z: str, out: str, indent: str) -> str:
    """Lines storing each row's arg maximum of `z` (BLOCK_B, BLOCK_N) at `out + rows` (see the module
    docstring for NaN and ties); they read `cols`, `col_in`, `rows` and `row_in`."""
    return "".join(f"{indent}{line}\n" for line in f"""z = {z}
nan = (z != z) & col_in[None, :]
first_nan = tl.min(tl.where(nan, cols[None, :], BLOCK_N), axis=1)
key = tl.where(col_in[None, :] & ~nan, z, -INF)
best = tl.argmax(key, axis=1, tie_break_left=True)
index = tl.where(first_nan < BLOCK_N, first_nan, best)
tl.store({out} + rows, index.to(tl.int64), mask=row_in)""".splitlines())


def generate(name: str, body, layouts: list[Layout], interpret: bool, options: dict) -> KernelSource:
    """Triton source for a product_arg_max `body` (passes/recurrent.py) reading inputs of these layouts: the
    product's operands first, then the epilogue's."""
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    layout_of = {t.id: lay for t, lay in zip(placeholders, layouts)}
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    product = next(op for op in body.operations if op.op == "matrix_multiplication")
    h, w = (layout_of[t.id] for t in product.inputs)
    batch, depth = h.shape
    columns = w.shape[1]
    frame = (batch, columns)
    dtype = product.outputs[0].dtype
    elem = tl_type(compute_dtype(dtype))
    # options (benchmarks tune them; tests force tl.dot): arg_max_dot, arg_max_block_batch, _depth, arg_max_warps
    dot = options.get("arg_max_dot", batch >= 16 and dtype.name == "float32" and not interpret)
    block_n = max(16, _pow2(columns))
    block_b = options.get("arg_max_block_batch", 16 if dot else 1)
    block_k = options.get("arg_max_block_depth", 32 if dot else max(1, min(64, 8192 // block_n)))
    warps = options.get("arg_max_warps", 8)
    if interpret and not dot:  # small tiles: the interpreter's time grows with them
        block_b, block_k = min(block_b, _pow2(batch)), min(block_k, 16)
    lines, z, checks = epilogue(body, layout_of, arg_of, frame, options.get("first_check", 0))
    if dot:
        precision = ', input_precision="ieee"' if dtype.name == "float32" else ""
        accumulate = f"        acc = tl.dot(a, w, acc{precision})"
        shape, finish = "(BLOCK_B, BLOCK_N)", "acc"
    else:
        accumulate = "        acc += a[:, :, None] * w[None, :, :]"
        shape, finish = "(BLOCK_B, BLOCK_K, BLOCK_N)", "tl.sum(acc, axis=1)"
    params = ", ".join([arg_of[t.id] for t in placeholders] + ["out"] + (["err"] if checks else []))
    src = header(f"product-arg-max kernel {name}", interpret) + f'''

@triton.jit
def {name}({params}, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_N)
    row_in = rows < {batch}
    col_in = cols < {columns}
    both = row_in[:, None] & col_in[None, :]
    acc = tl.zeros({shape}, {elem})
    for k0 in range(0, {depth}, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < {depth}
        a = tl.load({arg_of[product.inputs[0].id]} + rows[:, None].to(tl.int64) * {h.strides[0]}
                    + ks[None, :] * {h.strides[1]}, mask=row_in[:, None] & k_ok[None, :], other=0.0).to({elem})
        w = tl.load({arg_of[product.inputs[1].id]} + ks[:, None] * {w.strides[0]} + cols[None, :] * {w.strides[1]},
                    mask=k_ok[:, None] & col_in[None, :], other=0.0).to({elem})
{accumulate}
    p = {finish}
''' + "\n".join(lines) + "\n" + arg_max(z, "out", "    ")
    grid = ((batch + block_b - 1) // block_b,)
    return KernelSource(name, src, grid, warps, {"BLOCK_B": block_b, "BLOCK_N": block_n, "BLOCK_K": block_k},
                        "product_arg_max", tuple(checks))
