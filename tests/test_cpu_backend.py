"""The native CPU backend (codegen/cpu.py): every sample graph of the compiler's tests compiled to C++
loop nests against the eager interpreter and a float64 reference; training steps run for run; its
float32 math swept against float64; the disk cache; integer division by zero; the fall-back when no
compiler works; Graph.run compiling a signature on its third CPU run."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.codegen import cpu
from stitchml.runtime import compiled as compiled_runtime

from compiler_util import Case, all_cases, assert_match, check_case, run_case
from test_compiler import STEPS, _same_runs, _twins
from tolerance import assert_within, sensitivity

NATIVE = {"backend": "native"}


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))


def _params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(reason=c.known_failure, strict=True)]
                         if c.known_failure else []) for c in cases]


@pytest.mark.parametrize("case", _params(all_cases()))
def test_native_kernels_match_eager(case):
    out = check_case(case, NATIVE)
    assert all(s.kind != "interpret" for s in out.exe.steps)


@pytest.mark.parametrize("build", STEPS)
def test_training_steps_match_eager_run_for_run(build):
    a, b = _twins(build, sm.float64)
    exe = a[0].compile(a[1], a[2], a[3], device="cpu", options=NATIVE)
    assert any(s.source and "extern \"C\"" in s.source for s in exe.steps)
    _same_runs(exe, a, b, runs=4)


@pytest.mark.parametrize("op, reference", [("exponent", torch.exp), ("erf", torch.erf), ("tanh", torch.tanh),
                                           ("logarithm", torch.log), ("sigmoid", torch.sigmoid)])
def test_float32_math_is_within_the_tolerance_rule_over_its_whole_range(op, reference):
    """The vectorisable float32 exp, erf, tanh, log and sigmoid, on normal, huge, tiny, subnormal and
    special values, against float64 with the suite's rule for math-library functions."""
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.standard_normal(20000) * 3, rng.standard_normal(5000) * 40,
                         np.linspace(-110, 100, 5001), np.logspace(-45, 38, 2000), -np.logspace(-45, 38, 2000),
                         [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3e-45, 88.72, 88.73, -87.0, -103.9]])
    xs = xs.astype(np.float32)
    if op == "logarithm":
        xs = np.abs(xs)
    g = sm.Graph()
    x = g.placeholder((len(xs),), name="x")
    y = getattr(g, op)(x)
    exe = g.compile({x: sm.TensorType((len(xs),), sm.float32)}, [y], device="cpu", options=NATIVE)
    got = exe.run({x: xs})[y].torch()
    x64 = torch.from_numpy(xs).double()
    assert_within(got, reference(x64), "transcendental", op, sensitivity(reference, [x64])[0])


def test_a_zero_integer_divisor_is_an_execution_error_not_a_crash():
    g = sm.Graph()
    a, b = g.placeholder((4,), sm.int32, name="a"), g.placeholder((4,), sm.int32, name="b")
    q = g.floor_division(a, b) + 1
    exe = g.compile({a: sm.TensorType((4,), sm.int32), b: sm.TensorType((4,), sm.int32)}, [q], device="cpu",
                    options=NATIVE)
    ok = exe.run({a: np.array([7, -7, 8, 9], np.int32), b: np.array([2, 2, -3, 4], np.int32)})[q].numpy()
    assert ok.tolist() == [4, -3, -2, 3]
    with pytest.raises(sm.ExecutionError, match="floor_division.*integer division by zero"):
        exe.run({a: np.array([7, 1, 8, 9], np.int32), b: np.array([2, 0, -3, 4], np.int32)})


