"""ONNX operators as StitchML builder calls: one handler per op type, in the table `HANDLERS`.

A handler is ``handler(cx, node, args, attrs) -> list of values``: `cx` is the
`Importer` (onnx_import.py), `args` the node's inputs (Tensor, Dims, or None
for an omitted optional input), `attrs` its attributes as Python values. The
semantics follow the ONNX operator documentation at the latest opset; where
an earlier opset passed an operand as an attribute instead (axes, split,
pads, min/max) both forms are read.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .. import dtypes
from ..ir import UNKNOWN, Tensor
from . import shapes
from .onnx_values import Dims, onnx_dtype

HANDLERS: dict[str, Callable] = {}


def handles(*op_types: str):
    def register(fn):
        for t in op_types:
            HANDLERS[t] = fn
        return fn

    return register


def _t(cx, v) -> Tensor:
    return cx.tensor(v)


def _axes_operand(cx, args, attrs, index: int = 1):
    """axes from the input at `index` (newer opsets) or the `axes` attribute (older ones)."""
    if len(args) > index and args[index] is not None:
        return [int(a) for a in cx.static(args[index], "axes").reshape(-1)]
    return list(attrs["axes"]) if "axes" in attrs else None


def _rank(cx, x: Tensor) -> int:
    if x.rank is None:
        raise cx.fail(f"input {x.name} needs a known rank")
    return x.rank


# -- elementwise ------------------------------------------------------------------------
_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exponent", "Log": "logarithm",
          "Sqrt": "square_root", "Neg": "negative", "Abs": "absolute", "Reciprocal": "reciprocal",
          "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "Erf": "erf", "Sin": "sin",
          "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh",
          "Cosh": "cosh", "IsNaN": "is_nan", "Not": "logical_not"}
_BINARY = {"Add": "addition", "Sub": "subtraction", "Mul": "multiplication", "Equal": "equal",
           "Less": "less_than", "LessOrEqual": "less_than_or_equal_to", "Greater": "greater_than",
           "GreaterOrEqual": "greater_than_or_equal_to", "And": "logical_and", "Or": "logical_or",
           "Xor": "logical_xor"}


def _unary(name):
    return lambda cx, node, args, attrs: [getattr(cx.g, name)(_t(cx, args[0]))]


def _binary(name):
    return lambda cx, node, args, attrs: [getattr(cx.g, name)(_t(cx, args[0]), _t(cx, args[1]))]


for _op, _name in _UNARY.items():
    HANDLERS[_op] = _unary(_name)
for _op, _name in _BINARY.items():
    HANDLERS[_op] = _binary(_name)


@handles("Identity")
def _identity(cx, node, args, attrs):
    return [args[0] if isinstance(args[0], Dims) else cx.g.identity(_t(cx, args[0]))]


def _nonzero_divisor(cx, b: Tensor) -> None:
    """Integer division by a known zero is undefined (ONNX) and an error when folded: refuse it by name."""
    if not b.dtype.is_floating and b.op.op == "constant" and bool((b.op.attrs["value"] == 0).any()):
        raise cx.fail(f"integer divisor {b.name} holds a zero")


@handles("Div")
def _div(cx, node, args, attrs):
    a, b = _t(cx, args[0]), _t(cx, args[1])
    _nonzero_divisor(cx, b)
    g = cx.g
    if a.dtype.is_floating:
        return [g.division(a, b)]
    # Integer division truncates toward zero, as C does: the floor quotient (exact in the integer type, where
    # a float quotient would round above 2^24), plus one where an inexact quotient is negative.
    q = g.floor_division(a, b)
    if not a.dtype.is_signed:
        return [q]
    inexact = g.not_equal(g.modulo(a, b), g.constant(0, a.dtype))
    negative = g.not_equal(a < g.constant(0, a.dtype), b < g.constant(0, a.dtype))
    return [g.select(g.logical_and(inexact, negative), q + g.constant(1, a.dtype), q)]


@handles("Mod")
def _mod(cx, node, args, attrs):
    g = cx.g
    a, b = _t(cx, args[0]), _t(cx, args[1])
    _nonzero_divisor(cx, b)
    r = g.modulo(a, b)
    if not attrs.get("fmod", 0):
        return [r]
    # fmod takes the sign of the dividend; remainder takes the divisor's.
    wrong_sign = g.logical_and(g.not_equal(r, 0), g.not_equal(g.less_than(r, 0), g.less_than(a, 0)))
    return [g.select(wrong_sign, r - b, r)]


@handles("Pow")
def _pow(cx, node, args, attrs):
    g = cx.g
    a, b = _t(cx, args[0]), _t(cx, args[1])
    if a.dtype.is_floating:
        return [g.power(a, g.cast(b, a.dtype))]
    y = g.power(g.cast(a, dtypes.float64), g.cast(b, dtypes.float64))
    return [g.cast(y, a.dtype)]


@handles("Softsign")
def _softsign(cx, node, args, attrs):
    x = _t(cx, args[0])
    return [x / (1.0 + cx.g.absolute(x))]


@handles("Asinh", "Acosh", "Atanh")
def _inverse_hyperbolic(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    if node.op_type == "Asinh":
        return [g.logarithm(x + g.square_root(x * x + 1.0))]
    if node.op_type == "Acosh":
        return [g.logarithm(x + g.square_root(x * x - 1.0))]
    return [0.5 * g.logarithm((1.0 + x) / (1.0 - x))]


@handles("IsInf")
def _isinf(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    pos, neg = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
    inf = g.is_infinite(x)
    if pos and neg:
        return [inf]
    if not pos and not neg:
        return [g.logical_and(inf, False)]
    return [g.logical_and(inf, g.greater_than(x, 0) if pos else g.less_than(x, 0))]


@handles("LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "HardSigmoid", "HardSwish", "Mish", "Swish",
         "Gelu", "Softplus", "Shrink")
def _activation(cx, node, args, attrs):
    x = _t(cx, args[0])
    if x.dtype in (dtypes.float16, dtypes.bfloat16):  # half types round once, at the end, as the reference does
        return [cx.g.cast(y, x.dtype) for y in _activation(cx, node, [cx.g.cast(x, dtypes.float32)], attrs)]
    g, op = cx.g, node.op_type
    if op == "LeakyRelu":
        return [g.leaky_relu(x, attrs.get("alpha", 0.01))]
    if op in ("Elu", "Selu", "Celu"):
        alpha = attrs.get("alpha", {"Elu": 1.0, "Celu": 1.0, "Selu": 1.6732632423543772}[op])
        neg = alpha * (g.exponent(x / alpha) - 1.0) if op == "Celu" else alpha * (g.exponent(x) - 1.0)
        y = g.select(x > 0, x, neg)
        return [y * attrs.get("gamma", 1.0507009873554805) if op == "Selu" else y]
    if op == "ThresholdedRelu":
        return [g.select(x > attrs.get("alpha", 1.0), x, 0.0)]
    if op in ("HardSigmoid", "HardSwish"):
        alpha, beta = (attrs.get("alpha", 0.2), attrs.get("beta", 0.5)) if op == "HardSigmoid" else (1 / 6, 0.5)
        hs = g.maximum(g.minimum(x * alpha + beta, 1.0), 0.0)
        return [hs if op == "HardSigmoid" else x * hs]
    if op == "Mish":
        return [x * g.tanh(g.softplus(x))]
    if op == "Swish":
        return [x * g.sigmoid(x * attrs.get("alpha", 1.0))]
    if op == "Gelu":
        return [g.gelu(x, attrs.get("approximate", "none"))]
    if op == "Softplus":
        return [g.logarithm(g.exponent(x) + 1.0)]
    lambd, bias = attrs.get("lambd", 0.5), attrs.get("bias", 0.0)
    return [g.cast(g.select(x < -lambd, x + bias, g.select(x > lambd, x - bias, 0.0)), x.dtype)]


@handles("PRelu")
def _prelu(cx, node, args, attrs):
    x, slope = _t(cx, args[0]), _t(cx, args[1])
    return [cx.g.select(x < 0, x * slope, x)]


@handles("Where")
def _where(cx, node, args, attrs):
    return [cx.g.select(_t(cx, args[0]), _t(cx, args[1]), _t(cx, args[2]))]


@handles("Max", "Min", "Sum", "Mean")
def _variadic(cx, node, args, attrs):
    g = cx.g
    fn = {"Max": g.maximum, "Min": g.minimum, "Sum": g.addition, "Mean": g.addition}[node.op_type]
    xs = [_t(cx, a) for a in args if a is not None]
    y = xs[0] if len(xs) > 1 else g.identity(xs[0])
    for x in xs[1:]:
        y = fn(y, x)
    return [y / float(len(xs)) if node.op_type == "Mean" else y]


@handles("Clip")
def _clip(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    lo = args[1] if len(args) > 1 and args[1] is not None else attrs.get("min")
    hi = args[2] if len(args) > 2 and args[2] is not None else attrs.get("max")
    y = x
    if lo is not None:
        y = g.maximum(y, g.cast(_t(cx, np.asarray(lo, x.dtype.numpy) if isinstance(lo, float) else lo), x.dtype))
    if hi is not None:
        y = g.minimum(y, g.cast(_t(cx, np.asarray(hi, x.dtype.numpy) if isinstance(hi, float) else hi), x.dtype))
    return [y if y is not x else g.identity(x)]


# Per float8 type: the magnitude from which a value rounds past the largest finite one, and whether a
# value just at it does (ties go to even: 448 in float8_e4m3fn has an even mantissa, the others' odd).
_FLOAT8_OVERFLOW = {"float8_e4m3fn": (464.0, False), "float8_e5m2": (61440.0, True),
                    "float8_e4m3fnuz": (248.0, True), "float8_e5m2fnuz": (61440.0, True)}


def to_float8(g, x, dt: dtypes.DType, saturate: bool):
    """`x` cast to the float8 type `dt` as ONNX's Cast does: rounding half to even, and beyond the
    type's range (infinities included) the largest finite value with `saturate`, else NaN (infinity
    of the same sign for float8_e5m2). PyTorch's cast saturates float8_e4m3fn and overflows the
    others, so both cases are made explicit before it."""
    if x.dtype.is_floating:
        if saturate:
            top = float(torch.finfo(dt.torch).max)
            x = g.clamp(x, -top, top)
        else:
            limit, at = _FLOAT8_OVERFLOW[dt.name]
            size = g.absolute(x)
            over = size >= limit if at else size > limit
            if dt == dtypes.float8_e5m2:
                beyond = g.select(x > 0, math.inf, -math.inf)
            else:
                beyond = g.cast(g.constant(math.nan, dtypes.float32), x.dtype)
            x = g.select(over, beyond, x)
    return g.cast(x, dt)


@handles("Cast", "CastLike")
def _cast(cx, node, args, attrs):
    if node.op_type == "Cast":
        dt = onnx_dtype(attrs["to"], cx.where())
    else:
        dt = _t(cx, args[1]).dtype
    if isinstance(args[0], Dims) and dt in (dtypes.int64, dtypes.int32):
        return [args[0]]
    if dt.is_float8:
        return [to_float8(cx.g, _t(cx, args[0]), dt, bool(attrs.get("saturate", 1)))]
    return [cx.g.cast(_t(cx, args[0]), dt)]


@handles("Constant")
def _constant(cx, node, args, attrs):
    if "value" in attrs:
        return [cx.tensor(attrs["value"])]
    for key, dt in (("value_float", np.float32), ("value_int", np.int64), ("value_floats", np.float32),
                    ("value_ints", np.int64)):
        if key in attrs:
            return [cx.tensor(np.array(attrs[key], dt))]
    raise cx.fail(f"Constant with attributes {sorted(attrs)} is not supported")


# -- shape computations -------------------------------------------------------------------
@handles("Shape")
def _shape(cx, node, args, attrs):
    x = _t(cx, args[0]) if not isinstance(args[0], Dims) else cx.tensor(args[0])
    rank = _rank(cx, x)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    axes = range(rank)[slice(start, end)]
    return [Dims([x.shape[a] if x.shape[a] != UNKNOWN else (x, a) for a in axes])]


@handles("Size")
def _size(cx, node, args, attrs):
    x = _t(cx, args[0])
    if x.type.is_static:
        return [cx.tensor(np.array(x.type.numel(), np.int64))]
    return [cx.g.cast(cx.g.element_count(x, None, dtypes.int64), dtypes.int64)]


def _dims_entries(cx, v) -> list:
    return v.entries if isinstance(v, Dims) else [int(e) for e in cx.static(v, "a shape").reshape(-1)]


@handles("Reshape")
def _reshape(cx, node, args, attrs):
    x = _t(cx, args[0])
    entries = _dims_entries(cx, args[1])
    if not attrs.get("allowzero", 0):
        entries = [(x.shape[i] if x.shape[i] != UNKNOWN else (x, i)) if e == 0 else e for i, e in enumerate(entries)]
    return [_reshape_to(cx, x, entries)]


def _reshape_to(cx, x: Tensor, entries: list) -> Tensor:
    return shapes.reshape_to(cx.g, x, entries)


@handles("Flatten")
def _flatten(cx, node, args, attrs):
    x = _t(cx, args[0])
    rank = _rank(cx, x)
    axis = attrs.get("axis", 1)
    axis = rank if axis == rank else cx.axis(axis, rank)  # Flatten also takes axis == rank
    left, right = x.shape[:axis], x.shape[axis:]
    if UNKNOWN not in left:
        return [cx.g.reshape(x, (int(np.prod(left, dtype=np.int64)), -1))]
    if UNKNOWN not in right:
        return [cx.g.reshape(x, (-1, int(np.prod(right, dtype=np.int64))))]
    if axis == 1:
        return [_reshape_to(cx, x, [(x, 0), -1])]
    raise cx.fail(f"Flatten at axis {axis} of {x.type} has unknown extents on both sides")


def _dims_or_tensor(fn_dims, fn_tensor):
    def handler(cx, node, args, attrs):
        if isinstance(args[0], Dims):
            return fn_dims(cx, node, args, attrs)
        return fn_tensor(cx, node, args, attrs)

    return handler


def _in_range(cx, idx, n: int, what: str) -> None:
    """Known indices must lie in [-n, n) (ONNX: out of range is an error)."""
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise cx.fail(f"{what} {idx.min()}..{idx.max()} fall outside [{-n}, {n})")


def _gather_dims(cx, node, args, attrs):
    idx = cx.static(args[1], "Gather indices on a shape")
    entries = args[0].entries
    _in_range(cx, idx, len(entries), "indices")
    picked = [entries[int(i)] for i in idx.reshape(-1)]
    return [Dims(picked, scalar=idx.ndim == 0)]


def _gather_tensor(cx, node, args, attrs):
    x, idx = _t(cx, args[0]), _t(cx, args[1])
    axis = cx.axis(attrs.get("axis", 0), _rank(cx, x))
    _known_indices_in_range(cx, x, idx, axis)
    return [cx.g.gather(x, idx, axis)]


def _known_indices_in_range(cx, x: Tensor, idx: Tensor, axis: int) -> None:
    if idx.op.op == "constant" and x.shape[axis] != UNKNOWN:
        _in_range(cx, idx.op.attrs["value"].numpy(), x.shape[axis], "indices")


HANDLERS["Gather"] = _dims_or_tensor(_gather_dims, _gather_tensor)


def _slice_params(cx, args, attrs, rank):
    if len(args) > 1:
        starts = cx.static(args[1], "Slice starts").reshape(-1).tolist()
        ends = cx.static(args[2], "Slice ends").reshape(-1).tolist()
        axes = _axes_operand(cx, args, {}, 3) or list(range(len(starts)))
        steps = cx.static(args[4], "Slice steps").reshape(-1).tolist() if len(args) > 4 and args[4] is not None \
            else [1] * len(starts)
    else:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes, steps = list(attrs.get("axes", range(len(starts)))), [1] * len(starts)
    s, e, st = [None] * rank, [None] * rank, [1] * rank
    for a, b, c, d in zip(axes, starts, ends, steps):
        a = cx.axis(a, rank, "Slice axis")
        if d == 0:
            raise cx.fail("Slice step 0")
        s[a], e[a], st[a] = int(b), int(c), int(d)
    return s, e, st


def _slice_dims(cx, node, args, attrs):
    s, e, st = _slice_params(cx, args, attrs, 1)
    return [Dims(args[0].entries[slice(s[0], e[0], st[0])])]


def _slice_tensor(cx, node, args, attrs):
    x = _t(cx, args[0])
    s, e, st = _slice_params(cx, args, attrs, _rank(cx, x))
    return [cx.g.slice(x, s, e, st)]


HANDLERS["Slice"] = _dims_or_tensor(_slice_dims, _slice_tensor)


def _concat_dims(cx, node, args, attrs):
    return [Dims([e for a in args for e in _dims_entries(cx, a)])]


@handles("Concat")
def _concat(cx, node, args, attrs):
    if any(isinstance(a, Dims) for a in args):
        return _concat_dims(cx, node, args, attrs)
    xs = [_t(cx, a) for a in args]
    return [cx.g.concat(xs, cx.axis(attrs["axis"], _rank(cx, xs[0])))]


@handles("Unsqueeze")
def _unsqueeze(cx, node, args, attrs):
    axes = _axes_operand(cx, args, attrs)
    if isinstance(args[0], Dims) and args[0].scalar and axes in ([0], [-1]):
        return [Dims(args[0].entries)]
    return [cx.g.expand_dims(_t(cx, args[0]), axes)]


@handles("Squeeze")
def _squeeze(cx, node, args, attrs):
    axes = _axes_operand(cx, args, attrs)
    if isinstance(args[0], Dims) and len(args[0].entries) == 1 and axes in (None, [0], [-1]):
        return [Dims(args[0].entries, scalar=True)]
    return [cx.g.squeeze(_t(cx, args[0]), axes)]


@handles("Transpose")
def _transpose(cx, node, args, attrs):
    x = _t(cx, args[0])
    perm = attrs.get("perm")
    return [cx.g.transpose(x, list(perm) if perm is not None else None)]


@handles("Expand")
def _expand(cx, node, args, attrs):
    x = _t(cx, args[0])
    entries = _dims_entries(cx, args[1])
    rank = max(len(entries), _rank(cx, x))
    entries = [1] * (rank - len(entries)) + entries
    xs = (1,) * (rank - x.rank) + x.shape
    # Bidirectional broadcast: an entry of 1 keeps x's extent, symbolic or not.
    target = [(x, a - (rank - x.rank)) if e == 1 and d == UNKNOWN else (d if e == 1 else e)
              for a, (e, d) in enumerate(zip(entries, xs))]
    return [shapes.broadcast_to(cx.g, x, target)]


@handles("Tile")
def _tile(cx, node, args, attrs):
    return [cx.g.tile(_t(cx, args[0]), cx.static(args[1], "Tile repeats").reshape(-1).tolist())]


@handles("ConstantOfShape")
def _constant_of_shape(cx, node, args, attrs):
    entries = _dims_entries(cx, args[0])
    value = cx.tensor(attrs.get("value", np.zeros(1, np.float32)).reshape(()))
    return [shapes.broadcast_to(cx.g, value, entries)]


@handles("EyeLike")
def _eye_like(cx, node, args, attrs):
    x = _t(cx, args[0])
    if x.shape is None or len(x.shape) != 2 or UNKNOWN in x.shape:
        raise cx.fail(f"the input must be 2-D with known extents, got {x.type}")
    dt = onnx_dtype(attrs["dtype"], "EyeLike dtype") if "dtype" in attrs else x.dtype
    eye = np.eye(x.shape[0], x.shape[1], int(attrs.get("k", 0)), dtype=np.float64)
    return [cx.g.cast(cx.tensor(eye), dt)]


@handles("Compress")
def _compress(cx, node, args, attrs):
    # The condition decides the result's extent, so it is an import-time operand (a value specialisation
    # when it is a graph input).
    x = _t(cx, args[0])
    keep = np.nonzero(cx.static(args[1], "Compress condition").reshape(-1))[0].astype(np.int64)
    if "axis" not in attrs:
        x, axis = cx.g.reshape(x, [-1]), 0
    else:
        axis = cx.axis(attrs["axis"], _rank(cx, x))
    if x.shape[axis] != UNKNOWN and keep.size and keep[-1] >= x.shape[axis]:
        raise cx.fail(f"the condition selects index {keep[-1]} of an axis of extent {x.shape[axis]}")
    return [cx.g.gather(x, cx.tensor(keep), axis)]


@handles("Range")
def _range(cx, node, args, attrs):
    start, limit, delta = (cx.static(a, "Range operands") for a in args)
    first, last, step = (float(v.reshape(-1)[0]) for v in (start, limit, delta))
    if step == 0 or not all(math.isfinite(v) for v in (first, last, step)):
        raise cx.fail(f"Range({first}, {last}, {step}) needs finite operands and a non-zero step")
    count = max(math.ceil((last - first) / step), 0)  # checked before NumPy computes it
    if count > cx.limits.max_folded_elements:
        raise cx.over("max_folded_elements", count, "Range length")
    return [cx.g.cast(cx.tensor(np.arange(start, limit, delta).astype(start.dtype)), _t(cx, args[0]).dtype)]


@handles("Split")
def _split(cx, node, args, attrs):
    x = _t(cx, args[0])
    axis = cx.axis(attrs.get("axis", 0), _rank(cx, x))
    if len(args) > 1 and args[1] is not None:
        sizes = cx.static(args[1], "Split sizes").reshape(-1).tolist()
    elif "split" in attrs:
        sizes = list(attrs["split"])
    else:
        n = x.shape[axis]
        parts = attrs.get("num_outputs", len(node.output))
        if n == UNKNOWN or n < 1 or not 1 <= parts <= n:
            raise cx.fail(f"an equal Split into {parts} needs a known extent of at least that many, got {x.type}")
        chunk = -(-n // parts)
        sizes = [chunk] * (n // chunk) + ([n % chunk] if n % chunk else [])
    if len(sizes) != len(node.output):
        raise cx.fail(f"{len(sizes)} split sizes for {len(node.output)} outputs")
    return cx.g.split(x, sizes, axis)


@handles("Pad")
def _pad(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    rank = _rank(cx, x)
    pads = cx.static(args[1], "Pad pads").reshape(-1).tolist() if len(args) > 1 else list(attrs["pads"])
    value = 0.0
    if len(args) > 2 and args[2] is not None:
        value = cx.static(args[2], "Pad constant_value").reshape(-1)
        value = value[0].item() if value.size else 0.0
    elif "value" in attrs:
        value = attrs["value"]
    axes = [cx.axis(a, rank) for a in (_axes_operand(cx, args, {}, 3) or range(rank))]
    if len(pads) != 2 * len(axes):
        raise cx.fail(f"{len(pads)} pads for {len(axes)} axes (expected two per axis)")
    left, right = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        left[a], right[a] = int(pads[i]), int(pads[i + len(axes)])
    for a, (lo, hi, n) in enumerate(zip(left, right, x.shape)):
        crop = -min(lo, 0) - min(hi, 0)
        if crop and (n == UNKNOWN or crop > n):
            raise cx.fail(f"pads {lo}, {hi} remove {crop} elements of axis {a}, whose extent is "
                          f"{'unknown' if n == UNKNOWN else n}")
    if min(left + right) < 0:  # negative pads crop
        x = g.slice(x, [-min(p, 0) for p in left], [min(p, 0) or None for p in right])
        left, right = [max(p, 0) for p in left], [max(p, 0) for p in right]
    mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "periodic"}[attrs.get("mode", "constant")]
    return [g.pad(x, left, right, mode, value)]


# -- reductions ---------------------------------------------------------------------------
def _reduce_axes(cx, node, args, attrs, x):
    axes = _axes_operand(cx, args, attrs)
    if not axes:
        return "noop" if attrs.get("noop_with_empty_axes", 0) else None
    return [cx.axis(a, _rank(cx, x)) for a in axes]


@handles("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
def _reduce(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    axes = _reduce_axes(cx, node, args, attrs, x)
    keep = bool(attrs.get("keepdims", 1))
    op = node.op_type
    if axes == "noop":
        return [g.identity(x)]
    if op in ("ReduceMax", "ReduceMin", "ReduceLogSumExp") and x.shape is not None and UNKNOWN not in x.shape:
        reduced = range(len(x.shape)) if axes is None else axes
        if any(x.shape[a] == 0 for a in reduced):  # over no elements: the operation's identity, as ONNX says
            shape = [1 if a in reduced else d for a, d in enumerate(x.shape)] if keep else \
                [d for a, d in enumerate(x.shape) if a not in reduced]
            identity = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSumExp": -np.inf}[op]
            if x.dtype == dtypes.bool_:
                identity = op == "ReduceMin"
            elif x.dtype.is_integer:
                info = np.iinfo(x.dtype.numpy)
                identity = info.min if op == "ReduceMax" else info.max
            return [g.constant(np.full(shape, identity), x.dtype)]
    if op == "ReduceLogSumExp":
        return [g.cast(g.log_sum_exp(x, axes if axes is not None else tuple(range(_rank(cx, x))), keep), x.dtype)]
    pre = {"ReduceL1": g.absolute, "ReduceL2": g.square, "ReduceSumSquare": g.square}.get(op)
    base = {"ReduceMean": g.reduction_mean, "ReduceMax": g.reduction_maximum, "ReduceMin": g.reduction_minimum,
            "ReduceProd": g.reduction_product}.get(op, g.reduction_sum)
    y = base(pre(x) if pre else x, axes, keep)
    if op == "ReduceL2":
        y = g.cast(g.square_root(y), x.dtype)
    elif op == "ReduceLogSum":
        y = g.logarithm(y)
    return [y]


@handles("ArgMax", "ArgMin")
def _arg(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    axis, keep = cx.axis(attrs.get("axis", 0), _rank(cx, x)), bool(attrs.get("keepdims", 1))
    fn = g.reduction_arg_maximum if node.op_type == "ArgMax" else g.reduction_arg_minimum
    if not attrs.get("select_last_index", 0):
        return [fn(x, axis, keep)]
    n = x.shape[axis]
    if n == UNKNOWN:
        raise cx.fail("select_last_index needs a known extent along the axis")
    return [(n - 1) - fn(g.reverse(x, axis), axis, keep)]


# -- softmax family -------------------------------------------------------------------------
@handles("Softmax", "LogSoftmax", "Hardmax")
def _softmax(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    rank = _rank(cx, x)
    legacy = cx.opset < 13
    axis = cx.axis(attrs.get("axis", 1 if legacy else -1), rank)
    shape = x.shape
    if legacy:  # before opset 13 the input is coerced to 2-D around `axis`
        x = _flatten(cx, node, [x], {"axis": axis})[0]
        axis = 1
    if node.op_type == "Softmax":
        y = g.softmax(x, axis)
    elif node.op_type == "LogSoftmax":
        y = g.log_softmax(x, axis)
    else:
        if x.shape[axis] == UNKNOWN:
            raise cx.fail("Hardmax needs a known extent along the axis")
        y = g.one_hot(g.reduction_arg_maximum(x, axis), x.shape[axis], axis=axis, dtype=x.dtype)
    return [g.reshape(y, shape) if legacy and -1 not in shape else y]


@handles("OneHot")
def _one_hot(cx, node, args, attrs):
    g = cx.g
    idx = _t(cx, args[0])
    depth = int(cx.static(args[1], "OneHot depth").reshape(-1)[0])
    values = cx.static(args[2], "OneHot values").reshape(-1)
    if not idx.dtype.is_integer:
        idx = g.cast(idx, dtypes.int64)
    idx = g.select(idx < 0, idx + depth, idx)  # ONNX counts negative indices from the end
    return [g.one_hot(idx, depth, attrs.get("axis", -1), _t(cx, args[2]).dtype,
                      values[1].item(), values[0].item())]


@handles("Trilu")
def _trilu(cx, node, args, attrs):
    x = _t(cx, args[0])
    k = int(cx.static(args[1], "Trilu k").reshape(-1)[0]) if len(args) > 1 and args[1] is not None else 0
    if x.rank is None or x.rank < 2 or UNKNOWN in x.shape[-2:]:
        raise cx.fail("Trilu needs known extents of the last two axes")
    n, m = x.shape[-2:]
    if n * m > cx.limits.max_folded_elements:
        raise cx.over("max_folded_elements", n * m, "Trilu mask elements")
    mask = np.triu(np.ones((n, m), bool), k) if attrs.get("upper", 1) else np.tril(np.ones((n, m), bool), k)
    return [cx.g.select(cx.tensor(mask), x, cx.g.cast(cx.tensor(np.zeros((), np.int64)), x.dtype))]


@handles("DepthToSpace", "SpaceToDepth")
def _depth_space(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    b = attrs["blocksize"]
    if x.rank != 4 or UNKNOWN in x.shape[1:]:
        raise cx.fail(f"{node.op_type} needs an NCHW input with known C, H, W")
    n, c, h, w = x.shape
    if node.op_type == "SpaceToDepth":
        y = g.reshape(x, (-1, c, h // b, b, w // b, b))
        y = g.transpose(y, (0, 3, 5, 1, 2, 4))
        return [g.reshape(y, (-1, c * b * b, h // b, w // b))]
    if attrs.get("mode", "DCR") == "DCR":
        y = g.transpose(g.reshape(x, (-1, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = g.transpose(g.reshape(x, (-1, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return [g.reshape(y, (-1, c // (b * b), h * b, w * b))]


@handles("Dropout")
def _dropout(cx, node, args, attrs):
    x = _t(cx, args[0])
    if len(args) > 2 and args[2] is not None and bool(cx.static(args[2], "training_mode").reshape(-1)[0]):
        raise cx.fail("Dropout in training mode is not supported in packages (they run inference)")
    out = [cx.g.identity(x)]
    if len(node.output) > 1:
        out.append(cx.g.broadcast_to(cx.tensor(np.array(True)), x))
    return out





# -- indexing, scans, resampling ---------------------------------------------------------------
@handles("GatherElements")
def _gather_elements(cx, node, args, attrs):
    x, idx = _t(cx, args[0]), _t(cx, args[1])
    axis = cx.axis(attrs.get("axis", 0), _rank(cx, x))
    _known_indices_in_range(cx, x, idx, axis)
    if idx.rank == x.rank and any(i > d and d != UNKNOWN for a, (i, d) in enumerate(zip(idx.shape, x.shape))
                                  if a != axis):
        raise cx.fail(f"indices {idx.type} reach beyond data {x.type} off axis {axis}")
    return [cx.g.gather_along_axis(x, idx, axis)]


@handles("CumSum")
def _cumsum(cx, node, args, attrs):
    axis = int(cx.static(args[1], "CumSum axis").reshape(-1)[0])
    return [cx.g.cumulative_sum(_t(cx, args[0]), axis, bool(attrs.get("exclusive", 0)), bool(attrs.get("reverse", 0)))]


@handles("TopK")
def _topk(cx, node, args, attrs):
    k = int(cx.static(args[1], "TopK k").reshape(-1)[0])
    if not attrs.get("sorted", 1):
        raise cx.fail("TopK with sorted=0 is not supported")
    return list(cx.g.top_k(_t(cx, args[0]), k, attrs.get("axis", -1), bool(attrs.get("largest", 1))))


@handles("Einsum")
def _einsum(cx, node, args, attrs):
    return [cx.g.einsum(attrs["equation"], *[_t(cx, a) for a in args])]


@handles("Resize")
def _resize(cx, node, args, attrs):
    x = _t(cx, args[0])
    rank = _rank(cx, x)
    if attrs.get("antialias", 0):
        raise cx.fail("Resize with antialias is not supported")
    axes = [cx.axis(a, rank) for a in attrs.get("axes", range(rank))]
    args = list(args) + [None] * (4 - len(args))
    roi = cx.static(args[1], "Resize roi").reshape(-1).tolist() if args[1] is not None else []
    scales = [1.0] * rank
    sizes = list(x.shape)
    given_scales = cx.static(args[2], "Resize scales").reshape(-1) if args[2] is not None else np.zeros(0)
    if given_scales.size:
        for a, s in zip(axes, given_scales.tolist()):
            if s != 1.0 and x.shape[a] == UNKNOWN:
                raise cx.fail(f"Resize needs a known extent on the resized axis {a}")
            scales[a], sizes[a] = s, (x.shape[a] if s == 1.0 else int(math.floor(x.shape[a] * s)))
    else:
        wanted = cx.static(args[3], "Resize sizes").reshape(-1).tolist()
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        ratios = [w / x.shape[a] for a, w in zip(axes, wanted)]
        for a, w, r in zip(axes, wanted, ratios):
            if policy != "stretch":
                r = min(ratios) if policy == "not_larger" else max(ratios)
                w = int(math.floor(r * x.shape[a] + 0.5))
            scales[a], sizes[a] = r, int(w)
    if roi and len(roi) == 2 * len(axes) and len(axes) != rank:
        full = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full[a], full[a + rank] = roi[i], roi[i + len(axes)]
        roi = full
    transform = attrs.get("coordinate_transformation_mode", "half_pixel")
    return [cx.g.resize(x, sizes, attrs.get("mode", "nearest"), scales, transform,
                        attrs.get("nearest_mode", "round_prefer_floor"),
                        roi if transform == "tf_crop_and_resize" else None, attrs.get("cubic_coeff_a", -0.75),
                        bool(attrs.get("exclude_outside", 0)), attrs.get("extrapolation_value", 0.0))]

