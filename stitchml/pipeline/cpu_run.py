"""The CPU dispatch of a bound pipeline: its steps prepared once into a flat list of calls.

On the CPU a dispatch is the work itself, and at batch 1 a packaged network's steps are small: a view
costs a few microseconds of torch's Python binding, a native kernel's call as much again in reading its
slots' data pointers. A bound run (runtime/bound.py) already fixes every feed, output and intermediate
in memory, so most of that work gives the same answer every run. `PreparedRun` runs the steps once,
step by step, watching which slots each step binds, and keeps for later runs only what depends on the
data:

* a view of a slot whose tensor never changes (a feed, an arena buffer, a view of one) is made once and
  stays bound: it reads whatever the memory holds;
* a native kernel whose slots never change is called with its data pointers read once, and kernels in
  a row are one call of a small C runner over records made once (one ctypes call instead of several);
* a matrix product between such slots calls `torch.mm` or `torch.bmm` into the planned buffer (what
  `torch.matmul` calls after its shape logic), where the answer is bit for bit `torch.matmul`'s; a batched
  product small enough that PyTorch multiplies it in a loop of its own runs that loop compiled
  (codegen/cpu_product.py, `small_batched_product`), and other small products MKL's chains of multiply-adds
  compiled (codegen/cpu_product.py): native kernels, so they join their neighbours' runner call;
* a movement op run through its reference implementation (a `split`, a `reshape` of a transposed
  view), which binds fresh memory every run, copies into a buffer of its own instead, from a view of
  its input made once, with a native strided copy;
* a gather (an embedding's rows), concat or constant pad, which the native backend does not lower, runs
  as a native loop writing into a buffer made once (codegen/cpu_movement.py); an index out of range sets
  a flag that the run checks at its end, and the steps run again op by op for the reference's error;
* everything else runs as its step does, over the same environment.

The native loops made here are compiled together once the steps have been walked, and each replaces its
library call only where it gives the library's bits on the preparing run's values.

A slot is unstable when a step binds another tensor to it on every run (a library call's own result):
what reads it runs its step as is. A failing call runs the steps again op by op for the typed error that
names the op, and the next launch prepares again. A change of torch's thread count (the native kernels'
argument) prepares again too.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import threading
from typing import Callable

import torch

from ..codegen import cpu, cpu_movement, cpu_product
from ..codegen.cpu import NativeLaunch
from ..ops.contraction import _matmul_vendor
from ..registry import MOVEMENT, lookup
from ..runtime.launch import Chain, ReferenceCall, VendorCall, ViewOf
from ..runtime.native_conv import BindBuffer


# Ops run through their reference implementation that the prepared run makes native loops of (`_native_move`).
_NATIVE_MOVES = ("gather", "concat", "pad")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


# Native kernels in a row run from one call: the runner walks an array of (kernel, pointers, thread count)
# records made once. Every kernel takes data pointers then an int (codegen/cpu.py's CppSource); on x86-64
# and AArch64 a pointer argument travels the same way whatever it points to.
MAX_ARGS = 16
_RUNNER = "stitchml_run_native_calls"
_RUNNER_SOURCE = (
    "struct StitchmlCall { void* fn; long long n; long long threads; void* a[%d]; };\n"
    'extern "C" void %s(const StitchmlCall* calls, long long count, int unused) {\n'
    "    for (long long i = 0; i < count; ++i) {\n"
    "        const StitchmlCall& c = calls[i];\n"
    "        void* const* a = c.a;\n"
    "        const int t = (int)c.threads;\n"
    "        switch (c.n) {\n%s"
    "        }\n"
    "    }\n"
    "}\n") % (MAX_ARGS, _RUNNER, "".join(
        f"        case {n}: ((void (*)({'void*, ' * n}int))c.fn)({''.join(f'a[{i}], ' for i in range(n))}t); break;\n"
        for n in range(1, MAX_ARGS + 1)))


class _Call(ctypes.Structure):
    _fields_ = [("fn", ctypes.c_void_p), ("n", ctypes.c_longlong), ("threads", ctypes.c_longlong),
                ("a", ctypes.c_void_p * MAX_ARGS)]


_runner_lock = threading.Lock()
_runner: list = []  # the compiled runner, once; [None] where no compiler could make it


def _native_runner():
    """The runner function (ctypes), or None where the C++ compiler cannot build it."""
    with _runner_lock:
        if not _runner:
            module = cpu.Module()
            module.add(cpu.CppSource(_RUNNER, _RUNNER_SOURCE, "runner"))
            module.build()
            fn = module.functions.get(_RUNNER)
            if fn is not None:
                fn.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int]
            _runner.append(fn)
        return _runner[0]


class _NativeBatch:
    """Native kernels in a row with their pointers read once: one call of the runner for all of them."""

    def __init__(self, kernels: list[tuple[object, list[int], int]]):
        self.records = (_Call * len(kernels))()
        for record, (fn, pointers, threads) in zip(self.records, kernels):
            record.fn = ctypes.cast(fn, ctypes.c_void_p).value
            record.n, record.threads = len(pointers), threads
            for i, p in enumerate(pointers):
                record.a[i] = p
        self.count = len(kernels)
        self.address = ctypes.addressof(self.records)


class _Kernel(functools.partial):
    """A native kernel's call with its pointers and thread count bound (batched with its neighbours)."""


