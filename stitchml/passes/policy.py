"""Fusion policy: which legal fusion to prefer. Heuristics only, no correctness.

The score of putting `op` into a kernel is the memory traffic it saves: each
input computed in that kernel is neither stored nor loaded again.
"""
from __future__ import annotations

from ..ir import Operation
from .legality import Kernel


def score(kernel: Kernel, op: Operation) -> int:
    return sum(t.type.numel() * t.dtype.itemsize for t in op.inputs if kernel.produces(t))


def choose(candidates: list[tuple[Kernel, int]]) -> Kernel | None:
    """The best (kernel, score) pair: highest score, then the most recently started kernel."""
    if not candidates:
        return None
    return max(candidates, key=lambda ks: (ks[1], ks[0].id))[0]
