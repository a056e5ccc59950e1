"""resize's GPU path (PyTorch's bilinear upsampling kernels in float32) against the float64 reference
of the ONNX definition, values and gradients; which resizes take it."""
import numpy as np
import pytest
import torch

from stitchml.ops import image


def _attrs(shape, sizes, transform="half_pixel", mode="linear", scales=None, roi=()):
    scales = scales or tuple(o / n for o, n in zip(sizes, shape))
    return dict(sizes=sizes, scales=scales, roi=roi, mode=mode, transform=transform,
                nearest_mode="round_prefer_floor", cubic_coeff_a=-0.75, exclude_outside=False,
                extrapolation_value=0.0)


@pytest.mark.parametrize("shape,sizes", [((4, 8, 8), (4, 16, 16)), ((6, 8, 8), (6, 32, 32)),
                                         ((2, 3, 5, 7), (2, 3, 20, 9)), ((3, 9, 10), (3, 4, 5))])
def test_bilinear_2d_matches_the_reference(shape, sizes):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal(shape))
    dy = torch.from_numpy(rng.standard_normal(sizes))
    a = _attrs(shape, sizes)
    assert image._bilinear_2d(shape, sizes, a["scales"], (), "linear", "half_pixel")
    ref = image._resize_impl(x, **a)
    got = image.bilinear_2d(x.float(), sizes)
    assert got.dtype == torch.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got.double(), ref, atol=2e-6)
    grad = image.bilinear_2d_gradient(dy.float(), shape)
    np.testing.assert_allclose(grad.double(), image._resize_gradient_impl(dy, x, **a), atol=1e-5)


@pytest.mark.parametrize("shape,sizes,kw", [
    ((4, 8, 8), (4, 16, 16), {"mode": "cubic"}),
    ((4, 8, 8), (4, 16, 16), {"transform": "align_corners"}),
    ((4, 8, 8), (8, 16, 16), {}),  # a leading axis resized
    ((8, 8), (16, 16), {}),  # rank 2
    ((4, 8, 8), (4, 16, 16), {"scales": (1.0, 2.5, 2.0)}),  # scales that are not sizes / extents
    ((4, 8, 8), (4, 1, 16), {"transform": "pytorch_half_pixel"}),
])
def test_other_resizes_keep_the_reference(shape, sizes, kw):
    a = _attrs(shape, sizes, **kw)
    assert not image._bilinear_2d(shape, sizes, a["scales"], a["roi"], a["mode"], a["transform"])
