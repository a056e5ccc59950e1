"""The persistent TMA matmul template (compute capability 9.0 and later): a 2-D product of half-type
operands, its tiles brought into shared memory by the Tensor Memory Accelerator through host-made
tensor descriptors, and its pointwise epilogue computed on the accumulator before one TMA store per output.

One program per SM (or two) walks the output tiles in groups of GROUP_M row blocks, so the tiles of B it
shares stay in L2. The epilogue is the matmul template's own (codegen/matmul.py, `TileEmitter.epilogue`):
the product rounded once to its dtype, then float32 until each output's one rounding, so results equal
those of cuBLAS followed by the epilogue kernel up to the product's summation order. With `subtile` the
epilogue runs on the two column halves of a tile in turn, so that the second half's arithmetic can overlap
the first half's store, and the store's staging buffer is half a tile.

TMA reads and writes in boxes of the tile's shape and fills the lanes past a tensor's edges with zeros
(stores there are dropped), so ragged M, N and K need no masks on the operands. Its rules: the innermost
axis contiguous, every other stride a multiple of 16 bytes, the base address 16-byte aligned. `unsupported`
checks what is known when compiling; the run checks the addresses (runtime/tma.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import dtypes
from .common import Layout, header, tl_type
from .matmul import GROUP_M, TileEmitter, rounded, split

DTYPES = ("float16", "bfloat16")  # wgmma's operands here: float32 products stay with cuBLAS (IEEE, no TF32)
# Smaller products stay with cuBLAS and the epilogue kernel: on an H200 persistent TMA kernels took 1.8-2.2x the
# bare product at 4096 x 4096 x 1024, against 1.65-1.7x for that path (benchmarks/gemm_trials.py).
MIN_WORK = 2**36


@dataclass(frozen=True)
class TmaConfig:
    """Tile extents, warps and pipeline stages per program, the epilogue in two column halves (`subtile`),
    Triton's warp specialisation and loop flattening of the tile loop, and programs per SM."""

    bm: int = 128
    bn: int = 256
    bk: int = 64
    warps: int = 8
    stages: int = 3
    subtile: bool = False
    warp_specialize: bool = False
    flatten: bool = True
    per_sm: int = 1

    @property
    def name(self) -> str:
        flags = "".join(f"-{f}" for f, on in (("sub", self.subtile), ("ws", self.warp_specialize)) if on)
        return f"triton-tma-{self.bm}x{self.bn}x{self.bk}-w{self.warps}-s{self.stages}-x{self.per_sm}{flags}"


# What a GPU times against cuBLAS and the epilogue kernel. On an H200 (benchmarks/gemm_trials.py, second call)
# at 8192^3 bfloat16 with bias + GeLU(erf), in interleaved rounds: two programs per SM of 128 x 128 tiles, the
# epilogue in halves, 1.080x (BLOCK_K 32, 4 stages, hand-written) and 1.086x (BLOCK_K 64, 3 stages) the bare
# product, against 1.099x for cuBLAS + the epilogue kernel; one program per SM of 128 x 256 tiles, 1.08-1.16x.
CONFIGS = (TmaConfig(bn=128, bk=32, warps=4, stages=4, subtile=True, per_sm=2),
           TmaConfig(bn=128, warps=4, stages=3, subtile=True, per_sm=2))


@dataclass
class TmaSource:
    """A generated TMA kernel: its source, the programs it launches, and per kernel argument (the body's
    placeholders, then its outputs) None for a pointer, or the block of the descriptor made over it and
    whether the descriptor views the argument transposed (an operand stored column by column)."""

    name: str
    source: str
    programs: int
    num_warps: int
    num_stages: int
    descriptors: list[tuple[tuple[int, int], bool] | None]


def _operand(lay: Layout, itemsize: int) -> tuple[bool, str]:
    """(transposed, why not) for an operand's layout: rows contiguous, or columns contiguous (read through a
    transposed descriptor), the other stride a multiple of 16 bytes."""
    rows, cols = lay.strides
    if cols == 1 and rows >= lay.shape[1] and rows * itemsize % 16 == 0:
        return False, ""
    if rows == 1 and cols >= lay.shape[0] and cols * itemsize % 16 == 0:
        return True, ""
    return False, f"strides {lay.strides} (elements of {itemsize} bytes): TMA needs one contiguous axis and the " \
                  f"other's stride a multiple of 16 bytes"


