"""What a run means (docs/semantics.md): pruning, variables, control dependencies,
asynchronous runs, feed checks, unranked placeholders, result aliasing, random ops."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.ir import needed_ops
from stitchml.runtime.eager import prune

F32 = sm.float32


def _run(g, feeds=None, targets=(), target_ops=()):
    return g.run(feeds, list(targets), list(target_ops), device="cpu")


def _value(g, t, feeds=None):
    return _run(g, feeds, [t])[t].numpy()


# -- pruning -------------------------------------------------------------------------------------------
def test_only_what_the_targets_need_runs():
    g = sm.Graph()
    x = g.placeholder((2,), F32, name="x")
    unused = g.placeholder((3,), F32, name="unused")
    broken = g.gather(g.constant(np.ones(3, np.float32)), g.constant(np.array([7])))  # fails if it ever runs
    y = g.exponent(x)
    g.addition(broken, unused)
    np.testing.assert_allclose(_value(g, y, {x: np.zeros(2, np.float32)}), [1.0, 1.0])
    assert {op.op for op in prune(g, [y], [])} == {"placeholder", "exponent"}
    with pytest.raises(sm.ExecutionError, match=r"gather \(gather_\d+, built at .*test_graph.py:\d+\)"):
        _value(g, broken)


def test_the_walk_follows_inputs_and_control_dependencies_in_program_order():
    g = sm.Graph()
    v = g.variable(np.zeros(2, np.float32))
    x = g.placeholder((2,), F32, name="x")
    step = g.assign_variable(v, v + 1.0)
    noise = g.negative(x)
    with g.control_dependencies([step]):
        y = g.identity(x) * 2.0
    ops = g.operations
    walk = needed_ops(ops, [y.op])
    assert walk == [op for op in ops if op is not noise.op]  # program order, everything but the negation
    data_only = needed_ops(ops, [y.op], control_deps=False)
    assert [op.op for op in data_only] == ["placeholder", "identity", "constant", "multiplication"]
    later = ops[ops.index(step):]  # the ops from the assignment on: the walk looks no further back
    assert [op.op for op in needed_ops(later, [y.op])] == ["assign_variable", "identity", "constant", "multiplication"]
    assert prune(g, [y], []) == walk


def test_control_dependencies_are_run_and_pruned_through():
    g = sm.Graph()
    v = g.variable(np.zeros(2, np.float32))
    step = g.assign_variable(v, v + 1.0)
    x = g.placeholder((2,), F32)
    with g.control_dependencies([step]):
        y = g.identity(x)
    assert step in prune(g, [y], [])
    _run(g, {x: np.ones(2, np.float32)}, [y])
    np.testing.assert_allclose(g.variable_value(v).numpy(), [1.0, 1.0])
    with pytest.raises(sm.GraphError, match="control_dependencies: expected operations or tensors of this graph"):
        with g.control_dependencies([sm.Graph().placeholder((1,))]):
            pass


# -- variables -------------------------------------------------------------------------------------------
def test_variables_persist_and_reads_see_the_start_of_the_run():
    g = sm.Graph()
    v = g.variable(np.array([1.0, 2.0], np.float32))
    doubled = v * 2.0
    step = g.assign_variable(v, doubled)
    read = g.read_variable(v)
    out = _run(g, targets=[v, read, doubled], target_ops=[step])
    np.testing.assert_allclose(out[v].numpy(), [1.0, 2.0])  # the start-of-run value, not the assigned one
    np.testing.assert_allclose(out[read].numpy(), [1.0, 2.0])
    np.testing.assert_allclose(g.variable_value(v).numpy(), [2.0, 4.0])
    _run(g, target_ops=[step])
    np.testing.assert_allclose(_value(g, read), [4.0, 8.0])


def test_assignments_apply_in_program_order_at_the_end():
    g = sm.Graph()
    v = g.variable(np.zeros(1, np.float32))
    first = g.assign_variable(v, g.constant(np.array([1.0], np.float32)))
    second = g.assign_variable(v, v + 10.0)  # reads the start-of-run value 0
    _run(g, target_ops=[second, first])
    np.testing.assert_allclose(g.variable_value(v).numpy(), [10.0])  # built last wins, whatever the target order
    _run(g, target_ops=[first])
    np.testing.assert_allclose(g.variable_value(v).numpy(), [1.0])


def test_reads_ordered_after_an_assignment_see_it():
    g = sm.Graph()
    v = g.variable(np.array([3.0], np.float32))
    step = g.assign_variable(v, v * 2.0)
    with g.control_dependencies([step]):
        after = g.read_variable(v)
        step2 = g.assign_variable(v, after + 1.0)
    with g.control_dependencies([step2]):
        last = g.read_variable(v)
    before = g.read_variable(v)
    out = _run(g, targets=[before, after, last])
    assert (out[before].item(), out[after].item(), out[last].item()) == (3.0, 6.0, 7.0)
    np.testing.assert_allclose(g.variable_value(v).numpy(), [7.0])


def test_variable_value_and_set_variable_value():
    g = sm.Graph()
    v = g.variable(np.zeros((2, 2), np.float32))
    g.set_variable_value(v, np.eye(2, dtype=np.float32))
    np.testing.assert_allclose(_value(g, v * 1.0), np.eye(2))
    with pytest.raises(sm.GraphError, match=r"is float32\[2,2\], got \(3,\)"):
        g.set_variable_value(v, np.zeros(3, np.float32))
    with pytest.raises(sm.GraphError, match="expected a variable of this graph"):
        g.variable_value(g.placeholder((1,)))


# -- results never alias state -----------------------------------------------------------------------------
def test_results_never_share_memory_with_constants_or_variables():
    g = sm.Graph()
    c = g.constant(np.arange(4, dtype=np.float32))
    v = g.variable(np.ones((2, 2), np.float32))
    targets = [c, g.identity(c), g.reshape(c, (2, 2)), v, g.read_variable(v), g.transpose(v), c[1:]]
    for _ in range(2):
        out = _run(g, targets=targets)
        for t in targets:
            out[t].torch().fill_(-7.0)
    np.testing.assert_allclose(_value(g, c), np.arange(4))
    np.testing.assert_allclose(g.variable_value(v).numpy(), np.ones((2, 2)))


# -- feeds -------------------------------------------------------------------------------------------------
@pytest.fixture
def fed_graph():
    g = sm.Graph()
    x = g.placeholder((-1, 3), F32, name="x")
    v = g.variable(np.zeros(1, np.float32))
    step = g.assign_variable(v, v + 1.0)
    return g, x, g.reduction_sum(x), step, v


@pytest.mark.parametrize("feed, message", [
    (np.ones((2, 3), np.float64), "feed for placeholder x: expected dtype float32, got float64"),
    (np.ones(3, np.float32), r"expected shape float32[?,3], got (3,) (rank 1)"),
    (np.ones((2, 4), np.float32), r"expected shape float32[?,3], got (2, 4)"),
    ("text", "feed for placeholder x: cannot make TensorData from str"),
])
def test_feed_errors_come_before_any_work(fed_graph, feed, message):
    g, x, y, step, v = fed_graph
    with pytest.raises(sm.FeedError) as info:
        _run(g, {x: feed}, [y], [step])
    assert message in str(info.value)
    assert g.run_count == 0 and g.variable_value(v).numpy()[0] == 0.0


def test_missing_feeds_and_keys_that_are_not_placeholders(fed_graph):
    g, x, y, step, v = fed_graph
    with pytest.raises(sm.FeedError, match="the targets need placeholders with no feed: x"):
        _run(g, {}, [y], [step])
    with pytest.raises(sm.FeedError, match="is the output of reduction_sum; only placeholders can be fed"):
        _run(g, {x: np.ones((1, 3), np.float32), y: np.float32(1)}, [y])
    with pytest.raises(sm.FeedError, match="feed keys must be placeholders of this graph"):
        _run(g, {sm.Graph().placeholder((1, 3)): np.ones((1, 3), np.float32)}, [step.inputs[0]])
    with pytest.raises(sm.FeedError, match="feed keys must be placeholders of this graph"):
        _run(g, {"x": np.ones((1, 3), np.float32)}, [y])
    assert g.run_count == 0 and g.variable_value(v).numpy()[0] == 0.0


def test_target_errors():
    g = sm.Graph()
    x = g.placeholder((1,))
    with pytest.raises(sm.GraphError, match="targets must be Tensors of the graph, got str"):
        _run(g, {x: np.ones(1, np.float32)}, ["x"])
    with pytest.raises(sm.GraphError, match="belongs to another graph"):
        _run(g, {}, [sm.Graph().placeholder((1,))])
    with pytest.raises(sm.GraphError, match="target_ops must be Operations"):
        _run(g, {x: np.ones(1, np.float32)}, [], [x])


def test_unranked_placeholders_take_any_rank():
    g = sm.Graph()
    x = g.placeholder(None, F32, name="x")
    y = g.reduction_sum(x * 2.0, axes=None)
    assert x.shape is None and (x * 2.0).shape is None and y.shape == ()  # every axis reduced: a scalar
    for shape in [(), (3,), (2, 3, 4)]:
        a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(_value(g, y, {x: a}), 2 * a.sum(), rtol=1e-5)


def test_unknown_extents_that_do_not_fit_fail_naming_the_op():
    g = sm.Graph()
    a, b = g.placeholder((-1,), F32), g.placeholder((-1,), F32)
    c = g.addition(a, b, name="sum")
    with pytest.raises(sm.ExecutionError, match=r"addition \(sum, built at .*test_graph.py:\d+\)"):
        _run(g, {a: np.ones(2, np.float32), b: np.ones(3, np.float32)}, [c])


# -- asynchronous runs -----------------------------------------------------------------------------------
def test_run_async_wait_result_and_order():
    g = sm.Graph()
    v = g.variable(np.zeros(1, np.float32))
    step = g.assign_variable(v, v + 1.0)
    handles = [g.run_async(target_ops=[step], device="cpu") for _ in range(5)]
    read = g.read_variable(v)
    last = g.run_async(targets=[read], device="cpu")
    assert last.wait(timeout=30) and last.done()
    assert all(h.done() for h in handles)
    assert last.result()[read].item() == 5.0


def test_run_async_on_complete_gets_results_or_the_error():
    g = sm.Graph()
    x = g.placeholder((2,), F32)
    y = x + 1.0
    seen, done = [], threading.Event()

    def on_complete(results, error):
        seen.append((results, error))
        if len(seen) == 2:
            done.set()

    ok = g.run_async({x: np.zeros(2, np.float32)}, [y], device="cpu", on_complete=on_complete)
    bad = g.run_async({x: np.zeros(3, np.float32)}, [y], device="cpu", on_complete=on_complete)
    assert done.wait(30)
    (results, error), (no_results, feed_error) = seen
    assert error is None and results[y].numpy().tolist() == [1.0, 1.0]
    assert no_results is None and isinstance(feed_error, sm.FeedError)
    assert ok.result()[y].numpy().tolist() == [1.0, 1.0]
    with pytest.raises(sm.FeedError):
        bad.result()
    assert isinstance(bad.exception(), sm.FeedError)


# -- random operations ----------------------------------------------------------------------------------------
def _draws(seed, runs, shape=(4,)):
    g = sm.Graph()
    r = g.random_normal(shape, seed=seed)
    return [_value(g, r) for _ in range(runs)]


def test_random_ops_are_reproducible_per_seed_and_run():
    first, again = _draws(3, 3), _draws(3, 3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)  # run k of a fresh graph replays run k
    assert not np.array_equal(first[0], first[1])  # runs differ
    assert not np.array_equal(first[0], _draws(4, 1)[0])  # seeds differ


def test_an_unseeded_random_op_stores_its_seed(tmp_path):
    g = sm.Graph()
    r = g.random_uniform((3,))
    assert isinstance(r.op.attrs["seed"], int)
    g.save(tmp_path / "g.json")
    loaded = sm.Graph.load(tmp_path / "g.json")
    np.testing.assert_array_equal(_value(loaded, loaded.tensor(r.name)), _value(g, r))


def test_dropout_statistics():
    g = sm.Graph()
    x = g.placeholder((200, 100), F32)
    y = g.dropout(x, 0.3, seed=1)
    ones = np.ones((200, 100), np.float32)
    masks = []
    for _ in range(3):
        out = _value(g, y, {x: ones})
        assert set(np.unique(out)).issubset({0.0, np.float32(1 / 0.7)})
        dropped = (out == 0).mean()
        assert abs(dropped - 0.3) < 0.015  # 20000 draws: about 5 standard deviations
        assert abs(out.mean() - 1.0) < 0.03  # the scaling keeps the expectation
        masks.append(out == 0)
    assert not np.array_equal(masks[0], masks[1])
    assert np.array_equal(_value(g, g.dropout(x, 0.0), {x: ones}), ones)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the default device is CUDA where there is one")
def test_the_default_device_is_the_cpu_without_cuda():
    g = sm.Graph()
    x = g.placeholder((2,), F32)
    out = g.run({x: np.ones(2, np.float32)}, [x + 1.0])
    assert all(v.device == "cpu" for v in out.values())
