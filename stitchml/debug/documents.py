"""What the debugger shows, read from the files it was opened on.

A file is one of: a capture (`Capture.save`), a saved graph (`Graph.save`'s
JSON), a package (`Package.save`) or a Chrome/Perfetto trace
(`stitchml.write_trace`). Each becomes a `Document`: the ops with their
kernels, the kernels with the fusion report and generated source, the
captured tensors (captures only), and timeline events. A file that cannot be
read becomes a Document holding the error, which the debugger shows.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import StitchError
from .capture import Capture, OpRecord, _attr_summary, _kernel_map, load_capture


@dataclass
class Document:
    """One opened file, ready to show."""

    path: str
    kind: str  # "capture", "graph", "package", "trace" or "error"
    name: str = ""
    records: list[OpRecord] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    capture: Capture | None = None
    trace: list[dict] = field(default_factory=list)
    error: str | None = None
    note: str | None = None  # why some part is missing (no kernels: shapes unknown, say)
    origins: dict[str, list[dict]] = field(default_factory=dict)  # tensor name -> the model values it holds

    def summary(self) -> dict:
        return {"path": self.path, "kind": self.kind, "name": self.name, "error": self.error, "note": self.note,
                "ops": len(self.records), "kernels": len(self.kernels),
                "tensors": sorted(self.capture.tensors) if self.capture else [],
                "references": sorted(self.capture.reference) if self.capture else [],
                "bisect": self.capture.bisect if self.capture else None}

    def network(self) -> dict:
        return {"name": self.name, "ops": [asdict(r) for r in self.records], "kernels": self.kernels,
                "note": self.note, "origins": self.origins}

    def timeline(self) -> list[dict]:
        """Chrome trace events: the trace file's, or the profiled run's kernels with their dependencies."""
        if self.trace:
            return self.trace
        profile = self.capture.profile if self.capture else []
        if not profile:
            return []
        events = [{"ph": "M", "name": "process_name", "pid": "run", "args": {"name": f"{self.name}: one run"}},
                  {"ph": "M", "name": "thread_name", "pid": "run", "tid": 1, "args": {"name": "steps"}}]
        producer = {t: r.kernel for r in self.records if r.kernel for t in r.outputs}
        start, ends, flows = 0.0, {}, 0
        for name, kind, ms in profile:
            dur = float(ms) * 1e3
            events.append({"ph": "X", "name": name, "cat": kind, "pid": "run", "tid": 1, "ts": start, "dur": dur,
                           "args": {"kind": kind}})
            needs = {producer.get(t) for r in self.records if r.kernel == name for t in r.inputs} - {None, name}
            for dep in sorted(needs & set(ends)):
                flows += 1
                events.append({"ph": "s", "id": flows, "name": "data", "cat": "dependency", "pid": "run", "tid": 1,
                               "ts": ends[dep]})
                events.append({"ph": "f", "bp": "e", "id": flows, "name": "data", "cat": "dependency", "pid": "run",
                               "tid": 1, "ts": start})
            ends[name] = start + dur
            start += dur
        return events


def _records_of_graph(graph) -> list[OpRecord]:
    return [OpRecord(op.name, op.op, _attr_summary(op.attrs), [t.name for t in op.inputs],
                     [t.name for t in op.outputs], [list(t.shape) if t.shape is not None else [] for t in op.outputs],
                     [str(t.dtype) for t in op.outputs], op.location, op.scope) for op in graph.operations]


def _with_kernels(doc: Document, graph) -> Document:
    """Compile the graph on the CPU when every placeholder's shape is known, to show its kernels."""
    from ..ir import TensorType

    placeholders = graph.placeholders
    if any(not p.type.is_static for p in placeholders):
        doc.note = "kernels are not shown: some inputs have unknown extents (capture a run to see them)"
        return doc
    used = {t.id for op in graph.operations for t in op.inputs}
    targets = [t for op in graph.operations if op.op not in ("placeholder", "constant", "variable")
               for t in op.outputs if t.id not in used]
    try:
        exe = graph.compile({p: TensorType(p.shape, p.dtype) for p in placeholders}, targets, device="cpu")
    except StitchError as e:
        doc.note = f"kernels are not shown: the graph did not compile: {e}"
        return doc
    owner, doc.kernels = _kernel_map(exe)
    for r in doc.records:
        r.kernel = owner.get(r.name)
    return doc


def _sniff(path: str) -> str:
    """"json" (a graph or a trace), "package" (a directory or a zip) or "capture" (anything else, which
    load_capture then checks: a safetensors file begins with its header's length, then "{")."""
    if os.path.isdir(path):
        return "package"
    with open(path, "rb") as f:
        head = f.read(16)
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return "package" if head[:2] == b"PK" else "capture"


def open_document(path: str) -> Document:
    """Read `path` as whichever kind of file it is; errors become an error Document."""
    path = os.path.realpath(path)
    try:
        kind = _sniff(path)
        if kind == "capture":
            cap = load_capture(path)
            return Document(path, "capture", cap.graph_name, cap.records, cap.kernels, cap,
                            note=cap.compile_error and f"the graph did not compile: {cap.compile_error}")
        if kind == "json":
            with open(path) as f:
                data = json.load(f)
            if isinstance(data, dict) and "traceEvents" in data or isinstance(data, list):
                events = data["traceEvents"] if isinstance(data, dict) else data
                if not all(isinstance(e, dict) for e in events):
                    raise ValueError("expected a list of trace event objects")
                return Document(path, "trace", os.path.basename(path), trace=events)
            from ..graph import Graph

            graph = Graph.load(path)
            return _with_kernels(Document(path, "graph", graph.name, _records_of_graph(graph)), graph)
        from ..package import load_package

        fn = load_package(path).function()
        doc = Document(path, "package", fn.name, _records_of_graph(fn.graph))
        for o in fn.origins.values():  # an imported function: which values of the model each tensor holds
            doc.origins.setdefault(o.tensor, []).append(o.record())
        return _with_kernels(doc, fn.graph)
    except (StitchError, OSError, ValueError) as e:
        return Document(path, "error", os.path.basename(path), error=f"{type(e).__name__}: {e}")


def tensor_stats(a: np.ndarray) -> dict:
    """min, max, mean, std of the finite values; NaN and Inf counts and the index of the first of each."""
    f = a.astype(np.float64)
    finite = np.isfinite(f)
    out = {"shape": list(a.shape), "dtype": str(a.dtype), "size": int(a.size),
           "nan": int(np.isnan(f).sum()), "inf": int(np.isinf(f).sum())}
    for key, mask in (("first_nan", np.isnan(f)), ("first_inf", np.isinf(f))):
        hit = np.argwhere(mask)
        out[key] = hit[0].tolist() if len(hit) else None
    vals = f[finite]
    out.update({k: (float(fn(vals)) if vals.size else None) for k, fn in
                (("min", np.min), ("max", np.max), ("mean", np.mean), ("std", np.std))})
    return out


def plane(a: np.ndarray, layout: str, n: int, c: int, limit: int = 512) -> np.ndarray:
    """The 2-D image of image `n`, channel `c` of a tensor (NCHW or NHWC; lower ranks as they come)."""
    if a.ndim == 0:
        a = a.reshape(1, 1)
    if a.ndim == 1:
        a = a.reshape(1, -1)
    elif a.ndim >= 3:
        if layout == "NHWC":
            a = np.moveaxis(a, -1, -3)
        lead = a.reshape((-1,) + a.shape[-3:])
        a = lead[min(max(n, 0), lead.shape[0] - 1)]
        a = a[min(max(c, 0), a.shape[0] - 1)]
    return a[:limit, :limit]
