"""One error contract on every path: what fails in an op-by-op run fails the same way compiled.

Every failure of a compiled run (its fast path, its stepped path, bound runs, pipeline dispatches) is
the `ExecutionError` an eager run raises: it names the op, its name and the user's line that built it.
Integer division or modulo by zero and a maximum, minimum or arg-extremum over an empty axis raise on
every path; sum, mean and product over an empty axis give torch's values (docs/semantics.md, "Errors
during a run"). Compiled runs here use both CPU backends: the generated kernels under Triton's
interpreter, and the reference backend that runs kernel bodies op by op.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.codegen import reduction
from opdb import OPS
from opdb.core import P

pytestmark = pytest.mark.usefixtures("triton_interpreter")
HERE = os.path.abspath(__file__)
OPDB = os.path.join(os.path.dirname(HERE), "opdb")
BACKENDS = ["interpret", "reference"]  # generated kernels under Triton's interpreter; bodies op by op


def _line(marker: str) -> int:
    """The line of this file holding `marker` (a comment at the end of the line that builds an op)."""
    with open(HERE) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}"))


def _compile(g, feeds, targets, backend, target_ops=()):
    return g.compile(feeds, targets, target_ops, device="cpu", options={"backend": backend})


def _run_compiled(g, feeds, targets, backend, target_ops=()):
    return _compile(g, feeds, targets, backend, target_ops).run(feeds)


def _eager_and_compiled(g, feeds, targets, error=sm.ExecutionError):
    """The eager run and the compiled runs of every backend raise `error`; returns the messages."""
    messages = []
    with pytest.raises(error) as eager:
        g.run(feeds, targets, device="cpu")
    messages.append(str(eager.value))
    for backend in BACKENDS:
        with pytest.raises(error) as compiled:
            _run_compiled(g, feeds, targets, backend)
        messages.append(str(compiled.value))
    return messages


def _names(message: str, op: str, marker: str) -> None:
    assert op in message, f"the message does not name {op}: {message!r}"
    assert f"built at {HERE}:{_line(marker)}" in message, f"the message does not point at the line: {message!r}"


# -- the op database's error inputs, compiled ---------------------------------------------------------
def _run_inputs(record):
    return [ei for ei in record.errors() if ei.feeds is not None]


# Feeds that do not fit their placeholders (FeedError) are compile's own checks: test_compile_refuses_bad_feeds.
RUN_ERRORS = [pytest.param(r, id=r.name) for r in OPS.values()
              if any(ei.error is not sm.FeedError for ei in _run_inputs(r))]


@pytest.mark.parametrize("record", RUN_ERRORS)
def test_opdb_error_inputs_compiled(record):
    """Each error input that fails at run time fails compiled, on every backend, with the same type,
    naming the op and the line that built it (the compile of its feed types may be where it fails)."""
    for ei, backend in [(ei, b) for ei in _run_inputs(record) for b in BACKENDS]:
        op = ei.op or record.name
        where = f"{record.name} error input {ei.name or ei.match!r} ({backend})"
        g = sm.Graph(record.name)
        tensors = [g.placeholder(a.shape, a.dtype, name=f"in{i}") if isinstance(a, P) else a
                   for i, a in enumerate(ei.args)]
        placeholders = [t for t, a in zip(tensors, ei.args) if isinstance(a, P)]
        out = ei.build(g, *tensors, **ei.kwargs) if ei.build else record.call(g, tensors, ei.kwargs)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        targets = [t for t in out if isinstance(t, sm.Tensor)]
        target_ops = [t for t in out if isinstance(t, sm.Operation)]
        feeds = dict(zip(placeholders, ei.feeds))
        with pytest.raises(ei.error) as eager:
            g.run(feeds, targets, target_ops, device="cpu")
        with pytest.raises(sm.StitchError) as compiled:
            _run_compiled(g, feeds, targets, backend, target_ops)
        message = str(compiled.value)
        assert type(compiled.value) is type(eager.value), \
            f"{where}: compiled raised {type(compiled.value).__name__}: {message}"
        if ei.error is sm.ExecutionError:
            assert f"{op} (" in message, f"{where}: the message does not name {op}: {message!r}"
            assert f"built at {OPDB}" in message, f"{where}: the message does not name the line: {message!r}"


# -- indexing out of range ------------------------------------------------------------------------------
def test_gather_out_of_range():
    g = sm.Graph()
    x, i = g.placeholder((5, 3), sm.float32, name="x"), g.placeholder((2,), sm.int64, name="i")
    y = g.gather(x, i, axis=0) * 2.0  # gather
    feeds = {x: np.ones((5, 3), np.float32), i: np.array([1, 5])}
    for message in _eager_and_compiled(g, feeds, [y]):
        _names(message, "gather (", "gather")


def test_scatter_add_out_of_range():
    g = sm.Graph()
    x, i = g.placeholder((5, 3), sm.float32, name="x"), g.placeholder((1,), sm.int64, name="i")
    u = g.placeholder((1, 3), sm.float32, name="u")
    y = g.scatter_add(x, i, u, axis=0)  # scatter_add
    feeds = {x: np.ones((5, 3), np.float32), i: np.array([-6]), u: np.ones((1, 3), np.float32)}
    for message in _eager_and_compiled(g, feeds, [y]):
        _names(message, "scatter_add (", "scatter_add")


def test_gather_along_axis_out_of_range():
    g = sm.Graph()
    x, i = g.placeholder((3, 4), sm.float32, name="x"), g.placeholder((3, 2), sm.int64, name="i")
    y = g.exponent(g.gather_along_axis(x, i, axis=1))  # gather_along_axis
    feeds = {x: np.ones((3, 4), np.float32), i: np.full((3, 2), 4)}
    for message in _eager_and_compiled(g, feeds, [y]):
        _names(message, "gather_along_axis (", "gather_along_axis")


# -- reductions over an empty axis ------------------------------------------------------------------------
EXTREMA = ["reduction_maximum", "reduction_minimum", "reduction_arg_maximum", "reduction_arg_minimum"]


@pytest.mark.parametrize("name", EXTREMA)
@pytest.mark.parametrize("shape,axis", [((0, 3), 0), ((2, 0), 1), ((0,), 0)])
def test_empty_extremum_raises(name, shape, axis):
    g = sm.Graph()
    x = g.placeholder(shape, sm.float32, name="x")
    kwargs = {"axis": axis} if "arg" in name else {"axes": axis}
    y = getattr(g, name)(g.exponent(x), **kwargs) + 1  # extremum
    for message in _eager_and_compiled(g, {x: np.zeros(shape, np.float32)}, [y]):
        _names(message, f"{name} (", "extremum")


@pytest.mark.parametrize("dtype", [sm.float32, sm.int32])
def test_empty_reductions(dtype):
    """Over an empty axis a maximum raises on every path, while sums are 0, products 1 and means NaN
    (torch's values) eager and compiled, fused with other work or alone."""
    g = sm.Graph()
    x = g.placeholder((2, 0), dtype, name="x")
    outs = [g.reduction_sum(x, 1), g.reduction_mean(x, 1), g.reduction_product(x, 1), g.reduction_sum(x * 2, 1) + 1]
    data = torch.zeros((2, 0), dtype=dtype.torch)
    keep = dtype.torch  # sums and products keep the input type (docs/ops.md); an integer mean is float32
    want = [data.sum(1, dtype=keep), data.double().mean(1).float(), data.prod(1, dtype=keep), data.sum(1, dtype=keep) + 1]
    feeds = {x: sm.TensorData(data)}
    runs = [g.run(feeds, outs, device="cpu")] + [_run_compiled(g, feeds, outs, b) for b in BACKENDS]
    for results in runs:
        for out, ref in zip(outs, want):
            got = results[out].torch()
            assert got.dtype == ref.dtype
            torch.testing.assert_close(got, ref, equal_nan=True, rtol=0, atol=0)
    m = g.reduction_maximum(x * 2, 1)  # empty-max
    for message in _eager_and_compiled(g, feeds, outs + [m]):
        _names(message, "reduction_maximum (", "empty-max")


# -- integer division and modulo by zero ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [sm.int32, sm.int64])
@pytest.mark.parametrize("name", ["floor_division", "modulo"])
@pytest.mark.parametrize("divisor", ["tensor", "scalar"])
def test_integer_division_by_zero_raises(name, dtype, divisor):
    g = sm.Graph()
    a = g.placeholder((4,), dtype, name="a")
    b = g.placeholder((4,), dtype, name="b") if divisor == "tensor" else 0
    y = getattr(g, name)(a * 3, b) + 1  # division
    feeds = {a: np.array([7, -7, 3, 0], dtype.numpy)}
    if divisor == "tensor":
        feeds[b] = np.array([2, -3, 0, 5], dtype.numpy)
    for message in _eager_and_compiled(g, feeds, [y]):
        _names(message, f"{name} (", "division")
        assert "integer division by zero" in message


# codegen/reduction.py's limits, shrunk so that small rows take the looped and the split kernels
LOOPED = {"MAX_PERSISTENT": 8, "LOOP_BLOCK": 16}
SPLIT = {**LOOPED, "SPLIT_MIN_COLUMNS": 32}


@pytest.mark.parametrize("limits", [{}, LOOPED], ids=["persistent", "looped"])
def test_integer_division_in_a_reduction_kernel(limits, monkeypatch):
    """The zero check also works inside a reduction kernel (before the reduction and per row after it),
    and divisors without zeros give torch's floor values."""
    for name, value in limits.items():
        monkeypatch.setattr(reduction, name, value)
    g = sm.Graph()
    a, b = g.placeholder((3, 20), sm.int32, name="a"), g.placeholder((3, 20), sm.int32, name="b")
    s = g.reduction_sum(g.modulo(a, b), 1, keep_dims=True)  # row-modulo
    y = g.floor_division(s, g.reduction_maximum(b, 1, keep_dims=True) - 3)  # per-row
    rng = np.random.default_rng(0)
    av = rng.integers(-20, 20, (3, 20)).astype(np.int32)
    bv = rng.choice(np.array([-4, -3, -2, 2, 5], np.int32), (3, 20))
    bv[:, 0] = 5  # every row's maximum is 5: the per-row divisor is 2
    exe = _compile(g, {a: av, b: bv}, [y], "interpret")
    assert ("for c0 in range" in exe.steps[0].source) == bool(limits), exe.steps[0].source
    got = exe.run({a: av, b: bv})[y].torch()
    ta, tb = torch.from_numpy(av), torch.from_numpy(bv)
    want = torch.div(torch.remainder(ta, tb).sum(1, keepdim=True), 2, rounding_mode="floor")
    assert torch.equal(got, want)
    bz = bv.copy()
    bz[1, 12] = 0
    with pytest.raises(sm.ExecutionError) as info:
        exe.run({a: av, b: bz})
    _names(str(info.value), "modulo (", "row-modulo")
    b3 = bv.copy()
    b3[:, 0] = 3  # the per-row divisor is max(b) - 3 = 0 where 3 is the row's maximum
    b3[b3 > 3] = 2
    with pytest.raises(sm.ExecutionError) as info:
        exe.run({a: av, b: b3})
    _names(str(info.value), "floor_division (", "per-row")
    assert torch.equal(exe.run({a: av, b: bv})[y].torch(), want), "the flag of a failed run stays set"


def test_integer_division_in_a_split_reduction(monkeypatch):
    """Both kernels of a split reduction take the flag: its partial sums check the divisor."""
    for name, value in SPLIT.items():
        monkeypatch.setattr(reduction, name, value)
    g = sm.Graph()
    a, b = g.placeholder((2, 64), sm.int64, name="a"), g.placeholder((2, 64), sm.int64, name="b")
    r = g.reduction_sum(g.floor_division(a, b), 1)  # split-division
    av = torch.arange(128).reshape(2, 64) - 50
    bv = torch.full((2, 64), 3)
    exe = _compile(g, {a: av, b: bv}, [r], "interpret")
    assert "split reduction kernel" in exe.steps[0].source
    assert torch.equal(exe.run({a: av, b: bv})[r].torch(), torch.div(av, 3, rounding_mode="floor").sum(1))
    bv[1, 40] = 0
    with pytest.raises(sm.ExecutionError) as info:
        exe.run({a: av, b: bv})
    _names(str(info.value), "floor_division (", "split-division")


# -- failures inside kernels, on every way of running an executable ------------------------------------------
def test_fused_kernel_failure_names_its_ops_and_lines():
    """A failing kernel names every op fused into it and the lines that built them, on the fast path,
    the stepped path and a bound run."""
    g = sm.Graph()
    x = g.placeholder((4,), sm.float32, name="x")
    e = g.exponent(x)  # fused-exp
    y = e * 2.0 + 1.0  # fused-tail
    exe = g.compile({x: sm.TensorType((4,), sm.float32)}, [y], device="cpu")
    assert exe.kernel_count == 1
    exe.steps[0].run = _boom
    feeds = {x: torch.ones(4)}
    bound = exe.bind(feeds, {y: torch.empty(4)})
    for run in (lambda: exe.run(feeds), lambda: exe.run(feeds, profile=True), bound.launch):
        with pytest.raises(sm.ExecutionError, match="kernel failed") as info:
            run()
        message = str(info.value)
        _names(message, "exponent (", "fused-exp")
        _names(message, "multiplication (", "fused-tail")
        assert "x: (4,) torch.float32" in message


def _boom(env):
    raise RuntimeError("kernel failed")


def test_division_by_zero_in_a_fused_kernel_names_the_division():
    g = sm.Graph()
    a, b = g.placeholder((8,), sm.int64, name="a"), g.placeholder((8,), sm.int64, name="b")
    q = g.floor_division(g.absolute(a), b)  # fused-division
    y = g.cast(q, sm.float32) * 0.5
    for backend in BACKENDS:
        exe = _compile(g, {a: np.zeros(8, np.int64), b: np.ones(8, np.int64)}, [y], backend)
        assert exe.kernel_count == 1
        with pytest.raises(sm.ExecutionError) as info:
            exe.run({a: np.arange(8), b: np.arange(8) - 3})
        _names(str(info.value), "floor_division (", "fused-division")
        assert "absolute (" not in str(info.value)


def test_bound_run_and_pipeline_dispatch_raise_execution_error():
    g = sm.Graph()
    x, i = g.placeholder((5, 3), sm.float32, name="x"), g.placeholder((2,), sm.int64, name="i")
    y = g.gather(x, i, axis=0) + 1.0  # pipeline-gather
    xv, iv = torch.ones(5, 3), torch.tensor([0, 7])
    exe = g.compile({x: xv, i: iv}, [y], device="cpu")
    with pytest.raises(sm.ExecutionError) as info:
        exe.bind({x: xv, i: iv}, {y: torch.empty(2, 3)}).launch()
    _names(str(info.value), "gather (", "pipeline-gather")

    fn = sm.package.Package.from_graph(g, {"x": x, "i": i}, {"y": y}).function()
    dev = sm.device("cpu")
    pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    cb = dev.new_command_queue().command_buffer()
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": sm.TensorData(xv), "i": sm.TensorData(iv), "y": dev.new_tensor((2, 3), sm.float32)})
    enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size))
    enc.end()
    cb.commit()
    with pytest.raises(sm.ExecutionError) as info:
        cb.wait()
    assert "gather (" in str(info.value) and cb.status == "error"


