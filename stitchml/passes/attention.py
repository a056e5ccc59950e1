"""attention: recognise softmax(Q Kᵀ · scale [+ mask]) V written from primitives.

Requires: a simplified, pruned program. Ensures: every matched pattern is one
`fusion` op with template "attention" (codegen/attention.py) whose body holds
the matched ops, so the reference backend and the debugger still run it op by
op; the stitch pass leaves it alone.

The pattern, read backwards from the second product:

    matrix_multiplication(P, V)          P: softmax over the last axis, as
    [cast]                               composites.softmax emits it (max,
    division(e, reduction_sum(e))        subtract, exponent, sum, divide, with
    e = exponent(x - reduction_max(x))   casts to and from float32 for halves)
    [cast to float32]
    [addition(·, mask)]                  an additive mask broadcastable to the scores
    multiplication(·, c) | division(·, c) | none    c a one-element constant
    matrix_multiplication(Q, Kᵀ)         Kᵀ any operand: a transpose view is read in place

Every intermediate must be used by the pattern alone (the kernel never stores
the scores or probabilities), or by the pattern's backward in a training
graph: attention_grad.py finds that backward, and forward and backward are
replaced together by a forward kernel that also stores the log-sum-exp (and O
unrounded, for half types) and a backward fusion of two kernels
(codegen/attention_backward.py). A constant mask of -inf above the diagonal
and 0 elsewhere becomes a causal kernel, which skips the masked key tiles.
Every near miss (a softmax feeding a product that fails one condition) is
reported with its reason in `ctx.attention_report`, which
`Executable.fusion_report()` prints.
"""
from __future__ import annotations

import torch

from ..codegen.attention import LOG2E, MAX_HEAD_DIM, AttentionSpec
from ..dtypes import float32
from ..graph import Graph
from ..ir import Operation, Tensor
from . import attention_grad
from .program import Program, copy_op

FLOATS = ("float16", "bfloat16", "float32")


class _Miss(Exception):
    """The pattern does not apply; the message says why."""


def _producer(t: Tensor, op: str) -> Operation:
    if t.op.op != op:
        raise _Miss(f"{t.name} is made by {t.op.op}, expected {op}")
    return t.op


def _scalar(t: Tensor) -> float | None:
    if t.op.op == "constant" and t.type.numel() == 1:
        return float(t.op.attrs["value"].reshape(()).item())
    return None


def _last_axis(op: Operation) -> bool:
    rank = op.inputs[0].rank
    axes = op.attrs["axes"]
    return axes is not None and tuple(a % rank for a in axes) == (rank - 1,) and op.attrs["keep_dims"]


def _is_causal(mask: Tensor, scores: tuple[int, ...]) -> bool:
    """Whether `mask` is a constant with -inf strictly above the diagonal and 0 elsewhere."""
    if mask.op.op != "constant" or mask.rank < 2 or any(d != 1 for d in mask.shape[:-2]):
        return False
    value = mask.op.attrs["value"]
    if tuple(value.shape[-2:]) != scores[-2:]:
        return False
    value = value.reshape(value.shape[-2:])
    upper = torch.ones(value.shape, dtype=torch.bool).triu(1)
    return bool(torch.equal(value.isneginf(), upper) and not value.masked_fill(upper, 0).any())


