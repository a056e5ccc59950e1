"""Reduction primitives: sum, mean, maximum, minimum, product, arg max/min.

`axes=None` reduces every axis; negative axes count from the end; with
`keep_dims=True` reduced axes stay as extent 1 (MPSGraph's behaviour), else
they are dropped (NumPy's and PyTorch's default). Sums keep the input dtype
(bool sums to int64); half-precision inputs accumulate in float32.
"""
from __future__ import annotations

import torch

from .. import dtypes
from ..errors import ShapeError
from ..ir import UNKNOWN, TensorType, normalize_axes, normalize_axis
from ..registry import OPAQUE, REDUCTION, Combine, Primitive, builder, register


_HALF = (torch.float16, torch.bfloat16)


def in_float32(impl):
    """`impl` run on half-type CPU tensors as float32, its floating results rounded once to the half type.

    For reference implementations that sum (contractions, window sums, scatters, scans). torch's half
    kernels on the CPU differ between processors (oneDNN picks other kernels on AMD and Intel) and some
    round partial sums to the half type; in float32 every CPU is within float32 rounding of the others,
    and one final rounding follows. CUDA's libraries accumulate half types in float32 themselves.
    """

    def run(*args, **attrs):
        half = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in _HALF
                     and a.device.type == "cpu"), None)
        if half is None:
            return impl(*args, **attrs)
        out = impl(*(a.float() if isinstance(a, torch.Tensor) and a.dtype in _HALF else a for a in args), **attrs)
        if isinstance(out, (tuple, list)):
            return type(out)(o.to(half) if o.is_floating_point() else o for o in out)
        return out.to(half) if out.is_floating_point() else out

    run.__name__, run.__doc__ = impl.__name__, impl.__doc__
    return run


def _reduced_shape(shape, axes, keep_dims):
    if shape is None:  # every axis of an unknown rank reduced away leaves a scalar
        return () if axes is None and not keep_dims else None
    if axes is None:
        axes = tuple(range(len(shape)))
    axes = {a % len(shape) for a in axes} if shape else set()
    if keep_dims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _runtime_axes(x: torch.Tensor, axes) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(x.dim()))
    return tuple(sorted({a % x.dim() for a in axes})) if x.dim() else ()


def _reduction(name, fn, *, combine=None, out_dtype=None, float_only=False, needs_elements=False,
               doc=""):
    """Define a reduction primitive `g.<name>(x, axes=None, keep_dims=False)`."""

    def infer(types, axes, keep_dims):
        (t,) = types
        if t.shape is not None and axes is not None:
            normalize_axes(axes, t.rank)
        dt = out_dtype(t.dtype) if out_dtype else t.dtype
        return TensorType(_reduced_shape(t.shape, axes, keep_dims), dt)

    def impl(x, axes, keep_dims):
        axes = _runtime_axes(x, axes)
        if not axes:
            return x.clone() if out_dtype is None else x.to(out_dtype(dtypes.as_dtype(x.dtype)).torch)
        return fn(x, axes, keep_dims)

    prim = register(Primitive(name, REDUCTION, infer=infer, impl=impl, float_only=float_only, combine=combine,
                              needs_elements=needs_elements, doc=doc))

    def build(g, x, axes=None, keep_dims=False, name=None):
        x = g.as_tensor(x)
        if float_only and not x.dtype.is_floating:
            x = g.cast(x, dtypes.default_float)
        try:
            axes = normalize_axes(axes, x.rank)
        except ShapeError as e:
            raise g._error(name_, str(e), [x]) from None
        return g._emit1(name_, [x], {"axes": axes, "keep_dims": bool(keep_dims)}, name)

    name_ = name
    build.__name__ = name
    build.__doc__ = doc
    builder(name)(build)
    return prim


def _sum(x, axes, keep_dims):
    if x.dtype == torch.bool:
        x = x.to(torch.int64)
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.sum(x, dim=axes, keepdim=keep_dims, dtype=torch.float32).to(x.dtype)
    return torch.sum(x, dim=axes, keepdim=keep_dims, dtype=x.dtype)


def _mean(x, axes, keep_dims):
    if x.dtype in (torch.float16, torch.bfloat16):
        return torch.mean(x.float(), dim=axes, keepdim=keep_dims).to(x.dtype)
    return torch.mean(x, dim=axes, keepdim=keep_dims)


