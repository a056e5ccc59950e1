"""Golden files: the generated Triton source of a fixed set of graphs, kept in tests/golden/.

A change to the kernels the compiler generates shows up in review as a diff of these files. The
test regenerates each graph's kernels and compares them with the files; run it with
STITCHML_UPDATE_GOLDEN=1 to rewrite them after an intended change. The kernels must also compute
what the eager interpreter and a float64 reference do.

The files hold the source as CI generates it, under TRITON_INTERPRET=1: it imports libdevice from
stitchml.codegen.interpret. For a GPU the code generator writes Triton's CUDA libdevice import
instead (codegen/common.py: header); nothing else differs.
"""
from __future__ import annotations

import difflib
import os
import pathlib

import numpy as np
import pytest
import torch

import stitchml as sm

from compiler_util import assert_reference
from tolerance import sensitivity

pytestmark = pytest.mark.usefixtures("triton_interpreter")
GOLDEN = pathlib.Path(__file__).parent / "golden"


def _gelu(g):
    return [g.gelu(g.placeholder((8, 64), sm.float32, name="x"))]


def _softmax(g):
    return [g.softmax(g.placeholder((8, 64), sm.float32, name="x"))]


def _layer_norm(g):
    x = g.placeholder((8, 64), sm.float16, name="x")
    gamma, beta = g.placeholder((64,), sm.float16, name="gamma"), g.placeholder((64,), sm.float16, name="beta")
    return [g.layer_normalization(x, -1, gamma=gamma, beta=beta)]


def _matmul_bias_relu(g):
    x, w = g.placeholder((8, 32), sm.float32, name="x"), g.placeholder((32, 16), sm.float32, name="w")
    return [g.relu(x @ w + g.placeholder((16,), sm.float32, name="b"))]


def _sum_axis0(g):
    return [g.reduction_sum(g.square(g.placeholder((32, 24), sm.float32, name="x")) * 0.5, 0)]


def _broadcast_chain(g):
    x, y = g.placeholder((4, 1, 8), sm.float32, name="x"), g.placeholder((3, 1), sm.float32, name="y")
    z, w = g.placeholder((8,), sm.bfloat16, name="z"), g.placeholder((8, 3), sm.float32, name="w")
    return [g.tanh(x * y + z) - g.transpose(w, [1, 0])]


def _integer_division(g):
    # Only the divisor that can be zero is checked (the kernel's `err` argument); the constant 3 is not.
    a, b = g.placeholder((4, 8), sm.int32, name="a"), g.placeholder((8,), sm.int32, name="b")
    return [g.floor_division(a * 7, g.absolute(b) + 1) + g.modulo(a, 3)]


def _lstm_cell(g):
    # One kernel (passes/recurrent.py): the embedding rows gathered in place, both products, the update.
    table, tokens = g.placeholder((5, 6), sm.float32, name="table"), g.placeholder((3,), sm.int64, name="tokens")
    h, c = g.placeholder((3, 4), sm.float32, name="h"), g.placeholder((3, 4), sm.float32, name="c")
    w_ih, w_hh = g.placeholder((16, 6), sm.float32, name="w_ih"), g.placeholder((16, 4), sm.float32, name="w_hh")
    return [g.lstm_cell(g.gather(table, tokens, axis=0), h, c, w_ih, w_hh, g.placeholder((16,), sm.float32, name="b"))[0]]


def _lstm_reference(table, tokens, h, c, w_ih, w_hh, b):
    i, f, gg, o = (table[tokens.long()] @ w_ih.T + h @ w_hh.T + b).chunk(4, -1)
    return torch.sigmoid(o) * torch.tanh(torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg))


F = torch.nn.functional
GRAPHS = {  # name: (builder, float64 reference of its placeholders in order)
    "gelu": (_gelu, lambda x: F.gelu(x)),
    "softmax": (_softmax, lambda x: torch.softmax(x, -1)),
    "layer_norm": (_layer_norm, lambda x, gamma, beta: F.layer_norm(x, (64,), gamma, beta)),
    "matmul_bias_relu": (_matmul_bias_relu, lambda x, w, b: torch.relu(x @ w + b)),
    "sum_axis0": (_sum_axis0, lambda x: (x * x * 0.5).sum(0)),
    "broadcast_chain": (_broadcast_chain, lambda x, y, z, w: torch.tanh(x * y + z) - w.T),
    "integer_division": (_integer_division, lambda a, b: torch.floor(a * 7 / (b.abs() + 1)) + torch.remainder(a, 3)),
    "lstm_cell": (_lstm_cell, _lstm_reference),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_golden_kernel_sources(name):
    g = sm.Graph(name)
    targets = GRAPHS[name][0](g)
    rng = np.random.default_rng(0)
    feeds = {p: torch.as_tensor(rng.normal(size=p.shape)).to(p.dtype.torch) for p in g.placeholders}
    exe = g.compile(feeds, targets, device="cpu")
    (target,) = targets
    got, want = exe.run(feeds)[target].torch(), g.run(feeds, targets, device="cpu")[target].torch()
    args = [v.double() for v in feeds.values()]
    reference = GRAPHS[name][1](*args)
    (scale,) = sensitivity(GRAPHS[name][1], args)
    assert_reference(got, reference, f"{name}: compiled vs float64 reference", scale=scale)
    assert_reference(want, reference, f"{name}: eager vs float64 reference", scale=scale)

    files = {f"{name}__{kernel}.py": source for kernel, source in exe.kernel_sources().items()}
    assert files, f"{name}: no generated kernels"
    if os.environ.get("STITCHML_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        for stale in GOLDEN.glob(f"{name}__*.py"):
            stale.unlink()
        for file, source in files.items():
            (GOLDEN / file).write_text(source)
        return
    kept = sorted(p.name for p in GOLDEN.glob(f"{name}__*.py"))
    assert kept == sorted(files), f"{name}: kernels {sorted(files)}, golden files {kept} " \
                                  "(STITCHML_UPDATE_GOLDEN=1 rewrites them)"
    for file, source in files.items():
        golden = (GOLDEN / file).read_text()
        if source != golden:
            diff = "".join(difflib.unified_diff(golden.splitlines(True), source.splitlines(True),
                                                f"golden/{file}", "generated"))
            pytest.fail(f"{name}: generated source differs from golden/{file} "
                        f"(STITCHML_UPDATE_GOLDEN=1 rewrites it):\n{diff}")
