"""The ONNX importer on uint16/32/64 and the float8 types, against ONNX's own reference evaluator.

Values are chosen where implementations part ways: float8 casts at the largest finite value, at the
halfway points past it (ties go to even), beyond, at infinities, NaN and subnormals, with and without
`saturate`; unsigned arithmetic that wraps, and uint64 values of 2^63 and more (which int64 would read
as negative) through division, modulo, shifts, bit operations, comparisons and TopK.
"""
from __future__ import annotations

import numpy as np
import pytest

import stitchml as sm

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as T, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

EDGES = np.array([0, 1e-9, -1e-9, 0.3, 447, 448, 449, 456, 463.9, 464, 464.1, 479, 480, 481, 239, 240, 241, 247.9,
                  248, 248.1, 256, 57343, 57344, 57345, 61439, 61440, 61441, 65536, 1e6, np.inf, -np.inf, np.nan,
                  -448, -464, -464.1, -61440, -248, 2**-10, 2**-17, 1.5 * 2**-9], np.float32)


def _model(nodes, inputs, outputs, opset=21):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    if got.dtype.kind == "f":
        differ = ~((got == want) | (np.isnan(got) & np.isnan(want)))
    else:
        differ = got != want
    assert not differ.any(), f"{what}: at {np.flatnonzero(differ)}: {got[differ]} vs {want[differ]}"


@pytest.mark.parametrize("to", [T.FLOAT8E4M3FN, T.FLOAT8E5M2, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2FNUZ],
                         ids=lambda t: T.DataType.Name(t))
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8_at_the_edges(to, saturate):
    m = _model([helper.make_node("Cast", ["x"], ["y"], to=to, saturate=saturate),
                helper.make_node("Cast", ["y"], ["z"], to=T.FLOAT)],
               [helper.make_tensor_value_info("x", T.FLOAT, [len(EDGES)])],
               [helper.make_tensor_value_info("z", T.FLOAT, [len(EDGES)])])
    want = ReferenceEvaluator(m).run(None, {"x": EDGES})[0]
    got = sm.package.from_onnx(m.SerializeToString()).function()(x=EDGES)["z"].numpy()
    _same(got, want, f"Cast to {T.DataType.Name(to)} saturate={saturate}")


def test_quantize_linear_to_float8_and_back():
    x = (EDGES[np.isfinite(EDGES)] / 4).astype(np.float32)
    scale = np.array(0.5, np.float32)
    m = _model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"]),
                helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])],
               [helper.make_tensor_value_info("x", T.FLOAT, [len(x)]), helper.make_tensor_value_info("s", T.FLOAT, []),
                helper.make_tensor_value_info("zp", T.FLOAT8E4M3FN, [])],
               [helper.make_tensor_value_info("y", T.FLOAT, [len(x)])])
    import ml_dtypes

    zp = np.zeros((), ml_dtypes.float8_e4m3fn)
    want = ReferenceEvaluator(m).run(None, {"x": x, "s": scale, "zp": zp})[0]
    got = sm.package.from_onnx(m.SerializeToString()).function()(x=x, s=scale, zp=zp)["y"].numpy()
    _same(got, want, "QuantizeLinear/DequantizeLinear float8_e4m3fn")


BINARY = ["Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Greater", "Less",
          "Equal"]


@pytest.mark.parametrize("elem", [T.UINT16, T.UINT32, T.UINT64], ids=lambda t: T.DataType.Name(t))
def test_unsigned_operators(elem):
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    top = np.iinfo(np_type).max
    rng = np.random.default_rng(elem)
    a = np.concatenate([rng.integers(0, top, 10, dtype=np_type, endpoint=True), np.array([0, top, top // 2 + 1], np_type)])
    b = np.concatenate([rng.integers(1, top, 5, dtype=np_type, endpoint=True), rng.integers(1, 64, 8, dtype=np_type)])
    shift = rng.integers(0, np.iinfo(np_type).bits, a.size, dtype=np_type)
    nodes = [helper.make_node(op, ["a", "b"], [op]) for op in BINARY]
    nodes += [helper.make_node("BitShift", ["a", "s"], ["Left"], direction="LEFT"),
              helper.make_node("BitShift", ["a", "s"], ["Right"], direction="RIGHT"),
              helper.make_node("BitwiseNot", ["a"], ["Not"]),
              helper.make_node("TopK", ["a", "k"], ["TopV", "TopI"], axis=0),
              helper.make_node("Cast", ["a"], ["AsFloat"], to=T.DOUBLE)]
    k = np.array([4], np.int64)
    vi = helper.make_tensor_value_info
    outs = [n for node in nodes for n in node.output]
    m = _model(nodes, [vi("a", elem, [a.size]), vi("b", elem, [a.size]), vi("s", elem, [a.size]), vi("k", T.INT64, [1])],
               [vi(n, T.BOOL if n in ("Greater", "Less", "Equal") else T.INT64 if n == "TopI" else
                   T.DOUBLE if n == "AsFloat" else elem, [4] if n.startswith("Top") else [a.size]) for n in outs],
               opset=18)
    feeds = {"a": a, "b": b, "s": shift, "k": k}
    want = dict(zip(outs, ReferenceEvaluator(m).run(None, feeds)))
    got = sm.package.from_onnx(m.SerializeToString()).function()(**feeds)
    for name in outs:
        _same(got[name].numpy(), want[name], f"{T.DataType.Name(elem)} {name}")


@pytest.mark.parametrize("elem", [T.INT8, T.INT32, T.INT64], ids=lambda t: T.DataType.Name(t))
def test_integer_div_truncates_exactly(elem):
    """Div on integers truncates toward zero in the integer type, also where a float32 quotient would round."""
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    info = np.iinfo(np_type)
    rng = np.random.default_rng(7)
    a = rng.integers(info.min, info.max, 64, dtype=np_type, endpoint=True)
    b = rng.integers(info.min, info.max, 64, dtype=np_type, endpoint=True)
    b[:32] = rng.integers(-9, 9, 32, dtype=np_type)
    b[b == 0] = 3
    b[a == info.min] = 2  # not info.min // -1, which overflows
    vi = helper.make_tensor_value_info
    m = _model([helper.make_node("Div", ["a", "b"], ["y"])], [vi("a", elem, [64]), vi("b", elem, [64])],
               [vi("y", elem, [64])], opset=18)
    want = ReferenceEvaluator(m).run(None, {"a": a, "b": b})[0]
    got = sm.package.from_onnx(m.SerializeToString()).function()(a=a, b=b)["y"].numpy()
    _same(got, want, f"{T.DataType.Name(elem)} Div")
