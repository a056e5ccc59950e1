"""The eager interpreter: runs a graph op by op through the registry's reference
implementations, on any torch device.

A run (docs/semantics.md):
1. check targets and feeds against the graph (FeedError before any work);
2. prune to the operations the targets and target operations need;
3. execute them in program order, checking each result against its type;
4. apply the variable assignments, in program order, at the end.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..errors import ExecutionError, FeedError, GraphError, StitchError
from ..ir import Operation, Tensor, built_at, needed_ops
from ..registry import lookup
from ..tensor_data import TensorData, resolve_device


class RunContext:
    """What stateful implementations see: the feeds, constants, variables and pending assignments."""

    def __init__(self, graph, device: torch.device, feeds: dict[int, torch.Tensor], run_index: int):
        self.graph = graph
        self.device = device
        self.feeds = feeds
        self.run_index = run_index
        self.assigned: dict[int, torch.Tensor] = {}
        self.op: Operation | None = None

    def constant(self, op: Operation) -> torch.Tensor:
        key = (op.id, str(self.device))
        cache = self.graph._constant_cache
        if key not in cache:
            cache[key] = op.attrs["value"].to(self.device)
        return cache[key]

    def variable(self, op: Operation) -> torch.Tensor:
        """The value at the start of the run; the variable moves to this run's device."""
        values = self.graph._variable_values
        value = values.get(op.id)
        if value is None:
            value = op.attrs["initial_value"].clone()
        if value.device != self.device:
            value = value.to(self.device)
        values[op.id] = value
        return value


def prune(graph, targets: Sequence[Tensor], target_ops: Sequence[Operation]) -> list[Operation]:
    """The operations the targets and target operations need, control dependencies included, in program order."""
    return needed_ops(graph.operations, [t.op for t in targets] + list(target_ops))


def check_request(graph, targets: Iterable, target_ops: Iterable) -> tuple[list[Tensor], list[Operation]]:
    if isinstance(targets, Tensor):
        targets = [targets]
    if isinstance(target_ops, Operation):
        target_ops = [target_ops]
    targets, target_ops = list(targets), list(target_ops)
    for t in targets:
        if not isinstance(t, Tensor):
            raise GraphError(f"targets must be Tensors of the graph, got {type(t).__name__}")
        if t.graph is not graph:
            raise GraphError(f"target {t.name} belongs to another graph")
    for op in target_ops:
        if not isinstance(op, Operation):
            raise GraphError(f"target_ops must be Operations (assign_variable returns one), got {type(op).__name__}")
        if op.graph is not graph:
            raise GraphError(f"target op {op.name} belongs to another graph")
    return targets, target_ops


def check_feeds(graph, feeds: dict | None, plan: list[Operation], device: torch.device) -> dict[int, torch.Tensor]:
    """Validate every feed against its placeholder and move it to `device`; keyed by op id."""
    feeds = dict(feeds or {})
    out: dict[int, torch.Tensor] = {}
    for key, value in feeds.items():
        if not isinstance(key, Tensor) or key.graph is not graph:
            raise FeedError(f"feed keys must be placeholders of this graph, got {key!r}")
        if key.op.op != "placeholder":
            raise FeedError(f"feed key {key.name} is the output of {key.op.op}; only placeholders can be fed")
        try:
            data = value if isinstance(value, TensorData) else TensorData(value)
        except (TypeError, ValueError) as e:
            raise FeedError(f"feed for placeholder {key.name}: {e}") from None
        if data.dtype != key.dtype:
            raise FeedError(f"feed for placeholder {key.name}: expected dtype {key.dtype}, got {data.dtype}")
        if not key.type.accepts(data.shape):
            raise FeedError(f"feed for placeholder {key.name}: expected shape {key.type}, got {data.shape}"
                            f" (rank {data.rank})")
        out[key.op.id] = data.torch().to(device)
    missing = [op.outputs[0].name for op in plan if op.op == "placeholder" and op.id not in out]
    if missing:
        raise FeedError(f"the targets need placeholders with no feed: {', '.join(missing)}")
    return out


def execute(op: Operation, ctx: RunContext, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Run one operation's reference implementation and check its results against the IR."""
    prim = lookup(op.op)
    ctx.op = op
    try:
        if prim.impl is None:
            raise NotImplementedError(f"{op.op} has no reference implementation")
        out = prim.impl(ctx, *inputs, **op.attrs) if prim.needs_context else prim.impl(*inputs, **op.attrs)
    except StitchError:
        raise
    except Exception as e:
        shapes = ", ".join(f"{t.name}: {tuple(v.shape)} {v.dtype}" for t, v in zip(op.inputs, inputs))
        raise ExecutionError(f"{built_at(op)} failed on inputs [{shapes}]: {e}") from e
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(op.outputs):
        raise ExecutionError(f"{op.op} ({op.name}) returned {len(outs)} results for {len(op.outputs)} outputs")
    for t, v in zip(op.outputs, outs):
        if v.dtype != t.dtype.torch:
            raise ExecutionError(
                f"{built_at(op)} produced {v.dtype} where the graph says {t.type}: "
                f"the op's implementation and its shape-and-dtype rule disagree"
            )
        if not t.type.accepts(tuple(v.shape)):
            raise ExecutionError(
                f"{built_at(op)} produced {tuple(v.shape)} {v.dtype} where the graph "
                f"says {t.type}: an unknown extent did not match at run time"
            )
    return outs


def run_graph(graph, feeds, targets, target_ops, device) -> dict[Tensor, TensorData]:
    device = resolve_device(device)
    targets, target_ops = check_request(graph, targets, target_ops)
    plan = prune(graph, targets, target_ops)
    fed = check_feeds(graph, feeds, plan, device)
    with graph._run_lock:
        ctx = RunContext(graph, device, fed, graph.run_count)
        values: dict[int, torch.Tensor] = {}
        for op in plan:
            outs = execute(op, ctx, [values[t.id] for t in op.inputs])
            for t, v in zip(op.outputs, outs):
                values[t.id] = v
        for var_id, value in ctx.assigned.items():
            graph._variable_values[var_id] = value.clone(memory_format=torch.contiguous_format)
        graph.run_count += 1
        held = list(graph._variable_values.values()) + list(graph._constant_cache.values())
        state = {v.untyped_storage().data_ptr() for v in held} - {0}
    results = {}
    for t in targets:
        v = values[t.id]
        # Callers may write into results: never hand out the memory of a constant or variable.
        if v.untyped_storage().data_ptr() in state:
            v = v.clone()
        results[t] = TensorData._wrap(v)
    return results

