"""Neural material compression: a material's channels stored as two quantized latent grids and a tiny MLP
trained with StitchML, decoded per pixel inside a Triton shading kernel, compared with BC1 and BC7.

    $ stitchml demo neural-materials                          # 128x128 on the CPU: about 2-3 minutes on two cores
    $ stitchml demo neural-materials --size 1024 --steps 4000 --device cuda
    $ stitchml demo neural-materials --size 1024 --steps 2000 --device cuda --sweep --weights 4 1 1

The material: one surface, every channel derived from one photograph (scikit-image's coffee by default):
base color is the photograph, the normals come from its luminance taken as height, roughness from its
local detail; the channels share the surface's structure, as a real material's do. BC baselines,
encoded by etcpak and decoded by texture2ddecoder: base color BC1 + normal BC5 + roughness BC4, or base
color and roughness in BC7 + normal BC5: 16 bits per texel either way. The neural set counts its
latents at their stored bits and its weights at half precision; its training loss weighs the textures
(--weights) to share the bits among them. The goal, printed per BC set: at most half its bits per
texel, and no texture's PSNR nor the normals' angular error worse. `--sweep` adds the lowest rate at
which the neural set matches BC7.
"""
from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

import numpy as np
import torch

import stitchml as sm
from stitchml import optim
from stitchml.cli import positive
from stitchml.ir import Tensor
from stitchml.shader import MLP, PROGRAM, MLPSpec
from stitchml.tensor_data import resolve_device

OUTPUTS = 6  # base color RGB, normal x and y (z is rebuilt), roughness
NOISE = 0.7  # fraction of the training steps that quantize with noise rather than rounding
# Loss weights of the textures (base color, normal, roughness).
WEIGHTS = (1.0, 3.0, 8.0)


def output_weights(weights: tuple[float, float, float]) -> np.ndarray:
    """The loss weight of each decoder output (r, g, b, normal x, normal y, roughness) from the textures'."""
    color, normal, rough = weights
    return np.array([color] * 3 + [normal] * 2 + [rough], np.float32)


@dataclass
class Material:
    """Channels of one material, float32 (size, size, C): base color in [0, 1], unit normals, roughness."""

    base_color: np.ndarray
    normal: np.ndarray
    roughness: np.ndarray

    def targets(self) -> np.ndarray:
        """What the decoder learns, per texel: base color, normal x and y, roughness."""
        return np.concatenate([self.base_color, self.normal[..., :2], self.roughness], -1).astype(np.float32)


SURFACES = {"coffee": lambda d: d.coffee()[:, 100:500], "chelsea": lambda d: d.chelsea()[:, 75:375],
            "astronaut": lambda d: d.astronaut()[:256, 128:384],
            "immunohistochemistry": lambda d: d.immunohistochemistry()}


def make_material(size: int, surface: str = "coffee") -> Material:
    """The demo's material at `size` x `size`: every channel from one photograph of a surface, so they
    share its structure. Base color is the photograph; height is its blurred luminance, and the normals
    its gradient; roughness follows the local detail (standard deviation of the luminance's high
    frequencies over a few texels), rough where the surface is busy, smooth where it is flat. Stored at
    8 bits per channel as a texture would be."""
    from skimage import data, filters, transform

    color = transform.resize(SURFACES[surface](data), (size, size), anti_aliasing=True).astype(np.float64)
    luminance = color @ np.array([0.2126, 0.7152, 0.0722])
    height = filters.gaussian(luminance, sigma=1.0)
    dy, dx = np.gradient(height)
    n = np.stack([-dx * size / 16, -dy * size / 16, np.ones_like(dx)], -1)
    n /= np.linalg.norm(n, axis=-1, keepdims=True)
    detail = np.sqrt(filters.gaussian((luminance - filters.gaussian(luminance, sigma=2.0)) ** 2, sigma=2.0))
    rough = (0.2 + 0.75 * np.clip(detail / np.percentile(detail, 99), 0, 1))[..., None]
    q = lambda v, lo=0.0: (np.round((v - lo) / (1 - lo) * 255) / 255 * (1 - lo) + lo)  # noqa: E731  8-bit storage
    nxy = q(n[..., :2], -1.0)
    nz = np.sqrt(np.clip(1 - (nxy ** 2).sum(-1, keepdims=True), 0, 1))
    return Material(q(color).astype(np.float32), np.concatenate([nxy, nz], -1).astype(np.float32),
                    q(rough).astype(np.float32))


