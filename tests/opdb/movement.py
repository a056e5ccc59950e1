"""Records of the shape primitives: reshape, transpose, expand_dims, squeeze,
broadcast_to, concat, split, slice (and its gradient), pad, tile, reverse, and
the importers' reshape and broadcast to extents read at run time.

References take elements by index maps computed with NumPy (``np.pad`` of an
``arange``, NumPy slicing of an ``arange``) and apply them with torch, so they
are independent of our implementations and still differentiable.
"""
from __future__ import annotations

import numpy as np
import torch

import stitchml as sm

from .core import ALL, ErrorInput, Fuzz, OpInfo, P, Sample, adjoint, make
from .samples import shaped

_LAYOUTS = ("contiguous", "transposed", "sliced")


def take(x: torch.Tensor, index_map: np.ndarray) -> torch.Tensor:
    """Elements of `x` at the flat positions `index_map` (a NumPy array of the result's shape)."""
    index = torch.from_numpy(np.array(index_map, dtype=np.int64))
    return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)


def positions(x: torch.Tensor) -> np.ndarray:
    """Flat positions of x's elements, shaped like x."""
    return np.arange(x.numel()).reshape(tuple(x.shape))


def _runtime_mismatch(args, feeds, kwargs=None, match="failed on inputs", op=None):
    return ErrorInput(args, kwargs or {}, error=sm.ExecutionError, match=match, feeds=feeds, op=op)


def _f32(*shape):
    return np.ones(shape, np.float32)


# -- reshape ----------------------------------------------------------------------------------
def _reshape_samples(record, dtype, rng):
    yield from shaped([("merge", [(2, 3, 4)], {"shape": (6, 4)}), ("infer", [(2, 3, 4)], {"shape": (4, -1, 3)}),
                       ("to-scalar", [(1, 1)], {"shape": ()}), ("from-scalar", [()], {"shape": (1, 1)}),
                       ("zero-size", [(0, 3)], {"shape": (3, 0)})], layouts=("contiguous",))(record, dtype, rng)
    for layout in ("transposed", "sliced"):
        yield Sample((make((3, 4), dtype, rng, layout=layout),), {"shape": (-1,)}, name=layout,
                     more=((make((5, 2), dtype, rng, layout=layout),),))
    yield Sample((make((2, 6), dtype, rng), make((3, 4), dtype, rng)), name="like",
                 more=((make((1, 6), dtype, rng), make((3, 2), dtype, rng)),))


def _reshape_build(g, x, *like, shape=None):
    return g.reshape(x, like[0] if like else shape)


def _reshape_ref(x, *like, shape=None):
    return take(x, positions(x).reshape(tuple(like[0].shape) if like else shape))


def _reshape_errors():
    return [ErrorInput((P((2, 3)),), {"shape": (4, 2)}, match="cannot reshape"),
            ErrorInput((P((2, 3)),), {"shape": (-1, -1)}, match="more than one -1"),
            ErrorInput((P((2, 3)),), {"shape": ("a", 2)}, match="sequence of ints"),
            _runtime_mismatch((P((-1, 3)),), (_f32(3, 3),), {"shape": (6,)})]


# -- transpose ---------------------------------------------------------------------------------
def _transpose_samples(record, dtype, rng):
    cases = [("perm", [(2, 3, 4)], {"permutation": (1, 0, 2)}), ("cycle", [(2, 3, 4)], {"permutation": (2, 0, 1)}),
             ("negative", [(2, 3, 4)], {"permutation": (-1, 0, 1)}), ("reverse", [(2, 3, 4)], {}),
             ("swap", [(2, 3, 4)], {"permutation": 0, "with_dimension": -1}), ("scalar", [()], {}),
             ("zero-size", [(0, 3)], {"permutation": (1, 0)})]
    for s in shaped(cases)(record, dtype, rng):
        yield Sample(s.args, s.kwargs, s.name, unranked=False,
                     more=((make((1,) * s.args[0].dim(), dtype, rng),),) if s.args[0].dim() else ())
    yield Sample((make((3, 4), dtype, rng, layout="transposed"),), name="transposed", unranked=False)
    # two axes counted from the end: builds for an operand of unknown rank too
    for name, shape in (("swap-last", (2, 3, 4)), ("swap-last-matrix", (3, 5))):
        yield Sample((make(shape, dtype, rng),), {"permutation": -2, "with_dimension": -1}, name,
                     more=((make((1,) * len(shape), dtype, rng),),))


