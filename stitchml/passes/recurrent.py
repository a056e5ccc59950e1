"""recurrent: one kernel per step of a recurrent network's layer, and per sampled token.

Requires: a simplified, pruned program. Ensures: every matched pattern is one
`fusion` op whose body holds the matched ops (the reference backend and the
debugger still run it op by op; the stitch pass leaves it alone):

* template "lstm_cell" (codegen/lstm.py): the LSTM cell as composites.lstm_cell
  emits it in float32 or float64,

      gates = matrix_multiplication(x, A) + matrix_multiplication(h, B) [+ bias]
      i, f, g, o = split(gates, 4, axis=-1)
      c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')

  with A, B any (strided) operands, e.g. transposed weights; x may be a gather
  of rows of a table by a vector of indices (an embedding), which the kernel
  reads in place;
* template "product_arg_max" (codegen/product_argmax.py): the arg maximum over
  the last axis of a pointwise function of a product `matrix_multiplication(h, W)`
  (B, N) whose N fits one tile, as greedy decoding and Gumbel-max sampling
  compute a token from the output layer. The other operands broadcast to
  (B, N); one may be a gather at a scalar index along the first axis (the
  loop index picking this step's random draws), read in place.

* template "lstm_step" (codegen/lstm_step.py): an lstm_cell whose h' is the x
  of a second lstm_cell of the same width whose h' feeds a product_arg_max:
  a token of a two-layer generator. The three matched fusions become one
  whose body holds them as fusion ops. On CUDA that is one persistent kernel
  per token (P <= SM count programs, a grid barrier between the layers, the
  last program to finish draws the token); option `lstm_step_fusion`: True
  (default; CUDA only, the interpreter cannot run a grid barrier and keeps the
  three kernels, saying why), False, "split" (the same stages as three kernels
  with no barrier, any backend) or "persistent" (forced: under the interpreter
  its bounded wait gives up and the run raises, which the tests check).

Every intermediate must be read by the pattern alone and be no output of the
program (the kernels store h', c' and the index only). Recurrent steps at
small batches are chains of tiny kernels whose count, not their work, sets
the time: these replace 4-6 launches (two products, their sum, the update;
the product, its epilogue, the arg maximum, the gathers' index arithmetic)
with one. That is a gain while the batch is small: on an H200 the 2x512 LSTM
demo generates 37,800 tokens/s fused at batch 1 against 22,000 unfused, but at
batch 64, where the products are real matrix products, cuBLAS's kernels win
(711,000 unfused against 259,000 fused with tl.dot tiles), so patterns of more
than MAX_BATCH rows are left to the other passes. Options `lstm_cell_fusion`
and `product_arg_max_fusion` (default True) turn them off, `recurrent_max_batch`
moves the limit; the CPU's native and reference backends keep their own
kernels.
"""
from __future__ import annotations

from ..codegen import lstm_step
from ..codegen.lstm import LstmSpec
from ..codegen.product_argmax import MAX_COLUMNS
from ..codegen.common import checks_divisor, triton_template
from ..graph import Graph
from ..ir import Operation, Tensor
from .program import CompileError, Program, copy_op

FLOATS = ("float32", "float64")
MAX_BATCH = 8  # rows of a fused step at most (see the module docstring)


class _Miss(Exception):
    """The pattern does not apply; the message says why."""


class _Uses:
    """Who reads what in a program, and which tensors are its outputs."""

    def __init__(self, program: Program):
        self.readers: dict[int, list[Operation]] = {}
        for op in program.operations:
            for t in op.inputs:
                self.readers.setdefault(t.id, []).append(op)
        self.outputs = {t.id for t in program.outputs}

    def only(self, t: Tensor, reader: str | None = None) -> Operation:
        """The one op reading `t` (of kind `reader`), or _Miss: an intermediate the kernel keeps in registers."""
        readers = self.readers.get(t.id, [])
        if t.id in self.outputs or len(readers) != 1:
            raise _Miss(f"{t.name} is read outside the pattern")
        if reader is not None and readers[0].op != reader:
            raise _Miss(f"{t.name} is read by {readers[0].op}, expected {reader}")
        return readers[0]


