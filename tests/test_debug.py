"""stitchml.debug: captures (against NumPy), capture files (round trip and damage), bisection."""
import doctest
import importlib
import json
import math
import struct

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml import debug
from stitchml.debug import CaptureError


def _small():
    g = sm.Graph("small")
    x = g.placeholder((2, 3), sm.float32, name="x")
    with g.scope("block"):
        h = g.tanh(x * 2.0 + 1.0, name="h")
    s = g.reduction_sum(h, axes=[1], name="s")
    w = g.constant(np.arange(6, dtype=np.float32).reshape(3, 2), name="w")
    y = g.addition(g.matrix_multiplication(h, w, name="mm"), 0.5, name="y")
    return g, x, [s, y]


def test_capture_keeps_every_original_op_with_numpy_values_and_kernels():
    g, x, targets = _small()
    xv = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    cap = debug.capture(g, {x: xv}, targets)
    h = np.tanh(xv.astype(np.float64) * 2 + 1)
    np.testing.assert_allclose(cap.tensor("h"), h, rtol=1e-6)
    np.testing.assert_allclose(cap.tensor("s"), h.sum(1), rtol=1e-6)
    np.testing.assert_allclose(cap.tensor("y"), h @ np.arange(6).reshape(3, 2) + 0.5, rtol=1e-6)
    rec = cap.record("h")
    assert (rec.op, rec.scope, rec.shapes, rec.dtypes) == ("tanh", "block", [[2, 3]], ["float32"])
    assert rec.location.startswith(__file__) and rec.inputs == ["addition_4"]
    # h, s share the reduction kernel; the matmul starts its own and says why in the report
    assert cap.kernel_of("h") == cap.kernel_of("s") == "kernel0_reduction"
    assert cap.kernel_of("mm") == cap.kernel_of("y") == "kernel1_matmul"
    k0 = next(k for k in cap.kernels if k["name"] == "kernel0_reduction")
    assert k0["ops"][-2:] == ["h", "s"] and "matrix_multiplication" in k0["not_fused"][0][1]
    assert cap.record("x").kernel is None


def test_capture_of_an_executable_and_of_chosen_ops():
    g, x, targets = _small()
    xv = np.ones((2, 3), np.float32)
    exe = g.compile({x: sm.TensorType((2, 3), sm.float32)}, targets, device="cpu")
    cap = debug.capture(exe, {x: xv}, ops=["h"])
    assert sorted(cap.tensors) == ["h"] and len(cap.records) >= 7
    np.testing.assert_allclose(cap.tensor("h"), np.tanh(np.full((2, 3), 3.0)), rtol=1e-6)
    with pytest.raises(KeyError, match="nope"):
        debug.capture(exe, {x: xv}, ops=["nope"])


def test_capture_file_round_trip(tmp_path):
    g, x, targets = _small()
    cap = debug.capture(g, {"x": np.ones((2, 3), np.float32)}, targets)
    path = tmp_path / "run.capture"
    cap.save(path)
    back = debug.load_capture(path)
    assert [r.name for r in back.records] == [r.name for r in cap.records]
    assert back.kernels == json.loads(json.dumps(cap.kernels))
    for k in cap.tensors:
        assert torch.equal(back.tensors[k], cap.tensors[k])


def test_capture_of_views_and_softmax_saves(tmp_path):
    g = sm.Graph()
    x = g.placeholder((2, 5), sm.float32, name="x")
    y = g.softmax(g.reshape(x, (5, 2)), axis=1)  # reshape is a view; softmax holds a stop_gradient of a max
    xv = np.arange(10, dtype=np.float32).reshape(2, 5)
    cap = debug.capture(g, {x: xv}, [y])
    cap.save(tmp_path / "views.capture")
    back = debug.load_capture(tmp_path / "views.capture")
    want = torch.softmax(torch.from_numpy(xv).double().reshape(5, 2), 1).numpy()
    np.testing.assert_allclose(back.tensor(y.name), want, rtol=1e-6)


