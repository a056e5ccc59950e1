"""Hostile and invalid ONNX models: each is refused with PackageError, quickly, before it can use much memory."""
import signal
import warnings

import numpy as np
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper
from onnx import numpy_helper as nh

import stitchml as sm


@pytest.fixture(autouse=True)
def deadline():
    """Fail (rather than hang) a test that takes more than 20 s: the hostile inputs here once did."""
    def expire(*_):
        raise TimeoutError("the importer ran past the test's 20 s deadline")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _vi(name, shape, dtype=T.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, value):
    return nh.from_array(np.asarray(value), name)


def test_lstm_unrolled_beyond_the_limit_is_refused_at_once():
    # A 1 KB model whose sequence of 100,000 steps was unrolled into millions of ops (minutes, gigabytes).
    m = _model([helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=2)], [_vi("x", [100000, 1, 2])],
               [_vi("y", [100000, 1, 1, 2])],
               [_const("w", np.ones((1, 8, 2), np.float32)), _const("r", np.ones((1, 8, 2), np.float32))])
    assert len(m.SerializeToString()) < 1024
    with pytest.raises(sm.PackageError, match="max_unrolled_steps"):
        sm.package.from_onnx(m)


def test_lstm_within_a_raised_limit_imports():
    m = _model([helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=2)], [_vi("x", [6, 1, 2])],
               [_vi("y", [6, 1, 1, 2])],
               [_const("w", np.ones((1, 8, 2), np.float32)), _const("r", np.ones((1, 8, 2), np.float32))])
    with pytest.raises(sm.PackageError, match="max_unrolled_steps=4"):
        sm.package.from_onnx(m, limits=sm.package.Limits(max_unrolled_steps=4))
    assert sm.package.from_onnx(m, limits=sm.package.Limits(max_unrolled_steps=6)).function().outputs[0].name == "y"


def test_stacked_lstm_layers_add_up_against_the_limit():
    w, r = np.ones((1, 8, 2), np.float32), np.ones((1, 8, 2), np.float32)
    nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["y1"], hidden_size=2),
             helper.make_node("Squeeze", ["y1", "ax"], ["x2"]),
             helper.make_node("LSTM", ["x2", "w", "r"], ["y"], hidden_size=2)]
    m = _model(nodes, [_vi("x", [3, 1, 2])], [_vi("y", [3, 1, 1, 2])],
               [_const("w", w), _const("r", r), _const("ax", np.array([1], np.int64))])
    assert sm.package.from_onnx(m, limits=sm.package.Limits(max_unrolled_steps=6))
    with pytest.raises(sm.PackageError, match="layers.: 6 is over the limit max_unrolled_steps=5"):
        sm.package.from_onnx(m, limits=sm.package.Limits(max_unrolled_steps=5))


def test_mod_by_zero_in_constants_is_refused():
    m = _model([helper.make_node("Mod", ["a", "b"], ["y"])], [], [_vi("y", [3], T.INT64)],
               [_const("a", np.array([1, 2, 3], np.int64)), _const("b", np.array([0, 1, 0], np.int64))])
    with pytest.raises(sm.PackageError, match="divisor .* holds a zero"):
        sm.package.from_onnx(m)


def test_gather_elements_out_of_range_is_refused():
    m = _model([helper.make_node("GatherElements", ["a", "i"], ["y"], axis=0)], [], [_vi("y", [2])],
               [_const("a", np.array([1, 2, 3], np.float32)), _const("i", np.array([0, 7], np.int64))])
    with pytest.raises(sm.PackageError, match=r"indices 0\.\.7 fall outside \[-3, 3\)"):
        sm.package.from_onnx(m)


def test_gather_elements_indices_wider_than_the_data_are_refused():
    m = _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)], [_vi("x", [1, 3])], [_vi("y", [2, 2])],
               [_const("i", np.array([[0, 2], [1, 0]], np.int64))])
    with pytest.raises(sm.PackageError, match=r"indices int64\[2,2\] reach beyond data float32\[1,3\] off axis 1"):
        sm.package.from_onnx(m)


def test_range_to_two_to_the_40_is_refused_before_computing_it():
    m = _model([helper.make_node("Range", ["s", "l", "d"], ["y"])], [], [_vi("y", ["n"], T.INT64)],
               [_const("s", np.array(0, np.int64)), _const("l", np.array(2 ** 40, np.int64)),
                _const("d", np.array(1, np.int64))])
    with pytest.raises(sm.PackageError, match="Range length: 1099511627776 is over the limit max_folded_elements"):
        sm.package.from_onnx(m)


