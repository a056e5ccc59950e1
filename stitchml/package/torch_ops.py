"""Core ATen operators as StitchML builder calls: one handler per overload, in the table `HANDLERS`.

A handler is ``handler(imp, node, *args, **kwargs) -> value``, where the
arguments are the FX node's with nodes replaced by their values (Tensors,
ints, (tensor, axis) entries for symbolic sizes, tuples for multi-result
ops). Semantics follow PyTorch's ATen definitions (native_functions.yaml).
"""
from __future__ import annotations

import operator
from typing import Callable

import torch

from .. import dtypes
from ..ir import UNKNOWN, Tensor
from ..ops import Convolution2DDescriptor, Pooling2DDescriptor
from . import shapes

HANDLERS: dict[str, Callable] = {}


def aten(*names: str):
    def register(fn):
        for n in names:
            HANDLERS[n if n.startswith("<") else f"aten.{n}"] = fn
        return fn

    return register


def _axis(x: Tensor, d: int) -> int:
    return d % x.rank if x.rank else 0


# -- elementwise -----------------------------------------------------------------------------
_UNARY = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exponent", "log": "logarithm",
          "sqrt": "square_root", "rsqrt": "reverse_square_root", "neg": "negative", "abs": "absolute",
          "reciprocal": "reciprocal", "erf": "erf", "sin": "sin", "cos": "cos", "floor": "floor", "ceil": "ceil",
          "round": "round", "sign": "sign", "logical_not": "logical_not", "bitwise_not": "logical_not",
          "exp2": "exponent_base2", "log2": "logarithm_base2", "trunc": "truncate", "isnan": "is_nan"}
_BINARY = {"mul": "multiplication", "div": "division", "pow": "power", "eq": "equal", "ne": "not_equal",
           "lt": "less_than", "le": "less_than_or_equal_to", "gt": "greater_than",
           "ge": "greater_than_or_equal_to", "minimum": "minimum", "maximum": "maximum",
           "logical_and": "logical_and", "logical_or": "logical_or", "remainder": "modulo", "atan2": "atan2"}
for _name, _builder in _UNARY.items():
    HANDLERS[f"aten.{_name}.default"] = (lambda b: lambda imp, node, x: getattr(imp.g, b)(x))(_builder)
for _name, _builder in _BINARY.items():
    for _overload in set(getattr(torch.ops.aten, _name).overloads()) & {"Tensor", "Scalar", "Tensor_Tensor",
                                                                         "Tensor_Scalar", "Scalar_Tensor", "default"}:
        HANDLERS[f"aten.{_name}.{_overload}"] = (lambda b: lambda imp, node, a, c: getattr(imp.g, b)(a, c))(_builder)


@aten("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Scalar", "rsub.Tensor")
def _add(imp, node, a, b, alpha=1):
    g = imp.g
    if alpha != 1:
        b = b * alpha
    name = str(node.target)
    if name.startswith("aten.rsub"):
        return g.subtraction(b, a)
    return g.addition(a, b) if name.startswith("aten.add") else g.subtraction(a, b)


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(imp, node, a, b, rounding_mode=None):
    g = imp.g
    if rounding_mode == "floor":
        return g.floor_division(a, b)
    q = g.division(a, b)
    return g.truncate(q) if rounding_mode == "trunc" else q


@aten("bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor")
def _bitwise(imp, node, a, b):
    # On booleans (masks combined with & | ^) these are the logical operators; integer bit operations are not.
    if a.dtype != dtypes.bool_ or b.dtype != dtypes.bool_:
        raise imp.fail(f"bit operations on {a.dtype} are not supported (booleans are)")
    op = str(node.target).split(".")[1].replace("bitwise", "logical")
    return getattr(imp.g, op)(a, b)


@aten("where.self")
def _where(imp, node, cond, a, b):
    return imp.g.select(cond, a, b)


@aten("clamp.default", "hardtanh.default", "clamp_min.default", "clamp_max.default")
def _clamp(imp, node, x, lo=None, hi=None):
    g = imp.g
    if str(node.target) == "aten.clamp_max.default":
        lo, hi = None, lo
    y = x
    if lo is not None:
        y = g.maximum(y, lo)
    if hi is not None:
        y = g.minimum(y, hi)
    return y if y is not x else g.identity(x)


