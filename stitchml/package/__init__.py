"""Network packages: build them offline from ONNX or torch.export, save, load, inspect and run.

    pkg = sm.package.from_onnx("model.onnx"); pkg.save("model.smpkg")
    out = sm.load_package("model.smpkg").function("main")(x=images)

See docs/packages.md for the format and the importers' coverage.
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
