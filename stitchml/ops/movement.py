"""Movement primitives: reshape, transpose, broadcast, concat/split, slice, pad,
tile and reverse (gathers, scatters, one_hot and ``x[...]`` are in indexing.py).

Where an op needs a shape that is only known at run time (undoing a
broadcast, reshaping a gradient back), it takes a *like* tensor as an extra
input and reads that tensor's shape when it runs: ``g.reshape(dy, x)``.
"""
from __future__ import annotations

import builtins

import torch

from ..errors import ShapeError
from ..ir import UNKNOWN, Tensor, TensorType, broadcast_shapes, normalize_axes, normalize_axis
from ..registry import MOVEMENT, Primitive, builder, register


def _prim(name, doc, kind=MOVEMENT, **kw):
    return register(Primitive(name, kind, doc=doc, **kw))


def _ints(values, what):
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise ShapeError(f"{what} must be a sequence of ints, got {values!r}") from None


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# -- reshape ------------------------------------------------------------------
reshape = _prim("reshape", "The same elements in a new shape; one -1 extent is inferred (or: the shape of `like`).")


@reshape.def_view
def _reshape_view(base, out_shape, attrs):
    return base.view(out_shape)


@reshape.def_infer
def _reshape_infer(types, shape=None):
    x = types[0]
    if shape is None:  # reshape like types[1]
        return TensorType(types[1].shape, x.dtype)
    if sum(d == -1 for d in shape) > 1:
        raise ShapeError(f"target shape {shape} has more than one -1")
    if x.is_static:
        n = x.numel()
        known = _numel(d for d in shape if d != -1)
        if -1 in shape:
            if known == 0 or n % known:
                raise ShapeError(f"cannot reshape {x.shape} ({n} elements) to {shape}")
            shape = tuple(n // known if d == -1 else d for d in shape)
        elif known != n:
            raise ShapeError(f"cannot reshape {x.shape} ({n} elements) to {shape} ({known} elements)")
    return TensorType(shape, x.dtype)


@reshape.def_impl
def _reshape_impl(x, like=None, shape=None):
    return x.reshape(like.shape if shape is None else shape)


@reshape.def_vjp
def _reshape_vjp(g, op, dy):
    return [g.reshape(dy, op.inputs[0])] + [None] * (len(op.inputs) - 1)


@builder("reshape")
def _reshape(g, x, shape, name=None):
    """`x` with a new shape: a tuple (one -1 inferred) or the shape of a tensor."""
    x = g.as_tensor(x)
    if isinstance(shape, Tensor):
        return g._emit1("reshape", [x, shape], None, name)
    return g._emit1("reshape", [x], {"shape": g._checked("reshape", [x], _ints, shape, "shape")}, name)


# -- transpose ----------------------------------------------------------------
transpose = _prim("transpose", "Permute the axes: output axis i is input axis permutation[i]; or, as `swap`, "
                              "exchange two axes (negative positions count from the end), which needs no rank.")


@transpose.def_view
def _transpose_view(base, out_shape, attrs):
    return _transpose_impl(base, **attrs)  # a permutation of strides, or a swap of two


def swap_permutation(swap, rank: int) -> tuple[int, ...]:
    """The permutation that exchanges the two axes of `swap` in a tensor of rank `rank`."""
    a, b = (normalize_axis(int(axis), rank) for axis in swap)
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


@transpose.def_infer
def _transpose_infer(types, permutation=None, swap=None):
    x = types[0]
    if x.shape is None:
        return TensorType(None, x.dtype)
    if swap is not None:
        permutation = swap_permutation(swap, x.rank)
    if sorted(permutation) != list(range(x.rank)):
        raise ShapeError(f"permutation {permutation} is not a permutation of the {x.rank} axes")
    return TensorType(tuple(x.shape[p] for p in permutation), x.dtype)


@transpose.def_impl
def _transpose_impl(x, permutation=None, swap=None):
    if swap is not None:
        try:
            permutation = swap_permutation(swap, x.dim())
        except ShapeError as e:  # the rank seen at run time: reported as a failure of this op on its inputs
            raise ValueError(str(e)) from None
    return x.permute(permutation)


@transpose.def_vjp
def _transpose_vjp(g, op, dy):
    swap = op.attrs.get("swap")
    if swap is not None:  # a swap is its own inverse
        return [g.transpose(dy, swap[0], swap[1])]
    perm = op.attrs["permutation"]
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return [g.transpose(dy, inverse)]


@builder("transpose")
def _transpose(g, x, permutation=None, with_dimension=None, name=None):
    """Permute axes: ``transpose(x, (1, 0, 2))``, or swap two: ``transpose(x, 0, 1)`` (MPSGraph).

    With no permutation the axes are reversed, as in NumPy. Swapping two axes also works on a
    tensor of unknown rank when they are given from the end (``transpose(x, -2, -1)``).
    """
    x = g.as_tensor(x)
    if x.rank is None:
        if with_dimension is None:
            raise g._error("transpose", "needs a tensor of known rank (or two axes to swap, counted from the end)",
                           [x])
        swap = g._checked("transpose", [x], _ints, (permutation, with_dimension), "axes to swap")
        if any(axis >= 0 for axis in swap):
            raise g._error("transpose", f"axes {swap} of a tensor of unknown rank must count from the end (< 0)", [x])
        return g._emit1("transpose", [x], {"swap": swap}, name)
    if with_dimension is not None:
        perm = list(g._checked("transpose", [x], swap_permutation, (permutation, with_dimension), x.rank))
    elif permutation is None:
        perm = list(reversed(range(x.rank)))
    else:
        perm = [p % x.rank if x.rank else p for p in g._checked("transpose", [x], _ints, permutation, "permutation")]
    return g._emit1("transpose", [x], {"permutation": tuple(perm)}, name)


# -- expand_dims / squeeze ----------------------------------------------------------
expand_dims = _prim("expand_dims", "Insert extent-1 axes at `axes` (positions in the output).")
expand_dims.def_view(_reshape_view)


@expand_dims.def_infer
def _expand_dims_infer(types, axes):
    x = types[0]
    if x.shape is None:
        return TensorType(None, x.dtype)
    shape = list(x.shape)
    for a in normalize_axes(axes, x.rank + len(axes)):
        shape.insert(a, 1)
    return TensorType(tuple(shape), x.dtype)


@expand_dims.def_impl
def _expand_dims_impl(x, axes):
    rank = x.dim() + len(axes)
    for a in sorted(a % rank for a in axes):
        x = x.unsqueeze(a)
    return x


@expand_dims.def_vjp
def _expand_dims_vjp(g, op, dy):
    return [g.reshape(dy, op.inputs[0])]


@builder("expand_dims")
def _expand_dims(g, x, axes, name=None):
    """Add extent-1 axes; ``expand_dims(x, 0)`` makes a batch of one."""
    x = g.as_tensor(x)
    axes = (axes,) if isinstance(axes, int) else g._checked("expand_dims", [x], _ints, axes, "axes")
    if x.rank is not None:
        try:
            axes = normalize_axes(axes, x.rank + len(axes))
        except ShapeError as e:
            raise g._error("expand_dims", str(e), [x]) from None
    return g._emit1("expand_dims", [x], {"axes": axes}, name)


squeeze = _prim("squeeze", "Remove extent-1 axes at `axes`.")
squeeze.def_view(_reshape_view)


@squeeze.def_infer
def _squeeze_infer(types, axes):
    x = types[0]
    if x.shape is None:
        return TensorType(None, x.dtype)
    for a in axes:
        if x.shape[a] not in (1, UNKNOWN):
            raise ShapeError(f"axis {a} has extent {x.shape[a]}, not 1")
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


@squeeze.def_impl
def _squeeze_impl(x, axes):
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} has extent {x.shape[a]} at run time, not 1")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


