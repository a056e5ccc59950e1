"""stitch: group adjacent operations into kernels.

Requires: a simplified, pruned program with static shapes. Ensures: every
elementwise, fusable-reduction, matmul and convolution op sits in exactly one
`fusion` op whose body holds the kernel's ops; placeholders, constants,
variables, views, opaque ops and assignments stay as they are. The kernels
are in a topological order of the kernel graph.

Walking the ops in program order, each op that can start a kernel asks
legality.can_fuse of every kernel that produces one of its inputs; the legal
ones are scored (policy.score) and policy.choose picks one, else the op
starts a new kernel. Every refusal is kept for `Executable.fusion_report()`.
Joining is refused when it would close a cycle (the op reads a value that
itself depends on the kernel).

On the Triton backends a max pooling's gradient whose windows tile its input
starts a kernel too ("pool_gradient", codegen/pooling.py) that the
elementwise ops reading its result may join (its epilogue: the ReLU's mask
of a convolution's backward pass); one that no op joined stays a step of its
own, and the report says why either way.
"""
from __future__ import annotations

import heapq

from ..graph import Graph
from ..ir import Operation, Tensor
from .boundaries import explain
from .legality import Kernel, can_fuse, join, pool_gradient_start, start, template_of
from .policy import choose, score
from .program import Program, copy_op


def _group(program: Program, report: list, boundaries: list, backend: str,
           options: dict) -> tuple[list[Kernel], dict[int, Kernel], dict, set[int]]:
    kernels: list[Kernel] = []
    notes: list[str] = []
    kernel_of: dict[int, Kernel] = {}
    depends: dict[int, frozenset[int]] = {}  # tensor id -> kernels it transitively depends on
    refusals: dict[int, list[tuple[str, str]]] = {}
    reasons: dict[tuple[int, int], str] = {}  # (tensor id, consumer op id) -> why they stayed apart
    position = {op.id: i for i, op in enumerate(program.operations)}
    for op in program.operations:
        upstream = frozenset().union(*(depends.get(t.id, frozenset()) for t in op.inputs))
        chosen = None
        if template_of(op) is not None:
            scored = []
            for k in dict.fromkeys(kernel_of[t.op.id] for t in op.inputs if t.op.id in kernel_of):
                ok, reason = can_fuse(k, op)
                if ok:
                    through = [t for t in op.inputs if not k.produces(t) and k.id in depends.get(t.id, ())]
                    if through:
                        ok, reason = False, f"{through[0].name} depends on the kernel itself (would form a cycle)"
                if ok:
                    scored.append((k, score(k, op)))
                else:
                    refusals.setdefault(k.id, []).append((f"{op.op} ({op.name})", reason))
                    _note(reasons, op, k, reason)
            chosen = choose(scored)
            if chosen is not None:
                join(chosen, op)
                for other, _ in scored:
                    if other is chosen:
                        continue
                    if _merge(chosen, other, depends, refusals, position):
                        for member in other.ops:
                            kernel_of[member.id] = chosen
                        kernels.remove(other)
                    else:
                        _note(reasons, op, other, f"{op.op} joined another kernel, and this one could not merge "
                                                  f"into it: {refusals[chosen.id][-1][1]}")
            else:
                chosen = start(max((k.id for k in kernels), default=-1) + 1, op)
                kernels.append(chosen)
            kernel_of[op.id] = chosen
        elif op.op == "max_pooling2d_gradient":
            why = pool_gradient_start(op, backend, options)
            if why:
                notes.append(f"pooling gradient {op.name} takes no epilogue: {why}")
            else:
                chosen = Kernel(max((k.id for k in kernels), default=-1) + 1, "pool_gradient", [op],
                                op.outputs[0].shape)
                kernels.append(chosen)
                kernel_of[op.id] = chosen
        mine = upstream | {chosen.id} if chosen is not None else upstream
        for t in op.outputs:
            depends[t.id] = mine
    for k in [k for k in kernels if k.template == "pool_gradient"]:
        notes.append(_pool_note(k, refusals, reasons, kernels, kernel_of))
    masks = _masks(program, kernels, kernel_of, notes)
    kernels.sort(key=lambda k: position[k.ops[0].id])
    renumber = {k.id: i for i, k in enumerate(kernels)}
    refusals = {renumber[k]: v for k, v in refusals.items() if k in renumber}
    for k in kernels:
        k.id = renumber[k.id]
    report.extend({"note": line} for line in notes)
    for k in kernels:
        report.append({"kernel": k.id, "template": k.template, "ops": [f"{o.op} ({o.name})" for o in k.ops],
                       "not_fused": refusals.get(k.id, [])})
    dropped = {m.id for found in masks.values() for m in found.values() if m.id not in kernel_of}
    recomputed = {(m.outputs[0].name, f"kernel{k.id}_{k.template}") for k, found in masks.items()
                  for m in found.values()}
    boundaries.extend(b for b in explain([o for o in program.operations if o.id not in dropped], kernel_of, reasons)
                      if (b["tensor"], b["consumer"]) not in recomputed)
    return kernels, kernel_of, masks, dropped


