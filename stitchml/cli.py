"""The `stitchml` command: `doctor` reports the machine, `demo NAME` runs a demo, `package` builds and inspects packages.

    $ stitchml doctor
    $ stitchml demo gelu --device cpu
    $ stitchml package build model.onnx -o model.smpkg
    $ stitchml package build model.onnx -o model.smpkg --kernels-for x=8,3,64,64
    $ stitchml package inspect model.smpkg
"""
from __future__ import annotations

import argparse
import platform
import sys


def doctor(args) -> int:
    """Print the devices and the versions of what StitchML runs on."""
    import numpy
    import torch

    import stitchml

    rows = [("stitchml", stitchml.__version__), ("python", platform.python_version()),
            ("platform", platform.platform()), ("torch", torch.__version__), ("numpy", numpy.__version__)]
    try:
        import triton

        rows.append(("triton", triton.__version__))
    except ImportError:
        rows.append(("triton", "not installed (compiled GPU kernels unavailable)"))
    rows.append(("cpu", f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"))
    if torch.cuda.is_available():
        rows.append(("cuda", torch.version.cuda or "?"))
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"cuda:{i}", f"{p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB, "
                                      f"{p.multi_processor_count} SMs"))
    else:
        rows.append(("cuda", "no CUDA device"))
    rows.append(("default device", "cuda" if torch.cuda.is_available() else "cpu"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def demo(args) -> int:
    """Run one of the demos."""
    from . import demos

    return demos.run(args.name, args.rest)


def _dimensions(specs: list[str]) -> dict[str, tuple[int, ...]]:
    """{"x": (8, 3, 64, 64)} from ["x=8,3,64,64"]."""
    dims = {}
    for spec in specs:
        name, sep, extents = spec.partition("=")
        try:
            shape = tuple(int(d) for d in extents.split(","))
        except ValueError:
            shape = None
        if not sep or not name or shape is None or name in dims:
            raise ValueError(f"--kernels-for {spec!r}: expected NAME=D0,D1,... with integer extents, once per input")
        dims[name] = shape
    return dims


def package_build(args) -> int:
    """Build a package from an ONNX model (and compile its kernels for given input dimensions)."""
    from .errors import PackageError
    from .package import from_onnx

    try:
        dims = _dimensions(args.kernels_for)
        pkg = from_onnx(args.model, name=args.function)
        if dims:
            entry = pkg.compile_kernels(args.function, dims, device=args.device)
            print(f"compiled kernels for {entry.input_dimensions} on {entry.target['arch']}")
        pkg.save(args.output)
    except (PackageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    print(pkg.summary())
    return 0


def package_inspect(args) -> int:
    """Print a package's functions, signatures, op counts and weight sizes."""
    from .errors import PackageError
    from .package import load_package

    try:
        print(load_package(args.package).summary())
    except PackageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def debug(args) -> int:
    """Open the web debugger on captures, graphs, packages or traces; `debug bisect` finds the first diverging op."""
    from .debug.cli import main as debug_main

    return debug_main(args.rest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help=doctor.__doc__).set_defaults(fn=doctor)
    p = sub.add_parser("demo", help=demo.__doc__)
    p.add_argument("name", help="which demo (stitchml demo list shows them)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the demo's own options")
    p.set_defaults(fn=demo)
    pkg = sub.add_parser("package", help="build and inspect network packages").add_subparsers(dest="action", required=True)
    p = pkg.add_parser("build", help=package_build.__doc__)
    p.add_argument("model", help="an ONNX model file (opset 13 or later)")
    p.add_argument("-o", "--output", required=True, help="the package to write (a directory when it ends with /)")
    p.add_argument("--function", default="main", help="the function's name in the package (default: main)")
    p.add_argument("--kernels-for", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="compile the kernels for these input dimensions and carry them in the package "
                        "(once per input with symbolic extents; needs a GPU)")
    p.add_argument("--device", default="cuda", help="where --kernels-for compiles (default: cuda)")
    p.set_defaults(fn=package_build)
    p = pkg.add_parser("inspect", help=package_inspect.__doc__)
    p.add_argument("package", help="a package file or directory")
    p.set_defaults(fn=package_inspect)
    p = sub.add_parser("debug", help=debug.__doc__)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="FILE... [--port N] | bisect GRAPH [--feed NAME=FILE.npy]")
    p.set_defaults(fn=debug)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
