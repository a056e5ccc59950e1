"""Generic tests over the op database (tests/opdb): every record, every dtype, every sample.

* reference: the eager result is within the tolerance rule (tests/tolerance.py) of the record's
  independent float64 reference, and stays within it when another CPU rounds differently;
* types: the output's static type (shape and dtype rule) fits the result;
* errors: each error input raises the expected error, naming the op;
* completeness: every builder method and primitive has a record;
* the type promotion rule of docs/semantics.md, directly.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.registry import BUILDERS, COMPOSITES, REGISTRY

from opdb import OPS, KnownFailure, build, expected, feeds_for, modes
from opdb.core import P, as_outputs, assert_reference, ref_args
from opdb.ops_md import render as render_ops_md

CASES = [pytest.param(r, d, id=f"{r.name}-{d}") for r in OPS.values() for d in r.dtypes]


@pytest.mark.parametrize("record, dtype", CASES)
def test_reference(record, dtype):
    samples = record.samples_for(dtype)
    assert samples, f"{record.name} has no samples for {dtype}"
    for sample in samples:
        for mode in modes(record, sample):
            where = f"{record.name} {dtype} {sample.describe()} ({mode})"
            with expected(record.known_failure("reference", dtype, f"{sample.name}/{mode}"), where):
                built = build(record, sample, mode)
                for args in feeds_for(sample, mode):
                    got = built.run(args)
                    if record.ref is None:
                        record.check(got, *args, **sample.kwargs)
                        continue
                    assert_reference(record, got, args, sample.kwargs, where)


def _moved(t: torch.Tensor, ulps: int) -> torch.Tensor:
    """`t` moved by `ulps` units in the last place of its type."""
    toward = torch.full_like(t, math.inf if ulps > 0 else -math.inf)
    for _ in range(abs(ulps)):
        t = torch.nextafter(t, toward)
    return t


@pytest.mark.parametrize("name, dtype", [("exponent_base10", sm.float32), ("convolution_transpose2d", sm.bfloat16)])
def test_the_tolerance_rule_holds_on_another_cpu(name, dtype):
    """Math libraries and oneDNN kernels round float32 differently on AMD and Intel CPUs (an ulp is
    usual). Results moved two float32 ulps either way, and half-type results rounded from a float32
    value four float32 ulps off, still pass: these two checks failed on an AMD EPYC host under the
    earlier per-dtype tolerances."""
    record = OPS[name]
    for sample in record.samples_for(dtype):
        got = build(record, sample).run(sample.args)
        want = as_outputs(record.ref(*ref_args(record, sample.args), **sample.kwargs))
        for shift in (-2, 2):
            if dtype == sm.float32:
                other = [_moved(a, shift) for a in got]
            else:
                other = [_moved(w.float(), 2 * shift).to(dtype.torch) for w in want]
            assert_reference(record, other, sample.args, sample.kwargs,
                             f"{name} {dtype} {sample.describe()} moved by {shift} float32 ulps")


@pytest.mark.parametrize("record, dtype", CASES)
def test_types(record, dtype):
    for sample in record.samples_for(dtype):
        want = record.out_dtype(dtype, sample.kwargs)
        for mode in modes(record, sample):
            where = f"{record.name} {dtype} {sample.describe()} ({mode})"
            with expected(record.known_failure("types", dtype, f"{sample.name}/{mode}"), where):
                built = build(record, sample, mode)
                wants = want if isinstance(want, tuple) else (want,) * len(built.outputs)
                assert len(wants) == len(built.outputs), f"{where}: {len(built.outputs)} outputs, {len(wants)} dtypes"
                for out, want_dtype in zip(built.outputs, wants):
                    assert out.dtype == want_dtype, f"{where}: static dtype {out.dtype}, expected {want_dtype}"
                    if mode == "static":
                        assert out.type.is_static, f"{where}: static inputs gave {out.type}"
                    if mode == "dynamic":
                        assert out.shape is not None, f"{where}: inputs of known rank gave an unknown rank"
                for args in feeds_for(sample, mode):
                    for out, value in zip(built.outputs, built.run(args)):
                        assert value.dtype == out.dtype.torch, f"{where}: {out.name} is {out.type}, ran {value.dtype}"
                        assert out.type.accepts(tuple(value.shape)), \
                            f"{where}: {out.name} is {out.type}, ran shape {tuple(value.shape)}"


ERROR_CASES = [pytest.param(r, id=r.name) for r in OPS.values() if list(r.errors())]


def _error_graph(record, error_input):
    g = sm.Graph(record.name)
    tensors = [g.placeholder(a.shape, a.dtype, name=f"in{i}") if isinstance(a, P) else a
               for i, a in enumerate(error_input.args)]
    placeholders = [t for t, a in zip(tensors, error_input.args) if isinstance(a, P)]
    return g, tensors, placeholders


@pytest.mark.parametrize("record", ERROR_CASES)
def test_errors(record):
    for ei in record.errors():
        op = ei.op or record.name
        where = f"{record.name} error input {ei.name or ei.match!r}"
        with expected(record.known_failure("errors", None, ei.name), where):
            g, tensors, placeholders = _error_graph(record, ei)
            call = (lambda: ei.build(g, *tensors, **ei.kwargs)) if ei.build else \
                (lambda: record.call(g, tensors, ei.kwargs))
            if ei.feeds is None:
                with pytest.raises(ei.error) as info:
                    call()
            else:
                outputs = call()
                feeds = dict(zip(placeholders, ei.feeds))
                with pytest.raises(ei.error) as info:
                    g.run(feeds, outputs, device="cpu")
            message = str(info.value)
            assert ei.match in message, f"{where}: {message!r} lacks {ei.match!r}"
            if ei.error in (sm.ShapeError, sm.ExecutionError):
                assert op in message, f"{where}: the message does not name {op}: {message!r}"
                assert f"built at {os.path.dirname(__file__)}" in message, \
                    f"{where}: the message does not point at the line that built the op: {message!r}"


def _takes_tensors(record):
    # The placeholder record passes its placeholder through: that builder takes no tensors.
    return (record.builder and record.name != "placeholder" and record.inputs == "placeholder"
            and record.samples_for(record.dtypes[0])[0].args)


@pytest.mark.parametrize("record", [pytest.param(r, id=r.name) for r in OPS.values() if _takes_tensors(r)])
def test_tensor_of_another_graph(record):
    """Every builder refuses a tensor of another graph."""
    sample = record.samples_for(record.dtypes[0])[0]
    foreign = build(record, sample).inputs
    with pytest.raises(sm.GraphError, match="another graph"):
        record.call(sm.Graph("other"), foreign, sample.kwargs)


# Primitives only the compiler makes: no builder, no record; the compiler tests cover them.
COMPILER_INTERNAL = {
    "fusion",  # a kernel of the stitch pass; its reference runs its body (test_fusion_runs_its_body)
}


def test_every_builder_and_primitive_has_a_record():
    missing = sorted((set(BUILDERS) | set(REGISTRY)) - set(OPS) - COMPILER_INTERNAL)
    assert not missing, f"no op database record for: {', '.join(missing)} (add one to tests/opdb)"
    unknown = sorted(set(OPS) - set(BUILDERS) - set(REGISTRY))
    assert not unknown, f"records for ops that do not exist: {unknown}"


def test_compiler_internal_primitives_have_no_builder():
    assert COMPILER_INTERNAL <= set(REGISTRY) and not COMPILER_INTERNAL & (set(BUILDERS) | set(OPS))


def test_fusion_runs_its_body():
    """The reference of a stitched kernel (`fusion`) computes what its body's ops compute."""
    g = sm.Graph()
    x, w = g.placeholder((4, 3), sm.float32, name="x"), g.placeholder((3,), sm.float32, name="w")
    y = g.tanh(x * w + 1.0)
    z = g.reduction_sum(y * y, 1)
    exe = g.compile({x: sm.TensorType((4, 3), sm.float32), w: sm.TensorType((3,), sm.float32)}, [y, z],
                    device="cpu")
    (kernel,) = [op for op in exe.program.operations if op.op == "fusion"]
    assert [t.name for t in kernel.inputs] == ["x", "w"]
    rng = np.random.default_rng(0)
    xv, wv = (torch.as_tensor(rng.standard_normal(s), dtype=torch.float32) for s in ((4, 3), (3,)))
    got = REGISTRY["fusion"].impl(xv, wv, **kernel.attrs)
    want_y = torch.tanh(xv.double() * wv.double() + 1.0)
    want = [want_y, (want_y * want_y).sum(1)]
    assert len(got) == len(kernel.attrs["body"].outputs) == 2
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-6, atol=1e-6)
    ran = exe.run({x: xv, w: wv})
    for t, a in zip((y, z), got):
        torch.testing.assert_close(ran[t].torch(), a, rtol=1e-6, atol=1e-6)


