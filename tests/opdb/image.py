"""Records of the image primitives: resize and its gradient primitive.

The reference is written from the ONNX Resize specification as one interpolation
matrix per axis, from kernels of the distance to the source coordinate (nearest:
the rounded coordinate; linear: the hat max(0, 1 - |d|) at the coordinate clamped
to the input; cubic: Keys' kernel, edge elements repeated or, with
exclude_outside, left out and the weights renormalized), applied with torch so
that autograd gives the gradient's reference. Integer results round to nearest
(ties to even) and saturate.
"""
from __future__ import annotations

import numpy as np
import torch

import stitchml as sm

from .core import ALL, FLOATS, ErrorInput, OpInfo, P, Sample, adjoint, make


def _source(n_in, n_out, scale, transform, box):
    """Output index -> source coordinate (ONNX Resize); the resized length before rounding is scale * n_in."""
    i = np.arange(n_out, dtype=np.float64)
    if n_out == 1 and transform in ("pytorch_half_pixel", "align_corners"):
        return np.zeros(1)
    if n_out == 1 and transform == "tf_crop_and_resize":
        return np.full(1, (box[0] + box[1]) / 2 * (n_in - 1))
    centre = (i + 0.5) / scale - 0.5
    return {"half_pixel": lambda: centre, "pytorch_half_pixel": lambda: centre, "asymmetric": lambda: i / scale,
            "half_pixel_symmetric": lambda: centre + n_in / 2 * (1 - n_out / (scale * n_in)),
            "align_corners": lambda: i * (n_in - 1) / (scale * n_in - 1),
            "tf_crop_and_resize": lambda: (box[0] + i * (box[1] - box[0]) / (n_out - 1)) * (n_in - 1)}[transform]()


def _keys(d, a):
    """Keys' cubic convolution kernel at distance d."""
    d = abs(d)
    if d <= 1:
        return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1
    return a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a if d < 2 else 0.0


_ROUND = {"round_prefer_floor": lambda x: np.ceil(x - 0.5), "round_prefer_ceil": lambda x: np.floor(x + 0.5),
          "floor": np.floor, "ceil": np.ceil}


def _matrix(n_in, coords, mode, nearest_mode, a, exclude_outside):
    """(n_out, n_in): row i holds the weight of each source element in output i."""
    m = np.zeros((len(coords), n_in))
    for i, x in enumerate(coords):
        if mode == "nearest":
            m[i, int(np.clip(_ROUND[nearest_mode](x), 0, n_in - 1))] = 1.0
        elif mode == "linear":
            x = min(max(x, 0.0), n_in - 1.0)
            m[i] = np.maximum(0.0, 1.0 - np.abs(x - np.arange(n_in)))
        else:
            taps = [j for j in range(int(np.floor(x)) - 1, int(np.floor(x)) + 3)
                    if not exclude_outside or 0 <= j < n_in]
            weights = np.array([_keys(x - j, a) for j in taps])
            np.add.at(m[i], np.clip(taps, 0, n_in - 1), weights / weights.sum() if exclude_outside else weights)
    return m


def resize_ref(x, sizes, mode="nearest", scales=None, transform="half_pixel", nearest_mode="round_prefer_floor",
               roi=None, cubic_coeff_a=-0.75, exclude_outside=False, extrapolation_value=0.0):
    exact_type = torch.float64 if x.dtype.is_floating_point or mode != "nearest" else torch.int64
    y, outside = x.to(exact_type), torch.zeros((), dtype=torch.bool)
    for axis, n_in in enumerate(x.shape):
        n_out = n_in if sizes[axis] == -1 else sizes[axis]
        scale = (n_out / n_in if n_in else 1.0) if scales is None else scales[axis]
        box = (roi[axis], roi[axis + x.dim()]) if roi else (0.0, 1.0)
        coords = _source(n_in, n_out, scale, transform, box)
        m = torch.from_numpy(_matrix(n_in, coords, mode, nearest_mode, cubic_coeff_a, exclude_outside))
        y = torch.movedim(torch.tensordot(m.to(exact_type), y, dims=([1], [axis])), 0, axis)
        if transform == "tf_crop_and_resize":
            shape = [1] * x.dim()
            shape[axis] = n_out
            outside = outside | torch.from_numpy((coords < 0) | (coords > n_in - 1)).reshape(shape)
    y = torch.where(outside, torch.tensor(extrapolation_value, dtype=exact_type), y)
    if not x.dtype.is_floating_point and mode != "nearest":
        info = torch.iinfo(x.dtype)
        y = torch.round(y).clamp(info.min, info.max)
    return y.to(x.dtype)


