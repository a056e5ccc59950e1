"""More ONNX tensor operators, as decompositions into registry ops: CumProd, CenterCropPad, SwiGLU, AffineGrid,
GridSample, ScatterElements, ScatterND, CausalConvWithState, QuantizeLinear, DequantizeLinear, DFT.

Handlers as in onnx_ops.py. None needs a primitive of its own:

* ``CumProd``: the product over a triangular selection (element j of the
  row i when j <= i; < for ``exclusive``, reversed for ``reverse``), an
  n x n expansion that suits the short axes models take cumulative products
  over.
* ``CenterCropPad``: a centred slice where the target is smaller and a
  centred zero pad where it is larger (the extra element of an odd
  difference goes to the end), per axis.
* ``SwiGLU``: ``a * sigmoid(alpha * a) * b``.
* ``AffineGrid``: the affine matrices times the normalised sampling grid
  of the output size (a constant once the size is known).
* ``GridSample``: coordinates unnormalised, moved inside by the padding
  mode, then each interpolation tap (1 nearest, 2 linear, 4 cubic per axis)
  gathered from the flattened input and weighted; taps outside the input
  weigh 0 under ``zeros`` padding.
* ``ScatterElements``/``ScatterND`` with reduction ``none`` or ``add``:
  additions into zeros (the registry's scatter-add), then taken where an
  index landed or added to the data.
* ``CausalConvWithState``: the importer's depthwise ``Conv`` over the past
  state followed by the input.
* ``QuantizeLinear``/``DequantizeLinear`` to and from the integer types
  StitchML has, per tensor, per axis or per block, computed in float32.
* ``DFT``: products with cosine and sine matrices along the axis (forward,
  inverse, one-sided, and numpy's irfft for inverse one-sided).
"""
from __future__ import annotations

import itertools

import numpy as np

from .. import dtypes
from ..ir import UNKNOWN
from .onnx_ops import _rank, _t, handles, to_float8
from .onnx_values import onnx_dtype