def test_records_agree_with_the_registry():
    for name, record in OPS.items():
        assert record.builder == (name in BUILDERS), name
        prim = REGISTRY.get(name)
        if prim is not None:
            assert record.differentiable == prim.differentiable, f"{name}: the record and registry disagree"
        else:
            assert name in COMPOSITES or name == "index", name
        assert record.equivalent, f"{name}: give its NumPy/PyTorch equivalent (docs/ops.md)"


# -- type promotion (docs/semantics.md) ----------------------------------------------------
def _promoted(a, b):
    g = sm.Graph()
    x = g.placeholder((2,), a) if isinstance(a, sm.DType) else a
    y = g.placeholder((2,), b) if isinstance(b, sm.DType) else b
    return g.addition(x, y).dtype


# PyTorch's rule on the types it computes with; the others follow NumPy (tests/test_dtypes_unsigned.py).
@pytest.mark.parametrize("a", [pytest.param(d, id=str(d)) for d in sm.dtypes.CORE])
@pytest.mark.parametrize("b", [pytest.param(d, id=str(d)) for d in sm.dtypes.CORE])
def test_promotion_of_two_tensors_follows_pytorch(a, b):
    want = torch.promote_types(a.torch, b.torch)
    assert _promoted(a, b).torch == want
    assert _promoted(b, a).torch == want


