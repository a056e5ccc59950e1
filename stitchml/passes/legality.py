"""Fusion legality: may this op join this kernel? Every refusal says why.

Kernels come in templates (see codegen/):

* pointwise   elementwise ops over one iteration space of N elements;
              reshapes inside are free (they keep the flat order);
* reduction   a frame shape S reduced over axes A: values are FULL (shape S)
              or ROW (S reduced over A); elementwise ops on either, reductions
              FULL -> ROW, ROW values broadcast back into FULL ops;
* matmul      a matrix product and elementwise ops on its output (epilogue);
* convolution a 2-D convolution and elementwise ops on its output;
* pool_gradient  the gradient of a max pooling whose windows tile its input
              (codegen/pooling.py) and elementwise ops on its output: on the
              Triton backends only, started by stitch (`pool_gradient_start`).

Anything else runs alone: opaque ops (gather, pooling, random...),
elementwise ops with no Triton expression for their dtype and ops on float8
types through their reference implementation, views (reshape, transpose, broadcast_to,
slice) as zero-copy strided views that the next kernel loads through.
Correctness lives here; preferences live in policy.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..codegen import pooling
from ..codegen.common import checks_divisor, triton_template
from ..ir import Operation, Tensor
from ..registry import ELEMENTWISE, REGISTRY, lookup
from .program import CompileError

MAX_KERNEL_OPS = 96  # beyond this, compile time and register pressure outgrow the saved traffic


def numel(t: Tensor) -> int:
    return t.type.numel()


def template_of(op: Operation) -> str | None:
    """The template an op starts a kernel of, or None when it never joins one (views among them)."""
    if any(t.dtype.is_float8 for t in (*op.inputs, *op.outputs)):
        return None  # float8 types are for storage: their ops run through the (widening) reference
    prim = lookup(op.op)
    if prim.kind == ELEMENTWISE:
        return "pointwise" if triton_template(op) is not None else None
    if prim.combine is not None:
        return "reduction"
    return prim.template


def __getattr__(name: str):
    # FUSABLE_REDUCTIONS: the reductions a kernel can fold, read from the registry when asked (the op
    # modules may register after this module is imported)
    if name == "FUSABLE_REDUCTIONS":
        return frozenset(p.name for p in REGISTRY.values() if p.combine is not None)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(eq=False)
class Kernel:
    """A group of ops that will become one kernel."""

    id: int
    template: str
    ops: list[Operation] = field(default_factory=list)
    frame: tuple[int, ...] = ()  # pointwise: the output shape of its first op; others: see module docstring
    axes: tuple[int, ...] = ()  # reduction: reduced axes of the frame
    space: dict[int, str] = field(default_factory=dict)  # tensor id -> "full" | "row" (reduction kernels)

    @property
    def op_ids(self) -> set[int]:
        return {op.id for op in self.ops}

    def produces(self, t: Tensor) -> bool:
        return t.op.id in self.op_ids


def _row_shapes(frame, axes):
    keep = tuple(1 if i in axes else d for i, d in enumerate(frame))
    drop = tuple(d for i, d in enumerate(frame) if i not in axes)
    return keep, drop


def _reduction_axes(op: Operation) -> tuple[int, ...]:
    axes = op.attrs["axes"]
    rank = op.inputs[0].rank
    return tuple(range(rank)) if axes is None else tuple(sorted(a % rank for a in axes))


def space_of(kernel: Kernel, op: Operation) -> str | None:
    """Which space of a reduction kernel an elementwise op's output lives in, if any."""
    out = op.outputs[0].shape
    keep, drop = _row_shapes(kernel.frame, kernel.axes)
    if out == kernel.frame:
        return "full"
    if out in (keep, drop):
        return "row"
    return None