def _product(t: Tensor, uses: _Uses) -> Operation:
    op = t.op
    if op.op != "matrix_multiplication" or any(x.rank != 2 for x in op.inputs):
        raise _Miss(f"{t.name} is not a product of two matrices")
    uses.only(t)
    return op


def _other(op: Operation, t: Tensor) -> Tensor:
    a, b = op.inputs
    return b if a is t else a


def _match_lstm(split: Operation, uses: _Uses) -> tuple[list[Operation], list[Tensor], list[Tensor], LstmSpec]:
    """The cell ending in the readers of `split`: its ops, the fusion's inputs (x or table and indices, A, h, B,
    c[, bias]), its outputs (h', c') and spec; _Miss if none."""
    gates = split.inputs[0]
    if gates.rank != 2 or split.attrs["axis"] % 2 != 1 or len(split.outputs) != 4 or \
            len(set(split.attrs["sizes"])) != 1 or gates.dtype.name not in FLOATS:  # axis 1 or -1: the last
        raise _Miss("not a split of 2-D float32/float64 gates into four equal parts along the last axis")
    batch, hidden = gates.shape[0], split.attrs["sizes"][0]
    ops = [split]
    uses.only(gates)
    total, bias = gates, None
    if gates.op.op == "addition" and not all(x.op.op == "matrix_multiplication" for x in gates.op.inputs):
        add = gates.op
        total = next((x for x in add.inputs if x.op.op == "addition"), None)
        if total is None:
            raise _Miss("the gates are no sum of two products and a bias")
        bias = _other(add, total)
        if bias.shape not in ((4 * hidden,), (1, 4 * hidden)):
            raise _Miss(f"the bias {bias.name} of shape {bias.shape} is not one value per gate column")
        ops.append(add)
        uses.only(total)
    if total.op.op != "addition":
        raise _Miss("the gates are no sum of two products")
    ops.append(total.op)
    first, second = (_product(x, uses) for x in total.op.inputs)
    ops += [first, second]
    (x, a), (h, b) = first.inputs, second.inputs
    if x.shape[0] != batch or h.shape[0] != batch:
        raise _Miss(f"products of shapes {x.shape} x {a.shape} and {h.shape} x {b.shape} broadcast rows to {batch}")
    i, f, g, o = split.outputs
    sig_i, sig_f = uses.only(i, "sigmoid"), uses.only(f, "sigmoid")
    tanh_g, sig_o = uses.only(g, "tanh"), uses.only(o, "sigmoid")
    forget = uses.only(sig_f.outputs[0], "multiplication")
    c = _other(forget, sig_f.outputs[0])
    update = uses.only(sig_i.outputs[0], "multiplication")
    if _other(update, sig_i.outputs[0]) is not tanh_g.outputs[0]:
        raise _Miss("σ(i) is not multiplied by tanh(g)")
    uses.only(tanh_g.outputs[0])
    c_next = uses.only(forget.outputs[0], "addition")
    if _other(c_next, forget.outputs[0]) is not update.outputs[0]:
        raise _Miss("c' is not σ(f) c + σ(i) tanh(g)")
    uses.only(update.outputs[0])
    h_next = uses.only(sig_o.outputs[0], "multiplication")
    tanh_c = _other(h_next, sig_o.outputs[0])
    if tanh_c.op.op != "tanh" or tanh_c.op.inputs[0] is not c_next.outputs[0]:
        raise _Miss("h' is not σ(o) tanh(c')")
    uses.only(tanh_c)
    if c.shape != (batch, hidden):
        raise _Miss(f"the cell state {c.name} of shape {c.shape} is not ({batch}, {hidden})")
    ops += [sig_i, sig_f, tanh_g, sig_o, forget, update, c_next, tanh_c.op, h_next]
    if len({t.dtype for t in (x, a, h, b, c) + ((bias,) if bias is not None else ())}) != 1:
        raise _Miss("operands of several dtypes")
    gather = x.op.op == "gather" and x.op.attrs["axis"] == 0 and x.op.inputs[0].rank == 2 and \
        x.op.inputs[1].rank == 1 and x.id not in uses.outputs and len(uses.readers.get(x.id, [])) == 1
    inputs = (list(x.op.inputs) if gather else [x]) + [a, h, b, c] + ([bias] if bias is not None else [])
    if gather:
        ops.append(x.op)
    return ops, inputs, [h_next.outputs[0], c_next.outputs[0]], LstmSpec(bias is not None, gather)


