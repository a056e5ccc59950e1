"""Composite operations: Python functions of primitives.

They get gradients and fusion for free; each builds its ops inside a scope of
its own name, so dumps and the debugger show which ops belong to which
composite. A composite becomes a primitive only when a hand-written kernel
beats what fusion makes of it.

Half-precision inputs (float16, bfloat16) are computed in float32 and rounded
once at the end, as PyTorch does: each composite casts up where it starts and
back where it ends (`_upcast`, `_back`), so eager rounds once instead of after
every primitive, and the compiler fuses both casts into the composite's kernel.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import dtypes
from .errors import ShapeError
from .ir import UNKNOWN, Tensor, normalize_axes, normalize_axis
from .registry import builder


def composite(fn):
    """Register `fn(graph, ...)` as a Graph method whose ops are scoped under its name.

    A build error inside names the composite first ("softmax: reduction_maximum:
    axis 2 is out of range..."), so the user sees the op they called.
    """
    name = fn.__name__

    def build(g, *args, **kwargs):
        with g.scope(name):
            try:
                return fn(g, *args, **kwargs)
            except ShapeError as e:
                if str(e).startswith(f"{name}:"):
                    raise
                raise ShapeError(f"{name}: {e}") from None

    build.__name__ = fn.__name__
    build.__doc__ = fn.__doc__
    build.__wrapped__ = fn  # inspect.signature (and tools/graph_methods.py) read the real signature
    builder(fn.__name__, composite=True)(build)
    return fn


def _float(g, x):
    x = g.as_tensor(x)
    return x if x.dtype.is_floating else g.cast(x, dtypes.default_float)


_HALF = (dtypes.float16, dtypes.bfloat16)


def _upcast(g, x):
    """Tensor `x` in the type a composite computes in: half types in float32 (Python numbers stay weak)."""
    return g.cast(x, dtypes.float32) if isinstance(x, Tensor) and x.dtype in _HALF else x


def _upcast_like(g, t, like):
    """`_upcast` of an operand (gamma, beta, statistics) that broadcasts against the float32 tensor `like`.

    Cast after broadcasting: the cast then has the kernel's shape and fuses into it (a cast of a smaller
    operand would be a kernel of its own); the broadcast is a view the kernel reads with strides.
    """
    if not (isinstance(t, Tensor) and t.dtype in _HALF):
        return t
    if t.shape is not None and like.shape is not None and len(t.shape) <= len(like.shape) and all(
            a == 1 or a == b for a, b in zip(reversed(t.shape), reversed(like.shape))):
        return g.cast(g.broadcast_to(t, like), dtypes.float32)
    return g.cast(t, dtypes.float32)


def _back(g, y, dtype):
    """A composite's float32 result `y` rounded once to the caller's half type `dtype`."""
    return g.cast(y, dtype) if y.dtype != dtype else y


# -- activations ----------------------------------------------------------------
@composite
def gelu(g, x, approximate="none"):
    """GeLU: ``0.5 x (1 + erf(x / sqrt 2))``, or the tanh approximation with approximate="tanh"."""
    x = _float(g, x)
    if approximate not in ("none", "tanh"):
        raise g._error("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}", [x])
    dtype, x = x.dtype, _upcast(g, x)
    if approximate == "tanh":
        with g.scope("tanh"):  # the compiler hands this exact form to cuBLASLt's GELU epilogue
            inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
            return _back(g, 0.5 * x * (1.0 + g.tanh(inner)), dtype)
    return _back(g, 0.5 * x * (1.0 + g.erf(x * (1.0 / math.sqrt(2.0)))), dtype)


@composite
def silu(g, x):
    """SiLU (swish): ``x * sigmoid(x)``."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    return _back(g, x * g.sigmoid(x), dtype)


