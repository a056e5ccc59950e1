"""Bound runs: an executable tied to fixed caller memory, launched with no per-run host work.

`Executable.bind(feeds, outputs, heap)` places every feed, output and
intermediate once: the kernels read the caller's input tensors and write the
caller's output tensors where they are (zero copy), intermediates live in the
caller's heap. `launch()` then allocates nothing and checks nothing:

* the first launch runs the pre-bound steps (it also warms the kernels up);
* on CUDA the second launch captures the steps as a CUDA graph over these
  pointers and every launch after that is one graph launch (a few
  microseconds of host time whatever the network's size; on a given
  stream a direct cudaGraphLaunch, runtime/cudart.py).

Capturing on the second launch, not the first, means memory used once (a
fresh input every call) never pays for a capture. Where the caller's memory
cannot be used as is, the bound run stages it in buffers made at bind time
and copies in the launch (recorded in the graph too): an input that is not
contiguous, an output that is not contiguous, that overlaps an input, or
that the last step leaves in library memory (a cuDNN convolution result).

The feeds' and outputs' shapes, dtypes and devices are checked at bind
time, unless the caller has checked them already (`bind(..., checked=True)`:
an ML pipeline's argument table). Executables that read or assign variables, draw random numbers or run in
poison mode are not bindable (`Executable.bindable`); `Executable.bind`
returns None for them and callers use `Executable.run`. A bound run uses only
the executable's public interface: how a run is laid out (`feed_slots`,
`output_buffers`, `result_slots`, `environment`) and how its steps run
(`run_steps`, `check_flag`, `flags_divisions`, `run_lock`).
"""
from __future__ import annotations

import os

import torch

from ..errors import ExecutionError, GraphError
from ..ir import built_at
from . import cudart
from .cudart import using


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The byte range [start, end) that `t` addresses."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two byte ranges [start, end) share a byte."""
    return a[0] < b[1] and b[0] < a[1]


class BoundRun:
    """One executable on fixed feed, output and heap tensors; see the module docstring."""

    def __init__(self, exe, feeds: dict, outputs: dict, arena: torch.Tensor, names: dict, checked: bool = False):
        self.exe = exe
        env = exe.environment(arena)
        self.stage_in: list[tuple[torch.Tensor, torch.Tensor]] = []  # (bound buffer, caller's tensor)
        inputs = []
        for key, slot, shape, dtype, name in exe.feed_slots:
            t, name = feeds[key], names.get(key, name)
            if not checked and (tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != exe.device):
                raise GraphError(f"bind: feed {name} must be {tuple(shape)} {dtype} on {exe.device}, "
                                 f"got {tuple(t.shape)} {t.dtype} on {t.device}")
            if t.is_contiguous():
                env[slot] = t
            else:
                env[slot] = torch.empty(shape, dtype=dtype, device=exe.device)
                self.stage_in.append((env[slot], t))
            inputs.append(byte_span(t))
        output_slots = {slot for slot, _, _ in exe.output_buffers}
        for slot, shape, dtype in exe.output_buffers:
            env[slot] = torch.empty(shape, dtype=dtype, device=exe.device)
        self.results: list[tuple[int, torch.Tensor]] = []  # (slot, caller's tensor): copied unless it is the slot
        placed = []
        for (user, slot, _), t in zip(exe.result_slots, exe.program.outputs):
            dst, name = outputs[user], names.get(user, user.name)
            if not checked and (dst.device != exe.device or tuple(dst.shape) != tuple(t.shape)
                                or dst.dtype != t.dtype.torch):
                raise GraphError(f"bind: output {name} must be {tuple(t.shape)} {t.dtype} on {exe.device}, "
                                 f"got {tuple(dst.shape)} {dst.dtype} on {dst.device}")
            span = byte_span(dst)
            for other in placed:
                if spans_overlap(span, other):
                    raise GraphError(f"bind: output {name} shares memory with another output")
            placed.append(span)
            if (slot in output_slots and dst.is_contiguous() and not any(spans_overlap(span, s) for s in inputs)
                    and not any(r is dst for _, r in self.results)):
                env[slot] = dst  # the kernel that makes it writes the caller's memory
                output_slots.discard(slot)
            self.results.append((slot, dst))
        self.env = env
        self.keep = (feeds, outputs, arena)  # the captured pointers stay valid while this run exists
        self.launches = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.capture_error: str | None = None
        self._can_capture = exe.device.type == "cuda" and os.environ.get("STITCHML_CUDA_GRAPHS", "1") != "0"
        self._lock = exe.run_lock  # its steps use the executable's arena when no heap is given
        self._direct = None  # the direct-call runtime, once there is a graph to launch
        self._exec = 0
        self._capturing = False  # while capturing, the steps must not read the division flag

    def launch(self, stream: torch.cuda.Stream | None = None) -> None:
        """Run once on `stream` (None: the current stream); see the module docstring.

        A launch that runs the steps raises an `ExecutionError` naming the failing op; one that replays
        the recorded graph does not wait for the device, so a zero integer divisor it meets is raised
        by `check()` (a command buffer calls it when its work is done)."""
        rt = self._direct
        if rt is not None and stream is not None:
            code = rt.graph_launch(self._exec, stream.cuda_stream)
            if code:
                self._replay_failed(f"cudaGraphLaunch failed: CUDA error {code}")
            return
        with using(stream):
            graph = self.graph
            if graph is not None:
                try:
                    graph.replay()
                except RuntimeError as e:
                    self._replay_failed(e)
                return
            with self._lock:
                if self.graph is None and self.launches >= 1 and self._can_capture:
                    self._capture()
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self._steps()
                self.launches += 1

    def _steps(self) -> None:
        env = self.env
        for bound, caller in self.stage_in:
            bound.copy_(caller)
        self.exe.run_steps(env, check_flag=not self._capturing)
        for slot, dst in self.results:
            if env[slot] is not dst:
                dst.copy_(env[slot])

    def check(self) -> None:
        """Raise the ExecutionError of an integer division by zero that a replayed launch met (reads one
        int from the device: call it once the launches are done); a no-op for runs that divide no integers."""
        self.exe.check_flag(self.env)

    @property
    def needs_check(self) -> bool:
        """Whether `check()` can raise (a kernel flags integer divisions); callers skip it otherwise."""
        return self.exe.flags_divisions

    def _replay_failed(self, error) -> None:
        ops = ", ".join(built_at(op) for s in self.exe.steps for op in s.ops)
        raise ExecutionError(f"a replay of the bound run of {ops} failed: {error}")

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.exe.device)
        try:
            current.synchronize()
            self._capturing = True
            with cudart.capture(graph):
                self._steps()
        except Exception as e:  # noqa: BLE001  (a step that syncs with the host cannot be captured)
            self._can_capture = False
            self.capture_error = repr(e)
            return
        finally:
            self._capturing = False
        self.graph = graph
        self._direct = cudart.runtime()  # later launches on a given stream call cudaGraphLaunch directly
        if self._direct is not None:
            self._exec = graph.raw_cuda_graph_exec()

    @property
    def zero_copy(self) -> bool:
        """Whether the launch reads every input and writes every output in the caller's memory."""
        return not self.stage_in and all(self.env[slot] is dst for slot, dst in self.results)