def _elementwise(op: Operation) -> bool:
    return (op.op == "cast" or len(op.outputs) == 1 and triton_template(op) is not None) and not checks_divisor(op)


def _match_arg_max(arg: Operation, uses: _Uses) -> tuple[list[Operation], list[Tensor]]:
    """The product, its pointwise epilogue and the arg maximum ending in `arg`; the fusion's inputs (the
    product's operands first); _Miss if none."""
    z = arg.inputs[0]
    if z.rank != 2 or arg.attrs["axis"] != 1 or not z.dtype.is_floating:
        raise _Miss("not an arg maximum over the last axis of a 2-D float tensor")
    if z.shape[1] > MAX_COLUMNS:
        raise _Miss(f"{z.shape[1]} columns exceed one tile ({MAX_COLUMNS})")
    ops, leaves, product = [arg], [], None
    pending = [z]
    seen: set[int] = set()
    while pending:
        t = pending.pop()
        if t.id in seen:
            continue
        seen.add(t.id)
        op = t.op
        if op.op == "matrix_multiplication" and product is None and t.shape == z.shape:
            product = _product(t, uses)
            ops.append(op)
        elif op.op != "constant" and _elementwise(op) and t.shape == z.shape and \
                all(len(uses.readers.get(o.id, [])) == 1 and o.id not in uses.outputs for o in op.outputs):
            ops.append(op)
            pending += list(op.inputs)
        elif op.op == "gather" and op.attrs["axis"] == 0 and op.inputs[1].rank == 0 and \
                len(uses.readers.get(t.id, [])) == 1 and t.id not in uses.outputs:
            ops.append(op)
            leaves += list(op.inputs)
        elif not (op.op == "constant" and t.type.numel() == 1):
            leaves.append(t)
    if product is None:
        raise _Miss("no product of two matrices feeds the arg maximum through pointwise ops alone")
    if product.outputs[0].dtype.name not in FLOATS:
        raise _Miss(f"the product is {product.outputs[0].dtype.name}, not float32 or float64")
    inputs = list(product.inputs)
    for t in leaves:
        if all(t is not x for x in inputs):
            inputs.append(t)
    return ops, inputs


def _body(ops: list[Operation], inputs: list[Tensor], outputs: list[Tensor], position: dict[int, int],
          notes: dict) -> Program:
    """The fusion's body: placeholders for `inputs`, the matched ops in program order (one-element constants
    copied in)."""
    g = Graph("recurrent")
    inner = {t.id: g.placeholder(t.shape, t.dtype, name=t.name) for t in inputs}
    for op in sorted(ops, key=lambda o: position[o.id]):
        for t in op.inputs:
            if t.id not in inner:  # a one-element constant operand of the epilogue
                inner[t.id] = copy_op(g, t.op, [])[0]
        for old, new in zip(op.outputs, copy_op(g, op, [inner[t.id] for t in op.inputs])):
            inner[old.id] = new
    return Program(g, [inner[t.id] for t in outputs], notes)


STEP_TIMEOUT = ("a grid barrier of the persistent generation step timed out (its programs were not all resident "
                "on the GPU at once; a later run of this executable raises too): compile with "
                "options={'lstm_step_fusion': False}")


def _step_mode(ctx, options: dict) -> str:
    """How the lstm_step fusion runs: "persistent", "split" (three kernels), or why it does not apply."""
    mode = options.get("lstm_step_fusion", True)
    if mode is False:
        return "turned off (option lstm_step_fusion)"
    if mode not in (True, "persistent", "split"):
        raise CompileError(f"recurrent: option lstm_step_fusion expects True, False, 'persistent' or 'split', "
                           f"got {mode!r}")
    backend = ctx.backend if ctx is not None else "interpret"
    if mode is True and backend != "triton":
        return ("its grid barrier needs every program resident at once, which only a CUDA device promises "
                "(the interpreter runs programs one after another); option lstm_step_fusion='split' runs its "
                "stages as three kernels")
    return "split" if mode == "split" else "persistent"


