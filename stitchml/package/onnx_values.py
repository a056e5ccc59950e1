"""The values ONNX handlers and the importer share: element types and shape vectors.

`onnx_dtype` maps an ONNX TensorProto element type to ours; `Dims` is a shape
vector under construction whose entries are ints or "extent `axis` of tensor
t", so shapes computed in the model (Shape -> Gather -> Concat -> Reshape)
keep a batch extent known only at run time.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import dtypes
from ..errors import PackageError

# ONNX TensorProto element types we have a dtype for.
_ONNX_DTYPES = {1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 5: dtypes.int16, 6: dtypes.int32,
                7: dtypes.int64, 9: dtypes.bool_, 10: dtypes.float16, 11: dtypes.float64, 16: dtypes.bfloat16,
                4: dtypes.uint16, 12: dtypes.uint32, 13: dtypes.uint64, 17: dtypes.float8_e4m3fn,
                18: dtypes.float8_e4m3fnuz, 19: dtypes.float8_e5m2, 20: dtypes.float8_e5m2fnuz}


def onnx_dtype(code: int, where: str) -> dtypes.DType:
    if code not in _ONNX_DTYPES:
        import onnx

        name = onnx.TensorProto.DataType.Name(code) if code in onnx.TensorProto.DataType.values() else str(code)
        raise PackageError(f"{where}: element type {name} is not supported "
                           f"(supported: {', '.join(d.name for d in _ONNX_DTYPES.values())})")
    return _ONNX_DTYPES[code]


@dataclass
class Dims:
    """A shape vector under construction: ints, or (tensor, axis) for an extent known at run time."""

    entries: list
    scalar: bool = False

    def known(self) -> np.ndarray | None:
        if any(isinstance(e, tuple) for e in self.entries):
            return None
        a = np.array(self.entries, dtype=np.int64)
        return a.reshape(()) if self.scalar else a
