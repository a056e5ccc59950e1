"""Native loops for the data movement a prepared CPU dispatch (pipeline/cpu_run.py) would otherwise run
through an op's reference implementation every run: gather along an axis (embeddings, position tables),
concat and constant pad.

At a packaged transformer's sizes these ops move a few hundred elements, which takes a loop well under a
microsecond; the reference implementation's torch calls (an index_select after a wrap of the indices, a
torch.cat, F.pad) and the fresh tensors they return cost tens. Each loop copies the elements' bits as they
are (an unsigned integer of the element's size), so its result is the reference's bit for bit whatever the
type; inputs may have any strides (views made once), the output is contiguous (row-major).

Each function returns C++ whose function takes the inputs' data pointers, then the output's, then the
thread count (unused: the loops are far below the size where threads pay).
"""
from __future__ import annotations

import math

import torch

from .cpu import CppSource

BIT_TYPES = {1: "uint8_t", 2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}

# Index types a native gather reads.
INDEX_TYPES = {torch.int32: "int32_t", torch.int64: "int64_t"}


def _loops(shape: tuple, var: str, depth: int) -> tuple[list[str], int]:
    """`for` headers over `shape` with variables var0, var1, ..., indented from `depth`; the next depth."""
    lines = []
    for d, n in enumerate(shape):
        lines.append("    " * (depth + d) + f"for (int64_t {var}{d} = 0; {var}{d} < {n}; ++{var}{d})")
    return lines, depth + len(shape)


def _offset(var: str, strides: tuple) -> str:
    return " + ".join(f"{var}{d} * {s}LL" for d, s in enumerate(strides)) or "0"


def gather(name: str, x_shape: tuple, x_strides: tuple, index_shape: tuple, index_strides: tuple,
           index_type: torch.dtype, axis: int, itemsize: int) -> CppSource:
    """C++ for ``out = x.take(index, axis)`` (NumPy's take: out's shape is x[:axis] + index + x[axis+1:]),
    a negative index counting from the end. An index outside [-n, n) sets the int32 at the flag pointer to
    1 and writes zero bits in its place, so the caller can raise the reference's error after the run.

    Signature: ``(x, index, flag, out, threads)``."""
    t, it = BIT_TYPES[itemsize], INDEX_TYPES[index_type]
    n = x_shape[axis]
    outer, inner = x_shape[:axis], x_shape[axis + 1:]
    lines = [f'extern "C" void {name}(const {t}* __restrict__ x, const {it}* __restrict__ index, '
             f"int32_t* __restrict__ flag, {t}* __restrict__ out, int threads) {{",
             "    int64_t q = 0;"]
    head, depth = _loops(outer, "o", 1)
    lines += head
    lines.append("    " * depth + "{")
    depth += 1
    head, depth = _loops(index_shape, "j", depth)
    lines += head
    pad = "    " * depth
    base = _offset("o", x_strides[:axis])
    lines += [pad + "{",
              pad + f"    int64_t k = (int64_t)index[{_offset('j', index_strides)}];",
              pad + f"    if (k < 0) k += {n};",
              pad + f"    const bool ok = k >= 0 && k < {n};",
              pad + "    if (!ok) { *flag = 1; k = 0; }",
              pad + f"    const {t}* row = x + {base} + k * {x_strides[axis]}LL;"]
    head, inner_depth = _loops(inner, "i", depth + 1)
    lines += head
    lines.append("    " * inner_depth + f"out[q++] = ok ? row[{_offset('i', x_strides[axis + 1:])}] : ({t})0;")
    lines += [pad + "}", "    " * (len(outer) + 1) + "}", "}"]
    return CppSource(name, "\n".join(lines) + "\n", "copy")


def concat(name: str, shapes: list[tuple], strides: list[tuple], axis: int, itemsize: int) -> CppSource:
    """C++ for ``out = torch.cat(inputs, axis)`` (inputs of `shapes` with `strides`, in elements).

    Signature: ``(in0, ..., in{k-1}, out, threads)``."""
    t = BIT_TYPES[itemsize]
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    out_strides = [math.prod(out_shape[d + 1:]) for d in range(len(out_shape))]
    args = ", ".join(f"const {t}* __restrict__ in{i}" for i in range(len(shapes)))
    lines = [f'extern "C" void {name}({args}, {t}* __restrict__ out, int threads) {{']
    start = 0
    for i, (shape, st) in enumerate(zip(shapes, strides)):
        if math.prod(shape) == 0:
            continue
        head, depth = _loops(shape, "i", 1)
        lines += ["    {"] + head
        lines.append("    " * depth + f"out[{start * out_strides[axis]}LL + {_offset('i', tuple(out_strides))}] = "
                                      f"in{i}[{_offset('i', st)}];")
        lines.append("    }")
        start += shape[axis]
    lines.append("}")
    return CppSource(name, "\n".join(lines) + "\n", "copy")


def pad(name: str, shape: tuple, strides: tuple, left: tuple, right: tuple, value: torch.Tensor) -> CppSource:
    """C++ for a constant pad of x (`shape`, `strides`): `left[d]` elements of `value` (a scalar tensor of
    x's type) before axis d and `right[d]` after.

    Signature: ``(x, out, threads)``."""
    t = BIT_TYPES[value.element_size()]
    bits = int(value.reshape(1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[
        value.element_size()]).item()) % (1 << (8 * value.element_size()))
    out_shape = [n + a + b for n, a, b in zip(shape, left, right)]
    out_strides = [math.prod(out_shape[d + 1:]) for d in range(len(out_shape))]
    first = sum(a * s for a, s in zip(left, out_strides))
    lines = [f'extern "C" void {name}(const {t}* __restrict__ x, {t}* __restrict__ out, int threads) {{',
             f"    for (int64_t q = 0; q < {math.prod(out_shape)}LL; ++q) out[q] = ({t}){bits}ULL;"]
    head, depth = _loops(shape, "i", 1)
    lines += head
    lines.append("    " * depth + f"out[{first}LL + {_offset('i', tuple(out_strides))}] = x[{_offset('i', strides)}];")
    lines.append("}")
    return CppSource(name, "\n".join(lines) + "\n", "copy")


def strided_copy(name: str, shape: tuple, strides: tuple, itemsize: int) -> CppSource:
    """C++ copying the elements of a strided view (`shape`, `strides` in elements, read from its data
    pointer) in row-major order into a contiguous buffer; the bits as they are (any type of `itemsize` bytes)."""
    t = BIT_TYPES[itemsize]
    shape, strides = tuple(shape) or (1,), tuple(strides) or (1,)
    lines = [f'extern "C" void {name}(const {t}* __restrict__ in0, {t}* __restrict__ out0, int threads) {{',
             "    int64_t q = 0;"]
    for d, n in enumerate(shape):
        lines.append("    " * (d + 1) + f"for (int64_t i{d} = 0; i{d} < {n}; ++i{d})")
    index = " + ".join(f"i{d} * {s}LL" for d, s in enumerate(strides))
    lines += ["    " * (len(shape) + 1) + f"out0[q++] = in0[{index}];", "}"]
    return CppSource(name, "\n".join(lines) + "\n", "copy")
