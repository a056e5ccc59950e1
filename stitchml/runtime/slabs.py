"""A matrix product and its pointwise epilogue run slab by slab.

cuBLAS writes a large product to memory and the epilogue kernel reads it back:
a round trip of the whole product through device memory. `Slabs` cuts the
product into slabs along one axis (passes/slabs.py plans them) and runs, per
slab, the library product of the operands' matching rows into the slab, then
the epilogue kernel over it, while the slab is still in the L2 cache. With
`overlap`, a slab's epilogue runs on a second stream while the next slab's
product runs (events order them, so a CUDA-graph capture records the fork and
the join). With `in_place`, the product is written into the output itself and
the epilogue rewrites it where it lies: half the bytes a slab holds in the
cache.

Where the buffers of a run would make slabbing wrong (an output that shares
memory with an operand of the product, or, in place, with an input of the
epilogue) the step runs its whole-product form instead.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .bound import byte_span, spans_overlap


@dataclass(frozen=True)
class SlabView:
    """A strided view bound to `slot` for one slab: `source`'s memory from `offset` elements on."""

    slot: int
    source: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Slab:
    """One slab: the operands' rows (index tuples into the operands' slots), the views it binds (the
    product's slab first), and the epilogue launch that reads them."""

    a_index: tuple
    b_index: tuple
    views: tuple[SlabView, ...]
    launch: Callable[[list], None]


class Slabs:
    """Run `product(out, a, b, **attrs)` (the library call) and the epilogue slab by slab (module doc).

    `a`, `b`: the operands' slots; `outs`: the epilogue's output slots; `epilogue_ins`: the other slots the
    epilogue reads (checked against the outputs in place); `whole`: the step's whole-product form, run
    where slabbing is not safe for the run's buffers.
    """

    def __init__(self, product: Callable[..., torch.Tensor], attrs: dict[str, Any], a: int, b: int,
                 slabs: list[Slab], outs: list[int], epilogue_ins: list[int], whole: Callable[[list], None],
                 in_place: bool, overlap: bool):
        self.product, self.attrs, self.a, self.b = product, attrs, a, b
        self.slabs, self.outs, self.epilogue_ins, self.whole = slabs, outs, epilogue_ins, whole
        self.in_place, self.overlap = in_place, overlap
        self.fns = (whole,) + tuple(s.launch for s in slabs)  # what runtime/launch.launches finds
        self.side: torch.cuda.Stream | None = None  # the epilogues' stream with `overlap`, made on first use

    def safe(self, env: list) -> bool:
        """Whether this run's buffers let the slabs run: no output shares memory with an operand of the
        product (a later slab's product reads all of `b`, and `a` through a view of any layout) nor, in
        place, with an input of the epilogue (the product would overwrite it before the epilogue reads it)."""
        outs = [env[s] for s in self.outs]
        others = [env[self.a], env[self.b]] + ([env[s] for s in self.epilogue_ins] if self.in_place else [])
        return not any(spans_overlap(byte_span(o), byte_span(t)) for o in outs for t in others)

    def __call__(self, env: list) -> None:
        if not self.safe(env):
            self.whole(env)
            return
        a, b = env[self.a], env[self.b]
        cuda = a.is_cuda and self.overlap
        if cuda:
            main = torch.cuda.current_stream(a.device)
            if self.side is None:
                self.side = torch.cuda.Stream(a.device)
            self.side.wait_stream(main)  # the epilogue's inputs and the outputs are ready on `main`
        for slab in self.slabs:
            for v in slab.views:
                src = env[v.source]
                env[v.slot] = src.as_strided(v.shape, v.strides, src.storage_offset() + v.offset)
            part = env[slab.views[0].slot]
            got = self.product(part, a[slab.a_index], b[slab.b_index], **self.attrs)
            if got is not part:  # the library bound a result of its own: the epilogue reads the slab
                part.copy_(got)
            if cuda:
                done = torch.cuda.Event()
                done.record(main)
                self.side.wait_event(done)
                with torch.cuda.stream(self.side):
                    slab.launch(env)
            else:
                slab.launch(env)
        if cuda:
            main.wait_stream(self.side)
