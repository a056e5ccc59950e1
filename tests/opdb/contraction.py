"""Records of the contractions and window ops: matrix multiplication, 2-D
convolution (forward, transposed, weights gradient) and max/average pooling
with their gradient primitives.

References are written from the definitions, not from torch's conv and pool
kernels: a convolution is a sum over kernel taps of strided views, a pooling
window is gathered with a NumPy index map, and every gradient primitive is the
adjoint of its forward reference, taken by torch autograd.
"""
from __future__ import annotations

import math

import numpy as np
import torch

import stitchml as sm

from .core import FLOATS, NUMERIC, ErrorInput, Fuzz, OpInfo, P, Sample, adjoint, make, to_float, vjp

# -- matrix_multiplication ----------------------------------------------------------------------
def _matmul_ref(a, b):
    """Broadcast products summed over the contracted axis; 1-D operands as NumPy's matmul treats them."""
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    out = (a2.unsqueeze(-1) * b2.unsqueeze(-3)).sum(dim=-2)
    if a.dim() == 1:
        out = out.squeeze(-2)
    return out.squeeze(-1) if b.dim() == 1 else out


def _matmul_samples(record, dtype, rng):
    for name, shapes, more in [("matrix", [(2, 3), (3, 4)], [(5, 3), (3, 1)]),
                               ("batch", [(2, 2, 3), (2, 3, 4)], [(1, 4, 2), (3, 2, 5)]),
                               ("broadcast-batch", [(3, 2, 3), (3, 4)], [(2, 1, 3), (3, 2)]),
                               ("vector-matrix", [(3,), (3, 4)], [(2,), (2, 5)]),
                               ("matrix-vector", [(2, 3), (3,)], [(4, 1), (1,)]),
                               ("vector-vector", [(3,), (3,)], [(5,), (5,)]),
                               ("zero-size", [(0, 3), (3, 2)], [(2, 0), (0, 3)])]:
        yield Sample(tuple(make(s, dtype, rng, -1.0, 1.0) for s in shapes), name=name,
                     more=(tuple(make(s, dtype, rng, -1.0, 1.0) for s in more),))
    yield Sample((make((3, 4), dtype, rng, -1.0, 1.0, layout="transposed"),
                  make((4, 2), dtype, rng, -1.0, 1.0, layout="sliced")), name="layouts")


# -- convolution ----------------------------------------------------------------------------------
def _same(n, k, s, d):
    """TensorFlow's 'same' padding, from its definition (written apart from the implementation on purpose):
    the output has ceil(n / s) positions, and an odd pixel of padding goes at the end."""
    needed = (math.ceil(n / s) - 1) * s + d * (k - 1) + 1
    total = max(needed - n, 0)
    return total // 2, total - total // 2


