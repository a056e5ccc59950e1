"""Kernel bundles: a package's compiled kernels for one function, input dimensions and target.

A bundle is the blob `Package.add_kernels` stores (one part, ``kernels/<function>-<n>.bin``)::

    b"SMKERNEL"          8 bytes
    header length        8 bytes, little-endian
    header               UTF-8 JSON: format, version, target, built_with, files: [{path, size}]
    file bytes           every file's bytes in the header's order, and nothing after them

and holds two kinds of files:

* ``sources/k<32 hex>.py``: a generated kernel's Triton source, named as runtime/loader.py names the
  files it imports: the first 32 hex digits of the content's SHA-256 (checked on load);
* ``triton/<entry>/<file>``: one entry of Triton's cache directory as Triton wrote it while compiling
  those sources (<entry> is Triton's hash of what it compiled: source, options, GPU, Triton build).
  Each compiled kernel is a group: its IR stages, binary and metadata, listed by
  ``__grp__<kernel>.json``. Triton's group files hold absolute paths; a bundle's hold file names, and
  installing writes the paths where the files land.

A bundle carries no host code: Triton's launcher and utility libraries (.so files in entries without a
group) are left out and rebuilt by Triton where they are missing. Loading a package parses and checks
every bundle (`unpack`); a pipeline on a machine the bundle was built for `install`s it before it
compiles, writing only missing files, so the compile that follows finds every kernel in the caches.

    >>> b = Bundle({"arch": "sm_90", "triton": "3.6.0"}, {}, {}, {})
    >>> unpack(pack(b)).target
    {'arch': 'sm_90', 'triton': '3.6.0'}
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ..errors import PackageError, PipelineError
from ..runtime.launch import launches
from ..version import __version__
from . import container

MAGIC = b"SMKERNEL"
FORMAT = "stitchml.kernels"
VERSION = 1
MAX_HEADER_BYTES = 4 << 20
MAX_FILES = 4096
MAX_FILE_BYTES = 256 << 20
GROUP = "__grp__"
CLASSES = ("1", "16", "any", "i64")  # runtime/launch.py `specialisation`
_VARIANT = re.compile(rf"{'|'.join(CLASSES)}|[A-Za-z_][A-Za-z0-9_]{{0,31}}=[0-9A-Za-z_.]{{1,32}}")
_SOURCE = re.compile(r"k[0-9a-f]{32}\.py")
_ENTRY = re.compile(r"[A-Z2-7]{52}|[0-9a-f]{64}")  # a SHA-256 in base32 (Triton 3.x) or hex (older)
_STAGES = ("source", "ttir", "ttgir", "glir", "llir", "ptx", "cubin", "amdgcn", "hsaco", "json")
# Triton names a kernel's files after the JIT function (an identifier, cut to 150 characters).
_FILE = re.compile(rf"({GROUP})?[A-Za-z_][A-Za-z0-9_]{{0,149}}\.({'|'.join(_STAGES)})")


@dataclass
class Bundle:
    """A bundle's contents: target, versions it was built with, sources and Triton cache entries."""

    target: dict[str, str]
    built_with: dict[str, str]
    sources: dict[str, bytes]  # file name -> Triton source
    entries: dict[str, dict[str, bytes]]  # Triton cache entry -> file name -> bytes
    # source file name -> the binaries compiled from it, each as runtime/launch.py `KernelLaunch.binary`
    # gives it (the size arguments' specialisations, constexprs, launch options); empty: not recorded
    variants: dict[str, list[list[str]]] = field(default_factory=dict)

    @property
    def kernel_count(self) -> int:
        """Compiled kernels: one group per kernel and specialization."""
        return sum(1 for files in self.entries.values() for name in files if name.startswith(GROUP))


def pack(bundle: Bundle) -> bytes:
    """The bundle's bytes (see the module docstring)."""
    files = [(f"sources/{n}", d) for n, d in sorted(bundle.sources.items())]
    files += [(f"triton/{e}/{n}", d) for e, fs in sorted(bundle.entries.items()) for n, d in sorted(fs.items())]
    header = json.dumps({"format": FORMAT, "version": VERSION, "target": bundle.target,
                         "built_with": bundle.built_with, "variants": bundle.variants,
                         "files": [{"path": p, "size": len(d)} for p, d in files]}).encode()
    return b"".join([MAGIC, len(header).to_bytes(8, "little"), header, *(d for _, d in files)])


