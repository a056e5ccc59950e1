"""ONNX to package: walk the model's nodes and build the same graph with StitchML builders.

Each ONNX value becomes a graph `Tensor`, or stays a *known* value while it
is computable at import time: initializers, Constant nodes and whatever is
folded from them (the builder folds ops of small constants). Shape arithmetic
on symbolic extents (``Shape(x)`` where x has a ``dim_param``) is tracked as
`Dims` (onnx_values.py): a vector whose entries are ints or "extent `axis` of tensor t", so
``Reshape(x, Concat(Shape(x)[0:1], [-1]))`` becomes a reshape that copies the
batch extent at run time. The op handlers live in onnx_ops.py (with
onnx_nn.py and onnx_rnn.py), one per ONNX operator, in a table keyed by op type.
The function's `origins` map each ONNX value a node computed, by its name, to
the graph tensor that holds it (`Function.origin_names()`).

    pkg = sm.package.from_onnx("resnet18.onnx")
    print(pkg.function("main").inputs[0])      # input: float32[batch, 3, 224, 224]
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
import torch

from .. import dtypes
from ..errors import PackageError, StitchError
from ..graph import Graph
from ..ir import UNKNOWN, Tensor, TensorType, needed_ops
from ..version import __version__
from . import onnx_attention, onnx_bits, onnx_control, onnx_nn, onnx_rnn, onnx_tensor  # noqa: F401  (each registers its handlers in onnx_ops.HANDLERS)
from .limits import Limits, known_elements, resolve
from .onnx_ops import HANDLERS
from .onnx_values import Dims, onnx_dtype
from .package import Function, Origin, Package, Port
from .specialise import SpecializedFunction

SUBGRAPH_OPS = frozenset({"Scan", "Loop", "If"})  # operators whose graph attributes the handlers read
MIN_OPSET = 1  # handlers read both the attribute and the operand forms; 13+ is what docs/packages.md promises

class ImportTimeValueError(PackageError):
    """An operand the importer needs at import time (axes, a shape, pads) is only known at run time.

    `inputs` names the graph inputs it is computed from; `shapes` says it depends on their extents (a
    ``Shape`` the importer cannot follow symbolically) rather than on their values. `from_onnx` turns such a
    model into a function specialised per value or per input shapes at run time (specialise.py).
    """

    def __init__(self, message: str, inputs: tuple[str, ...] = (), shapes: bool = False):
        super().__init__(message)
        self.inputs = tuple(inputs)
        self.shapes = shapes

    @property
    def input_name(self) -> str | None:
        """The one graph input the value is, when it is one."""
        return self.inputs[0] if len(self.inputs) == 1 else None


def _sources(tensors: Sequence[Tensor]) -> tuple[str, ...]:
    """The placeholders (graph inputs) the tensors are computed from, in order of first reach."""
    seen, found, stack = set(), [], list(tensors)
    while stack:
        t = stack.pop()
        if not isinstance(t, Tensor) or t.op.id in seen:
            continue
        seen.add(t.op.id)
        if t.op.op == "placeholder":
            found.append(t.name)
        stack.extend(t.op.inputs)
    return tuple(found)


class Importer:
    """The state of one import: the graph, the ONNX value table and the opset."""

    def __init__(self, model, name: str, bind: dict[str, Any] | None = None, limits: Limits | None = None,
                 shapes: dict[str, tuple[int, ...]] | None = None):
        self.model = model
        self.shapes = dict(shapes or {})  # input extents fixed for this import (a shape specialisation)
        self.limits = resolve(limits)
        self.unrolled_steps = 0  # recurrent steps unrolled so far, over every layer (onnx_rnn.py)
        self.bind = dict(bind or {})
        self.g = Graph(model.graph.name or name)
        self.values: dict[str, Any] = {}  # ONNX name -> Tensor | Dims
        self.origins: dict[str, Origin] = {}  # ONNX value a node computed -> where it lives in the graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.node = None

    # -- values ---------------------------------------------------------------
    def where(self) -> str:
        n = self.node
        return f"node {n.name or '?'!r} ({n.op_type})" if n is not None else "graph"

    def fail(self, message: str) -> PackageError:
        return PackageError(f"{self.where()}: {message}")

    def over(self, name: str, found: int, what: str) -> PackageError:
        """The error for a limit (limits.py) this node would exceed."""
        return self.limits.exceeded(name, found, f"{self.where()}: {what}")

    def axis(self, axis: Any, rank: int, what: str = "axis") -> int:
        """`axis` counted from 0, refusing one outside [-rank, rank) as the operator specs do."""
        if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -rank <= axis < rank:
            raise self.fail(f"{what} {axis!r} is outside [{-rank}, {rank}) for an input of rank {rank}")
        return int(axis) % rank

    def check_size(self, value: Any) -> None:
        """Refuse a value whose known extents hold more elements than max_tensor_elements."""
        if isinstance(value, Tensor) and known_elements(value.shape) > self.limits.max_tensor_elements:
            raise self.over("max_tensor_elements", known_elements(value.shape), f"result of {value.type} elements")

    def constant(self, array: np.ndarray) -> Tensor:
        array = np.asarray(array)
        dt = dtypes.as_dtype(array.dtype) if array.dtype.name in {d.name for d in dtypes.ALL} else None
        if dt is None:
            raise self.fail(f"constant of NumPy type {array.dtype} has no StitchML dtype")
        return self.g.constant(np.array(array, order="C", copy=True), dt)

    def tensor(self, value: Any) -> Tensor:
        """A graph tensor for a value (known Dims become constants)."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, Dims):
            known = value.known()
            if known is None:
                raise self.symbolic(value)
            return self.constant(known)
        return self.constant(value)

    def symbolic(self, value: Dims) -> ImportTimeValueError:
        """The error for a shape vector with run-time extents used where the importer cannot follow it."""
        tensors = [e[0] for e in value.entries if isinstance(e, tuple)]
        return ImportTimeValueError(f"{self.where()}: this computes with symbolic extents in a way the importer "
                                    "cannot follow symbolically", _sources(tensors), shapes=True)

    def static(self, value: Any, what: str) -> np.ndarray:
        """The value as a NumPy array; ImportTimeValueError when it is only known at run time."""
        if isinstance(value, Dims):
            known = value.known()
            if known is not None:
                return known
            raise self.symbolic(value)
        elif isinstance(value, Tensor) and value.op.op == "constant":
            v = value.op.attrs["value"]
            # NumPy has no bfloat16 or float8 types: their values as float32 (exact)
            return (v.float() if v.dtype == torch.bfloat16 or dtypes.as_dtype(v.dtype).is_float8 else v).numpy()
        elif isinstance(value, np.ndarray):
            return value
        raise ImportTimeValueError(f"{self.where()}: {what} must be known when the model is imported "
                                   "(a constant or an initializer, or computed from graph inputs)",
                                   _sources([value]) if isinstance(value, Tensor) else ())

    def known(self, value: Any, what: str) -> np.ndarray | None:
        """The value as a NumPy array when it is known at import time, else None (control flow then steers
        with it at run time)."""
        try:
            return self.static(value, what)
        except ImportTimeValueError:
            return None

    def dims(self, value: Any, what: str) -> list:
        """A shape vector as entries: ints and (tensor, axis) pairs."""
        if isinstance(value, Dims):
            return list(value.entries)
        return [int(v) for v in self.static(value, what).reshape(-1)]

    # -- the walk ---------------------------------------------------------------
    def run_node(self, node) -> None:
        """Import one node: its handler's results become the values of its outputs."""
        self.node = node
        if node.domain not in ("", "ai.onnx"):
            raise self.fail(f"operators of domain {node.domain!r} are not supported")
        handler = HANDLERS.get(node.op_type)
        if handler is None:
            raise self.fail("this operator is not supported by the importer (docs/packages.md lists those that are)")
        missing = [n for n in node.input if n and n not in self.values]
        if missing:
            raise self.fail(f"inputs {missing} are not defined before the node")
        args = [self.values[n] if n else None for n in node.input]
        try:
            results = handler(self, node, args, attributes(node))
        except PackageError:
            raise
        except StitchError as e:
            raise self.fail(str(e)) from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            # A required attribute or operand is missing or of the wrong kind.
            raise self.fail(f"malformed node: {type(e).__name__}: {e}") from None
        except (ArithmeticError, RuntimeError, MemoryError) as e:
            # Folding constants evaluates the op now: torch refuses what the model's values make undefined.
            raise self.fail(f"cannot be evaluated on its constant operands ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None
        for out_name, value in zip(node.output, results):
            self.check_size(value)
            if out_name:
                self.values[out_name] = value
                if isinstance(value, Tensor):
                    self.origins[out_name] = Origin(out_name, out_name, node.op_type, value.name)
        if len(self.g.operations) > self.limits.max_operations:
            raise self.over("max_operations", len(self.g.operations), "operations built so far")

    def run_subgraph(self, graph, bound: dict[str, Any]) -> list:
        """Import a control-flow body once: its inputs bound to values, its initializers made constants;
        returns the values of its outputs. Outer values stay visible, as ONNX scoping says."""
        outer = self.node
        for init in graph.initializer:
            self.values[init.name] = self.tensor(_array(init, f"initializer {init.name!r}"))
        self.values.update(bound)
        for node in graph.node:
            self.run_node(node)
        self.node = outer
        missing = [o.name for o in graph.output if o.name not in self.values]
        if missing:
            raise self.fail(f"the body's outputs {missing} are not computed by any of its nodes")
        return [self.values[o.name] for o in graph.output]

    def run(self) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, list]]:
        graph = self.model.graph
        initializers = {init.name for init in graph.initializer}
        for init in graph.initializer:
            self.values[init.name] = self.tensor(_array(init, f"initializer {init.name!r}"))
            self.check_size(self.values[init.name])
        inputs, dim_names = {}, {}
        for vi in graph.input:
            if vi.name in initializers:
                continue
            if vi.name in self.bind:
                self.values[vi.name] = self.tensor(np.asarray(self.bind[vi.name]))
                continue
            dt, shape, names = value_type(vi)
            if vi.name in self.shapes:
                shape = tuple(self.shapes[vi.name])
            inputs[vi.name] = self.g.placeholder(shape, dt, name=vi.name)
            self.check_size(inputs[vi.name])
            self.values[vi.name] = inputs[vi.name]
            dim_names[vi.name] = names
        self.g._fold_constants = True
        for node in graph.node:
            self.run_node(node)
        self.node = None
        self.g._fold_constants = False
        outputs = {}
        for vi in graph.output:
            if vi.name not in self.values:
                raise PackageError(f"graph output {vi.name!r} is not computed by any node")
            value = self.tensor(self.values[vi.name])
            outputs[vi.name] = self.g.identity(value, name=vi.name) if value.op.op == "placeholder" else value
            dim_names[vi.name] = value_type(vi)[2] if vi.type.tensor_type.HasField("shape") else None
        _prune(self.g, list(outputs.values()))
        return inputs, outputs, {k: v for k, v in dim_names.items() if v is not None}


