"""Network packages: build them offline from ONNX or torch.export, save, load, inspect and run.

    pkg = sm.package.from_onnx("model.onnx"); pkg.save("model.smpkg")
    out = sm.load_package("model.smpkg").function("main")(x=images)

See docs/packages.md for the format and the importers' coverage.

Two modules here are public tools rather than parts of a package's life,
kept in the library because users run them too (docs/packages.md), not
only our tests and benchmarks:

* `zoo`: small reference networks with random weights (CNN, UNet, LSTM,
  transformer block, ResNet-18) and example inputs, `zoo.build(name)`: the
  models the docs' examples, the importers' parity tests and the benchmarks
  use, for trying packages and pipelines without a model file;
* `conformance`: ONNX's own backend node tests run through the ONNX
  importer, `python -m stitchml.package.conformance [--op NAME]`: what an
  installed onnx version's operators give here (docs/onnx_conformance.md is
  its report; tests/test_onnx_conformance.py runs the in-scope cases).
"""
from .kernels import current_target
from .limits import Limits, default_limits, set_default_limits
from .package import Function, KernelEntry, Origin, Package, Port, load_package


def from_onnx(model, name: str = "main", bind=None, limits: Limits | None = None) -> Package:
    """A package from an ONNX model (a path, bytes or a ModelProto); see onnx_import.py."""
    from .onnx_import import from_onnx as build

    return build(model, name=name, bind=bind, limits=limits)


def from_torch(module, example_inputs, dynamic_shapes=None, name: str = "main",
               limits: Limits | None = None) -> Package:
    """A package from a torch module through torch.export; see torch_import.py."""
    from .torch_import import from_torch as build

    return build(module, example_inputs, dynamic_shapes=dynamic_shapes, name=name, limits=limits)


__all__ = ["Package", "Function", "Port", "Origin", "KernelEntry", "load_package", "from_onnx", "from_torch", "current_target",
           "Limits", "default_limits", "set_default_limits"]