def _transpose_ref(x, permutation=None, with_dimension=None):
    if with_dimension is not None:
        return torch.transpose(x, permutation, with_dimension)
    perm = tuple(reversed(range(x.dim()))) if permutation is None else permutation
    return take(x, np.transpose(positions(x), perm))


# -- expand_dims / squeeze -------------------------------------------------------------------------
def _expand_dims_ref(x, axes):
    return take(x, np.expand_dims(positions(x), axes))


def _squeeze_samples(record, dtype, rng):
    for name, shape, kwargs in [("all", (1, 3, 1), {}), ("first", (1, 3, 1), {"axes": 0}),
                                ("two", (1, 3, 1), {"axes": (0, -1)}), ("to-scalar", (1,), {"axes": 0}),
                                ("zero-size", (0, 1), {"axes": 1})]:
        # axes=None needs every extent known: such samples have no -1 variant.
        more = ((make(tuple(d if d == 1 else 4 for d in shape), dtype, rng),),) if "axes" in kwargs else ()
        yield Sample((make(shape, dtype, rng),), kwargs, name=name, unranked=False,
                     dynamic=None if "axes" in kwargs else False, more=more)


def _squeeze_ref(x, axes=None):
    return take(x, np.squeeze(positions(x), axes))


# -- broadcast_to -----------------------------------------------------------------------------------
def _broadcast_samples(record, dtype, rng):
    yield from shaped([("lead", [(3,)], {"shape": (2, 3)}), ("ones", [(2, 1)], {"shape": (2, 3)}),
                       ("scalar", [()], {"shape": (2, 2)}), ("zero-size", [(1, 3)], {"shape": (0, 3)}),
                       ("same", [(2, 3)], {"shape": (2, 3)})], layouts=("contiguous",))(record, dtype, rng)
    yield Sample((make((3, 1), dtype, rng, layout="transposed"),), {"shape": (2, 3, 4)}, name="transposed")
    yield Sample((make((3, 1), dtype, rng), make((2, 3, 4), dtype, rng)), name="like",
                 more=((make((1, 1), dtype, rng), make((5, 2, 6), dtype, rng)),))


def _broadcast_build(g, x, *like, shape=None):
    return g.broadcast_to(x, like[0] if like else shape)


def _broadcast_ref(x, *like, shape=None):
    return take(x, np.broadcast_to(positions(x), tuple(like[0].shape) if like else shape))


# -- concat / split --------------------------------------------------------------------------------
def _concat_samples(record, dtype, rng):
    for name, shapes, axis, more in [("rows", [(2, 3), (4, 3)], 0, [(1, 3), (2, 3)]),
                                     ("columns", [(2, 3), (2, 1), (2, 0)], -1, [(5, 1), (5, 2), (5, 3)]),
                                     ("one", [(2, 3)], 1, [(1, 1)]), ("zero-size", [(0, 3), (0, 3)], 0, None)]:
        yield Sample(tuple(make(s, dtype, rng) for s in shapes), {"axis": axis}, name=name,
                     more=(tuple(make(s, dtype, rng) for s in more),) if more else ())
    yield Sample((make((3, 2), dtype, rng, layout="transposed"), make((3, 2), dtype, rng, layout="sliced")),
                 {"axis": 1}, name="layouts")


