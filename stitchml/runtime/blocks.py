"""Compiled control-flow blocks: a body's steps run on tensors, and a loop of them on CUDA graphs.

The compiler (passes/control.py) compiles each body of a control-flow op once
per input signature into a program and its pre-bound steps; a `BlockRun`
binds that program's constants and arena once and runs it on a list of input
tensors, returning fresh output tensors, as often as a loop asks.

`LoopGraphs` runs a for loop of known trip count on CUDA without a host
round trip per iteration: the body, writing its results into the other of
two sets of carried-value buffers, and the index increment are captured as
CUDA graphs of `CHUNK` iterations and of one, and a run replays them (trip
count // CHUNK and trip count % CHUNK times). Inside an enclosing capture (the executable
records its whole run once the kernels are warm) the loop is simply
unrolled into that capture instead, so replays of the enclosing run contain
the whole loop.
"""
from __future__ import annotations

import torch

from ..codegen.common import NO_FLAG
from . import cudart
from .steps import raise_flagged, run_steps

CHUNK = 16  # iterations per replayed CUDA graph: a launch per 16 iterations, a capture 16 bodies long


class BlockRun:
    """One compiled body: `run(inputs)` -> outputs. `program` and `ctx` are what the pass pipeline gave;
    `inputs` are the body's placeholders in order (the program keeps those its outputs need)."""

    def __init__(self, program, ctx, inputs):
        launch = ctx.launch_plan
        slots = launch.slots
        plan = ctx.memory_plan
        self.device = ctx.device
        self.steps = launch.steps
        self.checks, self.flag_slot = launch.checks, launch.flag_slot
        env: list = [None] * launch.nslots
        fed = {}
        self.held: set[int] = set()  # slots holding constants: results read from them are copied
        for op in program.operations:
            if op.op == "placeholder":
                fed[op.attrs["source"]] = slots[op.outputs[0].id]
            elif op.op == "constant":
                env[slots[op.outputs[0].id]] = op.attrs["value"].to(self.device)
                self.held.add(slots[op.outputs[0].id])
        self.feed_slots = [fed.get(t.op.id) for t in inputs]
        if self.flag_slot is not None:
            env[self.flag_slot] = torch.full((1,), NO_FLAG, dtype=torch.int32, device=self.device)
        arena = torch.empty(max(plan.arena_size, 1), dtype=torch.uint8, device=self.device)
        scratch_of = {v: k for k, v in plan.scratch.items()}
        self.fresh: list[tuple[int, tuple, torch.dtype]] = []
        for b in plan.buffers.values():
            if b.kind in ("vendor", "variable"):
                continue
            slot = launch.scratch_slots[scratch_of[b.id]] if b.kind == "scratch" else slots[b.id]
            if b.kind == "output":
                self.fresh.append((slot, b.shape, b.dtype))
            else:
                env[slot] = arena[b.offset:b.offset + b.nbytes].view(b.dtype).view(b.shape)
        self.arena = arena
        self.template = env
        self.result_slots = [slots[t.id] for t in program.outputs]

    def run(self, inputs: list[torch.Tensor], check_flag: bool = True, into: list[torch.Tensor] | None = None
            ) -> list[torch.Tensor]:
        """The body's outputs on `inputs` (contiguous tensors on the device). A zero integer divisor a kernel
        flagged is raised at once, or (``check_flag=False``, inside a capture) left for the caller.

        `into` gives, per output, a buffer of its type for the kernels to write (see `writes_into`); the
        outputs not written there (an input or a constant returned as is) are returned as they are."""
        env = self.template.copy()
        for slot, value in zip(self.feed_slots, inputs):
            if slot is not None:
                env[slot] = value if value.is_contiguous() else value.contiguous()
        for slot, shape, dtype in self.fresh:
            env[slot] = torch.empty(shape, dtype=dtype, device=self.device)
        if into is not None:
            for i, slot in self.writes_into.items():
                env[slot] = into[i]
        run_steps(self.steps, env, self.checks, self.flag_slot, check_flag)
        return [env[s].clone() if s in self.held else env[s] for s in self.result_slots]

    @property
    def writes_into(self) -> dict[int, int]:
        """{output index: slot} of the outputs the kernels write into a fresh buffer of their own: those
        `run(into=...)` can have written into the caller's buffers. An output given twice counts once."""
        fresh = {slot for slot, _, _ in self.fresh}
        out: dict[int, int] = {}
        for i, slot in enumerate(self.result_slots):
            if slot in fresh and slot not in out.values():
                out[i] = slot
        return out

    def raise_flagged(self) -> None:
        if self.flag_slot is not None:
            raise_flagged(self.template, self.checks, self.flag_slot)


