"""The convolution template: a direct (implicit-GEMM) 2-D convolution with its pointwise epilogue, in one
Triton kernel.

cuDNN computes a convolution into memory of its own and a generated kernel applies the epilogue (bias,
ReLU, the ReLU's mask for the backward pass): the product makes a round trip through memory. On shapes
where cuDNN's kernels fit badly (one input channel, a few dozen channels over small images) that round
trip and the library's own kernel cost more than the arithmetic. Here each program computes a tile of
output pixels (rows: batch x height x width) by output channels (columns) as a product over the window's
taps (input channel x kernel row x kernel column), loading the input through the window's indices
(zero outside the padded image) and the weights in place, then applies the epilogue to the tile in
registers and stores every value the kernel returns once.

Windows of at most `SMALL_TAPS` taps (a first layer of one input channel: 9) are unrolled into
multiply-adds in float32, exact in any mode; longer ones use `tl.dot` over blocks of taps, in IEEE
float32 unless the compile allows TF32 (`allow_tf32`), as the library call would.

The transposed convolution of stride 1 (the data gradient of a stride-1 convolution) is the same kernel
reading the window backwards: input row `oh + top - kh * dilation`, the weights' two channel axes
swapped. A max pooling of the epilogue's output whose windows tile it can be computed in the same kernel
(`poolable`): its tiles then hold whole rows of windows. The weights' gradient (`weights_gradient`) is a
product of output channels by taps over all the pixels, split over the pixels into partial sums that a
second kernel adds in a fixed order.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..ir import Operation
from ..ops.contraction import _nchw_shape, _resolve_padding, _transpose_out_hw, _weights_dims
from ..registry import ELEMENTWISE, lookup
from .common import DIVISIONS, Layout, checks_divisor, compute_dtype, expression, header, literal, tl_type
from .pointwise import KernelSource

SMALL_TAPS = 32  # windows of at most this many taps are unrolled multiply-adds, longer ones tile products
SMALL_WEIGHT_TAPS = 16  # weights gradients of at most this many taps keep an accumulator per tap
TAP_MAJOR_CHANNELS = 16  # from this many input channels a product's step is one tap's block of channels
FEW_PIXELS = 1024  # outputs of at most this many pixels (batch x height x width) also try FEW_PIXEL_BLOCKS
FEW_PIXEL_BLOCKS = (16, 32, 32, 2, 2)  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): ResNet-18's batch-1 layers
DTYPES = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class Window:
    """A convolution as the kernel walks it: per output pixel (n, oh, ow) and channel co, the sum over
    input channel ci and taps (kh, kw) of x[n, ci, oh * sh + oh0 + kh * dh, ow * sw + ow0 + kw * dw] *
    weight(co, ci, kh, kw); extents are NCHW, strides of x and the weights per logical axis."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    ho: int
    wo: int
    kh: int
    kw: int
    stride: tuple[int, int]
    origin: tuple[int, int]
    dilation: tuple[int, int]
    x_strides: tuple[int, int, int, int]  # n, ci, h, w
    w_strides: tuple[int, int, int, int]  # co, ci, kh, kw
    nhwc: bool


def _x_strides(lay: Layout, layout: str) -> tuple[int, ...]:
    s = lay.strides
    return tuple(s) if layout == "NCHW" else (s[0], s[3], s[1], s[2])


def _w_strides(lay: Layout, layout: str) -> tuple[int, ...]:
    s = lay.strides  # OIHW, or HWIO: (kh, kw, i, o)
    return tuple(s) if layout == "OIHW" else (s[3], s[2], s[0], s[1])


def unsupported(op: Operation) -> str:
    """Why the template cannot compute contraction `op` ("" when it can)."""
    if op.op not in ("convolution2d", "convolution_transpose2d"):
        return f"{op.op} has no convolution template"
    x = op.inputs[0]
    if x.dtype.name not in DTYPES:
        return f"the template computes {', '.join(DTYPES)}, not {x.dtype.name}"
    if op.attrs["groups"] != 1:
        return "grouped convolutions go to the library"
    if op.op == "convolution_transpose2d" and tuple(op.attrs["stride"]) != (1, 1):
        return "transposed convolutions of stride > 1 go to the library"
    sizes = [t.type.numel() for t in (*op.inputs, *op.outputs)]
    if max(sizes) >= 2**31:
        return "a tensor of 2**31 elements or more"
    return ""


