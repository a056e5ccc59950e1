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
from collections import OrderedDict, deque
from collections.abc import Mapping

import torch

from ..codegen import cpu
from ..dtypes import as_dtype
from ..errors import ExecutionError, FeedError, GraphError, StitchError
from ..ir import Operation, Tensor, TensorType, built_at
from ..tensor_data import TensorData, resolve_device
from .asyncrun import submit  # noqa: F401  (Graph.run_async's entry)
from .buckets import BucketedExecutable, Refused, bucket_types, check_spec, pad_graph
from .eager import RunContext, check_request, run_graph as run_eager
from . import native_run
from .executable import Executable, Signature

log = logging.getLogger("stitchml.compile")
CACHE_SIZE = int(os.environ.get("STITCHML_EXECUTABLE_CACHE", "16"))
# Graph.run on the CPU compiles a signature on its run after this many op-by-op runs (native backend only).
CPU_COMPILE_AFTER = int(os.environ.get("STITCHML_CPU_COMPILE_AFTER", "2"))


def compiles_by_default(device: torch.device) -> bool:
    """Whether Graph.run compiles on `device` when not told: always on CUDA; on the CPU when kernels
    compile to native code (the Triton interpreter and the reference backend are slower than op by op)."""
    return device.type == "cuda" or _backend(device) == "native"


