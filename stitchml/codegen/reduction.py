"""The reduction template: a frame S reduced over axes A, with the elementwise
work before, between and after the reductions in the same kernel.

The frame is viewed as rows r (the kept axes, in order) by columns c (the
reduced axes, in order). FULL values are [BLOCK_R, BLOCK_C] tiles, ROW values
[BLOCK_R, 1]; a ROW value read by a FULL op broadcasts along the columns.

* persistent rows (C <= MAX_PERSISTENT): a program loads whole rows once,
  computes every reduction in registers and stores every output: one read
  and one write of the data (softmax, layer norm, cross entropy);
* looped rows: each reduction gets a pass over its row in BLOCK_C chunks,
  recomputing the elementwise ops it needs; a last pass stores FULL outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Operation, Tensor
from ..registry import Combine, lookup
from .common import (Layout, checks_divisor, compute_dtype, divisor_check, expression, header, index_expr,
                     literal, tl_type)
from .pointwise import KernelSource, other_blocks

MAX_PERSISTENT = 16384  # columns a program keeps in registers
LOOP_BLOCK = 4096
PROGRAMS_PER_SM = 4  # split a reduction when its rows alone leave the GPU this empty
SPLIT_MIN_COLUMNS = 2 * LOOP_BLOCK


@dataclass
class SplitSource:
    """A reduction done in two kernels: partial results per column chunk, then a finishing pass."""

    partial: KernelSource
    finish: KernelSource
    splits: int


def split_factor(body, sm_count: int) -> int:
    """How many column chunks a reduction kernel's rows are cut into (1: no split).

    Splitting pays when the rows are too few to fill the GPU and the columns
    long (bias gradients: a few channels, a whole batch of columns). It is
    done for kernels with one reduction whose outputs are all per row.
    """
    frame, axes, space = body.notes["frame"], body.notes["axes"], body.notes["space"]
    f = _Frame(frame, axes)
    reductions = [op for op in body.operations if _combine(op)]
    if len(reductions) != 1 or f.C <= MAX_PERSISTENT or f.C < SPLIT_MIN_COLUMNS:
        return 1
    after = _descendants(reductions[0], body.operations)
    if any(space.get(t.id, "full") == "full" and t.id in after for t in body.outputs):
        return 1  # a per-element output needs the finished reduction: no split
    want = -(-PROGRAMS_PER_SM * sm_count // f.R)
    return max(1, min(want, f.C // LOOP_BLOCK))

def _combine(op: Operation) -> Combine | None:
    """How a reduction op folds (registry.Combine), or None for every other op."""
    return lookup(op.op).combine


def _accumulator(op: Operation):
    """The type a reduction accumulates in: its result's compute type (a bool sum counts in int64)."""
    return compute_dtype(op.outputs[0].dtype)


def _widen(op: Operation, x: str) -> str:
    """The operand converted to the accumulator type when they differ (bool to int64 for sums)."""
    if compute_dtype(op.inputs[0].dtype) == _accumulator(op):
        return x
    return f"{x}.to({tl_type(_accumulator(op))})"


def _neutral(op: Operation) -> str:
    text = _combine(op).neutral
    dt = compute_dtype(op.inputs[0].dtype)
    if "INF" in text and dt.is_bool:  # bool literals keep tl.where and loop accumulators int1
        return "False" if text == "-INF" else "True"
    if "INF" in text and not dt.is_floating:
        import torch

        info = torch.iinfo(dt.torch)
        return str(info.max if text == "INF" else info.min)
    return text


