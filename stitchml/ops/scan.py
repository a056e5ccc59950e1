"""Scans, sorting and Einstein summation: `cumulative_sum`, `top_k`, `einsum`."""
from __future__ import annotations

import re
import string

import torch

from .. import dtypes
from ..errors import GraphError, ShapeError
from ..ir import UNKNOWN, TensorType, broadcast_shapes, normalize_axis
from ..registry import CONTRACTION, OPAQUE, Primitive, builder, register
from .reduction import in_float32

# -- cumulative_sum -------------------------------------------------------------------
cumulative_sum = register(Primitive(
    "cumulative_sum", OPAQUE,
    doc="Running sum along `axis`; `exclusive` leaves each element out of its own sum, `reverse` runs from the end.",
))
cumulative_sum.def_infer(lambda types, axis, exclusive, reverse: types[0])


@cumulative_sum.def_impl
@in_float32
def _cumulative_sum_impl(x, axis, exclusive, reverse):
    y = x.flip(axis) if reverse else x
    if exclusive and y.shape[axis]:
        # Shifted by one: subtracting each element from the inclusive sum would give inf - inf = NaN and
        # lose small elements next to large ones.
        y = torch.cat([torch.zeros_like(y.narrow(axis, 0, 1)), y.narrow(axis, 0, y.shape[axis] - 1)], dim=axis)
    s = torch.cumsum(y, dim=axis).to(x.dtype)
    return s.flip(axis) if reverse else s


cumulative_sum.def_vjp(lambda g, op, dy: [g.cumulative_sum(dy, op.attrs["axis"], op.attrs["exclusive"],
                                                           not op.attrs["reverse"])])


@builder("cumulative_sum")
def _cumulative_sum(g, x, axis=0, exclusive=False, reverse=False, name=None):
    """``cumsum(x, axis)`` (MPSGraph cumulativeSum); bool counts as int64, as in NumPy and reduction_sum.

    >>> import numpy as np, stitchml as sm; g = sm.Graph(); x = g.constant([1.0, 2.0, 3.0])
    >>> g.run({}, [y := g.cumulative_sum(x)], device="cpu")[y].numpy().tolist()
    [1.0, 3.0, 6.0]
    """
    x = g.as_tensor(x)
    if x.rank is not None:
        axis = g._checked("cumulative_sum", [x], normalize_axis, axis, x.rank)
    if x.dtype.is_bool:
        x = g.cast(x, dtypes.int64)
    return g._emit1("cumulative_sum", [x], {"axis": int(axis), "exclusive": bool(exclusive), "reverse": bool(reverse)},
                    name)


# -- top_k ------------------------------------------------------------------------------
top_k = register(Primitive(
    "top_k", OPAQUE,
    doc="The k largest (or smallest) values along `axis` and their int64 indices; ties keep the lower index first.",
))