class _Binding(functools.partial):
    """A part that binds the same buffer to a slot every run: dropped where nothing else binds that slot."""


class _Pending:
    """A part to run as a native loop made for it (codegen/cpu_movement.py, cpu_product.py), compiled with the run's other such
    loops once the steps have been walked. `capture()`, called when `out` holds the library's answer, keeps
    that answer and the memory of `inputs` (later steps reuse the arena); the loop is then checked on those
    copies and replaces `fallback` only where it gives the same bits."""

    def __init__(self, source, inputs: list[torch.Tensor], out: torch.Tensor, fallback: Callable[[], object],
                 kind: str):
        self.source, self.inputs, self.out, self.fallback, self.kind = source, inputs, out, fallback, kind
        self.pointers = [t.data_ptr() for t in inputs] + [out.data_ptr()]
        self.snapshot: list = []
        self.want: torch.Tensor | None = None

    def capture(self) -> "_Pending":
        """Keep the elements each input addresses (from its first one on) and the answer in `out`."""
        if any(s < 0 for t in self.inputs for s in t.stride()) or any(t.numel() == 0 for t in self.inputs):
            return self  # not checked: the library call stays
        self.snapshot = [t.as_strided((1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())),), (1,)).clone()
                         for t in self.inputs]
        self.want = self.out.clone()
        return self

    def resolve(self, module, threads: int):
        fn = module.functions.get(self.source.name)
        if fn is None or self.want is None:
            return self.fallback
        fn.argtypes = [ctypes.c_void_p] * len(self.pointers) + [ctypes.c_int]
        got = torch.empty_like(self.want)
        fn(*[t.data_ptr() for t in self.snapshot], got.data_ptr(), threads)
        if not torch.equal(got, self.want):  # not the library's answer bit for bit: keep the library
            return self.fallback
        return _Kernel(fn, *self.pointers, threads)


