"""Executable: a graph compiled for one input signature.

`Graph.compile(feeds={placeholder: TensorType}, targets, target_ops, device)`
runs the pass pipeline (passes/__init__.py) and returns an Executable:

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((4,), sm.float32, name="x")
    >>> exe = g.compile({x: sm.TensorType((4,), sm.float32)}, [g.exponent(x)], device="cpu")
    >>> exe.intermediates_heap_size
    0

A run binds the feeds, the variables' storage, the constants and the arena
(the caller's `heap`, or one the executable keeps) to value slots, runs the
pre-bound steps, then writes the assigned variables (end-of-run semantics,
docs/semantics.md). Runs hold the graph's run lock throughout, so runs of
any executables of one graph, and its eager runs, never interleave. On CUDA, once a run has warmed the kernels up, the whole
run is captured as a CUDA graph and later runs replay it. A run that is its steps alone (a one-kernel CUDA
executable, most CPU ones) is prepared after the first instead (`_Prepared`): later runs check the feeds
against a fixed key and launch, with no per-run binding.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..codegen.common import NO_FLAG
from ..errors import ExecutionError, FeedError, GraphError
from ..ir import Operation, Tensor
from .steps import built_at, failure, raise_flagged, run_steps
from ..tensor_data import TensorData
from . import cudart, native_run


@dataclass(frozen=True)
class Signature:
    """What an executable is compiled for (MPSGraph compiles per unique input types)."""

    feeds: tuple[tuple[int, str, tuple[int, ...], str], ...]  # (placeholder op id, name, shape, dtype)
    targets: tuple[int, ...]
    target_ops: tuple[int, ...]
    device: str
    buckets: tuple = ()  # bucketed runs: the rules ((placeholder op id, axis, rule), ...); feeds hold bucket sizes
    options: tuple = ()  # the compile options, as sorted (name, repr(value)) pairs (`allow_tf32`...)

    def __post_init__(self) -> None:
        # hashed once: Graph.run's cache looks its executable up by signature on every run
        object.__setattr__(self, "_hash", hash((self.feeds, self.targets, self.target_ops, self.device,
                                                self.options)))

    def __hash__(self) -> int:
        return self._hash

    def describe_change(self, other: "Signature") -> str:
        """Which part of the signature differs from `other` (for recompile explanations)."""
        if self.device != other.device:
            return f"device {other.device} -> {self.device}"
        if self.targets != other.targets or self.target_ops != other.target_ops:
            return "targets or target operations changed"
        if self.buckets != other.buckets:
            return "bucket rules changed"
        if self.options != other.options:
            return f"options {dict(other.options)} -> {dict(self.options)}"
        mine = {f[0]: f for f in self.feeds}
        theirs = {f[0]: f for f in other.feeds}
        for key in sorted(set(mine) | set(theirs)):
            a, b = theirs.get(key), mine.get(key)
            if a != b:
                name = (b or a)[1]
                if a is None or b is None:
                    return f"feed {name} {'added' if a is None else 'removed'}"
                return f"feed {name}: {a[3]}{list(a[2])} -> {b[3]}{list(b[2])}"
        return "no change"

    def describe(self) -> str:
        """The feeds' types, as the compile log names a signature: "x: float32[3, 8], y: int64[3]"."""
        return ", ".join(f"{name}: {dtype}{list(shape)}" for _, name, shape, dtype in self.feeds) or "(no feeds)"


class FeedSlot(NamedTuple):
    """Where a run puts one feed: the user graph's placeholder, its slot, and the shape and dtype compiled for."""

    placeholder: Tensor
    slot: int
    shape: torch.Size
    dtype: torch.dtype
    name: str


class ResultSlot(NamedTuple):
    """Where a run finds one target's value: the slot, and whether the slot holds a variable's or
    constant's own memory (a result must be a copy of it)."""

    target: Tensor
    slot: int
    held: bool