def _rewrite_manifest(path, edit):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    manifest = json.loads(header["__metadata__"]["stitchml.capture"])
    edit(manifest)
    header["__metadata__"]["stitchml.capture"] = json.dumps(manifest)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(b"\x01\x02"), "expected a safetensors header"),
    (lambda p: p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}"), "does not fit"),
    (lambda p: p.write_bytes(p.read_bytes()[:-5]), "damaged"),
    (lambda p: p.write_bytes(struct.pack("<Q", 2) + b"{}"), "manifest"),
    (lambda p: _rewrite_manifest(p, lambda m: m.update(version=9)), "expected version 1"),
    (lambda p: _rewrite_manifest(p, lambda m: m["records"][1].update(name=3)), "'name' of type str"),
    (lambda p: _rewrite_manifest(p, lambda m: m["records"][-1].update(shapes=[[7, 7]])), "the record says shape"),
    (lambda p: _rewrite_manifest(p, lambda m: m["records"][-1].update(dtypes=["int8"])), "the record says int8"),
    (lambda p: _rewrite_manifest(p, lambda m: m["tensors"].append("ghost")), "ghost"),
])
def test_damaged_capture_files_raise_capture_error(tmp_path, damage, message):
    g, x, targets = _small()
    path = tmp_path / "run.capture"
    debug.capture(g, {x: np.ones((2, 3), np.float32)}, targets).save(path)
    damage(path)
    with pytest.raises(CaptureError, match=message):
        debug.load_capture(path)


def test_capture_paths_stay_inside_the_root(tmp_path):
    g, x, targets = _small()
    (tmp_path / "in").mkdir()
    path = tmp_path / "out.capture"
    debug.capture(g, {x: np.ones((2, 3), np.float32)}, targets).save(path)
    with pytest.raises(CaptureError, match="expected a path inside"):
        debug.load_capture(tmp_path / "in" / ".." / "out.capture", root=tmp_path / "in")
    assert debug.load_capture(path, root=tmp_path).graph_name == "small"


def _deep(n_blocks=60, bad=None, cancel=None):
    """A residual chain of n_blocks blocks of 5 ops: h + 0.1 * tanh(0.9 * h + shift).

    Each block's derivative is at least 1, so an error carries forward undamped. Block `bad` uses
    sin where it should use tanh; block `cancel` adds 1e4 to its activation and takes it away again
    (2 more ops), which keeps only 3 decimals in float32.
    """
    g = sm.Graph("deep")
    x = g.placeholder((4, 8), sm.float32, name="x")
    h = x
    for i in range(n_blocks):
        a = g.multiplication(h, 0.9, name=f"scale{i}")
        a = g.addition(a, 0.01 * (i % 7), name=f"shift{i}")
        a = (g.sin if i == bad else g.tanh)(a, name=f"act{i}")
        if i == cancel:
            a = g.subtraction(g.addition(a, 1e4, name=f"shifted{i}"), 1e4, name=f"cancelled{i}")
        h = g.addition(h, g.multiplication(a, 0.1, name=f"damp{i}"), name=f"blocks.{i}")
    return g, x, h


