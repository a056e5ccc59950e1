"""tma: launching a generated kernel that reads and writes through TMA tensor descriptors.

The persistent TMA matmul template (codegen/matmul_tma.py) takes host-made descriptors for its operands
and outputs, pointers for the rest. A descriptor holds its tensor (address, shape, strides) and block;
`TmaLaunch` makes them on every run (a few microseconds against the milliseconds of the products the
template is for), so it holds no tensor between runs. TMA needs 16-byte-aligned addresses; a run whose
operand or output is not aligned (a view at an odd offset) runs the step's other implementation instead,
with the same results.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import loader


class TmaLaunch:
    """Launch a `TmaSource` on its slots (the body's inputs, then its outputs), or `fallback` where TMA's
    alignment rule does not hold."""

    def __init__(self, source, ins: list[int], outs: list[int], fallback: Callable[[list], None]):
        self.fn = loader.load(source.name, source.source)
        self.source = source.source
        self.slots = ins + outs
        self.descriptors = source.descriptors
        self.grid = (source.programs,)
        self.launch_options = {"num_warps": source.num_warps, "num_stages": source.num_stages}
        self.fallback = fallback
        self.interpret = loader.interpreting()
        self.fallbacks = 0  # runs that went to `fallback` (tests, reports)

    def __call__(self, env: list) -> None:
        from triton.tools.tensor_descriptor import TensorDescriptor

        tensors = [env[s] for s in self.slots]
        if any(t.data_ptr() % 16 for t, d in zip(tensors, self.descriptors) if d is not None):
            self.fallbacks += 1
            self.fallback(env)
            return
        args = [t if d is None else TensorDescriptor.from_tensor(t.mT if d[1] else t, list(d[0]))
                for t, d in zip(tensors, self.descriptors)]
        if self.interpret:
            with loader.interpreter_lock, np.errstate(all="ignore"):
                self.fn[self.grid](*args, **self.launch_options)
            return
        self.fn[self.grid](*args, **self.launch_options)