def value_type(vi) -> tuple[dtypes.DType, tuple[int, ...] | None, list | None]:
    """dtype, shape (-1 for dim_param and unknown extents) and extent names of a graph input/output."""
    where = f"graph value {vi.name!r}"
    if not vi.type.HasField("tensor_type"):
        raise PackageError(f"{where}: only tensor values are supported, got {vi.type.WhichOneof('value')}")
    tt = vi.type.tensor_type
    dt = onnx_dtype(tt.elem_type, where)
    if not tt.HasField("shape"):
        return dt, None, None
    shape = tuple(d.dim_value if d.HasField("dim_value") else UNKNOWN for d in tt.shape.dim)
    if any(d.HasField("dim_value") and d.dim_value < 0 for d in tt.shape.dim):
        raise PackageError(f"{where}: negative extent in shape {[d.dim_value for d in tt.shape.dim]}")
    names = [d.dim_param if d.HasField("dim_param") and d.dim_param else None for d in tt.shape.dim]
    return dt, shape, names


def _array(proto, where: str) -> np.ndarray:
    from onnx import numpy_helper

    if proto.data_location == proto.EXTERNAL:
        raise PackageError(f"{where}: external tensor data is not supported; save the model with its weights inline")
    onnx_dtype(proto.data_type, where)
    if any(d < 0 for d in proto.dims):
        raise PackageError(f"{where}: negative extent in dims {list(proto.dims)}")
    try:
        return numpy_helper.to_array(proto)
    except (ValueError, TypeError) as e:
        raise PackageError(f"{where}: unreadable tensor ({e})") from None


