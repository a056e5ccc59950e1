"""The stitching compiler against the eager interpreter, on the CPU (kernels run under TRITON_INTERPRET=1).

* every sample graph of compiler_util (and every op database sample, once tests/opdb is on the
  branch) compiles, runs and equals eager and a float64 reference, with the kernel count fusion must
  reach; the multi-kernel ones again in poison mode and with blocks small enough for several programs;
* fusion: GeLU from primitives, the softmax family and the normalizations, matmul epilogues;
* reductions in the looped and the split templates, over inner and outer axes;
* every kernel these tests launch also compiles for a CUDA GPU;
* variables, assignments, control dependencies and random draws keep eager's run semantics;
* the executable cache, feed errors, the intermediates heap, fusion reports, the disk kernel cache
  and IR dumps.
"""
from __future__ import annotations

import inspect
import json
import os
import pathlib

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.codegen import reduction
from stitchml.runtime import loader
from stitchml.codegen.common import LIBDEVICE_CUDA, LIBDEVICE_INTERPRET
from stitchml.passes import PIPELINE
from stitchml.runtime.compiled import ExecutableCache
from stitchml.runtime.launch import KernelLaunch

from compiler_util import (EXACT, Case, all_cases, assert_match, assert_reference, check_case, compile_case,
                           compile_for_cuda, composite_cases, contraction_cases, opaque_cases, opdb_cases,
                           reduction_cases, run_case, seeded, view_cases)

pytestmark = pytest.mark.usefixtures("triton_interpreter")
F = torch.nn.functional


def _params(cases: list[Case]) -> list:
    return [pytest.param(c, id=c.name, marks=[pytest.mark.xfail(reason=c.known_failure, strict=True)]
                         if c.known_failure else []) for c in cases]


def test_the_comparison_rejects_what_it_must():
    """assert_match, which every test here relies on, fails on each kind of mismatch."""
    x = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    wrong = [torch.tensor([1.0, 1e30, float("nan"), -2.0]), torch.tensor([1.0, float("inf"), 0.0, -2.0]),
             torch.tensor([1.0, float("inf"), float("nan"), -2.001]), x.double(), x[:3]]
    for y in wrong:
        with pytest.raises(AssertionError):
            assert_match(y, x, "mismatch")
    with pytest.raises(AssertionError):
        assert_match(torch.tensor([3, 4]), torch.tensor([3, 5]), "integers")
    assert_match(x * (1 + 2**-22), x, "within the tolerance rule")
    # A half-type result of a composite is one rounding of a float32 computation: the rounded float64
    # reference passes, three units in the last place off does not.
    reference = torch.tensor([0.0036, -1000.3, 3.0e-7], dtype=torch.float64)
    rounded = reference.to(torch.float16)
    assert_reference(rounded, reference, "rounded once", "composite")
    off = rounded.view(torch.int16) + torch.tensor([3, 0, 0], dtype=torch.int16)
    with pytest.raises(AssertionError, match="1 of 3 elements"):
        assert_reference(off.view(torch.float16), reference, "three ulps off", "composite")


@pytest.mark.parametrize("case", _params(all_cases() + opdb_cases()))
def test_compiled_matches_eager(case):
    check_case(case)


@pytest.mark.parametrize("case", _params(composite_cases() + contraction_cases() + view_cases() + opaque_cases()))
def test_poison_mode_matches_eager(case):
    """With the arena filled with NaN before every run, a kernel that reads what nobody wrote shows."""
    out = check_case(case, {"poison": True})
    assert out.exe.plan.guard > 0


SMALL_BLOCKS = {"pointwise_block": 16, "pointwise_warps": 1, "reduction_block_r": 1}


@pytest.mark.parametrize("case", _params(reduction_cases()[::4] + composite_cases() + contraction_cases() + view_cases()
                                         + opaque_cases()))
def test_many_programs_per_kernel(case):
    """Blocks smaller than the tensors: every kernel runs several programs and masks the last one."""
    check_case(case, SMALL_BLOCKS)