def _sm_count(ctx, options: dict) -> int:
    if "sm_count" in options:
        return int(options["sm_count"])
    if ctx is not None and ctx.backend == "triton":
        import torch

        return torch.cuda.get_device_properties(ctx.device).multi_processor_count
    return 132


def _chain(found: dict[int, tuple], program: Program) -> list[tuple[int, int, int]] | str:
    """The (layer 1, layer 2, draw) keys of `found` that make a generation step, or why there is none."""
    cells = {k: v for k, v in found.items() if v[0] == "lstm_cell"}
    draws = {k: v for k, v in found.items() if v[0] == "product_arg_max"}
    chains, why = [], "no lstm_cell whose h' feeds another lstm_cell's x whose h' feeds a product's arg maximum"
    for k1, e1 in cells.items():
        for k2, e2 in cells.items():
            if e2[2][0] is not e1[3][0] or e2[4]["lstm_cell"].gather:
                continue
            for k3, e3 in draws.items():
                if e3[2][0] is not e2[3][0]:
                    continue
                h1, h2 = e1[3][0], e2[3][0]
                tainted = {t.id for t in e1[3] + e2[3]}  # what the cells' results feed, outside the kernels
                inside = {o.id for e in (e1, e2, e3) for o in e[1]}
                for op in program.operations:
                    if op.id not in inside and any(t.id in tainted for t in op.inputs):
                        tainted |= {t.id for t in op.outputs}
                if h1.shape != h2.shape or h1.dtype != h2.dtype:
                    why = f"the layers' states {h1.shape} {h1.dtype.name} and {h2.shape} {h2.dtype.name} differ"
                elif any(t.id in tainted for t in e1[2] + e2[2][1:] + e3[2][1:]):  # only x and h read h1', h2'
                    why = "an operand of the later kernels is computed from a cell's results"
                else:
                    chains.append((k1, k2, k3))
    return chains or why


def _merge_steps(found: dict[int, tuple], program: Program, position: dict[int, int], mode: str, ctx,
                 options: dict, report: list[str]) -> None:
    """Replace each (layer 1, layer 2, draw) chain in `found` by one lstm_step entry (codegen/lstm_step.py)."""
    chains = _chain(found, program)
    if isinstance(chains, str):
        report.append(f"lstm_step not applied: {chains}")
        return
    sm_count = _sm_count(ctx, options)
    for keys in chains:
        if any(k not in found for k in keys):  # a kernel of an earlier chain
            continue
        parts = [found.pop(k) for k in keys]
        hidden, batch = parts[0][3][0].shape[1], parts[0][3][0].shape[0]
        cfg = lstm_step.blocks(batch, hidden, sm_count, options)
        if mode == "persistent" and cfg.programs > sm_count:
            report.append(f"lstm_step not applied: {cfg.programs} programs of {cfg.units} units exceed the "
                          f"{sm_count} SMs the grid barrier needs them resident on")
            found.update(zip(keys, parts))
            continue
        links = {parts[0][3][0].id, parts[1][3][0].id}
        inputs: list[Tensor] = []
        for t in (t for p in parts for t in p[2]):
            if t.id not in links and all(t is not x for x in inputs):
                inputs.append(t)
        outputs = parts[0][3] + parts[1][3] + parts[2][3]
        notes = {"lstm_step": {"persistent": mode == "persistent", "sm_count": sm_count},
                 "flagged": STEP_TIMEOUT}
        ops = [o for p in parts for o in p[1]]
        found[max(keys, key=lambda k: position[k])] = ("lstm_step", ops, inputs, outputs, notes, parts)
        kind = ("one persistent kernel, a grid barrier between the layers" if mode == "persistent"
                else "three kernels (split)")
        report.append(f"lstm_step applied: both LSTM layers and the draw of a token in {kind}, {cfg.programs} "
                      f"programs of {cfg.units} hidden units")


