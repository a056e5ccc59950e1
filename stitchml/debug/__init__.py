"""Seeing inside what StitchML compiled: captures, bisection against a reference, a local web debugger.

    capture(graph_or_executable, feeds, targets)   every intermediate, keyed by the original ops
    load_capture(path)                              a saved capture, checked
    bisect(graph, feeds, reference)                 the first op whose output departs from a reference
    capture_bisection(graph, feeds, result)         a bisected run as a capture, for the web debugger
    serve(path, port)                               the web debugger (`stitchml debug FILE`)
    export_onnx(graph, path)                        a graph as an ONNX model

Capturing recomputes the program op by op through the reference
implementations; compiled runs carry no instrumentation.
"""
from .bisect import (BisectResult, bisect, capture_bisection, float64_reference, import_onnx, onnx_reference, torch_program_reference,
                     torch_reference)
from .capture import Capture, CaptureError, OpRecord, capture, load_capture
from .onnx_export import export_onnx

__all__ = ["Capture", "CaptureError", "OpRecord", "capture", "load_capture", "BisectResult", "bisect", "capture_bisection",
           "float64_reference", "import_onnx", "onnx_reference", "torch_reference",
           "torch_program_reference", "export_onnx", "create_app", "serve"]


def __getattr__(name: str):
    # The web debugger needs Flask (the `debug` extra); the rest of the package does not.
    if name in ("create_app", "serve"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module 'stitchml.debug' has no attribute {name!r}")
