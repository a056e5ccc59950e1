"""Records of the elementwise primitives: unary and binary math, comparisons, logic,
select, clamp and cast. References are PyTorch or NumPy in float64."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch

import stitchml as sm

from .core import ALL, FLOATS, NUMERIC, ErrorInput, Fuzz, OpInfo, P, Sample, exact, make, to_bool, to_float
from .samples import chain, elementwise, fixed

SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5, -2.0]
TIES = [-2.0, -1.0, 0.0, 1.0, 2.0]


def _np(fn):
    """A NumPy function as a reference over torch tensors."""
    return lambda *xs, **kw: torch.from_numpy(np.asarray(fn(*(x.detach().numpy() for x in xs), **kw)))


def _float_errors():
    return [ErrorInput((P((3,), sm.int32),), match="expects a floating-point operand")]


def _numeric_errors(arity=1):
    return [ErrorInput((P((3,), sm.bool),) * arity, match="expects a numeric operand, got bool")]


def _broadcast_errors(arity=2):
    """Shapes that never broadcast fail while building; -1 extents that turn out not to, while running."""
    return [
        ErrorInput((P((2, 3)), P((4,)), P(()))[:arity], match="do not broadcast"),
        ErrorInput((P((-1,)), P((-1,)), P(()))[:arity], error=sm.ExecutionError, match="failed on inputs",
                   feeds=(np.ones(2, np.float32), np.ones(3, np.float32), np.float32(1))[:arity]),
    ]


# -- how the compiler fuzzer draws them -----------------------------------------------------
def _smooth(lipschitz, bound, fit=None, guard=None, exact=False, rounded=False):
    """A smooth unary op of the fuzzer: Lipschitz constant and result bound on operands bounded by b."""
    return Fuzz("unary", (fit,), (guard,), lipschitz, bound, exact=exact, rounded=rounded)


_ONE = _smooth(lambda b: 1.0, lambda b: b, exact=True)  # |f(x) - f(y)| <= |x - y|, |f(x)| <= |x|, no rounding
_JUMP = Fuzz("jump")
_DIVISOR = Fuzz("jump", guards=(None, "divisor"))


# -- unary ----------------------------------------------------------------------------
def _unary(name, ref, dtypes, equivalent, domain=(-3.0, 3.0), extra=None, errors=None, **kw):
    return OpInfo(name, elementwise(1, [domain], extra=extra), ref, dtypes, equivalent=equivalent,
                  errors=errors or (lambda: ()), second_order=kw.pop("second_order", True), **kw)


def _float_unary(name, ref, equivalent, domain=(-3.0, 3.0), family="transcendental", **kw):
    """A float-only op, a math-library function unless `family` says otherwise: integer and bool inputs are
    promoted to float32."""
    return _unary(name, ref, ALL, equivalent, domain, out_dtype=to_float, family=family, **kw)


def _rounding(name, ref, equivalent):
    halves = fixed("halves", [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51, 3.75], dtypes=FLOATS)
    return _unary(name, ref, FLOATS, equivalent, extra=halves, errors=_float_errors, fuzz=_JUMP, bit_exact=True)


UNARY = [
    _unary("identity", lambda x: x.clone(), ALL, "np.copy / torch.clone", fuzz=_ONE, bit_exact=True),
    _unary("stop_gradient", lambda x: x.clone(), ALL, "torch.Tensor.detach", bit_exact=True),
    _unary("negative", torch.neg, NUMERIC, "np.negative / torch.neg", errors=_numeric_errors, fuzz=_ONE,
           bit_exact=True),
    _unary("absolute", torch.abs, NUMERIC, "np.abs / torch.abs", errors=_numeric_errors, fuzz=_ONE, bit_exact=True),
    _unary("sign", torch.sign, NUMERIC, "np.sign / torch.sign", errors=_numeric_errors, fuzz=_JUMP, bit_exact=True),
    _unary("square", torch.square, NUMERIC, "np.square / torch.square", errors=_numeric_errors,
           fuzz=_smooth(lambda b: 2 * b, lambda b: b * b, fit=8.0, rounded=True), bit_exact=True),
    _unary("relu", lambda x: torch.where(x > 0, x, torch.zeros_like(x)), NUMERIC, "torch.relu",
           errors=_numeric_errors, fuzz=_ONE, bit_exact=True),
    _float_unary("exponent", torch.exp, "np.exp / torch.exp",
                 fuzz=_smooth(math.exp, math.exp, fit=4.0)),
    _float_unary("exponent_base2", torch.exp2, "np.exp2 / torch.exp2",
                 fuzz=_smooth(lambda b: 2**b, lambda b: 2**b, fit=4.0)),
    _float_unary("exponent_base10", lambda x: 10.0 ** x, "10 ** x",
                 fuzz=_smooth(lambda b: 2.31 * 10**b, lambda b: 10**b, fit=1.0)),
    _float_unary("logarithm", torch.log, "np.log / torch.log", (0.1, 5.0),
                 domains=[(0.05, 4.0)],
                 fuzz=_smooth(lambda b: 2.0, lambda b: max(math.log(b + 0.5), 0.7), guard="half")),
    _float_unary("logarithm_base2", torch.log2, "np.log2 / torch.log2", (0.1, 5.0),
                 domains=[(0.05, 4.0)],
                 fuzz=_smooth(lambda b: 2.9, lambda b: max(math.log2(b + 0.5), 1.0), guard="half")),
    _float_unary("logarithm_base10", torch.log10, "np.log10 / torch.log10", (0.1, 5.0),
                 domains=[(0.05, 4.0)],
                 fuzz=_smooth(lambda b: 0.9, lambda b: max(math.log10(b + 0.5), 0.31), guard="half")),
    _float_unary("square_root", torch.sqrt, "np.sqrt / torch.sqrt", (0.1, 5.0), "elementwise",
                 domains=[(0.0, 4.0)],
                 fuzz=_smooth(lambda b: 1.0, lambda b: math.sqrt(b + 0.25), guard="quarter")),
    _float_unary("reverse_square_root", lambda x: 1.0 / torch.sqrt(x), "torch.rsqrt", (0.1, 5.0),
                 domains=[(0.05, 4.0)], fuzz=_smooth(lambda b: 4.0, lambda b: 2.0, guard="quarter")),
    _float_unary("reciprocal", lambda x: 1.0 / x, "np.reciprocal / torch.reciprocal", (0.25, 3.0),
                 "elementwise", extra=fixed("negative", [-2.5, -1.0, -0.5, -0.25], dtypes=FLOATS, grad=True),
                 nonzero=0, fuzz=_smooth(lambda b: 4.0, lambda b: 2.0, guard="half", rounded=True)),
    _float_unary("sin", torch.sin, "np.sin / torch.sin",
                 fuzz=_smooth(lambda b: 1.0, lambda b: 1.0)),
    _float_unary("cos", torch.cos, "np.cos / torch.cos",
                 fuzz=_smooth(lambda b: 1.0, lambda b: 1.0)),
    _float_unary("tan", torch.tan, "np.tan / torch.tan", (-1.2, 1.2),
                 domains=[(-1.4, 1.4)], fuzz=_smooth(lambda b: 3.5, lambda b: 1.6, guard="tanh")),
    _float_unary("asin", torch.asin, "np.arcsin / torch.asin", (-0.9, 0.9),
                 domains=[(-1.0, 1.0)], fuzz=_smooth(lambda b: 1.6, lambda b: 1.6, guard="tanh34")),
    _float_unary("acos", torch.acos, "np.arccos / torch.acos", (-0.9, 0.9),
                 domains=[(-1.0, 1.0)], fuzz=_smooth(lambda b: 1.6, lambda b: 3.2, guard="tanh34")),
    _float_unary("atan", torch.atan, "np.arctan / torch.atan",
                 fuzz=_smooth(lambda b: 1.0, lambda b: 1.6)),
    _float_unary("sinh", torch.sinh, "np.sinh / torch.sinh",
                 fuzz=_smooth(math.cosh, math.cosh, fit=4.0)),
    _float_unary("cosh", torch.cosh, "np.cosh / torch.cosh",
                 fuzz=_smooth(math.cosh, math.cosh, fit=4.0)),
    _float_unary("tanh", torch.tanh, "np.tanh / torch.tanh",
                 fuzz=_smooth(lambda b: 1.0, lambda b: 1.0)),
    _float_unary("erf", torch.erf, "scipy.special.erf / torch.erf",
                 fuzz=_smooth(lambda b: 1.2, lambda b: 1.0)),
    _float_unary("sigmoid", lambda x: 1.0 / (1.0 + torch.exp(-x)), "torch.sigmoid",
                 fuzz=_smooth(lambda b: 0.25, lambda b: 1.0)),
    _rounding("floor", torch.floor, "np.floor / torch.floor"),
    _rounding("ceil", torch.ceil, "np.ceil / torch.ceil"),
    _rounding("round", _np(np.round), "np.round / torch.round (half to even)"),
    _rounding("truncate", torch.trunc, "np.trunc / torch.trunc"),
]

_specials = fixed("specials", SPECIALS, dtypes=FLOATS)
PREDICATES = [
    _unary("is_nan", _np(np.isnan), ALL, "np.isnan / torch.isnan", extra=_specials, out_dtype=to_bool, fuzz=_JUMP,
           bit_exact=True),
    _unary("is_infinite", _np(np.isinf), ALL, "np.isinf / torch.isinf", extra=_specials, out_dtype=to_bool,
           fuzz=_JUMP, bit_exact=True),
    _unary("is_finite", _np(np.isfinite), ALL, "np.isfinite / torch.isfinite", extra=_specials,
           out_dtype=to_bool, fuzz=_JUMP, bit_exact=True),
    _unary("logical_not", _np(np.logical_not), ALL, "np.logical_not / torch.logical_not", out_dtype=to_bool,
           extra=_specials, fuzz=_JUMP, bit_exact=True),
]


# -- binary -----------------------------------------------------------------------------
def _binary(name, ref, dtypes, equivalent, domains=None, values=None, extra=None, errors=None, grad=True, **kw):
    def all_errors():
        return _broadcast_errors() + list((errors or (lambda: ()))())

    return OpInfo(name, elementwise(2, domains, values, extra=extra, grad=grad), ref, dtypes, equivalent=equivalent,
                  errors=all_errors, second_order=kw.pop("second_order", True), **kw)


def _floor_division(a, b):
    if a.dtype.is_floating_point:
        return torch.floor(a / b)
    return _np(np.floor_divide)(a, b)


def _modulo(a, b):
    if a.dtype.is_floating_point:
        return a - torch.floor(a / b) * b
    return _np(np.mod)(a, b)


def _integer_zero_division():
    return [ErrorInput((P((2,), sm.int32), P((2,), sm.int32)), error=sm.ExecutionError, match="built at",
                       feeds=(np.array([1, 2], np.int32), np.array([1, 0], np.int32)))]


_DIVISORS = [-3.0, -2.0, -1.0, 1.0, 2.0, 3.0]


def _smooth_division(record, dtype, rng):
    """Away from integer quotients (the jumps of floor): the samples for gradient checks."""
    if dtype.is_floating:
        a = make((2, 3), dtype, rng)
        b = make((3,), dtype, rng, 0.5, 3.0) * torch.tensor([1, -1, 1], dtype=dtype.torch)
        yield Sample((a, b), name="smooth")
_ties = fixed("ties", [1.0, 2.0, 3.0, -1.0], [1.0, 0.0, 3.0, -1.0], grad=True)
# Divisors below zero too (the domain is b != 0; the random samples draw b from (0.5, 3)).
_negative_divisors = fixed("negative-divisor", [1.5, -2.0, 0.5], [-0.5, -2.0, -1.5], dtypes=FLOATS, grad=True)
_nans = fixed("nan", [math.nan, 1.0, 2.0, math.nan], [1.0, math.nan, 0.0, math.nan], dtypes=FLOATS)


def _power_extra(record, dtype, rng):
    if dtype.is_floating:
        # 0 ** 0 and 0 ** 1; no finite differences across x = 0 (see test_power_gradient_at_zero_base).
        yield Sample((exact([0.0, 0.0, 2.0], dtype), exact([0.0, 1.0, 0.0], dtype)), name="zero-base", grad=False)


def _power_samples(record, dtype, rng):
    # Integers to negative powers are an error (as in NumPy): integer exponents stay >= 0.
    domains = [(0.5, 2.0), (-2.0, 2.0)] if dtype.is_floating else [(0.0, 3.0), (0.0, 3.0)]
    yield from elementwise(2, domains, extra=_power_extra)(record, dtype, rng)


def _comparison(name, fn, equivalent):
    return _binary(name, fn, ALL, equivalent, values=[TIES, TIES], out_dtype=to_bool, fuzz=_JUMP, bit_exact=True)


def _logical(name, fn, equivalent):
    return _binary(name, _np(lambda a, b: fn(a != 0, b != 0)), ALL, equivalent, values=[TIES, TIES],
                   out_dtype=to_bool, fuzz=_JUMP, bit_exact=True)


def _sum_rule(ba, bb, ea, eb):
    return ba + bb, ea + eb


def _power_rule(ba, bb, ea, eb):
    """Base in [1/2, ba] (its guard), exponent within [-bb, bb]."""
    bound = max(ba**bb, 2.0**bb)
    return bound, bb * max(ba, 2.0) ** (bb + 1) * ea + max(math.log(ba), math.log(2.0)) * bound * eb


_EXTREMUM = Fuzz("binary", exact=True, propagate=lambda ba, bb, ea, eb: (max(ba, bb), max(ea, eb)))

BINARY = [
    _binary("addition", torch.add, ALL, "np.add / torch.add / +",
            fuzz=Fuzz("binary", propagate=_sum_rule, rounded=True), bit_exact=True),
    _binary("subtraction", torch.sub, NUMERIC, "np.subtract / torch.sub / -", errors=lambda: _numeric_errors(2),
            fuzz=Fuzz("binary", propagate=_sum_rule, rounded=True), bit_exact=True),
    _binary("multiplication", torch.mul, ALL, "np.multiply / torch.mul / *",
            fuzz=Fuzz("binary", fit=(8.0, 8.0), propagate=lambda ba, bb, ea, eb: (ba * bb, bb * ea + ba * eb),
                      rounded=True), bit_exact=True),
    _binary("division", lambda a, b: a / b, ALL, "np.true_divide / torch.div / /", domains=[(-3.0, 3.0), (0.5, 3.0)],
            out_dtype=to_float, extra=_negative_divisors, nonzero=1,
            fuzz=Fuzz("binary", guards=(None, "half"), rounded=True,
                      propagate=lambda ba, bb, ea, eb: (2 * ba, 2 * ea + 4 * ba * eb))),
    _binary("floor_division", _floor_division, NUMERIC, "np.floor_divide / //", values=[range(-7, 8), _DIVISORS],
            grad=False, extra=_smooth_division, nonzero=1, fuzz=_DIVISOR,
            errors=lambda: _numeric_errors(2) + _integer_zero_division()),
    _binary("modulo", _modulo, NUMERIC, "np.mod / torch.remainder / %", values=[range(-7, 8), _DIVISORS],
            grad=False, extra=_smooth_division, nonzero=1, fuzz=_DIVISOR,
            errors=lambda: _numeric_errors(2) + _integer_zero_division()),
    OpInfo("power", _power_samples, torch.pow, NUMERIC, equivalent="np.power / torch.pow / **", second_order=True,
           family="transcendental", errors=lambda: _broadcast_errors() + _numeric_errors(2),
           domains=[(0.0, 3.0), (-2.0, 3.0)],
           fuzz=Fuzz("binary", fit=(4.0, 2.0), guards=("half", None), propagate=_power_rule)),
    _binary("maximum", torch.maximum, ALL, "np.maximum / torch.maximum", extra=chain(_ties, _nans),
            fuzz=_EXTREMUM, bit_exact=True),
    _binary("minimum", torch.minimum, ALL, "np.minimum / torch.minimum", extra=chain(_ties, _nans),
            fuzz=_EXTREMUM, bit_exact=True),
    _binary("atan2", torch.atan2, ALL, "np.arctan2 / torch.atan2", domains=[(-3.0, 3.0), (0.5, 3.0)],
            family="transcendental", out_dtype=to_float, extra=_negative_divisors,
            fuzz=Fuzz("binary", guards=(None, "half"), propagate=lambda ba, bb, ea, eb: (math.pi, 2 * ea + 2 * eb))),
    _comparison("equal", torch.eq, "np.equal / torch.eq / =="),
    _comparison("not_equal", torch.ne, "np.not_equal / torch.ne / !="),
    _comparison("less_than", torch.lt, "np.less / torch.lt / <"),
    _comparison("less_than_or_equal_to", torch.le, "np.less_equal / torch.le / <="),
    _comparison("greater_than", torch.gt, "np.greater / torch.gt / >"),
    _comparison("greater_than_or_equal_to", torch.ge, "np.greater_equal / torch.ge / >="),
    _logical("logical_and", np.logical_and, "np.logical_and / torch.logical_and / &"),
    _logical("logical_or", np.logical_or, "np.logical_or / torch.logical_or / |"),
    _logical("logical_xor", np.logical_xor, "np.logical_xor / torch.logical_xor / ^"),
]


# -- select, clamp ------------------------------------------------------------------------
def _select_samples(record, dtype, rng):
    for s in elementwise(3)(record, sm.float64, rng):
        shapes = [tuple(a.shape) for a in s.args]
        more = tuple(tuple(a.shape) for a in s.more[0]) if s.more else None

        def args(sh, layout="contiguous"):
            values = tuple(make(x, dtype, rng, layout=layout) for x in sh[1:])
            return (make(sh[0], sm.bool, rng, layout=layout),) + values

        layout = "transposed" if s.name == "transposed" else "sliced" if s.name == "sliced" else "contiguous"
        yield Sample(args(shapes, layout), name=s.name, more=(args(more),) if more else ())
    yield Sample((make((2, 3), sm.float32, rng, values=[0.0, 1.0, -2.0]), make((2, 3), dtype, rng),
                  make((3,), dtype, rng)), name="numeric-predicate")


def _select_ref(p, a, b):
    return torch.where(p != 0, a, b)


def _clamp_samples(record, dtype, rng):
    yield from elementwise(3, [(-3.0, 3.0), (-2.0, 0.0), (0.0, 2.0)])(record, dtype, rng)
    if dtype.is_floating:
        # lower bound above the upper: the result is the upper bound, and so is the gradient's path.
        yield Sample((make((6,), dtype, rng), make((6,), dtype, rng, 1.0, 2.0), make((6,), dtype, rng, -1.0, 0.0)),
                     name="crossed-bounds")
    yield Sample((make((2, 3), dtype, rng),), {"min_value": 0, "max_value": 2}, name="scalar-bounds")


def _clamp_ref(x, lo=None, hi=None, min_value=None, max_value=None):
    # The documented definition; torch.clamp's gradient fails for broadcast tensor bounds.
    lo = torch.as_tensor(min_value if lo is None else lo, dtype=x.dtype)
    hi = torch.as_tensor(max_value if hi is None else hi, dtype=x.dtype)
    return torch.minimum(torch.maximum(x, lo), hi)


TERNARY = [
    OpInfo("select", _select_samples, _select_ref, ALL, equivalent="np.where / torch.where", second_order=True,
           fuzz=Fuzz("select"), bit_exact=True,
           errors=lambda: [ErrorInput((P((2, 3), sm.bool), P((2, 3)), P((4,))), match="do not broadcast")]),
    OpInfo("clamp", _clamp_samples, _clamp_ref, NUMERIC, equivalent="np.clip / torch.clamp", second_order=True,
           fuzz=Fuzz("clamp"), bit_exact=True,
           build=lambda g, x, *bounds, **kw: g.clamp(x, *bounds, **kw),
           errors=lambda: [ErrorInput((P((3,), sm.bool), P((3,), sm.bool), P((3,), sm.bool)),
                                      match="expects a numeric operand")] + _broadcast_errors(3)),
]


# -- cast ---------------------------------------------------------------------------------
def _cast_samples(record, dtype, rng):
    for target in ALL:
        low = 0.0 if not target.is_signed or not dtype.is_signed else -100.0
        # Finite differences cannot see through rounding to a narrower type: float64 targets only.
        yield Sample((make((2, 3), dtype, rng, low, 100.0),), {"dtype": target}, name=f"to-{target}",
                     grad=target is sm.float64)
    yield Sample((make((3, 4), dtype, rng, 0.0, 100.0, layout="transposed"),), {"dtype": sm.int32},
                 name="transposed")


def _cast_ref(x, dtype):
    if x.dtype.is_floating_point and dtype.is_floating:
        return x.to(dtype.torch)  # rounding to nearest even, as NumPy; differentiable for the gradient checks
    x = x.detach()
    if dtype is sm.bfloat16:
        return torch.from_numpy(x.numpy().astype(ml_dtypes.bfloat16).view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(x.numpy().astype(dtype.numpy))


CAST = OpInfo(
    "cast", _cast_samples, _cast_ref, ALL, equivalent="np.ndarray.astype / torch.Tensor.to",
    out_dtype=lambda dtype, kwargs: kwargs["dtype"], fuzz=Fuzz("cast"),
    errors=lambda: [ErrorInput((P((3,)),), {"dtype": "complex64"}, match="unsupported dtype")],
)

RECORDS = UNARY + PREDICATES + BINARY + TERNARY + [CAST]