def _strings(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def unpack(blob: bytes, where: str = "kernel bundle") -> Bundle:
    """Parse and check a bundle; PackageError says what is wrong and where."""
    def need(cond: bool, message: str) -> None:
        if not cond:
            raise PackageError(f"{where}: {message}")

    need(isinstance(blob, (bytes, bytearray)), f"expected bytes, got {type(blob).__name__}")
    need(blob[:8] == MAGIC and len(blob) >= 16,
         f"not a kernel bundle: expected {MAGIC!r} and a header length, found {bytes(blob[:16])!r}")
    size = int.from_bytes(blob[8:16], "little")
    need(size <= MAX_HEADER_BYTES, f"header of {size} bytes, over the limit of {MAX_HEADER_BYTES}")
    need(16 + size <= len(blob), f"truncated: the header needs {size} bytes, {len(blob) - 16} follow")
    header = container.parse_json(bytes(blob[16:16 + size]), f"{where} header")
    need(isinstance(header, dict), "the header must be a JSON object")
    need(header.get("format") == FORMAT and header.get("version") == VERSION,
         f"format {header.get('format')!r} version {header.get('version')!r}, expected {FORMAT!r} version {VERSION}")
    target, built_with, files = header.get("target"), header.get("built_with"), header.get("files")
    need(_strings(target) and "arch" in target and "triton" in target,
         f"target must map strings to strings, with arch and triton; got {target!r}"[:300])
    need(_strings(built_with), f"built_with must map strings to strings; got {built_with!r}"[:300])
    variants = header.get("variants", {})
    need(isinstance(variants, dict) and len(variants) <= MAX_FILES and all(
        isinstance(k, str) and isinstance(v, list) and len(v) <= 64 and all(
            isinstance(c, list) and len(c) <= 16 and all(isinstance(x, str) and _VARIANT.fullmatch(x) for x in c)
            for c in v)
        for k, v in variants.items()),
         f"variants must map source names to lists of binaries (lists of {', '.join(CLASSES)} or name=value); "
         f"got {variants!r}"[:300])
    need(isinstance(files, list) and len(files) <= MAX_FILES, f"files must be a list of at most {MAX_FILES}")
    sources: dict[str, bytes] = {}
    entries: dict[str, dict[str, bytes]] = {}
    offset, seen = 16 + size, set()
    for i, rec in enumerate(files):
        path, n = (rec.get("path"), rec.get("size")) if isinstance(rec, dict) else (None, None)
        need(isinstance(path, str) and len(path) <= 256 and type(n) is int and 0 <= n <= MAX_FILE_BYTES,
             f"files[{i}]: expected {{'path': str of at most 256, 'size': 0..{MAX_FILE_BYTES}}}, got {rec!r}"[:300])
        need(path not in seen, f"files[{i}]: {path!r} appears twice")
        seen.add(path)
        data = bytes(blob[offset:offset + n])
        need(len(data) == n, f"truncated: {path} needs {n} bytes, {len(data)} follow")
        offset += n
        parts = path.split("/")
        if len(parts) == 2 and parts[0] == "sources":
            need(bool(_SOURCE.fullmatch(parts[1])), f"files[{i}]: source name {parts[1]!r} must be k<32 hex>.py")
            digest = hashlib.sha256(data).hexdigest()[:32]
            need(digest == parts[1][1:-3], f"{path}: content's SHA-256 starts {digest}, the name says {parts[1][1:-3]}")
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise PackageError(f"{where}: {path}: not UTF-8 text") from None
            sources[parts[1]] = data
        elif len(parts) == 3 and parts[0] == "triton":
            need(bool(_ENTRY.fullmatch(parts[1])), f"files[{i}]: Triton entry {parts[1]!r} must be a SHA-256 "
                                                   "in base32 (52 of A-Z2-7) or hex (64)")
            m = _FILE.fullmatch(parts[2])
            need(bool(m) and (not m.group(1) or parts[2].endswith(".json")),
                 f"files[{i}]: Triton file {parts[2]!r} must be <kernel>.<{'|'.join(_STAGES)}> or "
                 f"{GROUP}<kernel>.json")
            entries.setdefault(parts[1], {})[parts[2]] = data
        else:
            need(False, f"files[{i}]: path {path!r} must be sources/k<32 hex>.py or triton/<entry>/<file>")
    need(offset == len(blob), f"{len(blob) - offset} bytes follow the last file listed")
    for entry, named in entries.items():
        _check_entry(named, f"{where}: triton/{entry}")
    unknown = sorted(set(variants) - set(sources))
    need(not unknown, f"variants name sources the bundle does not carry: {unknown[:3]}")
    return Bundle(dict(target), dict(built_with), sources, entries,
                  {k: [list(c) for c in v] for k, v in variants.items()})


def _check_entry(files: dict[str, bytes], where: str) -> None:
    """Each group lists its own files by name, names its metadata, and every file belongs to a group."""
    groups = [n for n in files if n.startswith(GROUP)]
    if not groups:
        raise PackageError(f"{where}: no {GROUP}<kernel>.json lists the entry's files")
    listed: set[str] = set()
    for g in groups:
        doc = container.parse_json(files[g], f"{where}/{g}")
        children = doc.get("child_paths") if isinstance(doc, dict) else None
        if not isinstance(children, dict) or any(k != v for k, v in children.items()):
            raise PackageError(f"{where}/{g}: expected {{\"child_paths\": {{name: name}}}}, got {str(doc)[:200]}")
        metadata = g[len(GROUP):]
        if metadata not in children:
            raise PackageError(f"{where}/{g}: does not list the kernel's metadata {metadata}")
        for name in children:
            if name not in files or name.startswith(GROUP):
                raise PackageError(f"{where}/{g}: lists {name!r}, which is not a kernel file of the entry")
        if not isinstance(container.parse_json(files[metadata], f"{where}/{metadata}"), dict):
            raise PackageError(f"{where}/{metadata}: the kernel's metadata must be a JSON object")
        listed |= set(children)
    stray = sorted(set(files) - set(groups) - listed)
    if stray:
        raise PackageError(f"{where}: files {stray[:5]} belong to no group")


# -- installing --------------------------------------------------------------------------------
@dataclass
class Installed:
    """The files an install wrote, and those it found already there (and left as they were)."""

    written: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)


