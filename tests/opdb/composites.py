"""Records of the composites (stitchml/composites.py): activations, the softmax
family, cross entropy, statistics and normalizations, dropout and the LSTM
cell. References are torch.nn.functional in float64."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

import stitchml as sm

from .core import ALL, FLOATS, ErrorInput, OpInfo, P, Sample, exact, make, to_float
from .samples import elementwise, shaped


def _activation(name, ref, equivalent, extra_kwargs=({},), **kw):
    """A unary composite: the elementwise samples, once per set of keyword arguments."""
    def gen(record, dtype, rng):
        for kwargs in extra_kwargs:
            suffix = "".join(f"-{v}" for v in kwargs.values())
            for s in elementwise(1, [(-4.0, 4.0)])(record, dtype, rng):
                yield Sample(s.args, dict(kwargs), s.name + suffix, more=s.more)

    return OpInfo(name, gen, ref, ALL, float_only=True, out_dtype=to_float, equivalent=equivalent,
                  second_order=True, **kw)


def _softmax_samples(record, dtype, rng):
    for name, shape, axis in [("last", (2, 5), -1), ("middle", (3, 4, 2), 1), ("vector", (6,), 0),
                              ("zero-size", (0, 5), -1)]:
        yield Sample((make(shape, dtype, rng),), {"axis": axis}, name=name,
                     more=((make((4,) + shape[1:], dtype, rng),),) if len(shape) > 1 else ())
    yield Sample((make((3, 4), dtype, rng, layout="transposed"),), {"axis": 0}, name="transposed")
    if dtype in (sm.float32, sm.float64):
        # Large logits: computed stably (the maximum is subtracted first).
        yield Sample((make((2, 4), dtype, rng, 500.0, 1000.0),), {"axis": -1}, name="large", grad=False)


def _lse_samples(record, dtype, rng):
    for name, shape, kwargs in [("last", (2, 5), {"axes": -1}), ("all", (3, 4), {"axes": None}),
                                ("two-keep", (2, 3, 4), {"axes": (0, 2), "keep_dims": True}),
                                ("zero-size", (0, 5), {"axes": -1})]:
        yield Sample((make(shape, dtype, rng),), kwargs, name=name)
    if dtype.is_floating:
        # A row of -inf: log(sum(exp)) is -inf (as torch.logsumexp), not NaN.
        yield Sample((exact([-math.inf] * 3 + [0.0, 1.0, -2.0], dtype).reshape(2, 3),), {"axes": -1}, name="minus-inf",
                     grad=False)


def _lse_ref(x, axes=-1, keep_dims=False):
    dims = tuple(range(x.dim())) if axes is None else axes
    return torch.logsumexp(x, dim=dims, keepdim=keep_dims)


def _xent_samples(record, dtype, rng):
    for reduction in ("none", "sum", "mean"):
        probs = torch.softmax(torch.as_tensor(rng.standard_normal((4, 5))), -1).to(dtype.torch)
        yield Sample((make((4, 5), dtype, rng), probs), {"reduction": reduction}, name=f"probabilities-{reduction}",
                     more=((make((2, 5), dtype, rng), probs[:2]),))
        yield Sample((make((4, 5), dtype, rng), make((4,), sm.int64, rng, 0, 4)), {"reduction": reduction},
                     name=f"classes-{reduction}", dynamic=((-1, 5), (-1,)), unranked=False,
                     more=((make((7, 5), dtype, rng), make((7,), sm.int64, rng, 0, 4)),))
    yield Sample((make((2, 3, 4), dtype, rng), make((2, 4), sm.int32, rng, 0, 2)), {"axis": 1}, name="axis-1",
                 dynamic=((-1, 3, -1), (-1, -1)), unranked=False)
    yield Sample((make((3, 4), dtype, rng, layout="transposed"), torch.softmax(
        torch.as_tensor(rng.standard_normal((3, 4))), -1).float()), name="float32-labels")


def _xent_ref(logits, labels, axis=-1, reduction="sum"):
    if not labels.dtype.is_floating_point:
        hot = np.expand_dims(labels.numpy(), axis % logits.dim()) == np.arange(logits.shape[axis]).reshape(
            [-1 if a == axis % logits.dim() else 1 for a in range(logits.dim())])
        labels = torch.from_numpy(hot)
    losses = -(labels.to(logits.dtype) * F.log_softmax(logits, dim=axis)).sum(dim=axis)
    return {"none": losses, "sum": losses.sum(), "mean": losses.mean()}[reduction]


def _norm_samples(record, dtype, rng):
    x = make((2, 3, 4), dtype, rng)
    yield Sample((x, make((1, 3, 1), dtype, rng), make((1, 3, 1), dtype, rng, 0.5, 2.0)), name="plain")
    yield Sample((x, make((3, 1), dtype, rng), make((3, 1), dtype, rng, 0.5, 2.0), make((4,), dtype, rng),
                  make((4,), dtype, rng)), {"epsilon": 1e-3}, name="affine",
                 more=((make((5, 3, 4), dtype, rng), make((3, 1), dtype, rng), make((3, 1), dtype, rng, 0.5, 2.0),
                        make((4,), dtype, rng), make((4,), dtype, rng)),))


def _norm_ref(x, mean, var, gamma=None, beta=None, epsilon=1e-5):
    y = (x - mean) / torch.sqrt(var + epsilon)
    y = y * gamma if gamma is not None else y
    return y + beta if beta is not None else y


def _offset(dtype, rng, shape):
    """Data of spread 3 around 1000: the statistics cancel 1000 against itself. Computed in the half type
    itself, layer norm, batch norm and variance lose every digit (layer norm gives zeros)."""
    return make(shape, dtype, rng, 997.0, 1003.0)


def _variance_samples(record, dtype, rng):
    yield from shaped([("all", [(3, 4)], {}), ("axis-keep", [(2, 3, 4)], {"axes": 1, "keep_dims": True}),
                       ("two", [(2, 3, 4)], {"axes": (0, 2)})], layouts=("contiguous", "transposed"))(record, dtype, rng)
    if dtype.is_floating:
        yield Sample((_offset(dtype, rng, (4, 16)),), {"axes": 1}, name="offset-1e3", grad=False)


def _layer_norm_samples(record, dtype, rng):
    yield Sample((_offset(dtype, rng, (4, 16)),), name="offset-1e3", grad=False)
    yield Sample((make((2, 5), dtype, rng), make((5,), dtype, rng), make((5,), dtype, rng)), name="affine",
                 more=((make((3, 5), dtype, rng), make((5,), dtype, rng), make((5,), dtype, rng)),))
    yield Sample((make((2, 3, 4), dtype, rng),), {"axes": (1, 2)}, name="two-axes")
    yield Sample((make((3, 4), dtype, rng, layout="transposed"),), {"epsilon": 0.1}, name="epsilon")


def _layer_norm_build(g, x, *affine, **kwargs):
    gamma, beta = affine if affine else (None, None)
    return g.layer_normalization(x, gamma=gamma, beta=beta, **kwargs)


def _layer_norm_ref(x, *affine, axes=-1, epsilon=1e-5):
    dims = (axes,) if isinstance(axes, int) else axes
    shape = tuple(x.shape[d] for d in dims)
    gamma, beta = affine if affine else (None, None)
    return F.layer_norm(x, shape, gamma, beta, epsilon)


def _batch_norm_samples(record, dtype, rng):
    yield Sample((make((4, 3, 2, 2), dtype, rng), make((3, 1, 1), dtype, rng), make((3, 1, 1), dtype, rng)),
                 name="nchw", unranked=False, more=((make((2, 3, 5, 1), dtype, rng), make((3, 1, 1), dtype, rng),
                                     make((3, 1, 1), dtype, rng)),))
    yield Sample((make((5, 3), dtype, rng),), {"channel_axis": -1}, name="channels-last", unranked=False)
    yield Sample((_offset(dtype, rng, (8, 2)),), {"channel_axis": -1}, name="offset-1e3", unranked=False, grad=False)
    # Inference: the running statistics normalize, shaped (C,) as torch's buffers.
    yield Sample((make((4, 3, 2, 2), dtype, rng), make((3, 1, 1), dtype, rng), make((3, 1, 1), dtype, rng),
                  make((3,), dtype, rng), make((3,), dtype, rng, 0.5, 2.0)), {"training": False}, name="inference",
                 dynamic=((-1, 3, -1, -1), (3, 1, 1), (3, 1, 1), (3,), (3,)), unranked=False)
    # The mode fed at run time; the running statistics are the layer's initial ones (zeros, ones).
    for flag in (True, False):
        yield Sample((make((4, 3, 2, 2), dtype, rng), make((3, 1, 1), dtype, rng), make((3, 1, 1), dtype, rng),
                      torch.tensor(flag)), name=f"training-fed-{flag}",
                     dynamic=((-1, 3, -1, -1), (3, 1, 1), (3, 1, 1), ()), unranked=False)


def _batch_norm_build(g, x, *rest, **kwargs):
    gamma, beta = rest[:2] if rest else (None, None)
    if len(rest) == 4:  # gamma, beta and the running statistics: inference
        y, _ = g.batch_normalization(x, gamma=gamma, beta=beta, running_mean=rest[2], running_variance=rest[3],
                                     **kwargs)
        return y
    if len(rest) == 3:  # gamma, beta and the training flag, with running variables of the graph
        channels = x.shape[1]
        mean = g.variable(np.zeros(channels, x.dtype.numpy), name="running_mean")
        var = g.variable(np.ones(channels, x.dtype.numpy), name="running_variance")
        y, _ = g.batch_normalization(x, gamma=gamma, beta=beta, running_mean=mean, running_variance=var,
                                     training=rest[2], **kwargs)
        return y
    return g.batch_normalization(x, gamma=gamma, beta=beta, **kwargs)


def _batch_norm_ref(x, *rest, channel_axis=1, epsilon=1e-5, training=True):
    c = channel_axis % x.dim()
    moved = x.movedim(c, 1)
    weight, bias = (a.reshape(-1) for a in rest[:2]) if rest else (None, None)
    if len(rest) == 4:  # torch's inference formula (F.batch_norm refuses to differentiate the statistics)
        mean, var = (t.reshape(-1, *[1] * (x.dim() - 2)) for t in rest[2:4])
        w, b = (t.reshape(-1, *[1] * (x.dim() - 2)) for t in (weight, bias))
        return ((moved - mean) / torch.sqrt(var + epsilon) * w + b).movedim(1, c)
    mean = var = None
    if len(rest) == 3:
        mean, var, training = torch.zeros(x.shape[1], dtype=x.dtype), torch.ones(x.shape[1], dtype=x.dtype), bool(rest[2])
    return F.batch_norm(moved, mean, var, weight, bias, training=training, eps=epsilon).movedim(1, c)


def _batch_norm_errors():
    rm, rv = P((3,)), P((3,))
    return [ErrorInput((P(None),), match="needs a tensor of known rank"),
            ErrorInput((P((2, 3)),), {"channel_axis": 4}, match="out of range"),
            ErrorInput((P((2, 3)),), {"training": False}, match="inference (training not True) needs running_mean"),
            ErrorInput((P((2, 3)),), {"training": "yes"}, match="training must be a bool or a scalar bool tensor, got str"),
            ErrorInput((P((2, 3)), P((2,), sm.bool)), build=lambda g, x, t: g.batch_normalization(x, training=t),
                       match="training must be a bool or a scalar bool tensor, got a tensor bool[2]"),
            ErrorInput((P((2, 3)), rm), build=lambda g, x, m: g.batch_normalization(x, running_mean=m),
                       match="give both running_mean and running_variance"),
            ErrorInput((P((2, 3)), rm, rv), build=lambda g, x, m, v: g.batch_normalization(
                x, running_mean=m, running_variance=v, momentum=1.5), match="momentum must be in [0, 1], got 1.5"),
            ErrorInput((P((2, 3)), rm, rv), build=lambda g, x, m, v: g.batch_normalization(
                x, running_mean=m, running_variance=v), op="assign_variable", match="expected a variable")]


def _dropout_samples(record, dtype, rng):
    yield Sample((make((64, 64), dtype, rng, 0.5, 2.0),), {"rate": 0.25, "seed": 5}, name="quarter",
                 more=((make((32, 100), dtype, rng, 0.5, 2.0),),))
    yield Sample((make((3, 4), dtype, rng),), {"rate": 0.0}, name="none")
    yield Sample((make((0, 4), dtype, rng),), {"rate": 0.5, "seed": 1}, name="zero-size")
    yield Sample((make((3, 4), dtype, rng),), {"rate": 0.5, "training": False}, name="inference")
    for flag in (True, False):
        yield Sample((make((64, 64), dtype, rng, 0.5, 2.0), torch.tensor(flag)), {"rate": 0.25, "seed": 2},
                     name=f"training-fed-{flag}", dynamic=((-1, -1), ()), unranked=False)


def _dropout_build(g, x, *flag, **kwargs):
    return g.dropout(x, training=flag[0] if flag else kwargs.pop("training", True), **kwargs)


def _check_dropout(got, x, *flag, rate, seed=None, training=True):
    (value,) = got
    x = x.double()
    training = bool(flag[0]) if flag else training
    if rate == 0 or not training:
        assert torch.equal(value.double(), x), "dropout with rate 0 or not training is the identity"
        return
    scaled = x / (1.0 - rate)
    kept = torch.isclose(value.double(), scaled, rtol=1e-2, atol=0)
    assert (kept | (value == 0)).all(), "every element is dropped or scaled by 1 / (1 - rate)"
    if x.numel() > 1000:
        assert abs((value == 0).double().mean() - rate) < 0.05


def _lstm_samples(record, dtype, rng):
    batch, inputs, hidden = 2, 3, 4
    args = (make((batch, inputs), dtype, rng, -1.0, 1.0), make((batch, hidden), dtype, rng, -1.0, 1.0),
            make((batch, hidden), dtype, rng, -1.0, 1.0), make((4 * hidden, inputs), dtype, rng, -1.0, 1.0),
            make((4 * hidden, hidden), dtype, rng, -1.0, 1.0))
    # The gate split needs the weights' extents; the batch may be unknown.
    dynamic = ((-1, inputs), (-1, hidden), (-1, hidden), (4 * hidden, inputs), (4 * hidden, hidden), (4 * hidden,))
    yield Sample(args + (make((4 * hidden,), dtype, rng),), name="bias", dynamic=dynamic, unranked=False)
    yield Sample(args, name="no-bias", dynamic=dynamic[:5], unranked=False)


def _lstm_ref(x, h, c, w_ih, w_hh, bias=None):
    b_ih = bias if bias is not None else torch.zeros(w_ih.shape[0], dtype=x.dtype)
    return torch._VF.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, torch.zeros_like(b_ih))


RECORDS = [
    _activation("gelu", F.gelu, "torch.nn.functional.gelu", ({}, {"approximate": "tanh"}),
                errors=lambda: [ErrorInput((P((2,)),), {"approximate": "erf"}, match="approximate must be")]),
    _activation("silu", F.silu, "torch.nn.functional.silu"),
    _activation("softplus", F.softplus, "torch.nn.functional.softplus", ({}, {"beta": 2.0, "threshold": 3.0})),
    _activation("leaky_relu", lambda x, alpha=0.01: F.leaky_relu(x, alpha), "torch.nn.functional.leaky_relu",
                ({}, {"alpha": 0.2})),
    OpInfo("softmax", _softmax_samples, lambda x, axis=-1: F.softmax(x, axis), FLOATS, second_order=True,
           equivalent="torch.softmax", errors=lambda: [ErrorInput((P((2, 3)),), {"axis": 2}, match="out of range")]),
    OpInfo("log_softmax", _softmax_samples, lambda x, axis=-1: F.log_softmax(x, axis), FLOATS,
           second_order=True, equivalent="torch.log_softmax",
           errors=lambda: [ErrorInput((P((2, 3)),), {"axis": -3}, match="out of range")]),
    OpInfo("log_sum_exp", _lse_samples, _lse_ref, FLOATS, second_order=True, equivalent="torch.logsumexp",
           errors=lambda: [ErrorInput((P((2, 3)),), {"axes": (0, 0)}, match="name an axis twice")]),
    OpInfo("softmax_cross_entropy", _xent_samples, _xent_ref, FLOATS,
           equivalent="torch.nn.functional.cross_entropy (probabilities or class indices)",
           errors=lambda: [ErrorInput((P((2, 3)), P((2, 3))), {"reduction": "max"}, match="reduction must be"),
                           ErrorInput((P((2, -1)), P((2,), sm.int64)), match="known class count")]),
    OpInfo("variance", _variance_samples,
           lambda x, axes=None, keep_dims=False: torch.var(x, dim=axes, unbiased=False, keepdim=keep_dims),
           ALL, float_only=True, out_dtype=to_float, second_order=True,
           equivalent="np.var / torch.var(unbiased=False)",
           errors=lambda: [ErrorInput((P((2, 3)),), {"axes": 3}, match="out of range")]),
    OpInfo("normalization", _norm_samples, _norm_ref, FLOATS,
           equivalent="(x - mean) / sqrt(var + eps) * gamma + beta",
           build=lambda g, x, mean, var, *affine, **kw: g.normalization(x, mean, var, *affine, **kw),
           errors=lambda: [ErrorInput((P((2, 3)), P((4,)), P((3,))), match="do not broadcast")]),
    OpInfo("layer_normalization", _layer_norm_samples, _layer_norm_ref, FLOATS, build=_layer_norm_build,
           equivalent="torch.nn.functional.layer_norm",
           errors=lambda: [ErrorInput((P((2, 3)),), {"axes": 2}, match="out of range")]),
    OpInfo("batch_normalization", _batch_norm_samples, _batch_norm_ref, FLOATS, build=_batch_norm_build,
           equivalent="torch.nn.functional.batch_norm (training or running statistics)", errors=_batch_norm_errors),
    OpInfo("dropout", _dropout_samples, None, FLOATS, build=_dropout_build, check=_check_dropout,
           equivalent="torch.nn.functional.dropout",
           errors=lambda: [ErrorInput((P((2,)),), {"rate": 1.0}, match="rate must be in [0, 1)")]),
    # Its matrix products round to the input type, as PyTorch's cell: a graph for the tolerance rule.
    OpInfo("lstm_cell", _lstm_samples, _lstm_ref, FLOATS, family="graph", equivalent="torch.nn.LSTMCell",
           errors=lambda: [ErrorInput((P((2, 3)), P((2, 4)), P((2, 4)), P((15, 3)), P((15, 4))),
                                      match="does not split into 4 equal parts")]),
]