def _step_body(parts: list[tuple], inputs: list[Tensor], outputs: list[Tensor], position: dict[int, int],
               notes: dict) -> Program:
    """An lstm_step's body: placeholders for `inputs`, then the three parts as fusion ops of their own."""
    g = Graph("recurrent")
    inner = {t.id: g.placeholder(t.shape, t.dtype, name=t.name) for t in inputs}
    for template, ops, ins, outs, part_notes, _ in parts:
        name = f"{template}_{max(ops, key=lambda o: position[o.id]).name}"
        fused = g._emit("fusion", [inner[t.id] for t in ins],
                        {"body": _body(ops, ins, outs, position, part_notes), "template": template, "name": name},
                        name)
        for old, new in zip(outs, fused.outputs):
            inner[old.id] = new
    return Program(g, [inner[t.id] for t in outputs], notes)


def recurrent(program: Program, ctx) -> Program:
    """The pass (see the module docstring)."""
    options = ctx.options if ctx is not None else {}
    if ctx is not None and ctx.backend not in ("triton", "interpret"):
        return program
    lstm_on = options.get("lstm_cell_fusion", True) is not False
    arg_on = options.get("product_arg_max_fusion", True) is not False
    max_batch = options.get("recurrent_max_batch", MAX_BATCH)
    uses = _Uses(program)
    position = {op.id: i for i, op in enumerate(program.operations)}
    # id of the last matched op -> (template, ops, inputs, outputs, notes, the parts of an lstm_step or None)
    found: dict[int, tuple] = {}
    absorbed: set[int] = set()
    report: list[str] = []
    for op in program.operations:
        try:
            if op.op == "split" and lstm_on:
                ops, inputs, outputs, spec = _match_lstm(op, uses)
                template, notes = "lstm_cell", {"lstm_cell": spec}
            elif op.op == "reduction_arg_maximum" and arg_on:
                ops, inputs = _match_arg_max(op, uses)
                outputs, template, notes = [op.outputs[0]], "product_arg_max", {}
            else:
                continue
            if outputs[0].shape[0] > max_batch:
                raise _Miss(f"{outputs[0].shape[0]} rows: above {max_batch}, the products' own kernels are faster")
        except _Miss as why:
            report.append(f"{'lstm_cell' if op.op == 'split' else 'product_arg_max'} not applied at {op.name}: {why}")
            continue
        if any(o.id in absorbed for o in ops):
            continue
        absorbed |= {o.id for o in ops}
        last = max(ops, key=lambda o: position[o.id])
        found[last.id] = (template, ops, inputs, outputs, notes, None)
        report.append(f"{template} applied at {op.name}: {len(ops)} ops in one kernel")
    if found:
        mode = _step_mode(ctx, options)
        if mode in ("persistent", "split"):
            _merge_steps(found, program, position, mode, ctx, options, report)
        elif any(e[0] == "lstm_cell" for e in found.values()):
            report.append(f"lstm_step not applied: {mode}")
    if ctx is not None:
        ctx.recurrent_report = report
    if not found:
        return program
    g = Graph(program.graph.name)
    mapping: dict[int, Tensor] = {}
    waiting: list[Operation] = []  # ops reading a fused output (c') placed before the fusion's last op

    def emit(op: Operation) -> None:
        if op.id in found:
            template, ops, inputs, outputs, notes, parts = found[op.id]
            name = f"{template}_{op.name}"
            body = (_step_body(parts, inputs, outputs, position, notes) if parts else
                    _body(ops, inputs, outputs, position, notes))
            fused = g._emit("fusion", [mapping[t.id] for t in inputs], {"body": body, "template": template,
                                                                       "name": name}, name)
            for old, new in zip(outputs, fused.outputs):
                mapping[old.id] = new
        else:
            for old, new in zip(op.outputs, copy_op(g, op, [mapping[t.id] for t in op.inputs])):
                mapping[old.id] = new

    for op in program.operations:
        if op.id in absorbed and op.id not in found:
            continue
        if op.id not in found and any(t.id not in mapping for t in op.inputs) or waiting and op.id not in found:
            waiting.append(op)
            continue
        emit(op)
        while waiting and all(t.id in mapping for t in waiting[0].inputs):
            emit(waiting.pop(0))
    if waiting:
        raise CompileError(f"recurrent: {waiting[0].name} reads a value no op makes")
    return Program(g, [mapping[t.id] for t in program.outputs], dict(program.notes))
