"""Gradients built with `graph.gradients`, checked against torch.autograd and finite differences.

Generic over the op database (tests/opdb): every differentiable record's
float64 samples, the gradient of ``sum(output * w)`` (w random) against
torch.autograd on the record's reference, and against central finite
differences of our own forward along random directions; the same with -1
extents; second order (the gradient of a gradient) where the record asks for
it. Then the rules of autodiff itself: broadcasting undone, fan-out,
pruning, what `wrt` may be, paths that carry no gradient.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.registry import REGISTRY

from opdb import OPS, build, expected
from opdb.core import as_outputs, ref_args

F64 = sm.float64
_H = 1e-6  # finite-difference step in float64

# Records checked elsewhere: dropout draws a new mask per run (finite differences see another mask;
# see test_dropout_gradient), and a placeholder is the `wrt` itself.
_CUSTOM = {"dropout", "placeholder"}
DIFFERENTIABLE = [pytest.param(r, id=r.name) for r in OPS.values() if r.differentiable and r.name not in _CUSTOM]
SECOND_ORDER = [pytest.param(r, id=r.name) for r in OPS.values() if r.second_order and r.differentiable]


def _grad_samples(record):
    return [s for s in record.samples_for(F64) if s.grad and any(a.dtype == torch.float64 for a in s.args)]


class Case:
    """One sample's graph with a scalar loss sum(out_i * w_i) and its torch counterpart."""

    def __init__(self, record, sample, mode="static"):
        self.record, self.sample = record, sample
        self.rng = np.random.default_rng(0)
        self.built = build(record, sample, mode)
        # float64 inputs only: a finite-difference step of 1e-6 vanishes in float32.
        self.wrt_index = [i for i, a in enumerate(sample.args) if a.dtype == torch.float64]
        self.wrt = [self.built.inputs[i] for i in self.wrt_index]
        g = self.built.graph
        values = build(record, sample).run(sample.args)  # the outputs' concrete shapes
        self.weights = [torch.as_tensor(self.rng.standard_normal(tuple(v.shape))) for v in values]
        terms = [g.reduction_sum(g.cast(o, F64) * g.constant(w)) for o, w in zip(self.built.outputs, self.weights)]
        self.loss = terms[0]
        for t in terms[1:]:
            self.loss = self.loss + t

    def run(self, targets, args=None):
        return self.built.run(self.sample.args if args is None else args, targets)

    def torch_inputs(self):
        args = ref_args(self.record, self.sample.args)
        return [a.clone().requires_grad_(True) if i in self.wrt_index else a for i, a in enumerate(args)]

    def torch_loss(self, inputs):
        outs = as_outputs(self.record.ref(*inputs, **self.sample.kwargs))
        return sum((o.double() * w).sum() for o, w in zip(outs, self.weights))


def _torch_grad(loss, inputs, create_graph=False):
    if not loss.requires_grad:
        return [torch.zeros_like(x) for x in inputs]
    grads = torch.autograd.grad(loss, inputs, allow_unused=True, create_graph=create_graph)
    return [torch.zeros_like(x) if gr is None else gr for x, gr in zip(inputs, grads)]


def _close(got, want, record, what):
    rtol, atol = record.grad_tol
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def _check_first_order(record, sample, mode):
    case = Case(record, sample, mode)
    grads = case.built.graph.gradients(case.loss, case.wrt)
    got = case.run([grads[t] for t in case.wrt])
    for i, g_ in zip(case.wrt_index, got):
        want_shape = tuple(sample.args[i].shape)
        assert tuple(g_.shape) == want_shape, f"{record.name}: d/d in{i} has shape {tuple(g_.shape)}, not {want_shape}"
    inputs = case.torch_inputs()
    want = _torch_grad(case.torch_loss(inputs), [inputs[i] for i in case.wrt_index])
    for i, (a, b) in enumerate(zip(got, want)):
        _close(a, b, record, f"{record.name} {sample.describe()} ({mode}): d/d in{case.wrt_index[i]} vs torch")
    # Central differences of our own forward along random directions.
    for _ in range(2):
        direction = [torch.as_tensor(case.rng.standard_normal(tuple(sample.args[i].shape))) for i in case.wrt_index]

        def loss_at(step):
            args = list(sample.args)
            for i, d in zip(case.wrt_index, direction):
                args[i] = args[i] + step * d
            return case.run([case.loss], args)[0].item()

        numeric = (loss_at(_H) - loss_at(-_H)) / (2 * _H)
        analytic = sum(float((g_.double() * d).sum()) for g_, d in zip(got, direction))
        assert abs(numeric - analytic) <= 1e-5 * (1 + abs(analytic)), \
            f"{record.name} {sample.describe()} ({mode}): finite differences {numeric} vs gradient {analytic}"


