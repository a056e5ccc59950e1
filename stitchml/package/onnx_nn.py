"""ONNX network operators: matrix products, convolution, pooling and normalization.

Handlers as in onnx_ops.py. 1-D convolution and pooling run as 2-D ones with
an extent-1 H axis; ONNX's explicit pads ``[x1_begin, x2_begin, x1_end,
x2_end]`` become the descriptors' (top, bottom, left, right).
"""
from __future__ import annotations

from .. import dtypes
from ..ir import UNKNOWN, Tensor
from ..ops import Convolution2DDescriptor, Pooling2DDescriptor
from . import shapes
from .onnx_ops import _rank, _t, handles


# -- linear algebra -------------------------------------------------------------------------
@handles("MatMul")
def _matmul(cx, node, args, attrs):
    return [cx.g.matrix_multiplication(_t(cx, args[0]), _t(cx, args[1]))]


@handles("Gemm")
def _gemm(cx, node, args, attrs):
    g = cx.g
    a, b = _t(cx, args[0]), _t(cx, args[1])
    if attrs.get("transA", 0):
        a = g.transpose(a)
    if attrs.get("transB", 0):
        b = g.transpose(b)
    y = g.matrix_multiplication(a, b)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if len(args) > 2 and args[2] is not None:
        c = _t(cx, args[2])
        y = y + (c * beta if beta != 1.0 else c)
    return [y]