@squeeze.def_vjp
def _squeeze_vjp(g, op, dy):
    return [g.reshape(dy, op.inputs[0])]


@builder("squeeze")
def _squeeze(g, x, axes=None, name=None):
    """Drop extent-1 axes (all known ones when `axes` is None)."""
    x = g.as_tensor(x)
    if x.rank is None:
        raise g._error("squeeze", "needs a tensor of known rank", [x])
    if axes is None:
        if UNKNOWN in x.shape:
            raise g._error("squeeze", "axes=None is ambiguous with unknown extents; name the axes", [x])
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    try:
        axes = normalize_axes(axes, x.rank)
    except ShapeError as e:
        raise g._error("squeeze", str(e), [x]) from None
    return g._emit1("squeeze", [x], {"axes": axes}, name)


# -- broadcast_to -------------------------------------------------------------
broadcast_to = _prim("broadcast_to", "Broadcast to `shape` (or to the shape of `like`), NumPy rules.")


@broadcast_to.def_view
def _broadcast_to_view(base, out_shape, attrs):
    return base.expand(out_shape)


@broadcast_to.def_infer
def _broadcast_to_infer(types, shape=None):
    x = types[0]
    target = types[1].shape if shape is None else shape
    if x.shape is None or target is None:
        return TensorType(target, x.dtype)
    if len(x.shape) > len(target):
        raise ShapeError(f"cannot broadcast rank {len(x.shape)} {x.shape} to lower rank {target}")
    joined = broadcast_shapes(x.shape, target)
    for j, t in zip(joined, target):
        if t != UNKNOWN and j != t:
            raise ShapeError(f"cannot broadcast {x.shape} to {target}")
    return TensorType(tuple(target), x.dtype)