def _split_samples(record, dtype, rng):
    yield Sample((make((6, 2), dtype, rng),), {"sizes": 3}, name="equal", dynamic=((6, -1),),
                 more=((make((6, 5), dtype, rng),),), unranked=False)
    yield Sample((make((6, 2), dtype, rng),), {"sizes": [1, 2, 3]}, name="sizes", unranked=False)
    yield Sample((make((3, 2), dtype, rng, layout="transposed"),), {"sizes": [2, 0], "axis": -1}, name="empty-part",
                 unranked=False)
    yield Sample((make((5, 2), dtype, rng), make((2, 1), dtype, rng), make((3, 1), dtype, rng)), name="like",
                 more=((make((4, 3), dtype, rng), make((1, 1), dtype, rng), make((3, 1), dtype, rng)),))


def _split_build(g, x, *likes, sizes=None, axis=0):
    return g.split(x, list(likes) if likes else sizes, axis)


def _split_ref(x, *likes, sizes=None, axis=0):
    if likes:
        sizes = [t.shape[axis] for t in likes]
    if isinstance(sizes, int):
        return torch.tensor_split(x, sizes, dim=axis)
    bounds = np.cumsum(sizes)[:-1]
    return [take(x, p) for p in np.split(positions(x), bounds, axis=axis)]


# -- slice ------------------------------------------------------------------------------------------
_SLICES = [("window", (5, 4), ((1, 0), (4, None), (1, 2))),
           ("reversed", (5, 4), ((None, None), (None, None), (-1, -2))),
           ("negative-bounds", (5, 4), ((-3, 1), (-1, 3), (1, 1))),
           ("clamped", (5, 4), ((2, -100), (100, 100), (2, 1))),
           ("backwards-window", (6,), ((4,), (0,), (-2,))),
           ("empty", (5, 4), ((3, 0), (1, 4), (1, 1))),
           ("zero-size", (0, 4), ((0, 1), (None, 3), (1, 1))),
           ("scalar", (), ((), (), ()))]


def _np_slices(starts, ends, strides):
    return tuple(slice(s, e, st) for s, e, st in zip(starts, ends, strides))


def _slice_samples(record, dtype, rng):
    for name, shape, (starts, ends, strides) in _SLICES:
        for layout in (("contiguous", "transposed") if len(shape) == 2 else ("contiguous",)):
            kwargs = {"starts": starts, "ends": ends, "strides": strides}
            yield Sample((make(shape, dtype, rng, layout=layout),), kwargs, name=f"{name}/{layout}",
                         more=((make(tuple(d + 3 for d in shape), dtype, rng),),))


def _slice_ref(x, starts, ends, strides):
    return take(x, positions(x)[_np_slices(starts, ends, strides)])


def _slice_gradient_samples(record, dtype, rng):
    for name, shape, (starts, ends, strides) in _SLICES:
        like = make(shape, dtype, rng)
        dy = make(positions(like)[_np_slices(starts, ends, strides)].shape, dtype, rng)
        yield Sample((dy, like), {"starts": starts, "ends": ends, "strides": strides}, name=name, unranked=False)


def _slice_gradient_ref(dy, like, **kwargs):
    return adjoint(lambda z: _slice_ref(z, **kwargs), like, dy)


# -- pad ----------------------------------------------------------------------------------------------
_NP_PAD_MODES = {"reflect": "reflect", "symmetric": "symmetric", "edge": "edge", "periodic": "wrap"}