@handles("CumProd")
def _cum_prod(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    rank = _rank(cx, x)
    axis = cx.axis(int(cx.static(args[1], "CumProd axis").reshape(-1)[0]), rank)
    n = x.shape[axis]
    if n == UNKNOWN:
        raise cx.fail("CumProd needs a known extent along its axis")
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    reverse, exclusive = attrs.get("reverse", 0), attrs.get("exclusive", 0)
    keep = (j >= i if reverse else j <= i) & ((j != i) if exclusive else True)
    last = list(range(rank))
    last.append(last.pop(axis))  # the axis moved last
    xt = g.transpose(x, last) if axis != rank - 1 else x
    terms = g.select(g.constant(keep), g.expand_dims(xt, [rank - 1]), g.constant(1, x.dtype))
    y = g.reduction_product(terms, [rank])
    back = list(np.argsort(last))
    return [g.transpose(y, back) if axis != rank - 1 else y]


@handles("CenterCropPad")
def _center_crop_pad(cx, node, args, attrs):
    g, x = cx.g, _t(cx, args[0])
    rank = _rank(cx, x)
    target = [int(v) for v in cx.static(args[1], "CenterCropPad shape").reshape(-1)]
    axes = [cx.axis(a, rank) for a in attrs.get("axes", range(rank))]
    if len(axes) != len(target):
        raise cx.fail(f"shape has {len(target)} extents for {len(axes)} axes")
    if any(x.shape[a] == UNKNOWN for a in axes) or any(t < 0 for t in target):
        raise cx.fail(f"CenterCropPad needs known extents on its axes and non-negative targets, got {x.type}")
    starts, ends = [0] * rank, list(x.shape)
    left, right = [0] * rank, [0] * rank
    for a, t in zip(axes, target):
        n = x.shape[a]
        if t < n:
            starts[a] = (n - t) // 2
            ends[a] = starts[a] + t
        elif t > n:
            left[a] = (t - n) // 2
            right[a] = t - n - left[a]
    y = g.slice(x, starts, ends) if starts != [0] * rank or ends != list(x.shape) else x
    return [g.pad(y, left, right) if any(left) or any(right) else y]


@handles("SwiGLU")
def _swiglu(cx, node, args, attrs):
    g = cx.g
    a, b = _t(cx, args[0]), _t(cx, args[1])
    alpha = float(attrs.get("alpha", 1.0))
    return [a * g.sigmoid(a * alpha if alpha != 1.0 else a) * b]


@handles("AffineGrid")
def _affine_grid(cx, node, args, attrs):
    g, theta = cx.g, _t(cx, args[0])
    size = [int(v) for v in cx.static(args[1], "AffineGrid size").reshape(-1)]
    if len(size) not in (4, 5) or any(s <= 0 for s in size):
        raise cx.fail(f"size must be (N, C, H, W) or (N, C, D, H, W) of positive extents, got {size}")
    spatial = size[2:]
    align = attrs.get("align_corners", 0)

    def axis(n):  # normalised coordinates of n samples over [-1, 1]
        if align:
            return np.linspace(-1.0, 1.0, n) if n > 1 else np.full(1, -1.0)
        return (np.arange(n) * 2.0 + 1.0) / n - 1.0

    coords = np.meshgrid(*[axis(n) for n in spatial], indexing="ij")
    homo = np.stack([*coords[::-1], np.ones(spatial)], axis=-1).reshape(-1, len(spatial) + 1)
    grid = g.cast(g.constant(homo.T.astype(np.float64)), theta.dtype)  # (dims + 1, points)
    out = g.transpose(g.matrix_multiplication(theta, grid), [0, 2, 1])  # (N, points, dims)
    return [g.reshape(out, [size[0], *spatial, len(spatial)])]


def _reflect(cx, v, lo: float, hi: float):
    """ONNX GridSample's reflection of coordinates outside [lo, hi] back into it (repeatedly)."""
    g = cx.g
    rng = hi - lo
    below, above = v < lo, v > hi
    dx = g.select(below, lo - v, v - hi)
    n = g.floor(dx / rng)
    r = dx - n * rng
    even = g.equal(n - g.floor(n / 2.0) * 2.0, g.constant(0.0, v.dtype))
    low_side = g.select(even, r + lo, hi - r)  # reflected from below
    high_side = g.select(even, hi - r, r + lo)
    return g.select(below, low_side, g.select(above, high_side, v))


def _cubic(t):
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for a fraction t."""
    a = -0.75
    x = [t + 1.0, t, 1.0 - t, 2.0 - t]
    near = [((a + 2.0) * xi - (a + 3.0)) * xi * xi + 1.0 for xi in x[1:3]]
    far = [((a * xi - 5.0 * a) * xi + 8.0 * a) * xi - 4.0 * a for xi in (x[0], x[3])]
    return [far[0], near[0], near[1], far[1]]


@handles("GridSample")
def _grid_sample(cx, node, args, attrs):
    g = cx.g
    x, grid = _t(cx, args[0]), _t(cx, args[1])
    _rank(cx, x)  # a typed error for an input of unknown rank
    dims = list(x.shape[2:])
    nd = len(dims)
    if nd not in (2, 3) or UNKNOWN in x.shape or grid.shape is None or UNKNOWN in grid.shape:
        raise cx.fail(f"GridSample needs 4-D or 5-D inputs of known extents, got {x.type} and {grid.type}")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(attrs.get("mode", "linear"), attrs.get("mode", "linear"))
    padding = attrs.get("padding_mode", "zeros")
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise cx.fail(f"mode {mode!r} or padding_mode {padding!r} is not one ONNX defines")
    align = bool(attrs.get("align_corners", 0))
    n, c = x.shape[:2]
    out_spatial = list(grid.shape[1:-1])
    points = int(np.prod(out_spatial))
    flat = g.reshape(grid, [n, points, nd])
    taps_per_dim = []
    for i, size in enumerate(dims):
        comp = nd - 1 - i  # the grid's last axis holds (x, y[, z]): the fastest-varying axis first
        v = g.squeeze(g.slice(flat, [0, 0, comp], [n, points, comp + 1]), [2])
        v = (v + 1.0) * ((size - 1) / 2.0) if align else ((v + 1.0) * float(size) - 1.0) / 2.0
        if mode == "nearest":
            v = g.round(v)
        lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":
            out = g.logical_or(v < lo, v > hi)
            v = g.select(out, g.clamp(v, g.constant(0.0, v.dtype), g.constant(size - 1.0, v.dtype)), v)
        elif padding == "reflection":
            v = _reflect(cx, v, lo, hi)
        if mode == "nearest":
            taps = [(v, None)]
        else:
            base = g.floor(v)
            t = v - base
            if mode == "linear":
                taps = [(base, 1.0 - t), (base + 1.0, t)]
            else:
                taps = [(base + float(k), w) for k, w in zip((-1, 0, 1, 2), _cubic(t))]
        resolved = []
        for index, weight in taps:
            valid = None
            if padding == "zeros":
                valid = g.logical_and(index >= 0.0, index <= size - 1.0)
            elif padding == "reflection":
                index = g.truncate(_reflect(cx, index, lo, hi))
            index = g.clamp(index, g.constant(0.0, index.dtype), g.constant(size - 1.0, index.dtype))
            resolved.append((g.cast(index, dtypes.int64), weight, valid))
        taps_per_dim.append(resolved)
    strides = [int(np.prod(dims[i + 1:])) for i in range(nd)]
    source = g.reshape(x, [n, c, int(np.prod(dims))])
    total = None
    for combo in itertools.product(*taps_per_dim):
        index, weight, valid = None, None, None
        for (idx, w, ok), stride in zip(combo, strides):
            term = idx * stride if stride != 1 else idx
            index = term if index is None else index + term
            if w is not None:
                weight = w if weight is None else weight * w
            if ok is not None:
                valid = ok if valid is None else g.logical_and(valid, ok)
        picked = g.gather_along_axis(source, g.broadcast_to(g.reshape(index, [n, 1, points]), [n, c, points]), 2)
        if valid is not None:
            weight = g.cast(valid, flat.dtype) if weight is None else g.select(valid, weight, g.constant(0.0, weight.dtype))
        if weight is not None:
            picked = picked * g.cast(g.reshape(weight, [n, 1, points]), x.dtype)
        total = picked if total is None else total + picked
    return [g.reshape(total, [n, c, *out_spatial])]


def _wrapped(cx, idx, extent):
    """Indices counted from the end when negative, as ONNX allows, in int64."""
    g = cx.g
    idx = g.cast(idx, dtypes.int64) if idx.dtype != dtypes.int64 else idx
    return g.select(idx < 0, idx + extent, idx)


def _reduction(cx, attrs) -> str:
    reduction = attrs.get("reduction", "none")
    if reduction not in ("none", "add"):
        raise cx.fail(f"reduction {reduction!r} is not supported ('none' and 'add' are)")
    return reduction


@handles("ScatterElements", "Scatter")
def _scatter_elements(cx, node, args, attrs):
    # Additions into zeros where the indices point; 'none' then takes those sums where anything landed
    # (ONNX leaves duplicate indices undefined there), 'add' adds them to the data.
    g = cx.g
    data, indices, updates = (_t(cx, a) for a in args[:3])
    if data.shape is None or UNKNOWN in data.shape or indices.shape is None or UNKNOWN in indices.shape:
        raise cx.fail(f"ScatterElements needs known extents, got {data.type} and {indices.type}")
    axis = cx.axis(attrs.get("axis", 0), len(data.shape))
    idx = _wrapped(cx, indices, data.shape[axis])
    sums = g.scatter_add_along_axis(g.constant(np.zeros(data.shape), data.dtype), idx, updates, axis)
    if _reduction(cx, attrs) == "add":
        return [data + sums]
    hit = g.scatter_add_along_axis(g.constant(np.zeros(data.shape, np.int64)), idx,
                                   g.constant(np.ones(indices.shape, np.int64)), axis)
    return [g.select(hit > 0, sums, data)]


@handles("ScatterND")
def _scatter_nd(cx, node, args, attrs):
    # The first k axes of the data flattened into one, the index tuples into linear indices along it.
    g = cx.g
    data, indices, updates = (_t(cx, a) for a in args[:3])
    if data.shape is None or UNKNOWN in data.shape or indices.shape is None or UNKNOWN in indices.shape:
        raise cx.fail(f"ScatterND needs known extents, got {data.type} and {indices.type}")
    k = indices.shape[-1]
    lead, rest = list(data.shape[:k]), list(data.shape[k:])
    if k > len(data.shape):
        raise cx.fail(f"index tuples of {k} entries for data of rank {len(data.shape)}")
    count = int(np.prod(indices.shape[:-1]))
    linear = None
    for j, extent in enumerate(lead):
        part = g.squeeze(g.slice(indices, [0] * (indices.rank - 1) + [j], list(indices.shape[:-1]) + [j + 1]),
                         [indices.rank - 1])
        term = _wrapped(cx, part, extent) * int(np.prod(lead[j + 1:]))
        linear = term if linear is None else linear + term
    linear = g.reshape(linear, [count])
    flat = g.reshape(data, [int(np.prod(lead))] + rest)
    ups = g.reshape(updates, [count] + rest)
    sums = g.scatter_add(g.constant(np.zeros([int(np.prod(lead))] + rest), data.dtype), linear, ups, 0)
    if _reduction(cx, attrs) == "add":
        return [g.reshape(flat + sums, list(data.shape))]
    ones = g.constant(np.ones([count] + [1] * len(rest), np.int64))
    hit = g.scatter_add(g.constant(np.zeros([int(np.prod(lead))] + [1] * len(rest), np.int64)), linear, ones, 0)
    return [g.reshape(g.select(hit > 0, sums, flat), list(data.shape))]


@handles("CausalConvWithState")
def _causal_conv(cx, node, args, attrs):
    # A depthwise 1-D convolution over the past state (zeros without one) followed by the input; the new
    # state is the last k - 1 positions of that sequence.
    from .onnx_ops import HANDLERS

    g = cx.g
    x, w = _t(cx, args[0]), _t(cx, args[1])
    if _rank(cx, x) != 3 or _rank(cx, w) != 3 or UNKNOWN in x.shape or UNKNOWN in w.shape:
        raise cx.fail(f"input (batch, channels, length) and weight (channels, 1, k) of known extents, "
                      f"got {x.type} and {w.type}")
    b, c, length = x.shape
    k = w.shape[2]
    activation = attrs.get("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise cx.fail(f"activation must be none, silu or swish, got {activation!r}")
    past = _t(cx, args[3]) if len(args) > 3 and args[3] is not None else g.constant(np.zeros((b, c, k - 1)), x.dtype)
    padded = g.concat([past, x], axis=2) if k > 1 else x
    bias = args[2] if len(args) > 2 else None
    y = HANDLERS["Conv"](cx, node, [padded, w, bias], {"group": c, "kernel_shape": [k]})[0]
    if activation != "none":
        y = y * g.sigmoid(y)
    total = length + k - 1
    return [y, g.slice(padded, [0, 0, total - (k - 1)], [b, c, total])]


def _per_axis(cx, param, x, attrs):
    """A scale or zero point shaped to broadcast against x: a scalar, one value per entry along `axis`, or
    (with block_size) one per block of that many entries along it."""
    g = cx.g
    if param.rank == 0 or (param.shape is not None and list(param.shape) in ([], [1])):
        return g.reshape(param, []) if param.rank else param
    rank = _rank(cx, x)
    axis = cx.axis(attrs.get("axis", 1), rank)
    block = int(attrs.get("block_size", 0))
    if block > 0:
        if param.rank != rank:
            raise cx.fail(f"blocked quantization needs a parameter of rank {rank}, got {param.type}")
        expanded = g.reshape(g.tile(g.expand_dims(param, [axis + 1]), [1] * (axis + 1) + [block] + [1] * (rank - axis - 1)),
                             [d * block if a == axis else d for a, d in enumerate(param.shape)])
        if x.shape[axis] != expanded.shape[axis]:
            ends = list(expanded.shape)
            ends[axis] = x.shape[axis]
            expanded = g.slice(expanded, [0] * rank, ends)
        return expanded
    return g.reshape(param, [-1 if a == axis else 1 for a in range(rank)])


@handles("DequantizeLinear")
def _dequantize(cx, node, args, attrs):
    g = cx.g
    x, scale = _t(cx, args[0]), _t(cx, args[1])
    out = onnx_dtype(attrs["output_dtype"], "output_dtype") if attrs.get("output_dtype") else scale.dtype
    y = g.cast(x, dtypes.float32)
    if len(args) > 2 and args[2] is not None:
        y = y - g.cast(_per_axis(cx, _t(cx, args[2]), x, attrs), dtypes.float32)
    return [g.cast(y * g.cast(_per_axis(cx, scale, x, attrs), dtypes.float32), out)]


@handles("QuantizeLinear")
def _quantize(cx, node, args, attrs):
    # round(x / scale) half to even, plus the zero point, saturated to the output type's range.
    g = cx.g
    x, scale = _t(cx, args[0]), _t(cx, args[1])
    zp = _t(cx, args[2]) if len(args) > 2 and args[2] is not None else None
    if attrs.get("output_dtype"):
        out = onnx_dtype(attrs["output_dtype"], "output_dtype")
    else:
        out = zp.dtype if zp is not None else dtypes.uint8
    if not (out.is_integer or out.is_float8):
        raise cx.fail(f"quantizing to {out} is not supported (integer and float8 types are)")
    y = g.cast(x, dtypes.float32) / g.cast(_per_axis(cx, scale, x, attrs), dtypes.float32)
    if out.is_float8:  # no rounding to integers: the cast rounds, saturating unless told not to
        if zp is not None:
            y = y + g.cast(_per_axis(cx, zp, x, attrs), dtypes.float32)
        return [to_float8(g, y, out, bool(attrs.get("saturate", 1)))]
    y = g.round(y)
    if zp is not None:
        y = y + g.cast(_per_axis(cx, zp, x, attrs), dtypes.float32)
    info = np.iinfo(out.numpy)
    y = g.clamp(y, g.constant(float(info.min), dtypes.float32), g.constant(float(info.max), dtypes.float32))
    return [g.cast(y, out)]


def _dft_matrices(n_in: int, n: int, inverse: bool, onesided: bool):
    """(A, B, C, D), each (n_in, m): re_out = re A + im B, im_out = re C + im D (C, D None: a real result)."""
    j = np.arange(n_in)[:, None]
    if inverse and onesided:  # numpy's irfft: a Hermitian spectrum of n // 2 + 1 bins back to n real samples
        k = np.arange(n)[None, :]
        theta = 2 * np.pi * j * k / n
        weight = np.where((j == 0) | ((n % 2 == 0) & (j == n // 2)), 1.0, 2.0) * (j <= n // 2)
        return weight * np.cos(theta) / n, -weight * np.sin(theta) / n, None, None
    m = n // 2 + 1 if onesided else n
    k = np.arange(m)[None, :]
    theta = 2 * np.pi * j * k / n
    used = (j < n).astype(np.float64)  # samples past dft_length are cut; missing ones are zeros
    cos, sin = np.cos(theta) * used, np.sin(theta) * used
    if inverse:
        return cos / n, -sin / n, sin / n, cos / n
    return cos, sin, -sin, cos


@handles("DFT")
def _dft(cx, node, args, attrs):
    # A linear map along the axis: products with cosine and sine matrices, in float64 (the spectrum of a
    # float32 signal computed in float32 misses ONNX's absolute tolerance near zero).
    g, x = cx.g, _t(cx, args[0])
    rank = _rank(cx, x)
    if x.shape is None or UNKNOWN in x.shape or x.shape[-1] not in (1, 2):
        raise cx.fail(f"the signal must have known extents and a last axis of 1 (real) or 2 (complex), got {x.type}")
    if cx.opset >= 20:
        axis = int(cx.static(args[2], "DFT axis").reshape(-1)[0]) if len(args) > 2 and args[2] is not None else -2
    else:
        axis = attrs.get("axis", 1)
    axis = cx.axis(axis, rank)
    if axis == rank - 1:
        raise cx.fail("the axis cannot be the last one (it holds the real and imaginary parts)")
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    n_in = x.shape[axis]
    if len(args) > 1 and args[1] is not None:
        n = int(cx.static(args[1], "DFT dft_length").reshape(-1)[0])
    else:
        n = 2 * (n_in - 1) if inverse and onesided else n_in
    if n <= 0:
        raise cx.fail(f"dft_length must be positive, got {n}")
    lead = list(x.shape[:-1])
    order = [a for a in range(rank - 1) if a != axis] + [axis]  # the axis moved last
    back = list(np.argsort(order))

    def part(i):  # the real (0) or imaginary (1) parts, in float64, the axis last
        p = g.squeeze(g.slice(x, [0] * (rank - 1) + [i], lead + [i + 1]), [rank - 1])
        return g.transpose(g.cast(p, dtypes.float64), order)

    re = part(0)
    im = part(1) if x.shape[-1] == 2 else None
    a, b, c, d = _dft_matrices(n_in, n, inverse, onesided)

    def apply(m1, m2):
        y = g.matrix_multiplication(re, g.constant(m1))
        return y if im is None else y + g.matrix_multiplication(im, g.constant(m2))

    outs = [apply(a, b)] + ([] if c is None else [apply(c, d)])
    outs = [g.expand_dims(g.cast(g.transpose(o, back), x.dtype), [rank - 1]) for o in outs]
    return [outs[0] if len(outs) == 1 else g.concat(outs, axis=rank - 1)]
