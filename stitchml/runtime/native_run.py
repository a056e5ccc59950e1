"""native_run: the prepared run of an executable of directly launched kernels, its host path in C.

A prepared run in Python (`_Prepared`, runtime/executable.py) of a one-kernel
CUDA executable still spends most of its host time between the interpreter
and torch's bindings: the feed checks, the output's allocation, the ctypes
call of the launch (runtime/direct.py) and the result's wrapping. Where every
step is a kernel that `direct.bind` prepared a launch for, a `Runner` of a
small CPython extension (native_run.c) does the same work in C: it checks
each feed against the prepared key (exact tensor type, dtype identity, shape,
device, contiguity) and returns None on a miss, as `_Prepared` does, so that
the general path converts the feed or raises its FeedError; it allocates the
fresh outputs with the prepared `new_empty_strided` (small ones many at a time,
`BLOCK_OUTPUTS`; a caller's buffers skip it), writes the buffers' addresses
into each kernel's parameter block (the DirectLaunch's own memory, which the
runner holds), calls the driver's `cuLaunchKernelEx` (`cuLaunchKernel` where
the driver refuses the first) and builds the results, under the graph's run
lock, counting `runs` and `run_count`. A buffer off the alignment a kernel was
compiled for, or a launch the driver refuses, hands that kernel and the rest
to their steps in Python (Triton's launcher), whose failures become the typed
errors of `failure`. On an H200's host a one-kernel `exe.run` took 6.7
microseconds per call this way, against 8.1 for one eager `torch.erf` and
11.7-15.0 through the Python prepared run (benchmarks/bench_targets.py
--sections latency). A `Lookup` of the same extension is `Graph.run`'s lookup
of a request seen before (`ExecutableCache.quick`, runtime/compiled.py): 1.0
microseconds there against 2.1 in Python.

The extension is built the way Triton builds its own launcher: the system C
compiler and Python's headers (no cuda.h: the driver's two entry points come
as addresses from the ctypes driver handle), once per source, compiler, flags
and Python version, in the disk cache (`STITCHML_CACHE_DIR`) by an atomic
rename, so that concurrent processes share it safely. Where there is no C
compiler or no Python headers, `module()` logs why once and runs keep the
Python prepared path. `STITCHML_NATIVE_RUN=0` turns it off.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import logging
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from typing import Any

import torch

from ..codegen.cpu import find_compiler
from ..ir import Operation, Tensor
from ..tensor_data import TensorData
from .launch import KernelLaunch
from .steps import failure

log = logging.getLogger("stitchml.runtime")

NAME = "stitchml_native_run"
FLAGS = ["-O2", "-shared", "-fPIC", "-fno-strict-aliasing"]
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_run.c")
# Fresh outputs of at most BLOCK_BYTES are allocated BLOCK_OUTPUTS at a time, as one block and its `unbind`:
# on an H200's host a view cost 1.5 microseconds against 2.7 for `new_empty_strided` (bench_targets.py). A
# block lives while any of its outputs does: at most BLOCK_OUTPUTS * BLOCK_BYTES held for one small result.
# Sizes that are multiples of 16 bytes only, so that every output keeps the alignment kernels were built for.
BLOCK_OUTPUTS = 16
BLOCK_BYTES = 1 << 16

_module: Any = False  # not built yet; None: unavailable (`reason` says why)
reason: str | None = None
_lock = threading.Lock()


class Unavailable(RuntimeError):
    """No C compiler, no Python headers, or the extension failed to build or load."""


def enabled() -> bool:
    return os.environ.get("STITCHML_NATIVE_RUN", "1") != "0"


def compiler() -> tuple[str, str]:
    """(path, version line) of the C compiler: $CC, else cc, gcc or clang; Unavailable if none."""
    found = find_compiler((os.environ.get("CC"), "cc", "gcc", "clang"))
    if found is None:
        raise Unavailable("no C compiler found (set CC, or install gcc or clang)")
    return found


def cache_dir() -> str:
    root = os.environ.get("STITCHML_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "stitchml")
    path = os.path.join(root, "native")
    os.makedirs(path, exist_ok=True)
    return path


def library_path(source: str, cc: str, version: str, include: str) -> str:
    """Where the extension built from `source` by compiler `version` lives in the disk cache: keyed by the
    source, the compiler, the flags and the Python it is for (its version and ABI tag)."""
    key = hashlib.sha256("\0".join([source, version, *FLAGS, include, sys.version,
                                    str(sysconfig.get_config_var("SOABI"))]).encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), f"{NAME}-{key}.so")


def build(source: str, so: str, cc: str, include: str) -> None:
    """Compile `source` into the extension `so`: in a private folder, then renamed into place (atomic: a
    concurrent process sees no file or a whole one)."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(so)) as tmp:
        c = os.path.join(tmp, "native_run.c")
        with open(c, "w") as f:
            f.write(source)
        out = os.path.join(tmp, "native_run.so")
        result = subprocess.run([cc, *FLAGS, f"-I{include}", c, "-o", out], capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise Unavailable(f"{os.path.basename(cc)} failed on the native runner: {result.stderr.strip()[-2000:]}")
        os.replace(out, so)


def load(so: str):
    loader = importlib.machinery.ExtensionFileLoader(NAME, so)
    spec = importlib.util.spec_from_file_location(NAME, so, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def module():
    """The extension module, built or loaded from the disk cache on first use; None where it cannot be
    (the reason logged once, kept in `reason`)."""
    global _module, reason
    if _module is not False:
        return _module
    with _lock:
        if _module is not False:
            return _module
        try:
            include = sysconfig.get_paths()["include"]
            if not os.path.exists(os.path.join(include, "Python.h")):
                raise Unavailable(f"no Python headers (Python.h) in {include}")
            cc, version = compiler()
            with open(SOURCE) as f:
                source = f.read()
            so = library_path(source, cc, version, include)
            if not os.path.exists(so):
                build(source, so, cc, include)
            _module = load(so)
        except (Unavailable, OSError, ImportError, subprocess.SubprocessError) as e:
            _module, reason = None, f"{type(e).__name__}: {e}"
            log.warning("prepared runs stay in Python (the ctypes launch): %s", reason)
    return _module


def kernels(steps) -> list[tuple[KernelLaunch, Any]] | None:
    """(launch, its DirectLaunch) of every step, or None where a step is anything else (a vendor call, a
    view, a kernel launched through Triton)."""
    out = []
    for step in steps:
        fn = step.run
        direct = getattr(fn, "direct", None) if isinstance(fn, KernelLaunch) else None
        if direct is None:
            return None
        out.append((fn, direct))
    return out


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def runner(exe, prepared, stream=None):
    """A Runner of `exe`'s prepared run (`prepared`, its _Prepared), or None where the run is not all
    directly launched kernels, or the extension is unavailable or turned off. `stream(device_index)` gives
    the current stream as an int (default: torch's current raw CUDA stream)."""
    if not enabled():
        return None
    launches = kernels(exe.steps)
    if not launches:
        return None
    stream = stream or getattr(torch._C, "_cuda_getCurrentRawStream", None)
    mod = module() if stream is not None else None
    if mod is None:
        return None
    drv = launches[0][1].drv
    ex = _address(drv.launch_ex) if all(d.ex is not None for _, d in launches) and \
        getattr(drv, "launch_ex", None) is not None else 0
    specs = []
    for _, d in launches:
        c = d.config
        buffers = tuple((slot, mask) for slot, mask, _ in sorted(d.buffers, key=lambda b: b[2]))
        specs.append((d.shape[0].value or 0, (c.grid_x, c.grid_y, c.grid_z), (c.block_x, c.block_y, c.block_z),
                      c.shared, ctypes.addressof(d.block), ctypes.addressof(d.addresses), buffers))
    planned = {slot: i for i, (slot, *_) in enumerate(prepared.outputs)}
    users: dict[int, Any] = {}
    for user, slot, held in exe._results:  # the target a caller's buffer may stand in for, per fresh output
        if slot in planned and not held:
            users.setdefault(slot, user)
    outputs = []
    for (slot, new, shape, strides), (_, _, dtype) in zip(prepared.outputs, exe._outputs):
        nbytes = math.prod(shape) * dtype.itemsize
        count = BLOCK_OUTPUTS if 0 < nbytes <= BLOCK_BYTES and nbytes % 16 == 0 else 1
        size = (count, *shape) if count > 1 else shape
        outputs.append((slot, new, (size, (math.prod(shape), *strides) if count > 1 else strides), shape, dtype,
                        users.get(slot), count))
    steps, checks = list(exe.steps), exe._checks

    def resume(env: list, k: int) -> None:
        """Run steps[k:] in Python, as `_Prepared` does, errors typed by `failure`."""
        step = None
        try:
            for step in steps[k:]:
                step.run(env)
        except Exception as e:
            raise failure(step, e, env, checks, None) from e

    return mod.Runner(exe._nslots, list(prepared.env), prepared.feeds, prepared.index, tuple(outputs),
                      tuple(tuple(r) for r in exe._results), tuple(specs), ex, _address(drv.launch), stream,
                      launches[0][0].device_index, exe._lock, resume, exe, exe.graph, torch.Tensor, TensorData,
                      tuple(d for _, d in launches))


def lookup(cache, current, get_device):
    """A native `quick` for the ExecutableCache `cache` (its `_recent` entries by request key), or None
    where the extension is unavailable or turned off. `current(device)` is the current CUDA device where
    `device` resolves through it (compiled.py's `_current_cuda`); `get_device` torch's own call for it,
    which the lookup makes directly once CUDA is initialised (None on builds without CUDA)."""
    mod = module() if enabled() else None
    if mod is None:
        return None
    python = type(cache).quick.__get__(cache)  # requests of another form (options, a torch.device)
    return mod.Lookup(cache, cache._recent, cache.entries, Tensor, Operation, current, get_device, python)
