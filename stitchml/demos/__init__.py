"""Demos runnable as `stitchml demo NAME [options]`; each module has a `main(argv) -> int`."""
from __future__ import annotations

import importlib

DEMOS = {
    "gelu": "GeLU built from primitives, checked against torch on every device",
    "mnist": "the digit classifier: convolutions, pooling, dense layers, trained with Adam or SGD",
    "neural-materials": "material channels as quantized latents + an MLP decoded in a Triton kernel, against BC1/BC7",
}


def run(name: str, argv: list[str]) -> int:
    if name == "list" or name not in DEMOS:
        if name != "list":
            print(f"unknown demo {name!r}")
        for k, v in DEMOS.items():
            print(f"  {k:<16} {v}")
        return 0 if name == "list" else 2
    return importlib.import_module(f"{__name__}.{name.replace('-', '_')}").main(argv)
