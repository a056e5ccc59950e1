"""prune: drop operations that no output and no assignment needs.

Requires: a verified program. Ensures: every remaining op contributes to an
output or to an `assign_variable`.
"""
from __future__ import annotations

from .program import Program, rewrite


def live_ops(program: Program) -> set[int]:
    live: set[int] = set()
    stack = [t.op for t in program.outputs] + [op for op in program.operations if op.op == "assign_variable"]
    while stack:
        op = stack.pop()
        if op.id not in live:
            live.add(op.id)
            stack.extend(t.op for t in op.inputs)
    return live


def prune(program: Program, ctx) -> Program:
    live = live_ops(program)
    if len(live) == len(program.operations):
        return program
    return rewrite(program, keep=lambda op: op.id in live)
