"""The generation-step template: both LSTM layers and the draw of a token, one kernel per token on CUDA.

The body (passes/recurrent.py, template "lstm_step") holds three fusion ops in
order: an "lstm_cell" (layer 1, x possibly gathered from an embedding table),
an "lstm_cell" whose x is layer 1's h' (layer 2, the same width H), and a
"product_arg_max" whose product reads layer 2's h'. Program p owns hidden
units [p·U, (p+1)·U) of both layers; P = ⌈H / U⌉ programs:

    stage 0   layer 1's gates of its units (whole rows of W_ih and W_hh read
              at once: the K loop is unrolled, so every tile's loads are in
              flight together), the update, h1' and c1' stored; then the
              recurrent half of layer 2's gates (h2 · W_hh2: it does not
              need h1'), kept in registers
    barrier   every program's h1' stored
    stage 1   the input half of layer 2's gates from all of h1', the update,
              h2' and c2' stored, and the output layer's product restricted
              to its units: a partial row of logits per program
    arrival   the last program to arrive sums the P partial rows, applies the
              epilogue (bias, temperature, the step's noise) and stores each
              row's arg maximum: the token

so a token is one launch instead of three kernels. The barrier is an arrival
counter and a generation word in the step's own sync buffer: the last program
to arrive resets the counter and bumps the generation, the others spin on it
with acquire atomics, and data other programs wrote is loaded past L1
(".cg"). It is only correct when all P programs are resident at once, so the
pass uses it only on CUDA with P ≤ the SM count (one program per SM), never
under the interpreter (its programs run one after another). Every spin is
bounded (`SPIN`): a program that gives up flags the run (`err`, the step's
own check code: the run raises ExecutionError) and poisons the sync buffer,
so that every later launch flags at once instead of trusting a counter left
half way; no launch ever hangs.

`persistent=False` emits the same stages as three launches of the same source
(stage 0 and 1 over P programs, the draw in one), no barrier: the form the
CPU's interpreter runs, and a fallback.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..dtypes import as_dtype
from ..registry import lookup
from .common import Layout, header, tl_type
from .pointwise import KernelSource
from .product_argmax import arg_max, epilogue

SPIN = 1 << 22  # acquire polls of a barrier before a program gives up (seconds, far beyond any real wait)
SYNC_WORDS = 4  # arrival counter, generation, poison, unused


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class StepBlocks:
    """Hidden units per program, programs, batch rows (a power of two), K depth per tile, warps."""

    units: int
    programs: int
    batch: int
    depth: int
    warps: int


def blocks(batch: int, hidden: int, sm_count: int, options: dict) -> StepBlocks:
    """Units per program: a power of two, at least 8 and enough for at most `sm_count` programs (the
    barrier's residency condition). On an H200 the 2x512 demo ran alike with 64 programs of 8 units and
    128 of 4 (within the runs' spread), 20 % slower with 32 of 16; 8 keeps the barrier's arrivals few.
    Options lstm_step_units, lstm_step_depth and lstm_step_warps set the blocks (benchmarks tune them;
    the pass refuses units that need more programs than SMs)."""
    units = options.get("lstm_step_units", max(8, _pow2(-(-hidden // sm_count))))
    b = _pow2(batch)
    return StepBlocks(units, -(-hidden // units), b, options.get("lstm_step_depth", max(32, 128 // b)),
                      options.get("lstm_step_warps", 4))


@dataclass
class StepSources:
    """The kernels of a step: persistent one launch, else three (`stages`); the partial rows' size
    (elements) and dtype name; the gathers it flags (codes from options["first_check"] on; the next code,
    a barrier that timed out, is the step's own: the caller appends the step to its checks)."""

    stages: list[KernelSource]
    partials: int
    partial_dtype: str
    checks: list


def _cell(layer: int, spec, args: list[str], lays: list[Layout], hidden: int, elem: str, code: int,
          x_arg: str | None, part: str) -> str:
    """Stage code of one cell: `part` "all", "recurrent" (h · B into g0..g3 only) or "input" (x · A added,
    then the update and the stores). `x_arg`: x is that row-major (batch, H) buffer other programs wrote."""
    it = iter(zip(args, lays))
    x, x_lay = next(it)
    index = next(it) if spec.gather else None
    (a, a_lay), (h, h_lay), (b, b_lay), (c, c_lay) = next(it), next(it), next(it), next(it)
    bias = next(it) if spec.bias else None
    lines = []
    if part in ("all", "recurrent"):
        lines.append("\n".join(f"g{k} = tl.zeros((BLOCK_B, BLOCK_K, U), {elem})" for k in range(4)))

    def product(src: str, rows: str, ok: str, lay: Layout, weights: str, w_lay: Layout, extent: int, cache: str):
        load_w = "".join(
            f"\n    w = tl.load({weights} + ks[None, :, None] * {w_lay.strides[0]}"
            f" + ({k * hidden} + units)[None, None, :] * {w_lay.strides[1]},"
            f" mask=k_ok[None, :, None] & unit_ok[None, None, :], other=0.0)"
            f"\n    g{k} += v * w" for k in range(4))
        return f"""for k0 in tl.static_range(0, {extent}, BLOCK_K):
    ks = k0 + tl.arange(0, BLOCK_K)
    k_ok = ks < {extent}
    v = tl.load({src} + ({rows})[:, None, None] + ks[None, :, None] * {lay.strides[1]},
                mask={ok}[:, None, None] & k_ok[None, :, None], other=0.0{cache}){load_w}"""

    if part in ("all", "recurrent"):
        lines.append(product(h, f"rows64 * {h_lay.strides[0]}", "in_rows", h_lay, b, b_lay, b_lay.shape[0], ""))
    if part in ("all", "input"):
        if index is not None:
            (i_arg, i_lay) = index
            lines.append(f"""x_index = tl.load({i_arg} + rows * {i_lay.strides[0]}, mask=in_rows, other=0).to(tl.int64)
x_index = tl.where(x_index < 0, x_index + {x_lay.shape[0]}, x_index)
x_ok = in_rows & (x_index >= 0) & (x_index < {x_lay.shape[0]})
tl.atomic_min(err + rows * 0, {code}, mask=in_rows & ~x_ok)""")
            rows_of_x = f"x_index * {x_lay.strides[0]}"
        else:
            lines.append("x_ok = in_rows")
            rows_of_x = f"rows64 * {x_lay.strides[0]}"
        cache = ', cache_modifier=".cg"' if x_arg is not None else ""
        lines.append(product(x_arg or x, rows_of_x, "x_ok", x_lay, a, a_lay, a_lay.shape[0], cache))
        lines.append("\n".join(f"g{k} = tl.sum(g{k}, axis=1)" for k in range(4)))  # one reduction per gate
        if bias is not None:
            bias_arg, bias_lay = bias
            lines.append("\n".join(f"g{k} += tl.load({bias_arg} + ({k * hidden} + units) * {bias_lay.strides[-1]}, "
                                   f"mask=unit_ok, other=0.0)[None, :]" for k in range(4)))
        sigmoid, tanh = lookup("sigmoid").triton, lookup("tanh").triton
        lines.append(f"""c = tl.load({c} + rows64[:, None] * {c_lay.strides[0]} + units[None, :] * {c_lay.strides[1]},
            mask=in_cell, other=0.0).to({elem})
c_next = {sigmoid.format("g1")} * c + {sigmoid.format("g0")} * {tanh.format("g2")}
h{layer} = {sigmoid.format("g3")} * {tanh.format("c_next")}
tl.store(h_out{layer} + out_at, h{layer}.to({elem}), mask=in_cell)
tl.store(c_out{layer} + out_at, c_next.to({elem}), mask=in_cell)""")
    return textwrap.indent("\n".join(lines), "        ")


def generate(name: str, body, layouts: list[Layout], hidden: int, batch: int, sm_count: int, persistent: bool,
             interpret: bool, options: dict) -> StepSources:
    """Triton source for an lstm_step `body` whose placeholders have these layouts."""
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    layout_of = {t.id: lay for t, lay in zip(placeholders, layouts)}
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    cell1, cell2, draw = (op for op in body.operations if op.op == "fusion")
    cfg = blocks(batch, hidden, sm_count, options)
    dtype = cell1.outputs[0].dtype.name
    elem = tl_type(as_dtype(dtype))
    first = options.get("first_check", 0)
    checks = [o for o in cell1.attrs["body"].operations if o.op == "gather"]
    h1_out = "h_out0"

    def cell_args(op):
        return ([arg_of.get(t.id, h1_out) for t in op.inputs], [layout_of.get(t.id) for t in op.inputs])

    a1, l1 = cell_args(cell1)
    a2, l2 = cell_args(cell2)
    l2[0] = Layout((batch, hidden), (hidden, 1))
    spec1, spec2 = cell1.attrs["body"].notes["lstm_cell"], cell2.attrs["body"].notes["lstm_cell"]
    stage0 = _cell(0, spec1, a1, l1, hidden, elem, first, None, "all")
    recurrent2 = _cell(1, spec2, a2, l2, hidden, elem, first, None, "recurrent")
    input2 = _cell(1, spec2, a2, l2, hidden, elem, first, h1_out, "input")
    # the draw's body: its placeholders are the fusion's inputs; the product's first operand is h2' (registers)
    inner = draw.attrs["body"]
    inner_ph = [op.outputs[0] for op in inner.operations if op.op == "placeholder"]
    d_layout = {p.id: layout_of.get(t.id) for p, t in zip(inner_ph, draw.inputs)}
    d_arg = {p.id: arg_of.get(t.id, "h_out1") for p, t in zip(inner_ph, draw.inputs)}
    product = next(op for op in inner.operations if op.op == "matrix_multiplication")
    w_lay = d_layout[product.inputs[1].id]
    columns = w_lay.shape[1]
    block_n = max(16, _pow2(columns))
    lines, z, flagged = epilogue(inner, d_layout, d_arg, (batch, columns), first + len(checks))
    checks += flagged
    timeout = first + len(checks)  # the caller adds the step itself to its checks
    row_size = cfg.batch * block_n
    block_p = max(1, min(_pow2(cfg.programs), 16384 // row_size))
    partial_at = "pid * (BLOCK_B * BLOCK_N) + rows[:, None] * BLOCK_N + cols[None, :]"
    body_of_draw = f"""row_in = in_rows
col_in = col_ok
both = in_rows[:, None] & col_ok[None, :]
p = tl.zeros((BLOCK_B, BLOCK_N), {elem})
for q0 in range(0, {cfg.programs}, BLOCK_P):
    qs = q0 + tl.arange(0, BLOCK_P)
    part = tl.load(partial + qs[:, None, None] * (BLOCK_B * BLOCK_N) + rows[None, :, None] * BLOCK_N
                   + cols[None, None, :], mask=(qs < {cfg.programs})[:, None, None], other=0.0, cache_modifier=".cg")
    p += tl.sum(part, axis=0)
""" + textwrap.dedent("\n".join(lines)) + "\n" + arg_max(z, "token_out", "")

    def draw(indent: str) -> str:
        return textwrap.indent(body_of_draw, indent)

    barrier = f"""        tl.debug_barrier()  # every thread's stores before the arrival
        gen = tl.atomic_add(sync + 1, 0, sem="acquire", scope="gpu")
        arrived = tl.atomic_add(sync, 1, sem="acq_rel", scope="gpu")
        if arrived == {cfg.programs - 1}:  # the last: reset the counter, then release the others
            tl.atomic_xchg(sync, 0, sem="relaxed", scope="gpu")
            tl.atomic_add(sync + 1, 1, sem="release", scope="gpu")
        seen = gen
        spins = 0
        while live & (seen == gen) & (spins < SPIN):
            seen = tl.atomic_add(sync + 1, 0, sem="acquire", scope="gpu")
            spins += 1
        timed_out = live & (seen == gen)
        tl.atomic_xchg(sync + 2, 1, mask=timed_out)
        tl.atomic_min(err, {timeout}, mask=timed_out)
        tl.debug_barrier()
"""
    args = [arg_of[t.id] for t in placeholders] + ["h_out0", "c_out0", "h_out1", "c_out1", "token_out",
                                                  "partial", "sync", "err"]
    src = header(f"LSTM generation step kernel {name}", interpret) + f'''

@triton.jit
def {name}({", ".join(args)}, BLOCK_B: tl.constexpr, U: tl.constexpr, BLOCK_K: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, STAGE: tl.constexpr, SPIN: tl.constexpr):
    # STAGE -1: every stage, with the barriers (persistent); 0, 1, 2: that stage alone (three launches)
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_B)
    rows64 = rows.to(tl.int64)
    in_rows = rows < {batch}
    units = pid * U + tl.arange(0, U)
    unit_ok = units < {hidden}
    in_cell = in_rows[:, None] & unit_ok[None, :]
    out_at = rows64[:, None] * {hidden} + units[None, :]
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < {columns}
    if STAGE < 0:
        live = tl.load(sync + 2, volatile=True) == 0  # a barrier timed out in an earlier launch: flag, never trust
        tl.atomic_min(err, {timeout}, mask=~live)
    if STAGE <= 0:
{stage0}
    if (STAGE < 0) | (STAGE == 1):
        # the output layer's rows of this program's units, loaded before they are needed
        w_out = tl.load({d_arg[product.inputs[1].id]} + units[:, None] * {w_lay.strides[0]}
                        + cols[None, :] * {w_lay.strides[1]}, mask=unit_ok[:, None] & col_ok[None, :], other=0.0)
{recurrent2}
    if STAGE < 0:
{barrier}
    if (STAGE < 0) | (STAGE == 1):
{input2}
        tl.store(partial + {partial_at}, tl.sum(h1[:, :, None] * w_out[None, :, :], axis=1),
                 mask=in_rows[:, None] & col_ok[None, :])
    if STAGE < 0:
        tl.debug_barrier()
        last = tl.atomic_add(sync, 1, sem="acq_rel", scope="gpu") == {cfg.programs - 1}
        if last:  # every partial row is stored: this program draws the token
            tl.atomic_xchg(sync, 0, sem="relaxed", scope="gpu")
            tl.atomic_add(sync + 1, 1, sem="release", scope="gpu")
{draw("            ")}
    if STAGE == 2:
{draw("        ")}
'''
    base = {"BLOCK_B": cfg.batch, "U": cfg.units, "BLOCK_K": cfg.depth, "BLOCK_N": block_n, "BLOCK_P": block_p,
            "SPIN": options.get("lstm_step_spin", SPIN)}
    if persistent:
        stages = [KernelSource(name, src, (cfg.programs,), cfg.warps, {**base, "STAGE": -1}, "lstm_step")]
    else:
        stages = [KernelSource(name, src, grid, cfg.warps, {**base, "STAGE": k}, "lstm_step")
                  for k, grid in enumerate([(cfg.programs,), (cfg.programs,), (1,)])]
    return StepSources(stages, cfg.programs * row_size, dtype, checks)
