"""Every kernel boundary has a reason: each edge between two steps of a compiled sample graph (a kernel, a
vendor call, a gather, a scatter, a view...) appears in `Executable.boundaries` with the refusal or the fact
that keeps the two apart, and `fusion_report()` prints it. Checked on every sample graph of the compiler
tests and of the op database, so a new op kind cannot bring back a silent boundary."""
from __future__ import annotations

import pytest

import stitchml as sm
from compiler_util import (Case, Feeds, composite_cases, contraction_cases, from_opdb, opaque_cases, reduction_cases,
                           seeded, size_cases, view_cases)
from stitchml.passes.boundaries import SILENT

_SOURCES = ("placeholder", "constant", "variable", "assign_variable")


def _edges(program) -> set[tuple[str, str, str]]:
    """(producer step, consumer step, tensor) for every value one step of the stitched program reads from
    another, read off the program itself (kernels are its `fusion` ops)."""
    edges = set()
    for op in program.operations:
        if op.op in _SOURCES:
            continue
        for t in op.inputs:
            if t.op.op not in _SOURCES:
                edges.add((t.op.name, op.name))
    return edges


def _compile(case: Case):
    g = sm.Graph(case.name)
    feeds = Feeds(g, seeded(case.name))
    targets = list(case.build(g, feeds))
    return g.compile(feeds, targets, device="cpu", options={"backend": "reference"})


def _check(cases: list[Case]) -> int:
    """Check every case; the number of boundaries seen."""
    seen = 0
    for case in cases:
        try:
            exe = _compile(case)
        except sm.StitchError:  # samples that refuse to compile (empty axes...) have no boundaries
            continue
        explained = {(b["producer"], b["consumer"]) for b in exe.boundaries}
        silent = [b for b in exe.boundaries if b["reason"] == SILENT or not b["reason"]]
        assert not silent, f"{case.name}: boundaries without a reason: {silent}\n{exe.fusion_report()}"
        missing = _edges(exe.program) - explained
        assert not missing, f"{case.name}: edges between steps not in the report: {missing}\n{exe.fusion_report()}"
        report = exe.fusion_report()
        for b in exe.boundaries:
            assert f"boundary {b['producer']} -> {b['consumer']} ({b['tensor']}): {b['reason']}" in report
        seen += len(exe.boundaries)
    return seen


def _multi_step_cases() -> list[Case]:
    # the elementwise samples are one kernel each: no boundaries to check
    return reduction_cases() + composite_cases() + contraction_cases() + view_cases() + opaque_cases() + size_cases()


def test_every_boundary_of_the_compiler_samples_has_a_reason():
    assert _check(_multi_step_cases()) > 20


def test_every_boundary_of_the_op_database_samples_has_a_reason():
    from opdb import OPS

    # every record's samples in its first dtype: each op kind, at each of its sample shapes
    cases = [from_opdb(r, r.dtypes[0], i, s) for r in OPS.values() if r.ref is not None
             for i, s in enumerate(r.samples_for(r.dtypes[0]))]
    assert len(cases) > 500
    assert _check(cases) > 50


def test_a_silent_boundary_fails_the_check(monkeypatch):
    from stitchml.passes import boundaries

    monkeypatch.setattr(boundaries, "_alone", lambda op: None)
    with pytest.raises(AssertionError, match="without a reason"):
        _check([c for c in opaque_cases() if c.name == "gather"])
