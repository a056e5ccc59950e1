"""StitchML: a graph compiler and runtime for tensor programs.

Build a graph of tensors and operations, MPSGraph style, and run it on the CPU
or an NVIDIA GPU:

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph()
    >>> x = g.placeholder((-1, 4), sm.float32, name="x")
    >>> y = g.gelu(x)
    >>> g.run({x: np.ones((2, 4), np.float32)}, [y], device="cpu")[y].shape
    (2, 4)
"""
from . import ops as _ops  # registers every primitive
from . import composites as _composites  # registers the composites
from . import distributed, nn, optim  # data parallelism; layers; the update rules and SGD, Adam, AdamW
from .dtypes import (DType, bfloat16, float16, float32, float64, int8, int16, int32, int64, uint8,
                     uint16, uint32, uint64, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz,
                     as_dtype, promote)
from .dtypes import bool_ as bool  # noqa: A001  (stitchml.bool, like torch.bool)
from .errors import (DataError, DeviceError, ExecutionError, FeedError, GraphError, LayoutError, PackageError,
                     PipelineError, SerializationError, ShapeError, StitchError)
from .graph import Graph
from .ir import Operation, Tensor, TensorType
from .ops import Convolution2DDescriptor, Pooling2DDescriptor
from .registry import BUILDERS as _BUILDERS, REGISTRY
from .tensor_data import TensorData

for _name, _fn in _BUILDERS.items():
    if _name in vars(Graph):
        raise RuntimeError(f"builder {_name!r} would shadow Graph.{_name}")
    if not hasattr(Graph, _name):  # registered since graph_methods.py was generated: works, the test says so
        setattr(Graph, _name, _fn)

from .version import __version__  # noqa: E402

from . import package  # noqa: E402  (network packages need the builders attached above)
from .package import load_package  # noqa: E402
from .pipeline import Compiler, MLPipelineDescriptor, device, write_trace  # noqa: E402

__all__ = [
    "Graph", "Tensor", "TensorType", "Operation", "TensorData", "DType", "REGISTRY",
    "Convolution2DDescriptor", "Pooling2DDescriptor",
    "float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool",
    "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "as_dtype", "promote",
    "StitchError", "ShapeError", "FeedError", "GraphError", "ExecutionError", "LayoutError", "SerializationError",
    "DataError", "DeviceError", "distributed", "nn", "optim",
    "PackageError", "PipelineError", "package", "load_package",
    "device", "Compiler", "MLPipelineDescriptor", "write_trace",
]
