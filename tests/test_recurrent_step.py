"""The generation step (passes/recurrent.py "lstm_step", codegen/lstm_step.py): both LSTM layers and the
draw of a token in one kernel.

Its persistent form synchronises its programs with a grid barrier, which only a CUDA device can run
(benchmarks/tune_lstm.py checks it there against the unfused compile, token for token). Here, under
Triton's interpreter: the same stages as three kernels against NumPy in float64, when the pass applies
and when it refuses (with its reason), and that the persistent kernel, whose programs the interpreter
runs one after another, gives up its bounded wait and raises a typed error instead of hanging.
"""
from __future__ import annotations

import numpy as np
import pytest

import stitchml as sm
from stitchml.demos import lstm

pytestmark = pytest.mark.usefixtures("triton_interpreter")

BATCH, EMBED, HIDDEN, VOCAB, STEPS = 3, 5, 16, 11, 4


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _step_graph():
    """The demo's sampling step as a graph of its own: embed the token, two layers, the tempered draw."""
    g = sm.Graph("step")
    params = lstm.init_parameters(VOCAB, HIDDEN, EMBED, seed=5)
    weights = {name: g.placeholder(v.shape, sm.float32, name=name) for name, v in params.items()}
    token = g.placeholder((BATCH,), sm.int64, name="token")
    state = [g.placeholder((BATCH, HIDDEN), sm.float32, name=f"s{k}") for k in range(4)]
    noise = g.placeholder((STEPS, BATCH, VOCAB), sm.float32, name="noise")
    i = g.placeholder((), sm.int32, name="i")
    scale = g.placeholder((), sm.float32, name="scale")
    new = lstm.lstm_step(g, g.gather(weights["embedding"], token, axis=0), state, weights)
    logits = g.matrix_multiplication(new[-2], weights["output/weights"]) + weights["output/bias"]
    drawn = g.reduction_arg_maximum(logits * scale + g.gather(noise, i, axis=0), axis=-1)
    rng = np.random.default_rng(6)
    feeds = {weights[k]: v for k, v in params.items()}
    feeds.update({token: np.array([3, -1, 10]), noise: rng.gumbel(size=(STEPS, BATCH, VOCAB)).astype(np.float32),
                  i: np.int32(2), scale: np.float32(1.25)})
    feeds.update({s: rng.standard_normal((BATCH, HIDDEN)).astype(np.float32) for s in state})
    return g, feeds, new + [drawn], (params, token, state, noise, i, scale)


def _numpy(feeds, params, token, state, noise, i, scale):
    p = {k: v.astype(np.float64) for k, v in params.items()}
    x = p["embedding"][feeds[token]]
    out = []
    for layer in range(2):
        h, c = (feeds[s].astype(np.float64) for s in state[2 * layer:2 * layer + 2])
        gates = x @ p[f"lstm{layer}/weights_ih"].T + h @ p[f"lstm{layer}/weights_hh"].T + p[f"lstm{layer}/bias"]
        gi, gf, gg, go = np.split(gates, 4, axis=-1)
        c = _sigmoid(gf) * c + _sigmoid(gi) * np.tanh(gg)
        x = _sigmoid(go) * np.tanh(c)
        out += [x, c]
    logits = (x @ p["output/weights"] + p["output/bias"]) * float(feeds[scale]) + feeds[noise][feeds[i]]
    return out + [np.argmax(logits, axis=-1)]


def _kinds(exe) -> list[str]:
    return [s.kind for s in exe.steps if s.kind != "view"]


def test_the_split_step_is_one_fusion_that_matches_numpy():
    g, feeds, outs, parts = _step_graph()
    exe = g.compile(feeds, outs, device="cpu", options={"lstm_step_fusion": "split", "lstm_step_units": 4})
    assert _kinds(exe) == ["lstm_step"]
    assert "three kernels (split), 4 programs of 4 hidden units" in exe.fusion_report()
    got = exe.run(feeds)
    want = _numpy(feeds, *parts)
    for t, w in zip(outs[:4], want[:4]):
        np.testing.assert_allclose(got[t].numpy(), w, rtol=2e-5, atol=2e-5)
    assert got[outs[4]].numpy().tolist() == want[4].tolist()
    feeds[parts[4]] = np.int32(STEPS)  # the draws' row out of range: raised as the gather would
    with pytest.raises(sm.ExecutionError, match="an index out of range"):
        exe.run(feeds)


def test_the_persistent_step_never_waits_forever_and_raises_a_typed_error():
    g, feeds, outs, _ = _step_graph()
    exe = g.compile(feeds, outs, device="cpu", options={"lstm_step_fusion": "persistent", "lstm_step_spin": 3})
    assert _kinds(exe) == ["lstm_step"]
    source = next(s for s in exe.steps if s.kind == "lstm_step").source
    for bounded in ('sem="acquire", scope="gpu"', "(spins < SPIN)", 'cache_modifier=".cg"', "tl.debug_barrier()"):
        assert bounded in source
    # the interpreter runs program 0 to its end before program 1 starts: the barrier cannot complete
    for _ in range(2):  # and the second run, its sync words left half way, refuses at once
        with pytest.raises(sm.ExecutionError, match="grid barrier of the persistent generation step timed out"):
            exe.run(feeds)


def test_the_pass_says_why_the_step_is_not_fused():
    g, feeds, outs, _ = _step_graph()
    exe = g.compile(feeds, outs, device="cpu")
    assert _kinds(exe) == ["lstm_cell", "lstm_cell", "product_arg_max"]
    assert "lstm_step not applied: its grid barrier needs every program resident at once" in exe.fusion_report()
    exe = g.compile(feeds, outs, device="cpu", options={"lstm_step_fusion": "persistent", "lstm_step_units": 1,
                                                        "sm_count": 8})
    assert _kinds(exe) == ["lstm_cell", "lstm_cell", "product_arg_max"]
    assert "lstm_step not applied: 16 programs of 1 units exceed the 8 SMs" in exe.fusion_report()
    exe = g.compile(feeds, outs, device="cpu", options={"lstm_step_fusion": False})
    assert "lstm_step not applied: turned off (option lstm_step_fusion)" in exe.fusion_report()
    with pytest.raises(sm.GraphError, match="lstm_step_fusion expects True, False, 'persistent' or 'split', got 2"):
        g.compile(feeds, outs, device="cpu", options={"lstm_step_fusion": 2})


def test_a_second_layer_reading_the_first_layers_cell_state_is_left_as_three_kernels():
    """Layer 2's cell state is layer 1's c': the step would read it where another program writes it."""
    g = sm.Graph()
    x, h, c = (g.placeholder((1, 8), sm.float32, name=n) for n in "xhc")
    w, v = (g.placeholder((32, 8), sm.float32, name=n) for n in "wv")
    out = g.placeholder((8, 5), sm.float32, name="out")
    h1, c1 = g.lstm_cell(x, h, c, w, w)
    h2, c2 = g.lstm_cell(h1, h, c1, v, v)
    token = g.reduction_arg_maximum(g.matrix_multiplication(h2, out), axis=-1)
    rng = np.random.default_rng(7)
    feeds = {t: rng.standard_normal(t.shape).astype(np.float32) for t in (x, h, c, w, v, out)}
    exe = g.compile(feeds, [h2, c2, token], device="cpu", options={"lstm_step_fusion": "split"})
    assert _kinds(exe) == ["lstm_cell", "lstm_cell", "product_arg_max"]
    assert "lstm_step not applied: an operand of the later kernels is computed from a cell's results" in \
        exe.fusion_report()
