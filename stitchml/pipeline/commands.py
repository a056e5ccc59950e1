"""Command queues, command buffers and their encoders: network dispatches beside user kernels.

A queue is one CUDA stream (on the CPU: an ordered worker). A command
buffer records commands through encoders (an ML encoder dispatches a
pipeline, a compute encoder runs user code: a Triton kernel launch or torch
ops), barriers and event signals/waits; `commit()` hands it to its queue,
which runs the commands in order and timestamps each one (CUDA events on a
GPU, the wall clock on the CPU). `wait()` or a completed handler tells when
it is done; `timeline` and pipeline/trace.py turn the record into a
Chrome/Perfetto trace.

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
import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..errors import PipelineError, StitchError
from ..tensor_data import TensorData
from .device import Device, Heap, MLPipeline, SharedEvent

DEFAULT_EVENT_TIMEOUT = 60.0  # seconds a queue waits for an event before the command buffer fails


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


@dataclass
class _Command:
    span: Span
    run: Callable[[], None] | None  # None: a marker (barrier)
    event: tuple[SharedEvent, int] | None = None


class CommandQueue:
    """An ordered queue of command buffers on one device (MTL4CommandQueue): one CUDA stream."""

    def __init__(self, dev: Device, label: str = ""):
        self.device = dev
        self.label = label or f"queue{id(self) % 10000}"
        self.stream = torch.cuda.Stream(dev.torch_device) if dev.is_cuda else None
        self._launcher = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stitchml-{self.label}")
        self._completer = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stitchml-{self.label}-done")

    def command_buffer(self, label: str = "") -> "CommandBuffer":
        return CommandBuffer(self, label)

    def __repr__(self) -> str:
        return f"CommandQueue({self.label!r} on {self.device.name})"


class _Encoder:
    kind = ""

    def __init__(self, cb: "CommandBuffer", label: str):
        self.cb = cb
        self.label = label
        self.ended = False

    def _record(self, name: str, run: Callable[[], None], args: dict | None = None) -> None:
        if self.ended:
            raise PipelineError(f"{self.kind} encoder {self.label!r}: used after end()")
        self.cb._commands.append(_Command(Span(name, self.kind, self.label, self.cb.queue.label, args=args), run))

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

    def __init__(self, cb, label):
        super().__init__(cb, label)
        self.pipeline: MLPipeline | None = None
        self.table: dict[str, TensorData] | None = None

    def set_pipeline(self, pipeline: MLPipeline) -> None:
        if not isinstance(pipeline, MLPipeline):
            raise PipelineError(f"set_pipeline: expected an MLPipeline, got {type(pipeline).__name__}")
        if pipeline.device.torch_device != self.cb.queue.device.torch_device:
            raise PipelineError(f"set_pipeline: pipeline {pipeline.label} is for {pipeline.device.name}, "
                                f"the queue is on {self.cb.queue.device.name}")
        self.pipeline, self.table = pipeline, None

    def set_argument_table(self, table: dict[str, TensorData]) -> None:
        """Bind every input and output of the pipeline to caller-owned TensorData (zero copy), checked now."""
        p = self.pipeline
        if p is None:
            raise PipelineError("set_argument_table: call set_pipeline first")
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
        self.table = dict(table)

    def dispatch_network(self, heap: Heap) -> None:
        """Run the pipeline on the bound tensors, with `heap` for its intermediates (allocates nothing)."""
        p, table = self.pipeline, self.table
        if p is None or table is None:
            raise PipelineError("dispatch_network: set_pipeline and set_argument_table first")
        if not isinstance(heap, Heap) or heap.size < p.intermediates_heap_size or heap.device.torch_device != p.device.torch_device:
            raise PipelineError(f"dispatch_network: pipeline {p.label} needs a heap of {p.intermediates_heap_size} "
                                f"bytes on {p.device.name}, got {heap!r}")
        fn = p.function
        feeds = {fn.input_tensor(n): table[n] for n in p.input_types}
        outputs = {fn.output_tensor(n): table[n] for n in p.output_types}
        stream = self.cb.queue.stream

        def run():
            p.executable.run(feeds, outputs=outputs, heap=heap.data, stream=stream)

        self._record(p.label, run, {"inputs": {n: list(d) for n, d in p.input_dimensions.items()},
                                    "heap_bytes": p.intermediates_heap_size})


class ComputeEncoder(_Encoder):
    """Runs user work in queue order: Triton kernel launches or torch ops (MTL4ComputeCommandEncoder)."""

    kind = "compute"

    def dispatch(self, fn: Callable[..., Any], *args: Any, name: str | None = None, **kwargs: Any) -> None:
        """Record ``fn(*args, **kwargs)``; it runs on the queue's stream when the buffer executes."""
        if not callable(fn):
            raise PipelineError(f"dispatch: expected a callable, got {type(fn).__name__}")
        self._record(name or getattr(fn, "__name__", "kernel"), lambda: fn(*args, **kwargs))


