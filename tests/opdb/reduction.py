"""Records of the reductions: sum, mean, maximum, minimum, product, arg max/min,
element_count and sum_to_shape. References are NumPy (integers, bool) or
PyTorch in float64 (floats, so that autograd can check the gradients)."""
from __future__ import annotations

import math

import numpy as np
import torch

import stitchml as sm

from .core import ALL, NUMERIC, ErrorInput, Fuzz, OpInfo, P, Sample, adjoint, exact, make, to_float
from .samples import shaped

_CASES = [
    ("all", [(2, 3, 4)], {"axes": None}),
    ("all-keep", [(2, 3, 4)], {"axes": None, "keep_dims": True}),
    ("first", [(2, 3, 4)], {"axes": 0}),
    ("last-keep", [(2, 3, 4)], {"axes": -1, "keep_dims": True}),
    ("two", [(2, 3, 4)], {"axes": (0, 2)}),
    ("none", [(2, 3)], {"axes": ()}),
    ("scalar", [()], {"axes": None}),
]


def _reduction_samples(low=-3.0, high=3.0, empty_axis=True):
    """Axes None/one/several/none, keep_dims, scalars, layouts, zero-size and run-time sizes."""
    base = shaped(_CASES, (low, high))

    def gen(record, dtype, rng):
        yield from base(record, dtype, rng)
        for layout in ("transposed", "sliced"):
            yield Sample((make((3, 4), dtype, rng, low, high, layout=layout),), {"axes": 0}, name=layout)
        yield Sample((make((0, 3), dtype, rng),), {"axes": 1}, name="zero-size-kept")
        if empty_axis:
            # No gradient check: the mean of nothing is NaN.
            yield Sample((make((0, 3), dtype, rng),), {"axes": 0}, name="zero-size-reduced", grad=False)
        more = [(make((5, 1, 2), dtype, rng, low, high),)] + [(make((1, 0, 3), dtype, rng),)] * empty_axis
        yield Sample((make((2, 3, 4), dtype, rng, low, high),), {"axes": (1,), "keep_dims": True}, name="dynamic",
                     more=tuple(more))

    return gen


def _dims(x, axes):
    if axes is None:
        return tuple(range(x.dim()))
    return (axes,) if isinstance(axes, int) else tuple(axes)


def _torch_or_numpy(torch_fn, numpy_fn):
    """Floats through torch (differentiable), integers and bool through NumPy."""

    def ref(x, axes=None, keep_dims=False):
        dims = _dims(x, axes)
        if x.dtype.is_floating_point:
            return torch_fn(x, dims, keep_dims) if dims else x.clone()
        return torch.from_numpy(np.asarray(numpy_fn(x.numpy(), dims, keep_dims)))

    return ref


def _sum(x, dims, keep):
    return torch.sum(x, dim=dims, keepdim=keep)


def _product(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, dim=d, keepdim=keep)
    return x


def _axis_errors(extra=()):
    return lambda: [
        ErrorInput((P((2, 3)),), {"axes": 5}, match="out of range for rank 2"),
        ErrorInput((P((2, 3)),), {"axes": (0, -2)}, match="name an axis twice"),
        *extra,
    ]


_EMPTY_EXTREMUM = ErrorInput((P((-1, 3)),), {"axes": 0}, error=sm.ExecutionError, match="failed on inputs",
                             feeds=(np.zeros((0, 3), np.float32),), name="empty")


def _extremum_samples(record, dtype, rng):
    yield from _reduction_samples(empty_axis=False)(record, dtype, rng)
    yield Sample((make((3, 4), dtype, rng, values=[-1.0, 0.0, 1.0]),), {"axes": 1}, name="ties", grad=False)
    # Two equal maxima (and minima) per row: they share the gradient evenly.
    yield Sample((exact([1.0, 3.0, 3.0, 0.0, 0.0, 2.0], dtype).reshape(2, 3),), {"axes": 1}, name="two-way-tie")
    if dtype.is_floating:
        yield Sample((exact([1.0, math.nan, 2.0, 0.5], dtype).reshape(2, 2),), {"axes": 1}, name="nan", grad=False)


