"""Small reference networks with random weights: a CNN, a UNet, an LSTM, a transformer block, a ResNet-18, and
models of the transformers library (BERT, GPT-2, Llama, ViT, ConvNeXt, ResNet, T5, Wav2Vec2, Swin, MobileNetV2)
from small configs.

Public: the networks to try packages and pipelines on without a model file
(docs/packages.md starts from `zoo.build("cnn")`). The importers are checked
against PyTorch on these (tests/test_torch_export.py, tests/test_onnx_zoo.py),
and the benchmarks and the timeline example use them.
Each entry gives the module (in eval mode, seeded) and example inputs.

    >>> from stitchml.package import zoo
    >>> model, inputs = zoo.build("cnn")
    >>> tuple(model(*inputs).shape)
    (2, 10)
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F


class CNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, stride=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2),
        )
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _double_conv(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """Two levels down and up: one up path by transposed convolution, one by bilinear resize."""

    def __init__(self, cin: int = 4, cout: int = 3, width: int = 8):
        super().__init__()
        self.d1, self.d2 = _double_conv(cin, width), _double_conv(width, 2 * width)
        self.mid = _double_conv(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.u2 = _double_conv(4 * width, 2 * width)
        self.u1 = _double_conv(3 * width, width)
        self.out = nn.Conv2d(width, cout, 1)

    def forward(self, x):
        a = self.d1(x)
        b = self.d2(F.max_pool2d(a, 2))
        m = self.mid(F.max_pool2d(b, 2))
        b2 = self.u2(torch.cat([self.up2(m), b], 1))
        up = F.interpolate(b2, scale_factor=2.0, mode="bilinear", align_corners=False)
        return torch.sigmoid(self.out(self.u1(torch.cat([up, a], 1))))


class LSTMNet(nn.Module):
    def __init__(self, features: int = 6, hidden: int = 12, classes: int = 4):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and MLP with residuals, written out as a transformer model's code is."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))


class ResNet18(nn.Module):
    """ResNet-18's layout (stem, four stages of two basic blocks, pooled head) at reduced width."""

    def __init__(self, width: int = 8, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        stages, cin = [], width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            stages += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


def _randomize_norms(model: nn.Module) -> None:
    """Non-trivial running statistics, so that a wrong normalization cannot pass as identity."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple]]] = {
    "cnn": (CNN, lambda: (torch.randn(2, 3, 16, 16),)),
    "unet": (UNet, lambda: (torch.randn(2, 4, 16, 16),)),
    "lstm": (LSTMNet, lambda: (torch.randn(2, 5, 6),)),
    "transformer": (TransformerBlock, lambda: (torch.randn(2, 7, 32),)),
    "resnet18": (ResNet18, lambda: (torch.randn(2, 3, 32, 32),)),
}


class FirstOutput(nn.Module):
    """A transformers model's first output (its last hidden state) as a plain tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, return_dict=False)[0]


class EncoderDecoder(nn.Module):
    """An encoder-decoder model of the transformers library (T5) on one token tensor: the encoder reads all
    of it, the decoder its first five tokens; the decoder's last hidden state."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(input_ids=x, decoder_input_ids=x[:, :5], return_dict=False)[0]


def _transformers(family: str) -> tuple[nn.Module, tuple]:
    """A model of the transformers library from a small config (random weights; nothing is downloaded)."""
    import transformers as tf

    tokens = lambda: (torch.randint(0, 100, (2, 8)),)  # noqa: E731
    images = lambda n: (torch.randn(2, 3, n, n),)  # noqa: E731
    families = {
        "bert": lambda: (tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=64,
                                                    max_position_embeddings=32)), tokens()),
        "gpt2": lambda: (tf.GPT2Model(tf.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                                    bos_token_id=0, eos_token_id=0)), tokens()),
        "llama": lambda: (tf.LlamaModel(tf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       intermediate_size=64, max_position_embeddings=32)),
                          tokens()),
        "vit": lambda: (tf.ViTModel(tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=64, image_size=16, patch_size=4)), images(16)),
        "convnext": lambda: (tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2,
                                                                image_size=32)), images(32)),
        "resnet": lambda: (tf.ResNetModel(tf.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                          layer_type="basic")), images(32)),
        # Encoder-decoder with relative position buckets, RMS norms without bias, cross-attention.
        "t5": lambda: (tf.T5Model(tf.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                              num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8,
                                              relative_attention_max_distance=16, decoder_start_token_id=0)),
                       tokens()),
        # Audio: a strided 1-D convolution stack over raw samples, a weight-normed grouped positional
        # convolution, then a transformer encoder.
        "wav2vec2": lambda: (tf.Wav2Vec2Model(tf.Wav2Vec2Config(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16, 16),
            conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4)), (torch.randn(2, 400),)),
        # Shifted-window attention: rolls, window partitions and a relative position bias table read by index.
        "swin": lambda: (tf.SwinModel(tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                    num_heads=[2, 4], window_size=4)), images(32)),
        # Inverted residuals: depthwise (grouped) convolutions, ReLU6, TensorFlow-style "same" padding.
        "mobilenetv2": lambda: (tf.MobileNetV2Model(tf.MobileNetV2Config(image_size=32, depth_multiplier=0.25)),
                                images(32)),
    }
    if family not in families:
        raise KeyError(f"no transformers family {family!r}; there are {sorted(families)}")
    model, inputs = families[family]()
    with torch.no_grad():
        _randomize_norms(model)
    return (EncoderDecoder if family == "t5" else FirstOutput)(model.eval()).eval(), inputs


# Built as "hf:<family>".
TRANSFORMERS = ("bert", "gpt2", "llama", "vit", "convnext", "resnet", "t5", "wav2vec2", "swin", "mobilenetv2")


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple]:
    """The model `name` with weights from `seed`, in eval mode, and example inputs; ``hf:<family>`` builds
    one of `TRANSFORMERS` (needs the transformers package)."""
    torch.manual_seed(seed)
    if name.startswith("hf:"):
        return _transformers(name[3:])
    make, inputs = MODELS[name]
    model = make()
    with torch.no_grad():
        _randomize_norms(model)
    return model.eval(), inputs()