@top_k.def_infer
def _top_k_infer(types, k, axis, largest):
    x = types[0]
    if k < 0:
        raise ShapeError(f"k={k} must be >= 0")
    if x.shape is None:
        return [TensorType(None, x.dtype), TensorType(None, dtypes.int64)]
    if x.shape[axis] != UNKNOWN and not 0 <= k <= x.shape[axis]:
        raise ShapeError(f"k={k} is outside [0, {x.shape[axis]}] for axis {axis}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(shape, x.dtype), TensorType(shape, dtypes.int64)]


@top_k.def_impl
def _top_k_impl(x, k, axis, largest):
    if k > x.shape[axis]:
        raise ValueError(f"k={k} is more than the extent {x.shape[axis]} of axis {axis}")
    values, indices = torch.sort(x, dim=axis, descending=largest, stable=True)
    return values.narrow(axis, 0, k).contiguous(), indices.narrow(axis, 0, k).contiguous()


@top_k.def_vjp
def _top_k_vjp(g, op, dy, _):
    # Each value's cotangent goes back to the element it came from; the indices carry none.
    x, (_, indices) = op.inputs[0], op.outputs
    zeros = g.broadcast_to(g.constant(0, dy.dtype), x)
    return [g.scatter_add_along_axis(zeros, indices, dy, op.attrs["axis"])]


@builder("top_k")
def _top_k(g, x, k, axis=-1, largest=True, name=None):
    """(values, indices) of the `k` largest (smallest with largest=False) elements along `axis`, sorted."""
    x = g.as_tensor(x)
    if x.rank is None:
        raise g._error("top_k", "needs a tensor of known rank", [x])
    axis = g._checked("top_k", [x], normalize_axis, axis, x.rank)
    return tuple(g._emit("top_k", [x], {"k": int(k), "axis": axis, "largest": bool(largest)}, name).outputs)


# -- einsum -------------------------------------------------------------------------------
einsum = register(Primitive("einsum", CONTRACTION, doc="Einstein summation over the operands (NumPy's equation syntax)."))

_TERM = re.compile(r"[a-zA-Z]*(?:\.\.\.)?[a-zA-Z]*")


def _terms(equation: str, count: int) -> tuple[list[str], str]:
    """The operands' terms and the output term; an implicit output is NumPy's: '...' (where the
    operands have it), then the labels used once, in alphabetical order."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if not all(_TERM.fullmatch(t) for t in terms + [rhs]):
        raise ShapeError(f"{equation!r} is not an equation: terms of letters with one '...' at most, "
                         f"separated by ',', then '->' and the output term (optional)")
    if len(terms) != count:
        raise ShapeError(f"equation {equation!r} has {len(terms)} terms for {count} operands")
    labels = [c for c in lhs if c.isalpha()]
    if not arrow:
        rhs = ("..." if "..." in lhs else "") + "".join(sorted(c for c in set(labels) if labels.count(c) == 1))
    for c in rhs.replace("...", ""):
        if c not in labels:
            raise ShapeError(f"output label {c!r} is in no operand")
        if rhs.count(c) > 1:
            raise ShapeError(f"output label {c!r} is repeated")
    return terms, rhs


def _extent(sizes: list[int]) -> int:
    """One label's extent from its extents in the operands: equal, or 1 (broadcast), or unknown."""
    known = set(sizes) - {1, UNKNOWN}
    if known:
        return known.pop()
    return UNKNOWN if UNKNOWN in sizes else 1


@einsum.def_infer
def _einsum_infer(types, equation):
    terms, rhs = _terms(equation, len(types))
    if any(t.dtype != types[0].dtype for t in types):
        raise ShapeError(f"operand dtypes differ: {', '.join(str(t.dtype) for t in types)}")
    if types[0].dtype.is_bool:
        raise ShapeError("expects numeric operands, got bool")
    if any(t.shape is None for t in types):
        return TensorType(None, types[0].dtype)
    sizes: dict[str, list[int]] = {}
    ell_shapes = []
    for term, t in zip(terms, types):
        head, dots, tail = term.partition("...")
        n_ell = t.rank - len(head) - len(tail)
        if n_ell < 0 or (n_ell and not dots):
            raise ShapeError(f"term {term!r} does not fit rank {t.rank}")
        ell_shapes.append(t.shape[len(head):len(head) + n_ell])
        own: dict[str, int] = {}
        for c, d in zip(head + tail, t.shape[:len(head)] + t.shape[len(head) + n_ell:]):
            if UNKNOWN not in (d, own.get(c, d)) and own.get(c, d) != d:  # a diagonal needs equal extents
                raise ShapeError(f"label {c!r} has extents {own[c]} and {d}")
            own.setdefault(c, d)
            sizes.setdefault(c, []).append(d)
    for c, ds in sizes.items():
        known = sorted(set(ds) - {1, UNKNOWN})
        if len(known) > 1:
            raise ShapeError(f"label {c!r} has extents {known[0]} and {known[1]}")
    ell_shape = broadcast_shapes(*ell_shapes) if ell_shapes else ()
    head, dots, tail = rhs.partition("...")
    out = [_extent(sizes[c]) for c in head] + (list(ell_shape) if dots else []) + [_extent(sizes[c]) for c in tail]
    return TensorType(tuple(out), types[0].dtype)


einsum.def_impl(in_float32(lambda *xs, equation: torch.einsum(equation, *xs).to(xs[0].dtype)))


@einsum.def_vjp
def _einsum_vjp(g, op, dy):
    """Each operand's cotangent is an einsum of dy with the other operands, to the operand's own term.

    An output term cannot repeat a label, so a repeated label (a diagonal, "ii->i") is renamed
    apart and a mask shaped like the operand ties the copies together (ones where their
    coordinates agree). The mask, then all ones, also brings the extents that neither dy nor the
    other operands are known to have: labels only that operand has, which the forward summed, and
    labels the others have at extent 1 (broadcast). Extents the operand broadcast are summed back.
    With labels before '...' the broadcast axes are put first for that sum and moved back, which
    needs the operand's rank: an operand of unknown rank there is an error.
    """
    xs = op.inputs
    if not xs[0].dtype.is_floating:
        return [None] * len(xs)
    terms, rhs = _terms(op.attrs["equation"], len(xs))
    fresh = iter(c for c in string.ascii_letters if c not in op.attrs["equation"])
    grads = []
    for k, (x, term) in enumerate(zip(xs, terms)):
        others = [t for j, t in enumerate(terms) if j != k]
        head, dots, tail = term.partition("...")
        axes = list(range(len(head))) + list(range(-len(tail), 0))  # tail axes count from the end
        first, ties, renamed = {}, [], []
        for c, axis in zip(head + tail, axes):
            if c in first:
                ties.append((first[c], axis))
                c = next(fresh)
            first.setdefault(c, axis)
            renamed.append(c)
        new_head, new_tail = "".join(renamed[:len(head)]), "".join(renamed[len(head):])
        own = _label_extents(term, x)
        known = [_label_extents(t, xs[j]) for j, t in enumerate(terms) if j != k]

        def reached(c):  # the cotangent einsum gives label c the operand's extent
            d = own.get(c, UNKNOWN)
            return c in rhs or d == 1 or (d != UNKNOWN and any(e.get(c) == d for e in known))

        subs, operands = [rhs] + others, [dy] + [t for j, t in enumerate(xs) if j != k]
        if ties or not all(reached(c) for c in head + tail) or (dots and "..." not in rhs):
            subs.append(new_head + dots + new_tail)
            operands.append(_einsum_mask(g, x, ties))
        if not (dots and head):
            grads.append(g.sum_to_shape(g.einsum(",".join(subs) + "->" + new_head + dots + new_tail, *operands), x))
            continue
        if x.rank is None:
            raise GraphError(f"gradients: einsum ({op.name}, built at {op.location}): operand {k} ({x.name}) has "
                             f"labels before '...' ({term!r}) and an unknown rank; the gradient rule needs its rank "
                             f"to sum the broadcast axes back")
        n_ell = x.rank - len(head) - len(tail)
        perm = list(range(len(head), len(head) + n_ell)) + list(range(len(head))) + \
            list(range(len(head) + n_ell, x.rank))
        grad = g.einsum(",".join(subs) + "->..." + new_head + new_tail, *operands)
        grad = g.sum_to_shape(grad, g.transpose(x, perm))
        grads.append(g.transpose(grad, [perm.index(a) for a in range(x.rank)]))
    return grads


def _label_extents(term, t):
    """label -> the extent of t's axis with that label, where t's shape is known."""
    if t.shape is None:
        return {}
    head, _, tail = term.partition("...")
    return dict(zip(head + tail, t.shape[:len(head)] + t.shape[len(t.shape) - len(tail):]))


def _einsum_mask(g, x, ties):
    """Shaped like x and of its dtype: 1 where the coordinates along each tied pair of axes agree, else 0."""
    ones = g.broadcast_to(g.constant(1, dtypes.int32), x)
    keep = None
    for a, b in ties:
        same = g.equal(g.cumulative_sum(ones, a), g.cumulative_sum(ones, b))
        keep = same if keep is None else g.logical_and(keep, same)
    return g.broadcast_to(g.constant(1, x.dtype), x) if keep is None else g.cast(keep, x.dtype)


@builder("einsum")
def _einsum(g, equation, *operands, name=None):
    """``np.einsum(equation, *operands)``, e.g. ``g.einsum("bij,bjk->bik", a, b)``.

    Labels of extent 1 broadcast, and broadcast axes ('...') that the output leaves out are
    summed, as torch.einsum does. The IR keeps the equation with its output term written out.
    Gradients flow to every operand, diagonals included, except where an operand of unknown rank
    has labels before '...' ("i...j"): building gradients through that einsum is an error.
    """
    if not operands:
        raise g._error("einsum", "needs at least one operand")
    xs = g.promote(*operands, name="einsum") if len(operands) > 1 else [g.as_tensor(operands[0])]
    terms, rhs = g._checked("einsum", xs, _terms, str(equation), len(xs))
    return g._emit1("einsum", xs, {"equation": ",".join(terms) + "->" + rhs}, name)