class _Frame:
    def __init__(self, frame: tuple[int, ...], axes: tuple[int, ...]):
        self.frame, self.axes = frame, axes
        self.kept = [a for a in range(len(frame)) if a not in axes]
        self.R = 1
        for a in self.kept:
            self.R *= frame[a]
        self.C = 1
        for a in axes:
            self.C *= frame[a]
        self.keep_shape = tuple(1 if i in axes else d for i, d in enumerate(frame))

    def full_offset(self, lay: Layout) -> str:
        lay = lay.broadcast_to(self.frame)
        r = index_expr("rows", [(lay.shape[a], lay.strides[a]) for a in self.kept])
        c = index_expr("cols", [(lay.shape[a], lay.strides[a]) for a in self.axes])
        return " + ".join(p for p in (r, c) if p != "0") or "0"

    def row_offset(self, lay: Layout) -> str:
        if len(lay.shape) == len(self.kept) and lay.shape == tuple(self.frame[a] for a in self.kept):
            strides = list(lay.strides)
            full_strides = [0] * len(self.frame)
            for a, s in zip(self.kept, strides):
                full_strides[a] = s
            lay = Layout(self.keep_shape, tuple(full_strides), lay.offset)
        lay = lay.broadcast_to(self.keep_shape)
        return index_expr("rows", [(lay.shape[a], lay.strides[a]) for a in self.kept])


