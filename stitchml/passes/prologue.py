"""prologue: elementwise producers of a matrix product's operands move into the product's kernel.

Requires: a stitched program. Ensures: where a matmul kernel's operand is computed elementwise by another
kernel (a scale, a cast, an activation, a normalisation's apply step `(x - mean) * rstd * gamma + beta`
after the reduction that computed the row statistics) and nothing else reads it, the ops that compute
it are copied into the matmul kernel's body ahead of the product (codegen/matmul.py computes them as it
loads the operand's tiles), so the operand never goes through memory:

* a pointwise producer loses that output, and disappears when it was its only one;
* a reduction producer keeps its reductions and stores the per-row values the copied ops read (a
  row's mean and rstd) instead of the full-size result;
* a `transpose` between the producer and the product moves into the body too (the gradient of a
  product reads the forward's operand transposed), and a value read by several products (the
  forward one and the weight gradient's) is computed in each.

Only on the Triton backends (CUDA, the interpreter): the native CPU backend has no matmul template. On
CUDA the kernel's first run measures it against the vendor GEMM after a separate producer kernel and
keeps the faster (runtime/choices.py, as for cuBLASLt epilogues). There a reduction producer is left
whole unless the prologue is forced: on an H200 the vendor GEMM beat the template at every transformer
size measured, and a split reduction then costs one more pass over its rows than the unsplit kernel
(benchmarks/RESULTS.md, prologue fusion). `options={"prologue": False}` turns
the pass off, `"fused"` or `"separate"` forces one side. Each matmul or convolution operand that
another kernel computes gets a line in `fusion_report()`: fused, or why not (convolutions have no
Triton template: cuDNN computes them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..codegen.matmul import DOT_DTYPES, fusable_prologue_op, view_permutation
from ..graph import Graph
from ..ir import Operation, Tensor, needed_ops
from ..registry import lookup
from .memory import prologue_mode
from .program import Program, copy_op

MAX_PROLOGUE_OPS = 32  # the ops run once per tile of the other operand: long chains cost more than a store


@dataclass(eq=False)
class _Plan:
    """One producer output `tensor` that moves into its readers' prologues."""

    producer: Operation
    tensor: Tensor
    inner: Tensor  # the value in the producer's body
    ops: list[Operation]  # the producer body's ops computing it, in body order
    leaves: list[Tensor]  # body tensors they read: placeholders and per-row values
    readers: list[tuple[Operation, int, Operation | None]] = field(default_factory=list)  # (matmul, operand, view)


def _is_matmul(op: Operation) -> bool:
    return op.op == "fusion" and op.attrs["template"] == "matmul"


def _contraction(body: Program) -> Operation:
    return next(o for o in body.operations if lookup(o.op).vendor is not None)


def _operand_reader(op: Operation, t: Tensor) -> tuple[list[tuple[int, Operation]], str]:
    """The operand slots of matmul kernel `op` that read `t` (a program tensor) directly, or why `op`'s
    body reads `t` otherwise."""
    body = op.attrs["body"]
    placeholders = [o.outputs[0] for o in body.operations if o.op == "placeholder"]
    product = _contraction(body)
    if product.op != "matrix_multiplication":
        return [], f"{product.op} has no Triton template"
    if product.outputs[0].dtype.name not in DOT_DTYPES:
        return [], f"the product is {product.outputs[0].dtype}; the Triton template takes {', '.join(DOT_DTYPES)}"
    slots = []
    for i, outer in enumerate(op.inputs):
        if outer is not t:
            continue
        inner = placeholders[i]
        readers = [o for o in body.operations if inner in o.inputs]
        if readers != [product]:
            return [], f"{op.name}'s epilogue reads it too"
        slots.extend((j, op) for j, x in enumerate(product.inputs) if x is inner)
    return slots, ""


