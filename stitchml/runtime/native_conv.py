"""Convolutions on the native CPU backend: PyTorch's (oneDNN's) kernels called with the padding inside them,
and the buffer a native direct convolution writes its product into (`BindBuffer`).

The op-by-op implementations (ops/contraction.py) serve every layout, dtype and padding: they pad the input
with a copy first (any padding, also the uneven "same" padding of an even kernel), and the transposed
convolution computes the whole result and cuts it. On the CPU the padded copy of an activation costs about
as much as the convolution itself. Where the padding is even on both sides (the odd kernels of "same"
padding, explicit symmetric padding), NCHW data, OIHW weights and float32 or float64, the calls below hand
the padding to the library instead; the results agree with the padded call's within rounding (oneDNN may
pick another algorithm for the other shape: tests/test_cpu_window.py holds both to float64). Anything else
keeps the op-by-op implementation. Each call keeps its last result alive until its next one (`_Held`), so
that the allocator reuses that memory rather than faulting fresh pages in every run.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..ir import Operation
from ..ops.contraction import _resolve_padding

_TYPES = ("float32", "float64")


def _even_padding(op: Operation, x_shape: tuple, w_shape: tuple) -> tuple[int, int] | None:
    """(rows, columns) of padding on each side, or None where it differs between the sides."""
    attrs = op.attrs
    if attrs["data_layout"] != "NCHW" or attrs["weights_layout"] != "OIHW":
        return None
    pad = _resolve_padding(attrs["padding"], x_shape[2:], w_shape[2:], attrs["stride"], attrs["dilation"])
    if pad is None or pad[0] != pad[1] or pad[2] != pad[3]:
        return None
    return pad[0], pad[2]


def call(op: Operation) -> Callable[..., torch.Tensor] | None:
    """A function of the op's inputs returning its result for convolution2d, convolution_transpose2d and
    convolution2d_weights_gradient where the padding is even (see the module docstring), else None."""
    if op.op not in ("convolution2d", "convolution_transpose2d", "convolution2d_weights_gradient") or \
            op.outputs[0].dtype.name not in _TYPES or any(t.dtype.name not in _TYPES for t in op.inputs[:2]):
        return None
    attrs = op.attrs
    stride, dilation, groups = list(attrs["stride"]), list(attrs["dilation"]), attrs["groups"]
    if op.op == "convolution2d":
        x, w = op.inputs
        pad = _even_padding(op, x.shape, w.shape)
        if pad is None:
            return None
        return _Held(lambda xv, wv: torch.conv2d(xv, wv, None, stride, pad, dilation, groups))
    if op.op == "convolution_transpose2d":
        dy, w = op.inputs[:2]
        target = op.outputs[0].shape
        pad = _even_padding(op, target, w.shape)
        if pad is None:
            return None
        kernel = w.shape[2:]
        extra = [target[2 + a] - ((dy.shape[2 + a] - 1) * stride[a] - 2 * pad[a] + dilation[a] * (kernel[a] - 1) + 1)
                 for a in range(2)]
        if any(e < 0 or e >= max(stride[a], dilation[a]) for a, e in enumerate(extra)):
            return None
        return _Held(lambda dyv, wv, *_: torch.conv_transpose2d(dyv, wv, None, stride, pad, extra, groups, dilation))
    if op.op == "convolution2d_weights_gradient":
        dy, x, w = op.inputs
        pad = _even_padding(op, x.shape, w.shape)
        if pad is None:
            return None

        def weights_gradient(dyv, xv, wv):
            return torch.ops.aten.convolution_backward(dyv, xv, wv, None, stride, list(pad), dilation, False, [0, 0],
                                                       groups, [False, True, False])[1]

        return _Held(weights_gradient)


class BindBuffer:
    """A step part binding a buffer made once (on the first run) to `slot`: a kernel's own result that the
    memory plan does not place (the direct convolution's product before its epilogue, where the library
    call would have bound memory of its own)."""

    def __init__(self, slot: int, shape, dtype: torch.dtype):
        self.slot, self.shape, self.dtype, self.buffer = slot, tuple(shape), dtype, None

    def __call__(self, env: list) -> None:
        if self.buffer is None:
            self.buffer = torch.empty(self.shape, dtype=self.dtype)
        env[self.slot] = self.buffer


class _Held:
    """A library call that keeps its last result alive until its next call has returned.

    The library's result is memory of its own (oneDNN writes no caller buffer); dropped at the end of each
    run, it was freed at the top of the heap, which the allocator then hands back to the system, so the next
    run's call faulted every page of a fresh result in again: ~2300 page faults a training step of the digit
    classifier at batch 128, about a tenth of the step. Held, the next result is allocated while the last is
    still live and the freed one stays below it in the heap, where the call after reuses it: ~200 faults.
    The held tensor is never written again (runs bind the new result), so a caller that kept the old one
    sees no change."""

    def __init__(self, fn: Callable[..., torch.Tensor]):
        self.fn, self.last = fn, None

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        self.last = self.fn(*args)
        return self.last
