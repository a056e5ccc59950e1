"""Attention written from primitives runs as one fused kernel (passes/attention.py, codegen/attention.py).

Results are held to the suite's tolerance rule (composite family) against the formula in float64 on the
same, already rounded, inputs.
"""
from __future__ import annotations

import inspect
import json
import math
import pathlib

import pytest
import torch

import stitchml as sm
from compiler_util import compile_for_cuda
from stitchml.codegen import attention
from stitchml.codegen.attention import Tiles
from stitchml.codegen.common import LIBDEVICE_CUDA, LIBDEVICE_INTERPRET
from stitchml.runtime.launch import KernelLaunch
from tolerance import assert_within, sensitivity



def _build(shape, dtype, mask=None, spelling="transpose", kv=None):
    """softmax(Q Kᵀ · scale [+ mask]) V from primitives; returns (graph, q, k, v, output)."""
    g = sm.Graph()
    kv = kv or shape
    q = g.placeholder(shape, dtype, name="q")
    k = g.placeholder(kv, dtype, name="k")
    v = g.placeholder(kv, dtype, name="v")
    rank = len(shape)
    scores = g.matrix_multiplication(q, g.transpose(k, rank - 2, rank - 1))
    if spelling == "transpose":
        scores = scores * (1 / math.sqrt(shape[-1]))
    else:
        scores = scores / math.sqrt(shape[-1])
    if mask is not None:
        scores = scores + g.constant(mask)
    out = g.matrix_multiplication(g.softmax(scores, axis=-1), v)
    return g, q, k, v, out


def _reference(q, k, v, scale, mask):
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v


CASES = [  # (shape, kv shape, dtype, mask kind)
    ((1, 2, 21, 16), None, sm.float32, None),
    ((2, 1, 11, 12), (2, 1, 13, 12), sm.float16, "additive"),
    ((2, 19, 16), None, sm.bfloat16, "causal"),
    ((1, 1, 66, 8), None, sm.float32, "causal"),
]


@pytest.mark.parametrize("shape,kv,dtype,mask", CASES, ids=lambda c: str(c))
def test_attention_forward_matches_float64(shape, kv, dtype, mask):
    torch.manual_seed(0)
    kv = kv or shape
    length, keys = shape[-2], kv[-2]
    bias = None
    if mask == "additive":
        bias = torch.randn(length, keys).to(dtype.torch)
    elif mask == "causal":
        bias = torch.full((length, keys), float("-inf")).triu(1).to(dtype.torch)
    g, q, k, v, out = _build(shape, dtype, bias, spelling="divide" if dtype == sm.float16 else "transpose", kv=kv)
    feeds = {q: torch.randn(shape).to(dtype.torch), k: torch.randn(kv).to(dtype.torch),
             v: torch.randn(kv).to(dtype.torch)}
    exe = g.compile(feeds, [out], device="cpu")
    report = exe.fusion_report()
    assert "attention applied" in report, report
    kinds = [s.kind for s in exe.steps if s.kind not in ("view",)]
    assert kinds == ["attention"], kinds  # one kernel where the unfused graph launches three
    got = exe.run(feeds)[out].torch()
    scale = float(torch.tensor(1 / math.sqrt(shape[-1])).to(dtype.torch)) if dtype != sm.float16 else \
        1 / float(torch.tensor(math.sqrt(shape[-1])).to(dtype.torch))
    args = [feeds[t].double() for t in (q, k, v)]
    mask64 = None if bias is None else bias.double()
    want = _reference(*args, scale, mask64)
    scope = sensitivity(lambda a, b, c: _reference(a, b, c, scale, mask64), args)[0]
    assert_within(got, want, "composite", f"attention {shape} {dtype.name} {mask}", scope)


def test_unfused_graph_has_three_kernels():
    """The same graph with the pass off: a matmul, a softmax and a matmul kernel (what the fusion replaces)."""
    g, q, k, v, out = _build((1, 2, 16, 16), sm.float32)
    feeds = {t: torch.randn(1, 2, 16, 16) for t in (q, k, v)}
    exe = g.compile(feeds, [out], device="cpu", options={"attention": False})
    assert [s.kind for s in exe.steps if s.kind != "view"] == ["matmul", "reduction", "matmul"]