def _prod(x, axes, keep_dims):
    # torch.prod widens integers to int64; like the sums, keep the input type (bool gives int64)
    # and accumulate half types in float32.
    out = torch.int64 if x.dtype == torch.bool else x.dtype
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else out
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, dim=a, keepdim=keep_dims, dtype=acc)
    return x.to(out)


_SUM = Combine("0", "{a} + {b}", "tl.sum({x}, axis=1)")
reduction_sum = _reduction("reduction_sum", _sum, combine=_SUM,
                           out_dtype=lambda d: dtypes.int64 if d.is_bool else d, doc="Sum over `axes` (None: all).")
reduction_mean = _reduction("reduction_mean", _mean, float_only=True,
                            combine=Combine(_SUM.neutral, _SUM.combine, _SUM.finish, mean=True),
                            doc="Mean over `axes` (None: all).")
reduction_maximum = _reduction("reduction_maximum", lambda x, a, k: torch.amax(x, dim=a, keepdim=k),
                               combine=Combine("-INF", "_maximum({a}, {b})", "tl.reduce({x}, 1, _maximum)"),
                               needs_elements=True,
                               doc="Maximum over `axes`; NaN if any element is NaN.")
reduction_minimum = _reduction("reduction_minimum", lambda x, a, k: torch.amin(x, dim=a, keepdim=k),
                               combine=Combine("INF", "_minimum({a}, {b})", "tl.reduce({x}, 1, _minimum)"),
                               needs_elements=True,
                               doc="Minimum over `axes`; NaN if any element is NaN.")
reduction_product = _reduction("reduction_product", _prod,
                               combine=Combine("1", "{a} * {b}", "tl.reduce({x}, 1, _product)"),
                               out_dtype=lambda d: dtypes.int64 if d.is_bool else d, doc="Product over `axes`.")


def _restore(g, op, y):
    """Bring a reduced tensor back to broadcastable form against the input."""
    axes = op.attrs["axes"]
    # axes=None (kept only when x's rank is unknown) reduced to a scalar, which broadcasts as it is.
    if not op.attrs["keep_dims"] and axes is not None:
        y = g.expand_dims(y, axes)
    return y


@reduction_sum.def_vjp
def _sum_vjp(g, op, dy):
    return [g.broadcast_to(_restore(g, op, dy), op.inputs[0])]


@reduction_mean.def_vjp
def _mean_vjp(g, op, dy):
    x = op.inputs[0]
    count = g.element_count(x, op.attrs["axes"], dtype=dy.dtype)
    return [g.broadcast_to(_restore(g, op, dy) / count, x)]


def _extremum_vjp(g, op, dy):
    # Ties share the gradient evenly, as in PyTorch.
    x = op.inputs[0]
    hit = g.cast(g.equal(x, _restore(g, op, op.outputs[0])), dy.dtype)
    ties = g.reduction_sum(hit, op.attrs["axes"], keep_dims=True)
    return [hit * (_restore(g, op, dy) / ties)]


reduction_maximum.def_vjp(_extremum_vjp)
reduction_minimum.def_vjp(_extremum_vjp)


@reduction_product.def_vjp
def _product_vjp(g, op, dy):
    # d prod / d x_i is the product of the other elements. Where x_i != 0 that is prod / x_i. At a zero
    # it is (product of the nonzero elements) * (product of the other zeros), the latter written so that
    # its value and first derivative are exact: 1 with one zero, with two the other zero as S - x_i
    # (S: the sum of the zeros), 0 with more. So first and second derivatives match PyTorch's.
    x, axes = op.inputs[0], op.attrs["axes"]
    is_zero = g.equal(x, 0.0)
    safe = g.select(is_zero, 1.0, x)
    nonzero_product = g.reduction_product(safe, axes, keep_dims=True)
    zeros = g.reduction_sum(g.cast(is_zero, x.dtype), axes, keep_dims=True)
    zero_sum = g.reduction_sum(g.select(is_zero, x, 0.0), axes, keep_dims=True)
    other_zeros = g.select(g.equal(zeros, 1.0), 1.0, g.select(g.equal(zeros, 2.0), zero_sum - x, 0.0))
    elsewhere = _restore(g, op, op.outputs[0]) / safe
    return [_restore(g, op, dy) * g.select(is_zero, nonzero_product * other_zeros, elsewhere)]


