"""Records of the state and random primitives: placeholder, constant, variable,
read_variable, assign_variable, random_uniform and random_normal.

Random draws have no value reference; their records check the properties a
draw must have (shape, range, rough moments). Reproducibility per (seed,
run) and dropout statistics are tested in test_graph.py.
"""
from __future__ import annotations

import numpy as np
import torch

import stitchml as sm

from .core import ALL, FLOATS, ErrorInput, OpInfo, P, Sample, make
from .samples import elementwise


def _identity(x, **kwargs):
    return x.clone()


# -- placeholder / constant --------------------------------------------------------------------
def _placeholder_errors():
    return [ErrorInput((), build=lambda g: g.placeholder((2, -2)), match="extents >= 0 or -1"),
            ErrorInput((), build=lambda g: g.placeholder((1,) * 17), match="rank <= 16"),
            ErrorInput((), build=lambda g: g.placeholder((2,), "complex64"), match="unsupported dtype"),
            ErrorInput((P((2, 3)),), error=sm.FeedError, match="expected dtype float32, got float64",
                       feeds=(np.ones((2, 3)),)),
            ErrorInput((P((-1, 3)),), error=sm.FeedError, match="expected shape float32[?,3], got (2, 4)",
                       feeds=(np.ones((2, 4), np.float32),)),
            ErrorInput((P((-1, 3)),), error=sm.FeedError, match="(rank 1)", feeds=(np.ones(3, np.float32),))]


def _constant_samples(record, dtype, rng):
    yield Sample((), {"value": make((2, 3), dtype, rng)}, name="tensor")
    yield Sample((), {"value": make((3, 4), dtype, rng, layout="transposed")}, name="transposed")
    yield Sample((), {"value": make((0, 2), dtype, rng)}, name="zero-size")
    yield Sample((), {"value": make((), dtype, rng).numpy() if dtype.numpy is not None else make((), dtype, rng)},
                 name="numpy-scalar")
    yield Sample((), {"value": 1, "dtype": dtype, "shape": (2, 2)}, name="filled")
    yield Sample((), {"value": [[1, 0], [1, 1]], "dtype": dtype}, name="nested-list")


def _constant_ref(value, dtype=None, shape=None):
    t = torch.as_tensor(np.asarray(value)) if not isinstance(value, torch.Tensor) else value
    t = t.to(dtype.torch) if dtype is not None else t
    return t.expand(shape) if shape is not None else t


def _constant_errors():
    return [ErrorInput((), {"value": [1.0, 2.0], "shape": (2, 2)}, match="fills a scalar"),
            ErrorInput((), {"value": "abc"}, match="cannot make TensorData from str"),
            ErrorInput((), {"value": [1, [2]]}, match="constant"),
            ErrorInput((), {"value": 300, "dtype": sm.uint8}, match="out of range for uint8"),
            ErrorInput((), {"value": [-1, 2], "dtype": sm.uint8}, match="out of range for uint8")]


# -- variables ---------------------------------------------------------------------------------------
def _variable_errors(op):
    return lambda: [ErrorInput((P((2,)),), build=lambda g, x: getattr(g, op)(x), match="expected a variable")]


def _assign_build(g, x, *, initial):
    v = g.variable(initial, name="v")
    step = g.assign_variable(v, x)
    with g.control_dependencies([step]):
        return g.read_variable(v)


def _assign_samples(record, dtype, rng):
    for s in elementwise(1)(record, dtype, rng):
        (x,) = s.args
        yield Sample(s.args, {"initial": torch.zeros(x.shape, dtype=x.dtype)}, name=s.name)


def _assign_errors():
    init = {"initial": torch.zeros(3)}
    return [ErrorInput((P((3,), sm.float64),), init, build=_assign_build, match="differs from the variable's float32"),
            ErrorInput((P((4,)),), init, build=_assign_build, match="cannot be assigned to a variable of shape (3,)"),
            ErrorInput((P((-1,)),), init, build=_assign_build, error=sm.ExecutionError,
                       match="the value has shape (2,)",
                       feeds=(np.ones(2, np.float32),)),
            ErrorInput((P((3,)),), build=lambda g, x: g.assign_variable(x, x), match="expected a variable")]


