"""The recurrent pass (passes/recurrent.py): an LSTM cell and a product's arg maximum, one kernel each.

Compiled with the Triton interpreter and checked against NumPy in float64 (the broadcast-sum tiles the
kernels use at small batches, and the tl.dot tiles forced by option), plus the near misses that must
leave the ops alone and the index check of a gather read in place.
"""
from __future__ import annotations

import numpy as np
import pytest

import stitchml as sm
from stitchml.demos import lstm

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _cell(x, h, c, w_ih, w_hh, bias):
    gates = x @ w_ih.T + h @ w_hh.T + (0.0 if bias is None else bias)
    i, f, g, o = np.split(gates, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    return _sigmoid(o) * np.tanh(c), c


def _kinds(exe) -> list[str]:
    return [s.kind for s in exe.steps if s.kind != "view"]


def _cell_graph(dtype, batch, inputs, hidden, table, bias):
    g = sm.Graph()
    tab = g.placeholder((table, inputs), dtype, name="table")
    tokens = g.placeholder((batch,), sm.int64, name="tokens")
    h = g.placeholder((batch, hidden), dtype, name="h")
    c = g.placeholder((batch, hidden), dtype, name="c")
    w_ih = g.placeholder((4 * hidden, inputs), dtype, name="w_ih")
    w_hh = g.placeholder((4 * hidden, hidden), dtype, name="w_hh")
    b = g.placeholder((4 * hidden,), dtype, name="b") if bias else None
    h1, c1 = g.lstm_cell(g.gather(tab, tokens, axis=0), h, c, w_ih, w_hh, b)
    h2, c2 = g.lstm_cell(h1, c, c1, w_hh, w_hh)  # the second reads a computed x, no gather, no bias
    return g, (tab, tokens, h, c, w_ih, w_hh, b), (h1, c1, h2, c2)


@pytest.mark.parametrize("options", [{}, {"lstm_dot": True}], ids=["sums", "dot"])
def test_lstm_cells_are_one_kernel_each_and_match_numpy(options):
    batch, inputs, hidden, table = 3, 5, 4, 7
    dtype = sm.float64 if not options else sm.float32  # tl.dot tiles are float32 (IEEE products)
    g, (tab, tokens, h, c, w_ih, w_hh, b), outs = _cell_graph(dtype, batch, inputs, hidden, table, True)
    rng = np.random.default_rng(0)
    np_dtype = np.float64 if dtype == sm.float64 else np.float32
    values = {tab: rng.standard_normal((table, inputs)), tokens: np.array([2, -1, 0]),
              h: rng.standard_normal((batch, hidden)), c: rng.standard_normal((batch, hidden)),
              w_ih: rng.standard_normal((4 * hidden, inputs)), w_hh: rng.standard_normal((4 * hidden, hidden)),
              b: rng.standard_normal(4 * hidden)}
    feeds = {k: v.astype(np_dtype) if k is not tokens else v for k, v in values.items()}
    exe = g.compile(feeds, list(outs), device="cpu", options=options)
    assert _kinds(exe) == ["lstm_cell", "lstm_cell"]
    got = exe.run(feeds)
    f64 = {k: np.asarray(v, np.float64) for k, v in values.items()}
    x = f64[tab][values[tokens]]
    h1, c1 = _cell(x, f64[h], f64[c], f64[w_ih], f64[w_hh], f64[b])
    h2, c2 = _cell(h1, f64[c], c1, f64[w_hh], f64[w_hh], None)
    tol = 1e-12 if dtype == sm.float64 else 2e-5
    for t, want in zip(outs, (h1, c1, h2, c2)):
        np.testing.assert_allclose(got[t].numpy(), want, rtol=tol, atol=tol)


def test_a_gathered_index_out_of_range_raises_as_the_gather_would():
    g, (tab, tokens, h, c, w_ih, w_hh, b), outs = _cell_graph(sm.float32, 2, 3, 4, 5, False)
    feeds = {tab: np.ones((5, 3), np.float32), tokens: np.array([1, 5]), h: np.zeros((2, 4), np.float32),
             c: np.zeros((2, 4), np.float32), w_ih: np.ones((16, 3), np.float32), w_hh: np.ones((16, 4), np.float32)}
    exe = g.compile(feeds, list(outs), device="cpu")
    assert _kinds(exe) == ["lstm_cell", "lstm_cell"]
    with pytest.raises(sm.ExecutionError, match=r"gather .*an index out of range"):
        exe.run(feeds)
    feeds[tokens] = np.array([1, -5])  # negative indices count from the end, as NumPy's take
    np.testing.assert_array_equal(exe.run(feeds)[outs[0]].numpy(),
                                  g.run(feeds, [outs[0]], device="cpu", compiled=False)[outs[0]].numpy())


def test_an_intermediate_read_elsewhere_keeps_the_ops_and_says_why():
    g = sm.Graph()
    x, h, c = (g.placeholder((2, 3), sm.float64, name=n) for n in "xhc")
    w = g.placeholder((12, 3), sm.float64, name="w")
    h1, c1 = g.lstm_cell(x, h, c, w, w)
    gates = next(op for op in g.operations if op.op == "split").inputs[0]
    extra = g.reduction_sum(gates)
    feeds = {t: np.random.default_rng(1).standard_normal(t.shape) for t in (x, h, c, w)}
    exe = g.compile(feeds, [h1, c1, extra], device="cpu")
    assert "lstm_cell" not in _kinds(exe)
    assert any(line.startswith("lstm_cell not applied") and "is read outside the pattern" in line
               for line in exe.fusion_report().splitlines())
    want = _cell(feeds[x], feeds[h], feeds[c], feeds[w], feeds[w], None)
    got = exe.run(feeds)
    np.testing.assert_allclose(got[h1].numpy(), want[0], rtol=1e-12)


def _sample_graph(dtype, batch, depth, vocab, steps):
    """argmax(h @ W + b) * scale + (noise[i] where sampling else 0)): the demo's draw, greedy or Gumbel-max."""
    g = sm.Graph()
    h = g.placeholder((batch, depth), dtype, name="h")
    w = g.placeholder((depth, vocab), dtype, name="w")
    b = g.placeholder((vocab,), dtype, name="b")
    noise = g.placeholder((steps, batch, vocab), dtype, name="noise")
    i = g.placeholder((), sm.int32, name="i")
    scale = g.placeholder((), dtype, name="scale")
    sampling = g.placeholder((), sm.bool, name="sampling")
    z = (g.matrix_multiplication(h, w) + b) * scale + g.select(sampling, g.gather(noise, i, axis=0), 0.0)
    return g, (h, w, b, noise, i, scale, sampling), g.reduction_arg_maximum(z, axis=-1)


@pytest.mark.parametrize("options", [{}, {"arg_max_dot": True}], ids=["sums", "dot"])
def test_the_arg_maximum_of_a_product_is_one_kernel_with_torchs_ties_and_nans(options):
    batch, depth, vocab, steps = 4, 6, 9, 3
    dtype, np_dtype = (sm.float64, np.float64) if not options else (sm.float32, np.float32)
    g, (h, w, b, noise, i, scale, sampling), token = _sample_graph(dtype, batch, depth, vocab, steps)
    rng = np.random.default_rng(2)
    wv = rng.standard_normal((depth, vocab))
    wv[:, 5] = wv[:, 2]  # equal columns: an exact tie, which the first index wins
    bv = rng.standard_normal(vocab)
    bv[5] = bv[2] = 50.0
    hv = rng.standard_normal((batch, depth))
    nv = rng.standard_normal((steps, batch, vocab))
    nv[-1, 3, 7] = np.nan  # a NaN counts as the maximum (sampled below)
    feeds = {h: hv.astype(np_dtype), w: wv.astype(np_dtype), b: bv.astype(np_dtype), noise: nv.astype(np_dtype),
             i: np.int32(-1), scale: np_dtype(0.5), sampling: np.bool_(False)}
    exe = g.compile(feeds, [token], device="cpu", options=options)
    assert _kinds(exe) == ["product_arg_max"]
    got = exe.run(feeds)[token].numpy()
    assert got.dtype == np.int64 and got.tolist() == [2, 2, 2, 2]
    feeds[sampling] = np.bool_(True)
    feeds[b] = rng.standard_normal(vocab).astype(np_dtype)
    logits = (hv @ wv + feeds[b].astype(np.float64)) * 0.5 + nv[-1]
    want = np.argmax(np.where(np.isnan(logits), np.inf, logits), axis=-1)
    assert want[3] == 7
    np.testing.assert_array_equal(exe.run(feeds)[token].numpy(), want)
    feeds[i] = np.int32(steps)
    with pytest.raises(sm.ExecutionError, match="an index out of range"):
        exe.run(feeds)


def test_the_demo_samples_a_token_in_four_kernels_as_the_unfused_compile_does():
    """The generation loop's body: two LSTM cells, the output layer's draw, the token's write; greedy and
    sampled text (the same draws) equal the unfused compile's, and so do the generation step's three
    stages (codegen/lstm_step.py; its persistent form needs CUDA: benchmarks/tune_lstm.py checks it)."""
    params = lstm.init_parameters(11, 8, 4, seed=3)
    prompts = np.array([[1, 4, 2], [6, 0, 5]], np.int64)
    runs = {}
    for name, options in (("fused", {}), ("unfused", {"lstm_cell_fusion": False, "product_arg_max_fusion": False}),
                          ("step", {"lstm_step_fusion": "split", "lstm_step_units": 4})):
        gen = lstm.build_generator(params, batch=2, prompt_length=3, length=5, seed=4)
        types = {gen.prompt: sm.TensorType((2, 3), sm.int64), gen.temperature: sm.TensorType((), sm.float32)}
        exe = gen.graph.compile(types, [gen.tokens], device="cpu", options=options)
        runs[name] = [exe.run({gen.prompt: prompts, gen.temperature: np.float32(t)})[gen.tokens].numpy()
                      for t in (0.9, 0.0)]
        report = exe.fusion_report()
        if name == "fused":  # both loops' cells (reading the prompt, generating) and the draw
            assert report.count("lstm_cell applied") == 4 and report.count("product_arg_max applied") == 1, report
            assert "lstm_step not applied: its grid barrier needs every program resident" in report
        if name == "step":
            assert "lstm_step applied: both LSTM layers and the draw of a token in three kernels (split), 2 " \
                   "programs of 4 hidden units" in report, report
    for name in ("fused", "step"):
        for got, unfused in zip(runs[name], runs["unfused"]):
            np.testing.assert_array_equal(got, unfused)