@broadcast_to.def_impl
def _broadcast_to_impl(x, like=None, shape=None):
    return x.expand(like.shape if shape is None else shape)


@broadcast_to.def_vjp
def _broadcast_to_vjp(g, op, dy):
    return [g.sum_to_shape(dy, op.inputs[0])] + [None] * (len(op.inputs) - 1)


@builder("broadcast_to")
def _broadcast_to(g, x, shape, name=None):
    """Broadcast `x` to a static shape tuple, or to the run-time shape of a tensor."""
    x = g.as_tensor(x)
    if isinstance(shape, Tensor):
        if shape.shape is not None and x.shape == shape.shape and x.type.is_static:
            return x
        return g._emit1("broadcast_to", [x, shape], None, name)
    shape = g._checked("broadcast_to", [x], _ints, shape, "shape")
    if -1 in shape:
        raise g._error("broadcast_to", f"shape {shape} has -1; pass a tensor to take a run-time shape", [x])
    return g._emit1("broadcast_to", [x], {"shape": shape}, name)


# -- concat / split -----------------------------------------------------------------
concat = _prim("concat", "Join tensors along `axis`; other extents must agree.")


@concat.def_infer
def _concat_infer(types, axis):
    ranked = [t for t in types if t.shape is not None]
    dt = types[0].dtype
    if any(t.dtype != dt for t in types):
        raise ShapeError(f"dtypes differ: {', '.join(str(t.dtype) for t in types)}")
    if not ranked:
        return TensorType(None, dt)
    rank = ranked[0].rank
    if any(t.rank != rank for t in ranked):
        raise ShapeError(f"ranks differ: {', '.join(str(t.shape) for t in ranked)}")
    if rank == 0:
        raise ShapeError("cannot concatenate scalars; expand_dims them first")
    axis = normalize_axis(axis, rank)
    out = []
    for i in range(rank):
        dims = [t.shape[i] for t in ranked]
        if i == axis:
            out.append(UNKNOWN if UNKNOWN in dims or len(ranked) < len(types) else sum(dims))
        else:
            known = {d for d in dims if d != UNKNOWN}
            if len(known) > 1:
                raise ShapeError(f"extents along axis {i} differ: {sorted(known)}")
            out.append(known.pop() if known else UNKNOWN)
    return TensorType(tuple(out), dt)


concat.def_impl(lambda *xs, axis: torch.cat(xs, dim=axis))


@concat.def_vjp
def _concat_vjp(g, op, dy):
    return list(g.split(dy, list(op.inputs), op.attrs["axis"]))


@builder("concat")
def _concat(g, tensors, axis=0, name=None):
    """Concatenate a sequence of tensors along `axis` (MPSGraph concatTensors)."""
    tensors = g.promote(*tensors, name="concat") if len(tensors) > 1 else [g.as_tensor(t) for t in tensors]
    if not tensors:
        raise g._error("concat", "needs at least one tensor")
    return g._emit1("concat", tensors, {"axis": int(axis)}, name)


split = _prim("split", "Cut along `axis` into pieces of the given sizes (or the extents of `like` tensors).")


