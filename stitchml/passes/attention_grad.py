"""The gradient of an attention pattern: find the ops autodiff built for it, so that the pass
(attention.py) replaces forward and backward together.

In a training graph the backward reads the forward's probabilities, so the
forward alone cannot fuse. Which ops are the pattern's backward is decided by
construction, not by a second hand-written pattern: the matched forward ops are
copied into a graph of their own (the softmax's maximum behind stop_gradient,
as composites.softmax builds it), differentiated there by autodiff with respect
to Q, Kᵀ and V against a cotangent G, and run through the same passes the
program went through (simplify, fold, cse, prune). Every op of that canonical
program must then have its counterpart in the user's program: the same op and
attributes on counterpart inputs, transposes read through (a transpose of a
transpose is compared by the permutation it composes to), constants by value,
and G bound to whatever tensor the user's first matching op reads there.
"""
from __future__ import annotations

from ..graph import Graph
from ..ir import Operation, Tensor
from .program import Program, copy_op


class Miss(Exception):
    """The gradient graph does not have the pattern's backward; the message says why."""


def _resolve(t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """(base, permutation): `t` is transpose(base, permutation), through any chain of transposes."""
    perm = tuple(range(t.rank))
    while t.op.op == "transpose":
        p = t.op.attrs["permutation"]
        perm = tuple(p[i] for i in perm)
        t = t.op.inputs[0]
    return t, perm


def canonical(ops: list[Operation], inputs: list[Tensor], position: dict[int, int]):
    """(program, placeholders, cotangent, gradients): the forward `ops` and their backward, built by autodiff."""
    from . import cse, fold, prune, simplify  # the passes the program went through (module-level functions)

    g = Graph("attention_grad")
    inner = {t.id: g.placeholder(t.shape, t.dtype, name=f"in{i}") for i, t in enumerate(inputs)}
    for op in sorted(ops, key=lambda o: position[o.id]):
        for t in op.inputs:
            if t.id not in inner:
                inner[t.id] = copy_op(g, t.op, [])[0]
        outs = copy_op(g, op, [inner[t.id] for t in op.inputs])
        if op.op == "reduction_maximum":  # composites.softmax shifts by a maximum autodiff does not enter
            outs = [g.stop_gradient(outs[0])]
        for old, new in zip(op.outputs, outs):
            inner[old.id] = new
    out = inner[ops[0].outputs[0].id]
    cotangent = g.placeholder(out.shape, out.dtype, name="cotangent")
    wrt = [inner[t.id] for t in inputs[:3]]
    grads = g.gradients(out, wrt, initial_gradient=cotangent)
    program = Program(g, [out] + [grads[t] for t in wrt], {})
    for step in (simplify, fold, cse, prune):
        program = step(program, None)
    placeholders = [o.outputs[0] for o in program.operations if o.op == "placeholder"]
    named = {t.name: t for t in placeholders}
    return program, [named[f"in{i}"] for i in range(len(inputs))], named.get("cotangent"), program.outputs[1:]


def _same_constant(a: Tensor, b: Tensor) -> bool:
    if b.op.op != "constant" or a.type != b.type:
        return False
    x, y = a.op.attrs["value"], b.op.attrs["value"]
    return x.shape == y.shape and bool((x == y).all())


def _attrs(op: Operation) -> str:
    return repr(sorted((k, repr(v)) for k, v in op.attrs.items()))


def match(program: Program, ops: list[Operation], inputs: list[Tensor], position: dict[int, int]):
    """(forward ops, backward ops, views, cotangent, gradient tensors) of the user's program, or Miss.

    `ops` and `inputs` are what the forward match found; the gradient tensors are the user's tensors for
    dQ, dKᵀ and dV (their last non-view ops), views the transposes only the matched ops read."""
    canon, holders, cotangent, grads = canonical(ops, inputs, position)
    readers: dict[int, list[tuple[Operation, int]]] = {}  # resolved base id -> (user op, input index)
    for op in program.operations:
        if op.op == "transpose":
            continue
        for i, t in enumerate(op.inputs):
            readers.setdefault(_resolve(t)[0].id, []).append((op, i))
    mapped: dict[int, tuple[Tensor, tuple[int, ...]]] = {h.id: _resolve(t) for h, t in zip(holders, inputs)}
    bound: dict[int, Operation] = {}  # canonical op id -> user op
    used: set[int] = set()

    def fits(c: Tensor, u: Tensor) -> bool:
        base_c, perm_c = _resolve(c)
        base_u, perm_u = _resolve(u)
        if base_c.op.op == "constant":
            return _same_constant(base_c, base_u) and perm_c == perm_u
        if cotangent is not None and base_c is cotangent and base_c.id not in mapped:
            mapped[base_c.id] = (base_u, perm_u)  # bound by the first op that reads it
            return perm_c == tuple(range(c.rank))
        if base_c.id not in mapped:
            return False
        base_m, perm_m = mapped[base_c.id]
        return base_m.id == base_u.id and tuple(perm_m[i] for i in perm_c) == perm_u

    for c in canon.operations:
        if c.op in ("placeholder", "constant", "transpose"):
            continue
        anchors = [_resolve(t)[0] for t in c.inputs]
        keys = [mapped[b.id][0].id for b in anchors if b.id in mapped]
        if not keys:
            raise Miss(f"{c.op} of the backward reads nothing the pattern made")
        found = None
        for op, _ in readers.get(keys[0], []):
            if op.id in used or op.op != c.op or len(op.inputs) != len(c.inputs) or _attrs(op) != _attrs(c):
                continue
            saved = dict(mapped)
            if all(fits(a, b) for a, b in zip(c.inputs, op.inputs)):
                found = op
                break
            mapped.clear()
            mapped.update(saved)
        if found is None:
            raise Miss(f"the graph has no counterpart of the backward's {c.op} (reading "
                       f"{', '.join(t.name for t in c.inputs)})")
        bound[c.id] = found
        used.add(found.id)
        for a, b in zip(c.outputs, found.outputs):
            mapped[a.id] = (b, tuple(range(b.rank)))
    if cotangent is not None and cotangent.id not in mapped:
        raise Miss("the backward does not read the output's gradient")
    gradients = []
    for t in grads:
        base, perm = _resolve(t)
        if base.op.id not in bound:
            raise Miss(f"a gradient of the pattern is {base.op.op}, not computed in the backward")
        gradients.append((bound[base.op.id].outputs[0], perm))
    forward_ids = {o.id for o in ops}
    fwd = [o for o in bound.values() if o.id in forward_ids]
    if len(fwd) != len(ops):
        raise Miss("the backward's forward differs from the matched forward")
    bwd = [o for o in bound.values() if o.id not in forward_ids]
    return fwd, bwd, mapped[cotangent.id] if cotangent is not None else None, gradients