def _product_samples(record, dtype, rng):
    yield from _reduction_samples(0.5, 1.5)(record, dtype, rng)
    # Zeros: one (the gradient there is the product of the others) and two (all gradients 0).
    yield Sample((exact([2.0, 0.0, 3.0, 0.0, 0.0, 1.5, -1.0, 2.0, 0.5], dtype).reshape(3, 3),), {"axes": 1},
                 name="zeros")


def _arg_samples(record, dtype, rng):
    for name, shape, kwargs in [("last", (2, 3, 4), {}), ("first", (2, 3, 4), {"axis": 0}),
                                ("keep", (3, 4), {"axis": 1, "keep_dims": True}), ("vector", (5,), {"axis": 0})]:
        yield Sample((make(shape, dtype, rng, values=[-2.0, -1.0, 0.0, 1.0, 2.0]),), kwargs, name=name,
                     more=((make(shape[:-1] + (7,), dtype, rng),),))
    yield Sample((make((3, 4), dtype, rng, layout="transposed"),), {"axis": 0}, name="transposed")
    yield Sample((make((0, 3), dtype, rng),), {"axis": 1}, name="zero-size-kept")
    if dtype.is_floating:
        yield Sample((exact([1.0, math.nan, 2.0, 0.5], dtype).reshape(2, 2),), {"axis": 1}, name="nan")


def _arg_ref(fn):
    return lambda x, axis=-1, keep_dims=False: torch.from_numpy(np.asarray(fn(x.numpy(), axis=axis,
                                                                              keepdims=keep_dims)))


def _arg_record(name, fn, equivalent):
    return OpInfo(name, _arg_samples, _arg_ref(fn), ALL, equivalent=equivalent,
                  out_dtype=lambda dtype, kwargs: sm.int64, fuzz=_ARG,
                  errors=lambda: [ErrorInput((P((2, 3)),), {"axis": 2}, match="out of range for rank 2"),
                                  ErrorInput((P((-1, 3)),), {"axis": 0}, error=sm.ExecutionError,
                                             match="failed on inputs", feeds=(np.zeros((0, 3), np.float32),))])


def _count_samples(record, dtype, rng):
    for name, shape, kwargs in [("all", (2, 3, 4), {}), ("two", (2, 3, 4), {"axes": (0, 2)}),
                                ("int", (2, 3), {"axes": -1, "dtype": sm.int32}), ("scalar", (), {}),
                                ("zero-size", (0, 3), {"axes": 1})]:
        yield Sample((make(shape, dtype, rng),), kwargs, name=name, more=((make(shape[:-1] + (5,), dtype, rng),),)
                     if shape else ())


def _count_ref(x, axes=None, dtype=sm.float32):
    n = int(np.prod([x.shape[a] for a in _dims(x, axes)]))
    return torch.tensor(n, dtype=dtype.torch)


def _sum_to_shape_samples(record, dtype, rng):
    for name, shapes, more in [("lead-and-ones", [(2, 3, 4), (3, 1)], [(1, 3, 2), (1, 2)]),
                               ("to-scalar", [(2, 3), ()], [(5, 1), ()]), ("same", [(2, 3), (2, 3)], [(4, 1), (4, 1)]),
                               ("inner-one", [(2, 3), (2, 1)], [(3, 5), (3, 1)]),
                               ("zero-size", [(2, 0, 3), (0, 1)], [(2, 2, 3), (2, 1)])]:
        yield Sample(tuple(make(s, dtype, rng) for s in shapes), name=name,
                     more=(tuple(make(s, dtype, rng) for s in more),))
    yield Sample((make((3, 4), dtype, rng, layout="transposed"), make((1, 4), dtype, rng)), name="transposed")


def _sum_to_shape_ref(x, like):
    # The adjoint of broadcasting `like` to x's shape, by autograd.
    return adjoint(lambda z: torch.broadcast_to(z, x.shape), like, x)


