"""Graphs to text and JSON, and back.

JSON holds the IR exactly: operations in program order with their ids,
names, attributes, output types, control dependencies, scopes and source
locations. Tensor-valued attributes (constants, initial values) live in a
safetensors file beside it, referenced by key. Loading checks the format and
version, every reference and every output type (re-inferred through the
registry), so a damaged file fails with SerializationError, never later.

Version 2 also holds the graph's run state: every variable's current value
(beside its initial value, which stays an attribute) and the run counter
that seeds random draws, so a trained graph loads trained and a resumed
training run draws what the uninterrupted one would have. Version 1 files
(no run state) still load, with their variables at their initial values.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

import torch

from . import dtypes
from .errors import SerializationError, ShapeError
from .ir import Operation, Tensor, TensorType
from .ops.control import Body
from .registry import REGISTRY

FORMAT = "stitchml.graph"
VERSION = 2
READABLE = (1, 2)  # version 1 has no run state


# -- text -------------------------------------------------------------------------
def _attr_text(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        if v.numel() <= 8:
            vals = v.flatten().tolist()
            body = str(vals[0]) if v.dim() == 0 else str(vals)
            return f"{body}:{dtypes.as_dtype(v.dtype)}{list(v.shape) if v.dim() > 1 else ''}"
        return f"<{dtypes.as_dtype(v.dtype)}{list(v.shape)}>"
    if isinstance(v, dtypes.DType):
        return v.name
    if isinstance(v, Body):
        outs = ", ".join(f"%{t.name}" for t in v.outputs)
        inner = dump_text(v.graph).replace("\n", "\n    ")
        return f"{inner} -> ({outs})"
    return repr(v)


def dump_text(graph, locations: bool = False) -> str:
    """One line per operation: ``%out: type = op(%in, ...) {attrs}  # scope``."""
    lines = [f'graph "{graph.name}" {{']
    for op in graph.operations:
        outs = ", ".join(f"%{t.name}: {t.type}" for t in op.outputs) or op.name
        args = ", ".join(f"%{t.name}" for t in op.inputs)
        attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in op.attrs.items())
        line = f"  {outs} = {op.op}({args})"
        if attrs:
            line += f" {{{attrs}}}"
        if op.control_deps:
            line += " after(" + ", ".join(d.name for d in op.control_deps) + ")"
        notes = [n for n in (op.scope, op.location if locations else "") if n]
        if notes:
            line += "  # " + " ".join(notes)
        lines.append(line)
    lines.append("}")
    return "\n".join(lines)


