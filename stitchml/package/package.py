"""Network packages: functions (IR graphs with named inputs and outputs), weights, optional kernels.

A package holds one or more *functions*. Each is a StitchML graph whose
inputs are placeholders and whose outputs are named tensors, with a signature
(names, dtypes, shapes with -1 for symbolic extents and the names of those
extents). On disk (container.py) a package is::

    manifest.json                     format, version, producer, functions, kernels, parts table
    functions/<name>.json             the function's IR (serialize.py's graph format)
    functions/<name>.safetensors      its weights and other tensor attributes
    kernels/<function>-<n>.bin        optional compiled kernels, per input dimensions and target

docs/packages.md describes every field. Loading checks every part (hashes,
sizes, paths), the IR (known ops, types re-inferred) and that the signature
agrees with the graph; nothing in a package is ever executed as code (kernels.py
says what compiled kernels carry and how a pipeline uses them).

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph(); x = g.placeholder((-1, 3), sm.float32, name="x")
    >>> pkg = sm.package.Package.from_graph(g, inputs={"x": x}, outputs={"y": g.tanh(x)})
    >>> pkg.function("main")(x=np.zeros((2, 3), np.float32))["y"].shape
    (2, 3)
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

from .. import dtypes
from ..runtime import loader
from ..errors import PackageError, SerializationError
from ..graph import Graph
from ..ir import UNKNOWN, Tensor, TensorType
from ..serialize import from_dict, to_dict
from ..tensor_data import TensorData
from ..version import __version__
from . import container, kernels as bundles
from .container import is_int
from .limits import Limits, known_elements, resolve

FORMAT = "stitchml.package"
VERSION = 1
log = logging.getLogger("stitchml.package")


@dataclass(frozen=True)
class Port:
    """One input or output of a function: name, type and the names of its symbolic extents."""

    name: str
    type: TensorType
    dim_names: tuple[str | None, ...] | None = None

    def record(self, tensor_id: int) -> dict:
        return {"name": self.name, "dtype": self.type.dtype.name,
                "shape": None if self.type.shape is None else list(self.type.shape),
                "dim_names": None if self.dim_names is None else list(self.dim_names), "tensor": tensor_id}

    def __str__(self) -> str:
        if self.type.shape is None:
            return f"{self.name}: {self.type}"
        names = self.dim_names or (None,) * len(self.type.shape)
        dims = [n if d == UNKNOWN and n else ("?" if d == UNKNOWN else str(d)) for d, n in zip(self.type.shape, names)]
        return f"{self.name}: {self.type.dtype}[{', '.join(dims)}]"


@dataclass(frozen=True)
class KernelEntry:
    """Compiled kernels (a kernels.py bundle) for one function, input dimensions and target."""

    function: str
    input_dimensions: dict[str, tuple[int, ...]]
    target: dict[str, str]
    part: str
    compiler: str = ""


@dataclass(frozen=True)
class Origin:
    """Where a value of an imported function came from: the public map from the graph back to the model.

    `key` names the value in the model it was imported from: the ONNX value name, or for torch.export
    ``module#k``, the k-th ATen op that submodule (``enc.act``; ``""`` for the top-level forward) ran. Such
    keys survive changes elsewhere in the network, so two versions of one module line up (the debugger's
    bisection compares an imported network with a PyTorch run of another version through them).
    `value` and `op` are the source's own names (ONNX value and op type; FX node and ATen operator),
    `tensor` the graph tensor holding the value, `location` the source line that computed it
    (``"unet.py:42"`` for torch.export, ``""`` for ONNX, which records none).
    """

    key: str
    value: str
    op: str
    tensor: str
    location: str = ""

    def record(self) -> dict:
        return {"key": self.key, "value": self.value, "op": self.op, "tensor": self.tensor, "location": self.location}


def _describe(target: dict[str, str]) -> str:
    build = f" (build {target['triton_build']})" if "triton_build" in target else ""
    return f"{target.get('arch')}/triton {target.get('triton')}{build}"


class Function:
    """A function of a package: its graph, input and output ports; call it to run it.

    ``fn(**inputs)`` returns ``{output name: TensorData}`` on the inputs'
    device: compiled on CUDA (one executable per input signature), eagerly on
    the CPU, as `Graph.run` does.

    `origins` maps each value of the model an importer read (by `Origin.key`) to the graph tensor that
    holds it, with the source's names and line; empty for a function built from a graph. It is saved
    with the package.
    """

    def __init__(self, name: str, graph, inputs: dict[str, tuple[Tensor, Port]], outputs: dict[str, tuple[Tensor, Port]],
                 origins: dict[str, Origin] | None = None):
        self.name = name
        self.graph = graph
        self._inputs = inputs
        self._outputs = outputs
        self.origins: dict[str, Origin] = dict(origins or {})
        self.package: Package | None = None  # set by the package that holds the function

    def origin_names(self) -> dict[str, str]:
        """{origin key: graph tensor name}, the `names=` that `stitchml.debug.bisect` takes to compare this
        function with a reference keyed like the model it was imported from."""
        return {k: o.tensor for k, o in self.origins.items()}

    @property
    def inputs(self) -> list[Port]:
        return [p for _, p in self._inputs.values()]

    @property
    def outputs(self) -> list[Port]:
        return [p for _, p in self._outputs.values()]

    def input_tensor(self, name: str) -> Tensor:
        return self._port(self._inputs, name, "input")[0]

    def output_tensor(self, name: str) -> Tensor:
        return self._port(self._outputs, name, "output")[0]

    def _port(self, table, name, what):
        if name not in table:
            raise PackageError(f"function {self.name!r} has no {what} named {name!r}; it has {list(table)}")
        return table[name]

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for op in self.graph.operations:
            counts[op.op] = counts.get(op.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def weight_bytes(self) -> int:
        return sum(op.attrs["value"].numel() * op.attrs["value"].element_size()
                   for op in self.graph.operations if op.op == "constant")

    def check_inputs(self, values: dict[str, Any]) -> dict[str, TensorData]:
        """TensorData for each input, checked against the signature (FeedError says which and why)."""
        from ..errors import FeedError

        unknown = set(values) - set(self._inputs)
        if unknown:
            raise FeedError(f"function {self.name!r} has no inputs named {sorted(unknown)}; it takes "
                            f"{', '.join(str(p) for p in self.inputs)}")
        out = {}
        for name, (_, port) in self._inputs.items():
            if name not in values:
                raise FeedError(f"function {self.name!r}: input {port} is missing")
            data = values[name] if isinstance(values[name], TensorData) else TensorData(values[name])
            if data.dtype != port.type.dtype or not port.type.accepts(data.shape):
                raise FeedError(f"function {self.name!r}: input {port} got {data.dtype}{list(data.shape)}")
            out[name] = data
        return out

    def __call__(self, **inputs: Any) -> dict[str, TensorData]:
        data = self.check_inputs(inputs)
        device = next(iter(data.values())).device if data else None
        # Graph.run compiles on CUDA (one cached executable per signature) and runs eagerly on the CPU.
        results = self.graph.run({self.input_tensor(n): d for n, d in data.items()},
                                 [t for t, _ in self._outputs.values()], device=device)
        return {name: results[t] for name, (t, _) in self._outputs.items()}

    def __repr__(self) -> str:
        return (f"Function({self.name!r}, ({', '.join(str(p) for p in self.inputs)}) -> "
                f"({', '.join(str(p) for p in self.outputs)}), {len(self.graph.operations)} ops)")


def _ports_of(tensors: dict[str, Tensor], dim_names: dict[str, Sequence[str | None]] | None) -> dict:
    out = {}
    for name, t in tensors.items():
        names = None if dim_names is None or name not in dim_names else tuple(dim_names[name])
        out[name] = (t, Port(name, t.type, names))
    return out


class Package:
    """A loaded or freshly built network package; see the module docstring."""

    def __init__(self, functions: dict[str, Function], producer: dict | None = None,
                 kernels: Sequence[KernelEntry] = (), kernel_parts: dict[str, bytes] | None = None):
        self.functions = functions
        for fn in functions.values():
            fn.package = self
        self.producer = dict(producer or {"name": "stitchml", "version": __version__})
        self.kernels = list(kernels)
        self._kernel_parts = dict(kernel_parts or {})

    @classmethod
    def from_graph(cls, graph, inputs: dict[str, Tensor], outputs: dict[str, Tensor], name: str = "main",
                   producer: dict | None = None, dim_names: dict[str, Sequence[str | None]] | None = None,
                   origins: dict[str, Origin] | None = None) -> "Package":
        """A one-function package from a graph, its input placeholders and output tensors (and, from an
        importer, where its values came from: `Function.origins`)."""
        for n, t in inputs.items():
            if t.op.op != "placeholder" or t.graph is not graph:
                raise PackageError(f"input {n!r} must be a placeholder of the graph, got {t!r}")
        if origins:
            present = {t.name for op in graph.operations for t in op.outputs}
            origins = {k: o for k, o in origins.items() if o.tensor in present}  # values folded away have none
        fn = Function(name, graph, _ports_of(inputs, dim_names), _ports_of(outputs, dim_names), origins)
        return cls({name: fn}, producer)

    def function(self, name: str = "main") -> Function:
        """The function called `name`."""
        if name not in self.functions:
            raise PackageError(f"the package has no function {name!r}; it has {sorted(self.functions)}")
        return self.functions[name]

    # -- compiled kernels ---------------------------------------------------------
    def compile_kernels(self, function: str, input_dimensions: dict[str, Sequence[int]],
                        device: Any = "cuda") -> KernelEntry:
        """Compile `function` for these input dimensions on a CUDA device and carry the kernels.

        A pipeline made for the same dimensions on a machine of the same target then compiles
        nothing (kernels.py). Needs a GPU: ``pkg.compile_kernels("main", {"x": (8, 3, 64, 64)})``.
        """
        dims, target, blob = bundles.build(self.function(function), input_dimensions, device)
        return self.add_kernels(function, dims, target, blob, compiler=f"stitchml {__version__}")

    def add_kernels(self, function: str, input_dimensions: dict[str, Sequence[int]], target: dict[str, str],
                    blob: bytes, compiler: str = "") -> KernelEntry:
        """Attach a kernel bundle (kernels.py) built for `target`, in place of one for the same function,
        dimensions and target. `input_dimensions` names every input, as `MLPipeline.input_dimensions` does."""
        self.function(function)
        bundle = bundles.unpack(blob, f"add_kernels({function!r})")
        if bundle.target != dict(target):
            raise PackageError(f"add_kernels({function!r}): the bundle was built for {_describe(bundle.target)}, "
                               f"the entry says {_describe(target)}")
        dims = {k: tuple(int(d) for d in v) for k, v in input_dimensions.items()}
        old = next((k for k in self.kernels if (k.function, k.input_dimensions, k.target) == (function, dims, target)),
                   None)
        if old is not None:
            self.kernels.remove(old)
            part = old.part
        else:
            n = len(self.kernels)
            while f"kernels/{function}-{n}.bin" in self._kernel_parts:
                n += 1
            part = f"kernels/{function}-{n}.bin"
        entry = KernelEntry(function, dims, dict(target), part, compiler)
        self.kernels.append(entry)
        self._kernel_parts[part] = bytes(blob)
        return entry

    def find_kernels(self, function: str, input_dimensions: dict[str, Sequence[int]],
                     target: dict[str, str]) -> tuple[bytes | None, str]:
        """The kernel cache matching function, dimensions and target, or None and the reason none fits.

        Without a bundle for these dimensions, one built for other extents of the same ranks serves:
        generated kernels take their sizes as arguments, so the sources it carries are those a compile for
        these dimensions generates wherever the launch blocks agree, and Triton finds their binaries."""
        dims = {k: tuple(v) for k, v in input_dimensions.items()}
        candidates = [k for k in self.kernels if k.function == function and k.input_dimensions == dims]
        for k in candidates:
            if k.target == target:
                return self._kernel_parts[k.part], f"built for {_describe(k.target)}"
        ranks = {n: len(d) for n, d in dims.items()}
        for k in self.kernels:
            if k.function == function and k.target == target and \
                    {n: len(d) for n, d in k.input_dimensions.items()} == ranks:
                built = ", ".join(f"{n}={list(d)}" for n, d in sorted(k.input_dimensions.items()))
                return self._kernel_parts[k.part], f"built for {_describe(k.target)} at {built}, serving other sizes"
        if not candidates:
            return None, f"the package has no compiled kernels for {function!r} with these input dimensions"
        built = ", ".join(_describe(k.target) for k in candidates)
        return None, f"the package's kernels target {built}, this machine is {_describe(target)}"

    def install_kernels(self, function: str, input_dimensions: dict[str, Sequence[int]],
                        device: Any) -> tuple[str, int | None]:
        """Put the compiled kernels for `function`, these dimensions and this machine where a compile on
        `device` finds them (an ML pipeline of the function calls this before compiling). Returns a note
        saying that they serve, or why the pipeline compiles here, and the logging level it deserves
        (None: nothing worth logging)."""
        blob, why = self.find_kernels(function, input_dimensions, bundles.current_target(device))
        if blob is None:
            return f"compiled here: {why}", (logging.INFO if self.kernels else None)
        bundle = bundles.unpack(blob)
        try:
            bundles.install(bundle, loader.cache_dir(), bundles.triton_cache_dir())
        except (OSError, ImportError) as e:  # a cache that cannot be written only costs compile time
            return f"compiled here: the package's kernels ({why}) could not be installed: {e}", logging.WARNING
        return f"using the package's compiled kernels ({bundle.kernel_count} kernels, {why})", None

    def unserved_kernels(self, function: str, input_dimensions: dict[str, Sequence[int]], device: Any,
                         executable) -> list[str] | None:
        """The kernels of `executable` (compiled for these dimensions) whose binaries the bundle that
        `install_kernels` chose does not carry, so that Triton compiles them; None when no bundle serves
        or it does not list the specialisations it holds (package/kernels.py `unserved`)."""
        blob, _ = self.find_kernels(function, input_dimensions, bundles.current_target(device))
        return None if blob is None else bundles.unserved(bundles.unpack(blob), executable)

    # -- saving -----------------------------------------------------------------------
    def manifest_and_parts(self) -> tuple[dict, dict[str, bytes]]:
        from safetensors.torch import save as save_tensors

        parts: dict[str, bytes] = dict(self._kernel_parts)
        functions = {}
        for name, fn in self.functions.items():
            container.check_part_name(f"functions/{name}.json", f"function {name!r}")
            doc, tensors = to_dict(fn.graph)
            parts[f"functions/{name}.json"] = json.dumps(doc, separators=(",", ":")).encode()
            parts[f"functions/{name}.safetensors"] = save_tensors({k: v.cpu().contiguous() for k, v in tensors.items()})
            functions[name] = {
                "graph": f"functions/{name}.json", "weights": f"functions/{name}.safetensors",
                "inputs": [p.record(t.id) for t, p in fn._inputs.values()],
                "outputs": [p.record(t.id) for t, p in fn._outputs.values()],
            }
            if fn.origins:
                functions[name]["origins"] = [o.record() for o in fn.origins.values()]
        kernels = [{"function": k.function, "input_dimensions": {n: list(d) for n, d in k.input_dimensions.items()},
                    "target": k.target, "part": k.part, "compiler": k.compiler} for k in self.kernels]
        manifest = {"format": FORMAT, "version": VERSION, "producer": self.producer, "functions": functions,
                    "kernels": kernels}
        return manifest, parts

    def save(self, path: str | os.PathLike) -> None:
        """Write the package: one zip file, or a directory when `path` ends with a separator or is one."""
        manifest, parts = self.manifest_and_parts()
        container.write(path, manifest, parts)

    def summary(self) -> str:
        from .inspect import summary

        return summary(self)

    def __repr__(self) -> str:
        return f"Package({sorted(self.functions)}, producer={self.producer.get('name')})"


# -- loading -------------------------------------------------------------------------
def _need(cond: bool, where: str, message: str) -> None:
    if not cond:
        raise PackageError(f"{where}: {message}")


def _port(rec: Any, where: str) -> tuple[int, Port]:
    _need(isinstance(rec, dict), where, f"expected an object, got {type(rec).__name__}")
    name, shape, tid = rec.get("name"), rec.get("shape"), rec.get("tensor")
    _need(isinstance(name, str) and name != "", where, f"name must be a non-empty string, got {name!r}")
    _need(is_int(tid), where, f"tensor must be an int id, got {tid!r}")
    _need(shape is None or (isinstance(shape, list) and all(is_int(d) and d >= -1 for d in shape)),
          where, f"shape must be a list of ints >= -1 (or null), got {shape!r}")
    _need(isinstance(rec.get("dtype"), str), where, f"dtype must be a dtype's name, got {rec.get('dtype')!r:.40}")
    try:
        dt = dtypes.as_dtype(rec["dtype"])
    except (TypeError, ValueError) as e:
        raise PackageError(f"{where}: {e}") from None
    names = rec.get("dim_names")
    _need(names is None or (isinstance(names, list) and shape is not None and len(names) == len(shape)
                            and all(n is None or isinstance(n, str) for n in names)),
          where, f"dim_names must be null or one string/null per extent, got {names!r}")
    return tid, Port(name, TensorType(None if shape is None else tuple(shape), dt), None if names is None else tuple(names))


def _check_size(graph, limits: Limits, where: str) -> None:
    """Refuse an IR whose tensors could not be held: every known extent's product within the limit."""
    for op in graph.operations:
        for t in op.outputs:
            known = known_elements(t.shape)
            if known > limits.max_tensor_elements:
                raise limits.exceeded("max_tensor_elements", known, f"{where}: tensor {t.name} ({t.type}) elements")


