"""ONNX control flow (Scan, Loop, If): unrolled where the importer knows the
values that steer it, the graph's control-flow operations (ops/control.py)
where only the run does.

* ``If`` with a condition known at import time (a constant, or folded from
  constants) imports the branch it selects; any other condition (a graph
  input, or computed from one) becomes `if_then_else`, each branch a block
  of its own, compiled once for both outcomes.
* ``Loop`` whose trip count and every iteration's condition are known at
  import time is unrolled (each body imported once per iteration into the
  same graph, Importer.run_subgraph). Otherwise it becomes `while_loop`
  over (iteration, condition, carried values...), the body imported once,
  unless it has scan outputs (how many is known only when it runs): then
  the function is specialised per value of what steers it (specialise.py)
  and unrolled.
* ``Scan`` runs its body once per slice of the scan inputs, whose extent
  along the scan axis must be known; scan outputs are stacked.

Every unrolled iteration counts against ``max_unrolled_steps`` (limits.py),
as the recurrent operators' steps do.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from .onnx_ops import _rank, _t, handles


def _count(cx, steps: int) -> None:
    cx.unrolled_steps += steps
    if cx.unrolled_steps > cx.limits.max_unrolled_steps:
        raise cx.over("max_unrolled_steps", cx.unrolled_steps, "unrolled iterations of control flow")


def _stack(cx, parts: list, axis: int):
    g = cx.g
    if not parts:
        raise cx.fail("a scan output of no iterations has no known shape")
    return g.concat([g.expand_dims(_t(cx, p), [axis]) for p in parts], axis=axis)


@handles("Scan")
def _scan(cx, node, args, attrs):
    g = cx.g
    if cx.opset < 9:
        raise cx.fail("Scan before opset 9 (with sequence_lens) is not supported")
    body, m = attrs["body"], int(attrs["num_scan_inputs"])
    n = len(args) - m
    if m <= 0 or n < 0 or len(body.input) != n + m or len(body.output) < n:
        raise cx.fail(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs for "
                      f"{n} states and {m} scan inputs")
    k = len(body.output) - n
    scans = [_t(cx, a) for a in args[n:]]
    in_axes = [cx.axis(a, _rank(cx, x), "scan_input_axes entry")
               for a, x in zip(attrs.get("scan_input_axes", [0] * m), scans)]
    in_dirs = list(attrs.get("scan_input_directions", [0] * m))
    extents = {x.shape[a] for x, a in zip(scans, in_axes)}
    if len(extents) != 1 or -1 in extents:
        raise cx.fail(f"the scan inputs need one known extent along their scan axes, got {sorted(extents)}")
    steps = extents.pop()
    _count(cx, steps)
    states = list(args[:n])
    collected: list[list] = [[] for _ in range(k)]
    for i in range(steps):
        bound = {vi.name: s for vi, s in zip(body.input[:n], states)}
        for vi, x, axis, back in zip(body.input[n:], scans, in_axes, in_dirs):
            j = steps - 1 - i if back else i
            starts = [0] * x.rank
            ends = list(x.shape)
            starts[axis], ends[axis] = j, j + 1
            bound[vi.name] = g.squeeze(g.slice(x, starts, ends), [axis])
        outs = cx.run_subgraph(body, bound)
        states = outs[:n]
        for c, v in zip(collected, outs[n:]):
            c.append(v)
    out_dirs = list(attrs.get("scan_output_directions", [0] * k))
    out_axes = list(attrs.get("scan_output_axes", [0] * k))
    results = list(states)
    for c, axis, back in zip(collected, out_axes, out_dirs):
        rank = _rank(cx, _t(cx, c[0])) + 1 if c else 1
        results.append(_stack(cx, c[::-1] if back else c, cx.axis(axis, rank, "scan_output_axes entry")))
    return results


def _scalar(cx, value, what: str):
    """The first element of a value known at import time, or None when only the run knows it."""
    known = cx.known(value, what)
    return None if known is None else known.reshape(-1)[0]


@handles("Loop")
def _loop(cx, node, args, attrs):
    body = attrs["body"]
    carried = list(args[2:])
    n = len(carried)
    if len(body.input) != n + 2 or len(body.output) < n + 1:
        raise cx.fail(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs for "
                      f"{n} loop-carried values")
    if args[0] is None and args[1] is None:
        raise cx.fail("a Loop without trip count or condition never ends")
    trip = _scalar(cx, args[0], "Loop trip count") if args[0] is not None else None
    cond = _scalar(cx, args[1], "Loop condition") if args[1] is not None else True
    if (args[0] is not None and trip is None) or cond is None:
        if len(body.output) == n + 1:
            return _run_time_loop(cx, body, args, n)
        # scan outputs: how many is known only per value, so the function is specialised per value
        cx.static(args[0] if trip is None and args[0] is not None else args[1], "Loop trip count and condition")
    trip = int(trip) if trip is not None else None
    cond = bool(cond)
    collected: list[list] = [[] for _ in range(len(body.output) - n - 1)]
    i = 0
    while cond and (trip is None or i < trip):
        _count(cx, 1)
        bound = {body.input[0].name: np.array(i, np.int64), body.input[1].name: np.array(cond)}
        bound.update({vi.name: v for vi, v in zip(body.input[2:], carried)})
        outs = cx.run_subgraph(body, bound)
        cond = bool(cx.static(outs[0], "the Loop body's condition").reshape(-1)[0])
        carried = outs[1:n + 1]
        for c, v in zip(collected, outs[n + 1:]):
            c.append(v)
        i += 1
    return carried + [_stack(cx, c, 0) for c in collected]


def _run_time_loop(cx, body, args, n: int) -> list:
    """A Loop steered by run-time values, as `while_loop` over (i, condition, carried...): the body is
    imported once, into the loop's block."""
    g = cx.g
    trip = g.cast(g.reshape(_t(cx, args[0]), []), dtypes.int64) if args[0] is not None else None
    cond = g.cast(g.reshape(_t(cx, args[1]), []), dtypes.bool_) if args[1] is not None else g.constant(True)
    initial = [g.constant(np.array(0, np.int64)), cond] + [_t(cx, v) for v in args[2:]]

    def before(i, c, *v):
        go = c if trip is None else g.logical_and(c, g.less_than(i, trip))
        return go, [i, c, *v]

    def after(i, c, *v):
        bound = {body.input[0].name: i, body.input[1].name: c}
        bound.update({vi.name: x for vi, x in zip(body.input[2:], v)})
        outs = [_t(cx, o) for o in cx.run_subgraph(body, bound)]
        go_on = g.cast(g.reshape(outs[0], []), dtypes.bool_)
        return [i + g.constant(np.array(1, np.int64)), go_on, *outs[1:n + 1]]

    return list(g.while_loop(initial, before, after))[2:]


@handles("If")
def _if(cx, node, args, attrs):
    cond = _scalar(cx, args[0], "If condition")
    if cond is not None:
        return cx.run_subgraph(attrs["then_branch" if bool(cond) else "else_branch"], {})
    g = cx.g
    predicate = g.cast(g.reshape(_t(cx, args[0]), []), dtypes.bool_)

    def branch(name: str):
        return lambda: [_t(cx, v) for v in cx.run_subgraph(attrs[name], {})]

    out = g.if_then_else(predicate, branch("then_branch"), branch("else_branch"))
    return list(out) if isinstance(out, (list, tuple)) else [out]
