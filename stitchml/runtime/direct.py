"""direct: a compiled Triton kernel launched through the CUDA driver with a prepared argument block.

Triton's own launcher, called with a compiled kernel's handles, still parses
every argument of every call (a tuple of Python objects, each pointer read
through `data_ptr`), allocates its scratch buffers and consults its hooks. A
`DirectLaunch` does that work once, when a kernel step has launched through
Triton the first time: it lays out the kernel's parameter block (one 8-byte
slot per buffer, the extents as their fixed integers, a null pointer for
each parameter Triton adds after the visible ones), and a later launch writes
the buffers' addresses into the block and makes one `cuLaunchKernelEx` call
through ctypes, whose four arguments are made once (`cuLaunchKernel`'s eleven
where the driver lacks it). On an H200's host the launch through
`cuLaunchKernel` took a one-kernel `exe.run` from 22.5 to 16.5 microseconds of
host time per call (benchmarks/RESULTS.md); with a stand-in driver on a CPU
host, the launch's own Python went from 1.9 to 1.0 microseconds with the Ex
entry and a one-pass address write.

It is built only where that is known to be exact: the parameter list derived
from the compiled kernel's signature (constexprs left out, in argument order)
must match, parameter by parameter, both the sizes the driver reports for
the loaded function (`cuFuncGetParamInfo`) and those of the PTX entry; the
kernel needs no global or profiling scratch, one CTA per program, no
cooperative or programmatic-dependent launch. `bind` says why not otherwise
(an older driver, a kernel of another shape...), and the step keeps
launching through Triton, as it does under the interpreter.
`STITCHML_DIRECT_LAUNCH=0` turns it off (for tools that watch Triton's
launch hooks).
"""
from __future__ import annotations

import ctypes
import os
import re
from typing import Any

_INTEGERS = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
             "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
             "u32": ctypes.c_uint32, "u64": ctypes.c_uint64}

_driver: Any = False  # not looked up yet


class _Driver:
    """The libcuda entry points a launch needs: the launch itself and the parameter layout."""

    def __init__(self, lib: ctypes.CDLL):
        # cuLaunchKernel(CUfunction, grid x/y/z, block x/y/z, shared bytes, CUstream, void **params, void **extra):
        # no argtypes, so every call passes ready ctypes objects (converting eleven Python ints per call
        # through argtypes costs as much again as the call)
        self.launch = lib.cuLaunchKernel
        self.launch.restype = ctypes.c_int
        # cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **params, void **extra) (CUDA 12; Triton's own
        # launcher calls it): four arguments, all fixed per kernel, against eleven; None on older drivers
        self.launch_ex = getattr(lib, "cuLaunchKernelEx", None)
        if self.launch_ex is not None:
            self.launch_ex.restype = ctypes.c_int
        self.param_info = lib.cuFuncGetParamInfo  # CUDA 12.4 and later; AttributeError before
        self.param_info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.POINTER(ctypes.c_size_t)]
        self.param_info.restype = ctypes.c_int

    def params(self, function: int) -> list[tuple[int, int]]:
        """(offset, size) of every parameter of `function`, as the driver lays them out."""
        out = []
        offset, size = ctypes.c_size_t(), ctypes.c_size_t()
        while self.param_info(function, len(out), ctypes.byref(offset), ctypes.byref(size)) == 0:
            out.append((offset.value, size.value))
            if len(out) > 4096:  # no kernel of ours has that many; a driver answering forever is not one to trust
                raise OSError("cuFuncGetParamInfo did not end")
        return out


def driver() -> _Driver | None:
    """The libcuda bindings, or None where there is no usable driver library (CPU machines, old drivers)."""
    global _driver
    if _driver is False:
        _driver = None
        for name in ("libcuda.so.1", "libcuda.so"):
            try:
                _driver = _Driver(ctypes.CDLL(name))
                break
            except (OSError, AttributeError):
                continue
    return _driver


def enabled() -> bool:
    return os.environ.get("STITCHML_DIRECT_LAUNCH", "1") != "0"