class PreparedRun:
    """A `BoundRun` on the CPU whose later launches run a prepared list of calls; see the module docstring."""

    def __init__(self, bound):
        self.bound = bound
        self.exe = bound.exe
        self.calls: list[Callable[[], object]] | None = None
        self.threads = 0
        self.prepared: dict[str, int] = {}  # how many step parts each preparation took (tests, reports)
        self.flag = None  # the native gathers' index flag (ctypes), made with the first native gather
        self.labels: list[str] = []  # the op names each of `calls` runs (profiles)

    def launch(self, stream=None) -> None:
        """One run of the network (`stream` is ignored: the CPU has none)."""
        bound = self.bound
        with bound._lock:
            calls = self.calls
            if calls is None or self.threads != torch.get_num_threads():
                if bound.launches == 0:  # the first run goes through the bound run: it builds the kernels
                    bound._steps()
                else:
                    self._prepare()
            else:
                try:
                    for call in calls:
                        call()
                except Exception:
                    self.calls = None
                    bound._steps()  # raises the error naming the failing op
                    raise
                self.exe.check_flag(bound.env)
            bound.launches += 1

    def __getattr__(self, name: str):
        """The bound run's layout and state (`env`, `results`, `stage_in`, `zero_copy`, `launches`, `check`)."""
        if name == "bound":
            raise AttributeError(name)
        return getattr(self.bound, name)

    # -- preparing -----------------------------------------------------------------------------------
    def _prepare(self) -> None:
        """Run the steps once, part by part, and keep the calls later runs need."""
        bound, env = self.bound, self.bound.env
        self.threads = torch.get_num_threads()
        self.prepared = {"hoisted": 0, "native": 0, "product": 0, "copy": 0, "as_is": 0}
        calls: list[Callable[[], object]] = []
        labels: list[str] = []  # what each call does (`labels`: profiles, benchmarks/dispatch_parts.py)
        for dst, src in bound.stage_in:
            dst.copy_(src)
            calls.append(functools.partial(dst.copy_, src))
            labels.append("stage in")
        unstable: set[int] = set()
        try:
            for step in self.exe.steps:
                op = step.ops[0] if len(step.ops) == 1 else None
                parts = self._part(step.run, env, unstable, op)
                calls.extend(parts)
                labels.extend([",".join(o.op for o in step.ops)] * len(parts))
        except Exception:
            self.bound._steps()
            raise
        for slot, dst in bound.results:
            if env[slot] is dst:
                continue
            dst.copy_(env[slot])
            if slot in unstable:
                calls.append(functools.partial(_copy_slot, dst, env, slot))
            else:
                calls.append(functools.partial(dst.copy_, env[slot]))
            labels.append("result copy")
        self.exe.check_flag(env)
        kept = [i for i, c in enumerate(calls) if not (type(c) is _Binding and c.func.slot not in unstable)]
        calls, labels = self._resolved([calls[i] for i in kept]), [labels[i] for i in kept]
        if self.prepared.get("native_gather"):
            calls.append(functools.partial(_check_indices, self.flag))
            labels.append("index check")
        self.calls, self.labels = self._batched(calls, labels)

    def _resolved(self, calls: list) -> list:
        """`calls` with the native loops made for parts compiled (one module) and put in their place."""
        pending = [c for c in calls if type(c) is _Pending]
        if not pending:
            return calls
        module, names = cpu.Module(), set()
        for c in pending:
            if c.source.name not in names:
                names.add(c.source.name)
                module.add(c.source)
        module.build()
        out = []
        for c in calls:
            if type(c) is _Pending:
                key = f"native_{c.kind}"
                c = c.resolve(module, self.threads)
                if type(c) is _Kernel:
                    self.prepared[key] = self.prepared.get(key, 0) + 1
            out.append(c)
        return out

    def _batched(self, calls: list, labels: list[str]) -> tuple[list, list[str]]:
        """`calls` with each run of native kernels made one call of the runner, and their `labels` (a
        runner's: its kernels' labels joined by " | ")."""
        runner = _native_runner() if sum(type(c) is _Kernel for c in calls) > 1 else None
        out: list = []
        out_labels: list[str] = []
        row: list = []
        row_labels: list[str] = []
        self.batches = []  # the records the runner reads stay alive with this run
        for c, label in zip(calls + [None], labels + [""]):
            if runner is not None and type(c) is _Kernel and len(c.args) - 1 <= MAX_ARGS:
                row.append(c)
                row_labels.append(label)
                continue
            if len(row) > 1:
                batch = _NativeBatch([(k.func, list(k.args[:-1]), k.args[-1]) for k in row])
                self.batches.append(batch)
                out.append(functools.partial(runner, batch.address, batch.count, 0))
                out_labels.append(" | ".join(row_labels))
                self.prepared["batched"] = self.prepared.get("batched", 0) + len(row)
            else:
                out.extend(row)
                out_labels.extend(row_labels)
            row, row_labels = [], []
            if c is not None:
                out.append(c)
                out_labels.append(label)
        return out, out_labels

    def _part(self, fn, env: list, unstable: set[int], op) -> list[Callable[[], object]]:
        """Run `fn(env)`, part of the step computing `op` (None: several ops), once; the calls that redo it
        in later runs (none for a view made once)."""
        if type(fn) is Chain:
            return [c for inner in fn.fns for c in self._part(inner, env, unstable, None)]
        kind = type(fn)
        if issubclass(kind, ViewOf) and fn.src not in unstable:  # also SameSourceView, the CPU's views
            fn(env)
            if _storage(env[fn.dst]) == _storage(env[fn.src]):  # a view: it reads the memory as it is
                self.prepared["hoisted"] += 1
                return []
            unstable.add(fn.dst)  # a copy after all (a reshape of a strided tensor): redone every run
            return self._as_is(fn, env)
        if kind is ReferenceCall and op is not None and op.op in _NATIVE_MOVES and fn.context is None \
                and len(fn.outs) == 1 and not any(s in unstable for s in fn.ins):
            calls = self._native_move(fn, env, op.op)
            if calls is not None:
                self.prepared["copy"] += 1
                return calls
        if kind is ReferenceCall and op is not None and lookup(op.op).kind == MOVEMENT and fn.context is None \
                and not any(s in unstable for s in fn.ins):
            calls = self._movement(fn, env, op.op == "reshape")
            if calls is not None:
                self.prepared["copy"] += 1
                return calls
        before = list(env)
        fn(env)
        rebound = {i for i, (a, b) in enumerate(zip(before, env)) if a is not b}
        unstable |= rebound
        if kind is NativeLaunch and fn.fn is not None and fn.fn is not fn.fallback and \
                not any(s in unstable for s in fn.slots):
            self.prepared["native"] += 1
            return [_Kernel(fn.fn, *[env[s].data_ptr() for s in fn.slots], self.threads)]
        if kind is BindBuffer and not rebound and env[fn.slot] is fn.buffer:
            return [_Binding(fn, env)]
        if kind is VendorCall and fn.call is _matmul_vendor and rebound <= {fn.out_slot} and \
                not any(s in unstable for s in fn.ins):
            # a product into a buffer of its own: the planned one, or the tensor the library returned this
            # time (a product with no planned buffer, an epilogue's input), kept bound for every later run
            call = _product(env[fn.ins[0]], env[fn.ins[1]], env[fn.out_slot])
            if call is not None:
                unstable.discard(fn.out_slot)
                self.prepared["product"] += 1
                return [call]
        return self._as_is(fn, env)

    def _as_is(self, fn, env: list) -> list[Callable[[], object]]:
        self.prepared["as_is"] += 1
        return [functools.partial(fn, env)]

    def _native_move(self, fn: ReferenceCall, env: list, name: str) -> list[Callable[[], object]] | None:
        """A gather, concat or pad (`name`) as a native loop into a buffer made once (the planned buffer
        where the step writes into one); None where its operands are not ones the loops read."""
        args = [env[s] for s in fn.ins]
        if not args or not all(isinstance(a, torch.Tensor) for a in args):
            return None
        result = fn.impl(*args, **fn.attrs)
        if not isinstance(result, torch.Tensor) or result.element_size() not in cpu_movement.BIT_TYPES:
            return None
        slot = fn.outs[0]
        dst = env[slot] if fn.into else torch.empty(result.shape, dtype=result.dtype, device=result.device)
        if dst.shape != result.shape or dst.dtype != result.dtype or not dst.is_contiguous():
            return None
        dst.copy_(result)
        env[slot] = dst
        inputs = args
        x = args[0]
        size = x.element_size()
        key = f"{name}{[(tuple(a.shape), a.stride(), a.dtype) for a in args]}{sorted(fn.attrs.items())}".encode()
        label = f"prepared_{name}_{hashlib.sha256(key).hexdigest()[:16]}"
        if name == "gather":
            index = args[1]
            if index.dtype not in cpu_movement.INDEX_TYPES or x.dim() == 0:
                return None
            src = cpu_movement.gather(label, tuple(x.shape), x.stride(), tuple(index.shape), index.stride(),
                                      index.dtype, fn.attrs["axis"] % x.dim(), size)
            inputs = [x, index, self._index_flag()]
        elif name == "concat":
            if any(a.dtype != result.dtype for a in args):
                return None
            src = cpu_movement.concat(label, [tuple(a.shape) for a in args], [a.stride() for a in args],
                                      fn.attrs["axis"] % x.dim(), size)
        else:
            value = torch.tensor(fn.attrs["constant_value"]).to(x.dtype)
            src = cpu_movement.pad(label, tuple(x.shape), x.stride(), tuple(fn.attrs["left"]),
                                   tuple(fn.attrs["right"]), value)
        fallback = functools.partial(_reference_into, fn.impl, args, fn.attrs, dst)
        return [_Pending(src, inputs, dst, fallback, name).capture()]

    def _index_flag(self) -> torch.Tensor:
        """The int32 the native gathers set on an index out of range (checked once at the end of a run)."""
        if self.flag is None:
            self.flag = (ctypes.c_int32 * 1)()
            self.flag_tensor = torch.frombuffer(self.flag, dtype=torch.int32)
        return self.flag_tensor

    def _movement(self, fn: ReferenceCall, env: list, reshape: bool) -> list[Callable[[], object]] | None:
        """A movement op's reference call as copies into buffers made once, from views of its inputs made
        once; None where a result is neither a view of an input nor (`reshape`) a reshape of one."""
        args = [env[s] for s in fn.ins]
        if not args or not all(isinstance(a, torch.Tensor) for a in args):
            return None
        result = fn.impl(*args, **fn.attrs)
        result = result if isinstance(result, tuple) else (result,)
        shared = {_storage(a) for a in args}
        calls = []
        for slot, r in zip(fn.outs, result):
            dst = env[slot] if fn.into else torch.empty(r.shape, dtype=r.dtype, device=r.device)
            if _storage(r) in shared:
                source = r
            elif reshape and len(args) == 1 and r.numel() == args[0].numel():
                source, dst_view = args[0], dst.view(args[0].shape)  # a reshape copies row-major order
                dst_view.copy_(source)
                if not torch.equal(dst, r):
                    return None
                calls.append(_copy(source, dst_view))
                env[slot] = dst
                continue
            else:
                return None
            dst.copy_(source)
            calls.append(_copy(source, dst))
            env[slot] = dst
        return calls


