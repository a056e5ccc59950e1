"""The matmul template: a tiled matrix product whose operand loads compute their elementwise producers
(a prologue) and whose accumulator feeds its elementwise consumers (an epilogue), in one Triton kernel.

A matmul kernel's body (passes/prologue.py builds it) holds, per operand of the product, either the
placeholder it reads or the elementwise ops that compute it from placeholders, optionally followed by a
`transpose` view (the operand is the value read through a permutation of its axes), then the product,
then the epilogue. Every prologue op has the shape of the value it computes; its inputs are loaded
through their strided layouts broadcast to that shape, permuted by the view and broadcast over the
product's batch axes, so per-row statistics (M, 1), per-column factors (K,), transposed or sliced
inputs cost no copy. Loads that do not move with the contraction axis (a row's mean and rstd) and the
ops on them are hoisted out of the loop over K.

Values are computed as everywhere else (codegen/common.py: half types in float32, rounded where the IR
casts); each operand is rounded to the product's dtype before `tl.dot`, as the op-by-op run stores it,
so the tile product sees the values the vendor GEMM would. float32 products use IEEE precision (never
TF32): torch's default for cuBLAS. Lanes past the edges of the operands are zero after the prologue
(a prologue of zeros need not be zero: `+ beta`).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes
from ..ir import Operation, Tensor
from ..ops.movement import swap_permutation
from ..registry import ELEMENTWISE, lookup
from .common import Layout, compute_dtype, expression, flat_dims, header, index_expr, literal, tl_type
from .pointwise import KernelSource

DOT_DTYPES = ("float16", "bfloat16", "float32")
GROUP_M = 8  # programs walk the output in groups of 8 row blocks, so the B tiles they share stay in L2


@dataclass
class Prologue:
    """The elementwise ops (and scalar constants) that compute one operand, in body order; `value` is what
    they compute, `view` the transpose the product reads it through (None: read as is) and `perm` its
    permutation (operand axis i is value axis perm[i])."""

    ops: list[Operation]
    value: Tensor
    view: Operation | None
    perm: tuple[int, ...]


@dataclass
class MatmulParts:
    """A matmul body taken apart: the product, a Prologue or None per operand, the epilogue's ops."""

    contraction: Operation
    prologues: list[Prologue | None]
    epilogue: list[Operation]


def view_permutation(op: Operation) -> tuple[int, ...] | None:
    """The axis permutation of a `transpose` op (output axis i is input axis perm[i]); None for other ops."""
    if op.op != "transpose":
        return None
    swap = op.attrs.get("swap")
    return tuple(swap_permutation(swap, op.inputs[0].rank)) if swap is not None else tuple(op.attrs["permutation"])


def computed_by(value: Tensor, within: set[int]) -> list[Operation]:
    """The non-placeholder ops among `within` (op ids) that `value` needs, found by walking its inputs."""
    seen: dict[int, Operation] = {}
    stack = [value]
    while stack:
        t = stack.pop()
        op = t.op
        if op.id in seen or op.op == "placeholder" or op.id not in within:
            continue
        seen[op.id] = op
        stack.extend(op.inputs)
    return list(seen.values())


def split(body) -> MatmulParts:
    """Take a matmul kernel's body apart (see the module docstring for its form)."""
    ops = body.operations
    contraction = next(op for op in ops if lookup(op.op).vendor is not None)
    ids = {op.id for op in ops}
    prologues: list[Prologue | None] = []
    taken: set[int] = set()
    for t in contraction.inputs:
        if t.op.op == "placeholder":
            prologues.append(None)
            continue
        view, perm, value = None, tuple(range(t.rank)), t
        if lookup(t.op.op).view is not None:
            view, perm, value = t.op, view_permutation(t.op), t.op.inputs[0]
        mine = computed_by(value, ids)
        position = {op.id: i for i, op in enumerate(ops)}
        mine.sort(key=lambda op: position[op.id])
        prologues.append(Prologue(mine, value, view, perm))
        taken |= {op.id for op in mine} | ({view.id} if view is not None else set())
    epilogue = [op for op in ops if op.op != "placeholder" and op is not contraction and op.id not in taken]
    return MatmulParts(contraction, prologues, epilogue)


