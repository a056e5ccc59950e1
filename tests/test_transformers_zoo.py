"""Models of the transformers library, built from small configs with random weights (nothing is downloaded),
through torch.export and through torch.onnx into packages: outputs match PyTorch to 1e-4 relative error.

Ten families (stitchml.package.zoo builds them as "hf:<family>"): BERT, GPT-2 (its attention needs the
narrower decomposition table), Llama (grouped-query heads, rotary embeddings), ViT, ConvNeXt, ResNet,
T5 (encoder-decoder, relative position buckets, cross-attention), Wav2Vec2 (audio: strided 1-D convolutions
over raw samples, a weight-normed grouped positional convolution), Swin (shifted windows: rolls, window
partitions, a bias table read by advanced indexing) and MobileNetV2 (depthwise convolutions, ReLU6).
Every family goes through both importers. Four run in CI; the others are marked slow.
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
SLOW = {"bert", "vit", "resnet", "wav2vec2", "swin", "mobilenetv2"}


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


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in FAMILIES])
def test_family_matches_pytorch_through_onnx(family):
    import io

    model, xs = zoo.build(f"hf:{family}")
    with torch.no_grad():
        want = model(*xs).numpy()
    if family == "llama":
        # torch.onnx's TorchScript exporter cannot convert scaled_dot_product_attention's enable_gqa: Llama
        # exports with the library's eager attention (the same function; torch.export above keeps SDPA).
        model.model.set_attn_implementation("eager")
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, xs, buf, dynamo=False, input_names=["x"], output_names=["y"], opset_version=17)
    fn = sm.package.from_onnx(buf.getvalue()).function()
    got = fn(x=xs[0].numpy())["y"].numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL * np.abs(want).max()
