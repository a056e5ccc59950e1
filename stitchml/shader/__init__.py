"""Shader ML: small networks inside users' own Triton kernels.

* `Matmul2dDescriptor`, scopes THREAD and PROGRAM, `TensorView` (descriptor.py): host-side, no Triton.
* `MLPSpec`, `from_sequential`, `from_graph` (spec.py): a network's widths, activations, precision and
  scope; its packed weight buffer and a PyTorch reference of the same network.
* `stitchml.shader.language`: the device functions (`matmul2d`, `mlp`, `load_tile`, `store_tile`,
  `sample_bilinear`) to call from `@triton.jit` kernels; `stitchml.shader.kernels.mlp_rows` runs a
  spec on the rows of a matrix. Both import Triton.
* `mlp(g, x, spec, parameters)` and `MLP` (network.py): the same network in a graph, trainable.

See docs/shader_ml.md.
"""
from .descriptor import MIN_DOT, PROGRAM, SCOPES, THREAD, Matmul2dDescriptor, TensorView
from .network import MLP, mlp
from .spec import ACTIVATIONS, MLPSpec, from_graph, from_sequential

__all__ = ["Matmul2dDescriptor", "TensorView", "THREAD", "PROGRAM", "SCOPES", "MIN_DOT", "MLPSpec", "ACTIVATIONS",
           "from_sequential", "from_graph", "MLP", "mlp"]