def attributes(node) -> dict[str, Any]:
    """Node attributes as Python values (tensors as NumPy arrays)."""
    from onnx import AttributeProto, helper

    out = {}
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            out[a.name] = _array(a.t, f"attribute {a.name!r} of node {node.name!r}")
        elif a.type == AttributeProto.GRAPH and node.op_type in SUBGRAPH_OPS:
            out[a.name] = a.g  # imported by the handler, unrolled (onnx_control.py)
        elif a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            raise PackageError(f"node {node.name!r} ({node.op_type}): control flow subgraphs are not supported")
        else:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _prune(graph: Graph, outputs: Sequence[Tensor]) -> None:
    """Drop operations the outputs do not need (left behind by folding); placeholders stay."""
    needed = {op.id for op in needed_ops(graph.operations, [t.op for t in outputs])}
    graph.operations = [op for op in graph.operations if op.id in needed or op.op == "placeholder"]


def load_model(model: Any, limits: Limits | None = None):
    """A ModelProto from a path, bytes or a ModelProto; a file must be a regular file within max_model_bytes."""
    import onnx

    from .container import open_regular

    limits = resolve(limits)
    if isinstance(model, onnx.ModelProto):
        return model
    try:
        if isinstance(model, (bytes, bytearray)):
            data = bytes(model)
        else:
            path = os.fspath(model)
            fd, size = open_regular(os.path.realpath(path), f"ONNX model {path}")
            with os.fdopen(fd, "rb") as f:
                if size > limits.max_model_bytes:
                    raise limits.exceeded("max_model_bytes", size, f"ONNX model {path}: size in bytes")
                data = f.read(size + 1)
        if len(data) > limits.max_model_bytes:
            raise limits.exceeded("max_model_bytes", len(data), "ONNX model: size in bytes")
        return onnx.load_model_from_string(data)
    except PackageError:
        raise
    except (OSError, TypeError) as e:
        raise PackageError(f"cannot read the ONNX model {model!r:.200} ({e})") from None
    except Exception as e:  # protobuf's DecodeError has no stable import path
        raise PackageError(f"{model!r:.200} is not a valid ONNX model ({type(e).__name__}: {e})") from None


