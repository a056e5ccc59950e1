"""simplify: make shape-only ops static and apply algebraic identities.

Requires: static types. Ensures:
* ops that take a *like* tensor only for its shape (reshape, broadcast_to,
  sum_to_shape, split, random draws) take a static shape instead, so the like
  tensor is no longer an input (and may be pruned);
* expand_dims and squeeze are reshapes (one view op for the memory planner);
* `element_count` is a constant;
* identities: x*1, 1*x, x+0, 0+x, x-0, x/1, x**1, x**2 -> x*x, x**0.5 -> sqrt,
  x**-1 -> reciprocal, -(-x), cast to its own dtype, identity, stop_gradient,
  reshape/transpose/broadcast to the same shape, chains of reshapes and of
  transposes, select on a constant predicate;
* a transpose that swaps two axes counted from the end (built for an operand
  of unknown rank) becomes a permutation;
* a convolution of a zero-padded input (TensorFlow's "same" padding as an
  explicit pad, as exported models have it) pads inside the convolution:
  no padded copy of the activation, and the native CPU loop nests and the
  libraries take any padding.

Each rule is an entry of RULES keyed by op name: `rule(g, op, inputs)`
returns replacement outputs or None.
"""
from __future__ import annotations

import math

import torch

from ..ops.movement import swap_permutation
from .fold import constant_value, is_constant
from .program import Program, rewrite


def _scalar(t):
    """The Python value of a constant tensor whose elements are all equal, else None."""
    if not is_constant(t):
        return None
    v = constant_value(t)
    if v.numel() == 0:
        return None
    first = v.flatten()[0]
    return first.item() if bool((v == first).all()) else None


def _same(op, t):
    """`t` can stand in for op's output: same type."""
    return t.type == op.outputs[0].type


def _reshape(g, x, shape, name=None):
    if x.shape == tuple(shape):
        return x
    if x.op.op == "reshape" and len(x.op.inputs) == 1:
        x = x.op.inputs[0]
    return g._emit1("reshape", [x], {"shape": tuple(shape)}, name)


def _identity(g, op, inputs):
    return [inputs[0]]


def _binary_identity(neutral_left, neutral_right):
    def rule(g, op, inputs):
        a, b = inputs
        if neutral_right is not None and _scalar(b) == neutral_right and _same(op, a):
            return [a]
        if neutral_left is not None and _scalar(a) == neutral_left and _same(op, b):
            return [b]
        return None

    return rule


def _power(g, op, inputs):
    x, y = inputs
    e = _scalar(y)
    if e is None or not _same(op, x) or not x.dtype.is_floating:
        return None
    table = {1: lambda: x, 2: lambda: g.multiplication(x, x), 0.5: lambda: g.square_root(x),
             -1: lambda: g.reciprocal(x), 3: lambda: g.multiplication(g.multiplication(x, x), x)}
    return [table[e]()] if e in table else None


def _negative(g, op, inputs):
    (x,) = inputs
    return [x.op.inputs[0]] if x.op.op == "negative" else None


def _cast(g, op, inputs):
    (x,) = inputs
    return [x] if x.dtype == op.outputs[0].dtype else None


def _reshape_rule(g, op, inputs):
    return [_reshape(g, inputs[0], op.outputs[0].shape, op.name)]


def _broadcast_to(g, op, inputs):
    x = inputs[0]
    if x.shape == op.outputs[0].shape:
        return [x]
    if len(inputs) == 1:
        return None
    return [g._emit1("broadcast_to", [x], {"shape": op.outputs[0].shape}, op.name)]


def _sum_to_shape(g, op, inputs):
    x, like = inputs
    target = like.shape
    if x.shape == target:
        return [x]
    lead = len(x.shape) - len(target)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(target) if d == 1 and x.shape[lead + i] != 1)
    summed = g.reduction_sum(x, axes, keep_dims=False)
    return [_reshape(g, summed, target, op.name)]


def _transpose(g, op, inputs):
    (x,) = inputs
    swap = op.attrs.get("swap")
    if swap is not None:  # the rank is known now: the permutation form, which the later passes read
        return [g._emit1("transpose", [x], {"permutation": swap_permutation(swap, x.rank)}, op.name)]
    perm = op.attrs["permutation"]
    if list(perm) == list(range(len(perm))):
        return [x]
    if x.op.op == "transpose" and "permutation" in x.op.attrs:
        inner = x.op.attrs["permutation"]
        return [g.transpose(x.op.inputs[0], [inner[p] for p in perm])]
    return None


def _split(g, op, inputs):
    if len(inputs) == 1:
        return None
    sizes = tuple(t.shape[op.attrs["axis"]] for t in op.outputs)
    return list(g._emit("split", [inputs[0]], {"axis": op.attrs["axis"], "sizes": sizes}, op.name).outputs)


def _random(g, op, inputs):
    if not inputs:
        return None
    attrs = {**op.attrs, "shape": op.outputs[0].shape}
    return [g._emit1(op.op, [], attrs, op.name)]


def _element_count(g, op, inputs):
    (x,) = inputs
    axes = op.attrs["axes"]
    n = 1
    for a in range(len(x.shape)) if axes is None else axes:
        n *= x.shape[a]
    return [g.constant(torch.tensor(n, dtype=op.outputs[0].dtype.torch), name=op.name)]


def _select(g, op, inputs):
    p, a, b = inputs
    v = _scalar(p)
    if v is None:
        return None
    pick = a if v else b
    return [pick] if _same(op, pick) else None


def _padded_convolution(g, op, inputs):
    x, w = inputs
    padded = x.op
    if padded.op != "pad" or len(padded.inputs) != 1 or op.attrs["padding"] == "same":
        return None
    value, left, right = padded.attrs["constant_value"], padded.attrs["left"], padded.attrs["right"]
    if value != 0 or math.copysign(1.0, value) < 0 or len(left) != 4:  # -0.0 would show in an all-padding window
        return None
    rows, cols = (2, 3) if op.attrs["data_layout"] == "NCHW" else (1, 2)
    if any(left[a] or right[a] for a in range(4) if a not in (rows, cols)):
        return None
    top, bottom, first, last = (0, 0, 0, 0) if op.attrs["padding"] == "valid" else op.attrs["padding"]
    padding = (top + left[rows], bottom + right[rows], first + left[cols], last + right[cols])
    conv = g._emit("convolution2d", [padded.inputs[0], w], {**op.attrs, "padding": padding}, op.name)
    conv.location, conv.scope = op.location, op.scope
    return conv.outputs if _same(op, conv.outputs[0]) else None


RULES = {
    "identity": _identity,
    "stop_gradient": _identity,
    "addition": _binary_identity(0, 0),
    "subtraction": _binary_identity(None, 0),
    "multiplication": _binary_identity(1, 1),
    "division": _binary_identity(None, 1),
    "power": _power,
    "negative": _negative,
    "cast": _cast,
    "reshape": _reshape_rule,
    "expand_dims": _reshape_rule,
    "squeeze": _reshape_rule,
    "broadcast_to": _broadcast_to,
    "sum_to_shape": _sum_to_shape,
    "transpose": _transpose,
    "split": _split,
    "random_uniform": _random,
    "random_normal": _random,
    "element_count": _element_count,
    "select": _select,
    "convolution2d": _padded_convolution,
}


def simplify(program: Program, ctx) -> Program:
    def visit(g, op, inputs):
        rule = RULES.get(op.op)
        return rule(g, op, inputs) if rule is not None else None

    return rewrite(program, visit)
