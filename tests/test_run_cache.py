"""Graph.run's cache of executables: a request seen before finds its executable from identities,
shapes and dtypes alone, without changing what runs or which errors are raised."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.errors import FeedError, GraphError


def _graph():
    g = sm.Graph("cache")
    x = g.placeholder((-1,), sm.float32, name="x")
    return g, x, g.exponent(x) * 2.0


def test_a_repeated_request_reuses_its_executable_and_stays_correct():
    g, x, y = _graph()
    for n in (8, 8, 5, 8, 5):
        a = torch.randn(n)
        out = g.run({x: a}, [y], device="cpu", compiled=True)[y].numpy()
        np.testing.assert_allclose(out, np.exp(a.double().numpy()) * 2.0, rtol=1e-6)
    assert len(g.compile_log) == 2, g.compile_log  # one compile per shape
    assert g._executables.fast_hits == 3  # every request after the first of its shape
    single = g.run({x: torch.ones(8)}, y, device="cpu", compiled=True)[y].numpy()  # a bare target too
    np.testing.assert_allclose(single, np.full(8, 2 * np.e), rtol=1e-6)
    assert len(g.compile_log) == 2 and g._executables.fast_hits == 4  # a bare target is the same request


def test_errors_are_the_same_after_a_cached_run():
    g, x, y = _graph()
    g.run({x: torch.zeros(4)}, [y], device="cpu", compiled=True)
    with pytest.raises(FeedError, match="x"):
        g.run({x: torch.zeros(4, dtype=torch.float64)}, [y], device="cpu", compiled=True)
    other, ox, oy = _graph()
    with pytest.raises(GraphError, match="another graph"):
        g.run({x: torch.zeros(4)}, [oy], device="cpu", compiled=True)


def test_compiled_none_on_the_cpu_still_runs_op_by_op(monkeypatch):
    """Under Triton's interpreter the CPU's default is op by op: a request compiled before with compiled=True
    is not served compiled when compiled=None asks for the default. (With the native backend a signature
    that has an executable is warm, and runs compiled: test_cpu_backend.py.)"""
    from stitchml.runtime import compiled

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    g, x, y = _graph()
    g.run({x: torch.zeros(4)}, [y], device="cpu", compiled=True)
    calls = []
    real = compiled.run_eager
    monkeypatch.setattr(compiled, "run_eager", lambda *a: calls.append(1) or real(*a))
    out = g.run({x: torch.zeros(4)}, [y], device="cpu")[y].numpy()
    np.testing.assert_allclose(out, np.full(4, 2.0))
    assert calls == [1]


def test_evicted_executables_are_compiled_again(monkeypatch):
    from stitchml.runtime import compiled

    monkeypatch.setattr(compiled, "CACHE_SIZE", 1)
    g, x, y = _graph()
    g._executables = compiled.ExecutableCache(1)
    for n in (3, 4, 3):
        a = torch.randn(n)
        np.testing.assert_allclose(g.run({x: a}, [y], device="cpu", compiled=True)[y].numpy(),
                                   np.exp(a.double().numpy()) * 2.0, rtol=1e-6)
    compiles = [line for line in g.compile_log if line.startswith("compiled")]
    assert len(compiles) == 3 and "evicted" in compiles[2], g.compile_log


def test_the_cache_does_not_keep_fed_values_alive():
    g, x, y = _graph()
    a = torch.randn(16)
    g.run({x: a}, [y], device="cpu", compiled=True)
    gone = weakref.ref(a)
    del a
    gc.collect()
    assert gone() is None


def test_the_fast_lookup_uses_the_cache_entry_not_the_executables_own_signature():
    """An executable's signature can name its device more exactly than the request did ("cuda:0" for
    None or "cuda"): the fast lookup must still find it."""
    import dataclasses

    from stitchml.runtime import compiled

    g, x, y = _graph()
    g._executables = compiled.ExecutableCache()
    exe = g._executables.get(g, {x: torch.zeros(4)}, [y], [], torch.device("cpu"))
    exe.signature = dataclasses.replace(exe.signature, device="cpu:0")
    g._executables.remember(exe, {x: torch.zeros(4)}, [y], (), "cpu", True)
    assert g._executables.fast({x: torch.ones(4)}, [y], (), "cpu", True) is exe