def check_model(proto, limits: Limits) -> None:
    """Refuse what ONNX's checker refuses (with strict shape inference), and what it lets through:
    duplicate initializers or node outputs, negative extents, graphs over max_nodes."""
    import onnx

    graph = proto.graph
    if len(graph.node) > limits.max_nodes:
        raise limits.exceeded("max_nodes", len(graph.node), "the ONNX graph's nodes")
    defined: set[str] = set()
    for what, names in (("initializer", [i.name for i in graph.initializer]),
                        ("graph input", [v.name for v in graph.input if v.name not in
                                         {i.name for i in graph.initializer}]),
                        ("node output", [o for n in graph.node for o in n.output if o])):
        for name in names:
            if name in defined:
                raise PackageError(f"{what} {name!r} is defined twice (ONNX graphs assign each name once)")
            defined.add(name)
    outputs = [o.name for o in graph.output]
    if len(set(outputs)) != len(outputs):
        raise PackageError(f"graph outputs {outputs} name a value twice")
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
            if any(d < 0 for d in dims):
                raise PackageError(f"graph value {vi.name!r}: negative extent in shape {dims}")
    for init in graph.initializer:
        if init.data_location == init.EXTERNAL:
            raise PackageError(f"initializer {init.name!r}: external tensor data is not supported; "
                               "save the model with its weights inline")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except onnx.shape_inference.InferenceError as e:
        if not _only_function_bodies(proto, str(e)):
            raise PackageError(f"the ONNX checker refuses the model (shape inference: "
                               f"{str(e).strip()[:400]})") from None
    except Exception as e:  # ValidationError and whatever else the checker refuses with
        raise PackageError(f"the ONNX checker refuses the model ({type(e).__name__}: "
                           f"{str(e).strip()[:400]})") from None


