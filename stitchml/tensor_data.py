"""TensorData: a typed, strided view of memory on one device.

The counterpart of MPSGraphTensorData and MTLTensor: a dtype, a shape of rank
0 to 16, strides in elements (outermost first), a storage offset and a device.
The memory is held by a torch tensor, which gives DLPack, CUDA allocation and
streams for free; TensorData adds the checks and the MPSGraph-style surface.

    >>> import numpy as np, stitchml as sm
    >>> buf = np.arange(12, dtype=np.float32)          # 3 rows of 4, one padding column
    >>> t = sm.TensorData.from_buffer(buf, (3, 3), sm.float32, strides=(4, 1))
    >>> t.numpy()[1].tolist()
    [4.0, 5.0, 6.0]
"""
from __future__ import annotations

import warnings
from typing import Any, Sequence

import numpy as np
import torch

from . import dtypes
from .dtypes import DType, as_dtype
from .errors import DeviceError, LayoutError

MAX_RANK = 16


def available_devices() -> list[str]:
    """The devices this machine has, by the names runs accept: ``["cpu", "cuda:0", ...]``."""
    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]


class _Present:
    """The devices this machine has, listed when an error message formats it."""

    def __str__(self) -> str:
        return ", ".join(available_devices())


def resolve_device(device: Any = None) -> torch.device:
    """The torch device for a run or a TensorData; `None` means the default: CUDA when present, else the CPU.

    Accepted names are "cpu", "cuda" (the current CUDA device) and "cuda:N" (or the torch.device of
    one); any other name, and a CUDA device this machine does not have, raise `DeviceError`.

    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("gpu")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    stitchml.errors.DeviceError: unknown device 'gpu'; expected "cpu", "cuda" or "cuda:N"; this machine has: cpu...
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    present = _Present()  # listing the devices costs more than resolving one: only errors name them
    try:
        resolved = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda") or (resolved.type == "cpu" and resolved.index):
        raise DeviceError(f'unknown device {device!r}; expected "cpu", "cuda" or "cuda:N"; '
                          f"this machine has: {present}")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {str(resolved)!r} was asked for but this machine has no CUDA device "
                              f"(it has: {present}; see `stitchml doctor`)")
        if resolved.index is None:
            resolved = torch.device("cuda", torch.cuda.current_device())
        elif resolved.index >= torch.cuda.device_count():
            raise DeviceError(f"device {str(resolved)!r} was asked for but this machine has: {present}")
    return resolved


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    if array.dtype.byteorder == ">" or any(s < 0 or s % array.itemsize for s in array.strides):
        array = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("="), copy=False)
    if array.dtype.name == "bfloat16":  # ml_dtypes
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    if array.dtype.name.startswith("float8_") and hasattr(torch, array.dtype.name):  # ml_dtypes, as torch names it
        return torch.from_numpy(array.view(np.uint8).copy()).view(getattr(torch, array.dtype.name))
    with warnings.catch_warnings():  # read-only arrays: we never write into a caller's input
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def _to_torch(value: Any, dtype: DType | None) -> torch.Tensor:
    if isinstance(value, TensorData):
        return value._t
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return _from_numpy(value)
    if isinstance(value, np.generic):
        return _from_numpy(np.asarray(value))
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    if isinstance(value, (bool, int, float)) or isinstance(value, (list, tuple)):
        inferred = _infer_python_dtype(value)
        target = dtype or inferred
        if target.is_integer and inferred.is_integer:
            _check_int_range(value, target)
        return torch.as_tensor(value, dtype=target.torch)
    raise TypeError(
        f"cannot make TensorData from {type(value).__name__}; expected a NumPy array, torch tensor, "
        "an object with __dlpack__, a Python scalar or a nested list"
    )


def _check_int_range(value: Any, dtype: DType) -> None:
    """As NumPy 2: a Python int that an integer type cannot hold is an error, not a wrap-around."""
    info = torch.iinfo(dtype.torch)
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif not info.min <= v <= info.max:
            raise ValueError(f"value {v} is out of range for {dtype} [{info.min}, {info.max}]")


def _infer_python_dtype(value: Any) -> DType:
    """bool < int < float over all leaves of a scalar or nested list (no leaves: float, as NumPy and torch)."""
    category, leaves = 0, 0
    stack = [value]
    while stack:
        v = stack.pop()
        leaves += not isinstance(v, (list, tuple))
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, (bool, np.bool_)):
            pass
        elif isinstance(v, (int, np.integer)):
            category = max(category, 1)
        elif isinstance(v, (float, np.floating)):
            category = 2
        else:
            raise TypeError(f"nested list holds a {type(v).__name__}; expected bool, int or float")
    if not leaves:
        return dtypes.default_float
    return (dtypes.bool_, dtypes.default_int, dtypes.default_float)[category]


def _as_byte_tensor(buffer: Any) -> torch.Tensor:
    """A flat uint8 torch view of the memory behind `buffer` (no copy)."""
    if isinstance(buffer, TensorData):
        buffer = buffer._t
    if isinstance(buffer, np.ndarray):
        if not buffer.flags.c_contiguous:
            raise LayoutError("from_buffer: the buffer must be one contiguous block of memory; got a strided NumPy view")
        buffer = _from_numpy(buffer.reshape(-1))
    if isinstance(buffer, torch.Tensor):
        if not buffer.is_contiguous():
            raise LayoutError("from_buffer: the buffer must be one contiguous block of memory; got a strided tensor")
        flat = buffer.detach().reshape(-1)
        return flat.view(torch.uint8) if flat.dtype != torch.bool else flat.view(torch.uint8)
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(
            f"from_buffer: {type(buffer).__name__} exposes no memory; expected bytes, bytearray, memoryview, "
            "a NumPy array, a torch tensor or a TensorData"
        ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if view.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(view.cast("B"), dtype=torch.uint8)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


class TensorData:
    """Typed, strided memory on a device; see the module docstring.

    ``TensorData(value, dtype=None, device=None)`` accepts a NumPy array, a torch
    tensor, anything with ``__dlpack__`` (all zero copy when no cast or move is
    asked for), a Python scalar or a nested list.
    """

    __slots__ = ("_t",)

    def __init__(self, value: Any, dtype: Any = None, device: Any = None):
        dt = None if dtype is None else as_dtype(dtype)
        t = _to_torch(value, dt)
        if t.dtype not in (d.torch for d in dtypes.ALL):
            raise TypeError(f"unsupported element type {t.dtype}; expected one of {', '.join(d.name for d in dtypes.ALL)}")
        if dt is not None and t.dtype != dt.torch:
            t = t.to(dt.torch)
        if device is not None:
            t = t.to(resolve_device(device))
        if t.dim() > MAX_RANK:
            raise LayoutError(f"TensorData: rank {t.dim()} is over the limit of {MAX_RANK}")
        self._t = t

    # -- construction ------------------------------------------------------
    @classmethod
    def from_buffer(
        cls,
        buffer: Any,
        shape: Sequence[int],
        dtype: Any,
        strides: Sequence[int] | None = None,
        offset: int = 0,
    ) -> "TensorData":
        """Wrap existing memory without copying.

        `strides` and `offset` count elements of `dtype`, outermost first. The
        innermost stride must be 1 and every addressed element must lie inside
        the buffer, else `LayoutError`.
        """
        dt = as_dtype(dtype)
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_RANK:
            raise LayoutError(f"from_buffer: rank {len(shape)} is over the limit of {MAX_RANK}")
        if any(d < 0 for d in shape):
            raise LayoutError(f"from_buffer: shape {shape} has a negative extent")
        strides = contiguous_strides(shape) if strides is None else tuple(int(s) for s in strides)
        if len(strides) != len(shape):
            raise LayoutError(f"from_buffer: {len(strides)} strides given for a shape of rank {len(shape)} {shape}")
        if shape and strides[-1] != 1:
            raise LayoutError(f"from_buffer: the innermost stride must be 1; got strides {strides}")
        if any(s < 0 for s in strides):
            raise LayoutError(f"from_buffer: strides must be >= 0; got {strides}")
        if offset < 0:
            raise LayoutError(f"from_buffer: offset must be >= 0; got {offset}")
        raw = _as_byte_tensor(buffer)
        capacity = raw.numel() // dt.itemsize
        if raw.numel() % dt.itemsize or raw.data_ptr() % dt.itemsize:
            raw = raw[: capacity * dt.itemsize]
            if raw.numel() and raw.data_ptr() % dt.itemsize:
                raise LayoutError(f"from_buffer: the buffer's address is not aligned to {dt.itemsize} bytes for {dt}")
        if 0 not in shape:
            last = offset + sum((d - 1) * s for d, s in zip(shape, strides))
            if last >= capacity:
                raise LayoutError(
                    f"from_buffer: shape {shape}, strides {strides}, offset {offset} address element {last}, "
                    f"but the buffer holds {capacity} elements of {dt} ({raw.numel()} bytes)"
                )
        elif offset > capacity:
            raise LayoutError(f"from_buffer: offset {offset} lies past the buffer's {capacity} elements")
        flat = raw.view(dt.torch) if raw.numel() else torch.empty(0, dtype=dt.torch, device=raw.device)
        return cls._wrap(torch.as_strided(flat, shape, strides, offset))

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: Any, device: Any = None) -> "TensorData":
        """Uninitialised, contiguous memory (torch's allocator aligns it to 64+ bytes)."""
        return cls._wrap(torch.empty(tuple(shape), dtype=as_dtype(dtype).torch, device=resolve_device(device)))

    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: Any, device: Any = None) -> "TensorData":
        return cls._wrap(torch.zeros(tuple(shape), dtype=as_dtype(dtype).torch, device=resolve_device(device)))

    @classmethod
    def _wrap(cls, t: torch.Tensor) -> "TensorData":
        obj = cls.__new__(cls)
        obj._t = t
        return obj

    # -- description ---------------------------------------------------------
    @property
    def dtype(self) -> DType:
        return as_dtype(self._t.dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._t.shape)

    @property
    def rank(self) -> int:
        return self._t.dim()

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(self._t.stride())

    @property
    def offset(self) -> int:
        return self._t.storage_offset()

    @property
    def device(self) -> str:
        return str(self._t.device)

    @property
    def nbytes(self) -> int:
        return self._t.numel() * self._t.element_size()

    def __repr__(self) -> str:
        return (
            f"TensorData(shape={self.shape}, dtype={self.dtype}, device={self.device}, "
            f"strides={self.strides}, offset={self.offset})"
        )

    # -- export --------------------------------------------------------------
    def torch(self) -> torch.Tensor:
        """The torch tensor over the same memory (no copy)."""
        return self._t

    def numpy(self) -> np.ndarray:
        """A NumPy array; zero copy for CPU data, a copy from a GPU."""
        t = self._t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            try:
                import ml_dtypes
            except ImportError:
                raise TypeError("NumPy has no bfloat16; install ml_dtypes, or use .torch() or cast first") from None
            return t.contiguous().view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
        if dtypes.as_dtype(t.dtype).is_float8:
            try:
                import ml_dtypes
            except ImportError:
                raise TypeError(f"NumPy has no {t.dtype}; install ml_dtypes, or use .torch() or cast first") from None
            return t.contiguous().view(torch.uint8).numpy().view(getattr(ml_dtypes, str(t.dtype)[6:]))
        return t.numpy()

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def to(self, device: Any) -> "TensorData":
        """A copy on `device` (self when it is already there)."""
        return TensorData._wrap(self._t.to(resolve_device(device)))

    def item(self):
        return self._t.item()
