"""Image primitives: `resize` (nearest, linear, cubic), separable over any set of axes, and its gradient.

The sampling follows the ONNX Resize definition, which covers PyTorch's
``interpolate`` and TensorFlow's resize modes: each output index i along an
axis maps to a source coordinate by the coordinate transformation mode
(half_pixel, half_pixel_symmetric, pytorch_half_pixel, align_corners,
asymmetric, tf_crop_and_resize), and the output is a weighted sum of source
elements at integer taps around it (edge elements repeat outside the input).
Integer results of linear and cubic interpolation round to nearest and
saturate. `resize_gradient` is the transpose: each output's cotangent added
back to its taps with the same weights.

The reference computes in float64 with one gather per tap and axis. On a GPU, floating-point bilinear
resizing of the last two axes at half-pixel centres (what training graphs that upsample latent grids
do) runs PyTorch's fused upsampling kernels instead, in float32: the float64 passes cost several times
the rest of such a training step.
"""
from __future__ import annotations


import numpy as np
import torch

from ..errors import ShapeError
from ..ir import UNKNOWN, TensorType
from ..registry import OPAQUE, Primitive, builder, register

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_crop_and_resize")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

resize = register(Primitive("resize", OPAQUE, doc="Resample to `sizes` by nearest, linear or cubic interpolation."))


@resize.def_infer
def _resize_infer(types, sizes, scales, roi, mode, transform, nearest_mode, cubic_coeff_a, exclude_outside,
                  extrapolation_value):
    x = types[0]
    if x.rank is not None and len(sizes) != x.rank:
        raise ShapeError(f"sizes {sizes} need one extent per axis of {x}")
    if len(scales) != len(sizes) or len(roi) not in (0, 2 * len(sizes)):
        raise ShapeError(f"scales {scales} need one entry per axis, and roi {roi} none or two per axis "
                         f"(starts, then ends), for sizes {sizes}")
    if mode not in MODES or transform not in TRANSFORMS or nearest_mode not in NEAREST:
        raise ShapeError(f"mode {mode!r}, transformation {transform!r} or nearest mode {nearest_mode!r} is unknown")
    if mode != "nearest" and x.dtype.is_bool:
        raise ShapeError(f"{mode} interpolation needs a numeric input, got bool")
    if x.shape is None:
        return TensorType(tuple(sizes), x.dtype)
    return TensorType(tuple(d if s == -1 else s for s, d in zip(sizes, x.shape)), x.dtype)