def can_fuse(kernel: Kernel, op: Operation) -> tuple[bool, str]:
    """Whether `op` may join `kernel` (one of op's inputs is produced in it)."""
    if len(kernel.ops) >= MAX_KERNEL_OPS:
        return False, f"kernel {kernel.id} already holds {MAX_KERNEL_OPS} ops"
    kind = template_of(op)
    if kind is None:
        return False, f"{op.op} runs as its own kernel (vendor library or view)"
    internal = [t for t in op.inputs if kernel.produces(t)]
    if kind in ("matmul", "convolution"):
        return False, f"{op.op} starts its own kernel; only its epilogue fuses"
    if kernel.template == "pool_gradient":
        return _pool_epilogue(kernel, op, kind, internal)
    if kernel.template in ("pointwise", "matmul", "convolution"):
        frame_n = 1
        for d in kernel.frame:
            frame_n *= d
        if kind == "reduction":
            if kernel.template != "pointwise":
                return False, f"a reduction cannot join a {kernel.template} epilogue"
            if op.inputs[0].shape != kernel.frame:
                return False, f"reduction input {op.inputs[0].shape} differs from the kernel's frame {kernel.frame}"
            return True, ""
        if numel(op.outputs[0]) != frame_n:
            return False, f"{op.op} has {numel(op.outputs[0])} elements, the kernel iterates over {frame_n}"
        for t in internal:
            if numel(t) != frame_n:
                return False, f"{op.op} broadcasts {t.name}, computed in the kernel: it would be recomputed per element"
        if kernel.template != "pointwise" and op.outputs[0].shape != kernel.frame:
            return False, f"epilogue op {op.op} of shape {op.outputs[0].shape} differs from {kernel.frame}"
        return True, ""
    # reduction kernel
    if kind == "reduction":
        if op.inputs[0].shape != kernel.frame or _reduction_axes(op) != kernel.axes:
            return False, (f"{op.op} reduces {op.inputs[0].shape} over {_reduction_axes(op)}; the kernel reduces "
                           f"{kernel.frame} over {kernel.axes}")
        if kernel.space.get(op.inputs[0].id) == "row":
            return False, f"{op.op} would reduce an already reduced value"
        return True, ""
    space = space_of(kernel, op)
    if space is None:
        return False, f"{op.op} output {op.outputs[0].shape} is neither the frame {kernel.frame} nor its reduced rows"
    for t in internal:
        ts = kernel.space.get(t.id)
        if space == "row" and ts == "full":
            return False, f"{op.op} is per row but reads {t.name}, which is per element"
        if t.shape not in (kernel.frame, *_row_shapes(kernel.frame, kernel.axes)):
            return False, f"{op.op} reads {t.name} of shape {t.shape}, outside the kernel's frame"
    return True, ""


def pool_gradient_start(op: Operation, backend: str, options: dict) -> str:
    """Why a max_pooling2d_gradient cannot start a kernel that takes the elementwise ops reading its result
    ("" when it can): compile option `pool_epilogue` (on by default), the backend, the windows, the type."""
    mode = options.get("pool_epilogue", True)
    if mode not in (True, False, "separate", "sum"):
        raise CompileError(f"option pool_epilogue expects True, False, 'separate' or 'sum', got {mode!r}")
    if mode is False:
        return "option pool_epilogue is off"
    if backend not in ("triton", "interpret"):
        return f"the {backend} backend has no pooling-gradient template"
    x = op.inputs[1]
    if x.dtype.name not in pooling.DTYPES or op.inputs[0].dtype != x.dtype:
        return f"its operands are {op.inputs[0].dtype} and {x.dtype}; the template takes one of {pooling.DTYPES}"
    return pooling.misfit(op.attrs, x.shape)


def _pool_epilogue(kernel: Kernel, op: Operation, kind: str, internal: list[Tensor]) -> tuple[bool, str]:
    """Whether `op` may join the epilogue of a pooling gradient: elementwise, over the gradient's shape, and
    not computing what the gradient reads (the kernel loads its operands from memory)."""
    if kind != "pointwise":
        return False, f"a {kind} cannot join a pooling gradient's epilogue (elementwise ops only)"
    if checks_divisor(op):
        return False, f"{op.op} divides integers: the pooling gradient's epilogue does not flag a zero divisor"
    if op.outputs[0].shape != kernel.frame:
        return False, f"epilogue op {op.op} of shape {op.outputs[0].shape} differs from {kernel.frame}"
    for t in internal:
        if t.shape != kernel.frame:
            return False, f"{op.op} broadcasts {t.name}, computed in the kernel: it would be recomputed per element"
    pool = next(o for o in kernel.ops if o.op == "max_pooling2d_gradient")
    if any(t.id == i.id for t in op.outputs for i in pool.inputs):
        return False, f"{op.op} computes an operand of {pool.name}, which loads its operands from memory"
    return True, ""


def join(kernel: Kernel, op: Operation) -> None:
    """Add `op` to `kernel`, updating its template and spaces (after can_fuse said yes)."""
    kind = template_of(op)
    if kernel.template == "pointwise" and kind == "reduction":
        kernel.template = "reduction"
        kernel.frame = op.inputs[0].shape
        kernel.axes = _reduction_axes(op)
        for member in kernel.ops:
            for t in member.outputs:
                kernel.space[t.id] = "full"
    kernel.ops.append(op)
    if kernel.template == "reduction":
        if kind == "reduction":
            kernel.space[op.outputs[0].id] = "row"
        else:
            kernel.space[op.outputs[0].id] = space_of(kernel, op)


def start(kernel_id: int, op: Operation) -> Kernel:
    kind = template_of(op)
    if kind == "reduction":
        k = Kernel(kernel_id, "reduction", [], op.inputs[0].shape, _reduction_axes(op))
        join(k, op)
        return k
    frame = op.outputs[0].shape
    return Kernel(kernel_id, kind, [op], frame)