def unsupported(body, in_layouts: list[Layout]) -> str:
    """Why the template cannot compute matmul kernel `body` reading inputs of `in_layouts` ("" when it can)."""
    parts = split(body)
    product = parts.contraction
    if product.op != "matrix_multiplication":
        return f"{product.op} is not a matrix product"
    a, b = product.inputs
    out = product.outputs[0]
    if a.rank != 2 or b.rank != 2:
        return f"operands of rank {a.rank} and {b.rank}, not 2"
    if out.dtype.name not in DTYPES:
        return f"a {out.dtype.name} product (the template takes {' and '.join(DTYPES)})"
    if any(parts.prologues):
        return "an operand is computed in the kernel (a prologue)"
    if a is b:
        return "both operands are one tensor"
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    for t in (a, b):
        if any(t in op.inputs for op in parts.epilogue):
            return f"operand {t.name} is also read by the epilogue"
        why = _operand(in_layouts[placeholders.index(t)], t.dtype.itemsize)[1]
        if why:
            return f"operand {t.name}: {why}"
    for t in body.outputs:
        if t.shape != out.shape:
            return f"output {t.name} of shape {t.shape} is not the product's {out.shape}"
        if t.shape[1] * t.dtype.itemsize % 16:
            return f"output {t.name}'s rows of {t.shape[1]} x {t.dtype.itemsize} bytes are not a multiple of 16"
    for op in parts.epilogue:
        if op.op in ("floor_division", "modulo") and not op.inputs[0].dtype.is_floating:
            return f"{op.op} ({op.name}) divides integers (only the pointwise template flags zero divisors)"
    return ""


def configs(body, in_layouts: list[Layout], mode: str, capability: tuple[int, int] | None,
            given: list[dict] | None = None) -> tuple[list[TmaConfig], str]:
    """The configurations to generate for matmul kernel `body` and why there are none ("" when there are).

    `mode` is compile option `matmul_tma` where it offers the template: "measure" (on a GPU of compute
    `capability` 9.0 or later, for products of at least MIN_WORK multiply-adds, each of CONFIGS joins the
    measured choice) or "always" (one configuration wherever the template applies, under the interpreter
    (`capability` None) too). `given` (option `matmul_tma_configs`, dicts of TmaConfig fields) replaces the
    configurations."""
    why = unsupported(body, in_layouts)
    if why:
        return [], why
    product = split(body).contraction
    (m, n), k = product.outputs[0].shape, product.inputs[0].shape[1]
    if capability is not None and capability < (9, 0):
        return [], f"compute capability {capability[0]}.{capability[1]} has no TMA"
    if mode == "measure" and m * n * k < MIN_WORK:
        return [], f"{m} x {n} x {k} is below the template's {MIN_WORK} multiply-adds"
    if given is not None:
        return [TmaConfig(**c) for c in given], ""
    return [interpreter_config(m, n, k)] if capability is None else list(CONFIGS), ""


def interpreter_config(m: int, n: int, k: int) -> TmaConfig:
    """Small tiles for the interpreter, which pays per program and per tile: still several tiles per program
    and several steps along K wherever the shape has them."""
    def fit(d: int, most: int) -> int:
        return max(16, min(most, 1 << max(d - 1, 0).bit_length()))
    return TmaConfig(fit(m, 32), fit(n, 32), fit(k, 16), 4, 1, subtile=True, warp_specialize=True, flatten=False)


