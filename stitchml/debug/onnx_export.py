"""A graph as an ONNX model (opset 18), for checking it in other tools (onnxruntime, Netron).

The ops covered are those with a one-node ONNX form that the importer also
reads back: elementwise math and comparisons, matrix multiplication,
reductions, reshape, transpose and cast. Composites (softmax, gelu...) are
already primitives in the graph. Any other op is a GraphError naming it.
Tensor names become ONNX value names, so `onnx_reference` of the exported
model matches the graph's tensors by name in `bisect`.

    >>> import os, tempfile, numpy as np, onnxruntime as ort, stitchml as sm
    >>> from stitchml import debug
    >>> g = sm.Graph(); x = g.placeholder((2,), sm.float32, name="x")
    >>> y = g.tanh(x * 2.0, name="y")
    >>> path = os.path.join(tempfile.mkdtemp(), "tanh.onnx")
    >>> debug.export_onnx(g, path, [y])
    >>> ort.InferenceSession(path).run(["y"], {"x": np.ones(2, np.float32)})[0].round(4)
    array([0.964, 0.964], dtype=float32)
"""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from ..errors import GraphError
from ..ir import Operation, Tensor
from ..runtime.eager import prune

OPSET = 18
_UNARY = {"exponent": "Exp", "logarithm": "Log", "square_root": "Sqrt", "negative": "Neg", "absolute": "Abs",
          "tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf", "sin": "Sin", "cos": "Cos",
          "floor": "Floor", "ceil": "Ceil", "reciprocal": "Reciprocal", "sign": "Sign", "round": "Round",
          "stop_gradient": "Identity", "identity": "Identity", "logical_not": "Not"}
_BINARY = {"addition": "Add", "subtraction": "Sub", "multiplication": "Mul", "power": "Pow", "maximum": "Max",
           "minimum": "Min", "equal": "Equal", "less_than": "Less", "greater_than": "Greater",
           "less_than_or_equal_to": "LessOrEqual", "greater_than_or_equal_to": "GreaterOrEqual",
           "logical_and": "And", "logical_or": "Or", "matrix_multiplication": "MatMul"}
_REDUCE = {"reduction_sum": "ReduceSum", "reduction_mean": "ReduceMean", "reduction_maximum": "ReduceMax",
           "reduction_minimum": "ReduceMin", "reduction_product": "ReduceProd"}


def _elem(dtype) -> int:
    from onnx import TensorProto as T

    table = {"float32": T.FLOAT, "float64": T.DOUBLE, "float16": T.FLOAT16, "bfloat16": T.BFLOAT16,
             "int64": T.INT64, "int32": T.INT32, "int16": T.INT16, "int8": T.INT8, "uint8": T.UINT8, "bool": T.BOOL,
             "uint16": T.UINT16, "uint32": T.UINT32, "uint64": T.UINT64, "float8_e4m3fn": T.FLOAT8E4M3FN,
             "float8_e5m2": T.FLOAT8E5M2, "float8_e4m3fnuz": T.FLOAT8E4M3FNUZ, "float8_e5m2fnuz": T.FLOAT8E5M2FNUZ}
    return table[str(dtype)]


def _fail(op: Operation, why: str) -> GraphError:
    return GraphError(f"export_onnx: {op.op} ({op.name}, built at {op.location}) {why}")


def _node(op: Operation, helper, add_init) -> list:
    ins, outs = [t.name for t in op.inputs], [t.name for t in op.outputs]
    kind = op.op
    if kind in _UNARY:
        return [helper.make_node(_UNARY[kind], ins, outs, name=op.name)]
    if kind in _BINARY:
        return [helper.make_node(_BINARY[kind], ins, outs, name=op.name)]
    if kind == "division":
        if not op.outputs[0].dtype.is_floating:
            raise _fail(op, "divides integers, which ONNX Div truncates where StitchML floors")
        return [helper.make_node("Div", ins, outs, name=op.name)]
    if kind == "select":
        return [helper.make_node("Where", ins, outs, name=op.name)]
    if kind in _REDUCE:
        axes = op.attrs.get("axes")
        extra = [] if axes is None else [add_init(f"{op.name}.axes", np.asarray(axes, np.int64))]
        return [helper.make_node(_REDUCE[kind], ins + extra, outs, name=op.name,
                                 keepdims=int(bool(op.attrs.get("keep_dims"))))]
    if kind == "reshape":
        if op.outputs[0].shape is None or -1 in op.outputs[0].shape:
            raise _fail(op, "has an unknown output extent; export a graph with known shapes")
        shape = add_init(f"{op.name}.shape", np.asarray(op.outputs[0].shape, np.int64))
        return [helper.make_node("Reshape", ins + [shape], outs, name=op.name)]
    if kind == "transpose" and "permutation" in op.attrs:
        return [helper.make_node("Transpose", ins, outs, name=op.name, perm=list(op.attrs["permutation"]))]
    if kind == "cast":
        return [helper.make_node("Cast", ins, outs, name=op.name, to=_elem(op.outputs[0].dtype))]
    raise _fail(op, "has no ONNX form in export_onnx (docs/debugging.md lists the ops it covers)")


def export_onnx(graph, path: str | os.PathLike, targets: Iterable[Tensor] | None = None) -> None:
    """Write the ops `targets` need (default: every value no op consumes) as an ONNX model at `path`."""
    import onnx
    from onnx import helper, numpy_helper

    if targets is None:
        used = {t.id for op in graph.operations for t in op.inputs}
        targets = [t for op in graph.operations if op.op not in ("placeholder", "constant", "variable")
                   for t in op.outputs if t.id not in used]
    targets = list(targets)
    inputs, inits, nodes = [], [], []

    def add_init(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value, name))
        return name

    for op in prune(graph, targets, ()):
        t = op.outputs[0] if op.outputs else None
        if op.op == "placeholder":
            shape = None if t.shape is None else [None if d == -1 else d for d in t.shape]
            inputs.append(helper.make_tensor_value_info(t.name, _elem(t.dtype), shape))
        elif op.op == "constant":
            value = op.attrs["value"]
            if str(t.dtype) == "bfloat16":
                raise _fail(op, "is a bfloat16 constant, which NumPy cannot hold")
            add_init(t.name, value.detach().cpu().numpy().reshape(t.shape))
        elif op.op in ("variable", "read_variable", "assign_variable"):
            raise _fail(op, "reads or writes a variable; export the graph for inference with constants instead")
        else:
            nodes.extend(_node(op, helper, add_init))
    outputs = [helper.make_tensor_value_info(t.name, _elem(t.dtype), None if t.shape is None else
                                             [None if d == -1 else d for d in t.shape]) for t in targets]
    model = helper.make_model(helper.make_graph(nodes, graph.name, inputs, outputs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", OPSET)], producer_name="stitchml")
    model.ir_version = min(model.ir_version, 10)  # readable by the onnxruntime releases we test against
    onnx.checker.check_model(model)
    onnx.save(model, os.fspath(path))
