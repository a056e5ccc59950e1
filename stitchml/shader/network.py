"""An MLPSpec in a graph: `mlp(g, x, spec, parameters)`, built from matrix multiplication, addition and
the activation primitives so that autodiff and the optimizers apply; `MLP` owns the variables and
packs their trained values into the buffer in-kernel networks read.

`mlp` is a function of the graph rather than a registered builder (a `g.` method): the spec is a
Python object, not a tensor attribute the IR could serialize, and the ops it builds are the
primitives, scoped under "mlp" in dumps.

    >>> import numpy as np, stitchml as sm
    >>> from stitchml.shader import MLP, MLPSpec
    >>> g = sm.Graph()
    >>> net = MLP(g, MLPSpec((3, 8, 2), ("relu", "none")), rng=np.random.default_rng(0), name="decoder")
    >>> x = g.placeholder((-1, 3), sm.float32, name="x")
    >>> y = net(x)
    >>> g.run({x: np.ones((5, 3), np.float32)}, [y], device="cpu")[y].shape, net.pack().numel()
    ((5, 2), 544)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .. import dtypes
from ..errors import ShapeError
from ..ir import Tensor
from ..nn import Module
from .spec import MLPSpec, from_graph


def mlp(g, x, spec: MLPSpec, parameters: Sequence[Tensor]) -> Tensor:
    """`spec`'s chain on the last axis of `x`: ``h = act(h @ W + b)`` per layer, with `parameters`
    [W0, b0, W1, b1, ...] (weights (in, out)), the network `stitchml.shader.language.mlp` runs in a kernel.
    A build error names "mlp" first."""
    with g.scope("mlp"):
        try:
            return _build(g, x, spec, parameters)
        except ShapeError as e:
            if str(e).startswith("mlp:"):
                raise
            raise ShapeError(f"mlp: {e}") from None


def _build(g, x, spec, parameters):
    if not isinstance(spec, MLPSpec):
        raise g._error("mlp", f"expected an MLPSpec, got {type(spec).__name__}", [x])
    if len(parameters) != 2 * spec.layers:
        raise g._error("mlp", f"{spec} needs {2 * spec.layers} parameters (weights and bias per layer), got "
                              f"{len(parameters)}", [x])
    h = g.as_tensor(x)
    for i, (act, n_in, n_out) in enumerate(zip(spec.activations, spec.widths, spec.widths[1:])):
        w, b = parameters[2 * i], parameters[2 * i + 1]
        if tuple(w.shape) != (n_in, n_out) or tuple(b.shape) != (n_out,):
            raise g._error("mlp", f"layer {i} of {spec} expects weights ({n_in}, {n_out}) and bias ({n_out},), got "
                                  f"{w.shape} and {b.shape}", [w, b])
        h = g.matrix_multiplication(h, w) + b
        if act != "none":
            h = getattr(g, act)(h)
    return h


class MLP(Module):
    """The variables of an MLPSpec (PyTorch's default initialisation, drawn from `rng`) and its graph."""

    def __init__(self, g, spec: MLPSpec, *, rng: np.random.Generator, dtype=dtypes.float32, name: str = "mlp") -> None:
        self.graph, self.spec = g, spec
        self.parameters = []
        for i, (n_in, n_out) in enumerate(zip(spec.widths, spec.widths[1:])):
            self.parameters += [self._make(g, f"{name}/layer{i}/weights", (n_in, n_out), n_in, rng, dtype),
                                self._make(g, f"{name}/layer{i}/bias", (n_out,), n_in, rng, dtype)]

    def __call__(self, x: Tensor) -> Tensor:
        return mlp(self.graph, x, self.spec, self.parameters)

    def weights(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The variables' current values as (weights, bias) pairs in float64."""
        return from_graph(self.graph, self.parameters, self.spec)

    def pack(self, device: str | torch.device = "cpu") -> torch.Tensor:
        """The current values packed for `language.mlp` (MLPSpec.pack)."""
        return self.spec.pack(self.weights(), device)
