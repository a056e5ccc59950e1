"""The gradient of a max pooling whose windows tile the input, as one Triton kernel.

torch computes it by pooling again with int64 indices and scattering `dy`
through them: the input is read twice and eight bytes of index are written
and read per window element. Where the windows tile the input exactly
(window = stride, no padding or dilation, extents divisible by the window,
NCHW), each program instance instead takes a block of windows, finds each
window's maximum as torch does (the first strictly greater element, NaN
winning from where it appears: the last NaN) and writes `dy` there and zero
elsewhere: one read of the input and `dy`, one write of the result.

For 2x2 windows `max_pool_gradient_rows` takes whole rows of windows
instead: each program loads its two input rows per window row contiguously
(rows padded to a power of two), splits them into the four positions of each
window in registers and stores the result rows contiguously, where the
per-window kernel reads and writes every other element per instruction. Which
is faster is measured (passes/lower.py). `max_pool_rows` is the forward 2x2
pooling the same way, measured against torch's.

`gradient_with_epilogue` is either kernel carrying the elementwise ops that
read the gradient (passes/stitch.py groups them: the ReLU's mask of a
convolution's backward pass, a cast): each applies to the gradient in
registers, so it is never stored and loaded again. The mask select and any
other op compute exactly as the separate epilogue kernel would (the same
expressions on the same values), so both ways give the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..ir import Operation
from .common import Layout, compute_dtype, expression, flat_dims, header, index_expr, literal, tl_type
from .pointwise import KernelSource

BLOCK = 256


def fits(attrs: dict, shape: tuple[int, ...]) -> bool:
    """Whether a max_pooling2d_gradient with these attributes, over an input of `shape`, is one this kernel
    computes: windows that tile the NCHW input exactly, and fewer than 2**31 elements."""
    return not misfit(attrs, shape)


def misfit(attrs: dict, shape: tuple[int, ...]) -> str:
    """Why these kernels do not compute a max_pooling2d_gradient with these attributes over an input of
    `shape` ("" when they do: see `fits`)."""
    kh, kw = attrs["kernel_size"]
    if attrs.get("data_layout", "NCHW") != "NCHW" or len(shape) != 4:
        return f"the kernels take NCHW inputs of rank 4, not {attrs.get('data_layout', 'NCHW')} of shape {shape}"
    if tuple(attrs["stride"]) != (kh, kw):
        return f"the stride {tuple(attrs['stride'])} differs from the window {(kh, kw)}: windows do not tile"
    if tuple(attrs["dilation"]) != (1, 1) or attrs["padding"] not in ("valid", (0, 0, 0, 0), [0, 0, 0, 0]):
        return "the windows are dilated or padded"
    n, c, h, w = shape
    if h % kh or w % kw:
        return f"the {kh}x{kw} windows do not tile the input: height {h} x width {w} leaves a window cut"
    if not 0 < n * c * h * w < 2 ** 31:
        return f"the input has {n * c * h * w} elements; the kernels index fewer than 2**31"
    return ""


def max_pool_gradient(name: str, shape: tuple[int, ...], kernel: tuple[int, int], dtype: DType,
                      interpret: bool) -> KernelSource:
    """The kernel for `dx = max_pooling2d_gradient(dy, x)` over an input of NCHW `shape` (see `fits`)."""
    n, c, h, w = shape
    kh, kw = kernel
    ho, wo = h // kh, w // kw
    windows = n * c * ho * wo
    lines = [header(f"max pooling gradient {kh}x{kw}, {dtype.name}", interpret), "", "@triton.jit",
             f"def {name}(dy, x, dx, windows, ho, wo, w, BLOCK: tl.constexpr):"] + _window_pick(kh, kw, "dy", "x")
    cells = [(a, b) for a in range(kh) for b in range(kw)]
    for k, (a, b) in enumerate(cells):
        lines.append(f"    tl.store(dx + base + {a} * w + {b}, tl.where(at == {k}, g, zero), mask=mask)")
    source = "\n".join(lines) + "\n"
    return KernelSource(name=name, source=source, grid=((windows + BLOCK - 1) // BLOCK,), num_warps=4,
                        constexprs={"BLOCK": BLOCK}, template="pooling", sizes=(windows, ho, wo, w))


def _window_pick(kh: int, kw: int, dy: str, x: str) -> list[str]:
    """The per-window kernels' first lines: window `i` at offset `base` of the input, `dy` there in `g`, its
    cells in float32 `v0`, `v1`... and the index of the cell taking the gradient in `at`."""
    lines = ["    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             "    mask = i < windows",
             "    col = i % wo",
             "    row = (i // wo) % ho",
             "    plane = i // (wo * ho)",
             f"    base = plane * (ho * {kh}) * w + row * {kh} * w + col * {kw}",
             f"    g = tl.load({dy} + i, mask=mask, other=0)"]
    cells = [(a, b) for a in range(kh) for b in range(kw)]
    for k, (a, b) in enumerate(cells):
        # compared in float32 (exact for every float type; the interpreter holds half types as raw bits)
        lines.append(f"    v{k} = tl.load({x} + base + {a} * w + {b}, mask=mask, other=0).to(tl.float32)")
    lines += ["    best = v0", "    at = tl.zeros_like(i)"]
    for k in range(1, len(cells)):
        lines += [f"    take = (v{k} > best) | (v{k} != v{k})",
                  f"    best = tl.where(take, v{k}, best)",
                  f"    at = tl.where(take, {k}, at)"]
    return lines + ["    zero = tl.zeros_like(g)"]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def rows_fit(attrs: dict, shape: tuple[int, ...]) -> bool:
    """Whether `max_pool_gradient_rows` computes this gradient: 2x2 windows that tile the input (`fits`)."""
    return tuple(attrs["kernel_size"]) == (2, 2) and fits(attrs, shape) and _pow2(shape[3]) <= 4096


def max_pool_gradient_rows(name: str, shape: tuple[int, ...], dtype: DType, interpret: bool) -> KernelSource:
    """The kernel for `dx = max_pooling2d_gradient(dy, x)` with 2x2 windows over an input of NCHW `shape`
    (see `rows_fit`): a program per block of window rows, each row of windows loaded as a [2, width] tile."""
    n, c, h, w = shape
    width = _pow2(w)
    rows = n * c * (h // 2)
    block = max(1, min(64, 2048 // width)) if not interpret else 2
    source = header(f"max pooling gradient 2x2 by rows, {dtype.name}", interpret) + f'''

@triton.jit
def {name}(dy, x, dx, rows, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r_ok = r < rows
    d = tl.arange(0, 2)
    col = tl.arange(0, {width})
    at_x = r[:, None, None] * {2 * w} + d[None, :, None] * {w} + col[None, None, :]
    ok = r_ok[:, None, None] & (d[None, :, None] < 2) & (col[None, None, :] < {w})
    # compared in float32 (exact for every float type; the interpreter holds half types as raw bits)
    v = tl.reshape(tl.load(x + at_x, mask=ok, other=0).to(tl.float32), (BLOCK, 2, {width // 2}, 2))
{_pick(width, w, 'dy')}    tl.store(dx + at_x, out, mask=ok)
'''
    return KernelSource(name=name, source=source, grid=((rows + block - 1) // block,), num_warps=4,
                        constexprs={"BLOCK": block}, template="pooling", sizes=(rows,))


def _rows_tile(x: str, dy: str, w: int, width: int) -> list[str]:
    """Lines of a rows-of-windows kernel after `r` and `r_ok` (its rows of windows): the tile of the input's
    two rows per window row (`xv`, in float32, at `at_x` where `ok`) and each window's gradient placed (`_pick`)."""
    return ["    d = tl.arange(0, 2)",
            f"    col = tl.arange(0, {width})",
            f"    at_x = r[:, None, None] * {2 * w} + d[None, :, None] * {w} + col[None, None, :]",
            f"    ok = r_ok[:, None, None] & (d[None, :, None] < 2) & (col[None, None, :] < {w})",
            f"    xv = tl.load({x} + at_x, mask=ok, other=0).to(tl.float32)",
            f"    v = tl.reshape(xv, (BLOCK, 2, {width // 2}, 2))",
            _pick(width, w, dy).rstrip("\n")]


