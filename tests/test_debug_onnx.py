"""stitchml.debug with ONNX: export_onnx checked by onnxruntime and re-import; bisection against onnxruntime."""
import doctest
import importlib

import numpy as np
import pytest

import stitchml as sm
from stitchml import debug

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _mixed():
    """Most op families export_onnx covers: elementwise, matmul, reductions, reshape, transpose, cast, select."""
    g = sm.Graph("mixed")
    x = g.placeholder((2, 3, 4), sm.float32, name="x")
    w = g.constant(np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2), name="w")
    h = g.matrix_multiplication(g.tanh(x) * 2.0 - 0.5, w, name="mm")               # (2, 3, 2)
    s = g.softmax(h, axis=2)
    m = g.reduction_mean(s, axes=[1], keep_dims=True, name="mean")
    r = g.reshape(g.transpose(x, 0, 2), (4, 6), name="flat")
    big = g.reduction_maximum(g.square_root(g.absolute(r)), axes=[1], name="big")
    pick = g.select(g.greater_than(x, 0.0), g.exponent(x), g.erf(x) / 3.0, name="pick")
    n = g.cast(g.reduction_sum(pick, axes=None, name="total"), sm.float64, name="total64")
    return g, x, [s, m, big, pick, n]


def test_export_runs_in_onnxruntime_and_reimports_to_the_same_values(tmp_path):
    g, x, targets = _mixed()
    xv = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ours = g.run({x: xv}, targets, device="cpu")
    path = tmp_path / "mixed.onnx"
    debug.export_onnx(g, path, targets)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = session.run([t.name for t in targets], {"x": xv})
    for t, v in zip(targets, theirs):
        assert v.dtype == ours[t].numpy().dtype and v.shape == ours[t].shape
        np.testing.assert_allclose(v, ours[t].numpy(), rtol=2e-6, atol=1e-6, err_msg=t.name)
    x64 = xv.astype(np.float64)  # and one value by hand, in float64
    pick = np.where(x64 > 0, np.exp(x64), np.vectorize(__import__("math").erf)(x64) / 3)
    np.testing.assert_allclose(theirs[4], pick.sum(), rtol=1e-5)
    fn = sm.package.from_onnx(str(path)).function()
    again = fn(x=xv)
    for t in targets:
        np.testing.assert_allclose(again[t.name].numpy(), ours[t].numpy(), rtol=1e-6, atol=1e-7, err_msg=t.name)


def test_export_refuses_ops_it_cannot_write(tmp_path):
    g = sm.Graph()
    x = g.placeholder((3,), sm.int32, name="x")
    with pytest.raises(sm.GraphError, match=r"floor_division \(q, built at .*test_debug_onnx.py:\d+\) has no ONNX form"):
        debug.export_onnx(g, tmp_path / "m.onnx", [g.floor_division(x, x, name="q")])
    v = g.variable(np.zeros(3, np.float32), name="v")
    with pytest.raises(sm.GraphError, match="reads or writes a variable"):
        debug.export_onnx(g, tmp_path / "m.onnx", [g.read_variable(v) * 2.0])
    assert not (tmp_path / "m.onnx").exists()


def _chain(activation_at_7: str):
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits, prev = [], [], "x"
    for i in range(12):
        w = np.random.default_rng(i).standard_normal((8, 8)).astype(np.float32) * 0.3
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"]))
        nodes.append(helper.make_node(activation_at_7 if i == 7 else "Tanh", [f"mm{i}"], [f"act{i}"]))
        nodes.append(helper.make_node("Add", [f"act{i}", prev], [f"res{i}"]))
        prev = f"res{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, 8])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_bisect_against_onnxruntime_maps_onnx_names(tmp_path):
    onnx.save(_chain("Tanh"), tmp_path / "ours.onnx")
    graph, names = debug.import_onnx(str(tmp_path / "ours.onnx"))
    xv = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    same = debug.bisect(graph, {"x": xv}, debug.onnx_reference(_chain("Tanh")), names=names, tolerance=1e-5)
    assert same.op is None and same.compared == 36 and same.probes == 1
    wrong = debug.bisect(graph, {"x": xv}, debug.onnx_reference(_chain("Sigmoid")), names=names, tolerance=1e-5)
    assert wrong.tensor == names["act7"] and wrong.op.op == "tanh"
    assert wrong.probes <= 1 + int(np.ceil(np.log2(36)))
    mm7 = debug.onnx_reference(_chain("Sigmoid"))({"x": xv})["mm7"].astype(np.float64)
    np.testing.assert_allclose(wrong.expected, 1 / (1 + np.exp(-mm7)), rtol=1e-5)
    np.testing.assert_allclose(wrong.ours, np.tanh(mm7), rtol=1e-5, atol=1e-6)


def test_docstring_example():
    failures, tried = doctest.testmod(importlib.import_module("stitchml.debug.onnx_export"))
    assert tried and not failures
