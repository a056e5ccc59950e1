"""torch.export to package: export, decompose to core ATen, map each ATen op to StitchML builders.

``torch.export.export`` traces the module into an FX graph of ATen ops;
``run_decompositions`` with the default (core ATen) table brings it down to
about a hundred operators, of which the table in torch_ops.py maps the ones
CNNs, RNNs and transformers use. Parameters, buffers and lifted constants
become graph constants (weights); user inputs become placeholders, with -1
for every extent a `torch.export.Dim` made symbolic, named after the Dim.
Symbolic sizes that reach shapes (``view(x, [s0, -1])``) are tracked as
(tensor, axis) entries and become run-time extents (package/shapes.py).

The ops built for an ATen node carry the node's source line (the innermost
frame of its stack trace outside torch itself: the model's own code) as
their `location`, and the submodule that ran it as their `scope`; the
function's `origins` map each node (``module#k``, `origin_keys`) to the
tensor holding its value.

    >>> import torch, stitchml as sm
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> batch = torch.export.Dim("batch")
    >>> pkg = sm.package.from_torch(m, (torch.randn(2, 4),), dynamic_shapes=({0: batch},))
    >>> str(pkg.function().inputs[0])
    'input: float32[batch, 4]'
"""
from __future__ import annotations

import inspect
import os
import re
from typing import Any, Sequence

import torch

from .. import dtypes
from ..errors import PackageError, StitchError
from ..graph import Graph
from ..ir import UNKNOWN, Tensor
from ..version import __version__
from .limits import Limits, known_elements, resolve
from .package import Origin, Package

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


class TorchImporter:
    """The state of one import: the graph and the FX value table."""

    def __init__(self, program, name: str):
        self.program = program
        self.g = Graph(name)
        self.values: dict[str, Any] = {}
        self.node = None

    def where(self) -> str:
        n = self.node
        return f"node {n.name} ({n.target})" if n is not None else "program"

    def fail(self, message: str) -> PackageError:
        return PackageError(f"{self.where()}: {message}")

    def tensor(self, value: Any, like: Tensor | None = None) -> Tensor:
        """A graph tensor for a value; Python scalars take like's dtype (weak typing, as in torch)."""
        if isinstance(value, Tensor):
            return value
        if isinstance(value, (bool, int, float)):
            return self.g.as_tensor(value, like.dtype if like is not None else None)
        if isinstance(value, torch.Tensor):
            return self.g.constant(value.detach().cpu().contiguous())
        raise self.fail(f"expected a tensor operand, got {type(value).__name__}")

    def arg(self, a: Any) -> Any:
        """An FX argument as a value: nodes looked up, lists mapped, the rest as is."""
        if isinstance(a, torch.fx.Node):
            return self.values[a.name]
        if isinstance(a, (list, tuple)):
            return [self.arg(x) for x in a]
        return a

    def ints(self, values: Sequence[Any], what: str) -> list[int]:
        out = []
        for v in values:
            if not isinstance(v, int):
                raise self.fail(f"{what} must be known when the model is exported; got a symbolic {v!r}")
            out.append(v)
        return out