def test_softmax_over_wrong_axis_does_not_match():
    g = sm.Graph()
    q, k, v = (g.placeholder((2, 16, 16), sm.float32, name=n) for n in "qkv")
    p = g.softmax(g.matrix_multiplication(q, g.transpose(k, 1, 2)) * 0.25, axis=-2)
    out = g.matrix_multiplication(p, v)
    feeds = {t: torch.randn(2, 16, 16) for t in (q, k, v)}
    exe = g.compile(feeds, [out], device="cpu")
    report = exe.fusion_report()
    assert "attention not applied at" in report and "last (key) axis" in report, report
    assert "attention" not in [s.kind for s in exe.steps]
    args = [feeds[t].double() for t in (q, k, v)]
    want = torch.softmax(args[0] @ args[1].transpose(1, 2) * 0.25, -2) @ args[2]
    assert (exe.run(feeds)[out].torch().double() - want).abs().max().item() < 1e-5


def test_probabilities_used_elsewhere_do_not_match():
    """When the graph also returns the probabilities, the kernel (which never stores them) must not apply."""
    g = sm.Graph()
    q, k, v = (g.placeholder((16, 8), sm.float32, name=n) for n in "qkv")
    p = g.softmax(g.matrix_multiplication(q, g.transpose(k, 0, 1)) * 0.5, axis=-1)
    out = g.matrix_multiplication(p, v)
    feeds = {t: torch.randn(16, 8) for t in (q, k, v)}
    exe = g.compile(feeds, [out, p], device="cpu")
    assert "is an output of the graph" in exe.fusion_report()


def test_attention_kernels_compile_for_cuda(monkeypatch, tmp_path):
    """The interpreter accepts what the GPU compiler may not: the attention kernels, forward and backward, must
    compile for sm_90 for half and float32 operands, causal and additive masks, with the GPU's tile sizes."""

    jobs = []

    def record(self, env):
        if "attention" not in self.fn.fn.__name__:
            return
        source = pathlib.Path(inspect.getsourcefile(self.fn.fn)).read_text()
        jobs.append(json.dumps({"name": self.fn.fn.__name__, "warps": self.warps, "constexprs": self.meta,
                                "source": source.replace(LIBDEVICE_INTERPRET, LIBDEVICE_CUDA),
                                "dtypes": [str(env[s].dtype).replace("torch.", "") for s in self.slots],
                                "sizes": list(self.sizes)}, sort_keys=True))

    monkeypatch.setattr(KernelLaunch, "__call__", record)
    gpu_tiles = attention.tiles
    monkeypatch.setattr(attention, "tiles", lambda kernel, length, keys, head, causal, interpret:
                        gpu_tiles(kernel, length, keys, head, causal, False))
    causal = torch.full((64, 64), float("-inf")).triu(1).half()
    g, leaves, outs = _training((1, 2, 64, 128), sm.float16, causal)  # forward, dQ and dK/dV kernels
    feeds = {t: torch.zeros(1, 2, 64, 128).half() for t in leaves}
    g.compile(feeds, outs, device="cpu").run(feeds)
    g, q, k, v, out = _build((1, 2, 64, 40), sm.float32, torch.randn(64, 64))  # float32 products, a mask
    feeds = {t: torch.zeros(1, 2, 64, 40) for t in (q, k, v)}
    g.compile(feeds, [out], device="cpu").run(feeds)
    assert len(jobs) == 4
    failed = compile_for_cuda(jobs, tmp_path)
    assert not failed, failed


def test_mask_fed_at_run_time_with_broadcast_batch():
    """A mask placeholder of shape (1, L, S) over a (B, L, S) batch, scale written first: the kernel reads the
    mask through stride 0 over the batch, and a new mask at run time changes the result."""
    torch.manual_seed(1)
    g = sm.Graph()
    q, k, v = (g.placeholder((2, 12, 8), sm.float32, name=n) for n in "qkv")
    m = g.placeholder((1, 12, 12), sm.float32, name="m")
    scores = 0.5 * g.matrix_multiplication(q, g.transpose(k, 1, 2)) + m
    out = g.matrix_multiplication(g.softmax(scores, axis=-1), v)
    feeds = {t: torch.randn(2, 12, 8) for t in (q, k, v)}
    exe = g.compile({**feeds, m: torch.zeros(1, 12, 12)}, [out], device="cpu")
    assert "attention applied" in exe.fusion_report() and "additive mask" in exe.fusion_report()
    args = [feeds[t].double() for t in (q, k, v)]
    for mask in (torch.randn(1, 12, 12) * 3, torch.zeros(1, 12, 12)):
        got = exe.run({**feeds, m: mask})[out].torch()
        want = _reference(*args, 0.5, mask.double())
        scope = sensitivity(lambda a, b, c: _reference(a, b, c, 0.5, mask.double()), args)[0]
        assert_within(got, want, "composite", "attention with a fed mask", scope)