def _explicit_padding(padding, hw, kernel, stride, dilation):
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        return _same(hw[0], kernel[0], stride[0], dilation[0]) + _same(hw[1], kernel[1], stride[1], dilation[1])
    if isinstance(padding, int):
        return (padding,) * 4
    return (padding[0], padding[0], padding[1], padding[1]) if len(padding) == 2 else tuple(padding)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def conv_ref(x, w, stride=1, dilation=1, padding=0, groups=1, data_layout="NCHW", weights_layout="OIHW"):
    """out[n, o, i, j] = sum over c, taps of x_padded[n, c, i*s + kh*d, j*s + kw*d] * w[o, c, kh, kw], per group."""
    stride, dilation = _pair(stride), _pair(dilation)
    if data_layout == "NHWC":
        x = x.permute(0, 3, 1, 2)
    if weights_layout == "HWIO":
        w = w.permute(3, 2, 0, 1)
    kh, kw = w.shape[2:]
    top, bottom, left, right = _explicit_padding(padding, x.shape[2:], (kh, kw), stride, dilation)
    xp = torch.nn.functional.pad(x, (left, right, top, bottom))
    oh = (xp.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    cin = w.shape[1]
    outs = []
    for gi in range(groups):
        xg = xp[:, gi * cin:(gi + 1) * cin]
        wg = w[gi * (w.shape[0] // groups):(gi + 1) * (w.shape[0] // groups)]
        acc = torch.zeros((x.shape[0], wg.shape[0], oh, ow), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                h0, w0 = i * dilation[0], j * dilation[1]
                view = xg[:, :, h0:h0 + stride[0] * (oh - 1) + 1:stride[0], w0:w0 + stride[1] * (ow - 1) + 1:stride[1]]
                acc = acc + torch.einsum("nchw,oc->nohw", view, wg[:, :, i, j])
        outs.append(acc)
    out = torch.cat(outs, dim=1)
    return out.permute(0, 2, 3, 1) if data_layout == "NHWC" else out


def _conv_out_hw(x_hw, kernel, desc):
    stride, dilation = _pair(desc.get("stride", 1)), _pair(desc.get("dilation", 1))
    pad = _explicit_padding(desc.get("padding", 0), x_hw, kernel, stride, dilation)
    return tuple((n + pad[2 * a] + pad[2 * a + 1] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1
                 for a, n in enumerate(x_hw))


# (name, source NCHW shape, weights OIHW shape, descriptor)
_CONVS = [
    ("basic", (1, 2, 5, 5), (3, 2, 3, 3), {}),
    ("stride-pad", (2, 2, 6, 5), (3, 2, 3, 3), {"stride": 2, "padding": 1}),
    ("dilation-asymmetric", (1, 2, 6, 7), (2, 2, 2, 3), {"dilation": 2, "padding": (1, 0, 2, 1)}),
    ("same-stride", (2, 2, 5, 6), (4, 2, 3, 2), {"stride": 2, "padding": "same"}),
    ("groups", (1, 4, 4, 4), (6, 2, 3, 3), {"groups": 2, "padding": (1, 1)}),
    ("nhwc", (1, 2, 5, 4), (3, 2, 2, 3), {"data_layout": "NHWC", "weights_layout": "HWIO", "stride": (2, 1)}),
    ("zero-batch", (0, 2, 4, 4), (3, 2, 3, 3), {"padding": "valid"}),
]


def _layouts(desc, x_shape, w_shape):
    """The shapes in the descriptor's layouts."""
    if desc.get("data_layout") == "NHWC":
        x_shape = (x_shape[0], x_shape[2], x_shape[3], x_shape[1])
    if desc.get("weights_layout") == "HWIO":
        w_shape = (w_shape[2], w_shape[3], w_shape[1], w_shape[0])
    return x_shape, w_shape


def _conv_samples(record, dtype, rng):
    for name, xs, ws, desc in _CONVS:
        x_shape, w_shape = _layouts(desc, xs, ws)
        x = make(x_shape, dtype, rng, -1.0, 1.0, layout="sliced" if name == "basic" else "contiguous")
        w = make(w_shape, dtype, rng, -1.0, 1.0, layout="transposed" if name == "basic" else "contiguous")
        more = (make((x_shape[0] + 1,) + x_shape[1:], dtype, rng, -1.0, 1.0), make(w_shape, dtype, rng, -1.0, 1.0))
        yield Sample((x, w), {"descriptor": desc}, name=name, more=(more,))


def _conv_build(g, x, w, descriptor):
    return g.convolution2d(x, w, sm.Convolution2DDescriptor(**descriptor))


def _conv_apply(x, w, descriptor):
    return conv_ref(x, w, **descriptor)


def _transpose_samples(record, dtype, rng):
    """dy shaped like a forward output; with `like` (the forward source) or an output padding."""
    for name, xs, ws, desc in _CONVS:
        x_shape, w_shape = _layouts(desc, xs, ws)
        out_hw = _conv_out_hw(xs[2:], ws[2:], desc)
        dy_nchw = (xs[0], ws[0]) + out_hw
        dy_shape, _ = _layouts(desc, dy_nchw, ws)
        yield Sample((make(dy_shape, dtype, rng, -1.0, 1.0), make(w_shape, dtype, rng, -1.0, 1.0),
                      make(x_shape, dtype, rng)), {"descriptor": desc}, name=f"{name}-like")
    dy = make((1, 3, 2, 2), dtype, rng, -1.0, 1.0)
    yield Sample((dy, make((3, 2, 3, 3), dtype, rng, -1.0, 1.0)), {"descriptor": {"stride": 2, "padding": 1},
                                                                   "output_padding": (1, 0)}, name="output-padding")
    yield Sample((dy, make((3, 2, 3, 3), dtype, rng, -1.0, 1.0)), {"descriptor": {"stride": 2, "padding": "same"}},
                 name="same")


def _transpose_build(g, dy, w, *like, descriptor, output_padding=(0, 0)):
    desc = sm.Convolution2DDescriptor(**descriptor)
    if like:
        return g.convolution_transpose2d(dy, w, desc, output_shape=like[0])
    return g.convolution_transpose2d(dy, w, desc, output_padding=output_padding)


def _transpose_ref(dy, w, *like, descriptor, output_padding=(0, 0)):
    """The adjoint of conv_ref w.r.t. its source, for a source of like's shape (or PyTorch's ConvTranspose2d size)."""
    if like:
        source = like[0]
    else:
        stride, dilation = _pair(descriptor.get("stride", 1)), _pair(descriptor.get("dilation", 1))
        kernel = w.shape[2:]
        if descriptor.get("padding") == "same":
            hw = tuple(n * s for n, s in zip(dy.shape[2:], stride))
        else:
            pad = _explicit_padding(descriptor.get("padding", 0), (0, 0), kernel, stride, dilation)
            hw = tuple((n - 1) * stride[a] - pad[2 * a] - pad[2 * a + 1] + dilation[a] * (kernel[a] - 1) + 1
                       + output_padding[a] for a, n in enumerate(dy.shape[2:]))
        source = torch.zeros((dy.shape[0], w.shape[1] * descriptor.get("groups", 1)) + hw)
    return adjoint(lambda z: conv_ref(z, w, **descriptor), source, dy)


def _weights_gradient_samples(record, dtype, rng):
    for s in _transpose_samples(record, dtype, rng):
        if s.name.endswith("-like"):
            dy, w, x = s.args
            yield Sample((dy, make(x.shape, dtype, rng, -1.0, 1.0), w), s.kwargs, name=s.name[:-5])


def _weights_gradient_build(g, dy, x, w, descriptor):
    return g._emit1("convolution2d_weights_gradient", [dy, x, w], sm.Convolution2DDescriptor(**descriptor).attrs())


def _weights_gradient_ref(dy, x, w, descriptor):
    return adjoint(lambda z: conv_ref(x, z, **descriptor), w, dy)


def _conv_errors():
    return [ErrorInput((P((1, 2, 5, 5)), P((3, 3, 3, 3))), {"descriptor": {}}, match="input channels 2"),
            ErrorInput((P((1, 2, 5, 5), sm.int32), P((3, 2, 3, 3), sm.int32)), {"descriptor": {}},
                       match="expects floating-point operands"),
            ErrorInput((P((2, 5, 5)), P((3, 2, 3, 3))), {"descriptor": {}}, match="need rank 4"),
            ErrorInput((P((1, 2, 2, 2)), P((3, 2, 3, 3))), {"descriptor": {}}, match="larger than the padded extent"),
            ErrorInput((P((1, 4, 5, 5)), P((3, 2, 3, 3))), {"descriptor": {"groups": 2}},
                       match="not divisible by groups"),
            ErrorInput((P((1, 2, 5, 5)), P((3, 2, 3, 3))), {"descriptor": {"data_layout": "CHWN"}},
                       match="data_layout 'CHWN'"),
            ErrorInput((P((1, 2, 5, 5)), P((3, 2, 3, 3))), {"descriptor": {"stride": 0}}, match="must be >= 1")]


# -- pooling -------------------------------------------------------------------------------------
_POOLS = [
    ("kernel-2", (1, 2, 4, 6), {"kernel_size": 2}),
    ("stride-pad", (2, 1, 5, 5), {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("dilation", (1, 2, 5, 7), {"kernel_size": (2, 3), "stride": 1, "dilation": (1, 2)}),
    ("ceil-pad", (1, 1, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("ceil", (1, 1, 5, 5), {"kernel_size": 2, "ceil_mode": True}),
    # The last window would start in the bottom padding: PyTorch drops it.
    ("ceil-pad-edge", (1, 1, 5, 5), {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("same", (1, 2, 5, 6), {"kernel_size": 3, "stride": 2, "padding": "same"}),
    ("zero-padding-counted", (1, 1, 4, 4), {"kernel_size": 3, "stride": 1, "padding": 1,
                                            "include_zero_padding": True}),
    ("nhwc", (1, 3, 4, 2), {"kernel_size": 2, "stride": 1, "data_layout": "NHWC"}),
    ("zero-batch", (0, 2, 4, 4), {"kernel_size": 2}),
]


def _windows(x, desc):
    """x (NCHW) gathered into windows: (values (N, C, OH, OW, K), in_input mask, in_padded mask)."""
    kernel = _pair(desc.get("kernel_size", 2))
    stride = kernel if desc.get("stride") is None else _pair(desc["stride"])
    dilation = _pair(desc.get("dilation", 1))
    pad = _explicit_padding(desc.get("padding", 0), x.shape[2:], kernel, stride, dilation)
    outs = []
    for a, n in enumerate(x.shape[2:]):
        span = n + pad[2 * a] + pad[2 * a + 1] - dilation[a] * (kernel[a] - 1) - 1
        out = (-(-span // stride[a]) if desc.get("ceil_mode") else span // stride[a]) + 1
        if desc.get("ceil_mode") and (out - 1) * stride[a] >= n + pad[2 * a]:
            out -= 1  # PyTorch: the last window starts inside the input or the left padding
        outs.append(out)
    rows = [np.arange(outs[a])[:, None] * stride[a] - pad[2 * a] + np.arange(kernel[a])[None, :] * dilation[a]
            for a in range(2)]
    h = rows[0][:, None, :, None]  # (OH, 1, KH, 1)
    w = rows[1][None, :, None, :]  # (1, OW, 1, KW)
    inside = (h >= 0) & (h < x.shape[2]) & (w >= 0) & (w < x.shape[3])
    padded_h, padded_w = x.shape[2] + pad[1], x.shape[3] + pad[3]
    in_padded = np.broadcast_to((h < padded_h) & (w < padded_w), inside.shape)
    flat = np.clip(h, 0, x.shape[2] - 1) * x.shape[3] + np.clip(w, 0, x.shape[3] - 1)
    flat = torch.from_numpy(flat.reshape(outs[0], outs[1], -1))
    values = x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3])[:, :, flat]
    return values, torch.from_numpy(inside.reshape(outs[0], outs[1], -1)), \
        torch.from_numpy(in_padded.reshape(outs[0], outs[1], -1).copy())


def _nchw(fn):
    """Apply an NCHW reference to a tensor in the descriptor's layout."""
    def ref(x, *rest, descriptor):
        nhwc = descriptor.get("data_layout") == "NHWC"
        args = [t.permute(0, 3, 1, 2) if nhwc else t for t in (x, *rest)]
        out = fn(*args, descriptor)
        return out.permute(0, 2, 3, 1) if nhwc else out
    return ref


def _window_argmax(x, desc):
    """Per window, the position of its first maximum in row-major window order (padding never wins)."""
    values, inside, _ = _windows(x, desc)
    low = torch.tensor(-math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min, dtype=x.dtype)
    return values, torch.where(inside, values, low).argmax(dim=-1, keepdim=True)


@_nchw
def max_pool_ref(x, desc):
    # Picked by index, so that the gradient goes to that one element (PyTorch's rule), even on ties.
    values, choice = _window_argmax(x, desc)
    return values.gather(-1, choice).squeeze(-1)


@_nchw
def avg_pool_ref(x, desc):
    values, inside, in_padded = _windows(x, desc)
    counted = in_padded if desc.get("include_zero_padding") else inside
    total = torch.where(inside, values, torch.zeros((), dtype=x.dtype)).sum(dim=-1)
    return total / counted.sum(dim=-1).to(x.dtype)


@_nchw
def _select_ref(values, x, desc):
    _, choice = _window_argmax(x, desc)
    return _windows(values, desc)[0].gather(-1, choice).squeeze(-1)


def _pool_layout(shape, desc):
    return (shape[0], shape[2], shape[3], shape[1]) if desc.get("data_layout") == "NHWC" else shape


def _pool_samples(record, dtype, rng):
    for name, shape, desc in _POOLS:
        if record.name.startswith("avg") and desc.get("dilation", 1) != 1:
            continue
        x = make(_pool_layout(shape, desc), dtype, rng, -3.0, 3.0, layout="transposed" if name == "kernel-2" else
                 "contiguous")
        yield Sample((x,), {"descriptor": desc}, name=name,
                     more=((make(_pool_layout((shape[0] + 1,) + shape[1:], desc), dtype, rng),),))


def _pool_build(op):
    return lambda g, x, descriptor: getattr(g, op)(x, sm.Pooling2DDescriptor(**descriptor))


def _pool_gradient_samples(record, dtype, rng):
    forward = avg_pool_ref if record.name.startswith("avg") else max_pool_ref
    for s in _pool_samples(record, dtype, rng):
        (x,) = s.args
        dy = make(tuple(forward(x.double(), descriptor=s.kwargs["descriptor"]).shape), dtype, rng)
        yield Sample((dy, x), s.kwargs, name=s.name)


def _select_samples(record, dtype, rng):
    for s in _pool_samples(record, dtype, rng):
        (x,) = s.args
        yield Sample((make(x.shape, dtype, rng), x), s.kwargs, name=s.name)


def _emit_build(op):
    return lambda g, *xs, descriptor: g._emit1(op, list(xs), sm.Pooling2DDescriptor(**descriptor).attrs())


def _pool_errors():
    return [ErrorInput((P((2, 5, 5)),), {"descriptor": {}}, match="needs rank 4"),
            ErrorInput((P((1, 1, 5, 5)),), {"descriptor": {"kernel_size": 0}}, match="must be >= 1"),
            ErrorInput((P((1, 1, 5, 5)),), {"descriptor": {"padding": 3}}, match="wider than the window"),
            ErrorInput((P((1, 1, 5, 5)),), {"descriptor": {"data_layout": "NCWH"}}, match="data_layout"),
            ErrorInput((P((1, 1, 1, 1)),), {"descriptor": {"kernel_size": 3}}, match="larger than the padded")]


RECORDS = [
    OpInfo("matrix_multiplication", _matmul_samples, _matmul_ref, NUMERIC, out_dtype=to_float, float_only=True,
           second_order=True, equivalent="np.matmul / torch.matmul / @", fuzz=Fuzz("matmul"),
           errors=lambda: [ErrorInput((P((2, 3)), P((4, 5))), match="contraction extents differ"),
                           ErrorInput((P((2, 2, 3)), P((3, 3, 4))), match="do not broadcast"),
                           ErrorInput((P((-1, 3)), P((-1, 4))), error=sm.ExecutionError, match="failed on inputs",
                                      feeds=(np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)))]),
    OpInfo("convolution2d", _conv_samples, _conv_apply, FLOATS, build=_conv_build, second_order=True,
           errors=_conv_errors, equivalent="torch.nn.functional.conv2d (padding 'same' as TensorFlow)",
           fuzz=Fuzz("conv")),
    OpInfo("convolution_transpose2d", _transpose_samples, _transpose_ref, FLOATS, build=_transpose_build,
           second_order=True, equivalent="torch.nn.functional.conv_transpose2d",
           errors=lambda: [ErrorInput((P((1, 3, 2, 2)), P((3, 2, 3, 3))), {"descriptor": {}, "output_padding": (1,)},
                                      match="output_padding must be an int or a pair"),
                           ErrorInput((P((1, 4, 2, 2)), P((3, 2, 3, 3))), {"descriptor": {}},
                                      match="source channels 4 != the weights' output channels 3")]),
    OpInfo("convolution2d_weights_gradient", _weights_gradient_samples, _weights_gradient_ref, FLOATS,
           build=_weights_gradient_build, builder=False, equivalent="torch.nn.grad.conv2d_weight"),
    OpInfo("max_pooling2d", _pool_samples, max_pool_ref, NUMERIC, build=_pool_build("max_pooling2d"), second_order=True,
           errors=_pool_errors, equivalent="torch.nn.functional.max_pool2d"),
    OpInfo("avg_pooling2d", _pool_samples, avg_pool_ref, FLOATS, build=_pool_build("avg_pooling2d"), second_order=True,
           equivalent="torch.nn.functional.avg_pool2d",
           errors=lambda: _pool_errors() + [
               ErrorInput((P((1, 1, 5, 5), sm.int32),), {"descriptor": {}}, match="floating-point source"),
               ErrorInput((P((1, 1, 5, 5)),), {"descriptor": {"dilation": 2}}, match="dilation 1")]),
    OpInfo("max_pooling2d_gradient", _pool_gradient_samples,
           lambda dy, x, descriptor: vjp(lambda z: max_pool_ref(z, descriptor=descriptor), x, dy), FLOATS,
           build=_emit_build("max_pooling2d_gradient"), builder=False,
           equivalent="torch.ops.aten.max_pool2d_with_indices_backward"),
    OpInfo("avg_pooling2d_gradient", _pool_gradient_samples,
           lambda dy, x, descriptor: adjoint(lambda z: avg_pool_ref(z, descriptor=descriptor), x, dy), FLOATS,
           build=_emit_build("avg_pooling2d_gradient"), builder=False, second_order=True,
           equivalent="torch.ops.aten.avg_pool2d_backward"),
    OpInfo("max_pooling2d_select", _select_samples, lambda v, x, descriptor: _select_ref(v, x, descriptor=descriptor),
           FLOATS, build=_emit_build("max_pooling2d_select"), builder=False,
           equivalent="the adjoint of max_pooling2d_gradient"),
]
