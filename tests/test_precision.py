"""Compile options of the library calls: `allow_tf32` (TF32 in cuBLAS/cuDNN for one executable, torch's
flags restored) and `conv_channels_last` (cuDNN gets channels-last operands), against the op-by-op run
and float64 references."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.errors import GraphError
from stitchml.registry import lookup


@pytest.fixture
def torch_flags():
    """torch's TF32 flags, put back after the test whatever it set."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _matmul_graph():
    g = sm.Graph("tf32")
    a = g.placeholder((8, 16), sm.float32, name="a")
    b = g.placeholder((16, 4), sm.float32, name="b")
    return g, a, b, g.relu(a @ b)


def _feeds(a, b):
    gen = torch.Generator().manual_seed(0)
    return {a: torch.randn(8, 16, generator=gen), b: torch.randn(16, 4, generator=gen)}


@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("globally", [False, True])
def test_library_calls_see_the_executables_choice_and_the_flags_come_back(monkeypatch, torch_flags, allow, globally):
    seen = []
    prim = lookup("matrix_multiplication")
    original = prim.vendor

    def vendor(out, x, y):
        seen.append((torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return original(out, x, y)

    monkeypatch.setattr(prim, "vendor", vendor)
    g, a, b, y = _matmul_graph()
    feeds = _feeds(a, b)
    exe = g.compile(feeds, [y], device="cpu", options={"allow_tf32": allow} if allow else {})
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = globally
    got = exe.run(feeds)[y].torch()
    assert seen == [(allow, allow)]  # the executable's choice, not the process's
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (globally, globally)
    want = torch.relu(feeds[a].double() @ feeds[b].double())
    assert (got.double() - want).abs().max().item() <= 1e-5  # the CPU has no TF32: results unchanged


def test_allow_tf32_is_part_of_the_signature(torch_flags):
    g, a, b, y = _matmul_graph()
    feeds = _feeds(a, b)
    plain = g.run(feeds, [y], device="cpu", compiled=True)[y].numpy()
    fast = g.run(feeds, [y], device="cpu", compiled=True, options={"allow_tf32": True})[y].numpy()
    again = g.run(feeds, [y], device="cpu", compiled=True, options={"allow_tf32": False})[y].numpy()
    np.testing.assert_array_equal(plain, fast)
    np.testing.assert_array_equal(plain, again)
    log = [line for line in g.compile_log if line.startswith("compiled")]
    assert len(log) == 2 and "options {} -> {'allow_tf32': 'True'}" in log[1], log  # False is the default
    exe = g.compile(feeds, [y], device="cpu", options={"allow_tf32": True})
    assert exe.signature != g.compile(feeds, [y], device="cpu").signature
    assert exe.signature.options == (("allow_tf32", "True"),)


def test_allow_tf32_takes_a_bool():
    g, a, b, y = _matmul_graph()
    with pytest.raises(GraphError, match="allow_tf32 expects True or False, got 'yes'"):
        g.compile(_feeds(a, b), [y], device="cpu", options={"allow_tf32": "yes"})


def _cnn(g, x, labels, weights, padding):
    v = {k: g.variable(w, name=k) for k, w in weights.items()}
    desc = sm.Convolution2DDescriptor(padding=padding)
    pool = sm.Pooling2DDescriptor(kernel_size=2)
    h = g.max_pooling2d(g.relu(g.convolution2d(x, v["c1"], desc) + v["b1"]), pool)
    h = g.max_pooling2d(g.relu(g.convolution2d(h, v["c2"], desc) + v["b2"]), pool)
    flat = g.reshape(h, (x.shape[0], -1))
    loss = g.softmax_cross_entropy(flat @ v["d"], labels, reduction="mean")
    grads = g.gradients(loss, list(v.values()))
    return loss, [grads[v[k]] for k in weights]


def _torch_cnn(x, labels, weights, padding):
    w = {k: torch.from_numpy(t).double().requires_grad_(True) for k, t in weights.items()}
    f = torch.nn.functional
    pad = 1 if padding == "same" else tuple(padding)
    conv = (lambda a, k: f.conv2d(a, k, padding=pad)) if padding == "same" else \
        (lambda a, k: f.conv2d(f.pad(a, (pad[2], pad[3], pad[0], pad[1])), k))
    h = f.max_pool2d(f.relu(conv(x.double(), w["c1"]) + w["b1"]), 2)
    h = f.max_pool2d(f.relu(conv(h, w["c2"]) + w["b2"]), 2)
    loss = f.cross_entropy(h.flatten(1) @ w["d"], labels)
    return loss, torch.autograd.grad(loss, list(w.values()))


@pytest.mark.parametrize("padding", ["same", (0, 2, 1, 1)])
@pytest.mark.parametrize("options", [{}, {"conv_channels_last": True}, {"allow_tf32": True}])
def test_convolution_steps_match_the_op_by_op_run_and_float64(triton_interpreter, padding, options):
    """Symmetric padding goes to the library, asymmetric is padded first; either way, with channels-last
    operands or not, a training step's loss and gradients equal the op-by-op run's and torch's in float64."""
    rng = np.random.default_rng(0)
    side, flat = 8, 4 * 2 * 2  # both paddings keep the extents: 8 x 8, pooled to 4 x 4, then 2 x 2
    weights = {"c1": rng.standard_normal((3, 1, 3, 3)).astype(np.float32) * 0.5,
               "b1": rng.standard_normal((3, 1, 1)).astype(np.float32) * 0.1,
               "c2": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
               "b2": rng.standard_normal((4, 1, 1)).astype(np.float32) * 0.1,
               "d": rng.standard_normal((flat, 5)).astype(np.float32) * 0.3}
    g = sm.Graph("cnn")
    x = g.placeholder((2, 1, side, side), sm.float32, name="x")
    labels = g.placeholder((2,), sm.int64, name="labels")
    loss, grads = _cnn(g, x, labels, weights, padding)
    feeds = {x: torch.from_numpy(rng.standard_normal((2, 1, side, side)).astype(np.float32)),
             labels: torch.tensor([1, 3])}
    exe = g.compile(feeds, [loss, *grads], device="cpu", options=options)
    assert any(s.kind == "convolution" for s in exe.steps)
    got = exe.run(feeds)
    eager = g.run(feeds, [loss, *grads], device="cpu", compiled=False)
    want_loss, want_grads = _torch_cnn(feeds[x], feeds[labels], weights, padding)
    for t, want in zip([loss, *grads], [want_loss, *want_grads]):
        assert got[t].shape == eager[t].shape == tuple(want.shape)
        np.testing.assert_allclose(got[t].numpy(), eager[t].numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[t].numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-5)
