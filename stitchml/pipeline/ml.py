"""ML pipelines and the compiler that makes them: Metal 4's machine-learning pipeline objects.

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((-1, 4), sm.float32, name="x")
    >>> fn = sm.package.Package.from_graph(g, {"x": x}, {"y": g.relu(x)}).function()
    >>> dev = sm.device("cpu")
    >>> desc = sm.MLPipelineDescriptor(fn); desc.set_input_dimensions("x", (2, 4))
    >>> pipeline = sm.Compiler(dev).new_ml_pipeline(desc)
    >>> pipeline.output_shapes
    {'y': (2, 4)}

A pipeline is a package function compiled for fixed input dimensions on a
device by the stitching compiler (`Graph.compile`); it knows its
`intermediates_heap_size` before anything runs, and a dispatch places the
intermediates in the caller's heap (pipeline/commands.py). The compile does
the pruning and typing: the pipeline's output types are those of the compiled
program.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import ExecutionError, PipelineError
from ..ir import TensorType
from ..runtime.cudart import using
from .cpu_run import PreparedRun

if TYPE_CHECKING:
    from .device import Device
    from .resources import Heap

log = logging.getLogger("stitchml.pipeline")
BINDINGS = 8  # argument tables (with their heap) a pipeline keeps bound runs for


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
        if self.kernel_note.startswith("using"):
            missing = fn.package.unserved_kernels(fn.name, dims, dev.torch_device, self.executable)
            if missing:
                self.kernel_note += f"; {len(missing)} not in it compile here: {', '.join(missing)}"
        self.output_types = {p.name: t.type for p, t in zip(fn.outputs, self.executable.program.outputs)}
        unknown = [f"{n}: {t}" for n, t in self.output_types.items() if not t.is_static]
        if unknown:
            raise PipelineError(f"pipeline {self.label}: output extents stay unknown for these input dimensions: {unknown}")
        self.intermediates_heap_size = int(self.executable.intermediates_heap_size)
        self.span_args = {"inputs": {n: list(d) for n, d in dims.items()}, "heap_bytes": self.intermediates_heap_size}
        self._checked_table: tuple | None = None  # the last argument table found valid (set_argument_table)
        self._bindings: OrderedDict[tuple, Any] = OrderedDict()
        self._bind_lock = threading.Lock()
        self._last: tuple = (None, None, None, None)  # (table, heap, run, check) of the last dispatch

    def launcher(self, table: tuple, heap: Heap):
        """What a dispatch on these tensors runs, `run(stream)`: the bound run's launch for this argument table and heap (made on
        first use and kept for the last `BINDINGS` tables; see runtime/bound.py), or for executables that
        cannot be bound a full run that copies in and out. `table` is the checked ((name, TensorData), ...)
        in input-then-output order."""
        return self.bound(table, heap)[0]

    def bound(self, table: tuple, heap: Heap) -> tuple:
        """(`launcher`'s run, the check to call once its work is done or None): a replayed CUDA launch meets
        a zero integer divisor on the device, and the check raises it (only for kernels that flag them)."""
        last = self._last
        if last[0] is table and last[1] is heap:
            return last[2:]
        key = (id(heap), *[id(v) for _, v in table])
        with self._bind_lock:
            hit = self._bindings.get(key)
            if hit is not None:
                self._bindings.move_to_end(key)
                self._last = (table, heap, hit[0], hit[3])
                return hit[0], hit[3]
            fn, exe, values, dev = self.function, self.executable, dict(table), self.device
            feeds = {fn.input_tensor(n): values[n] for n in self.input_types}
            outputs = {fn.output_tensor(n): values[n] for n in self.output_types}
            names = {**{fn.input_tensor(n): n for n in self.input_types}, **{fn.output_tensor(n): n for n in self.output_types}}
            bound = exe.bind(feeds, outputs, heap.data, names, checked=True)  # set_argument_table checked them
            check = None
            if bound is not None:
                run = bound.launch if dev.is_cuda else PreparedRun(bound).launch
                if dev.is_cuda and bound.needs_check:  # the CPU and full runs raise it in the run itself
                    check = bound.check
            else:
                def run(stream=None):
                    with using(stream):
                        exe.run(feeds, outputs=outputs, heap=heap.data)
            # the key's objects stay alive with the entry, so their ids cannot be reused meanwhile
            self._bindings[key] = (run, heap, table, check)
            while len(self._bindings) > BINDINGS:
                self._bindings.popitem(last=False)
            self._last = (table, heap, run, check)
            return run, check

    def release_bindings(self) -> None:
        """Forget the bound runs (and with them the references they hold to argument tensors and heaps)."""
        with self._bind_lock:
            self._bindings.clear()
            self._last = (None, None, None, None)

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