@pytest.mark.parametrize("record", DIFFERENTIABLE)
def test_gradient(record):
    samples = _grad_samples(record)
    assert samples, f"{record.name} is differentiable but has no float64 sample fit for gradients"
    for sample in samples:
        with expected(record.known_failure("gradient", F64, sample.name), f"{record.name} {sample.describe()}"):
            _check_first_order(record, sample, "static")


@pytest.mark.parametrize("record", [p for p in DIFFERENTIABLE if p.values[0].dynamic and p.values[0].inputs ==
                                    "placeholder"])
def test_gradient_with_unknown_extents(record):
    samples = [s for s in _grad_samples(record) if s.dynamic is not False]
    for sample in samples[:3]:
        with expected(record.known_failure("gradient", F64, f"{sample.name}/dynamic"), f"{record.name} dynamic"):
            _check_first_order(record, sample, "dynamic")


@pytest.mark.parametrize("record", [p for p in DIFFERENTIABLE if p.values[0].unranked and p.values[0].inputs ==
                                    "placeholder"])
def test_gradient_with_unknown_rank(record):
    samples = [s for s in _grad_samples(record) if s.unranked]
    for sample in samples[:2]:
        with expected(record.known_failure("gradient", F64, f"{sample.name}/unranked"), f"{record.name} unranked"):
            _check_first_order(record, sample, "unranked")


@pytest.mark.parametrize("record", SECOND_ORDER)
def test_second_order(record):
    checked = 0
    for sample in _grad_samples(record):
        with expected(record.known_failure("second_order", F64, sample.name), f"{record.name} {sample.describe()}"):
            case = Case(record, sample)
            g = case.built.graph
            first = g.gradients(case.loss, case.wrt)
            w2 = [torch.as_tensor(case.rng.standard_normal(tuple(sample.args[i].shape))) for i in case.wrt_index]
            terms = [g.reduction_sum(first[t] * g.constant(w)) for t, w in zip(case.wrt, w2)]
            loss2 = terms[0]
            for t in terms[1:]:
                loss2 = loss2 + t
            second = g.gradients(loss2, case.wrt)
            got = case.run([second[t] for t in case.wrt])
            inputs = case.torch_inputs()
            wrt = [inputs[i] for i in case.wrt_index]
            grads = _torch_grad(case.torch_loss(inputs), wrt, create_graph=True)
            want = _torch_grad(sum((gr * w).sum() for gr, w in zip(grads, w2)), wrt)
            for a, b in zip(got, want):
                _close(a, b, record, f"{record.name} {sample.describe()}: second order")
        checked += 1
    assert checked


@pytest.mark.parametrize("record", [pytest.param(r, id=r.name) for r in OPS.values() if not r.differentiable
                                    and F64 in r.dtypes and r.name not in _CUSTOM and _grad_samples(r)])
def test_no_gradient_flows(record):
    """Ops marked differentiable=False pass no gradient to their floating inputs."""
    case = Case(record, _grad_samples(record)[0])
    grads = case.built.graph.gradients(case.loss, case.wrt)
    for value in case.run([grads[t] for t in case.wrt]):
        assert not value.any(), f"{record.name} passed a gradient"


def test_every_primitive_has_a_gradient_rule_or_says_it_has_none():
    missing = [name for name, prim in REGISTRY.items() if prim.vjp is None and prim.differentiable]
    assert not missing, f"primitives with neither a vjp nor differentiable=False: {missing}"


def test_einsum_gradient_needs_the_rank_of_an_operand_with_labels_before_the_ellipsis():
    """The one case the einsum rule refuses (stitchml/ops/scan.py), while building, saying why."""
    g = sm.Graph()
    x, y = g.placeholder(None, F64), g.placeholder((4,), F64)
    loss = g.reduction_sum(g.einsum("i...j,j->i...", x, y))
    with pytest.raises(sm.GraphError, match=r"einsum .*operand 0 \(placeholder_0\) has labels before '...' "
                                            r"\('i...j'\) and an unknown rank"):
        g.gradients(loss, [x])
    x3 = g.placeholder((-1, -1, 4), F64)
    grad = g.gradients(g.reduction_sum(g.einsum("i...j,j->i...", x3, y)), [x3])[x3]
    xv, yv = np.random.default_rng(4).standard_normal((2, 3, 4)), np.arange(4.0)
    (got,) = _run(g, {x3: xv, y: yv}, grad)
    np.testing.assert_array_equal(got, np.broadcast_to(yv, (2, 3, 4)))


