"""Network specs for in-kernel MLPs: layer widths, activations, precision and scope; the packed weight
buffer the kernel reads; a PyTorch reference of the same network; loading weights from
`torch.nn.Sequential` and from a StitchML graph's variables.

    >>> spec = MLPSpec((12, 32, 6), ("relu", "none"))
    >>> spec.padded, spec.parameter_count, spec.constexprs("N_")["N_P2"]
    ((16, 32, 16), 614, 16)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..errors import ShapeError
from .descriptor import MIN_DOT, PROGRAM, THREAD, check_scope

ACTIVATIONS = ("none", "relu", "sigmoid", "tanh")
PRECISIONS = {"float16": torch.float16, "float16-sums": torch.float16, "float32": torch.float32}
# The kernels' REDUCED constant: products of halves (1), and hidden layers also summed in half (2).
_REDUCED = {"float16": 1, "float16-sums": 2, "float32": 0}
MAX_LAYERS = 4
Weights = Sequence[tuple[np.ndarray, np.ndarray]]  # per layer: weights (in, out) and bias (out,)


def _pow2_at_least(n: int, floor: int) -> int:
    p = floor
    while p < n:
        p *= 2
    return p


@dataclass(frozen=True)
class MLPSpec:
    """A chain of dense layers ``h = act(h @ W + b)`` with `widths` (input, hidden..., output).

    precision: "float16" (weights stored as halves, tensor-core products summed in float32),
    "float16-sums" (the same, but hidden layers at program scope sum in half, starting from their biases:
    fewer registers and instructions, about twice the rounding error) or "float32";
    scope: "program" (tl.dot; widths padded to powers of two ≥ 16) or "thread" (FMAs; powers of two).
    Padding rows and columns are zero, so padded inputs and outputs are ignored.
    """

    widths: tuple[int, ...]
    activations: tuple[str, ...]
    precision: str = "float16"
    scope: str = PROGRAM

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(self.widths))
        object.__setattr__(self, "activations", tuple(self.activations))
        layers = len(self.widths) - 1
        if not 1 <= layers <= MAX_LAYERS or any(not isinstance(w, int) or w < 1 for w in self.widths):
            raise ShapeError(f"MLPSpec: expected 2 to {MAX_LAYERS + 1} positive integer widths (input, hidden..., "
                             f"output), got {self.widths}")
        if len(self.activations) != layers or any(a not in ACTIVATIONS for a in self.activations):
            raise ShapeError(f"MLPSpec: expected one activation per layer ({layers}) from {ACTIVATIONS}, got "
                             f"{self.activations}")
        if self.precision not in PRECISIONS:
            raise ShapeError(f"MLPSpec: precision must be one of {tuple(PRECISIONS)}, got {self.precision!r}")
        check_scope(self.scope, "MLPSpec")

    @property
    def layers(self) -> int:
        return len(self.widths) - 1

    @property
    def padded(self) -> tuple[int, ...]:
        """The widths the kernel computes with: powers of two, at least 16 at program scope."""
        floor = MIN_DOT if self.scope == PROGRAM else 1
        return tuple(_pow2_at_least(w, floor) for w in self.widths)

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision]

    @property
    def parameter_count(self) -> int:
        """Weights and biases of the unpadded network."""
        return sum(a * b + b for a, b in zip(self.widths, self.widths[1:]))

    @property
    def stored_bits(self) -> int:
        """Bits the unpadded parameters take at the stored precision (the honest size of the network)."""
        return self.parameter_count * torch.finfo(self.dtype).bits

    @property
    def packed_numel(self) -> int:
        p = self.padded
        return sum(a * b + b for a, b in zip(p, p[1:]))

    def with_scope(self, scope: str) -> "MLPSpec":
        return MLPSpec(self.widths, self.activations, self.precision, scope)

    def constexprs(self, prefix: str = "MLP_") -> dict[str, object]:
        """Keyword arguments for a kernel declaring ``{prefix}LAYERS, {prefix}P0..P4, {prefix}A0..A3,
        {prefix}SCOPE, {prefix}REDUCED`` as tl.constexpr, to pass on to `language.mlp`."""
        p = self.padded + (1,) * (MAX_LAYERS + 1 - len(self.padded))
        a = self.activations + ("none",) * (MAX_LAYERS - self.layers)
        out: dict[str, object] = {f"{prefix}LAYERS": self.layers}
        out.update({f"{prefix}P{i}": v for i, v in enumerate(p)})
        out.update({f"{prefix}A{i}": v for i, v in enumerate(a)})
        out.update({f"{prefix}SCOPE": self.scope, f"{prefix}REDUCED": _REDUCED[self.precision]})
        return out

    def check(self, weights: Weights) -> list[tuple[np.ndarray, np.ndarray]]:
        """`weights` as float64 arrays, after checking each layer's shapes against the widths."""
        if len(weights) != self.layers:
            raise ShapeError(f"{self}: expected {self.layers} (weights, bias) pairs, got {len(weights)}")
        out = []
        for i, ((w, b), n_in, n_out) in enumerate(zip(weights, self.widths, self.widths[1:])):
            w, b = np.asarray(w, np.float64), np.asarray(b, np.float64)
            if w.shape != (n_in, n_out) or b.shape != (n_out,):
                raise ShapeError(f"{self}: layer {i} expects weights ({n_in}, {n_out}) and bias ({n_out},), got "
                                 f"{w.shape} and {b.shape}")
            out.append((w, b))
        return out

    def pack(self, weights: Weights, device: str | torch.device = "cpu") -> torch.Tensor:
        """One flat buffer of `precision`: per layer the zero-padded (P[l], P[l+1]) weights row-major, then
        the P[l+1] biases; what `language.mlp` reads."""
        parts = []
        for (w, b), pi, po in zip(self.check(weights), self.padded, self.padded[1:]):
            wp = np.zeros((pi, po))
            wp[:w.shape[0], :w.shape[1]] = w
            bp = np.zeros(po)
            bp[:b.shape[0]] = b
            parts += [wp.ravel(), bp]
        return torch.from_numpy(np.concatenate(parts)).to(device=device, dtype=self.dtype)

    def unpack(self, packed: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
        """The unpadded (weights, bias) pairs a packed buffer holds, as float64 arrays."""
        if packed.dim() != 1 or packed.numel() != self.packed_numel:
            raise ShapeError(f"{self}: expected a flat buffer of {self.packed_numel} elements, got "
                             f"{tuple(packed.shape)}")
        flat = packed.detach().to("cpu", torch.float64).numpy()
        out, at = [], 0
        for n_in, n_out, pi, po in zip(self.widths, self.widths[1:], self.padded, self.padded[1:]):
            w = flat[at:at + pi * po].reshape(pi, po)[:n_in, :n_out]
            at += pi * po
            out.append((w.copy(), flat[at:at + n_out].copy()))
            at += po
        return out

    def reference(self, x: torch.Tensor, weights: Weights, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The network on the rows of `x` (..., widths[0]) in PyTorch at `dtype`, on x's device."""
        if x.shape[-1] != self.widths[0]:
            raise ShapeError(f"{self}: expected inputs (..., {self.widths[0]}), got {tuple(x.shape)}")
        h = x.to(dtype)
        for (w, b), act in zip(self.check(weights), self.activations):
            h = h @ torch.as_tensor(w, dtype=dtype, device=x.device) + torch.as_tensor(b, dtype=dtype, device=x.device)
            h = {"none": lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[act](h)
        return h


_TORCH_ACTIVATIONS = {torch.nn.ReLU: "relu", torch.nn.Sigmoid: "sigmoid", torch.nn.Tanh: "tanh",
                      torch.nn.Identity: "none"}


def from_sequential(model: torch.nn.Sequential, precision: str = "float16",
                    scope: str = PROGRAM) -> tuple[MLPSpec, list[tuple[np.ndarray, np.ndarray]]]:
    """The spec and weights of a Sequential of Linear layers, each optionally followed by one of
    ReLU, Sigmoid, Tanh or Identity (Linear's (out, in) weights are transposed to (in, out))."""
    widths, acts, weights = [], [], []
    for i, layer in enumerate(model):
        if isinstance(layer, torch.nn.Linear):
            if widths and widths[-1] != layer.in_features:
                raise ShapeError(f"from_sequential: layer {i} takes {layer.in_features} features after "
                                 f"{widths[-1]}")
            widths[len(widths) - 1:] = [layer.in_features, layer.out_features]
            acts.append("none")
            bias = layer.bias.detach() if layer.bias is not None else torch.zeros(layer.out_features)
            weights.append((layer.weight.detach().double().cpu().numpy().T.copy(), bias.double().cpu().numpy()))
        elif type(layer) in _TORCH_ACTIVATIONS and acts and acts[-1] == "none":
            acts[-1] = _TORCH_ACTIVATIONS[type(layer)]
        else:
            raise ShapeError(f"from_sequential: layer {i} is {type(layer).__name__}; expected Linear layers, each "
                             f"followed by at most one of {[t.__name__ for t in _TORCH_ACTIVATIONS]}")
    return MLPSpec(tuple(widths), tuple(acts), precision, scope), weights


def from_graph(graph, parameters: Sequence, spec: MLPSpec) -> list[tuple[np.ndarray, np.ndarray]]:
    """The current values of a graph's variables [w0, b0, w1, b1, ...] (weights (in, out)) as `spec`'s
    weights, checked against its widths."""
    values = [graph.variable_value(v).numpy() for v in parameters]
    if len(values) != 2 * spec.layers:
        raise ShapeError(f"from_graph: {spec} needs {2 * spec.layers} variables (weights and bias per layer), "
                         f"got {len(values)}")
    return spec.check(list(zip(values[0::2], values[1::2])))


__all__ = ["MLPSpec", "ACTIVATIONS", "PRECISIONS", "from_sequential", "from_graph", "THREAD", "PROGRAM"]