def fusable_prologue_op(op: Operation, shape: tuple[int, ...]) -> str:
    """Why `op` cannot be part of a prologue computing a value of `shape` ("" when it can)."""
    if op.op == "constant":
        return "" if op.outputs[0].type.numel() == 1 else f"constant {op.name} is not a scalar"
    if lookup(op.op).kind != ELEMENTWISE:
        return f"{op.op} ({op.name}) is not elementwise"
    if op.outputs[0].shape != shape:
        return f"{op.op} ({op.name}) has shape {op.outputs[0].shape}, not the operand's {shape}"
    if op.op in ("floor_division", "modulo") and not op.inputs[0].dtype.is_floating:
        return f"{op.op} ({op.name}) divides integers (a kernel flags zero divisors only in its own template)"
    return ""


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def blocks(m: int, n: int, k: int, dtype: str, interpret: bool, options: dict) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); `options["matmul_blocks"]` overrides."""
    if "matmul_blocks" in options:
        return tuple(options["matmul_blocks"])
    if interpret:  # the interpreter pays per program: few, small-enough tiles
        return max(16, min(64, _pow2(m))), max(16, min(64, _pow2(n))), max(16, min(32, _pow2(k))), 4, 1
    if dtype == "float32":
        return max(16, min(64, _pow2(m))), max(16, min(64, _pow2(n))), 32, 4, 3
    if m >= 128 and n >= 128:
        return 128, 128, 64, 8, 3
    return max(16, min(64, _pow2(m))), max(16, min(128, _pow2(n))), 64 if k >= 64 else max(16, _pow2(k)), 4, 3


def more_blocks(m: int, n: int, dtype: str) -> list[tuple[int, int, int, int, int]]:
    """Other tiles worth timing against `blocks`' on a GPU (a measured choice runs each once): wider
    tiles reuse each A tile, the prologue's work included, over more columns."""
    if dtype == "float32" or m < 256 or n < 256:
        return []
    return [(128, 256, 64, 8, 3)]


