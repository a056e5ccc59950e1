"""The digit classifier: convolution, bias add, ReLU, pooling, reshape, dense layers,
softmax cross entropy and an optimizer, all in one graph; every training step is one run.

    $ stitchml demo mnist                                  # scikit-learn's 8x8 digits, no download
    $ stitchml demo mnist --data ../shared/data/mnist --epochs 2 --out mnist.safetensors
    $ stitchml demo mnist --distributed 2                  # data-parallel, two processes (gloo or NCCL)
    $ torchrun --nproc-per-node 2 -m stitchml demo mnist   # the same, launched by torchrun

Without --data it trains on scikit-learn's bundled 8x8 digits (a held-out fifth is the
test set); with --data it reads the four MNIST IDX files from that folder.
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

import stitchml as sm
from stitchml import data, nn, optim
from stitchml.cli import device_argument, positive
from stitchml.demos import default_threads

OPTIMIZERS = {"adam": lambda lr: optim.Adam(lr), "sgd": lambda lr: optim.SGD(lr, momentum=0.9)}
# What reaches the documented accuracy (docs/training.md) on each dataset; options override.
# The 8x8 digits run on one thread: their tensors are too small to split, and spare threads
# only wait on each other (three times slower on two threads of a two-core machine, thirty times
# when other work shares it). MNIST takes the demos' default (stitchml.demos.default_threads).
DEFAULTS = {
    "digits": {"epochs": 30, "batch_size": 32, "learning_rate": {"adam": 2e-3, "sgd": 0.02}, "threads": 1},
    "mnist": {"epochs": 2, "batch_size": 64, "learning_rate": {"adam": 1e-3, "sgd": 0.01}, "threads": None},
}


@dataclass
class Classifier:
    """The graph and the tensors and operations a training loop needs."""

    graph: sm.Graph
    images: sm.Tensor  # placeholder (-1, C, H, W), float32 unless built otherwise
    labels: sm.Tensor  # placeholder (-1,) int64
    loss: sm.Tensor  # mean cross entropy of the batch
    correct: sm.Tensor  # how many predictions of the batch are right
    updates: list[sm.Operation]  # one optimizer step
    parameters: list[sm.Tensor]
    logits: sm.Tensor  # (batch, classes), before the softmax


def build(image_shape: tuple[int, int, int], classes: int = 10, *, seed: int = 0, optimizer: str = "adam",
          learning_rate: float = 1e-3, dtype: sm.DType = sm.float32, data_parallel: str | None = None) -> Classifier:
    """Two convolution blocks (5x5, 16 and 32 channels, each ReLU and 2x2 max pooling), a hidden
    dense layer of 128 and the output layer; weights drawn from `seed`, images fed as `dtype`.
    `data_parallel` names the process group whose processes average their gradients.

    >>> m = build((1, 8, 8), seed=0)
    >>> m.images.type.shape, m.loss.type.shape, len(m.parameters)
    ((-1, 1, 8, 8), (), 8)
    """
    channels, height, width = image_shape
    g = sm.Graph("digit_classifier")
    rng = np.random.default_rng(seed)
    images = g.placeholder((-1, channels, height, width), dtype, name="images")
    labels = g.placeholder((-1,), sm.int64, name="labels")
    same = sm.Convolution2DDescriptor(padding="same")
    pool = sm.Pooling2DDescriptor(kernel_size=2)
    conv1 = nn.Conv2d(g, channels, 16, 5, same, rng=rng, dtype=dtype, name="conv1")
    conv2 = nn.Conv2d(g, 16, 32, 5, same, rng=rng, dtype=dtype, name="conv2")
    flat = 32 * (height // 4) * (width // 4)
    hidden = nn.Dense(g, flat, 128, rng=rng, dtype=dtype, name="dense1")
    output = nn.Dense(g, 128, classes, rng=rng, dtype=dtype, name="dense2")

    x = g.max_pooling2d(g.relu(conv1(images)), pool)
    x = g.max_pooling2d(g.relu(conv2(x)), pool)
    logits = output(g.relu(hidden(g.reshape(x, (-1, flat)))))
    losses = g.softmax_cross_entropy(logits, labels, reduction="none")
    loss = g.division(g.reduction_sum(losses), g.element_count(losses), name="loss")  # any batch size
    correct = g.reduction_sum(g.equal(g.reduction_arg_maximum(logits, axis=-1), labels), name="correct")
    parameters = conv1.parameters + conv2.parameters + hidden.parameters + output.parameters
    updates = OPTIMIZERS[optimizer](learning_rate).minimize(g, loss, parameters, data_parallel=data_parallel)
    return Classifier(g, images, labels, loss, correct, updates, parameters, logits)


def train(model: Classifier, dataset: data.Dataset, epochs: int, batch_size: int, *, seed: int = 0,
          device: str | None = None, progress: bool = True, sharded: bool = False) -> list[float]:
    """Train in place, one run per batch; returns each step's loss (taken before its update).

    `sharded`: this process trains on its part of each epoch (stitchml.distributed.shard), in
    batches of `batch_size` per process; the progress bar counts every process's images.
    """
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    losses = []
    size = sm.distributed.world_size() if sharded else 1
    count = len(dataset.train_labels)
    total = epochs * (count - count % size)
    with tqdm(total=total, unit="img", unit_scale=True, disable=not progress, desc="training") as bar:
        for epoch in range(epochs):
            if sharded:
                part = sm.distributed.shard(count, epoch=epoch, seed=seed)
                epoch_batches = data.batches(dataset.train_images[part], dataset.train_labels[part], batch_size)
            else:
                epoch_batches = data.batches(dataset.train_images, dataset.train_labels, batch_size, rng)
            for images, labels in epoch_batches:
                # tensors rather than arrays: Graph.run finds the executable of a request of tensors from their
                # identities, shapes and dtypes alone (arrays take the full lookup, ~0.4 ms a step on the CPU)
                feeds = {model.images: torch.from_numpy(images), model.labels: torch.from_numpy(labels)}
                out = model.graph.run(feeds, [model.loss], model.updates, device=device)
                losses.append(out[model.loss].item())
                bar.update(len(labels) * size)
                bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.4f}", refresh=False)
    return losses


def evaluate(model: Classifier, images: np.ndarray, labels: np.ndarray, *, device: str | None = None,
             batch_size: int = 1000) -> float:
    """The fraction of `images` classified correctly."""
    right = 0
    for x, y in data.batches(images, labels, batch_size):
        out = model.graph.run({model.images: x, model.labels: y}, [model.correct], device=device)
        right += int(out[model.correct].item())
    return right / len(labels)


def save_weights(model: Classifier, path: str, metadata: dict[str, str] | None = None) -> None:
    """The trained parameters as safetensors, keyed by variable name (conv1/weights...)."""
    from safetensors.numpy import save_file

    save_file({v.name: model.graph.variable_value(v).numpy() for v in model.parameters}, path, metadata=metadata)


def load_weights(model: Classifier, path: str) -> dict[str, str]:
    """Set the parameters from a file `save_weights` wrote; returns its metadata.

    A missing file, a missing key or a tensor of another shape or dtype (weights of the MNIST network given to
    the 8x8 one, say) raises `DataError` naming the file, the key, what was expected and what was found.
    """
    from safetensors import SafetensorError, safe_open

    if not os.path.isfile(path):
        raise sm.DataError(f"{path}: no such file (expected classifier weights that `stitchml demo mnist --out` "
                           f"writes)")
    try:
        with safe_open(path, "numpy") as f:
            found = {key: f.get_tensor(key) for key in f.keys()}
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise sm.DataError(f"{path}: not a safetensors file ({e})") from None
    for v in model.parameters:
        if v.name not in found:
            raise sm.DataError(f"{path}: expected a tensor {v.name!r}, found only {sorted(found)}")
        value = found[v.name]
        if value.shape != tuple(v.shape) or value.dtype != v.dtype.numpy:
            raise sm.DataError(f"{path}: {v.name!r} expected {v.dtype.name}{list(v.shape)}, found "
                               f"{value.dtype}{list(value.shape)} (weights of another image size?)")
    for v in model.parameters:
        model.graph.set_variable_value(v, found[v.name])
    return metadata


def _writable(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    folder = os.path.dirname(os.path.abspath(path)) if path else None
    if folder and not os.path.isdir(folder):
        parser.error(f"{option} {path!r}: the folder {folder!r} does not exist")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo mnist", description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder with the MNIST IDX files (default: scikit-learn's 8x8 digits)")
    parser.add_argument("--device", type=device_argument, help="cpu, cuda or cuda:N (default: CUDA when present, "
                                                               "else the CPU)")
    parser.add_argument("--epochs", type=positive(int), help="default: 2 for MNIST, 30 for the 8x8 digits")
    parser.add_argument("--batch-size", type=positive(int), help="default: 64 for MNIST, 32 for the 8x8 digits")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    parser.add_argument("--learning-rate", type=positive(float),
                        help="default: 1e-3 for MNIST, 2e-3 for the 8x8 digits (adam); 0.01 and 0.02 "
                             "(sgd with momentum 0.9)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: 1 for the 8x8 digits; "
                                                              "for MNIST half the cores, at least 1)")
    parser.add_argument("--out", help="write the trained weights here (safetensors)")
    parser.add_argument("--distributed", type=positive(int), metavar="N",
                        help="train data-parallel in N processes on this machine (one per GPU with NCCL, "
                             "else gloo on the CPU); under torchrun the processes are torchrun's")
    args = parser.parse_args(argv)
    _writable(parser, "--out", args.out)
    if args.distributed and "WORLD_SIZE" not in os.environ:
        return _launch(args.distributed, argv)
    rank, size = sm.distributed.init()
    main_process = rank == 0

    try:
        dataset = data.load_mnist(args.data) if args.data else data.load_digits(seed=args.seed)
    except sm.DataError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    defaults = DEFAULTS[dataset.name]
    epochs = args.epochs or defaults["epochs"]
    batch_size = args.batch_size or defaults["batch_size"]
    learning_rate = args.learning_rate or defaults["learning_rate"][args.optimizer]
    torch.set_num_threads(args.threads or defaults["threads"] or default_threads())
    if batch_size % size:
        parser.error(f"--batch-size {batch_size} does not split evenly over {size} processes")
    model = build(dataset.image_shape, dataset.classes, seed=args.seed, optimizer=args.optimizer,
                  learning_rate=learning_rate, data_parallel="world" if size > 1 else None)
    if size > 1:
        sm.distributed.synchronize_variables(model.graph)
    say = print if main_process else (lambda *a, **k: None)
    say(f"{dataset.name}: {len(dataset.train_labels)} training and {len(dataset.test_labels)} test images of "
          f"{dataset.image_shape}; {sum(int(np.prod(p.shape)) for p in model.parameters)} parameters, "
          f"{len(model.graph.operations)} operations in the graph")
    start = time.perf_counter()
    train(model, dataset, epochs, batch_size // size, seed=args.seed, device=args.device, progress=main_process,
          sharded=size > 1)
    seconds = time.perf_counter() - start
    accuracy = evaluate(model, dataset.test_images, dataset.test_labels, device=args.device)
    rate = epochs * len(dataset.train_labels) / seconds
    processes = f" in {size} processes" if size > 1 else ""
    say(f"trained {epochs} epochs{processes} in {seconds:.1f} s ({rate:.0f} images/s); "
        f"test accuracy {accuracy:.2%} on {len(dataset.test_labels)} images")
    if args.out and main_process:
        save_weights(model, args.out, {"dataset": dataset.name, "epochs": str(epochs),
                                       "test_accuracy": f"{accuracy:.4f}"})
        print(f"weights written to {args.out}")
    sm.distributed.barrier()
    return 0


def _launch(processes: int, argv: list[str] | None) -> int:
    """Run this demo again in `processes` processes under torchrun (torch.distributed.run)."""
    import subprocess
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--distributed" in argv:  # the processes find their group in torchrun's environment
        i = argv.index("--distributed")
        del argv[i:i + 2]
    argv = [a for a in argv if not a.startswith("--distributed=")]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "stitchml", "demo", "mnist", *argv]
    return subprocess.call(command)