class CommandBuffer:
    """Recorded work for one queue (MTL4CommandBuffer); see the module docstring."""

    def __init__(self, queue: CommandQueue, label: str = ""):
        self.queue = queue
        self.label = label or f"cb{id(self) % 10000}"
        self.status = "encoding"  # -> committed -> completed | error
        self.error: BaseException | None = None
        self._commands: list[_Command] = []
        self._open: _Encoder | None = None
        self._handlers: list[Callable[["CommandBuffer"], None]] = []
        self._done = threading.Event()
        self._timings: list[tuple[Span, Any, Any]] = []

    # -- encoding ---------------------------------------------------------------------------
    def _check_encoding(self, what: str) -> None:
        if self.status != "encoding":
            raise PipelineError(f"command buffer {self.label}: {what} after commit()")
        if self._open is not None:
            raise PipelineError(f"command buffer {self.label}: {what} while the {self._open.kind} encoder "
                                f"{self._open.label!r} is open; end() it first")

    def _encoder(self, cls, label):
        self._check_encoding(f"opening a {cls.kind} encoder")
        enc = cls(self, label or f"{cls.kind}{sum(c.span.kind == cls.kind for c in self._commands)}")
        self._open = enc
        return enc

    def ml_encoder(self, label: str = "") -> MLEncoder:
        return self._encoder(MLEncoder, label)

    def compute_encoder(self, label: str = "") -> ComputeEncoder:
        return self._encoder(ComputeEncoder, label)

    def barrier(self, after: str = "machine_learning", before: str = "dispatch") -> None:
        """Order the stages: work of stage `before` waits for work of stage `after` (a trace marker on one stream)."""
        self._check_encoding("barrier")
        self._commands.append(_Command(Span(f"barrier {after} -> {before}", "barrier", "", self.queue.label), None))

    def signal_event(self, event: SharedEvent, value: int) -> None:
        """When the work before it is done, set `event` to `value`."""
        self._check_encoding("signal_event")
        span = Span(f"signal {event.label}={value}", "signal", "", self.queue.label, args={"event": event.label, "value": value})
        self._commands.append(_Command(span, None, (event, int(value))))

    def wait_for_event(self, event: SharedEvent, value: int, timeout: float = DEFAULT_EVENT_TIMEOUT) -> None:
        """Work after this waits until `event` reaches `value` (signaled by this or another queue)."""
        self._check_encoding("wait_for_event")
        span = Span(f"wait {event.label}>={value}", "wait", "", self.queue.label,
                    args={"event": event.label, "value": value, "timeout": timeout})
        self._commands.append(_Command(span, None, (event, int(value))))

    def add_completed_handler(self, handler: Callable[["CommandBuffer"], None]) -> None:
        """Call `handler(command_buffer)` when the work is done (or has failed: see `.error`)."""
        if self._done.is_set():
            handler(self)
        else:
            self._handlers.append(handler)

    # -- execution ----------------------------------------------------------------------------
    def commit(self) -> None:
        """Hand the recorded work to the queue; it runs after the buffers committed before it."""
        self._check_encoding("commit")
        self.status = "committed"
        self.queue._launcher.submit(self._execute)

    def _stamp(self):
        if self.queue.stream is None:
            return time.perf_counter_ns()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(self.queue.stream)
        return ev

    def _execute(self) -> None:
        stream = self.queue.stream
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        try:
            with ctx:
                for cmd in self._commands:
                    start = self._stamp()
                    if cmd.span.kind == "wait":
                        self._wait(cmd)
                    elif cmd.span.kind == "signal":
                        cmd.event[0].signal(cmd.event[1], stream)
                    elif cmd.run is not None:
                        cmd.run()
                    self._timings.append((cmd.span, start, self._stamp()))
        except BaseException as e:  # the failure belongs to this buffer; later buffers on the queue still run
            self.error = e
        self.queue._completer.submit(self._complete)

    def _wait(self, cmd: _Command) -> None:
        event, value = cmd.event
        timeout = cmd.span.args["timeout"]
        if not event.wait_until(value, timeout):
            raise PipelineError(f"command buffer {self.label}: event {event.label} did not reach {value} within "
                                f"{timeout} s (it is at {event.signaled_value}); is its signal committed?")
        cuda_event = event.cuda_event_for(value)
        if cuda_event is not None:
            self.queue.stream.wait_event(cuda_event)

    def _complete(self) -> None:
        if self.queue.stream is not None and self.error is None:
            try:
                self.queue.stream.synchronize()
            except RuntimeError as e:
                self.error = e
        dev = self.queue.device
        for span, start, end in self._timings:
            if isinstance(start, int):
                span.start_us, span.end_us = (start - dev.origin_ns) / 1e3, (end - dev.origin_ns) / 1e3
            elif self.error is None:
                span.start_us = dev.origin_event.elapsed_time(start) * 1e3
                span.end_us = dev.origin_event.elapsed_time(end) * 1e3
        self.status = "error" if self.error is not None else "completed"
        self._done.set()
        for handler in self._handlers:
            handler(self)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the work is done; raises its error (PipelineError wraps non-StitchML errors)."""
        if self.status == "encoding":
            raise PipelineError(f"command buffer {self.label}: wait() before commit()")
        if not self._done.wait(timeout):
            raise PipelineError(f"command buffer {self.label}: not done after {timeout} s")
        if self.error is not None:
            if isinstance(self.error, StitchError):
                raise self.error
            raise PipelineError(f"command buffer {self.label} failed: {type(self.error).__name__}: {self.error}") \
                from self.error

    @property
    def timeline(self) -> list[Span]:
        """What ran, in order, with start and end times (after completion)."""
        return [span for span, _, _ in self._timings]

    def __repr__(self) -> str:
        return f"CommandBuffer({self.label!r}, {self.status}, {len(self._commands)} commands)"