# -- block compression baselines ----------------------------------------------------------------
def _bc(encode: str, decode: str, rgba: np.ndarray) -> np.ndarray:
    import etcpak
    import texture2ddecoder

    h, w = rgba.shape[:2]
    blocks = getattr(etcpak, encode)(np.ascontiguousarray(rgba).tobytes(), w, h)
    bgra = np.frombuffer(getattr(texture2ddecoder, decode)(blocks, w, h), np.uint8).reshape(h, w, 4)
    return bgra[..., [2, 1, 0, 3]].astype(np.float32) / 255  # the decoder writes BGRA


def _u8(*channels: np.ndarray) -> np.ndarray:
    out = np.zeros(channels[0].shape[:2] + (4,), np.uint8)
    out[..., 3] = 255
    for i, c in enumerate(channels):
        out[..., i] = np.round(np.clip(c, 0, 1) * 255)
    return out


def _normal_from_xy(xy: np.ndarray) -> np.ndarray:
    z = np.sqrt(np.clip(1 - (xy ** 2).sum(-1, keepdims=True), 0, 1))
    n = np.concatenate([xy, z], -1)
    return n / np.maximum(np.linalg.norm(n, axis=-1, keepdims=True), 1e-8)


def block_compressed(m: Material) -> dict[str, tuple[Material, float]]:
    """The material through BC1 + BC5 + BC4 and BC7 (color and roughness) + BC5: decoded, bits per texel."""
    nx, ny = (m.normal[..., 0] + 1) / 2, (m.normal[..., 1] + 1) / 2
    normal = _bc("compress_bc5", "decode_bc5", _u8(nx, ny))[..., :2] * 2 - 1
    normal = _normal_from_xy(normal)
    bc1 = _bc("compress_bc1", "decode_bc1", _u8(*np.moveaxis(m.base_color, -1, 0)))[..., :3]
    bc4 = _bc("compress_bc4", "decode_bc4", _u8(m.roughness[..., 0]))[..., :1]
    bc7 = _bc("compress_bc7", "decode_bc7", _u8(*np.moveaxis(m.base_color, -1, 0), m.roughness[..., 0]))
    return {"BC1+BC5+BC4": (Material(bc1, normal, bc4), 4 + 8 + 4),
            "BC7+BC5": (Material(bc7[..., :3], normal, bc7[..., 3:]), 8 + 8)}


