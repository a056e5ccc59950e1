"""plan_memory: give every intermediate buffer an offset in one arena.

Requires: a stitched program (its op order is the kernel schedule). Ensures:
`ctx.memory_plan` holds, for every value, where it lives:

* sources (feeds, variables, constants) live where the caller keeps them;
* views (reshape, transpose, broadcast_to, slice...) alias their input's
  buffer with a derived strided layout when the layout allows (else the op
  copies, like any compute op);
* outputs of kernels and vendor ops are buffers: program outputs get memory
  of their own each run (the caller keeps them); every other buffer gets an
  offset in the arena, by liveness over the schedule, packed greedily largest
  first into the lowest gap that no simultaneously live buffer occupies;
* kernels that call a vendor library before their epilogue (matmul,
  convolution) get a scratch buffer live only during that kernel.

The arena size is known here, before any run. `lower_bound` is the largest
sum of simultaneously live bytes: no plan can be smaller. With poison
checking on (`options["poison"]`), each buffer is followed by a guard zone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ir import Operation
from ..registry import lookup
from .. import dtypes
from ..codegen import cpu_window
from ..codegen.common import Layout
from ..codegen.matmul import split
from .program import Program

ALIGN = 64  # bytes: keeps 16-byte vector loads aligned and buffers on separate cache lines
GUARD = 64  # bytes after each buffer in poison mode


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Buffer:
    id: int
    nbytes: int
    start: int  # schedule index that writes it
    end: int  # last schedule index that reads it (or a view of it)
    offset: int = -1  # in the arena; -1 for program outputs
    kind: str = "intermediate"  # intermediate | output | scratch | vendor (a library call's own memory)
    shape: tuple[int, ...] = ()
    dtype: object = None  # torch dtype


@dataclass
class MemoryPlan:
    """Where every value lives. `place[tensor id]` = (kind, key, Layout)."""

    arena_size: int
    lower_bound: int
    buffers: dict[int, Buffer]
    place: dict[int, tuple[str, int, Layout]]
    scratch: dict[int, int] = field(default_factory=dict)  # op id -> buffer id
    guard: int = 0
    in_place: dict[int, int] = field(default_factory=dict)  # assigned value tensor id -> user variable op id

    @property
    def separate_size(self) -> int:
        """Bytes if every intermediate had its own allocation."""
        return sum(_aligned(b.nbytes) for b in self.buffers.values() if b.kind in ("intermediate", "scratch"))

    @property
    def vendor_bytes(self) -> int:
        """Bytes that library calls (cuDNN, pooling, gathers...) allocate themselves, outside the arena."""
        return sum(b.nbytes for b in self.buffers.values() if b.kind == "vendor")


def view_layout(op: Operation, src: Layout) -> Layout | None:
    """The layout of a view op's output over its input's buffer, or None when it must copy."""
    rule = lookup(op.op).view
    if rule is None:
        return None
    base = torch.empty(0, device="meta").as_strided(src.shape, src.strides, src.offset)
    shape = op.outputs[0].shape
    try:
        out = rule(base, shape, op.attrs)
    except RuntimeError:
        return None
    if out is None or tuple(out.shape) != shape:
        return None
    return Layout(tuple(out.shape), tuple(out.stride()), out.storage_offset())


def _is_view(op: Operation) -> bool:
    return lookup(op.op).view is not None and len(op.inputs) == 1


# Orders in which `_pack` places buffers; it keeps the smallest arena. Largest first is the classic
# greedy; latest-ending first places what the last steps hold together (a training step's last
# gradient product and its scratch) before the earlier temporaries can fragment the space.
_ORDERS = (lambda b: (-b.nbytes, b.start), lambda b: (-b.end, -b.nbytes))


def _pack(buffers: list[Buffer], guard: int) -> int:
    """Greedy: each buffer takes the lowest offset clear of the live buffers placed so far, in each of
    `_ORDERS`; the offsets of the smallest arena are kept."""
    best, offsets = None, {}
    for order in _ORDERS:
        size = _pack_in(sorted(buffers, key=order), guard)
        if best is None or size < best:
            best, offsets = size, {id(b): b.offset for b in buffers}
    for b in buffers:
        b.offset = offsets[id(b)]
    return best or 0


def _pack_in(buffers: list[Buffer], guard: int) -> int:
    placed: list[Buffer] = []
    size = 0
    for b in buffers:
        need = _aligned(b.nbytes) + guard
        busy = sorted((p.offset, p.offset + _aligned(p.nbytes) + guard) for p in placed
                      if p.start <= b.end and b.start <= p.end)
        offset = 0
        for lo, hi in busy:
            if offset + need <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
        size = max(size, offset + need)
    return size


def lower_bound(buffers: list[Buffer]) -> int:
    events = sorted({b.start for b in buffers} | {b.end for b in buffers})
    best = 0
    for t in events:
        best = max(best, sum(b.nbytes for b in buffers if b.start <= t <= b.end))
    return best


def prologue_mode(backend: str, options: dict) -> str:
    """How a matmul kernel with a prologue runs: "fused" (one Triton kernel), "separate" (the producers'
    pointwise kernels, the vendor GEMM, the epilogue kernel) or "choose" (CUDA: the first run measures both)."""
    mode = options.get("prologue", True)
    if mode in ("fused", "separate"):
        return mode
    return "choose" if backend == "triton" else "fused"


def separate_scratch(body: Program) -> tuple[list[tuple[int, int]], int]:
    """Where the separate run of a matmul kernel with a prologue keeps its temporaries in its byte scratch:
    (byte offset, bytes) per prologue value, then the product when an epilogue reads it; and the total."""
    parts = split(body)
    sizes = [p.value.type.numel() * p.value.dtype.itemsize for p in parts.prologues if p is not None]
    if parts.epilogue:
        product = parts.contraction.outputs[0]
        sizes.append(product.type.numel() * product.dtype.itemsize)
    spans, offset = [], 0
    for n in sizes:
        spans.append((offset, n))
        offset += _aligned(n)  # each temporary aligned as the arena's buffers are
    return spans, offset


def _scratch(op: Operation, ctx):
    """(shape, DType) of the temporary a kernel needs besides its outputs, or None."""
    if op.op != "fusion":
        return None
    body, template = op.attrs["body"], op.attrs["template"]
    if template == "matmul" and any(split(body).prologues):
        # bytes for the producers' results and the product, when the kernel may run as separate steps
        backend, options = (ctx.backend, ctx.options) if ctx is not None else ("interpret", {})
        if prologue_mode(backend, options) == "fused":
            return None
        return (separate_scratch(body)[1],), dtypes.uint8
    if template == "matmul":  # cuBLAS writes the product here, the epilogue kernel reads it
        product = next(o for o in body.operations if lookup(o.op).vendor is not None).outputs[0]
        has_epilogue = len([o for o in body.operations if o.op not in ("placeholder", "constant")]) > 1
        return (product.shape, product.dtype) if has_epilogue else None
    if template == "attention_backward":  # Δ = rowsum(dO ∘ O) per query row, from the dQ kernel to the dK/dV one
        lse = op.inputs[-3]  # inputs: ..., lse, O, dO
        return lse.shape, lse.dtype
    if template == "reduction":
        from ..codegen.reduction import split_scratch

        return split_scratch(body, (ctx.options if ctx is not None else {}).get("sm_count", 132))
    return None


def _in_place_assignments(program: Program, buffers: dict[int, Buffer]) -> dict[int, int]:
    """Assignments whose kernel may write the new value straight into the variable.

    Legal when the value is computed elementwise by a kernel of ours (pointwise,
    a per-element output of a reduction kernel, or a matmul/convolution
    epilogue), nothing else uses it, the variable is
    assigned once, and every other reader of the variable runs before that
    kernel, which itself reads the variable only at the index it writes. The
    end-of-run semantics then hold without the end-of-run copy.
    """
    ops = program.operations
    position = {op.id: i for i, op in enumerate(ops)}
    assigns: dict[int, list[Operation]] = {}
    for op in ops:
        if op.op == "assign_variable":
            assigns.setdefault(op.inputs[0].op.attrs["source"], []).append(op)
    users: dict[int, list[Operation]] = {}
    for op in ops:
        for t in op.inputs:
            users.setdefault(t.id, []).append(op)
    outputs = {t.id for t in program.outputs}
    result: dict[int, int] = {}
    for source, group in assigns.items():
        if len(group) != 1:
            continue
        var, value = group[0].inputs
        kernel = value.op
        if kernel.op != "fusion" or kernel.attrs["template"] not in ("pointwise", "reduction", "matmul", "convolution") or \
                value.id in outputs or len(users.get(value.id, [])) != 1 or value.id not in buffers or \
                buffers[value.id].kind != "intermediate":
            continue
        readers = _readers(var, users)
        if any(position[r.id] > position[kernel.id] for r in readers):
            continue
        if kernel in readers and not _reads_elementwise(kernel, var, value):
            continue
        if kernel in readers and _loads_for_product(kernel, var):
            continue  # one Triton kernel: other programs may still load the tiles a program writes
        result[value.id] = source
    return result


def _readers(var, users) -> list[Operation]:
    """Ops that read `var` directly or through views."""
    out, stack = [], [var]
    while stack:
        t = stack.pop()
        for op in users.get(t.id, []):
            if _is_view(op):
                stack.extend(op.outputs)
            elif op.op != "assign_variable":
                out.append(op)
    return out


def _loads_for_product(kernel: Operation, var) -> bool:
    """Whether a matmul kernel with a prologue (one Triton kernel) reads `var` for its product: every
    program loads a whole row or column of tiles, not only the elements it writes."""
    if kernel.attrs["template"] != "matmul":
        return False
    parts = split(kernel.attrs["body"])
    if not any(parts.prologues):
        return False  # the vendor GEMM reads its operands before the epilogue kernel writes
    placeholders = [o.outputs[0] for o in kernel.attrs["body"].operations if o.op == "placeholder"]
    inner = placeholders[list(kernel.inputs).index(var)]
    before = [parts.contraction] + [o for p in parts.prologues if p is not None for o in p.ops]
    return any(inner in o.inputs for o in before)


def _reads_elementwise(kernel: Operation, var, value) -> bool:
    """Inside `kernel`, `var` is read directly, at the frame's own index (no broadcast)."""
    if not any(t is var for t in kernel.inputs):
        return False
    body = kernel.attrs["body"]
    placeholder = [o.outputs[0] for o in body.operations if o.op == "placeholder"][list(kernel.inputs).index(var)]
    return placeholder.shape == value.shape and all(
        o.outputs[0].shape == value.shape for o in body.operations if any(t is placeholder for t in o.inputs))