def _pool_note(k: Kernel, refusals: dict, reasons: dict, kernels: list[Kernel], kernel_of: dict) -> str:
    """The report's line for a pooling gradient's kernel; one that no op joined becomes a plain step again
    (it leaves `kernels` and `kernel_of`), its line saying why."""
    pool = next(o for o in k.ops if o.op == "max_pooling2d_gradient")
    if len(k.ops) > 1:
        taken = ", ".join(f"{o.op} ({o.name})" for o in k.ops if o is not pool)
        return f"pooling gradient {pool.name} took its epilogue: {taken}"
    kernels.remove(k)
    del kernel_of[pool.id]
    why = [r for _, r in refusals.get(k.id, [])] + [r for (t, _), r in reasons.items() if t == pool.outputs[0].id]
    return f"pooling gradient {pool.name} takes no epilogue: {why[0] if why else 'no elementwise op reads its result'}"


def _masks(program: Program, kernels: list[Kernel], kernel_of: dict, notes: list[str]) -> dict:
    """The ReLU masks that pooling gradient kernels compute instead of loading them: a mask `z > 0` (or
    `relu(z) > 0`) read by a kernel whose pooling's source is `relu(z)` is `relu(z) > 0` there (for every
    value, NaN and -0 included), from the source that kernel loads anyway. A mask no one else reads leaves
    its kernel (removed from it, and the kernel when it held nothing else). By kernel: {mask tensor id: the
    mask's op}."""
    found: dict[Kernel, dict[int, Operation]] = {}
    for k in kernels:
        if k.template != "pool_gradient":
            continue
        pool = next(o for o in k.ops if o.op == "max_pooling2d_gradient")
        x = pool.inputs[1]
        sources = {x.id} | ({x.op.inputs[0].id} if x.op.op == "relu" else set())
        for op in k.ops:
            for t in op.inputs:
                m = t.op
                if not k.produces(t) and t.id not in found.get(k, {}) and m.op == "greater_than" and \
                        m.inputs[0].id in sources and _inline_constant(m.inputs[1]) and \
                        not m.inputs[1].op.attrs["value"].any():
                    found.setdefault(k, {})[t.id] = m
                    notes.append(f"pooling gradient {pool.name} computes the mask {m.name} from its source "
                                 f"{x.name} instead of loading it")
    readers: dict[int, list] = {}
    for op in program.operations:
        for t in op.inputs:
            readers.setdefault(t.id, []).append(op)
    outputs = {t.id for t in program.outputs}
    for k, masks in found.items():
        for t, m in masks.items():
            home = kernel_of.get(m.id)
            if home is None or t in outputs or any(t not in found.get(kernel_of.get(r.id), {}) for r in readers[t]):
                continue
            home.ops.remove(m)
            del kernel_of[m.id]
            if not home.ops:
                kernels.remove(home)
    return found


def _note(reasons: dict, op, kernel: Kernel, reason: str) -> None:
    for t in op.inputs:
        if kernel.produces(t):
            reasons.setdefault((t.id, op.id), reason)


def _merge(into: Kernel, other: Kernel, depends: dict, refusals: dict, position: dict) -> bool:
    """Move every op of `other` into `into` when each may join and no path leaves and re-enters."""
    both = into.op_ids | other.op_ids
    for a, b in ((into, other), (other, into)):
        for member in a.ops:
            for t in member.inputs:
                if t.op.id not in both and b.id in depends.get(t.id, ()):
                    refusals.setdefault(into.id, []).append(
                        (f"kernel {other.id}", f"{t.name} lies on a path between the kernels (would form a cycle)"))
                    return False
    trial = Kernel(into.id, into.template, list(into.ops), into.frame, into.axes, dict(into.space))
    for member in sorted(other.ops, key=lambda o: position[o.id]):
        ok, reason = can_fuse(trial, member)
        if not ok:
            refusals.setdefault(into.id, []).append((f"kernel {other.id}", reason))
            return False
        join(trial, member)
    trial.ops.sort(key=lambda o: position[o.id])
    into.template, into.ops, into.frame, into.axes, into.space = trial.template, trial.ops, trial.frame, trial.axes, \
        trial.space
    for key, deps in depends.items():
        if other.id in deps:
            depends[key] = (deps - {other.id}) | {into.id}
    return True


