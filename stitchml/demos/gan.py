"""A GAN in one graph: a DCGAN-style generator and discriminator that train together, one run per step.

    $ stitchml demo gan                                    # scikit-learn's 8x8 digits, about a minute on a CPU
    $ stitchml demo gan --data ../shared/data/mnist --classifier mnist.safetensors

The generator is dense -> batch normalization -> ReLU -> transposed convolution -> batch normalization
-> ReLU -> transposed convolution -> tanh; the discriminator convolution -> leaky ReLU -> dropout, twice,
then dense. Each training step is one run of one graph: both losses, both networks' gradients (each
restricted to its own variables), two Adam optimizers and the generator's running statistics. After
every epoch a grid of samples (the generator in inference mode, on fixed noise) is written as a PNG,
and at the end the digit classifier of `stitchml demo mnist` labels a thousand samples: the fraction it
labels with confidence above 0.9, and the class histogram (a GAN that collapses onto a few modes
fills few classes).
"""
from __future__ import annotations

import argparse
import os
import struct
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

import stitchml as sm
from stitchml import data, nn, optim
from stitchml.cli import device_argument, positive
from stitchml.demos import default_threads, mnist

# What each dataset trains with unless told; the 8x8 digits run on one thread (demos/mnist.py says why).
DEFAULTS = {
    "digits": {"epochs": 60, "batch_size": 64, "width": 32, "latent": 32, "threads": 1},
    "mnist": {"epochs": 5, "batch_size": 128, "width": 64, "latent": 100, "threads": None},
}
CONFIDENT = 0.9  # a sample counts as a recognisable digit when the classifier gives a class this much


@dataclass
class GAN:
    """The graph and the tensors and operations a training loop needs."""

    graph: sm.Graph
    real: sm.Tensor  # placeholder (-1, 1, H, W): training images scaled to [-1, 1]
    noise: sm.Tensor  # placeholder (-1, latent): the generator's input
    d_loss: sm.Tensor  # the discriminator's loss (real labelled 1, generated 0)
    g_loss: sm.Tensor  # the generator's non-saturating loss
    updates: list[sm.Operation]  # both optimizers' steps and the running statistics
    samples: sm.Tensor  # the generator in inference mode on `noise`, in [-1, 1]
    fake: sm.Tensor  # the generator in training mode (the batch's statistics), as the step uses it
    generator_variables: list[sm.Tensor] = field(default_factory=list)
    discriminator_variables: list[sm.Tensor] = field(default_factory=list)
    running_statistics: list[sm.Tensor] = field(default_factory=list)