def test_huge_constant_of_shape_is_refused():
    m = _model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], [_vi("y", ["a", "b", "c"])],
               [_const("s", np.array([2 ** 20] * 3, np.int64))])
    with pytest.raises(sm.PackageError, match="max_tensor_elements"):
        sm.package.from_onnx(m)


def test_softmax_axis_out_of_range_is_refused():
    m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-100)], [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    with pytest.raises(sm.PackageError, match="axis"):
        sm.package.from_onnx(m)


def test_axis_check_of_our_own():
    """Beyond the checker: the importer's own range check, as a model with an unknown rank reaches it."""
    from stitchml.package.onnx_import import Importer

    cx = Importer(_model([], [], []), "main")
    assert cx.axis(-2, 2) == 0 and cx.axis(1, 2) == 1
    for bad in (-100, -3, 2, True, 1.0):
        with pytest.raises(sm.PackageError, match=r"outside \[-2, 2\)"):
            cx.axis(bad, 2)


def test_duplicate_node_outputs_are_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])],
               [_vi("x", [2, 3])], [_vi("y", [2, 3])])
    with pytest.raises(sm.PackageError, match="node output 'y' is defined twice"):
        sm.package.from_onnx(m)


def test_duplicate_graph_outputs_are_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2]), _vi("y", [2])])
    with pytest.raises(sm.PackageError, match=r"graph outputs \['y', 'y'\] name a value twice"):
        sm.package.from_onnx(m)


def test_duplicate_initializers_are_refused():
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [3])], [_vi("y", [3])],
               [_const("w", np.ones(3, np.float32)), _const("w", np.zeros(3, np.float32))])
    with pytest.raises(sm.PackageError, match="initializer 'w' is defined twice"):
        sm.package.from_onnx(m)


def test_negative_extents_are_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [-3, 3])], [_vi("y", [-3, 3])])
    with pytest.raises(sm.PackageError, match=r"negative extent in shape \[-3, 3\]"):
        sm.package.from_onnx(m)
    w = _const("w", np.ones(3, np.float32))
    w.dims[:] = [-1]
    m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [3])], [_vi("y", [3])], [w])
    with pytest.raises(sm.PackageError, match="Negative dimension value"):
        sm.package.from_onnx(m)


@pytest.mark.parametrize("pads", [[0, -5, 0, 0], [0, -2, 0, -2]])
def test_pad_removing_more_than_the_extent_is_refused(pads):
    m = _model([helper.make_node("Pad", ["x", "p"], ["y"])], [_vi("x", [2, 3])], [_vi("y", ["a", "b"])],
               [_const("p", np.array(pads, np.int64))])
    with pytest.raises(sm.PackageError, match="Pad"):
        sm.package.from_onnx(m)


def test_negative_pads_within_the_extent_still_crop():
    m = _model([helper.make_node("Pad", ["x", "p"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 1])],
               [_const("p", np.array([0, -1, 0, -1], np.int64))])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(sm.package.from_onnx(m).function()(x=x)["y"].numpy(), x[:, 1:2])


def test_special_file_as_model_is_refused(tmp_path):
    import os

    os.mkfifo(tmp_path / "model.onnx")
    with pytest.raises(sm.PackageError, match="FIFO"):
        sm.package.from_onnx(tmp_path / "model.onnx")


def test_from_torch_keeps_the_batch_dims_name_through_varargs():
    class Varargs(torch.nn.Module):
        def forward(self, *xs):
            return xs[0] * 2

    batch = torch.export.Dim("batch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(Varargs(), (torch.randn(2, 4),), dynamic_shapes=(({0: batch},),)).function()
    assert str(fn.inputs[0]) == "xs_0: float32[batch, 4]"


def test_from_torch_refuses_a_result_over_the_element_limit():
    class Big(torch.nn.Module):
        def forward(self, x):
            return x.expand(64, 64, 4)

    with pytest.raises(sm.PackageError, match=r"node .*expand.*max_tensor_elements=1000"):
        sm.package.from_torch(Big(), (torch.randn(1, 4),), limits=sm.package.Limits(max_tensor_elements=1000))