def test_promotion_table_examples():
    assert _promoted(sm.int8, sm.uint8) is sm.int16
    assert _promoted(sm.float16, sm.bfloat16) is sm.float32
    assert _promoted(sm.bool, sm.int8) is sm.int8
    assert _promoted(sm.int64, sm.float16) is sm.float16
    assert _promoted(sm.int32, sm.int64) is sm.int64


@pytest.mark.parametrize("dtype, scalar, want", [
    (sm.float16, 0.5, sm.float16), (sm.bfloat16, 2, sm.bfloat16), (sm.int8, 3, sm.int8), (sm.uint8, 3, sm.uint8),
    (sm.int8, 0.5, sm.float32), (sm.int64, 0.5, sm.float32), (sm.bool, 1, sm.int64), (sm.bool, True, sm.bool),
    (sm.bool, 0.5, sm.float32), (sm.float64, 1, sm.float64),
])
def test_python_scalars_are_weak(dtype, scalar, want):
    assert _promoted(dtype, scalar) is want
    assert _promoted(scalar, dtype) is want


@pytest.mark.parametrize("dtype, scalar", [(sm.uint8, 300), (sm.uint8, -1), (sm.int8, 128), (sm.int8, -129),
                                           (sm.int16, 2 ** 15), (sm.int32, -2 ** 31 - 1), (sm.int64, 2 ** 63),
                                           (sm.uint16, 2 ** 16), (sm.uint32, -1), (sm.uint64, 2 ** 64)])
