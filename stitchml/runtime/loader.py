"""Generated kernels on disk: write once, import by content hash.

Triton compiles a kernel from its source file (it reads the source back with
`inspect`), so every generated kernel is written to
``$STITCHML_CACHE_DIR/kernels/<sha256>.py`` (default ``~/.cache/stitchml``)
and imported from there. Triton's own cache then keeps the compiled binary,
keyed by source, GPU architecture and Triton version, so a second process
with the same graph writes nothing and compiles nothing.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading

_lock = threading.Lock()
_loaded: dict[str, object] = {}
# Triton's interpreter is not thread-safe: a launch swaps module-level state of triton.language for
# its own (builder, patched functions) and restores it on return, so two launches at once corrupt each
# other (InterpreterError). Every interpreted launch in the process holds this lock; GPU launches do not.
interpreter_lock = threading.Lock()
stats = {"written": 0, "reused_files": 0, "imported": 0}


def cache_dir() -> str:
    root = os.environ.get("STITCHML_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "stitchml")
    path = os.path.join(root, "kernels")
    os.makedirs(path, exist_ok=True)
    return path


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def file_name(source: str) -> str:
    """The name of the file that holds `source`: ``k`` and the first 32 hex digits of its SHA-256."""
    return f"k{hashlib.sha256(source.encode()).hexdigest()[:32]}.py"


def forget() -> None:
    """Import every kernel anew from now on.

    Triton keeps what it compiled on the JIT function objects, so a fresh
    import is what makes it compile again (package.kernels collects what a
    compile writes into Triton's cache).
    """
    with _lock:
        _loaded.clear()


def load(name: str, source: str):
    """The `@triton.jit` function `name` defined by `source`."""
    fname = file_name(source)
    key = f"{fname[1:-3]}_{'interp' if interpreting() else 'jit'}"
    with _lock:
        module = _loaded.get(key)
        if module is None:
            path = os.path.join(cache_dir(), fname)
            if os.path.exists(path):
                stats["reused_files"] += 1
            else:
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".py")
                with os.fdopen(fd, "w") as f:
                    f.write(source)
                os.replace(tmp, path)  # atomic: concurrent processes never see half a file
                stats["written"] += 1
            spec = importlib.util.spec_from_file_location(f"stitchml_kernel_{key}", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            stats["imported"] += 1
            _loaded[key] = module
    return getattr(module, name)
