"""Optimizer updates against torch.optim, step by step in float64, with the optimizer state."""
import doctest

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml import optim

STEPS = 6
SHAPES = {"w1": (3, 5), "b1": (5,), "w2": (5, 2), "b2": (2,)}


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s) * 0.7 for k, s in SHAPES.items()}


def _batches(seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((7, 3)), rng.standard_normal((7, 2))) for _ in range(STEPS)]


def _forward(ops, p, x):
    """The same tiny MLP for both frameworks: tanh(x W1 + b1) W2 + b2, squared error summed."""
    return ops.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def _graph_model(weights, dtype=sm.float64):
    g = sm.Graph()
    x = g.placeholder((-1, 3), dtype, name="x")
    y = g.placeholder((-1, 2), dtype, name="y")
    params = {k: g.variable(v.astype(dtype.numpy), name=k) for k, v in weights.items()}
    d = _forward(g, params, x) - y
    return g, x, y, params, g.reduction_sum(d * d)


def _torch_loss(params, x, y):
    d = _forward(torch, params, torch.from_numpy(x)) - torch.from_numpy(y)
    return (d * d).sum()


CASES = {
    "sgd": (lambda: optim.SGD(0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
    "sgd_l2": (lambda: optim.SGD(0.05, weight_decay=0.1), lambda p: torch.optim.SGD(p, lr=0.05, weight_decay=0.1)),
    "momentum": (lambda: optim.SGD(0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    "nesterov_l2": (lambda: optim.SGD(0.03, momentum=0.8, nesterov=True, weight_decay=0.05),
                    lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.8, nesterov=True, weight_decay=0.05)),
    "adam": (lambda: optim.Adam(0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
    "adam_hyper": (lambda: optim.Adam(0.02, beta1=0.5, beta2=0.8, epsilon=1e-3),
                   lambda p: torch.optim.Adam(p, lr=0.02, betas=(0.5, 0.8), eps=1e-3)),
    "adam_l2": (lambda: optim.Adam(0.05, weight_decay=0.3), lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.3)),
    "adamw": (lambda: optim.AdamW(0.05, weight_decay=0.3), lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.3)),
    "amsgrad": (lambda: optim.Adam(0.05, amsgrad=True), lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True)),
}


def _torch_name(role, adam):
    """torch.optim's state key for one of our state roles."""
    return {"velocity": "exp_avg_sq" if adam else "momentum_buffer", "momentum": "exp_avg",
            "maximum_velocity": "max_exp_avg_sq", "step": "step"}[role]


@pytest.mark.parametrize("case", CASES)
def test_matches_torch_optim_step_by_step(case):
    make, make_torch = CASES[case]
    weights = _weights()
    g, x, y, params, loss = _graph_model(weights)
    opt = make()
    updates = opt.minimize(g, loss, list(params.values()))
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    topt = make_torch(list(tparams.values()))
    for step, (xb, yb) in enumerate(_batches(), start=1):
        out = g.run({x: xb, y: yb}, [loss], updates, device="cpu")[loss].item()
        topt.zero_grad()
        tloss = _torch_loss(tparams, xb, yb)
        tloss.backward()
        topt.step()
        assert out == pytest.approx(tloss.item(), rel=1e-12), "the run returns the loss before the update"
        for k, v in params.items():
            np.testing.assert_allclose(g.variable_value(v).numpy(), tparams[k].detach().numpy(), rtol=1e-10,
                                       atol=1e-12, err_msg=f"{case}: {k} after step {step}")
            tstate = topt.state[tparams[k]]
            adam = isinstance(opt, optim.Adam)
            assert {_torch_name(role, adam) for role in opt.state[v]} == {key for key, t in tstate.items() if t is not None}
            for role, var in opt.state[v].items():
                expected = tstate[_torch_name(role, adam)]
                np.testing.assert_allclose(g.variable_value(var).numpy(), np.asarray(expected), rtol=1e-10,
                                           atol=1e-12, err_msg=f"{case}: {role} of {k} after step {step}")
    moved = max(np.abs(g.variable_value(v).numpy() - weights[k]).max() for k, v in params.items())
    assert moved > 1e-2, "the weights must change for the comparison to mean anything"


@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_learning_rate_schedule_fed_as_a_placeholder(kind):
    """A float32 scalar placeholder drives float64 weights; torch changes param_groups' lr."""
    weights = _weights(3)
    g, x, y, params, loss = _graph_model(weights)
    lr = g.placeholder((), sm.float32, name="lr")
    opt = optim.SGD(lr, momentum=0.9) if kind == "momentum" else optim.Adam(lr)
    updates = opt.minimize(g, loss, list(params.values()))
    tparams = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    topt = (torch.optim.SGD(list(tparams.values()), lr=0.0, momentum=0.9) if kind == "momentum"
            else torch.optim.Adam(list(tparams.values()), lr=0.0))
    schedule = np.float32([0.1, 0.05, 0.025, 0.0125, 0.01, 0.005])
    for rate, (xb, yb) in zip(schedule, _batches(4)):
        g.run({x: xb, y: yb, lr: np.float32(rate)}, [loss], updates, device="cpu")
        for group in topt.param_groups:
            group["lr"] = float(rate)
        topt.zero_grad()
        _torch_loss(tparams, xb, yb).backward()
        topt.step()
    for k, v in params.items():
        np.testing.assert_allclose(g.variable_value(v).numpy(), tparams[k].detach().numpy(), rtol=1e-10, atol=1e-12)


def test_float32_weights_train_with_float_hyperparameters():
    weights = _weights(5)
    g, x, y, params, loss = _graph_model(weights, sm.float32)
    updates = optim.Adam(0.01, weight_decay=0.01).minimize(g, loss, list(params.values()))
    tparams = {k: torch.tensor(v.astype(np.float32), requires_grad=True) for k, v in weights.items()}
    topt = torch.optim.Adam(list(tparams.values()), lr=0.01, weight_decay=0.01)
    for xb, yb in _batches(6):
        xb, yb = xb.astype(np.float32), yb.astype(np.float32)
        g.run({x: xb, y: yb}, [loss], updates, device="cpu")
        topt.zero_grad()
        _torch_loss(tparams, xb, yb).backward()
        topt.step()
    for k, v in params.items():
        assert g.variable_value(v).dtype == sm.float32
        np.testing.assert_allclose(g.variable_value(v).numpy(), tparams[k].detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [sm.bfloat16, sm.float16])
def test_half_type_updates_keep_hyperparameters_near_one(dtype):
    """beta2 = 0.999 is 1.0 in bfloat16: the rules compute in float32 and round the results once."""
    g = sm.Graph()
    v, m, s, grad = (g.constant(np.array(a), dtype) for a in ([1.0, -2.0], [0.5, 0.25], [1.0, 0.25], [3.0, -1.0]))
    new_v, new_m, new_s = g.adam(0.1, 0.9, 0.999, 1e-8, 0.9, 0.999, v, m, s, grad)
    sgd_v, sgd_vel = g.stochastic_gradient_descent_momentum(0.1, 0.999, v, s, grad)
    out = g.run({}, [new_v, new_m, new_s, sgd_v, sgd_vel], device="cpu")
    a, d, m0, s0 = np.array([1.0, -2.0]), np.array([3.0, -1.0]), np.array([0.5, 0.25]), np.array([1.0, 0.25])
    m1, s1 = 0.9 * m0 + 0.1 * d, 0.999 * s0 + 0.001 * d * d
    vel = 0.999 * s0 + d
    want = [a - 0.1 / 0.1 * m1 / (np.sqrt(s1) / np.sqrt(0.001) + 1e-8), m1, s1, a - 0.1 * vel, vel]
    for t, w in zip((new_v, new_m, new_s, sgd_v, sgd_vel), want):
        assert t.dtype is dtype
        assert torch.equal(out[t].torch(), torch.from_numpy(w).to(dtype.torch)), (t.name, out[t].torch(), w)


def test_update_rules_as_graph_ops():
    """The builder methods alone, with tensor hyperparameters, against the formulas."""
    g = sm.Graph()
    v = g.variable(np.array([1.0, -2.0, 3.0]), name="v")
    grad = g.constant(np.array([0.5, 0.25, -1.0]))
    lr = g.placeholder((), sm.float64, name="lr")
    sgd = g.stochastic_gradient_descent(lr, v, grad, weight_decay=0.1)
    vel = g.variable(np.array([1.0, 1.0, 1.0]), name="vel")
    mom_v, mom_vel = g.stochastic_gradient_descent_momentum(lr, 0.5, v, vel, grad, nesterov=True)
    m, s = g.constant(np.array([0.1, 0.2, 0.3])), g.constant(np.array([0.01, 0.02, 0.03]))
    adam = g.adam(lr, 0.9, 0.99, 1e-8, 0.9 ** 3, 0.99 ** 3, v, m, s, grad)
    assert len(adam) == 3 and all("adam" in t.op.scope for t in adam)
    out = g.run({lr: np.float64(0.1)}, [sgd, mom_v, mom_vel, *adam], device="cpu")
    a, d = np.array([1.0, -2.0, 3.0]), np.array([0.5, 0.25, -1.0])
    np.testing.assert_allclose(out[sgd].numpy(), a - 0.1 * (d + 0.1 * a), rtol=1e-15)
    np.testing.assert_allclose(out[mom_vel].numpy(), 0.5 + d, rtol=1e-15)
    np.testing.assert_allclose(out[mom_v].numpy(), a - 0.1 * (d + 0.5 * (0.5 + d)), rtol=1e-15)
    m1 = 0.9 * np.array([0.1, 0.2, 0.3]) + 0.1 * d
    s1 = 0.99 * np.array([0.01, 0.02, 0.03]) + 0.01 * d * d
    expected = a - 0.1 / (1 - 0.9 ** 3) * m1 / (np.sqrt(s1) / np.sqrt(1 - 0.99 ** 3) + 1e-8)
    np.testing.assert_allclose(out[adam[0]].numpy(), expected, rtol=1e-14)
    np.testing.assert_allclose(out[adam[1]].numpy(), m1, rtol=1e-15)
    np.testing.assert_allclose(out[adam[2]].numpy(), s1, rtol=1e-15)


def test_errors_say_what_was_expected_and_found():
    g = sm.Graph()
    v = g.variable(np.zeros((2, 3)), name="v")
    with pytest.raises(sm.ShapeError, match=r"stochastic_gradient_descent: .*float64\[2,3\].*float64\[3\]"):
        g.stochastic_gradient_descent(0.1, v, g.constant(np.zeros(3)))
    with pytest.raises(sm.ShapeError, match="adam: .*float32"):
        g.adam(0.1, 0.9, 0.999, 1e-8, 0.9, 0.999, v, v, v, g.constant(np.zeros((2, 3), np.float32)))
    with pytest.raises(sm.ShapeError, match=r"learning_rate must be a scalar tensor .*got shape \(2,\)"):
        g.stochastic_gradient_descent(g.constant(np.ones(2)), v, v)
    with pytest.raises(sm.ShapeError, match="values must be a floating-point tensor"):
        g.stochastic_gradient_descent(0.1, g.variable(np.zeros(2, np.int64)), v)
    loss = g.reduction_sum(v * v)
    with pytest.raises(sm.GraphError, match="SGD.minimize: expected variables of this graph .*placeholder"):
        optim.SGD(0.1).minimize(g, loss, [g.placeholder((2,), sm.float64, name="p")])
    with pytest.raises(sm.GraphError, match="int64; only floating-point variables train"):
        optim.Adam().minimize(g, loss, [g.variable(np.zeros(2, np.int64), name="k")])
    with pytest.raises(sm.GraphError, match="nesterov=True needs a nonzero momentum"):
        optim.SGD(0.1, nesterov=True)


def test_docstring_examples_run():
    import stitchml.optim

    failures, tried = doctest.testmod(stitchml.optim, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
