"""Slabs: a matrix product and its pointwise epilogue planned slab by slab (runtime/slabs.py runs them).

The product is cut along one axis into slabs of at most `slab_bytes`: the
outermost axis whose trailing block fits (the rows of a 2-D product; whole
matrices, or rows of one matrix, of a batched one), every axis before it fixed
per slab. Each slab is a contiguous part of the row-major product and of each
output, so cuBLAS writes it as a product of its own (the operands' matching
rows, or batch entries) and one epilogue kernel, generated for the slab's
shape (a second one for a shorter last slab), reads it through views bound per
slab; the epilogue's other inputs are read through their layouts broadcast to
the product, cut the same way.

Slabs run only where compile options ask for them (`epilogue_slabs`: bytes
per slab; `epilogue_in_place`, `epilogue_overlap`: runtime/slabs.py): by
default every product keeps the whole-product path. Measured on an H200 at
8192^3 bfloat16 and float16 (benchmarks/bench_epilogue.py, contenders timed in
interleaved rounds), every slab layout was slower than the whole product, by
3-7 %: each slab's product reads all of the other operand again (128 MB per
slab there), while the L2 can save at most the product's read back, and the
erf GeLU epilogue spends about as long on arithmetic as on bytes (alone, 0.135
ms against 0.077 ms for a bias-only pass, which costs what a copy of the
product costs). Running a slab's epilogue on a second stream beside the next
slab's product gained nothing measurable: cuBLAS's kernel fills every SM.
"""
from __future__ import annotations

import itertools
import math

from ..codegen import pointwise
from ..codegen.common import Layout
from ..graph import Graph
from ..ir import Operation, TensorType
from ..registry import lookup
from ..runtime.launch import KernelLaunch
from ..runtime.slabs import Slab, Slabs, SlabView
from .program import Program

MAX_SLABS = 64  # beyond this the host work per slab outweighs what a slab can save


def slab_axis(shape: tuple[int, ...], itemsize: int, slab_bytes: int) -> tuple[int, int]:
    """(axis, extent per slab): the outermost axis, short of the last, whose trailing block fits in
    `slab_bytes`, and as many of its entries as fit (at least one)."""
    for axis in range(len(shape) - 1):
        block = math.prod(shape[axis + 1:]) * itemsize
        if block <= slab_bytes or axis == len(shape) - 2:
            return axis, max(1, min(shape[axis], slab_bytes // max(block, 1)))
    raise ValueError(f"a product has rank >= 2, got {shape}")


def _operand_index(operand_shape: tuple[int, ...], rank: int, fixed: tuple[int, ...], axis: int, rows: slice,
                   is_a: bool) -> tuple:
    """The index that cuts an operand of a product of rank `rank` for one slab: the batch axes fixed per
    slab, then the slab's range on `axis` (a batch axis, or the rows, which only `a` has)."""
    lead = rank - len(operand_shape)  # the operand's batch axes align right with the product's
    index = []
    for p in range(max(lead, 0), axis + 1):
        extent = operand_shape[p - lead]
        if p == rank - 2:  # the rows of the product: a's rows; b has none
            if is_a:
                index.append(rows)
            break
        if p < axis:
            index.append(0 if extent == 1 else fixed[p])
        else:
            index.append(slice(0, 1) if extent == 1 else rows)
    return tuple(index)


def _epilogue_for(epi: Program, frame: tuple[int, ...], product_shape: tuple[int, ...]) -> Program | None:
    """The epilogue program over one slab: its placeholders (the product, then its other inputs) of the
    slab's shape, every op of it too (each op has the product's shape: passes/legality.py). None when an
    op or output has another shape."""
    g = Graph("epilogue_slab")
    mapping = {}
    for op in epi.operations:
        if op.op == "placeholder":
            t = op.outputs[0]
            mapping[t.id] = g.placeholder(frame, t.dtype)
            continue
        if op.op != "constant" and any(t.shape != product_shape for t in op.outputs):
            return None
        types = None if op.op == "constant" else [TensorType(frame, t.dtype) for t in op.outputs]
        new = g._emit(op.op, [mapping[t.id] for t in op.inputs], op.attrs, op.name, types=types)
        for old, t in zip(op.outputs, new.outputs):
            mapping[old.id] = t
    if any(t.shape != product_shape for t in epi.outputs):
        return None
    return Program(g, [mapping[t.id] for t in epi.outputs], dict(epi.notes))


def build(name: str, contraction: Operation, epi: Program, layouts: list[Layout], a: int, b: int, epi_ins: list[int],
          outs: list[int], product_slot: int, whole, attrs: dict, slab_bytes: int, in_place: bool, overlap: bool,
          interpret: bool, options: dict, new_slot) -> Slabs | None:
    """The slabbed run of a matmul kernel (module doc), or None where it does not apply: not a plain matrix
    product, more than MAX_SLABS slabs (or one, unless in place), an epilogue that flags integer divisions,
    or, in place, an output of another type than the product.

    `layouts`: the epilogue's input layouts (the contiguous product first, then `epi_ins`' plan layouts);
    `product_slot`: the product's scratch; `whole`: the step's whole-product run; `new_slot()`: a slot for
    each view bound per slab."""
    if contraction.op != "matrix_multiplication":
        return None
    product = contraction.outputs[0]
    shape = tuple(product.shape)
    if in_place and epi.outputs[0].dtype != product.dtype:
        return None
    axis, rows = slab_axis(shape, product.dtype.itemsize, slab_bytes)
    lead = shape[:axis]
    count = math.prod(lead) * -(-shape[axis] // rows)
    if count > MAX_SLABS or (count == 1 and not in_place):
        return None
    a_shape, b_shape = (tuple(t.shape) for t in contraction.inputs)
    contiguous = Layout.contiguous(shape).strides
    # Per view: (source slot, strides over the whole product); the product's slab first, then the other
    # epilogue inputs, then the outputs.
    sources = [(outs[0] if in_place else product_slot, contiguous)]
    sources += [(s, lay.broadcast_to(shape).strides) for s, lay in zip(epi_ins, layouts[1:])]
    sources += [(s, contiguous) for s in outs]
    slots = [new_slot() for _ in sources]
    n_in = 1 + len(epi_ins)
    launches: dict[int, KernelLaunch] = {}
    slabs = []
    for fixed in itertools.product(*(range(n) for n in lead)):
        for start in range(0, shape[axis], rows):
            height = min(rows, shape[axis] - start)
            frame = (height,) + shape[axis + 1:]
            if height not in launches:
                body = _epilogue_for(epi, frame, shape)
                if body is None:
                    return None
                in_layouts = [Layout(frame, strides[axis:], 0) for _, strides in sources[:n_in]]
                src = pointwise.generate(f"{name}_slab{height}", body, in_layouts, interpret, options)
                if src.checks:
                    return None
                launches[height] = KernelLaunch(src, slots[:n_in], slots[n_in:])
            views = tuple(SlabView(slot, source, frame, strides[axis:],
                                   sum(i * s for i, s in zip(fixed, strides)) + start * strides[axis])
                          for slot, (source, strides) in zip(slots, sources))
            span = slice(start, start + height)
            slabs.append(Slab(_operand_index(a_shape, len(shape), fixed, axis, span, True),
                              _operand_index(b_shape, len(shape), fixed, axis, span, False),
                              views, launches[height]))
    vendor = lookup(contraction.op).vendor
    return Slabs(vendor, attrs, a, b, slabs, outs, epi_ins, whole, in_place, overlap)
