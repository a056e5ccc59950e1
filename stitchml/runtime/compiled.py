"""From a graph and a signature to an Executable, and the per-graph cache of them.

`compile_graph` extracts the program the targets need, runs the pass
pipeline and wraps the result. This module is the graph's one way into the
runtime: `Graph.compile`, `Graph.run` (`run_graph`: op by op, or compiled and
cached) and `Graph.run_async` (`submit`) call it. `cached_run` is what `Graph.run` uses on CUDA:
one executable per signature (feed shapes and dtypes, targets, target ops,
device) in a bounded LRU cache; every compile after the first says which part
of the signature changed (`Graph.compile_log`).
"""
from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Mapping

import torch

from ..dtypes import as_dtype
from ..errors import ExecutionError, FeedError
from ..ir import Tensor, TensorType, built_at
from ..tensor_data import TensorData, resolve_device
from .asyncrun import submit  # noqa: F401  (Graph.run_async's entry)
from .eager import RunContext, check_request, run_graph as run_eager
from .executable import Executable, Signature

log = logging.getLogger("stitchml.compile")
CACHE_SIZE = int(os.environ.get("STITCHML_EXECUTABLE_CACHE", "16"))


def _backend(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "reference"
        return "triton"
    return "interpret" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "reference"


def _feed_types(graph, feeds) -> dict[Tensor, TensorType]:
    """{placeholder: TensorType} from feeds of TensorTypes or example data; FeedError for anything else."""
    if not isinstance(feeds, Mapping):
        raise FeedError(f"compile: feeds must map placeholders to TensorTypes or example data, "
                        f"got {type(feeds).__name__}")
    out = {}
    for key, value in feeds.items():
        if not isinstance(key, Tensor) or key.graph is not graph or key.op.op != "placeholder":
            raise FeedError(f"compile: feed keys must be placeholders of graph {graph.name!r}, got {key!r}")
        if isinstance(value, TensorType):
            out[key] = value
            continue
        try:
            data = value if isinstance(value, TensorData) else TensorData(value)
        except (TypeError, ValueError) as e:
            raise FeedError(f"compile: feed for placeholder {key.name}: expected a TensorType or example data, "
                            f"got {type(value).__name__} ({e})") from None
        out[key] = TensorType(data.shape, data.dtype)
    return out


def signature_of(graph, feed_types: dict[Tensor, TensorType], targets, target_ops, device) -> Signature:
    feeds = tuple(sorted((t.op.id, t.name, tuple(tt.shape), tt.dtype.name) for t, tt in feed_types.items()))
    return Signature(feeds, tuple(t.id for t in targets), tuple(op.id for op in target_ops), str(device))


def _check_types(feed_types: dict[Tensor, TensorType]) -> None:
    for t, tt in feed_types.items():
        if tt.shape is None or -1 in tt.shape:
            raise FeedError(f"compile: placeholder {t.name} needs a static shape to compile for, got {tt}")
        if as_dtype(tt.dtype) != t.dtype or not t.type.accepts(tt.shape):
            raise FeedError(f"compile: placeholder {t.name} is {t.type}; cannot compile it for {tt}")


def _check_reductions(program) -> None:
    """Refuse, before any device work, a maximum, minimum or arg-extremum over an empty axis: every shape
    is static here, and a kernel would return its neutral element (-inf for a maximum) where an op-by-op
    run raises. The error is the one an op-by-op run gives, at the line that built the op."""
    for op in program.operations:
        if not op.primitive.needs_elements:
            continue
        shape = op.inputs[0].shape
        if not shape:  # a scalar holds one element
            continue
        axes = op.attrs["axes"] if "axes" in op.attrs else (op.attrs["axis"],)
        if axes is None:
            axes = range(len(shape))
        empty = [a % len(shape) for a in axes if shape[a % len(shape)] == 0]
        if empty:
            t = op.inputs[0]
            raise ExecutionError(f"{built_at(op)} failed on inputs "
                                 f"[{t.name}: {t.shape} {t.dtype.torch}]: it reduces over axis {empty[0]}, "
                                 f"which has no elements")


def compile_graph(graph, feeds: dict, targets, target_ops, device, options: dict) -> Executable:
    device = resolve_device(device)
    targets, target_ops = check_request(graph, targets, target_ops)
    feed_types = _feed_types(graph, feeds)
    _check_types(feed_types)
    # The passes load on the first compile: a process that only runs graphs op by op (Graph.run on the CPU,
    # which comes through this module) does not pay for importing them.
    from ..passes import CompileContext, extract, run_pipeline

    program = extract(graph, feed_types, targets, target_ops)
    _check_reductions(program)
    options = dict(options)
    if device.type == "cuda":
        options.setdefault("sm_count", torch.cuda.get_device_properties(device).multi_processor_count)
    ctx = CompileContext(device=device, backend=options.get("backend", _backend(device)), options=options,
                         run_context=lambda: RunContext(graph, device, {}, graph.run_count))
    program = run_pipeline(program, ctx)
    return Executable(graph, program, ctx, signature_of(graph, feed_types, targets, target_ops, device), targets)


def run_graph(graph, feeds, targets, target_ops, device, compiled: bool | None) -> dict:
    """`Graph.run`: op by op on the CPU or with `compiled=False`, else through the graph's executable
    cache (made on first use, shared by every thread that runs the graph)."""
    dev = resolve_device(device)
    if compiled is False or (compiled is None and dev.type != "cuda"):
        return run_eager(graph, feeds, targets, target_ops, dev)
    targets, target_ops = check_request(graph, targets, target_ops)
    with graph._run_lock:
        if graph._executables is None:
            graph._executables = ExecutableCache()
        exe = graph._executables.get(graph, feeds or {}, targets, target_ops, dev)
    return exe.run(feeds)


class ExecutableCache:
    """A graph's compiled executables, least recently used dropped first."""

    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self.entries: OrderedDict[Signature, Executable] = OrderedDict()
        self.log: list[str] = []

    def get(self, graph, feeds: dict, targets, target_ops, device) -> Executable:
        feed_types = _feed_types(graph, feeds or {})
        sig = signature_of(graph, feed_types, targets, target_ops, device)
        exe = self.entries.get(sig)
        if exe is not None:
            self.entries.move_to_end(sig)
            return exe
        if self.entries:
            nearest = next(reversed(self.entries))
            reason = sig.describe_change(nearest)
        else:
            reason = "first run"
        exe = compile_graph(graph, feed_types, targets, target_ops, device, {})
        message = f"compiled {graph.name!r} for a new signature ({reason}): {exe.kernel_count} kernels, " \
                  f"heap {exe.intermediates_heap_size} bytes"
        self.log.append(message)
        log.info(message)
        self.entries[sig] = exe
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return exe
