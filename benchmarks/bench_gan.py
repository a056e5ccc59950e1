"""Step time of `stitchml demo gan`'s GAN against the same GAN in PyTorch eager and torch.compile.

Run on a CUDA machine:  python benchmarks/bench_gan.py [--all] [--json out.json]
Here, to know it works:  python benchmarks/bench_gan.py --device cpu --quick

One training step of each contender is the same work: the generator on a batch of noise (batch
normalization in training mode, running statistics updated), the discriminator on the real and the
generated batch (dropout 0.3), both losses, each network's gradients restricted to its own weights and
both Adam updates (simultaneous: both read the weights from the start of the step). StitchML runs the
step as one compiled executable (one run of one graph); PyTorch eager runs the modules and
`torch.optim.Adam` (its default foreach implementation); torch.compile compiles the forward and
losses (backward through AOTAutograd) and each optimizer's step. The images are random in [-1, 1]:
step time does not depend on their content. Times are medians of CUDA-event timings of batches of
steps after warm-up (wall clock on the CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from stitchml.demos import gan as stitch_gan  # noqa: E402

# (name, image side, batch, width, latent): the demo's MNIST configuration; --all adds its 8x8 digits one
# and a larger batch (each configuration compiles about 80 kernels, and torch.compile its own: --all takes
# about three times as long).
CONFIGS = [("mnist 28x28", 28, 128, 64, 100)]
MORE = [("digits 8x8", 8, 64, 32, 32), ("mnist 28x28", 28, 512, 64, 100)]
QUICK = [("digits 8x8", 8, 16, 8, 8)]


class Generator(torch.nn.Module):
    """The demo's generator in torch.nn: dense, batch norm, ReLU, two transposed convolutions, tanh."""

    def __init__(self, side: int, width: int, latent: int):
        super().__init__()
        self.base, self.wide = side // 4, 2 * width
        features = self.wide * self.base * self.base
        self.dense, self.norm0 = torch.nn.Linear(latent, features), torch.nn.BatchNorm1d(features)
        self.up1 = torch.nn.ConvTranspose2d(self.wide, width, 4, 2, 1)
        self.norm1 = torch.nn.BatchNorm2d(width)
        self.up2 = torch.nn.ConvTranspose2d(width, 1, 4, 2, 1)

    def forward(self, z):
        x = F.relu(self.norm0(self.dense(z))).reshape(-1, self.wide, self.base, self.base)
        return torch.tanh(self.up2(F.relu(self.norm1(self.up1(x)))))


class Discriminator(torch.nn.Module):
    """The demo's discriminator: two strided convolutions with leaky ReLU and dropout, then dense."""

    def __init__(self, side: int, width: int):
        super().__init__()
        base = side // 4
        self.conv1, self.conv2 = torch.nn.Conv2d(1, width, 4, 2, 1), torch.nn.Conv2d(width, 2 * width, 4, 2, 1)
        self.dense = torch.nn.Linear(2 * width * base * base, 1)

    def forward(self, x):
        x = F.dropout(F.leaky_relu(self.conv1(x), 0.2), 0.3, self.training)
        x = F.dropout(F.leaky_relu(self.conv2(x), 0.2), 0.3, self.training)
        return self.dense(x.flatten(1))


def torch_step(side: int, width: int, latent: int, device: str, compiled: bool):
    """A function running one training step of the PyTorch GAN on (real, noise)."""
    gen, dis = Generator(side, width, latent).to(device), Discriminator(side, width).to(device)
    g_opt = torch.optim.Adam(gen.parameters(), 2e-4, betas=(0.5, 0.999))
    d_opt = torch.optim.Adam(dis.parameters(), 2e-4, betas=(0.5, 0.999))
    g_params, d_params = list(gen.parameters()), list(dis.parameters())

    def losses(real, z):
        fake = gen(z)
        real_logits, fake_logits = dis(real), dis(fake)
        d_loss = F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()
        return d_loss, F.softplus(-fake_logits).mean()

    def g_update():
        g_opt.step()

    def d_update():
        d_opt.step()

    if compiled:
        losses, g_update, d_update = torch.compile(losses), torch.compile(g_update), torch.compile(d_update)

    def step(real, z):
        d_loss, g_loss = losses(real, z)
        d_grads = torch.autograd.grad(d_loss, d_params, retain_graph=True)
        g_grads = torch.autograd.grad(g_loss, g_params)
        for p, grad in zip(d_params + g_params, d_grads + g_grads):
            p.grad = grad
        d_update()
        g_update()
        return d_loss, g_loss

    return step


