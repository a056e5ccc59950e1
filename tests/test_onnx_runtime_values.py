"""ONNX models that compute an import-time operand (a shape, axes, bounds) from their inputs: the function
is specialised at run time per value (and per input extents where Shape arithmetic needs them)."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

import stitchml as sm
from stitchml.errors import FeedError, PackageError
from stitchml.package.specialise import SpecializedFunction


def _vi(name, shape, dtype=T.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_reshape_to_a_shape_input_specialises_per_value_and_logs_why():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [_vi("x", [2, 3]), _vi("s", [2], T.INT64)], [_vi("y", ["p", "q"])])
    fn = sm.package.from_onnx(model).function()
    assert isinstance(fn, SpecializedFunction) and fn.value_inputs == ("s",)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert [p.name for p in fn.inputs] == ["x", "s"]
    for shape in ([3, 2], [6, 1], [3, 2]):
        y = fn(x=x, s=np.array(shape, np.int64))["y"].numpy()
        np.testing.assert_array_equal(y, x.reshape(shape))
    assert len(fn.specialise_log) == 2  # the third call reuses the first specialisation
    assert "first run" in fn.specialise_log[0]
    assert "s: [3, 2] -> [6, 1]" in fn.specialise_log[1]
    # One specialisation is a plain function of a static graph, which a package can save.
    one = fn.specialise(x=x, s=np.array([3, 2], np.int64))
    assert [p.name for p in one.inputs] == ["x"] and one.graph.operations
    with pytest.raises(PackageError, match="values of input s"):
        fn.graph


def test_values_computed_from_inputs_fold_per_value():
    # Range(0, n * 2, 1) then a reduction over axes that are an input plus one: both depend on values.
    nodes = [helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", T.INT64, [], [2])),
             helper.make_node("Mul", ["n", "two"], ["lim"]),
             helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", T.INT64, [], [0])),
             helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", T.INT64, [], [1])),
             helper.make_node("Range", ["zero", "lim", "one"], ["r"]),
             helper.make_node("Add", ["a", "one"], ["axes"]),
             helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0)]
    model = _model(nodes, [_vi("n", [], T.INT64), _vi("a", [1], T.INT64), _vi("x", [2, 3, 4])],
                   [_vi("r", ["k"], T.INT64), _vi("s", ["i", "j"])], opset=18)
    fn = sm.package.from_onnx(model).function()
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    out = fn(n=np.array(3, np.int64), a=np.array([0], np.int64), x=x)
    np.testing.assert_array_equal(out["r"].numpy(), np.arange(6))
    np.testing.assert_allclose(out["s"].numpy(), x.sum(axis=1), rtol=1e-6)
    out = fn(n=np.array(1, np.int64), a=np.array([1], np.int64), x=x)
    np.testing.assert_array_equal(out["r"].numpy(), np.arange(2))
    np.testing.assert_allclose(out["s"].numpy(), x.sum(axis=2), rtol=1e-6)
    assert set(fn.value_inputs) == {"n", "a"}


def test_shape_arithmetic_the_importer_cannot_follow_folds_per_input_extents():
    # Shape -> Cast to float -> Mul 0.5 -> Cast back -> Concat -> Reshape: not a plain copy of extents.
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=T.FLOAT),
             helper.make_node("Constant", [], ["h"], value=helper.make_tensor("h", T.FLOAT, [2], [0.5, 2.0])),
             helper.make_node("Mul", ["sf", "h"], ["m"]),
             helper.make_node("Cast", ["m"], ["shape"], to=T.INT64),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    model = _model(nodes, [_vi("x", ["b", 4])], [_vi("y", ["p", "q"])])
    fn = sm.package.from_onnx(model).function()
    assert fn.shape_specialised
    for b in (2, 4):
        x = np.arange(4 * b, dtype=np.float32).reshape(b, 4)
        np.testing.assert_array_equal(fn(x=x)["y"].numpy(), x.reshape(b // 2, 8))
    assert "extents of x: [2, 4] -> [4, 4]" in fn.specialise_log[1]


def test_a_value_input_too_large_to_key_on_is_a_feed_error():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [_vi("x", [2, 3]), _vi("s", ["k"], T.INT64)], [_vi("y", ["p", "q"])])
    fn = sm.package.from_onnx(model).function()
    with pytest.raises(FeedError, match="at most"):
        fn(x=np.zeros((2, 3), np.float32), s=np.ones(5000, np.int64))


def test_a_hostile_run_time_value_is_refused_by_the_import_limits():
    nodes = [helper.make_node("Range", ["a", "n", "d"], ["r"])]
    model = _model(nodes, [_vi("a", [], T.INT64), _vi("n", [], T.INT64), _vi("d", [], T.INT64)],
                   [_vi("r", ["k"], T.INT64)])
    fn = sm.package.from_onnx(model).function()
    with pytest.raises(PackageError):
        fn(a=np.array(0, np.int64), n=np.array(2 ** 40, np.int64), d=np.array(1, np.int64))