class _Deep(torch.nn.Module):
    class Block(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            self.i = i

        def forward(self, h):
            return h + 0.1 * torch.tanh(h * 0.9 + 0.01 * (self.i % 7))

    def __init__(self, n):
        super().__init__()
        self.blocks = torch.nn.ModuleList(self.Block(i) for i in range(n))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_bisect_finds_a_wrong_op_against_a_torch_module_in_log_probes():
    g, x, out = _deep(60, bad=41)
    assert len(g.operations) >= 300
    xv = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    r = debug.bisect(g, {x: xv}, debug.torch_reference(_Deep(60).double()), targets=[out], tolerance=1e-5)
    assert r.op.name == "blocks.41" and r.tensor == "blocks.41"
    assert r.compared == 60 and r.probes <= 1 + math.ceil(math.log2(60))
    ref = _Deep(60).double()(torch.from_numpy(xv).double())
    assert r.max_abs_error > 1e-3 and r.expected.shape == (4, 8)
    assert not np.allclose(r.ours, r.expected, atol=1e-5)
    assert ref.shape == (4, 8)


def test_bisect_finds_a_float32_cancellation_against_float64_in_a_graph_of_300_ops():
    g, x, out = _deep(60, cancel=34)  # block 34 adds and subtracts 1e4: float32 keeps 3 decimals of act34
    xv = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    # float32 rounding elsewhere stays below 2e-6 relative; the output grows to about 10, so the relative
    # tolerance must stay small for the cancelled decimals (0.1 * 2**-11 at the output) to show there
    r = debug.bisect(g, {x: xv}, "float64", targets=[out], tolerance=2e-6)
    assert r.op.name == "cancelled34" and r.op.op == "subtraction" and r.op.location.startswith(__file__)
    assert r.compared == 302 and r.probes <= 10
    assert 1e-5 < r.max_abs_error <= 2.0 ** -11  # half an ulp of 1e4 in float32
    np.testing.assert_allclose(r.ours, r.expected, atol=2.0 ** -11)
    print(f"bisect: {r.probes} probes over {r.compared} ops")


def test_bisect_without_a_divergence_and_with_unmatched_names():
    g, x, out = _deep(5)
    xv = np.zeros((4, 8), np.float32)
    r = debug.bisect(g, {x: xv}, debug.torch_reference(_Deep(5).double()), targets=[out], tolerance=1e-5)
    assert r.op is None and r.probes == 1 and "no divergence" in r.summary()
    with pytest.raises(sm.GraphError, match="no reference value is named like a graph tensor"):
        debug.bisect(g, {x: xv}, lambda feeds: {"other": np.zeros(1)}, targets=[out])


def test_docstring_examples():
    for name in ("stitchml.debug.capture", "stitchml.debug.bisect"):
        failures, tried = doctest.testmod(importlib.import_module(name))
        assert tried and not failures


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act = torch.nn.Linear(3, 3), torch.nn.Tanh()

    def forward(self, x):
        return self.act(self.lin(x)) * 2.0  # the line the tanh and the product come from


def test_imported_functions_map_values_back_to_the_model_and_keep_the_map(tmp_path):
    import inspect

    fn = sm.package.from_torch(_Tiny().eval(), (torch.zeros(2, 3),)).function()
    line = inspect.getsourcelines(_Tiny.forward)[1] + 1
    tanh = fn.origins["act#0"]
    assert (tanh.op, tanh.location) == ("aten.tanh.default", f"{__file__}:{line}")
    op = fn.graph.tensor(tanh.tensor).op
    assert (op.op, op.scope, op.location) == ("tanh", "act", f"{__file__}:{line}")
    assert fn.origins["#0"].op == "aten.mul.Tensor" and fn.origins["#0"].tensor == fn.output_tensor("output").name
    assert fn.origins["lin#0"].location == f"{__file__}:{line}"  # a torch layer's ops: the line that called it
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    values = debug.torch_program_reference(_Tiny().eval(), (torch.zeros(2, 3),))({"x": x})
    assert set(fn.origin_names()) <= set(values)
    fn.package.save(tmp_path / "tiny.smpkg")
    loaded = sm.load_package(tmp_path / "tiny.smpkg").function()
    assert loaded.origins == fn.origins
    fn.package.save(str(tmp_path / "dir") + "/")
    manifest = json.loads((tmp_path / "dir" / "manifest.json").read_text())
    manifest["functions"]["main"]["origins"][0]["tensor"] = "nowhere"
    (tmp_path / "dir" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(sm.PackageError, match=r"origins\[0\]: tensor 'nowhere' is not in the graph"):
        sm.load_package(str(tmp_path / "dir") + "/")
