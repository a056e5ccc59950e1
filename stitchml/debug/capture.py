"""Captures: every intermediate of a run, keyed by the graph's original (unfused) operations.

A compiled run keeps no intermediates (fused ones never reach memory), so a
capture recomputes the pruned graph op by op through the reference
implementations (runtime/eager.py's `execute`) and keeps what was asked for.
Nothing changes in a normal run: capturing costs only when it is asked for.

Each op's record carries its name, kind, an attribute summary, input and
output tensor names, shapes and dtypes, the user's source line, its scope and
the compiled kernel it was fused into (from the executable's fusion report).

    >>> import numpy as np, stitchml as sm
    >>> from stitchml import debug
    >>> g = sm.Graph(); x = g.placeholder((2,), sm.float32, name="x")
    >>> y = g.tanh(x * 2.0, name="y")
    >>> cap = debug.capture(g, {x: np.ones(2, np.float32)}, [y])
    >>> [r.name for r in cap.records if r.op != "constant"]
    ['x', 'multiplication_2', 'y']
    >>> cap.kernel_of("y")
    'kernel0_pointwise'

A capture saves to one safetensors file: the tensors, and the manifest as
JSON in the file's metadata (`Capture.save`, `load_capture`). Loading checks
sizes, the header, the manifest's schema and that every tensor matches its
record; it never unpickles.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from ..errors import SerializationError, StitchError
from ..ir import Operation, Tensor
from ..registry import lookup
from ..runtime.eager import RunContext, check_feeds, check_request, execute, prune
from ..tensor_data import TensorData, resolve_device

FORMAT = "stitchml.capture"
VERSION = 1
MAX_FILE_BYTES = 4 << 30  # a capture larger than this is refused when loading
MAX_HEADER_BYTES = 64 << 20
REFERENCE = "reference/"  # key prefix of reference values in a capture file
_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
           "uint8": torch.uint8, "bool": torch.bool, "uint16": torch.uint16, "uint32": torch.uint32,
           "uint64": torch.uint64, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
           "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2fnuz": torch.float8_e5m2fnuz}


class CaptureError(SerializationError):
    """A capture file is missing, malformed, too large or does not match its manifest."""


@dataclass
class OpRecord:
    """What a capture knows of one original operation."""

    name: str
    op: str
    attrs: dict[str, str]
    inputs: list[str]
    outputs: list[str]
    shapes: list[list[int]]
    dtypes: list[str]
    location: str
    scope: str
    kernel: str | None = None  # the compiled step that runs it; None when the compiler removed it


@dataclass
class Capture:
    """The records of a run's operations in program order, and the captured tensors by tensor name."""

    graph_name: str
    records: list[OpRecord]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)  # {"name", "template", "ops", "not_fused", "source"}
    compile_error: str | None = None
    profile: list[list] = field(default_factory=list)  # [step, kind, ms] of one compiled run, in order
    reference: dict[str, torch.Tensor] = field(default_factory=dict)  # reference values, by tensor name
    bisect: dict | None = None  # a bisection's outcome (BisectResult.to_json without the arrays)

    def record(self, name: str) -> OpRecord:
        """The record of the op called `name`, or of the op producing the tensor called `name`."""
        for r in self.records:
            if r.name == name or name in r.outputs:
                return r
        raise KeyError(f"capture of {self.graph_name!r} has no op or tensor named {name!r}")

    def kernel_of(self, name: str) -> str | None:
        """The compiled kernel (step name) that op or tensor `name` was fused into."""
        return self.record(name).kernel

    def tensor(self, name: str) -> np.ndarray:
        """A captured tensor as a NumPy array (bfloat16 as float32)."""
        if name not in self.tensors:
            raise KeyError(f"capture of {self.graph_name!r} holds no tensor named {name!r}")
        t = self.tensors[name]
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    def reference_tensor(self, name: str) -> np.ndarray | None:
        """The reference's value of tensor `name` (from a bisection), or None."""
        t = self.reference.get(name)
        return None if t is None else (t.float() if t.dtype == torch.bfloat16 else t).numpy()

    def manifest(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "graph": self.graph_name,
                "records": [asdict(r) for r in self.records], "kernels": self.kernels,
                "compile_error": self.compile_error, "profile": self.profile, "bisect": self.bisect,
                "tensors": sorted(self.tensors) + sorted(REFERENCE + k for k in self.reference)}

    def save(self, path: str | os.PathLike) -> None:
        """Write the capture as one safetensors file (manifest in its metadata)."""
        from safetensors.torch import save_file

        # Copies: ops that return views (stop_gradient, reshape) share memory, which safetensors refuses.
        tensors = {k: v.detach().cpu().clone(memory_format=torch.contiguous_format) for k, v in self.tensors.items()}
        tensors.update({REFERENCE + k: v.detach().cpu().clone(memory_format=torch.contiguous_format)
                        for k, v in self.reference.items()})
        save_file(tensors, os.fspath(path), metadata={FORMAT: json.dumps(self.manifest())})