# -- compile's own checks ---------------------------------------------------------------------------------
def test_compile_time_error_names_the_line_that_built_the_op():
    g = sm.Graph()
    a, b = g.placeholder((-1,), sm.float32, name="a"), g.placeholder((-1,), sm.float32, name="b")
    y = a + b  # unfit-extents
    with pytest.raises(sm.ExecutionError) as info:
        g.compile({a: sm.TensorType((2,), sm.float32), b: sm.TensorType((3,), sm.float32)}, [y], device="cpu")
    _names(str(info.value), "addition (", "unfit-extents")
    assert f"{HERE}:{_line('unfit-extents') + 2}" not in str(info.value)


def test_kernel_the_compiler_cannot_make_names_the_ops(monkeypatch):
    """A code generator failure is a CompileError naming the ops of the kernel and their lines."""
    from stitchml.codegen import pointwise

    def refuse(*args, **kwargs):
        raise NotImplementedError("no template for this")

    monkeypatch.setattr(pointwise, "generate", refuse)
    g = sm.Graph()
    x = g.placeholder((4,), sm.float32, name="x")
    y = g.sin(x) + 1.0  # ungenerated
    with pytest.raises(sm.GraphError, match="no template for this") as info:
        g.compile({x: sm.TensorType((4,), sm.float32)}, [y], device="cpu", options={"backend": "interpret"})
    _names(str(info.value), "sin (", "ungenerated")


