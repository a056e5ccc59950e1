"""CUDA's math library under TRITON_INTERPRET=1 (the CPU path of CI).

Generated kernels call `libdevice.tanh`, `libdevice.atan2`... On the GPU that
is Triton's binding of CUDA's libdevice. Triton's interpreter runs kernels as
Python over NumPy arrays but cannot call libdevice, so under the interpreter
the generated module imports this `libdevice` namespace instead: each
function applies the NumPy function of the same meaning to the tensor's data.
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
