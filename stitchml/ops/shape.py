"""Shape primitives that importers need for models with symbolic extents.

`reshape_with_dims` is `reshape` whose target shape may copy extents of other
tensors at run time: what ONNX's ``Reshape(x, Concat(Shape(x)[0], -1))`` and
torch.export's ``view(x, [s0, -1])`` mean when the batch extent is symbolic.
"""
from __future__ import annotations

import math
from collections import Counter

from ..errors import ShapeError
from ..ir import UNKNOWN, TensorType, broadcast_shapes
from ..registry import MOVEMENT, Primitive, builder, register

reshape_with_dims = register(Primitive(
    "reshape_with_dims", MOVEMENT,
    doc=("Reshape input 0 to `shape` (one -1 inferred), where each (out_axis, input, axis) in `copies` "
         "multiplies out_axis by the run-time extent of that axis of that input."),
))


def _resolve(shapes, shape, copies, error=ShapeError):
    """Each copied extent multiplies its output entry (which starts as the int in `shape`).

    An input of unknown rank gives unknown extents; at run time (`error` ValueError) every
    copied axis must exist.
    """
    out = list(shape)
    for o, i, a in copies:
        if not (0 <= o < len(out)) or not (0 <= i < len(shapes)) or (
                shapes[i] is not None and not -len(shapes[i]) <= a < len(shapes[i])):
            raise error(f"copy ({o}, {i}, {a}) names an axis that does not exist")
        d = UNKNOWN if shapes[i] is None else shapes[i][a]
        out[o] = UNKNOWN if UNKNOWN in (d, out[o]) else out[o] * d
    return out


@reshape_with_dims.def_infer
def _reshape_with_dims_infer(types, shape, copies):
    x = types[0]
    if sum(d == -1 for d in shape) > 1:
        raise ShapeError(f"target shape {shape} has more than one -1")
    if any(shape[o] == -1 for o, _, _ in copies):
        raise ShapeError("the inferred (-1) extent cannot also copy extents")
    out = _resolve([t.shape for t in types], shape, copies)
    inferred = [i for i, d in enumerate(shape) if d == -1]
    if x.shape is not None:
        # Element count of x over the product of the other output extents, where unknown extents
        # of x that the output copies cancel out.
        num, den = Counter(), Counter()
        for a, d in enumerate(x.shape):
            num[("x", a) if d == UNKNOWN else d] += 1
        for j, d in enumerate(shape):
            if j not in inferred:
                den[d] += 1
        for o, i, a in copies:
            d = UNKNOWN if types[i].shape is None else types[i].shape[a]
            den[("x", a % len(x.shape)) if i == 0 and d == UNKNOWN else d] += 1
        common = num & den
        num, den = num - common, den - common
        if not any(isinstance(k, tuple) or k == UNKNOWN for k in list(num) + list(den)):
            n = math.prod(k ** c for k, c in num.items())
            m = math.prod(k ** c for k, c in den.items())
            if (m == 0 or n % m) if inferred else n != m:
                raise ShapeError(f"cannot reshape {x.shape} to {tuple(out)}")
            if inferred:
                out[inferred[0]] = n // m
    return TensorType(tuple(out), x.dtype)


@reshape_with_dims.def_impl
def _reshape_with_dims_impl(x, *others, shape, copies):
    return x.reshape(_resolve([tuple(x.shape)] + [tuple(o.shape) for o in others], shape, copies, ValueError))


reshape_with_dims.def_vjp(lambda g, op, dy: [g.reshape(dy, op.inputs[0])] + [None] * (len(op.inputs) - 1))


@builder("reshape_with_dims")
def _reshape_with_dims(g, x, shape, copies=(), sources=(), name=None):
    """Reshape `x` to `shape`, multiplying extent ``out_axis`` by an extent of ``sources[input - 1]``
    (input 0: `x`) at run time: ``(1, -1)`` with copies ``[(0, 0, 0)]`` keeps the batch and flattens the rest.

    >>> import stitchml as sm; g = sm.Graph()
    >>> x = g.placeholder((-1, 4, 5), sm.float32)
    >>> g.reshape_with_dims(x, (1, -1), copies=[(0, 0, 0)]).type.shape
    (-1, 20)
    """
    return _emit_with_dims(g, "reshape_with_dims", x, shape, copies, sources, name)


def _emit_with_dims(g, op, x, shape, copies, sources, name):
    x = g.as_tensor(x)
    sources = [g.as_tensor(s) for s in sources]
    attrs = {"shape": tuple(int(d) for d in shape), "copies": tuple(tuple(int(v) for v in c) for c in copies)}
    return g._emit1(op, [x, *sources], attrs, name)


broadcast_with_dims = register(Primitive(
    "broadcast_with_dims", MOVEMENT,
    doc=("Broadcast input 0 to `shape`, where each (out_axis, input, axis) in `copies` multiplies out_axis by "
         "the run-time extent of that axis of that input (input 0 is the broadcast tensor itself)."),
))


@broadcast_with_dims.def_infer
def _broadcast_with_dims_infer(types, shape, copies):
    x = types[0]
    if any(d < 0 for d in shape):
        raise ShapeError(f"shape {shape} has an extent < 0; copies give the extents known at run time only")
    out = _resolve([t.shape for t in types], shape, copies)
    if x.shape is not None and len(x.shape) > len(out):
        raise ShapeError(f"cannot broadcast rank {len(x.shape)} {x.shape} to lower rank {tuple(out)}")
    if x.shape is not None and any(d != UNKNOWN and j != d for j, d in zip(broadcast_shapes(x.shape, out), out)):
        raise ShapeError(f"cannot broadcast {x.shape} to {tuple(out)}")
    return TensorType(tuple(out), x.dtype)


@broadcast_with_dims.def_impl
def _broadcast_with_dims_impl(x, *others, shape, copies):
    return x.expand(_resolve([tuple(x.shape)] + [tuple(o.shape) for o in others], shape, copies, ValueError))


broadcast_with_dims.def_vjp(lambda g, op, dy: [g.sum_to_shape(dy, op.inputs[0])] + [None] * (len(op.inputs) - 1))


@builder("broadcast_with_dims")
def _broadcast_with_dims(g, x, shape, copies=(), sources=(), name=None):
    """Broadcast `x` to `shape`, multiplying extent ``out_axis`` by an extent of ``sources[input - 1]`` at run time.

    >>> import stitchml as sm; g = sm.Graph()
    >>> x = g.placeholder((-1, 4), sm.float32)
    >>> g.broadcast_with_dims(g.constant(0.0), (2, 1, 4), copies=[(1, 1, 0)], sources=[x]).type.shape
    (2, -1, 4)
    """
    return _emit_with_dims(g, "broadcast_with_dims", x, shape, copies, sources, name)
