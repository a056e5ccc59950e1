"""The pointwise template: one program per BLOCK elements of one iteration space.

Every op of the kernel has N elements; element i of any value is its i-th
element in row-major order, so values stay in registers from op to op.
Inputs are loaded through their strided layout broadcast to the shape of the
op that reads them; outputs are stored contiguously at i.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import Tensor
from .common import (Layout, checks_divisor, compute_dtype, divisor_check, expression, flat_dims, header,
                     index_expr, literal, tl_type)


@dataclass
class KernelSource:
    """A generated kernel: its source, entry name, launch grid and meta-parameters."""

    name: str
    source: str
    grid: tuple[int, ...]
    num_warps: int
    constexprs: dict
    template: str
    checks: tuple = ()  # integer divisions it flags a zero divisor of (codes from options["first_check"] on)
    # Extents passed as arguments after the buffers (not written into the source), so that one source and
    # one Triton binary serve every size with the same launch blocks; Triton does not specialise on them.
    sizes: tuple = ()
    num_stages: int | None = None  # software pipelining depth (matmul kernels); None: Triton's default
    # Other (constexprs, num_warps) the same source launches with at other batch sizes: a package's kernel
    # bundle compiles them too, so that loading it for another batch size compiles nothing.
    alternatives: tuple = ()


# A bundle's batch sizes: from an eighth of the size it was built for to eight times it.
OTHER_SIZES = (1 / 8, 1 / 4, 1 / 2, 2, 4, 8)


def other_blocks(choose, n: int, own) -> tuple:
    """The launch blocks `choose(m)` gives for m = n times each of OTHER_SIZES, less `own`, in order."""
    found = []
    for f in OTHER_SIZES:
        b = choose(max(1, int(n * f)))
        if b != own and b not in found:
            found.append(b)
    return tuple(found)


def _block(n: int) -> tuple[int, int]:
    """(BLOCK, num_warps) for n elements: whole small tensors in one program; wide blocks for bandwidth."""
    if n <= 1024:
        b = 1 << max(n - 1, 0).bit_length()
        return max(b, 32), 1 if b <= 128 else 4
    # Measured on an H200 (benchmarks/tune_pointwise.py): 4096 x 4 warps streams 256M floats at ~96% of copy bandwidth.
    return (4096, 4) if n >= 1 << 22 else (1024, 4)


def generate(name: str, body, in_layouts: list[Layout], interpret: bool, options: dict | None = None) -> KernelSource:
    """Triton source for a pointwise fusion `body` (a Program) reading inputs of the given layouts."""
    ops = [op for op in body.operations if op.op != "placeholder"]
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    n = body.outputs[0].type.numel()
    wide = n >= 2**31 - 2**20
    lines = []
    options = options or {}
    # An L2 bypass hint for loads; measured no faster on an H200 at 256M elements, so off unless asked for.
    stream = options.get("pointwise_stream", False)
    loaded: dict[tuple[int, tuple], str] = {}
    value: dict[int, str] = {}
    checks: list = []
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    layout_of = {t.id: lay for t, lay in zip(placeholders, in_layouts)}

    def operand(t: Tensor, frame: tuple[int, ...]) -> str:
        if t.id in value:
            return value[t.id]
        key = (t.id, frame)
        if key not in loaded:
            lay = layout_of[t.id].broadcast_to(frame)
            idx = index_expr("i", flat_dims(lay, list(range(len(frame)))))
            var = f"x{len(loaded)}"
            scalar = idx == "0"
            ptr = f"{arg_of[t.id]} + {lay.offset}" if lay.offset else arg_of[t.id]
            hint = ', eviction_policy="evict_first"' if stream else ""
            load = f"tl.load({ptr})" if scalar else f"tl.load({ptr} + {idx}, mask=mask, other=0{hint})"
            lines.append(f"    {var} = {load}.to({tl_type(compute_dtype(t.dtype))})")
            loaded[key] = var
        return loaded[key]

    for k, op in enumerate(ops):
        out = op.outputs[0]
        if op.op == "constant":
            value[out.id] = literal(op.attrs["value"], out.dtype)
            continue
        args = [operand(t, out.shape) for t in op.inputs]
        if checks_divisor(op):
            lines.append(divisor_check(op, args, options.get("first_check", 0) + len(checks), "mask", "i * 0"))
            checks.append(op)
        lines.append(f"    v{k} = {expression(op, args)}")
        value[out.id] = f"v{k}"
    outs = [f"out{j}" for j in range(len(body.outputs))]
    for j, t in enumerate(body.outputs):
        v = value[t.id] if t.id in value else operand(t, t.shape)
        lines.append(f"    tl.store({outs[j]} + i, ({v}).to({tl_type(t.dtype)}), mask=mask)")
    block, warps = _block(n)
    block, warps = options.get("pointwise_block", block), options.get("pointwise_warps", warps)
    pinned = "pointwise_block" in options or "pointwise_warps" in options
    others = () if pinned else tuple(({"BLOCK": b}, w) for b, w in other_blocks(_block, n, (block, warps)))
    params = ", ".join([arg_of[t.id] for t in placeholders] + outs + (["err"] if checks else []))
    start = "tl.program_id(0).to(tl.int64) * BLOCK" if wide else "tl.program_id(0) * BLOCK"
    src = header(f"pointwise kernel {name}", interpret) + f'''

@triton.jit
def {name}({params}, n, BLOCK: tl.constexpr):
    i = {start} + tl.arange(0, BLOCK)
    mask = i < n
''' + "\n".join(lines) + "\n"
    return KernelSource(name, src, ((n + block - 1) // block,), warps, {"BLOCK": block}, "pointwise", tuple(checks),
                        (n,), alternatives=others)