def _conv_descriptor_pads(cx, attrs, spatial, kernel, strides, dilations):
    """Our padding value (tuple or 'same') for ONNX auto_pad / pads."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto == "VALID":
        return (0, 0, 0, 0)
    if auto == "SAME_UPPER":
        return "same"
    if auto == "SAME_LOWER":
        if UNKNOWN in spatial:
            raise cx.fail("auto_pad SAME_LOWER needs known spatial extents")
        out = []
        for n, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            out.append((total - total // 2, total // 2))
        return (out[0][0], out[0][1], out[1][0], out[1][1])
    p = list(attrs.get("pads", [0] * 2 * len(kernel)))
    return (p[0], p[2], p[1], p[3])


def _as_2d(cx, x: Tensor, spatial_rank: int, what: str) -> tuple[Tensor, bool]:
    if spatial_rank == 2:
        return x, False
    if spatial_rank == 1:
        return cx.g.expand_dims(x, [2]), True
    raise cx.fail(f"{what} over {spatial_rank} spatial axes is not supported (1-D and 2-D are)")


def _pair_of(attrs, key, default, one_d, fill=1):
    v = list(attrs.get(key, default))
    return [fill] + v if one_d else v


def _conv_operands(cx, node, args, attrs):
    """Source and weights as 2-D (a 1-D convolution gets an extent-1 H axis), kernel, strides, dilations."""
    x, w = _t(cx, args[0]), _t(cx, args[1])
    x2, one_d = _as_2d(cx, x, _rank(cx, x) - 2, node.op_type)
    w2 = cx.g.expand_dims(w, [2]) if one_d else w
    strides = _pair_of(attrs, "strides", [1] * (2 - one_d), one_d)
    dil = _pair_of(attrs, "dilations", [1] * (2 - one_d), one_d)
    return x2, w2, one_d, list(w2.shape[2:]), strides, dil


def _conv_result(cx, y, args, one_d):
    if len(args) > 2 and args[2] is not None:
        y = y + cx.g.reshape(_t(cx, args[2]), (-1, 1, 1))
    return [cx.g.squeeze(y, [2]) if one_d else y]


@handles("Conv")
def _conv(cx, node, args, attrs):
    x2, w2, one_d, kernel, strides, dil = _conv_operands(cx, node, args, attrs)
    pattrs = dict(attrs)
    if one_d and "pads" in attrs:
        pattrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    pad = _conv_descriptor_pads(cx, pattrs, x2.shape[2:], kernel, strides, dil)
    desc = Convolution2DDescriptor(stride=tuple(strides), dilation=tuple(dil), padding=pad, groups=attrs.get("group", 1))
    return _conv_result(cx, cx.g.convolution2d(x2, w2, desc), args, one_d)


@handles("ConvTranspose")
def _conv_transpose(cx, node, args, attrs):
    x2, w2, one_d, kernel, strides, dil = _conv_operands(cx, node, args, attrs)
    out_pad = _pair_of(attrs, "output_padding", [0] * (2 - one_d), one_d, fill=0)
    auto = attrs.get("auto_pad", "NOTSET")
    if "output_shape" in attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        spatial = x2.shape[2:]
        if UNKNOWN in spatial:
            raise cx.fail("output_shape / SAME padding needs known spatial extents")
        target = _pair_of(attrs, "output_shape", [n * s for n, s in zip(spatial, strides)], one_d, fill=1) \
            if "output_shape" in attrs else [n * s for n, s in zip(spatial, strides)]
        target = target[-2:]
        pads = []
        for i, (n, k, s, d, op_) in enumerate(zip(spatial, kernel, strides, dil, out_pad)):
            total = s * (n - 1) + op_ + (k - 1) * d + 1 - target[i]
            if total < 0:
                out_pad[i] -= total
                total = 0
            begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pads.append((begin, total - begin))
        pad = (pads[0][0], pads[0][1], pads[1][0], pads[1][1])
    else:
        p = list(attrs.get("pads", [0] * 2 * len(kernel)))
        if one_d:
            p = [0, p[0], 0, p[1]]
        pad = "valid" if auto == "VALID" else (p[0], p[2], p[1], p[3])
    desc = Convolution2DDescriptor(stride=tuple(strides), dilation=tuple(dil), padding=pad, groups=attrs.get("group", 1))
    y = cx.g.convolution_transpose2d(x2, w2, desc, output_padding=tuple(out_pad))
    return _conv_result(cx, y, args, one_d)


@handles("MaxPool", "AveragePool")
def _pool(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    if len([o for o in node.output if o]) > 1:
        raise cx.fail("MaxPool's Indices output is not supported")
    x2, one_d = _as_2d(cx, x, _rank(cx, x) - 2, node.op_type)
    kernel = _pair_of(attrs, "kernel_shape", [], one_d)
    strides = _pair_of(attrs, "strides", [1] * len(attrs["kernel_shape"]), one_d)
    dil = _pair_of(attrs, "dilations", [1] * len(attrs["kernel_shape"]), one_d)
    pattrs = dict(attrs)
    if one_d and "pads" in attrs:
        pattrs["pads"] = [0, attrs["pads"][0], 0, attrs["pads"][1]]
    pad = _conv_descriptor_pads(cx, pattrs, x2.shape[2:], kernel, strides, dil)
    desc = Pooling2DDescriptor(kernel_size=tuple(kernel), stride=tuple(strides), dilation=tuple(dil), padding=pad,
                               ceil_mode=bool(attrs.get("ceil_mode", 0)),
                               include_zero_padding=bool(attrs.get("count_include_pad", 0)))
    y = g.max_pooling2d(x2, desc) if node.op_type == "MaxPool" else g.avg_pooling2d(x2, desc)  # LpPool: average
    return [g.squeeze(y, [2]) if one_d else y]


@handles("LpPool")
def _lp_pool(cx, node, args, attrs):
    # (sum over the window of |x|^p)^(1/p): an average including the zero padding, times the window's size.
    g, x = cx.g, _t(cx, args[0])
    p = float(attrs.get("p", 2))
    if p <= 0:
        raise cx.fail(f"p must be positive, got {p}")
    window = 1
    for k in attrs["kernel_shape"]:
        window *= int(k)
    powered = g.power(g.absolute(x), g.constant(p, x.dtype))
    avg = _pool(cx, node, [powered], {**attrs, "count_include_pad": 1})[0]
    return [g.power(avg * float(window), g.constant(1.0 / p, x.dtype))]


@handles("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(cx, node, args, attrs):
    x = _t(cx, args[0])
    axes = tuple(range(2, _rank(cx, x)))
    fn = cx.g.reduction_mean if node.op_type == "GlobalAveragePool" else cx.g.reduction_maximum
    return [fn(x, axes, keep_dims=True)]


# -- normalization ----------------------------------------------------------------------------
def _per_channel(cx, v, rank: int) -> Tensor:
    """A (C,) parameter shaped to broadcast over (N, C, ...)."""
    return cx.g.reshape(_t(cx, v), (-1,) + (1,) * (rank - 2))


@handles("BatchNormalization")
def _batch_norm(cx, node, args, attrs):
    x = _t(cx, args[0])
    if attrs.get("training_mode", 0) or len([o for o in node.output if o]) > 1:
        raise cx.fail("BatchNormalization in training mode is not supported in packages (they run inference)")
    r = _rank(cx, x)
    scale, bias, mean, var = (_per_channel(cx, a, r) for a in args[1:5])
    return [cx.g.normalization(x, mean, var, scale, bias, attrs.get("epsilon", 1e-5))]


@handles("InstanceNormalization")
def _instance_norm(cx, node, args, attrs):
    x = _t(cx, args[0])
    r = _rank(cx, x)
    axes = tuple(range(2, r))
    return [cx.g.layer_normalization(x, axes, _per_channel(cx, args[1], r), _per_channel(cx, args[2], r),
                                     attrs.get("epsilon", 1e-5))]


@handles("LayerNormalization")
def _layer_norm(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    r = _rank(cx, x)
    axes = tuple(range(cx.axis(attrs.get("axis", -1), r), r))
    eps = attrs.get("epsilon", 1e-5)
    xf = g.cast(x, dtypes.float32) if attrs.get("stash_type", 1) == 1 and x.dtype != dtypes.float64 else x
    mean = g.reduction_mean(xf, axes, keep_dims=True)
    d = xf - mean
    inv = g.reverse_square_root(g.reduction_mean(d * d, axes, keep_dims=True) + eps)
    y = g.cast(d * inv, x.dtype) * _t(cx, args[1])
    if len(args) > 2 and args[2] is not None:
        y = y + _t(cx, args[2])
    return [y, mean, inv]


@handles("RMSNormalization")
def _rms_norm(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    r = _rank(cx, x)
    axes = tuple(range(cx.axis(attrs.get("axis", -1), r), r))
    xf = g.cast(x, dtypes.float32) if x.dtype != dtypes.float64 else x
    inv = g.reverse_square_root(g.reduction_mean(xf * xf, axes, keep_dims=True) + attrs.get("epsilon", 1e-5))
    return [g.cast(xf * inv, x.dtype) * _t(cx, args[1])]


@handles("GroupNormalization")
def _group_norm(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    groups, eps = attrs["num_groups"], attrs.get("epsilon", 1e-5)
    r = _rank(cx, x)
    c = x.shape[1]
    if c == UNKNOWN or UNKNOWN in x.shape[2:]:
        raise cx.fail("GroupNormalization needs known channel and spatial extents")
    grouped = shapes.reshape_to(cx.g, x, [(x, 0) if x.shape[0] == UNKNOWN else x.shape[0], groups, -1])
    y = g.reshape(g.layer_normalization(grouped, (2,), None, None, eps), x)
    scale, bias = _t(cx, args[1]), _t(cx, args[2])
    if scale.shape[0] != c:  # opset 18 gave one scale per group
        scale = g.reshape(g.tile(g.expand_dims(scale, [1]), (1, c // groups)), (c,))
        bias = g.reshape(g.tile(g.expand_dims(bias, [1]), (1, c // groups)), (c,))
    return [y * _per_channel(cx, scale, r) + _per_channel(cx, bias, r)]


@handles("LpNormalization")
def _lp_norm(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    axis, p = attrs.get("axis", -1), attrs.get("p", 2)
    norm = g.reduction_sum(g.absolute(x), axis, True) if p == 1 else g.square_root(g.reduction_sum(x * x, axis, True))
    return [x / g.select(g.equal(norm, 0.0), 1.0, norm)]  # a zero vector stays zero


@handles("MeanVarianceNormalization")
def _mvn(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    axes = tuple(attrs.get("axes", (0, 2, 3)))
    mean = g.reduction_mean(x, axes, keep_dims=True)
    var = g.reduction_mean(x * x, axes, keep_dims=True) - mean * mean
    return [(x - mean) / (g.square_root(var) + 1e-9)]