def parameter_types(compiled, n_buffers: int, sizes: tuple) -> list | None:
    """The kernel's parameters in order, from a compiled kernel's source signature: "ptr" for each of the
    `n_buffers` buffers, a ctypes integer holding each extent of `sizes`; constexprs are not parameters.
    None when the signature holds anything else (floats, tuples, descriptors) or does not line up."""
    src = getattr(compiled, "src", None)
    names = getattr(getattr(src, "fn", None), "arg_names", None)
    signature = getattr(src, "signature", None)
    if names is None or not isinstance(signature, dict):
        return None
    values = [None] * n_buffers + list(sizes)
    out = []
    for i, name in enumerate(names):
        ty = signature.get(name, signature.get(i))
        if ty == "constexpr":
            continue
        if not isinstance(ty, str) or i >= len(values):
            return None
        if ty.startswith("*"):
            if i >= n_buffers:
                return None
            out.append("ptr")
        elif ty in _INTEGERS and i >= n_buffers:
            out.append(_INTEGERS[ty](values[i]))
        else:
            return None
    return out


def refusal(compiled) -> str | None:
    """Why a compiled kernel cannot be launched directly (None: it can), from its metadata."""
    meta = getattr(compiled, "metadata", None)
    if meta is None or getattr(compiled, "function", None) is None:
        return "no loaded function"
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        return "it needs scratch memory"
    if getattr(meta, "num_ctas", 1) != 1 or tuple(getattr(meta, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in \
            ((1, 1, 1), (1,), ()):
        return "CTA clusters"
    if getattr(meta, "launch_cooperative_grid", False) or getattr(meta, "launch_pdl", False):
        return "a cooperative or programmatic-dependent launch"
    return None


class LaunchConfig(ctypes.Structure):
    """CUDA's CUlaunchConfig (cuda.h): grid and block extents, dynamic shared memory, stream, attributes."""

    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("num_attrs", ctypes.c_uint)]


class DirectLaunch:
    """One kernel's prepared launch: its grid, block, shared memory and parameter block (module docstring).

    A launch goes through `cuLaunchKernelEx` where the driver has it, its four arguments made once (the
    config's stream field rewritten when the stream changes); the first launch it refuses, before any it
    accepted, moves this kernel to `cuLaunchKernel` for good.
    """

    def __init__(self, drv: _Driver, function: int, grid: tuple, threads: int, shared: int, types: list,
                 hidden: int, slots: list[int], alignment: tuple[bool, ...]):
        self.drv = drv
        self.shape = [ctypes.c_void_p(function), *(ctypes.c_uint(v) for v in (*grid, threads, 1, 1, shared))]
        self.stream, self.stream_handle = None, ctypes.c_void_p(0)
        n = sum(1 for t in types if t == "ptr")
        self.addresses = (ctypes.c_uint64 * max(n, 1))()
        self._null = ctypes.c_uint64(0)
        self._keep = [t for t in types if t != "ptr"] + [self._null]  # the block points into these
        params, k = [], 0
        base = ctypes.addressof(self.addresses)
        for t in types:
            if t == "ptr":
                params.append(base + 8 * k)
                k += 1
            else:
                params.append(ctypes.addressof(t))
        params += [ctypes.addressof(self._null)] * hidden
        self.block = (ctypes.c_void_p * max(len(params), 1))(*params)
        # (slot, alignment mask, address index) per buffer: 15 for those Triton specialised as 16-byte aligned
        # at the first launch (a later launch with one of them unaligned goes back through Triton, which
        # compiles the variant), 0 for the others
        self.buffers = tuple((slot, 15 if aligned else 0, i) for i, (slot, aligned) in enumerate(zip(slots, alignment)))
        self.slots = slots
        self.ex = getattr(drv, "launch_ex", None)  # None: cuLaunchKernel
        self.ex_accepted = False  # whether cuLaunchKernelEx has launched this kernel yet
        self.config = LaunchConfig(*grid, threads, 1, 1, shared, None, None, 0)
        self.ex_args = (ctypes.c_void_p(ctypes.addressof(self.config)), self.shape[0], self.block, None)

    def __call__(self, env: list, stream: int) -> bool:
        """Launch on the buffers at `slots` of `env` on `stream`; False (nothing launched) when a buffer breaks
        the alignment the kernel was compiled for or the driver refuses the launch."""
        addresses = self.addresses
        for slot, mask, i in self.buffers:  # one pass, no list: about half the host time of building one
            ptr = env[slot].data_ptr()
            if ptr & mask:
                return False
            addresses[i] = ptr
        if stream != self.stream:
            self.stream, self.stream_handle = stream, ctypes.c_void_p(stream)
            self.config.stream = stream
        ex = self.ex
        if ex is not None:
            if ex(*self.ex_args) == 0:
                self.ex_accepted = True
                return True
            if self.ex_accepted:
                return False
            self.ex = None  # refused before it ever launched (a driver that has the entry but not its config)
        f, gx, gy, gz, bx, by, bz, shared = self.shape
        return self.drv.launch(f, gx, gy, gz, bx, by, bz, shared, self.stream_handle, self.block, None) == 0


def bind(compiled, grid: tuple, slots: list[int], sizes: tuple, alignment: tuple[bool, ...]
         ) -> tuple[DirectLaunch | None, str]:
    """A DirectLaunch of `compiled` (a Triton CompiledKernel that has launched once, its buffers at `slots`
    of a run's environment, then the extents `sizes`) and "direct", or None and why a direct launch is not
    known to be exact (module docstring)."""
    n_buffers = len(slots)
    if not enabled():
        return None, "STITCHML_DIRECT_LAUNCH=0"
    why = refusal(compiled) or ("an empty grid" if 0 in grid else None)
    drv = driver() if why is None else None
    if why is None and drv is None:
        why = "no CUDA driver library with cuFuncGetParamInfo"
    types = parameter_types(compiled, n_buffers, sizes) if why is None else None
    if why is None and types is None:
        why = "a parameter of a kind other than buffers and integers"
    if why is not None:
        return None, why
    try:
        reported = [size for _, size in drv.params(compiled.function)]
    except OSError as e:
        return None, str(e)
    hidden = hidden_parameters(types, reported)
    if hidden is None or hidden != hidden_parameters(types, ptx_parameters(compiled)):
        return None, f"parameter sizes {reported} (PTX {ptx_parameters(compiled)}) do not match {types}"
    meta = compiled.metadata
    threads = meta.num_warps * getattr(meta, "warp_size", 32)
    return DirectLaunch(drv, compiled.function, grid, threads, meta.shared, types, hidden, slots, alignment), \
        "direct"


def hidden_parameters(types: list, sizes: list[int] | None) -> int | None:
    """How many pointer parameters the kernel has after the visible `types` (Triton's scratch pointers),
    given the byte size of every parameter (`sizes`); None when the visible ones do not match."""
    if sizes is None:
        return None
    expected = [8 if t == "ptr" else ctypes.sizeof(t) for t in types]
    rest = sizes[len(expected):]
    if sizes[:len(expected)] != expected or any(size != 8 for size in rest):
        return None
    return len(rest)


_PTX_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}


def ptx_parameters(compiled) -> list[int] | None:
    """The byte size of every parameter of the kernel's PTX entry (None without PTX or an entry)."""
    ptx = getattr(compiled, "asm", {}).get("ptx") if hasattr(compiled, "asm") else None
    if not isinstance(ptx, str):
        return None
    entry = re.search(r"\.entry\s+[\w$]+\s*\((.*?)\)", ptx, re.S)
    if entry is None:
        return None
    sizes = []
    for decl in entry.group(1).split(","):
        if not decl.strip():
            continue
        array = re.search(r"\.b8\s+[\w$]+\[(\d+)\]", decl)
        scalar = re.search(r"\.[usbf](8|16|32|64)\b", decl)
        if array:
            sizes.append(int(array.group(1)))
        elif scalar:
            sizes.append(_PTX_SIZES[scalar.group(1)])
        else:
            return None
    return sizes