def test_compile_refuses_bad_feeds():
    """Feeds of the wrong kind raise FeedError naming what was expected, never TypeError."""
    g = sm.Graph()
    x = g.placeholder((2, 3), sm.float32, name="x")
    other = sm.Graph().placeholder((2, 3), sm.float32, name="z")
    ok = sm.TensorType((2, 3), sm.float32)
    cases = {"name as key": {"x": ok}, "int key": {3: ok}, "placeholder of another graph": {other: ok},
             "not a placeholder": {g.exponent(x): ok}, "wrong dtype": {x: sm.TensorType((2, 3), sm.int32)},
             "wrong example dtype": {x: np.ones((2, 3), np.int64)}, "string": {x: "float32[2,3]"},
             "object": {x: object()}, "None": {x: None}, "not a mapping": [x]}
    for case, feeds in cases.items():
        with pytest.raises(sm.FeedError, match="compile") as info:
            g.compile(feeds, [g.negative(x)], device="cpu")
        assert "expected" in str(info.value) or "must" in str(info.value) or "cannot" in str(info.value), case


def test_every_step_kind_names_its_ops():
    """Each kind of step lower builds (a kernel launch, a library call, a view, a reference call) carries
    the ops it computes: whichever step fails, the error names its op and the line that built it."""
    from stitchml.runtime import launch

    g = sm.Graph()
    a, b = g.placeholder((4, 6), sm.float32, name="a"), g.placeholder((6, 3), sm.float32, name="b")
    i = g.placeholder((2,), sm.int64, name="i")
    p = g.matrix_multiplication(a, b)  # step-matmul
    t = g.transpose(p, 0, 1)  # step-view
    r = g.gather(t, i, axis=0)  # step-gather
    y = g.exponent(r) * 2.0  # step-kernel
    feeds = {a: torch.ones(4, 6), b: torch.ones(6, 3), i: torch.tensor([0, 2])}
    marks = {"matrix_multiplication": "step-matmul", "transpose": "step-view", "gather": "step-gather",
             "exponent": "step-kernel"}
    for backend in BACKENDS:
        exe = _compile(g, feeds, [y], backend)
        kinds = {type(s.run).__name__ for s in exe.steps}
        assert all(hasattr(launch, k) for k in kinds), kinds  # every step runs a named runtime step kind
        seen = set()
        for step in exe.steps:
            assert step.ops, f"step {step.name} ({step.kind}) carries no ops"
            original, step.run = step.run, _boom
            try:
                with pytest.raises(sm.ExecutionError, match="kernel failed") as info:
                    exe.run(feeds, profile=True)
            finally:
                step.run = original
            for op in step.ops:
                if op.op in marks:
                    _names(str(info.value), f"{op.op} (", marks[op.op])
                    seen.add(op.op)
        assert seen == set(marks), (backend, seen)
        assert torch.allclose(exe.run(feeds)[y].torch(), torch.exp(torch.full((2, 4), 6.0)) * 2.0)
