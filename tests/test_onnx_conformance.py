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


def test_pass_rates_meet_the_targets():
    # docs/onnx_conformance.md: 75.2% of the whole suite (the goal: 75%) and 83.0% in scope (the goal: 90%,
    # short of it by element types StitchML lacks: uint16/32/64, float8, 4-bit, strings; on the types it
    # has, the in-scope rate is over 90%).
    everything = list(conformance.node_cases())
    in_scope_rate = 1 - len(KNOWN) / len(_CASES)
    overall = (len(_CASES) - len(KNOWN)) / len(everything)  # out-of-scope cases fail at import (no handler)
    typed = [n for n, c in _CASES.items() if c.types_supported]
    typed_rate = 1 - len(set(KNOWN) & set(typed)) / len(typed)
    assert overall >= 0.75, overall
    assert in_scope_rate >= 0.829, in_scope_rate
    assert typed_rate >= 0.90, typed_rate


def test_failure_causes_group_cases():
    a = conformance.cause("import: node 'n1' (Reshape): shape [2, 3] must be known; inputs: x: float32[1]")
    b = conformance.cause("import: node 'n7' (Reshape): shape [4] must be known; inputs: y: float32[9]")
    assert a == b == "import: shape … must be known"


def test_an_operator_the_suite_lacks_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        conformance.main(["--op", "NotAnOp", "--out", "-"])
    assert exit_info.value.code == 2
    assert "no ONNX node test of that operator" in capsys.readouterr().err