def _match(out: Operation, uses: dict[int, int], outputs: set[int],
           strict: bool = True) -> tuple[list[Operation], list[Tensor], AttentionSpec]:
    """The ops of the pattern that ends in `out`, its inputs (Q, Kᵀ, V[, mask]) and its spec; _Miss if none.
    Not `strict`: intermediates may be read elsewhere (by the pattern's backward, which the caller checks)."""
    ops: list[Operation] = [out]

    def inner(t: Tensor, readers: int = 1) -> Tensor:
        if not strict:
            return t
        if t.id in outputs:
            raise _Miss(f"{t.name} is an output of the graph (the fused kernel does not store it)")
        if uses.get(t.id, 0) != readers:
            raise _Miss(f"{t.name} is also read outside the attention pattern")
        return t

    probs, v = out.inputs
    if probs.op.op == "cast":
        ops.append(probs.op)
        probs = inner(probs).op.inputs[0]
    div = _producer(inner(probs), "division")
    e, total = div.inputs
    sum_op = _producer(total, "reduction_sum")
    if sum_op.inputs[0] is not e:
        raise _Miss("the softmax's sum does not reduce its own exponentials")
    if not _last_axis(sum_op):
        raise _Miss(f"softmax over axes {sum_op.attrs['axes']} of a rank-{e.rank} tensor; attention normalises "
                    "over the last (key) axis")
    exp_op = _producer(inner(e, 2), "exponent")
    inner(total)
    sub = _producer(inner(exp_op.inputs[0]), "subtraction")
    x, mx = sub.inputs
    max_op = _producer(inner(mx), "reduction_maximum")
    if max_op.inputs[0] is not x or not _last_axis(max_op):
        raise _Miss("the softmax's maximum is not taken over the last axis of its input")
    ops += [div, sum_op, exp_op, sub, max_op]
    scores = inner(x, 2)
    if scores.op.op == "cast":
        ops.append(scores.op)
        scores = inner(scores.op.inputs[0])
    mask = None
    if scores.op.op == "addition":
        add = scores.op
        a, b = add.inputs
        left = a.op.op in ("multiplication", "division", "matrix_multiplication")
        scores, mask = (a, b) if left else (b, a)
        if scores.shape != add.outputs[0].shape:
            raise _Miss(f"the mask {mask.name} of shape {mask.shape} broadcasts the scores {scores.shape}")
        if mask.rank > scores.rank or mask.shape[-2:] != scores.shape[-2:] and any(
                m not in (1, s) for m, s in zip(mask.shape[::-1], scores.shape[::-1])):
            raise _Miss(f"the mask {mask.name} of shape {mask.shape} does not broadcast to the scores {scores.shape}")
        ops.append(add)
        scores = inner(scores)
    scale, divide = 1.0, False
    if scores.op.op in ("multiplication", "division"):
        op = scores.op
        a, b = op.inputs
        c = _scalar(b)
        if c is None and op.op == "multiplication":
            c, b, a = _scalar(a), a, b
        if c is None:
            raise _Miss(f"{op.op} ({op.name}) scales the scores by a tensor, not a one-element constant")
        scale, divide = c, op.op == "division"
        ops.append(op)
        scores = inner(a)
    first = _producer(scores, "matrix_multiplication")
    ops.append(first)
    q, kt = first.inputs
    if not (2 <= q.rank and q.rank == kt.rank == v.rank) or q.rank > 4:
        raise _Miss(f"operands of ranks {q.rank}, {kt.rank}, {v.rank}; attention takes 2- to 4-D Q, K and V alike")
    names = {t.dtype.name for t in (q, kt, v)}
    if len(names) != 1 or not names <= set(FLOATS):
        raise _Miss(f"Q, K and V are {sorted(names)}; attention takes one of {', '.join(FLOATS)}")
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD_DIM:
        raise _Miss(f"head dimension {max(q.shape[-1], v.shape[-1])} exceeds {MAX_HEAD_DIM}")
    if mask is not None and not mask.dtype.is_floating:
        raise _Miss(f"the mask {mask.name} is {mask.dtype.name}, not a floating type")
    causal = mask is not None and _is_causal(mask, x.shape)
    inputs = [q, kt, v] + ([mask] if mask is not None and not causal else [])
    return ops, inputs, AttentionSpec(scale, divide, mask is not None and not causal, causal)


def _placeholders(g: Graph, inputs: list[Tensor]) -> dict[int, Tensor]:
    return {t.id: g.placeholder(t.shape, t.dtype, name=f"in{i}") for i, t in enumerate(inputs)}


def _copy(g: Graph, ops: list[Operation], inner: dict[int, Tensor], inputs: list[Tensor],
          position: dict[int, int]) -> None:
    """Copy `ops` into `g` in program order. An operand made outside them is a constant of the pattern (the
    scale, a causal mask) or a transpose of an input (the backward's Vᵀ, Qᵀ, K), re-made from the input."""
    def get(t: Tensor) -> Tensor:
        if t.id in inner:
            return inner[t.id]
        if t.op.op == "constant":
            inner[t.id] = copy_op(g, t.op, [])[0]
            return inner[t.id]
        base, perm = attention_grad._resolve(t)
        for x in inputs:
            xb, xp = attention_grad._resolve(x)
            if xb.id == base.id:
                inner[t.id] = g._emit("transpose", [inner[x.id]], {"permutation": tuple(xp.index(p) for p in perm)}
                                      ).outputs[0]
                return inner[t.id]
        if base.id in inner:  # the backward's Pᵀ
            inner[t.id] = g._emit("transpose", [inner[base.id]], {"permutation": perm}).outputs[0]
            return inner[t.id]
        raise attention_grad.Miss(f"the backward reads {t.name}, made outside the pattern")

    for op in sorted(ops, key=lambda o: position[o.id]):
        for old, new in zip(op.outputs, copy_op(g, op, [get(t) for t in op.inputs])):
            inner[old.id] = new