# How the compiler fuzzer carries errors through them: propagate(n elements, bound, error, rounding).
_SUM = Fuzz("reduction", propagate=lambda n, b, e, rnd: (n * b, n * e + rnd(n * b, n)))
_MEAN = Fuzz("reduction", propagate=lambda n, b, e, rnd: (b, e + rnd(b, n + 1)))
_PRODUCT = Fuzz("reduction", propagate=lambda n, b, e, rnd: (b**n, n * b ** (n - 1) * e + rnd(b**n, n)))
_EXTREMUM = Fuzz("reduction", propagate=lambda n, b, e, rnd: (b, e), exact=True)  # picks an element: same bits
_ARG = Fuzz("reduction", propagate=lambda n, b, e, rnd: (n, 0.0), exact=True)  # an index: drawn on exact operands

RECORDS = [
    OpInfo("reduction_sum", _reduction_samples(), _torch_or_numpy(_sum, lambda x, a, k: np.sum(
        x, axis=a, keepdims=k, dtype=np.int64 if x.dtype == np.bool_ else x.dtype)), ALL,
        out_dtype=lambda dtype, kwargs: sm.int64 if dtype.is_bool else dtype, second_order=True,
        errors=_axis_errors(), equivalent="np.sum / torch.sum", fuzz=_SUM),
    OpInfo("reduction_mean", _reduction_samples(), _torch_or_numpy(
        lambda x, d, k: torch.mean(x, dim=d, keepdim=k), None), ALL, out_dtype=to_float, second_order=True,
        errors=_axis_errors(), equivalent="np.mean / torch.mean", fuzz=_MEAN),
    OpInfo("reduction_maximum", _extremum_samples, _torch_or_numpy(
        lambda x, d, k: torch.amax(x, dim=d, keepdim=k), lambda x, a, k: np.max(x, axis=a, keepdims=k)), ALL,
        second_order=True, errors=_axis_errors([_EMPTY_EXTREMUM]), equivalent="np.max / torch.amax",
        fuzz=_EXTREMUM),
    OpInfo("reduction_minimum", _extremum_samples, _torch_or_numpy(
        lambda x, d, k: torch.amin(x, dim=d, keepdim=k), lambda x, a, k: np.min(x, axis=a, keepdims=k)), ALL,
        second_order=True, errors=_axis_errors([_EMPTY_EXTREMUM]), equivalent="np.min / torch.amin",
        fuzz=_EXTREMUM),
    OpInfo("reduction_product", _product_samples, _torch_or_numpy(_product, lambda x, a, k: np.prod(
        x, axis=a, keepdims=k, dtype=np.int64 if x.dtype == np.bool_ else x.dtype)), ALL,
        out_dtype=lambda dtype, kwargs: sm.int64 if dtype.is_bool else dtype, second_order=True,
        errors=_axis_errors(), equivalent="np.prod / torch.prod", fuzz=_PRODUCT),
    _arg_record("reduction_arg_maximum", np.argmax, "np.argmax / torch.argmax"),
    _arg_record("reduction_arg_minimum", np.argmin, "np.argmin / torch.argmin"),
    OpInfo("element_count", _count_samples, _count_ref, ALL, out_dtype=lambda dtype, kwargs: kwargs.get(
        "dtype", sm.float32), errors=_axis_errors(), equivalent="math.prod(x.shape[a] for a in axes)"),
    OpInfo("sum_to_shape", _sum_to_shape_samples, _sum_to_shape_ref, NUMERIC, second_order=True,
           equivalent="the adjoint of np.broadcast_to",
           errors=lambda: [ErrorInput((P((2, 3)), P((4,))), match="cannot be summed"),
                           ErrorInput((P((-1, 3)), P((-1,))), error=sm.ExecutionError, match="failed on inputs",
                                      feeds=(np.ones((2, 3), np.float32), np.ones(4, np.float32)))]),
]
