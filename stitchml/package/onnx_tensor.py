"""More ONNX tensor operators, as decompositions into registry ops: CumProd, CenterCropPad, SwiGLU, AffineGrid.

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
"""
from __future__ import annotations

import numpy as np

from ..ir import UNKNOWN
from .onnx_ops import _rank, _t, handles


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
