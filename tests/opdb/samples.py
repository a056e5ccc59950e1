"""Sample generators shared by families of records.

Each returns a function ``(record, dtype, rng) -> iterable of Sample`` covering
the cases every op of the family must handle: scalars, broadcasting,
non-contiguous layouts (transposed, sliced with an offset), zero-size
tensors and placeholders of -1 extents fed more than one size.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from stitchml.dtypes import DType

from .core import OpInfo, Sample, exact, make

Domain = tuple[float, float]
Generator = Callable[[OpInfo, DType, np.random.Generator], Iterable[Sample]]

# Shapes per arity: (name, shapes of the args, shapes fed next to the same graph).
_ELEMENTWISE_CASES = {
    1: [("scalar", [()], None), ("vector", [(5,)], [(7,)]), ("matrix", [(2, 3)], [(4, 1)]),
        ("zero-size", [(0, 3)], [(2, 3)])],
    2: [("scalar", [(), ()], None), ("vector", [(5,), (5,)], [(7,), (1,)]),
        ("broadcast", [(2, 3), (3,)], [(4, 3), (1,)]), ("broadcast-both", [(2, 1, 4), (3, 1)], [(1, 2, 4), (2, 4)]),
        ("scalar-tensor", [(), (2, 3)], [(), (1, 1)]), ("zero-size", [(0, 3), (3,)], [(2, 3), (3,)])],
    3: [("scalar", [(), (), ()], None), ("broadcast", [(2, 3), (3,), ()], [(4, 3), (1,), ()]),
        ("broadcast-both", [(2, 1, 4), (3, 1), (1, 4)], [(1, 2, 4), (2, 4), (1, 1)]),
        ("zero-size", [(0, 3), (3,), ()], [(2, 3), (3,), ()])],
}


def elementwise(arity: int, domains: Sequence[Domain] | None = None, values: Sequence | None = None,
                extra: Generator | None = None, grad: bool = True) -> Generator:
    """Samples of an `arity`-ary elementwise op; arg i draws from domains[i] or values[i]."""

    def gen(record: OpInfo, dtype: DType, rng: np.random.Generator):
        def args(shapes, layout="contiguous"):
            return tuple(make(s, dtype, rng, *(domains[i] if domains else (-3.0, 3.0)), layout=layout,
                              values=values[i] if values else None) for i, s in enumerate(shapes))

        for name, shapes, more in _ELEMENTWISE_CASES[arity]:
            yield Sample(args(shapes), name=name, more=(args(more),) if more else (), grad=grad)
        yield Sample(args([(3, 4)] * arity, "transposed"), name="transposed", grad=grad)
        yield Sample(args([(2, 5)] * arity, "sliced"), name="sliced", grad=grad)
        if extra is not None:
            yield from extra(record, dtype, rng)

    return gen


def fixed(name: str, *arrays: Sequence, grad: bool = False, kwargs: dict | None = None,
          dtypes: Sequence[DType] | None = None) -> Generator:
    """One sample of fixed values (specials: NaN, infinities, ties, halves), for `dtypes` (default all)."""

    def gen(record: OpInfo, dtype: DType, rng: np.random.Generator):
        if dtypes is not None and dtype not in dtypes:
            return
        yield Sample(tuple(exact(a, dtype) for a in arrays), dict(kwargs or {}), name=name, grad=grad)

    return gen


def chain(*generators: Generator) -> Generator:
    """All samples of several generators."""

    def gen(record: OpInfo, dtype: DType, rng: np.random.Generator):
        for g in generators:
            yield from g(record, dtype, rng)

    return gen


def shaped(cases: Sequence[tuple[str, Sequence[tuple], dict]], domain: Domain = (-3.0, 3.0),
           layouts: Sequence[str] = ("contiguous",), grad: bool = True) -> Generator:
    """Samples from explicit (name, arg shapes, kwargs) cases, each in every layout of `layouts`."""

    def gen(record: OpInfo, dtype: DType, rng: np.random.Generator):
        for name, shapes, kwargs in cases:
            for layout in layouts:
                args = tuple(make(s, dtype, rng, *domain, layout=layout) for s in shapes)
                yield Sample(args, dict(kwargs), name=f"{name}/{layout}" if len(layouts) > 1 else name, grad=grad)

    return gen