def _pick(width: int, w: int, dy: str) -> str:
    """The rows kernels' middle: from the [BLOCK, 2, width / 2, 2] tile `v` of the input (float32), the
    gradient's rows `out` ([BLOCK, 2, width], `dy`'s type): `dy` at each window's maximum, zero elsewhere."""
    return f'''    left, right = tl.split(v)
    v0, v2 = tl.split(tl.permute(left, (0, 2, 1)))
    v1, v3 = tl.split(tl.permute(right, (0, 2, 1)))
    best = v0
    at = tl.zeros_like(v0).to(tl.int32)
    take = (v1 > best) | (v1 != v1)
    best = tl.where(take, v1, best)
    at = tl.where(take, 1, at)
    take = (v2 > best) | (v2 != v2)
    best = tl.where(take, v2, best)
    at = tl.where(take, 2, at)
    take = (v3 > best) | (v3 != v3)
    at = tl.where(take, 3, at)
    pc = tl.arange(0, {width // 2})
    g = tl.load({dy} + r[:, None] * {w // 2} + pc[None, :], mask=r_ok[:, None] & (pc[None, :] < {w // 2}), other=0)
    zero = tl.zeros_like(g)
    left = tl.permute(tl.join(tl.where(at == 0, g, zero), tl.where(at == 2, g, zero)), (0, 2, 1))
    right = tl.permute(tl.join(tl.where(at == 1, g, zero), tl.where(at == 3, g, zero)), (0, 2, 1))
    out = tl.reshape(tl.join(left, right), (BLOCK, 2, {width}))
'''


