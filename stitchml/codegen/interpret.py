"""CUDA's math library under TRITON_INTERPRET=1 (the CPU path of CI).

Generated kernels call `libdevice.tanh`, `libdevice.atan2`... On the GPU that
is Triton's binding of CUDA's libdevice. Triton's interpreter runs kernels as
Python over NumPy arrays but cannot call libdevice, so under the interpreter
the generated module imports this `libdevice` namespace instead: each
function applies the NumPy function of the same meaning to the tensor's data.

Importing this module also corrects two faults of the interpreter that
generated kernels meet: its bfloat16 conversions (`_convert_bfloat16`),
used at every load and store of a bfloat16 tensor, and its broadcasting of
a scalar comparison (`_splat_bools`).
"""
from __future__ import annotations

import types

import numpy as np


def _wrap(np_fn, result_dtype=None):
    def fn(*args):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        like = next(a for a in args if isinstance(a, tl.tensor))
        data = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(a, like.handle.data.dtype) for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(np_fn(*data))
        if result_dtype is None:
            out = out.astype(like.handle.data.dtype)
            return tl.tensor(TensorHandle(out, like.type.scalar), like.type)
        out = out.astype(np.int32)
        block = like.type.with_element_ty(tl.int32) if like.type.is_block() else tl.int32
        return tl.tensor(TensorHandle(out, tl.int32), block)

    return fn


libdevice = types.SimpleNamespace(
    tanh=_wrap(np.tanh), atan2=_wrap(np.arctan2), pow=_wrap(np.power), rint=_wrap(np.rint),
    nearbyint=_wrap(np.rint), trunc=_wrap(np.trunc), asin=_wrap(np.arcsin), acos=_wrap(np.arccos),
    atan=_wrap(np.arctan), sinh=_wrap(np.sinh), cosh=_wrap(np.cosh), tan=_wrap(np.tan),
    expm1=_wrap(np.expm1), log1p=_wrap(np.log1p), isinf=_wrap(np.isinf, "int32"), isnan=_wrap(np.isnan, "int32"),
)


# -- bfloat16 under the interpreter ----------------------------------------------------------
# The interpreter keeps bfloat16 values as their bits in uint16 arrays. Its conversions truncate
# float32 instead of rounding to nearest even, and convert integers, bools and float64 to bfloat16
# by NumPy's astype(uint16), which gives bits, not values. The GPU rounds to nearest even, as
# PyTorch does (through float32, for wider types).
def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    single = values.astype(np.float32)
    bits = single.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    quiet_nan = ((bits >> 16) | 0x40).astype(np.uint16)
    return np.where(np.isnan(single), quiet_nan, rounded)


def _bfloat16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _convert_bfloat16(builder_cls) -> None:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle, _get_np_dtype

    cast_impl, fp_to_fp = builder_cls.cast_impl, builder_cls.create_fp_to_fp

    def convert(src, dst_type):
        src_type, dst = src.dtype.scalar, dst_type.scalar
        if src_type == dst:
            return TensorHandle(src.data.copy(), dst)
        data = _bfloat16_values(src.data) if src_type == tl.bfloat16 else src.data
        data = _bfloat16_bits(data) if dst == tl.bfloat16 else data.astype(_get_np_dtype(dst))
        return TensorHandle(data, dst)

    def patched_cast(self, src, dst_type):
        if tl.bfloat16 in (src.dtype.scalar, dst_type.scalar):
            return convert(src, dst_type)
        return cast_impl(self, src, dst_type)

    def patched_fp_to_fp(self, src, dst_type, rounding_mode):
        if tl.bfloat16 in (src.dtype.scalar, dst_type.scalar):
            return convert(src, dst_type)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    builder_cls.cast_impl, builder_cls.create_fp_to_fp = patched_cast, patched_fp_to_fp


# A comparison's result keeps its operands' dtype in the interpreter's handle (bool data labelled
# float32, say). Broadcasting a scalar one, as a kernel does with a value loaded once for a whole
# block, then made float data of it, and `flag | other_flags` failed.
def _splat_bools(builder_cls) -> None:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    splat = builder_cls.create_splat

    def patched_splat(self, ret_ty, arg):
        if arg.data.dtype == np.bool_:
            return TensorHandle(np.full(ret_ty.shape, arg.data.reshape(-1)[0], dtype=np.bool_), tl.int1)
        return splat(self, ret_ty, arg)

    builder_cls.create_splat = patched_splat


def _patch() -> None:
    from triton.runtime import interpreter

    _convert_bfloat16(interpreter.InterpreterBuilder)
    _splat_bools(interpreter.InterpreterBuilder)


_patch()
