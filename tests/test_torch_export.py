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
