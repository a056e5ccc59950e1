"""`stitchml debug`: the web debugger, and bisection from the command line.

    $ stitchml debug run.capture [more files] [--port 8765] [--host 127.0.0.1]
    $ stitchml debug bisect model.onnx --feed x=x.npy [--reference onnx|float64] [-o run.capture]
    $ stitchml debug bisect graph.json --feed x=x.npy --tolerance 1e-4 -o run.capture

`bisect` takes a saved graph (Graph.save), a package or an ONNX model. The
reference is "float64" (the graph op by op in float64) or, for an ONNX
model, "onnx" (onnxruntime, ONNX values matched by name, the default).
Inputs without --feed get seeded standard-normal values when their shape is
known. With -o the run is captured, with the bisection and the reference's
values, for `stitchml debug run.capture`.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

from ..errors import StitchError
from ..tensor_data import TensorData


def _load_graph(path: str):
    """(graph, {reference name: tensor name}, ONNX model or None) from a saved graph, package or ONNX model."""
    if path.endswith(".onnx"):
        from .bisect import import_onnx

        graph, names = import_onnx(path)
        return graph, names, path
    if os.path.isfile(path) and open(path, "rb").read(1) in (b"{", b"["):
        from ..graph import Graph

        return Graph.load(path), {}, None
    from ..package import load_package

    return load_package(path).function().graph, {}, None


def _feeds(graph, specs: list[str]) -> dict:
    feeds = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            raise ValueError(f"--feed {spec!r}: expected NAME=FILE.npy")
        feeds[name] = np.load(file, allow_pickle=False)
    rng = np.random.default_rng(0)
    for p in graph.placeholders:
        if p.name not in feeds:
            if not p.type.is_static:
                raise ValueError(f"input {p.name} has shape {p.type} with unknown extents: give it with --feed")
            feeds[p.name] = TensorData(torch.from_numpy(rng.standard_normal(p.shape)).to(p.dtype.torch))
            print(f"input {p.name}: seeded standard-normal values of shape {list(p.shape)}")
    return feeds


def bisect_command(args) -> int:
    from . import bisect, capture_bisection, float64_reference, onnx_reference

    graph, names, onnx_model = _load_graph(args.graph)
    feeds = _feeds(graph, args.feed)
    kind = args.reference or ("onnx" if onnx_model else "float64")
    if kind == "onnx" and onnx_model is None:
        raise ValueError("--reference onnx needs an ONNX model as the graph")
    reference = onnx_reference(onnx_model) if kind == "onnx" else float64_reference(graph)
    result = bisect(graph, feeds, reference, tolerance=args.tolerance, names=names if kind == "onnx" else None)
    print(result.summary())
    if args.output:
        cap = capture_bisection(graph, feeds, result)
        cap.save(args.output)
        print(f"wrote {args.output} (open it with: stitchml debug {args.output})")
    return 1 if result.op is not None else 0


def serve_command(args) -> int:
    from .server import serve

    missing = [f for f in args.files if not os.path.exists(f)]
    if missing:
        raise ValueError(f"no such file: {', '.join(missing)}")
    serve(args.files, port=args.port, host=args.host)
    return 0


def main(argv: list[str]) -> int:
    """Dispatch `stitchml debug ...`; returns the exit status (1: a divergence was found, 2: an error)."""
    if argv[:1] == ["bisect"]:
        p = argparse.ArgumentParser(prog="stitchml debug bisect", description="the first op that departs from a reference")
        p.add_argument("graph", help="a saved graph (.json), a package, or an ONNX model (.onnx)")
        p.add_argument("--feed", action="append", default=[], metavar="NAME=FILE.npy", help="an input's value")
        p.add_argument("--reference", choices=["float64", "onnx"], help="default: onnx for ONNX models, else float64")
        p.add_argument("--tolerance", type=float, default=1e-4, help="|ours - ref| <= tol * (1 + |ref|) agrees")
        p.add_argument("-o", "--output", help="write a capture with the result, for the web debugger")
        args, fn = p.parse_args(argv[1:]), bisect_command
    else:
        p = argparse.ArgumentParser(prog="stitchml debug", description="the web debugger")
        p.add_argument("files", nargs="+", help="captures, saved graphs (.json), packages or trace JSON files")
        p.add_argument("--port", type=int, default=8765)
        p.add_argument("--host", default="127.0.0.1", help="the address to bind (default: this machine only)")
        args, fn = p.parse_args(argv), serve_command
    try:
        return fn(args)
    except (StitchError, ValueError, OSError) as e:
        print(f"{p.prog}: error: {e}", file=sys.stderr)
        return 2