@aten("gelu.default")
def _gelu(imp, node, x, approximate="none"):
    return imp.g.gelu(x, approximate)


@aten("silu.default")
def _silu(imp, node, x):
    return imp.g.silu(x)


@aten("leaky_relu.default")
def _leaky_relu(imp, node, x, slope=0.01):
    return imp.g.leaky_relu(x, slope)


@aten("hardsigmoid.default", "hardswish.default")
def _hard(imp, node, x):
    g = imp.g
    hs = g.maximum(g.minimum(x / 6.0 + 0.5, 1.0), 0.0)
    return hs if str(node.target) == "aten.hardsigmoid.default" else x * hs


@aten("elu.default")
def _elu(imp, node, x, alpha=1.0, scale=1.0, input_scale=1.0):
    g = imp.g
    return g.select(x > 0, x * scale, (g.exponent(x * input_scale) - 1.0) * (alpha * scale))


@aten("_to_copy.default")
def _to_copy(imp, node, x, dtype=None, **_):
    return imp.g.cast(x, dtype) if dtype is not None else imp.g.identity(x)


@aten("clone.default", "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default")
def _identity(imp, node, x, **_):
    return imp.g.identity(x)


# -- shapes ------------------------------------------------------------------------------------
@aten("sym_size.int")
def _sym_size(imp, node, x, dim):
    d = x.shape[_axis(x, dim)]
    return (x, _axis(x, dim)) if d == UNKNOWN else d


def _symint(op):
    def handler(imp, node, a, b):
        a, b = shapes.as_extent(a), shapes.as_extent(b)
        if isinstance(a, int) and isinstance(b, int):
            return op(a, b)
        if op is operator.mul:
            return a * b
        raise imp.fail(f"{op.__name__} on symbolic sizes is not supported (products are)")

    return handler


for _op in (operator.mul, operator.add, operator.sub, operator.floordiv):
    HANDLERS[str(_op)] = _symint(_op)


@aten("<built-in function getitem>")
def _getitem(imp, node, seq, i):
    value = seq[i]
    if value is None:
        raise imp.fail(f"result {i} of {node.args[0].target} is not supported")
    return value


@aten("view.default", "_unsafe_view.default", "reshape.default")
def _view(imp, node, x, size):
    return shapes.reshape_to(imp.g, x, list(size))


@aten("permute.default")
def _permute(imp, node, x, dims):
    return imp.g.transpose(x, [_axis(x, d) for d in dims])


@aten("t.default")
def _t(imp, node, x):
    return imp.g.transpose(x)


@aten("transpose.int")
def _transpose(imp, node, x, a, b):
    return imp.g.transpose(x, _axis(x, a), _axis(x, b))


@aten("expand.default")
def _expand(imp, node, x, size, implicit=False):
    lead = len(size) - x.rank
    entries = []
    for i, s in enumerate(size):
        own = x.shape[i - lead] if i >= lead else 1
        if s == -1 or (isinstance(s, tuple) and i >= lead and s == (x, i - lead)):
            entries.append((x, i - lead) if own == UNKNOWN else own)
        else:
            entries.append(s)
    return shapes.broadcast_to(imp.g, x, entries)


@aten("unsqueeze.default")
def _unsqueeze(imp, node, x, dim):
    return imp.g.expand_dims(x, [dim % (x.rank + 1)])


@aten("squeeze.dims", "squeeze.dim", "squeeze.default")
def _squeeze(imp, node, x, dims=None):
    if dims is None:
        return imp.g.squeeze(x)
    dims = [dims] if isinstance(dims, int) else dims
    keep = [_axis(x, d) for d in dims if x.shape[_axis(x, d)] in (1, UNKNOWN)]
    return imp.g.squeeze(x, keep) if keep else imp.g.identity(x)


@aten("slice.Tensor")
def _slice(imp, node, x, dim=0, start=None, end=None, step=1):
    axis = _axis(x, dim)
    starts, ends, steps = [None] * x.rank, [None] * x.rank, [1] * x.rank
    starts[axis], ends[axis], steps[axis] = start, end, step
    if isinstance(start, tuple) or isinstance(end, tuple):
        raise imp.fail("slicing at a symbolic position is not supported")
    return imp.g.slice(x, starts, ends, steps)