def _readers(t: Tensor, users: dict, outputs: set[int]) -> tuple[list[tuple[Operation, int, Operation | None]], str]:
    """Every (matmul kernel, operand, view) reading `t`, or why `t` must stay in memory."""
    if t.id in outputs:
        return [], f"{_user_name(t)} is a result of the program"
    found = []
    for user in users.get(t.id, []):
        view = None
        targets = [(user, t)]
        if view_permutation(user) is not None:
            view = user
            if user.outputs[0].id in outputs:
                return [], f"{user.name} (a transpose of it) is a result of the program"
            targets = [(u, user.outputs[0]) for u in users.get(user.outputs[0].id, [])]
        for reader, value in targets:
            if not _is_matmul(reader):
                return [], f"{reader.name} ({reader.op if reader.op != 'fusion' else reader.attrs['template']}) " \
                           f"reads it too, so it is stored anyway"
            slots, why = _operand_reader(reader, value)
            if why:
                return [], why
            found.extend((m, j, view) for j, m in slots)
    return list(dict.fromkeys(found)), ""


def _apply_ops(producer: Operation, t: Tensor) -> tuple[_Plan | None, str]:
    """The producer-body ops computing output `t`, or why they cannot run in a prologue."""
    body = producer.attrs["body"]
    inner = body.outputs[[o for o in producer.outputs].index(t)]
    space = body.notes.get("space", {}) if producer.attrs["template"] == "reduction" else {}
    ops: dict[int, Operation] = {}
    leaves: dict[int, Tensor] = {}
    stack = [inner]
    while stack:
        v = stack.pop()
        if v.id in leaves or v.op.id in ops:
            continue
        if v.op.op == "placeholder" or space.get(v.id) == "row":
            leaves[v.id] = v
            continue
        why = fusable_prologue_op(v.op, inner.shape)
        if why:
            return None, why
        ops[v.op.id] = v.op
        stack.extend(v.op.inputs)
    if not ops:
        return None, "it is a reduction's result, which its kernel stores"
    if len(ops) > MAX_PROLOGUE_OPS:
        return None, f"it takes {len(ops)} ops; a prologue runs them once per tile, at most {MAX_PROLOGUE_OPS}"
    order = {o.id: i for i, o in enumerate(body.operations)}
    return _Plan(producer, t, inner, sorted(ops.values(), key=lambda o: order[o.id]),
                 sorted(leaves.values(), key=lambda x: x.id)), ""


def _user_name(t: Tensor) -> str:
    """The name of the user's value a kernel output stores (the kernel's outputs are named after it)."""
    if t.op.op != "fusion":
        return t.name
    return t.op.attrs["body"].outputs[list(t.op.outputs).index(t)].name


def _describe(plan: _Plan) -> str:
    return ", ".join(o.op for o in plan.ops if o.op != "constant")


def prologue(program: Program, ctx) -> Program:
    """The pass (see the module docstring)."""
    if ctx is None or ctx.backend not in ("triton", "interpret") or ctx.options.get("prologue", True) is False:
        return program
    users: dict[int, list[Operation]] = {}
    for op in program.operations:
        for t in op.inputs:
            users.setdefault(t.id, [])
            if op not in users[t.id]:
                users[t.id].append(op)
    outputs = {t.id for t in program.outputs}
    mode = prologue_mode(ctx.backend, ctx.options)
    plans: dict[int, _Plan] = {}
    lines: list[str] = []
    seen: set[int] = set()
    for op in program.operations:
        if op.op == "fusion" and op.attrs["template"] == "convolution":
            for outer in op.inputs:
                if outer.op.op == "fusion" and outer.id not in seen:
                    seen.add(outer.id)
                    lines.append(f"prologue not fused: {outer.op.name} -> {op.name} ({_user_name(outer)}): "
                                 f"convolutions run in cuDNN, which reads its operands from memory")
        if not _is_matmul(op):
            continue
        for outer in op.inputs:
            t = outer.op.inputs[0] if view_permutation(outer.op) is not None else outer
            producer = t.op
            if producer.op != "fusion" or t.id in seen:
                continue
            seen.add(t.id)
            where = f"{producer.name} -> {op.name} ({_user_name(t)})"
            if producer.attrs["template"] not in ("pointwise", "reduction"):
                lines.append(f"prologue not fused: {where}: a {producer.attrs['template']} kernel computes it, "
                             f"and is not recomputed per tile")
                continue
            if producer.attrs["template"] == "reduction" and mode == "choose":
                lines.append(f"prologue not fused: {where}: the reduction kernel applies its rows itself; on CUDA "
                             f"the vendor GEMM beat the prologue template at every measured size, and splitting "
                             f"the reduction would cost a pass over its rows (options={{'prologue': 'fused'}} "
                             f"forces it)")
                continue
            readers, why = _readers(t, users, outputs)
            plan = None
            if not why:
                plan, why = _apply_ops(producer, t)
            if plan is None:
                lines.append(f"prologue not fused: {where}: {why}")
                continue
            plan.readers = readers
            plans[t.id] = plan
            for matmul, j, view in readers:
                through = f" through {view.name}" if view is not None else ""
                lines.append(f"prologue: {producer.name} ({_describe(plan)}) fused into the loads of "
                             f"{matmul.name}'s operand {j} ({plan.inner.name}{through})")
    if ctx.fusion_report is not None:
        ctx.fusion_report.extend({"note": line} for line in lines)
    if not plans:
        return program
    return _rebuild(program, plans, ctx)


