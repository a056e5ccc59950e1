"""Graph's builder methods are written out (stitchml/graph_methods.py) and agree with the registry."""
from __future__ import annotations

import importlib.util
import inspect
import pydoc
from pathlib import Path

import stitchml as sm
from stitchml.graph_methods import GraphMethods
from stitchml.registry import BUILDERS

TOOL = Path(__file__).resolve().parent.parent / "tools" / "graph_methods.py"


def _tool():
    spec = importlib.util.spec_from_file_location("graph_methods_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_methods_match_the_registry():
    tool = _tool()
    assert tool.TARGET.read_text() == tool.render(), \
        "stitchml/graph_methods.py disagrees with the registry's builders: run python tools/graph_methods.py"


def test_every_builder_is_a_written_out_method_with_its_signature():
    for name, fn in BUILDERS.items():
        method = vars(GraphMethods).get(name)
        assert method is not None, f"builder {name} is not in GraphMethods"
        assert getattr(sm.Graph, name) is method, name  # inherited, not attached
        want = list(inspect.signature(fn).parameters)[1:]
        got = list(inspect.signature(method).parameters)[1:]
        assert got == want, (name, got, want)
        assert inspect.getdoc(method) == inspect.getdoc(fn), name
    assert set(n for n in vars(GraphMethods) if not n.startswith("_")) == set(BUILDERS)


def test_help_shows_builders():
    text = pydoc.render_doc(sm.Graph, renderer=pydoc.plaintext)
    assert "reduction_sum(self, x, axes=None, keep_dims=False, name=None)" in text
    assert "softmax(self, x, axis=-1)" in text.replace("\n", "")


def test_methods_build_what_the_builders_build():
    g = sm.Graph()
    x = g.placeholder((2, 3), sm.float32, name="x")
    y = g.reduction_sum(g.softmax(x, axis=1), axes=1, name="s")
    assert y.name == "s" and [op.op for op in g.operations][-1] == "reduction_sum"
    assert g.placeholder((2,)).dtype == sm.float32  # a default written as dtypes.float32