def test_poison_exposes_a_missing_write():
    case = Case("two_kernels", lambda g, feed: [g.softmax(g.exponent(feed((4, 9))) @ feed((9, 5)))])
    # without prologue fusion, which would compute the exponent inside the product's kernel
    _, feeds, (y,), exe = compile_case(case, {"poison": True, "prologue": False})
    assert exe.kernel_count == 3
    exe.steps[0].run = lambda env: None  # the first kernel "forgets" to write its output
    assert torch.isnan(exe.run(feeds)[y].torch()).all()


# -- fusion ----------------------------------------------------------------------------
def _case(name: str) -> Case:
    return next(c for c in composite_cases() + contraction_cases() if c.name == name)


def test_gelu_from_primitives_is_one_kernel():
    def build(g, feed):
        x = feed((4, 9))
        return [0.5 * x * (1.0 + g.erf(x * g.reciprocal(g.square_root(g.constant(2.0, sm.float32)))))]

    out = check_case(Case("gelu_primitives", build, lambda x: [F.gelu(x)], kernels=1))
    assert [s.kind for s in out.exe.steps] == ["pointwise"]


@pytest.mark.parametrize("name", ["softmax-float32", "softmax_axis0-float32", "log_softmax-float32",
                                  "layer_norm-float32", "variance-float32", "batch_norm-float32",
                                  "softmax_cross_entropy_rows"])
def test_row_composites_are_one_reduction_kernel(name):
    out = check_case(_case(name))
    assert [s.kind for s in out.exe.steps] == ["reduction"], out.exe.fusion_report()


def test_matmul_bias_gelu_is_one_matmul_kernel_with_its_epilogue():
    out = check_case(_case("matmul_bias_gelu-float32"))
    (step,) = out.exe.steps
    assert step.kind == "matmul"
    assert "tl.erf(" in step.source and out.exe.fusion_report().startswith(
        "kernel 0 (matmul): matrix_multiplication")


def test_fusion_report_lists_kernels_and_refusals():
    def build(g, feed):
        x, w = feed((4, 8)), feed((8, 9))
        y = g.softmax(x @ w)
        return [g.normalization(y, feed((1, 9)), feed((1, 9), low=0.5, high=1.0))]

    out = check_case(Case("report", build))
    report = out.exe.fusion_report()
    assert report.splitlines()[0].startswith("kernel 0 (matmul): matrix_multiplication")
    assert "a reduction cannot join a matmul epilogue" in report
    assert "multiplication has 36 elements, the kernel iterates over 9" in report
    assert out.exe.kernel_count == len([ln for ln in report.splitlines() if ln.startswith("kernel ")])


# -- reduction templates ----------------------------------------------------------------
def _reduce(op: str, shape, axis, dtype=sm.float32, low=-2.0, high=2.0) -> Case:
    torch_op = {"reduction_sum": torch.sum, "reduction_mean": torch.mean, "reduction_maximum": torch.amax,
                "reduction_minimum": torch.amin, "reduction_product": torch.prod}[op]

    def build(g, feed):
        return [getattr(g, op)(feed(shape, dtype, low=low, high=high), axis)]

    return Case(f"{op}-{shape}-{axis}-{dtype}", build, (lambda x: [torch_op(x, axis)]) if dtype.is_floating else None,
                kernels=1)


def _rows(name: str, shape, build, reference) -> Case:
    return Case(f"{name}-{shape}", lambda g, feed: build(g, feed(shape)), reference, kernels=1)


def _looped_cases(n: int) -> list[Case]:
    """Rows of n columns (more than the shrunken persistent limit, not a multiple of the block)."""
    return [
        *[_reduce(op, (3, n), -1) for op in ("reduction_sum", "reduction_mean", "reduction_maximum", "reduction_minimum")],
        _reduce("reduction_product", (3, n), -1, low=0.9, high=1.1),
        _reduce("reduction_sum", (n, 3), 0),
        _reduce("reduction_maximum", (2, n, 3), 1),
        _reduce("reduction_sum", (3, n), -1, sm.int32, -5, 5),
        _reduce("reduction_maximum", (3, n), -1, sm.bool),
        _reduce("reduction_sum", (3, n), -1, sm.float16),
        _rows("softmax", (3, n), lambda g, x: [g.softmax(x)], lambda x: [torch.softmax(x, -1)]),
        _rows("softmax_axis0", (n, 3), lambda g, x: [g.softmax(x, 0)], lambda x: [torch.softmax(x, 0)]),
        _rows("log_softmax", (3, n), lambda g, x: [g.log_softmax(x)], lambda x: [torch.log_softmax(x, -1)]),
        _rows("layer_norm", (3, n), lambda g, x: [g.layer_normalization(x)], lambda x: [F.layer_norm(x, (n,))]),
        _rows("variance", (3, n), lambda g, x: [g.variance(x, -1)], lambda x: [x.var(-1, unbiased=False)]),
        _rows("exp_and_sum", (3, n), lambda g, x: [g.exponent(x), g.reduction_sum(g.exponent(x), -1)],
              lambda x: [x.exp(), x.exp().sum(-1)]),
    ]