def stitch_step(side: int, width: int, latent: int, batch: int, device: str):
    """One run of the demo's graph, compiled once for this batch."""
    model = stitch_gan.build((1, side, side), width=width, latent=latent)
    import stitchml as sm

    exe = model.graph.compile({model.real: sm.TensorType((batch, 1, side, side), sm.float32),
                               model.noise: sm.TensorType((batch, latent), sm.float32)},
                              [model.d_loss, model.g_loss], model.updates, device=device)

    def step(real, z):
        out = exe.run({model.real: real, model.noise: z})
        return out[model.d_loss], out[model.g_loss]

    return step, exe


def median_ms(fn, device: str, reps: int, inner: int) -> float:
    """Median milliseconds per call over `reps` batches of `inner` calls, after warm-up."""
    for _ in range(3):
        fn()
    cuda = device.startswith("cuda")
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        else:
            start = time.perf_counter()
        for _ in range(inner):
            fn()
        if cuda:
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / inner)
        else:
            times.append((time.perf_counter() - start) * 1e3 / inner)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="one small configuration, few repetitions")
    parser.add_argument("--all", action="store_true", help="also the 8x8 digits at batch 64 and MNIST at batch 512")
    parser.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    torch.manual_seed(0)
    reps, inner = (3, 2) if args.quick else (15, 10)
    rows = []
    print(f"{'config':<12} {'batch':>5}  {'contender':<14} {'ms/step':>9}  {'d_loss':>7} {'g_loss':>7}  note")
    failed = False
    for name, side, batch, width, latent in QUICK if args.quick else CONFIGS + (MORE if args.all else []):
        rng = np.random.default_rng(0)
        real = torch.as_tensor(rng.uniform(-1, 1, (batch, 1, side, side)).astype(np.float32), device=args.device)
        z = torch.as_tensor(rng.standard_normal((batch, latent)).astype(np.float32), device=args.device)
        start = time.perf_counter()
        step, exe = stitch_step(side, width, latent, batch, args.device)
        contenders = {"stitchml": (step, f"{exe.kernel_count} kernels, compiled in "
                                         f"{time.perf_counter() - start:.1f} s")}
        contenders["torch eager"] = (torch_step(side, width, latent, args.device, False), "")
        if not args.no_torch_compile:
            contenders["torch.compile"] = (torch_step(side, width, latent, args.device, True), "")
        for who, (fn, note) in contenders.items():
            try:
                start = time.perf_counter()
                d_loss, g_loss = (float(v.torch() if hasattr(v, "torch") else v.detach()) for v in fn(real, z))
                if who == "torch.compile":
                    note = f"first step (compiling) {time.perf_counter() - start:.1f} s"
                ms = median_ms(lambda: fn(real, z), args.device, reps, inner)
            except Exception as e:  # noqa: BLE001  (one contender failing leaves the others' rows)
                print(f"{name:<12} {batch:>5}  {who:<14} failed: {type(e).__name__}: {e}", flush=True)
                rows.append({"config": name, "batch": batch, "who": who, "error": f"{type(e).__name__}: {e}"})
                failed = True
                continue
            row = {"config": name, "batch": batch, "width": width, "who": who, "ms_per_step": ms,
                   "d_loss": d_loss, "g_loss": g_loss, "note": note}
            rows.append(row)
            print(f"{name:<12} {batch:>5}  {who:<14} {ms:9.3f}  {d_loss:7.3f} {g_loss:7.3f}  {note}", flush=True)
            failed |= not (np.isfinite(d_loss) and np.isfinite(g_loss))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
