"""Records of the collective primitives in a single process: a group of one.

With no process group, every collective is what it is in a group of one
(all_reduce, all_gather, reduce_scatter, broadcast and reduce_to_root all give
back their input), so the generic templates check shape rules, dtypes, errors,
gradients, serialisation and the compiled path here; tests/test_distributed.py
checks the values against torch.distributed across gloo processes.
"""
from __future__ import annotations


import stitchml as sm

from .core import FLOATS, NUMERIC, ErrorInput, OpInfo, P, Sample, make


def _identity(x, **kwargs):
    return x.clone()


def _shapes(dtype, rng):
    yield make((3, 4), dtype, rng), "matrix"
    yield make((2, 3, 2), dtype, rng, layout="transposed"), "transposed"
    yield make((5,), dtype, rng), "vector"


def _all_reduce_samples(record, dtype, rng):
    for x, name in _shapes(dtype, rng):
        for reduce in ("sum", "mean", "max", "min") if dtype.is_floating else ("sum", "max", "min"):
            # max / min: the gradient's mask compares the input with the result (equal in a group of one)
            yield Sample((x,), {"reduce": reduce}, name=f"{name}-{reduce}")


def _wait_samples(record, dtype, rng):
    for x, name in _shapes(dtype, rng):
        yield Sample((x,), {"reduce": "sum"}, name=name)
        if dtype.is_floating:
            yield Sample((x,), {"reduce": "mean"}, name=f"{name}-mean")


def _wait_build(g, x, reduce):
    return g.collective_wait(g.all_reduce(x, reduce, asynchronous=True))


def _wait_errors():
    return [ErrorInput((P((2, 3)),), build=lambda g, x: g.collective_wait(x),
                       match="expects the result of all_reduce(..., asynchronous=True)"),
            ErrorInput((P((2, 3)),), error=sm.GraphError, build=lambda g, x: g.negative(
                g.all_reduce(x, asynchronous=True)), match="pass it through collective_wait", op="negative")]


def _gather_samples(record, dtype, rng):
    for x, name in _shapes(dtype, rng):
        yield Sample((x,), {"axis": 0}, name=name)
        yield Sample((x,), {"axis": -1}, name=f"{name}-last")


def _scatter_samples(record, dtype, rng):
    for x, name in _shapes(dtype, rng):
        yield Sample((x,), {"reduce": "sum", "axis": 0}, name=name)
        if dtype.is_floating:
            yield Sample((x,), {"reduce": "mean", "axis": -1}, name=f"{name}-mean")


def _rooted_samples(record, dtype, rng):
    for x, name in _shapes(dtype, rng):
        yield Sample((x,), {"root": 0}, name=name)


def _all_reduce_errors():
    return [ErrorInput((P((2, 3)),), {"reduce": "product"}, match="reduce must be one of"),
            ErrorInput((P((2, 3), sm.int32),), {"reduce": "mean"}, match="needs a floating-point input"),
            ErrorInput((P((2, 3)),), {"group": "nobody"}, match="process group 'nobody' is not registered"),
            ErrorInput((P((2, 3)),), {"group": 3}, match="must be a process group's name"),
            ErrorInput((P((2, 3)),), {"reduce": "max", "asynchronous": True},
                       match="asynchronous all_reduce supports reduce='sum' and 'mean'")]


def _gather_errors():
    return [ErrorInput((P((2, 3)),), {"axis": 2}, match="axis 2 is out of range for rank 2")]


def _scatter_errors():
    return [ErrorInput((P((2, 3)),), {"axis": 5}, match="axis 5 is out of range for rank 2"),
            ErrorInput((P((2, 3)),), {"reduce": "any"}, match="reduce must be one of")]


def _rooted_errors():
    return [ErrorInput((P((2, 3)),), {"root": 1}, match="root must be a rank in [0, 1)"),
            ErrorInput((P((2, 3)),), {"root": -1}, match="root must be a rank in [0, 1)")]


RECORDS = [
    OpInfo("all_reduce", _all_reduce_samples, _identity, NUMERIC, errors=_all_reduce_errors, second_order=True,
           equivalent="torch.distributed.all_reduce / jax.lax.psum, pmax, pmin, pmean"),
    OpInfo("all_gather", _gather_samples, _identity, NUMERIC + (sm.bool,), errors=_gather_errors, second_order=True,
           equivalent="torch.distributed.all_gather_into_tensor / jax.lax.all_gather(tiled=True)"),
    OpInfo("reduce_scatter", _scatter_samples, _identity, NUMERIC, errors=_scatter_errors, second_order=True,
           equivalent="torch.distributed.reduce_scatter_tensor / jax.lax.psum_scatter(tiled=True)"),
    OpInfo("broadcast", _rooted_samples, _identity, NUMERIC + (sm.bool,), errors=_rooted_errors, second_order=True,
           equivalent="torch.distributed.broadcast"),
    OpInfo("collective_wait", _wait_samples, _identity, NUMERIC, build=_wait_build, errors=_wait_errors,
           second_order=True, equivalent="torch.distributed.all_reduce(async_op=True) then work.wait()"),
    OpInfo("reduce_to_root", _rooted_samples, _identity, NUMERIC, errors=_rooted_errors, second_order=True,
           equivalent="torch.distributed.reduce (zeros off the root)"),
]
