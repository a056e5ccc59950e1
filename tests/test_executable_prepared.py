"""The prepared run of an executable (runtime/executable.py's `_Prepared`) and Graph.run's lookup of it:
feeds are checked against the compiled signature and bad ones raise the typed errors of the general path,
results are fresh or the caller's buffers, and every value equals a float64 reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.errors import ExecutionError, FeedError
from tolerance import assert_within, sensitivity


def _gelu_graph():
    g = sm.Graph("prepared")
    x = g.placeholder((-1,), sm.float32, name="x")
    return g, x, 0.5 * x * (1.0 + g.erf(x * (1.0 / math.sqrt(2.0))))


def _check(got, a: torch.Tensor, what: str) -> None:
    """`got` (TensorData or torch) is GeLU of the float32 feed `a`, by the suite's rule against float64."""
    x = a.double()
    gelu = torch.nn.functional.gelu
    got = got.torch() if isinstance(got, sm.TensorData) else torch.as_tensor(got)
    assert_within(got, gelu(x), "graph", what, sensitivity(gelu, [x])[0])


@pytest.fixture(scope="module")
def compiled():
    g, x, y = _gelu_graph()
    exe = g.compile({x: sm.TensorType((64,), sm.float32)}, [y], device="cpu")
    exe.run({x: torch.randn(64)})  # the first run prepares the next ones
    assert exe._prepared is not None
    return g, x, y, exe


def test_prepared_runs_return_fresh_results_equal_to_the_reference(compiled):
    g, x, y, exe = compiled
    a, b = torch.randn(64), torch.randn(64)
    runs, count = exe.runs, g.run_count
    ra, rb = exe.run({x: a})[y], exe.run({x: sm.TensorData(b)})[y]  # a torch tensor, then a TensorData
    _check(ra, a, "ra")
    _check(rb, b, "rb")
    ptrs = {ra.torch().data_ptr(), rb.torch().data_ptr(), a.data_ptr(), b.data_ptr()}
    assert len(ptrs) == 4  # each result is memory of its own, not a feed's or the other run's
    assert ra.torch().is_contiguous() and ra.shape == (64,) and ra.dtype == sm.float32
    assert (exe.runs, g.run_count) == (runs + 2, count + 2)


def test_a_caller_buffer_is_written_in_place_and_a_strided_one_receives_a_copy(compiled):
    _, x, y, exe = compiled
    a = torch.randn(64)
    out = torch.full((64,), float("nan"))
    got = exe.run({x: a}, outputs={y: out})[y]
    assert got.torch().data_ptr() == out.data_ptr()
    _check(out, a, "out")
    wide = torch.full((64, 2), float("nan"))
    strided = wide[:, 0]
    exe.run({x: a}, outputs={y: strided})
    _check(strided, a, "strided")
    assert torch.isnan(wide[:, 1]).all()  # only the buffer's own elements were written


@pytest.mark.parametrize("feed, message", [
    (torch.zeros(65), r"compiled for \(64,\) float32, got \(65,\) float32"),
    (torch.zeros(64, dtype=torch.float64), r"compiled for \(64,\) float32, got \(64,\) float64"),
    (torch.zeros(8, 8), r"compiled for \(64,\) float32, got \(8, 8\) float32"),
])
def test_a_feed_off_the_signature_raises_the_feed_error_saying_what_was_expected(compiled, feed, message):
    _, x, _, exe = compiled
    with pytest.raises(FeedError, match="feed for placeholder x: the executable was " + message):
        exe.run({x: feed})


def test_missing_and_foreign_feed_keys_raise_feed_errors(compiled):
    g, x, y, exe = compiled
    with pytest.raises(FeedError, match="needs a feed for placeholder x"):
        exe.run({})
    other = sm.Graph("other").placeholder((64,), sm.float32, name="z")
    with pytest.raises(FeedError, match="needs a feed for placeholder x"):
        exe.run({other: torch.zeros(64)})
    with pytest.raises(FeedError, match="placeholders of the compiled graph"):
        exe.run({x: torch.zeros(64), other: torch.zeros(64)})


