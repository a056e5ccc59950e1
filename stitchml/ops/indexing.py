"""Indexing primitives: gather and scatter (by index and along an axis), one_hot,
and `index`, the builder behind ``x[...]``.
"""
from __future__ import annotations

import builtins

import torch

from .. import dtypes
from ..errors import ShapeError
from ..ir import UNKNOWN, Tensor, TensorType, normalize_axis
from ..registry import OPAQUE, builder
from .movement import _prim
from .reduction import in_float32


# -- gather / scatter ---------------------------------------------------------------
def _check_indices(t: TensorType):
    if not t.dtype.is_integer:
        raise ShapeError(f"indices must be integers, got {t.dtype}")


def _wrap(idx: torch.Tensor, n: int) -> torch.Tensor:
    idx = idx.long()
    return torch.where(idx < 0, idx + n, idx)


gather = _prim("gather", "Take slices along `axis` at `indices` (NumPy take); negative indices count from the end.")


@gather.def_infer
def _gather_infer(types, axis):
    x, idx = types
    _check_indices(idx)
    if x.shape is None or idx.shape is None:
        return TensorType(None, x.dtype)
    ax = normalize_axis(axis, x.rank)
    return TensorType(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype)


@gather.def_impl
def _gather_impl(x, indices, axis):
    axis %= x.dim()  # a negative axis stays in the IR when the rank was unknown while building
    flat = _wrap(indices.reshape(-1), x.shape[axis])
    out = x.index_select(axis, flat)
    return out.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])


@gather.def_vjp
def _gather_vjp(g, op, dy):
    x, idx = op.inputs
    zeros = g.broadcast_to(g.constant(0, dy.dtype), x)
    return [g.scatter_add(zeros, idx, dy, op.attrs["axis"]), None]


def _along_axis(g, op: str, tensors: list, axis: int, name):
    """Emit a gather or scatter along `axis`, checked against the first tensor's rank when it is known."""
    if tensors[0].rank is not None:
        axis = g._checked(op, tensors, normalize_axis, axis, tensors[0].rank)
    return g._emit1(op, tensors, {"axis": int(axis)}, name)


@builder("gather")
def _gather(g, x, indices, axis=0, name=None):
    """``x.take(indices, axis)``: out shape = x[:axis] + indices + x[axis+1:]."""
    return _along_axis(g, "gather", [g.as_tensor(x), g.as_tensor(indices)], axis, name)


scatter_add = _prim("scatter_add", "The adjoint of gather: add `updates` into `data` at `indices` along `axis`.")


@scatter_add.def_infer
def _scatter_add_infer(types, axis):
    data, idx, upd = types
    _check_indices(idx)
    if upd.dtype != data.dtype:
        raise ShapeError(f"updates dtype {upd.dtype} differs from data dtype {data.dtype}")
    if data.shape is not None and idx.shape is not None and upd.shape is not None:
        ax = normalize_axis(axis, data.rank)
        want = data.shape[:ax] + idx.shape + data.shape[ax + 1:]
        if len(want) != len(upd.shape) or any(a != b and UNKNOWN not in (a, b) for a, b in zip(want, upd.shape)):
            raise ShapeError(f"updates must have shape {want}, got {upd.shape}")
    return data


@scatter_add.def_impl
@in_float32
def _scatter_add_impl(data, indices, updates, axis):
    axis %= data.dim()
    flat = _wrap(indices.reshape(-1), data.shape[axis])
    upd = updates.reshape(data.shape[:axis] + (flat.numel(),) + data.shape[axis + 1:])
    return data.index_add(axis, flat, upd)


@scatter_add.def_vjp
def _scatter_add_vjp(g, op, dy):
    return [dy, None, g.gather(dy, op.inputs[1], op.attrs["axis"])]


@builder("scatter_add")
def _scatter_add(g, data, indices, updates, axis=0, name=None):
    """``out = data; out[..., indices[j], ...] += updates[..., j, ...]`` along `axis`."""
    data = g.as_tensor(data)
    return _along_axis(g, "scatter_add", [data, g.as_tensor(indices), g.as_tensor(updates, data.dtype)], axis, name)


