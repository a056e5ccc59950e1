"""The persistent TMA matmul template (codegen/matmul_tma.py, runtime/tma.py): a 2-D half-type product whose
tiles TMA loads, with the kernel's pointwise epilogue applied before the TMA store.

Under Triton's interpreter, which runs host tensor descriptors, `tl.range(..., warp_specialize=...)`,
`flatten` and the subtiled epilogue (warp specialisation itself is a GPU compiler pass: the interpreter
runs the loop as written). Compile option `matmul_tma="always"` picks the template where CUDA would
measure it; results are held to the float64 reference and to the op-by-op run, and the lowering's choice
and its fallbacks (misaligned strides or addresses, batched or float32 products) are checked. The
generated sources for the GPU's configurations must compile for sm_90.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import stitchml as sm
from stitchml.codegen import matmul_tma
from stitchml.passes.program import CompileError
from stitchml.runtime.tma import TmaLaunch
from compiler_util import Case, check_case, compile_case

pytestmark = pytest.mark.usefixtures("triton_interpreter")
F = torch.nn.functional
ALWAYS = {"matmul_tma": "always"}
# no warp specialisation, the tile loop flattened, the epilogue on whole tiles, two programs per "SM"
PLAIN = {**ALWAYS, "matmul_tma_configs": [dict(bm=16, bn=32, bk=16, warps=4, stages=1, per_sm=2)]}


def _gelu_bias(dt, m, n, k):
    return Case(f"tma_gelu_bias-{dt}-{m}x{n}x{k}",
                lambda g, feed: [g.gelu(feed((m, k), dt) @ feed((k, n), dt) + feed((n,), dt))],
                lambda x, w, b: [F.gelu(x @ w + b)], 1)


CASES = [
    _gelu_bias(sm.bfloat16, 50, 72, 40),  # ragged against the 32 x 32 x 16 tiles on every axis
    _gelu_bias(sm.float16, 37, 40, 24),
    # an epilogue input that varies along M and N (a residual), and a ReLU
    Case("tma_residual_relu",
         lambda g, feed: [g.relu(feed((33, 24), sm.bfloat16) @ g.transpose(feed((48, 24), sm.bfloat16), [1, 0]) +
                                 feed((33, 48), sm.bfloat16))],
         lambda x, w, r: [torch.relu(x @ w.T + r)], 1),
    # a float32 output from a float16 product, scaled per column, beside the product itself
    Case("tma_float32_epilogue_and_product",
         lambda g, feed: (lambda p, s: [g.cast(p, sm.float32) * s, p])(feed((40, 24), sm.float16) @
                                                                       feed((24, 56), sm.float16), feed((56,))),
         lambda x, w, s: [(x @ w).half().double() * s, x @ w], 1),  # the float16 product, then float32
    # both operands stored column by column (read through transposed descriptors), bias as a (1, n) row
    Case("tma_transposed_operands",
         lambda g, feed: [g.tanh(g.transpose(feed((40, 48), sm.bfloat16), [1, 0]) @
                                 g.transpose(feed((64, 40), sm.bfloat16), [1, 0]) + feed((1, 64), sm.bfloat16))],
         lambda a, b, r: [torch.tanh(a.T @ b.T + r)], 1),
]


def _step(exe):
    return next(s for s in exe.steps if s.kind == "matmul")


@pytest.mark.parametrize("options", [ALWAYS, PLAIN], ids=["ws-subtile", "plain"])
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_template_matches_reference_and_op_by_op(case, options):
    out = check_case(case, options)
    launch = _step(out.exe).run
    assert isinstance(launch, TmaLaunch), type(launch)
    assert launch.fallbacks == 0
    assert "persistent TMA matmul kernel" in _step(out.exe).source


def test_product_kept_in_its_dtype_before_the_epilogue():
    """Never a different result: the template rounds the product to bfloat16 before the epilogue, as cuBLAS
    writing it and the epilogue kernel reading it do; on inputs where that rounding shows, the two paths
    agree bit for bit."""
    case = _gelu_bias(sm.bfloat16, 48, 64, 32)
    g, feeds, targets, old = compile_case(case, {"matmul_tma": "never"})
    new = g.compile(feeds, targets, device="cpu", options=ALWAYS)
    assert not isinstance(_step(old).run, TmaLaunch)
    a, b = old.run(feeds)[targets[0]].torch(), new.run(feeds)[targets[0]].torch()
    x, w, bias = (v.float() for v in feeds.values())
    unrounded = F.gelu(x @ w + bias).bfloat16()
    assert not torch.equal(a, unrounded)  # the inputs make the product's rounding visible
    assert torch.equal(a, b)


def _mlp(m: int, n: int, k: int, dt=sm.bfloat16, batch: tuple = ()):
    g = sm.Graph("mlp")
    x = g.placeholder(batch + (m, k), dt, name="x")
    w = g.placeholder((k, n), dt, name="w")
    b = g.placeholder((n,), dt, name="b")
    return g, x, w, b, g.gelu(x @ w + b)


@pytest.mark.parametrize("shape, dtype, batch, why", [
    ((24, 32, 20), sm.bfloat16, (), "multiple of 16 bytes"),  # x's rows: 20 x 2 bytes
    ((24, 32, 32), sm.float32, (), "float32 product"),
    ((24, 32, 32), sm.bfloat16, (2,), "rank 3"),
])
def test_lowering_falls_back_where_the_template_does_not_apply(shape, dtype, batch, why, caplog):
    m, n, k = shape
    g, x, w, b, y = _mlp(m, n, k, dtype, batch)
    feeds = {x: torch.randn(batch + (m, k)).to(dtype.torch), w: torch.randn(k, n).to(dtype.torch),
             b: torch.randn(n).to(dtype.torch)}
    with caplog.at_level("INFO", logger="stitchml.compile"):
        exe = g.compile(feeds, [y], device="cpu", options=ALWAYS)
    assert not isinstance(_step(exe).run, TmaLaunch)
    assert any(why in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    ref = F.gelu(feeds[x].double() @ feeds[w].double() + feeds[b].double())
    torch.testing.assert_close(exe.run(feeds)[y].torch().double(), ref, rtol=2e-2, atol=2e-2)


def test_output_rows_must_be_whole_16_bytes(caplog):
    """A bool output of 40 columns has rows of 40 bytes, which TMA cannot store: the old path computes it."""
    g = sm.Graph("positive")
    x, w = g.placeholder((24, 32), sm.float16, name="x"), g.placeholder((32, 40), sm.float16, name="w")
    y = (x @ w) > 0.0
    feeds = {x: torch.randn(24, 32).half(), w: torch.randn(32, 40).half()}
    with caplog.at_level("INFO", logger="stitchml.compile"):
        exe = g.compile(feeds, [y], device="cpu", options=ALWAYS)
    assert not isinstance(_step(exe).run, TmaLaunch)
    assert any("rows of 40 x 1 bytes" in r.getMessage() for r in caplog.records)
    assert torch.equal(exe.run(feeds)[y].torch(), (feeds[x].float() @ feeds[w].float()).half() > 0)


def test_misaligned_address_runs_the_other_path():
    """TMA needs 16-byte-aligned addresses: an operand at an odd offset runs cuBLAS and the epilogue kernel
    for that run, with the same results, and the next aligned run is the template's again."""
    g, x, w, b, y = _mlp(40, 48, 32)
    gen = torch.Generator().manual_seed(1)
    feeds = {x: torch.randn(40, 32, generator=gen).bfloat16(), w: torch.randn(32, 48, generator=gen).bfloat16(),
             b: torch.randn(48, generator=gen).bfloat16()}
    exe = g.compile(feeds, [y], device="cpu", options=ALWAYS)
    launch = _step(exe).run
    aligned = exe.run(feeds)[y].torch()
    odd = torch.empty(40 * 32 + 1, dtype=torch.bfloat16)[1:].view(40, 32)
    odd.copy_(feeds[x])
    assert odd.data_ptr() % 16
    shifted = exe.run({**feeds, x: odd})[y].torch()
    assert launch.fallbacks == 1
    assert torch.equal(shifted, aligned)
    exe.run(feeds)
    assert launch.fallbacks == 1