def test_feeds_the_prepared_run_does_not_take_are_converted_by_the_general_path(compiled):
    _, x, y, exe = compiled
    base = torch.randn(128)
    strided = base[::2]  # not contiguous
    _check(exe.run({x: strided})[y], strided, "a strided feed")
    arr = np.linspace(-3, 3, 64, dtype=np.float32)
    _check(exe.run({x: arr})[y], torch.from_numpy(arr), "a NumPy feed")


def test_a_failing_step_raises_the_execution_error_naming_its_ops(compiled):
    _, x, _, exe = compiled
    step = exe.steps[0]
    real = step.run

    def broken(env):
        raise RuntimeError("device fault")

    step.run = broken
    try:
        with pytest.raises(ExecutionError, match="device fault") as info:
            exe.run({x: torch.zeros(64)})
    finally:
        step.run = real
    assert "erf" in str(info.value)


def test_runs_with_variables_keep_the_general_path_and_their_semantics():
    g = sm.Graph("counter")
    v = g.variable(np.zeros(4, np.float32), name="v")
    x = g.placeholder((4,), sm.float32, name="x")
    total = v + x
    exe = g.compile({x: sm.TensorType((4,), sm.float32)}, [total], [g.assign_variable(v, total)], device="cpu")
    for k in range(3):
        got = exe.run({x: torch.ones(4)})[total].numpy()
        np.testing.assert_array_equal(got, np.full(4, k + 1.0, np.float32))
    assert exe._prepared is None  # a variable is read and assigned: not a run of its steps alone


def test_graph_run_finds_the_prepared_run_and_checks_every_feed():
    g, x, y = _gelu_graph()
    a8, a5 = torch.randn(8), torch.randn(5)
    for a in (a8, a8, a5, a8, a5, a5):  # alternating shapes: each run is its own shape's executable's
        _check(g.run({x: a}, [y], device="cpu", compiled=True)[y], a, f"g.run of {tuple(a.shape)}")
    assert len(g.compile_log) == 2 and g._executables.fast_hits == 4

    def served():  # the shape of the executable the identity lookup serves this request with
        (entry,) = g._executables._recent.values()
        return entry[1].signature.feeds[0][2]

    assert served() == (5,)
    g.run({x: a8}, [y], device="cpu", compiled=True)  # found by the lookup with shapes, which hands it over
    assert served() == (8,)
    with pytest.raises(FeedError, match=r"placeholder x is float32\[\?\]; cannot compile it for float64\[8\]"):
        g.run({x: a8.double()}, [y], device="cpu", compiled=True)


def test_an_evicted_executable_is_not_kept_by_the_lookup():
    g, x, y = _gelu_graph()
    g.run({x: torch.zeros(3)}, [y], device="cpu", compiled=True)
    g._executables.size = 1
    g.run({x: torch.zeros(4)}, [y], device="cpu", compiled=True)  # evicts the first
    held = {entry[1] for entry in g._executables._recent.values()}
    assert held == set(g._executables.entries.values()) and len(held) == 1
    a = torch.randn(3)
    _check(g.run({x: a}, [y], device="cpu", compiled=True)[y], a, "g.run after an eviction")
    assert "evicted" in g.compile_log[-1]


def test_graph_run_of_an_executable_without_prepared_runs_keeps_the_lookup_with_shapes():
    g = sm.Graph("accumulate")
    v = g.variable(np.zeros(3, np.float32), name="v")
    x = g.placeholder((3,), sm.float32, name="x")
    total = v + x
    assign = g.assign_variable(v, total)
    for k in range(4):
        got = g.run({x: torch.ones(3)}, [total], [assign], device="cpu", compiled=True)[total].numpy()
        np.testing.assert_array_equal(got, np.full(3, k + 1.0, np.float32))  # each run reads the last one's value
    assert not g._executables._recent and g._executables.fast_hits == 3


def test_runs_that_always_pass_caller_buffers_are_prepared_too():
    g, x, y = _gelu_graph()
    exe = g.compile({x: sm.TensorType((32,), sm.float32)}, [y], device="cpu")
    out = torch.empty(32)
    for _ in range(2):
        a = torch.randn(32)
        assert exe.run({x: a}, outputs={y: out})[y].torch().data_ptr() == out.data_ptr()
        _check(out, a, "a caller buffer")
        assert exe._prepared is not None
