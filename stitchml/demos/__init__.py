"""Demos runnable as `stitchml demo NAME [options]`; each module has a `main(argv) -> int`."""
from __future__ import annotations

import importlib
import os
import sys

DEMOS = {
    "gan": "a DCGAN whose generator and discriminator train in one graph run; samples scored by the classifier",
    "gelu": "GeLU built from primitives, checked against torch on every device",
    "mnist": "the digit classifier: convolutions, pooling, dense layers, trained with Adam or SGD",
    "lstm": "a character-level LSTM trained on Shakespeare, sampling text in one graph run with for_loop",
    "neural-materials": "material channels as quantized latents + an MLP decoded in a Triton kernel, against BC1/BC7",
    "neural-ao": "a UNet's ambient occlusion on a command buffer, and a typo in it found by bisection",
}


def default_threads() -> int:
    """CPU threads a demo uses unless told: half the cores this process may run on, at least one.

    torch's own default (every physical core) is the fastest on an idle machine, but when other work
    shares the cores its threads spin waiting on each other: on a busy two-core machine, training ran
    tens of times slower on two threads than on one (docs/training.md, "Threads"). A fixed rule, not
    one read from the load, keeps runs with the same options reproducible bit for bit.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // 2)


def run(name: str, argv: list[str]) -> int:
    """Run demo `name` with its own options `argv` ("list" prints the demos); returns the exit code."""
    if name == "list" or name not in DEMOS:
        out = sys.stdout if name == "list" else sys.stderr
        if name != "list":
            print(f"unknown demo {name!r}; the demos are:", file=out)
        for k, v in DEMOS.items():
            print(f"  {k:<16} {v}", file=out)
        return 0 if name == "list" else 2
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}").main(argv)