LOOPED = {"MAX_PERSISTENT": 8, "LOOP_BLOCK": 16}  # codegen/reduction.py limits, shrunk to small sizes
SPLIT_LIMITS = {**LOOPED, "SPLIT_MIN_COLUMNS": 32}


@pytest.mark.parametrize("case", _params(_looped_cases(37)))
def test_looped_reductions(case, monkeypatch):
    """Rows longer than MAX_PERSISTENT are reduced in BLOCK_C chunks, one pass per reduction."""
    for name, value in LOOPED.items():
        monkeypatch.setattr(reduction, name, value)
    out = check_case(case)
    (source,) = out.exe.kernel_sources().values()
    assert "for c0 in range(0, 37, BLOCK_C)" in source


SPLIT = ["reduction_sum-(3, 100)--1-float32", "reduction_mean-(3, 100)--1-float32",
         "reduction_maximum-(3, 100)--1-float32", "reduction_minimum-(3, 100)--1-float32",
         "reduction_product-(3, 100)--1-float32", "reduction_sum-(100, 3)-0-float32",
         "reduction_maximum-(2, 100, 3)-1-float32", "reduction_sum-(3, 100)--1-int32",
         "reduction_maximum-(3, 100)--1-bool", "reduction_sum-(3, 100)--1-float16", "exp_and_sum-(3, 100)"]


def _split_cases() -> list[Case]:
    return [c for c in _looped_cases(100) if c.name in SPLIT]


@pytest.mark.parametrize("case", _params(_split_cases()))
def test_split_reductions(case, monkeypatch):
    """Few long rows are cut into column chunks: a partial kernel per chunk, then a finishing kernel."""
    for name, value in SPLIT_LIMITS.items():
        monkeypatch.setattr(reduction, name, value)
    out = check_case(case)
    (source,) = out.exe.kernel_sources().values()
    assert "_partial(" in source and "CHUNK" in source


# -- run semantics -----------------------------------------------------------------------
def _counter(g):
    """Exact state: every value is a small integer or a dyadic fraction, so compiled must equal eager bit
    for bit."""
    x = g.placeholder((4,), sm.float32, name="x")
    count = g.variable(np.zeros(4, np.int32), name="count")
    acc = g.variable(np.zeros(4, np.float32), name="acc")
    bump = g.assign_variable(count, count + 1)
    grow = g.assign_variable(acc, acc * 0.5 + x * g.cast(count, sm.float32))
    twice = g.assign_variable(acc, acc + 1.0)  # after `grow` in program order: this one wins
    with g.control_dependencies([bump]):
        seen = g.read_variable(count)  # the value `bump` assigned in this run
    start = g.read_variable(acc)  # no dependency: the value at the start of the run
    p = g.variable(np.array([1, 2, 3, 4], np.float32), name="p")
    q = g.variable(np.array([10, 20, 30, 40], np.float32), name="q")
    swap = [g.assign_variable(p, q), g.assign_variable(q, g.transpose(p, [0]))]  # both read the start values
    targets = [seen * 2, start, g.exponent(g.cast(seen, sm.float32) * 0.0), p]
    return x, (count, acc, p, q), targets, [bump, grow, twice, *swap]


