"""The `stitchml` command: `doctor` reports the machine, `demo NAME` runs a demo.

    $ stitchml doctor
    $ stitchml demo gelu --device cpu
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help=doctor.__doc__).set_defaults(fn=doctor)
    p = sub.add_parser("demo", help=demo.__doc__)
    p.add_argument("name", help="which demo (stitchml demo list shows them)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the demo's own options")
    p.set_defaults(fn=demo)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
