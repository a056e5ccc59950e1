"""Contractions and window ops: matrix multiplication, 2-D convolution and its
transpose, max and average pooling, and the gradient primitives they need.

These run as vendor kernels (cuBLAS, cuDNN through torch); the compiler fuses
elementwise work into their epilogues. Descriptors follow MPSGraph's
Convolution2DOpDescriptor and Pooling2DOpDescriptor; `padding` is an int,
(vertical, horizontal), (top, bottom, left, right), "valid" or "same" (TF's
rule: output extent ceil(input / stride), extra padding at the bottom/right).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch
import torch.nn.functional as F

from .. import dtypes
from ..errors import ShapeError
from ..ir import UNKNOWN, Tensor, TensorType, broadcast_shapes
from ..registry import CONTRACTION, OPAQUE, Primitive, builder, register
from .reduction import in_float32

Padding = Union[int, tuple, str]


def _pair(v, what):
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(x) for x in v)
    if len(v) != 2:
        raise ShapeError(f"{what} must be an int or a pair, got {v}")
    return v


def _padding(p):
    if isinstance(p, str):
        if p not in ("valid", "same"):
            raise ShapeError(f"padding {p!r} must be 'valid', 'same' or explicit")
        return p
    if isinstance(p, int):
        return (p, p, p, p)
    p = tuple(int(x) for x in p)
    if len(p) == 2:
        return (p[0], p[0], p[1], p[1])
    if len(p) == 4:
        return p
    raise ShapeError(f"padding {p} must be an int, (vertical, horizontal) or (top, bottom, left, right)")


@dataclass(frozen=True)
class Convolution2DDescriptor:
    """How a 2-D convolution slides: MPSGraph's Convolution2DOpDescriptor.

    >>> import stitchml as sm
    >>> sm.Convolution2DDescriptor(stride=2, padding="same").attrs()["stride"]
    (2, 2)
    """

    stride: int | tuple = 1
    dilation: int | tuple = 1
    padding: Padding = 0
    groups: int = 1
    data_layout: str = "NCHW"
    weights_layout: str = "OIHW"

    def attrs(self) -> dict:
        if self.data_layout not in ("NCHW", "NHWC"):
            raise ShapeError(f"data_layout {self.data_layout!r} must be 'NCHW' or 'NHWC'")
        if self.weights_layout not in ("OIHW", "HWIO"):
            raise ShapeError(f"weights_layout {self.weights_layout!r} must be 'OIHW' or 'HWIO'")
        if self.groups < 1:
            raise ShapeError(f"groups must be >= 1, got {self.groups}")
        stride, dilation = _pair(self.stride, "stride"), _pair(self.dilation, "dilation")
        if min(stride + dilation) < 1:
            raise ShapeError(f"stride {stride} and dilation {dilation} must be >= 1")
        return {"stride": stride, "dilation": dilation, "padding": _padding(self.padding), "groups": int(self.groups),
                "data_layout": self.data_layout, "weights_layout": self.weights_layout}


@dataclass(frozen=True)
class Pooling2DDescriptor:
    """How a 2-D pooling window slides: MPSGraph's Pooling2DOpDescriptor.

    `stride` defaults to the kernel size. `include_zero_padding` makes average
    pooling divide by the full window, padding included.
    """

    kernel_size: int | tuple = 2
    stride: int | tuple | None = None
    dilation: int | tuple = 1
    padding: Padding = 0
    ceil_mode: bool = False
    include_zero_padding: bool = False
    data_layout: str = "NCHW"

    def attrs(self) -> dict:
        if self.data_layout not in ("NCHW", "NHWC"):
            raise ShapeError(f"data_layout {self.data_layout!r} must be 'NCHW' or 'NHWC'")
        kernel = _pair(self.kernel_size, "kernel_size")
        stride = kernel if self.stride is None else _pair(self.stride, "stride")
        dilation = _pair(self.dilation, "dilation")
        if min(kernel + stride + dilation) < 1:
            raise ShapeError(f"kernel {kernel}, stride {stride} and dilation {dilation} must be >= 1")
        return {"kernel_size": kernel, "stride": stride, "dilation": dilation, "padding": _padding(self.padding),
                "ceil_mode": bool(self.ceil_mode), "include_zero_padding": bool(self.include_zero_padding),
                "data_layout": self.data_layout}


def _attrs_of(descriptor, cls, g, op, inputs):
    if descriptor is None:
        descriptor = cls()
    if isinstance(descriptor, dict):
        descriptor = cls(**descriptor)
    if not isinstance(descriptor, cls):
        raise g._error(op, f"expected a {cls.__name__}, got {type(descriptor).__name__}", inputs)
    try:
        return descriptor.attrs()
    except ShapeError as e:
        raise g._error(op, str(e), inputs) from None


# -- geometry shared by the shape rules and the implementations ---------------------
def _same_padding(n, k, s, d):
    total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def _resolve_padding(padding, hw, kernel, stride, dilation):
    """Explicit (top, bottom, left, right) for input extents `hw` (entries may be -1)."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        if UNKNOWN in hw:
            return None
        return _same_padding(hw[0], kernel[0], stride[0], dilation[0]) + _same_padding(hw[1], kernel[1], stride[1], dilation[1])
    return tuple(padding)


