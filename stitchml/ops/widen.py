"""Reference implementations on the element types PyTorch has few kernels for.

PyTorch stores uint16, uint32, uint64 and the float8 types but computes with
few of them (``uint16 + uint16`` and ``float8 * float8`` have no kernel).
`widening` wraps a primitive's implementation: it first runs as it is, and
where PyTorch has no kernel for such an operand it runs again on operands
converted to a type PyTorch computes in, and converts the results back:

* uint16 and uint32 go to int32 and int64, which hold every value, so every
  op is exact; results convert back modulo 2^16 or 2^32 (the wrap-around of
  unsigned arithmetic, as in NumPy and ONNX).
* uint64 has no wider integer type. It is reinterpreted as int64 (the same
  bits), which is exact for every value in the primitive's ``unsigned`` class
  "ring" (addition, products, movement: arithmetic modulo 2^64) and, with the
  sign bit flipped first, in class "order" (comparisons, extrema, sorting).
  Integer division, modulo, absolute value, sign and relu have their own
  exact forms on those bits (`UINT64`); other ops of class "value" are
  exact for values below 2^63 and refuse larger ones with an error that
  says so.
* float8 types compute in float32 and round back once, as half types do in
  generated kernels.

Results go back to the types the primitive's shape-and-dtype rule gives.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import dtypes
from ..ir import TensorType

_INT64_MIN = -(1 << 63)
_WIDER = {torch.uint16: torch.int32, torch.uint32: torch.int64, torch.uint64: torch.int64,
          **{d.torch: torch.float32 for d in dtypes.FLOAT8}}
_NAMES = ("UInt16", "UInt32", "UInt64", "Float8")  # how PyTorch's "not implemented for" messages name them
# The classes of the primitives, in one table: elementwise ops and reductions are of class "value" unless
# named here, the others (movement, contractions, state) of class "ring".
RING = ("identity", "stop_gradient", "negative", "square", "addition", "subtraction", "multiplication", "power",
        "equal", "not_equal", "select", "cast", "logical_not", "logical_and", "logical_or", "logical_xor",
        "is_nan", "is_infinite", "is_finite", "reduction_sum", "reduction_product", "sum_to_shape")
ORDER = ("maximum", "minimum", "clamp", "less_than", "less_than_or_equal_to", "greater_than",
         "greater_than_or_equal_to", "reduction_maximum", "reduction_minimum", "reduction_arg_maximum",
         "reduction_arg_minimum", "top_k", "max_pooling2d")


def default_class(name: str, kind: str) -> str:
    """The class a primitive `name` of `kind` has unless its entry says otherwise."""
    if name in RING:
        return "ring"
    if name in ORDER:
        return "order"
    return "value" if kind in ("elementwise", "reduction") else "ring"


def _unsigned_at_least(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a >= b for uint64 values held as int64 bits: flipping the sign bit maps unsigned order to signed."""
    return (a ^ _INT64_MIN) >= (b ^ _INT64_MIN)


def _quotient(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Unsigned 64-bit a // b on int64 bits (Hacker's Delight, 9-3): halve a to make it a non-negative
    int64, divide, double, and correct by one; a divisor of 2^63 or more goes at most once."""
    if bool((b == 0).any()):
        raise ZeroDivisionError("integer division by zero")
    large = b < 0
    q = (((a >> 1) & ~_INT64_MIN) // torch.where(large, 1, b)) << 1
    q = q + _unsigned_at_least(a - q * b, b).to(torch.int64)
    return torch.where(large, _unsigned_at_least(a, b).to(torch.int64), q)


# Exact forms on uint64 values held as int64 bits, where the class's reinterpretation would not be.
UINT64: dict[str, Callable[..., torch.Tensor]] = {
    "floor_division": _quotient,
    "modulo": lambda a, b: a - _quotient(a, b) * b,
    "absolute": lambda x: x.clone(),
    "relu": lambda x: x.clone(),
    "sign": lambda x: (x != 0).to(torch.int64),
}


def _needs(args) -> bool:
    # A plain loop: this runs before every reference call, on any types.
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.dtype in _WIDER:
                return True
        elif isinstance(a, (list, tuple)) and _needs(a):
            return True
    return False


def _no_kernel(e: Exception) -> bool:
    from ..errors import StitchError

    return not isinstance(e, StitchError) and any(n in str(e) for n in _NAMES)


def _widen(a: Any, cls: str, op: str) -> Any:
    if isinstance(a, (list, tuple)):
        return type(a)(_widen(v, cls, op) for v in a)
    if not isinstance(a, torch.Tensor) or a.dtype not in _WIDER:
        return a
    if a.dtype != torch.uint64:
        return a.to(_WIDER[a.dtype])
    signed = a.view(torch.int64)
    if cls == "order":
        return signed ^ _INT64_MIN
    if cls == "value" and signed.numel() and bool((signed < 0).any()):
        raise ValueError(f"{op}: uint64 values of 2**63 and more are not supported by its reference "
                         f"implementation (PyTorch has no uint64 kernel for it; it computes in int64)")
    return signed


def _narrow(r: torch.Tensor, want: torch.dtype, cls: str) -> torch.Tensor:
    if r.dtype == want:
        return r
    if want == torch.uint64 and r.dtype == torch.int64:
        return (r ^ _INT64_MIN if cls == "order" else r).view(torch.uint64)
    return r.to(want)


def _out_dtypes(prim, args, attrs) -> list[torch.dtype] | None:
    """The result types by the primitive's shape-and-dtype rule, None where it cannot say."""
    if prim.infer is None:
        return None
    types = [TensorType(tuple(a.shape), dtypes.as_dtype(a.dtype)) for a in args if isinstance(a, torch.Tensor)]
    try:
        out = prim.infer(types, **attrs)
    except Exception:
        return None
    return [t.dtype.torch for t in (out if isinstance(out, (list, tuple)) else [out])]


def widening(prim, impl: Callable[..., Any]) -> Callable[..., Any]:
    """`impl` of `prim`, computing in a wider type where PyTorch lacks a kernel (see the module docstring)."""

    def call(*args, **attrs):
        if not _needs(args):
            return impl(*args, **attrs)
        try:
            return impl(*args, **attrs)
        except (RuntimeError, NotImplementedError, TypeError) as e:
            if not _no_kernel(e):
                raise
        cls = prim.unsigned
        tensors = args[1:] if prim.needs_context else args
        if prim.name in UINT64 and any(isinstance(a, torch.Tensor) and a.dtype == torch.uint64 for a in tensors):
            return UINT64[prim.name](*(a.view(torch.int64) for a in tensors)).view(torch.uint64)
        wanted = _out_dtypes(prim, tensors, attrs)
        wide = _widen(list(args), cls, prim.name)
        result = impl(*wide, **attrs)
        outs = result if isinstance(result, tuple) else (result,)
        if wanted is None or len(wanted) != len(outs):
            back = {_WIDER[a.dtype]: a.dtype for a in tensors if isinstance(a, torch.Tensor) and a.dtype in _WIDER}
            wanted = [back.get(r.dtype, r.dtype) for r in outs]
        narrowed = tuple(_narrow(r, w, cls) if isinstance(r, torch.Tensor) else r for r, w in zip(outs, wanted))
        return narrowed if isinstance(result, tuple) else narrowed[0]

    call.__name__ = getattr(impl, "__name__", "impl")
    call.__wrapped__ = impl
    return call
