"""Control flow (stitchml/ops/control.py, passes/control.py) beyond the op database's generic checks:
blocks that read enclosing graphs, nesting, gradients of nested loops against torch.autograd and
float64 finite differences, compiled runs (the Triton interpreter) against eager ones with each block
compiled once, and the errors a block can cause."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
import stitchml.passes as passes

F64 = sm.float64


def _nested(g, x, w, n):
    """for i < n: v = if sum(v) > 0 then tanh(v * w) else v + (for j < i: u = u * 0.5 + w)."""
    def inner(i, v):
        halves = g.for_loop(0, i, 1, v, lambda j, u: u * 0.5 + w)
        return g.if_then_else(g.reduction_sum(v) > 0.0, lambda: g.tanh(v * w), lambda: v + halves)

    return g.for_loop(0, n, 1, x, inner)


def _nested_torch(x, w, n):
    v = x
    for i in range(n):
        u = v
        for _ in range(i):
            u = u * 0.5 + w
        v = torch.tanh(v * w) if v.sum() > 0 else v + u
    return v


def _inputs():
    rng = np.random.default_rng(7)
    return rng.standard_normal((2, 3)), rng.standard_normal((3,))


def test_nested_blocks_read_the_enclosing_graphs():
    g = sm.Graph()
    x, w = g.placeholder((2, 3), F64, name="x"), g.placeholder((3,), F64, name="w")
    y = _nested(g, x, w, 5)
    xv, wv = _inputs()
    got = g.run({x: xv, w: wv}, [y], device="cpu")[y].numpy()
    np.testing.assert_allclose(got, _nested_torch(torch.tensor(xv), torch.tensor(wv), 5).numpy(), rtol=1e-12)
    # The inner loop reads w from two graphs out: through a capture of the outer body, then its own.
    outer_body = y.op.attrs["body"]
    assert [t.name for t in outer_body.graph.captures] == ["w"]
    assert y.op.inputs[-1] is w


def test_gradients_of_nested_loops_and_branches_match_torch_and_finite_differences():
    g = sm.Graph()
    x, w = g.placeholder((2, 3), F64, name="x"), g.placeholder((3,), F64, name="w")
    y = _nested(g, x, w, 4)
    loss = g.reduction_sum(y * y)
    grads = g.gradients(loss, [x, w])
    xv, wv = _inputs()
    got = g.run({x: xv, w: wv}, [grads[x], grads[w]], device="cpu")
    xt, wt = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    want = torch.autograd.grad((_nested_torch(xt, wt, 4) ** 2).sum(), [xt, wt])
    for a, b in zip((got[grads[x]].numpy(), got[grads[w]].numpy()), want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-9, atol=1e-12)
    rng = np.random.default_rng(1)
    dx, dw = rng.standard_normal(xv.shape), rng.standard_normal(wv.shape)

    def at(h):
        return g.run({x: xv + h * dx, w: wv + h * dw}, [loss], device="cpu")[loss].numpy()

    numeric = (at(1e-6) - at(-1e-6)) / 2e-6
    analytic = float((got[grads[x]].numpy() * dx).sum() + (got[grads[w]].numpy() * dw).sum())
    assert abs(numeric - analytic) <= 1e-6 * (1 + abs(analytic))


def test_compiled_loops_compile_each_block_once_and_match_eager(monkeypatch):
    g = sm.Graph()
    x, w = g.placeholder((2, 3), F64, name="x"), g.placeholder((3,), F64, name="w")
    n = g.placeholder((), sm.int32, name="n")  # a data-dependent trip count
    y = _nested(g, x, w, n)
    z = g.while_loop(y, lambda v: (g.reduction_sum(g.absolute(v)) < 50.0, v), lambda v: v * 1.5 + 0.1)
    dx = g.gradients(g.reduction_sum(_nested(g, x, w, 3) ** 2.0), [x])[x]
    compiles = []
    real = passes.run_pipeline
    monkeypatch.setattr(passes, "run_pipeline", lambda p, ctx: compiles.append(p) or real(p, ctx))
    exe = g.compile({x: sm.TensorType((2, 3), F64), w: sm.TensorType((3,), F64), n: sm.TensorType((), sm.int32)},
                    [y, z, dx], device="cpu")
    assert any(s.kind == "control" for s in exe.steps)
    compiled = len(compiles)
    xv, wv = _inputs()
    for count in (0, 1, 6):
        feeds = {x: xv, w: wv, n: np.array(count, np.int32)}
        got = exe.run(feeds)
        want = g.run(feeds, [y, z, dx], device="cpu", compiled=False)
        for t in (y, z, dx):
            np.testing.assert_allclose(got[t].numpy(), want[t].numpy(), rtol=1e-12, atol=1e-14, err_msg=t.name)
    assert len(compiles) == compiled, "a run compiled a block again"


def test_compiled_for_loop_reports_a_bad_step_as_eager_does():
    g = sm.Graph()
    x, s = g.placeholder((2,), F64, name="x"), g.placeholder((), sm.int32, name="s")
    y = g.for_loop(0, 3, s, x, lambda i, v: v + 1.0)
    exe = g.compile({x: sm.TensorType((2,), F64), s: sm.TensorType((), sm.int32)}, [y], device="cpu")
    with pytest.raises(sm.ExecutionError, match=r"for_loop \(for_loop_\d+, built at .*test_control_flow.py.*step "
                                                r"must be positive, got 0"):
        exe.run({x: np.zeros(2), s: np.array(0, np.int32)})


def test_blocks_are_pure():
    g = sm.Graph()
    x = g.placeholder((2,), sm.float32, name="x")
    with pytest.raises(sm.GraphError, match="random_uniform .* is a random draw; .*draw random values before"):
        g.for_loop(0, 2, 1, x, lambda i, v: v + g.random_uniform((2,)))
    with pytest.raises(sm.GraphError, match="is a placeholder"):
        g.if_then_else(g.constant(True), lambda: g.placeholder((2,)), lambda: x)
    inside = []
    g.for_loop(0, 2, 1, x, lambda i, v: inside.append(v * 2.0) or inside[0])
    with pytest.raises(sm.GraphError, match="another graph"):
        g.exponent(inside[0])  # a block's tensor does not leak out of it


def test_while_loop_gradients_with_a_tensor_both_blocks_read():
    """Both blocks read w: its gradient sums both uses, once each (torch.autograd on the same loop)."""
    g = sm.Graph()
    x, w = g.placeholder((3,), F64, name="x"), g.placeholder((3,), F64, name="w")
    y, u = g.while_loop(x, lambda v: (g.reduction_sum(g.absolute(v)) < 20.0, [v, v * w]),
                        lambda v, u: g.tanh(u) * 3.0 + v * w)
    grads = g.gradients(g.reduction_sum(y * u), [x, w])
    xv, wv = np.array([0.3, 0.5, -0.2]), np.array([1.5, -0.7, 2.0])
    got = g.run({x: xv, w: wv}, [grads[x], grads[w]], device="cpu")
    xt, wt = torch.tensor(xv, requires_grad=True), torch.tensor(wv, requires_grad=True)
    v, trips = xt, 0
    while v.abs().sum() < 20.0:
        v, trips = torch.tanh(v * wt) * 3.0 + v * wt, trips + 1
    assert trips == 3
    want = torch.autograd.grad((v * (v * wt)).sum(), [xt, wt])
    np.testing.assert_allclose(got[grads[x]].numpy(), want[0].numpy(), rtol=1e-10)
    np.testing.assert_allclose(got[grads[w]].numpy(), want[1].numpy(), rtol=1e-10)


def test_text_dump_shows_the_blocks():
    g = sm.Graph()
    x = g.placeholder((2,), sm.float32, name="x")
    g.for_loop(0, 2, 1, x, lambda i, v: g.tanh(v))
    text = str(g)
    assert 'body=graph "graph/body" {' in text and "tanh(%carried0)" in text


def test_loop_graph_buffers_carry_values_as_the_plain_loop_does():
    """The CUDA loop's buffer handling (runtime/blocks.py, LoopGraphs), run without capture: iterations
    alternate between two buffer sets, a body returning an input as is gets it copied, and any trip
    count, on the first (warm-up) run and on later ones, ends where the op-by-op loop ends."""
    from stitchml.passes import CompileContext, extract, run_pipeline
    from stitchml.runtime.blocks import BlockRun, LoopGraphs

    g = sm.Graph()
    x, w = g.placeholder((2, 3), F64, name="x"), g.placeholder((3,), F64, name="w")
    n = g.placeholder((), sm.int32, name="n")
    # Carried: a new value, an input passed through unchanged, and a counter.
    y = g.for_loop(0, n, 1, [x, w, g.constant(0, sm.int32)], lambda i, v, u, k: [g.tanh(v * u) + 0.1, u, k + i])
    body = y[0].op.attrs["body"]
    types = [sm.TensorType((), sm.int32), x.type, w.type, sm.TensorType((), sm.int32)]
    ctx = CompileContext(device=torch.device("cpu"), backend="reference")  # the buffers are what is tested
    program = run_pipeline(extract(body.graph, dict(zip(body.inputs, types)), body.outputs, []), ctx)
    block = BlockRun(program, ctx, body.inputs)
    assert sorted(block.writes_into) == [0, 2]  # w comes back as is: copied, not written
    xv, wv = (torch.as_tensor(a) for a in _inputs())
    start = [xv, wv, torch.tensor(0, dtype=torch.int32)]
    for counts in ((0, 3), (1, 18), (2, 1, 17)):  # a first run warms up, the later ones start warm
        loop = LoopGraphs(block, torch.zeros((), dtype=torch.int32), start, [], 1, capture=False)
        for count in counts:
            got = loop.run(0, count, start, [])
            want = g.run({x: xv.numpy(), w: wv.numpy(), n: np.array(count, np.int32)}, y, device="cpu")
            for a, t in zip(got, y):
                np.testing.assert_allclose(a.numpy(), want[t].numpy(), rtol=1e-12, err_msg=f"{t.name}, {count}")
