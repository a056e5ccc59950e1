"""Control flow in the graph (MPSGraph's if/then/else, while and for loops).

Each op holds its sub-graphs as attributes, the way a stitched kernel holds
its `body` (fusion.py): a `Body` is a nested Graph whose placeholders are its
inputs, in order (the block arguments, then the tensors of enclosing graphs
it reads, its `captures`), and whose `outputs` are what the block returns.
The op's inputs are the operands followed by each body's captures, so the
IR stays flat dataflow: passes, pruning and serialisation see every value
a body reads.

* ``if_then_else(predicate, then_fn, else_fn)``: a scalar bool picks a branch;
  both branches return the same number of tensors, of one dtype each.
* ``while_loop(initial, before_fn, after_fn)``: ``before_fn(*carried)`` returns
  ``(predicate, results)``; while the predicate holds, ``after_fn(*results)``
  gives the next carried values (their types are the initial ones); when it
  fails, `results` are the op's outputs.
* ``for_loop(lower, upper, step, initial, body_fn)``: for ``i = lower;
  i < upper; i += step`` (int32 scalars, step > 0) ``body_fn(i, *carried)``
  gives the next carried values; the last ones are the outputs.

Bodies are pure functions of their inputs: no placeholders of their own, no
variables and no random draws (draw before the loop and index the draws by
the iteration). Gradients flow through all three: the for loop's rule runs
the transposed body backwards over the carried values each iteration
started from, which a second forward loop stores (`history`) when the bounds
are known while building, and which are recomputed from the initial values
otherwise (see `_history`); the while loop's counts its iterations first,
then does the same with recomputed values.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from .. import dtypes
from ..errors import GraphError, ShapeError
from ..ir import UNKNOWN, Tensor, TensorType
from ..registry import OPAQUE, RANDOM, Primitive, builder, register

_FORBIDDEN = {"variable": "a variable", "assign_variable": "an assignment", "read_variable": "a variable read"}


class Body:
    """A control-flow op's sub-graph: placeholders (its inputs, in order), then its ops; `outputs` it returns."""

    __slots__ = ("graph", "outputs")

    def __init__(self, graph, outputs: Sequence[Tensor]):
        self.graph = graph
        self.outputs = list(outputs)

    @property
    def operations(self):
        return self.graph.operations

    @property
    def inputs(self) -> list[Tensor]:
        return [op.outputs[0] for op in self.graph.operations if op.op == "placeholder"]

    @property
    def in_types(self) -> list[TensorType]:
        return [t.type for t in self.inputs]

    @property
    def out_types(self) -> list[TensorType]:
        return [t.type for t in self.outputs]

    def __repr__(self) -> str:
        # The identity is part of it: passes compare attributes by repr (cse), and two blocks of one shape
        # are still two blocks.
        return (f"<block {self.graph.name}: {len(self.inputs)} inputs, {len(self.operations)} operations, "
                f"{len(self.outputs)} outputs, at {id(self):#x}>")


def _as_list(result: Any) -> tuple[list, bool]:
    """A block's return value as a list, and whether it was a single value (then the op returns one too)."""
    if isinstance(result, (list, tuple)):
        return list(result), False
    return [result], True


