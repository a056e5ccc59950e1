"""Records of the indexed primitives: gather, scatter_add, their along-axis forms,
one_hot, and the ``x[...]`` builder `index`.

References use NumPy index maps (``np.take``, ``np.take_along_axis``, NumPy
indexing of an ``arange``) applied with torch, and for the scatters the
one-hot form ``out[k] = data[k] + sum_j [idx_j == k] upd_j``.
"""
from __future__ import annotations

import numpy as np
import torch

import stitchml as sm

from .core import INTS, NUMERIC, ErrorInput, Fuzz, OpInfo, P, Sample, make
from .movement import positions, take

_INDEX_DTYPES = (sm.int64, sm.int32, sm.int16, sm.int8, sm.uint8)


def _indices(rng, shape, n, dtype=sm.int64, negative=True):
    """Indices into an axis of extent n, repeats included, negatives (from the end) where the dtype allows."""
    low = -n if negative and dtype.is_signed else 0
    return make(shape, dtype, rng, low, n - 1)


def _wrap(idx: torch.Tensor, n: int) -> np.ndarray:
    i = idx.numpy().astype(np.int64)
    return np.where(i < 0, i + n, i)


# -- gather / scatter_add -------------------------------------------------------------------------
def _gather_samples(record, dtype, rng):
    yield Sample((make((5, 3), dtype, rng), _indices(rng, (4,), 5)), {"axis": 0}, name="rows",
                 more=((make((2, 1), dtype, rng), _indices(rng, (3,), 2)),))
    yield Sample((make((2, 5), dtype, rng, layout="transposed"), _indices(rng, (2, 3), 5, sm.int32)), {"axis": 1},
                 name="matrix-indices")
    yield Sample((make((4,), dtype, rng), _indices(rng, (), 4, sm.int8)), {"axis": -1}, name="scalar-index")
    yield Sample((make((4, 2), dtype, rng), _indices(rng, (0,), 4, sm.uint8)), {"axis": 0}, name="no-indices")
    yield Sample((make((0, 2), dtype, rng), _indices(rng, (3,), 2, sm.int16)), {"axis": 1}, name="zero-size")


def _gather_ref(x, idx, axis):
    return take(x, np.take(positions(x), _wrap(idx, x.shape[axis]), axis=axis))


def _scatter_samples(record, dtype, rng):
    yield Sample((make((5, 3), dtype, rng), _indices(rng, (4,), 5), make((4, 3), dtype, rng)), {"axis": 0},
                 name="rows", more=((make((2, 1), dtype, rng), _indices(rng, (6,), 2), make((6, 1), dtype, rng)),))
    yield Sample((make((2, 5), dtype, rng), _indices(rng, (2, 3), 5, sm.int32), make((2, 2, 3), dtype, rng,
                                                                                   layout="transposed")),
                 {"axis": 1}, name="matrix-indices")
    yield Sample((make((4,), dtype, rng), _indices(rng, (), 4, sm.int8), make((), dtype, rng)), {"axis": 0},
                 name="scalar-index")
    yield Sample((make((0, 2), dtype, rng), _indices(rng, (3,), 2, sm.uint8), make((0, 3), dtype, rng)), {"axis": 1},
                 name="zero-size")


def _one_hot_sum(idx: np.ndarray, n: int, updates: torch.Tensor, axis: int) -> torch.Tensor:
    """sum_j [idx_j == k] updates[..., j, ...]: `updates` (whose axes from `axis` on are idx's) added into n slots."""
    hits = torch.from_numpy((idx.reshape(-1)[:, None] == np.arange(n)[None, :]).astype(np.float64))
    flat = updates.reshape(tuple(updates.shape[:axis]) + (idx.size,) + tuple(updates.shape[axis + idx.ndim:]))
    moved = flat.movedim(axis, -1).to(torch.float64)
    return (moved @ hits).movedim(-1, axis)


def _scatter_add_ref(data, idx, updates, axis):
    added = _one_hot_sum(_wrap(idx, data.shape[axis]), data.shape[axis], updates, axis)
    return (data.to(torch.float64) + added).to(data.dtype)


