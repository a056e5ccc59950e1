"""Facts about ops live on their primitives: the compiler recognises patterns by the ops themselves.

The cuBLASLt bias+GeLU(tanh) epilogue is chosen by comparing the ops fused after a matrix product (their
names, wiring and constants) with the tanh GeLU that composites.gelu builds; the scope names the ops carry
play no part, so the same formula written by hand is recognised, and a different one is not.
"""
from __future__ import annotations

import importlib
import math

import pytest

import stitchml as sm

lower = importlib.import_module("stitchml.passes.lower")


def _epilogue_kind(monkeypatch, activation, dtype=sm.float32):
    """The cuBLASLt epilogue kind chosen for activation(a @ b + c), or None."""
    bodies = []
    split = lower._epilogue

    def spy(body):
        bodies.append(body)
        return split(body)

    monkeypatch.setattr(lower, "_epilogue", spy)
    g = sm.Graph("epilogue")
    a, b, c = g.placeholder((4, 8), dtype), g.placeholder((8, 6), dtype), g.placeholder((6,), dtype)
    y = activation(g, g.matrix_multiplication(a, b) + c)
    g.compile({p: sm.TensorType(p.shape, dtype) for p in (a, b, c)}, [y])
    (body,) = bodies
    contraction = next(o for o in body.operations if o.op == "matrix_multiplication")
    placeholders = [o.outputs[0] for o in body.operations if o.op == "placeholder"]
    fused = lower._cublaslt_epilogue(body, contraction, placeholders, list(range(len(placeholders))), [0])
    return None if fused is None else fused[0]


def _hand_gelu(cubic):
    def build(g, x):
        with g.scope("mine"):
            inner = math.sqrt(2.0 / math.pi) * (x + cubic * x * x * x)
            return 0.5 * x * (1.0 + g.tanh(inner))
    return build


@pytest.mark.parametrize("activation, dtype, kind", [
    (lambda g, x: x, sm.float32, "bias"),
    (lambda g, x: g.relu(x), sm.float32, "bias_relu"),
    (lambda g, x: g.gelu(x, approximate="tanh"), sm.float32, "bias_gelu"),
    (_hand_gelu(0.044715), sm.float32, "bias_gelu"),  # no "gelu/tanh" scope: the ops alone decide
    (_hand_gelu(0.04), sm.float32, None),  # the same wiring with another constant is another function
    (lambda g, x: g.gelu(x), sm.float32, None),  # erf GeLU: cuBLASLt has no such epilogue
    (lambda g, x: g.gelu(x, approximate="tanh") * 2.0, sm.float32, None),
    # a half GeLU computes in float32 between casts, as cuBLASLt's epilogue does
    (lambda g, x: g.gelu(x, approximate="tanh"), sm.float16, "bias_gelu"),
    (lambda g, x: g.gelu(x, approximate="tanh"), sm.bfloat16, "bias_gelu"),
    (lambda g, x: g.cast(g.gelu(g.cast(x, sm.float32), approximate="tanh"), sm.float32), sm.float16, None),
], ids=["bias", "relu", "gelu_tanh", "hand_gelu_tanh", "other_constant", "gelu_erf", "scaled", "gelu_tanh_f16",
        "gelu_tanh_bf16", "f16_product_float32_result"])
def test_cublaslt_epilogue_is_matched_on_the_fused_ops(monkeypatch, activation, dtype, kind):
    assert _epilogue_kind(monkeypatch, activation, dtype) == kind