# (name, source shape, sizes, keywords, placeholder shape of the -1 variant or False, shapes fed next)
_RESIZES = [
    ("nearest-up", (1, 2, 3, 4), (-1, -1, 6, 8), {}, (-1, -1, 3, 4), (2, 1, 3, 4)),
    ("linear-scales", (4, 6), (6, 9), {"mode": "linear", "scales": (1.5, 1.5), "transform": "asymmetric"}, None,
     (3, 5)),
    ("keep-axis", (2, 4), (-1, 6), {"mode": "linear"}, (-1, 4), (5, 4)),
    ("nearest-floor-asymmetric", (2, 6, 5), (2, 3, 2), {"nearest_mode": "floor", "transform": "asymmetric"}, False,
     None),
    ("nearest-ceil-align-corners", (5, 4), (8, 3), {"nearest_mode": "ceil", "transform": "align_corners"}, False,
     None),
    ("nearest-ties", (3, 4), (6, 8), {"transform": "asymmetric"}, False, None),
    ("nearest-ties-ceil", (3, 4), (6, 8), {"transform": "asymmetric", "nearest_mode": "round_prefer_ceil"}, False,
     None),
    ("nearest-symmetric", (4, 6), (6, 4), {"transform": "half_pixel_symmetric"}, False, None),
    ("linear", (2, 3, 4), (2, 5, 7), {"mode": "linear"}, False, None),
    ("linear-align-corners", (3, 4), (5, 2), {"mode": "linear", "transform": "align_corners"}, False, None),
    ("linear-pytorch-to-one", (4, 3), (1, 6), {"mode": "linear", "transform": "pytorch_half_pixel"}, False, None),
    ("linear-scales-symmetric", (4, 5), (6, 8), {"mode": "linear", "scales": (1.6, 1.7),
                                                 "transform": "half_pixel_symmetric"}, False, None),
    ("cubic", (1, 1, 4, 5), (1, 1, 7, 3), {"mode": "cubic"}, False, None),
    ("cubic-exclude-outside", (5, 4), (3, 7), {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": True},
     False, None),
    ("cubic-align-corners", (3, 4), (6, 2), {"mode": "cubic", "transform": "align_corners"}, False, None),
    ("crop", (3, 4), (5, 3), {"mode": "linear", "transform": "tf_crop_and_resize", "roi": (-0.2, 0.1, 0.9, 1.3),
                              "extrapolation_value": 2.5}, False, None),
    ("crop-to-one", (3, 4), (1, 2), {"mode": "cubic", "transform": "tf_crop_and_resize",
                                     "roi": (0.2, -0.5, 0.6, 0.5)}, False, None),
    ("vector", (5,), (9,), {"mode": "linear"}, False, None),
    ("zero-size", (0, 3), (0, 6), {}, False, None),
]


def _resize_samples(record, dtype, rng):
    if dtype.is_bool:
        cases = [c for c in _RESIZES if c[3].get("mode", "nearest") == "nearest"]
    else:
        cases = _RESIZES
    for name, shape, sizes, kwargs, dynamic, more in cases:
        yield Sample((make(shape, dtype, rng),), {"sizes": sizes, **kwargs}, name=name,
                     dynamic=(dynamic,) if isinstance(dynamic, tuple) else dynamic,
                     unranked="scales" in kwargs and dynamic is None, more=((make(more, dtype, rng),),) if more else ())
    yield Sample((make((3, 4), dtype, rng, layout="transposed"),), {"sizes": (6, 2), "mode": "nearest"},
                 name="transposed", dynamic=False, unranked=False)
    if dtype.is_integer and dtype.itemsize <= 2:
        # Steps between the extremes of the type: cubic overshoot beyond them saturates.
        info = torch.iinfo(dtype.torch)
        steps = torch.tensor([[0, 0, 1, 1, 0, 0], [1, 0, 1, 0, 1, 0]]).bool()
        x = torch.where(steps, info.max, info.min).to(dtype.torch)
        yield Sample((x,), {"sizes": (2, 11), "mode": "cubic"}, name="saturated", dynamic=False, unranked=False)


def _resize_gradient_build(g, dy, x, **kwargs):
    # The attributes as the builder makes them (scales from the extents): build the forward op for them.
    attrs = g.resize(x, **kwargs).op.attrs
    return g._emit1("resize_gradient", [dy, x], attrs)


def _resize_gradient_samples(record, dtype, rng):
    for s in _resize_samples(record, dtype, rng):
        (x,) = s.args
        dy = make(tuple(resize_ref(x.double(), **s.kwargs).shape), dtype, rng)
        yield Sample((dy, x), s.kwargs, name=s.name, dynamic=False, unranked=False)


def _resize_errors():
    return [ErrorInput((P((2, 3)),), {"sizes": (4,)}, match="need one extent per axis"),
            ErrorInput((P((2, 3)),), {"sizes": (2, 6), "scales": (3.0,)}, match="need one entry per axis"),
            ErrorInput((P((2, 3)),), {"sizes": (2, 6), "transform": "tf_crop_and_resize", "roi": (0.0, 1.0)},
                       match="roi (0.0, 1.0) none or two per axis"),
            ErrorInput((P((2, 3)),), {"sizes": (2, 6), "mode": "area"}, match="mode 'area'"),
            ErrorInput((P((2, 3)),), {"sizes": (2, 6), "transform": "half_pixels"}, match="is unknown"),
            ErrorInput((P((2, 3), sm.bool),), {"sizes": (2, 6), "mode": "linear"},
                       match="linear interpolation needs a numeric input, got bool"),
            ErrorInput((P((-1, 3)),), {"sizes": (2, 6)}, match="scales are needed"),
            ErrorInput((P((2, 3)),), {"sizes": (2, -2)}, match="extents must be >= 0")]


RECORDS = [
    # Interpolation weights computed, then summed: a composite for the tolerance rule.
    OpInfo("resize", _resize_samples, resize_ref, ALL, errors=_resize_errors, second_order=True, family="composite",
           equivalent="ONNX Resize; torch.nn.functional.interpolate (nearest, bilinear, bicubic)"),
    OpInfo("resize_gradient", _resize_gradient_samples,
           lambda dy, x, **kwargs: adjoint(lambda z: resize_ref(z, **kwargs), x, dy), FLOATS,
           build=_resize_gradient_build, builder=False, second_order=True, dynamic=False, unranked=False,
           family="composite",
           equivalent="the adjoint of resize (torch.nn.functional.interpolate's backward)",
           errors=lambda: [ErrorInput((P((2, 5)), P((2, 3))), {"sizes": (2, 6)}, build=_resize_gradient_build,
                                      match="the gradient has shape (2, 5), but resizing the source (2, 3) gives "
                                            "(2, 6)")]),
]