@aten("select.int")
def _select(imp, node, x, dim, index):
    axis = _axis(x, dim)
    key = [slice(None)] * x.rank
    key[axis] = index
    return imp.g.index(x, tuple(key))


def _empty(t: Tensor) -> bool:
    return t.shape is not None and UNKNOWN not in t.shape and 0 in t.shape


@aten("cat.default")
def _cat(imp, node, tensors, dim=0):
    # torch.cat skips empty tensors (a (0,)-shaped one of any rank, as a KV cache starts): so does the import.
    kept = [t for t in tensors if not _empty(t)] or list(tensors[:1])
    if len(kept) == 1:
        return imp.g.identity(kept[0])
    return imp.g.concat(kept, _axis(kept[0], dim))


@aten("split_with_sizes.default")
def _split_with_sizes(imp, node, x, sizes, dim=0):
    return tuple(imp.g.split(x, imp.ints(sizes, "split sizes"), _axis(x, dim)))


@aten("split.Tensor")
def _split(imp, node, x, size, dim=0):
    axis = _axis(x, dim)
    n = x.shape[axis]
    if n == UNKNOWN:
        raise imp.fail("split along a symbolic extent is not supported")
    return tuple(imp.g.split(x, [min(size, n - i) for i in range(0, n, size)], axis))


@aten("full.default")
def _full(imp, node, size, value, dtype=None, **_):
    dt = dtypes.as_dtype(dtype) if dtype is not None else dtypes.as_dtype(torch.get_default_dtype())
    return shapes.broadcast_to(imp.g, imp.g.constant(value, dt), list(size))


@aten("full_like.default")
def _full_like(imp, node, x, value, dtype=None, **_):
    dt = dtypes.as_dtype(dtype) if dtype is not None else x.dtype
    entries = [(x, i) if d == UNKNOWN else d for i, d in enumerate(x.shape)]
    return shapes.broadcast_to(imp.g, imp.g.constant(value, dt), entries)


@aten("scalar_tensor.default")
def _scalar_tensor(imp, node, value, dtype=None, **_):
    return imp.g.constant(value, dtype or torch.get_default_dtype())


@aten("arange.start_step", "arange.default", "arange.start")
def _arange(imp, node, *args, dtype=None, **_):
    values = [a for a in args if not isinstance(a, tuple)]
    if len(values) != len(args):
        raise imp.fail("arange with a symbolic bound is not supported")
    return imp.g.constant(torch.arange(*values, dtype=dtype))


@aten("repeat.default")
def _repeat(imp, node, x, repeats):
    extra = len(repeats) - x.rank
    if extra:
        x = imp.g.expand_dims(x, list(range(extra)))
    return imp.g.tile(x, imp.ints(repeats, "repeats"))


@aten("flip.default")
def _flip(imp, node, x, dims):
    return imp.g.reverse(x, [_axis(x, d) for d in dims])