def test_default_and_measure_mode_keep_the_vendor_path_here_and_the_option_is_checked():
    """Off by default; "measure" offers the template only to a GPU's measured choice, so the interpreter keeps
    cuBLAS (torch) and the epilogue kernel; an unknown value of the option is an error that names it."""
    case = CASES[0]
    for options in (None, {"matmul_tma": "measure"}):
        assert not isinstance(_step(compile_case(case, options)[3]).run, TmaLaunch)
    with pytest.raises(CompileError, match="matmul_tma expects 'measure', 'always' or 'never', got 'yes'"):
        compile_case(case, {"matmul_tma": "yes"})


def _body(m: int, n: int, k: int):
    """A matmul kernel body (bias + GeLU epilogue) and its input layouts, as the lowering sees them."""
    captured = {}
    real = matmul_tma.configs

    def spy(body, layouts, *args):
        captured["args"] = (body, layouts)
        return real(body, layouts, *args)

    g, x, w, b, y = _mlp(m, n, k)
    matmul_tma.configs = spy
    try:
        g.compile({x: torch.zeros(m, k).bfloat16(), w: torch.zeros(k, n).bfloat16(), b: torch.zeros(n).bfloat16()},
                  [y], device="cpu", options={**ALWAYS, "matmul_tma_configs": []})
    finally:
        matmul_tma.configs = real
    return captured["args"]