def _scatter_errors():
    return [ErrorInput((P((5, 3)), P((4,), sm.int64), P((4, 2))), {"axis": 0}, match="updates must have shape"),
            ErrorInput((P((5, 3)), P((4,), sm.int64), P((4, 3), sm.float64)), {"axis": 0},
                       match="updates dtype float64 differs"),
            ErrorInput((P((5, 3)), P((4,)), P((4, 3))), {"axis": 0}, match="indices must be integers"),
            ErrorInput((P((5, 3)), P((4,), sm.int64), P((4, 3))), {"axis": 3}, match="out of range for rank 2"),
            ErrorInput((P((5, 3)), P((1,), sm.int64), P((1, 3))), {"axis": 0}, error=sm.ExecutionError,
                       match="failed on inputs", feeds=(np.ones((5, 3), np.float32), np.array([5]),
                                                        np.ones((1, 3), np.float32)))]


# -- along an axis -----------------------------------------------------------------------------------
def _along_samples(record, dtype, rng):
    scatter = record.name.startswith("scatter")
    for name, shape, idx_shape, axis, idx_dtype in [("last", (3, 4), (3, 2), 1, sm.int64),
                                                    ("first", (3, 4), (5, 4), 0, sm.int32),
                                                    ("vector", (5,), (7,), -1, sm.int8),
                                                    ("zero-size", (0, 3), (0, 2), 1, sm.uint8)]:
        idx = _indices(rng, idx_shape, shape[axis], idx_dtype)
        extra = (make(idx_shape, dtype, rng, layout="transposed"),) if scatter else ()
        yield Sample((make(shape, dtype, rng, layout="sliced"), idx) + extra, {"axis": axis}, name=name)


def _gather_along_ref(x, idx, axis):
    return take(x, np.take_along_axis(positions(x), _wrap(idx, x.shape[axis]), axis=axis))


def _scatter_along_ref(data, idx, updates, axis):
    axis %= data.dim()
    wrapped = _wrap(idx, data.shape[axis])
    hits = torch.from_numpy((np.expand_dims(wrapped, -1) == np.arange(data.shape[axis])).astype(np.float64))
    added = (updates.to(torch.float64).unsqueeze(-1) * hits).sum(dim=axis).movedim(-1, axis)
    return (data.to(torch.float64) + added).to(data.dtype)


def _along_errors(scatter):
    """For the scatter, the same cases with updates shaped like the indices."""
    tail = (P((3, 2)),) if scatter else ()
    feeds_tail = (np.ones((3, 2), np.float32),) if scatter else ()
    return lambda: [ErrorInput((P((3, 4)), P((3,), sm.int64)) + ((P((3,)),) if scatter else ()),
                               {"axis": 1}, match="need the rank of the input"),
                    ErrorInput((P((3, 4)), P((3, 2))) + tail, {"axis": 1}, match="indices must be integers"),
                    ErrorInput((P((3, 4)), P((3, 2), sm.int64)) + tail, {"axis": 1}, error=sm.ExecutionError,
                               match="failed on inputs",
                               feeds=(np.ones((3, 4), np.float32), np.full((3, 2), 4)) + feeds_tail)]


# -- one_hot ---------------------------------------------------------------------------------------
def _one_hot_samples(record, dtype, rng):
    # Indices run from -3 to 3 (where the dtype allows): those outside [0, 3) give rows of off_value.
    yield Sample((make((4,), dtype, rng, -3, 3),), {"depth": 3}, name="vector",
                 more=((make((6,), dtype, rng, -3, 3),),))
    yield Sample((_indices(rng, (2, 3), 4, dtype),), {"depth": 4, "axis": 0, "dtype": sm.int32, "on_value": 5,
                                                     "off_value": -1}, name="axis-0")
    yield Sample((_indices(rng, (), 3, dtype),), {"depth": 3, "dtype": sm.float16}, name="scalar")
    yield Sample((_indices(rng, (0, 2), 3, dtype),), {"depth": 3, "axis": 1}, name="zero-size")
    yield Sample((_indices(rng, (0,), 2, dtype),), {"depth": 0}, name="depth-0")


def _one_hot_ref(idx, depth, axis=-1, dtype=sm.float32, on_value=1.0, off_value=0.0):
    i = idx.numpy().astype(np.int64)
    hot = np.expand_dims(i, -1) == np.arange(depth)
    out = np.where(hot, on_value, off_value)
    return torch.from_numpy(np.moveaxis(out, -1, axis % out.ndim)).to(dtype.torch)


# -- x[...] -------------------------------------------------------------------------------------------
TENSOR = "tensor"  # where a key holds the sample's integer tensor


def _key(key, tensors):
    return tuple(tensors[0] if k is TENSOR else k for k in key)


