"""Devices, heaps, shared events and ML pipelines: Metal 4's machine-learning objects, in snake_case.

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((-1, 4), sm.float32, name="x")
    >>> fn = sm.package.Package.from_graph(g, {"x": x}, {"y": g.relu(x)}).function()
    >>> dev = sm.device("cpu")
    >>> desc = sm.MLPipelineDescriptor(fn); desc.set_input_dimensions("x", (2, 4))
    >>> pipeline = sm.Compiler(dev).new_ml_pipeline(desc)
    >>> pipeline.output_shapes
    {'y': (2, 4)}

A `Device` stands for one torch device (the CPU, or one CUDA GPU). A pipeline
is a package function compiled for fixed input dimensions on a device by
the stitching compiler (`Graph.compile`); it knows its
`intermediates_heap_size` before anything runs, and a dispatch places the
intermediates in the caller's heap.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import torch

from .. import dtypes
from ..errors import ExecutionError, PipelineError
from ..ir import TensorType
from ..runtime.cudart import using
from ..tensor_data import TensorData, resolve_device

if TYPE_CHECKING:
    from .commands import CommandQueue

log = logging.getLogger("stitchml.pipeline")
BINDINGS = 8  # argument tables (with their heap) a pipeline keeps bound runs for


class Heap:
    """Caller-owned memory for a pipeline's intermediates: one uint8 buffer on the device.

    A heap serves one command queue at a time: buffers of one queue run in order, so they share it
    safely, but a buffer of another queue would overwrite intermediates still in use. A dispatch on a
    heap that a buffer of another queue holds (encoding, committed, or not completed yet) raises
    PipelineError naming that buffer; once it completes, the heap is free for any queue.
    """

    def __init__(self, device: "Device", size: int):
        self.device = device
        self.size = int(size)
        self.data = TensorData.empty((max(self.size, 1),), dtypes.uint8, device.torch_device)
        self._queue = None  # the queue whose buffers use it (the one that may dispatch on it without checks)
        self._users: weakref.WeakSet = weakref.WeakSet()  # that queue's buffers that dispatch on it
        self._lock = threading.Lock()

    def _claim(self, cb) -> None:
        """Record that command buffer `cb` dispatches on this heap; refuse while another queue's buffer
        that uses it is not completed. O(1) while one queue keeps using it."""
        with self._lock:
            if self._queue is not cb.queue:
                for other in list(self._users):
                    if not other._work_done():
                        raise PipelineError(
                            f"dispatch_network: {self!r} is in use by command buffer {other.label!r} on queue "
                            f"{other.queue.label!r} ({other._status}, not completed); command buffer {cb.label!r} "
                            f"on queue {cb.queue.label!r} cannot use it until that one completes: wait for it, or "
                            f"give each queue its own heap")
                self._users.clear()
                self._queue = cb.queue
            self._users.add(cb)

    def __repr__(self) -> str:
        return f"Heap({self.size} bytes on {self.device.name})"


class SharedEvent:
    """A counter that command buffers signal and wait on (MTLSharedEvent): orders work across queues.

    `signaled_value` only grows. On a GPU each signal also records a CUDA
    event, so a waiting queue's stream waits on the device, not the host.
    """

    def __init__(self, device: "Device", label: str = ""):
        self.device = device
        self.label = label or f"event{id(self) % 10000}"
        self._value = 0
        self._cuda: dict[int, Any] = {}
        self._cond = threading.Condition()

    @property
    def signaled_value(self) -> int:
        return self._value

    def signal(self, value: int, stream: Any = None) -> None:
        """Set the value (host side, or in stream order on a GPU when `stream` is given)."""
        with self._cond:
            if value < self._value:
                raise PipelineError(f"event {self.label}: signal {value} is below the current value {self._value}")
            if stream is not None:
                ev = torch.cuda.Event()
                ev.record(stream)
                self._cuda[value] = ev
            self._value = value
            self._cond.notify_all()

    def wait_until(self, value: int, timeout: float | None = None) -> bool:
        """Block the calling thread until the value reaches `value`; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._value >= value, timeout)

    def cuda_event_for(self, value: int):
        """The CUDA event of the first signal that reached `value` (None on the CPU)."""
        with self._cond:
            reached = sorted(v for v in self._cuda if v >= value)
            return self._cuda[reached[0]] if reached else None

    def __repr__(self) -> str:
        return f"SharedEvent({self.label!r}, value={self._value})"


