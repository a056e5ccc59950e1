"""torch.export to package: export, decompose to core ATen, map each ATen op to StitchML builders.

``torch.export.export`` traces the module into an FX graph of ATen ops;
``run_decompositions`` with the default (core ATen) table brings it down to
about a hundred operators, of which the table in torch_ops.py maps the ones
CNNs, RNNs and transformers use. Parameters, buffers and lifted constants
become graph constants (weights); user inputs become placeholders, with -1
for every extent a `torch.export.Dim` made symbolic, named after the Dim.
Symbolic sizes that reach shapes (``view(x, [s0, -1])``) are tracked as
(tensor, axis) entries and become run-time extents (package/shapes.py).

    >>> import torch, stitchml as sm
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> batch = torch.export.Dim("batch")
    >>> pkg = sm.package.from_torch(m, (torch.randn(2, 4),), dynamic_shapes=({0: batch},))
    >>> str(pkg.function().inputs[0])
    'input: float32[batch, 4]'
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from .. import dtypes
from ..errors import PackageError, StitchError
from ..graph import Graph
from ..ir import UNKNOWN, Tensor
from .package import Package


class TorchImporter:
    """The state of one import: the graph and the FX value table."""

    def __init__(self, program, name: str):
        self.program = program
        self.g = Graph(name)
        self.values: dict[str, Any] = {}
        self.node = None

    def fail(self, message: str) -> PackageError:
        n = self.node
        where = f"node {n.name} ({n.target})" if n is not None else "program"
        return PackageError(f"{where}: {message}")

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


def _dim_names(module, program, dynamic_shapes) -> dict[str, list[str | None]]:
    """Input name -> per-axis names of the torch.export.Dim objects that made extents symbolic."""
    if dynamic_shapes is None:
        return {}
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    specs = dynamic_shapes if isinstance(dynamic_shapes, dict) else dict(zip(params, dynamic_shapes))
    out = {}
    for name, spec in specs.items():
        if isinstance(spec, dict):
            items = spec.items()
        elif isinstance(spec, (list, tuple)):
            items = enumerate(spec)
        else:
            continue
        axes = {int(a): getattr(d, "__name__", None) for a, d in items if d is not None}
        if axes:
            out[name] = axes
    return out


def _weights(program) -> dict[str, torch.Tensor]:
    """Placeholder name -> tensor for parameters, buffers and lifted constants."""
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


def from_torch(module: torch.nn.Module, example_inputs: Sequence[Any], dynamic_shapes=None,
               name: str = "main") -> Package:
    """Export `module` with torch.export and import it into a one-function package.

    `dynamic_shapes` is torch.export's: per input, a dict {axis: torch.export.Dim}.
    Outputs are named ``output`` (one) or ``output_0``, ``output_1``... The
    module runs in its current mode: call ``.eval()`` first for inference.
    """
    from .. import __version__
    from .torch_ops import HANDLERS

    try:
        program = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes)
        program = program.run_decompositions(torch.export.default_decompositions())
    except Exception as e:  # torch.export's own errors have many types; they all mean "cannot export"
        raise PackageError(f"torch.export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    imp = TorchImporter(program, name)
    weights = _weights(program)
    names = _dim_names(module, program, dynamic_shapes)
    inputs, dim_names = {}, {}
    outputs: dict[str, Tensor] = {}
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
            axes = names.get(node.name, {})
            dim_names[node.name] = [axes.get(i, str(d)) if not isinstance(d, int) else None for i, d in enumerate(val.shape)]
        elif node.op == "call_function":
            handler = HANDLERS.get(str(node.target))
            if handler is None:
                raise imp.fail("this ATen operator is not supported by the importer (docs/packages.md lists those that are)")
            try:
                result = handler(imp, node, *[imp.arg(a) for a in node.args],
                                 **{k: imp.arg(v) for k, v in node.kwargs.items()})
            except (PackageError, KeyError):
                raise
            except StitchError as e:
                raise imp.fail(str(e)) from None
            imp.values[node.name] = _match_meta(imp, node, result)
        elif node.op == "output":
            results = [imp.tensor(imp.arg(a)) for a in node.args[0]]
            for i, t in enumerate(results):
                key = "output" if len(results) == 1 else f"output_{i}"
                outputs[key] = imp.g.identity(t, name=key) if t.op.op in ("placeholder", "constant") else t
    imp.node = None
    producer = {"name": "stitchml.torch_export", "version": __version__,
                "source": f"torch.export from torch {torch.__version__}, {type(module).__name__}"}
    return Package.from_graph(imp.g, inputs, outputs, name=name, producer=producer,
                              dim_names={k: v for k, v in dim_names.items() if any(v)})


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
