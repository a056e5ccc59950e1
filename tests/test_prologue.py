"""Prologue fusion (passes/prologue.py, codegen/matmul.py): elementwise producers of a matrix product's
operands run inside the product's kernel, as the fused Triton kernel and as the separate run (producer
kernels, the vendor GEMM, the epilogue) that CUDA measures it against. Every result is held to the
float64 reference and to the op-by-op run; the fusion report says what moved, or why not."""
from __future__ import annotations

import json

import pytest
import torch

import stitchml as sm
from compiler_util import Case, check_case, compile_case, compile_for_cuda

pytestmark = pytest.mark.usefixtures("triton_interpreter")

F = torch.nn.functional
MODES = ("fused", "separate")


def _layer_norm_matmul(dt):
    def build(g, feed):
        h = g.layer_normalization(feed((40, 32), dt), -1, feed((32,), dt), feed((32,), dt))
        return [h @ feed((32, 24), dt)]

    def reference(x, gamma, beta, w):
        return [F.layer_norm(x, (32,), gamma, beta, 1e-5) @ w]

    return Case(f"prologue_layer_norm_apply-{dt}", build, reference, 2)


CASES = [
    _layer_norm_matmul(sm.float32),
    _layer_norm_matmul(sm.bfloat16),
    # a per-column factor and a cast to the product's type
    Case("prologue_scale_cast",
         lambda g, feed: [g.cast(feed((33, 20)) * feed((20,)), sm.bfloat16) @ feed((20, 18), sm.bfloat16)],
         lambda x, s, w: [(x * s) @ w], 1),
    # the producer reads a transposed (non-contiguous) input
    Case("prologue_transposed_input",
         lambda g, feed: [g.relu(g.transpose(feed((20, 33)), [1, 0])) @ feed((20, 18))],
         lambda x, w: [torch.relu(x.T) @ w], 1),
    # the right operand, computed with a per-row factor, read through a transpose
    Case("prologue_rhs_through_transpose",
         lambda g, feed: [feed((33, 20), sm.float16) @ g.transpose(feed((18, 20), sm.float16) *
                                                                    feed((18, 1), sm.float16), [1, 0])],
         lambda x, w, r: [x @ (w * r).T], 1),
    # both operands, batched against a shared weight, with an epilogue in the same kernel
    Case("prologue_batched_with_epilogue",
         lambda g, feed: [g.relu(g.sigmoid(feed((2, 17, 20))) @ (feed((20, 18)) - 1.0) + feed((18,)))],
         lambda x, w, b: [torch.relu(torch.sigmoid(x) @ (w - 1.0) + b)], 1),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_prologue_matches_reference_and_op_by_op(case, mode):
    out = check_case(case, {"prologue": mode})
    report = out.exe.fusion_report()
    assert "prologue: " in report and "prologue not fused" not in report, report
    kinds = [s.kind for s in out.exe.steps]
    assert kinds.count("matmul") == 1 and "pointwise" not in kinds, kinds
    _, feeds, targets, off = compile_case(case, {"prologue": False})
    # each pointwise producer disappears; a layer norm's reduction kernel stays, storing each row's statistics
    saved = {"prologue_batched_with_epilogue": 2}.get(case.name, 0 if "layer_norm" in case.name else 1)
    assert off.kernel_count == out.exe.kernel_count + saved, off.fusion_report()
    unfused = off.run(feeds)
    for t, got in zip(targets, out.compiled):
        want = unfused[t].torch()
        if mode == "separate":  # the same kernels and the same library call as without the pass
            assert torch.equal(got, want), case.name
        else:
            torch.testing.assert_close(got.double(), want.double(), rtol=2 * torch.finfo(got.dtype).eps,
                                       atol=1e-6 * want.double().abs().max().item())


def test_kernel_source_computes_the_layer_norm_in_the_loads():
    case = _layer_norm_matmul(sm.bfloat16)
    exe = compile_case(case, {"prologue": "fused"})[3]
    src = next(s.source for s in exe.steps if s.kind == "matmul")
    loop = src[src.index("for k0"):]
    assert "tl.dot" in loop and "rsqrt" not in src  # the reduction kernel stores rstd; the prologue reads it
    assert src.count("tl.load") == 6  # x, gamma, beta, a row's mean and rstd, the weight
    hoisted = src[:src.index("for k0")]
    assert hoisted.count("tl.load") == 2, hoisted  # a row's mean and rstd do not move with K


def test_training_step_fuses_forward_and_weight_gradient():
    """Layer norm, a product and a loss, with gradients: the normalised activations are recomputed in
    the forward product and in the weight gradient's (through its transpose), never stored."""
    g = sm.Graph("layer")
    x = g.placeholder((48, 32), sm.bfloat16, name="x")
    gamma = g.placeholder((32,), sm.bfloat16, name="gamma")
    beta = g.placeholder((32,), sm.bfloat16, name="beta")
    w = g.placeholder((40, 32), sm.bfloat16, name="w")
    y = g.cast(g.layer_normalization(x, -1, gamma, beta) @ g.transpose(w, -1, -2), sm.float32)
    loss = g.reduction_sum(y * y)
    grads = g.gradients(loss, [x, w, gamma, beta])
    targets = [loss] + [grads[t] for t in (x, w, gamma, beta)]
    gen = torch.Generator().manual_seed(5)
    feeds = {t: torch.randn(t.shape, generator=gen).bfloat16() for t in (x, gamma, beta, w)}
    exe = g.compile(feeds, targets, device="cpu", options={"prologue": "fused"})
    report = exe.fusion_report()
    fused = [line for line in report.splitlines() if line.startswith("prologue: ")]
    assert len(fused) == 2 and any("through transpose" in line for line in fused), report
    got = exe.run(feeds)
    eager = g.run(feeds, targets, device="cpu")
    leaves = {t: feeds[t].double().requires_grad_() for t in (x, gamma, beta, w)}
    h = F.layer_norm(leaves[x], (32,), leaves[gamma], leaves[beta], 1e-5).bfloat16().double()
    ref_y = (h @ leaves[w].bfloat16().double().T).bfloat16().double()
    ref_loss = (ref_y * ref_y).sum()
    ref = [ref_loss.detach()] + list(torch.autograd.grad(ref_loss, [leaves[t] for t in (x, w, gamma, beta)]))
    for t, r in zip(targets, ref):
        a, e = got[t].torch().double(), eager[t].torch().double()
        scale = r.abs().max().item()
        # bfloat16 activations and gradients: both runs round after each product, in another order
        assert (a - r).abs().max().item() <= 0.05 * scale, t.name
        assert (a - e).abs().max().item() <= 0.05 * scale, t.name


@pytest.mark.parametrize("build, why", [
    (lambda g, x, w: [g.tanh(x) @ w, g.tanh(x)], "is a result of the program"),
    (lambda g, x, w: [g.tanh(x) @ w, g.reshape(g.tanh(x), [72]) * 3.0], "reads it too"),
    (lambda g, x, w: [g.tanh(x) @ w + g.tanh(x)[:, :1]], "reads it too"),
    (lambda g, x, w: [g.cast(g.tanh(x), sm.float64) @ g.cast(w, sm.float64)], "the Triton template takes"),
    (lambda g, x, w: [g.reduction_sum(g.tanh(x), axes=[0], keep_dims=True) @ w], "a reduction's result"),
    (lambda g, x, w: [(g.tanh(g.reshape(x, [72])) + g.reshape(x, [1, 72])) @ g.reshape(w, [72, 1])],
     "not the operand's"),
])
def test_report_says_why_not(build, why):
    g = sm.Graph("refused")
    x = g.placeholder((6, 12), sm.float32, name="x")
    w = g.placeholder((12, 6), sm.float32, name="w")
    targets = build(g, x, w)
    feeds = {x: torch.randn(6, 12), w: torch.randn(12, 6)}
    exe = g.compile(feeds, targets, device="cpu")
    report = exe.fusion_report()
    assert "prologue not fused" in report and why in report and "prologue: " not in report, report
    for t in targets:  # tanh in float32 by the kernel and by torch: an ulp apart
        torch.testing.assert_close(exe.run(feeds)[t].torch(), g.run(feeds, [t], device="cpu")[t].torch(),
                                   rtol=1e-5, atol=1e-5)


def test_a_convolution_says_why_its_producer_stays_apart():
    g = sm.Graph("conv")
    x = g.placeholder((2, 3, 6, 6), sm.float32, name="x")
    w = g.placeholder((4, 3, 3, 3), sm.float32, name="w")
    y = g.convolution2d(g.relu(x), w)
    feeds = {x: torch.randn(2, 3, 6, 6), w: torch.randn(4, 3, 3, 3)}
    exe = g.compile(feeds, [y], device="cpu")
    assert "convolutions run in cuDNN, which reads its operands from memory" in exe.fusion_report()
    want = torch.nn.functional.conv2d(torch.relu(feeds[x].double()), feeds[w].double())
    torch.testing.assert_close(exe.run(feeds)[y].torch().double(), want, rtol=1e-5, atol=1e-5)


def test_pass_is_off_on_request_and_on_the_native_backend():
    case = CASES[2]
    exe = compile_case(case, {"prologue": False})[3]
    assert "prologue" not in exe.fusion_report() and [s.kind for s in exe.steps].count("pointwise") == 1
    native = compile_case(case, {"backend": "native"})[3]
    assert "prologue" not in native.fusion_report()


def test_separate_run_keeps_its_temporaries_in_the_arena():
    case = CASES[5]  # both operands computed, and an epilogue reading the product
    exe = compile_case(case, {"prologue": "separate"})[3]
    fused = compile_case(case, {"prologue": "fused"})[3]
    a, b = 2 * 17 * 20 * 4, 20 * 18 * 4
    product = 2 * 17 * 18 * 4
    assert exe.intermediates_heap_size >= a + b + product > fused.intermediates_heap_size


def test_variable_read_in_a_prologue_is_not_overwritten_while_other_tiles_load_it():
    """w <- tanh(w) @ x * 0.5 + w in one kernel: each program loads whole rows of w for its product, so the
    new value cannot be written into w in place (several programs at these sizes)."""
    gen = torch.Generator().manual_seed(3)
    w0, x0 = torch.randn(80, 80, generator=gen), torch.randn(80, 80, generator=gen) / 8
    g = sm.Graph("in_place")
    w = g.variable(w0.clone(), name="w")
    x = g.placeholder((80, 80), sm.float32, name="x")
    exe = g.compile({x: x0}, [], target_ops=[g.assign_variable(w, (g.tanh(w) @ x) * 0.5 + w)], device="cpu",
                    options={"prologue": "fused"})
    assert "prologue: " in exe.fusion_report() and exe.plan.in_place == {}
    exe.run({x: x0})
    want = (torch.tanh(w0.double()) @ x0.double()) * 0.5 + w0.double()
    torch.testing.assert_close(g.variable_value(w).torch().double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[5]], ids=repr)
