"""GeLU from primitives, as in the talk: constants, square_root, multiplication,
erf and addition. Runs on every available device and prints the max error
against torch.nn.functional.gelu.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import stitchml as sm
from stitchml.cli import device_argument, positive
from stitchml.demos import default_threads


def build(dtype=sm.float32):
    g = sm.Graph("gelu")
    x = g.placeholder((-1, -1), dtype, name="x")
    half, one = g.constant(0.5, dtype), g.constant(1.0, dtype)
    root2 = g.square_root(g.constant(2.0, dtype))
    y = g.multiplication(g.multiplication(half, x), g.addition(one, g.erf(g.division(x, root2))), name="gelu")
    return g, x, y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo gelu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", action="append", type=device_argument,
                        help="cpu, cuda or cuda:N, once per device (default: every available device)")
    parser.add_argument("--rows", type=positive(int), default=1024)
    parser.add_argument("--cols", type=positive(int), default=1024)
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: half the cores, at least 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads or default_threads())
    devices = args.device or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    g, x, y = build()
    print(g)
    a = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    ref = torch.nn.functional.gelu(torch.from_numpy(a).double()).numpy()
    worst = 0.0
    for device in devices:
        out = g.run({x: sm.TensorData(a)}, [y], device=device)[y].numpy()
        err = float(np.abs(out - ref).max())
        worst = max(worst, err)
        print(f"{device:>5}: {args.rows}x{args.cols} max |stitchml - torch gelu| = {err:.3e}")
    return 0 if worst < 1e-5 else 1
