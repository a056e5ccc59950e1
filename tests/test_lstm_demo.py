"""The LSTM demo (stitchml/demos/lstm.py): its layer against torch.nn.LSTM, generation at temperature 0
against a greedy PyTorch loop, Gumbel-max draws against softmax(logits / T), and a tiny model whose
validation loss falls below a unigram model's."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.demos import lstm


def _params(vocab=7, width=8, embed=4, seed=3):
    return lstm.init_parameters(vocab, width, embed, seed)


def test_two_lstm_layers_match_torch_nn_lstm():
    rng = np.random.default_rng(0)
    batch, steps, features, width = 3, 5, 4, 6
    torch.manual_seed(0)
    ref = torch.nn.LSTM(features, width, num_layers=2, batch_first=True).double()
    x = torch.as_tensor(rng.standard_normal((batch, steps, features)))
    h0, c0 = (torch.as_tensor(rng.standard_normal((2, batch, width))) for _ in range(2))
    want, (hn, cn) = ref(x, (h0, c0))
    g = sm.Graph()
    out = g.constant(x.numpy())
    finals = []
    for layer in range(2):
        w = {n: g.constant(getattr(ref, f"{n}_l{layer}").detach().numpy()) for n in ("weight_ih", "weight_hh")}
        bias = g.constant((getattr(ref, f"bias_ih_l{layer}") + getattr(ref, f"bias_hh_l{layer}")).detach().numpy())
        out, h, c = lstm.lstm_layer(g, out, g.constant(h0[layer].numpy()), g.constant(c0[layer].numpy()),
                                    w["weight_ih"], w["weight_hh"], bias)
        finals += [h, c]
    got = g.run({}, [out, *finals], device="cpu")
    np.testing.assert_allclose(got[out].numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-14)
    for layer in range(2):
        np.testing.assert_allclose(got[finals[2 * layer]].numpy(), hn[layer].detach().numpy(), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(got[finals[2 * layer + 1]].numpy(), cn[layer].detach().numpy(), rtol=1e-12,
                                   atol=1e-14)


def _torch_logits(params, prompt_row):
    """Logits after each token from the last prompt token on, greedily: a PyTorch reference of the loop."""
    p = {k: torch.as_tensor(v) for k, v in params.items()}
    width = p["output/weights"].shape[0]
    state = [torch.zeros(1, width) for _ in range(4)]

    def step(token):
        x = p["embedding"][token][None]
        for layer in range(2):
            cell = torch.nn.LSTMCell(x.shape[1], width)
            with torch.no_grad():
                cell.weight_ih.copy_(p[f"lstm{layer}/weights_ih"])
                cell.weight_hh.copy_(p[f"lstm{layer}/weights_hh"])
                cell.bias_ih.copy_(p[f"lstm{layer}/bias"])
                cell.bias_hh.zero_()
                state[2 * layer], state[2 * layer + 1] = cell(x, (state[2 * layer], state[2 * layer + 1]))
            x = state[2 * layer]
        return (x @ p["output/weights"] + p["output/bias"])[0]

    for token in prompt_row[:-1]:
        step(int(token))
    return step


@pytest.mark.parametrize("batch", [2, lstm.FUSED_BATCH + 1], ids=["fused-step", "table-step"])
def test_temperature_zero_is_greedy_argmax(batch):
    """Both forms of the sampling step (one kernel per layer at small batches, cuBLAS products above)."""
    params = _params()
    prompts = np.resize(np.array([[1, 4, 2], [6, 0, 5], [3, 3, 1]], np.int64), (batch, 3))
    gen = lstm.build_generator(params, batch=batch, prompt_length=3, length=12, seed=1)
    tokens = lstm.generate(gen, prompts, 0.0, device="cpu")
    for row, prompt in zip(tokens, prompts):
        step, token, want = _torch_logits(params, prompt), int(prompt[-1]), []
        for _ in range(12):
            token = int(step(token).argmax())
            want.append(token)
        assert row.tolist() == want
    # Greedy decoding ignores the draws: another run (new draws) gives the same text.
    assert (lstm.generate(gen, prompts, 0.0, device="cpu") == tokens).all()


def test_sampling_draws_from_the_tempered_softmax():
    params = _params()
    batch, temperature = 3000, 0.7
    prompts = np.tile(np.array([[2, 3]], np.int64), (batch, 1))
    gen = lstm.build_generator(params, batch=batch, prompt_length=2, length=1, seed=5)
    first = lstm.generate(gen, prompts, temperature, device="cpu")[:, 0]
    with torch.no_grad():
        probs = torch.softmax(_torch_logits(params, prompts[0])(3).double() / temperature, -1).numpy()
    counts = np.bincount(first, minlength=len(probs))
    sigma = np.sqrt(batch * probs * (1 - probs))
    assert (np.abs(counts - batch * probs) <= 4 * sigma + 1).all(), (counts, batch * probs)


@pytest.fixture
def one_thread():
    """Tiny matrices: more threads only wait on each other (and on the other tests' processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_tiny_model_beats_the_unigram_model_and_its_weights_round_trip(tmp_path, one_thread):
    corpus = lstm.load_corpus(300_000)
    unigram = lstm.unigram_loss(corpus)
    trainer = lstm.build_trainer(lstm.init_parameters(len(corpus.vocab), 32, 16, 0), 16, 16, 2e-2)
    losses, valid = lstm.train(trainer, corpus, 50, valid_every=50, progress=False)
    assert valid[-1] < unigram - 0.1, f"validation loss {valid[-1]:.3f}, unigram model {unigram:.3f}"
    path = str(tmp_path / "lstm.safetensors")
    lstm.save_weights(trainer.parameters(), corpus.vocab, path, {"steps": "50"})
    params, vocab = lstm.load_weights(path)
    assert vocab == corpus.vocab
    for name, value in trainer.parameters().items():
        np.testing.assert_array_equal(params[name], value)
    with pytest.raises(sm.DataError, match="not weights of this demo"):
        lstm.save_weights({"embedding": params["embedding"]}, vocab, path, {})
        lstm.load_weights(path)


def test_compiled_generation_draws_what_eager_generation_draws():
    """The generation graph compiles (every shape static, each loop body compiled once) and, with the draws
    of the same seed and run, samples the same characters as the op-by-op run."""
    params = _params()
    prompts = np.array([[1, 4, 2], [6, 0, 5]], np.int64)
    runs = []
    for compiled in (False, True):
        gen = lstm.build_generator(params, batch=2, prompt_length=3, length=6, seed=9)
        out = gen.graph.run({gen.prompt: prompts, gen.temperature: np.float32(0.8)}, [gen.tokens], device="cpu",
                            compiled=compiled)
        runs.append(out[gen.tokens].numpy())
    np.testing.assert_array_equal(runs[1], runs[0])


def test_the_command_generates_from_saved_weights_and_refuses_bad_options(tmp_path, capsys):
    vocab = "".join(sorted(set("KING. and the queen\n")))
    path = str(tmp_path / "w.safetensors")
    lstm.save_weights(lstm.init_parameters(len(vocab), 8, 4, 0), vocab, path, {})
    assert lstm.main(["--weights", path, "--device", "cpu", "--prompt", "KING.", "--length", "7",
                      "--temperature", "0", "--threads", "1"]) == 0
    text = capsys.readouterr().out.split("\n", 1)[1]
    assert text.startswith("KING.") and len(text.rstrip("\n")) >= len("KING.") and set(text) <= set(vocab + "\n")
    for args, phrase in ((["--temperature", "-1"], "--temperature must be finite and >= 0"),
                         (["--weights", path, "--prompt", "KING!"], "characters the model has no token for: '!'"),
                         (["--length", "0"], "expected an integer above 0")):
        with pytest.raises(SystemExit) as info:
            lstm.main(args + ["--device", "cpu"])
        assert info.value.code == 2 and phrase in capsys.readouterr().err