def _schedule(program: Program, kernel_of: dict[int, Kernel], dropped: set[int]) -> list:
    """Nodes (kernels and standalone ops, less the `dropped` ones) in a topological order, earliest program
    position first."""
    position = {op.id: i for i, op in enumerate(program.operations)}
    node_of = {op.id: (kernel_of[op.id] if op.id in kernel_of else op) for op in program.operations
               if op.id not in dropped}
    nodes = list(dict.fromkeys(node_of.values()))
    key = {id(n): min(position[o.id] for o in n.ops) if isinstance(n, Kernel) else position[n.id] for n in nodes}
    members = {id(n): (n.ops if isinstance(n, Kernel) else [n]) for n in nodes}
    preds: dict[int, set[int]] = {id(n): set() for n in nodes}
    succs: dict[int, set[int]] = {id(n): set() for n in nodes}
    for n in nodes:
        for o in members[id(n)]:
            for t in o.inputs:
                if t.op.id in dropped:  # a mask the kernel computes itself: it reads the mask's source
                    t = t.op.inputs[0]
                p = node_of[t.op.id]
                if p is not n:
                    preds[id(n)].add(id(p))
                    succs[id(p)].add(id(n))
    by_id = {id(n): n for n in nodes}
    ready = [(key[id(n)], id(n)) for n in nodes if not preds[id(n)]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, nid = heapq.heappop(ready)
        order.append(by_id[nid])
        for s in succs[nid]:
            preds[s].discard(nid)
            if not preds[s]:
                heapq.heappush(ready, (key[s], s))
    assert len(order) == len(nodes), "the kernel graph has a cycle"
    return order


def _inline_constant(t: Tensor) -> bool:
    return t.op.op == "constant" and t.type.numel() == 1


def _build_kernel(g: Graph, k: Kernel, mapping: dict[int, Tensor], used_outside: set[int], masks: dict) -> None:
    """The kernel's `fusion` op in `g`; `masks` ({tensor id: op}, see `_masks`): masks it computes from its
    pooling's source instead of loading them."""
    body = Graph(f"kernel{k.id}")
    inner: dict[int, Tensor] = {}
    inputs: list[Tensor] = []
    mine = k.op_ids
    x = next((o.inputs[1] for o in k.ops if o.op == "max_pooling2d_gradient"), None)

    def operand(t: Tensor) -> None:
        if t.id in inner or t.op.id in mine:
            return
        if t.id in masks:
            operand(x)
            operand(t.op.inputs[1])
            inner[t.id] = copy_op(body, t.op, [inner[x.id], inner[t.op.inputs[1].id]])[0]
        elif _inline_constant(t):
            inner[t.id] = copy_op(body, t.op, [])[0]
        else:
            inner[t.id] = body.placeholder(t.shape, t.dtype, name=f"in{len(inputs)}")
            inputs.append(mapping[t.id])

    for op in k.ops:
        for t in op.inputs:
            operand(t)
        for old, new in zip(op.outputs, copy_op(body, op, [inner[t.id] for t in op.inputs])):
            inner[old.id] = new
    outs = [t for op in k.ops for t in op.outputs if t.id in used_outside]
    name = f"kernel{k.id}_{k.template}"
    attrs = {"body": Program(body, [inner[t.id] for t in outs], {"frame": k.frame, "axes": k.axes,
                                                                 "space": {inner[i].id: s for i, s in k.space.items()
                                                                           if i in inner}}),
             "template": k.template, "name": name}
    fused = g._emit("fusion", inputs, attrs, name)
    for old, new in zip(outs, fused.outputs):
        mapping[old.id] = new


def stitch(program: Program, ctx) -> Program:
    report: list = []
    boundaries: list = []
    backend, options = (ctx.backend, ctx.options) if ctx is not None else ("reference", {})
    kernels, kernel_of, masks, dropped = _group(program, report, boundaries, backend, options)
    used_outside = {t.id for t in program.outputs}
    for op in program.operations:
        for t in op.inputs:
            if t.op.id in kernel_of and kernel_of.get(op.id) is not kernel_of[t.op.id] and \
                    t.id not in masks.get(kernel_of.get(op.id), {}):
                used_outside.add(t.id)
    g = Graph(program.graph.name)
    mapping: dict[int, Tensor] = {}
    for node in _schedule(program, kernel_of, dropped):
        if isinstance(node, Kernel):
            _build_kernel(g, node, mapping, used_outside, masks.get(node, {}))
        else:
            for old, new in zip(node.outputs, copy_op(g, node, [mapping[t.id] for t in node.inputs])):
                mapping[old.id] = new
    if ctx is not None:
        ctx.fusion_report = [{"note": line} for line in ctx.attention_report + ctx.recurrent_report] + report
        ctx.boundaries = boundaries
    return Program(g, [mapping[t.id] for t in program.outputs], dict(program.notes))