# -- the neural representation ------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Two latent grids (fine at size/2, coarse at size/4), their channels and stored bits, the decoder."""

    size: int
    fine: int = 4
    coarse: int = 6
    bits: int = 5
    hidden: int = 32

    @property
    def spec(self) -> MLPSpec:
        return MLPSpec((self.fine + self.coarse, self.hidden, OUTPUTS), ("relu", "none"), "float16", PROGRAM)

    @property
    def levels(self) -> int:
        """Largest quantized magnitude: latents are stored as integers in [-levels, levels]."""
        return 2 ** (self.bits - 1) - 1

    def bits_per_texel(self) -> tuple[float, float]:
        """(latents, weights) in bits per texel of the material."""
        latent = self.bits * (self.fine * (self.size // 2) ** 2 + self.coarse * (self.size // 4) ** 2)
        return latent / self.size ** 2, self.spec.stored_bits / self.size ** 2


@dataclass
class Compressed:
    """The stored form: latents (fine then coarse grid, channels last, int8 holding `bits`-bit values), weights."""

    layout: Layout
    latents: torch.Tensor  # int8, flat: fine (size/2, size/2, fine) then coarse (size/4, size/4, coarse)
    weights: list[tuple[np.ndarray, np.ndarray]]


@dataclass
class Training:
    """The training graph of a layout: latents and decoder as variables, one Adam step per run over every
    texel. `noise` (a scalar placeholder, 1 or 0) picks how the latents are quantized in the forward
    pass: uniform noise of one quantization step (1), or straight-through rounding (0), which is what
    is stored."""

    graph: sm.Graph
    fine: Tensor
    coarse: Tensor
    net: MLP
    target: Tensor
    learning_rate: Tensor
    noise: Tensor
    loss: Tensor
    updates: list


def training_graph(layout: Layout, seed: int = 0, weights: tuple[float, float, float] = WEIGHTS) -> Training:
    """The graph `train` runs: latents quantized (noise or rounding), upsampled bilinearly to every texel,
    decoded by the MLP; mean squared error against the target, each texture's weighted by `weights`
    (base color, normal, roughness); Adam."""
    s, rng = layout.size, np.random.default_rng(seed)
    g = sm.Graph("neural_material")
    fine = g.variable(rng.uniform(-0.1, 0.1, (layout.fine, s // 2, s // 2)).astype(np.float32), name="latents/fine")
    coarse = g.variable(rng.uniform(-0.1, 0.1, (layout.coarse, s // 4, s // 4)).astype(np.float32),
                        name="latents/coarse")
    net = MLP(g, layout.spec, rng=rng, name="decoder")
    target = g.placeholder((s * s, OUTPUTS), sm.float32, name="target")
    lr = g.placeholder((), sm.float32, name="learning_rate")
    noise = g.placeholder((), sm.float32, name="noise")

    def quantized(v, seed):
        # Noise of one quantization step lets every latent move freely early on; rounding (its gradient
        # passed straight through) makes the decoder learn the values that are stored.
        c = g.clamp(v, -1.0, 1.0)
        jitter = g.random_uniform(tuple(v.shape), seed=seed, minimum=-0.5 / layout.levels, maximum=0.5 / layout.levels)
        rounding = g.stop_gradient(g.round(c * layout.levels) / layout.levels - c)
        return c + noise * jitter + (1.0 - noise) * rounding

    grids = [g.resize(quantized(v, seed + i), (v.shape[0], s, s), mode="linear") for i, v in enumerate((fine, coarse))]
    features = g.transpose(g.reshape(g.concat(grids, axis=0), (layout.fine + layout.coarse, s * s)), (1, 0))
    loss = g.reduction_mean(g.square(net(features) - target) * g.constant(output_weights(weights)))
    updates = optim.Adam(lr).minimize(g, loss, [fine, coarse] + net.parameters)
    return Training(g, fine, coarse, net, target, lr, noise, loss, updates)


def schedule(step: int, steps: int, learning_rate: float, noise_fraction: float) -> tuple[float, float]:
    """(learning rate, noise switch) of `step`: cosine decay to 1e-4; noise for the first `noise_fraction`
    of the steps, rounding after."""
    lr = learning_rate * 0.5 * (1 + math.cos(math.pi * step / steps)) + 1e-4
    return lr, 1.0 if step < noise_fraction * steps else 0.0


def train(m: Material, layout: Layout, steps: int, *, learning_rate: float = 0.05, noise_fraction: float = NOISE,
          weights: tuple[float, float, float] = WEIGHTS, seed: int = 0, device: str | None = None,
          log_every: int = 0) -> tuple[Compressed, list[float]]:
    """Fit latents and decoder with Adam on every texel per step (`training_graph`), quantizing with noise
    for the first `noise_fraction` of the steps and with straight-through rounding after, so what is
    stored is what was trained last. Returns the stored form and the loss of the first and last steps
    and of every `log_every`-th."""
    t = training_graph(layout, seed, weights)
    # The target stays on the device: fed as an array it would be copied there on every step.
    feeds = {t.target: torch.from_numpy(m.targets().reshape(-1, OUTPUTS)).to(resolve_device(device))}
    losses = []
    for step in range(steps):
        lr, noise = schedule(step, steps, learning_rate, noise_fraction)
        feeds[t.learning_rate], feeds[t.noise] = np.float32(lr), np.float32(noise)
        loss = t.graph.run(feeds, [t.loss], t.updates, device=device)[t.loss]
        logged = bool(log_every) and step % log_every == 0
        if step == 0 or step == steps - 1 or logged:  # reading the loss waits for the device
            losses.append(loss.item())
        if logged or (log_every and step == steps - 1):
            print(f"  step {step:5d}  loss {losses[-1]:.5f}  ({10 * math.log10(1 / max(losses[-1], 1e-12)):.1f} dB)"
                  + ("  (noise)" if noise else ""))

    def stored(v):
        q = np.round(np.clip(t.graph.variable_value(v).numpy(), -1, 1) * layout.levels).astype(np.int8)
        return torch.from_numpy(np.ascontiguousarray(q.transpose(1, 2, 0)).ravel())

    return Compressed(layout, torch.cat([stored(t.fine), stored(t.coarse)]), t.net.weights()), losses


def _decode_output(y: torch.Tensor, size: int) -> Material:
    """Material channels from the decoder's (texels, 6) output: clamped color and roughness, unit normals."""
    y = y.double().cpu().numpy().reshape(size, size, OUTPUTS)
    return Material(np.clip(y[..., :3], 0, 1), _normal_from_xy(y[..., 3:5]), np.clip(y[..., 5:6], 0, 1))


def decode_reference(c: Compressed) -> Material:
    """The decode in PyTorch (float64, any device): bilinear latents and the spec's reference network."""
    L, s = c.layout, c.layout.size
    fine_n = (s // 2) ** 2 * L.fine
    grids = [c.latents[:fine_n].reshape(s // 2, s // 2, L.fine), c.latents[fine_n:].reshape(s // 4, s // 4, L.coarse)]
    feats = [torch.nn.functional.interpolate(q.permute(2, 0, 1)[None].double() / L.levels, size=(s, s),
                                             mode="bilinear", align_corners=False)[0] for q in grids]
    x = torch.cat(feats).reshape(L.fine + L.coarse, -1).T
    return _decode_output(L.spec.reference(x, L.spec.unpack(L.spec.pack(c.weights))), s)


def decode_kernel(c: Compressed, device: str, block: int = 128) -> Material:
    """The decode in the Triton shading kernel (`stitchml.shader.shading.shade`) on `device` (on the CPU, the
    interpreter)."""
    from ..shader.shading import shade

    L = c.layout
    out = shade(c.latents.to(device), L.spec.pack(c.weights, device), L.size, L.fine, L.coarse, L.levels,
                L.spec, block=block).double().cpu().numpy().reshape(L.size, L.size, -1)
    return Material(out[..., :3], out[..., 3:6], out[..., 6:7])


# -- measures ----------------------------------------------------------------------------------
def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of values in [0, 1]."""
    return float(10 * np.log10(1 / max(np.mean((np.asarray(a, np.float64) - b) ** 2), 1e-20)))


def angular_error(a: np.ndarray, b: np.ndarray) -> float:
    """Mean angle in degrees between unit normals."""
    cos = np.clip((a.astype(np.float64) * b).sum(-1), -1, 1)
    return float(np.degrees(np.arccos(cos)).mean())


def measure(ref: Material, got: Material) -> dict[str, float]:
    """PSNR of every texture (normals' x and y over [-1, 1] mapped to [0, 1]) and the normals' mean angular error."""
    return {"base color dB": psnr(ref.base_color, got.base_color), "roughness dB": psnr(ref.roughness, got.roughness),
            "normal dB": psnr(ref.normal[..., :2] * 0.5, got.normal[..., :2] * 0.5),
            "normal deg": angular_error(ref.normal, got.normal)}


def shortfalls(q: dict[str, float], bc: dict[str, float]) -> list[str]:
    """Where quality `q` is worse than `bc` (lower PSNR, larger angle), with the margin; empty when no worse."""
    out = []
    for k in q:
        worse = q[k] - bc[k] if k.endswith("dB") else bc[k] - q[k]
        if worse < 0:
            unit = k.split()[-1]
            out.append(f"{k.replace(' dB', '').replace(' deg', ' angle')} {worse:+.{2 if unit == 'dB' else 3}f} {unit}")
    return out


def goal_report(neural: dict[str, float], neural_bpp: float, baselines: dict[str, tuple[dict[str, float], float]]
                ) -> list[str]:
    """Lines saying, per BC set, whether the neural set meets the goal: at most half the set's bits per
    texel and no texture's PSNR nor the normals' angular error worse."""
    lines = []
    for name, (bc, bpp) in baselines.items():
        short = shortfalls(neural, bc)
        half = neural_bpp <= bpp / 2
        verdict = "met" if half and not short else "not met"
        lines.append(f"goal against {name} ({bpp:g} bits/texel): neural at {100 * neural_bpp / bpp:.0f}% of its bits, "
                     + (f"worse in {', '.join(short)}" if short else "no texture worse") + f": {verdict}")
    return lines


# Layouts of the sweep, in increasing bits per texel: (fine channels, coarse channels, bits, hidden width).
LADDER = [(2, 4, 5, 32), (4, 6, 5, 32), (4, 8, 6, 32), (6, 8, 6, 32), (6, 12, 6, 64), (6, 16, 6, 64),
          (8, 16, 6, 64), (12, 16, 6, 64), (16, 24, 6, 64)]


def save_comparison(path: str, ref: Material, rows: dict[str, Material]) -> None:
    """A PNG: one column per version (original, BC..., neural), base color above normals; then the
    neural error (absolute, x8)."""
    from PIL import Image

    def tile(mat: Material) -> np.ndarray:
        return np.concatenate([mat.base_color, mat.normal * 0.5 + 0.5], 0)

    cols = [tile(ref)] + [tile(m) for m in rows.values()]
    neural = list(rows.values())[-1]
    cols.append(np.clip(np.abs(tile(ref) - tile(neural)) * 8, 0, 1))
    Image.fromarray(np.round(np.concatenate(cols, 1) * 255).astype(np.uint8)).save(path)


def _table(material: Material, rows: dict[str, tuple[Material, float]]) -> dict[str, dict[str, float]]:
    """Print one row per version (bits per texel, every measure); return the measures."""
    out = {name: measure(material, mat) for name, (mat, _) in rows.items()}
    keys = list(next(iter(out.values())))
    print(f"{'':<22}{'bits/texel':>11}" + "".join(f"{k:>15}" for k in keys))
    for name, (_, bpp) in rows.items():
        print(f"{name:<22}{bpp:>11.2f}" + "".join(f"{v:>15.2f}" for v in out[name].values()))
    return out


def sweep(material: Material, bc: dict[str, float], args: argparse.Namespace, device: str) -> None:
    """Train the LADDER's layouts from the cheapest up until one is no worse than `bc` (the BC7 set) in
    every measure; print each and the bits per texel of the first that matches."""
    print(f"sweep: layouts in increasing bits per texel until one matches BC7+BC5 ({args.steps} steps each)")
    for fine, coarse, bits, hidden in LADDER:
        layout = Layout(args.size, fine, coarse, bits, hidden)
        start = time.perf_counter()
        compressed, _ = train(material, layout, args.steps, learning_rate=args.learning_rate,
                              noise_fraction=args.noise_fraction, weights=tuple(args.weights), seed=args.seed,
                              device=device)
        q = measure(material, decode_reference(compressed))
        bpp = sum(layout.bits_per_texel())
        short = shortfalls(q, bc)
        print(f"  {fine:>2} + {coarse:>2} at {bits} bits, hidden {hidden:>3}: {bpp:6.2f} bits/texel  "
              + "  ".join(f"{k} {v:.2f}" for k, v in q.items())
              + f"  ({time.perf_counter() - start:.0f} s)  "
              + ("matches BC7+BC5" if not short else "worse in " + ", ".join(short)))
        if not short:
            print(f"lowest bits per texel at which the neural set matches BC7+BC5: {bpp:.2f} "
                  f"({100 * bpp / 16:.0f}% of its 16)")
            return
    print("no layout of the sweep matches BC7+BC5")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo neural-materials", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=positive(int), default=128, help="texels per side, a multiple of 16 (default 128)")
    parser.add_argument("--steps", type=positive(int), default=1000, help="training steps, all texels each (default 1000)")
    parser.add_argument("--surface", choices=sorted(SURFACES), default="coffee",
                        help="the photograph every channel is derived from (default coffee)")
    parser.add_argument("--fine", type=positive(int), default=4, help="channels of the size/2 latent grid (default 4)")
    parser.add_argument("--coarse", type=positive(int), default=6, help="channels of the size/4 latent grid (default 6)")
    parser.add_argument("--bits", type=int, default=5, choices=range(2, 9), metavar="2..8",
                        help="stored bits per latent (default 5)")
    parser.add_argument("--hidden", type=positive(int), default=32, help="decoder hidden width (default 32)")
    parser.add_argument("--learning-rate", type=positive(float), default=0.05)
    parser.add_argument("--noise-fraction", type=_fraction, default=NOISE,
                        help=f"share of the steps quantizing latents with noise before rounding (default {NOISE})")
    parser.add_argument("--weights", type=positive(float), nargs=3, default=WEIGHTS,
                        metavar=("COLOR", "NORMAL", "ROUGH"),
                        help="loss weights of base color, normal and roughness (default %(default)s)")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="default: CUDA when present, else the CPU")
    parser.add_argument("--decode", choices=["kernel", "reference"], default="kernel",
                        help="decode in the Triton shading kernel (the interpreter on the CPU) or in PyTorch")
    parser.add_argument("--sweep", action="store_true",
                        help="then train layouts of increasing size until one matches BC7+BC5, and report its bits")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="neural_materials.png", help="the side-by-side image (default %(default)s)")
    args = parser.parse_args(argv)
    if args.size % 16 or args.size < 16:
        parser.error(f"--size must be a positive multiple of 16, got {args.size}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was asked for but no CUDA device is available (see `stitchml doctor`)")
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported

    layout = Layout(args.size, args.fine, args.coarse, args.bits, args.hidden)
    material = make_material(args.size, args.surface)
    print(f"material {args.size}x{args.size} from {args.surface}: base color, normals (luminance as height), "
          f"roughness (local detail); decoder {layout.spec.widths}, latents {args.fine}@size/2 + {args.coarse}@size/4 "
          f"at {args.bits} bits; loss weights {tuple(args.weights)}")
    start = time.perf_counter()
    baselines = block_compressed(material)
    compressed, _ = train(material, layout, args.steps, learning_rate=args.learning_rate,
                          noise_fraction=args.noise_fraction, weights=tuple(args.weights), seed=args.seed,
                          device=device, log_every=max(args.steps // 6, 1))
    trained = time.perf_counter() - start
    neural = decode_kernel(compressed, device, 128 if device == "cuda" else 1024) if args.decode == "kernel" \
        else decode_reference(compressed)
    latent_bpp, weight_bpp = layout.bits_per_texel()
    rows = {name: (mat, bpp) for name, (mat, bpp) in baselines.items()}
    name = f"neural ({args.decode})"
    rows[name] = (neural, latent_bpp + weight_bpp)
    print(f"trained {args.steps} steps in {trained:.1f} s on {device}; decode: {args.decode}")
    quality = _table(material, rows)
    print(f"neural bits per texel: latents {latent_bpp:.2f} + weights {weight_bpp:.2f} "
          f"({layout.spec.parameter_count} half-precision parameters)")
    bc = {k: (quality[k], bpp) for k, (_, bpp) in baselines.items()}
    print("\n".join(goal_report(quality[name], latent_bpp + weight_bpp, bc)))
    save_comparison(args.out, material, {k: v[0] for k, v in rows.items()})
    print(f"wrote {args.out} (columns: original, " + ", ".join(rows) + ", neural error x8)")
    if args.sweep:
        sweep(material, quality["BC7+BC5"], args, device)
    return 0


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text}")
    return value
