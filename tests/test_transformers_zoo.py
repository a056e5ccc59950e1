"""Models of the transformers library, built from small configs with random weights (nothing is downloaded),
through torch.export and through torch.onnx into packages: outputs match PyTorch to 1e-4 relative error.

Six families (stitchml.package.zoo builds them as "hf:<family>"): BERT, GPT-2 (its attention needs the
narrower decomposition table), Llama (grouped-query heads, rotary embeddings), ViT, ConvNeXt and ResNet.
Three run in CI; the others are marked slow.
"""
import warnings

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.package import zoo

pytest.importorskip("transformers")
REL = 1e-4
FAMILIES = zoo.TRANSFORMERS
SLOW = {"bert", "vit", "resnet"}


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in FAMILIES])
def test_family_matches_pytorch_through_torch_export(family):
    model, xs = zoo.build(f"hf:{family}")
    with torch.no_grad():
        want = model(*xs).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, xs).function()
    got = fn(**{p.name: x.numpy() for p, x in zip(fn.inputs, xs)})[fn.outputs[0].name].numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL * np.abs(want).max()


# torch.onnx's TorchScript exporter cannot convert Llama's grouped-query attention (enable_gqa), so Llama goes
# through torch.export only.
ONNX_FAMILIES = [f for f in FAMILIES if f != "llama"]


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f
                                    for f in ONNX_FAMILIES])
def test_family_matches_pytorch_through_onnx(family):
    import io

    model, xs = zoo.build(f"hf:{family}")
    with torch.no_grad():
        want = model(*xs).numpy()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, xs, buf, dynamo=False, input_names=["x"], output_names=["y"], opset_version=17)
    fn = sm.package.from_onnx(buf.getvalue()).function()
    got = fn(x=xs[0].numpy())["y"].numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL * np.abs(want).max()
