"""torch.export parity: every zoo model imported through torch.export matches PyTorch to 1e-4 in float32."""
import warnings

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.package import zoo

TOL = 1e-4


def _run(fn, xs):
    out = fn(**{p.name: x.numpy() for p, x in zip(fn.inputs, xs)})
    return out[fn.outputs[0].name].numpy()


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_matches_pytorch(name, tmp_path):
    model, xs = zoo.build(name)
    batch = torch.export.Dim("batch", min=1, max=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pkg = sm.package.from_torch(model, xs, dynamic_shapes=({0: batch},))
    pkg.save(tmp_path / "m.smpkg")
    fn = sm.load_package(tmp_path / "m.smpkg").function("main")
    assert fn.inputs[0].type.shape[0] == -1 and fn.inputs[0].dim_names[0] == "batch"
    with torch.no_grad():
        for x in (xs, tuple(torch.cat([v, v[:1]]) for v in xs)):  # the example batch and another
            want = model(*x).numpy()
            got = _run(fn, x)
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= TOL


def test_static_export_keeps_every_extent():
    model, xs = zoo.build("cnn")
    fn = sm.package.from_torch(model, xs).function()
    assert fn.inputs[0].type.shape == (2, 3, 16, 16)
    with torch.no_grad():
        assert np.abs(_run(fn, xs) - model(*xs).numpy()).max() <= TOL


def test_unsupported_aten_operator_names_the_node():
    class Odd(torch.nn.Module):
        def forward(self, x):
            return torch.special.i0(x)

    with pytest.raises(sm.PackageError, match="i0"):
        sm.package.from_torch(Odd(), (torch.randn(3),))


def test_export_failure_is_a_package_error():
    class DataDependent(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]  # the output shape depends on the data

    with pytest.raises(sm.PackageError):
        sm.package.from_torch(DataDependent(), (torch.randn(4),))


class _Ops(torch.nn.Module):
    """One module per group of ATen operators the zoo does not reach."""

    def __init__(self, body):
        super().__init__()
        self.body = body
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, x):
        return self.body(self, x)


_BODIES = {
    "scans_and_sorting": lambda m, x: torch.cumsum(x, 1) + torch.topk(x, 3, dim=1).values.sum(1, keepdim=True),
    "selection": lambda m, x: torch.where(x > 0, x, -x).clamp(0.1, 0.9) + x.flip(1).repeat(1, 1)[:, 1:2],
    "statistics": lambda m, x: x.var(dim=1, keepdim=True) + x.argmax(1, keepdim=True).float() + x.amin(1, keepdim=True),
    "embedding": lambda m, x: m.emb((x.abs() * 3).long().clamp(0, 9)).sum(-1),
    "padding_and_resize": lambda m, x: torch.nn.functional.interpolate(
        torch.nn.functional.pad(x.reshape(x.shape[0], 1, 2, 4), (1, 1, 0, 1)), scale_factor=2.0, mode="nearest"
    ).flatten(1),
    "activations": lambda m, x: torch.nn.functional.silu(x) + torch.nn.functional.elu(x)
    + torch.nn.functional.hardswish(x) + torch.nn.functional.leaky_relu(x, 0.2) + torch.rsqrt(x.abs() + 1),
    "split_select": lambda m, x: torch.cat([p * i for i, p in enumerate(x.split(3, dim=1))], 1)[:, 2] + x.select(1, 0),
}


@pytest.mark.parametrize("name", sorted(_BODIES))
def test_aten_operator_groups_match_pytorch(name):
    model = _Ops(_BODIES[name]).eval()
    x = torch.randn(3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x,)).function()
    with torch.no_grad():
        want = model(x).numpy()
    got = fn(x=x.numpy())["output"].numpy()
    assert got.shape == want.shape and np.abs(got - want).max() <= TOL


class _Blocks(torch.nn.Module):
    """any over a dim, group norm, and a cat onto an empty cache, as transformer and ConvNeXt blocks use."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 4)

    def forward(self, x, mask):
        cache = torch.zeros(0)
        y = self.norm(x)
        keep = mask.any(dim=-1, keepdim=True) & ~mask.all(dim=-1, keepdim=True)
        return torch.cat([cache, (y.flatten(1) * keep).flatten()]), keep


def test_any_all_group_norm_and_cat_with_an_empty_tensor_match_pytorch():
    model = _Blocks().eval()
    with torch.no_grad():
        model.norm.weight.normal_()
        model.norm.bias.normal_()
    x = torch.randn(3, 4, 5, 5)
    mask = torch.tensor([[True, False], [True, True], [False, False]])
    batch = torch.export.Dim("batch", min=2, max=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x, mask), dynamic_shapes=({0: batch}, {0: batch})).function()
    out = fn(x=x.numpy(), mask=mask.numpy())
    with torch.no_grad():
        want, want_keep = model(x, mask)
    got = [out[p.name].numpy() for p in fn.outputs]
    np.testing.assert_array_equal(got[1], want_keep.numpy())
    assert np.abs(got[0] - want.numpy()).max() <= TOL * max(1.0, np.abs(want.numpy()).max())
