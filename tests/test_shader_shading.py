"""The neural-material shading kernel (stitchml.shader.shading): the integer-filtered fast path and the
byte-gather kernel against a float64 PyTorch decode (bilinear latents, the spec's reference network,
the normal rebuilt and made unit), and the plain-feature variant. Kernels run under TRITON_INTERPRET=1
on the CPU."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # Triton reads this when a kernel is decorated, i.e. at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

from stitchml.errors import DataError, ShapeError  # noqa: E402
from stitchml.shader import MLPSpec  # noqa: E402
from stitchml.shader import shading, shading_fast  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _decoder(inputs: int, seed: int):
    spec = MLPSpec((inputs, 32, 6), ("relu", "none"))
    rng = np.random.default_rng(seed)
    weights = [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.3)
               for a, b in zip(spec.widths, spec.widths[1:])]
    return spec, weights


def _reference(features: torch.Tensor, spec: MLPSpec, weights) -> torch.Tensor:
    """(texels, 8) in float64: clamped colour, the unit normal with z rebuilt, clamped roughness, 0."""
    y = spec.reference(features.double().cpu(), weights)
    xy = y[:, 3:5]
    z = (1 - (xy ** 2).sum(1, keepdim=True)).clamp(min=0).sqrt()
    normal = torch.nn.functional.normalize(torch.cat([xy, z], 1), dim=1)
    return torch.cat([y[:, :3].clamp(0, 1), normal, y[:, 5:6].clamp(0, 1), torch.zeros_like(z)], 1)


def _features(latents: torch.Tensor, size, fine: int, coarse: int, levels: int) -> torch.Tensor:
    h, w = (size, size) if isinstance(size, int) else size
    n_fine = (h // 2) * (w // 2) * fine
    grids = [latents[:n_fine].reshape(h // 2, w // 2, fine), latents[n_fine:].reshape(h // 4, w // 4, coarse)]
    feats = [torch.nn.functional.interpolate(q.permute(2, 0, 1)[None].double() / levels, size=(h, w),
                                             mode="bilinear", align_corners=False)[0] for q in grids]
    return torch.cat(feats).reshape(fine + coarse, -1).T


@pytest.mark.parametrize("size,fine,coarse,block,levels", [
    (16, 4, 12, 16, 127),  # blocks within image rows; extreme latents fill the 16-bit lanes
    (24, 8, 4, 64, 7),  # blocks across rows, a partial last block, two fine words
    (16, 4, 6, 64, 7),  # channel counts the fast path does not take: the byte-gather kernel
])
def test_shade_matches_the_float64_decode(size, fine, coarse, block, levels):
    spec, weights = _decoder(fine + coarse, seed=size + fine)
    n = (size // 2) ** 2 * fine + (size // 4) ** 2 * coarse
    latents = torch.randint(-levels, levels + 1, (n,), dtype=torch.int8, generator=torch.Generator().manual_seed(3))
    assert shading_fast.fits(spec, fine, coarse) == (coarse % 4 == 0)
    out = torch.full((size * size, 8), float("nan"), device=DEVICE)
    shading.shade(latents.to(DEVICE), spec.pack(weights, DEVICE), size, fine, coarse, levels, spec, block=block,
                  out=out)
    ref = _reference(_features(latents, size, fine, coarse, levels), spec, weights)
    got = out.double().cpu()
    assert torch.isfinite(got).all()
    # the kernel rounds the decoder's inputs, weights and hidden layer to half; the reference does not
    np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=3e-3)
    np.testing.assert_allclose(got[:, 3:6].norm(dim=1).numpy(), 1, atol=1e-5)


@pytest.mark.parametrize("height,width,fine,coarse,block,dtype", [
    (8, 32, 4, 12, 16, torch.float16),  # blocks within rows (a constant count per row), two channels a store word
    (12, 20, 4, 4, 32, torch.float16),  # blocks across rows of a non-square material
    (8, 12, 4, 6, 16, torch.float32),  # the byte-gather kernel
])
def test_shade_rectangular_materials(height, width, fine, coarse, block, dtype):
    spec, weights = _decoder(fine + coarse, seed=height + width)
    n = (height // 2) * (width // 2) * fine + (height // 4) * (width // 4) * coarse
    latents = torch.randint(-15, 16, (n,), dtype=torch.int8, generator=torch.Generator().manual_seed(5))
    out = torch.full((height * width, 8), float("nan"), dtype=dtype, device=DEVICE)
    shading.shade(latents.to(DEVICE), spec.pack(weights, DEVICE), (height, width), fine, coarse, 15, spec,
                  block=block, out=out)
    ref = _reference(_features(latents, (height, width), fine, coarse, 15), spec, weights)
    # half outputs add one rounding (2.4e-4 at 0.5) to the decoder's
    np.testing.assert_allclose(out.double().cpu().numpy(), ref.numpy(), atol=3e-3 if dtype == torch.float32 else 4e-3)
    with pytest.raises(ShapeError, match="12x20 material"):
        shading.shade(latents[:-1].to(DEVICE), spec.pack(weights, DEVICE), (12, 20), fine, coarse, 15, spec)


@pytest.mark.parametrize("height,width,fine,coarse,block,group,warps", [
    (8, 32, 4, 12, 16, 4, 1),  # one word fine, three coarse; left and right edges inside groups
    (12, 32, 8, 4, 32, 2, 1),  # two fine words; pairs at both coarse phases
    (4, 16, 4, 8, 16, 4, 1),  # a word past the channels
])
def test_grouped_sampling_is_the_per_texel_decode(height, width, fine, coarse, block, group, warps):
    """Texels sampled a group at a time give the same integer tap sums, hence the same bits, as each
    texel on its own; and both match the float64 decode."""
    spec, weights = _decoder(fine + coarse, seed=height + width)
    n = (height // 2) * (width // 2) * fine + (height // 4) * (width // 4) * coarse
    latents = torch.randint(-15, 16, (n,), dtype=torch.int8, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    outs = []
    for g in (1, group):
        out = torch.full((height * width, 8), float("nan"), dtype=torch.float16, device=DEVICE)
        shading.shade(latents, spec.pack(weights, DEVICE), (height, width), fine, coarse, 15, spec, block=block,
                      num_warps=warps, group=g, out=out)
        outs.append(out.cpu())
    assert torch.equal(outs[0], outs[1])
    # by default a group per thread: pairs at 256 texels x 4 warps, fours at 2 warps, none when too few
    assert [shading.default_group(b, w) for b, w in [(256, 4), (256, 2), (128, 4), (512, 4)]] == [2, 4, 1, 4]
    ref = _reference(_features(latents.cpu(), (height, width), fine, coarse, 15), spec, weights)
    np.testing.assert_allclose(outs[1].double().numpy(), ref.numpy(), atol=4e-3)
    with pytest.raises(ShapeError, match="group must be 1, 2 or 4"):
        shading.shade(latents, spec.pack(weights, DEVICE), (height, width), fine, coarse, 15, spec, group=3)


@pytest.mark.parametrize("height,width,fine,coarse,block,group", [
    (8, 32, 4, 12, 16, 4),  # fours; edges inside groups
    (12, 32, 8, 4, 32, 2),  # pairs, two fine words
    (12, 20, 4, 4, 32, 1),  # blocks across rows: texels one at a time
])
def test_half_conversion_is_the_float_conversion(height, width, fine, coarse, block, group):
    """Latents within [-8, 8] are converted two at a time as halves; the decoder gets the same values as
    through float32: decoding with levels 8 equals decoding with levels 16 and the first layer's weights
    doubled, bit for bit (the kernel scales those by 1 / levels, exactly), and both match float64. The
    extremes (+-8: 16-bit lanes at 1024 + 0 and 1024 + 1024) are in every tap."""
    spec, weights = _decoder(fine + coarse, seed=height * width)
    n = (height // 2) * (width // 2) * fine + (height // 4) * (width // 4) * coarse
    latents = torch.randint(-8, 9, (n,), dtype=torch.int8, generator=torch.Generator().manual_seed(7))
    latents[::5], latents[1::5] = 8, -8
    doubled = [(weights[0][0] * 2, weights[0][1])] + weights[1:]
    outs = []
    for levels, w in [(8, weights), (16, doubled)]:
        out = torch.full((height * width, 8), float("nan"), dtype=torch.float16, device=DEVICE)
        shading.shade(latents.to(DEVICE), spec.pack(w, DEVICE), (height, width), fine, coarse, levels, spec,
                      block=block, num_warps=1, group=group, out=out)
        outs.append(out.cpu())
    assert torch.equal(outs[0], outs[1])
    ref = _reference(_features(latents, (height, width), fine, coarse, 8), spec, weights).numpy()
    got = outs[0].double().numpy()
    # z = sqrt(1 - x² - y²) turns an error e in x² + y² near 1 into up to sqrt(e): z is compared squared
    others = [0, 1, 2, 3, 4, 6, 7]
    np.testing.assert_allclose(got[:, others], ref[:, others], atol=4e-3)
    np.testing.assert_allclose(got[:, 5] ** 2, ref[:, 5] ** 2, atol=4e-3)


def test_shade_plain_matches_the_float64_decode():
    spec, weights = _decoder(16, seed=5)
    # in [-1, 1] like sampled latents / levels
    features = (torch.rand(200, 16, generator=torch.Generator().manual_seed(4)) * 2 - 1).half()
    out = torch.full((200, 8), float("nan"), device=DEVICE)
    shading.shade_plain(features.to(DEVICE), spec.pack(weights, DEVICE), spec, block=64, out=out)
    np.testing.assert_allclose(out.double().cpu().numpy(), _reference(features, spec, weights).numpy(), atol=3e-3)


def test_shade_plain_refuses_other_shapes():
    spec, weights = _decoder(16, seed=5)
    with pytest.raises(ShapeError, match=r"features \(texels, 16\)"):
        shading.shade_plain(torch.zeros(8, 12, dtype=torch.float16), spec.pack(weights), spec)
    wide = MLPSpec((16, 32, 20), ("relu", "none"))
    with pytest.raises(ShapeError, match="6 outputs"):
        shading.shade_plain(torch.zeros(8, 16, dtype=torch.float16), wide.pack(_decoder(16, 1)[1][:1] + [
            (np.zeros((32, 20)), np.zeros(20))]), wide)


def test_shade_refuses_latents_outside_their_levels():
    """The half conversion relies on latents within [-levels, levels]: one outside is a DataError before any
    kernel runs, naming the range and what was found; non-integer latents are refused too."""
    fine, coarse, levels = 4, 12, 8
    spec, weights = _decoder(fine + coarse, seed=1)
    n = 6 * 10 * fine + 3 * 5 * coarse
    latents = torch.randint(-levels, levels + 1, (n,), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    latents[17] = levels + 1
    with pytest.raises(DataError, match=r"\[-8, 8\].*from -8 to 9"):
        shading.shade(latents.to(DEVICE), spec.pack(weights, DEVICE), (12, 20), fine, coarse, levels, spec)
    with pytest.raises(DataError, match="int8"):
        shading.shade(latents.float().to(DEVICE), spec.pack(weights, DEVICE), (12, 20), fine, coarse, levels, spec)