def test_python_ints_the_integer_type_cannot_hold_are_errors(dtype, scalar):
    """As NumPy 2 (docs/semantics.md): an error naming the op, not a wrap-around; the extremes still fit."""
    with pytest.raises(sm.ShapeError, match=rf"^addition: the Python int {scalar} does not fit {dtype} "):
        _promoted(dtype, scalar)
    with pytest.raises(sm.ShapeError, match=rf"^maximum: the Python int {scalar} does not fit {dtype} "):
        g = sm.Graph()
        g.maximum(scalar, g.placeholder((2,), dtype))
    info = torch.iinfo(dtype.torch)
    assert _promoted(dtype, info.min) is dtype and _promoted(info.max, dtype) is dtype


def test_promotion_inserts_casts_and_computes_in_the_common_type():
    g = sm.Graph()
    x = g.placeholder((3,), sm.int8)
    y = g.placeholder((3,), sm.uint8)
    z = x + y
    assert z.dtype is sm.int16
    assert [op.op for op in g.operations].count("cast") == 2
    a, b = np.array([-100, 100, 7], np.int8), np.array([200, 200, 1], np.uint8)
    got = g.run({x: a, y: b}, [z], device="cpu")[z].numpy()
    np.testing.assert_array_equal(got, a.astype(np.int16) + b.astype(np.int16))


@pytest.mark.parametrize("op", ["exponent", "square_root", "division", "reduction_mean", "erf"])
@pytest.mark.parametrize("dtype", [sm.int8, sm.int64, sm.bool])
def test_float_only_ops_promote_integers_to_float32(op, dtype):
    g = sm.Graph()
    x = g.placeholder((2,), dtype)
    y = getattr(g, op)(x, x) if op == "division" else getattr(g, op)(x)
    assert y.dtype is sm.float32


@pytest.mark.parametrize("op", ["equal", "less_than", "logical_and"])
def test_comparisons_give_bool(op):
    g = sm.Graph()
    assert getattr(g, op)(g.placeholder((2,), sm.float16), g.placeholder((2,), sm.int32)).dtype is sm.bool
    assert g.is_nan(g.placeholder((2,), sm.bfloat16)).dtype is sm.bool


def test_ops_md_is_up_to_date():
    """docs/ops.md is generated from the registry and the database; regenerate it when either changes."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "ops.md")
    text = render_ops_md(OPS)
    if os.environ.get("STITCHML_REGENERATE"):
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert f.read() == text, ("docs/ops.md is out of date; run "
                                  "STITCHML_REGENERATE=1 python -m pytest tests/test_ops.py -k ops_md")


def test_known_failures_are_strict():
    """A known failure must fail; once it passes, the check says to remove the entry."""
    kf = KnownFailure("reference", reason="an example")
    with expected(kf, "a failing check"):
        raise AssertionError("still broken")
    with pytest.raises(AssertionError, match="passes now: remove the entry"):
        with expected(kf, "a fixed check"):
            pass
    record = dataclasses.replace(OPS["matrix_multiplication"],
                                 known_failures=(KnownFailure("gradient", reason="an example", sample="/unranked"),))
    assert record.known_failure("gradient", sm.float64, "matrix/unranked") is not None
    assert record.known_failure("gradient", sm.float64, "matrix") is None
    assert record.known_failure("reference", sm.float64, "matrix/unranked") is None


def test_an_implementation_that_disagrees_with_its_dtype_rule_is_reported():
    """The interpreter checks every result against the IR: a wrong dtype names the op and says why."""
    g = sm.Graph()
    x = g.placeholder((2,), sm.int8)
    bad = g._emit1("cast", [x], {"dtype": sm.int16})
    bad.op.attrs["dtype"] = sm.int32  # the implementation now produces another type than the IR says
    with pytest.raises(sm.ExecutionError, match="produced torch.int32 where the graph says int16.*disagree"):
        g.run({x: np.zeros(2, np.int8)}, [bad], device="cpu")
