"""Elementwise primitives: unary, binary and ternary math, comparisons, logic, cast.

Every op broadcasts its operands NumPy style and computes in one dtype: the
builder promotes operands first (dtypes.py), inserting `cast` ops. `{0}`,
`{1}`, `{2}` in a Triton expression stand for the operands, already loaded
(half types upcast to float32); `libdevice.` names CUDA's math library.

Gradient rules return the cotangent of each input in the broadcast output
shape; autodiff sums it back to the input's shape.
"""
from __future__ import annotations

import math

import torch

from .. import dtypes
from ..ir import TensorType, broadcast_shapes
from ..errors import ShapeError
from ..registry import ELEMENTWISE, Primitive, builder, register


def _infer(out: str | None):
    def infer(types, **attrs):
        first = types[0].dtype
        for t in types[1:]:
            if t.dtype != first:
                raise ShapeError(f"operand dtypes differ: {', '.join(str(t.dtype) for t in types)}")
        shape = broadcast_shapes(*(t.shape for t in types))
        return TensorType(shape, dtypes.bool_ if out == "bool" else first)

    return infer


def _check_dtype(g, name, x, allow):
    if allow == "float" and not x.dtype.is_floating:
        raise g._error(name, f"expects a floating-point operand, got {x.dtype}", [x])
    if allow == "signed" and not x.dtype.is_signed:
        raise g._error(name, f"is undefined for {x.dtype}", [x])
    if allow == "numeric" and x.dtype.is_bool:
        raise g._error(name, "expects a numeric operand, got bool", [x])


def unary(name, impl, triton, *, float_only=False, out=None, to_bool=False, allow=None, differentiable=True, doc=""):
    """Define a unary elementwise primitive and its builder `g.<name>(x)`."""
    prim = register(
        Primitive(name, ELEMENTWISE, infer=_infer(out), impl=impl, triton=triton, float_only=float_only,
                  differentiable=differentiable, doc=doc)
    )

    def build(g, x, name=None):
        x = g.as_tensor(x)
        if to_bool and not x.dtype.is_bool:
            x = g.cast(x, dtypes.bool_)
        if float_only and not x.dtype.is_floating:
            x = g.cast(x, dtypes.default_float)
        _check_dtype(g, prim.name, x, allow)
        return g._emit1(prim.name, [x], None, name)

    build.__name__ = name
    build.__doc__ = doc or f"Elementwise {name}(x)."
    builder(name)(build)
    return prim


def binary(name, impl, triton, *, float_only=False, out=None, to_bool=False, allow=None, differentiable=True, doc=""):
    """Define a binary elementwise primitive and its builder `g.<name>(a, b)`."""
    prim = register(
        Primitive(name, ELEMENTWISE, infer=_infer(out), impl=impl, triton=triton, float_only=float_only,
                  differentiable=differentiable, doc=doc)
    )

    def build(g, primary, secondary, name=None):
        a, b = g.promote(primary, secondary, name=prim.name)
        if to_bool and not a.dtype.is_bool:
            a, b = g.cast(a, dtypes.bool_), g.cast(b, dtypes.bool_)
        if float_only and not a.dtype.is_floating:
            a, b = g.cast(a, dtypes.default_float), g.cast(b, dtypes.default_float)
        _check_dtype(g, prim.name, a, allow)
        return g._emit1(prim.name, [a, b], None, name)

    build.__name__ = name
    build.__doc__ = doc or f"Elementwise {name}(primary, secondary), NumPy broadcasting."
    builder(name)(build)
    return prim


def _zeros_like_vjp(g, op, dy):
    return [None for _ in op.inputs]


# -- unary math ---------------------------------------------------------------
identity = unary("identity", lambda x: x, "{0}", doc="The input, as a new tensor.")
identity.def_vjp(lambda g, op, dy: [dy])

stop_gradient = unary("stop_gradient", lambda x: x, "{0}", differentiable=False,
                      doc="The input unchanged; no gradient flows back through it.")

negative = unary("negative", torch.neg, "-{0}", allow="numeric", doc="-x.")
negative.def_vjp(lambda g, op, dy: [-dy])

absolute = unary("absolute", torch.abs, "tl.abs({0})", allow="numeric", doc="|x|.")
absolute.def_vjp(lambda g, op, dy: [dy * g.sign(op.inputs[0])])