def test_assignments_and_control_dependencies_match_eager_exactly():
    ga, gb = sm.Graph("compiled"), sm.Graph("eager")
    xa, va, ta, oa = _counter(ga)
    xb, vb, tb, ob = _counter(gb)
    x = np.array([0.5, -1.25, 2.0, 0.125], np.float32)
    exe = ga.compile({xa: x}, ta, oa, device="cpu")
    for run in range(1, 4):
        got, want = exe.run({xa: x}), gb.run({xb: x}, tb, ob, device="cpu")
        for a, b in zip(ta, tb):
            assert_match(got[a].torch(), want[b].torch(), f"run {run}: {a.name}", EXACT)
        assert got[ta[0]].numpy().tolist() == [2 * run] * 4  # the read saw this run's bump
        for a, b in zip(va, vb):
            assert_match(ga.variable_value(a).torch(), gb.variable_value(b).torch(), f"run {run}: {a.name}", EXACT)
        assert ga.variable_value(va[1]).numpy().tolist() == (want[tb[1]].numpy() + 1.0).tolist()
        swapped = [[1, 2, 3, 4], [10, 20, 30, 40]][::1 if run % 2 == 0 else -1]
        assert [ga.variable_value(v).numpy().tolist() for v in va[2:]] == swapped
        assert got[ta[3]].numpy().tolist() == swapped[1]  # p as the run started


def _mlp_step(g, rng, dtype=sm.float32, batch=8):
    x = g.placeholder((batch, 16), dtype, name="x")
    labels = g.placeholder((batch,), sm.int32, name="labels")
    init = [rng.normal(0, 0.3, (16, 32)), np.zeros(32), rng.normal(0, 0.3, (32, 10)), np.zeros(10)]
    w1, b1, w2, b2 = (g.variable(v.astype(dtype.numpy), name=n) for v, n in zip(init, ("w1", "b1", "w2", "b2")))
    loss = g.softmax_cross_entropy(g.relu(x @ w1 + b1) @ w2 + b2, labels, reduction="mean")
    grads = g.gradients(loss, [w1, b1, w2, b2])
    steps = [g.assign_variable(v, v - 0.1 * grads[v]) for v in (w1, b1, w2, b2)]
    feeds = {x: rng.normal(size=(batch, 16)).astype(dtype.numpy), labels: rng.integers(0, 10, batch).astype(np.int32)}
    return feeds, [loss], steps


def _cnn_step(g, rng, dtype=sm.float32, batch=4):
    x = g.placeholder((batch, 3, 8, 8), dtype, name="x")
    labels = g.placeholder((batch,), sm.int32, name="labels")
    init = [rng.normal(0, 0.3, (8, 3, 3, 3)), np.zeros((8, 1, 1)), rng.normal(0, 0.1, (128, 10)), np.zeros(10)]
    w, b, w2, b2 = (g.variable(v.astype(dtype.numpy), name=n) for v, n in zip(init, ("w", "b", "w2", "b2")))
    h = g.relu(g.convolution2d(x, w, sm.Convolution2DDescriptor(padding=1)) + b)
    h = g.reshape(g.max_pooling2d(h, sm.Pooling2DDescriptor(kernel_size=2)), (batch, 128))
    loss = g.softmax_cross_entropy(h @ w2 + b2, labels, reduction="mean")
    grads = g.gradients(loss, [w, b, w2, b2])
    steps = [g.assign_variable(v, v - 0.05 * grads[v]) for v in (w, b, w2, b2)]
    feeds = {x: rng.normal(size=(batch, 3, 8, 8)).astype(dtype.numpy),
             labels: rng.integers(0, 10, batch).astype(np.int32)}
    return feeds, [loss], steps


def _softmax_chain(g, rng, dtype=sm.float32):
    x, y = g.placeholder((8, 32), dtype, name="x"), g.placeholder((8, 32), dtype, name="y")
    s = g.softmax(g.softmax(x) * 2.0 + y)
    t = g.log_softmax(s * x, 0)
    feeds = {x: rng.normal(size=(8, 32)).astype(dtype.numpy), y: rng.normal(size=(8, 32)).astype(dtype.numpy)}
    return feeds, [g.reduction_sum(t * s, 1), s], []


STEPS = [pytest.param(f, id=f.__name__.strip("_")) for f in (_mlp_step, _cnn_step, _softmax_chain)]


