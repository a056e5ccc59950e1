"""Program: what the compiler passes transform.

A Program is a standalone Graph specialised to one input signature (every
shape static), plus the list of its output tensors. It is extracted from a
user graph by `extract`: placeholders take the fed types, variables become
`variable` ops that remember which variable of the user graph they read
(attribute ``source``), and assignments stay `assign_variable` ops whose
value the executable writes back at the end of a run.

Passes rebuild programs with `rewrite`, which walks the ops in order and
lets a visitor re-emit each one (or replace it) into a fresh graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import ExecutionError, FeedError, GraphError, ShapeError
from ..graph import Graph
from ..ir import Operation, Tensor, TensorType, built_at, needed_ops
from ..registry import lookup


class CompileError(GraphError):
    """The compiler could not handle a graph (names the op and the reason)."""


@dataclass
class Program:
    graph: Graph
    outputs: list[Tensor]
    notes: dict = field(default_factory=dict)

    @property
    def operations(self) -> list[Operation]:
        return self.graph.operations

    def __str__(self) -> str:
        from ..serialize import dump_text

        outs = ", ".join(f"%{t.name}" for t in self.outputs)
        return dump_text(self.graph) + f"\noutputs: {outs}"


Visitor = Callable[[Graph, Operation, list[Tensor]], "list[Tensor] | None"]


def copy_op(g: Graph, op: Operation, inputs: list[Tensor], *, infer: bool = False) -> list[Tensor]:
    """Re-emit `op` into `g` with new inputs (types kept, or re-inferred with `infer`)."""
    types = None if infer else [t.type for t in op.outputs]
    new = g._emit(op.op, inputs, op.attrs, op.name, types=types)
    new.location, new.scope = op.location, op.scope
    return list(new.outputs)


def rewrite(program: Program, visit: Visitor | None = None, *, keep: Callable[[Operation], bool] | None = None) -> Program:
    """A new program: each op of `program` re-emitted by `visit` (None: copied as is).

    `visit(new_graph, op, mapped_inputs)` returns the op's replacement outputs,
    or None to copy it. `keep(op)` False drops an op (its outputs must be unused).
    """
    g = Graph(program.graph.name)
    mapping: dict[int, Tensor] = {}
    for op in program.operations:
        if keep is not None and not keep(op):
            continue
        try:
            inputs = [mapping[t.id] for t in op.inputs]
        except KeyError:
            raise CompileError(f"{op.op} ({op.name}) uses a value that was dropped") from None
        outs = visit(g, op, inputs) if visit is not None else None
        if outs is None:
            outs = copy_op(g, op, inputs)
        if len(outs) != len(op.outputs):
            raise CompileError(f"rewriting {op.op} ({op.name}) gave {len(outs)} outputs for {len(op.outputs)}")
        for old, new in zip(op.outputs, outs):
            mapping[old.id] = new
    return Program(g, [mapping[t.id] for t in program.outputs], dict(program.notes))


def extract(graph: Graph, feed_types: dict[Tensor, TensorType], targets: list[Tensor],
            target_ops: list[Operation]) -> Program:
    """The pruned program the targets need, re-typed for the fed types.

    Variable semantics are resolved here, statically: a `read_variable` sees
    the value at the start of the run (the variable itself), unless it has
    control dependencies, in which case it sees the value of the latest
    assignment to that variable before it in program order.
    """
    plan = needed_ops(graph.operations, [t.op for t in targets] + list(target_ops))
    fed = {t.op.id: tt for t, tt in feed_types.items()}
    missing = [op.outputs[0].name for op in plan if op.op == "placeholder" and op.id not in fed]
    if missing:
        raise FeedError(f"compile: the targets need placeholders with no feed or type: {', '.join(missing)}")
    g = Graph(graph.name)
    mapping: dict[int, Tensor] = {}
    assigned: dict[int, Tensor] = {}  # user variable op id -> latest assigned value so far
    for op in plan:
        inputs = [mapping[t.id] for t in op.inputs]
        if op.op == "read_variable":
            source = op.inputs[0].op.id
            mapping[op.outputs[0].id] = assigned[source] if op.control_deps and source in assigned else inputs[0]
            continue
        attrs = dict(op.attrs)
        if op.op == "placeholder":
            tt = fed[op.id]
            attrs = {"shape": tt.shape, "dtype": tt.dtype, "source": op.id}
        if op.op == "variable":
            attrs["source"] = op.id
        try:
            types = lookup(op.op).infer([t.type for t in inputs], **attrs)
        except ShapeError as e:  # what an op-by-op run of these feeds raises, at the line that built the op
            shapes = ", ".join(f"{t.name}: {t.shape} {t.dtype.torch}" for t in inputs)
            raise ExecutionError(f"{built_at(op)} failed on inputs [{shapes}]: "
                                 f"{e} (compiling for the given feed types)") from None
        new = g._emit(op.op, inputs, attrs, op.name, types=[types] if isinstance(types, TensorType) else types)
        new.location, new.scope = op.location, op.scope
        if op.op == "assign_variable":
            assigned[op.inputs[0].op.id] = inputs[1]
        for old, t in zip(op.outputs, new.outputs):
            mapping[old.id] = t
    return Program(g, [mapping[t.id] for t in targets])