def test_many_tiles_and_steps_along_k(case):
    """Tiles of 16: several row and column blocks (grouped), several steps along K, ragged edges."""
    out = check_case(case, {"prologue": "fused", "matmul_blocks": (16, 16, 16, 4, 1)})
    src = next(s.source for s in out.exe.steps if s.kind == "matmul")
    assert "for k0 in range(0, " in src and out.exe.steps[-1].run.meta["BLOCK_K"] == 16
    grid = next(s.run.grid for s in out.exe.steps if s.kind == "matmul")
    assert grid[0] >= 4, grid


def test_matmul_kernels_compile_for_cuda(monkeypatch, tmp_path):
    """The interpreter accepts what the GPU compiler may not: every matmul kernel of the cases above and of a
    training step, generated for CUDA with the GPU's tiles (128 x 128 x 64, 8 warps, 3 stages for half
    types, and the 128 x 256 tiles a measured choice also times), must compile for sm_90."""
    from stitchml.codegen import matmul

    jobs = []
    real = matmul.generate

    def spy(name, body, layouts, interpret, options=None):
        product = matmul.split(body).contraction.outputs[0]
        pointers = [o.outputs[0].dtype.name for o in body.operations if o.op == "placeholder"]
        for tiles in [None] + matmul.more_blocks(256, 256, product.dtype.name):  # the wider tiles CUDA times too
            src = real(name, body, layouts, False, {**(options or {}), **({"matmul_blocks": tiles} if tiles else {})})
            jobs.append(json.dumps({"name": name, "source": src.source, "warps": src.num_warps,
                                    "stages": src.num_stages, "constexprs": src.constexprs, "sizes": list(src.sizes),
                                    "dtypes": pointers + [t.dtype.name for t in body.outputs]}, sort_keys=True))
        return real(name, body, layouts, interpret, options)

    monkeypatch.setattr(matmul, "generate", spy)
    big = Case("prologue_layer_norm_gpu_tiles",
               lambda g, feed: [g.layer_normalization(feed((256, 128), sm.bfloat16), -1, feed((128,), sm.bfloat16),
                                                      feed((128,), sm.bfloat16)) @ feed((128, 256), sm.bfloat16)])
    for case in CASES + [big]:
        compile_case(case, {"prologue": "fused"})
    g = sm.Graph("step")
    x, w = g.placeholder((48, 32), sm.bfloat16, name="x"), g.placeholder((40, 32), sm.bfloat16, name="w")
    loss = g.reduction_sum(g.cast(g.layer_normalization(x, -1) @ g.transpose(w, -1, -2), sm.float32))
    grads = g.gradients(loss, [x, w])
    g.compile({x: torch.zeros(48, 32).bfloat16(), w: torch.zeros(40, 32).bfloat16()}, [grads[x], grads[w]],
              device="cpu", options={"prologue": "fused"})
    halves = 5  # of the 8 kernels (the cases, the GPU-sized one and a weight gradient through a transpose)
    assert len(jobs) == len(CASES) + 2 + halves, len(jobs)
    failed = compile_for_cuda(jobs, tmp_path)
    assert not failed, failed


def test_on_cuda_a_reduction_producer_stays_whole_unless_the_prologue_is_forced():
    """On CUDA (the `triton` backend, measured choice) a layer norm's apply step stays in its reduction
    kernel: the vendor GEMM won every measured size, and a split reduction costs a pass; forcing the
    prologue still splits it. Compiling needs no GPU."""
    case = CASES[0]
    chosen = compile_case(case, {"backend": "triton"})[3]
    report = chosen.fusion_report()
    assert "the reduction kernel applies its rows itself" in report and "prologue: " not in report, report
    assert [s.kind for s in chosen.steps if s.kind != "view"].count("reduction") == 1
    forced = compile_case(case, {"backend": "triton", "prologue": "fused"})[3]
    assert "prologue: " in forced.fusion_report(), forced.fusion_report()
