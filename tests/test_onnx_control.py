"""ONNX control flow: Scan over a known extent unrolled; If and Loop unrolled when the importer knows what steers them, the graph's if_then_else and while_loop otherwise."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

import stitchml as sm
from stitchml.errors import PackageError


def _vi(name, shape, dtype=T.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, opset=17):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _scan_model(reverse=0):
    # state += row; scan output: state * 2, per row of x (3, 2)
    body = helper.make_graph([helper.make_node("Add", ["s_in", "row"], ["s_out"]),
                              helper.make_node("Add", ["s_out", "s_out"], ["twice"])], "body",
                             [_vi("s_in", [2]), _vi("row", [2])], [_vi("s_out", [2]), _vi("twice", [2])])
    scan = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[reverse])
    return _model([scan], [_vi("s0", [2]), _vi("x", [3, 2])], [_vi("s", [2]), _vi("ys", [3, 2])])


@pytest.mark.parametrize("reverse", [0, 1])
def test_scan_is_a_running_sum(reverse):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    s0 = np.array([1.0, -1.0], np.float32)
    out = sm.package.from_onnx(_scan_model(reverse)).function()(s0=s0, x=x)
    rows = x[::-1] if reverse else x
    running = s0 + np.cumsum(rows, axis=0)
    np.testing.assert_allclose(out["s"].numpy(), running[-1])
    np.testing.assert_allclose(out["ys"].numpy(), 2 * running)


def test_if_on_an_input_condition_selects_at_run_time():
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["a"])], "then", [], [_vi("a", [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["b"])], "else", [], [_vi("b", [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                   [_vi("c", [], T.BOOL), _vi("x", [2])], [_vi("y", [2])])
    fn = sm.package.from_onnx(model).function()
    x = np.array([-1.5, 2.0], np.float32)
    np.testing.assert_array_equal(fn(c=np.array(True), x=x)["y"].numpy(), -x)
    np.testing.assert_array_equal(fn(c=np.array(False), x=x)["y"].numpy(), np.abs(x))


def _loop_model():
    # v = v * 2, M times; the scan output collects each v.
    body = helper.make_graph([helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
                              helper.make_node("Identity", ["v_out"], ["each"])], "body",
                             [_vi("i", [], T.INT64), _vi("cond_in", [], T.BOOL), _vi("v_in", [2])],
                             [_vi("cond_out", [], T.BOOL), _vi("v_out", [2]), _vi("each", [2])])
    loop = helper.make_node("Loop", ["m", "", "v0"], ["v", "all"], body=body)
    return _model([loop], [_vi("m", [], T.INT64), _vi("v0", [2])], [_vi("v", [2]), _vi("all", ["n", 2])])


def test_loop_with_an_input_trip_count_unrolls_per_value():
    fn = sm.package.from_onnx(_loop_model()).function()
    v0 = np.array([1.0, -3.0], np.float32)
    out = fn(m=np.array(3, np.int64), v0=v0)
    np.testing.assert_array_equal(out["v"].numpy(), v0 * 8)
    np.testing.assert_array_equal(out["all"].numpy(), np.stack([v0 * 2, v0 * 4, v0 * 8]))


def test_loop_past_the_unrolling_limit_is_refused():
    fn = sm.package.from_onnx(_loop_model(), limits=sm.package.Limits(max_unrolled_steps=10)).function()
    with pytest.raises(PackageError, match="max_unrolled_steps"):
        fn(m=np.array(1 << 40, np.int64), v0=np.zeros(2, np.float32))


def _reference(model, **feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(model).run(None, feeds)


def test_if_on_a_computed_condition_is_one_graph_for_both_outcomes():
    """`ReduceSum(x) > 0` is known only when the model runs: the If becomes if_then_else, whose branches
    read outer values, and one compiled function serves both outcomes (against ONNX's reference)."""
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["a"])], "then", [], [_vi("a", [3])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["b0"]), helper.make_node("Mul", ["b0", "x"], ["b"])],
                              "else", [], [_vi("b", [3])])
    zero = helper.make_tensor("zero", T.FLOAT, [], [0.0])
    model = _model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                    helper.make_node("Greater", ["s", "zero"], ["c"]),
                    helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                   [_vi("x", [3])], [_vi("y", [3])])
    model.graph.initializer.append(zero)
    fn = sm.package.from_onnx(model).function()
    assert "if_then_else" in {o.op for o in fn.graph.operations}
    for x in (np.array([1.0, -0.5, 2.0], np.float32), np.array([-1.0, 0.5, -2.0], np.float32)):
        np.testing.assert_allclose(fn(x=x)["y"].numpy(), _reference(model, x=x)[0], rtol=1e-6)


def _while_model():
    # while v.sum() < limit and i < m: v = v * 3 (carried); the condition is computed in the body
    body = helper.make_graph([helper.make_node("Mul", ["v_in", "three"], ["v_out"]),
                              helper.make_node("ReduceSum", ["v_out"], ["t"], keepdims=0),
                              helper.make_node("Less", ["t", "limit"], ["cond_out"])], "body",
                             [_vi("i", [], T.INT64), _vi("cond_in", [], T.BOOL), _vi("v_in", [2])],
                             [_vi("cond_out", [], T.BOOL), _vi("v_out", [2])])
    model = _model([helper.make_node("Loop", ["m", "go", "v0"], ["v"], body=body)],
                   [_vi("m", [], T.INT64), _vi("go", [], T.BOOL), _vi("v0", [2]), _vi("limit", [])], [_vi("v", [2])])
    model.graph.initializer.append(helper.make_tensor("three", T.FLOAT, [], [3.0]))
    return model


def test_loop_steered_at_run_time_is_a_while_loop():
    """Trip count, first condition and the body's condition all come from inputs or data: the Loop is one
    while_loop (the body imported once, not unrolled), equal to ONNX's reference for every case."""
    model = _while_model()
    fn = sm.package.from_onnx(model).function()
    assert "while_loop" in {o.op for o in fn.graph.operations}
    v0 = np.array([1.0, 2.0], np.float32)
    for m, go, limit in ((10, True, 100.0), (2, True, 1e6), (10, False, 100.0), (0, True, 100.0), (10, True, 1.0)):
        feeds = dict(m=np.array(m, np.int64), go=np.array(go), v0=v0, limit=np.array(limit, np.float32))
        np.testing.assert_allclose(fn(**feeds)["v"].numpy(), _reference(model, **feeds)[0], rtol=1e-6)