def test_configs_on_a_gpu_depend_on_capability_and_size():
    big, small = _body(4096, 4096, 4096), _body(256, 256, 256)
    assert matmul_tma.configs(*big, "measure", (9, 0)) == (list(matmul_tma.CONFIGS), "")
    assert "capability 8.0 has no TMA" in matmul_tma.configs(*big, "measure", (8, 0))[1]
    assert "below the template's" in matmul_tma.configs(*small, "measure", (9, 0))[1]
    assert matmul_tma.configs(*small, "always", (9, 0))[0] == list(matmul_tma.CONFIGS)


def test_gpu_configurations_compile_for_sm90(tmp_path):
    """The interpreter accepts what the GPU compiler may not: the sources generated for CONFIGS (an 8192^3
    product, 132 SMs) must compile for sm_90 with their descriptors' block types."""
    body, layouts = _body(8192, 8192, 8192)
    jobs = []
    for config in matmul_tma.CONFIGS:
        src = matmul_tma.generate("kernel0_matmul", body, layouts, False, config, 132)
        types = ["bf16"] * (len(src.descriptors))
        signature = [f"tensordesc<{t}[{d[0][0]}, {d[0][1]}]>" if d else f"*{t}" for t, d in zip(types,
                                                                                             src.descriptors)]
        jobs.append({"config": dataclasses.asdict(config), "source": src.source, "signature": signature,
                     "warps": src.num_warps, "stages": src.num_stages})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), STITCHML_CACHE_DIR=str(tmp_path / "stitchml"),
               TRITON_DEFAULT_FP_FUSION="1")
    subprocess.run([sys.executable, "-c", _COMPILE, str(tmp_path)], env=env, check=True)
    failed = json.loads((tmp_path / "failed.json").read_text())
    assert not failed, failed


_COMPILE = """
import json, pathlib, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
from stitchml.runtime import loader

work = pathlib.Path(sys.argv[1])
failed = {}
for job in json.loads((work / "jobs.json").read_text()):
    fn = loader.load("kernel0_matmul", job["source"])
    try:
        triton.compile(ASTSource(fn, dict(zip(fn.arg_names, job["signature"]))), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": job["warps"], "num_stages": job["stages"]})
    except Exception as e:
        failed[json.dumps(job["config"])] = type(e).__name__ + ": " + " ".join(str(e).split())[-300:]
(work / "failed.json").write_text(json.dumps(failed))
"""
