"""The CUDA runtime calls of a dispatch's hot path, made directly, and a cheap current-stream switch.

A packaged-network dispatch on a GPU is a CUDA-graph launch between two
timing-event records. Through torch's wrappers those cost about 5 and 3
microseconds of host time on an H200's host (benchmarks/dispatch_parts.py);
called through ctypes on the libcudart that torch itself loaded, they cost a
fraction of that. So do the completion checks a command buffer's `wait()`
makes (a query, then a synchronize only if the work still runs). The handles are the same driver objects torch made (its
events' `cuda_event`, its graphs' `raw_cuda_graph_exec()`, its streams'
`cuda_stream`), so everything else keeps going through torch.

`runtime()` is None where that library cannot be found (a CPU build, a
static or unexpected layout, a torch without raw graph handles); callers then
use torch's wrappers.
"""
from __future__ import annotations

import contextlib
import ctypes
import warnings
from typing import Any

import torch

_runtime: Any = False  # not looked up yet
NOT_READY = 600  # cudaErrorNotReady: what a query answers for work still running


class _Runtime:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.event_record = lib.cudaEventRecord
        self.graph_launch = lib.cudaGraphLaunch
        for fn in (self.event_record, self.graph_launch):
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int
        # a command buffer's completion: query first (0 done, NOT_READY running), synchronize only if running
        self.stream_query, self.stream_synchronize = lib.cudaStreamQuery, lib.cudaStreamSynchronize
        self.event_query, self.event_synchronize = lib.cudaEventQuery, lib.cudaEventSynchronize
        for fn in (self.stream_query, self.stream_synchronize, self.event_query, self.event_synchronize):
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = ctypes.c_int
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p

    def fail(self, what: str, code: int) -> None:
        message = self.lib.cudaGetErrorString(code) or b"unknown error"
        raise RuntimeError(f"{what} failed: CUDA error {code} ({message.decode(errors='replace')})")


def _loaded_cudart() -> str | None:
    """The path of the libcudart mapped into this process (the one torch uses), if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libcudart.so" in path:
                    return path
    except OSError:
        pass
    return None


def runtime() -> _Runtime | None:
    """The direct-call runtime, or None (see the module docstring)."""
    global _runtime
    if _runtime is False:
        _runtime = None
        if torch.cuda.is_available() and hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
            torch.cuda.init()
            path = _loaded_cudart()
            if path is not None:
                try:
                    _runtime = _Runtime(ctypes.CDLL(path))
                except (OSError, AttributeError):
                    _runtime = None
    return _runtime


_get_stream = getattr(torch._C, "_cuda_getCurrentStream", None)
_set_stream = getattr(torch._C, "_cuda_setStream", None)


@contextlib.contextmanager
def using(stream: torch.cuda.Stream | None):
    """Make `stream` the current stream of its device for the block (None: leave things as they are)."""
    if stream is None:
        yield
        return
    if _set_stream is None:
        with torch.cuda.stream(stream):
            yield
        return
    prev = _get_stream(stream.device_index)
    _set_stream(stream.stream_id, stream.device_index, stream.device_type)
    try:
        yield
    finally:
        _set_stream(*prev)


@contextlib.contextmanager
def capture(graph: torch.cuda.CUDAGraph):
    """`torch.cuda.graph(graph)`, quiet about a capture that enqueued nothing (a run of views only):
    replaying an empty graph is correct and costs one launch."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        with torch.cuda.graph(graph):
            yield