def generate(name: str, body, in_layouts: list[Layout], interpret: bool, config: TmaConfig,
             sms: int) -> TmaSource:
    """Triton source for matmul kernel `body` (`unsupported` must have said "") with `config`'s tiles, for a
    GPU of `sms` streaming multiprocessors."""
    parts = split(body)
    product = parts.contraction
    out = product.outputs[0]
    dt = out.dtype
    a, b = product.inputs
    m, n = out.shape
    k = a.shape[1]
    c = config
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    em = TileEmitter(placeholders, in_layouts, ())
    wide = max([t.type.numel() for t in placeholders] + [m * n]) >= 2**31 - 2**20
    cast = ".to(tl.int64)" if wide else ""
    # the interpreter holds bfloat16 as raw 16-bit integers, which its tl.dot multiplies as integers
    widen = ".to(tl.float32)" if interpret and dt == dtypes.bfloat16 else ""
    precision = ', input_precision="ieee"' if widen else ""
    descriptors: list[tuple[tuple[int, int], bool] | None] = [None] * len(placeholders)
    loads = []
    for t, (rows, cols), (at_row, at_col) in ((a, (c.bm, c.bk), ("om", "k0")), (b, (c.bk, c.bn), ("k0", "on"))):
        i = placeholders.index(t)
        transposed = _operand(in_layouts[i], t.dtype.itemsize)[0]
        if transposed:  # the descriptor walks the stored (columns x rows) matrix; the tile is its transpose
            descriptors[i] = ((cols, rows), True)
            loads.append(f"{em.arg_of[t.id]}.load([{at_col}, {at_row}]).T{widen}")
        else:
            descriptors[i] = ((rows, cols), False)
            loads.append(f"{em.arg_of[t.id]}.load([{at_row}, {at_col}]){widen}")
    halves = 2 if c.subtile else 1
    width = c.bn // halves
    descriptors += [((c.bm, width), False)] * len(body.outputs)
    lines = []
    if c.subtile:
        lines.append(f"        halves = tl.split(tl.permute(tl.reshape(acc, ({c.bm}, 2, {width})), (0, 2, 1)))")
    for h in range(halves):
        acc = f"halves[{h}]" if c.subtile else "acc"
        em.lanes["n"] = (f"rn{h}", f"n_ok{h}")
        shift = f" + {h * width}" if h else ""
        lines += [f"        rn{h} = (on{shift} + tl.arange(0, {width})){cast}", f"        n_ok{h} = rn{h} < {n}",
                  f"        c{h} = {rounded(acc, dt)}"]
        epilogue, value = em.epilogue(parts, out, f"c{h}")
        lines += ["    " + line for line in epilogue]
        for i, t in enumerate(body.outputs):
            lines.append(f"        out{i}.store([om, on{shift}], ({value[t.id]}).to({tl_type(t.dtype)}))")
    if any(re.search(r"\b(rm|m_ok)\b", line) for line in lines):  # an epilogue input that varies along M
        lines[:0] = [f"        rm = (om + tl.arange(0, {c.bm})){cast}", f"        m_ok = rm < {m}"]
    blocks_m, blocks_n = -(-m // c.bm), -(-n // c.bn)
    programs = max(1, min(sms * c.per_sm, blocks_m * blocks_n))
    params = ", ".join([em.arg_of[t.id] for t in placeholders] + [f"out{i}" for i in range(len(body.outputs))])
    src = header(f"persistent TMA matmul kernel {name}", interpret) + f'''

@triton.jit
def {name}({params}):
    for tile in tl.range(tl.program_id(0), {blocks_m * blocks_n}, {programs}, flatten={c.flatten}, \
warp_specialize={c.warp_specialize}):
        group = tile // {GROUP_M * blocks_n}
        first_m = group * {GROUP_M}
        rows_here = tl.minimum({blocks_m} - first_m, {GROUP_M})
        om = (first_m + (tile % {GROUP_M * blocks_n}) % rows_here) * {c.bm}
        on = ((tile % {GROUP_M * blocks_n}) // rows_here) * {c.bn}
        acc = tl.zeros(({c.bm}, {c.bn}), dtype=tl.float32)
        for k0 in range(0, {k}, {c.bk}):
            acc = tl.dot({loads[0]}, {loads[1]}, acc{precision})
''' + "\n".join(lines) + "\n"
    return TmaSource(name, src, programs, c.warps, c.stages, descriptors)