def _load_function(name: str, rec: Any, parts: dict[str, bytes], where: str, limits: Limits) -> Function:
    from safetensors import SafetensorError
    from safetensors.torch import load as load_tensors

    _need(isinstance(rec, dict), where, "expected an object")
    for key in ("graph", "weights"):
        _need(isinstance(rec.get(key), str) and rec[key] in parts, where,
              f"{key} part {rec.get(key)!r} is not in the package")
    doc = container.parse_json(parts[rec["graph"]], f"{where} graph")
    ops = doc.get("operations") if isinstance(doc, dict) else None
    if isinstance(ops, list) and len(ops) > limits.max_operations:
        raise limits.exceeded("max_operations", len(ops), f"{where}: the IR's operations")
    try:
        tensors = load_tensors(parts[rec["weights"]])
    except (SafetensorError, ValueError, RuntimeError, OverflowError) as e:
        raise PackageError(f"{where}: weights {rec['weights']} are not valid safetensors ({e})") from None
    try:
        graph = from_dict(doc, tensors, Graph)
    except SerializationError as e:
        raise PackageError(f"{where}: invalid IR: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as e:
        raise PackageError(f"{where}: malformed IR ({type(e).__name__}: {e})") from None
    _check_size(graph, limits, where)
    by_id = {t.id: t for op in graph.operations for t in op.outputs}
    ports = {}
    for kind in ("inputs", "outputs"):
        recs = rec.get(kind)
        _need(isinstance(recs, list), where, f"{kind} must be a list")
        table = {}
        for i, r in enumerate(recs):
            pw = f"{where} {kind}[{i}]"
            tid, port = _port(r, pw)
            _need(port.name not in table, pw, f"name {port.name!r} is used twice")
            _need(tid in by_id, pw, f"tensor id {tid} is not in the graph")
            t = by_id[tid]
            if kind == "inputs":
                _need(t.op.op == "placeholder", pw, f"tensor {t.name} is made by {t.op.op}, not a placeholder")
                _need(t.type == port.type, pw, f"the graph's placeholder is {t.type}, the signature says {port.type}")
            else:
                _need(t.dtype == port.type.dtype, pw, f"the graph's tensor is {t.type}, the signature says {port.type}")
            table[port.name] = (t, port)
        ports[kind] = table
    return Function(name, graph, ports["inputs"], ports["outputs"], _origins(rec.get("origins", []), by_id, where))


def _origins(recs: Any, by_id: dict, where: str) -> dict[str, Origin]:
    _need(isinstance(recs, list), where, f"origins must be a list, got {type(recs).__name__}")
    names = {t.name for t in by_id.values()}
    out: dict[str, Origin] = {}
    for i, r in enumerate(recs):
        ow = f"{where} origins[{i}]"
        _need(isinstance(r, dict) and set(r) == set(Origin.__dataclass_fields__)
              and all(isinstance(v, str) for v in r.values()), ow,
              f"expected an object of text fields {sorted(Origin.__dataclass_fields__)}, got {str(r)[:120]!r}")
        _need(r["key"] not in out, ow, f"key {r['key']!r} is used twice")
        _need(r["tensor"] in names, ow, f"tensor {r['tensor']!r} is not in the graph")
        out[r["key"]] = Origin(**r)
    return out


def _load_kernels(manifest: dict, functions: dict, parts: dict[str, bytes]) -> tuple[list[KernelEntry], dict]:
    entries, blobs = [], {}
    recs = manifest.get("kernels", [])
    _need(isinstance(recs, list), "manifest", "kernels must be a list")
    for i, r in enumerate(recs):
        where = f"manifest kernels[{i}]"
        _need(isinstance(r, dict), where, "expected an object")
        _need(isinstance(r.get("function"), str) and r["function"] in functions, where,
              f"function {r.get('function')!r} is not in the package")
        _need(isinstance(r.get("part"), str) and r["part"] in parts, where, f"part {r.get('part')!r} is not in the package")
        dims, target = r.get("input_dimensions"), r.get("target")
        _need(isinstance(dims, dict) and all(isinstance(v, list) and all(is_int(d) and d >= 0 for d in v)
                                             for v in dims.values()), where, "input_dimensions must map names to extents")
        _need(isinstance(target, dict) and all(isinstance(v, str) for v in target.values()), where,
              "target must map strings to strings")
        bundle = bundles.unpack(parts[r["part"]], f"{where} part {r['part']}")
        _need(bundle.target == target, where,
              f"the bundle was built for {_describe(bundle.target)}, the entry says {_describe(target)}")
        entries.append(KernelEntry(r["function"], {k: tuple(v) for k, v in dims.items()}, target, r["part"],
                                   str(r.get("compiler", ""))))
        blobs[r["part"]] = parts[r["part"]]
    return entries, blobs


def load_package(path: str | os.PathLike, limits: Limits | None = None) -> Package:
    """Read and validate a package file or directory; PackageError says what is wrong and where.

    `limits` bounds what loading may cost (sizes of parts and tensors, operations; limits.py); the
    default is `default_limits()`. Any damaged or hostile input raises PackageError, never another error.

    >>> import stitchml as sm
    >>> sm.load_package("/nonexistent.smpkg")
    Traceback (most recent call last):
    ...
    stitchml.errors.PackageError: /nonexistent.smpkg: no such package
    """
    limits = resolve(limits)
    manifest, parts = container.read(path, limits)
    where = f"{os.fspath(path)}: manifest"
    _need(manifest.get("format") == FORMAT, where, f"format is {manifest.get('format')!r}, expected {FORMAT!r}")
    _need(manifest.get("version") == VERSION, where,
          f"format version {manifest.get('version')!r} is not supported (this build reads version {VERSION})")
    producer = manifest.get("producer", {})
    _need(isinstance(producer, dict), where, "producer must be an object")
    funcs = manifest.get("functions")
    _need(isinstance(funcs, dict) and funcs, where, "functions must be a non-empty object")
    functions = {}
    for name, rec in funcs.items():
        _need(isinstance(name, str) and name.isidentifier(), where, f"function name {name!r} must be an identifier")
        functions[name] = _load_function(name, rec, parts, f"{where} functions[{name!r}]", limits)
    used = {r[k] for r in funcs.values() for k in ("graph", "weights")}
    kernels, blobs = _load_kernels(manifest, functions, parts)
    unused = set(parts) - used - set(blobs)
    _need(not unused, where, f"parts {sorted(unused)[:5]} are listed but belong to nothing")
    return Package(functions, producer, kernels, blobs)