# Float operands choose between float constants: no integer intermediate to convert back (and NaN gives 0, as torch).
sign = unary("sign", torch.sign, {"float": "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))",
                                  "int": "tl.where({0} > 0, 1, tl.where({0} < 0, -1, 0))"}, allow="numeric",
             doc="-1, 0 or 1: the sign of x (0 for 0).")
sign.def_vjp(_zeros_like_vjp)

exponent = unary("exponent", torch.exp, "tl.exp({0})", float_only=True, doc="e ** x.")
exponent.def_vjp(lambda g, op, dy: [dy * op.outputs[0]])

exponent_base2 = unary("exponent_base2", torch.exp2, "tl.exp2({0})", float_only=True, doc="2 ** x.")
exponent_base2.def_vjp(lambda g, op, dy: [dy * op.outputs[0] * math.log(2.0)])

exponent_base10 = unary("exponent_base10", lambda x: torch.pow(10.0, x).to(x.dtype),
                        "tl.exp2({0} * 3.321928094887362)", float_only=True, doc="10 ** x.")
exponent_base10.def_vjp(lambda g, op, dy: [dy * op.outputs[0] * math.log(10.0)])

logarithm = unary("logarithm", torch.log, "tl.log({0})", float_only=True,
                  doc="The natural logarithm of x.")
logarithm.def_vjp(lambda g, op, dy: [dy / op.inputs[0]])

logarithm_base2 = unary("logarithm_base2", torch.log2, "tl.log2({0})", float_only=True,
                        doc="The base-2 logarithm of x.")
logarithm_base2.def_vjp(lambda g, op, dy: [dy / (op.inputs[0] * math.log(2.0))])

logarithm_base10 = unary("logarithm_base10", torch.log10, "tl.log({0}) * 0.4342944819032518", float_only=True,
                         doc="The base-10 logarithm of x.")
logarithm_base10.def_vjp(lambda g, op, dy: [dy / (op.inputs[0] * math.log(10.0))])

square = unary("square", torch.square, "{0} * {0}", allow="numeric", doc="x * x.")
square.def_vjp(lambda g, op, dy: [dy * 2.0 * op.inputs[0]])

# tl.sqrt_rn is float32 only; tl.sqrt is correctly rounded in float64.
square_root = unary("square_root", torch.sqrt, {"float": "tl.sqrt_rn({0})", "float64": "tl.sqrt({0})"},
                    float_only=True, doc="The square root of x.")
square_root.def_vjp(lambda g, op, dy: [dy * 0.5 / op.outputs[0]])

reverse_square_root = unary("reverse_square_root", torch.rsqrt, "tl.rsqrt({0})", float_only=True,
                            doc="1 / sqrt(x).")
reverse_square_root.def_vjp(lambda g, op, dy: [dy * -0.5 * op.outputs[0] / op.inputs[0]])

reciprocal = unary("reciprocal", torch.reciprocal, "1.0 / {0}", float_only=True, doc="1 / x.")
reciprocal.def_vjp(lambda g, op, dy: [-dy * op.outputs[0] * op.outputs[0]])

sin = unary("sin", torch.sin, "tl.sin({0})", float_only=True, doc="Sine of x (radians).")
sin.def_vjp(lambda g, op, dy: [dy * g.cos(op.inputs[0])])

cos = unary("cos", torch.cos, "tl.cos({0})", float_only=True, doc="Cosine of x (radians).")
cos.def_vjp(lambda g, op, dy: [-dy * g.sin(op.inputs[0])])

tan = unary("tan", torch.tan, "libdevice.tan({0})", float_only=True, doc="Tangent of x (radians).")
tan.def_vjp(lambda g, op, dy: [dy * (1.0 + op.outputs[0] * op.outputs[0])])

asin = unary("asin", torch.asin, "libdevice.asin({0})", float_only=True,
             doc="Inverse sine, in [-pi/2, pi/2].")
asin.def_vjp(lambda g, op, dy: [dy * g.reverse_square_root(1.0 - op.inputs[0] * op.inputs[0])])

acos = unary("acos", torch.acos, "libdevice.acos({0})", float_only=True, doc="Inverse cosine, in [0, pi].")
acos.def_vjp(lambda g, op, dy: [-dy * g.reverse_square_root(1.0 - op.inputs[0] * op.inputs[0])])

