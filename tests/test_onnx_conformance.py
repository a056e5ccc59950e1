"""The ONNX project's backend node tests, through the importer and the eager executor, as `stitchml conformance
onnx` runs them (no input bound at import time).

Every in-scope case (each operator of its model is in the importer's table) must pass unless
docs/onnx_conformance.md lists it under "Failures in scope", and each listed case must still fail: a fix
shows up as an unexpected pass, and the report is regenerated with `stitchml conformance onnx`.
"""
import os
import re

import pytest

from stitchml.package import conformance

_DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "onnx_conformance.md")


def _known_failures() -> dict[str, str]:
    text = open(_DOC).read().split("## Failures in scope", 1)[1]
    return dict(re.findall(r"^- `(\w+)` \(\w+\): (.*)$", text, re.M))


KNOWN = _known_failures()
_CASES = {c.name: c for c in conformance.cases_for(in_scope_only=True)}


@pytest.mark.parametrize("name", sorted(_CASES))
def test_node(name):
    failure = conformance.check(_CASES[name])
    if name in KNOWN:
        assert failure is not None, f"{name} passes now; regenerate docs/onnx_conformance.md"
    else:
        assert failure is None, failure


def test_known_failures_are_in_scope_cases():
    assert set(KNOWN) <= set(_CASES)


def test_pass_rates_do_not_fall():
    # The rates docs/onnx_conformance.md reports (83.4% in scope, 66.9% overall with onnx 1.23.2); the goals
    # are 90% and 75%, short of them by element types StitchML lacks (uint16/32/64, float8, 4-bit, strings)
    # and operators still missing (docs/packages.md lists them).
    everything = list(conformance.node_cases())
    in_scope_rate = 1 - len(KNOWN) / len(_CASES)
    overall = (len(_CASES) - len(KNOWN)) / len(everything)  # out-of-scope cases fail at import (no handler)
    assert in_scope_rate >= 0.834, in_scope_rate
    assert overall >= 0.668, overall


def test_failure_causes_group_cases():
    a = conformance.cause("import: node 'n1' (Reshape): shape [2, 3] must be known; inputs: x: float32[1]")
    b = conformance.cause("import: node 'n7' (Reshape): shape [4] must be known; inputs: y: float32[9]")
    assert a == b == "import: shape … must be known"