def test_kernels_of_an_executable_compile_once_into_one_cached_library(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    case = Case("native_cached", lambda g, feed: [g.softmax(feed((4, 9))), g.gelu(feed((3, 5)))])
    first = run_case(case, NATIVE)
    files = sorted(os.listdir(tmp_path / "cpu"))
    assert len(files) == 1 and files[0].endswith(".so") and first.exe.kernel_count == 2
    cpu._loaded.clear()  # as in a new process
    calls = []
    monkeypatch.setattr(cpu, "_compile", lambda *a: calls.append(a))
    second = run_case(case, NATIVE)
    assert not calls, "a second compile ran the compiler again"
    for x, y in zip(first.compiled, second.compiled):
        assert torch.equal(x, y)


def test_processes_compiling_the_same_kernels_at_once_share_the_cache(tmp_path):
    script = ("import numpy as np, stitchml as sm\n"
              "g = sm.Graph(); x = g.placeholder((64,)); y = g.tanh(g.exponent(x) * 2.0)\n"
              "exe = g.compile({x: sm.TensorType((64,), sm.float32)}, [y], device='cpu', "
              "options={'backend': 'native'})\n"
              "out = exe.run({x: np.linspace(-1, 1, 64, dtype=np.float32)})[y].numpy()\n"
              "print(float(out.sum()))\n")
    env = {**os.environ, "STITCHML_CACHE_DIR": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(outs)) == 1
    assert [f for f in os.listdir(tmp_path / "cpu") if f.endswith(".so")] and \
        not [f for f in os.listdir(tmp_path / "cpu") if not f.endswith(".so")], "a partial file was left"


def test_without_a_compiler_cpu_runs_use_the_reference_and_say_why(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("PATH", "/nonexistent")
    cpu.compiler.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="stitchml.compile"):
            assert not compiled_runtime.native_available()
        assert "no C++ compiler found" in caplog.text
        g = sm.Graph()
        x = g.placeholder((3,), name="x")
        y = g.gelu(x)
        exe = g.compile({x: sm.TensorType((3,), sm.float32)}, [y], device="cpu")
        assert [s.kind for s in exe.steps] == ["reference"]
        assert np.allclose(exe.run({x: np.ones(3, np.float32)})[y].numpy(), 0.8413447)
    finally:
        cpu.compiler.cache_clear()


def test_graph_run_on_the_cpu_compiles_a_signature_on_its_third_run(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = sm.Graph()
    x = g.placeholder((-1, 8), name="x")
    y = g.softmax(g.gelu(x), axis=-1)
    a = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    results = []
    for _ in range(2):
        results.append(g.run({x: a}, [y], device="cpu")[y].torch())
        assert g.compile_log == []
    results.append(g.run({x: a}, [y], device="cpu")[y].torch())
    assert len(g.compile_log) == 1
    results.append(g.run({x: a[:2]}, [y], device="cpu")[y].torch())  # another signature starts cold
    assert len(g.compile_log) == 1
    assert g.run({x: a}, [y], device="cpu", compiled=False)[y].torch().equal(results[0])
    for r in results[2:3]:
        assert_match(r, results[0], "compiled third run")


def test_bad_feeds_on_the_cpu_get_the_op_by_op_errors_whatever_the_backend(monkeypatch):
    """A run that would compile (native backend) still reports a bad feed as an op-by-op run does."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = sm.Graph()
    x = g.placeholder((3,), name="x")
    y = g.reduction_sum(x)
    for _ in range(3):
        g.run({x: np.ones(3, np.float32)}, [y], device="cpu")
    assert len(g.compile_log) == 1
    with pytest.raises(sm.FeedError, match="feed for placeholder x: expected dtype float32, got float64"):
        g.run({x: np.ones(3)}, [y], device="cpu")
    with pytest.raises(sm.FeedError, match="is the output of reduction_sum; only placeholders can be fed"):
        g.run({y: np.ones(())}, [y], device="cpu")


def test_broadcast_reads_and_reductions_over_non_adjacent_axes_divide_once_per_row_not_per_element():
    """A bias over channels and a channel's sum over batch and pixels: the loops split into rows and
    columns, so no element pays an integer division (it keeps the loop from vectorising)."""
    g = sm.Graph()
    x = g.placeholder((3, 5, 7, 9), name="x")
    b = g.placeholder((1, 5, 1, 1), name="b")
    y = g.relu(x + b)
    s = g.reduction_sum(y * x, axes=(0, 2, 3), keep_dims=True)
    types = {x: sm.TensorType((3, 5, 7, 9), sm.float32), b: sm.TensorType((1, 5, 1, 1), sm.float32)}
    xv, bv = torch.randn(3, 5, 7, 9), torch.randn(1, 5, 1, 1)
    y64 = torch.relu(xv.double() + bv.double())
    for target, ref, loop in ((y, y64, "for (int64_t o = 0;"), (s, (y64 * xv.double()).sum((0, 2, 3), keepdim=True),
                                                              "for (int64_t co = 0;")):
        exe = g.compile(types, [target], device="cpu", options=NATIVE)
        (source,) = [st.source for st in exe.steps if st.source]
        assert loop in source
        indices = re.findall(r"\bin\d+\[([^\]]*)\]", source)  # every load's index
        assert len(indices) >= 2 and not any("/" in index for index in indices), indices
        got = exe.run({x: xv, b: bv})[target].torch()
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_a_relu_mask_is_read_as_bytes_so_its_select_and_channel_sum_vectorise():
    """Bool buffers are uint8_t in the kernels' signatures (GCC has no vector type for C++ bool, so a loop
    loading one stays scalar): a ReLU's mask, its select of the gradient and a channel's sum, against float64."""
    g = sm.Graph()
    x = g.placeholder((4, 3, 6, 6), name="x")
    dy = g.placeholder((4, 3, 6, 6), name="dy")
    mask = g.greater_than(x, 0.0)
    masked = g.select(mask, dy, 0.0)
    total = g.reduction_sum(masked, axes=(0, 2, 3), keep_dims=True)
    types = {x: sm.TensorType((4, 3, 6, 6), sm.float32), dy: sm.TensorType((4, 3, 6, 6), sm.float32)}
    exe = g.compile(types, [mask, masked, total], device="cpu", options=NATIVE)
    sources = "".join(st.source for st in exe.steps if st.source)
    assert "uint8_t* __restrict__" in sources and "bool*" not in sources
    xv, dyv = torch.randn(4, 3, 6, 6), torch.randn(4, 3, 6, 6)
    out = exe.run({x: xv, dy: dyv})
    want = torch.where(xv > 0, dyv.double(), 0.0)
    assert torch.equal(out[mask].torch(), xv > 0)
    assert torch.equal(out[masked].torch().double(), want)
    torch.testing.assert_close(out[total].torch().double(), want.sum((0, 2, 3), keepdim=True), rtol=1e-6, atol=1e-6)


def test_a_convolution_result_a_caller_kept_is_not_changed_by_the_next_run():
    """The library convolution's last result stays alive between runs (runtime/native_conv.py), so that its
    memory is reused rather than faulted in again; a result the caller holds must still be its own run's."""
    g = sm.Graph()
    x = g.placeholder((2, 32, 12, 12), name="x")
    w = g.placeholder((16, 32, 3, 3), name="w")  # 663k multiply-adds an image: oneDNN's, not a direct loop nest
    y = g.convolution2d(x, w, sm.Convolution2DDescriptor(padding="same"))
    types = {x: sm.TensorType((2, 32, 12, 12), sm.float32), w: sm.TensorType((16, 32, 3, 3), sm.float32)}
    exe = g.compile(types, [y], device="cpu", options=NATIVE)
    assert not any(s.source for s in exe.steps)
    xs, wv = [torch.randn(2, 32, 12, 12) for _ in range(3)], torch.randn(16, 32, 3, 3)
    kept = [exe.run({x: xv, w: wv})[y].torch() for xv in xs]
    for i, (xv, got) in enumerate(zip(xs, kept)):
        conv = lambda a, b: torch.nn.functional.conv2d(a, b, padding=1)  # noqa: E731
        want = conv(xv.double(), wv.double())
        assert_within(got, want, "contraction", f"run {i}'s kept result",
                      sensitivity(conv, [xv.double(), wv.double()])[0])