class TileEmitter:
    """Triton source for elementwise ops on the tiles of a matmul kernel: lines before the loop over K
    (`hoisted`, 4 spaces in) and inside it (`looped`, 8 spaces in), variables named from one counter.

    `lanes` maps a tile axis ("m", "n", "k") to the names of its index vector and mask; a kernel that
    computes an epilogue on part of a tile at a time changes them between calls."""

    def __init__(self, placeholders: list[Tensor], layouts: list[Layout], batch: tuple[int, ...]):
        self.arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
        self.layout_of = {t.id: lay for t, lay in zip(placeholders, layouts)}
        self.batch = batch
        self.hoisted: list[str] = []
        self.looped: list[str] = []
        self.names = iter(range(1 << 30))
        self.lanes = {"m": ("rm", "m_ok"), "n": ("rn", "n_ok"), "k": ("rk", "k_ok")}

    def load(self, t: Tensor, lay: Layout, row: str, col: str, convert: bool = True) -> tuple[str, bool]:
        """Load placeholder `t` through `lay` (over batch + the two tile axes) at lanes `row` x `col`, in
        its compute type (`convert`) or its own: the variable and whether it moves with K."""
        nb = len(self.batch)
        base = index_expr("bid", flat_dims(lay, list(range(nb))))
        terms = [] if base == "0" else [f"({base})"]
        mask, moves = [], False
        for axis, stride, where in ((row, lay.strides[nb], "[:, None]"), (col, lay.strides[nb + 1], "[None, :]")):
            lane, ok = self.lanes[axis]
            if stride:  # a broadcast axis (stride 0) leaves the load a row, a column or a scalar
                terms.append(f"{lane}{where}" if stride == 1 else f"{lane}{where} * {stride}")
                mask.append(f"{ok}{where}")
                moves = moves or axis == "k"
        var = f"x{next(self.names)}"
        ptr = self.arg_of[t.id] + (f" + {lay.offset}" if lay.offset else "")
        masked = f", mask={' & '.join(mask)}, other=0" if mask else ""
        text = f"tl.load({ptr} + {' + '.join(terms)}{masked})" if terms else f"tl.load({ptr})"
        text = f"{text}.to({tl_type(compute_dtype(t.dtype))})" if convert else text
        (self.looped if moves else self.hoisted).append(f"{'        ' if moves else '    '}{var} = {text}")
        return var, moves

    def emit(self, ops: list[Operation], frame_layout, row: str, col: str, value: dict, moving: dict) -> None:
        """Emit elementwise `ops`; `frame_layout(t)` is a placeholder's layout over batch + tile axes."""
        for op in ops:
            o = op.outputs[0]
            if op.op == "constant":
                value[o.id], moving[o.id] = literal(op.attrs["value"], o.dtype), False
                continue
            args, moves = [], False
            for t in op.inputs:
                if t.id not in value:
                    value[t.id], moving[t.id] = self.load(t, frame_layout(t), row, col)
                args.append(value[t.id])
                moves = moves or moving[t.id]
            var = f"v{next(self.names)}"
            (self.looped if moves else self.hoisted).append(
                f"{'        ' if moves else '    '}{var} = {expression(op, args)}")
            value[o.id], moving[o.id] = var, moves

    def epilogue(self, parts: MatmulParts, out: Tensor, accumulator: str) -> tuple[list[str], dict[int, str]]:
        """The epilogue's lines on the product's tile held in `accumulator` (taken out of `hoisted`), and
        the variable of every value it computes, the product's included."""
        value = {out.id: accumulator}
        moving: dict[int, bool] = {out.id: False}
        before = len(self.hoisted)
        self.emit(parts.epilogue, lambda x: self.layout_of[x.id].broadcast_to(out.shape), "m", "n", value, moving)
        lines = self.hoisted[before:]
        del self.hoisted[before:]
        if any(moving.values()):
            raise AssertionError("an epilogue value moves with K")
        return lines, value


def rounded(acc: str, dt) -> str:
    """The float32 accumulator `acc` as the product's value: rounded once to a half type, as the vendor
    GEMM stores it."""
    return acc if dt == compute_dtype(dt) else f"{acc}.to({tl_type(dt)}).to(tl.float32)"