@composite
def softplus(g, x, beta=1.0, threshold=20.0):
    """``log(1 + exp(beta x)) / beta``, linear above `threshold` (as PyTorch)."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    bx = x * beta
    safe = g.minimum(bx, threshold)
    return _back(g, g.select(bx > threshold, x, g.logarithm(1.0 + g.exponent(safe)) / beta), dtype)


@composite
def leaky_relu(g, x, alpha=0.01):
    """``x`` where positive, else ``alpha * x``."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    return _back(g, g.select(x > 0, x, x * alpha), dtype)


# -- softmax family ---------------------------------------------------------------
@composite
def softmax(g, x, axis=-1):
    """``exp(x - max) / sum(exp(x - max))`` along `axis`."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    m = g.stop_gradient(g.reduction_maximum(x, axis, keep_dims=True))
    e = g.exponent(x - m)
    return _back(g, e / g.reduction_sum(e, axis, keep_dims=True), dtype)


@composite
def log_sum_exp(g, x, axes=-1, keep_dims=False):
    """``log(sum(exp(x)))`` over `axes`, computed stably."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    m = g.stop_gradient(g.reduction_maximum(x, axes, keep_dims=True))
    # Where the maximum is infinite (a slice of -inf, say) shift by 0, not inf - inf = NaN: torch.logsumexp's rule.
    m = g.select(g.is_finite(m), m, 0.0)
    s = g.logarithm(g.reduction_sum(g.exponent(x - m), axes, keep_dims=keep_dims))
    # The reduction over m's extent-1 axes drops them without needing the rank (squeeze does).
    return _back(g, s + (m if keep_dims else g.reduction_maximum(m, axes)), dtype)


@composite
def log_softmax(g, x, axis=-1):
    """``x - log(sum(exp(x)))`` along `axis`, computed stably."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    return _back(g, x - log_sum_exp(g, x, axis, keep_dims=True), dtype)


@composite
def softmax_cross_entropy(g, logits, labels, axis=-1, reduction="sum"):
    """Cross entropy of softmax(logits) against `labels` (MPSGraph softMaxCrossEntropy).

    `labels` are probabilities shaped like `logits`, or integer class indices
    (one-hot encoded along `axis`). `reduction`: "none", "sum" or "mean" over
    the remaining axes.
    """
    logits = _float(g, logits)
    labels = g.as_tensor(labels)
    if reduction not in ("none", "sum", "mean"):
        raise g._error("softmax_cross_entropy", f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}",
                       [logits, labels])
    if labels.dtype.is_integer:
        if logits.rank is None or logits.shape[axis] == UNKNOWN:
            raise g._error("softmax_cross_entropy", "integer labels need a known class count along the axis",
                           [logits, labels])
        labels = g.one_hot(labels, logits.shape[axis], axis=axis, dtype=logits.dtype)
    dtype, logits = logits.dtype, _upcast(g, logits)
    if labels.dtype != logits.dtype:
        labels = g.cast(labels, logits.dtype)
    losses = -g.reduction_sum(labels * log_softmax(g, logits, axis), axis)
    if reduction != "none":
        losses = g.reduction_sum(losses) if reduction == "sum" else g.reduction_mean(losses)
    return _back(g, losses, dtype)


# -- statistics and normalization -------------------------------------------------
@composite
def variance(g, x, axes=None, keep_dims=False):
    """Population variance ``mean((x - mean(x))**2)`` over `axes` (MPSGraph variance)."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    d = x - g.reduction_mean(x, axes, keep_dims=True)
    return _back(g, g.reduction_mean(d * d, axes, keep_dims=keep_dims), dtype)


