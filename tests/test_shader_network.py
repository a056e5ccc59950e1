"""The trainable side of shader ML: mlp's values and gradients against torch.autograd and float64
finite differences, training with Adam, and trained graph variables packed for the kernel."""
from __future__ import annotations

import doctest
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # Triton reads this when a kernel is decorated, i.e. at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import stitchml as sm  # noqa: E402
from stitchml import optim  # noqa: E402
from stitchml.errors import ShapeError  # noqa: E402
from stitchml.shader import MLP, PROGRAM, THREAD, MLPSpec, from_graph, mlp, network  # noqa: E402

SPEC = MLPSpec((3, 5, 4, 2), ("tanh", "sigmoid", "relu"), "float32", THREAD)


def _graph(spec: MLPSpec, seed: int = 0):
    g = sm.Graph()
    net = MLP(g, spec, rng=np.random.default_rng(seed), dtype=sm.float64, name="net")
    x = g.placeholder((-1, spec.widths[0]), sm.float64, name="x")
    return g, net, x


def test_values_and_gradients_against_torch_autograd():
    g, net, x = _graph(SPEC)
    y = net(x)
    target = np.random.default_rng(1).standard_normal((7, 2))
    loss = g.reduction_sum(g.square(y - target))
    grads = g.gradients(loss, [x] + net.parameters)
    xv = np.random.default_rng(2).standard_normal((7, 3))
    out = g.run({x: xv}, [y, loss] + list(grads.values()), device="cpu")

    tx = torch.tensor(xv, requires_grad=True)
    params = [torch.tensor(g.variable_value(v).numpy(), requires_grad=True) for v in net.parameters]
    h = tx
    for (w, b), act in zip(zip(params[0::2], params[1::2]), SPEC.activations):
        h = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu}[act](h @ w + b)
    tl = ((h - torch.tensor(target)) ** 2).sum()
    tl.backward()
    np.testing.assert_allclose(out[y].numpy(), h.detach().numpy(), rtol=1e-12)
    for t, ref in zip([x] + net.parameters, [tx] + params):
        np.testing.assert_allclose(out[grads[t]].numpy(), ref.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_gradients_against_finite_differences():
    spec = MLPSpec((2, 4, 3), ("tanh", "none"), "float32", THREAD)
    g, net, x = _graph(spec, seed=3)
    loss = g.reduction_sum(g.sin(net(x)))
    w0 = net.parameters[0]
    grad = g.gradients(loss, [w0])[w0]
    xv = np.random.default_rng(4).standard_normal((5, 2))
    analytic = g.run({x: xv}, [grad], device="cpu")[grad].numpy()

    weights = from_graph(g, net.parameters, spec)
    def f(w):
        return float(torch.sin(spec.reference(torch.tensor(xv), [(w, weights[0][1]), weights[1]])).sum())
    eps, numeric = 1e-6, np.zeros_like(weights[0][0])
    for idx in np.ndindex(*numeric.shape):
        d = np.zeros_like(numeric)
        d[idx] = eps
        numeric[idx] = (f(weights[0][0] + d) - f(weights[0][0] - d)) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def test_adam_fits_and_trained_weights_run_in_the_kernel():
    from stitchml.shader.kernels import mlp_rows

    spec = MLPSpec((2, 16, 1), ("tanh", "none"), "float32", PROGRAM)
    g = sm.Graph()
    net = MLP(g, spec, rng=np.random.default_rng(5), name="fit")
    x = g.placeholder((-1, 2), sm.float32, name="x")
    t = g.placeholder((-1, 1), sm.float32, name="t")
    loss = g.reduction_mean(g.square(net(x) - t))
    steps = optim.Adam(0.05).minimize(g, loss, net.parameters)
    rng = np.random.default_rng(6)
    xv = rng.uniform(-1, 1, (256, 2)).astype(np.float32)
    tv = (np.sin(3 * xv[:, :1]) * xv[:, 1:]).astype(np.float32)
    losses = [g.run({x: xv, t: tv}, [loss], steps, device="cpu")[loss].item() for _ in range(120)]
    assert losses[-1] < 0.02 * losses[0]  # measured: 0.385 -> 0.0019

    device = "cuda" if torch.cuda.is_available() else "cpu"
    got = mlp_rows(torch.tensor(xv, device=device), net.pack(device), spec).cpu().double()
    want = g.run({x: xv}, [net(x)], device="cpu")
    np.testing.assert_allclose(got.numpy(), list(want.values())[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.numpy(), spec.reference(torch.tensor(xv), net.weights()).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_build_errors_name_the_composite():
    g, net, x = _graph(SPEC)
    with pytest.raises(ShapeError, match=r"mlp: .*needs 6 parameters"):
        mlp(g, x, SPEC, net.parameters[:4])
    swapped = [net.parameters[1], net.parameters[0]] + net.parameters[2:]
    with pytest.raises(ShapeError, match=r"mlp: layer 0 of .* expects weights \(3, 5\)"):
        mlp(g, x, SPEC, swapped)
    with pytest.raises(ShapeError, match="mlp: expected an MLPSpec, got tuple"):
        mlp(g, x, (3, 5), net.parameters)


def test_doctest():
    failures, tried = doctest.testmod(network)
    assert tried and not failures