class Device:
    """A CPU or CUDA device: makes queues, heaps, events and tensors. Use `stitchml.device(...)`."""

    def __init__(self, torch_device: torch.device):
        self.torch_device = torch_device
        self.name = str(torch_device)
        self.is_cuda = torch_device.type == "cuda"
        # Timestamps of every command buffer on this device are measured from this origin.
        self.origin_ns = time.perf_counter_ns()
        self.origin_event = None
        if self.is_cuda:
            self.origin_event = torch.cuda.Event(enable_timing=True)
            self.origin_event.record(torch.cuda.current_stream(torch_device))

    def new_command_queue(self, label: str = "", timestamps: bool = False) -> "CommandQueue":
        """A queue (a CUDA stream). `timestamps=True` times every command on the GPU with CUDA events
        (about 2.5 us of host time per command: a profiling setting); otherwise a GPU command buffer's
        timeline gives the times the host enqueued each command."""
        from .commands import CommandQueue

        return CommandQueue(self, label, timestamps)

    def new_heap(self, size: int) -> Heap:
        """A heap of at least `size` bytes (a pipeline's `intermediates_heap_size`)."""
        if size < 0:
            raise PipelineError(f"new_heap: size must be >= 0, got {size}")
        return Heap(self, size)

    def new_shared_event(self, label: str = "") -> SharedEvent:
        return SharedEvent(self, label)

    def new_tensor(self, shape: Sequence[int], dtype: Any) -> TensorData:
        """Uninitialised TensorData on this device (for argument tables)."""
        return TensorData.empty(shape, dtype, self.torch_device)

    def __repr__(self) -> str:
        return f"Device({self.name!r})"


def device(name: str = "cpu") -> Device:
    """The device called `name`: "cpu", "cuda" or "cuda:N" (None: CUDA when present, else the CPU).

    >>> import stitchml as sm
    >>> sm.device("cpu").name
    'cpu'
    """
    return Device(resolve_device(name))


class MLPipelineDescriptor:
    """What to compile: a package function and the dimensions of each input.

    `use_package_kernels` (default True): install the compiled kernels the package carries for
    these dimensions and this machine before compiling; False compiles everything here.
    """

    def __init__(self, function, label: str = ""):
        self.function = function
        self.label = label or function.name
        self.input_dimensions: dict[str, tuple[int, ...]] = {}
        self.use_package_kernels = True

    def set_input_dimensions(self, name: str, dimensions: Sequence[int]) -> None:
        port = self.function._port(self.function._inputs, name, "input")[1]
        dims = tuple(int(d) for d in dimensions)
        if any(d < 0 for d in dims) or not port.type.accepts(dims):
            raise PipelineError(f"input {port}: dimensions {dims} do not fit its signature")
        self.input_dimensions[name] = dims