gather_along_axis = _prim("gather_along_axis", "out[i][j] = x[i][indices[i][j]] along `axis` (torch.gather).")


@gather_along_axis.def_infer
def _gather_along_axis_infer(types, axis):
    x, idx = types
    _check_indices(idx)
    if x.rank is not None and idx.rank is not None and x.rank != idx.rank:
        raise ShapeError(f"indices need the rank of the input ({x.rank}), got {idx.rank}")
    return TensorType(idx.shape, x.dtype)


gather_along_axis.def_impl(lambda x, indices, axis: torch.gather(x, axis, _wrap(indices, x.shape[axis])))


@gather_along_axis.def_vjp
def _gather_along_axis_vjp(g, op, dy):
    x, idx = op.inputs
    zeros = g.broadcast_to(g.constant(0, dy.dtype), x)
    return [g.scatter_add_along_axis(zeros, idx, dy, op.attrs["axis"]), None]


@builder("gather_along_axis")
def _gather_along_axis(g, x, indices, axis, name=None):
    """Pick one element per index along `axis` (MPSGraph gatherAlongAxis)."""
    return _along_axis(g, "gather_along_axis", [g.as_tensor(x), g.as_tensor(indices)], axis, name)


scatter_add_along_axis = _prim("scatter_add_along_axis", "The adjoint of gather_along_axis (torch.scatter_add).")


@scatter_add_along_axis.def_infer
def _scatter_add_along_axis_infer(types, axis):
    data, idx, upd = types
    _check_indices(idx)
    if upd.dtype != data.dtype:
        raise ShapeError(f"updates dtype {upd.dtype} differs from data dtype {data.dtype}")
    if data.rank is not None and idx.rank is not None and data.rank != idx.rank:
        raise ShapeError(f"indices need the rank of the input ({data.rank}), got {idx.rank}")
    if idx.shape is not None and upd.shape is not None and (
            len(idx.shape) != len(upd.shape) or any(a != b and UNKNOWN not in (a, b) for a, b in zip(idx.shape, upd.shape))):
        raise ShapeError(f"updates must have the indices' shape {idx.shape}, got {upd.shape}")
    return data


scatter_add_along_axis.def_impl(in_float32(
    lambda data, indices, updates, axis: data.scatter_add(axis, _wrap(indices, data.shape[axis]), updates)))


@scatter_add_along_axis.def_vjp
def _scatter_add_along_axis_vjp(g, op, dy):
    return [dy, None, g.gather_along_axis(dy, op.inputs[1], op.attrs["axis"])]


@builder("scatter_add_along_axis")
def _scatter_add_along_axis(g, data, indices, updates, axis, name=None):
    """``out = data; out[i][indices[i][j]] += updates[i][j]`` along `axis`."""
    data = g.as_tensor(data)
    return _along_axis(g, "scatter_add_along_axis", [data, g.as_tensor(indices), g.as_tensor(updates, data.dtype)],
                       axis, name)


one_hot = _prim("one_hot", "on_value where the position along `axis` equals the index, else off_value "
                "(indices outside [0, depth) give all off_value, as in TensorFlow).",
                kind=OPAQUE, differentiable=False)


@one_hot.def_infer
def _one_hot_infer(types, depth, axis, dtype, on_value, off_value):
    (idx,) = types
    _check_indices(idx)
    if idx.shape is None:
        return TensorType(None, dtype)
    shape = list(idx.shape)
    shape.insert(normalize_axis(axis, idx.rank + 1), depth)
    return TensorType(tuple(shape), dtype)


@one_hot.def_impl
def _one_hot_impl(indices, depth, axis, dtype, on_value, off_value):
    # A comparison, not F.one_hot: that raises for depth 0 and for indices >= depth, which are all off here.
    hit = indices.long().unsqueeze(-1) == torch.arange(depth, device=indices.device)
    dt = dtypes.as_dtype(dtype).torch
    out = torch.full(hit.shape, off_value, dtype=dt, device=indices.device).masked_fill_(hit, on_value)
    return out.movedim(-1, axis % out.dim())