def _body(ops: list[Operation], inputs: list[Tensor], spec: AttentionSpec, position: dict[int, int],
          lse: bool = False) -> Program:
    """The forward kernel's body: the matched ops, and with `lse` each row's log-sum-exp in base 2 (float32,
    (batch..., L)), the second output, which the backward kernels read. For half types a training forward
    also stores O in float32 before its rounding (the third output; the body, which the reference backend
    runs, widens the rounded O): the backward's Δ = rowsum(dO ∘ O) needs O to float32's precision."""
    g = Graph("attention")
    inner = _placeholders(g, inputs)
    _copy(g, ops, inner, inputs, position)
    outs = [inner[ops[0].outputs[0].id]]
    if lse:
        top = next(inner[o.outputs[0].id] for o in ops if o.op == "reduction_maximum")
        total = next(inner[o.outputs[0].id] for o in ops if o.op == "reduction_sum")
        outs.append(g.reshape((g.logarithm(total) + top) * LOG2E, top.shape[:-1]))
        if outs[0].dtype != float32:
            outs.append(g.cast(outs[0], float32))
    return Program(g, outs, {"attention": spec})


def _backward_body(fwd: list[Operation], bwd: list[Operation], inputs: list[Tensor], out: Tensor,
                   cotangent: Tensor, grads: list[Tensor], spec: AttentionSpec, position: dict[int, int]) -> Program:
    """The backward kernels' body: the forward recomputed, then the backward ops. Inputs: Q, Kᵀ, V[, mask],
    lse, O in float32 (the forward's unrounded O for half types, O itself for float32), dO (the reference
    backend ignores lse and O)."""
    g = Graph("attention_backward")
    inner = _placeholders(g, inputs)
    g.placeholder(out.shape[:-1], float32, name="lse")
    g.placeholder(out.shape, float32, name="unrounded")
    inner[cotangent.id] = g.placeholder(cotangent.shape, cotangent.dtype, name="cotangent")
    _copy(g, fwd + bwd, inner, inputs, position)
    return Program(g, [inner[t.id] for t in grads], {"attention": spec})


def _training(op: Operation, program: Program, uses: dict, outputs: set, position: dict):
    """The pattern ending in `op` together with its backward, or _Miss / attention_grad.Miss."""
    ops, inputs, spec = _match(op, uses, outputs, strict=False)
    _, bwd, (cotangent, perm), gradients = attention_grad.match(program, ops, inputs, position)
    fwd = ops  # the final product first, as _body expects
    if perm != tuple(range(cotangent.rank)):
        raise _Miss("the output's gradient is read transposed")
    grads = [t for t, _ in gradients]
    absorbed = {o.id for o in fwd + bwd}
    keep = {op.outputs[0].id} | {t.id for t in grads}
    made = {t.id for o in fwd + bwd for t in o.outputs}
    views: set[int] = set()
    readers: dict[int, list[int]] = {}
    for user in program.operations:
        for t in user.inputs:
            readers.setdefault(t.id, []).append(user.id)
    for user in reversed(program.operations):  # transposes only absorbed ops (or dropped views) read
        if user.op == "transpose" and user.id not in absorbed and all(
                r in absorbed or r in views for r in readers.get(user.outputs[0].id, [])) and \
                user.outputs[0].id not in outputs and all(user.outputs[0].id != t.id for t in inputs):
            views.add(user.id)
    for user in program.operations:
        if user.id in absorbed or user.id in views:
            continue
        for t in user.inputs:
            if t.id in made and t.id not in keep:
                raise _Miss(f"{t.name} is also read outside the attention pattern and its gradient ({user.name})")
    for t in program.outputs:
        if t.id in made and t.id not in keep:
            raise _Miss(f"{t.name} is an output of the graph (the fused kernels do not store it)")
    return fwd, bwd, inputs, spec, cotangent, grads, views


