"""The `stitchml` command: `doctor` reports the machine, `demo NAME` runs a demo, `package` builds and inspects packages.

    $ stitchml doctor
    $ stitchml demo gelu --device cpu
    $ stitchml package build model.onnx -o model.smpkg
    $ stitchml package build model.onnx -o model.smpkg --kernels-for x=8,3,64,64
    $ stitchml package inspect model.smpkg
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import sys

# What each kind of failure exits with: 0 success, 1 a demo's check failed, 2 the user asked for
# something that cannot be done (argparse's code for bad arguments, used for every user mistake).
USAGE_ERROR = 2


def device_argument(name: str) -> str:
    """argparse `type=` for --device: `name` when this machine has that device, else an argparse error
    that lists the accepted names and the devices present."""
    from .errors import DeviceError
    from .tensor_data import resolve_device

    try:
        resolve_device(name)
    except DeviceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def _device(parser: argparse.ArgumentParser, option: str, name: str) -> None:
    """An argparse error unless this machine has the device `name` (for an option whose default may be absent)."""
    try:
        device_argument(name)
    except argparse.ArgumentTypeError as e:
        parser.error(f"argument {option}: {e}")


def positive(kind: type):
    """argparse `type=` for a count (`positive(int)`) or a rate (`positive(float)`) that must be finite and above 0."""
    what = "an integer" if kind is int else "a number"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} above 0, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected {what} above 0, got {text}")
        return value

    return parse


def doctor(args) -> int:
    """Print the devices and the versions of what StitchML runs on."""
    import numpy
    import torch

    import stitchml
    from stitchml.demos import default_threads

    rows = [("stitchml", stitchml.__version__), ("python", platform.python_version()),
            ("platform", platform.platform()), ("torch", torch.__version__), ("numpy", numpy.__version__)]
    try:
        import triton

        rows.append(("triton", triton.__version__))
    except ImportError:
        rows.append(("triton", "not installed (compiled GPU kernels unavailable)"))
    rows.append(("cpu", f"{platform.processor() or platform.machine()}, torch uses {torch.get_num_threads()} threads, "
                        f"the demos {default_threads()} (--threads)"))
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


def _dimensions(parser: argparse.ArgumentParser, specs: list[str]) -> dict[str, tuple[int, ...]]:
    """{"x": (8, 3, 64, 64)} from ["x=8,3,64,64"]."""
    dims = {}
    for spec in specs:
        name, sep, extents = spec.partition("=")
        try:
            shape = tuple(int(d) for d in extents.split(","))
        except ValueError:
            shape = None
        if not sep or not name or shape is None or name in dims:
            parser.error(f"--kernels-for {spec!r}: expected NAME=D0,D1,... with integer extents, once per input")
        dims[name] = shape
    return dims


def _existing(parser: argparse.ArgumentParser, what: str, path: str) -> None:
    if not os.path.exists(path):
        parser.error(f"{what} {path!r}: no such file or directory")


def package_build(args) -> int:
    """Build a package from an ONNX model (and compile its kernels for given input dimensions)."""
    from .package import from_onnx

    _existing(args.parser, "model", args.model)
    folder = os.path.dirname(os.path.abspath(args.output.rstrip("/\\") or "."))
    if not os.path.isdir(folder):
        args.parser.error(f"-o {args.output!r}: the folder {folder!r} does not exist")
    dims = _dimensions(args.parser, args.kernels_for)
    if dims:
        _device(args.parser, "--device", args.device)
    pkg = from_onnx(args.model, name=args.function)
    if dims:
        entry = pkg.compile_kernels(args.function, dims, device=args.device)
        print(f"compiled kernels for {entry.input_dimensions} on {entry.target['arch']}")
    pkg.save(args.output)
    print(f"wrote {args.output}")
    print(pkg.summary())
    return 0


def package_inspect(args) -> int:
    """Print a package's functions, signatures, op counts and weight sizes."""
    from .package import load_package

    _existing(args.parser, "package", args.package)
    print(load_package(args.package).summary())
    return 0


def debug(args) -> int:
    """Open the web debugger on captures, graphs, packages or traces; `debug bisect` finds the first diverging op."""
    from .debug.cli import main as debug_main

    return debug_main(args.rest)


def conformance(args) -> int:
    """Run a conformance suite: `conformance onnx` runs every ONNX backend node test and writes the report."""
    from .package.conformance import main as onnx_main

    return onnx_main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    """The `stitchml` command's parser; each subcommand's parser is in its arguments as `parser`."""
    from .demos import DEMOS

    parser = argparse.ArgumentParser(prog="stitchml", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("doctor", help=doctor.__doc__)
    p.set_defaults(fn=doctor, parser=p)
    p = sub.add_parser("demo", help=demo.__doc__)
    p.add_argument("name", choices=["list", *DEMOS], help="which demo (stitchml demo list shows them)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the demo's own options (stitchml demo NAME --help)")
    p.set_defaults(fn=demo, parser=p)
    pkg = sub.add_parser("package", help="build and inspect network packages").add_subparsers(dest="action", required=True)
    p = pkg.add_parser("build", help=package_build.__doc__)
    p.add_argument("model", help="an ONNX model file (opset 13 or later)")
    p.add_argument("-o", "--output", required=True, help="the package to write (a directory when it ends with /)")
    p.add_argument("--function", default="main", help="the function's name in the package (default: main)")
    p.add_argument("--kernels-for", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="compile the kernels for these input dimensions and carry them in the package "
                        "(once per input with symbolic extents; needs a GPU)")
    p.add_argument("--device", default="cuda", help="where --kernels-for compiles (default: cuda)")
    p.set_defaults(fn=package_build, parser=p)
    p = pkg.add_parser("inspect", help=package_inspect.__doc__)
    p.add_argument("package", help="a package file or directory")
    p.set_defaults(fn=package_inspect, parser=p)
    p = sub.add_parser("conformance", help=conformance.__doc__)
    p.add_argument("suite", choices=["onnx"], help="which suite (onnx: the ONNX backend node tests)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="[--op NAME] [--out PATH]")
    p.set_defaults(fn=conformance, parser=p)
    p = sub.add_parser("debug", help=debug.__doc__)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="FILE... [--port N] | bisect GRAPH [--feed NAME=FILE.npy]")
    p.set_defaults(fn=debug, parser=p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns the exit code.

    Mistakes in the arguments exit through argparse (usage, then `stitchml ...: error: ...`, code 2); a
    StitchError that a subcommand raises is one line, `stitchml: error: ...`, and code 2 as well. A reader
    that stops early (`stitchml doctor | head -1`) ends the command quietly, as the Python documentation
    advises for SIGPIPE.
    """
    from .errors import StitchError

    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
            code = args.fn(args)
        finally:  # --help and demos' usage errors leave through SystemExit: flush where a closed pipe is caught
            sys.stdout.flush()
    except StitchError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except BrokenPipeError:
        # Python flushes stdout again at exit; pointing it at devnull keeps that flush from failing too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # a file the command reads or writes: permissions, a full disk...
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130  # the shell's code for a command ended by Ctrl-C
    return code


if __name__ == "__main__":
    sys.exit(main())
