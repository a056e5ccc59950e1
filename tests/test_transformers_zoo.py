"""Models of the transformers library, built from small configs with random weights (nothing is downloaded),
through torch.export and through torch.onnx into packages: outputs match PyTorch to 1e-4 relative error.

Six families: BERT, GPT-2 (its attention needs the narrower decomposition table), Llama (grouped-query
heads, rotary embeddings), ViT, ConvNeXt and ResNet. Three run in
CI; the others are marked slow.
"""
import warnings

import numpy as np
import pytest
import torch

import stitchml as sm

tf = pytest.importorskip("transformers")
REL = 1e-4


def _tokens():
    return (torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0)),)


def _images(size):
    return (torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0)),)


FAMILIES = {
    "bert": lambda: (tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=4, intermediate_size=64,
                                                max_position_embeddings=32)), _tokens()),
    "gpt2": lambda: (tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                                bos_token_id=0, eos_token_id=0)), _tokens()),
    "llama": lambda: (tf.LlamaModel(tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2,
                                                   intermediate_size=64, max_position_embeddings=32)), _tokens()),
    "vit": lambda: (tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                             intermediate_size=64, image_size=16, patch_size=4)), _images(16)),
    "convnext": lambda: (tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                                            image_size=32)), _images(32)),
    "resnet": lambda: (tf.ResNetModel(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                      layer_type="basic")), _images(32)),
}
SLOW = {"bert", "vit", "resnet"}


class _FirstOutput(torch.nn.Module):
    """The model's last hidden state as a plain tensor (its outputs are a dataclass otherwise)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, return_dict=False)[0]


@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in FAMILIES])
def test_family_matches_pytorch_through_torch_export(family):
    torch.manual_seed(0)
    model, xs = FAMILIES[family]()
    model = _FirstOutput(model.eval())
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

    torch.manual_seed(0)
    model, xs = FAMILIES[family]()
    model = _FirstOutput(model.eval())
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