def _put(path: str, data: bytes, done: Installed) -> None:
    if os.path.exists(path):
        done.present.append(path)
        return
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".install-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.link(tmp, path)  # atomic, and fails where another process wrote the file meanwhile: never overwrites
        done.written.append(path)
    except FileExistsError:
        done.present.append(path)
    finally:
        os.unlink(tmp)


def install(bundle: Bundle, sources_dir: str, triton_dir: str) -> Installed:
    """Write the bundle's sources into `sources_dir` and its Triton entries into `triton_dir`.

    Only missing files are written. A group file goes last and names where its files are, so Triton
    never finds a group whose files are not there yet.
    """
    done = Installed()
    os.makedirs(sources_dir, exist_ok=True)
    for name, data in sorted(bundle.sources.items()):
        _put(os.path.join(sources_dir, name), data, done)
    for entry, files in sorted(bundle.entries.items()):
        folder = os.path.join(triton_dir, entry)
        os.makedirs(folder, exist_ok=True)
        groups = sorted(n for n in files if n.startswith(GROUP))
        for name in sorted(set(files) - set(groups)):
            _put(os.path.join(folder, name), files[name], done)
        for g in groups:
            children = json.loads(files[g])["child_paths"]
            doc = {"child_paths": {n: os.path.join(folder, n) for n in children}}
            _put(os.path.join(folder, g), json.dumps(doc).encode(), done)
    return done


# -- Triton's cache --------------------------------------------------------------------------------
def triton_cache_dir() -> str:
    """The directory Triton caches compiled kernels in (``TRITON_CACHE_DIR`` or ``triton.knobs``)."""
    from triton import knobs

    return knobs.cache.dir


@contextlib.contextmanager
def triton_cache_at(path: str) -> Iterator[None]:
    """Triton caches into `path` inside the block; its previous setting (and environment) come back after."""
    from triton import knobs

    with knobs.cache.scope():
        knobs.cache.dir = path
        yield