def _attr_summary(attrs: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, torch.Tensor):
            out[k] = f"tensor {str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
        else:
            text = repr(v) if not hasattr(v, "name") or not isinstance(getattr(v, "name"), str) else v.name
            out[k] = text if len(text) <= 120 else text[:117] + "..."
    return out


def _kernel_map(exe) -> tuple[dict[str, str], list[dict]]:
    """op name -> step name, and one entry per kernel, from an executable's fusion report and steps."""
    sources = exe.kernel_sources()
    owner: dict[str, str] = {}
    kernels = []
    for entry in exe.fusion_entries:
        name = f"kernel{entry['kernel']}_{entry['template']}"
        ops = [text[text.index("(") + 1:-1] for text in entry["ops"]]
        for op_name in ops:
            owner[op_name] = name
        kernels.append({"name": name, "template": entry["template"], "ops": ops,
                        "not_fused": [list(x) for x in entry["not_fused"]], "source": sources.get(name)})
    for step in exe.steps:
        if step.name not in {k["name"] for k in kernels}:
            owner.setdefault(step.name, step.name)
            kernels.append({"name": step.name, "template": step.kind, "ops": [step.name], "not_fused": [],
                            "source": step.source})
    return owner, kernels


def run_ops(graph, plan: Sequence[Operation], feeds: dict, device, float64: bool = False) -> dict[int, torch.Tensor]:
    """Values of every tensor of `plan` (tensor id -> torch tensor), computed op by op.

    With `float64` every floating value is carried in float64 (casts between float types keep
    float64), the reference that bisection compares a float32 or float16 graph against.
    """
    fed = check_feeds(graph, feeds, list(plan), device)
    values: dict[int, torch.Tensor] = {}
    with graph._run_lock:
        ctx = RunContext(graph, device, fed, graph.run_count)
        for op in plan:
            inputs = [values[t.id] for t in op.inputs]
            if not float64:
                outs = execute(op, ctx, inputs)
            else:
                outs = _execute64(op, ctx, inputs)
            for t, v in zip(op.outputs, outs):
                values[t.id] = v
    return values


