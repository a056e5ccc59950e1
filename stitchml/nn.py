"""Layers: functions over tensors, each paired with a class that owns its variables.

The functions (`dense`, `conv2d`) only build operations from the tensors they
are given; the classes (`Dense`, `Conv2d`) make the variables with PyTorch's
default initialisation (uniform in ±1/sqrt(fan_in)) drawn from a NumPy
generator, so a seed gives the same weights everywhere, and call the function.

    >>> import numpy as np, stitchml as sm
    >>> g = sm.Graph()
    >>> layer = sm.nn.Dense(g, 4, 3, rng=np.random.default_rng(0), name="fc")
    >>> x = g.placeholder((-1, 4), sm.float32, name="x")
    >>> y = layer(x)
    >>> g.run({x: np.ones((2, 4), np.float32)}, [y], device="cpu")[y].shape, [v.name for v in layer.parameters]
    ((2, 3), ['fc/weights', 'fc/bias'])
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes
from .ir import Tensor
from .ops import Convolution2DDescriptor


def dense(g, x: Tensor, weights: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weights + bias`` with weights shaped (in, out)."""
    y = g.matrix_multiplication(x, weights)
    return y if bias is None else y + bias


def conv2d(g, x: Tensor, weights: Tensor, bias: Tensor | None = None,
           descriptor: Convolution2DDescriptor | None = None) -> Tensor:
    """2-D convolution of `x` with `weights` (layouts as the descriptor says; NCHW and OIHW by
    default), then the per-channel bias add."""
    y = g.convolution2d(x, weights, descriptor)
    if bias is None:
        return y
    channels_last = descriptor is not None and descriptor.data_layout == "NHWC"
    return y + (bias if channels_last else g.reshape(bias, (-1, 1, 1)))


class Module:
    """Something with variables: `parameters` lists them in a fixed order."""

    parameters: list[Tensor]

    def _make(self, g, name: str, shape: tuple[int, ...], fan_in: int, rng: np.random.Generator, dtype) -> Tensor:
        bound = 1.0 / math.sqrt(fan_in)
        value = rng.uniform(-bound, bound, shape).astype(dtypes.as_dtype(dtype).numpy)
        return g.variable(value, name=name)


class Dense(Module):
    """A fully connected layer: weights (in_features, out_features) and an optional bias."""

    def __init__(self, g, in_features: int, out_features: int, bias: bool = True, *,
                 rng: np.random.Generator, dtype=dtypes.float32, name: str = "dense") -> None:
        self.graph = g
        self.weights = self._make(g, f"{name}/weights", (in_features, out_features), in_features, rng, dtype)
        self.bias = self._make(g, f"{name}/bias", (out_features,), in_features, rng, dtype) if bias else None
        self.parameters = [self.weights] + ([self.bias] if bias else [])

    def __call__(self, x: Tensor) -> Tensor:
        return dense(self.graph, x, self.weights, self.bias)


class Conv2d(Module):
    """A 2-D convolution layer: weights (out, in / groups, kh, kw) and an optional bias.

    The descriptor sets stride, padding, dilation, groups and the data layout; the
    weights are OIHW.
    """

    def __init__(self, g, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 descriptor: Convolution2DDescriptor | None = None, bias: bool = True, *,
                 rng: np.random.Generator, dtype=dtypes.float32, name: str = "conv") -> None:
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        descriptor = descriptor or Convolution2DDescriptor()
        if descriptor.weights_layout != "OIHW":
            raise g._error("Conv2d", f"expected a descriptor with weights_layout 'OIHW', got "
                                     f"{descriptor.weights_layout!r}")
        per_group = in_channels // descriptor.groups
        fan_in = per_group * kh * kw
        self.graph, self.descriptor = g, descriptor
        self.weights = self._make(g, f"{name}/weights", (out_channels, per_group, kh, kw), fan_in, rng, dtype)
        self.bias = self._make(g, f"{name}/bias", (out_channels,), fan_in, rng, dtype) if bias else None
        self.parameters = [self.weights] + ([self.bias] if bias else [])

    def __call__(self, x: Tensor) -> Tensor:
        return conv2d(self.graph, x, self.weights, self.bias, self.descriptor)


__all__ = ["dense", "conv2d", "Module", "Dense", "Conv2d"]