def build_body(g, name: str, arg_types: Sequence[TensorType], fn: Callable, what: str,
               arg_names: Sequence[str] = ()) -> tuple[Body, list[Tensor], bool]:
    """Build `fn(*args)` into a new sub-graph of `g`'s innermost graph.

    Returns the body, the outer tensors it captures (the op's extra inputs) and whether `fn` returned
    a single value. `what` names the block in errors ("for_loop body").
    """
    if not callable(fn):
        raise GraphError(f"{what}: expected a function building the block, got {type(fn).__name__}")
    sub = g.innermost().subgraph(name)
    args = [sub._append("placeholder", [], {"shape": tt.shape, "dtype": tt.dtype},
                        arg_names[i] if i < len(arg_names) else f"{name}_arg{i}", None).outputs[0]
            for i, tt in enumerate(arg_types)]
    with g.building(sub):
        result, single = _as_list(fn(*args))
        outputs = [sub.as_tensor(v) if isinstance(v, (Tensor, bool, int, float)) else v for v in result]
    for i, t in enumerate(outputs):
        if not isinstance(t, Tensor):
            raise GraphError(f"{what}: result {i} is a {type(t).__name__}; a block returns tensors")
    inputs = {t.id for t in args} | {t.id for t in sub._captured.values()}
    for op in sub.operations:
        reason = "a random draw" if op.primitive.kind == RANDOM else _FORBIDDEN.get(op.op)
        if op.op == "placeholder" and op.outputs[0].id not in inputs:
            reason = "a placeholder"
        if reason:
            raise GraphError(f"{what}: {op.op} ({op.name}, built at {op.location}) is {reason}; a block is a pure "
                             f"function of its arguments and the tensors it reads (draw random values before "
                             f"the loop and index them by the iteration; feed placeholders outside)")
    # Placeholders first: the arguments, then the captures (their order of capture). They read nothing,
    # so moving them up keeps the operations in dependency order.
    placeholders = [op for op in sub.operations if op.op == "placeholder"]
    sub.operations[:] = placeholders + [op for op in sub.operations if op.op != "placeholder"]
    return Body(sub, outputs), list(sub.captures), single


def _join(a: TensorType, b: TensorType, what: str) -> TensorType:
    """The type that holds both `a` and `b` (extents that differ become unknown); ShapeError if none."""
    if a.dtype != b.dtype:
        raise ShapeError(f"{what}: dtype {a.dtype} differs from {b.dtype}")
    if a.shape is None or b.shape is None:
        return TensorType(None, a.dtype)
    if len(a.shape) != len(b.shape):
        raise ShapeError(f"{what}: rank {len(a.shape)} ({a}) differs from rank {len(b.shape)} ({b})")
    return TensorType(tuple(x if x == y else UNKNOWN for x, y in zip(a.shape, b.shape)), a.dtype)


def _fits(value: TensorType, slot: TensorType, what: str) -> None:
    """`value` may flow into `slot` (a loop-carried type): same dtype, and no extent known to differ."""
    if value.dtype != slot.dtype:
        raise ShapeError(f"{what}: expected {slot}, found {value} (dtype {value.dtype} is not {slot.dtype})")
    if value.shape is None or slot.shape is None:
        return
    if len(value.shape) != len(slot.shape) or any(
            v != s and UNKNOWN not in (v, s) for v, s in zip(value.shape, slot.shape)):
        raise ShapeError(f"{what}: expected {slot}, found {value}")


def _scalar(tt: TensorType, dtype, what: str) -> None:
    if tt.dtype != dtype or tt.shape not in ((), None):
        raise ShapeError(f"{what} must be a scalar {dtype}, found {tt}")


def _check_inputs(body: Body, types: Sequence[TensorType], what: str) -> None:
    if len(types) != len(body.inputs):
        raise ShapeError(f"{what} takes {len(body.inputs)} inputs, the op gives it {len(types)}")
    for i, (given, want) in enumerate(zip(types, body.in_types)):
        _fits(given, want, f"{what} input {i}")