def test_mask_that_broadcasts_the_scores_does_not_match():
    g = sm.Graph()
    q, k, v = (g.placeholder((16, 8), sm.float32, name=n) for n in "qkv")
    scores = g.matrix_multiplication(q, g.transpose(k, 0, 1)) * 0.5 + g.placeholder((2, 16, 16), sm.float32)
    out = g.matrix_multiplication(g.softmax(scores, axis=-1), g.broadcast_to(v, (2, 16, 8)))
    feeds = {t: torch.randn(16, 8) for t in (q, k, v)}
    feeds[scores.op.inputs[1]] = torch.randn(2, 16, 16)
    exe = g.compile(feeds, [out], device="cpu")
    assert "broadcasts the scores" in exe.fusion_report(), exe.fusion_report()


def _training(shape, dtype, mask):
    g = sm.Graph()
    q, k, v, do = (g.placeholder(shape, dtype, name=n) for n in ("q", "k", "v", "do"))
    rank = len(shape)
    scores = g.matrix_multiplication(q, g.transpose(k, rank - 2, rank - 1)) * 0.25
    if mask is not None:
        scores = scores + g.constant(mask)
    out = g.matrix_multiplication(g.softmax(scores, axis=-1), v)
    grads = g.gradients(g.reduction_sum(out * do), [q, k, v])
    return g, (q, k, v, do), [out, grads[q], grads[k], grads[v]]


def _assert_training_matches(got, feeds, leaves, outs, bias, label):
    """O, dQ, dK and dV of a `_training` graph's run obey the tolerance rule against float64 autograd."""
    mask64 = None if bias is None else bias.double()

    def reference(q, k, v, do):
        o = _reference(q, k, v, 0.25, mask64)
        return (o, *torch.autograd.grad((o * do).sum(), (q, k, v), create_graph=True))

    args = [feeds[t].double().requires_grad_() for t in leaves]
    scopes = sensitivity(reference, [a.detach() for a in args])
    for name, t, want, scope in zip(("O", "dQ", "dK", "dV"), outs, reference(*args), scopes):
        assert_within(got[t].torch(), want.detach(), "composite", f"{name} {label}", scope)


@pytest.mark.parametrize("shape,dtype,mask", [((1, 1, 19, 8), sm.float32, None), ((1, 13, 8), sm.float16, "causal"),
                                              ((1, 1, 66, 4), sm.bfloat16, "additive")], ids=str)
def test_training_step_fuses_forward_and_backward(shape, dtype, mask):
    """The gradient graph of the pattern becomes a forward kernel (which also stores the log-sum-exp) and the
    two backward kernels; O, dQ, dK and dV obey the tolerance rule against float64 autograd."""
    torch.manual_seed(2)
    length = shape[-2]
    bias = None
    if mask == "causal":
        bias = torch.full((length, length), float("-inf")).triu(1).to(dtype.torch)
    elif mask == "additive":
        bias = torch.randn(length, length).to(dtype.torch)
    g, leaves, outs = _training(shape, dtype, bias)
    feeds = {t: torch.randn(shape).to(dtype.torch) for t in leaves}
    exe = g.compile(feeds, outs, device="cpu")
    assert "with its gradient" in exe.fusion_report(), exe.fusion_report()
    assert [s.kind for s in exe.steps if s.kind in ("attention", "attention_backward", "matmul", "reduction")] == \
        ["attention", "attention_backward"]
    _assert_training_matches(exe.run(feeds), feeds, leaves, outs, bias, f"{shape} {dtype.name} {mask}")


