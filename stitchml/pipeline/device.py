"""Devices: Metal 4's device object, in snake_case, which makes queues, heaps, events and tensors.

    >>> import stitchml as sm
    >>> dev = sm.device("cpu")
    >>> dev.new_tensor((2, 3), sm.float32).shape
    (2, 3)

A `Device` stands for one torch device (the CPU, or one CUDA GPU). The
objects it makes live beside it: heaps and shared events in
pipeline/resources.py, command queues in pipeline/commands.py; ML pipelines
and their compiler in pipeline/ml.py (their names are importable from here
too).
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from ..errors import PipelineError
from ..tensor_data import TensorData, resolve_device
from .commands import CommandQueue
from .ml import BINDINGS, Compiler, MLPipeline, MLPipelineDescriptor
from .resources import Heap, SharedEvent

__all__ = ["BINDINGS", "Compiler", "Device", "Heap", "MLPipeline", "MLPipelineDescriptor", "SharedEvent", "device"]


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

    def new_command_queue(self, label: str = "", timestamps: bool = False) -> CommandQueue:
        """A queue (a CUDA stream). `timestamps=True` times every command on the GPU with CUDA events
        (about 2.5 us of host time per command: a profiling setting); otherwise a GPU command buffer's
        timeline gives the times the host enqueued each command."""
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
