"""The op database is the one source of per-op test facts: every registered primitive has a record that
the compiler fuzzer and the compiled sample graphs can use, or a reasoned exclusion in tests/opdb/coverage.py.

A new primitive without a record, a record without a `fuzz`, a `fuzz` the fuzzer cannot carry out, or an
input domain the compiled sample graphs cannot feed, fails here by name, instead of going silently
untested. Exclusions that no longer apply fail too.
"""
from __future__ import annotations

import pytest

import stitchml as sm
from stitchml.registry import ELEMENTWISE, REGISTRY

import test_fuzz_compiler as fuzzer
from compiler_util import ELEMENTWISE_DTYPES, OPERAND_DTYPES, _builds, _elementwise, operands
from opdb import OPS
from opdb.coverage import NO_RECORD, NOT_COMPILED, NOT_FUZZED

PRIMITIVES = sorted(REGISTRY)
ELEMENTWISE_OPS = [n for n in PRIMITIVES if REGISTRY[n].kind == ELEMENTWISE and n != "cast"]


@pytest.mark.parametrize("name", PRIMITIVES)
def test_every_primitive_has_a_record_the_fuzzer_and_compiled_cases_use(name):
    if name in NO_RECORD:
        assert name not in OPS, f"{name} has an opdb record now: remove it from NO_RECORD in tests/opdb/coverage.py"
        return
    assert name in OPS, (f"primitive {name!r} has no opdb record: add one to its family's module in tests/opdb "
                         f"(or, with the reason, to NO_RECORD in tests/opdb/coverage.py)")
    record = OPS[name]
    if name in NOT_FUZZED:
        assert record.fuzz is None, f"{name} has a `fuzz` now: remove it from NOT_FUZZED in tests/opdb/coverage.py"
    else:
        assert record.fuzz is not None, (f"{name}: the compiler fuzzer does not draw it; give its record a `fuzz` "
                                         f"(tests/opdb/core.py, Fuzz) or list it with the reason in NOT_FUZZED")
    if name in NOT_COMPILED:
        assert record.ref is None, f"{name} has a reference now: remove it from NOT_COMPILED in tests/opdb/coverage.py"
    else:
        assert record.ref is not None, (f"{name}: the compiled sample graphs need its record's reference; add one or "
                                        f"list it with the reason in NOT_COMPILED")


def test_exclusions_name_registered_primitives():
    stale = sorted((set(NO_RECORD) | set(NOT_FUZZED) | set(NOT_COMPILED)) - set(REGISTRY))
    assert not stale, f"tests/opdb/coverage.py lists ops that are not registered primitives: {stale}"


def _tables() -> dict:
    """Where the fuzzer looks up each role's ops."""
    return {"unary": fuzzer.UNARY, "binary": fuzzer.BINARY, "jump": fuzzer.JUMPS + fuzzer.JUMP_BINARY,
            "reduction": fuzzer.REDUCTIONS, "move": fuzzer.MOVES}


@pytest.mark.parametrize("name", [n for n in OPS if OPS[n].fuzz is not None])
def test_fuzz_spec_is_one_the_fuzzer_can_carry_out(name):
    spec = OPS[name].fuzz
    assert name in REGISTRY, f"{name}: only registered primitives are fuzzed (composites are built of them)"
    if spec.role in fuzzer.BUILT_IN:
        assert fuzzer.BUILT_IN[spec.role] == name, f"{name}: the fuzzer builds role {spec.role!r} only for " \
                                                   f"{fuzzer.BUILT_IN[spec.role]}"
        return
    assert name in _tables()[spec.role], f"{name}: role {spec.role!r}, yet not in the fuzzer's table of that role"
    arity = {"unary": 1, "binary": 2, "jump": operands(name), "reduction": 1, "move": 1}[spec.role]
    assert len(spec.fit) in (0, arity) and len(spec.guards) in (0, arity), \
        f"{name}: fit {spec.fit} and guards {spec.guards} need one entry per operand ({arity})"
    unknown = [g for g in spec.guards if g is not None and g not in fuzzer.GRAPH_GUARDS]
    assert not unknown, f"{name}: guards {unknown} unknown; the fuzzer applies {fuzzer.GRAPH_GUARDS}"
    if spec.role == "unary":
        assert spec.lipschitz and spec.bound, f"{name}: a smooth unary op needs `lipschitz` and `bound`"
        lipschitz, bound = spec.lipschitz(2.0), spec.bound(2.0)
        assert lipschitz >= 0 and bound >= 0, f"{name}: lipschitz {lipschitz}, bound {bound} on |x| <= 2"
    if spec.role in ("binary", "reduction"):
        assert spec.propagate, f"{name}: role {spec.role!r} needs `propagate`"
    if spec.role == "move":
        assert name in fuzzer.MOVE_APPLIES, f"{name}: the fuzzer draws no arguments for it (MOVE_APPLIES)"
    if spec.role == "jump" and operands(name) == 1:
        assert not spec.exact and not spec.rounded, f"{name}: jumps are exact by taking exact operands"
    accepted = [dt for dt in (sm.float32, sm.int32, sm.bool) if fuzzer._accepts(name, *[dt] * arity)] \
        if spec.role in ("unary", "binary", "jump") else [sm.float32]
    assert sm.float32 in accepted, f"{name}: its builder refuses float32 operands, so the fuzzer never draws it"


@pytest.mark.parametrize("name", ELEMENTWISE_OPS)
def test_compiled_cases_can_feed_the_record(name):
    """The compiled sample graphs (compiler_util.elementwise_cases) draw each operand from the record's
    domains, avoid zero for its `nonzero` operand, and cover every dtype the record claims that they sample."""
    record, arity = OPS[name], operands(name)
    assert len(record.domains) <= arity, f"{name}: {len(record.domains)} domains for {arity} operands"
    for low, high in record.domains:
        assert low < high, f"{name}: empty domain [{low}, {high})"
    assert record.nonzero is None or 0 <= record.nonzero < arity, f"{name}: nonzero operand {record.nonzero}"
    claimed = [dt for dt in ELEMENTWISE_DTYPES if dt in record.dtypes]
    refused = [str(dt) for dt in claimed if not _builds(_elementwise(name, dt).build)]
    assert not refused, (f"{name}: its record claims {refused}, but its compiled case does not build there "
                         f"(operand dtypes {OPERAND_DTYPES.get(name, {})})")


def test_every_move_is_drawn():
    """Each movement op the fuzzer lists is drawn with arguments of its own (not some other move's)."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    seen = set()

    @settings(max_examples=300, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        seen.add(data.draw(fuzzer._movement((2, 1, 3)))[0])

    draw()
    assert seen == set(fuzzer.MOVES), f"never drawn: {sorted(set(fuzzer.MOVES) - seen)}"
