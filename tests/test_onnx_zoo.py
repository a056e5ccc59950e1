"""ONNX parity: the zoo exported by torch.onnx.export (TorchScript exporter, opset 17) and imported."""
import io
import warnings

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import stitchml as sm
from stitchml.package import zoo

TOL = 1e-4


def _export(model, xs) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, xs, f, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}})
    return f.getvalue()


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_matches_pytorch(name, tmp_path):
    model, xs = zoo.build(name)
    pkg = sm.package.from_onnx(_export(model, xs))
    pkg.save(tmp_path / "m.smpkg")
    fn = sm.load_package(tmp_path / "m.smpkg").function()
    assert str(fn.inputs[0]).startswith("x: float32[batch, ")
    with torch.no_grad():
        for x in (xs, tuple(torch.cat([v, v[:1]]) for v in xs)):
            want = model(*x).numpy()
            got = fn(x=x[0].numpy())["y"].numpy()
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= TOL


def _model(nodes, inputs, outputs, opset=17, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unknown_operator_names_node_and_op():
    m = _model([helper.make_node("FancyOp", ["x"], ["y"], name="n1")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(sm.PackageError, match=r"n1.*FancyOp"):
        sm.package.from_onnx(m)


def test_unsupported_element_type_is_reported():
    m = _model([helper.make_node("Identity", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
               [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    with pytest.raises(sm.PackageError, match="STRING"):
        sm.package.from_onnx(m)


def test_garbage_bytes_are_not_a_model():
    with pytest.raises(sm.PackageError, match="not a valid ONNX model"):
        sm.package.from_onnx(b"\x08\x01garbage" * 10)


def test_external_data_is_refused():
    t = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    t.data_location = TensorProto.EXTERNAL
    del t.float_data[:]
    t.external_data.add(key="location", value="../../etc/passwd")
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializers=[t])
    with pytest.raises(sm.PackageError, match="external"):
        sm.package.from_onnx(m)


def test_operand_needed_at_import_time_can_be_bound():
    # Without bind the function is specialised per value at run time (test_onnx_runtime_values.py).
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])])
    fn = sm.package.from_onnx(m, bind={"shape": np.array([3, 2])}).function()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(fn(x=x)["y"].numpy(), x.reshape(3, 2))


def test_symbolic_flatten_keeps_the_batch_extent():
    m = _model([helper.make_node("Flatten", ["x"], ["y"], axis=1)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])])
    fn = sm.package.from_onnx(m).function()
    assert fn.outputs[0].type.shape == (-1, 6)
    for n in (1, 4):
        x = np.random.rand(n, 2, 3).astype(np.float32)
        np.testing.assert_array_equal(fn(x=x)["y"].numpy(), x.reshape(n, 6))


def test_model_proto_roundtrip_through_bytes():
    m = _model([helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    fn = sm.package.from_onnx(m.SerializeToString()).function()
    assert fn(x=np.array([-1.0, 0.0, 2.0], np.float32))["y"].numpy().tolist() == [0.0, 0.0, 2.0]


def test_malformed_node_is_a_package_error():
    m = _model([helper.make_node("Concat", ["x", "x"], ["y"], name="cat")],  # Concat requires `axis`
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    with pytest.raises(sm.PackageError, match=r"(?s)Required attribute 'axis' is missing.*Name: cat OpType: Concat"):
        sm.package.from_onnx(m)


def test_undefined_input_is_named():
    m = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(sm.PackageError, match="nowhere"):
        sm.package.from_onnx(m)
