"""Layers: functions over tensors, each paired with a class that owns its variables.

The functions (`dense`, `conv2d`, `conv_transpose2d`) only build operations from the tensors they
are given; the classes (`Dense`, `Conv2d`) make the variables with PyTorch's
default initialisation (uniform in ±1/sqrt(fan_in)) drawn from a NumPy
generator, so a seed gives the same weights everywhere, and call the function.
`BatchNorm` also owns running statistics, which its calls in training mode
update through the assignments they add to its `updates`.

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


def conv_transpose2d(g, x: Tensor, weights: Tensor, bias: Tensor | None = None,
                     descriptor: Convolution2DDescriptor | None = None, output_padding=(0, 0)) -> Tensor:
    """Transposed 2-D convolution of `x` (weights (in, out / groups, kh, kw), torch's ConvTranspose2d layout),
    then the per-channel bias add."""
    y = g.convolution_transpose2d(x, weights, descriptor, output_padding=output_padding)
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


class ConvTranspose2d(Module):
    """A transposed 2-D convolution layer (torch.nn.ConvTranspose2d): weights (in, out / groups, kh, kw).

    With stride s, kernel k and padding p an extent n becomes (n - 1) s - 2 p + k (+ `output_padding`):
    stride 2, kernel 4, padding 1 doubles it.
    """

    def __init__(self, g, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 descriptor: Convolution2DDescriptor | None = None, bias: bool = True, output_padding=(0, 0), *,
                 rng: np.random.Generator, dtype=dtypes.float32, name: str = "conv_transpose") -> None:
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        descriptor = descriptor or Convolution2DDescriptor()
        if descriptor.weights_layout != "OIHW":
            raise g._error("ConvTranspose2d", f"expected a descriptor with weights_layout 'OIHW', got "
                                              f"{descriptor.weights_layout!r}")
        per_group = out_channels // descriptor.groups
        fan_in = per_group * kh * kw  # torch computes it from the weights' second axis, as here
        self.graph, self.descriptor, self.output_padding = g, descriptor, output_padding
        self.weights = self._make(g, f"{name}/weights", (in_channels, per_group, kh, kw), fan_in, rng, dtype)
        self.bias = self._make(g, f"{name}/bias", (out_channels,), fan_in, rng, dtype) if bias else None
        self.parameters = [self.weights] + ([self.bias] if bias else [])

    def __call__(self, x: Tensor) -> Tensor:
        return conv_transpose2d(self.graph, x, self.weights, self.bias, self.descriptor, self.output_padding)


class BatchNorm(Module):
    """Batch normalization over every axis but `channel_axis` (torch.nn.BatchNorm1d/2d), with running statistics.

    `parameters` are gamma (ones) and beta (zeros), shaped (channels,); `running_mean` (zeros) and
    `running_variance` (ones) are variables outside `parameters` that no optimizer touches. A call with
    `training` True (or a scalar bool tensor) normalizes with the batch's statistics and adds to `updates`
    the two assignments that move the running statistics by `momentum` (pass them as target operations);
    with False it normalizes with the running statistics.

        >>> import numpy as np, stitchml as sm
        >>> g = sm.Graph()
        >>> bn = sm.nn.BatchNorm(g, 3, name="bn")
        >>> x = g.placeholder((-1, 3, 4, 4), sm.float32, name="x")
        >>> y = bn(x)
        >>> [v.name for v in bn.parameters], len(bn.updates)
        (['bn/gamma', 'bn/beta'], 2)
    """

    def __init__(self, g, channels: int, *, momentum: float = 0.1, epsilon: float = 1e-5, channel_axis: int = 1,
                 dtype=dtypes.float32, name: str = "batch_norm") -> None:
        numpy_type = dtypes.as_dtype(dtype).numpy
        self.graph, self.momentum, self.epsilon, self.channel_axis = g, momentum, epsilon, channel_axis
        self.gamma = g.variable(np.ones(channels, numpy_type), name=f"{name}/gamma")
        self.beta = g.variable(np.zeros(channels, numpy_type), name=f"{name}/beta")
        self.running_mean = g.variable(np.zeros(channels, numpy_type), name=f"{name}/running_mean")
        self.running_variance = g.variable(np.ones(channels, numpy_type), name=f"{name}/running_variance")
        self.parameters = [self.gamma, self.beta]
        self.updates: list = []

    def __call__(self, x: Tensor, training: bool | Tensor = True) -> Tensor:
        g = self.graph
        if x.rank is None:
            raise g._error("BatchNorm", "expected a tensor of known rank", [x])
        c = self.channel_axis + x.rank if self.channel_axis < 0 else self.channel_axis
        gamma, beta = (g.reshape(t, (-1,) + (1,) * max(x.rank - 1 - c, 0)) for t in (self.gamma, self.beta))
        y, updates = g.batch_normalization(x, gamma=gamma, beta=beta, epsilon=self.epsilon,
                                           channel_axis=self.channel_axis, running_mean=self.running_mean,
                                           running_variance=self.running_variance, momentum=self.momentum,
                                           training=training)
        self.updates.extend(updates)
        return y


__all__ = ["dense", "conv2d", "conv_transpose2d", "Module", "Dense", "Conv2d", "ConvTranspose2d", "BatchNorm"]
