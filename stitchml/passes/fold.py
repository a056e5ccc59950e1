"""fold: evaluate operations whose inputs are all constants.

Requires: static types. Ensures: no pure op with only constant inputs and a
small result remains (large results stay ops, so folding never bloats the
program with data a kernel could compute on the fly).
"""
from __future__ import annotations

from ..registry import RANDOM, STATE, lookup
from .program import Program, rewrite

FOLD_LIMIT = 1 << 16  # elements


def is_constant(t) -> bool:
    return t.op.op == "constant"


def constant_value(t):
    return t.op.attrs["value"]


def fold(program: Program, ctx) -> Program:
    def visit(g, op, inputs):
        prim = lookup(op.op)
        if (not inputs or prim.kind in (STATE, RANDOM) or prim.needs_context or len(op.outputs) != 1
                or not all(is_constant(t) for t in inputs) or op.outputs[0].type.numel() > FOLD_LIMIT):
            return None
        try:
            value = prim.impl(*[constant_value(t) for t in inputs], **op.attrs)
        except Exception:  # noqa: BLE001  (left to the run, which raises it naming the op and its line)
            return None
        return [g.constant(value.detach().cpu().contiguous().clone(), name=op.name)]

    return rewrite(program, visit)