@split.def_infer
def _split_infer(types, axis, sizes=None):
    x = types[0]
    if x.shape is None:
        return [TensorType(None, x.dtype) for _ in (sizes or types[1:])]
    ax = normalize_axis(axis, x.rank)
    if sizes is None:
        extents = [t.shape[ax] if t.shape is not None else UNKNOWN for t in types[1:]]
    else:
        extents = list(sizes)
        if x.shape[ax] != UNKNOWN and sum(extents) != x.shape[ax]:
            raise ShapeError(f"sizes {sizes} do not add up to extent {x.shape[ax]} of axis {ax}")
    return [TensorType(x.shape[:ax] + (e,) + x.shape[ax + 1:], x.dtype) for e in extents]


@split.def_impl
def _split_impl(x, *likes, axis, sizes=None):
    if sizes is None:
        sizes = [t.shape[axis] for t in likes]
    return tuple(torch.split(x, list(sizes), dim=axis))


@split.def_vjp
def _split_vjp(g, op, *dys):
    pieces = [dy if dy is not None else g.broadcast_to(g.constant(0, op.inputs[0].dtype), out)
              for dy, out in zip(dys, op.outputs)]
    return [g.concat(pieces, op.attrs["axis"])] + [None] * (len(op.inputs) - 1)


@builder("split")
def _split(g, x, sizes, axis=0, name=None):
    """Split along `axis`: into `sizes` equal parts (an int), parts of the given sizes,
    or parts as long as the given tensors are along `axis`. Returns a list."""
    x = g.as_tensor(x)
    if x.rank is not None:
        axis = g._checked("split", [x], normalize_axis, axis, x.rank)
    if isinstance(sizes, int):
        if x.rank is None or x.shape[axis] == UNKNOWN:
            raise g._error("split", "an equal split needs a known extent along the axis", [x])
        extent = x.shape[axis]
        if sizes <= 0 or extent % sizes:
            raise g._error("split", f"extent {extent} does not split into {sizes} equal parts", [x])
        sizes = [extent // sizes] * sizes
    if sizes and all(isinstance(s, Tensor) for s in sizes):
        return list(g._emit("split", [x, *sizes], {"axis": int(axis)}, name).outputs)
    sizes = g._checked("split", [x], _ints, sizes, "sizes")
    return list(g._emit("split", [x], {"axis": int(axis), "sizes": sizes}, name).outputs)


# -- slice -------------------------------------------------------------------------
slice = _prim("slice", "Python-style slicing per axis: starts, ends (None: to the end) and nonzero strides.")


@slice.def_view
def _slice_view(base, out_shape, attrs):
    if any(s < 0 for s in attrs["strides"]):  # strides are never negative: a reversed slice copies
        return None
    return base[tuple(builtins.slice(a, b, c) for a, b, c in zip(attrs["starts"], attrs["ends"], attrs["strides"]))]


def _slice_range(n, start, end, stride):
    return range(*builtins.slice(start, end, stride).indices(n))


@slice.def_infer
def _slice_infer(types, starts, ends, strides):
    x = types[0]
    if x.shape is None:
        return TensorType(None, x.dtype)
    if not len(starts) == len(ends) == len(strides) == x.rank:
        raise ShapeError(f"starts, ends and strides need {x.rank} entries each")
    if 0 in strides:
        raise ShapeError(f"strides {strides} must be nonzero")
    shape = tuple(UNKNOWN if d == UNKNOWN else len(_slice_range(d, s, e, st))
                  for d, s, e, st in zip(x.shape, starts, ends, strides))
    return TensorType(shape, x.dtype)


def _slice_index(x, starts, ends, strides):
    """Per axis: a python slice (positive stride) or an index tensor (negative stride)."""
    out = []
    for n, s, e, st in zip(x.shape, starts, ends, strides):
        if st > 0:
            out.append(builtins.slice(s, e, st))
        else:
            out.append(torch.tensor(list(_slice_range(n, s, e, st)), dtype=torch.long, device=x.device))
    return out


@slice.def_impl
def _slice_impl(x, starts, ends, strides):
    if len(starts) != x.dim():  # built on a tensor of unknown rank
        raise ValueError(f"starts, ends and strides have {len(starts)} entries for a tensor of rank {x.dim()}")
    for axis, ix in enumerate(_slice_index(x, starts, ends, strides)):
        if isinstance(ix, torch.Tensor):
            x = x.index_select(axis, ix)
        elif ix != builtins.slice(None, None, 1):
            x = x[(builtins.slice(None),) * axis + (ix,)]
    return x


@slice.def_vjp
def _slice_vjp(g, op, dy):
    return [g.slice_gradient(dy, op.inputs[0], **op.attrs)]


@builder("slice")
def _slice(g, x, starts, ends, strides=None, name=None):
    """``x[starts[0]:ends[0]:strides[0], ...]`` (MPSGraph sliceTensor); None in starts or ends as in Python."""
    x = g.as_tensor(x)
    if x.rank is None and strides is None:
        raise g._error("slice", "needs a tensor of known rank, or strides", [x])
    strides = (1,) * x.rank if strides is None else g._checked("slice", [x], _ints, strides, "strides")
    starts = tuple(None if v is None else int(v) for v in starts)
    ends = tuple(None if v is None else int(v) for v in ends)
    return g._emit1("slice", [x], {"starts": starts, "ends": ends, "strides": strides}, name)


slice_gradient = _prim("slice_gradient", "Zeros shaped like `like`, with `dy` written where `slice` read.")


@slice_gradient.def_infer
def _slice_gradient_infer(types, starts, ends, strides):
    dy, like = types
    if dy.shape is not None and like.shape is not None:
        sliced = _slice_infer([like], starts, ends, strides).shape
        if len(sliced) != len(dy.shape) or any(a != b and UNKNOWN not in (a, b) for a, b in zip(sliced, dy.shape)):
            raise ShapeError(f"the gradient has shape {dy.shape}, but the slice of the gradient's target {like.shape} "
                             f"has shape {sliced}")
    return TensorType(like.shape, dy.dtype)


@slice_gradient.def_impl
def _slice_gradient_impl(dy, like, starts, ends, strides):
    out = torch.zeros(like.shape, dtype=dy.dtype, device=dy.device)
    index = []
    for axis, (n, s, e, st) in enumerate(zip(like.shape, starts, ends, strides)):
        r = _slice_range(n, s, e, st)
        if st < 0:  # the same elements, walked forwards
            dy, r = dy.flip(axis), r[::-1]
        index.append(builtins.slice(r.start, r.start + len(r) * r.step, r.step) if len(r) else builtins.slice(0, 0))
    out[tuple(index)] = dy
    return out


@slice_gradient.def_vjp
def _slice_gradient_vjp(g, op, ddy):
    return [g.slice(ddy, **op.attrs), None]


@builder("slice_gradient")
def _slice_gradient(g, dy, like, starts, ends, strides, name=None):
    """The adjoint of `slice`: scatter `dy` into zeros of like's shape."""
    return g._emit1("slice_gradient", [dy, like],
                    {"starts": tuple(starts), "ends": tuple(ends), "strides": tuple(strides)}, name)


# -- pad ---------------------------------------------------------------------------
pad = _prim("pad", "Pad with a constant: `left[i]` before and `right[i]` after axis i.")


@pad.def_infer
def _pad_infer(types, left, right, constant_value):
    x = types[0]
    if x.shape is None:
        return TensorType(None, x.dtype)
    if len(left) != x.rank or len(right) != x.rank:
        raise ShapeError(f"left and right padding need {x.rank} entries each, got {left} and {right}")
    if any(p < 0 for p in left + right):
        raise ShapeError(f"padding must be >= 0, got {left} and {right}")
    return TensorType(tuple(UNKNOWN if d == UNKNOWN else d + a + b for d, a, b in zip(x.shape, left, right)), x.dtype)


@pad.def_impl
def _pad_impl(x, left, right, constant_value):
    spec = []
    for a, b in zip(reversed(left), reversed(right)):
        spec += [a, b]
    return torch.nn.functional.pad(x, spec, value=constant_value)


@pad.def_vjp
def _pad_vjp(g, op, dy):
    left, right = op.attrs["left"], op.attrs["right"]
    return [g.slice(dy, left, [-r if r else None for r in right], (1,) * len(left))]


_PAD_MODES = ("constant", "reflect", "symmetric", "edge", "periodic")


def _pad_indices(n, before, after, mode):
    """Source index for each output position along one axis (non-constant modes)."""
    out = []
    for i in range(-before, n + after):
        if mode == "edge":
            j = min(max(i, 0), n - 1)
        elif mode == "periodic":
            j = i % n
        else:
            period, shift = (2 * n - 2, 0) if mode == "reflect" else (2 * n, 0)
            j = (i + shift) % period if period else 0
            if mode == "reflect" and j >= n:
                j = period - j
            if mode == "symmetric" and j >= n:
                j = period - 1 - j
        out.append(j)
    return out


@builder("pad")
def _pad(g, x, left, right, mode="constant", constant_value=0.0, name=None):
    """Pad each axis; modes: constant, reflect (mirror without the edge), symmetric
    (mirror with the edge), edge (repeat the border), periodic (wrap)."""
    x = g.as_tensor(x)
    if mode not in _PAD_MODES:
        raise g._error("pad", f"mode {mode!r} is not one of {_PAD_MODES}", [x])
    left, right = g._checked("pad", [x], _ints, left, "left"), g._checked("pad", [x], _ints, right, "right")
    if mode == "constant":
        return g._emit1("pad", [x], {"left": left, "right": right, "constant_value": float(constant_value)}, name)
    if x.rank is None or len(left) != x.rank or len(right) != x.rank:
        raise g._error("pad", f"left and right padding need one entry per axis, got {left} and {right}", [x])
    if any(p < 0 for p in left + right):
        raise g._error("pad", f"padding must be >= 0, got {left} and {right}", [x])
    for axis, (a, b) in enumerate(zip(left, right)):
        if a == b == 0:
            continue
        n = x.shape[axis]
        if n == UNKNOWN or n == 0 or (mode == "reflect" and max(a, b) >= n):
            raise g._error("pad", f"mode {mode!r} on axis {axis} needs a known extent > padding", [x])
        index = g.constant(torch.tensor(_pad_indices(n, a, b, mode), dtype=torch.int64))
        x = g.gather(x, index, axis)
    return x


# -- tile / reverse -----------------------------------------------------------------
tile = _prim("tile", "Repeat the whole tensor `multiples[i]` times along axis i.")


@tile.def_infer
def _tile_infer(types, multiples):
    x = types[0]
    if x.shape is None:
        return TensorType(None, x.dtype)
    if len(multiples) != x.rank or any(m < 0 for m in multiples):
        raise ShapeError(f"multiples {multiples} need {x.rank} entries >= 0")
    return TensorType(tuple(UNKNOWN if d == UNKNOWN else d * m for d, m in zip(x.shape, multiples)), x.dtype)


tile.def_impl(lambda x, multiples: x.repeat(multiples))


@tile.def_vjp
def _tile_vjp(g, op, dy):
    x, multiples = op.inputs[0], op.attrs["multiples"]
    if 0 in multiples:
        return [g.broadcast_to(g.constant(0, dy.dtype), x)]
    if x.type.is_static:
        split_shape = [v for m, d in zip(multiples, x.shape) for v in (m, d)]
        return [g.reduction_sum(g.reshape(dy, split_shape), tuple(range(0, 2 * x.rank, 2)))]
    # Extents known only at run time: cut dy into the copies along each axis (each as long as x) and add them.
    for axis, m in enumerate(multiples):
        if m > 1:
            pieces = g.split(dy, [x] * m, axis)
            dy = pieces[0]
            for piece in pieces[1:]:
                dy = dy + piece
    return [dy]


@builder("tile")
def _tile(g, x, multiples, name=None):
    """Repeat `x` (MPSGraph tileTensor, NumPy tile with one entry per axis)."""
    x = g.as_tensor(x)
    return g._emit1("tile", [x], {"multiples": g._checked("tile", [x], _ints, multiples, "multiples")}, name)


reverse = _prim("reverse", "Reverse the order of elements along `axes`.")
reverse.def_infer(lambda types, axes: types[0])
reverse.def_impl(lambda x, axes: x.flip(axes) if axes else x)
reverse.def_vjp(lambda g, op, dy: [g.reverse(dy, op.attrs["axes"])])


@builder("reverse")
def _reverse(g, x, axes=None, name=None):
    """Flip `x` along `axes` (all when None)."""
    x = g.as_tensor(x)
    try:
        axes = normalize_axes(axes, x.rank)
    except ShapeError as e:
        raise g._error("reverse", str(e), [x]) from None
    if axes is None:
        raise g._error("reverse", "axes=None needs a tensor of known rank", [x])
    return g._emit1("reverse", [x], {"axes": axes}, name)