def plan_memory(program: Program, ctx) -> Program:
    ops = program.operations
    place: dict[int, tuple[str, int, Layout]] = {}
    buffers: dict[int, Buffer] = {}
    base_of: dict[int, int] = {}  # tensor id -> buffer id (for buffers and their views)
    scratch: dict[int, int] = {}
    last = len(ops)
    for i, op in enumerate(ops):
        if op.op in ("placeholder", "variable", "constant"):
            t = op.outputs[0]
            place[t.id] = (op.op, op.id, Layout.contiguous(t.shape))
            continue
        for t in op.inputs:  # extend lifetimes of the buffers read here
            b = base_of.get(t.id)
            if b is not None:
                buffers[b].end = max(buffers[b].end, last if op.op == "assign_variable" else i)
        if op.op == "assign_variable":
            continue
        if _is_view(op):
            kind, key, lay = place[op.inputs[0].id]
            derived = view_layout(op, lay)
            if derived is not None:
                place[op.outputs[0].id] = (kind, key, derived)
                if op.inputs[0].id in base_of:
                    base_of[op.outputs[0].id] = base_of[op.inputs[0].id]
                continue
        # A library call (an op that is not a kernel of ours) returns memory of its own; the native CPU
        # backend's window kernels (codegen/cpu_window.py) write planned buffers as fused kernels do.
        ours = op.op == "fusion" or (ctx is not None and ctx.backend == "native" and cpu_window.supports(op))
        kind = "intermediate" if ours else "vendor"
        for t in op.outputs:
            b = Buffer(t.id, t.type.numel() * t.dtype.itemsize, i, i, kind=kind, shape=t.shape, dtype=t.dtype.torch)
            buffers[b.id] = b
            base_of[t.id] = b.id
            place[t.id] = ("buffer", b.id, Layout.contiguous(t.shape))
        need = _scratch(op, ctx)
        if need is not None:
            shape, dtype = need
            n = 1
            for d in shape:
                n *= d
            b = Buffer(-(op.id + 1), n * dtype.itemsize, i, i, kind="scratch", shape=shape, dtype=dtype.torch)
            buffers[b.id] = b
            scratch[op.id] = b.id
    for t in program.outputs:  # outputs, and anything an output is a view of, belong to the caller
        b = base_of.get(t.id)
        if b is not None and buffers[b].kind != "vendor":
            buffers[b].kind = "output"
    in_place = _in_place_assignments(program, buffers)
    for value_id, source in in_place.items():
        buffers[value_id].kind = "variable"
        place[value_id] = ("variable", source, place[value_id][2])
    arena = [b for b in buffers.values() if b.kind in ("intermediate", "scratch")]
    guard = GUARD if ctx is not None and ctx.options.get("poison") else 0
    size = _pack(arena, guard)
    if ctx is not None:
        ctx.memory_plan = MemoryPlan(size, lower_bound(arena), buffers, place, scratch, guard, in_place)
    return program