def _arg_reduction(name, fn):
    def infer(types, axis, keep_dims):
        (t,) = types
        if t.shape is None:
            return TensorType(None, dtypes.int64)
        ax = normalize_axis(axis, t.rank)
        return TensorType(_reduced_shape(t.shape, (ax,), keep_dims), dtypes.int64)

    prim = register(Primitive(name, REDUCTION, infer=infer, differentiable=False, needs_elements=True,
                              impl=lambda x, axis, keep_dims: fn(x, dim=axis, keepdim=keep_dims),
                              doc=f"Index of the {name.split('_')[-1]} along `axis` (first on ties), as int64."))

    def build(g, x, axis=-1, keep_dims=False, name=None):
        x = g.as_tensor(x)
        if x.dtype.is_bool:
            x = g.cast(x, dtypes.uint8)
        if x.rank is not None:
            try:
                axis = normalize_axis(axis, x.rank)
            except ShapeError as e:
                raise g._error(name_, str(e), [x]) from None
        return g._emit1(name_, [x], {"axis": int(axis), "keep_dims": bool(keep_dims)}, name)

    name_ = name
    build.__name__ = name
    build.__doc__ = prim.doc
    builder(name)(build)
    return prim


reduction_arg_maximum = _arg_reduction("reduction_arg_maximum", torch.argmax)
reduction_arg_minimum = _arg_reduction("reduction_arg_minimum", torch.argmin)


element_count = register(Primitive(
    "element_count", OPAQUE, differentiable=False,
    doc="The number of elements over `axes` (None: all) as a scalar; known at compile time for static shapes.",
))


@element_count.def_infer
def _element_count_infer(types, axes, dtype):
    return TensorType((), dtype)


@element_count.def_impl
def _element_count_impl(x, axes, dtype):
    n = 1
    for a in _runtime_axes(x, axes):
        n *= x.shape[a]
    return torch.tensor(n, dtype=dtypes.as_dtype(dtype).torch, device=x.device)


@builder("element_count")
def _element_count(g, x, axes=None, dtype=dtypes.float32, name=None):
    """How many elements of `x` lie in `axes` (the divisor of a mean)."""
    x = g.as_tensor(x)
    try:
        axes = normalize_axes(axes, x.rank)
    except ShapeError as e:
        raise g._error("element_count", str(e), [x]) from None
    return g._emit1("element_count", [x], {"axes": axes, "dtype": dtypes.as_dtype(dtype)}, name)


sum_to_shape = register(Primitive(
    "sum_to_shape", REDUCTION,
    doc="Sum `x` down to the shape of `like` (undoes broadcasting); the shape is read at run time.",
))


@sum_to_shape.def_infer
def _sum_to_shape_infer(types):
    x, like = types
    if x.dtype.is_bool:
        raise ShapeError("expects a numeric operand, got bool")
    if x.shape is not None and like.shape is not None:
        lead = len(x.shape) - len(like.shape)
        fits = lead >= 0 and all(d in (1, UNKNOWN) or e in (d, UNKNOWN) for d, e in zip(like.shape, x.shape[lead:]))
        if not fits:
            raise ShapeError(f"shape {x.shape} cannot be summed to shape {like.shape}: {like.shape} does not "
                             f"broadcast to {x.shape}")
    return TensorType(like.shape, x.dtype)


@sum_to_shape.def_impl
@in_float32
def _sum_to_shape_impl(x, like):
    shape = like.shape
    lead = x.dim() - len(shape)
    if lead < 0:
        raise ValueError(f"sum_to_shape: cannot sum shape {tuple(x.shape)} to the larger rank of {tuple(shape)}")
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1]
    y = x.sum(dim=axes, keepdim=True, dtype=x.dtype) if axes else x
    return y.reshape(shape)


@sum_to_shape.def_vjp
def _sum_to_shape_vjp(g, op, dy):
    return [g.broadcast_to(dy, op.inputs[0]), None]


@builder("sum_to_shape")
def _sum_to_shape(g, x, like, name=None):
    """Sum `x` over the axes along which `like` was broadcast to reach x's shape."""
    x, like = g.as_tensor(x), g.as_tensor(like)
    if x.shape is not None and like.shape is not None and like.shape == x.shape and -1 not in x.shape:
        return x
    return g._emit1("sum_to_shape", [x, like], None, name)