def run_body(body: Body, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run a body op by op through the reference implementations (the eager interpreter's `execute`)."""
    from ..runtime.eager import RunContext, execute

    ctx = RunContext(body.graph, inputs[0].device if inputs else torch.device("cpu"), {}, 0)
    values: dict[int, torch.Tensor] = {}
    it = iter(inputs)
    for op in body.operations:
        if op.op == "placeholder":
            values[op.outputs[0].id] = next(it)
            continue
        for t, v in zip(op.outputs, execute(op, ctx, [values[x.id] for x in op.inputs])):
            values[t.id] = v
    return [values[t.id] for t in body.outputs]


def _single(values: list, single: bool):
    return values[0] if single else values


def _int32(g, value, what: str) -> Tensor:
    t = g.as_tensor(value, dtypes.int32) if not isinstance(value, Tensor) else g.as_tensor(value)
    if t.dtype != dtypes.int32 or t.shape not in ((), None):
        raise g._error("for_loop", f"{what} must be a scalar int32 (a Python int or an int32 tensor), found {t.type}",
                       [t])
    return t


# -- if_then_else ---------------------------------------------------------------------------------
if_then_else = register(Primitive(
    "if_then_else", OPAQUE,
    doc="Runs `then_body` when the scalar bool predicate holds, else `else_body`; returns the branch's results.",
))


@if_then_else.def_infer
def _if_infer(types, then_body, else_body):
    _scalar(types[0], dtypes.bool_, "the predicate")
    n_then = len(then_body.inputs)
    _check_inputs(then_body, types[1:1 + n_then], "then_fn")
    _check_inputs(else_body, types[1 + n_then:], "else_fn")
    a, b = then_body.out_types, else_body.out_types
    if len(a) != len(b):
        raise ShapeError(f"then_fn returns {len(a)} tensors and else_fn {len(b)}; both branches must return as many")
    return [_join(x, y, f"result {i} of the branches") for i, (x, y) in enumerate(zip(a, b))]


@if_then_else.def_impl
def _if_impl(predicate, *inputs, then_body, else_body):
    n_then = len(then_body.inputs)
    if bool(predicate):
        return tuple(run_body(then_body, inputs[:n_then]))
    return tuple(run_body(else_body, inputs[n_then:]))


@builder("if_then_else")
def _if_then_else(g, predicate, then_fn: Callable, else_fn: Callable, name: str | None = None):
    """``then_fn() if predicate else else_fn()`` inside the graph (MPSGraph if/then/else).

    The functions take no arguments and build with `g` (or Tensor operators) on any tensor of the
    graph; they return a tensor or a list of tensors, the same number of the same dtypes.

    >>> import stitchml as sm; g = sm.Graph(); x = g.constant([1.0, -2.0])
    >>> y = g.if_then_else(g.reduction_sum(x) > 0.0, lambda: x * 2.0, lambda: -x)
    >>> g.run({}, [y], device="cpu")[y].numpy().tolist()
    [-1.0, 2.0]
    """
    predicate = g.as_tensor(predicate)
    if predicate.dtype != dtypes.bool_ or predicate.shape not in ((), None):
        raise g._error("if_then_else", f"the predicate must be a scalar bool, found {predicate.type}", [predicate])
    then_body, then_in, single = build_body(g, "then", [], then_fn, "if_then_else then_fn")
    else_body, else_in, _ = build_body(g, "else", [], else_fn, "if_then_else else_fn")
    inputs = [predicate, *then_in, *else_in]
    op = g._emit("if_then_else", inputs, {"then_body": then_body, "else_body": else_body}, name)
    return _single(list(op.outputs), single)


# -- while_loop -----------------------------------------------------------------------------------
while_loop = register(Primitive(
    "while_loop", OPAQUE,
    doc="`before_body` gives (predicate, results) from the carried values; while the predicate holds "
        "`after_body` gives the next carried values from the results; the last results are the outputs.",
))


@while_loop.def_infer
def _while_infer(types, before_body, after_body):
    n = len(after_body.outputs)
    carried = list(types[:n])
    n_before = len(before_body.inputs) - n
    _check_inputs(before_body, carried + list(types[n:n + n_before]), "before_fn")
    outs = before_body.out_types
    if not outs:
        raise ShapeError("before_fn must return (predicate, results)")
    _scalar(outs[0], dtypes.bool_, "the predicate before_fn returns")
    _check_inputs(after_body, outs[1:] + list(types[n + n_before:]), "after_fn")
    for i, (got, want) in enumerate(zip(after_body.out_types, carried)):
        _fits(got, want, f"after_fn result {i} (the loop-carried value {i})")
    return [TensorType(t.shape, t.dtype) for t in outs[1:]]


@while_loop.def_impl
def _while_impl(*inputs, before_body, after_body):
    n = len(after_body.outputs)
    n_before = len(before_body.inputs) - n
    carried, before_in, after_in = list(inputs[:n]), inputs[n:n + n_before], inputs[n + n_before:]
    while True:
        predicate, *results = run_body(before_body, carried + list(before_in))
        if not bool(predicate):
            return tuple(results)
        carried = run_body(after_body, results + list(after_in))


@builder("while_loop")
def _while_loop(g, initial, before_fn: Callable, after_fn: Callable, name: str | None = None):
    """MPSGraph's while loop: ``while True: p, r = before_fn(*v); if not p: return r; v = after_fn(*r)``.

    `initial` is a tensor or a list of them (the carried values); `before_fn` returns ``(predicate,
    results)`` with a scalar bool predicate and a tensor or list of them; `after_fn` takes the results and
    returns the next carried values, of the initial values' types. The loop returns the results in the
    form `before_fn` gave them (a tensor, or a list).

    >>> import stitchml as sm; g = sm.Graph()
    >>> y = g.while_loop(g.constant(1.0), lambda v: (v < 100.0, v), lambda v: v * 3.0)
    >>> g.run({}, [y], device="cpu")[y].numpy().tolist()
    243.0
    """
    initial, _ = _as_list(initial)
    initial = [g.as_tensor(v) for v in initial]
    form = []

    def before(*carried):
        out = before_fn(*carried)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise GraphError(f"while_loop before_fn: expected it to return (predicate, results), got {out!r}")
        results, single = _as_list(out[1])
        form.append(single)
        return [out[0], *results]

    before_body, before_in, _ = build_body(g, "before", [t.type for t in initial], before, "while_loop before_fn")
    after_body, after_in, _ = build_body(g, "after", before_body.out_types[1:], after_fn, "while_loop after_fn")
    inputs = [*initial, *before_in, *after_in]
    op = g._emit("while_loop", inputs, {"before_body": before_body, "after_body": after_body}, name)
    return _single(list(op.outputs), form[0])


# -- for_loop -------------------------------------------------------------------------------------
for_loop = register(Primitive(
    "for_loop", OPAQUE,
    doc="For i = lower; i < upper; i += step: the carried values become `body`(i, carried...); returns the "
        "last ones (and with `history`, the trip count or -1, each carried value at the start of every "
        "iteration, stacked).",
))


@for_loop.def_infer
def _for_infer(types, body, history):
    for tt, what in zip(types[:3], ("lower", "upper", "step")):
        _scalar(tt, dtypes.int32, what)
    n = len(body.outputs)
    carried = list(types[3:3 + n])
    _check_inputs(body, [TensorType((), dtypes.int32)] + list(types[3:]), "body_fn")
    for i, (got, want) in enumerate(zip(body.out_types, carried)):
        _fits(got, want, f"body_fn result {i} (the loop-carried value {i})")
    outs = [TensorType(t.shape, t.dtype) for t in carried]
    if history is not None:
        outs += [TensorType(None if t.shape is None else (int(history),) + t.shape, t.dtype) for t in carried]
    return outs


def trip_count(lower: int, upper: int, step: int) -> int:
    """How many times ``for i = lower; i < upper; i += step`` runs; ValueError for a step that is not positive."""
    if step <= 0:
        raise ValueError(f"the step must be positive, got {step}")
    return max(0, -(-(upper - lower) // step))


@for_loop.def_impl
def _for_impl(lower, upper, step, *inputs, body, history):
    n = len(body.outputs)
    lo, count, st = int(lower), trip_count(int(lower), int(upper), int(step)), int(step)
    carried, captured = list(inputs[:n]), list(inputs[n:])
    if history not in (None, UNKNOWN, count):
        raise ValueError(f"the loop was built to run {history} times, its bounds give {count}")
    kept: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for k in range(count):
        if history is not None:
            for h, v in zip(kept, carried):
                h.append(v)
        index = torch.tensor(lo + k * st, dtype=torch.int32, device=lower.device)
        carried = run_body(body, [index, *carried, *captured])
    if history is None:
        return tuple(carried)
    stacked = [torch.stack(h) if h else torch.empty((0, *x.shape), dtype=x.dtype, device=x.device)
               for h, x in zip(kept, inputs[:n])]
    return (*carried, *stacked)


@builder("for_loop")
def _for_loop(g, lower, upper, step, initial, body_fn: Callable, name: str | None = None):
    """MPSGraph's for loop: ``for i in range(lower, upper, step): v = body_fn(i, *v)``; returns the last `v`.

    `lower`, `upper` and `step` are Python ints or scalar int32 tensors (step > 0, checked when it runs);
    `initial` is a tensor or a list of them; `body_fn(i, *carried)` gets the int32 index and returns the
    next carried values, of the initial values' types (a tensor or a list, as `initial` is).

    >>> import stitchml as sm; g = sm.Graph()
    >>> y = g.for_loop(0, 4, 1, g.constant(1.0), lambda i, v: v * 2.0 + g.cast(i, sm.float32))
    >>> g.run({}, [y], device="cpu")[y].numpy().tolist()
    27.0
    """
    if isinstance(step, int) and step <= 0:
        raise g._error("for_loop", f"the step must be positive, got {step}")
    bounds = [_int32(g, v, what) for v, what in ((lower, "lower"), (upper, "upper"), (step, "step"))]
    initial, single = _as_list(initial)
    initial = [g.as_tensor(v) for v in initial]
    names = ["index"] + [f"carried{i}" for i in range(len(initial))]
    body, captured, _ = build_body(g, "body", [TensorType((), dtypes.int32)] + [t.type for t in initial], body_fn,
                                   "for_loop body_fn", names)
    op = g._emit("for_loop", [*bounds, *initial, *captured], {"body": body, "history": None}, name)
    return _single(list(op.outputs), single)


# -- gradients --------------------------------------------------------------------------------------
def inline(g, body: Body, inputs: Sequence[Tensor]) -> list[Tensor]:
    """Build a copy of `body`'s ops into `g` on `inputs` (tensors of `g`); returns its outputs there."""
    values = {t.id: x for t, x in zip(body.inputs, inputs)}
    for op in body.operations:
        if op.op == "placeholder":
            continue
        new = g._emit(op.op, [values[t.id] for t in op.inputs], op.attrs)
        for t, v in zip(op.outputs, new.outputs):
            values[t.id] = v
    return [values[t.id] for t in body.outputs]


def _zeros(g, like: Tensor) -> Tensor:
    return g.broadcast_to(g.constant(0.0, like.dtype), like)


def _transposed(g, build: Callable, inputs: Sequence[Tensor], cotangents: dict[int, Tensor], wrt: Sequence[int]
                ) -> list[Tensor]:
    """In the graph being built (`g.innermost()`): the gradients of ``sum_i <build(sub, inputs)[i],
    cotangents[i]>`` with respect to ``inputs[k]`` for k in `wrt`."""
    sub = g.innermost()
    xs = [sub.as_tensor(t) for t in inputs]
    outs = build(sub, xs)
    loss = None
    for i, dy in cotangents.items():
        term = sub.reduction_sum(outs[i] * sub.as_tensor(dy))
        term = term if term.dtype == dtypes.float64 else sub.cast(term, dtypes.float32)
        loss = term if loss is None else loss + term
    grads = sub.gradients(loss, [xs[k] for k in wrt])
    # One tensor given twice (a loop's two blocks reading the same tensor) gets its gradient once.
    seen: set[int] = set()
    out = []
    for k in wrt:
        out.append(grads[xs[k]] if xs[k].id not in seen else _zeros(sub, xs[k]))
        seen.add(xs[k].id)
    return out


def _inlined(body: Body) -> Callable:
    return lambda sub, xs: inline(sub, body, xs)


@if_then_else.def_vjp
def _if_vjp(g, op, *dys):
    then_body, else_body = op.attrs["then_body"], op.attrs["else_body"]
    n_then = len(then_body.inputs)
    then_in, else_in = op.inputs[1:1 + n_then], op.inputs[1 + n_then:]
    cts = {i: dy for i, dy in enumerate(dys) if dy is not None and dy.dtype.is_floating}
    then_wrt = [k for k, t in enumerate(then_in) if t.dtype.is_floating]
    else_wrt = [k for k, t in enumerate(else_in) if t.dtype.is_floating]
    if not cts or not then_wrt + else_wrt:
        return [None] * len(op.inputs)

    def then_fn():
        return (_transposed(g, _inlined(then_body), then_in, cts, then_wrt) if then_wrt else []) + \
            [_zeros(g, else_in[k]) for k in else_wrt]

    def else_fn():
        return [_zeros(g, then_in[k]) for k in then_wrt] + \
            (_transposed(g, _inlined(else_body), else_in, cts, else_wrt) if else_wrt else [])

    grads = g.if_then_else(op.inputs[0], then_fn, else_fn)
    out: list[Tensor | None] = [None] * len(op.inputs)
    for j, k in enumerate(then_wrt):
        out[1 + k] = grads[j]
    for j, k in enumerate(else_wrt):
        out[1 + n_then + k] = grads[len(then_wrt) + j]
    return out


def _history(g, op, lower, upper, step, initial, captured) -> Callable[[Tensor], list[Tensor]]:
    """How the reverse loop gets the carried values iteration k started from.

    With bounds known while building, the loop runs once more keeping them all (O(trip count) memory,
    a static history a compiled program can hold); otherwise iteration k recomputes them from the
    initial values (k iterations of the body: O(trip count squared) work, no history).
    """
    body = op.attrs["body"]
    known = [t.op.attrs["value"] if t.op.op == "constant" else None for t in (lower, upper, step)]
    if all(v is not None for v in known) and int(known[2]) > 0:
        length = trip_count(*(int(v) for v in known))
        histories = g._emit("for_loop", op.inputs, {"body": body, "history": length}).outputs[len(initial):]
        return lambda k: [g.gather(h, k, axis=0) for h in histories]

    def recompute(k):
        values = g.for_loop(lower, lower + k * step, step, list(initial),
                            lambda i, *v: inline(g.innermost(), body, [i, *v, *captured]))
        # Values to differentiate at, not functions of the reads the gradient is taken for.
        return [g.stop_gradient(v) for v in values]
    return recompute


@for_loop.def_vjp
def _for_vjp(g, op, *dys):
    body = op.attrs["body"]
    n = len(body.outputs)
    if any(d is not None for d in dys[n:]):
        raise GraphError(f"gradients: the stacked history of {op.op} ({op.name}) has no gradient rule")
    lower, upper, step = op.inputs[:3]
    initial, captured = op.inputs[3:3 + n], op.inputs[3 + n:]
    carried = [k for k in range(n) if initial[k].dtype.is_floating and dys[k] is not None]
    reads = [k for k, t in enumerate(captured) if t.dtype.is_floating]
    if not carried:
        return [None] * len(op.inputs)
    count = g.maximum(g.floor_division(upper - lower + step - 1, step), 0)
    values_at = _history(g, op, lower, upper, step, initial, captured)

    def backward(j, *state):
        cts, sums = state[:len(carried)], state[len(carried):]
        k = count - 1 - j
        wrt = [1 + c for c in carried] + [1 + n + r for r in reads]
        grads = _transposed(g, _inlined(body), [lower + k * step, *values_at(k), *captured],
                            {c: ct for c, ct in zip(carried, cts)}, wrt)
        return grads[:len(carried)] + [s + d for s, d in zip(sums, grads[len(carried):])]

    start = [dys[c] for c in carried] + [_zeros(g, captured[r]) for r in reads]
    result = g.for_loop(0, count, 1, start, backward)
    out: list[Tensor | None] = [None] * len(op.inputs)
    for j, c in enumerate(carried):
        out[3 + c] = result[j]
    for j, r in enumerate(reads):
        out[3 + n + r] = result[len(carried) + j]
    return out


@while_loop.def_vjp
def _while_vjp(g, op, *dys):
    """Count the iterations (the loop again, with a counter), then run the transposed iteration backwards
    from the last to the first, each iteration's carried values recomputed from the initial ones."""
    before, after = op.attrs["before_body"], op.attrs["after_body"]
    n = len(after.outputs)
    n_before = len(before.inputs) - n
    initial, before_in, after_in = op.inputs[:n], op.inputs[n:n + n_before], op.inputs[n + n_before:]
    results = {i: dy for i, dy in enumerate(dys) if dy is not None and dy.dtype.is_floating}
    carried = [k for k, t in enumerate(initial) if t.dtype.is_floating]
    reads_before = [k for k, t in enumerate(before_in) if t.dtype.is_floating]
    reads_after = [k for k, t in enumerate(after_in) if t.dtype.is_floating]
    if not results or not carried + reads_before:
        return [None] * len(op.inputs)

    def iteration(sub, xs):  # the carried values, the reads of before and of after -> the next carried values
        v, b, a = xs[:n], xs[n:n + n_before], xs[n + n_before:]
        return inline(sub, after, inline(sub, before, [*v, *b])[1:] + list(a))

    def counting_before(k, *v):
        return inline(g.innermost(), before, [*v, *before_in])[0], [k, *v]

    def counting_after(k, *v):
        return [k + 1, *iteration(g.innermost(), [*v, *before_in, *after_in])]

    trips = g.while_loop([g.constant(0, dtypes.int32), *initial], counting_before, counting_after)[0]

    def state_at(k):  # the carried values iteration k starts from: values to differentiate at, not functions
        values = g.for_loop(0, k, 1, list(initial),
                            lambda i, *v: iteration(g.innermost(), [*v, *before_in, *after_in]))
        return [g.stop_gradient(v) for v in values]

    # The results are before's at the values the last test saw; then each iteration, transposed, backwards.
    # Built as a block and inlined: in a block the cotangents are inputs, never functions of what the
    # gradient is taken for (they are, in the graph: the gradient of y * y reads y).
    block, reads, _ = build_body(g, "transposed", [], lambda: _transposed(
        g, lambda sub, xs: inline(sub, before, xs)[1:], [*state_at(trips), *before_in], results,
        carried + [n + r for r in reads_before]), "while_loop gradient")
    last = inline(g.innermost(), block, reads)
    cts, sums_before = last[:len(carried)], last[len(carried):]
    sums_after = [_zeros(g, after_in[r]) for r in reads_after]
    if carried:
        def backward(j, *state):
            cts = state[:len(carried)]
            sums = state[len(carried):]
            wrt = carried + [n + r for r in reads_before] + [n + n_before + r for r in reads_after]
            grads = _transposed(g, iteration, [*state_at(trips - 1 - j), *before_in, *after_in],
                                dict(zip(carried, cts)), wrt)
            return grads[:len(carried)] + [s + d for s, d in zip(sums, grads[len(carried):])]

        state = g.for_loop(0, trips, 1, [*cts, *sums_before, *sums_after], backward)
        cts, sums_before, sums_after = (state[:len(carried)], state[len(carried):len(carried) + len(reads_before)],
                                        state[len(carried) + len(reads_before):])
    out: list[Tensor | None] = [None] * len(op.inputs)
    for j, k in enumerate(carried):
        out[k] = cts[j]
    for j, r in enumerate(reads_before):
        out[n + r] = sums_before[j]
    for j, r in enumerate(reads_after):
        out[n + n_before + r] = sums_after[j]
    return out
