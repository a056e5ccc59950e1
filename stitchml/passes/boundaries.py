"""Why each kernel boundary exists: one reason per edge between two steps.

After stitch has grouped the ops, every value that one step (a kernel, a
vendor call, a gather, a view...) computes and another step reads crosses
memory. `explain` lists each such edge with its reason: the refusal that
legality gave when the consumer asked the producer's kernel, the failed merge
of two kernels, or, for steps no kernel template takes, why they run alone.
An edge with no known reason says so (`SILENT`); the tests require that no
sample graph has one, so a new op kind cannot bring back an unexplained
boundary.
"""
from __future__ import annotations

from ..ir import Operation
from ..registry import ELEMENTWISE, lookup
from .legality import Kernel, template_of

SILENT = "no reason recorded"
_SOURCES = ("placeholder", "constant", "variable")


def _label(node) -> str:
    return f"kernel{node.id}_{node.template}" if isinstance(node, Kernel) else node.name


def _alone(op: Operation) -> str:
    """Why `op` runs as a step of its own (it has no kernel template)."""
    prim = lookup(op.op)
    if prim.view is not None and len(op.inputs) == 1:
        return f"{op.op} is a view: it runs as a zero-copy strided view, not inside a kernel"
    if op.op == "fusion":  # made before stitching: the attention pass's kernel
        return f"{op.attrs['template']} is a kernel of its own (softmax(Q Kᵀ) V fused by the attention pass)"
    if prim.kind == ELEMENTWISE:
        dtypes = ", ".join(sorted({str(t.dtype) for t in op.inputs}))
        return f"{op.op} has no Triton expression for {dtypes}: it runs its reference implementation"
    return f"{op.op} has no kernel template (library call or opaque op): it runs its reference implementation"


def explain(operations: list[Operation], kernel_of: dict[int, Kernel],
            reasons: dict[tuple[int, int], str]) -> list[dict]:
    """Each edge between two steps: {producer, consumer, tensor, reason}, in program order.

    `kernel_of` maps op ids to their kernels (final ids); `reasons` maps (tensor id, consumer op id)
    to the refusal stitch recorded when the consumer could not join the tensor's kernel.
    """
    out: list[dict] = []
    seen: set[tuple[str, str, int]] = set()
    for op in operations:
        if op.op in _SOURCES or op.op == "assign_variable":
            continue
        consumer = kernel_of.get(op.id, op)
        for t in op.inputs:
            if t.op.op in _SOURCES:
                continue
            producer = kernel_of.get(t.op.id, t.op)
            if producer is consumer:
                continue
            key = (_label(producer), _label(consumer), t.id)
            if key in seen:
                continue
            seen.add(key)
            reason = reasons.get((t.id, op.id))
            if reason is None and template_of(op) is None:
                reason = _alone(op)
            if reason is None and not isinstance(producer, Kernel):
                why = _alone(t.op)
                view = lookup(t.op.op).view is not None and len(t.op.inputs) == 1
                reason = why and f"{why}; {'the reader loads through it' if view else 'its result is read from memory'}"
            out.append({"producer": key[0], "consumer": key[1], "tensor": t.name, "reason": reason or SILENT})
    return out