def _window_out(n, k, s, d, before, after, ceil_mode=False):
    if n == UNKNOWN:
        return UNKNOWN
    span = n + before + after - d * (k - 1) - 1
    if span < 0:
        raise ShapeError(f"the window ({k} with dilation {d}) is larger than the padded extent {n + before + after}")
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= n + before:  # PyTorch: the last window must start inside the input
        out -= 1
    return out


def _to_nchw(x, layout):
    return x if layout == "NCHW" else x.permute(0, 3, 1, 2)


def _from_nchw(x, layout):
    return x if layout == "NCHW" else x.permute(0, 2, 3, 1)


def _nchw_shape(shape, layout):
    return shape if layout == "NCHW" else (shape[0], shape[3], shape[1], shape[2])


def _layout_shape(n, c, h, w, layout):
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def _oihw(w, layout):
    return w if layout == "OIHW" else w.permute(3, 2, 0, 1)


def _weights_dims(shape, layout):
    return shape if layout == "OIHW" else (shape[3], shape[2], shape[0], shape[1])


# -- matrix_multiplication ------------------------------------------------------------
matrix_multiplication = register(Primitive(
    "matrix_multiplication", CONTRACTION, template="matmul",
    doc="Batched matrix product of the last two axes; leading axes broadcast.",
))


@matrix_multiplication.def_vendor
def _matmul_vendor(out, a, b):
    return torch.matmul(a, b, out=out)  # cuBLAS writes the product into the planned buffer