class Executable:
    """A compiled run of one graph; see the module docstring.

    Besides `run`, `bind` and the reports, an executable shows how a run is laid
    out, for runners of their own (bound runs, runtime/bound.py): `slot_count`,
    `feed_slots`, `output_buffers`, `result_slots`, `environment(arena)`,
    `run_steps(env)` and `check_flag(env)`, `run_lock`, `bindable`.
    """

    def __init__(self, graph, program, ctx, signature: Signature, targets: list[Tensor]):
        self.graph = graph
        self.program = program
        self.signature = signature
        self.device = ctx.device
        self.backend = ctx.backend
        launch = ctx.launch_plan
        self.steps = launch.steps
        self.plan = ctx.memory_plan
        self.compile_times = dict(ctx.timings)
        self._report = ctx.fusion_report
        self.boundaries: list[dict] = ctx.boundaries  # {producer, consumer, tensor, reason} per edge between steps
        self._poison = bool(ctx.options.get("poison"))
        slots = launch.slots
        self._nslots = launch.nslots
        self._checks, self._flag_slot = launch.checks, launch.flag_slot  # integer divisions kernels flag
        self._feeds: list[tuple[int, int, tuple, torch.dtype, str]] = []  # (user op id, slot, shape, dtype, name)
        self._variables: list[tuple[int, int]] = []  # (user variable op id, slot)
        self._constants: list[tuple[int, torch.Tensor]] = []
        self._assigns: list[tuple[int, int]] = []
        self._in_place: list[tuple[int, int]] = []  # (user variable op id, slot of the value written into it)
        for op in program.operations:
            if op.op == "placeholder":
                t = op.outputs[0]
                self._feeds.append((op.attrs["source"], slots[t.id], t.shape, t.dtype.torch, t.name))
            elif op.op == "variable":
                self._variables.append((op.attrs["source"], slots[op.outputs[0].id]))
            elif op.op == "constant":
                self._constants.append((slots[op.outputs[0].id], op.attrs["value"].to(self.device)))
            elif op.op == "assign_variable":
                if op.inputs[1].id in self.plan.in_place:  # the kernel writes the variable itself
                    self._in_place.append((op.inputs[0].op.attrs["source"], slots[op.inputs[1].id]))
                else:
                    self._assigns.append((op.inputs[0].op.attrs["source"], slots[op.inputs[1].id]))
        if self._flag_slot is not None:  # bound like a constant on every path: runs, replays, captures
            self._constants.append((self._flag_slot, torch.full((1,), NO_FLAG, dtype=torch.int32, device=self.device)))
        self._buffers = []  # (slot, offset, nbytes, dtype, shape) for arena buffers
        self._outputs = []  # (slot, shape, dtype) allocated per run
        scratch_of = {v: k for k, v in self.plan.scratch.items()}
        for b in self.plan.buffers.values():
            if b.kind in ("vendor", "variable"):
                continue
            slot = launch.scratch_slots[scratch_of[b.id]] if b.kind == "scratch" else slots[b.id]
            if b.kind == "output":
                self._outputs.append((slot, b.shape, b.dtype))
            else:
                self._buffers.append((slot, b.offset, b.nbytes, b.dtype, b.shape))
        held = {slots[op.outputs[0].id] for op in program.operations if op.op in ("variable", "constant")}
        self._results = [ResultSlot(user, slots[t.id],
                                    slots[t.id] in held or self.plan.place[t.id][0] in ("variable", "constant"))
                         for user, t in zip(targets, program.outputs)]
        # Slots backed by a variable's storage, which assignments overwrite in place: results and
        # assigned values read from them are taken before any assignment (reads see the run's start).
        variable_slots = {slots[t.id] for op in program.operations for t in op.outputs
                          if self.plan.place.get(t.id, ("",))[0] == "variable"}
        self._assign_reads = {slot for _, slot in self._assigns if slot in variable_slots}
        self._results_read_variables = any(slot in variable_slots for _, slot, _ in self._results)
        self._feed_keys = [FeedSlot(_op(graph, source).outputs[0], slot, torch.Size(shape), dtype, name)
                           for source, slot, shape, dtype, name in self._feeds]
        self._arena: torch.Tensor | None = None
        self._bound_arena_ptr = None
        self._bound: list = []
        # The graph's run lock, not one of our own: every executable of the graph, its eager runs and
        # its bound runs read and write the same variables, run_count and (here) this arena.
        self._lock = graph._run_lock
        self._graph_state = None  # a _CapturedRun, made after the first run
        self._capture_ok = None
        self._template = None  # slots of constants and arena buffers, bound once
        self._fresh_outputs = None  # {target: (slot, shape, dtype)} of targets a run allocates (caller outputs)
        self._prepared: _Prepared | None = None  # the plain run prepared once, after the first (class _Prepared)
        # the device as `Tensor.get_device` numbers it (-1: the CPU), for the feeds' cheap check; None: unknown
        self._device_index = -1 if self.device.type == "cpu" else self.device.index
        self.runs = 0
        self.last_profile: list[tuple[str, str, float]] = []
        self.capture_error: str | None = None

    # -- reports ---------------------------------------------------------------
    @property
    def intermediates_heap_size(self) -> int:
        """Bytes of arena the intermediates need (a caller's heap must be at least this large)."""
        return self.plan.arena_size

    @property
    def kernel_count(self) -> int:
        return sum(1 for s in self.steps if s.kind != "view")

    def fusion_report(self) -> str:
        """Each kernel with the ops inside it, and why each unfused neighbour stayed out."""
        lines = []
        for entry in self._report:
            if "note" in entry:  # a line of a pass before stitching (attention)
                lines.append(entry["note"])
                continue
            lines.append(f"kernel {entry['kernel']} ({entry['template']}): {', '.join(entry['ops'])}")
            for who, why in entry["not_fused"]:
                lines.append(f"    not fused: {who}: {why}")
        for s in self.steps:
            if s.kind in ("vendor", "view"):
                lines.append(f"{s.kind} {s.name}")
        for b in self.boundaries:
            lines.append(f"boundary {b['producer']} -> {b['consumer']} ({b['tensor']}): {b['reason']}")
        return "\n".join(lines)

    def profile(self, feeds: dict | None = None, repeats: int = 5):
        """Per step: time, bytes and FLOPs (from the IR), achieved bandwidth and FLOP/s and their fractions
        of the device's measured limits, sorted by the time left on the table (runtime/roofline.py)."""
        from .roofline import profile

        return profile(self, feeds, repeats)

    def kernel_sources(self) -> dict[str, str]:
        """Generated Triton source of every kernel, by kernel name."""
        return {s.name: s.source for s in self.steps if s.source}

    @property
    def fusion_entries(self) -> list[dict]:
        """The stitcher's record of every kernel, in order: `kernel` (its index), `template`, `ops` (each
        "op (name)") and `not_fused` ((neighbour, reason) pairs); `fusion_report()` is its text form."""
        return [dict(entry) for entry in self._report if "note" not in entry]  # notes: fusion_report()'s

    # -- the layout of a run, for runners of their own (runtime/bound.py) ---------------------------------
    @property
    def slot_count(self) -> int:
        """The length of a run's environment list of value slots."""
        return self._nslots

    @property
    def feed_slots(self) -> list[FeedSlot]:
        """Every feed a run needs, in slot order of the placeholders."""
        return list(self._feed_keys)

    @property
    def output_buffers(self) -> list[tuple[int, torch.Size, torch.dtype]]:
        """(slot, shape, dtype) of the buffers a run allocates fresh for its outputs."""
        return list(self._outputs)

    @property
    def result_slots(self) -> list[ResultSlot]:
        """Every target's slot, in the order of the compiled targets (`program.outputs`)."""
        return list(self._results)

    @property
    def prepares_runs(self) -> bool:
        """Whether plain runs (own arena, current stream) after the first take the prepared path: the
        run is its steps alone (no variables, no integer-division flag, no poison, no CUDA-graph replay)."""
        return _Prepared.applies(self)

    @property
    def run_lock(self):
        """The graph's run lock: runs of any executable of one graph and its eager runs never interleave."""
        return self._lock

    @property
    def bindable(self) -> bool:
        """Whether runs can be bound to fixed memory: no variables read or assigned, no random draws,
        not in poison mode (runtime/bound.py)."""
        return not (self._variables or self._in_place or self._assigns or self._poison
                    or any(op.primitive.kind == "random" for op in self.program.operations))

    def environment(self, arena: torch.Tensor) -> list:
        """A fresh environment with the constants and the arena buffers (typed views of `arena`) bound."""
        env: list = [None] * self._nslots
        for slot, value in self._constants:
            env[slot] = value
        for slot, view in self._arena_views(arena):
            env[slot] = view
        return env

    def run_steps(self, env: list, check_flag: bool = True) -> None:
        """Run the steps over a bound `env`; a failing step raises the ExecutionError naming its ops, and
        (with `check_flag`) a zero integer divisor a kernel flagged is raised at the end."""
        run_steps(self.steps, env, self._checks, self._flag_slot, check_flag=check_flag)

    @property
    def flags_divisions(self) -> bool:
        """Whether kernels flag integer divisions by zero in the environment (`check_flag` reads the flag)."""
        return self._flag_slot is not None

    def check_flag(self, env: list) -> None:
        """Raise the ExecutionError of an integer division by zero a kernel flagged in `env` (reads one int
        from the device); a no-op for executables that divide no integers."""
        if self._flag_slot is not None:
            raise_flagged(env, self._checks, self._flag_slot)

    # -- running -----------------------------------------------------------------
    def _feed_env(self, env: list, feeds: dict | None) -> None:
        feeds = feeds or {}
        for key, slot, shape, dtype, name in self._feed_keys:
            value = feeds.get(key)
            if value is None:
                raise FeedError(f"the executable needs a feed for placeholder {name}")
            kind = type(value)
            t = value if kind is torch.Tensor else value._t if kind is TensorData else TensorData(value).torch()
            if t.dtype != dtype or t.shape != shape:
                got = f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
                raise FeedError(f"feed for placeholder {name}: the executable was compiled for {tuple(shape)} "
                                f"{str(dtype).replace('torch.', '')}, got {got}; compile again for it")
            if t.device != self.device:
                t = t.to(self.device)
            env[slot] = t if t.is_contiguous() else t.contiguous()
        if len(feeds) > len(self._feed_keys):
            for key in feeds:
                if not isinstance(key, Tensor) or key.graph is not self.graph or key.op.op != "placeholder":
                    raise FeedError(f"feed keys must be placeholders of the compiled graph, got {key!r}")

    def _storage(self, source: int) -> torch.Tensor:
        """A variable's value tensor, moved to this device (contiguous) if it lives elsewhere."""
        values = self.graph._variable_values
        v = values.get(source)
        if v is None:
            v = _op(self.graph, source).attrs["initial_value"].clone()
        if v.device != self.device or not v.is_contiguous():
            v = v.to(self.device).contiguous()
        values[source] = v
        return v

    def _variable_env(self, env: list) -> None:
        for source, slot in self._variables:
            env[slot] = self._storage(source)
        for source, slot in self._in_place:
            env[slot] = self._storage(source)

    def _bind(self, env: list, arena: torch.Tensor) -> None:
        """Fill the slots of variables, constants, arena buffers and fresh outputs."""
        self._variable_env(env)
        for slot, value in self._constants:
            env[slot] = value
        self._bind_arena(env, arena)
        for slot, shape, dtype in self._outputs:
            env[slot] = torch.empty(shape, dtype=dtype, device=self.device)

    def _arena_for(self, heap) -> torch.Tensor:
        if heap is not None:
            t = heap.torch() if isinstance(heap, TensorData) else heap
            if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() < self.intermediates_heap_size or \
                    t.device != self.device:
                raise GraphError(f"heap: expected a 1-D uint8 buffer of at least {self.intermediates_heap_size} "
                                 f"bytes on {self.device}, got {tuple(t.shape)} {t.dtype} on {t.device}")
            return t
        if self._arena is None:
            self._arena = torch.empty(max(self.intermediates_heap_size, 1), dtype=torch.uint8, device=self.device)
        return self._arena

    def _arena_views(self, arena: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(slot, typed view of `arena`) for every arena buffer of the plan."""
        return [(slot, arena[off:off + n].view(dtype).view(shape)) for slot, off, n, dtype, shape in self._buffers]

    def _bind_arena(self, env: list, arena: torch.Tensor) -> None:
        if not self._buffers:
            return
        if self._bound_arena_ptr != arena.data_ptr():
            self._bound = self._arena_views(arena)
            self._bound_arena_ptr = arena.data_ptr()
        for slot, view in self._bound:
            env[slot] = view
        if self._poison:
            arena.view(torch.uint8).fill_(0xFF)  # NaN in every float type: unwritten reads show up

    def run(self, feeds: dict | None = None, outputs: dict | None = None, heap: Any = None,
            stream: Any = None, profile: bool = False) -> dict[Tensor, TensorData]:
        """Run once; returns {target: TensorData}. `outputs` maps targets to caller buffers to fill: a
        contiguous buffer of the target's shape, dtype and device is written by the kernels themselves (no
        copy, no allocation; it must not overlap a feed), anything else receives a copy.

        With `profile=True` the run executes step by step (no graph replay) and
        `last_profile` lists (step, kind, milliseconds).
        """
        if heap is None and stream is None and not profile:
            prepared = self._prepared
            if prepared is not None:  # feeds, outputs and steps checked against what was prepared; None: a miss
                result = prepared(feeds, outputs)
                if result is not None:
                    return result
            if not self._poison:
                result = self._run_plain(feeds, outputs)
                if result is not None:
                    return result
        with self._lock, cudart.using(stream):
            arena = self._arena_for(heap)
            if not profile and self._graph_state is not None and self._graph_state.fits(self, arena):
                return self._replay(feeds, outputs)
            env = [None] * self._nslots
            self._feed_env(env, feeds)
            self._bind(env, arena)
            timer = _StepTimer(self.device) if profile else None
            step = None
            try:
                for step in self.steps:
                    zones = self._guard_zones(arena, step) if self._poison else ()
                    for zone in zones:
                        zone.fill_(0xFF)
                    if timer:
                        timer.start()
                    step.run(env)
                    if timer:
                        timer.stop(step)
                    for zone in zones:
                        if bool((zone != 0xFF).any()):
                            raise GraphError(f"{step.name} wrote past the end of its output buffer")
            except Exception as e:
                raise failure(step, e, env, self._checks, self._flag_slot) from e
            if self._flag_slot is not None:
                raise_flagged(env, self._checks, self._flag_slot)
            if timer:
                self.last_profile = timer.results()
            return self._finish(env, outputs, arena)

    def _run_plain(self, feeds: dict | None, outputs: dict | None = None) -> dict[Tensor, TensorData] | None:
        """The common case (own arena, current stream), with as little host work as possible: the feeds'
        checks, fresh outputs or the caller's bound in their place, the steps. None when `outputs` holds a
        buffer the kernels cannot write directly (`run` then copies into it)."""
        with self._lock:
            state = self._graph_state
            if state is not None and state.fits(self, self._arena_for(None)):
                return self._replay(feeds, outputs)
            env = self._template
            if env is None:
                env = [None] * self._nslots
                for slot, value in self._constants:
                    env[slot] = value
                self._bind_arena(env, self._arena_for(None))
                self._template = env
            env = env.copy()
            if not self._feed_fast(env, feeds):
                self._feed_env(env, feeds)
            if self._variables or self._in_place:
                self._variable_env(env)
            if outputs and not self._bind_outputs(env, outputs):
                return None
            device = self.device
            for slot, shape, dtype in self._outputs:
                if env[slot] is None:
                    env[slot] = torch.empty(shape, dtype=dtype, device=device)
            run_steps(self.steps, env, self._checks, self._flag_slot)
            if self._prepared is None and _Prepared.applies(self):  # the kernels have launched once: prepare
                self._prepared = _prepare(self)
            if outputs:
                return self._finish(env, None, self._arena_for(None))
            result = {}  # _collect without caller buffers
            wrap = TensorData._wrap
            for user, slot, held in self._results:
                v = env[slot]
                result[user] = wrap(v.clone() if held else v)
            if self._assigns:
                self._assign(env)
            self.runs += 1
            self.graph.run_count += 1
            if self._graph_state is None and self._capture_ok is not False and self._capturable:
                self._graph_state = _CapturedRun.capture(self, self._arena_for(None))
            return result

    def _feed_fast(self, env: list, feeds: dict | None) -> bool:
        """Bind feeds that are contiguous tensors of the compiled shape and dtype already on this device, as
        most are (checked with `get_device`'s int rather than a device object per feed); False, with `env`
        partly bound, for anything else, which `_feed_env` then binds or reports."""
        index = self._device_index
        if type(feeds) is not dict or len(feeds) != len(self._feed_keys) or index is None:
            return False
        for key, slot, shape, dtype, _ in self._feed_keys:
            t = feeds.get(key)
            kind = type(t)
            if kind is TensorData:
                t = t._t
            elif kind is not torch.Tensor:
                return False
            if t.dtype != dtype or t.shape != shape or t.get_device() != index or not t.is_contiguous():
                return False
            env[slot] = t
        return True

    def _bind_outputs(self, env: list, outputs: dict) -> bool:
        """Bind caller buffers as the output buffers of their targets; False when one cannot be (a target
        that is not a fresh output, or a buffer of another shape, dtype or device, or strided)."""
        fresh = self._fresh_outputs
        if fresh is None:
            planned = {slot: (shape, dtype) for slot, shape, dtype in self._outputs}
            fresh = self._fresh_outputs = {user: (slot, *planned[slot]) for user, slot, held in self._results
                                           if slot in planned and not held}
        for user, dst in outputs.items():
            found = fresh.get(user)
            t = dst._t if type(dst) is TensorData else dst
            if found is None or type(t) is not torch.Tensor or t.shape != found[1] or t.dtype != found[2] or \
                    t.get_device() != self._device_index or not t.is_contiguous() or env[found[0]] is not None:
                return False
            env[found[0]] = t
        return True

    def _finish(self, env: list, outputs: dict | None, arena: torch.Tensor) -> dict[Tensor, TensorData]:
        """Results, then the end-of-run assignments; after the first run, capture for replay."""
        result = self._collect(env, outputs)
        if self._assigns:
            self._assign(env)
        self.runs += 1
        self.graph.run_count += 1
        if self._capturable and self._graph_state is None:
            self._graph_state = _CapturedRun.capture(self, arena)
        return result

    def _assign(self, env: list) -> None:
        """Write the assigned values into the variables, in program order (end-of-run semantics).

        Values that are variables themselves are read before the first write, so a swap swaps.
        """
        values = self.graph._variable_values
        pending = [(source, env[slot].clone() if slot in self._assign_reads else env[slot])
                   for source, slot in self._assigns]
        for source, value in pending:
            values[source].copy_(value)

    @property
    def _capturable(self) -> bool:
        """Whether runs may be replayed from a CUDA graph: CUDA, several steps, no random draws, no poison,
        and no assignment that would overwrite a variable a result or another assignment still reads
        (a replay collects results after the recorded assignments)."""
        if self._capture_ok is None:
            hazard = bool(self._assigns) and (bool(self._assign_reads) or self._results_read_variables)
            # A replay assigns before the run can read a flagged zero divisor: such runs are not captured.
            hazard = hazard or (bool(self._assigns) and self._flag_slot is not None)
            self._capture_ok = (self.device.type == "cuda" and len(self.steps) > 1 and not self._poison and not hazard
                                and os.environ.get("STITCHML_CUDA_GRAPHS", "1") != "0"
                                and not any(op.primitive.kind == "random" for op in self.program.operations))
        return self._capture_ok

    def _replay(self, feeds: dict | None, outputs: dict | None) -> dict[Tensor, TensorData]:
        state = self._graph_state
        fed = [None] * self._nslots
        if not self._feed_fast(fed, feeds):
            self._feed_env(fed, feeds)
        for _, slot, *_ in self._feeds:
            state.env[slot].copy_(fed[slot])
        try:
            state.graph.replay()
        except Exception as e:  # the device reports a failure at the replay, not at the kernel that made it
            ops = ", ".join(built_at(op) for s in self.steps for op in s.ops)
            raise ExecutionError(f"a replay of the run of {ops} failed: {e}") from e
        if self._flag_slot is not None:
            raise_flagged(state.env, self._checks, self._flag_slot)
        self.runs += 1
        self.graph.run_count += 1
        return self._collect(state.env, outputs, copy_all=True)

    def _collect(self, env: list, outputs: dict | None, copy_all: bool = False) -> dict[Tensor, TensorData]:
        result = {}
        for user, slot, held in self._results:
            v = env[slot]
            if outputs and user in outputs:
                dst = outputs[user].torch() if isinstance(outputs[user], TensorData) else outputs[user]
                if tuple(dst.shape) != tuple(v.shape) or dst.dtype != v.dtype:
                    raise GraphError(f"output buffer for {user.name}: expected {tuple(v.shape)} {v.dtype}, "
                                     f"got {tuple(dst.shape)} {dst.dtype}")
                dst.copy_(v)
                result[user] = TensorData._wrap(dst)
                continue
            result[user] = TensorData._wrap(v.clone() if held or copy_all else v)
        return result

    def _guard_zones(self, arena: torch.Tensor, step) -> list[torch.Tensor]:
        """The guard zones after the arena buffers `step` writes (poison mode)."""
        zones = []
        for key in step.writes:
            b = self.plan.buffers.get(key)
            if b is not None and b.kind in ("intermediate", "scratch") and self.plan.guard:
                end = b.offset + (b.nbytes + 63) // 64 * 64 + self.plan.guard
                zones.append(arena[b.offset + b.nbytes:end])
        return zones

    def bind(self, feeds: dict, outputs: dict, heap: Any = None, names: dict | None = None, checked: bool = False):
        """A `BoundRun` of this executable on fixed caller memory (runtime/bound.py), or None when it
        cannot be bound (variables, random draws, poison mode). `feeds` maps placeholders and
        `outputs` targets to tensors (torch or TensorData); `heap` is as for `run`; `names` gives
        feeds and targets the names errors call them by (default: the tensors' names). `checked`:
        the caller has already checked every tensor's shape, dtype and device (an ML pipeline's
        argument table), so the bound run does not check them again."""
        from .bound import BoundRun

        if not self.bindable:
            return None
        unwrap = lambda v: v.torch() if isinstance(v, TensorData) else v  # noqa: E731
        missing = [name for key, _, _, _, name in self._feed_keys if key not in feeds]
        missing += [user.name for user, _, _ in self._results if user not in outputs]
        if missing:
            raise GraphError(f"bind: no tensor given for {', '.join(missing)}")
        with self._lock:
            return BoundRun(self, {k: unwrap(v) for k, v in feeds.items()},
                            {k: unwrap(v) for k, v in outputs.items()}, self._arena_for(heap), names or {}, checked)

    def run_async(self, feeds: dict | None = None, on_complete=None, **kwargs):
        """Queue a run; the handle and callback behave as Graph.run_async's."""
        from .asyncrun import submit

        return submit(self, lambda: self.run(feeds, **kwargs), on_complete)


class _Prepared:
    """A plain run prepared once, for executables whose run is their steps alone: no variables to bind or
    assign, no flag to read back, no poison, no CUDA-graph replay (CPU executables and one-kernel CUDA ones).

    Everything a run of `Executable._run_plain` works out anew is fixed here: the environment with the
    constants and arena views bound, each feed's slot and compiled (shape, dtype, device index), each
    fresh output's allocator (`new_empty_strided` of a zero-element tensor of its dtype on the device:
    no dtype or device for torch to parse, a third less host time than `torch.empty`), the result slots.
    A run checks every feed against its prepared key with the cheapest comparisons (an exact tensor type,
    the dtype, the shape, the device index, contiguity) and binds it as it is; on any miss (another
    shape, a feed to convert or move, a caller buffer the kernels cannot write) it returns None without
    having run anything, and `Executable.run` takes the general path, which converts the feed or raises
    the FeedError saying what was expected.
    """

    __slots__ = ("exe", "graph", "lock", "env", "feeds", "index", "outputs", "results", "steps", "checks")

    def __init__(self, exe: "Executable", env: list):
        self.exe, self.graph, self.lock, self.env = exe, exe.graph, exe._lock, env
        self.feeds = tuple((key, slot, shape, dtype) for key, slot, shape, dtype, _ in exe._feed_keys)
        self.index = exe._device_index
        self.outputs = tuple((slot, torch.empty(0, dtype=dtype, device=exe.device).new_empty_strided, tuple(shape),
                              _contiguous_strides(shape)) for slot, shape, dtype in exe._outputs)
        self.results = tuple(exe._results)
        self.steps, self.checks = exe.steps, exe._checks

    @staticmethod
    def applies(exe: "Executable") -> bool:
        """Whether `exe`'s plain runs can take the prepared path (see the class docstring), once a first
        run has bound its template environment."""
        return not (exe._variables or exe._in_place or exe._assigns or exe._poison or exe._capturable) and \
            exe._flag_slot is None and exe._device_index is not None

    def __call__(self, feeds: dict | None, outputs: dict | None) -> dict[Tensor, TensorData] | None:
        """One run; None (nothing run) where a feed or caller buffer misses what was prepared."""
        if type(feeds) is not dict or len(feeds) != len(self.feeds):
            return None
        env = self.env.copy()
        index = self.index
        for key, slot, shape, dtype in self.feeds:
            t = feeds.get(key)
            kind = type(t)
            if kind is not torch.Tensor:
                if kind is not TensorData:
                    return None
                t = t._t
            if t.dtype != dtype or t.shape != shape or t.get_device() != index or not t.is_contiguous():
                return None
            env[slot] = t
        if outputs and not self.exe._bind_outputs(env, outputs):
            return None
        for slot, new, shape, strides in self.outputs:
            if env[slot] is None:  # not a caller's buffer
                env[slot] = new(shape, strides)
        with self.lock:
            step = None
            try:
                for step in self.steps:
                    step.run(env)
            except Exception as e:
                raise failure(step, e, env, self.checks, None) from e
            result = {}
            for user, slot, held in self.results:  # TensorData._wrap, inlined (a call less per result)
                data = _new_data(TensorData)
                data._t = env[slot].clone() if held else env[slot]
                result[user] = data
            self.exe.runs += 1
            self.graph.run_count += 1
        return result


_new_data = object.__new__


def _prepare(exe: "Executable"):
    """The prepared run of `exe`: in C where every step is a directly launched kernel and the extension
    builds (runtime/native_run.py), else `_Prepared`."""
    prepared = _Prepared(exe, exe._template)
    try:
        return native_run.runner(exe, prepared) or prepared
    except Exception as e:  # noqa: BLE001  (a runner that cannot be made leaves the Python one, which works)
        native_run.log.warning("the prepared run of %s stays in Python: %s: %s", exe.graph.name, type(e).__name__, e)
        return prepared


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, n = [], 1
    for extent in reversed(tuple(shape)):
        strides.append(n)
        n *= max(extent, 1)
    return tuple(reversed(strides))


class _StepTimer:
    """Per-step times: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def start(self) -> None:
        if self.cuda:
            self.begin = torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop(self, step) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.marks.append((step, self.begin, end))
        else:
            self.marks.append((step, self.begin, time.perf_counter()))

    def results(self) -> list[tuple[str, str, float]]:
        if self.cuda:
            torch.cuda.synchronize()
            return [(s.name, s.kind, a.elapsed_time(b)) for s, a, b in self.marks]
        return [(s.name, s.kind, (b - a) * 1e3) for s, a, b in self.marks]


class _CapturedRun:
    """A run recorded as a CUDA graph over static feed, arena and output buffers.

    Replays are valid while the variables' storage and the arena stay where
    they were at capture; otherwise the executable runs its steps again.
    """

    def __init__(self, graph, env, arena_ptr: int, variable_ptrs: tuple):
        self.graph, self.env, self.arena_ptr, self.variable_ptrs = graph, env, arena_ptr, variable_ptrs

    def fits(self, exe: "Executable", arena: torch.Tensor) -> bool:
        values = exe.graph._variable_values
        ptrs = tuple(values[s].data_ptr() if s in values else 0 for s, _ in exe._variables + exe._in_place)
        return arena.data_ptr() == self.arena_ptr and ptrs == self.variable_ptrs

    @staticmethod
    def capture(exe: "Executable", arena: torch.Tensor) -> "_CapturedRun | None":
        env = [None] * exe._nslots
        for _, slot, shape, dtype, _ in exe._feeds:
            env[slot] = torch.empty(shape, dtype=dtype, device=exe.device)
        exe._bind(env, arena)
        values = exe.graph._variable_values
        cuda_graph = torch.cuda.CUDAGraph()
        try:
            torch.cuda.synchronize(exe.device)
            with cudart.capture(cuda_graph):
                for step in exe.steps:
                    step.run(env)
                for source, slot in exe._assigns:
                    values[source].copy_(env[slot])
        except Exception as e:  # noqa: BLE001  (a step that syncs with the host cannot be captured)
            exe._capture_ok = False
            exe.capture_error = repr(e)
            return None
        ptrs = tuple(values[s].data_ptr() for s, _ in exe._variables + exe._in_place)
        return _CapturedRun(cuda_graph, env, arena.data_ptr(), ptrs)


def _op(graph, op_id: int) -> Operation:
    for op in graph.operations:
        if op.id == op_id:
            return op
    raise GraphError(f"operation {op_id} is not in the graph")
