"""Records of the control-flow ops: if_then_else, while_loop and for_loop.

Each record builds its op with fixed blocks over the sample's tensors (one of
them read by the block from the enclosing graph, a capture), and its reference
runs the same blocks as a Python `if` or loop over PyTorch tensors.
"""
from __future__ import annotations

import torch

import stitchml as sm

from .core import ErrorInput, OpInfo, P, Sample, make

_REAL = (sm.float32, sm.float64)


# -- if_then_else --------------------------------------------------------------------------------
def _if_build(g, predicate, x, w):
    return g.if_then_else(predicate, lambda: x * w + 1.0, lambda: [g.tanh(x) - w])


def _if_ref(predicate, x, w):
    return x * w + 1.0 if bool(predicate) else torch.tanh(x) - w


def _if_samples(record, dtype, rng):
    for taken in (True, False):
        yield Sample((torch.tensor(taken), make((3, 4), dtype, rng), make((4,), dtype, rng)),
                     name=f"{'then' if taken else 'else'}-broadcast",
                     more=((torch.tensor(taken), make((2, 5), dtype, rng), make((5,), dtype, rng)),))


def _if_errors():
    def mixed(g, p, x):
        return g.if_then_else(p, lambda: x, lambda: g.cast(x, sm.int32))

    def counts(g, p, x):
        return g.if_then_else(p, lambda: [x, x], lambda: [x])

    def shapes(g, p, x):
        return g.if_then_else(p, lambda: x, lambda: g.reduction_sum(x, 0))

    return [ErrorInput((P((), sm.float32), P((2,)), P((2,))), match="predicate must be a scalar bool"),
            ErrorInput((P((2,), sm.bool), P((2,)), P((2,))), match="predicate must be a scalar bool"),
            ErrorInput((P((), sm.bool), P((2,))), build=mixed, match="dtype float32 differs from int32"),
            ErrorInput((P((), sm.bool), P((2,))), build=counts, match="then_fn returns 2 tensors and else_fn 1"),
            ErrorInput((P((), sm.bool), P((2, 3))), build=shapes, match="rank 2 (float32[2,3]) differs from rank 1")]


# -- for_loop --------------------------------------------------------------------------------------
def _for_build(g, x, w, lower=0, upper=3, step=1):
    # Carries x and a running sum; reads w from the enclosing graph; uses the index.
    def body(i, v, total):
        v = g.tanh(v * w) + g.cast(i, v.dtype) * 0.25
        return [v, total + g.reduction_sum(v, axes=-1)]

    return g.for_loop(lower, upper, step, [x, g.reduction_sum(x, axes=-1)], body)


def _for_ref(x, w, lower=0, upper=3, step=1):
    v, total = x, x.sum(-1)
    for i in range(lower, upper, step):
        v = torch.tanh(v * w) + i * 0.25
        total = total + v.sum(-1)
    return v, total


def _for_samples(record, dtype, rng):
    for name, kwargs in [("three", {}), ("strided", {"lower": 1, "upper": 6, "step": 2}),
                         ("none", {"lower": 2, "upper": 2})]:
        yield Sample((make((2, 3), dtype, rng), make((3,), dtype, rng)), kwargs, name=name,
                     more=((make((4, 5), dtype, rng), make((5,), dtype, rng)),))


def _for_errors():
    def wrong_dtype(g, x):
        return g.for_loop(0, 2, 1, x, lambda i, v: g.cast(v, sm.float64))

    def wrong_shape(g, x):
        return g.for_loop(0, 2, 1, x, lambda i, v: v[0])

    def float_bound(g, x, upper):
        return g.for_loop(0, upper, 1, x, lambda i, v: v)

    def zero_step(g, x):
        return g.for_loop(0, 2, 0, x, lambda i, v: v)

    def data_step(g, x, step):
        return g.for_loop(0, 2, step, x, lambda i, v: v)

    return [ErrorInput((P((2, 3)),), build=wrong_dtype, match="expected float32[2,3], found float64[2,3]"),
            ErrorInput((P((2, 3)),), build=wrong_shape, match="expected float32[2,3], found float32[3]"),
            ErrorInput((P((2, 3)), P(())), build=float_bound, match="upper must be a scalar int32"),
            ErrorInput((P((2, 3)),), build=zero_step, match="step must be positive, got 0"),
            ErrorInput((P((2,)), P((), sm.int32)), build=data_step, error=sm.ExecutionError,
                       match="step must be positive, got -1",
                       feeds=(torch.zeros(2), torch.tensor(-1, dtype=torch.int32)))]


# -- while_loop ------------------------------------------------------------------------------------
def _while_build(g, x, limit):
    # Doubles x (and counts the doublings) until its absolute sum reaches `limit`; returns x's mean too.
    def before(v, n):
        return g.reduction_sum(g.absolute(v)) < limit, [v, n, g.reduction_mean(v)]

    return g.while_loop([x, g.constant(0, sm.int32)], before, lambda v, n, m: [v * 2.0 + m * 0.0, n + 1])


def _while_ref(x, limit):
    n = 0
    while bool(x.abs().sum() < limit):
        x, n = x * 2.0, n + 1
    return x, torch.tensor(n, dtype=torch.int32), x.mean()


def _while_samples(record, dtype, rng):
    for name, limit in (("several", 40.0), ("none", 0.0)):
        yield Sample((make((2, 3), dtype, rng, 0.5, 1.0), torch.tensor(limit, dtype=dtype.torch)), name=name,
                     more=((make((3, 1), dtype, rng, 0.5, 1.0), torch.tensor(limit, dtype=dtype.torch)),))


def _while_errors():
    def not_bool(g, x):
        return g.while_loop(x, lambda v: (g.reduction_sum(v), v), lambda v: v)

    def vector(g, x):
        return g.while_loop(x, lambda v: (v > 0.0, v), lambda v: v)

    def no_pair(g, x):
        return g.while_loop(x, lambda v: v, lambda v: v)

    def carried(g, x):
        return g.while_loop(x, lambda v: (g.reduction_sum(v) > 0.0, v), lambda v: g.cast(v, sm.int32))

    return [ErrorInput((P((2,)),), build=not_bool, match="predicate before_fn returns must be a scalar bool"),
            ErrorInput((P((2,)),), build=vector, match="found bool[2]"),
            ErrorInput((P((2,)),), build=no_pair, error=sm.GraphError,
                       match="expected it to return (predicate, results)"),
            ErrorInput((P((2,)),), build=carried,
                       match="after_fn result 0 (the loop-carried value 0): expected float32[2]")]


RECORDS = [
    OpInfo("if_then_else", _if_samples, _if_ref, _REAL, build=_if_build, family="graph", errors=_if_errors,
           equivalent="jax.lax.cond / MPSGraph if(_:then:else:)"),
    OpInfo("for_loop", _for_samples, _for_ref, _REAL, build=_for_build, family="graph", errors=_for_errors,
           equivalent="jax.lax.fori_loop / MPSGraph forLoop"),
    OpInfo("while_loop", _while_samples, _while_ref, _REAL, build=_while_build, family="graph", errors=_while_errors,
           out_dtype=lambda dtype, kwargs: (dtype, sm.int32, dtype),
           equivalent="jax.lax.while_loop / MPSGraph whileWithInitialInputs"),
]