def _only_function_bodies(proto, message: str) -> bool:
    """Whether every inference error is in the function body of an operator that has no inference rule
    of its own: ONNX infers those by expanding the body, which fails on some valid models (MVN with its
    default axes). The importer's own checks still apply to such nodes."""
    import re

    import onnx

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    failing = set(re.findall(r"\(op_type:(\w+)", message)) & {n.op_type for n in proto.graph.node}
    if not failing:
        return False
    for op in failing:
        try:
            schema = onnx.defs.get_schema(op, opset)
        except onnx.defs.SchemaError:
            return False
        if schema.has_type_and_shape_inference_function or not schema.has_function:
            return False
    return True


def from_onnx(model: Any, name: str = "main", bind: dict[str, Any] | None = None,
              limits: Limits | None = None) -> Package:
    """Import an ONNX model into a one-function package; PackageError names the node that failed.

    An operand the graph needs as a constant (axes, a shape, pads, repeats) that
    the model computes from its inputs makes the function specialised at run
    time on those inputs' values (specialise.py); `bind` fixes graph inputs to
    values (arrays) at import time instead. The model must pass ONNX's checker
    (`onnx.checker.check_model(full_check=True)`); `limits` bounds what importing
    may cost (limits.py). Any invalid or hostile model raises PackageError.

    >>> import onnx, numpy as np, stitchml as sm
    >>> from onnx import helper, TensorProto as T
    >>> node = helper.make_node("Relu", ["x"], ["y"])
    >>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, ["n", 2])],
    ...                           [helper.make_tensor_value_info("y", T.FLOAT, ["n", 2])])
    >>> pkg = sm.package.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    >>> pkg.function()(x=np.array([[-1.0, 2.0]], np.float32))["y"].numpy().tolist()
    [[0.0, 2.0]]
    """
    limits = resolve(limits)
    proto = load_model(model, limits)
    check_model(proto, limits)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        raise PackageError(f"the model uses opset {opset}; the importer reads opset {MIN_OPSET} and later "
                           "(13 and later fully); convert it with onnx.version_converter")
    producer = {"name": "stitchml.onnx", "version": __version__,
                "source": f"ONNX opset {opset}, from {proto.producer_name or 'unknown'} "
                          f"{proto.producer_version}".rstrip()}
    try:
        fn = import_graph(proto, name, bind, limits)
    except ImportTimeValueError as e:
        fn = _specialised(proto, name, bind, limits, e)
    return Package({name: fn}, producer)


def import_graph(proto, name: str, bind: dict[str, Any] | None, limits: Limits,
                 shapes: dict[str, tuple[int, ...]] | None = None) -> Function:
    """The function of a checked model: one graph, `bind`'s inputs fixed to values, `shapes`' extents fixed."""
    importer = Importer(proto, name, bind, limits, shapes)
    inputs, outputs, dim_names = importer.run()
    return Package.from_graph(importer.g, inputs, outputs, name=name, dim_names=dim_names,
                              origins=importer.origins).function(name)


def _specialised(proto, name: str, bind: dict[str, Any] | None, limits: Limits, error: ImportTimeValueError):
    """A function specialised at run time on the inputs `error` says an import-time operand comes from."""
    initializers = {i.name for i in proto.graph.initializer}
    graph_inputs = [vi for vi in proto.graph.input if vi.name not in initializers and vi.name not in (bind or {})]
    if not error.inputs or not set(error.inputs) <= {vi.name for vi in graph_inputs}:
        raise error
    ports = []
    for vi in [*graph_inputs, *proto.graph.output]:
        dt, shape, names = value_type(vi)
        ports.append(Port(vi.name, TensorType(shape, dt), None if names is None else tuple(names)))
    values = () if error.shapes else error.inputs
    return SpecializedFunction(name, proto, {"limits": limits}, ports[:len(graph_inputs)],
                               ports[len(graph_inputs):], values, error.shapes, import_graph, ImportTimeValueError)
