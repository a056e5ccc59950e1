"""ONNX bit operators on the integer types StitchML has, as integer arithmetic in int64.

Handlers as in onnx_ops.py. The registry has no bit primitives, so:

* ``BitShift``: a right shift is a floor division by 2^b (arithmetic for
  signed types), a left shift a product by 2^b wrapped to the type's width
  (uint64 shifts in uint64, the others in int64);
  shifts below 0 or of the width or more give 0 (-1 for negative values
  shifted right), as ONNX's definition says.
* ``BitwiseAnd``/``Or``/``Xor``/``Not``: the bits of each operand (floor
  division by powers of two, modulo 2: two's complement for negative
  values), combined arithmetically and summed back with their weights, the
  sign bit weighing -2^(width-1) in signed types (and in uint64, which is
  computed as int64 of the same bits).
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .onnx_ops import _t, handles


def _width(cx, x) -> tuple[int, bool]:
    if not x.dtype.is_integer:
        raise cx.fail(f"bit operations need an integer type, got {x.dtype}")
    info = np.iinfo(x.dtype.numpy)
    return info.bits, info.min < 0


def _int64(cx, x):
    return cx.g.cast(x, dtypes.int64) if x.dtype != dtypes.int64 else x


@handles("BitShift")
def _bit_shift(cx, node, args, attrs):
    g = cx.g
    a, b = _t(cx, args[0]), _t(cx, args[1])
    width, signed = _width(cx, a)
    if a.dtype == dtypes.uint64:  # no wider type: shift in uint64 itself, by products and quotients of 2^b
        b64 = _int64(cx, b)
        powers = g.constant(np.array([1 << k for k in range(64)], np.uint64))
        p = g.gather(powers, g.clamp(b64, g.constant(0, dtypes.int64), g.constant(63, dtypes.int64)), 0)
        y = g.floor_division(a, p) if attrs.get("direction") == "RIGHT" else a * p
        if attrs.get("direction") not in ("LEFT", "RIGHT"):
            raise cx.fail(f"direction must be LEFT or RIGHT, got {attrs.get('direction')!r}")
        return [g.select(g.logical_or(b64 < 0, b64 >= 64), g.constant(0, dtypes.uint64), y)]
    a64, b64 = _int64(cx, a), _int64(cx, b)
    powers = g.constant(np.array([1 << k for k in range(min(width, 63))], np.int64))
    p = g.gather(powers, g.clamp(b64, g.constant(0, dtypes.int64), g.constant(min(width, 63) - 1, dtypes.int64)), 0)
    out_of_range = g.logical_or(b64 < 0, b64 >= width)
    zero = g.constant(0, dtypes.int64)
    if attrs.get("direction") == "RIGHT":
        y = g.floor_division(a64, p)
        far = g.select(a64 < 0, g.constant(-1, dtypes.int64), zero) if signed else zero
    elif attrs.get("direction") == "LEFT":
        y = a64 * p  # int64 products wrap in two's complement, which is the 64-bit result
        if width < 64:
            y = g.modulo(y, g.constant(1 << width, dtypes.int64))
            if signed:
                y = g.select(y >= (1 << (width - 1)), y - (1 << width), y)
        far = zero
    else:
        raise cx.fail(f"direction must be LEFT or RIGHT, got {attrs.get('direction')!r}")
    return [g.cast(g.select(out_of_range, far, y), a.dtype)]


def _bits(cx, x64, count: int):
    """Bits 0 .. count-1 of x along a new last axis, as int64 0/1 (two's complement for negative x)."""
    g = cx.g
    powers = g.constant(np.array([1 << k for k in range(count)], np.int64))
    return g.modulo(g.floor_division(g.expand_dims(x64, [-1]), powers), g.constant(2, dtypes.int64))


@handles("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot")
def _bitwise(cx, node, args, attrs):
    g = cx.g
    xs = [_t(cx, a) for a in args]
    width, signed = _width(cx, xs[0])
    signed = signed or width == 64  # uint64 computes as int64: the same bits, and the cast back keeps them
    low = width - 1 if signed else width  # the bits summed with positive weights
    x64 = [_int64(cx, x) for x in xs]
    op = node.op_type
    one = g.constant(1, dtypes.int64)

    def combine(u, v=None):
        if op == "BitwiseAnd":
            return u * v
        if op == "BitwiseOr":
            return u + v - u * v
        if op == "BitwiseXor":
            return g.modulo(u + v, g.constant(2, dtypes.int64))
        return one - u

    bits = [_bits(cx, x, low) for x in x64]
    weights = g.constant(np.array([1 << k for k in range(low)], np.int64))
    y = g.reduction_sum(combine(*bits) * weights, [-1])
    if signed:
        signs = [g.cast(x < 0, dtypes.int64) for x in x64]
        y = y + combine(*signs) * g.constant(int(np.iinfo(np.int64).min) if width == 64 else -(1 << (width - 1)),
                                             dtypes.int64)
    return [g.cast(y, xs[0].dtype)]