@composite
def normalization(g, x, mean, variance, gamma=None, beta=None, epsilon=1e-5):
    """``(x - mean) / sqrt(variance + epsilon) * gamma + beta`` (MPSGraph normalization)."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    y = (x - _upcast_like(g, mean, x)) * g.reverse_square_root(_upcast_like(g, variance, x) + epsilon)
    if gamma is not None:
        y = y * _upcast_like(g, gamma, y)
    if beta is not None:
        y = y + _upcast_like(g, beta, y)
    return _back(g, y, dtype)


@composite
def layer_normalization(g, x, axes=-1, gamma=None, beta=None, epsilon=1e-5):
    """Normalize over `axes` with the statistics of each sample (torch LayerNorm over the last axes)."""
    x = _float(g, x)
    dtype, x = x.dtype, _upcast(g, x)
    mean = g.reduction_mean(x, axes, keep_dims=True)
    var = variance(g, x, axes, keep_dims=True)
    return _back(g, normalization(g, x, mean, var, _upcast_like(g, gamma, x), _upcast_like(g, beta, x), epsilon),
                 dtype)


def _training_flag(g, op, training, inputs):
    """`training` as a Python bool (decided while building) or a scalar bool tensor (decided at run time)."""
    if isinstance(training, Tensor):
        if not training.dtype.is_bool or training.shape != ():
            raise g._error(op, f"training must be a bool or a scalar bool tensor, got a tensor {training.type}",
                           [*inputs, training])
        return training
    if isinstance(training, (bool, np.bool_)):
        return bool(training)
    raise g._error(op, f"training must be a bool or a scalar bool tensor, got {type(training).__name__}", inputs)


def _statistics_shape(g, x, axes):
    """The keep-dims shape of statistics over `axes` of `x`: 1 on `axes`, the extent elsewhere."""
    shape = tuple(1 if a in axes else x.shape[a] for a in range(x.rank))
    if shape.count(UNKNOWN) > 1:
        raise g._error("batch_normalization", f"running statistics need the extents off axes {axes} known "
                                              f"(at most one -1)", [x])
    return shape


@composite
def batch_normalization(g, x, axes=None, gamma=None, beta=None, epsilon=1e-5, channel_axis=1, *,
                        running_mean=None, running_variance=None, momentum=0.1, training=True):
    """Normalize over `axes` (default: all but `channel_axis`) with the batch's or the running statistics.

    gamma and beta broadcast against `x`; give them shape (C, 1, 1) for NCHW. As torch's BatchNorm:
    with `training` True the batch's mean and (biased) variance normalize; with False, `running_mean`
    and `running_variance` (any shape of C elements: (C,) as torch, or (C, 1, 1)); a scalar bool tensor
    (a placeholder fed each run) chooses at run time. Without running statistics the result is `y`.
    With them it is ``(y, updates)``: `updates` assign ``(1 - momentum) running + momentum batch`` to the
    two variables (the batch variance unbiased, as torch), or keep them in inference; pass them as target
    operations. Python False builds no updates (an empty list).

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph()
    >>> x = g.placeholder((-1, 2, 3, 3), sm.float32, name="x")
    >>> mean, var = g.variable(np.zeros(2, np.float32)), g.variable(np.ones(2, np.float32))
    >>> y, updates = g.batch_normalization(x, running_mean=mean, running_variance=var)
    >>> _ = g.run({x: np.ones((4, 2, 3, 3), np.float32)}, [y], updates)
    >>> g.variable_value(mean).numpy().tolist()
    [0.10000000149011612, 0.10000000149011612]
    """
    x = _float(g, x)
    if axes is None:
        if x.rank is None:
            raise g._error("batch_normalization", "axes=None needs a tensor of known rank", [x])
        c = g._checked("batch_normalization", [x], normalize_axis, channel_axis, x.rank)
        axes = tuple(a for a in range(x.rank) if a != c)
    training = _training_flag(g, "batch_normalization", training, [x])
    running = (running_mean, running_variance)
    if (running_mean is None) != (running_variance is None):
        raise g._error("batch_normalization", "give both running_mean and running_variance, or neither", [x])
    if running_mean is None and training is not True:
        raise g._error("batch_normalization", "inference (training not True) needs running_mean and "
                                              "running_variance", [x])
    if not 0.0 <= momentum <= 1.0:
        raise g._error("batch_normalization", f"momentum must be in [0, 1], got {momentum}", [x])
    dtype, x = x.dtype, _upcast(g, x)
    gamma, beta = _upcast_like(g, gamma, x), _upcast_like(g, beta, x)
    if training is not False:
        mean = g.reduction_mean(x, axes, keep_dims=True)
        var = variance(g, x, axes, keep_dims=True)
        y = normalization(g, x, mean, var, gamma, beta, epsilon)
    if running_mean is None:
        return _back(g, y, dtype)
    if x.rank is None:
        raise g._error("batch_normalization", "running statistics need a tensor of known rank", [x])
    axes = g._checked("batch_normalization", [x], normalize_axes, axes, x.rank)
    shape = _statistics_shape(g, x, axes)
    stored_mean, stored_var = (_upcast(g, g.reshape(g.as_tensor(t), shape)) for t in running)
    inferred = normalization(g, x, stored_mean, stored_var, gamma, beta, epsilon)
    if training is False:
        return _back(g, inferred, dtype), []
    if isinstance(training, Tensor):
        y = g.select(training, y, inferred)
    # torch keeps the unbiased variance n / (n - 1) var; one element per channel has none, and keeps var.
    n = g.element_count(x, axes, dtype=x.dtype)
    unbiased = var * (n / g.maximum(n - 1.0, 1.0))
    updates = []
    for stored, batch, variable in ((stored_mean, mean, running_mean), (stored_var, unbiased, running_variance)):
        new = g.stop_gradient((1.0 - momentum) * stored + momentum * batch)
        if isinstance(training, Tensor):
            new = g.select(training, new, stored)
        updates.append(g.assign_variable(variable, g.cast(g.reshape(new, variable), variable.dtype)))
    return _back(g, y, dtype), updates


# -- regularization ----------------------------------------------------------------
@composite
def dropout(g, x, rate, seed=None, training=True):
    """Zero each element with probability `rate`, scale the rest by 1 / (1 - rate).

    A new mask is drawn at every run (see ops/random.py). As torch.nn.functional.dropout, `training`
    False is the identity; a scalar bool tensor (a placeholder fed each run) chooses at run time.
    """
    x = _float(g, x)
    if not 0.0 <= rate < 1.0:
        raise g._error("dropout", f"rate must be in [0, 1), got {rate}", [x])
    training = _training_flag(g, "dropout", training, [x])
    if rate == 0.0 or training is False:
        return g.identity(x)
    keep = g.random_uniform(x, seed=seed, dtype=x.dtype) >= rate
    # The scale is rounded once, with the product, not first to a half type.
    dropped = _back(g, g.select(keep, _upcast(g, x) * (1.0 / (1.0 - rate)), 0.0), x.dtype)
    return dropped if training is True else g.select(training, dropped, x)


# -- recurrent cells -------------------------------------------------------------------
@composite
def lstm_cell(g, x, h, c, weights_ih, weights_hh, bias=None):
    """One LSTM step, PyTorch's layout: weights (4H, in) with gates i, f, g, o; returns (h, c).

    ``gates = x @ W_ihᵀ + h @ W_hhᵀ + bias``; ``c' = f c + i g``; ``h' = o tanh(c')``. As PyTorch's
    cell, the matrix products run in the operands' type (they accumulate in float32 and round once);
    the gates are summed and activated in float32.
    """
    products = (g.matrix_multiplication(x, weights_ih.T), g.matrix_multiplication(h, weights_hh.T))
    operands = [g.as_tensor(t) for t in (*products, c, bias) if t is not None]
    dtype = functools.reduce(dtypes.promote, (t.dtype for t in operands))
    gates = _upcast(g, products[0]) + _upcast(g, products[1])
    c = _upcast(g, g.as_tensor(c))
    if bias is not None:
        gates = gates + _upcast_like(g, bias, gates)
    i, f, gg, o = g.split(gates, 4, axis=-1)
    c_next = g.sigmoid(f) * c + g.sigmoid(i) * g.tanh(gg)
    h_next = g.sigmoid(o) * g.tanh(c_next)
    if dtype not in _HALF:
        return h_next, c_next
    return _back(g, h_next, dtype), _back(g, c_next, dtype)