def _rebuild(program: Program, plans: dict[int, _Plan], ctx) -> Program:
    by_producer: dict[int, list[_Plan]] = {}
    by_matmul: dict[int, dict[int, tuple[_Plan, Operation | None]]] = {}
    views: set[int] = set()
    for plan in plans.values():
        by_producer.setdefault(plan.producer.id, []).append(plan)
        for matmul, j, view in plan.readers:
            by_matmul.setdefault(matmul.id, {})[j] = (plan, view)
            if view is not None:
                views.add(view.id)
    g = Graph(program.graph.name)
    mapping: dict[int, Tensor] = {}
    leaf_outer: dict[tuple[int, int], Tensor] = {}  # (producer op id, body tensor id) -> new program tensor
    for op in program.operations:
        if op.id in views:
            continue
        if op.id in by_producer:
            _emit_producer(g, op, by_producer[op.id], mapping, leaf_outer)
            continue
        if op.id in by_matmul:
            _emit_matmul(g, op, by_matmul[op.id], mapping, leaf_outer)
            continue
        for old, new in zip(op.outputs, copy_op(g, op, [mapping[t.id] for t in op.inputs])):
            mapping[old.id] = new
    _fix_boundaries(ctx, plans, views, program)
    return Program(g, [mapping[t.id] for t in program.outputs], dict(program.notes))


def _emit_producer(g: Graph, op: Operation, plans: list[_Plan], mapping: dict, leaf_outer: dict) -> None:
    """Re-emit a producer kernel without the outputs that moved, storing the per-row values they read."""
    body = op.attrs["body"]
    moved = {p.inner.id for p in plans}
    keep = [(old, inner) for old, inner in zip(op.outputs, body.outputs) if inner.id not in moved]
    placeholders = {t.id: i for i, t in enumerate(o.outputs[0] for o in body.operations if o.op == "placeholder")}
    rows = [x for p in plans for x in p.leaves if x.id not in placeholders]
    for p in plans:  # placeholders the prologues read are the producer's inputs
        for x in p.leaves:
            if x.id in placeholders:
                leaf_outer[(op.id, x.id)] = mapping[op.inputs[placeholders[x.id]].id]
    inner_outputs = list(dict.fromkeys([inner for _, inner in keep] + rows))
    if not inner_outputs:  # everything it computed moved into prologues
        return
    needed = needed_ops(body.operations, [t.op for t in inner_outputs])
    sub = Graph(body.graph.name)
    inner_map: dict[int, Tensor] = {}
    inputs = []
    for o in needed:
        if o.op == "placeholder":
            t = o.outputs[0]
            inner_map[t.id] = sub.placeholder(t.shape, t.dtype, name=f"in{len(inputs)}")
            inputs.append(mapping[op.inputs[placeholders[t.id]].id])
            continue
        for old, new in zip(o.outputs, copy_op(sub, o, [inner_map[t.id] for t in o.inputs])):
            inner_map[old.id] = new
    notes = dict(body.notes)
    notes["space"] = {inner_map[i].id: s for i, s in body.notes.get("space", {}).items() if i in inner_map}
    template = op.attrs["template"]
    if template == "reduction" and not any(lookup(o.op).combine is not None for o in needed):
        template = "pointwise"  # only elementwise ops over the frame are left
    attrs = {"body": Program(sub, [inner_map[t.id] for t in inner_outputs], notes), "template": template,
             "name": op.attrs["name"]}
    fused = g._emit("fusion", inputs, attrs, op.name)
    new_of = {t.id: new for t, new in zip(inner_outputs, fused.outputs)}
    for old, inner in keep:
        mapping[old.id] = new_of[inner.id]
    for x in rows:
        leaf_outer[(op.id, x.id)] = new_of[x.id]