def _backend(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "reference"
        return "triton"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "interpret"
    return "native" if native_available() else "reference"


def native_available() -> bool:
    """Whether CPU kernels compile to native code (codegen/cpu.py): a C++ compiler works, and
    STITCHML_CPU_BACKEND does not ask for the reference backend."""
    if os.environ.get("STITCHML_CPU_BACKEND", "native") == "reference":
        return False
    try:
        cpu.compiler()
    except cpu.CompilerUnavailable as e:
        log.info("CPU kernels run through their reference implementations: %s", e)
        return False
    return True


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


def signature_of(graph, feed_types: dict[Tensor, TensorType], targets, target_ops, device,
                 options: dict | None = None) -> Signature:
    feeds = tuple(sorted((t.op.id, t.name, tuple(tt.shape), tt.dtype.name) for t, tt in feed_types.items()))
    return Signature(feeds, tuple(t.id for t in targets), tuple(op.id for op in target_ops), str(device),
                     options=options_key(options))


def options_key(options: dict | None) -> tuple:
    """Compile options as a signature holds them: sorted (name, repr(value)) pairs; `allow_tf32=False`, the
    default, is left out, so that asking for the default finds the same executable."""
    if not options:
        return ()
    return tuple(sorted((k, repr(v)) for k, v in options.items() if not (k == "allow_tf32" and v is False)))


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
    if not isinstance(options.get("allow_tf32", False), bool):
        raise GraphError(f"compile: option allow_tf32 expects True or False, got {options['allow_tf32']!r}")
    user_options, options = options, dict(options)
    if device.type == "cuda":
        options.setdefault("sm_count", torch.cuda.get_device_properties(device).multi_processor_count)
    ctx = CompileContext(device=device, backend=options.get("backend", _backend(device)), options=options,
                         run_context=lambda: RunContext(graph, device, {}, graph.run_count))
    program = run_pipeline(program, ctx)
    return Executable(graph, program, ctx, signature_of(graph, feed_types, targets, target_ops, device, user_options),
                      targets)


def _rules(spec) -> tuple:
    return tuple(sorted((t.op.id, a, repr(r)) for t, axes in spec.items() for a, r in axes.items()))


def _bucketed(graph, spec, feed_types, targets, device, options: dict) -> BucketedExecutable:
    """Compile the padded twin of `graph` for the buckets of `feed_types` (Refused: it cannot be bucketed)."""
    padded = pad_graph(graph, spec, feed_types, targets)
    twin_types = {p: bucket_types(spec, feed_types)[user] for user, (p, _) in padded.feeds.items()}
    twin_types.update({m: TensorType((padded.sizes[c],), as_dtype("bool")) for c, m in padded.masks.items()})
    twin_types.update({n: TensorType((), as_dtype("float32")) for n in padded.counts.values()})
    exe = compile_graph(padded.graph, twin_types, [t for t, _ in padded.targets], [], device, options)
    label = ", ".join(f"{t.name}: {tt.dtype}{list(tt.shape)}" for t, tt in bucket_types(spec, feed_types).items())
    return BucketedExecutable(padded, exe, spec, label, targets)


def compile_bucketed(graph, feeds: dict, targets, target_ops, device, options: dict, buckets) -> BucketedExecutable:
    """`Graph.compile` with buckets: an executable for every feed size that rounds up to the same buckets as
    `feeds`; CompileError when the graph cannot be bucketed as asked."""
    device = resolve_device(device)
    targets, target_ops = check_request(graph, targets, target_ops)
    spec = check_spec(graph, buckets)
    feed_types = _feed_types(graph, feeds)
    _check_types(feed_types)
    from ..passes import CompileError

    if target_ops:
        raise CompileError("compile: bucketed executables run targets only, not target operations")
    try:
        return _bucketed(graph, spec, feed_types, targets, device, options)
    except Refused as e:
        raise CompileError(f"compile: cannot bucket graph {graph.name!r}: {e}") from None


_current_device = getattr(torch._C, "_cuda_getDevice", None)  # torch.cuda.current_device without its checks


def _fast_key(feeds, targets, target_ops, device, compiled, options=None) -> tuple | None:
    """The key of a run request whose feeds are all tensors: the feed keys', targets' and target ops'
    identities, each feed's shape and dtype, the device as asked for (with the current CUDA device,
    which `None` and "cuda" resolve to), `compiled` and the compile options. None when a feed is anything
    else (arrays, lists). Built flat, in one tuple: `Graph.run` builds one per call."""
    if feeds is None:
        feeds = {}
    elif type(feeds) is not dict:
        return None
    if type(targets) is not list and type(targets) is not tuple:
        if isinstance(targets, Tensor):
            targets = (targets,)
        elif not isinstance(targets, (list, tuple)):
            return None
    if type(target_ops) is not tuple and type(target_ops) is not list:
        if isinstance(target_ops, Operation):
            target_ops = (target_ops,)
        elif not isinstance(target_ops, (list, tuple)):
            return None
    if device is not None and type(device) is not str and type(device) is not torch.device:
        return None  # the full lookup says what is wrong with it
    current = _current_device() if _current_device is not None and torch.cuda.is_initialized() else None
    key = [device, current, compiled, options_key(options) if options else (), len(feeds), len(targets)]
    for k, value in feeds.items():
        kind = type(value)
        t = value if kind is torch.Tensor else value._t if kind is TensorData else None
        if t is None:
            return None
        key += (id(k), t.shape, t.dtype)
    key += map(id, targets)
    key += map(id, target_ops)
    return tuple(key)


_cuda_ready = False  # CUDA initialised in this process (checked until it is: it stays so)


def _current_cuda(device) -> int | None:
    """The current CUDA device where `device` (as Graph.run got it) resolves through it: None, or a CUDA
    device without an index; None otherwise, or before CUDA is initialised."""
    global _cuda_ready
    if _current_device is None:
        return None
    if device is not None and (device.type != "cuda" or device.index is not None if type(device) is torch.device
                               else ":" in device or device == "cpu"):
        return None
    if not _cuda_ready:
        _cuda_ready = torch.cuda.is_initialized()
        if not _cuda_ready:
            return None
    return _current_device()


def _request_key(feeds, targets, target_ops, device, compiled, options) -> tuple | None:
    """The key of a run request by identities alone: the feed keys', targets' and target ops' identities,
    the device as asked for (with the current CUDA device where that resolves it), `compiled` and the compile
    options; not the feeds' shapes or dtypes, which the executable's prepared run checks against its own.
    None for a request of another form (the full lookup takes those)."""
    if type(feeds) is not dict:
        if feeds is not None:
            return None
        feeds = {}
    kind = type(targets)
    if kind is Tensor:
        targets = (targets,)
    elif kind is not list and kind is not tuple:
        return None
    kind = type(target_ops)
    if kind is Operation:
        target_ops = (target_ops,)
    elif kind is not tuple and kind is not list:
        return None
    if device is not None and type(device) is not str and type(device) is not torch.device:
        return None
    current = None if device == "cpu" else _current_cuda(device)
    return (device, current, compiled, options_key(options) if options else (), len(feeds), len(targets),
            *map(id, feeds), *map(id, targets), *map(id, target_ops))


def run_graph(graph, feeds, targets, target_ops, device, compiled: bool | None, buckets=None,
              options: dict | None = None) -> dict:
    """`Graph.run`: a request seen before goes straight to its executable; otherwise op by op where the
    device does not compile by default (or with `compiled=False`), else through the graph's executable
    cache (made on first use, shared by every thread that runs the graph). A CPU signature compiles on
    its run after CPU_COMPILE_AFTER op-by-op runs; runs with buckets compile at once. `options` are
    compile options (`allow_tf32`), part of the executable's signature; op-by-op runs ignore them."""
    cache = graph._executables
    if compiled is not False and cache is not None and not (buckets or graph.buckets):
        # a request seen before whose prepared run `Graph.run` did not take (ExecutableCache.quick): its
        # executable from identities, shapes and dtypes
        with graph._run_lock:
            exe = cache.fast(feeds, targets, target_ops, device, compiled, options)
        if exe is not None:
            return exe.run(feeds)
    dev = resolve_device(device)
    buckets = graph.buckets if buckets is None else buckets
    if compiled is False or (compiled is None and not compiles_by_default(dev) and not buckets):
        return run_eager(graph, feeds, targets, target_ops, dev)
    request = targets, target_ops
    targets, target_ops = check_request(graph, targets, target_ops)
    with graph._run_lock:
        if graph._executables is None:
            graph._executables = ExecutableCache()
        cold = compiled is None and dev.type != "cuda" and not buckets and not graph._executables.warm(
            graph, feeds or {}, targets, target_ops, dev)
        exe = None if cold else graph._executables.get(graph, feeds or {}, targets, target_ops, dev, buckets, options)
        if exe is not None and not buckets:
            graph._executables.remember(exe, feeds, *request, device, compiled, options)
    return run_eager(graph, feeds, targets, target_ops, dev) if cold else exe.run(feeds)


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
        self.evicted: OrderedDict[Signature, None] = OrderedDict()  # dropped signatures, newest last (bounded)
        self.log: list[str] = []
        self.served: deque[str] = deque(maxlen=256)  # which bucket served each recent bucketed run
        self.refused: dict[tuple, str] = {}  # (bucket rules, targets) -> why the graph cannot be bucketed
        self.runs: dict[Signature, int] = {}  # CPU runs op by op so far, per signature (warm)
        self._fast: dict[tuple, tuple[Signature, tuple]] = {}
        self._recent: dict[tuple, tuple[Signature, Executable, tuple]] = {}  # `quick`'s: by _request_key
        self.fast_hits = 0  # requests `quick` or `fast` answered (tests and benchmarks read it)
        self._native_tried = False  # whether `quick` was offered to the native lookup (runtime/native_run.py)

    def fast(self, feeds, targets, target_ops, device, compiled, options=None) -> Executable | None:
        """The executable `get` returned for this same request (`Graph.run`'s arguments) before, or None."""
        key = _fast_key(feeds, targets, target_ops, device, compiled, options)
        hit = self._fast.get(key) if key is not None else None
        if hit is None:
            return None
        exe = self.entries.get(hit[0])
        if exe is None:  # evicted since
            del self._fast[key]
            return None
        self.entries.move_to_end(hit[0])
        self.fast_hits += 1
        request = _request_key(feeds, targets, target_ops, device, compiled, options)
        if request is not None:  # the request's shapes changed back to these: `quick` serves them again
            self._note(request, (hit[0], exe, hit[1]))
        return exe

    def _note(self, request: tuple, entry: tuple) -> None:
        """Let `quick` find `entry` (signature, executable, the objects the key's identities are of), if
        the executable's runs take its prepared path (others are left to `fast`)."""
        if not entry[1].prepares_runs:
            return
        if len(self._recent) >= self.FAST_SIZE and request not in self._recent:
            self._recent.clear()
        self._recent[request] = entry
        if not self._native_tried:  # an entry `quick` can serve: from now on, look requests up in C
            self._native_tried = True
            lookup = native_run.lookup(self, _current_cuda, _current_device)
            if lookup is not None:
                self.quick = lookup

    def quick(self, feeds, targets, target_ops, device, compiled, options=None) -> dict | None:
        """The result of a run of a request seen before (`Graph.run`'s arguments) by the executable `get`
        returned for it last, through that executable's prepared run (Executable._prepared), which checks
        the feeds against what it was compiled for; None (nothing run) when there is none or a feed misses.
        Lock-free up to the run, which takes the graph's run lock: each dictionary operation is atomic."""
        if not self._recent:  # no executable with prepared runs: no key to build
            return None
        key = _request_key(feeds, targets, target_ops, device, compiled, options)
        hit = self._recent.get(key) if key is not None else None
        if hit is None:
            return None
        sig, exe, _ = hit
        prepared = exe._prepared
        result = prepared(feeds, None) if prepared is not None else None
        if result is not None:
            try:
                self.entries.move_to_end(sig)
            except KeyError:  # evicted by another thread meanwhile: this run was still its executable's
                pass
            self.fast_hits += 1
        return result

    def remember(self, exe: Executable, feeds, targets, target_ops, device, compiled, options=None) -> None:
        """Let `fast` find `exe` for this request (after `get` checked it and returned `exe`). The entry
        holds the objects whose identities its key takes (not the fed values), so that no other object
        can take those identities while it lives."""
        key = _fast_key(feeds, targets, target_ops, device, compiled, options)
        # the entry's own key: `exe.signature` can name the device more exactly ("cuda:0" for "cuda")
        sig = next((s for s, e in self.entries.items() if e is exe), None)
        if key is None or sig is None:
            return
        if len(self._fast) >= self.FAST_SIZE:
            self._fast.clear()
        held = (tuple(feeds or {}),
                *(tuple(x) if isinstance(x, (list, tuple)) else (x,) for x in (targets, target_ops)))
        self._fast[key] = (sig, held)
        request = _request_key(feeds, targets, target_ops, device, compiled, options)
        if request is not None:
            self._note(request, (sig, exe, held))

    def warm(self, graph, feeds: dict, targets, target_ops, device) -> bool:
        """Whether a CPU run of this signature should compile: it has an executable already, or this is
        at least its CPU_COMPILE_AFTER + 1-th run (compiling costs a compiler run, so a signature run
        once or twice stays op by op)."""
        try:
            sig = signature_of(graph, _feed_types(graph, feeds or {}), targets, target_ops, device)
        except StitchError:
            return False  # a bad feed: the op-by-op run says what is wrong, as it does for any first run
        if sig in self.entries:
            return True
        seen = self.runs.get(sig, 0) + 1
        self.runs[sig] = seen
        if len(self.runs) > 4 * self.size:  # a stream of one-off signatures: forget the oldest counts
            self.runs.pop(next(iter(self.runs)))
        return seen > CPU_COMPILE_AFTER

    def get(self, graph, feeds: dict, targets, target_ops, device, buckets=None, options=None) -> Executable:
        """The executable for these feeds (compiled on a miss); with `buckets`, one of the padded twin
        that serves every size of the same buckets, unless the graph cannot be bucketed (then the
        exact one, the log saying why once)."""
        feed_types = _feed_types(graph, feeds or {})
        spec = check_spec(graph, buckets) if buckets else {}
        if spec:
            key = (_rules(spec), tuple(t.id for t in targets), tuple(op.id for op in target_ops))
            if target_ops:
                self.refused.setdefault(key, "target operations are run by exact-shape executables")
            if key not in self.refused:
                return self._get_bucketed(graph, spec, key, feed_types, targets, device, options or {})
        sig = signature_of(graph, feed_types, targets, target_ops, device, options)
        exe = self.entries.get(sig)
        if exe is not None:
            self.entries.move_to_end(sig)
            return exe
        what = self._why(sig)
        exe = compile_graph(graph, feed_types, targets, target_ops, device, options or {})
        self._add(graph, sig, exe, what)
        return exe

    def _get_bucketed(self, graph, spec, key, feed_types, targets, device, options: dict):
        sig = signature_of(graph, bucket_types(spec, feed_types), targets, [], device, options)
        sig = Signature(sig.feeds, sig.targets, sig.target_ops, sig.device, key[0], sig.options)
        exe = self.entries.get(sig)
        if exe is None:
            what = self._why(sig)
            try:
                exe = _bucketed(graph, spec, feed_types, targets, device, options)
            except Refused as e:
                self.refused[key] = str(e)
                self.log.append(f"no buckets for {graph.name!r}: {e}; compiling for exact shapes")
                return self.get(graph, feed_types, targets, [], device, options=options)
            self._add(graph, sig, exe, what.replace("signature", "bucket", 1))
        else:
            self.entries.move_to_end(sig)
        if exe.sizes(feed_types) is None:  # padded extents that must agree do not: the exact compile says why
            return self.get(graph, feed_types, targets, [], device, options=options)
        self.served.append(f"bucket {exe.label} served " +
                           ", ".join(f"{t.name}: {list(tt.shape)}" for t, tt in feed_types.items()))
        return exe

    def _why(self, sig: Signature) -> str:
        if sig in self.evicted:
            del self.evicted[sig]
            return f"a signature compiled before and evicted (the cache holds {self.size})"
        if self.entries:
            alike = [s for s in self.entries if s.buckets == sig.buckets]  # compare bucketed with bucketed
            return f"a new signature ({sig.describe_change((alike or list(self.entries))[-1])})"
        return "a new signature (first run)"

    def _add(self, graph, sig: Signature, exe, what: str) -> None:
        message = f"compiled {graph.name!r} for {what}: {exe.kernel_count} kernels, " \
                  f"heap {exe.intermediates_heap_size} bytes"
        self.log.append(message)
        log.info(message)
        self.entries[sig] = exe
        while len(self.entries) > self.size:
            dropped, _ = self.entries.popitem(last=False)
            # `quick` holds executables themselves: let the dropped one go (in place: the native lookup holds
            # this dictionary)
            for k in [k for k, v in self._recent.items() if v[0] is dropped]:
                del self._recent[k]
            self.evicted[dropped] = None
            self.log.append(f"evicted {graph.name!r} {dropped.describe()} (least recently used of {self.size})")
            while len(self.evicted) > 64 * self.size:  # remember enough to explain recompiles, not every shape
                self.evicted.popitem(last=False)