atan = unary("atan", torch.atan, "libdevice.atan({0})", float_only=True,
             doc="Inverse tangent, in (-pi/2, pi/2).")
atan.def_vjp(lambda g, op, dy: [dy / (1.0 + op.inputs[0] * op.inputs[0])])

sinh = unary("sinh", torch.sinh, "libdevice.sinh({0})", float_only=True, doc="Hyperbolic sine.")
sinh.def_vjp(lambda g, op, dy: [dy * g.cosh(op.inputs[0])])

cosh = unary("cosh", torch.cosh, "libdevice.cosh({0})", float_only=True, doc="Hyperbolic cosine.")
cosh.def_vjp(lambda g, op, dy: [dy * g.sinh(op.inputs[0])])

tanh = unary("tanh", torch.tanh, "libdevice.tanh({0})", float_only=True, doc="Hyperbolic tangent.")
tanh.def_vjp(lambda g, op, dy: [dy * (1.0 - op.outputs[0] * op.outputs[0])])

erf = unary("erf", torch.erf, "tl.erf({0})", float_only=True, doc="The error function.")
erf.def_vjp(lambda g, op, dy: [dy * (2.0 / math.sqrt(math.pi)) * g.exponent(-op.inputs[0] * op.inputs[0])])

sigmoid = unary("sigmoid", torch.sigmoid, "tl.sigmoid({0})", float_only=True, doc="1 / (1 + exp(-x)).")
sigmoid.def_vjp(lambda g, op, dy: [dy * op.outputs[0] * (1.0 - op.outputs[0])])

relu = unary("relu", torch.relu, "tl.maximum({0}, 0, tl.PropagateNan.ALL)", allow="numeric", doc="max(x, 0).")
relu.def_vjp(lambda g, op, dy: [g.select(op.inputs[0] > 0, dy, 0.0)])

floor = unary("floor", torch.floor, "tl.floor({0})", allow="float", doc="The largest integer <= x.")
floor.def_vjp(_zeros_like_vjp)

ceil = unary("ceil", torch.ceil, "tl.ceil({0})", allow="float", doc="The smallest integer >= x.")
ceil.def_vjp(_zeros_like_vjp)

round = unary("round", torch.round, "libdevice.rint({0})", allow="float",
              doc="Round half to even, like NumPy and PyTorch.")
round.def_vjp(_zeros_like_vjp)

truncate = unary("truncate", torch.trunc, "libdevice.trunc({0})", allow="float",
                 doc="x rounded toward zero.")
truncate.def_vjp(_zeros_like_vjp)

is_nan = unary("is_nan", torch.isnan, "{0} != {0}", out="bool", differentiable=False,
               doc="True where x is NaN.")
# libdevice.isinf takes floats only; integers and bools are never infinite.
is_infinite = unary("is_infinite", torch.isinf, {"float": "libdevice.isinf({0}) != 0", "int": "{0} != {0}"},
                    out="bool", differentiable=False, doc="True where x is +inf or -inf.")
is_finite = unary("is_finite", torch.isfinite, {"float": "({0} == {0}) & (libdevice.isinf({0}) == 0)",
                                                "int": "{0} == {0}"},
                  out="bool", differentiable=False, doc="True where x is neither NaN nor infinite.")
logical_not = unary("logical_not", torch.logical_not, "{0} == 0", to_bool=True, differentiable=False,
                    doc="True where x is zero (false).")

# -- binary math ----------------------------------------------------------------
# On bool, torch.add is a logical or; Triton adds int1 modulo 2.
addition = binary("addition", torch.add, {"bool": "{0} | {1}", "int": "{0} + {1}", "float": "{0} + {1}"},
                  doc="a + b (for bool: or).")
addition.def_vjp(lambda g, op, dy: [dy, dy])

subtraction = binary("subtraction", torch.sub, "{0} - {1}", allow="numeric", doc="a - b.")
subtraction.def_vjp(lambda g, op, dy: [dy, -dy])

multiplication = binary("multiplication", torch.mul, "{0} * {1}", doc="a * b (for bool: and).")
multiplication.def_vjp(lambda g, op, dy: [dy * op.inputs[1], dy * op.inputs[0]])

division = binary("division", torch.div, "{0} / {1}", float_only=True,
                  doc="True division; integer operands are promoted to float32 first.")
division.def_vjp(lambda g, op, dy: [dy / op.inputs[1], -dy * op.outputs[0] / op.inputs[1]])

