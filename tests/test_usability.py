"""What a new user runs into first: device names, gradients of non-scalars, completion handlers.

The CLI's own behaviour is in tests/test_cli.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.tensor_data import available_devices, resolve_device


# -- devices --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpu", "mps", "cpu:1", "cuda0", "", "CUDA"])
def test_an_unknown_device_says_which_are_accepted_and_present(name):
    g = sm.Graph()
    x = g.placeholder((2,), sm.float32)
    with pytest.raises(sm.DeviceError, match=r'expected "cpu", "cuda" or "cuda:N"; this machine has: cpu') as e:
        g.run({x: np.ones(2, np.float32)}, [x], device=name)
    assert repr(name) in str(e.value)
    assert isinstance(e.value, ValueError) and isinstance(e.value, sm.StitchError)
    with pytest.raises(sm.DeviceError):
        sm.TensorData(np.ones(2), device=name)


def test_a_cuda_device_that_is_not_present():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    missing = [f"cuda:{count}"] + ([] if count else ["cuda"])
    for name in missing:
        with pytest.raises(sm.DeviceError, match=r"was asked for but this machine has.*cpu") as e:
            resolve_device(name)
        assert repr(name) in str(e.value)
    assert available_devices() == ["cpu"] + [f"cuda:{i}" for i in range(count)]


def test_accepted_device_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")


# -- gradients of non-scalars --------------------------------------------------------------------
F64 = sm.float64


def test_gradients_of_a_non_scalar_need_an_initial_gradient():
    g = sm.Graph()
    x = g.placeholder((4, 3), F64, name="x")
    y = g.sin(x)
    with pytest.raises(sm.GraphError, match=r"gradients: `of` \(sin_1, built at .*test_usability.py:\d+\) has "
                                            r"shape \(4, 3\), not a scalar; .*give initial_gradient"):
        g.gradients(y, [x])
    with pytest.raises(sm.GraphError, match=r"initial_gradient \(v\) has shape \(3, 4\); expected the shape of "
                                            r"`of` \(sin_1\), \(4, 3\)"):
        g.gradients(y, [x], initial_gradient=g.placeholder((3, 4), F64, name="v"))
    with pytest.raises(sm.GraphError, match=r"initial_gradient \(k\) is int32; expected a floating-point tensor"):
        g.gradients(y, [x], initial_gradient=g.placeholder((4, 3), sm.int32, name="k"))
    with pytest.raises(sm.GraphError, match="initial_gradient must be a tensor of this graph"):
        g.gradients(y, [x], initial_gradient=sm.Graph().placeholder((4, 3), F64))
    # A reduction of an unknown rank over every axis is a scalar, so it needs none.
    u = g.placeholder(None, F64, name="u")
    du = g.gradients(g.reduction_sum(g.sin(u)), [u])[u]
    uv = np.random.default_rng(0).standard_normal((2, 3))
    np.testing.assert_allclose(g.run({u: uv}, [du], device="cpu")[du].numpy(), np.cos(uv), rtol=1e-12)


@pytest.mark.parametrize("batch", [(4,), (-1,)], ids=["static", "unknown extent"])
def test_initial_gradient_gives_the_vector_jacobian_product(batch):
    """Against torch.autograd.grad with grad_outputs, in float64, through a broadcast bias."""
    rng = np.random.default_rng(5)
    xv, wv, bv, vv = (rng.standard_normal(s) for s in ((4, 5), (5, 3), (3,), (4, 3)))
    g = sm.Graph()
    x = g.placeholder((*batch, 5), F64, name="x")
    v = g.placeholder((*batch, 3), F64, name="v")
    w, b = g.variable(wv, name="w"), g.variable(bv, name="b")
    y = g.tanh(x @ w) * 2.0 + b
    grads = g.gradients(y, [x, w, b], initial_gradient=v)
    got = g.run({x: xv, v: vv}, [grads[t] for t in (x, w, b)], device="cpu")
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (xv, wv, bv))
    want = torch.autograd.grad(torch.tanh(tx @ tw) * 2.0 + tb, [tx, tw, tb], grad_outputs=torch.tensor(vv))
    for t, expected in zip((x, w, b), want):
        np.testing.assert_allclose(got[grads[t]].numpy(), expected.numpy(), rtol=1e-12, atol=1e-14)


def test_a_scalar_initial_gradient_scales_the_gradient():
    g = sm.Graph()
    x = g.placeholder((3,), F64)
    loss = g.reduction_sum(x * x)
    dx = g.gradients(loss, [x], initial_gradient=g.constant(np.float32(0.5)))[x]
    assert dx.dtype is F64
    np.testing.assert_allclose(g.run({x: np.array([1.0, -2.0, 3.0])}, [dx], device="cpu")[dx].numpy(),
                               [1.0, -2.0, 3.0], rtol=1e-15)


# -- asynchronous runs ------------------------------------------------------------------------------
def _graph():
    g = sm.Graph()
    x = g.placeholder((2,), sm.float32)
    return g, x, x * 2.0


@pytest.mark.parametrize("ending", ["wait", "result", "exception", "done"])
def test_the_completion_handler_has_run_when_the_handle_says_the_run_ended(ending):
    """A slow handler: wait(), result() and exception() return only after it, and done() is False until then."""
    import time

    g, x, y = _graph()
    seen = []

    def slow(results, error):
        time.sleep(0.3)
        seen.append(results[y].numpy().tolist())

    handle = g.run_async({x: np.ones(2, np.float32)}, [y], device="cpu", on_complete=slow)
    if ending == "wait":
        assert handle.wait(timeout=30)
    elif ending == "result":
        assert handle.result(timeout=30)[y].numpy().tolist() == [2.0, 2.0]
    elif ending == "exception":
        assert handle.exception(timeout=30) is None
    else:
        while not handle.done():
            time.sleep(0.01)
    assert seen == [[2.0, 2.0]]
    assert handle.handler_exception() is None


def test_a_handler_that_raises_is_logged_and_kept_on_the_handle(caplog):
    g, x, y = _graph()

    def broken(results, error):
        raise KeyError("bad handler")

    with caplog.at_level("ERROR", logger="stitchml"):
        handle = g.run_async({x: np.ones(2, np.float32)}, [y], device="cpu", on_complete=broken)
        assert handle.wait(timeout=30)
    assert isinstance(handle.handler_exception(), KeyError)
    assert handle.result()[y].numpy().tolist() == [2.0, 2.0]  # the run itself succeeded
    assert "completion handler" in caplog.text and "bad handler" in caplog.text
    # The queue goes on: the next run and its handler work.
    after = g.run_async({x: np.zeros(2, np.float32)}, [y], device="cpu")
    assert after.result(timeout=30)[y].numpy().tolist() == [0.0, 0.0]
