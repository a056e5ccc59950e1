"""Limits on what loading a package and importing a model may cost, so a hostile input cannot hang or eat memory.

Every check happens before the work it guards: a part's size against
`max_part_bytes` before a byte of it is read, a Range's length before it is
computed, a recurrent operator's unrolled steps before the first step is
built. Exceeding a limit raises `PackageError` naming the limit, so raising it
is one keyword away::

    sm.load_package(path, limits=sm.package.Limits(max_part_bytes=8 << 30))
    sm.package.from_onnx(model, limits=sm.package.Limits(max_unrolled_steps=20_000))
    sm.package.set_default_limits(sm.package.Limits(max_part_bytes=8 << 30))  # for every later call

docs/packages.md lists the defaults.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What loading and importing may cost; see the module docstring."""

    max_part_bytes: int = 2 << 30  # one part of a package (weights are the largest)
    max_package_bytes: int = 8 << 30  # all parts (or the whole archive) together
    max_tensor_elements: int = 1 << 31  # any tensor of an IR or import whose extents are known
    max_operations: int = 500_000  # operations of one function's IR, loaded or built by an importer
    max_model_bytes: int = 2 << 30  # an ONNX file (protobuf's own limit)
    max_nodes: int = 100_000  # nodes of an ONNX graph
    max_folded_elements: int = 1 << 24  # a value an importer computes while importing (Range, shapes, folding)
    max_unrolled_steps: int = 4096  # a recurrent operator's sequence length x directions, unrolled at import

    def exceeded(self, name: str, found: int, what: str) -> "PackageError":
        """The error for `what` needing `found` where limit `name` allows less."""
        from ..errors import PackageError

        return PackageError(f"{what}: {found} is over the limit {name}={getattr(self, name)} "
                            f"(raise it with limits=Limits({name}=...) if the input is trusted)")


def known_elements(shape) -> int:
    """The product of a shape's known extents (symbolic ones, -1, count as 1; no shape counts as 1)."""
    count = 1
    for d in shape or ():
        count *= d if d >= 0 else 1
    return count


_default = Limits()


def default_limits() -> Limits:
    """The limits used when a call passes none."""
    return _default


def set_default_limits(limits: Limits) -> Limits:
    """Use `limits` when a call passes none; returns the previous default."""
    global _default
    if not isinstance(limits, Limits):
        raise TypeError(f"expected a Limits, got {type(limits).__name__}")
    previous, _default = _default, limits
    return previous


def resolve(limits: Limits | None) -> Limits:
    return _default if limits is None else limits
