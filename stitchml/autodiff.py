"""Reverse-mode autodiff inside the graph (MPSGraph's gradient method).

`gradients(of, wrt, initial_gradient=None)` appends the backward operations to
the same graph and returns a tensor per `wrt` entry. `of` is a scalar, or
`initial_gradient` (a tensor of `of`'s shape) seeds the walk: a non-scalar `of`
without one is an error, never an implicit sum.

1. find the operations on a path from some `wrt` tensor to `of` (others get
   no gradient ops at all);
2. walk them in reverse program order, asking each primitive's `vjp` rule
   (registry) for the cotangents of its inputs given those of its outputs;
3. elementwise rules answer in the broadcast output shape: the cotangent is
   summed back to each input's shape (`sum_to_shape`, run-time shapes);
4. fan-out accumulates by addition; gradient ops whose inputs are all
   constants are evaluated while building (folded to constants).

Integer and bool tensors carry no gradient; primitives marked
`differentiable=False` (comparisons, arg max, random, stop_gradient...) stop
it. A `wrt` tensor that `of` does not depend on gets zeros. Rules are built
from builder ops, so gradients of gradients work wherever the rules used
have rules of their own.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .errors import GraphError
from .ir import Operation, Tensor, built_at, needed_ops
from .registry import ELEMENTWISE, STATE, lookup


def _on_path(graph, of: Tensor, wrt: Sequence[Tensor]) -> tuple[list[Operation], set[int]]:
    """Operations that depend on some `wrt` tensor and that `of` depends on, in program
    order, and the ids of all tensors that depend on some `wrt` tensor."""
    reach = {t.id for t in wrt}
    path = []
    for op in needed_ops(graph.operations, [of.op], control_deps=False):
        if any(t.id in reach for t in op.inputs):
            path.append(op)
            reach.update(t.id for t in op.outputs)
    return path, reach


def _drop_unused(graph, start: int, keep: list[Tensor]) -> None:
    """Remove the ops appended since `start` that no kept cotangent needs."""
    new = graph.operations[start:]
    if not new:
        return
    graph.operations[start:] = needed_ops(new, [t.op for t in keep], control_deps=False)


def _differentiable(t: Tensor) -> bool:
    return t.dtype.is_floating


class _Folding:
    """While active, ops whose inputs are all constants are emitted as constants."""

    def __init__(self, graph):
        self.graph = graph

    def __enter__(self):
        self.previous = getattr(self.graph, "_fold_constants", False)
        self.graph._fold_constants = True

    def __exit__(self, *exc):
        self.graph._fold_constants = self.previous


def gradients(graph, of: Tensor, wrt: Sequence[Tensor], initial_gradient: Tensor | None = None,
              on_ready: Callable[[Tensor, Tensor], Sequence[Tensor]] | None = None) -> dict[Tensor, Tensor]:
    """d(of)/d(wrt) for each tensor of `wrt`, built into `graph`.

    `of` is a scalar loss, or any tensor with `initial_gradient` given: a tensor of `of`'s shape, the
    cotangent of `of` (torch.autograd.grad's grad_outputs). The result is then the vector-Jacobian
    product, the gradient of ``sum(of * initial_gradient)``.

    `on_ready(t, gradient)` is called once per `wrt` tensor, as soon as the backward walk has built
    its whole gradient, so that ops it builds stand in program order right there, before the rest of
    the backward pass (a data-parallel step starts reducing the last layers' gradients while the first
    layers' are still computed). It returns the tensors it built that must be kept.
    """
    if isinstance(wrt, Tensor):
        wrt = [wrt]
    wrt = list(wrt)
    for t in [of, *wrt]:
        if not isinstance(t, Tensor) or t.graph is not graph:
            raise GraphError(f"gradients: expected tensors of this graph, got {t!r}")
    if not _differentiable(of):
        raise GraphError(f"gradients: `of` ({of.name}) is {of.dtype}; only floating-point tensors have gradients")
    for t in wrt:
        if not _differentiable(t):
            raise GraphError(f"gradients: cannot differentiate with respect to {t.name} of dtype {t.dtype}")
    if initial_gradient is None and of.shape != ():
        shape = "an unknown rank" if of.shape is None else f"shape {of.shape}"
        raise GraphError(f"gradients: `of` ({of.name}, built at {of.op.location}) has {shape}, not a scalar; reduce "
                         f"it to one (reduction_sum, reduction_mean) or give initial_gradient, a tensor of its "
                         f"shape, for the vector-Jacobian product")
    if initial_gradient is not None:
        initial_gradient = _checked_initial_gradient(graph, of, initial_gradient)

    cotangents: dict[int, list[Tensor]] = {}
    first = len(graph.operations)
    kept: list[Tensor] = []
    with graph.scope("gradients"), _Folding(graph):
        cotangents[of.id] = [graph.constant(1.0, of.dtype) if initial_gradient is None else initial_gradient]
        path, reach = _on_path(graph, of, wrt)
        # The position in `path` of each wrt tensor's first consumer: the walk has its whole gradient after it.
        complete_at: dict[int, list[Tensor]] = {}
        done: set[int] = set()
        if on_ready is not None:
            for t in dict.fromkeys(wrt):
                consumers = [i for i, op in enumerate(path) if any(x.id == t.id for x in op.inputs)]
                if consumers and t.id != of.id:
                    complete_at.setdefault(consumers[0], []).append(t)
        for index in reversed(range(len(path))):
            op = path[index]
            prim = lookup(op.op)
            dys = [_sum(graph, cotangents.get(t.id)) for t in op.outputs]
            if all(d is None for d in dys) or not prim.differentiable or prim.kind == STATE and prim.vjp is None:
                continue
            if prim.vjp is None:
                raise GraphError(f"gradients: {built_at(op)} has no gradient rule")
            start = len(graph.operations)
            cts = prim.vjp(graph, op, *dys)
            if len(cts) != len(op.inputs):
                raise GraphError(f"gradients: the rule of {op.op} returned {len(cts)} cotangents for "
                                 f"{len(op.inputs)} inputs")
            # Rules answer for every input; keep (and keep the ops of) only those on a path from `wrt`.
            cts = [ct if ct is not None and x.id in reach and _differentiable(x) else None
                   for x, ct in zip(op.inputs, cts)]
            _drop_unused(graph, start, [ct for ct in cts if ct is not None])
            for x, ct in zip(op.inputs, cts):
                if ct is None:
                    continue
                if prim.kind == ELEMENTWISE and not (ct.shape == x.shape and x.type.is_static):
                    ct = graph.sum_to_shape(ct, x)
                if ct.dtype != x.dtype:
                    ct = graph.cast(ct, x.dtype)
                cotangents.setdefault(x.id, []).append(ct)
            for t in complete_at.get(index, ()):
                total = _sum(graph, cotangents.get(t.id))
                if total is not None:
                    cotangents[t.id] = [total]
                    done.add(t.id)
                    kept += [total, *on_ready(t, total)]
        out = {}
        for t in wrt:
            g = _sum(graph, cotangents.get(t.id))
            out[t] = g if g is not None else graph.broadcast_to(graph.constant(0.0, t.dtype), t)
            if on_ready is not None and t.id not in done:
                done.add(t.id)
                kept += on_ready(t, out[t])
    _drop_unused(graph, first, list(out.values()) + kept)
    return out


def _checked_initial_gradient(graph, of: Tensor, initial: Tensor) -> Tensor:
    """`initial` as the cotangent of `of`: a floating tensor of this graph whose shape fits `of`'s,
    cast to `of`'s dtype."""
    if not isinstance(initial, Tensor) or initial.graph is not graph:
        raise GraphError(f"gradients: initial_gradient must be a tensor of this graph, got {initial!r}")
    if not _differentiable(initial):
        raise GraphError(f"gradients: initial_gradient ({initial.name}) is {initial.dtype}; expected a "
                         f"floating-point tensor")
    fits = of.shape is None or initial.shape is None or (
        len(of.shape) == len(initial.shape) and all(a == b or -1 in (a, b) for a, b in zip(of.shape, initial.shape)))
    if not fits:
        raise GraphError(f"gradients: initial_gradient ({initial.name}) has shape {initial.shape}; expected the "
                         f"shape of `of` ({of.name}), {of.shape}")
    return initial if initial.dtype == of.dtype else graph.cast(initial, of.dtype)


def _sum(graph, parts: list[Tensor] | None) -> Tensor | None:
    if not parts:
        return None
    total = parts[0]
    for p in parts[1:]:
        total = graph.addition(total, p)
    return total