def max_pool_rows(name: str, shape: tuple[int, ...], dtype: DType, interpret: bool) -> KernelSource:
    """The kernel for `y = max_pooling2d(x)` with 2x2 windows over an input of NCHW `shape` (see `rows_fit`),
    a program per block of window rows; a NaN in a window makes its maximum NaN, as torch's does."""
    n, c, h, w = shape
    width = _pow2(w)
    rows = n * c * (h // 2)
    block = max(1, min(64, 2048 // width)) if not interpret else 2
    source = header(f"max pooling 2x2 by rows, {dtype.name}", interpret, reduction=True) + f'''

@triton.jit
def {name}(x, y, rows, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r_ok = r < rows
    d = tl.arange(0, 2)
    col = tl.arange(0, {width})
    ok = r_ok[:, None, None] & (d[None, :, None] < 2) & (col[None, None, :] < {w})
    v = tl.load(x + r[:, None, None] * {2 * w} + d[None, :, None] * {w} + col[None, None, :], mask=ok, other=0)
    v = tl.reshape(v.to(tl.float32), (BLOCK, 2, {width // 2}, 2))
    m = tl.reduce(tl.reduce(v, 3, _maximum), 1, _maximum)
    pc = tl.arange(0, {width // 2})
    tl.store(y + r[:, None] * {w // 2} + pc[None, :], m.to(y.dtype.element_ty),
             mask=r_ok[:, None] & (pc[None, :] < {w // 2}))
'''
    return KernelSource(name=name, source=source, grid=((rows + block - 1) // block,), num_warps=4,
                        constexprs={"BLOCK": block}, template="pooling", sizes=(rows,))


DTYPES = ("float16", "bfloat16", "float32")  # the types the kernels compare exactly in float32


def _body_parts(body, in_layouts: list[Layout]):
    """Of a pooling gradient's fusion `body`: the pooling op, the elementwise ops after it, each input's
    argument name and layout by tensor id, and the kernel's parameter list (the inputs, then the outputs)."""
    pool = next(op for op in body.operations if op.op == "max_pooling2d_gradient")
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    ops = [op for op in body.operations if op.op != "placeholder" and op is not pool]
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    layout_of = {t.id: lay for t, lay in zip(placeholders, in_layouts)}
    params = ", ".join([arg_of[t.id] for t in placeholders] + [f"out{j}" for j in range(len(body.outputs))])
    return pool, ops, arg_of, layout_of, params


def gradient_with_epilogue(name: str, body, in_layouts: list[Layout], rows: bool, interpret: bool) -> KernelSource:
    """The kernel for a fusion `body` (a Program: one max_pooling2d_gradient whose source is an NCHW input
    that `fits`, and elementwise ops over that input's shape, passes/stitch.py) reading inputs of the given
    layouts (the gradient's two row-major): per block of windows, or with `rows` (see `rows_fit`) per block
    of rows of 2x2 windows; each output stored row-major."""
    pool, ops, arg_of, layout_of, params = _body_parts(body, in_layouts)
    dy, x = pool.inputs
    frame = x.shape
    n, c, h, w = frame
    kh, kw = pool.attrs["kernel_size"]
    to = f".to({tl_type(compute_dtype(dy.dtype))})"
    title = f"max pooling gradient {kh}x{kw}{' by rows' if rows else ''} with its epilogue, {x.dtype.name}"
    if rows:
        width = _pow2(w)
        count = n * c * (h // 2)
        block = max(1, min(64, 2048 // width)) if not interpret else 2
        lines = [f"def {name}({params}, rows, BLOCK: tl.constexpr):",
                 "    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                 "    r_ok = r < rows",
                 *_rows_tile(arg_of[x.id], arg_of[dy.id], w, width)]
        # the input's values are in float32 already: its compute type for every type in DTYPES
        lines += _epilogue(ops, body.outputs, {pool.outputs[0].id: f"out{to}", x.id: "xv"}, "at_x", "ok",
                           arg_of, layout_of, frame, "e_")[0]
        grid, constexprs, sizes = ((count + block - 1) // block,), {"BLOCK": block}, (count,)
    else:
        ho, wo = h // kh, w // kw
        windows = n * c * ho * wo
        lines = [f"def {name}({params}, windows, ho, wo, w, BLOCK: tl.constexpr):"]
        lines += _window_pick(kh, kw, arg_of[dy.id], arg_of[x.id])
        for k, (a, b) in enumerate((a, b) for a in range(kh) for b in range(kw)):
            lines.append(f"    e{k} = base + {a} * w + {b}")
            lines += _epilogue(ops, body.outputs, {pool.outputs[0].id: f"tl.where(at == {k}, g, zero){to}",
                                                   x.id: f"v{k}"}, f"e{k}", "mask", arg_of, layout_of, frame,
                               f"c{k}_")[0]
        grid, constexprs, sizes = ((windows + BLOCK - 1) // BLOCK,), {"BLOCK": BLOCK}, (windows, ho, wo, w)
    source = header(title, interpret) + "\n\n@triton.jit\n" + "\n".join(lines) + "\n"
    return KernelSource(name=name, source=source, grid=grid, num_warps=4, constexprs=constexprs,
                        template="pooling", sizes=sizes)


def _epilogue(ops: list[Operation], outputs, value: dict[int, str], index: str, mask: str, arg_of: dict,
              layout_of: dict, frame: tuple[int, ...], tag: str) -> tuple[list[str], dict[int, str]]:
    """Lines computing the elementwise `ops` at the elements of flat (row-major) index `index` of `frame`,
    from `value` (tensor id -> its expression in its compute type) and inputs loaded through their layouts,
    then storing each of `outputs` there; `tag` keeps the names of one cell's lines apart from another's.
    And every value's expression by tensor id."""
    value = dict(value)
    lines = []
    for k, op in enumerate(ops):
        out = op.outputs[0]
        if op.op == "constant":
            value[out.id] = literal(op.attrs["value"], out.dtype)
            continue
        for t in op.inputs:
            if t.id not in value:
                lay = layout_of[t.id].broadcast_to(frame)
                idx = index_expr(index, flat_dims(lay, list(range(len(frame)))))
                ptr = f"{arg_of[t.id]} + {lay.offset}" if lay.offset else arg_of[t.id]
                load = f"tl.load({ptr})" if idx == "0" else f"tl.load({ptr} + {idx}, mask={mask}, other=0)"
                var = f"{tag}x{len(value)}"
                lines.append(f"    {var} = {load}.to({tl_type(compute_dtype(t.dtype))})")
                value[t.id] = var
        lines.append(f"    {tag}v{k} = {expression(op, [value[t.id] for t in op.inputs])}")
        value[out.id] = f"{tag}v{k}"
    lines += [f"    tl.store(out{j} + {index}, ({value[t.id]}).to({tl_type(t.dtype)}), mask={mask})"
              for j, t in enumerate(outputs)]
    return lines, value


@dataclass
class SumSource:
    """The rows kernel with its epilogue that also sums one output per channel (`gradient_with_sum`): the
    kernel writes a float32 partial sum per program into a scratch of `parts` elements, `finish` adds them."""

    partial: KernelSource
    finish: KernelSource
    parts: int


def gradient_with_sum(name: str, body, in_layouts: list[Layout], total: int, out_dtype: DType,
                      interpret: bool) -> SumSource:
    """`gradient_with_epilogue` by rows of 2x2 windows, a program per block of window rows of one (batch,
    channel) plane, which also sums its tile of body output `total` (as stored, rounded to its type) in
    float32; the second kernel adds each channel's partial sums over the batch in a fixed order, a tile of
    them per step, and stores the channel's sum as `out_dtype`: the per-channel (bias) gradient. Extents of
    the batch are arguments, not written into the sources (see KernelSource.sizes)."""
    pool, ops, arg_of, layout_of, params = _body_parts(body, in_layouts)
    dy, x = pool.inputs
    n, c, h, w = x.shape
    width, half = _pow2(w), h // 2
    block = min(_pow2(half), max(1, 2048 // width)) if not interpret else 2
    chunks = -(-half // block)
    parts = n * c * chunks
    to = f".to({tl_type(compute_dtype(dy.dtype))})"
    lines = [f"def {name}_partial({params}, part, half, BLOCK: tl.constexpr):",
             f"    plane = tl.program_id(0) // {chunks}",
             f"    k = (tl.program_id(0) % {chunks}) * BLOCK + tl.arange(0, BLOCK)",
             "    r = plane * half + k",
             "    r_ok = k < half",
             *_rows_tile(arg_of[x.id], arg_of[dy.id], w, width)]
    more, value = _epilogue(ops, body.outputs, {pool.outputs[0].id: f"out{to}", x.id: "xv"}, "at_x", "ok", arg_of,
                            layout_of, x.shape, "e_")
    t = body.outputs[total]
    stored = f"({value[t.id]}).to({tl_type(t.dtype)}).to(tl.float32)"
    lines += more + [f"    s = tl.sum(tl.sum(tl.sum(tl.where(ok, {stored}, 0.0), 2), 1), 0)",
                     "    tl.store(part + tl.program_id(0), s)"]
    partial = header(f"max pooling gradient 2x2 by rows with its epilogue and its sum per channel, "
                     f"{x.dtype.name}", interpret) + "\n\n@triton.jit\n" + "\n".join(lines) + "\n"
    # a program per channel, its partials a few wide tiles: the finish is one or two dependent loads deep
    ways = min(_pow2(n * chunks), 1024) if not interpret else 4
    channels = 1
    finish = header("max pooling gradient, the sum per channel of its partial sums", interpret) + f'''

@triton.jit
def {name}_finish(part, out, count, BLOCK: tl.constexpr, WAYS: tl.constexpr):
    ch = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ch_ok = ch < {c}
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    for j0 in range(0, count, WAYS):
        j = j0 + tl.arange(0, WAYS)
        at = ((j // {chunks}) * {c})[:, None] * {chunks} + ch[None, :] * {chunks} + (j % {chunks})[:, None]
        s += tl.sum(tl.load(part + at, mask=(j < count)[:, None] & ch_ok[None, :], other=0), 0)
    tl.store(out + ch, s.to({tl_type(out_dtype)}), mask=ch_ok)
'''
    warps = max(1, min(4, block * 2 * width // 256))  # a plane's rows are few: no idle warps
    return SumSource(KernelSource(f"{name}_partial", partial, (parts,), warps, {"BLOCK": block}, "pooling",
                                  sizes=(half,)),
                     KernelSource(f"{name}_finish", finish, (-(-c // channels),), 4,
                                  {"BLOCK": channels, "WAYS": ways}, "pooling", sizes=(n * chunks,)), parts)
