"""Shapes whose entries may be symbolic extents, as importers meet them.

An entry is an int, a pair (t, a) meaning "the run-time extent of axis a of
tensor t", or an `Extent`: an int factor times such extents (``b * t`` when a
model flattens batch and time). These helpers build static reshapes and
broadcasts when every entry is an int and the `*_with_dims` primitives
(ops/shape.py) otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Tensor


@dataclass(frozen=True, eq=False)
class Extent:
    """factor x the product of the run-time extents of (tensor, axis) terms."""

    terms: tuple
    factor: int = 1

    def __mul__(self, other):
        if isinstance(other, Extent):
            return Extent(self.terms + other.terms, self.factor * other.factor)
        if isinstance(other, int):
            return Extent(self.terms, self.factor * other)
        return NotImplemented

    __rmul__ = __mul__


def as_extent(v) -> Extent | int:
    """An int as is; a (tensor, axis) pair as an Extent."""
    return Extent((v,)) if isinstance(v, tuple) else v


def is_symbolic(entries: list) -> bool:
    return any(isinstance(e, (tuple, Extent)) for e in entries)


def _with_dims(g, builder: str, x: Tensor, entries: list) -> Tensor:
    sources: list[Tensor] = []
    shape, copies = [], []
    for i, e in enumerate(entries):
        e = as_extent(e)
        if not isinstance(e, Extent):
            shape.append(int(e))
            continue
        shape.append(e.factor)
        for t, axis in e.terms:
            if t is not x and t not in sources:
                sources.append(t)
            copies.append((i, 0 if t is x else 1 + sources.index(t), axis))
    return getattr(g, builder)(x, shape, copies, sources)


def reshape_to(g, x: Tensor, entries: list) -> Tensor:
    """Reshape to entries of ints (one may be -1) and (tensor, axis) pairs read at run time."""
    if not is_symbolic(entries):
        return g.reshape(x, [int(e) for e in entries])
    return _with_dims(g, "reshape_with_dims", x, entries)


def broadcast_to(g, x: Tensor, entries: list) -> Tensor:
    """Broadcast to entries of ints and (tensor, axis) pairs read at run time."""
    if not is_symbolic(entries):
        return g.broadcast_to(x, [int(e) for e in entries])
    return _with_dims(g, "broadcast_with_dims", x, entries)