def generate(name: str, body, in_layouts: list[Layout], interpret: bool, options: dict | None = None) -> KernelSource:
    """Triton source for a matmul kernel `body` (a Program) reading inputs of the given layouts."""
    options = options or {}
    parts = split(body)
    product = parts.contraction
    if product.op != "matrix_multiplication":
        raise NotImplementedError(f"{product.op} has no Triton template")
    out = product.outputs[0]
    dt = out.dtype
    if dt.name not in DOT_DTYPES:
        raise NotImplementedError(f"tl.dot takes {', '.join(DOT_DTYPES)}, not {dt.name}")
    batch = out.shape[:-2]
    m, n = out.shape[-2:]
    k = product.inputs[0].shape[-1]
    nbatch = 1
    for d in batch:
        nbatch *= d
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    sizes = [t.type.numel() for t in placeholders] + [t.type.numel() for t in body.outputs]
    wide = max(sizes + [nbatch * m * n]) >= 2**31 - 2**20
    em = TileEmitter(placeholders, in_layouts, batch)
    hoisted, looped = em.hoisted, em.looped
    dot_type = tl_type(dt)
    # the interpreter holds bfloat16 as raw 16-bit integers, which its tl.dot multiplies as integers: there
    # the rounded operands are widened to float32 (values unchanged, products exact)
    widen = ".to(tl.float32)" if interpret and dt == dtypes.bfloat16 else ""
    operands = []
    for j, (t, pro) in enumerate(zip(product.inputs, parts.prologues)):
        row, col = ("m", "k") if j == 0 else ("k", "n")
        tile_shape = batch + t.shape[-2:]
        value: dict[int, str] = {}
        moving: dict[int, bool] = {}
        if pro is None:
            lay = em.layout_of[t.id].broadcast_to(tile_shape)
            var = em.load(t, lay, row, col, convert=False)[0]
            if all(lay.strides[-2:]):
                operands.append(var + widen)
                continue
            src = var  # a broadcast operand: its load is a row or a column, the dot takes a whole tile
        else:
            def frame_layout(x: Tensor, pro=pro, tile_shape=tile_shape) -> Layout:
                lay = em.layout_of[x.id].broadcast_to(pro.value.shape)
                lay = Layout(tuple(lay.shape[p] for p in pro.perm), tuple(lay.strides[p] for p in pro.perm), lay.offset)
                return lay.broadcast_to(tile_shape)

            em.emit(pro.ops, frame_layout, row, col, value, moving)
            src = value[pro.value.id]
        mask = f"{em.lanes[row][1]}[:, None] & {em.lanes[col][1]}[None, :]"
        src = f"tl.where({mask}, {src}, 0.0)"
        var = "a" if j == 0 else "b"
        looped.append(f"        {var} = ({src}).to({dot_type}){widen}")
        operands.append(var)
    precision = ', input_precision="ieee"' if dt == dtypes.float32 or widen else ""
    looped.append(f"        acc = tl.dot({operands[0]}, {operands[1]}, acc{precision})")

    # The epilogue runs on the accumulator's tile, hoisted lines and all, after the loop.
    epilogue_lines, value = em.epilogue(parts, out, "c")
    stores = []
    for i, t in enumerate(body.outputs):
        if t.shape != out.shape:
            raise NotImplementedError(f"matmul kernel output {t.name} of shape {t.shape} is not the product's "
                                      f"{out.shape}")
        v = value.get(t.id, rounded("acc", dt))
        stores.append(f"    tl.store(out{i} + out_base + rm[:, None] * {n} + rn[None, :], "
                      f"({v}).to({tl_type(t.dtype)}), mask=m_ok[:, None] & n_ok[None, :])")
    bm, bn, bk, warps, stages = blocks(m, n, k, dt.name, interpret, options)
    params = ", ".join([em.arg_of[t.id] for t in placeholders] + [f"out{i}" for i in range(len(body.outputs))])
    cast = ".to(tl.int64)" if wide else ""
    src = header(f"matmul kernel {name}", interpret) + f'''

@triton.jit
def {name}({params}, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    bid = tl.program_id(1){cast}
    blocks_m = tl.cdiv(M, BLOCK_M)
    blocks_n = {-(-n // bn)}
    group = pid // ({GROUP_M} * blocks_n)
    first_m = group * {GROUP_M}
    rows_here = tl.minimum(blocks_m - first_m, {GROUP_M})
    pid_m = first_m + (pid % ({GROUP_M} * blocks_n)) % rows_here
    pid_n = (pid % ({GROUP_M} * blocks_n)) // rows_here
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)){cast}
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)){cast}
    m_ok = rm < M
    n_ok = rn < {n}
    out_base = bid * M * {n}
''' + "\n".join(hoisted) + f'''
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, {k}, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < {k}
''' + "\n".join(looped) + f'''
    c = {rounded("acc", dt)}
''' + "\n".join(epilogue_lines + stores) + "\n"
    grid = (-(-m // bm) * -(-n // bn), nbatch)
    return KernelSource(name, src, grid, warps, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, "matmul",
                        sizes=(m,), num_stages=stages)