def _pad_samples(record, dtype, rng):
    constant = {"mode": "constant", "constant_value": 2.0}
    yield Sample((make((2, 3), dtype, rng),), {"left": (1, 0), "right": (2, 1), **constant}, name="constant",
                 more=((make((4, 1), dtype, rng),),))
    yield Sample((make((0, 3), dtype, rng),), {"left": (1, 1), "right": (0, 2)}, name="zero-size")
    yield Sample((make((), dtype, rng),), {"left": (), "right": ()}, name="scalar")
    yield Sample((make((3, 4), dtype, rng, layout="transposed"),), {"left": (0, 2), "right": (1, 0)},
                 name="transposed")
    for mode in _NP_PAD_MODES:
        yield Sample((make((3, 4), dtype, rng),), {"left": (2, 1), "right": (1, 3), "mode": mode}, name=mode,
                     unranked=False, dynamic=False)
        yield Sample((make((3, 2), dtype, rng, layout="sliced"),), {"left": (2, 0), "right": (1, 0), "mode": mode},
                     name=f"{mode}-dynamic", dynamic=((3, -1),), unranked=False, more=((make((3, 5), dtype, rng),),))
    for mode in ("symmetric", "edge", "periodic"):
        yield Sample((make((2, 3), dtype, rng),), {"left": (0, 5), "right": (3, 4), "mode": mode},
                     name=f"{mode}-wide", unranked=False, dynamic=False)


def _pad_ref(x, left, right, mode="constant", constant_value=0.0):
    widths = list(zip(left, right))
    if mode == "constant":
        out = torch.full(tuple(d + a + b for d, (a, b) in zip(x.shape, widths)), constant_value, dtype=x.dtype)
        out[tuple(slice(a, a + d) for d, (a, _) in zip(x.shape, widths))] = x
        return out
    return take(x, np.pad(positions(x), widths, mode=_NP_PAD_MODES[mode]))


def _pad_errors():
    return [ErrorInput((P((2, 3)),), {"left": (1, 0), "right": (0, 0), "mode": "mirror"}, match="is not one of"),
            ErrorInput((P((2, 3)),), {"left": (-1, 0), "right": (0, 0)}, match="must be >= 0"),
            ErrorInput((P((2, 3)),), {"left": (-1, 0), "right": (0, 0), "mode": "edge"}, match="must be >= 0"),
            ErrorInput((P((2, 3)),), {"left": (1,), "right": (0,)}, match="need 2 entries each"),
            ErrorInput((P((2, 3)),), {"left": (2, 0), "right": (0, 0), "mode": "reflect"},
                       match="needs a known extent > padding"),
            ErrorInput((P((-1, 3)),), {"left": (1, 0), "right": (0, 0), "mode": "edge"},
                       match="needs a known extent > padding")]


# -- tile / reverse -----------------------------------------------------------------------------------
def _tile_ref(x, multiples):
    return take(x, np.tile(positions(x), multiples))


def _reverse_samples(record, dtype, rng):
    for name, shape, kwargs in [("all", (2, 3, 4), {}), ("first", (2, 3, 4), {"axes": 0}),
                                ("two", (2, 3, 4), {"axes": (0, -1)}), ("scalar", (), {}),
                                ("zero-size", (0, 3), {"axes": 1})]:
        yield Sample((make(shape, dtype, rng),), kwargs, name=name, unranked="axes" in kwargs,
                     more=((make(tuple(d + 1 for d in shape), dtype, rng),),))
    yield Sample((make((3, 4), dtype, rng, layout="sliced"),), {"axes": 1}, name="sliced")


def _reverse_ref(x, axes=None):
    return take(x, np.flip(positions(x), axes))


# -- reshape_with_dims / broadcast_with_dims -------------------------------------------------------
def _with_dims_samples(cases, layouts):
    """Cases (name, shapes of x and the sources, kwargs, shapes fed next), and kwargs for a transposed x
    of shape (3, 4) with a sliced source of shape (2, 5)."""
    def gen(record, dtype, rng):
        for name, shapes, kwargs, more in cases:
            yield Sample(tuple(make(s, dtype, rng) for s in shapes), dict(kwargs), name=name,
                         more=(tuple(make(s, dtype, rng) for s in more),) if more else ())
        yield Sample((make((3, 4), dtype, rng, layout="transposed"), make((2, 5), dtype, rng, layout="sliced")),
                     dict(layouts), name="layouts")

    return gen