def _twins(build, dtype=sm.float32):
    """The same graph twice (same initial values and feeds): one to compile, one to run eagerly."""
    made = []
    for name in ("compiled", "eager"):
        g = sm.Graph(name)
        made.append((g, *build(g, np.random.default_rng(7), dtype)))
    return made


def _same_runs(exe, a, b, runs: int, tol=None) -> None:
    (ga, feeds_a, targets_a, _), (gb, feeds_b, targets_b, ops_b) = a, b
    for run in range(runs):
        got = exe.run(feeds_a)
        want = gb.run(feeds_b, targets_b, ops_b, device="cpu")
        for ta, tb in zip(targets_a, targets_b):
            assert_match(got[ta].torch(), want[tb].torch(), f"run {run}: {ta.name}", tol)
        for va, vb in zip(ga.variables, gb.variables):
            assert_match(ga.variable_value(va).torch(), gb.variable_value(vb).torch(), f"run {run}: {va.name}", tol)


@pytest.mark.parametrize("build", STEPS[:2])
def test_training_steps_match_eager(build):
    """Several steps in float64: every loss and every updated variable as eager has them. Differences of
    rounding (other summation orders, NumPy's libm) grow a little from step to step."""
    a, b = _twins(build, sm.float64)
    exe = a[0].compile(a[1], a[2], a[3], device="cpu")
    _same_runs(exe, a, b, runs=4)


def test_outputs_never_alias_variables():
    g = sm.Graph()
    v = g.variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="v")
    exe = g.compile({}, [g.transpose(v, [1, 0]), g.read_variable(v)], device="cpu")
    for out in exe.run().values():
        out.torch().fill_(-1.0)
    assert g.variable_value(v).numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


def _random_graph(g):
    x = g.placeholder((64,), sm.float32, name="x")
    return x, [g.dropout(x, 0.5, seed=7), g.random_normal((4, 4), seed=9) * 2.0 + x[:4],
               g.random_uniform(x, seed=11, minimum=-1.0)]


def test_random_ops_draw_what_eager_draws_in_the_same_run():
    (ga, (xa, ta)), (gb, (xb, tb)) = [(g, _random_graph(g)) for g in (sm.Graph("a"), sm.Graph("b"))]
    x = np.ones(64, np.float32)
    exe = ga.compile({xa: x}, ta, device="cpu")
    runs = []
    for run in range(3):
        got, want = exe.run({xa: x}), gb.run({xb: x}, tb, device="cpu")
        for a, b in zip(ta, tb):
            assert_match(got[a].torch(), want[b].torch(), f"run {run}: {a.name}", EXACT)
        runs.append(got[ta[0]].torch())
    assert not torch.equal(runs[0], runs[1]), "two runs drew the same dropout mask"
    assert set(runs[0].unique().tolist()) == {0.0, 2.0}


# -- the executable cache and feed errors ---------------------------------------------------
def test_executable_cache_compiles_once_per_signature_and_says_why():
    g = sm.Graph("cached")
    x = g.placeholder((-1, 8), sm.float32, name="x")
    y, z = g.softmax(x), g.exponent(x)
    cache = ExecutableCache(size=2)

    def get(rows, targets=(y,)):
        a = seeded(f"rows{rows}").normal(size=(rows, 8)).astype(np.float32)
        exe = cache.get(g, {x: a}, list(targets), [], "cpu")
        for t in targets:
            assert_match(exe.run({x: a})[t].torch(), g.run({x: a}, [t], device="cpu")[t].torch(), f"{rows} rows")
        return exe

    first = get(2)
    assert get(2) is first and len(cache.log) == 1 and "first run" in cache.log[0]
    second = get(3)
    assert second is not first and "feed x: float32[2, 8] -> float32[3, 8]" in cache.log[1]
    assert get(2) is first  # a hit makes `first` the most recently used...
    get(4)
    assert get(2) is first  # ...so the bound of two dropped `second`
    assert cache.log[-1] == "evicted 'cached' x: float32[3, 8] (least recently used of 2)"
    assert get(3) is not second and len(cache.log) == 6  # three compiles, an eviction, a compile, an eviction
    assert "for a signature compiled before and evicted (the cache holds 2)" in cache.log[-2]
    assert cache.log[-1].startswith("evicted 'cached' x: float32[4, 8]")
    assert "feed" not in cache.log[-2]
    get(3, (y, z))
    assert "targets or target operations changed" in cache.log[-2] and cache.log[-1].startswith("evicted")
    assert len(cache.entries) == 2