@builder("one_hot")
def _one_hot(g, indices, depth, axis=-1, dtype=dtypes.float32, on_value=1.0, off_value=0.0, name=None):
    """One-hot encode integer `indices` into a new axis of extent `depth` (indices outside [0, depth): all off)."""
    indices = g.as_tensor(indices)
    if depth < 0:
        raise g._error("one_hot", f"depth must be >= 0, got {depth}", [indices])
    attrs = {"depth": int(depth), "axis": int(axis), "dtype": dtypes.as_dtype(dtype),
             "on_value": on_value, "off_value": off_value}
    return g._emit1("one_hot", [indices], attrs, name)


# -- x[...] ----------------------------------------------------------------------
@builder("index")
def _index(g, x, key, name=None):
    """NumPy basic indexing: ints, slices (any step), None, Ellipsis, and one integer tensor.

    As in NumPy, the tensor's axes take its place when the ints and the tensor
    stand next to each other in the key, and come first otherwise.
    """
    x = g.as_tensor(x)
    key = key if isinstance(key, tuple) else (key,)
    if x.rank is None:
        raise g._error("index", "indexing needs a tensor of known rank", [x])
    if sum(k is Ellipsis for k in key) > 1:
        raise g._error("index", "an index can hold at most one Ellipsis", [x])
    for k in key:
        if isinstance(k, bool) or not (k is None or k is Ellipsis or isinstance(k, (int, builtins.slice, Tensor))):
            raise g._error("index", f"unsupported index {k!r}", [x])
    tensors = [k for k in key if isinstance(k, Tensor)]
    if len(tensors) > 1:
        raise g._error("index", "only one tensor index is supported; use gather", [x])
    if tensors and tensors[0].rank is None:
        raise g._error("index", "a tensor index needs a known rank", [x, tensors[0]])
    used = sum(1 for k in key if k is not None and k is not Ellipsis)
    if used > x.rank:
        raise g._error("index", f"too many indices ({used}) for rank {x.rank}", [x])
    if Ellipsis in key:
        i = key.index(Ellipsis)
        key = key[:i] + (builtins.slice(None),) * (x.rank - used) + key[i + 1:]
    key = key + (builtins.slice(None),) * (x.rank - sum(1 for k in key if k is not None))
    # NumPy: with a tensor present, ints are advanced indices too; apart (a slice or None between
    # them), the tensor's axes go first.
    advanced = [i for i, k in enumerate(key) if isinstance(k, (int, Tensor))]
    first = bool(tensors) and advanced != list(range(advanced[0], advanced[0] + len(advanced)))
    starts, ends, strides, drop, new_axes, tensor_axis = [], [], [], [], [], None
    axis, out_axis = 0, tensors[0].rank if first else 0
    for k in key:
        if k is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(k, Tensor):
            tensor_axis = axis
            out_axis += 0 if first else k.rank
            k = builtins.slice(None)
        if isinstance(k, int):
            n = x.shape[axis]
            if n != UNKNOWN and not -n <= k < n:
                raise g._error("index", f"index {k} is out of range for axis {axis} of extent {n}", [x])
            if k < 0 and n == UNKNOWN:
                raise g._error("index", f"negative index {k} on axis {axis} of unknown extent", [x])
            k = k % n if n != UNKNOWN else k
            starts.append(k), ends.append(k + 1), strides.append(1), drop.append(axis)
        else:
            step = 1 if k.step is None else int(k.step)
            if step == 0:
                raise g._error("index", "slice step cannot be zero", [x])
            starts.append(k.start)
            ends.append(k.stop)
            strides.append(step)
            out_axis += 0 if tensor_axis == axis else 1
        axis += 1
    y = x
    trivial = all(s in (0, None) and e is None and st == 1 for s, e, st in zip(starts, ends, strides))
    if not trivial:
        y = g.slice(y, starts, ends, strides)
    if drop:
        y = g.squeeze(y, drop)
    if tensors:
        at = tensor_axis - sum(1 for d in drop if d < tensor_axis)
        y = g.gather(y, tensors[0], at)
        if first and at:
            r = tensors[0].rank
            y = g.transpose(y, list(range(at, at + r)) + [i for i in range(y.rank) if not at <= i < at + r])
    if new_axes:
        y = g.expand_dims(y, new_axes)
    return y if y is not x else g.identity(x)