def _leaf_specs(value: Any, spec: Any, out: list) -> None:
    """The dynamic_shapes spec of every leaf of `value`, in the order torch.export flattens inputs."""
    if isinstance(value, (list, tuple)):
        specs = spec if isinstance(spec, (list, tuple)) and len(spec) == len(value) else [None] * len(value)
        for v, sp in zip(value, specs):
            _leaf_specs(v, sp, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _leaf_specs(v, spec.get(k) if isinstance(spec, dict) else None, out)
    else:
        out.append(spec if isinstance(value, torch.Tensor) else None)


def _symbol_names(module, program, example_inputs: Sequence[Any], dynamic_shapes) -> dict[str, str]:
    """Symbolic extent (as torch prints it, e.g. ``s31``) -> the name of the torch.export.Dim that made it.

    Specs are matched to the user inputs the way torch.export matches them: per parameter of
    ``forward`` (``*args`` takes the remaining inputs as one tuple) or per input, then flattened."""
    if dynamic_shapes is None:
        return {}
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    values, names, rest = [], [], list(example_inputs)
    for p in params:
        if not rest:
            break
        if p.kind == p.VAR_POSITIONAL:
            values.append(tuple(rest))
            rest = []
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            values.append(rest.pop(0))
        else:
            break
        names.append(p.name)
    if isinstance(dynamic_shapes, dict):
        specs = [dynamic_shapes.get(n) for n in names]
    elif isinstance(dynamic_shapes, (list, tuple)) and len(dynamic_shapes) == len(values):
        specs = list(dynamic_shapes)
    else:
        values, specs = list(example_inputs), list(dynamic_shapes) if isinstance(dynamic_shapes, (list, tuple)) else []
    leaves: list = []
    _leaf_specs(tuple(values), tuple(specs) if len(specs) == len(values) else None, leaves)
    from torch.export.graph_signature import InputKind

    user = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    vals = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    out: dict[str, str] = {}
    for name, spec in zip(user, leaves):
        val = vals.get(name)
        if not isinstance(val, torch.Tensor) or spec is None:
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec) if isinstance(spec, (list, tuple)) else ()
        for axis, dim in items:
            dim_name = getattr(dim, "__name__", None)
            if isinstance(axis, int) and 0 <= axis < val.dim() and dim_name and not isinstance(val.shape[axis], int):
                out.setdefault(str(val.shape[axis]), dim_name)
    return out