def window(op: Operation, x_layout: Layout, w_layout: Layout) -> Window:
    """The `Window` of a convolution2d or a stride-1 convolution_transpose2d op (see `unsupported`)."""
    attrs = op.attrs
    layout, wl = attrs["data_layout"], attrs["weights_layout"]
    x, out = op.inputs[0], op.outputs[0]
    n, c, h, w = _nchw_shape(x.shape, layout)
    _, _, ho, wo = _nchw_shape(out.shape, layout)
    o, i, kh, kw = _weights_dims(op.inputs[1].shape, wl)
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    ws = _w_strides(w_layout, wl)
    if op.op == "convolution2d":
        top, _, left, _ = _resolve_padding(attrs["padding"], (h, w), (kh, kw), (sh, sw), (dh, dw))
        return Window(n, c, h, w, o, ho, wo, kh, kw, (sh, sw), (-top, -left), (dh, dw),
                      _x_strides(x_layout, layout), ws, layout == "NHWC")
    # transposed, stride 1: dx[ih] = sum_kh dy[ih + top - kh * dh] w[kh]; the weights' O axis is summed
    target = (ho, wo) if len(op.inputs) == 3 else _transpose_out_hw(h, w, (kh, kw), attrs,
                                                                       attrs.get("output_padding", (0, 0)))
    top, _, left, _ = _resolve_padding(attrs["padding"], target, (kh, kw), (sh, sw), (dh, dw))
    return Window(n, c, h, w, i, ho, wo, kh, kw, (1, 1), (top, left), (-dh, -dw), _x_strides(x_layout, layout),
                  (ws[1], ws[0], ws[2], ws[3]), layout == "NHWC")


def variants(op: Operation) -> list[dict]:
    """Options of the template worth measuring against each other for contraction `op` on a GPU: where the
    product steps one tap's channels at a time, the input tile's load order, and the flattened window; with
    few output pixels (a small batch's late layers) also tiles of 16 rows, so that more programs share the
    work (a 128-row tile of a 64-pixel output leaves all but one program idle)."""
    x, w = op.inputs[:2]
    cin = _nchw_shape(x.shape, op.attrs["data_layout"])[1]
    _, _, kh, kw = _weights_dims(w.shape, op.attrs["weights_layout"])
    found = [{}, {"conv_order": "pixels"}, {"conv_form": "flat"}] \
        if cin * kh * kw > SMALL_TAPS and cin >= TAP_MAJOR_CHANNELS else [{}]
    on, _, oh, ow = _nchw_shape(op.outputs[0].shape, op.attrs["data_layout"])
    if op.op == "convolution2d" and on * oh * ow <= FEW_PIXELS:
        found.append({"conv_blocks": FEW_PIXEL_BLOCKS})
    return found