@matrix_multiplication.def_infer
def _matmul_infer(types):
    a, b = types
    if a.dtype != b.dtype:
        raise ShapeError(f"dtypes differ: {a.dtype} and {b.dtype}")
    if not a.dtype.is_floating:
        raise ShapeError(f"expects floating-point operands, got {a.dtype}")
    if a.shape is None or b.shape is None:
        return TensorType(None, a.dtype)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"operands need rank >= 2, got {a.shape} and {b.shape}")
    k1, k2 = a.shape[-1], b.shape[-2]
    if UNKNOWN not in (k1, k2) and k1 != k2:
        raise ShapeError(f"contraction extents differ: {a.shape} @ {b.shape} ({k1} != {k2})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return TensorType(batch + (a.shape[-2], b.shape[-1]), a.dtype)


matrix_multiplication.def_impl(in_float32(torch.matmul))


@matrix_multiplication.def_vjp
def _matmul_vjp(g, op, dy):
    a, b = op.inputs
    return [g.sum_to_shape(g.matrix_multiplication(dy, b.T), a), g.sum_to_shape(g.matrix_multiplication(a.T, dy), b)]


@builder("matrix_multiplication")
def _matrix_multiplication(g, primary, secondary, name=None):
    """``primary @ secondary`` with NumPy matmul rules (1-D operands are promoted and the axis removed)."""
    a, b = g.promote(primary, secondary, name="matrix_multiplication")
    if not a.dtype.is_floating:
        a, b = g.cast(a, dtypes.default_float), g.cast(b, dtypes.default_float)
    squeeze = []
    if a.rank == 1:
        a = g.expand_dims(a, 0)
        squeeze.append(-2)
    if b.rank == 1:
        b = g.expand_dims(b, -1)
        squeeze.append(-1)
    y = g._emit1("matrix_multiplication", [a, b], None, None if squeeze else name)
    if squeeze:
        y = g.squeeze(y, squeeze, name=name)
    return y


# -- convolution2d --------------------------------------------------------------------
def _conv_out_type(x, w, attrs, out_hw=None):
    layout, wl = attrs["data_layout"], attrs["weights_layout"]
    n, c, h, wd = _nchw_shape(x.shape, layout)
    o, i, kh, kw = _weights_dims(w.shape, wl)
    groups = attrs["groups"]
    if UNKNOWN not in (c, i) and c != i * groups:
        raise ShapeError(f"input channels {c} != weights input channels {i} x groups {groups}")
    if o != UNKNOWN and o % groups:
        raise ShapeError(f"output channels {o} are not divisible by groups {groups}")
    if out_hw is None:
        pad = _resolve_padding(attrs["padding"], (h, wd), (kh, kw), attrs["stride"], attrs["dilation"])
        (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
        if pad is None:
            out_hw = tuple(UNKNOWN if e == UNKNOWN else -(-e // s) for e, s in zip((h, wd), (sh, sw)))
        else:
            out_hw = (_window_out(h, kh, sh, dh, pad[0], pad[1]), _window_out(wd, kw, sw, dw, pad[2], pad[3]))
    return TensorType(_layout_shape(n, o, *out_hw, layout), x.dtype)


def _check_conv_types(types):
    x, w = types[0], types[1]
    if x.dtype != w.dtype:
        raise ShapeError(f"dtypes differ: {x.dtype} and {w.dtype}")
    if not x.dtype.is_floating:
        raise ShapeError(f"expects floating-point operands, got {x.dtype}")
    if x.rank not in (None, 4) or w.rank not in (None, 4):
        raise ShapeError(f"source and weights need rank 4, got {x.shape} and {w.shape}")
    return x.shape is not None and w.shape is not None


convolution2d = register(Primitive("convolution2d", CONTRACTION, template="convolution",
                                   doc="2-D convolution (cross-correlation, as in PyTorch)."))


@convolution2d.def_infer
def _conv_infer(types, **attrs):
    if not _check_conv_types(types):
        return TensorType(None, types[0].dtype)
    return _conv_out_type(types[0], types[1], attrs)


def _library_layout(attrs):
    """The memory format convolution operands reach the library in: channels-last when the compile asked for
    it (attribute `channels_last`, which the lowering sets for compile option `conv_channels_last`), else
    row-major. Results are made row-major again where they leave the library call."""
    return torch.channels_last if attrs.get("channels_last") else torch.contiguous_format


def _conv_padded_input(x, w_oihw, attrs):
    """(input, (pad_h, pad_w)) for the library call: symmetric padding goes to the library (no padded copy),
    anything else is padded here and the library pads nothing."""
    pad = _resolve_padding(attrs["padding"], x.shape[2:], w_oihw.shape[2:], attrs["stride"], attrs["dilation"])
    if pad[0] == pad[1] and pad[2] == pad[3]:
        return x, (pad[0], pad[2])
    return F.pad(x, (pad[2], pad[3], pad[0], pad[1])), (0, 0)


@convolution2d.def_impl
@in_float32
def _conv_impl(x, w, **attrs):
    x = _to_nchw(x, attrs["data_layout"])
    w = _oihw(w, attrs["weights_layout"])
    if attrs.get("channels_last"):
        fmt = _library_layout(attrs)
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    xp, padding = _conv_padded_input(x, w, attrs)
    y = F.conv2d(xp, w, stride=attrs["stride"], padding=padding, dilation=attrs["dilation"], groups=attrs["groups"])
    return _from_nchw(y, attrs["data_layout"])


@convolution2d.def_vendor
def _conv_vendor(out, x, w, **attrs):
    # cuDNN returns its own memory: the epilogue reads it where it is, row-major. cuDNN picks channels-last
    # output when an operand's strides look channels-last, which a contiguous tensor with one channel can (a
    # (N, 1, H, W) image batch, a (C, 1, k, k) filter); the epilogue was generated for the row-major layout,
    # so anything else is made row-major.
    y = _conv_impl(x, w, **attrs)
    return y if y.is_contiguous() else y.contiguous()


@convolution2d.def_vjp
def _conv_vjp(g, op, dy):
    x, w = op.inputs
    dx = g._emit1("convolution_transpose2d", [dy, w, x], op.attrs)
    dw = g._emit1("convolution2d_weights_gradient", [dy, x, w], op.attrs)
    return [dx, dw]


@builder("convolution2d")
def _convolution2d(g, source, weights, descriptor=None, name=None):
    """2-D convolution of `source` (NCHW or NHWC) with `weights` (OIHW or HWIO)."""
    source, weights = g.promote(source, weights, name="convolution2d")
    attrs = _attrs_of(descriptor, Convolution2DDescriptor, g, "convolution2d", [source, weights])
    return g._emit1("convolution2d", [source, weights], attrs, name)


convolution_transpose2d = register(Primitive(
    "convolution_transpose2d", CONTRACTION,
    doc=("The adjoint of convolution2d with the same weights and descriptor: weights keep the forward layout "
         "(O = this op's input channels). The output size is that of `like` when given."),
))


def _transpose_out_hw(h, w, kernel, attrs, output_padding):
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    pad = attrs["padding"]
    out = []
    for n, k, s, d, op_, axis in ((h, kernel[0], sh, dh, output_padding[0], 0), (w, kernel[1], sw, dw, output_padding[1], 1)):
        if n == UNKNOWN:
            out.append(UNKNOWN)
        elif pad == "same":
            out.append(n * s)
        elif pad == "valid":
            out.append((n - 1) * s + d * (k - 1) + 1 + op_)
        else:
            out.append((n - 1) * s - pad[2 * axis] - pad[2 * axis + 1] + d * (k - 1) + 1 + op_)
    return tuple(out)


@convolution_transpose2d.def_infer
def _conv_transpose_infer(types, output_padding=(0, 0), **attrs):
    if not _check_conv_types(types):
        return TensorType(None, types[0].dtype)
    x, w = types[0], types[1]
    layout = attrs["data_layout"]
    n, c, h, wd = _nchw_shape(x.shape, layout)
    o, i, kh, kw = _weights_dims(w.shape, attrs["weights_layout"])
    if UNKNOWN not in (c, o) and c != o:
        raise ShapeError(f"source channels {c} != the weights' output channels {o}")
    if len(types) == 3 and types[2].shape is not None:
        return TensorType(types[2].shape, x.dtype)
    ho, wo = _transpose_out_hw(h, wd, (kh, kw), attrs, output_padding)
    return TensorType(_layout_shape(n, UNKNOWN if i == UNKNOWN else i * attrs["groups"], ho, wo, layout), x.dtype)


@convolution_transpose2d.def_impl
@in_float32
def _conv_transpose_impl(x, w, like=None, output_padding=(0, 0), **attrs):
    layout = attrs["data_layout"]
    x, w = _to_nchw(x, layout), _oihw(w, attrs["weights_layout"])
    if attrs.get("channels_last"):
        fmt = _library_layout(attrs)
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    kernel = w.shape[2:]
    if like is not None:
        target = _nchw_shape(tuple(like.shape), layout)[2:]
    else:
        target = _transpose_out_hw(x.shape[2], x.shape[3], kernel, attrs, output_padding)
    pad = _resolve_padding(attrs["padding"], target, kernel, attrs["stride"], attrs["dilation"])
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    if pad[0] == pad[1] and pad[2] == pad[3]:  # the library crops symmetric padding itself: no strided slice
        extra = [t - ((n - 1) * s - 2 * p + d * (k - 1) + 1)
                 for t, n, s, p, d, k in ((target[0], x.shape[2], sh, pad[0], dh, kernel[0]),
                                          (target[1], x.shape[3], sw, pad[2], dw, kernel[1]))]
        if 0 <= extra[0] < max(sh, dh) and 0 <= extra[1] < max(sw, dw):
            y = F.conv_transpose2d(x, w, stride=attrs["stride"], padding=(pad[0], pad[2]), output_padding=extra,
                                   dilation=attrs["dilation"], groups=attrs["groups"])
            return _from_nchw(y, layout)
    full = F.conv_transpose2d(x, w, stride=attrs["stride"], dilation=attrs["dilation"], groups=attrs["groups"])
    need_h, need_w = pad[0] + target[0], pad[2] + target[1]
    extra_h, extra_w = max(need_h - full.shape[2], 0), max(need_w - full.shape[3], 0)
    if extra_h or extra_w:
        full = F.pad(full, (0, extra_w, 0, extra_h))
    y = full[:, :, pad[0]:need_h, pad[2]:need_w]
    return _from_nchw(y, layout)


@convolution_transpose2d.def_vjp
def _conv_transpose_vjp(g, op, dy):
    x, w = op.inputs[:2]
    attrs = {k: v for k, v in op.attrs.items() if k != "output_padding"}
    dx = g._emit1("convolution2d", [dy, w], attrs)
    dw = g._emit1("convolution2d_weights_gradient", [x, dy, w], attrs)
    return [dx, dw] + [None] * (len(op.inputs) - 2)


@builder("convolution_transpose2d")
def _convolution_transpose2d(g, source, weights, descriptor=None, output_shape=None, output_padding=(0, 0), name=None):
    """Transposed convolution ("deconvolution"): the gradient of convolution2d w.r.t. its source.

    `output_shape` (a tensor whose shape to take) removes the ambiguity a
    stride > 1 leaves; else `output_padding` adds rows/columns at the end.
    """
    source, weights = g.promote(source, weights, name="convolution_transpose2d")
    attrs = _attrs_of(descriptor, Convolution2DDescriptor, g, "convolution_transpose2d", [source, weights])
    inputs = [source, weights]
    if isinstance(output_shape, Tensor):
        inputs.append(output_shape)
    elif output_shape is not None:
        raise g._error("convolution_transpose2d", "output_shape must be a tensor whose shape to take", inputs)
    else:
        attrs["output_padding"] = g._checked("convolution_transpose2d", inputs, _pair, output_padding, "output_padding")
    return g._emit1("convolution_transpose2d", inputs, attrs, name)


convolution2d_weights_gradient = register(Primitive(
    "convolution2d_weights_gradient", CONTRACTION,
    doc="d(convolution2d)/d(weights) applied to `dy`: inputs (dy, source, weights_like), in the weights' layout.",
))


@convolution2d_weights_gradient.def_infer
def _conv_wgrad_infer(types, **attrs):
    return TensorType(types[2].shape, types[0].dtype)


@convolution2d_weights_gradient.def_impl
@in_float32
def _conv_wgrad_impl(dy, x, w, **attrs):
    layout = attrs["data_layout"]
    dy, x, w_oihw = _to_nchw(dy, layout), _to_nchw(x, layout), _oihw(w, attrs["weights_layout"])
    xp, padding = _conv_padded_input(x, w_oihw, attrs)
    fmt = _library_layout(attrs)
    _, dw, _ = torch.ops.aten.convolution_backward(
        dy.contiguous(memory_format=fmt), xp.contiguous(memory_format=fmt), w_oihw.contiguous(memory_format=fmt), None, list(attrs["stride"]), list(padding),
        list(attrs["dilation"]), False, [0, 0], attrs["groups"], [False, True, False])
    return dw if attrs["weights_layout"] == "OIHW" else dw.permute(2, 3, 1, 0)


@convolution2d_weights_gradient.def_vjp
def _conv_wgrad_vjp(g, op, ddw):
    dy, x, w = op.inputs
    # Bilinear in (dy, x): d/d(dy) is the forward conv of x with ddw; d/dx the transpose conv of dy with ddw.
    return [g._emit1("convolution2d", [x, ddw], op.attrs), g._emit1("convolution_transpose2d", [dy, ddw, x], op.attrs), None]


# -- pooling ---------------------------------------------------------------------------
def _pool_infer(types, **attrs):
    (x,) = types[:1]
    if x.shape is None:
        return TensorType(None, x.dtype)
    if x.rank != 4:
        raise ShapeError(f"source needs rank 4, got {x.shape}")
    n, c, h, w = _nchw_shape(x.shape, attrs["data_layout"])
    kernel, stride, dil = attrs["kernel_size"], attrs["stride"], attrs["dilation"]
    pad = _resolve_padding(attrs["padding"], (h, w), kernel, stride, dil)
    if pad is None:
        hw = tuple(UNKNOWN if e == UNKNOWN else -(-e // s) for e, s in zip((h, w), stride))
    else:
        if max(pad[0], pad[1]) > kernel[0] * dil[0] or max(pad[2], pad[3]) > kernel[1] * dil[1]:
            raise ShapeError(f"padding {pad} is wider than the window {kernel}")
        hw = (_window_out(h, kernel[0], stride[0], dil[0], pad[0], pad[1], attrs["ceil_mode"]),
              _window_out(w, kernel[1], stride[1], dil[1], pad[2], pad[3], attrs["ceil_mode"]))
    return TensorType(_layout_shape(n, c, *hw, attrs["data_layout"]), x.dtype)


def _pool_geometry(x, attrs):
    """Explicit padding (for F.pad) and the output extents of the shape rule, for an NCHW input."""
    kernel, stride, dil = attrs["kernel_size"], attrs["stride"], attrs["dilation"]
    pad = _resolve_padding(attrs["padding"], x.shape[2:], kernel, stride, dil)
    out = tuple(_window_out(x.shape[2 + a], kernel[a], stride[a], dil[a], pad[2 * a], pad[2 * a + 1],
                            attrs["ceil_mode"]) for a in range(2))
    return (pad[2], pad[3], pad[0], pad[1]), out


def _padded(x, spec, value=0.0):
    """F.pad, except that no padding is no copy (F.pad copies even then: a pool over a whole
    activation would read and write it once more for nothing)."""
    return F.pad(x, spec, value=value) if any(spec) else x


def _pooled(fn, xp, attrs, out):
    """`fn` over windows of the padded input, cut to the shape rule's extents.

    torch sees the padding as input, so in ceil mode it keeps a last window that
    starts in the bottom/right padding; PyTorch's own rule (and ours) drops it.
    """
    y = fn(xp, attrs["kernel_size"], attrs["stride"], 0, attrs["dilation"], ceil_mode=attrs["ceil_mode"])
    return y[:, :, :out[0], :out[1]]


def _window_sum(xp, kernel, stride, padding, dilation, ceil_mode):
    return F.avg_pool2d(xp, kernel, stride, padding, ceil_mode, True, divisor_override=1)


def _torch_padding(spec, attrs) -> tuple[int, int] | None:
    """The padding to hand torch's own pooling (one kernel, no padded copy, no divisor computed per run), or
    None where its rules differ from ours: asymmetric padding, more than half a window, ceil mode (torch's
    divisor of a window that runs past the input)."""
    left, right, top, bottom = spec
    (kh, kw), ceil = attrs["kernel_size"], attrs["ceil_mode"]
    if left != right or top != bottom or 2 * top > kh or 2 * left > kw or ceil:
        return None
    return top, left


def _pool_impl(kind):
    def impl(x, **attrs):
        layout = attrs["data_layout"]
        x = _to_nchw(x, layout)
        spec, out = _pool_geometry(x, attrs)
        padding = _torch_padding(spec, attrs) if x.dtype.is_floating_point else None
        if padding is not None:
            if kind == "max":
                y = F.max_pool2d(x, attrs["kernel_size"], attrs["stride"], padding, attrs["dilation"])
            else:  # the divisor: the window's size, or (include_zero_padding off) its part inside the input
                y = F.avg_pool2d(x, attrs["kernel_size"], attrs["stride"], padding,
                                 count_include_pad=attrs["include_zero_padding"])
            if tuple(y.shape[2:]) == out:
                return _from_nchw(y, layout)
        if kind == "max":
            fill = float("-inf") if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
            y = _pooled(F.max_pool2d, _padded(x, spec, fill), attrs, out)
        else:
            sums = _pooled(_window_sum, _padded(x, spec), attrs, out)
            ones = F.pad(torch.ones_like(x[:1, :1]), spec, value=1.0 if attrs["include_zero_padding"] else 0.0)
            y = sums / _pooled(_window_sum, ones, attrs, out)
        return _from_nchw(y, layout)

    return impl if kind == "max" else in_float32(impl)


max_pooling2d = register(Primitive("max_pooling2d", OPAQUE, infer=_pool_infer, impl=_pool_impl("max"),
                                   doc="Maximum over each window (padding never wins)."))
avg_pooling2d = register(Primitive("avg_pooling2d", OPAQUE, infer=_pool_infer, impl=_pool_impl("avg"),
                                   doc="Mean over each window (padding excluded unless include_zero_padding)."))


def _pool_gradient_impl(forward):
    def impl(dy, x, **attrs):
        with torch.enable_grad():
            xx = x.detach().requires_grad_(True)
            (dx,) = torch.autograd.grad(forward(xx, **attrs), xx, dy)
        return dx

    return in_float32(impl)


@in_float32
def _max_pool_gradient_impl(dy, x, **attrs):
    """The window maxima's indices and PyTorch's scatter of `dy` to them (no autograd round trip)."""
    layout = attrs["data_layout"]
    xv, dyv = _to_nchw(x, layout), _to_nchw(dy, layout)
    spec, out = _pool_geometry(xv, attrs)
    fill = float("-inf") if xv.dtype.is_floating_point else torch.iinfo(xv.dtype).min
    xp = _padded(xv, spec, fill)
    window = (attrs["kernel_size"], attrs["stride"], [0, 0], attrs["dilation"], attrs["ceil_mode"])
    full, indices = torch.ops.aten.max_pool2d_with_indices(xp, *window)
    if tuple(full.shape[2:]) != tuple(out):  # a last window the shape rule drops gets no cotangent
        grad = torch.zeros_like(full)
        grad[:, :, :out[0], :out[1]] = dyv
    else:
        grad = dyv.contiguous()
    dxp = torch.ops.aten.max_pool2d_with_indices_backward(grad, xp, *window, indices)
    h, w = xv.shape[2:]
    return _from_nchw(dxp[:, :, spec[2]:spec[2] + h, spec[0]:spec[0] + w], layout)


max_pooling2d_gradient = register(Primitive(
    "max_pooling2d_gradient", OPAQUE, infer=lambda types, **attrs: TensorType(types[1].shape, types[0].dtype),
    impl=_max_pool_gradient_impl, doc="Route `dy` back to each window's maximum: inputs (dy, source).",
))
avg_pooling2d_gradient = register(Primitive(
    "avg_pooling2d_gradient", OPAQUE, infer=lambda types, **attrs: TensorType(types[1].shape, types[0].dtype),
    impl=_pool_gradient_impl(avg_pooling2d.impl), doc="Spread `dy` evenly over each window: inputs (dy, source_like).",
))

max_pooling2d.def_vjp(lambda g, op, dy: [g._emit1("max_pooling2d_gradient", [dy, op.inputs[0]], op.attrs)])
avg_pooling2d.def_vjp(lambda g, op, dy: [g._emit1("avg_pooling2d_gradient", [dy, op.inputs[0]], op.attrs)])
avg_pooling2d_gradient.def_vjp(lambda g, op, ddx: [g._emit1("avg_pooling2d", [ddx], op.attrs), None])


@max_pooling2d_gradient.def_vjp
def _max_pool_grad_vjp(g, op, ddx):
    # The gradient routes dy through a fixed selection: its adjoint picks the same elements of ddx.
    dy, x = op.inputs
    return [g._emit1("max_pooling2d_select", [ddx, x], op.attrs), None]


max_pooling2d_select = register(Primitive(
    "max_pooling2d_select", OPAQUE, infer=lambda types, **attrs: _pool_infer(types[1:], **attrs),
    doc="For each window of `source`, the element of `values` at the window's argmax: inputs (values, source).",
))


@max_pooling2d_select.def_impl
def _max_pool_select_impl(values, x, **attrs):
    layout = attrs["data_layout"]
    xv, vv = _to_nchw(x, layout), _to_nchw(values, layout)
    spec, out = _pool_geometry(xv, attrs)

    def argmax(xp, kernel, stride, padding, dilation, ceil_mode):
        return F.max_pool2d(xp, kernel, stride, padding, dilation, ceil_mode, return_indices=True)[1]

    idx = _pooled(argmax, _padded(xv, spec, float("-inf")), attrs, out)
    picked = _padded(vv, spec).flatten(2).gather(2, idx.flatten(2)).reshape(idx.shape)
    return _from_nchw(picked, layout)


max_pooling2d_select.def_vjp(lambda g, op, d: [g._emit1("max_pooling2d_gradient", [d, op.inputs[1]], op.attrs), None])


@builder("max_pooling2d")
def _max_pooling2d(g, source, descriptor=None, name=None):
    """Max pooling over 2-D windows (MPSGraph maxPooling2D)."""
    source = g.as_tensor(source)
    return g._emit1("max_pooling2d", [source], _attrs_of(descriptor, Pooling2DDescriptor, g, "max_pooling2d", [source]), name)


@builder("avg_pooling2d")
def _avg_pooling2d(g, source, descriptor=None, name=None):
    """Average pooling over 2-D windows (MPSGraph avgPooling2D)."""
    source = g.as_tensor(source)
    if not source.dtype.is_floating:
        raise g._error("avg_pooling2d", f"expects a floating-point source, got {source.dtype}", [source])
    attrs = _attrs_of(descriptor, Pooling2DDescriptor, g, "avg_pooling2d", [source])
    if attrs["dilation"] != (1, 1):
        raise g._error("avg_pooling2d", f"supports dilation 1 only, got {attrs['dilation']}", [source])
    return g._emit1("avg_pooling2d", [source], attrs, name)