# Integers divide exactly: Triton's // and % truncate toward zero (C), corrected to round toward minus
# infinity where the remainder is nonzero and its sign differs from the divisor's (Python, torch).
_FLOOR_FIX = "((({0} % {1}) != 0) & ((({0} % {1}) < 0) != ({1} < 0)))"


def _nonzero_divisor(fn):
    """`fn` on integers refuses a zero divisor on every device: torch raises on the CPU (for free), a GPU
    would give garbage, so there the divisor is checked first; compiled kernels flag it the same way
    (codegen/common.py, DIVISIONS)."""
    def checked(a, b):
        if b.is_floating_point():
            return fn(a, b)
        if b.device.type == "cpu":
            try:
                return fn(a, b)
            except RuntimeError as e:
                if "ZeroDivisionError" not in str(e):
                    raise
        elif not bool((b == 0).any()):
            return fn(a, b)
        raise ZeroDivisionError("integer division by zero")
    return checked


floor_division = binary("floor_division", _nonzero_divisor(lambda a, b: torch.div(a, b, rounding_mode="floor")),
                        {"float": "tl.floor({0} / {1})", "int": "{0} // {1} - " + _FLOOR_FIX},
                        allow="numeric", doc="floor(a / b), Python's //.")
floor_division.def_vjp(_zeros_like_vjp)

modulo = binary("modulo", _nonzero_divisor(torch.remainder),
                {"float": "{0} - tl.floor({0} / {1}) * {1}", "int": "{0} % {1} + {1} * " + _FLOOR_FIX}, allow="numeric",
                doc="a - floor(a / b) * b: the result takes the sign of b, like Python's %.")
modulo.def_vjp(lambda g, op, dy: [dy, -dy * g.floor_division(op.inputs[0], op.inputs[1])])

# libdevice has no integer pow (and NumPy's refuses negative exponents): integer powers run alone.
power = binary("power", torch.pow, {"float": "libdevice.pow({0}, {1})", "int": None}, allow="numeric",
               doc="a ** b; an integer base needs a non-negative exponent.")


@power.def_vjp
def _power_vjp(g, op, dy):
    x, y = op.inputs
    # y x**(y-1), taken as 0 where y == 0 (as PyTorch): 0 * 0**-1 would be NaN at x == 0.
    dx = g.select(g.equal(y, 0.0), 0.0, dy * y * g.power(x, y - 1.0))
    # d/dy x**y = x**y log x, taken as 0 where x == 0 (the limit for y > 0).
    safe_log = g.logarithm(g.select(g.equal(x, 0.0), 1.0, x))
    return [dx, dy * op.outputs[0] * safe_log]


maximum = binary("maximum", torch.maximum, "tl.maximum({0}, {1}, tl.PropagateNan.ALL)",
                 doc="Elementwise maximum; NaN if either operand is NaN.")


def _extremum_vjp(wins):
    """The operand that `wins` (strictly) gets dy; ties share it evenly, as in PyTorch."""

    def vjp(g, op, dy):
        a, b = op.inputs
        tie = g.equal(a, b)
        half = dy * 0.5
        return [g.select(tie, half, g.select(wins(a, b), dy, 0.0)), g.select(tie, half, g.select(wins(b, a), dy, 0.0))]

    return vjp


maximum.def_vjp(_extremum_vjp(lambda a, b: a > b))

minimum = binary("minimum", torch.minimum, "tl.minimum({0}, {1}, tl.PropagateNan.ALL)",
                 doc="Elementwise minimum; NaN if either operand is NaN.")
minimum.def_vjp(_extremum_vjp(lambda a, b: a < b))

atan2 = binary("atan2", torch.atan2, "libdevice.atan2({0}, {1})", float_only=True,
               doc="atan2(primary, secondary): the angle of the point (secondary, primary).")


@atan2.def_vjp
def _atan2_vjp(g, op, dy):
    y, x = op.inputs
    r2 = x * x + y * y
    return [dy * x / r2, -dy * y / r2]


for _name, _fn, _expr in (
    ("equal", torch.eq, "{0} == {1}"),
    ("not_equal", torch.ne, "{0} != {1}"),
    ("less_than", torch.lt, "{0} < {1}"),
    ("less_than_or_equal_to", torch.le, "{0} <= {1}"),
    ("greater_than", torch.gt, "{0} > {1}"),
    ("greater_than_or_equal_to", torch.ge, "{0} >= {1}"),
):
    binary(_name, _fn, _expr, out="bool", differentiable=False, doc=_expr.format("a", "b") + ", as bool.")

