"""Bisection: the first operation whose compiled output departs from a reference.

`bisect(graph, feeds, reference)` compiles and runs prefixes of the graph's
program order and compares them with the reference's named intermediates.
An error propagates to everything downstream of it, so "some value leaving
the prefix diverges" is false for every prefix before the first bad op and
true from it on: a binary search finds that op in about log2(n) + 1 probes
(compiled runs).

The reference is a callable `reference(feeds) -> {name: array}` taking the
feeds by placeholder name, or "float64" (the same graph run op by op with
every float carried in float64). Builders of references:

* `torch_reference(module)`: a PyTorch module; forward hooks record the
  output of every named submodule under its qualified name ("blocks.3.act");
* `torch_program_reference(module, example_inputs)`: a PyTorch module
  exported as the importer exports it (torch.export, core ATen) and run by
  PyTorch node by node, every node's value under its `Origin.key`
  (``module#k``), so a network imported with `package.from_torch` lines up
  op by op through `Function.origin_names()`, even against another version
  of the module;
* `onnx_reference(model)`: an ONNX model run by onnxruntime with every
  node output exposed as a graph output, under the ONNX value names;
* `float64_reference(graph)`: what "float64" means.

Mapping rule: a reference intermediate belongs to the graph tensor of the
same name (builders take `name=`; ONNX imports name tensors after the ONNX
values, `Function.origins`, through `stitchml.debug.import_onnx`); `names={reference: tensor}`
renames reference entries first. Ops whose outputs have no reference entry
are not compared; a divergence is then reported at the first compared op
downstream of the fault.

    >>> import numpy as np, stitchml as sm
    >>> from stitchml import debug
    >>> g = sm.Graph(); x = g.placeholder((3,), sm.float32, name="x")
    >>> y = g.subtraction(x + 1e8, 1e8, name="y")
    >>> r = debug.bisect(g, {x: np.array([0.25, 0.5, 1.0], np.float32)}, "float64", targets=[y])
    >>> r.op.name, r.probes  # x + 1e8 rounds within the tolerance; the cancellation does not
    ('y', 2)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

from ..errors import GraphError
from ..ir import Tensor
from ..runtime.eager import prune
from ..tensor_data import TensorData, resolve_device
from .capture import Capture, OpRecord, _attr_summary, _feeds_by_tensor, capture, run_ops

Reference = Callable[[dict[str, np.ndarray]], Mapping[str, Any]]
_SOURCES = ("placeholder", "constant", "variable")


@dataclass
class BisectResult:
    """The first diverging op (None when all agree), both values, and how the search went."""

    op: OpRecord | None
    tensor: str | None
    ours: np.ndarray | None
    expected: np.ndarray | None
    max_abs_error: float
    probes: int
    compared: int  # ops with a reference value, the search space
    trail: list[tuple[str, bool]] = field(default_factory=list)  # (last op of the prefix, diverged), in order
    references: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # compared values, by tensor name

    def summary(self) -> str:
        if self.op is None:
            return f"no divergence: {self.compared} ops compared in {self.probes} probe(s)"
        return (f"first divergence at {self.op.op} ({self.op.name}), built at {self.op.location}\n"
                f"  tensor {self.tensor}: max |ours - reference| = {self.max_abs_error:.6g}\n"
                f"  found in {self.probes} probes over {self.compared} compared ops")

    def to_json(self) -> dict:
        def arr(a):
            return None if a is None else {"shape": list(a.shape), "values": _flat(a, 4096)}
        return {"op": None if self.op is None else vars(self.op), "tensor": self.tensor, "ours": arr(self.ours),
                "expected": arr(self.expected), "max_abs_error": self.max_abs_error, "probes": self.probes,
                "compared": self.compared, "trail": [list(t) for t in self.trail]}


def _flat(a: np.ndarray, limit: int) -> list:
    v = np.asarray(a, dtype=np.float64).reshape(-1)[:limit]
    return [None if not np.isfinite(x) else float(x) for x in v]


def float64_reference(graph, device=None) -> Reference:
    """The graph run op by op with every float in float64, intermediates by tensor name."""
    dev = resolve_device(device if device is not None else "cpu")

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed = _feeds_by_tensor(graph, feeds)
        plan = prune(graph, _sinks(graph), ())
        values = run_ops(graph, plan, {k: _as_fed(k, v) for k, v in fed.items()}, dev, float64=True)
        return {t.name: values[t.id] for op in plan for t in op.outputs}
    return run


def _as_fed(placeholder: Tensor, value) -> TensorData:
    data = value if isinstance(value, TensorData) else TensorData(value)
    return data if data.dtype == placeholder.dtype else TensorData(data.torch().to(placeholder.dtype.torch))


def torch_reference(module: torch.nn.Module, inputs: Iterable[str] | None = None) -> Reference:
    """A PyTorch module as a reference: each named submodule's output, by qualified name.

    `inputs` lists the placeholder names in the order of `forward`'s arguments (default: the
    order the feeds are given in); the module's own output is recorded as "output".
    """
    order = None if inputs is None else list(inputs)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        seen: dict[str, torch.Tensor] = {}
        hooks = []
        for name, sub in module.named_modules():
            if name:
                hooks.append(sub.register_forward_hook(
                    lambda m, a, out, name=name: seen.__setitem__(name, out.detach()) if torch.is_tensor(out) else None))
        try:
            args = [torch.as_tensor(np.asarray(feeds[k])) for k in (order or list(feeds))]
            with torch.no_grad():
                out = module(*args)
        finally:
            for h in hooks:
                h.remove()
        if torch.is_tensor(out):
            seen["output"] = out.detach()
        return seen
    return run


def torch_program_reference(module: torch.nn.Module, example_inputs, inputs: Iterable[str] | None = None) -> Reference:
    """A PyTorch module as a reference op by op: the value of every ATen node by its origin key.

    The module is exported as `stitchml.package.from_torch` exports it (`example_inputs` fix the
    shapes) and its nodes run in PyTorch one by one, in the module's dtypes, as eager PyTorch runs them.
    Keys are `Origin.key`s (``module#k``, `package.torch_import.origin_keys`); the feeds are passed in
    the order of `inputs` (default: the order they are given in), the program's output also as "output".
    """
    from ..package.torch_import import export_program, origin_keys, program_weights

    program = export_program(module, example_inputs)
    keys = origin_keys(program)
    weights = program_weights(program)
    order = None if inputs is None else list(inputs)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        args = iter(torch.as_tensor(np.asarray(feeds[k])) for k in (order or list(feeds)))
        env: dict[str, Any] = {}
        seen: dict[str, torch.Tensor] = {}

        def value(a):
            if isinstance(a, torch.fx.Node):
                return env[a.name]
            return type(a)(value(x) for x in a) if isinstance(a, (list, tuple)) else a
        with torch.no_grad():
            for node in program.graph.nodes:
                if node.op == "placeholder":
                    env[node.name] = weights[node.name] if node.name in weights else next(args)
                elif node.op == "call_function":
                    env[node.name] = node.target(*value(node.args), **{k: value(v) for k, v in node.kwargs.items()})
                    if torch.is_tensor(env[node.name]):
                        seen[keys[node.name]] = env[node.name]
                elif node.op == "output":
                    out = value(node.args[0])
                    if len(out) == 1 and torch.is_tensor(out[0]):
                        seen["output"] = out[0]
        return seen
    return run


def onnx_reference(model) -> Reference:
    """An ONNX model (path or ModelProto) through onnxruntime, every node output by its ONNX name."""
    import onnx
    import onnxruntime as ort

    proto = onnx.load(model) if not isinstance(model, onnx.ModelProto) else model
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    known = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in known:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                known.add(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, {k: np.asarray(v) for k, v in feeds.items()})))
    return run


def _sinks(graph) -> list[Tensor]:
    used = {t.id for op in graph.operations for t in op.inputs}
    return [t for op in graph.operations if op.op not in _SOURCES for t in op.outputs if t.id not in used]


def _numpy(v) -> np.ndarray:
    if isinstance(v, TensorData):
        v = v.torch()
    if torch.is_tensor(v):
        v = v.detach().cpu()
        return (v.double() if v.is_floating_point() else v).numpy()
    return np.asarray(v)


def _diverges(ours: np.ndarray, ref: np.ndarray, tolerance: float) -> tuple[bool, float]:
    if ours.shape != ref.shape:
        return True, float("inf")
    if ours.size == 0:
        return False, 0.0
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    same_nan = np.isnan(a) & np.isnan(b)
    err = np.where(same_nan | (a == b), 0.0, np.abs(a - b))
    bad = ~(err <= tolerance + tolerance * np.abs(np.where(same_nan, 0.0, b)))  # NaN against a number: bad
    return bool(bad.any()), float(np.nanmax(np.where(np.isnan(err), np.inf, err)))


def bisect(graph, feeds: dict, reference: Reference | str = "float64", targets: Iterable[Tensor] | None = None,
           tolerance: float = 1e-4, names: Mapping[str, str] | None = None, device=None,
           options: dict | None = None) -> BisectResult:
    """The first op, in program order, whose compiled output differs from the reference.

    `feeds` maps placeholders (or their names) to arrays; `targets` defaults to every value no op
    consumes. A value diverges when |ours - reference| > tolerance * (1 + |reference|) anywhere
    (NaN in the same places agrees). Each probe compiles the graph for the values leaving one
    prefix of the program (through `graph.compile(..., device, options)`) and runs it once.
    """
    fed = _feeds_by_tensor(graph, feeds)
    targets = list(targets) if targets is not None else _sinks(graph)
    if reference == "float64":
        reference = float64_reference(graph, device)
    elif isinstance(reference, str):
        raise GraphError(f"bisect: reference must be a callable or 'float64', got {reference!r}")
    raw = reference({k.name: (v.numpy() if isinstance(v, TensorData) else np.asarray(v)) for k, v in fed.items()})
    rename = dict(names or {})
    expected = {rename.get(k, k): _numpy(v) for k, v in raw.items()}
    plan = prune(graph, targets, ())
    position = {op.id: i for i, op in enumerate(plan)}
    candidates = [op for op in plan if op.op not in _SOURCES and any(t.name in expected for t in op.outputs)]
    if not candidates:
        ours = sorted(t.name for op in plan for t in op.outputs)[:8]
        raise GraphError(f"bisect: no reference value is named like a graph tensor; the reference has "
                         f"{sorted(expected)[:8]}, the graph {ours} (pass names={{reference: tensor}})")
    last_use: dict[int, int] = {}
    for op in plan:
        for t in op.inputs:
            last_use[t.id] = max(last_use.get(t.id, -1), position[op.id])
    final = {t.id for t in targets}
    types = {k: _as_fed(k, v) for k, v in fed.items()}
    dev = resolve_device(device if device is not None else "cpu")
    probes: dict[int, tuple[bool, list]] = {}
    trail: list[tuple[str, bool]] = []

    def probe(i: int) -> bool:
        if i in probes:
            return probes[i][0]
        end = position[candidates[i].id]
        checked = [t for op in candidates[:i + 1] for t in op.outputs if t.name in expected
                   and (op is candidates[i] or t.id in final or last_use.get(t.id, -1) > end)]
        needed = {op.id for op in prune(graph, checked, ())}
        exe = graph.compile({k: v for k, v in types.items() if k.op.id in needed}, checked, device=dev,
                            options=options)
        out = exe.run({k: v for k, v in types.items() if k.op.id in needed})
        found = []
        for t in checked:
            mine = _numpy(out[t])
            bad, err = _diverges(mine, expected[t.name], tolerance)
            if bad:
                found.append((t, mine, err))
        probes[i] = (bool(found), found)
        trail.append((candidates[i].name, bool(found)))
        return bool(found)

    last = len(candidates) - 1
    compared = {t.name: expected[t.name] for op in candidates for t in op.outputs if t.name in expected}
    if not probe(last):
        return BisectResult(None, None, None, None, 0.0, len(probes), len(candidates), trail, compared)
    lo, hi = 0, last
    while lo < hi:
        mid = (lo + hi) // 2
        if probe(mid):
            hi = mid
        else:
            lo = mid + 1
    op = candidates[lo]
    found = probes[lo][1]
    t, mine, err = next((f for f in found if f[0].op is op), found[0])
    record = OpRecord(t.op.name, t.op.op, _attr_summary(t.op.attrs), [x.name for x in t.op.inputs],
                      [x.name for x in t.op.outputs],
                      [list(mine.shape) if x is t else list(x.shape or ()) for x in t.op.outputs],
                      [str(x.dtype) for x in t.op.outputs], t.op.location, t.op.scope)
    return BisectResult(record, t.name, mine, expected[t.name], err, len(probes), len(candidates), trail, compared)


def capture_bisection(graph, feeds: dict, result: BisectResult, targets: Iterable[Tensor] | None = None,
                      device=None) -> Capture:
    """A capture of the run that `result` bisected, for the web debugger's bisection page.

    It holds every intermediate, the reference's values of the compared tensors (for difference maps)
    and the result; the diverging tensor holds the compiled run's value, as the bisection saw it.
    `targets` defaults to every value no op consumes.
    """
    cap = capture(graph, feeds, list(targets) if targets is not None else _sinks(graph), device=device)
    cap.reference = {k: torch.from_numpy(np.ascontiguousarray(v)).to(cap.tensors[k].dtype)
                     for k, v in result.references.items() if k in cap.tensors}
    if result.tensor is not None and result.tensor in cap.tensors:
        cap.tensors[result.tensor] = torch.from_numpy(np.ascontiguousarray(result.ours)).to(
            cap.tensors[result.tensor].dtype)
    cap.bisect = {k: v for k, v in result.to_json().items() if k not in ("ours", "expected")}
    if result.op is not None:
        cap.bisect["op"]["kernel"] = cap.record(result.op.name).kernel
    return cap


def import_onnx(model):
    """An ONNX model as (graph, {ONNX value name: graph tensor name}) for bisecting against `onnx_reference`:
    the package function's graph and `Function.origin_names()`."""
    from ..package import from_onnx

    fn = from_onnx(model).function()
    return fn.graph, fn.origin_names()