# -- random --------------------------------------------------------------------------------------------
def _random_samples(params):
    def gen(record, dtype, rng):
        yield Sample((), {"shape": (64, 64), "seed": 7, "dtype": dtype, **params}, name="static")
        yield Sample((make((2, 3), dtype, rng),), {"seed": 3, "dtype": dtype, **params}, name="like",
                     more=((make((40, 50), dtype, rng),),))
        yield Sample((), {"shape": (0, 3), "seed": 1, "dtype": dtype}, name="zero-size")

    return gen


def _random_build(op):
    def build(g, *like, shape=None, **kwargs):
        return getattr(g, op)(like[0] if like else shape, **kwargs)

    return build


def _check_uniform(got, *like, shape=None, dtype, minimum=0.0, maximum=1.0, seed=None):
    (value,) = got
    assert tuple(value.shape) == (tuple(like[0].shape) if like else shape)
    v = value.double()
    if v.numel():
        assert minimum <= v.min() and v.max() <= maximum, (v.min(), v.max())
    if v.numel() > 1000:
        assert abs(v.mean() - (minimum + maximum) / 2) < 0.05 * (maximum - minimum)


def _check_normal(got, *like, shape=None, dtype, mean=0.0, standard_deviation=1.0, seed=None):
    (value,) = got
    assert tuple(value.shape) == (tuple(like[0].shape) if like else shape)
    v = value.double()
    assert torch.isfinite(v).all()
    if v.numel() > 1000:
        assert abs(v.mean() - mean) < 0.1 * standard_deviation and abs(v.std() / standard_deviation - 1) < 0.1


def _random_errors():
    return [ErrorInput((), {"shape": (2,), "dtype": sm.int32}, match="floating-point dtype"),
            ErrorInput((), {"shape": (-1, 2)}, match="must be static"),
            ErrorInput((), {"shape": (2,), "dtype": "complex64"}, match="unsupported dtype")]


RECORDS = [
    OpInfo("placeholder", elementwise(1), _identity, ALL, build=lambda g, x: x, errors=_placeholder_errors,
           equivalent="an argument of the function"),
    OpInfo("constant", _constant_samples, _constant_ref, ALL, errors=_constant_errors,
           equivalent="np.asarray / torch.as_tensor"),
    OpInfo("variable", elementwise(1), _identity, ALL, build=lambda g, v: v, inputs="variable",
           errors=lambda: [ErrorInput((), build=lambda g: g.variable("abc"), match="cannot make TensorData")],
           equivalent="torch.nn.Parameter"),
    OpInfo("read_variable", elementwise(1), _identity, ALL, build=lambda g, v: g.read_variable(v), inputs="variable",
           errors=_variable_errors("read_variable"), equivalent="reading a torch.nn.Parameter"),
    OpInfo("assign_variable", _assign_samples, lambda x, initial: x.clone(), ALL, build=_assign_build,
           errors=_assign_errors, equivalent="torch.Tensor.copy_ (applied at the end of the run)"),
    OpInfo("random_uniform", _random_samples({"minimum": -2.0, "maximum": 3.0}), None, FLOATS,
           build=_random_build("random_uniform"), check=_check_uniform, errors=_random_errors,
           out_dtype=lambda dtype, kwargs: kwargs["dtype"], equivalent="torch.rand (seeded per run)"),
    OpInfo("random_normal", _random_samples({"mean": 1.0, "standard_deviation": 2.0}), None, FLOATS,
           build=_random_build("random_normal"), check=_check_normal, errors=_random_errors,
           out_dtype=lambda dtype, kwargs: kwargs["dtype"], equivalent="torch.randn (seeded per run)"),
]
