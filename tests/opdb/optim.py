"""Records of the optimizer update rules (stitchml/optim.py): stochastic_gradient_descent,
stochastic_gradient_descent_momentum and adam.

References are the update formulas of torch.optim's documentation (SGD with dampening 0,
Adam with L2 or decoupled weight decay and AMSGrad), written out in float64. Hyperparameters
are Python floats in the sample's keyword arguments, or scalar tensors: the names listed in
``tensors`` are the sample's last args.
"""
from __future__ import annotations

import torch

import stitchml as sm

from .core import FLOATS, ErrorInput, OpInfo, P, Sample, make

_HYPER = ("learning_rate", "momentum", "beta1", "beta2", "epsilon", "beta1_power", "beta2_power")


def _unpack(args, kwargs):
    """(state and gradient tensors, hyperparameters by name, other keywords)."""
    kw = dict(kwargs)
    names = kw.pop("tensors", ())
    cut = len(args) - len(names)
    hyper = {n: kw.pop(n) for n in _HYPER if n in kw}
    hyper.update(zip(names, args[cut:]))
    return list(args[:cut]), hyper, kw


def _rule_samples(states, hyper, cases):
    """`states`: (low, high) per state tensor, gradient last; `cases`: (name, keywords, hyperparameters
    given as tensors). Each case on a matrix fed other sizes, then a vector, a zero-size and a transposed one."""
    def gen(record, dtype, rng):
        def tensors(shape, layout="contiguous"):
            return tuple(make(shape, dtype, rng, *bounds, layout=layout) for bounds in states)

        for name, kwargs, given in cases:
            scalars = tuple(make((), dtype, rng, hyper[n] * 0.9, hyper[n]) for n in given)
            yield Sample(tensors((2, 3)) + scalars, {**hyper, **kwargs, "tensors": given}, name=name,
                         more=(tensors((4, 1)) + scalars,), unranked=not given)
        yield Sample(tensors((5,)), dict(hyper), name="vector", more=(tensors((2,)),))
        yield Sample(tensors((0, 3)), dict(hyper), name="zero-size")
        yield Sample(tensors((3, 4), "transposed"), dict(hyper), name="transposed")

    return gen


# -- stochastic_gradient_descent ------------------------------------------------------------------
def _sgd_build(g, *args, **kwargs):
    (values, gradient), h, kw = _unpack(args, kwargs)
    return g.stochastic_gradient_descent(h["learning_rate"], values, gradient, **kw)


def _sgd_ref(*args, **kwargs):
    (values, gradient), h, kw = _unpack(args, kwargs)
    return values - h["learning_rate"] * (gradient + kw.get("weight_decay", 0.0) * values)


def _momentum_build(g, *args, **kwargs):
    (values, velocity, gradient), h, kw = _unpack(args, kwargs)
    return g.stochastic_gradient_descent_momentum(h["learning_rate"], h["momentum"], values, velocity, gradient, **kw)


def _momentum_ref(*args, **kwargs):
    """torch.optim.SGD, dampening 0: b = mu b + g; step = g + mu b (Nesterov) or b."""
    (values, velocity, gradient), h, kw = _unpack(args, kwargs)
    d = gradient + kw.get("weight_decay", 0.0) * values
    velocity = h["momentum"] * velocity + d
    step = d + h["momentum"] * velocity if kw.get("nesterov") else velocity
    return values - h["learning_rate"] * step, velocity


# -- adam --------------------------------------------------------------------------------------------
def _adam_build(g, *args, **kwargs):
    (values, m, v, gradient, *maximum), h, kw = _unpack(args, kwargs)
    return g.adam(*(h[n] for n in _HYPER if n != "momentum"), values, m, v, gradient,
                  maximum_velocity=maximum[0] if maximum else None, **kw)


def _adam_ref(*args, **kwargs):
    """torch.optim.Adam / AdamW for step t, where beta1_power = beta1**t and beta2_power = beta2**t."""
    (values, m, v, gradient, *maximum), h, kw = _unpack(args, kwargs)
    lr, decay = h["learning_rate"], kw.get("weight_decay", 0.0)
    if kw.get("decoupled_weight_decay"):
        values = values * (1 - lr * decay)
    else:
        gradient = gradient + decay * values
    m = h["beta1"] * m + (1 - h["beta1"]) * gradient
    v = h["beta2"] * v + (1 - h["beta2"]) * gradient * gradient
    second = torch.maximum(maximum[0], v) if maximum else v
    denominator = second.sqrt() / (1 - h["beta2_power"]) ** 0.5 + h["epsilon"]
    return [values - lr / (1 - h["beta1_power"]) * m / denominator, m, v] + ([second] if maximum else [])


