"""verify: the program is well formed.

Requires: nothing. Ensures: every op is in the registry, inputs are defined
before use, every output type equals what the op's rule infers from its
inputs, and every shape is static (a program is specialised to one signature).
"""
from __future__ import annotations

from ..errors import ShapeError
from ..ir import TensorType, built_at
from ..registry import REGISTRY
from .program import CompileError, Program


def verify(program: Program, ctx) -> Program:
    defined: set[int] = set()
    for op in program.operations:
        where = built_at(op)
        prim = REGISTRY.get(op.op)
        if prim is None:
            raise CompileError(f"verify: {where}: unknown op")
        for t in op.inputs:
            if t.id not in defined:
                raise CompileError(f"verify: {where}: input {t.name} is used before it is defined")
        try:
            inferred = prim.infer([t.type for t in op.inputs], **op.attrs)
        except ShapeError as e:
            raise CompileError(f"verify: {where}: {e}") from None
        inferred = [inferred] if isinstance(inferred, TensorType) else list(inferred)
        actual = [t.type for t in op.outputs]
        if inferred != actual:
            raise CompileError(f"verify: {where}: outputs {[str(t) for t in actual]} but the rule gives "
                               f"{[str(t) for t in inferred]}")
        for t in op.outputs:
            if not t.type.is_static:
                raise CompileError(f"verify: {where}: output {t.name} has type {t.type}, not static after "
                                   "specialisation to the feed types")
            defined.add(t.id)
    for t in program.outputs:
        if t.id not in defined:
            raise CompileError(f"verify: output {t.name} is not computed by the program")
    return program
