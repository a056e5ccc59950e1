"""Executables for pipelines: the compiler's contract, and an eager stand-in until it lands.

The contract (``Graph.compile``)::

    exe = graph.compile(feeds={x: TensorType(shape, dtype)}, targets=[y], device="cuda")
    exe.intermediates_heap_size            # bytes, known right after compile
    exe.run(feeds, outputs=None, heap=None, stream=None) -> {tensor: TensorData}
    exe.run_async(feeds, on_complete=cb)

`compile_graph` uses ``Graph.compile`` when the graph has it and otherwise
builds an `EagerExecutable`, which implements the same surface on top of
``Graph.run``. The stand-in checks everything the contract checks (feed and
output types, heap size) but lets torch allocate the intermediates, so it
reports the liveness lower bound as its heap size and does not touch the
caller's heap. Everything outside this module talks to the contract only.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

import torch

from ..errors import FeedError, ShapeError
from ..ir import Operation, Tensor, TensorType
from ..registry import STATE, lookup
from ..runtime.asyncrun import RunHandle, submit
from ..runtime.eager import prune
from ..tensor_data import TensorData, resolve_device


def specialize(graph, feed_types: dict[Tensor, TensorType], plan: Sequence[Operation]) -> dict[int, TensorType]:
    """Every tensor's type once the placeholders have the given (concrete) types: tensor id -> type."""
    types: dict[int, TensorType] = {}
    by_op = {t.op.id: tt for t, tt in feed_types.items()}
    for op in plan:
        if op.op == "placeholder":
            out = [by_op.get(op.id, op.outputs[0].type)]
        else:
            try:
                inferred = lookup(op.op).infer([types[t.id] for t in op.inputs], **op.attrs)
            except ShapeError as e:
                raise FeedError(f"input dimensions do not fit {op.op} ({op.name}): {e}") from None
            out = [inferred] if isinstance(inferred, TensorType) else list(inferred)
        for t, tt in zip(op.outputs, out):
            types[t.id] = tt
    return types


def _nbytes(tt: TensorType) -> int:
    n = tt.numel()
    return 0 if n is None else n * tt.dtype.itemsize


def heap_lower_bound(plan: Sequence[Operation], types: dict[int, TensorType], targets: Sequence[Tensor]) -> int:
    """The largest sum of bytes of intermediates alive at once, over the op schedule `plan`.

    Feeds, constants, variables and results live outside the heap. No memory
    plan can use less; the compiler's arena is compared against this number.
    """
    keep = {t.id for t in targets}
    last_use: dict[int, int] = {}
    for i, op in enumerate(plan):
        for t in op.inputs:
            last_use[t.id] = i
    live, peak, size = 0, 0, {}
    for i, op in enumerate(plan):
        if lookup(op.op).kind != STATE:
            for t in op.outputs:
                if t.id not in keep:
                    size[t.id] = _nbytes(types[t.id])
                    live += size[t.id]
        peak = max(peak, live)
        for t in {t.id for t in op.inputs}:
            if last_use.get(t) == i and t in size:
                live -= size.pop(t)
        for t in op.outputs:  # results nobody reads die at once
            if t.id in size and t.id not in last_use:
                live -= size.pop(t.id)
    return peak


class EagerExecutable:
    """The contract's executable, run op by op through `Graph.run` (see the module docstring).

    >>> import numpy as np, stitchml as sm
    >>> from stitchml.pipeline.executable import compile_graph
    >>> g = sm.Graph(); x = g.placeholder((-1, 2), sm.float32, name="x"); y = g.relu(x) * 2.0
    >>> exe = compile_graph(g, {x: sm.TensorType((3, 2), sm.float32)}, [y], device="cpu")
    >>> exe.run({x: np.ones((3, 2), np.float32)})[y].numpy()[0].tolist()
    [2.0, 2.0]
    """

    def __init__(self, graph, feed_types: dict[Tensor, TensorType], targets: Sequence[Tensor],
                 target_ops: Sequence[Operation] = (), device: Any = None):
        self.graph = graph
        self.device = resolve_device(device)
        self.feed_types = dict(feed_types)
        self.targets = list(targets)
        self.target_ops = list(target_ops)
        plan = prune(graph, self.targets, self.target_ops)
        self.types = specialize(graph, self.feed_types, plan)
        self.output_types = {t: self.types[t.id] for t in self.targets}
        self.intermediates_heap_size = heap_lower_bound(plan, self.types, self.targets)

    def _check_feeds(self, feeds: dict) -> None:
        for t, want in self.feed_types.items():
            if t not in feeds:
                raise FeedError(f"no feed for placeholder {t.name} ({want})")
            v = feeds[t]
            shape, dtype = (v.shape, v.dtype) if isinstance(v, TensorData) else (None, None)
            if dtype is not None and (dtype != want.dtype or tuple(shape) != want.shape):
                raise FeedError(f"feed for {t.name}: the executable was compiled for {want}, got {dtype}{list(shape)}")

    def run(self, feeds: dict, outputs: dict | None = None, heap: TensorData | None = None,
            stream: Any = None) -> dict[Tensor, TensorData]:
        """Run once; results go into `outputs` (caller-owned TensorData) when given."""
        self._check_feeds(feeds)
        if heap is not None:
            if not isinstance(heap, TensorData) or heap.dtype.name != "uint8" or heap.nbytes < self.intermediates_heap_size:
                raise FeedError(f"heap: expected uint8 TensorData of at least {self.intermediates_heap_size} bytes, "
                                f"got {heap!r}")
        if outputs is not None:
            for t, want in self.output_types.items():
                out = outputs.get(t)
                if out is None or out.dtype != want.dtype or out.shape != want.shape:
                    raise FeedError(f"output for {t.name}: expected {want}, got {out!r}")
        ctx = torch.cuda.stream(stream) if stream is not None and self.device.type == "cuda" else contextlib.nullcontext()
        with ctx:
            results = self.graph.run(feeds, self.targets, self.target_ops, device=self.device)
            if outputs is None:
                return results
            for t in self.targets:
                outputs[t].torch().copy_(results[t].torch())
        return {t: outputs[t] for t in self.targets}

    def run_async(self, feeds: dict, on_complete: Callable | None = None, outputs: dict | None = None) -> RunHandle:
        """Queue a run; `on_complete(results, error)` is called when it ends."""
        return submit(self, lambda: self.run(feeds, outputs), on_complete)


def compile_graph(graph, feed_types: dict[Tensor, TensorType], targets: Sequence[Tensor],
                  target_ops: Sequence[Operation] = (), device: Any = None):
    """An executable for one input signature: the stitching compiler's when present, else the eager stand-in."""
    if hasattr(type(graph), "compile"):
        return graph.compile(feeds=feed_types, targets=list(targets), target_ops=list(target_ops), device=device)
    return EagerExecutable(graph, feed_types, targets, target_ops, device)