def _emit_matmul(g: Graph, op: Operation, fused: dict[int, tuple[_Plan, Operation | None]], mapping: dict,
                 leaf_outer: dict) -> None:
    """Re-emit a matmul kernel with the producers' ops ahead of the product on the operands in `fused`."""
    body = op.attrs["body"]
    product = _contraction(body)
    sub = Graph(body.graph.name)
    inputs: list[Tensor] = []
    slot_of: dict[int, Tensor] = {}  # new program tensor id -> its placeholder in `sub`

    def placeholder(outer: Tensor) -> Tensor:
        if outer.id not in slot_of:
            slot_of[outer.id] = sub.placeholder(outer.shape, outer.dtype, name=f"in{len(inputs)}")
            inputs.append(outer)
        return slot_of[outer.id]

    dropped = {product.inputs[j].id for j in fused}
    inner_map: dict[int, Tensor] = {}
    placeholders = [o.outputs[0] for o in body.operations if o.op == "placeholder"]
    for i, p in enumerate(placeholders):
        if p.id not in dropped:
            inner_map[p.id] = placeholder(mapping[op.inputs[i].id])
    for j, (plan, view) in sorted(fused.items()):
        local = {x.id: placeholder(leaf_outer[(plan.producer.id, x.id)]) for x in plan.leaves}
        for o in plan.ops:
            for old, new in zip(o.outputs, copy_op(sub, o, [local[t.id] for t in o.inputs])):
                local[old.id] = new
        value = local[plan.inner.id]
        if view is not None:
            value = copy_op(sub, view, [value])[0]
        inner_map[product.inputs[j].id] = value
    for o in body.operations:
        if o.op == "placeholder":
            continue
        for old, new in zip(o.outputs, copy_op(sub, o, [inner_map[t.id] for t in o.inputs])):
            inner_map[old.id] = new
    attrs = {"body": Program(sub, [inner_map[t.id] for t in body.outputs], dict(body.notes)), "template": "matmul",
             "name": op.attrs["name"]}
    new = g._emit("fusion", inputs, attrs, op.name)
    for old, t in zip(op.outputs, new.outputs):
        mapping[old.id] = t


def _reads_rows(plan: _Plan) -> bool:
    space = plan.producer.attrs["body"].notes.get("space", {})
    return any(space.get(x.id) == "row" for x in plan.leaves)


def _fix_boundaries(ctx, plans: dict[int, _Plan], views: set[int], program: Program) -> None:
    """Edges between steps after the move: the fused values' edges go; a producer that disappeared hands
    its inputs' edges to the matmul kernels; per-row values stored for a prologue get an edge of their own."""
    names = {p.inner.name for p in plans.values()} | {o.outputs[0].name for o in program.operations if o.id in views}
    view_names = {o.name for o in program.operations if o.id in views}
    moved = {q.inner.id for q in plans.values()}
    gone = {p.producer.name for p in plans.values()
            if all(inner.id in moved for inner in p.producer.attrs["body"].outputs) and not _reads_rows(p)}
    kept, seen = [], set()
    for b in ctx.boundaries:
        if b["tensor"] in names or b["producer"] in view_names or b["consumer"] in view_names:
            continue
        targets = [b["consumer"]]
        if b["consumer"] in gone:
            targets = sorted({m.name for p in plans.values() if p.producer.name == b["consumer"]
                              for m, _, _ in p.readers})
        for consumer in targets:
            key = (b["producer"], consumer, b["tensor"])
            if key not in seen:
                seen.add(key)
                kept.append({**b, "consumer": consumer})
    for p in plans.values():
        if _reads_rows(p):
            for m, _, _ in p.readers:
                key = (p.producer.name, m.name, f"{p.producer.name} rows")
                if key not in seen:
                    seen.add(key)
                    kept.append({"producer": p.producer.name, "consumer": m.name, "tensor": key[2],
                                 "reason": "per-row values of a reduction, read by the matmul's prologue: the "
                                           "reduction finishes before the product starts"})
    ctx.boundaries[:] = kept
