"""Element types and the type promotion rule.

A `DType` names one element type and knows its torch and NumPy counterparts.
Promotion, used whenever two operands of an elementwise op differ in type, is
PyTorch's rule, written out here so it is ours to document:

* the category order is bool < unsigned/signed integer < floating;
* within a category the wider type wins; int8 with uint8 gives int16,
  float16 with bfloat16 gives float32;
* a Python scalar is *weak*: it takes the type of the tensor it meets, unless
  it is of a higher category (a float scalar with an integer tensor gives
  float32, the default float type).

uint16, uint32 and uint64 follow NumPy (PyTorch refuses to promote them with
any other integer type): an unsigned type with a signed one gives the
smallest signed type that holds both (uint16 with int8 gives int32, uint32
with int32 gives int64) and uint64 with any signed type gives float64; with
a narrower unsigned type or bool the wider one wins.

The float8 types (float8_e4m3fn, float8_e5m2 and their "fnuz" variants) are
storage types: values are computed in float32 and rounded back (as half
types are in kernels). A float8 type with a wider float gives that float, two
different float8 types give float16 (which holds both exactly), and a float8
type with an integer or bool keeps the float8 type (the category rule).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DType:
    """One element type. Compare with ``is`` or ``==``; print shows its name."""

    name: str
    torch: torch.dtype
    itemsize: int
    category: int  # 0 bool, 1 integer, 2 floating

    @property
    def is_floating(self) -> bool:
        return self.category == 2

    @property
    def is_integer(self) -> bool:
        return self.category == 1

    @property
    def is_bool(self) -> bool:
        return self.category == 0

    @property
    def is_signed(self) -> bool:
        return not (self.name.startswith("uint") or self.name == "bool")

    @property
    def is_float8(self) -> bool:
        return self.name.startswith("float8")

    @property
    def numpy(self) -> np.dtype | None:
        """The NumPy dtype, or None where NumPy has none (bfloat16, the float8 types)."""
        return None if self.name == "bfloat16" or self.is_float8 else np.dtype(self.name)

    def __repr__(self) -> str:
        return f"stitchml.{self.name}"

    def __str__(self) -> str:
        return self.name


float16 = DType("float16", torch.float16, 2, 2)
bfloat16 = DType("bfloat16", torch.bfloat16, 2, 2)
float32 = DType("float32", torch.float32, 4, 2)
float64 = DType("float64", torch.float64, 8, 2)
int8 = DType("int8", torch.int8, 1, 1)
uint8 = DType("uint8", torch.uint8, 1, 1)
int16 = DType("int16", torch.int16, 2, 1)
int32 = DType("int32", torch.int32, 4, 1)
int64 = DType("int64", torch.int64, 8, 1)
bool_ = DType("bool", torch.bool, 1, 0)
uint16 = DType("uint16", torch.uint16, 2, 1)
uint32 = DType("uint32", torch.uint32, 4, 1)
uint64 = DType("uint64", torch.uint64, 8, 1)
float8_e4m3fn = DType("float8_e4m3fn", torch.float8_e4m3fn, 1, 2)
float8_e5m2 = DType("float8_e5m2", torch.float8_e5m2, 1, 2)
float8_e4m3fnuz = DType("float8_e4m3fnuz", torch.float8_e4m3fnuz, 1, 2)
float8_e5m2fnuz = DType("float8_e5m2fnuz", torch.float8_e5m2fnuz, 1, 2)

# The types PyTorch's kernels cover; for the others (WIDE_UNSIGNED, FLOAT8) reference implementations
# compute in a wider type and convert back (stitchml/ops/widen.py).
CORE: tuple[DType, ...] = (float16, bfloat16, float32, float64, int8, uint8, int16, int32, int64, bool_)
WIDE_UNSIGNED: tuple[DType, ...] = (uint16, uint32, uint64)
FLOAT8: tuple[DType, ...] = (float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz)
ALL: tuple[DType, ...] = CORE + WIDE_UNSIGNED + FLOAT8
_BY_NAME = {d.name: d for d in ALL}
_BY_TORCH = {d.torch: d for d in ALL}

default_float = float32
default_int = int64


def as_dtype(value) -> DType:
    """Turn a DType, its name, a torch dtype, a NumPy dtype or a Python type into a DType."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    if isinstance(value, torch.dtype) and value in _BY_TORCH:
        return _BY_TORCH[value]
    if value is bool:
        return bool_
    if value is int:
        return default_int
    if value is float:
        return default_float
    try:
        name = np.dtype(value).name
    except TypeError:
        name = None
    if name in _BY_NAME:
        return _BY_NAME[name]
    supported = ", ".join(d.name for d in ALL)
    raise TypeError(f"unsupported dtype {value!r}; expected one of {supported}")


def promote(a: DType, b: DType) -> DType:
    """The common type of two tensor operands (see the module docstring)."""
    if a == b:
        return a
    if a.is_float8 or b.is_float8:
        if a.is_float8 and b.is_float8:
            return float16
        wide, other = (b, a) if a.is_float8 else (a, b)
        return wide if wide.is_floating else other
    if a in WIDE_UNSIGNED or b in WIDE_UNSIGNED:
        if a.is_floating or b.is_floating:
            return as_dtype(torch.promote_types(a.torch, b.torch))
        return as_dtype(np.promote_types(np.dtype(a.name), np.dtype(b.name)).name)
    return as_dtype(torch.promote_types(a.torch, b.torch))


def scalar_dtype(value, partner: DType | None) -> DType:
    """The type a weak Python scalar takes next to a tensor of type `partner`."""
    category = 0 if isinstance(value, (bool, np.bool_)) else 1 if isinstance(value, (int, np.integer)) else 2
    if partner is not None and partner.category >= category:
        return partner
    return (bool_, default_int, default_float)[category]