def test_training_step_with_probabilities_read_elsewhere_stays_unfused():
    """A graph that also returns the probabilities: neither the forward nor the backward fuses, and the report
    says why."""
    g = sm.Graph()
    q, k, v = (g.placeholder((16, 8), sm.float32, name=n) for n in "qkv")
    p = g.softmax(g.matrix_multiplication(q, g.transpose(k, 0, 1)) * 0.5, axis=-1)
    out = g.matrix_multiplication(p, v)
    grads = g.gradients(g.reduction_sum(out), [q, k, v])
    feeds = {t: torch.randn(16, 8) for t in (q, k, v)}
    exe = g.compile(feeds, [out, p, grads[q]], device="cpu")
    report = exe.fusion_report()
    assert "attention not applied" in report and "as a training step" in report, report
    assert "attention" not in [s.kind for s in exe.steps]


TILED = [  # (shape, forward and dQ tiles, dK/dV tiles, bounds checks): causal, several tiles per program so that
    # the unmasked loops run as well as the diagonal ones; extents that are multiples of the tiles (no bounds
    # checks, as at the GPU's sizes) and extents the last tile (and the head dimension) overhang
    ((1, 1, 32, 16), Tiles(16, 16, 4, 1), Tiles(16, 16, 4, 1), False),
    ((1, 1, 40, 8), Tiles(16, 32, 4, 1), Tiles(32, 16, 4, 1), True),
    ((1, 40, 8), Tiles(32, 16, 4, 1), Tiles(16, 32, 4, 1), True),
]


@pytest.mark.parametrize("shape,rows_tile,keys_tile,bounds", TILED, ids=str)
def test_causal_training_step_with_many_tiles_matches_float64(monkeypatch, shape, rows_tile, keys_tile, bounds):
    """Causal forward, dQ and dK/dV kernels with tiles smaller than the problem, BLOCK_M equal to, above and
    below BLOCK_N: O, dQ, dK and dV obey the tolerance rule against float64 autograd."""
    monkeypatch.setattr(attention, "tiles", lambda kernel, *shape: keys_tile if kernel == "dkv" else rows_tile)
    torch.manual_seed(3)
    length = shape[-2]
    bias = torch.full((length, length), float("-inf")).triu(1).half()
    g, leaves, outs = _training(shape, sm.float16, bias)
    feeds = {t: torch.randn(shape).half() for t in leaves}
    exe = g.compile(feeds, outs, device="cpu")
    assert "with its gradient" in exe.fusion_report() and "(causal" in exe.fusion_report(), exe.fusion_report()
    sources = "".join(s.source for s in exe.steps if s.kind in ("attention", "attention_backward"))
    assert ("mask=" in sources) == bounds, "bounds checks only where a tile overhangs"
    # the mask on the diagonal loops alone: once in the forward and dQ kernels, once (transposed) in dK/dV
    assert sources.count("rows[:, None] >= cols[None, :]") == 2 and sources.count("rows[None, :] >= cols[:, None]") == 1
    _assert_training_matches(exe.run(feeds), feeds, leaves, outs, bias, f"{shape} {rows_tile} {keys_tile}")


@pytest.mark.parametrize("dtype,causal", [(sm.float16, True), (sm.bfloat16, False)], ids=str)
def test_training_step_with_peaked_softmax_takes_delta_from_unrounded_output(dtype, causal):
    """Scores three times wider than usual: few keys carry each row, dS = P (dP - Δ) cancels, and Δ =
    rowsum(dO ∘ O) must come from the forward's float32 O (O rounded to the half type puts dQ and dK past
    the tolerance rule). A causal first row's softmax is one key: its dQ is exactly 0, as the formula is."""
    torch.manual_seed(4)
    shape = (1, 20, 16)
    bias = torch.full((20, 20), float("-inf")).triu(1).to(dtype.torch) if causal else None
    g, leaves, outs = _training(shape, dtype, bias)
    feeds = {t: (torch.randn(shape) * (3 if i < 2 else 1)).to(dtype.torch) for i, t in enumerate(leaves)}
    exe = g.compile(feeds, outs, device="cpu")
    assert [s.kind for s in exe.steps if s.kind.startswith("attention")] == ["attention", "attention_backward"]
    got = exe.run(feeds)
    _assert_training_matches(got, feeds, leaves, outs, bias, f"{dtype.name} causal={causal}")
    if causal:
        assert (got[outs[1]].torch()[:, 0] == 0).all()
