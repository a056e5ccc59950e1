"""Imports go one way: down the layer order of docs/architecture.md.

Every module under stitchml/ is parsed with `ast`, imports inside functions
included (those are where cycles hide); an import of a module in a higher
layer fails the test, unless it is listed in ALLOWED with the reason it is
still needed. Imports under `if TYPE_CHECKING:` are for annotations only and
never run, so they are not edges. Within one layer modules may import each
other.
"""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "stitchml"

# Lowest first. A module belongs to the layer of the longest prefix naming it (a prefix names the
# module itself and everything below it); `stitchml` itself, the package facade, only by name.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("stitchml.dtypes", "stitchml.errors", "stitchml.tensor_data", "stitchml.data", "stitchml.version")),
    ("ir", ("stitchml.ir",)),
    ("ops", ("stitchml.registry", "stitchml.ops")),
    ("builder", ("stitchml.graph", "stitchml.graph_methods", "stitchml.composites", "stitchml.serialize")),
    ("transforms", ("stitchml.autodiff", "stitchml.optim", "stitchml.nn", "stitchml.distributed")),
    ("codegen", ("stitchml.codegen",)),
    ("runtime", ("stitchml.runtime",)),
    ("passes", ("stitchml.passes",)),
    ("compile", ("stitchml.runtime.compiled",)),
    ("pipeline", ("stitchml.pipeline",)),
    ("package", ("stitchml.package",)),
    ("shader", ("stitchml.shader",)),
    ("debug", ("stitchml.debug",)),
    ("apps", ("stitchml.demos", "stitchml.cli", "stitchml.__main__", "stitchml")),
]

# (importer, imported) -> why the upward import is still needed. Only an import inside a function can be
# allowed: one at module level would make importing the lower module import the higher one.
ALLOWED: dict[tuple[str, str], str] = {
    ("stitchml.ir", "stitchml.registry"):
        "Operation.primitive looks its registry entry up; the registry is built on the IR's types",
    ("stitchml.ops.fusion", "stitchml.runtime.eager"):
        "a stitched kernel's reference implementation interprets its body op by op",
    ("stitchml.ops.control", "stitchml.runtime.eager"):
        "a control-flow op's reference implementation interprets its blocks op by op",
    ("stitchml.graph", "stitchml.autodiff"): "Graph.gradients calls reverse mode",
    ("stitchml.graph", "stitchml.runtime.compiled"):
        "Graph.compile, Graph.run and Graph.run_async call the runtime's entry (compiled.py)",
}


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at `root`, by dotted name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import of our package in the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                for rest in child.orelse:
                    visit(rest, lazy)
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(base + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                for a in child.names:  # `from . import x` imports the module x when there is one
                    found.append((f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, child.lineno, lazy))
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return sorted({e for e in found if e[0] == top or e[0].startswith(top + ".")}, key=lambda e: e[1])


def layer_of(name: str) -> int:
    """The index in LAYERS of the module's layer."""
    best, index = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or (p != ROOT.name and name.startswith(p + "."))) and len(p) > best:
                best, index = len(p), i
    assert index >= 0, f"{name} is in no layer: add it to LAYERS in tests/test_layering.py and docs/architecture.md"
    return index


def upward_edges(root: Path, allowed: dict[tuple[str, str], str]) -> tuple[list[str], set[tuple[str, str]]]:
    """The imports going up the layer order that `allowed` does not list, and the allowed pairs seen."""
    known = modules(root)
    bad, seen = [], set()
    for name, path in known.items():
        for target, line, lazy in imports(name, path, known):
            if layer_of(target) <= layer_of(name):
                continue
            if lazy and (name, target) in allowed:
                seen.add((name, target))
                continue
            bad.append(f"{path.relative_to(root.parent)}:{line}: {name} ({LAYERS[layer_of(name)][0]}) imports "
                       f"{target} ({LAYERS[layer_of(target)][0]})")
    return bad, seen


def test_imports_go_down_the_layers():
    bad, seen = upward_edges(ROOT, ALLOWED)
    assert not bad, "imports going up the layer order (docs/architecture.md):\n" + "\n".join(bad)
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"ALLOWED lists imports that are gone (remove them): {stale}"


def test_every_module_has_a_layer():
    for name in modules(ROOT):
        layer_of(name)


def test_a_planted_upward_import_fails(tmp_path):
    tree = tmp_path / "stitchml"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    ir = tree / "ir.py"
    ir.write_text(ir.read_text() + "\n\ndef _planted():\n    from .passes import run_pipeline\n    return run_pipeline\n")
    (tree / "errors.py").write_text((tree / "errors.py").read_text() + "\nimport stitchml.debug.capture\n")
    graph = tree / "graph.py"  # an allowed pair, but at module level
    graph.write_text(graph.read_text() + "\nfrom .autodiff import gradients  # noqa: E402\n")
    bad, _ = upward_edges(tree, ALLOWED)
    assert len(bad) == 3, bad
    assert any("stitchml.graph (builder) imports stitchml.autodiff (transforms)" in b for b in bad), bad
    assert any("stitchml.ir (ir) imports stitchml.passes (passes)" in b for b in bad), bad
    assert any("stitchml.errors (base) imports stitchml.debug.capture (debug)" in b for b in bad), bad


def test_executable_users_read_no_private_fields():
    """Bound runs and the debugger use the Executable's public interface (slot layout, run_steps,
    fusion_entries): an attribute `exe._x` / `self.exe._x` read there fails."""
    bad = []
    for path in [ROOT / "runtime" / "bound.py", *sorted((ROOT / "debug").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("exe", "executable"):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {name}.{node.attr}")
    assert not bad, "private Executable fields read outside the executable:\n" + "\n".join(bad)


def cycles(root: Path, allowed: dict[tuple[str, str], str]) -> list[list[str]]:
    """Groups of modules that import each other (strongly connected, imports inside functions included),
    leaving out the allowed upward imports: those are the known ways back up."""
    known = modules(root)
    edges = {name: sorted({t for t, _, _ in imports(name, path, known) if t in known and t != name
                           and (name, t) not in allowed}) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for name in known:
        if name not in index:
            visit(name)
    return found


def test_no_import_cycles():
    """Within a layer imports may go either way, but no two modules may import each other, directly or
    through others (the package facade `stitchml` re-exports, and is imported by no module of ours)."""
    found = cycles(ROOT, ALLOWED)
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_planted_cycle_fails(tmp_path):
    tree = tmp_path / "stitchml"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    serialize = tree / "serialize.py"
    serialize.write_text(serialize.read_text() + "\n\ndef _planted():\n    from .graph import Graph\n    return Graph\n")
    assert cycles(tree, ALLOWED) == [["stitchml.graph", "stitchml.serialize"]]