_RESHAPE_WITH_DIMS = _with_dims_samples([
    ("keep-batch", [(2, 4, 5)], {"shape": (1, -1), "copies": ((0, 0, 0),)}, [(3, 4, 5)]),
    ("from-source", [(2, 3, 4), (5, 2)], {"shape": (1, -1), "copies": ((0, 1, 1),)}, [(3, 3, 4), (1, 3)]),
    ("product", [(2, 3, 4)], {"shape": (1, 4), "copies": ((0, 0, 0), (0, 0, 1))}, [(1, 5, 4)]),
    ("factor-negative-axis", [(2, 6)], {"shape": (2, -1), "copies": ((0, 0, -2),)}, [(3, 6)]),
    ("no-copies", [(2, 3)], {"shape": (3, 2)}, None),
    ("zero-size", [(0, 3)], {"shape": (1, 3), "copies": ((0, 0, 0),)}, [(2, 3)]),
], layouts={"shape": (1, 6), "copies": ((0, 1, 0),)})
_BROADCAST_WITH_DIMS = _with_dims_samples([
    ("batch-from-source", [(1, 4), (3, 2)], {"shape": (1, 4), "copies": ((0, 1, 0),)}, [(1, 4), (5, 2)]),
    ("new-axes", [(3,), (4, 5)], {"shape": (2, 1, 3), "copies": ((1, 1, 1),)}, [(3,), (1, 2)]),
    ("own-extent", [(2, 1)], {"shape": (1, 3), "copies": ((0, 0, 0),)}, [(4, 1)]),
    ("scalar", [(), (3,)], {"shape": (2, 1), "copies": ((1, 1, 0),)}, [(), (5,)]),
    ("no-copies", [(3, 1)], {"shape": (2, 3, 4)}, None),
    ("zero-size", [(1, 3), (0,)], {"shape": (1, 3), "copies": ((0, 1, 0),)}, [(1, 3), (2,)]),
], layouts={"shape": (1, 3, 4), "copies": ((0, 1, 0),)})


def _resolved(args, shape, copies):
    """The target shape: entry o times the extent of axis a of args[i] for each copy (o, i, a)."""
    out = list(shape)
    for o, i, a in copies:
        out[o] *= args[i].shape[a]
    return tuple(out)


def _reshape_with_dims_ref(x, *sources, shape, copies=()):
    return take(x, positions(x).reshape(_resolved((x, *sources), shape, copies)))


def _broadcast_with_dims_ref(x, *sources, shape, copies=()):
    return take(x, np.broadcast_to(positions(x), _resolved((x, *sources), shape, copies)))


def _with_dims_build(op):
    return lambda g, x, *sources, shape, copies=(): getattr(g, op)(x, shape, copies, sources)


def _reshape_with_dims_errors():
    return [ErrorInput((P((2, 3)),), {"shape": (4, 2)}, match="cannot reshape (2, 3) to (4, 2)"),
            ErrorInput((P((-1, 4, 5)),), {"shape": (1, 21), "copies": ((0, 0, 0),)}, match="cannot reshape"),
            ErrorInput((P((2, 3)),), {"shape": (-1, -1)}, match="more than one -1"),
            ErrorInput((P((-1, 4)),), {"shape": (-1, 2), "copies": ((0, 0, 0),)}, match="cannot also copy extents"),
            ErrorInput((P((2, 3)),), {"shape": (1, 3), "copies": ((0, 0, 2),)}, match="names an axis that does not"),
            ErrorInput((P((2, 3)),), {"shape": (1, 3), "copies": ((0, 1, 0),)}, match="names an axis that does not"),
            _runtime_mismatch((P((-1, -1)),), (_f32(2, 3),), {"shape": (1, 2), "copies": ((0, 0, 0),)}),
            _runtime_mismatch((P(None),), (_f32(2, 3),), {"shape": (1, -1), "copies": ((0, 0, 2),)},
                              match="copy (0, 0, 2) names an axis that does not exist")]