def _execute64(op: Operation, ctx: RunContext, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    if op.op == "cast" and inputs[0].is_floating_point() and op.outputs[0].dtype.torch.is_floating_point:
        return (inputs[0],)
    prim = lookup(op.op)
    ctx.op = op
    try:
        out = prim.impl(ctx, *inputs, **op.attrs) if prim.needs_context else prim.impl(*inputs, **op.attrs)
    except StitchError:
        raise
    except Exception:  # noqa: BLE001  (an impl that insists on its own dtype: run it as built, then widen)
        narrow = [v.to(t.dtype.torch) for t, v in zip(op.inputs, inputs)]
        out = prim.impl(ctx, *narrow, **op.attrs) if prim.needs_context else prim.impl(*narrow, **op.attrs)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(v.double() if v.is_floating_point() else v for v in outs)


def capture(graph_or_executable, feeds: dict, targets: Iterable[Tensor] | Tensor | None = None,
            ops: Iterable[str] | None = None, device=None, compile: bool = True,
            profile_run: bool = True) -> Capture:
    """Run the graph op by op and keep its intermediates, mapped to the original operations.

    `graph_or_executable` is a Graph or an Executable (its graph, targets and fusion report are
    used). `targets` defaults to the executable's targets; `ops` names the ops whose outputs are
    kept (default: all). With a Graph and `compile=True` the graph is compiled for the feeds'
    types on `device` to learn which kernel each op was fused into; with `profile_run` the
    executable also runs once with profiling, for the debugger's timeline (`Capture.profile`),
    unless that run would assign variables or draw random numbers.
    """
    from ..runtime.executable import Executable

    exe = graph_or_executable if isinstance(graph_or_executable, Executable) else None
    graph = exe.graph if exe is not None else graph_or_executable
    if targets is None:
        if exe is None:
            raise TypeError("capture: targets are needed when capturing a Graph")
        by_id = {t.id: t for op in graph.operations for t in op.outputs}
        targets = [by_id[i] for i in exe.signature.targets]
    targets, _ = check_request(graph, targets, ())
    dev = resolve_device(device if device is not None else (exe.device if exe is not None else "cpu"))
    feeds = _feeds_by_tensor(graph, feeds)
    compile_error = None
    if exe is None and compile:
        try:
            exe = graph.compile({k: TensorData(v) if not isinstance(v, TensorData) else v for k, v in feeds.items()},
                                targets, device=dev)
        except StitchError as e:
            compile_error = str(e)
    owner, kernels = _kernel_map(exe) if exe is not None else ({}, [])
    profile = []
    if exe is not None and profile_run and not _stateful(exe):
        exe.run({k: v for k, v in feeds.items()}, profile=True)
        profile = [list(p) for p in exe.last_profile]
    plan = prune(graph, targets, ())
    wanted = None if ops is None else set(ops)
    if wanted is not None:
        unknown = wanted - {op.name for op in plan}
        if unknown:
            raise KeyError(f"capture: the targets need no op named {', '.join(sorted(unknown))}")
    values = run_ops(graph, plan, feeds, dev)
    records, tensors = [], {}
    for op in plan:
        records.append(OpRecord(op.name, op.op, _attr_summary(op.attrs), [t.name for t in op.inputs],
                                [t.name for t in op.outputs], [list(values[t.id].shape) for t in op.outputs],
                                [str(t.dtype) for t in op.outputs], op.location, op.scope, owner.get(op.name)))
        if wanted is None or op.name in wanted:
            for t in op.outputs:
                tensors[t.name] = values[t.id].detach().cpu().clone()  # views of constants must not alias them
    return Capture(graph.name, records, tensors, kernels, compile_error, profile)


def _stateful(exe) -> bool:
    """Whether running `exe` would change the graph's state (assignments, or the random draws' run index)."""
    return any(op.op == "assign_variable" or op.primitive.kind == "random" for op in exe.program.operations)


def _feeds_by_tensor(graph, feeds: dict) -> dict:
    """Feeds keyed by placeholder Tensor (keys may also be placeholder names)."""
    out = {}
    for k, v in (feeds or {}).items():
        out[graph.tensor(k) if isinstance(k, str) else k] = v
    return out


# -- loading ------------------------------------------------------------------------
def _fail(path, what: str) -> CaptureError:
    return CaptureError(f"capture file {os.fspath(path)}: {what}")


def _check_manifest(path, m: Any, header: dict) -> None:
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise _fail(path, f"expected a manifest of format {FORMAT!r}, found {str(m)[:80]!r}")
    if m.get("version") != VERSION:
        raise _fail(path, f"expected version {VERSION}, found {m.get('version')!r}")
    if not isinstance(m.get("graph"), str) or not isinstance(m.get("records"), list) \
            or not isinstance(m.get("kernels"), list) or not isinstance(m.get("tensors"), list):
        raise _fail(path, "the manifest needs 'graph' (text) and 'records', 'kernels', 'tensors' (lists)")
    fields = {"name": str, "op": str, "attrs": dict, "inputs": list, "outputs": list, "shapes": list,
              "dtypes": list, "location": str, "scope": str}
    produced = {}
    for i, r in enumerate(m["records"]):
        if not isinstance(r, dict):
            raise _fail(path, f"record {i} is a {type(r).__name__}, expected an object")
        for key, typ in fields.items():
            if not isinstance(r.get(key), typ):
                raise _fail(path, f"record {i} ({r.get('name')!r}): expected {key!r} of type {typ.__name__}, "
                                  f"found {type(r.get(key)).__name__}")
        if not (len(r["outputs"]) == len(r["shapes"]) == len(r["dtypes"])):
            raise _fail(path, f"record {i} ({r['name']}): outputs, shapes and dtypes differ in length")
        if r.get("kernel") is not None and not isinstance(r["kernel"], str):
            raise _fail(path, f"record {i} ({r['name']}): 'kernel' must be text or null")
        for name, shape, dtype in zip(r["outputs"], r["shapes"], r["dtypes"]):
            produced[name] = (shape, dtype)
    stored = {k for k in header if k != "__metadata__"}
    if set(m["tensors"]) != stored:
        raise _fail(path, f"the manifest lists tensors {sorted(set(m['tensors']) ^ stored)[:5]} that the file "
                          f"does not hold, or the reverse")
    if not isinstance(m.get("profile", []), list) or not isinstance(m.get("bisect") or {}, dict):
        raise _fail(path, "expected 'profile' to be a list and 'bisect' an object or null")
    for name in stored:
        info = header[name]
        if name.removeprefix(REFERENCE) not in produced:
            raise _fail(path, f"tensor {name!r} belongs to no record")
        shape, dtype = produced[name.removeprefix(REFERENCE)]
        if list(info.get("shape", [])) != shape:
            raise _fail(path, f"tensor {name!r}: the record says shape {shape}, the file holds {info.get('shape')}")


def load_capture(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Capture:
    """Read a capture file, checking it fully; with `root`, the path must lie inside that folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    real = os.path.realpath(path)
    if root is not None:
        base = os.path.realpath(root)
        if os.path.commonpath([base, real]) != base:
            raise _fail(path, f"expected a path inside {base}")
    if not os.path.isfile(real):
        raise _fail(path, "no such file")
    size = os.path.getsize(real)
    if size > MAX_FILE_BYTES:
        raise _fail(path, f"{size} bytes is more than the {MAX_FILE_BYTES} a capture may hold")
    with open(real, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _fail(path, f"expected a safetensors header, found {len(head)} bytes")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise _fail(path, f"header of {n} bytes does not fit a file of {size} bytes")
        try:
            header = json.loads(f.read(n))
            manifest = json.loads(header["__metadata__"][FORMAT])
        except (ValueError, KeyError, TypeError) as e:
            raise _fail(path, f"expected a JSON header with a {FORMAT} manifest ({e.__class__.__name__}: {e})") from None
    if not isinstance(header, dict):
        raise _fail(path, "the header is not a JSON object")
    _check_manifest(path, manifest, header)
    try:
        tensors = load_file(real)
    except (SafetensorError, ValueError, OSError) as e:
        raise _fail(path, f"the tensor data is damaged: {e}") from None
    records = [OpRecord(**{k: r[k] for k in OpRecord.__dataclass_fields__ if k in r}) for r in manifest["records"]]
    reference = {k[len(REFERENCE):]: tensors.pop(k) for k in list(tensors) if k.startswith(REFERENCE)}
    for r in records:
        for name, dtype in zip(r.outputs, r.dtypes):
            if name in tensors and _DTYPES.get(dtype) != tensors[name].dtype:
                raise _fail(path, f"tensor {name!r}: the record says {dtype}, the file holds {tensors[name].dtype}")
    return Capture(manifest["graph"], records, tensors, manifest["kernels"], manifest.get("compile_error"),
                   manifest.get("profile") or [], reference, manifest.get("bisect"))