def _source_coordinates(n_in, n_out, scale, transform, roi):
    i = np.arange(n_out, dtype=np.float64)
    if transform == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if transform == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        return n_in / 2 * (1 - adjustment) + (i + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (i + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if transform == "align_corners":  # the resized length is n_in * scale, before rounding (ONNX)
        return i * (n_in - 1) / (n_in * scale - 1) if n_out > 1 else np.zeros(n_out)
    if transform == "asymmetric":
        return i / scale
    start, end = roi
    if n_out > 1:
        return start * (n_in - 1) + i * (end - start) * (n_in - 1) / (n_out - 1)
    return np.full(n_out, 0.5 * (start + end) * (n_in - 1))


def _cubic_weights(t, a):
    s = np.stack([t + 1, t, 1 - t, 2 - t], axis=-1)
    near = ((a + 2) * s - (a + 3)) * s * s + 1
    far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return np.where(np.abs(s) <= 1, near, far)


def _taps(n_in, x, mode, nearest_mode, a, exclude_outside):
    """Per output index: source indices (taps, n_out) and weights (taps, n_out)."""
    if mode == "nearest":
        fl = np.floor(x)
        frac = x - fl
        rounded = {"round_prefer_floor": np.where(frac <= 0.5, fl, fl + 1),
                   "round_prefer_ceil": np.where(frac < 0.5, fl, fl + 1),
                   "floor": fl, "ceil": np.ceil(x)}[nearest_mode]
        return np.clip(rounded, 0, n_in - 1)[None].astype(np.int64), np.ones((1, len(x)))
    base = np.floor(x)
    t = x - base
    if mode == "linear":
        offsets, weights = np.array([0, 1]), np.stack([1 - t, t])
    else:
        offsets, weights = np.array([-1, 0, 1, 2]), _cubic_weights(t, a).T
    idx = base[None] + offsets[:, None]
    if mode == "cubic" and exclude_outside:
        weights = np.where((idx >= 0) & (idx <= n_in - 1), weights, 0.0)
        weights = weights / weights.sum(axis=0, keepdims=True)
    return np.clip(idx, 0, n_in - 1).astype(np.int64), weights


def _plans(shape, sizes, scales, roi, mode, transform, nearest_mode, cubic_coeff_a, exclude_outside):
    """Per resampled axis: (axis, source indices (taps, n_out), weights (taps, n_out), outside (n_out,) or None).

    `outside` marks the outputs of tf_crop_and_resize whose coordinate leaves the input; they take the
    extrapolation value. Axes that keep their extent at scale 1 are left out (except for crops).
    """
    plans = []
    for axis, (n_in, n_out) in enumerate(zip(shape, sizes)):
        n_out = n_in if n_out == -1 else n_out
        box = (roi[axis], roi[axis + len(shape)]) if roi else (0.0, 1.0)
        if n_in == n_out and scales[axis] == 1.0 and transform != "tf_crop_and_resize":
            continue
        coords = _source_coordinates(n_in, n_out, scales[axis], transform, box)
        idx, w = _taps(n_in, coords, mode, nearest_mode, cubic_coeff_a, exclude_outside)
        outside = (coords < 0) | (coords > n_in - 1) if transform == "tf_crop_and_resize" else None
        plans.append((axis, idx, w, outside))
    return plans


def _along(v, axis, rank):
    """A 1-D NumPy array as a torch tensor shaped to broadcast along `axis`."""
    shape = [1] * rank
    shape[axis] = -1
    return torch.from_numpy(v).reshape(shape)


def _bilinear_2d(shape, sizes, scales, roi, mode, transform) -> bool:
    """Whether a resize is PyTorch's bilinear `interpolate` (align_corners=False) of the last two axes:
    linear, half-pixel centres, scales equal to sizes / extents, the other axes kept, rank 3 or more."""
    if mode != "linear" or roi or len(shape) < 3 or transform not in ("half_pixel", "pytorch_half_pixel"):
        return False
    outs = [n if s == -1 else s for s, n in zip(sizes, shape)]
    if any(o != n for o, n in zip(outs[:-2], shape[:-2])) or min(outs[-2:]) < 1 or min(shape[-2:]) < 1:
        return False
    # pytorch_half_pixel maps a single output to 0, interpolate to the centre: only equal for outputs > 1
    if transform == "pytorch_half_pixel" and min(outs[-2:]) == 1:
        return False
    return all(s == o / n for s, o, n in zip(scales[-2:], outs[-2:], shape[-2:]))


def _fast(x: torch.Tensor, shape, sizes, scales, roi, mode, transform) -> bool:
    return x.is_cuda and x.dtype.is_floating_point and x.dtype != torch.float64 and \
        _bilinear_2d(shape, sizes, scales, roi, mode, transform)


def bilinear_2d(x: torch.Tensor, sizes) -> torch.Tensor:
    """`resize` of the last two axes of `x` to `sizes[-2:]` by PyTorch's bilinear interpolation, in float32."""
    h, w = x.shape[-2:]
    out = [h if sizes[-2] == -1 else sizes[-2], w if sizes[-1] == -1 else sizes[-1]]
    y = torch.nn.functional.interpolate(x.reshape(1, -1, h, w).float(), size=out, mode="bilinear",
                                        align_corners=False)
    return y.reshape(*x.shape[:-2], *out).to(x.dtype)


def bilinear_2d_gradient(dy: torch.Tensor, source_shape) -> torch.Tensor:
    """The adjoint of `bilinear_2d` for a source of `source_shape`, in float32."""
    channels = int(np.prod(source_shape[:-2], dtype=np.int64))
    d = torch.ops.aten.upsample_bilinear2d_backward(dy.reshape(1, channels, *dy.shape[-2:]).float(),
                                                    list(dy.shape[-2:]), [1, channels, *source_shape[-2:]], False)
    return d.reshape(source_shape).to(dy.dtype)


@resize.def_impl
def _resize_impl(x, sizes, scales, roi, mode, transform, nearest_mode, cubic_coeff_a, exclude_outside,
                 extrapolation_value):
    if _fast(x, x.shape, sizes, scales, roi, mode, transform):
        return bilinear_2d(x, sizes)
    y = x if mode == "nearest" else x.to(torch.float64)
    outside = None
    for axis, idx, w, bad in _plans(x.shape, sizes, scales, roi, mode, transform, nearest_mode, cubic_coeff_a,
                                    exclude_outside):
        acc = None
        for k in range(idx.shape[0]):
            part = y.index_select(axis, torch.from_numpy(idx[k]).to(x.device))
            if mode != "nearest":
                part = part * _along(w[k], axis, x.dim()).to(x.device)
            acc = part if acc is None else acc + part
        y = acc
        if bad is not None:
            bad = _along(bad, axis, x.dim()).to(x.device)
            outside = bad if outside is None else outside | bad
    if outside is not None:
        y = torch.where(outside, torch.tensor(extrapolation_value, dtype=y.dtype, device=y.device), y)
    if not x.dtype.is_floating_point and mode != "nearest":
        info = torch.iinfo(x.dtype)  # cubic overshoot saturates instead of wrapping around
        y = torch.round(y).clamp(info.min, info.max)
    return y.to(x.dtype)


resize_gradient = register(Primitive(
    "resize_gradient", OPAQUE,
    doc="The adjoint of `resize`: each output's `dy` added back to the source elements it was interpolated from, "
        "with the same weights: inputs (dy, source).",
))


@resize_gradient.def_infer
def _resize_gradient_infer(types, **attrs):
    dy, source = types
    resized = _resize_infer([source], **attrs)
    if dy.shape is not None and resized.shape is not None and (len(dy.shape) != len(resized.shape) or any(
            UNKNOWN not in (a, b) and a != b for a, b in zip(dy.shape, resized.shape))):
        raise ShapeError(f"the gradient has shape {dy.shape}, but resizing the source {source.shape} gives "
                         f"{resized.shape}")
    return TensorType(source.shape, dy.dtype)


@resize_gradient.def_impl
def _resize_gradient_impl(dy, source, sizes, scales, roi, mode, transform, nearest_mode, cubic_coeff_a,
                          exclude_outside, extrapolation_value):
    if _fast(dy, source.shape, sizes, scales, roi, mode, transform):
        return bilinear_2d_gradient(dy, tuple(source.shape))
    plans = _plans(source.shape, sizes, scales, roi, mode, transform, nearest_mode, cubic_coeff_a, exclude_outside)
    d = dy.to(torch.float64)
    for axis, _, _, bad in plans:  # the extrapolated outputs came from no source element
        if bad is not None:
            d = d.masked_fill(_along(bad, axis, dy.dim()).to(dy.device), 0.0)
    for axis, idx, w, _ in reversed(plans):  # the transpose of each axis's interpolation, last axis first
        shape = list(d.shape)
        shape[axis] = source.shape[axis]
        acc = d.new_zeros(shape)
        for k in range(idx.shape[0]):
            acc.index_add_(axis, torch.from_numpy(idx[k]).to(dy.device), d * _along(w[k], axis, dy.dim()).to(dy.device))
        d = acc
    return d.to(dy.dtype)


resize.def_vjp(lambda g, op, dy: [g._emit1("resize_gradient", [dy, op.inputs[0]], op.attrs)])
# The adjoint of the gradient is the linear part of resize: extrapolated outputs are 0, not the extrapolation value.
resize_gradient.def_vjp(lambda g, op, ddx: [g._emit1("resize", [ddx], {**op.attrs, "extrapolation_value": 0.0}), None])


@builder("resize")
def _resize(g, x, sizes, mode="nearest", scales=None, transform="half_pixel", nearest_mode="round_prefer_floor",
            roi=None, cubic_coeff_a=-0.75, exclude_outside=False, extrapolation_value=0.0, name=None):
    """Resample `x` to `sizes` (one extent per axis, -1 keeps an axis); `scales` default to sizes / input extents.

    >>> import stitchml as sm; g = sm.Graph()
    >>> g.resize(g.placeholder((1, 3, 8, 8)), (1, 3, 16, 16), mode="linear").type.shape
    (1, 3, 16, 16)
    """
    x = g.as_tensor(x)
    sizes = tuple(int(s) for s in sizes)
    if scales is None:
        if x.rank is None or any(i < 0 and o != i for o, i in zip(sizes, x.shape)):
            raise g._error("resize", "scales are needed when resized input extents are unknown", [x])
        scales = tuple(o / i if i > 0 and o != -1 else 1.0 for o, i in zip(sizes, x.shape))
    attrs = {"sizes": sizes, "scales": tuple(float(s) for s in scales), "roi": tuple(float(r) for r in roi or ()),
             "mode": mode, "transform": transform, "nearest_mode": nearest_mode, "cubic_coeff_a": float(cubic_coeff_a),
             "exclude_outside": bool(exclude_outside), "extrapolation_value": float(extrapolation_value)}
    return g._emit1("resize", [x], attrs, name)
