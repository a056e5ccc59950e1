"""Compiled control flow: each control-flow op is one opaque step whose bodies are compiled programs.

`lower` (lower.py) hands the ops named in CONTROL_FLOW here. Each body is
compiled once, while the program is lowered, for the static input types the
op gives it (the enclosing program is specialised, so they are known):
`extract` and the pass pipeline make its program, and a `BlockRun`
(runtime/blocks.py) binds it; no iteration compiles anything. The step then

* if_then_else: reads the predicate (one host read per run) and runs a branch;
* while_loop: runs `before`, reads the predicate, runs `after`, until the
  predicate fails (one host read per iteration: torch has no public CUDA
  graph conditional node to keep the test on the device);
* for_loop: takes its bounds from the program when they are constants (no host
  read), else reads them once per run. On CUDA the iterations replay the body
  captured as CUDA graphs (`LoopGraphs`), or, inside the enclosing run's own
  capture, are unrolled into it, so a replay of the run holds the whole loop;
  elsewhere a Python loop runs the compiled body.

Reading a value on the host cannot be captured: a run with an if/then/else,
a while loop or a for loop of data-dependent bounds is not replayed from a
CUDA graph (the executable runs its steps), which the step says by raising
inside a capture.
"""
from __future__ import annotations

import torch

from ..dtypes import int32
from ..errors import ExecutionError
from ..ir import Operation, TensorType, built_at
from ..ops.control import Body, trip_count
from ..runtime.blocks import BlockRun, LoopGraphs
from ..runtime.steps import Step
from .program import CompileError, extract

CONTROL_FLOW = frozenset({"if_then_else", "while_loop", "for_loop"})


def _compile(op: Operation, body: Body, types: list[TensorType], ctx, what: str) -> tuple[BlockRun, list[TensorType]]:
    """`body` compiled for `types`: its bound steps, and its output types."""
    program = extract(body.graph, dict(zip(body.inputs, types)), body.outputs, [])
    program, sub = ctx.compile_block(program)
    return BlockRun(program, sub, body.inputs), [t.type for t in program.outputs]


def _expect(op: Operation, got: list[TensorType], want: list[TensorType], what: str) -> None:
    if got != want:
        raise CompileError(f"{built_at(op)}: {what} gives {', '.join(map(str, got))} where the op carries "
                           f"{', '.join(map(str, want))}; a compiled loop needs them equal")


def _capturing(ctx) -> bool:
    return ctx.device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _refuse_capture(op: Operation, why: str) -> None:
    raise ExecutionError(f"{built_at(op)} {why} on the host, which a CUDA graph cannot record")


def _store(env: list, outs: list[int], results: list[torch.Tensor], args: list[torch.Tensor]) -> None:
    """Bind the results; one that is an input's memory (a loop that ran no iteration) is copied."""
    shared = {a.untyped_storage().data_ptr() for a in args}
    for slot, r in zip(outs, results):
        env[slot] = r.clone() if r.untyped_storage().data_ptr() in shared else r


def control_step(op: Operation, ins: list[int], outs: list[int], ctx) -> Step:
    """The step that runs `op`, a control-flow op, its bodies compiled."""
    make = {"if_then_else": _if, "while_loop": _while, "for_loop": _for}[op.op]
    return Step(op.name, "control", make(op, ins, outs, ctx))


def _if(op: Operation, ins: list[int], outs: list[int], ctx):
    then_body, else_body = op.attrs["then_body"], op.attrs["else_body"]
    types = [t.type for t in op.inputs]
    n = len(then_body.inputs)
    want = [t.type for t in op.outputs]
    branches = []
    for body, given, what in ((then_body, types[1:1 + n], "then_fn"), (else_body, types[1 + n:], "else_fn")):
        block, got = _compile(op, body, given, ctx, what)
        _expect(op, got, want, what)
        branches.append(block)

    def run(env):
        if _capturing(ctx):
            _refuse_capture(op, "reads its predicate")
        args = [env[s] for s in ins]
        if bool(args[0]):
            _store(env, outs, branches[0].run(args[1:1 + n]), args)
        else:
            _store(env, outs, branches[1].run(args[1 + n:]), args)
    return run


def _while(op: Operation, ins: list[int], outs: list[int], ctx):
    before_body, after_body = op.attrs["before_body"], op.attrs["after_body"]
    types = [t.type for t in op.inputs]
    n = len(after_body.outputs)
    n_before = len(before_body.inputs) - n
    before, got = _compile(op, before_body, types[:n + n_before], ctx, "before_fn")
    results = got[1:]
    _expect(op, results, [t.type for t in op.outputs], "before_fn")
    after, got = _compile(op, after_body, results + types[n + n_before:], ctx, "after_fn")
    _expect(op, got, types[:n], "after_fn")

    def run(env):
        if _capturing(ctx):
            _refuse_capture(op, "reads its predicate every iteration")
        args = [env[s] for s in ins]
        carried, reads_before, reads_after = args[:n], args[n:n + n_before], args[n + n_before:]
        while True:
            predicate, *values = before.run(carried + reads_before)
            if not bool(predicate):
                break
            carried = after.run(values + reads_after)
        _store(env, outs, values, args)
    return run


def _for(op: Operation, ins: list[int], outs: list[int], ctx):
    body, history = op.attrs["body"], op.attrs["history"]
    types = [t.type for t in op.inputs]
    n = len(body.outputs)
    block, got = _compile(op, body, [TensorType((), int32)] + types[3:], ctx, "body_fn")
    _expect(op, got, types[3:3 + n], "body_fn")
    # Bounds that are constants of the program are known now: such a loop never reads the device.
    known = [int(t.op.attrs["value"]) if t.op.op == "constant" else None for t in op.inputs[:3]]
    graphs: dict[int, LoopGraphs] = {}  # by step, made by the first run on CUDA that may use them

    def run(env):
        args = [env[s] for s in ins]
        capturing = _capturing(ctx)
        if capturing and None in known:
            _refuse_capture(op, "reads its bounds")
        lower, upper, step = (k if k is not None else int(a) for k, a in zip(known, args[:3]))
        count = trip_count(lower, upper, step)
        carried, reads = list(args[3:3 + n]), list(args[3 + n:])
        if capturing and block.flag_slot is not None:
            _refuse_capture(op, "checks its body's integer divisors or gathered indices")
        if ctx.device.type == "cuda" and not capturing and history is None and count >= 2:
            if step not in graphs:
                graphs[step] = LoopGraphs(block, torch.empty((), dtype=torch.int32, device=ctx.device),
                                          carried, reads, step)
            _store(env, outs, graphs[step].run(lower, count, carried, reads), args)
            return
        kept: list[list[torch.Tensor]] = [[] for _ in range(n)]
        for k in range(count):
            if history is not None:
                for h, v in zip(kept, carried):
                    h.append(v)
            index = torch.full((), lower + k * step, dtype=torch.int32, device=ctx.device)
            carried = block.run([index, *carried, *reads], check_flag=not capturing)
        if history is not None:
            carried += [torch.stack(h) if h else torch.empty((0, *x.shape), dtype=x.dtype, device=x.device)
                        for h, x in zip(kept, args[3:3 + n])]
        _store(env, outs, carried, args)
    return run