def test_power_gradient_at_zero_base():
    """d/dx x**y is y x**(y-1), which PyTorch takes as 0 where y == 0 (not 0 * inf); d/dy is 0 at x == 0."""
    x, y = np.array([0.0, 0.0, 0.0, 2.0]), np.array([0.0, 1.0, 2.0, 0.0])
    g = sm.Graph()
    px, py = g.placeholder((4,), F64), g.placeholder((4,), F64)
    grads = g.gradients(g.reduction_sum(px ** py), [px, py])
    got = g.run({px: x, py: y}, [grads[px], grads[py]], device="cpu")
    tx, ty = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
    want = torch.autograd.grad((tx ** ty).sum(), [tx, ty])
    for t, w in zip((px, py), want):
        np.testing.assert_array_equal(got[grads[t]].numpy(), w.numpy())


# -- the rules of autodiff ------------------------------------------------------------------------
def _run(g, feeds, *targets):
    out = g.run(feeds, list(targets), device="cpu")
    return [out[t].numpy() for t in targets]


def test_broadcasting_is_undone_with_unknown_extents():
    g = sm.Graph()
    a, b = g.placeholder((-1, 1), F64), g.placeholder((-1,), F64)
    c = g.placeholder((), F64)
    loss = g.reduction_sum((a * b + c) ** 2)
    grads = g.gradients(loss, [a, b, c])
    for n, m in ((3, 4), (2, 1), (5, 2)):
        av, bv, cv = np.random.rand(n, 1), np.random.rand(m), np.array(0.5)
        ga, gb, gc = _run(g, {a: av, b: bv, c: cv}, grads[a], grads[b], grads[c])
        ta, tb, tc = (torch.tensor(v, requires_grad=True) for v in (av, bv, cv))
        want = torch.autograd.grad(((ta * tb + tc) ** 2).sum(), [ta, tb, tc])
        for got, w in zip((ga, gb, gc), want):
            assert got.shape == tuple(w.shape)
            np.testing.assert_allclose(got, w.numpy(), rtol=1e-12)


def test_fan_out_accumulates():
    g = sm.Graph()
    x = g.placeholder((3,), F64)
    loss = g.reduction_sum(x * x + g.sin(x) + x)
    (grad,) = _run(g, {x: np.array([0.5, -1.0, 2.0])}, g.gradients(loss, [x])[x])
    v = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(grad, 2 * v + np.cos(v) + 1, rtol=1e-12)


def test_ops_off_the_path_get_no_gradient_ops():
    def gradient_ops(with_branch):
        g = sm.Graph()
        x, w = g.placeholder((2, 3), F64), g.variable(np.ones((3, 2)))
        loss = g.reduction_sum(g.tanh(x @ w))
        if with_branch:
            other = g.placeholder((4,), F64)
            loss = loss + g.reduction_sum(g.exponent(g.sin(other)))  # depends on neither x nor w
        before = len(g.operations)
        g.gradients(loss, [w])
        new = g.operations[before:]
        assert all(op.scope.startswith("gradients") for op in new)
        return [op.op for op in new]

    assert gradient_ops(True) == gradient_ops(False)
    assert "cos" not in gradient_ops(True) and "exponent" not in gradient_ops(True)


@pytest.mark.parametrize("kind", ["variable", "placeholder", "intermediate"])
def test_wrt_variable_placeholder_or_intermediate(kind):
    g = sm.Graph()
    x = g.placeholder((3,), F64)
    w = g.variable(np.array([1.0, 2.0, 3.0]))
    h = x * w
    loss = g.reduction_sum(g.sin(h))
    target = {"variable": w, "placeholder": x, "intermediate": h}[kind]
    grad = g.gradients(loss, [target])[target]
    xv = np.array([0.1, -0.4, 0.3])
    (got,) = _run(g, {x: xv}, grad)
    hv = xv * np.array([1.0, 2.0, 3.0])
    want = {"variable": np.cos(hv) * xv, "placeholder": np.cos(hv) * np.array([1.0, 2.0, 3.0]),
            "intermediate": np.cos(hv)}[kind]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_integer_and_comparison_paths_carry_no_gradient():
    g = sm.Graph()
    x = g.placeholder((4,), F64)
    through_int = g.cast(g.cast(x * 3.0, sm.int32), F64)
    mask = g.cast(x > 0.0, F64)
    loss = g.reduction_sum(through_int * x + mask * x + g.cast(g.reduction_arg_maximum(x, 0), F64))
    xv = np.array([0.7, -1.2, 2.5, 0.1])
    (got,) = _run(g, {x: xv}, g.gradients(loss, [x])[x])
    np.testing.assert_allclose(got, np.trunc(xv * 3.0) + (xv > 0), rtol=1e-12)