def weights_variants(op: Operation) -> list[dict]:
    """Options of `weights_gradient` worth measuring against each other on a GPU: pixels per step of the
    split product (twice the default, more bytes in flight per program) and, for few taps or many channels,
    the product over the flattened window, at both."""
    dy, x, wl = op.inputs
    cin = _nchw_shape(x.shape, op.attrs["data_layout"])[1]
    _, _, kh, kw = _weights_dims(wl.shape, op.attrs["weights_layout"])
    wider = 64 if x.dtype.name == "float32" else 128
    if cin * kh * kw <= SMALL_WEIGHT_TAPS:
        return [{}, {"wgrad_pixels": 128}, {"wgrad_form": "flat"}, {"wgrad_form": "flat", "wgrad_pixels": 128}]
    if cin >= TAP_MAJOR_CHANNELS:
        return [{}, {"wgrad_pixels": wider}, {"wgrad_form": "flat"}, {"wgrad_form": "flat", "wgrad_pixels": wider}]
    return [{}, {"wgrad_pixels": wider}]


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def blocks(win: Window, dtype: str, interpret: bool, options: dict) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); `options["conv_blocks"]` overrides."""
    if "conv_blocks" in options:
        return tuple(options["conv_blocks"])
    bn = max(16, min(64, _pow2(win.cout)))
    if interpret:
        return 32, bn, 16, 4, 1
    if win.cin * win.kh * win.kw <= SMALL_TAPS:
        return 128, bn, 16, 4, 1
    return 128, bn, 32 if dtype == "float32" else 64, 4, 3


def poolable(body, output: int, attrs: dict) -> str:
    """Why the kernel of convolution `body` cannot also max-pool its output `output` with pooling `attrs`
    ("" when it can): windows of power-of-two extents that tile the NCHW output, and rows short enough for
    a tile to hold a row of windows."""
    from .matmul import split
    from .pooling import fits

    conv = split(body).contraction
    out = conv.outputs[0]
    if conv.op != "convolution2d" or conv.attrs["data_layout"] != "NCHW" or attrs.get("data_layout") != "NCHW":
        return "pooling inside a convolution kernel takes NCHW convolutions"
    if body.outputs[output].shape != out.shape or not fits(attrs, out.shape):
        return "the pooling windows do not tile the convolution's output"
    if any(k & (k - 1) for k in attrs["kernel_size"]):
        return "a pooling window of other than power-of-two extents"
    if attrs["kernel_size"][0] * _pow2(out.shape[3]) > 256:
        return "a window's rows take more than 256 lanes of a tile"
    return ""


def generate(name: str, body, in_layouts: list[Layout], interpret: bool, options: dict | None = None,
             contraction: Operation | None = None, pool: tuple[int, tuple[int, int]] | None = None) -> KernelSource:
    """Triton source for a convolution kernel `body` (a Program: the convolution and a pointwise epilogue)
    reading inputs of the given layouts; with `contraction` set, `body` is None and the kernel computes
    that op alone from its first two inputs. With `pool` (body output index, window), the kernel also
    max-pools that output (see `poolable`) into a last output: its tiles then hold whole rows of windows
    (rows padded to a power of two), pooled in registers."""
    options = options or {}
    if contraction is None:
        from .matmul import split  # the same split of a kernel body into product and epilogue

        parts = split(body)
        conv, epilogue = parts.contraction, parts.epilogue
        if any(p is not None for p in parts.prologues):
            raise NotImplementedError("a convolution's operands are read from memory")
        placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
        outputs = list(body.outputs)
    else:
        conv, epilogue, placeholders, outputs = contraction, [], list(contraction.inputs), [contraction.outputs[0]]
    reason = unsupported(conv)
    if reason:
        raise NotImplementedError(reason)
    arg_of = {t.id: f"in{i}" for i, t in enumerate(placeholders)}
    layout_of = {t.id: lay for t, lay in zip(placeholders, in_layouts)}
    xt, wt = conv.inputs[:2]
    if xt.id not in arg_of or wt.id not in arg_of:
        raise NotImplementedError("a convolution's operands are read from memory")
    win = window(conv, layout_of[xt.id], layout_of[wt.id])
    out = conv.outputs[0]
    dt = out.dtype
    taps = win.cin * win.kh * win.kw
    bm, bn, bk, warps, stages = blocks(win, dt.name, interpret, options)
    if pool is not None and options.get("conv_pool") != "cells":
        band = pool[1][0] * _pow2(win.wo)  # one row of windows: its window rows, each padded to a power of two
        bm = max(bm, band)
    hw = win.ho * win.wo
    xs, ws = win.x_strides, win.w_strides
    (sh, sw), (oh0, ow0), (dh, dw) = win.stride, win.origin, win.dilation
    wide = max(t.type.numel() for t in (*placeholders, *outputs)) >= 2**31 - 2**20
    cast = ".to(tl.int64)" if wide else ""

    def term(var: str, stride: int) -> str:
        return "" if stride == 0 else f" + {var}" if stride == 1 else f" + {var} * {stride}"

    def ptr(t, extra: str = "") -> str:
        lay = layout_of[t.id]
        return arg_of[t.id] + (f" + {lay.offset}" if lay.offset else "") + extra

    x_in, w_in = ptr(xt), ptr(wt)
    lines = [f"    x_row = nn * {xs[0]}", f"    ih0 = oh * {sh} + {oh0}", f"    iw0 = ow * {sw} + {ow0}",
             "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
    precision = "" if dt.name != "float32" else \
        ', input_precision="tf32"' if options.get("allow_tf32") else ', input_precision="ieee"'
    dot_type = tl_type(dt)
    # the interpreter holds bfloat16 as raw integers, which its tl.dot multiplies as integers (codegen/matmul.py)
    widen = ".to(tl.float32)" if interpret and dt.name == "bfloat16" else ""
    if taps <= SMALL_TAPS:
        for ci in range(win.cin):
            for a in range(win.kh):
                lines += [f"    ih = ih0 + {a * dh}", f"    h_ok = m_ok & (ih >= 0) & (ih < {win.h})"]
                for b in range(win.kw):
                    lines += [f"    iw = iw0 + {b * dw}",
                              f"    xv = tl.load({x_in} + x_row{term(str(ci), xs[1])}{term('ih', xs[2])}"
                              f"{term('iw', xs[3])}, mask=h_ok & (iw >= 0) & (iw < {win.w}), other=0)"
                              ".to(tl.float32)",
                              f"    wv = tl.load({w_in} + rn * {ws[0]} + {ci * ws[1] + a * ws[2] + b * ws[3]}, "
                              "mask=n_ok, other=0).to(tl.float32)",
                              "    acc += xv[:, None] * wv[None, :]"]
    elif win.cin >= TAP_MAJOR_CHANNELS and options.get("conv_form") != "flat":
        # one tap at a time, a block of input channels per step: the window's indices are computed per pixel
        # (a vector) instead of per pixel and tap; `conv_order` "pixels" loads the input tile channels by
        # pixels, pixels fastest (NCHW images are contiguous along their rows), and transposes it in registers
        blocks_c = -(-win.cin // bk)
        by_pixels = options.get("conv_order", "channels") == "pixels"
        if by_pixels:
            tile = f"x_at[None, :]{term('ci[:, None]', xs[1])}", "ok[None, :] & c_ok[:, None]"
        else:
            tile = f"x_at[:, None]{term('ci[None, :]', xs[1])}", "ok[:, None] & c_ok[None, :]"
        lines += [f"    for it in range(0, {win.kh * win.kw * blocks_c}):",
                  f"        t = it // {blocks_c}",
                  f"        ci = (it % {blocks_c}) * BLOCK_K + tl.arange(0, BLOCK_K)",
                  f"        c_ok = ci < {win.cin}",
                  f"        kh_ = t // {win.kw}",
                  f"        kw_ = t % {win.kw}",
                  f"        ih = ih0 + kh_ * {dh}",
                  f"        iw = iw0 + kw_ * {dw}",
                  f"        ok = m_ok & (ih >= 0) & (ih < {win.h}) & (iw >= 0) & (iw < {win.w})",
                  f"        x_at = x_row{term('ih', xs[2])}{term('iw', xs[3])}",
                  f"        a = tl.load({x_in} + {tile[0]}, mask={tile[1]}, other=0).to({dot_type}){widen}",
                  f"        b = tl.load({w_in} + rn[None, :] * {ws[0]}{term('ci[:, None]', ws[1])}"
                  f"{term('kh_', ws[2])}{term('kw_', ws[3])}, mask=c_ok[:, None] & n_ok[None, :], other=0)"
                  f".to({dot_type}){widen}",
                  f"        acc = tl.dot({'tl.trans(a)' if by_pixels else 'a'}, b, acc{precision})"]
    else:
        lines += [f"    for k0 in range(0, {taps}, BLOCK_K):",
                  "        rk = k0 + tl.arange(0, BLOCK_K)",
                  f"        k_ok = rk < {taps}",
                  f"        kw_ = rk % {win.kw}",
                  f"        kh_ = (rk // {win.kw}) % {win.kh}",
                  f"        ci = rk // {win.kh * win.kw}",
                  f"        ih = ih0[:, None] + kh_[None, :] * {dh}",
                  f"        iw = iw0[:, None] + kw_[None, :] * {dw}",
                  f"        ok = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < {win.h}) & (iw >= 0) & "
                  f"(iw < {win.w})",
                  f"        a = tl.load({x_in} + x_row[:, None]{term('ci[None, :]', xs[1])}{term('ih', xs[2])}"
                  f"{term('iw', xs[3])}, mask=ok, other=0).to({dot_type}){widen}",
                  f"        b = tl.load({w_in} + rn[None, :] * {ws[0]}{term('ci[:, None]', ws[1])}"
                  f"{term('kh_[:, None]', ws[2])}{term('kw_[:, None]', ws[3])}, "
                  f"mask=k_ok[:, None] & n_ok[None, :], other=0).to({dot_type}){widen}",
                  f"        acc = tl.dot(a, b, acc{precision})"]
    product, lines = lines, []
    # the product rounded to its type, as the library stores it, then the epilogue on the tile
    rounded = "acc" if dt == compute_dtype(dt) else f"acc.to({tl_type(dt)}).to(tl.float32)"
    axes = ("nn[:, None]", "oh[:, None]", "ow[:, None]", "rn[None, :]") if win.nhwc else \
        ("nn[:, None]", "rn[None, :]", "oh[:, None]", "ow[:, None]")
    names = iter(range(1 << 30))
    for t in outputs:
        if t.shape != out.shape:
            raise NotImplementedError(f"convolution kernel output {t.name} of shape {t.shape} is not the "
                                      f"product's {out.shape}")

    def tile() -> list[str]:
        """The product and the epilogue on the tile at pixels (nn, oh, ow); each output's value in its compute
        type (a tile, a row or a column)."""
        lines.extend(product)
        lines.append(f"    c = {rounded}")
        value = {out.id: "c"}
        for op in epilogue:
            o = op.outputs[0]
            if op.op == "constant":
                value[o.id] = literal(op.attrs["value"], o.dtype)
                continue
            if lookup(op.op).kind != ELEMENTWISE or op.op in DIVISIONS and checks_divisor(op):
                raise NotImplementedError(f"{op.op} ({op.name}) in a convolution's epilogue")
            args = []
            for t in op.inputs:
                if t.id not in value:
                    lay = layout_of[t.id].broadcast_to(out.shape)
                    terms = "".join(term(v, s) for v, s in zip(axes, lay.strides))
                    # a value constant along the tile's rows (a bias) or columns loads as one row or column
                    rows = any(st for v, st in zip(axes, lay.strides) if v.endswith("[:, None]"))
                    cols = any(st for v, st in zip(axes, lay.strides) if v.endswith("[None, :]"))
                    mask = " & ".join(m for m, used in (("m_ok[:, None]", rows), ("n_ok[None, :]", cols)) if used)
                    var = f"x{next(names)}"
                    lines.append(f"    {var} = tl.load({ptr(t)}{terms}{f', mask={mask}, other=0' if mask else ''})"
                                 f".to({tl_type(compute_dtype(t.dtype))})")
                    value[t.id] = var
                args.append(value[t.id])
            var = f"v{next(names)}"
            lines.append(f"    {var} = {expression(op, args)}")
            value[o.id] = var
        return [value.get(t.id, "c") for t in outputs]

    def store(where: str, values: list[str], mask: str = "m_ok[:, None] & n_ok[None, :]") -> None:
        lines.extend(f"    tl.store(out{i} + {where}, ({v}).to({tl_type(t.dtype)}), mask={mask})"
                     for i, (v, t) in enumerate(zip(values, outputs)))

    pool_type = tl_type(outputs[pool[0]].dtype) if pool is not None else ""

    names_out = [f"out{i}" for i in range(len(outputs))]
    plane = f"nn[:, None] * {win.cout * hw} + rn[None, :] * {hw}"
    if pool is None:
        store("rm[:, None] * {c} + rn[None, :]".format(c=win.cout) if win.nhwc else f"{plane} + (rm % {hw})[:, None]",
              tile())
        m = win.n * hw
        grid_m = -(-m // bm)
        pixels = f"""    m_ok = rm < M
    ow = rm % {win.wo}
    oh = (rm // {win.wo}) % {win.ho}
    nn = rm // {hw}"""
    elif options.get("conv_pool") == "cells":
        # rm walks the pooled pixels; the tile is computed once per cell of the window and the cells meet in
        # a running maximum, lane by lane. A row's two cells are interleaved (join, reshape) and stored as
        # rows of consecutive pixels: stored apart, each lane's pixel is two elements from the next lane's,
        # no store is contiguous and every lane of a warp writes a line of its own
        kp, lp = pool[1]
        ph, pw = win.ho // kp, win.wo // lp
        if lp not in (1, 2):
            raise NotImplementedError("pooling by cells takes windows of one or two columns")
        pixels = f"""    m_ok = rm < M
    pw_ = rm % {pw}
    ph_ = (rm // {pw}) % {ph}
    nn = rm // {ph * pw}"""
        if lp == 2:  # the pixels of a row of cells: s2 = 2 * pooled pixel + column
            pixels += f"""
    s2 = (tl.program_id(0) * (2 * BLOCK_M) + tl.arange(0, 2 * BLOCK_M)){cast}
    ow2 = s2 % {win.wo}
    ph2 = (s2 // {win.wo}) % {ph}
    nn2 = s2 // {win.wo * ph}
    m2_ok = s2 < 2 * M"""
        for a in range(kp):
            cells = []
            for b in range(lp):
                lines += [f"    oh = ph_ * {kp} + {a}", f"    ow = pw_ * {lp} + {b}"]
                values = [f"v{next(names)}" for _ in outputs]
                # in the output's type (bool as bytes) for the join; the running maximum in the compute type
                raw = tile()
                kinds = ["tl.int8" if t.dtype.name == "bool" else tl_type(t.dtype) for t in outputs]
                lines.extend(f"    {v} = tl.broadcast_to(({e}).to({k}), (BLOCK_M, BLOCK_N))"
                             for v, e, k in zip(values, raw, kinds))
                cells.append(values)
                first = a == b == 0
                lines.append(f"    pv = {raw[pool[0]]}" if first else f"    pv = _maximum(pv, {raw[pool[0]]})")
            if lp == 1:
                store(f"{plane} + (oh * {win.wo} + ow)[:, None]", cells[0])
                continue
            joined = [f"tl.reshape(tl.permute(tl.join({u}, {v}), (0, 2, 1)), (2 * BLOCK_M, BLOCK_N))"
                      for u, v in zip(*cells)]
            store(f"nn2[:, None] * {win.cout * hw} + rn[None, :] * {hw} + ((ph2 * {kp} + {a}) * {win.wo} + ow2)"
                  "[:, None]", joined, "m2_ok[:, None] & n_ok[None, :]")
        lines.append(f"    tl.store(pooled + nn[:, None] * {win.cout * ph * pw} + rn[None, :] * {ph * pw} + "
                     f"(rm % {ph * pw})[:, None], pv.to({pool_type}), mask=m_ok[:, None] & n_ok[None, :])")
        names_out.append("pooled")
        m = win.n * ph * pw
        grid_m = -(-m // bm)
    else:
        # rm walks rows of windows: (n, pooled row) groups of kh rows of `width` lanes, the last lanes masked
        (kp, lp), width = pool[1], _pow2(win.wo)
        ph, pw = win.ho // kp, win.wo // lp
        values = tile()
        store(f"{plane} + (oh * {win.wo} + ow)[:, None]", values)
        pixels = f"""    ow = rm % {width}
    grp = rm // {kp * width}
    oh = (grp % {ph}) * {kp} + (rm // {width}) % {kp}
    nn = grp // {ph}
    m_ok = (ow < {win.wo}) & (grp < M)"""
        rows = bm // (kp * width)
        lines += [f"    pv = tl.reshape({values[pool[0]]}, ({rows}, {kp}, {width // lp}, {lp}, BLOCK_N))",
                  "    pv = tl.reduce(tl.reduce(pv, 3, _maximum), 1, _maximum)",
                  f"    pg = (tl.program_id(0) * {rows} + tl.arange(0, {rows})){cast}[:, None, None]",
                  f"    pc = tl.arange(0, {width // lp})[None, :, None]",
                  f"    tl.store(pooled + (pg // {ph}) * {win.cout * ph * pw} + rn[None, None, :] * {ph * pw} + "
                  f"(pg % {ph}) * {pw} + pc, pv.to({pool_type}), mask=(pg < M) & (pc < {pw}) & n_ok[None, None, :])"]
        names_out.append("pooled")
        m = win.n * ph
        grid_m = -(-m * kp * width // bm)
    params = ", ".join([arg_of[t.id] for t in placeholders] + names_out)
    what = "transposed convolution" if conv.op == "convolution_transpose2d" else "convolution"
    src = header(f"{what} kernel {name}", interpret, reduction=pool is not None) + f'''

@triton.jit
def {name}({params}, M, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)){cast}
    rn = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)){cast}
    n_ok = rn < {win.cout}
{pixels}
''' + "\n".join(lines) + "\n"
    grid = (grid_m, -(-win.cout // bn))
    return KernelSource(name, src, grid, warps, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, "convolution",
                        sizes=(m,), num_stages=stages)


def key(op: Operation, dtype: DType, options: dict) -> str:
    """What a measured choice between this template and the library depends on, besides the source."""
    x, w = op.inputs[:2]
    tf32 = ":tf32" if options.get("allow_tf32") and dtype.name == "float32" else ""
    layout = options.get("conv_channels_last")
    tf32 += f":channels_last={layout}" if layout else ""  # the library calls it is measured against
    attrs = ",".join(f"{k}={op.attrs[k]}" for k in ("stride", "padding", "dilation", "data_layout", "weights_layout"))
    return f"{op.op}:{x.shape}x{w.shape}:{attrs}:{dtype}{tf32}"


@dataclass
class WeightsGradientSource:
    """The weights' gradient as two kernels: `partial` sums each of `splits` slices of the pixels into a
    float32 scratch of `scratch` elements, `finish` adds the slices in a fixed order (deterministic) into the
    gradient, in the weights' layout and type."""

    partial: KernelSource
    finish: KernelSource
    splits: int
    scratch: int


def weights_gradient(name: str, op: Operation, in_layouts: list[Layout], interpret: bool,
                     options: dict | None = None) -> WeightsGradientSource:
    """Kernels for `convolution2d_weights_gradient(dy, x, weights_like)`: per output channel co and tap
    (ci, kh, kw), the sum over the pixels (n, oh, ow) of dy[n, co, oh, ow] * x[n, ci, window], a product
    of co x taps over a long contraction, split over the pixels (see `WeightsGradientSource`)."""
    options = options or {}
    if op.op != "convolution2d_weights_gradient":
        raise NotImplementedError(f"{op.op} is not a weights gradient")
    dy, x, wl = op.inputs
    attrs = op.attrs
    if x.dtype.name not in DTYPES or attrs["groups"] != 1:
        raise NotImplementedError("the template computes ungrouped float convolutions")
    if max(t.type.numel() for t in op.inputs) >= 2**31 - 2**20:
        raise NotImplementedError("a tensor of 2**31 elements or more")
    layout = attrs["data_layout"]
    n, cin, h, w = _nchw_shape(x.shape, layout)
    _, cout, ho, wo = _nchw_shape(dy.shape, layout)
    _, _, kh, kw = _weights_dims(wl.shape, attrs["weights_layout"])
    (sh, sw), (dh, dw) = attrs["stride"], attrs["dilation"]
    top, _, left, _ = _resolve_padding(attrs["padding"], (h, w), (kh, kw), (sh, sw), (dh, dw))
    ys, xs = _x_strides(in_layouts[0], layout), _x_strides(in_layouts[1], layout)
    taps, hw, pixels = cin * kh * kw, ho * wo, n * ho * wo
    dt = x.dtype
    dot_type = tl_type(dt)
    widen = ".to(tl.float32)" if interpret and dt.name == "bfloat16" else ""
    precision = "" if dt.name != "float32" else \
        ', input_precision="tf32"' if options.get("allow_tf32") else ', input_precision="ieee"'
    form = options.get("wgrad_form") or ("small" if taps <= SMALL_WEIGHT_TAPS else
                                         "tap" if cin >= TAP_MAJOR_CHANNELS else "flat")
    bm = max(16, min(64, _pow2(cout)))
    if form == "small":  # a 2-D accumulator per tap, summed over the pixels once at the end
        bn, bk, warps, stages = 16, (16 if interpret else 64), (4 if interpret else 8), 1
        tiles = -(-cout // bm)
        grid_n = 1
    elif form == "tap":  # one tap and a block of input channels per program
        bn = max(16, min(64, _pow2(cin)))
        bk, warps, stages = 16 if interpret else 32 if dt.name == "float32" else 64, 4, (1 if interpret else 3)
        grid_n = kh * kw * -(-cin // bn)
        tiles = -(-cout // bm) * grid_n
    else:
        bn = max(16, min(64, _pow2(taps)))
        bk, warps, stages = 16 if interpret else 32 if dt.name == "float32" else 64, 4, (1 if interpret else 3)
        grid_n = -(-taps // bn)
        tiles = -(-cout // bm) * grid_n
    if interpret:
        bm = 16
        tiles = -(-cout // bm) * grid_n
    elif "wgrad_pixels" in options:  # pixels per step, a variant measured on the GPU (`weights_variants`)
        bk = options["wgrad_pixels"]
    want = 4 * options.get("sm_count", 132) if not interpret else 4
    splits = max(1, min(-(-pixels // (4 * bk)), -(-want // tiles)))
    scratch = splits * cout * taps

    def off(t: Layout) -> str:
        return f" + {t.offset}" if t.offset else ""

    dy_tile = (f"tl.load(dy{off(in_layouts[0])} + nn[None, :] * {ys[0]} + rm[:, None] * {ys[1]} + oh[None, :] * "
               f"{ys[2]} + ow[None, :] * {ys[3]}, mask=m_ok[:, None] & p_ok[None, :], other=0)")
    x_ptr = f"x{off(in_layouts[1])}"
    head, body, tail = [], [], []
    if form == "small":
        cells = [(c, a, b) for c in range(cin) for a in range(kh) for b in range(kw)]
        head += [f"    acc{t} = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)" for t in range(len(cells))]
        body.append(f"        a = {dy_tile}.to(tl.float32)")
        for t, (c, a, b) in enumerate(cells):
            body += [f"        ih = oh * {sh} + {a * dh - top}",
                     f"        iw = ow * {sw} + {b * dw - left}",
                     f"        ok = p_ok & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})",
                     f"        xv = tl.load({x_ptr} + nn * {xs[0]} + {c * xs[1]} + ih * {xs[2]} + iw * {xs[3]}, "
                     "mask=ok, other=0).to(tl.float32)",
                     f"        acc{t} += a * xv[None, :]"]
            tail.append(f"    tl.store(part + split * {cout * taps} + rm * {taps} + {t}, tl.sum(acc{t}, axis=1), "
                        "mask=m_ok)")
    elif form == "tap":
        blocks_c = -(-cin // bn)
        head += ["    t = tl.program_id(0) // " + str(blocks_c),
                 f"    rc = (tl.program_id(0) % {blocks_c}) * BLOCK_N + tl.arange(0, BLOCK_N)",
                 f"    c_ok = rc < {cin}",
                 f"    kh_ = t // {kw}",
                 f"    kw_ = t % {kw}",
                 "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
        body += [f"        a = {dy_tile}.to({dot_type}){widen}",
                 f"        ih = oh * {sh} + {-top} + kh_ * {dh}",
                 f"        iw = ow * {sw} + {-left} + kw_ * {dw}",
                 f"        ok = p_ok & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})",
                 f"        b = tl.load({x_ptr} + (nn * {xs[0]} + ih * {xs[2]} + iw * {xs[3]})[:, None] + rc[None, :] * "
                 f"{xs[1]}, mask=ok[:, None] & c_ok[None, :], other=0).to({dot_type}){widen}",
                 f"        acc = tl.dot(a, b, acc{precision})"]
        tail.append(f"    tl.store(part + split * {cout * taps} + rm[:, None] * {taps} + "
                    f"(rc * {kh * kw} + t)[None, :], acc, mask=m_ok[:, None] & c_ok[None, :])")
    else:
        head += ["    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)",
                 f"    n_ok = rn < {taps}",
                 f"    kw_ = rn % {kw}",
                 f"    kh_ = (rn // {kw}) % {kh}",
                 f"    ci = rn // {kh * kw}",
                 "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"]
        body += [f"        a = {dy_tile}.to({dot_type}){widen}",
                 f"        ih = oh[:, None] * {sh} + {-top} + kh_[None, :] * {dh}",
                 f"        iw = ow[:, None] * {sw} + {-left} + kw_[None, :] * {dw}",
                 f"        ok = p_ok[:, None] & n_ok[None, :] & (ih >= 0) & (ih < {h}) & (iw >= 0) & (iw < {w})",
                 f"        b = tl.load({x_ptr} + nn[:, None] * {xs[0]} + ci[None, :] * {xs[1]} + ih * {xs[2]} + "
                 f"iw * {xs[3]}, mask=ok, other=0).to({dot_type}){widen}",
                 f"        acc = tl.dot(a, b, acc{precision})"]
        tail.append(f"    tl.store(part + split * {cout * taps} + rm[:, None] * {taps} + rn[None, :], acc, "
                    "mask=m_ok[:, None] & n_ok[None, :])")
    partial = header(f"convolution weights gradient {name}, partial sums", interpret) + f'''

@triton.jit
def {name}_partial(dy, x, like, part, P, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(2)
    m_ok = rm < {cout}
    chunk = tl.cdiv(tl.cdiv(P, {splits}), BLOCK_K) * BLOCK_K
''' + "\n".join(head) + f'''
    for p0 in range(split * chunk, split * chunk + chunk, BLOCK_K):
        rp = p0 + tl.arange(0, BLOCK_K)
        p_ok = rp < P
        ow = rp % {wo}
        oh = (rp // {wo}) % {ho}
        nn = rp // {hw}
''' + "\n".join(body + tail) + "\n"
    out_strides = _w_strides(Layout.contiguous(wl.shape), attrs["weights_layout"])
    # a tile of slices by gradient elements per step, summed along the slices: a sequential loop over hundreds
    # of slices (one load in flight per element) took 99 µs for conv1's 288 elements on an H200, the product
    # 41 µs; tl.sum's tree over a fixed tile shape keeps the order fixed
    ways = 2 if interpret else min(128, max(2, _pow2(splits)))  # the interpreter's steps: the loop and its mask
    block = max(32, min(256, 4096 // ways))
    finish = header(f"convolution weights gradient {name}, sum of the slices", interpret) + f'''

@triton.jit
def {name}_finish(part, out, BLOCK: tl.constexpr, WAYS: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < {cout * taps}
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, {splits}, WAYS):
        k = k0 + tl.arange(0, WAYS)
        s += tl.sum(tl.load(part + k[:, None] * {cout * taps} + i[None, :], mask=(k < {splits})[:, None] & ok[None, :],
                            other=0), axis=0)
    co = i // {taps}
    t = i % {taps}
    tl.store(out + co * {out_strides[0]} + (t // {kh * kw}) * {out_strides[1]} + ((t // {kw}) % {kh}) * {out_strides[2]}
             + (t % {kw}) * {out_strides[3]}, s.to({dot_type}), mask=ok)
'''
    grid = (grid_n, -(-cout // bm), splits)
    return WeightsGradientSource(
        KernelSource(f"{name}_partial", partial, grid, warps, {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk},
                     "convolution", sizes=(pixels,), num_stages=stages),
        KernelSource(f"{name}_finish", finish, (-(-cout * taps // block),), 4, {"BLOCK": block, "WAYS": ways},
                     "convolution"),
        splits, scratch)
