"""Heaps and shared events: the memory and the synchronisation a device makes for command buffers.

    >>> import stitchml as sm
    >>> dev = sm.device("cpu")
    >>> dev.new_heap(1024)
    Heap(1024 bytes on cpu)
    >>> e = dev.new_shared_event("frame"); e.signal(2); e.signaled_value
    2
"""
from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch

from .. import dtypes
from ..errors import PipelineError
from ..tensor_data import TensorData

if TYPE_CHECKING:
    from .device import Device


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
        self._users: list[weakref.ref] = []  # that queue's buffers that dispatch on it (weak: dead ones pruned)
        self._prune_at = 64
        self._lock = threading.Lock()

    def _claim(self, cb) -> None:
        """Record that command buffer `cb` dispatches on this heap; refuse while another queue's buffer
        that uses it is not completed. O(1) (amortized) while one queue keeps using it."""
        with self._lock:
            users = self._users
            if self._queue is not cb.queue:
                for ref in users:
                    other = ref()
                    if other is not None and not other._work_done():
                        raise PipelineError(
                            f"dispatch_network: {self!r} is in use by command buffer {other.label!r} on queue "
                            f"{other.queue.label!r} ({other._status}, not completed); command buffer {cb.label!r} "
                            f"on queue {cb.queue.label!r} cannot use it until that one completes: wait for it, or "
                            f"give each queue its own heap")
                users.clear()
                self._queue = cb.queue
            users.append(weakref.ref(cb))
            if len(users) > self._prune_at:  # the buffers gone since; the bound doubles past the live ones
                users[:] = [r for r in users if r() is not None]
                self._prune_at = max(64, 2 * len(users))

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