def test_gradients_of_a_subset_of_variables():
    g = sm.Graph()
    x = g.placeholder((2, 3), F64)
    w1, w2, w3 = g.variable(np.full((3, 3), 0.1)), g.variable(np.full((3, 3), 0.2)), g.variable(np.full((3,), 0.3))
    loss = g.reduction_sum(g.tanh(g.tanh(x @ w1) @ w2 + w3))
    grads = g.gradients(loss, [w1, w3])
    assert set(grads) == {w1, w3}
    xv = np.random.default_rng(1).standard_normal((2, 3))
    got = _run(g, {x: xv}, grads[w1], grads[w3])
    tx = torch.tensor(xv)
    t1, t2, t3 = (torch.tensor(g.variable_value(v).numpy(), requires_grad=True) for v in (w1, w2, w3))
    want = torch.autograd.grad(torch.tanh(torch.tanh(tx @ t1) @ t2 + t3).sum(), [t1, t3])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-12)


def test_wrt_off_the_path_gets_zeros():
    g = sm.Graph()
    x, unused = g.placeholder((2,), F64), g.placeholder((-1, 3), F64)
    grads = g.gradients(g.reduction_sum(x * x), [unused])
    (got,) = _run(g, {x: np.ones(2), unused: np.ones((4, 3))}, grads[unused])
    np.testing.assert_array_equal(got, np.zeros((4, 3)))


def test_gradient_errors():
    g = sm.Graph()
    x, i = g.placeholder((2,), F64), g.placeholder((2,), sm.int32)
    with pytest.raises(sm.GraphError, match="only floating-point tensors have gradients"):
        g.gradients(g.reduction_sum(i), [x])
    with pytest.raises(sm.GraphError, match="cannot differentiate with respect to"):
        g.gradients(g.reduction_sum(x), [i])
    with pytest.raises(sm.GraphError, match="expected tensors of this graph"):
        g.gradients(g.reduction_sum(x), [sm.Graph().placeholder((2,), F64)])


def test_dropout_gradient():
    """Within one run the gradient is the mask scaled by 1 / (1 - rate): output / input where the input is nonzero."""
    g = sm.Graph()
    x = g.placeholder((50, 40), F64)
    y = g.dropout(x, 0.3, seed=11)
    grad = g.gradients(g.reduction_sum(y), [x])[x]
    xv = np.random.default_rng(2).uniform(0.5, 1.5, (50, 40))
    out, got = _run(g, {x: xv}, y, grad)
    np.testing.assert_allclose(got, np.where(out != 0, 1 / 0.7, 0.0), rtol=1e-12)
    assert 0.25 < (got == 0).mean() < 0.35


def test_unused_outputs_of_a_multi_output_op_get_zero_cotangents():
    g = sm.Graph()
    x = g.placeholder((2, 6), F64)
    first, _, third = g.split(x, 3, axis=1)
    loss = g.reduction_sum(g.sin(first)) + g.reduction_sum(third * third)
    xv = np.random.default_rng(3).standard_normal((2, 6))
    (got,) = _run(g, {x: xv}, g.gradients(loss, [x])[x])
    want = np.concatenate([np.cos(xv[:, :2]), np.zeros((2, 2)), 2 * xv[:, 4:]], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_gradients_keep_each_input_dtype():
    g = sm.Graph()
    h, w = g.placeholder((3,), sm.float16), g.variable(np.array([0.5, -1.0, 2.0], np.float32))
    loss = g.reduction_sum(g.cast(h, sm.float32) * w)
    grads = g.gradients(loss, [h, w])
    assert grads[h].dtype is sm.float16 and grads[w].dtype is sm.float32
    hv = np.array([1.0, 2.0, -3.0], np.float16)
    gh, gw = _run(g, {h: hv}, grads[h], grads[w])
    np.testing.assert_array_equal(gh, np.array([0.5, -1.0, 2.0], np.float16))
    np.testing.assert_array_equal(gw, hv.astype(np.float32))