def _broadcast_with_dims_errors():
    return [ErrorInput((P((3,)),), {"shape": (2, 4)}, match="do not broadcast"),
            ErrorInput((P((2, 3)),), {"shape": (1, 3), "copies": ((0, 1, 0),)}, build=lambda g, x, **kw: (
                g.broadcast_with_dims(x, sources=[g.placeholder((4,))], **kw)), match="do not broadcast"),
            ErrorInput((P((2, 3)),), {"shape": (3,)}, match="to lower rank"),
            ErrorInput((P((3,)),), {"shape": (2, -1)}, match="has an extent < 0"),
            ErrorInput((P((3,)),), {"shape": (1, 3), "copies": ((2, 0, 0),)}, match="names an axis that does not"),
            _runtime_mismatch((P((-1,)), P((-1,))), (_f32(3), _f32(2)), {"shape": (1,), "copies": ((0, 1, 0),)})]


RECORDS = [
    OpInfo("reshape", _reshape_samples, _reshape_ref, ALL, build=_reshape_build, errors=_reshape_errors,
           equivalent="np.reshape / torch.reshape", fuzz=Fuzz("move")),
    OpInfo("transpose", _transpose_samples, _transpose_ref, ALL, equivalent="np.transpose / torch.permute",
           fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3, 4)),), {"permutation": (0, 0, 1)}, match="is not a permutation"),
                           ErrorInput((P((2, 3)),), {"permutation": 0, "with_dimension": 2},
                                      match="out of range for rank 2"),
                           ErrorInput((P(None),), {}, match="needs a tensor of known rank"),
                           ErrorInput((P(None),), {"permutation": 0, "with_dimension": -1},
                                      match="must count from the end"),
                           ErrorInput((P(None),), {"permutation": -3, "with_dimension": -1}, error=sm.ExecutionError,
                                      match="axis -3 is out of range for rank 2", feeds=(np.ones((2, 3), np.float32),))]),
    OpInfo("expand_dims", shaped([("first", [(2, 3)], {"axes": 0}), ("last", [(2, 3)], {"axes": -1}),
                                  ("two", [(2, 3)], {"axes": (0, 3)}), ("scalar", [()], {"axes": 0}),
                                  ("zero-size", [(0, 3)], {"axes": 1})], layouts=_LAYOUTS),
           _expand_dims_ref, ALL, equivalent="np.expand_dims / torch.unsqueeze", fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)),), {"axes": 4}, match="out of range for rank 3"),
                           ErrorInput((P((2, 3)),), {"axes": (0, -4)}, match="name an axis twice")]),
    OpInfo("squeeze", _squeeze_samples, _squeeze_ref, ALL, equivalent="np.squeeze / torch.squeeze",
           fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)),), {"axes": 0}, match="has extent 2, not 1"),
                           ErrorInput((P((-1, 3)),), {}, match="ambiguous with unknown extents"),
                           ErrorInput((P((2, 3)),), {"axes": 2}, match="out of range for rank 2"),
                           _runtime_mismatch((P((-1, 3)),), (_f32(2, 3),), {"axes": 0}, match="at run time, not 1")]),
    OpInfo("broadcast_to", _broadcast_samples, _broadcast_ref, ALL, build=_broadcast_build,
           equivalent="np.broadcast_to / torch.broadcast_to", fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)),), {"shape": (4, 3)}, match="do not broadcast"),
                           ErrorInput((P((2, 3)),), {"shape": (3,)}, match="to lower rank"),
                           ErrorInput((P((3,)),), {"shape": (-1, 3)}, match="pass a tensor"),
                           _runtime_mismatch((P((-1,)), P((-1,))), (_f32(2), _f32(3)))]),
    OpInfo("concat", _concat_samples, lambda *xs, axis: torch.cat(xs, dim=axis), ALL,
           build=lambda g, *xs, axis: g.concat(list(xs), axis), equivalent="np.concatenate / torch.cat",
           fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)), P((2,))), {"axis": 0}, match="ranks differ"),
                           ErrorInput((P((2, 3)), P((2, 4))), {"axis": 0}, match="extents along axis 1 differ"),
                           ErrorInput((P(()), P(())), {"axis": 0}, match="scalars"),
                           ErrorInput((), {"axis": 0}, match="needs at least one tensor"),
                           _runtime_mismatch((P((-1, 2)), P((-1, 2))), (_f32(2, 2), _f32(3, 2)), {"axis": 1})]),
    OpInfo("split", _split_samples, _split_ref, ALL, build=_split_build, equivalent="np.split / torch.split",
           fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((6, 2)),), {"sizes": [1, 2]}, match="do not add up to extent 6"),
                           ErrorInput((P((6, 2)),), {"sizes": 4}, match="does not split into 4 equal parts"),
                           ErrorInput((P((-1, 2)),), {"sizes": 2}, match="needs a known extent"),
                           ErrorInput((P((6, 2)),), {"sizes": 2, "axis": 2}, match="out of range for rank 2"),
                           _runtime_mismatch((P((-1, 2)),), (_f32(5, 2),), {"sizes": [1, 2]})]),
    OpInfo("slice", _slice_samples, _slice_ref, ALL, equivalent="x[s0:e0:k0, ...] (NumPy basic slicing)",
           fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)),), {"starts": (0,), "ends": (1,)}, match="need 2 entries each"),
                           ErrorInput((P((2, 3)),), {"starts": (0, 0), "ends": (1, 1), "strides": (1, 0)},
                                      match="must be nonzero"),
                           ErrorInput((P(None),), {"starts": (0,), "ends": (1,)}, match="needs a tensor of known rank"),
                           _runtime_mismatch((P(None),), (_f32(2, 3),), {"starts": (0,), "ends": (1,), "strides": (1,)},
                                             match="1 entries for a tensor of rank 2")]),
    OpInfo("slice_gradient", _slice_gradient_samples, _slice_gradient_ref, ALL, second_order=True,
           equivalent="the adjoint of slice",
           errors=lambda: [ErrorInput((P((2, 2)), P((5, 4))), {"starts": (1, 0), "ends": (4, None),
                                                               "strides": (1, 2)}, match="slice of the gradient")]),
    OpInfo("pad", _pad_samples, _pad_ref, ALL, errors=_pad_errors, fuzz=Fuzz("move"),
           equivalent="np.pad (constant, reflect, symmetric, edge, wrap) / torch.nn.functional.pad"),
    OpInfo("tile", shaped([("rows", [(2, 3)], {"multiples": (2, 1)}), ("columns", [(2, 3)], {"multiples": (1, 3)}),
                           ("none", [(2, 3)], {"multiples": (0, 2)}), ("scalar", [()], {"multiples": ()}),
                           ("zero-size", [(0, 3)], {"multiples": (2, 2)})], layouts=_LAYOUTS),
           _tile_ref, ALL, equivalent="np.tile / torch.tile", fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)),), {"multiples": (2,)}, match="need 2 entries >= 0"),
                           ErrorInput((P((2, 3)),), {"multiples": (2, -1)}, match="need 2 entries >= 0")]),
    OpInfo("reverse", _reverse_samples, _reverse_ref, ALL, equivalent="np.flip / torch.flip", fuzz=Fuzz("move"),
           errors=lambda: [ErrorInput((P((2, 3)),), {"axes": 2}, match="out of range for rank 2"),
                           ErrorInput((P(None),), {}, match="needs a tensor of known rank")]),
    OpInfo("reshape_with_dims", _RESHAPE_WITH_DIMS, _reshape_with_dims_ref, ALL,
           build=_with_dims_build("reshape_with_dims"), errors=_reshape_with_dims_errors,
           equivalent="torch.reshape(x, [x.shape[0], -1]) with extents read at run time"),
    OpInfo("broadcast_with_dims", _BROADCAST_WITH_DIMS, _broadcast_with_dims_ref, ALL,
           build=_with_dims_build("broadcast_with_dims"), errors=_broadcast_with_dims_errors,
           equivalent="torch.Tensor.expand(y.shape[0], 4) with extents read at run time"),
]