def generate(name: str, body, in_layouts: list[Layout], interpret: bool, options: dict | None = None) -> KernelSource:
    frame, axes, space = body.notes["frame"], body.notes["axes"], body.notes["space"]
    f = _Frame(frame, axes)
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    ops = [op for op in body.operations if op.op != "placeholder"]
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    layout_of = {t.id: lay for t, lay in zip(placeholders, in_layouts)}
    persistent = f.C <= MAX_PERSISTENT
    block_c = 1 << max(f.C - 1, 0).bit_length() if persistent else LOOP_BLOCK
    block_c = max(block_c, 16)

    def rows_block(rows: int) -> tuple[int, int]:
        block_r = max(1, min(1 << max(rows - 1, 0).bit_length(), 4096 // block_c)) if persistent else 1
        # measured on an H200: 16 warps keep 8192-wide rows at ~91% of copy bandwidth
        return block_r, 4 if block_r * block_c <= 4096 else 16

    block_r, warps = rows_block(f.R)
    options = options or {}
    pinned = "reduction_block_r" in options or "reduction_warps" in options
    others = () if pinned else tuple(({"BLOCK_R": r, "BLOCK_C": block_c}, w)
                                     for r, w in other_blocks(rows_block, f.R, (block_r, warps)))
    block_r = options.get("reduction_block_r", block_r) if persistent else block_r
    warps = options.get("reduction_warps", warps)

    def op_space(op: Operation) -> str:
        return space.get(op.outputs[0].id, "full")

    splits = split_factor(body, options.get("sm_count", 132))
    if splits > 1:
        return _split(name, body, f, placeholders, ops, arg_of, layout_of, space, splits, interpret,
                      options.get("first_check", 0))
    gen = _Gen(f, arg_of, layout_of, space, options.get("first_check", 0))
    if persistent:
        body_lines = gen.straight(ops, lambda op: True, store=body.outputs)
    else:
        body_lines = gen.looped(ops, body.outputs, op_space)
    outs = [f"out{j}" for j in range(len(body.outputs))] + (["err"] if gen.checks else [])
    params = ", ".join([arg_of[t.id] for t in placeholders] + outs)
    src = header(f"reduction kernel {name}: rows of {f.C}", interpret, reduction=True) + f'''

@triton.jit(do_not_specialize=["R"])
def {name}({params}, R, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    rmask = rows < R
''' + "\n".join(body_lines) + "\n"
    grid = ((f.R + block_r - 1) // block_r,)
    return KernelSource(name, src, grid, warps, {"BLOCK_R": block_r, "BLOCK_C": block_c}, "reduction",
                        tuple(gen.checks), (f.R,), alternatives=others)


def _split(name, body, f, placeholders, ops, arg_of, layout_of, space, splits, interpret,
           first_check: int) -> SplitSource:
    red = next(op for op in ops if _combine(op))
    chunk = -(-f.C // splits)
    chunk = -(-chunk // LOOP_BLOCK) * LOOP_BLOCK
    splits = -(-f.C // chunk)
    acc_dtype = _accumulator(red)
    params = ", ".join(arg_of[t.id] for t in placeholders)
    gen = _Gen(f, arg_of, layout_of, space, first_check)
    # Stage 1: program (row, chunk) reduces its chunk of columns into part[row, chunk].
    lines: list[str] = []
    env: dict = {}
    for op in ops:
        if op.op == "constant":
            gen.elementwise(op, lines, env)
    acc = gen.fresh("acc")
    lines.append(f"    {acc} = tl.full([BLOCK_R, BLOCK_C], {_neutral(red)}, {tl_type(acc_dtype)})")
    lines.append("    for c0 in range(0, CHUNK, BLOCK_C):")
    inner: list[str] = []
    loop_env = dict(env)
    gen.columns(inner, "tl.program_id(1) * CHUNK + c0")
    for op in _ancestors(red, ops, loop_env):
        gen.elementwise(op, inner, loop_env)
    x = _widen(red, gen.operand(red.inputs[0], True, inner, loop_env))
    inner.append(f"    {acc} = {_combine(red).combine.format(a=acc, b=f'tl.where(mask, {x}, {_neutral(red)})')}")
    full_outs = [(j, t) for j, t in enumerate(body.outputs) if space.get(t.id, "full") == "full"]
    needed = _needed_by(full_outs, ops)
    for op in ops:  # per-element outputs the reduction did not need are computed here too
        if not _combine(op) and op.outputs[0].id in needed and op.outputs[0].id not in loop_env:
            gen.elementwise(op, inner, loop_env)
    for j, t in full_outs:
        gen.store(t, j, inner, loop_env)
    lines.extend("    " + ln for ln in inner)
    lines.append(f"    tl.store(part + rows * {splits} + tl.program_id(1), "
                 f"{_combine(red).finish.format(x=acc)}[:, None], mask=rmask)")
    # Stage 2: combine each row's partials, then the per-row ops and stores.
    fin: list[str] = []
    fenv: dict = {}
    for op in ops:
        if op.op == "constant":
            gen.elementwise(op, fin, fenv)
    fin.append("    chunks = tl.arange(0, BLOCK_S)[None, :]")
    fin.append(f"    pmask = rmask & (chunks < {splits})")
    p = gen.fresh("p")
    fin.append(f"    {p} = tl.load(part + rows * {splits} + chunks, mask=pmask, other={_neutral(red)})")
    r = gen.fresh("r")
    fin.append(f"    {r} = {_combine(red).finish.format(x=p)}[:, None]")
    if _combine(red).mean:
        fin.append(f"    {r} = {r} / {f.C}")
    fenv[red.outputs[0].id] = r
    for op in ops:
        if not _combine(op) and op.op != "constant" and space.get(op.outputs[0].id, "full") == "row":
            gen.elementwise(op, fin, fenv)
    for j, t in enumerate(body.outputs):
        if space.get(t.id, "full") == "row":
            gen.store(t, j, fin, fenv)
    outs = ", ".join([f"out{j}" for j in range(len(body.outputs))] + (["err"] if gen.checks else []))
    block_s = max(16, 1 << max(splits - 1, 0).bit_length())
    src = header(f"split reduction kernel {name}: {f.R} rows of {f.C} in {splits} chunks", interpret, reduction=True) + f'''

@triton.jit
def {name}_partial({params}, part, {outs}, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, CHUNK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    rmask = rows < {f.R}
''' + "\n".join(lines) + f'''


@triton.jit
def {name}({params}, part, {outs}, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    rmask = rows < {f.R}
''' + "\n".join(fin) + "\n"
    block_r = max(1, min(64, 4096 // block_s))
    checks = tuple(gen.checks)
    partial = KernelSource(f"{name}_partial", src, (f.R, splits), 8,
                           {"BLOCK_R": 1, "BLOCK_C": LOOP_BLOCK, "CHUNK": chunk}, "reduction", checks)
    finish = KernelSource(name, src, (-(-f.R // block_r),), 4, {"BLOCK_R": block_r, "BLOCK_S": block_s}, "reduction",
                          checks)
    return SplitSource(partial, finish, splits)


def _needed_by(outputs, ops) -> set[int]:
    """Ids of the tensors the given (index, tensor) outputs are computed from."""
    by_out = {t.id: op for op in ops for t in op.outputs}
    need: set[int] = set()
    stack = [t for _, t in outputs]
    while stack:
        t = stack.pop()
        if t.id in need:
            continue
        need.add(t.id)
        if t.id in by_out:
            stack.extend(by_out[t.id].inputs)
    return need


def _descendants(op: Operation, ops) -> set[int]:
    """Ids of the tensors computed from `op`'s output."""
    seen = {op.outputs[0].id}
    for o in ops:
        if any(t.id in seen for t in o.inputs):
            seen.update(t.id for t in o.outputs)
    return seen


def split_scratch(body, sm_count: int):
    """(shape, dtype) of the partials buffer a split reduction needs, or None."""
    splits = split_factor(body, sm_count)
    if splits == 1:
        return None
    f = _Frame(body.notes["frame"], body.notes["axes"])
    red = next(op for op in body.operations if _combine(op))
    chunk = -(-(-(-f.C // splits)) // LOOP_BLOCK) * LOOP_BLOCK
    return (f.R, -(-f.C // chunk)), _accumulator(red)


class _Gen:
    """Emits loads, elementwise ops, reductions and stores for one kernel."""

    def __init__(self, f: _Frame, arg_of, layout_of, space, first_check: int = 0):
        self.f, self.arg_of, self.layout_of, self.space = f, arg_of, layout_of, space
        self.count = 0
        self.first_check = first_check
        self.checks: list[Operation] = []  # integer divisions flagged (common.DIVISIONS), in code order

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def load(self, t: Tensor, full: bool, lines: list[str], env: dict) -> str:
        key = (t.id, full)
        if key in env:
            return env[key]
        lay = self.layout_of[t.id]
        idx = self.f.full_offset(lay) if full else self.f.row_offset(lay)
        ptr = f"{self.arg_of[t.id]} + {lay.offset}" if lay.offset else self.arg_of[t.id]
        mask = "mask" if full else "rmask"
        var = self.fresh("x")
        if idx == "0":
            lines.append(f"    {var} = tl.load({ptr}).to({tl_type(compute_dtype(t.dtype))})")
        else:
            lines.append(f"    {var} = tl.load({ptr} + {idx}, mask={mask}, other=0).to({tl_type(compute_dtype(t.dtype))})")
        env[key] = var
        return var

    def operand(self, t: Tensor, full: bool, lines, env) -> str:
        if t.id in env:
            return env[t.id]
        return self.load(t, full, lines, env)

    def elementwise(self, op: Operation, lines, env) -> None:
        out = op.outputs[0]
        if op.op == "constant":
            env[out.id] = literal(op.attrs["value"], out.dtype)
            return
        full = self.space.get(out.id, "full") == "full"
        args = [self.operand(t, full, lines, env) for t in op.inputs]
        if checks_divisor(op):  # an op recomputed in several passes keeps its first code
            if not any(o is op for o in self.checks):
                self.checks.append(op)
            code = self.first_check + next(k for k, o in enumerate(self.checks) if o is op)
            lines.append(divisor_check(op, args, code, "mask" if full else "rmask",
                                       "rows * 0 + cols * 0" if full else "rows * 0"))
        var = self.fresh("v")
        lines.append(f"    {var} = {expression(op, args)}")
        env[out.id] = var

    def reduce_tile(self, op: Operation, lines, env) -> None:
        x = _widen(op, self.operand(op.inputs[0], True, lines, env))
        var = self.fresh("r")
        masked = f"tl.where(mask, {x}, {_neutral(op)})"
        lines.append(f"    {var} = {_combine(op).finish.format(x=masked)}[:, None]")
        if _combine(op).mean:
            lines.append(f"    {var} = {var} / {self.f.C}")
        env[op.outputs[0].id] = var

    def store(self, t: Tensor, j: int, lines, env) -> None:
        v = env[t.id]
        if self.space.get(t.id, "full") == "full":
            idx = self.f.full_offset(Layout.contiguous(self.f.frame))
            # The pointer spans the whole [BLOCK_R, BLOCK_C] tile even where the frame has no rows or no
            # columns beyond extent 1 (then the offset lacks that term, or is 0 for a one-element frame).
            idx = " + ".join(([idx] if idx != "0" else []) + [f"{n} * 0" for n in ("rows", "cols") if n not in idx])
            lines.append(f"    tl.store(out{j} + {idx}, ({v}).to({tl_type(t.dtype)}), mask=mask)")
        else:
            lines.append(f"    tl.store(out{j} + rows, tl.broadcast_to(({v}).to({tl_type(t.dtype)}), "
                         f"[BLOCK_R, 1]), mask=rmask)")

    def columns(self, lines, start: str = "0") -> None:
        lines.append(f"    cols = {start} + tl.arange(0, BLOCK_C)[None, :]")
        lines.append(f"    mask = rmask & (cols < {self.f.C})")

    def straight(self, ops, wanted, store) -> list[str]:
        lines: list[str] = []
        env: dict = {}
        self.columns(lines)
        for op in ops:
            if _combine(op):
                self.reduce_tile(op, lines, env)
            else:
                self.elementwise(op, lines, env)
        for j, t in enumerate(store):
            self.store(t, j, lines, env)
        return lines

    def row_ops_now(self, ops, done: set, rows_env: dict, lines: list[str], op_space) -> None:
        """Emit the per-row ops whose inputs are all available."""
        for op in ops:
            if op.id not in done and not _combine(op) and op_space(op) == "row" and \
                    all(t.id in rows_env or t.op.op in ("placeholder", "constant") for t in op.inputs):
                self.elementwise(op, lines, rows_env)
                done.add(op.id)

    def online_softmax_pass(self, red_max: Operation, red_sum: Operation, ops, lines, rows_env) -> None:
        """One pass keeping a running maximum and a rescaled running sum per lane."""
        dt = tl_type(compute_dtype(red_max.inputs[0].dtype))
        m, s = self.fresh("acc_m"), self.fresh("acc_s")
        lines.append(f"    {m} = tl.full([BLOCK_R, BLOCK_C], -INF, {dt})")
        lines.append(f"    {s} = tl.full([BLOCK_R, BLOCK_C], 0, {dt})")
        lines.append(f"    for c0 in range(0, {self.f.C}, BLOCK_C):")
        inner: list[str] = []
        env = dict(rows_env)
        self.columns(inner, "c0")
        for op in _ancestors(red_max, ops, rows_env):
            self.elementwise(op, inner, env)
        x = self.operand(red_max.inputs[0], True, inner, env)
        new = self.fresh("m")
        inner.append(f"    {new} = _maximum({m}, tl.where(mask, {x}, -INF))")
        # A lane whose maximum is still -inf has only seen exp(-inf) = 0: keep its sum at 0, not NaN.
        inner.append(f"    {s} = {s} * tl.where({new} == -INF, 0, tl.exp({m} - {new})) + "
                     f"tl.where(mask & ({new} != -INF), tl.exp({x} - {new}), 0)")
        inner.append(f"    {m} = {new}")
        lines.extend("    " + ln for ln in inner)
        rm, rs = self.fresh("r"), self.fresh("r")
        lines.append(f"    {rm} = tl.reduce({m}, 1, _maximum)[:, None]")
        lines.append(f"    {rs} = tl.sum({s} * tl.where({m} == -INF, 0, tl.exp({m} - {rm})), axis=1)[:, None]")
        # A row of -inf gives exp(-inf - -inf) = NaN in the op-by-op form; keep that meaning.
        lines.append(f"    {rs} = tl.where({rm} == -INF, INF - INF, {rs})")
        rows_env[red_max.outputs[0].id] = rm
        rows_env[red_sum.outputs[0].id] = rs

    def looped(self, ops, outputs, op_space) -> list[str]:
        lines: list[str] = []
        rows_env: dict = {}  # ROW values available after their reduction pass
        done: set[int] = set()
        for op in ops:
            if op.op == "constant":
                self.elementwise(op, lines, rows_env)
                done.add(op.id)
        reductions = [op for op in ops if _combine(op)]
        paired = _online_pairs(reductions)
        for red in reductions:
            if red.id in done:
                continue
            if red.id in paired:
                self.online_softmax_pass(red, paired[red.id], ops, lines, rows_env)
                done.update((red.id, paired[red.id].id))
                self.row_ops_now(ops, done, rows_env, lines, op_space)
                continue
            need = _ancestors(red, ops, rows_env)
            acc = self.fresh("acc")
            dt = tl_type(_accumulator(red))
            lines.append(f"    {acc} = tl.full([BLOCK_R, BLOCK_C], {_neutral(red)}, {dt})")
            lines.append(f"    for c0 in range(0, {self.f.C}, BLOCK_C):")
            inner: list[str] = []
            env = dict(rows_env)
            self.columns(inner, "c0")
            for op in need:
                self.elementwise(op, inner, env)
            x = _widen(red, self.operand(red.inputs[0], True, inner, env))
            combine = _combine(red).combine.format(a=acc, b=f"tl.where(mask, {x}, {_neutral(red)})")
            inner.append(f"    {acc} = {combine}")
            lines.extend("    " + ln for ln in inner)
            var = self.fresh("r")
            lines.append(f"    {var} = {_combine(red).finish.format(x=acc)}[:, None]")
            if _combine(red).mean:
                lines.append(f"    {var} = {var} / {self.f.C}")
            rows_env[red.outputs[0].id] = var
            done.add(red.id)
            self.row_ops_now(ops, done, rows_env, lines, op_space)
        full_outs = [(j, t) for j, t in enumerate(outputs) if self.space.get(t.id, "full") == "full"]
        if full_outs:
            lines.append(f"    for c0 in range(0, {self.f.C}, BLOCK_C):")
            inner = []
            env = dict(rows_env)
            self.columns(inner, "c0")
            for op in ops:
                if not _combine(op) and op.outputs[0].id not in env:
                    self.elementwise(op, inner, env)
            for j, t in full_outs:
                self.store(t, j, inner, env)
            lines.extend("    " + ln for ln in inner)
        for j, t in enumerate(outputs):
            if self.space.get(t.id, "full") == "row":
                self.store(t, j, lines, rows_env)
        return lines


def _online_pairs(reductions: list[Operation]) -> dict[int, Operation]:
    """max(x) followed by sum(exp(x - max(x))): both computed in one pass over the row (online softmax)."""
    pairs = {}
    for red, nxt in zip(reductions, reductions[1:]):
        if red.op != "reduction_maximum" or nxt.op != "reduction_sum":
            continue
        e = nxt.inputs[0].op
        if e.op != "exponent" or e.inputs[0].op.op != "subtraction":
            continue
        x, m = e.inputs[0].op.inputs
        if x is red.inputs[0] and m is red.outputs[0] and x.dtype.is_floating:
            pairs[red.id] = nxt
    return pairs


def _ancestors(red: Operation, ops: list[Operation], available: dict) -> list[Operation]:
    """The elementwise ops `red` needs that are not yet computed, in program order."""
    by_out = {t.id: op for op in ops for t in op.outputs}
    need: set[int] = set()
    stack = [red.inputs[0]]
    while stack:
        t = stack.pop()
        if t.id in available or t.id not in by_out:
            continue
        op = by_out[t.id]
        if op.id in need:
            continue
        need.add(op.id)
        stack.extend(op.inputs)
    return [op for op in ops if op.id in need and not _combine(op)]