def _index_samples(record, dtype, rng):
    cases = [("int", (1,)), ("negative-int", (-1, slice(None))), ("slice-int", (slice(1, None), 0)),
             ("ellipsis-step", (Ellipsis, slice(None, None, -2))), ("new-axis", (None, 2, slice(1, 3))),
             ("int-then-new-axis", (0, None)), ("empty-key", ()), ("all", (slice(None), slice(None)))]
    for name, key in cases:
        yield Sample((make((4, 5), dtype, rng, layout="transposed"),), {"key": key}, name=name, unranked=False,
                     dynamic=((4, 5),) if name == "negative-int" else None)
    yield Sample((make((4, 5), dtype, rng), _indices(rng, (2,), 5)), {"key": (slice(None), TENSOR)},
                 name="tensor", unranked=False)
    yield Sample((make((4, 5), dtype, rng), _indices(rng, (3,), 4, sm.int32)), {"key": (TENSOR, 0)},
                 name="tensor-int", unranked=False)
    # Ints and the tensor apart: the tensor's axes come first (NumPy's rule).
    yield Sample((make((2, 3, 4), dtype, rng), _indices(rng, (2,), 4)), {"key": (0, slice(None), TENSOR)},
                 name="int-slice-tensor", unranked=False)
    yield Sample((make((3, 3, 4), dtype, rng), _indices(rng, (2, 2), 3)), {"key": (slice(1, None), None, 2, TENSOR)},
                 name="slice-new-axis-int-tensor", unranked=False)


def _index_ref(x, *tensors, key):
    key = tuple(t.numpy() if isinstance(t, torch.Tensor) else t for t in _key(key, tensors))
    return take(x, positions(x)[key])


def _index_errors():
    return [ErrorInput((P((2, 3)),), {"key": (0, 0, 0)}, match="too many indices"),
            ErrorInput((P((2, 3)),), {"key": (Ellipsis, Ellipsis)}, match="at most one Ellipsis"),
            ErrorInput((P((2, 3)),), {"key": (5,)}, match="out of range for axis 0"),
            ErrorInput((P((-1, 3)),), {"key": (-1,)}, match="negative index -1 on axis 0 of unknown extent"),
            ErrorInput((P((2, 3)),), {"key": (slice(None, None, 0),)}, match="slice step cannot be zero"),
            ErrorInput((P((2, 3)),), {"key": ("a",)}, match="unsupported index"),
            ErrorInput((P(None),), {"key": (0,)}, match="needs a tensor of known rank"),
            ErrorInput((P((2, 3)), P((2,), sm.int64), P((2,), sm.int64)), {"key": (TENSOR, TENSOR)},
                       build=lambda g, x, a, b, key: g.index(x, (a, b)), match="only one tensor index")]


RECORDS = [
    OpInfo("gather", _gather_samples, _gather_ref, NUMERIC + (sm.bool,), equivalent="np.take / torch.index_select",
           fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((5, 3)), P((4,))), {"axis": 0}, match="indices must be integers"),
                           ErrorInput((P((5, 3)), P((4,), sm.int64)), {"axis": 2}, match="out of range for rank 2"),
                           ErrorInput((P((5, 3)), P((1,), sm.int64)), {"axis": 0}, error=sm.ExecutionError,
                                      match="failed on inputs", feeds=(np.ones((5, 3), np.float32), np.array([-6])))]),
    OpInfo("scatter_add", _scatter_samples, _scatter_add_ref, NUMERIC, errors=_scatter_errors,
           equivalent="np.add.at / torch.index_add"),
    OpInfo("gather_along_axis", _along_samples, _gather_along_ref, NUMERIC + (sm.bool,),
           fuzz=Fuzz("move"),
           errors=_along_errors(False), equivalent="np.take_along_axis / torch.gather"),
    OpInfo("scatter_add_along_axis", _along_samples, _scatter_along_ref, NUMERIC, errors=_along_errors(True),
           equivalent="torch.scatter_add"),
    OpInfo("one_hot", _one_hot_samples, _one_hot_ref, INTS, out_dtype=lambda dtype, kwargs: kwargs.get(
        "dtype", sm.float32), equivalent="torch.nn.functional.one_hot",
        errors=lambda: [ErrorInput((P((3,)),), {"depth": 3}, match="indices must be integers"),
                        ErrorInput((P((3,), sm.int64),), {"depth": -1}, match="depth must be >= 0"),
                        ErrorInput((P((3,), sm.int64),), {"depth": 3, "axis": 3}, match="out of range")]),
    OpInfo("index", _index_samples, _index_ref, NUMERIC + (sm.bool,), errors=_index_errors,
           build=lambda g, x, *tensors, key: g.index(x, _key(key, tensors)),
           equivalent="x[key] (NumPy indexing: one integer tensor at most)"),
]