_ADAM_HYPER = {"learning_rate": 0.5, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8, "beta1_power": 0.9 ** 3,
               "beta2_power": 0.999 ** 3}
_VALUES, _GRADIENT, _SIGNED, _POSITIVE = (-3.0, 3.0), (-3.0, 3.0), (-1.0, 1.0), (0.5, 2.0)


def _adam_samples(record, dtype, rng):
    yield from _rule_samples([_VALUES, _SIGNED, _POSITIVE, _GRADIENT], _ADAM_HYPER, [
        ("plain", {}, ()), ("l2", {"weight_decay": 0.1}, ()),
        ("decoupled", {"weight_decay": 0.1, "decoupled_weight_decay": True}, ()),
        ("tensors", {}, ("learning_rate", "beta1_power", "beta2_power"))])(record, dtype, rng)
    # AMSGrad: the maximum velocity is the last state tensor; some elements keep it, others take v.
    for name, given in (("amsgrad", ()), ("amsgrad-tensors", ("beta2", "epsilon"))):
        scalars = tuple(make((), dtype, rng, _ADAM_HYPER[n] * 0.9, _ADAM_HYPER[n]) for n in given)
        yield Sample(tuple(make((2, 3), dtype, rng, *b) for b in (_VALUES, _SIGNED, _POSITIVE, _GRADIENT, _POSITIVE))
                     + scalars, {**_ADAM_HYPER, "tensors": given}, name=name, unranked=not given)


def _errors(build, states, extra=None):
    """Operands that are not floating point or not like the values, and hyperparameters that are not scalars."""
    def errors():
        like = (P((2, 3)),) * (states - 1)
        return [ErrorInput((P((2, 3), sm.int32),) + like, match="values must be a floating-point tensor", build=build),
                ErrorInput((P((2, 3)),) + like[:-1] + (P((3,)),), match="must be float32[2,3] like the values",
                           build=build),
                ErrorInput((P((2, 3)),) + like[:-1] + (P((2, 3), sm.float64),), match="got in{}: float64[2,3]"
                           .format(states - 1), build=build),
                ErrorInput((P((2, 3)),) + like + (P((1,)),), {"tensors": ("learning_rate",)}, build=build,
                           match="learning_rate must be a scalar tensor (shape ()), got shape (1,)"),
                ErrorInput((P((2, 3)),) + like, {"learning_rate": "0.1"}, build=build,
                           match="learning_rate must be a number or a scalar tensor, got str")] + (extra or [])

    return errors


_SGD_HYPER = {"learning_rate": 0.5}
_MOMENTUM_HYPER = {"learning_rate": 0.5, "momentum": 0.9}

RECORDS = [
    OpInfo("stochastic_gradient_descent",
           _rule_samples([_VALUES, _GRADIENT], _SGD_HYPER, [("plain", {}, ()), ("l2", {"weight_decay": 0.1}, ()),
                                                           ("tensor", {}, ("learning_rate",))]),
           _sgd_ref, FLOATS, build=_sgd_build, second_order=True,
           errors=_errors(lambda g, *args, **kw: _sgd_build(g, *args, **{**_SGD_HYPER, **kw}), 2),
           equivalent="torch.optim.SGD (one step, no momentum)"),
    OpInfo("stochastic_gradient_descent_momentum",
           _rule_samples([_VALUES, _SIGNED, _GRADIENT], _MOMENTUM_HYPER, [
               ("plain", {}, ()), ("nesterov-l2", {"nesterov": True, "weight_decay": 0.1}, ()),
               ("tensors", {}, ("learning_rate", "momentum"))]),
           _momentum_ref, FLOATS, build=_momentum_build, second_order=True,
           errors=_errors(lambda g, *args, **kw: _momentum_build(g, *args, **{**_MOMENTUM_HYPER, **kw}), 3),
           equivalent="torch.optim.SGD (one step, momentum, dampening 0)"),
    OpInfo("adam", _adam_samples, _adam_ref, FLOATS, build=_adam_build, second_order=True,
           errors=_errors(lambda g, *args, **kw: _adam_build(g, *args, **{**_ADAM_HYPER, **kw}), 4, [
               ErrorInput((P((2, 3)),) * 4 + (P((2, 2)),), {**_ADAM_HYPER}, build=_adam_build,
                          match="got in4: float32[2,2]")]),
           equivalent="torch.optim.Adam / AdamW (one step; amsgrad)"),
]
