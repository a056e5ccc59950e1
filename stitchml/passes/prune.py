"""prune: drop operations that no output and no assignment needs.

Requires: a verified program. Ensures: every remaining op contributes to an
output or to an `assign_variable`.
"""
from __future__ import annotations

from ..ir import needed_ops
from .program import Program, rewrite


def live_ops(program: Program) -> set[int]:
    roots = [t.op for t in program.outputs] + [op for op in program.operations if op.op == "assign_variable"]
    return {op.id for op in needed_ops(program.operations, roots)}


def prune(program: Program, ctx) -> Program:
    live = live_ops(program)
    if len(live) == len(program.operations):
        return program
    return rewrite(program, keep=lambda op: op.id in live)