def test_feed_errors_come_before_any_work():
    g = sm.Graph()
    x = g.placeholder((-1, 8), sm.float32, name="x")
    v = g.variable(np.zeros(8, np.float32), name="v")
    step = g.assign_variable(v, v + g.reduction_sum(x, 0))
    y = g.exponent(x)
    exe = g.compile({x: sm.TensorType((2, 8), sm.float32)}, [y], [step], device="cpu")
    bad = [({x: np.ones((3, 8), np.float32)}, "compiled for"), ({x: np.ones((2, 8), np.float64)}, "compiled for"),
           ({}, "needs a feed for placeholder x"),
           ({x: np.ones((2, 8), np.float32), y: np.ones((2, 8), np.float32)}, "must be placeholders")]
    for feeds, message in bad:
        with pytest.raises(sm.FeedError, match=message):
            exe.run(feeds)
    assert exe.runs == 0 and g.variable_value(v).numpy().tolist() == [0.0] * 8
    with pytest.raises(sm.FeedError, match="cannot compile"):
        g.compile({x: sm.TensorType((2, 9), sm.float32)}, [y], device="cpu")
    exe.run({x: np.ones((2, 8), np.float32)})
    assert g.variable_value(v).numpy().tolist() == [2.0] * 8


# -- the intermediates heap -------------------------------------------------------------------
@pytest.mark.parametrize("build", STEPS)
def test_intermediates_heap_is_known_at_compile_time_and_near_the_lower_bound(build):
    a, b = _twins(build)
    exe = a[0].compile(a[1], a[2], a[3], device="cpu")
    size, bound = exe.intermediates_heap_size, exe.plan.lower_bound
    assert exe.runs == 0 and 0 < bound <= size <= 1.05 * bound, (size, bound)
    arena = [buf for buf in exe.plan.buffers.values() if buf.kind in ("intermediate", "scratch")]
    for i, p in enumerate(arena):  # the plan itself: inside the arena, no two live buffers overlap
        assert 0 <= p.offset and p.offset + p.nbytes <= size
        for q in arena[i + 1:]:
            if p.start <= q.end and q.start <= p.end:
                assert p.offset + p.nbytes <= q.offset or q.offset + q.nbytes <= p.offset, (p, q)
    heap = torch.full((size,), 0xFF, dtype=torch.uint8)  # a caller's heap of exactly that size
    got = exe.run(a[1], heap=heap)
    want = b[0].run(b[1], b[2], b[3], device="cpu")
    for ta, tb in zip(a[2], b[2]):
        assert_match(got[ta].torch(), want[tb].torch(), ta.name)
    with pytest.raises(sm.GraphError, match=f"at least {size} bytes"):
        exe.run(a[1], heap=torch.empty(size - 1, dtype=torch.uint8))


@pytest.mark.parametrize("build", STEPS)
def test_poison_runs_of_training_steps_match_eager(build):
    a, b = _twins(build)
    exe = a[0].compile(a[1], a[2], a[3], device="cpu", options={"poison": True})
    assert exe.intermediates_heap_size > exe.plan.lower_bound  # guard zones after every buffer
    _same_runs(exe, a, b, runs=3)