def attention(program: Program, ctx) -> Program:
    if ctx is not None and (ctx.options.get("attention", True) is False or ctx.backend not in ("triton", "interpret")):
        return program  # the CPU's C++ and reference backends keep their own kernels
    uses: dict[int, int] = {}
    for op in program.operations:
        for t in op.inputs:
            uses[t.id] = uses.get(t.id, 0) + 1
    outputs = {t.id for t in program.outputs}
    position = {op.id: i for i, op in enumerate(program.operations)}
    report: list[str] = []
    found: dict[int, tuple] = {}  # id of the op the replacement stands at -> ("forward" | "backward", ...)
    absorbed: set[int] = set()
    for op in program.operations:
        if op.op != "matrix_multiplication" or op.inputs[0].op.op not in ("cast", "division") or op.id in absorbed:
            continue
        try:
            ops, inputs, spec = _match(op, uses, outputs)
            training = None
        except _Miss as miss:
            if not _looks_like_softmax(op):
                continue
            try:
                fwd, bwd, inputs, spec, cotangent, grads, views = _training(op, program, uses, outputs, position)
            except (_Miss, attention_grad.Miss) as why:
                report.append(f"attention not applied at {op.name}: {miss}" + (
                    "" if str(why) == str(miss) else f"; as a training step: {why}"))
                continue
            ops, training = fwd, (bwd, cotangent, grads, views)
        kind = "causal" if spec.causal else "additive mask" if spec.mask else "no mask"
        shapes = f"Q {inputs[0].shape}, V {inputs[2].shape}, {inputs[0].dtype.name}"
        absorbed |= {o.id for o in ops}
        if training is None:
            found[op.id] = ("forward", ops, inputs, spec, False)
            report.append(f"attention applied at {op.name}: {len(ops)} ops in one kernel ({kind}, {shapes})")
            continue
        bwd, cotangent, grads, views = training
        found[op.id] = ("forward", ops, inputs, spec, True)
        first = min(grads, key=lambda t: position[t.op.id]).op
        found[first.id] = ("backward", ops, bwd, inputs, spec, op.outputs[0], cotangent, grads)
        absorbed |= {o.id for o in bwd} | views
        report.append(f"attention applied at {op.name} with its gradient: {len(ops)} ops in one forward kernel, "
                      f"{len(bwd)} in two backward kernels ({kind}, {shapes})")
    if ctx is not None:
        ctx.attention_report = report
    if not found:
        return program
    g = Graph(program.graph.name)
    mapping: dict[int, Tensor] = {}
    lse_of: dict[int, tuple[Tensor, Tensor]] = {}  # forward output id -> its log-sum-exp, O in float32
    for op in program.operations:
        entry = found.get(op.id)
        if entry is not None and entry[0] == "forward":
            _, ops, inputs, spec, lse = entry
            body = _body(ops, inputs, spec, position, lse)
            name = f"attention_{op.name}"
            fused = g._emit("fusion", [mapping[t.id] for t in inputs], {"body": body, "template": "attention",
                                                                       "name": name}, name)
            mapping[op.outputs[0].id] = fused.outputs[0]
            if lse:
                lse_of[op.outputs[0].id] = (fused.outputs[1], fused.outputs[2 if len(fused.outputs) == 3 else 0])
        if entry is not None and entry[0] == "backward":
            _, ops, bwd, inputs, spec, out, cotangent, grads = entry
            body = _backward_body(ops, bwd, inputs, out, cotangent, grads, spec, position)
            name = f"attention_backward_{op.name}"
            feeds = [mapping[t.id] for t in inputs] + [*lse_of[out.id], mapping[cotangent.id]]
            fused = g._emit("fusion", feeds, {"body": body, "template": "attention_backward", "name": name}, name)
            for t, new in zip(grads, fused.outputs):
                mapping[t.id] = new
        if op.id not in absorbed:
            for old, new in zip(op.outputs, copy_op(g, op, [mapping[t.id] for t in op.inputs])):
                mapping[old.id] = new
    return Program(g, [mapping[t.id] for t in program.outputs], dict(program.notes))


def _looks_like_softmax(op: Operation) -> bool:
    """Whether the first operand of a product is (a cast of) a softmax's division: a near miss worth a line."""
    t = op.inputs[0]
    if t.op.op == "cast":
        t = t.op.inputs[0]
    return t.op.op == "division" and t.op.inputs[1].op.op == "reduction_sum"
