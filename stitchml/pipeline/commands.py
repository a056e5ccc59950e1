"""Command queues, command buffers and their encoders: network dispatches beside user kernels.

A queue is one CUDA stream (on the CPU: an ordered worker thread). A
command buffer records commands through encoders (an ML encoder dispatches
a pipeline, a compute encoder runs user code: a Triton kernel launch or
torch ops), barriers and event signals/waits; `commit()` hands it to its
queue, which runs the commands in order. `wait()` or a completed handler
tells when it is done; `timeline` and pipeline/trace.py turn the record
into a Chrome/Perfetto trace.

Times: on the CPU the wall clock around each command. On a GPU, a queue
made with `timestamps=True` (or a buffer asked for with it) records a CUDA
event between commands and the spans carry GPU times (`clock == "gpu"`);
otherwise the spans carry the times the host enqueued each command
(`clock == "host"`), which costs nothing. GPU timestamps are a profiling
setting, as in Metal 4 where timestamps are asked for explicitly: an event
record costs about 2.5 us of host time, as much as the whole launch of a
captured network (benchmarks/dispatch_parts.py).

`commit()` runs the commands on the calling thread when the queue is idle
(nothing committed before it is still running or waiting on the queue's
worker): on a GPU that only enqueues work on the stream; on the CPU it is the
work itself, and it saves two thread hand-offs per buffer. A buffer that
waits for an event nobody has signaled yet goes to the worker, and so do the
buffers committed after it or while a buffer runs, which keeps queue order.
Completed handlers run on the queue's completion thread (or in `wait()`). A
GPU dispatch is one CUDA-graph replay of the pipeline bound to the argument
table (pipeline/ml.py, runtime/bound.py).

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((2, 2), sm.float32, name="x")
    >>> fn = sm.package.Package.from_graph(g, {"x": x}, {"y": x * 2.0}).function()
    >>> dev = sm.device("cpu"); pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    >>> xin, yout = sm.TensorData(np.ones((2, 2), np.float32)), dev.new_tensor((2, 2), sm.float32)
    >>> cb = dev.new_command_queue().command_buffer()
    >>> enc = cb.ml_encoder(); enc.set_pipeline(pipe); enc.set_argument_table({"x": xin, "y": yout})
    >>> enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size)); enc.end()
    >>> cb.commit(); cb.wait(); yout.numpy().tolist()
    [[2.0, 2.0], [2.0, 2.0]]
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..errors import PipelineError, StitchError
from ..runtime import cudart
from ..runtime.cudart import NOT_READY, using
from ..tensor_data import TensorData
from .ml import MLPipeline
from .resources import Heap, SharedEvent

if TYPE_CHECKING:
    from .device import Device

DEFAULT_EVENT_TIMEOUT = 60.0  # seconds a queue waits for an event before the command buffer fails
log = logging.getLogger("stitchml.pipeline")

@dataclass
class Span:
    """One recorded command: what ran, where and when (microseconds since the device's origin)."""

    name: str
    kind: str  # "ml", "compute", "barrier", "signal", "wait"
    encoder: str
    queue: str
    start_us: float = 0.0
    end_us: float = 0.0
    args: dict | None = None
    clock: str = "host"  # "gpu": CUDA-event times; "host": when the host ran (CPU) or enqueued (GPU) it


# A recorded command: (kind, name, encoder or None, run or None, args or None, (event, value) or None)
_Command = tuple


def _pending():
    """A held lock: released once a buffer's commands have run (cheaper than a threading.Event)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


def _wait_for(pending, timeout: float = -1) -> bool:
    """Wait until `pending` is released (False after `timeout` seconds); it stays released for others."""
    if not pending.acquire(True, timeout):
        return False
    pending.release()
    return True


class CommandQueue:
    """An ordered queue of command buffers on one device (MTL4CommandQueue): one CUDA stream."""

    def __init__(self, dev: Device, label: str = "", timestamps: bool = False):
        self.device = dev
        self.label = label or f"queue{id(self) % 10000}"
        self.timestamps = bool(timestamps)
        self.stream = torch.cuda.Stream(dev.torch_device) if dev.is_cuda else None
        self._handle = self.stream.cuda_stream if dev.is_cuda else 0
        self._direct = cudart.runtime() if dev.is_cuda else None
        self._lock = threading.Lock()  # held while a buffer's commands are put on the stream
        self._backlog = 0  # buffers running or handed to the worker and not yet run: later ones queue behind them
        self._running = threading.Lock()  # CPU: held while a buffer's commands run (committer or worker)
        self._events: list = []  # timing events of completed buffers, for reuse
        self._finish_lock = threading.Lock()
        self._launcher: cf.ThreadPoolExecutor | None = None
        self._completer: cf.ThreadPoolExecutor | None = None

    def command_buffer(self, label: str = "", timestamps: bool | None = None) -> "CommandBuffer":
        """A new command buffer; `timestamps` (default: the queue's) times its commands on the GPU."""
        return CommandBuffer(self, label, self.timestamps if timestamps is None else timestamps)

    # -- running buffers --------------------------------------------------------------------------
    def _commit(self, cb: "CommandBuffer") -> None:
        cpu = self.stream is None
        if cpu:  # other threads may wait() while it runs here
            cb._executed = _pending()
        if not (cb._waits and cb._blocked()):
            with self._lock:
                idle = self._backlog == 0
                if idle and not cpu:
                    cb._execute()
                    return
                if idle:  # the CPU runs it on this thread; buffers committed meanwhile queue behind it
                    self._backlog += 1
                    self._running.acquire()  # free: the worker lets it go before it leaves the backlog
            if idle:
                try:
                    cb._execute_host()
                finally:
                    self._running.release()
                    with self._lock:
                        self._backlog -= 1
                    cb._executed.release()
                return
        if not cpu:
            cb._executed = _pending()
        with self._lock:  # one worker, and buffers reach it in commit order
            self._backlog += 1
            if self._launcher is None:
                self._launcher = cf.ThreadPoolExecutor(1, thread_name_prefix=f"stitchml-{self.label}")
            self._launcher.submit(self._run_queued, cb)

    def _run_queued(self, cb: "CommandBuffer") -> None:
        try:
            if self.stream is not None:
                cb._execute()
            else:
                with self._running:  # after a buffer run on its committing thread
                    cb._execute_host()
        finally:
            with self._lock:
                self._backlog -= 1
            cb._executed.release()

    def _complete_later(self, cb: "CommandBuffer") -> None:
        with self._lock:
            if self._completer is None:
                self._completer = cf.ThreadPoolExecutor(1, thread_name_prefix=f"stitchml-{self.label}-done")
            self._completer.submit(cb._finish)

    def _mark(self):
        """A timing event recorded on the stream now (from the pool of events of finished buffers)."""
        events = self._events
        ev = events.pop() if events else None
        if ev is None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(self.stream)  # torch makes the CUDA event on its first record
            return ev
        rt = self._direct
        if rt is None:
            ev.record(self.stream)
        else:
            code = rt.event_record(ev.cuda_event, self._handle)
            if code:
                rt.fail("cudaEventRecord", code)
        return ev

    def _is_done(self, ev) -> bool:
        """Whether CUDA event `ev` (None: all the work on the stream) has completed; a CUDA error counts
        as done (the synchronize in `_wait_done` raises it)."""
        rt = self._direct
        if rt is None:
            return ev.query() if ev is not None else self.stream.query()
        return (rt.event_query(ev.cuda_event) if ev is not None else rt.stream_query(self._handle)) != NOT_READY

    def _wait_done(self, ev) -> None:
        """Block until CUDA event `ev` (None: all the work on the stream) has completed; a CUDA error raises
        RuntimeError. Work that is already done costs one query, not a synchronize."""
        rt = self._direct
        if rt is None:
            ev.synchronize() if ev is not None else self.stream.synchronize()
            return
        if ev is not None:
            handle = ev.cuda_event
            code = rt.event_query(handle)
            if code == NOT_READY:
                code = rt.event_synchronize(handle)
        else:
            code = rt.stream_query(self._handle)
            if code == NOT_READY:
                code = rt.stream_synchronize(self._handle)
        if code:
            rt.fail("waiting for the queue's work", code)

    def __repr__(self) -> str:
        return f"CommandQueue({self.label!r} on {self.device.name})"


class _Encoder:
    kind = ""
    __slots__ = ("cb", "_label", "_index", "ended")

    def __init__(self, cb: "CommandBuffer", label: str, index: int):
        self.cb = cb
        self._label = label
        self._index = index
        self.ended = False

    @property
    def label(self) -> str:
        """The encoder's label (default: its kind and its place among the buffer's encoders)."""
        return self._label or f"{self.kind}{self._index}"

    def _record(self, name: str, run: Callable[[], None], args: dict | None = None) -> None:
        if self.ended:
            raise PipelineError(f"{self.kind} encoder {self.label!r}: used after end()")
        self.cb._commands.append((self.kind, name, self, run, args, None))

    def end(self) -> None:
        """Finish encoding; the command buffer can open another encoder or commit."""
        if self.ended:
            raise PipelineError(f"{self.kind} encoder {self.label!r}: end() called twice")
        self.ended = True
        self.cb._open = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self.ended:
            self.end()


def _describe(t: Any) -> str:
    return f"{t.dtype}{list(t.shape)} on {t.device}" if isinstance(t, TensorData) else type(t).__name__


class MLEncoder(_Encoder):
    """Dispatches ML pipelines (MTL4MachineLearningCommandEncoder)."""

    kind = "ml"
    __slots__ = ("pipeline", "table")

    def __init__(self, cb, label, index):
        self.cb, self._label, self._index, self.ended = cb, label, index, False  # _Encoder's, without the call
        self.pipeline: MLPipeline | None = None
        self.table: tuple | None = None  # ((name, TensorData), ...), inputs then outputs

    def set_pipeline(self, pipeline: MLPipeline) -> None:
        if pipeline is not self.pipeline:
            if not isinstance(pipeline, MLPipeline):
                raise PipelineError(f"set_pipeline: expected an MLPipeline, got {type(pipeline).__name__}")
            dev = self.cb.queue.device
            if pipeline.device is not dev and pipeline.device.torch_device != dev.torch_device:
                raise PipelineError(f"set_pipeline: pipeline {pipeline.label} is for {pipeline.device.name}, "
                                    f"the queue is on {self.cb.queue.device.name}")
        self.pipeline, self.table = pipeline, None

    def set_argument_table(self, table: dict[str, TensorData]) -> None:
        """Bind every input and output of the pipeline to caller-owned TensorData (zero copy), checked now."""
        p = self.pipeline
        if p is None:
            raise PipelineError("set_argument_table: call set_pipeline first")
        checked = p._checked_table
        if checked is not None and len(table) == len(checked):
            for n, v in checked:
                if table.get(n) is not v:
                    break
            else:
                self.table = checked  # the same tensors as the last table checked for this pipeline
                return
        want = {**{n: (t, "input") for n, t in p.input_types.items()}, **{n: (t, "output") for n, t in p.output_types.items()}}
        unknown = sorted(set(table) - set(want))
        missing = sorted(set(want) - set(table))
        if unknown or missing:
            raise PipelineError(f"argument table for pipeline {p.label}: " + "; ".join(filter(None, [
                f"unknown names {unknown}" if unknown else "", f"missing {missing}" if missing else ""]))
                + f"; it takes {', '.join(f'{n} ({k} {t})' for n, (t, k) in want.items())}")
        for name, (tt, kind) in want.items():
            v = table[name]
            if not isinstance(v, TensorData) or v.dtype != tt.dtype or v.shape != tt.shape \
                    or v.device != str(p.device.torch_device):
                raise PipelineError(f"argument table for pipeline {p.label}: {kind} {name!r} must be TensorData "
                                    f"{tt} on {p.device.name}, got {_describe(v)}")
        self.table = p._checked_table = tuple((n, table[n]) for n in want)

    def dispatch_network(self, heap: Heap) -> None:
        """Run the pipeline on the bound tensors, with `heap` for its intermediates (allocates nothing)."""
        p, table = self.pipeline, self.table
        if p is None or table is None:
            raise PipelineError("dispatch_network: set_pipeline and set_argument_table first")
        if heap.__class__ is not Heap or heap.size < p.intermediates_heap_size or (
                heap.device is not p.device and heap.device.torch_device != p.device.torch_device):
            raise PipelineError(f"dispatch_network: pipeline {p.label} needs a heap of {p.intermediates_heap_size} "
                                f"bytes on {p.device.name}, got {heap!r}")
        if self.ended:
            raise PipelineError(f"ml encoder {self.label!r}: used after end()")
        last = p._last  # the previous dispatch's table and heap: the same launch again
        if last[0] is table and last[1] is heap:
            run, check = last[2], last[3]
        else:
            try:
                run, check = p.bound(table, heap)
            except StitchError as e:
                raise PipelineError(f"dispatch_network: pipeline {p.label}: {e}") from None
        cb = self.cb
        heap._claim(cb)
        cb._commands.append(("ml", p.label, self, run, p.span_args, None))
        if check is not None:
            cb._checks += (check,)


class ComputeEncoder(_Encoder):
    """Runs user work in queue order: Triton kernel launches or torch ops (MTL4ComputeCommandEncoder)."""

    kind = "compute"
    __slots__ = ()

    def dispatch(self, fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any) -> None:
        """Record ``fn(*args, **kwargs)``; it runs on the queue's stream when the buffer executes."""
        if not callable(fn):
            raise PipelineError(f"dispatch: expected a callable, got {type(fn).__name__}")
        self._record(name or getattr(fn, "__name__", "kernel"), (lambda: fn(*args, **kwargs)) if args or kwargs else fn)


class CommandBuffer:
    """Recorded work for one queue (MTL4CommandBuffer); see the module docstring."""

    __slots__ = ("queue", "_label", "_status", "error", "_commands", "_open", "_encoders", "_handlers", "_waits",
                 "_executed", "_stamps", "_marks", "_spans", "_finished", "_completing", "timestamps", "_done",
                 "_ran", "_checks", "__weakref__")

    def __init__(self, queue: CommandQueue, label: str = "", timestamps: bool = False):
        self.queue = queue
        self.timestamps = timestamps and queue.stream is not None  # GPU timing events (the CPU is always timed)
        self._label = label
        self._status = "encoding"  # -> committed -> completed | error
        self.error: BaseException | None = None
        self._commands: list[_Command] = []
        self._open: _Encoder | None = None
        self._encoders = 0
        self._handlers: list[Callable[["CommandBuffer"], None]] | tuple = ()  # a list once one is added
        self._checks: tuple[Callable[[], None], ...] = ()  # bound runs' checks of what their replays met on the device
        self._waits = False
        self._executed = None  # a _pending() lock, released once the commands have run (None: run in a GPU commit)
        self._stamps: list = []  # per command run: (start, end): indices into _marks, else host nanoseconds
        self._marks: list | tuple = ()  # with timestamps: the CUDA events recorded between commands
        self._done = None  # without timestamps, when a handler waits: a CUDA event after the last command
        self._spans: list[Span] | None = None  # made from the stamps when `timeline` is asked for
        self._finished = False
        self._completing = False
        self._ran = False  # its commands have run (on the CPU) or are on the stream (on a GPU)

    @property
    def label(self) -> str:
        return self._label or f"cb{id(self) % 10000}"

    # -- encoding ---------------------------------------------------------------------------
    def _check_encoding(self, what: str) -> None:
        if self._status != "encoding":
            raise PipelineError(f"command buffer {self.label}: {what} after commit()")
        if self._open is not None:
            raise PipelineError(f"command buffer {self.label}: {what} while the {self._open.kind} encoder "
                                f"{self._open.label!r} is open; end() it first")

    def _encoder(self, cls, label):
        if self._status != "encoding" or self._open is not None:
            self._check_encoding(f"opening a {cls.kind} encoder")
        self._encoders += 1
        enc = self._open = cls(self, label, self._encoders)
        return enc

    def ml_encoder(self, label: str = "") -> MLEncoder:
        return self._encoder(MLEncoder, label)

    def compute_encoder(self, label: str = "") -> ComputeEncoder:
        return self._encoder(ComputeEncoder, label)

    def barrier(self, after: str = "machine_learning", before: str = "dispatch") -> None:
        """Order the stages: work of stage `before` waits for work of stage `after` (a trace marker on one stream)."""
        self._check_encoding("barrier")
        self._commands.append(("barrier", f"barrier {after} -> {before}", None, None, None, None))

    def signal_event(self, event: SharedEvent, value: int) -> None:
        """When the work before it is done, set `event` to `value`."""
        self._check_encoding("signal_event")
        self._commands.append(("signal", f"signal {event.label}={value}", None, None,
                               {"event": event.label, "value": value}, (event, int(value))))

    def wait_for_event(self, event: SharedEvent, value: int, timeout: float = DEFAULT_EVENT_TIMEOUT) -> None:
        """Work after this waits until `event` reaches `value` (signaled by this or another queue)."""
        self._check_encoding("wait_for_event")
        self._waits = True
        self._commands.append(("wait", f"wait {event.label}>={value}", None, None,
                               {"event": event.label, "value": value, "timeout": timeout}, (event, int(value))))

    def add_completed_handler(self, handler: Callable[["CommandBuffer"], None]) -> None:
        """Call `handler(command_buffer)` when the work is done (or has failed: see `.error`)."""
        with self.queue._finish_lock:
            if not self._finished:
                self._handlers = [*self._handlers, handler]
                later = self._status != "encoding" and not self._completing
                self._completing = self._completing or later
            else:
                later = None
        if later is None:
            handler(self)
        elif later:
            self.queue._complete_later(self)

    # -- execution ----------------------------------------------------------------------------
    def commit(self) -> None:
        """Hand the recorded work to the queue; it runs after the buffers committed before it."""
        self._check_encoding("commit")
        self._status = "committed"
        self.queue._commit(self)
        if self._handlers:
            with self.queue._finish_lock:
                later = not self._completing
                self._completing = True
            if later:
                self.queue._complete_later(self)

    def _blocked(self) -> bool:
        """Whether running now would block the host on an event not signaled yet."""
        return any(c[0] == "wait" and c[5][0].signaled_value < c[5][1] for c in self._commands)

    def _execute(self) -> None:
        """Put the commands on the queue's stream (the calling thread is the committer or the worker)."""
        q = self.queue
        stamps, timed = self._stamps, self.timestamps
        stream, clock = q.stream, time.perf_counter_ns
        marks = self._marks = [] if timed else ()
        try:
            if timed:
                marks.append(q._mark())
            for kind, _, _, run, args, event in self._commands:
                start = len(marks) - 1 if timed else clock()
                if kind == "ml":
                    run(stream)
                elif kind == "compute":
                    with using(stream):
                        run()
                elif kind == "wait":
                    self._wait(event, args["timeout"])
                elif kind == "signal":
                    event[0].signal(event[1], stream)
                if not timed:
                    stamps.append((start, clock()))
                    continue
                if kind != "barrier" and kind != "signal":
                    marks.append(q._mark())
                stamps.append((start, len(marks) - 1))
            if not timed and self._handlers:
                self._done = q._mark()
        except BaseException as e:  # the failure belongs to this buffer; later buffers on the queue still run
            self.error = e
        self._ran = True

    def _execute_host(self) -> None:
        """Run the commands now, on the CPU, timing them with the wall clock."""
        stamps = self._stamps
        try:
            for kind, _, _, run, args, event in self._commands:
                start = time.perf_counter_ns()
                if run is not None:
                    run()
                elif kind == "wait":
                    self._wait(event, args["timeout"])
                elif kind == "signal":
                    event[0].signal(event[1])
                stamps.append((start, time.perf_counter_ns()))
        except BaseException as e:
            self.error = e
        self._ran = True

    def _wait(self, event: tuple[SharedEvent, int], timeout: float) -> None:
        ev, value = event
        if not ev.wait_until(value, timeout):
            raise PipelineError(f"command buffer {self.label}: event {ev.label} did not reach {value} within "
                                f"{timeout} s (it is at {ev.signaled_value}); is its signal committed?")
        cuda_event = ev.cuda_event_for(value)
        if cuda_event is not None:
            self.queue.stream.wait_event(cuda_event)

    def _work_done(self) -> bool:
        """Whether its work is over (heaps ask, to know whether this buffer still uses them)."""
        if self._finished:
            return True
        if not self._ran:
            return False
        return self.queue.stream is None or self.error is not None or self._gpu_done()

    def _last_event(self):
        """The CUDA event that completes with this buffer's work, if one was recorded."""
        return self._marks[-1] if self._marks else self._done

    def _gpu_done(self) -> bool:
        """Whether the GPU finished this buffer's work (without an event: whether the queue is idle)."""
        return self.queue._is_done(self._last_event())

    def _finish(self) -> None:
        """Once the work is done: turn the stamps into spans, set the status, call the handlers (once)."""
        if self._finished:
            return
        if self._executed is not None:
            _wait_for(self._executed)
        q = self.queue
        if q.stream is not None and self.error is None:
            try:  # without an event, waiting for the queue also waits for work committed after this buffer
                q._wait_done(self._last_event())
                for check in self._checks:  # a replayed dispatch met its zero integer divisors on the device
                    check()
            except (RuntimeError, StitchError) as e:
                self.error = e
        with q._finish_lock:
            if self._finished:
                return
            if self._marks or self._done is not None:
                if self.timestamps:  # the events go back to the queue's pool below: read their times now
                    self._spans = self._make_spans()
                if self.error is None:
                    q._events.extend(self._marks)
                    if self._done is not None:
                        q._events.append(self._done)
                self._marks, self._done = (), None
            self._status = "error" if self.error is not None else "completed"
            self._finished = True
            handlers, self._handlers = self._handlers, ()
        for handler in handlers:
            try:
                handler(self)
            except Exception:  # noqa: BLE001  (a handler's failure is the handler's; the buffer is done)
                log.exception("command buffer %s: completed handler failed", self.label)

    @property
    def status(self) -> str:
        """"encoding", "committed", "completed" or "error" (completed GPU work is noticed when asked)."""
        if self._status == "committed" and self._executed is None and self.queue.stream is not None \
                and self._gpu_done():
            self._finish()
        return self._status

    def wait(self, timeout: float | None = None) -> None:
        """Block until the work is done; raises its error (PipelineError wraps non-StitchML errors)."""
        if self._finished:  # done before: only its error to raise
            if self.error is not None:
                self._raise()
            return
        if self._status == "encoding":
            raise PipelineError(f"command buffer {self.label}: wait() before commit()")
        if timeout is not None:
            deadline = time.monotonic() + timeout
            if self._executed is not None and not _wait_for(self._executed, max(timeout, 0.0)):
                raise PipelineError(f"command buffer {self.label}: not done after {timeout} s")
            while self.queue.stream is not None and self.error is None and not self._finished \
                    and not self._gpu_done():
                if time.monotonic() > deadline:
                    raise PipelineError(f"command buffer {self.label}: not done after {timeout} s")
                time.sleep(1e-4)
        self._finish()
        if self.error is not None:
            self._raise()

    def _raise(self) -> None:
        if isinstance(self.error, StitchError):
            raise self.error
        raise PipelineError(f"command buffer {self.label} failed: {type(self.error).__name__}: {self.error}") \
            from self.error

    def _make_spans(self) -> list[Span]:
        q = self.queue
        dev, timed, spans = q.device, self.timestamps, []
        for (kind, name, encoder, _, args, _), (start, end) in zip(self._commands, self._stamps):
            span = Span(name, kind, encoder.label if encoder else "", q.label, args=args,
                        clock="gpu" if timed else "host")
            if not timed:
                span.start_us, span.end_us = (start - dev.origin_ns) / 1e3, (end - dev.origin_ns) / 1e3
            elif self.error is None:
                span.start_us = dev.origin_event.elapsed_time(self._marks[start]) * 1e3
                span.end_us = dev.origin_event.elapsed_time(self._marks[end]) * 1e3
            spans.append(span)
        return spans

    @property
    def timeline(self) -> list[Span]:
        """What ran, in order, with start and end times (after completion; host times are turned into spans
        when asked for, which keeps them off a dispatch's path)."""
        with self.queue._finish_lock:
            if not self._finished:
                return []
            if self._spans is None:
                self._spans = self._make_spans()
            return list(self._spans)

    def __repr__(self) -> str:
        return f"CommandBuffer({self.label!r}, {self._status}, {len(self._commands)} commands)"