class MLPipeline:
    """A function compiled for fixed input dimensions on a device (MTL4MachineLearningPipelineState)."""

    def __init__(self, desc: MLPipelineDescriptor, dev: Device):
        fn = desc.function
        self.function, self.device, self.label = fn, dev, desc.label
        dims = {}
        for port in fn.inputs:
            if port.name in desc.input_dimensions:
                dims[port.name] = desc.input_dimensions[port.name]
            elif port.type.is_static:
                dims[port.name] = port.type.shape
            else:
                raise PipelineError(f"pipeline {self.label}: input {port} has symbolic extents; "
                                    "call set_input_dimensions first")
        self.input_dimensions = dims
        self.input_types = {n: TensorType(d, fn.input_tensor(n).dtype) for n, d in dims.items()}
        targets = [fn.output_tensor(p.name) for p in fn.outputs]
        self.kernel_note = self._install_package_kernels(dev, desc.use_package_kernels)
        try:  # the compile prunes the graph and types it for these dimensions: the output types are its
            self.executable = fn.graph.compile({fn.input_tensor(n): t for n, t in self.input_types.items()},
                                               targets, device=dev.torch_device)
        except ExecutionError as e:  # an op refuses these dimensions: the error names it and its line
            raise PipelineError(f"pipeline {self.label}: input dimensions {dims} do not fit: {e}") from None
        self.output_types = {p.name: t.type for p, t in zip(fn.outputs, self.executable.program.outputs)}
        unknown = [f"{n}: {t}" for n, t in self.output_types.items() if not t.is_static]
        if unknown:
            raise PipelineError(f"pipeline {self.label}: output extents stay unknown for these input dimensions: {unknown}")
        self.intermediates_heap_size = int(self.executable.intermediates_heap_size)
        self.span_args = {"inputs": {n: list(d) for n, d in dims.items()}, "heap_bytes": self.intermediates_heap_size}
        self._checked_table: tuple | None = None  # the last argument table found valid (set_argument_table)
        self._bindings: OrderedDict[tuple, Any] = OrderedDict()
        self._bind_lock = threading.Lock()
        self._last: tuple = (None, None, None)  # (table, heap, run) of the last dispatch

    def launcher(self, table: tuple, heap: Heap):
        """What a dispatch on these tensors runs, `run(stream)`: the bound run's launch for this argument table and heap (made on
        first use and kept for the last `BINDINGS` tables; see runtime/bound.py), or for executables that
        cannot be bound a full run that copies in and out. `table` is the checked ((name, TensorData), ...)
        in input-then-output order."""
        last = self._last
        if last[0] is table and last[1] is heap:
            return last[2]
        key = (id(heap), *[id(v) for _, v in table])
        with self._bind_lock:
            hit = self._bindings.get(key)
            if hit is not None:
                self._bindings.move_to_end(key)
                self._last = (table, heap, hit[0])
                return hit[0]
            fn, exe, values = self.function, self.executable, dict(table)
            feeds = {fn.input_tensor(n): values[n] for n in self.input_types}
            outputs = {fn.output_tensor(n): values[n] for n in self.output_types}
            names = {**{fn.input_tensor(n): n for n in self.input_types}, **{fn.output_tensor(n): n for n in self.output_types}}
            bound = exe.bind(feeds, outputs, heap.data, names, checked=True)  # set_argument_table checked them
            if bound is not None:
                run = bound.launch
            else:
                def run(stream=None):
                    with using(stream):
                        exe.run(feeds, outputs=outputs, heap=heap.data)
            # the key's objects stay alive with the entry, so their ids cannot be reused meanwhile
            self._bindings[key] = (run, heap, table)
            while len(self._bindings) > BINDINGS:
                self._bindings.popitem(last=False)
            self._last = (table, heap, run)
            return run

    def release_bindings(self) -> None:
        """Forget the bound runs (and with them the references they hold to argument tensors and heaps)."""
        with self._bind_lock:
            self._bindings.clear()
            self._last = (None, None, None)

    def _install_package_kernels(self, dev: Device, use: bool) -> str:
        """Put the package's compiled kernels for this machine where the compile will find them; the note
        says that they serve this pipeline, or why it compiles here."""
        package = getattr(self.function, "package", None)
        if package is None:
            return "compiled here (the function belongs to no package)"
        if not use:
            return "compiled here: the descriptor's use_package_kernels is off"
        note, level = package.install_kernels(self.function.name, self.input_dimensions, dev.torch_device)
        if level is not None:
            log.log(level, "pipeline %s: %s", self.label, note)
        return note

    @property
    def output_shapes(self) -> dict[str, tuple[int, ...]]:
        return {n: t.shape for n, t in self.output_types.items()}

    def __repr__(self) -> str:
        return (f"MLPipeline({self.label!r} on {self.device.name}, inputs {self.input_dimensions}, "
                f"heap {self.intermediates_heap_size} bytes)")


class Compiler:
    """Makes ML pipelines on a device (MTL4Compiler)."""

    def __init__(self, dev: Device):
        self.device = dev

    def new_ml_pipeline(self, desc: MLPipelineDescriptor) -> MLPipeline:
        """Compile `desc.function` for its input dimensions, through the stitching compiler."""
        return MLPipeline(desc, self.device)