# -- JSON -------------------------------------------------------------------------
def _encode(v: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(v, torch.Tensor):
        tensors[key] = v.contiguous()
        return {"$tensor": key}
    if isinstance(v, dtypes.DType):
        return {"$dtype": v.name}
    if isinstance(v, Body):  # a control-flow block: its operations, keyed apart from the enclosing graph's
        return {"$body": {"name": v.graph.name, "operations": _operation_records(v.graph, tensors, f"{key}."),
                          "outputs": [t.id for t in v.outputs]}}
    if isinstance(v, float) and not math.isfinite(v):
        return {"$float": repr(v)}
    if isinstance(v, (list, tuple)):
        return [_encode(x, f"{key}.{i}", tensors) for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {"$dict": {k: _encode(x, f"{key}.{k}", tensors) for k, x in v.items()}}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise SerializationError(f"attribute {key} holds a {type(v).__name__}, which has no JSON form")


def _decode(v: Any, tensors: dict[str, torch.Tensor], where: str, new_graph: Callable[[str], Any] | None = None
            ) -> Any:
    if isinstance(v, list):
        return tuple(_decode(x, tensors, where, new_graph) for x in v)
    if isinstance(v, dict):
        if "$tensor" in v:
            if v["$tensor"] not in tensors:
                raise SerializationError(f"{where}: tensor {v['$tensor']!r} is missing from the weights file")
            return tensors[v["$tensor"]]
        if "$dtype" in v:
            try:
                return dtypes.as_dtype(v["$dtype"])
            except TypeError as e:
                raise SerializationError(f"{where}: {e}") from None
        if "$float" in v:
            return float(v["$float"])
        if "$dict" in v:
            return {k: _decode(x, tensors, where, new_graph) for k, x in v["$dict"].items()}
        if "$body" in v and new_graph is not None:
            return _read_body(v["$body"], tensors, where, new_graph)
        raise SerializationError(f"{where}: unknown attribute encoding {sorted(v)}")
    return v


def to_dict(graph) -> tuple[dict, dict[str, torch.Tensor]]:
    """The graph as a JSON-able dict and the tensors it references: attributes, and the variables'
    current values with the run counter (taken under the run lock, so never half a run's updates)."""
    with graph._run_lock:
        state = {op_id: v.detach().to("cpu", copy=True) for op_id, v in graph._variable_values.items()}
        run_count = graph.run_count
    tensors: dict[str, torch.Tensor] = {}
    ops = _operation_records(graph, tensors, "")
    variables = []
    for op_id, value in sorted(state.items()):
        tensors[f"state.var{op_id}"] = value.contiguous()
        variables.append({"id": op_id, "value": {"$tensor": f"state.var{op_id}"}})
    doc = {"format": FORMAT, "version": VERSION, "name": graph.name, "operations": ops,
           "next_op": graph._next_op, "next_tensor": graph._next_tensor,
           "variables": variables, "run_count": run_count}
    return doc, tensors


def _operation_records(graph, tensors: dict[str, torch.Tensor], prefix: str) -> list[dict]:
    """The JSON records of `graph`'s operations; tensor attributes go to `tensors` under `prefix`."""
    ops = []
    for op in graph.operations:
        ops.append({
            "id": op.id,
            "op": op.op,
            "name": op.name,
            "inputs": [t.id for t in op.inputs],
            "attrs": {k: _encode(v, f"{prefix}op{op.id}.{k}", tensors) for k, v in op.attrs.items()},
            "outputs": [{"id": t.id, "name": t.name, "shape": None if t.shape is None else list(t.shape),
                         "dtype": t.dtype.name} for t in op.outputs],
            "control_deps": [d.id for d in op.control_deps],
            "scope": op.scope,
            "location": op.location,
        })
    return ops


def _require(cond: bool, message: str):
    if not cond:
        raise SerializationError(message)


def from_dict(doc: dict, tensors: dict[str, torch.Tensor], new_graph: Callable[[str], Any]):
    """Rebuild a graph from `to_dict`'s output, checking every part of it; `new_graph(name)` makes the
    empty graph (`Graph`: this module sits below graph.py, whose save, load and text use it)."""
    _require(isinstance(doc, dict) and doc.get("format") == FORMAT, f"not a {FORMAT} document")
    _require(doc.get("version") in READABLE, f"graph format version {doc.get('version')!r} is not supported "
                                             f"(this build reads versions {', '.join(map(str, READABLE))})")
    _require(isinstance(doc.get("operations"), list), "the document has no operation list")
    g = new_graph(str(doc.get("name", "graph")))
    tensor_by_id, op_by_id = _read_operations(g, doc["operations"], tensors, "")
    try:
        g._next_op = max([int(doc.get("next_op", 0))] + [i + 1 for i in op_by_id])
        g._next_tensor = max([int(doc.get("next_tensor", 0))] + [i + 1 for i in tensor_by_id])
    except (TypeError, ValueError) as e:
        raise SerializationError(f"malformed id counters ({e})") from None
    _read_state(g, doc, tensors, op_by_id)
    return g


def _read_body(rec: Any, tensors: dict[str, torch.Tensor], where: str, new_graph: Callable[[str], Any]) -> Body:
    """A control-flow block: its operations, checked as a graph's are, and its outputs; `new_graph` makes
    the block's graph (the type of the graph being read)."""
    _require(isinstance(rec, dict) and isinstance(rec.get("operations"), list) and isinstance(rec.get("outputs"), list),
             f"{where}: a block needs an operation list and an output list")
    g = new_graph(str(rec.get("name", "body")))
    tensor_by_id, op_by_id = _read_operations(g, rec["operations"], tensors, f"{where}: ")
    for t in rec["outputs"]:
        _require(t in tensor_by_id, f"{where}: block output {t!r} is not a tensor of the block")
    seen_other = False
    for op in g.operations:  # the block's inputs are its placeholders, which come first
        _require(not (seen_other and op.op == "placeholder"), f"{where}: placeholder {op.name} after other operations")
        seen_other = seen_other or op.op != "placeholder"
    g._next_op = max(op_by_id, default=-1) + 1
    g._next_tensor = max(tensor_by_id, default=-1) + 1
    return Body(g, [tensor_by_id[t] for t in rec["outputs"]])


def _read_operations(g, records: list, tensors: dict[str, torch.Tensor], where_prefix: str
                     ) -> tuple[dict[int, Tensor], dict[int, Operation]]:
    """Read operation records into `g`, in order, each checked against those before it."""
    tensor_by_id: dict[int, Tensor] = {}
    op_by_id: dict[int, Operation] = {}
    for i, rec in enumerate(records):
        where = f"{where_prefix}operation #{i}"
        try:
            op = _read_operation(g, rec, where, tensors, tensor_by_id, op_by_id)
        except SerializationError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            # A record of the wrong shape (a list for the attributes, a name for an id...): say where.
            name = rec.get("op") if isinstance(rec, dict) else None
            raise SerializationError(f"{where}{f' ({name})' if name else ''}: malformed record "
                                     f"({type(e).__name__}: {e})") from None
        op_by_id[op.id] = op
        g.operations.append(op)
    return tensor_by_id, op_by_id


def _read_state(g, doc: dict, tensors: dict[str, torch.Tensor], op_by_id: dict[int, Operation]) -> None:
    """The variables' current values and the run counter, each checked against the graph."""
    run_count = doc.get("run_count", 0)
    _require(isinstance(run_count, int) and not isinstance(run_count, bool) and run_count >= 0,
             f"run_count must be a non-negative integer, got {run_count!r}")
    records = doc.get("variables", [])
    _require(isinstance(records, list), f"variables must be a list of {{id, value}} records, got {type(records).__name__}")
    for i, rec in enumerate(records):
        where = f"variables[{i}]"
        _require(isinstance(rec, dict) and isinstance(rec.get("id"), int) and isinstance(rec.get("value"), dict),
                 f"{where}: expected {{'id': int, 'value': {{'$tensor': key}}}}, got {rec!r}")
        op = op_by_id.get(rec["id"])
        _require(op is not None and op.op == "variable",
                 f"{where}: operation {rec['id']} is {'not in the graph' if op is None else f'a {op.op}'}, "
                 f"expected a variable")
        value = _decode(rec["value"], tensors, where)
        t = op.outputs[0]
        _require(isinstance(value, torch.Tensor) and value.dtype == t.dtype.torch and tuple(value.shape) == t.shape,
                 f"{where}: variable {t.name} is {t.type}, the stored value is "
                 f"{tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__} "
                 f"{getattr(value, 'dtype', '')}")
        g._variable_values[op.id] = value.clone(memory_format=torch.contiguous_format)
    g.run_count = run_count


def _read_operation(g, rec: dict, where: str, tensors: dict[str, torch.Tensor], tensor_by_id: dict[int, Tensor],
                    op_by_id: dict[int, Operation]) -> Operation:
    """One operation record, checked against the ops and tensors read before it."""
    try:
        opname, op_id, inputs = rec["op"], int(rec["id"]), rec["inputs"]
        out_recs, deps = rec["outputs"], rec["control_deps"]
    except (KeyError, TypeError, ValueError) as e:
        raise SerializationError(f"{where}: malformed record ({e})") from None
    _require(opname in REGISTRY, f"{where}: unknown op {opname!r}")
    _require(op_id not in op_by_id, f"{where}: duplicate op id {op_id}")
    for t in inputs:
        _require(t in tensor_by_id, f"{where} ({opname}): input tensor {t} is not defined before it")
    for d in deps:
        _require(d in op_by_id, f"{where} ({opname}): control dependency {d} is not defined before it")
    attrs = {k: _decode(v, tensors, f"{where} ({opname}) attribute {k}", type(g))
             for k, v in rec.get("attrs", {}).items()}
    try:
        types = [TensorType(None if o["shape"] is None else tuple(o["shape"]), dtypes.as_dtype(o["dtype"]))
                 for o in out_recs]
    except (KeyError, TypeError, ShapeError) as e:
        raise SerializationError(f"{where} ({opname}): bad output type ({e})") from None
    in_tensors = [tensor_by_id[t] for t in inputs]
    try:
        inferred = REGISTRY[opname].infer([t.type for t in in_tensors], **attrs)
    except (ShapeError, TypeError, KeyError, ValueError, ArithmeticError, RuntimeError) as e:
        # The rules assume well-formed attributes: a stride of 0, inf as an int, a tensor as a flag end here.
        raise SerializationError(f"{where} ({opname}): attributes or inputs do not fit the op "
                                 f"({type(e).__name__}: {e})") from None
    inferred = [inferred] if isinstance(inferred, TensorType) else list(inferred)
    _require(inferred == types, f"{where} ({opname}): stored output types {[str(t) for t in types]} differ "
                                f"from the op's rule {[str(t) for t in inferred]}")
    op = Operation(g, op_id, opname, tuple(in_tensors), attrs, tuple(op_by_id[d] for d in deps),
                   str(rec.get("name", f"{opname}_{op_id}")), str(rec.get("location", "")), str(rec.get("scope", "")))
    outs = []
    for j, (o, tt) in enumerate(zip(out_recs, types)):
        tid = int(o["id"])
        _require(tid not in tensor_by_id, f"{where}: duplicate tensor id {tid}")
        t = Tensor(g, op, j, tt, str(o.get("name", f"{op.name}:{j}")), tid)
        tensor_by_id[tid] = t
        outs.append(t)
    op.outputs = tuple(outs)
    return op


def save(graph, path: str | os.PathLike) -> None:
    """Write `graph` (IR, variables' current values, run counter) as JSON at `path`, tensors beside it."""
    from safetensors.torch import save_file

    doc, tensors = to_dict(graph)
    path = os.fspath(path)
    weights = path + ".safetensors"
    doc["weights"] = os.path.basename(weights)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    stored, seen = {}, set()
    for k, v in tensors.items():
        v = v.cpu()
        # One tensor may back several attributes (a loop body that gradients also reference, its copies
        # in the gradient's blocks): safetensors stores each key's own memory.
        ptr = v.untyped_storage().data_ptr()
        stored[k] = v.clone() if ptr in seen else v
        seen.add(ptr)
    save_file(stored, weights)


def load(path: str | os.PathLike, new_graph: Callable[[str], Any]):
    """The graph `save` wrote at `path`, with its variables' values and run counter as they were saved;
    `new_graph` as for `from_dict` (`Graph.load(path)` is the way to call it)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = os.fspath(path)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SerializationError(f"{path}: cannot read the graph ({e})") from None
    _require(isinstance(doc, dict), f"{path}: not a {FORMAT} document")
    weights = doc.get("weights")
    tensors = {}
    if weights:
        _require(isinstance(weights, str) and os.path.basename(weights) == weights,
                 f"{path}: weights file name {weights!r} must be a plain file name beside the graph")
        try:
            tensors = load_file(os.path.join(os.path.dirname(path), weights))
        except (OSError, SafetensorError) as e:
            raise SerializationError(f"{path}: cannot read weights {weights} ({e})") from None
    return from_dict(doc, tensors, new_graph)
