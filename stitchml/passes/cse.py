"""cse: compute identical pure operations once.

Requires: nothing. Ensures: no two pure ops share op name, inputs and
attributes; small constants with equal values are merged. Random and state
ops are never merged (two draws are two draws).
"""
from __future__ import annotations

import torch

from ..registry import RANDOM, STATE, lookup
from .program import Program, copy_op, rewrite

_CONSTANT_LIMIT = 64  # elements: larger constants are compared by identity only


def _attr_key(v):
    if isinstance(v, torch.Tensor):
        if v.numel() <= _CONSTANT_LIMIT:
            return ("tensor", str(v.dtype), tuple(v.shape), tuple(v.flatten().tolist()))
        return ("tensor-id", id(v))
    if isinstance(v, dict):
        return tuple(sorted((k, _attr_key(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    return repr(v)


def _mergeable(op) -> bool:
    prim = lookup(op.op)
    return bool(op.outputs) and prim.kind != RANDOM and (prim.kind != STATE or op.op == "constant")


def cse(program: Program, ctx) -> Program:
    seen: dict = {}

    def visit(g, op, inputs):
        if not _mergeable(op):
            return None
        key = (op.op, tuple(t.id for t in inputs), _attr_key(op.attrs))
        if key not in seen:
            seen[key] = copy_op(g, op, inputs)
        return seen[key]

    return rewrite(program, visit)
