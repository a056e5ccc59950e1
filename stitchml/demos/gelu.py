"""GeLU from primitives, as in the talk: constants, square_root, multiplication,
erf and addition. Runs on every available device and prints the max error
against torch.nn.functional.gelu.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

import stitchml as sm


def build(dtype=sm.float32):
    g = sm.Graph("gelu")
    x = g.placeholder((-1, -1), dtype, name="x")
    half, one = g.constant(0.5, dtype), g.constant(1.0, dtype)
    root2 = g.square_root(g.constant(2.0, dtype))
    y = g.multiplication(g.multiplication(half, x), g.addition(one, g.erf(g.division(x, root2))), name="gelu")
    return g, x, y


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo gelu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", action="append", help="cpu or cuda (default: every available device)")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=1024)
    args = parser.parse_args(argv)
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
