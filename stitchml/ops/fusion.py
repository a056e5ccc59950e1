"""The `fusion` primitive: a kernel made by the compiler's stitch pass.

Its `body` attribute is a Program (passes/program.py): placeholders for the
kernel's inputs, the stitched ops, and the outputs the kernel stores. The
reference implementation runs the body op by op, so a stitched program is
still an executable graph: the debugger compares a generated kernel with its
own body, and a backend without a code generator runs bodies eagerly.
"""
from __future__ import annotations

from ..ir import TensorType
from ..registry import OPAQUE, Primitive, register

fusion = register(Primitive(
    "fusion", OPAQUE, differentiable=False,
    doc="A stitched kernel: attribute `body` holds its ops, `template` how code is generated for it.",
))


@fusion.def_infer
def _fusion_infer(types, body, template, name):
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    if [t.type for t in placeholders] != list(types):
        raise ValueError("fusion: input types differ from the body's placeholders")
    return [TensorType(t.shape, t.dtype) for t in body.outputs]


@fusion.def_impl
def _fusion_impl(*inputs, body, template, name):
    from ..runtime.eager import RunContext, execute

    ctx = RunContext(body.graph, inputs[0].device if inputs else None, {}, 0)
    values = {}
    it = iter(inputs)
    for op in body.operations:
        if op.op == "placeholder":
            values[op.outputs[0].id] = next(it)
            continue
        for t, v in zip(op.outputs, execute(op, ctx, [values[x.id] for x in op.inputs])):
            values[t.id] = v
    return tuple(values[t.id] for t in body.outputs)