def build(image_shape: tuple[int, int, int], *, width: int = 32, latent: int = 32, seed: int = 0,
          learning_rate: float = 2e-4, dropout: float = 0.3) -> GAN:
    """The generator and discriminator for images of `image_shape` (C, H, W with H, W divisible by 4).

    `width` is the channel count of the larger feature maps (the smaller ones have twice as many);
    `latent` the noise's length. Both optimizers are Adam with beta1 0.5, as DCGAN.

    >>> gan = build((1, 8, 8), width=8, latent=4)
    >>> gan.samples.type.shape, gan.d_loss.type.shape, len(gan.generator_variables), len(gan.running_statistics)
    ((-1, 1, 8, 8), (), 10, 4)
    """
    channels, height, width_px = image_shape
    if height % 4 or width_px % 4:
        raise sm.ShapeError(f"gan: image height and width must be divisible by 4, got {height}x{width_px}")
    g = sm.Graph("gan")
    rng = np.random.default_rng(seed)
    real = g.placeholder((-1, channels, height, width_px), sm.float32, name="real")
    noise = g.placeholder((-1, latent), sm.float32, name="noise")
    up = sm.Convolution2DDescriptor(stride=2, padding=1)  # kernel 4: doubles height and width
    base = (height // 4, width_px // 4)
    wide, narrow = 2 * width, width

    g_dense = nn.Dense(g, latent, wide * base[0] * base[1], rng=rng, name="generator/dense")
    g_norm0 = nn.BatchNorm(g, wide * base[0] * base[1], name="generator/norm0")
    g_up1 = nn.ConvTranspose2d(g, wide, narrow, 4, up, rng=rng, name="generator/up1")
    g_norm1 = nn.BatchNorm(g, narrow, name="generator/norm1")
    g_up2 = nn.ConvTranspose2d(g, narrow, channels, 4, up, rng=rng, name="generator/up2")
    d_conv1 = nn.Conv2d(g, channels, narrow, 4, up, rng=rng, name="discriminator/conv1")
    d_conv2 = nn.Conv2d(g, narrow, wide, 4, up, rng=rng, name="discriminator/conv2")
    d_dense = nn.Dense(g, wide * base[0] * base[1], 1, rng=rng, name="discriminator/dense")
    norms = [g_norm0, g_norm1]

    def generator(z, training):
        x = g.relu(g_norm0(g_dense(z), training))
        x = g.reshape(x, (-1, wide, *base))
        x = g.relu(g_norm1(g_up1(x), training))
        return g.tanh(g_up2(x))

    def discriminator(x):
        # Masks seeded from `seed` (a dropout without one draws its seed when built): runs repeat exactly.
        x = g.dropout(g.leaky_relu(d_conv1(x), 0.2), dropout, seed=int(rng.integers(2**31)))
        x = g.dropout(g.leaky_relu(d_conv2(x), 0.2), dropout, seed=int(rng.integers(2**31)))
        return d_dense(g.reshape(x, (-1, wide * base[0] * base[1])))

    fake = generator(noise, True)
    real_logits, fake_logits = discriminator(real), discriminator(fake)
    # Cross entropy with logits: -log sigmoid(t) = softplus(-t), -log(1 - sigmoid(t)) = softplus(t).
    d_loss = g.addition(g.reduction_mean(g.softplus(-real_logits)), g.reduction_mean(g.softplus(fake_logits)),
                        name="d_loss")
    g_loss = g.reduction_mean(g.softplus(-fake_logits), name="g_loss")
    generator_variables = g_dense.parameters + g_norm0.parameters + g_up1.parameters + g_norm1.parameters + \
        g_up2.parameters
    discriminator_variables = d_conv1.parameters + d_conv2.parameters + d_dense.parameters
    updates = optim.Adam(learning_rate, beta1=0.5).minimize(g, d_loss, discriminator_variables)
    updates += optim.Adam(learning_rate, beta1=0.5).minimize(g, g_loss, generator_variables)
    updates += [op for norm in norms for op in norm.updates]
    samples = g.identity(generator(noise, False), name="samples")
    running = [t for norm in norms for t in (norm.running_mean, norm.running_variance)]
    return GAN(g, real, noise, d_loss, g_loss, updates, samples, fake, generator_variables, discriminator_variables,
               running)


def train(gan: GAN, images: np.ndarray, epochs: int, batch_size: int, *, seed: int = 0, device: str | None = None,
          after_epoch=None, progress: bool = True) -> list[tuple[float, float]]:
    """Train in place on `images` in [0, 1], one run per full batch; returns each step's (d_loss, g_loss).

    `after_epoch(epoch)` is called after each epoch (the demo writes its sample grid there).
    """
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    latent = gan.noise.type.shape[1]
    losses = []
    steps = len(images) // batch_size  # full batches only: one compiled signature on a GPU
    if steps == 0:
        raise sm.DataError(f"gan: a batch of {batch_size} needs at least that many images, got {len(images)}")
    with tqdm(total=epochs * steps, unit="step", disable=not progress, desc="training") as bar:
        for epoch in range(epochs):
            order = rng.permutation(len(images))
            for step in range(steps):
                batch = images[order[step * batch_size:(step + 1) * batch_size]] * 2.0 - 1.0
                z = rng.standard_normal((batch_size, latent)).astype(np.float32)
                out = gan.graph.run({gan.real: batch, gan.noise: z}, [gan.d_loss, gan.g_loss], gan.updates,
                                    device=device)
                losses.append((out[gan.d_loss].item(), out[gan.g_loss].item()))
                bar.update()
                bar.set_postfix(epoch=epoch + 1, d_loss=f"{losses[-1][0]:.3f}", g_loss=f"{losses[-1][1]:.3f}",
                                refresh=False)
            if after_epoch is not None:
                after_epoch(epoch)
    return losses


def generate(gan: GAN, noise: np.ndarray, *, device: str | None = None) -> np.ndarray:
    """Images in [0, 1] from the generator in inference mode (running statistics), one per row of `noise`."""
    out = gan.graph.run({gan.noise: np.ascontiguousarray(noise, np.float32)}, [gan.samples], device=device)
    return (out[gan.samples].numpy() + 1.0) / 2.0


def grid(images: np.ndarray, columns: int = 8, border: int = 1) -> np.ndarray:
    """(N, 1, H, W) images in [0, 1] tiled into one uint8 picture, `columns` wide, with a dark border."""
    n, _, h, w = images.shape
    rows = -(-n // columns)
    out = np.zeros((rows * (h + border) + border, columns * (w + border) + border), np.uint8)
    for i, image in enumerate(np.clip(images[:, 0], 0.0, 1.0)):
        r, c = divmod(i, columns)
        top, left = border + r * (h + border), border + c * (w + border)
        out[top:top + h, left:left + w] = np.round(image * 255.0)
    return out


def write_png(path: str, picture: np.ndarray, scale: int = 1) -> None:
    """A grayscale uint8 picture as an 8-bit PNG, each pixel `scale` x `scale` (no imaging library needed)."""
    picture = np.repeat(np.repeat(picture, scale, axis=0), scale, axis=1)
    h, w = picture.shape

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(b"\0" + picture[r].tobytes() for r in range(h))  # filter type 0 on every row
    header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8-bit grayscale, no interlace
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9))
                + chunk(b"IEND", b""))