# -- kernel cache and IR dumps ------------------------------------------------------------
def test_disk_kernel_cache_reuses_kernel_files(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    case = Case("cached_kernels", lambda g, feed: [g.softmax(feed((4, 9))), g.gelu(feed((3, 5)))])
    loader.forget()  # as in a new process: nothing imported yet
    before = dict(loader.stats)
    first = run_case(case)
    files = sorted(os.listdir(tmp_path / "kernels"))
    assert len(files) == first.exe.kernel_count == 2
    assert loader.stats["written"] - before["written"] == 2
    loader.forget()
    before = dict(loader.stats)
    second = run_case(case)
    assert loader.stats["written"] == before["written"], "a second compile wrote kernel files again"
    assert loader.stats["reused_files"] - before["reused_files"] == 2
    assert sorted(os.listdir(tmp_path / "kernels")) == files
    for a, b in zip(first.compiled, second.compiled):
        assert_match(a, b, "second compile", EXACT)


def test_dump_ir_writes_one_file_per_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHML_DUMP_IR", str(tmp_path / "ir"))
    run_case(Case("dumped", lambda g, feed: [g.softmax(feed((4, 9)) * 2.0)]))
    names = ["extract"] + [name for name, _ in PIPELINE]
    files = sorted(os.listdir(tmp_path / "ir"))
    assert files == [f"{i:02d}_{name}.txt" for i, name in enumerate(names)]
    for f, name in zip(files, names):
        assert (tmp_path / "ir" / f).read_text().startswith(f"// after {name}\n")
    assert "fusion" in (tmp_path / "ir" / f"{names.index('stitch'):02d}_stitch.txt").read_text()


# -- the same kernels for CUDA ---------------------------------------------------------------
CUDA_BATCHES = 4  # tests of their own, which pytest-xdist spreads over the workers


@pytest.mark.parametrize("batch", range(CUDA_BATCHES))
def test_kernels_compile_for_cuda(batch, monkeypatch, tmp_path):
    """The interpreter is lenient (NumPy takes any dtype): every kernel the sample graphs launch must
    also compile for a CUDA GPU (sm_90), which Triton does on the CPU, down to a cubin."""
    launches: dict = {}  # kernel job -> names of the cases that launch it
    original = KernelLaunch.__call__
    case = None  # the case being run, which `record` files each launch under

    def record(self, env):
        interpreted = pathlib.Path(inspect.getsourcefile(self.fn.fn)).read_text()
        job = json.dumps({"name": self.fn.fn.__name__, "warps": self.warps, "constexprs": self.meta,
                          "source": interpreted.replace(LIBDEVICE_INTERPRET, LIBDEVICE_CUDA),
                          "dtypes": [str(env[s].dtype).replace("torch.", "") for s in self.slots],
                          "sizes": list(self.sizes)}, sort_keys=True)
        launches.setdefault(job, set()).add(case.name)
        original(self, env)

    monkeypatch.setattr(KernelLaunch, "__call__", record)
    limits = [({}, c) for c in all_cases()] + [(LOOPED, c) for c in _looped_cases(37)] + \
        [(SPLIT_LIMITS, c) for c in _split_cases()]
    for patch, case in limits[batch::CUDA_BATCHES]:
        with monkeypatch.context() as m:
            for name, value in patch.items():
                m.setattr(reduction, name, value)
            _, feeds, _, exe = compile_case(case)
        exe.run(feeds)
    failed = compile_for_cuda(list(launches), tmp_path)
    broken = {name: error for job, error in failed.items() for name in launches[job]}
    assert not broken, "kernels that do not compile for CUDA:\n" + "\n".join(f"{k}: {v}" for k, v in broken.items())


@pytest.mark.parametrize("operand", ["filter", "image"])
def test_convolution_epilogue_reads_channels_last_library_output(operand):
    """A one-channel operand is contiguous in both layouts; when its strides look channels-last the
    convolution library returns channels-last output, which the epilogue must not read as row-major."""
    torch.manual_seed(0)
    w = torch.randn(4, 1, 3, 3)
    xin = torch.randn(2, 1, 8, 8)
    if operand == "filter":
        w = w.to(memory_format=torch.channels_last)
    else:
        xin = xin.to(memory_format=torch.channels_last)
    assert (w if operand == "filter" else xin).is_contiguous()  # the compiler sees an ordinary tensor
    g = sm.Graph()
    x = g.placeholder((2, 1, 8, 8), sm.float32, name="x")
    bias = torch.randn(1, 4, 1, 1)
    y = g.relu(g.convolution2d(x, g.variable(w, name="w")) + g.constant(bias))
    exe = g.compile({x: xin}, [y], device="cpu")
    assert "kernel 0 (convolution): convolution2d" in exe.fusion_report()
    want = torch.relu(torch.nn.functional.conv2d(xin.double(), w.double()) + bias.double())
    for _ in range(2):
        got = exe.run({x: xin})[y].torch()
        assert (got.double() - want).abs().max().item() <= 1e-5