def triton_build() -> str | None:
    """A digest of what Triton puts into every cache key besides the kernel: its installation (version,
    sources, libtriton) and the backend (GPU arch, ptxas version); None where it cannot be found.

    Two machines with equal digests share cache entries; a bundle built under another digest would be
    missed by Triton even where the version string agrees.
    """
    try:
        try:
            from triton.runtime.cache import triton_key
        except ImportError:  # older Triton kept it beside the compiler
            from triton.compiler.compiler import triton_key
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        key = f"{triton_key()}-{make_backend(driver.active.get_current_target()).hash()}"
    except Exception:  # noqa: BLE001 - any failure only means "unknown": the bundle then does not match
        return None
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def current_target(device: Any = "cpu") -> dict[str, str]:
    """What compiled kernels must have been built for to run here: GPU arch, Triton version and, on a
    GPU, the digest of Triton's build and backend that its cache keys depend on (`triton_build`)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        target = {"arch": f"sm_{major}{minor}", "triton": triton_version}
        with torch.cuda.device(dev):
            build = triton_build() if triton_version != "none" else None
        return target if build is None else {**target, "triton_build": build}
    return {"arch": "cpu", "triton": triton_version}


def collect(triton_dir: str) -> dict[str, dict[str, bytes]]:
    """The compiled kernels in a Triton cache directory, as bundle entries (group paths become names)."""
    entries = {}
    for entry in sorted(os.listdir(triton_dir)):
        folder = os.path.join(triton_dir, entry)
        groups = sorted(n for n in os.listdir(folder) if n.startswith(GROUP)) if os.path.isdir(folder) else []
        files: dict[str, bytes] = {}
        for g in groups:  # entries without one hold Triton's host libraries, which bundles leave out
            with open(os.path.join(folder, g), "rb") as f:
                children = sorted(json.load(f)["child_paths"])
            for name in children:
                with open(os.path.join(folder, name), "rb") as f:
                    files[name] = f.read()
            files[g] = json.dumps({"child_paths": {n: n for n in children}}).encode()
        if files:
            entries[entry] = files
    return entries


# -- building ----------------------------------------------------------------------------------------
def build(function, input_dimensions: dict[str, Sequence[int]], device: Any = "cuda"
          ) -> tuple[dict[str, tuple[int, ...]], dict[str, str], bytes]:
    """Compile `function` for the input dimensions on a CUDA device; (all input dimensions, target, bundle).

    The pipeline is compiled as a loading machine will compile it, with Triton caching into an empty
    directory and every kernel imported anew, then run once on zeros so that Triton compiles every
    kernel (and every candidate of a measured choice, since another machine may choose differently).
    """
    import torch

    from ..runtime import choices, loader
    from ..pipeline.device import Compiler, MLPipelineDescriptor, device as make_device

    where = f"compile_kernels({function.name!r})"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise PackageError(f"{where}: kernels are compiled on a CUDA device; got {device!r} "
                           f"(CUDA {'available' if torch.cuda.is_available() else 'not available'})")
    try:
        import triton
    except ImportError:
        raise PackageError(f"{where}: Triton is not installed") from None
    dev = make_device(device)
    desc = MLPipelineDescriptor(function)
    desc.use_package_kernels = False
    try:
        for name, dims in input_dimensions.items():
            desc.set_input_dimensions(name, dims)
        with tempfile.TemporaryDirectory(prefix="stitchml-kernels-") as tmp, triton_cache_at(tmp):
            loader.forget()
            pipeline = Compiler(dev).new_ml_pipeline(desc)
            exe = pipeline.executable
            for step in exe.steps:
                if isinstance(step.run, choices.Chooser):
                    step.run.remeasure = True
                for launch in launches(step.run):
                    launch.variants = True
            exe.run({function.input_tensor(n): torch.zeros(t.shape, dtype=t.dtype.torch, device=dev.torch_device)
                     for n, t in pipeline.input_types.items()})
            torch.cuda.synchronize(dev.torch_device)
            entries = collect(tmp)
    except PipelineError as e:
        raise PackageError(f"{where}: {e}") from None
    # every kernel a step may launch, one file each (a step's source joins those of its chained kernels)
    sources = {k.file: k.source.encode() for step in exe.steps for k in launches(step.run)}
    target = current_target(dev.torch_device)
    built_with = {"stitchml": __version__, "torch": torch.__version__, "triton": triton.__version__,
                  "device": torch.cuda.get_device_name(dev.torch_device)}
    return pipeline.input_dimensions, target, pack(Bundle(target, built_with, sources, entries, variants_of(exe)))


# -- which binaries a bundle serves ---------------------------------------------------------------------
def variants_of(executable) -> dict[str, list[list[str]]]:
    """What `build` compiles for `executable`: per kernel source, the specialisation of every launch's size
    arguments and of their other classes (runtime/launch.py `variant_sizes`), with its own blocks and those
    it launches with at other batch sizes (`KernelLaunch.binaries`)."""
    out: dict[str, set[tuple[str, ...]]] = {}
    for step in executable.steps:
        for launch in launches(step.run):
            out.setdefault(launch.file, set()).update(tuple(b) for b in launch.binaries())
    return {name: [list(c) for c in sorted(binaries)] for name, binaries in sorted(out.items())}


def unserved(bundle: Bundle, executable) -> list[str] | None:
    """The kernel launches of `executable` whose binary the bundle does not carry, as "source (binary)": another
    source, other blocks, or sizes of a specialisation not compiled. None when the bundle does not list its
    variants (built before they were recorded)."""
    if not bundle.variants:
        return None
    missing = []
    for step in executable.steps:
        for launch in launches(step.run):
            binary = launch.binary()
            if binary not in bundle.variants.get(launch.file, []):
                missing.append(f"{launch.file} ({', '.join(binary)})")
    return missing
