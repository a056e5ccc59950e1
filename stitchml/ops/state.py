"""State primitives: placeholders, constants, variables, reads and assignments.

Their implementations read and write the run context (runtime/eager.py):
feeds, cached constants and the graph's variable values. The run semantics
(docs/semantics.md): within one run every read of a variable sees its value
from the start of the run; assignments take effect at the end of the run, in
program order. A `read_variable` with a control dependency on an assignment
sees the latest value assigned so far in the run instead.
"""
from __future__ import annotations

from typing import Any

import torch

from .. import dtypes
from ..errors import ShapeError
from ..ir import Operation, Tensor, TensorType
from ..registry import STATE, Primitive, builder, register
from ..tensor_data import MAX_RANK, TensorData

placeholder = register(Primitive("placeholder", STATE, differentiable=False,
                                 doc="A tensor fed at run time; -1 marks an unknown extent, shape=None an unknown rank."))


@placeholder.def_infer
def _placeholder_infer(types, shape, dtype, source=None):
    return TensorType(None if shape is None else tuple(shape), dtype)


@placeholder.def_impl(needs_context=True)
def _placeholder_impl(ctx, **attrs):
    return ctx.feeds[ctx.op.id]


@builder("placeholder")
def _placeholder(g, shape=None, dtype=dtypes.float32, name=None) -> Tensor:
    """A tensor whose value is fed at each run.

    >>> import stitchml as sm; g = sm.Graph()
    >>> g.placeholder((-1, 784), sm.float32, name="images").type.shape
    (-1, 784)
    """
    if shape is not None:
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_RANK or any(d < -1 for d in shape):
            raise g._error("placeholder", f"shape {shape} must have rank <= {MAX_RANK} and extents >= 0 or -1")
    try:
        dt = dtypes.as_dtype(dtype)
    except TypeError as e:
        raise g._error("placeholder", str(e)) from None
    return g._emit1("placeholder", [], {"shape": shape, "dtype": dt}, name)


def _as_value(value: Any, dtype) -> torch.Tensor:
    """A contiguous CPU copy of a constant or initial value."""
    t = TensorData(value, dtype).torch()
    return t.detach().to("cpu").contiguous().clone()


constant = register(Primitive("constant", STATE, differentiable=False, doc="A tensor known when the graph is built."))


@constant.def_infer
def _constant_infer(types, value):
    return TensorType(tuple(value.shape), dtypes.as_dtype(value.dtype))


@constant.def_impl(needs_context=True)
def _constant_impl(ctx, **attrs):
    return ctx.constant(ctx.op)


@builder("constant")
def _constant(g, value, dtype=None, shape=None, name=None) -> Tensor:
    """A constant tensor from a scalar, nested list, array, torch tensor or TensorData.

    With `shape`, a scalar is filled to that shape (MPSGraph constantWithScalar:shape:).
    """
    try:
        t = _as_value(value, dtype)
    except (TypeError, ValueError) as e:
        raise g._error("constant", str(e)) from None
    if shape is not None:
        if t.dim() != 0:
            raise g._error("constant", f"shape= fills a scalar, but the value has shape {tuple(t.shape)}")
        t = t.expand(tuple(shape)).contiguous()
    return g._emit1("constant", [], {"value": t}, name)


variable = register(Primitive("variable", STATE, doc=(
    "A tensor that persists across runs; its value in a run is the value at the run's start.")))


@variable.def_infer
def _variable_infer(types, initial_value, source=None):
    return TensorType(tuple(initial_value.shape), dtypes.as_dtype(initial_value.dtype))


@variable.def_impl(needs_context=True)
def _variable_impl(ctx, **attrs):
    return ctx.variable(ctx.op)


@variable.def_vjp
def _variable_vjp(g, op, dy):
    return []  # a source: gradients stop here, at the `wrt` tensor


@builder("variable")
def _variable(g, initial_value, dtype=None, name=None) -> Tensor:
    """A variable holding `initial_value` until an `assign_variable` changes it."""
    try:
        t = _as_value(initial_value, dtype)
    except (TypeError, ValueError) as e:
        raise g._error("variable", str(e)) from None
    return g._emit1("variable", [], {"initial_value": t}, name)


read_variable = register(Primitive("read_variable", STATE, doc=(
    "The variable's value: from the run's start, or the latest assigned one when ordered after an assignment.")))


@read_variable.def_infer
def _read_variable_infer(types):
    return types[0]


@read_variable.def_impl(needs_context=True)
def _read_variable_impl(ctx, start_value):
    var_id = ctx.op.inputs[0].op.id
    if ctx.op.control_deps and var_id in ctx.assigned:
        return ctx.assigned[var_id]
    return start_value


@read_variable.def_vjp
def _read_variable_vjp(g, op, dy):
    return [dy]


def _variable_of(g, v, what) -> Operation:
    if not isinstance(v, Tensor) or v.graph is not g:
        raise g._error(what, f"expected a variable of this graph, got {v!r}")
    if v.op.op == "read_variable":
        v = v.op.inputs[0]
    if v.op.op != "variable":
        raise g._error(what, f"expected a variable (made by graph.variable), got the output of {v.op.op}", [v])
    return v


@builder("read_variable")
def _read_variable(g, v, name=None) -> Tensor:
    """Read a variable (see the module docstring for which value a read sees)."""
    return g._emit1("read_variable", [_variable_of(g, v, "read_variable")], None, name)


assign_variable = register(Primitive("assign_variable", STATE, differentiable=False,
                                     doc="Write a new value to a variable at the end of the run."))


@assign_variable.def_infer
def _assign_infer(types):
    var, value = types
    if value.dtype != var.dtype:
        raise ShapeError(f"the value's dtype {value.dtype} differs from the variable's {var.dtype}")
    fits = value.shape is None or (
        len(value.shape) == len(var.shape) and all(d in (-1, e) for d, e in zip(value.shape, var.shape))
    )
    if not fits:
        raise ShapeError(f"a value of shape {value.shape} cannot be assigned to a variable of shape {var.shape}")
    return []


@assign_variable.def_impl(needs_context=True)
def _assign_impl(ctx, current, value):
    var = ctx.op.inputs[0]
    if tuple(value.shape) != var.shape:
        raise ValueError(f"the value has shape {tuple(value.shape)}, the variable {var.shape}")
    ctx.assigned[var.op.id] = value
    return ()


@builder("assign_variable")
def _assign_variable(g, v, value, name=None) -> Operation:
    """Assign `value` to variable `v`; returns the Operation to pass as a target op."""
    var = _variable_of(g, v, "assign_variable")
    value = g.as_tensor(value, var.dtype)
    return g._emit("assign_variable", [var, value], None, name)