@aten("constant_pad_nd.default")
def _pad(imp, node, x, pad, value=0.0):
    left, right = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):
        left[x.rank - 1 - i], right[x.rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if min(left + right) < 0:
        raise imp.fail("negative padding is not supported")
    return imp.g.pad(x, left, right, "constant", value)


@aten("embedding.default")
def _embedding(imp, node, weight, indices, *_):
    return imp.g.gather(weight, indices, 0)


@aten("index_select.default")
def _index_select(imp, node, x, dim, index):
    return imp.g.gather(x, index, _axis(x, dim))


@aten("gather.default")
def _gather(imp, node, x, dim, index, sparse_grad=False):
    return imp.g.gather_along_axis(x, index, _axis(x, dim))


@aten("index.Tensor")
def _index(imp, node, x, indices):
    # NumPy advanced indexing with index tensors at adjacent axes (None keeps an axis whole): the indexed
    # axes merge into one, read at the row-major linear index of the broadcast index tensors.
    g = imp.g
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used or used != list(range(used[0], used[-1] + 1)) or x.shape is None:
        raise imp.fail("index: index tensors at adjacent axes of a tensor of known rank are supported, "
                       f"got them at axes {used}")
    first, last = used[0], used[-1] + 1
    extents = x.shape[first:last]
    if len(used) > 1 and UNKNOWN in extents:
        raise imp.fail(f"index: several index tensors need the indexed extents known, got {x.type}")
    linear = None
    for axis, n in zip(used, extents):
        idx = g.cast(indices[axis], dtypes.int64) if indices[axis].dtype != dtypes.int64 else indices[axis]
        idx = g.select(idx < 0, idx + n, idx) if len(used) > 1 else idx
        linear = idx if linear is None else linear * n + idx
    if len(used) > 1:
        x = g.reshape(x, (*[-1 if d == UNKNOWN else d for d in x.shape[:first]], -1,
                          *[-1 if d == UNKNOWN else d for d in x.shape[last:]]))
    return g.gather(x, linear, first)


@aten("linalg_vector_norm.default")
def _vector_norm(imp, node, x, ord=2, dim=None, keepdim=False, dtype=None):
    g = imp.g
    if dtype is not None:
        x = g.cast(x, dtype)
    if isinstance(dim, int):
        dim = [dim]
    axes, size = _dims(x, dim), g.absolute(x)
    if ord == float("inf"):
        return g.reduction_maximum(size, axes, keepdim)
    if ord == -float("inf"):
        return g.reduction_minimum(size, axes, keepdim)
    if ord == 2:
        return g.square_root(g.reduction_sum(size * size, axes, keepdim))
    if ord == 1:
        return g.reduction_sum(size, axes, keepdim)
    if ord == 0:
        return g.reduction_sum(g.cast(g.not_equal(x, 0), x.dtype), axes, keepdim)
    return g.power(g.reduction_sum(g.power(size, float(ord)), axes, keepdim), 1.0 / ord)


@aten("cumsum.default")
def _cumsum(imp, node, x, dim, dtype=None):
    y = imp.g.cumulative_sum(x, _axis(x, dim))
    return imp.g.cast(y, dtype) if dtype is not None else y


@aten("topk.default")
def _topk(imp, node, x, k, dim=-1, largest=True, sorted=True):
    return imp.g.top_k(x, k, _axis(x, dim), largest)


# -- reductions ---------------------------------------------------------------------------------
def _dims(x, dims):
    return None if dims is None or list(dims) == [] else [_axis(x, d) for d in dims]


@aten("sum.dim_IntList", "mean.dim", "amax.default", "amin.default", "sum.default", "mean.default", "prod.dim_int")
def _reduce(imp, node, x, dims=None, keepdim=False, dtype=None):
    g = imp.g
    op = str(node.target).split(".")[1]
    fn = {"sum": g.reduction_sum, "mean": g.reduction_mean, "amax": g.reduction_maximum,
          "amin": g.reduction_minimum, "prod": g.reduction_product}[op]
    if isinstance(dims, int):
        dims = [dims]
    if dtype is not None:
        x = g.cast(x, dtype)
    return fn(x, _dims(x, dims), keepdim)


@aten("any.dim", "any.dims", "any.default", "all.dim", "all.dims", "all.default")
def _any(imp, node, x, dims=None, keepdim=False):
    # any: some element is non-zero; all: no element is zero. Counted as int64, compared with 0.
    g = imp.g
    if isinstance(dims, int):
        dims = [dims]
    is_all = str(node.target).startswith("aten.all")
    zero = g.constant(0, x.dtype) if x.dtype != dtypes.bool_ else g.constant(False, dtypes.bool_)
    hits = g.cast(g.equal(x, zero) if is_all else g.not_equal(x, zero), dtypes.int64)
    count = g.reduction_sum(hits, _dims(x, dims), keepdim)
    return g.equal(count, g.constant(0, dtypes.int64)) if is_all else g.greater_than(count, g.constant(0, dtypes.int64))


@aten("argmax.default", "argmin.default")
def _argmax(imp, node, x, dim=None, keepdim=False):
    g = imp.g
    fn = g.reduction_arg_maximum if "argmax" in str(node.target) else g.reduction_arg_minimum
    if dim is None:
        return fn(g.reshape(x, (-1,)), 0, False)
    return fn(x, _axis(x, dim), keepdim)


@aten("var.correction")
def _var(imp, node, x, dims=None, correction=1, keepdim=False):
    g = imp.g
    axes = _dims(x, dims)
    v = g.variance(x, axes, keepdim)
    if correction:
        n = g.element_count(x, axes, dtype=v.dtype)
        v = v * n / (n - float(correction))
    return v


@aten("_softmax.default", "_log_softmax.default")
def _softmax(imp, node, x, dim, half_to_float=False):
    fn = imp.g.softmax if "_softmax" in str(node.target) and "log" not in str(node.target) else imp.g.log_softmax
    return fn(x, _axis(x, dim))


@aten("scaled_dot_product_attention.default")
def _sdpa(imp, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # torch's math definition: softmax(q k^T * scale + bias) v, a boolean mask selecting the keys attended
    # and is_causal keeping key j <= query i (top-left aligned); grouped-query heads repeat each kv head.
    import numpy as np

    g = imp.g
    if dropout_p:
        raise imp.fail("attention dropout is not supported (packages run inference)")
    head = q.shape[-1]
    if head == UNKNOWN or q.shape[-2] == UNKNOWN or k.shape[-2] == UNKNOWN:
        raise imp.fail("attention needs known sequence lengths and head size")
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        rep = q.shape[-3] // k.shape[-3]

        def repeat(x):
            entries = [(x, i) if d == UNKNOWN else d for i, d in enumerate(x.shape)]
            y = g.tile(g.expand_dims(x, [x.rank - 2]), [1] * (x.rank - 2) + [rep, 1, 1])
            return shapes.reshape_to(g, y, entries[:-3] + [x.shape[-3] * rep] + entries[-2:])

        k, v = repeat(k), repeat(v)
    scale = 1.0 / float(np.sqrt(head)) if scale is None else float(scale)
    scores = g.matrix_multiplication(q, g.transpose(k, list(range(k.rank - 2)) + [k.rank - 1, k.rank - 2])) * scale
    neg = g.constant(-np.inf, scores.dtype)
    if is_causal:
        keep = np.tril(np.ones((q.shape[-2], k.shape[-2]), bool))
        scores = g.select(g.constant(keep), scores, neg)
    if attn_mask is not None:
        scores = g.select(attn_mask, scores, neg) if attn_mask.dtype == dtypes.bool_ else scores + attn_mask
    return g.matrix_multiplication(g.softmax(scores, scores.rank - 1), v)


# -- linear algebra and convolution -----------------------------------------------------------------
@aten("mm.default", "bmm.default", "matmul.default")
def _mm(imp, node, a, b):
    return imp.g.matrix_multiplication(a, b)


@aten("addmm.default")
def _addmm(imp, node, bias, a, b, beta=1, alpha=1):
    y = imp.g.matrix_multiplication(a, b)
    y = y * alpha if alpha != 1 else y
    return y + (bias * beta if beta != 1 else bias)


@aten("convolution.default")
def _convolution(imp, node, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    g = imp.g
    one_d = x.rank == 3
    if x.rank not in (3, 4):
        raise imp.fail(f"convolution over {x.rank - 2} spatial axes is not supported (1-D and 2-D are)")
    if one_d:
        x, w = g.expand_dims(x, [2]), g.expand_dims(w, [2])
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
        output_padding = [0, *output_padding]
    pad = (padding[0], padding[0], padding[1], padding[1])
    desc = Convolution2DDescriptor(stride=tuple(stride), dilation=tuple(dilation), padding=pad, groups=groups)
    if transposed:
        y = g.convolution_transpose2d(x, w, desc, output_padding=tuple(output_padding))
    else:
        y = g.convolution2d(x, w, desc)
    if bias is not None:
        y = y + g.reshape(bias, (-1, 1, 1))
    return g.squeeze(y, [2]) if one_d else y


def _pool_attrs(kernel, stride, padding, dilation, ceil_mode, include_pad=False):
    kernel = list(kernel) * (2 if len(kernel) == 1 else 1)
    stride = list(stride or kernel) * (2 if len(stride or kernel) == 1 else 1)
    padding = [padding] * 2 if isinstance(padding, int) else list(padding) * (2 if len(padding) == 1 else 1)
    dilation = [dilation] * 2 if isinstance(dilation, int) else list(dilation) * (2 if len(dilation) == 1 else 1)
    return Pooling2DDescriptor(kernel_size=tuple(kernel), stride=tuple(stride), dilation=tuple(dilation),
                               padding=(padding[0], padding[0], padding[1], padding[1]), ceil_mode=bool(ceil_mode),
                               include_zero_padding=bool(include_pad))


@aten("max_pool2d_with_indices.default", "max_pool2d.default")
def _max_pool(imp, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    y = imp.g.max_pooling2d(x, _pool_attrs(kernel, stride, padding, dilation, ceil_mode))
    return (y, None) if "with_indices" in str(node.target) else y


@aten("avg_pool2d.default")
def _avg_pool(imp, node, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor=None):
    if divisor is not None:
        raise imp.fail("avg_pool2d with divisor_override is not supported")
    return imp.g.avg_pooling2d(x, _pool_attrs(kernel, stride, padding, 1, ceil_mode, count_include_pad))


@aten("upsample_bilinear2d.vec", "upsample_nearest2d.vec")
def _upsample(imp, node, x, output_size, *rest):
    bilinear = "bilinear" in str(node.target)
    align_corners, scale_factors = (rest[0], rest[1]) if bilinear else (False, rest[0])
    n, c, h, w = x.shape
    if UNKNOWN in (h, w):
        raise imp.fail("resizing needs known spatial extents")
    if output_size:
        out = imp.ints(output_size, "output_size")
        scales = [o / i for o, i in zip(out, (h, w))]
    else:
        scales = list(scale_factors)
        out = [int(i * s) for i, s in zip((h, w), scales)]
    mode, transform = ("linear", "align_corners" if align_corners else "pytorch_half_pixel") if bilinear \
        else ("nearest", "asymmetric")
    return imp.g.resize(x, (n, c, *out), mode, (1.0, 1.0, *scales), transform, "floor")


# -- normalization -------------------------------------------------------------------------------
@aten("_native_batch_norm_legit_no_training.default")
def _batch_norm(imp, node, x, weight, bias, mean, var, momentum, eps):
    g = imp.g
    shape = (-1,) + (1,) * (x.rank - 2)

    def per_channel(v):
        return None if v is None else g.reshape(v, shape)

    y = g.normalization(x, per_channel(mean), per_channel(var), per_channel(weight), per_channel(bias), eps)
    return (y, None, None)


@aten("native_group_norm.default")
def _group_norm(imp, node, x, weight, bias, n, c, hw, groups, eps):
    # Normalise each (sample, group) over its channels and positions, then scale and shift per channel.
    g = imp.g
    if x.shape is None or UNKNOWN in x.shape[1:]:
        raise imp.fail(f"group norm needs known channel and spatial extents, got {x.type}")
    entries = [(x, 0) if x.shape[0] == UNKNOWN else x.shape[0], int(groups), -1]
    y = g.layer_normalization(shapes.reshape_to(g, x, entries), (2,), None, None, eps)
    y = shapes.reshape_to(g, y, [(x, 0) if x.shape[0] == UNKNOWN else x.shape[0], *x.shape[1:]])
    per_channel = (-1,) + (1,) * (x.rank - 2)
    if weight is not None:
        y = y * g.reshape(weight, per_channel)
    if bias is not None:
        y = y + g.reshape(bias, per_channel)
    return (y, None, None)


@aten("native_layer_norm.default")
def _layer_norm(imp, node, x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.rank - len(normalized_shape), x.rank))
    return (imp.g.layer_normalization(x, axes, weight, bias, eps), None, None)


@aten("_assert_tensor_metadata.default", "_assert_scalar.default", "sym_constrain_range_for_size.default",
      "sym_constrain_range.default", "_assert_async.msg")
def _assertion(imp, node, *args, **kwargs):
    """Export-time checks of types and ranges: nothing to run in a package."""
    return None