logical_and = binary("logical_and", torch.logical_and, "{0} & {1}", to_bool=True, differentiable=False,
                     doc="a and b; nonzero operands are true.")
logical_or = binary("logical_or", torch.logical_or, "{0} | {1}", to_bool=True, differentiable=False,
                    doc="a or b; nonzero operands are true.")
logical_xor = binary("logical_xor", torch.logical_xor, "{0} ^ {1}", to_bool=True, differentiable=False,
                     doc="a xor b; nonzero operands are true.")

# -- ternary ------------------------------------------------------------------
select = register(Primitive(
    "select", ELEMENTWISE, impl=torch.where, triton="tl.where({0}, {1}, {2})",
    doc="select(predicate, true_value, false_value), broadcasting all three.",
))


@select.def_infer
def _select_infer(types, **attrs):
    p, a, b = types
    if not p.dtype.is_bool:
        raise ShapeError(f"predicate must be bool, got {p.dtype}")
    if a.dtype != b.dtype:
        raise ShapeError(f"value dtypes differ: {a.dtype} and {b.dtype}")
    return TensorType(broadcast_shapes(p.shape, a.shape, b.shape), a.dtype)


@builder("select")
def _select(g, predicate, true_value, false_value, name=None):
    """Where `predicate` is true take `true_value`, else `false_value` (MPSGraph select)."""
    p = g.as_tensor(predicate)
    if not p.dtype.is_bool:
        p = g.not_equal(p, 0)
    a, b = g.promote(true_value, false_value, name="select")
    return g._emit1("select", [p, a, b], None, name)


@select.def_vjp
def _select_vjp(g, op, dy):
    p = op.inputs[0]
    return [None, g.select(p, dy, 0.0), g.select(p, 0.0, dy)]


clamp = register(Primitive(
    "clamp", ELEMENTWISE, infer=_infer(None), impl=lambda x, lo, hi: torch.minimum(torch.maximum(x, lo), hi),
    triton="tl.minimum(tl.maximum({0}, {1}, tl.PropagateNan.ALL), {2}, tl.PropagateNan.ALL)",
    doc="clamp(x, min_value, max_value) = minimum(maximum(x, min_value), max_value).",
))


@builder("clamp")
def _clamp(g, x, min_value, max_value, name=None):
    """Limit `x` to [min_value, max_value]."""
    x, lo, hi = g.promote(x, min_value, max_value, name="clamp")
    _check_dtype(g, "clamp", x, "numeric")
    return g._emit1("clamp", [x, lo, hi], None, name)


@clamp.def_vjp
def _clamp_vjp(g, op, dy):
    x, lo, hi = op.inputs
    # Whichever of x, lo, hi the result is gets dy; with crossed bounds (lo > hi) that is hi.
    inside = g.logical_and(x >= lo, x <= hi)
    return [g.select(inside, dy, 0.0), g.select(g.logical_and(x < lo, lo <= hi), dy, 0.0),
            g.select(g.logical_or(x > hi, hi < lo), dy, 0.0)]


# -- cast -----------------------------------------------------------------------
cast = register(Primitive(
    "cast", ELEMENTWISE, impl=lambda x, dtype: x.to(dtypes.as_dtype(dtype).torch), triton="{0}",
    doc="Convert to `dtype`. Float to integer truncates toward zero; nonzero to bool is True.",
))


@cast.def_infer
def _cast_infer(types, dtype):
    return TensorType(types[0].shape, dtypes.as_dtype(dtype))


@builder("cast")
def _cast(g, x, dtype, name=None):
    """`x` converted to `dtype` (a stitchml dtype, its name, or a torch/NumPy dtype)."""
    x = g.as_tensor(x)
    try:
        dt = dtypes.as_dtype(dtype)
    except TypeError as e:
        raise g._error("cast", str(e), [x]) from None
    return g._emit1("cast", [x], {"dtype": dt}, name)


@cast.def_vjp
def _cast_vjp(g, op, dy):
    x = op.inputs[0]
    return [g.cast(dy, x.dtype) if x.dtype.is_floating else None]


__all__ = [n for n, v in dict(globals()).items() if isinstance(v, Primitive)]