class LoopGraphs:
    """A for loop's body captured as CUDA graphs over static buffers (see the module docstring).

    The carried values live in two sets of buffers, A and B: an iteration reads one set and its kernels
    write the other (`BlockRun.run(into=...)`), so no copy moves them back; an output that is not
    written there (an input returned as is) is copied. The graph of `CHUNK` iterations (an even number)
    starts and ends on A; single iterations alternate between an A-to-B and a B-to-A graph.
    `capture=False` runs the same iterations without graphs (how the CPU tests check this class).
    """

    def __init__(self, block: BlockRun, index: torch.Tensor, carried: list[torch.Tensor],
                 reads: list[torch.Tensor], step: int, capture: bool = True):
        self.block, self.step, self.capture = block, step, capture
        self.index = torch.empty_like(index)
        self.sets = [[torch.empty_like(c, memory_format=torch.contiguous_format) for c in carried] for _ in "AB"]
        self.reads = [torch.empty_like(r, memory_format=torch.contiguous_format) for r in reads]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph | None] = {}  # (iterations, from set)
        self.warm = False
        self.capture_error: str | None = None  # why the body could not be captured, if it could not

    def _iteration(self, src: int) -> None:
        """One iteration from buffer set `src` into the other one."""
        dst = self.sets[1 - src]
        outs = self.block.run([self.index, *self.sets[src], *self.reads], check_flag=False, into=dst)
        for d, o in zip(dst, outs):
            if o.data_ptr() != d.data_ptr():
                d.copy_(o)
        self.index.add_(self.step)

    def _iterations(self, iterations: int, src: int) -> None:
        for k in range(iterations):
            self._iteration((src + k) % 2)

    def _graph(self, iterations: int, src: int) -> torch.cuda.CUDAGraph | None:
        """The graph of `iterations` iterations from set `src`, captured on first use; None when the body cannot
        be captured (a nested if/then/else or while loop reads the device from the host: it refuses inside
        a capture)."""
        key = (iterations, src)
        if key not in self.graphs:
            graph = torch.cuda.CUDAGraph()
            torch.cuda.synchronize(self.block.device)
            try:
                with cudart.capture(graph):
                    self._iterations(iterations, src)
            except Exception as e:  # noqa: BLE001  (nothing ran: a capture records, it does not execute)
                self.capture_error = repr(e)
                graph = None
            self.graphs[key] = graph
        return self.graphs[key]

    def _replay(self, iterations: int, src: int) -> None:
        graph = self._graph(iterations, src) if self.capture else None
        if graph is None:
            self._iterations(iterations, src)
        else:
            graph.replay()

    def run(self, lower: int, count: int, carried: list[torch.Tensor], reads: list[torch.Tensor]
            ) -> list[torch.Tensor]:
        """`count` iterations from index `lower` on the given values; returns the last carried values."""
        self.index.fill_(lower)
        for dst, src in zip(self.sets[0], carried):
            dst.copy_(src)
        for dst, src in zip(self.reads, reads):
            dst.copy_(src)
        at = 0  # the set holding the carried values; the chunks start from A, so the warm-up is even or all
        if not self.warm and count:  # two iterations uncaptured: kernels compile, choices decide
            for _ in range(min(count, 2)):
                self._iteration(at)
                at = 1 - at
            count -= min(count, 2)
            self.warm = True
        chunks, rest = divmod(count, CHUNK)
        for _ in range(chunks):
            self._replay(CHUNK, 0)
        for _ in range(rest):
            self._replay(1, at)
            at = 1 - at
        self.block.raise_flagged()
        return [c.clone() for c in self.sets[at]]