def _copy(source: torch.Tensor, dst: torch.Tensor):
    """`dst.copy_(source)` (dst contiguous, same shape) as a native loop where the element size allows."""
    fallback = functools.partial(dst.copy_, source)
    size = source.element_size()
    if size not in cpu_movement.BIT_TYPES or source.dtype != dst.dtype or not dst.is_contiguous():
        return fallback
    key = f"{tuple(source.shape)}{source.stride()}{size}".encode()
    name = f"prepared_copy_{hashlib.sha256(key).hexdigest()[:16]}"
    src = cpu_movement.strided_copy(name, tuple(source.shape), source.stride(), size)
    return _Pending(src, [source], dst, fallback, "copy").capture()


def _reference_into(impl, args: list, attrs: dict, dst: torch.Tensor) -> None:
    dst.copy_(impl(*args, **attrs))


def _check_indices(flag) -> None:
    """Raise where a native gather met an index out of range this run (the launch then runs the steps op by
    op, and the gather's reference raises the error that names it)."""
    if flag[0]:
        flag[0] = 0
        raise IndexError("a gather's index is out of range")


def _copy_slot(dst: torch.Tensor, env: list, slot: int) -> None:
    dst.copy_(env[slot])


def _product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    """`torch.mm` or `torch.bmm` writing `out` (`torch.matmul` where the batch axes do not fold into one), or
    in its place a native loop with the library's bits for these operands: where PyTorch multiplies small
    batched matrices in a loop of its own, that loop (codegen/cpu_product.py), else for small products MKL's
    chain of multiply-adds (codegen/cpu_product.py); None where that is not `torch.matmul`'s answer bit for
    bit (checked on the values at hand)."""
    if out.dtype != a.dtype or out.dtype != b.dtype or not out.is_contiguous() or a.dim() != b.dim() or \
            a.dim() < 2 or a.shape[:-2] != b.shape[:-2]:
        return None
    folded = None
    if a.dim() == 2:
        call = functools.partial(torch.mm, a, b, out=out)
    else:
        try:
            folded = a.view(-1, *a.shape[-2:]), b.view(-1, *b.shape[-2:]), out.view(-1, *out.shape[-2:])
            call = functools.partial(torch.bmm, *folded[:2], out=folded[2])
        except RuntimeError:  # batch axes that do not fold without a copy
            call = functools.partial(torch.matmul, a, b, out=out)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = math.prod(a.shape[:-2])
    dtype = str(a.dtype).replace("torch.", "")
    small = None
    if dtype in ("float32", "float64") and folded is not None and m * k * n < cpu_product.TORCH_SMALL_BMM:
        a3, b3, out3 = folded
        key = f"{batch},{m},{k},{n}{a3.stride()}{b3.stride()}{a.dtype}".encode()
        name = f"prepared_product_{hashlib.sha256(key).hexdigest()[:16]}"
        src = cpu_product.small_batched_product(name, batch, m, k, n, a3.stride(), b3.stride(), dtype)
        small = _Pending(src, [a3, b3], out3, call, "product")
    elif dtype in ("float32", "float64") and cpu_product.fits(batch, m, k, n, a.element_size()):
        key = f"fma{tuple(a.shape)},{n}{a.stride()}{b.stride()}{a.dtype}".encode()
        name = f"prepared_product_{hashlib.sha256(key).hexdigest()[:16]}"
        src = cpu_product.product(name, tuple(a.shape[:-2]), m, k, n, a.stride(), b.stride(), dtype)
        small = _Pending(src, [a, b], out, call, "product")
    want = out.clone()
    call()
    if not torch.equal(out, want):
        out.copy_(want)
        return None
    return small.capture() if small is not None else call