def export_program(module: torch.nn.Module, example_inputs: Sequence[Any], dynamic_shapes=None):
    """`module` through torch.export, decomposed to core ATen: the program the importer reads."""
    try:
        program = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
        return _decompose(program)
    except Exception as e:  # torch.export's own errors have many types; they all mean "cannot export"
        raise PackageError(f"torch.export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


def module_path(node) -> str:
    """The qualified name of the submodule whose forward ran an FX node ("" for the top-level forward)."""
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def origin_keys(program) -> dict[str, str]:
    """FX node name -> ``module#k`` for every ATen node of `program`: the k-th node that submodule ran.

    Keys depend only on the nodes of the same submodule before it, so two versions of a network
    (one operator changed) give the same key to corresponding values.
    """
    counts: dict[str, int] = {}
    keys = {}
    for node in program.graph.nodes:
        if node.op == "call_function":
            path = module_path(node)
            keys[node.name] = f"{path}#{counts.get(path, 0)}"
            counts[path] = counts.get(path, 0) + 1
    return keys


def source_line(node) -> str:
    """``file:line`` of the model code that made an FX node: the innermost frame of its stack trace
    outside torch's own modules (an ``nn.Conv2d`` node points at the line that called the layer)."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    own = [f for f in frames if not os.path.abspath(f[0]).startswith(_TORCH_DIR)]
    path, line = (own or frames or [("", "")])[-1]
    return f"{path}:{line}" if path else ""


def program_weights(program) -> dict[str, torch.Tensor]:
    """Placeholder name -> tensor for the parameters, buffers and lifted constants of an exported program."""
    sig = program.graph_signature
    state = program.state_dict
    consts = getattr(program, "constants", {}) or {}
    table = {}
    for spec in sig.input_specs:
        target = getattr(spec, "target", None)
        if target is None:
            continue
        value = state.get(target, consts.get(target))
        if value is None:
            raise PackageError(f"export: no value for {spec.arg.name} ({target})")
        table[spec.arg.name] = value.detach() if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    return table


def _decompose(program):
    """Core ATen through the default decompositions; where those fail, a narrower table that keeps the
    operators torch_ops.py maps itself (attention, whose math decomposition leaves strides a later view
    refuses in GPT-2-style blocks)."""
    try:
        return program.run_decompositions(torch.export.default_decompositions())
    except Exception:  # noqa: BLE001  the narrower table is tried next; its error is the one reported
        table = torch.export.default_decompositions()
        for op in (torch.ops.aten.scaled_dot_product_attention.default,):
            table.pop(op, None)
        return program.run_decompositions(table)


def from_torch(module: torch.nn.Module, example_inputs: Sequence[Any], dynamic_shapes=None,
               name: str = "main", limits: Limits | None = None) -> Package:
    """Export `module` with torch.export and import it into a one-function package.

    `dynamic_shapes` is torch.export's: per input, a dict {axis: torch.export.Dim}.
    Outputs are named ``output`` (one) or ``output_0``, ``output_1``... The
    module runs in its current mode: call ``.eval()`` first for inference. `limits` (limits.py) bounds
    the program's nodes (max_nodes), the operations built and the elements of any tensor with known extents.
    """
    from .torch_ops import HANDLERS

    program = export_program(module, example_inputs, dynamic_shapes)
    limits = resolve(limits)
    n_nodes = len(program.graph.nodes)
    if n_nodes > limits.max_nodes:
        raise limits.exceeded("max_nodes", n_nodes, "the exported program's nodes")
    imp = TorchImporter(program, name)
    weights = program_weights(program)
    names = _symbol_names(module, program, example_inputs, dynamic_shapes)
    inputs, dim_names = {}, {}
    outputs: dict[str, Tensor] = {}
    keys = origin_keys(program)
    origins: dict[str, Origin] = {}
    for node in program.graph.nodes:
        imp.node = node
        if node.op == "placeholder":
            if node.name in weights:
                imp.values[node.name] = imp.g.constant(weights[node.name].cpu().contiguous())
                continue
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise imp.fail(f"input {node.name} is a {type(val).__name__}; only tensor inputs are supported")
            shape = tuple(d if isinstance(d, int) else UNKNOWN for d in val.shape)
            t = imp.g.placeholder(shape, dtypes.as_dtype(val.dtype), name=node.name)
            inputs[node.name] = imp.values[node.name] = t
            dim_names[node.name] = [None if isinstance(d, int) else names.get(str(d), str(d)) for d in val.shape]
        elif node.op == "call_function":
            handler = HANDLERS.get(str(node.target))
            if handler is None:
                raise imp.fail("this ATen operator is not supported by the importer (docs/packages.md lists those that are)")
            built = len(imp.g.operations)
            try:
                result = handler(imp, node, *[imp.arg(a) for a in node.args],
                                 **{k: imp.arg(v) for k, v in node.kwargs.items()})
            except (PackageError, KeyError):
                raise
            except StitchError as e:
                raise imp.fail(str(e)) from None
            imp.values[node.name] = value = _match_meta(imp, node, result)
            _check_size(imp, limits, value)
            line, scope = source_line(node), module_path(node)
            for op in imp.g.operations[built:]:
                op.location, op.scope = line or op.location, scope
            if isinstance(value, Tensor):
                origins[keys[node.name]] = Origin(keys[node.name], node.name, str(node.target), value.name, line)
        elif node.op == "output":
            results = [imp.tensor(imp.arg(a)) for a in node.args[0]]
            for i, t in enumerate(results):
                key = "output" if len(results) == 1 else f"output_{i}"
                outputs[key] = imp.g.identity(t, name=key) if t.op.op in ("placeholder", "constant") else t
    imp.node = None
    producer = {"name": "stitchml.torch_export", "version": __version__,
                "source": f"torch.export from torch {torch.__version__}, {type(module).__name__}"}
    return Package.from_graph(imp.g, inputs, outputs, name=name, producer=producer,
                              dim_names={k: v for k, v in dim_names.items() if any(v)}, origins=origins)


def _check_size(imp: TorchImporter, limits: Limits, value: Any) -> None:
    """Refuse a result with more elements than max_tensor_elements, or an IR over max_operations."""
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, Tensor) and known_elements(v.shape) > limits.max_tensor_elements:
            raise limits.exceeded("max_tensor_elements", known_elements(v.shape), f"{imp.where()}: result {v.type}")
    if len(imp.g.operations) > limits.max_operations:
        raise limits.exceeded("max_operations", len(imp.g.operations), f"{imp.where()}: operations built")


def _match_meta(imp: TorchImporter, node, result):
    """Cast a result to the dtype torch recorded for the node, where our promotion rule differs."""
    val = node.meta.get("val")
    if isinstance(result, Tensor) and isinstance(val, torch.Tensor):
        want = dtypes.as_dtype(val.dtype)
        if result.dtype != want:
            result = imp.g.cast(result, want)
        if result.rank is not None and result.rank != val.dim():
            raise imp.fail(f"produced rank {result.rank} where torch has {val.dim()} ({tuple(val.shape)})")
    return result