def quality(classifier: mnist.Classifier, images: np.ndarray, *, device: str | None = None,
            batch_size: int = 1000) -> tuple[float, np.ndarray]:
    """The fraction of `images` (in [0, 1]) the classifier labels with confidence above 0.9, and the
    histogram of its labels (how many images it puts in each class)."""
    g = classifier.graph
    probabilities = g.softmax(classifier.logits, axis=-1)
    confidence, label = g.reduction_maximum(probabilities, -1), g.reduction_arg_maximum(probabilities, -1)
    confident, histogram = 0, np.zeros(classifier.logits.type.shape[-1], np.int64)
    for start in range(0, len(images), batch_size):
        x = np.ascontiguousarray(images[start:start + batch_size], np.float32)
        out = g.run({classifier.images: x}, [confidence, label], device=device)
        confident += int((out[confidence].numpy() > CONFIDENT).sum())
        histogram += np.bincount(out[label].numpy(), minlength=len(histogram))
    return confident / len(images), histogram


def load_classifier(dataset: data.Dataset, path: str | None, *, seed: int = 0, device: str | None = None,
                    progress: bool = True) -> tuple[mnist.Classifier, str]:
    """The digit classifier of `stitchml demo mnist`: its weights from `path`, or trained here briefly."""
    model = mnist.build(dataset.image_shape, dataset.classes, seed=seed,
                        learning_rate=mnist.DEFAULTS[dataset.name]["learning_rate"]["adam"])
    if path:
        mnist.load_weights(model, path)
        return model, f"weights from {path}"
    # A brief training: the digits as `stitchml demo mnist` trains them (30 epochs), MNIST one epoch of its
    # first 10,000 images.
    epochs, subset = (30, len(dataset.train_labels)) if dataset.name == "digits" else (1, 10_000)
    quick = dataset.subset(subset, len(dataset.test_labels))
    mnist.train(model, quick, epochs, mnist.DEFAULTS[dataset.name]["batch_size"], seed=seed, device=device,
                progress=progress)
    return model, f"trained here for {epochs} epoch(s) on {len(quick.train_labels)} images"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo gan", description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="folder with the MNIST IDX files (default: scikit-learn's 8x8 digits)")
    parser.add_argument("--device", type=device_argument, help="cpu, cuda or cuda:N (default: CUDA when present, "
                                                               "else the CPU)")
    parser.add_argument("--epochs", type=positive(int), help="default: 60 for the 8x8 digits, 5 for MNIST")
    parser.add_argument("--batch-size", type=positive(int), help="default: 64 for the 8x8 digits, 128 for MNIST")
    parser.add_argument("--learning-rate", type=positive(float), default=2e-4, help="both Adams' (default 2e-4)")
    parser.add_argument("--width", type=positive(int), help="channels of the larger feature maps (default: 32 "
                                                            "for the 8x8 digits, 64 for MNIST)")
    parser.add_argument("--classifier", help="digit classifier weights written by `stitchml demo mnist --out` "
                                             "for the same dataset (default: train one briefly here)")
    parser.add_argument("--samples", type=positive(int), default=1000, help="how many samples the classifier "
                                                                            "labels at the end (default 1000)")
    parser.add_argument("--out", default="gan-samples", help="folder for the per-epoch sample grids (made if "
                                                             "missing; default gan-samples)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: 1 for the 8x8 digits; "
                                                              "for MNIST half the cores, at least 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent):
        parser.error(f"--out {args.out!r}: the folder {parent!r} does not exist")

    try:
        dataset = data.load_mnist(args.data) if args.data else data.load_digits(seed=args.seed)
    except sm.DataError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    defaults = DEFAULTS[dataset.name]
    epochs, batch_size = args.epochs or defaults["epochs"], args.batch_size or defaults["batch_size"]
    if batch_size > len(dataset.train_labels):
        parser.error(f"--batch-size {batch_size}: the training set has only {len(dataset.train_labels)} images")
    torch.set_num_threads(args.threads or defaults["threads"] or default_threads())
    try:
        classifier, origin = load_classifier(dataset, args.classifier, seed=args.seed, device=args.device,
                                             progress=not args.quiet)
    except sm.DataError as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    gan = build(dataset.image_shape, width=args.width or defaults["width"], latent=defaults["latent"],
                seed=args.seed, learning_rate=args.learning_rate)
    count = sum(int(np.prod(v.shape)) for v in gan.generator_variables + gan.discriminator_variables)
    print(f"{dataset.name}: {len(dataset.train_labels)} training images of {dataset.image_shape}; {count} parameters, "
          f"{len(gan.graph.operations)} operations in one graph; classifier: {origin}")
    os.makedirs(args.out, exist_ok=True)
    fixed = np.random.default_rng(args.seed + 1).standard_normal((64, defaults["latent"])).astype(np.float32)
    scale = max(1, 256 // (8 * dataset.image_shape[1]))  # an 8x8 grid of about 256 pixels a side

    def save_grid(epoch: int) -> None:
        write_png(os.path.join(args.out, f"epoch-{epoch + 1:03d}.png"),
                  grid(generate(gan, fixed, device=args.device)), scale)

    start = time.perf_counter()
    losses = train(gan, dataset.train_images, epochs, batch_size, seed=args.seed, device=args.device,
                   after_epoch=save_grid, progress=not args.quiet)
    seconds = time.perf_counter() - start
    last = np.asarray(losses[-len(losses) // epochs:])
    print(f"trained {epochs} epochs ({len(losses)} steps) in {seconds:.1f} s ({1e3 * seconds / len(losses):.1f} ms "
          f"a step, sample grids included); last epoch's mean d_loss {last[:, 0].mean():.3f}, "
          f"g_loss {last[:, 1].mean():.3f}; grids in {args.out}/")
    noise = np.random.default_rng(args.seed + 2).standard_normal((args.samples, defaults["latent"]))
    fraction, histogram = quality(classifier, generate(gan, noise, device=args.device), device=args.device)
    reference, _ = quality(classifier, dataset.test_images, device=args.device)
    print(f"classifier confidence > {CONFIDENT}: {fraction:.1%} of {args.samples} samples "
          f"({reference:.1%} of {len(dataset.test_labels)} held-out real images)")
    print("samples per class: " + "  ".join(f"{c}:{n}" for c, n in enumerate(histogram)))
    if not np.isfinite(last).all():
        print("the losses are not finite: training diverged")
        return 1
    return 0
