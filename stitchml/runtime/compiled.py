"""From a graph and a signature to an Executable, and the per-graph cache of them.

`compile_graph` extracts the program the targets need, runs the pass
pipeline and wraps the result. `cached_run` is what `Graph.run` uses on CUDA:
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
from ..ir import Operation, Tensor, TensorType, built_at
from ..passes import CompileContext, extract, run_pipeline
from ..tensor_data import TensorData, resolve_device
from .eager import RunContext, check_request
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
    program = extract(graph, feed_types, targets, target_ops)
    _check_reductions(program)
    options = dict(options)
    if device.type == "cuda":
        options.setdefault("sm_count", torch.cuda.get_device_properties(device).multi_processor_count)
    ctx = CompileContext(device=device, backend=options.get("backend", _backend(device)), options=options,
                         run_context=lambda: RunContext(graph, device, {}, graph.run_count))
    program = run_pipeline(program, ctx)
    return Executable(graph, program, ctx, signature_of(graph, feed_types, targets, target_ops, device), targets)


def _fast_key(feeds, targets, target_ops, device, compiled) -> tuple[tuple, tuple] | None:
    """(key, objects) for a run request whose feeds are all tensors. The key: the feed keys', targets'
    and target ops' identities, each feed's shape and dtype, the device as asked for (with the current
    CUDA device, which `None` and "cuda" resolve to) and `compiled`; the objects whose identities it
    takes (not the fed values). None when a feed is anything else (arrays, lists)."""
    feeds = {} if feeds is None else feeds
    targets = (targets,) if isinstance(targets, Tensor) else targets
    target_ops = (target_ops,) if isinstance(target_ops, Operation) else target_ops
    if not isinstance(feeds, dict) or not isinstance(targets, (list, tuple)) or \
            not isinstance(target_ops, (list, tuple)):
        return None
    shapes = []
    for value in feeds.values():
        kind = type(value)
        t = value if kind is torch.Tensor else value._t if kind is TensorData else None
        if t is None:
            return None
        shapes.append((t.shape, t.dtype))
    current = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    if device is not None and type(device) not in (str, torch.device):
        return None  # the full lookup says what is wrong with it
    key = (tuple(map(id, feeds)), tuple(shapes), tuple(map(id, targets)), tuple(map(id, target_ops)), device,
           current, compiled)
    return key, (tuple(feeds), tuple(targets), tuple(target_ops), device)


class ExecutableCache:
    """A graph's compiled executables, least recently used dropped first.

    `get` checks the request and builds its signature (feed types, targets, device); `fast` finds the
    executable of a request seen before from a key of identities, shapes and dtypes alone, which costs
    a few microseconds instead of tens. Each fast entry holds the objects whose identities its key
    uses, so the identities cannot be reused by other objects while it lives.
    """

    FAST_SIZE = 64

    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self.entries: OrderedDict[Signature, Executable] = OrderedDict()
        self.log: list[str] = []
        self._fast: dict[tuple, tuple[Signature, tuple]] = {}
        self.fast_hits = 0  # requests `fast` answered (tests and benchmarks read it)

    def fast(self, feeds, targets, target_ops, device, compiled) -> Executable | None:
        """The executable `get` returned for this same request (`Graph.run`'s arguments) before, or None."""
        found = _fast_key(feeds, targets, target_ops, device, compiled)
        hit = self._fast.get(found[0]) if found is not None else None
        if hit is None:
            return None
        key = found[0]
        exe = self.entries.get(hit[0])
        if exe is None:  # evicted since
            del self._fast[key]
            return None
        self.entries.move_to_end(hit[0])
        self.fast_hits += 1
        return exe

    def remember(self, exe: Executable, feeds, targets, target_ops, device, compiled) -> None:
        """Let `fast` find `exe` for this request (after `get` checked it and returned `exe`)."""
        found = _fast_key(feeds, targets, target_ops, device, compiled)
        # the entry's own key: `exe.signature` can name the device more exactly ("cuda:0" for "cuda")
        sig = next((s for s, e in self.entries.items() if e is exe), None)
        if found is None or sig is None:
            return
        if len(self._fast) >= self.FAST_SIZE:
            self._fast.clear()
        self._fast[found[0]] = (sig, found[1])

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
