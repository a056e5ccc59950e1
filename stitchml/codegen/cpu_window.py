"""The CPU templates of window ops as C++ loop nests (codegen/cpu.py compiles them): max pooling and its
gradient, average pooling, and the direct convolution of small convolutions.

Pooling is an opaque op: op by op it pads the input and calls PyTorch (`ops/contraction.py`), and on the CPU
those calls (a padded copy, the windows' maxima with their indices, the scatter of the gradient) cost more
than the convolutions around them. Here each (image, channel) plane is one unit of work for a thread: the
forward pass keeps each window's maximum in a register; the gradient finds each window's maximum again
(cheaper than storing indices) and adds the output's gradient there. Both follow PyTorch's rule exactly:
padding takes part as the lowest value of the type (it wins only a window whose real elements are all that
value, and its gradient is dropped), a later element wins only if it is greater or NaN, and a plane's
gradient is accumulated window by window in order, so the results are bit for bit those of an op-by-op
run. Average pooling divides each window's sum by the count the op-by-op implementation takes (cells of
the input, or of the padded input with include_zero_padding). Any strides (NCHW or NHWC, views); float32
and float64 (other types keep the op-by-op call).
"""
from __future__ import annotations

from ..ir import Operation
from ..ops.contraction import _nchw_shape, _resolve_padding, _window_out
from ..registry import ELEMENTWISE, lookup
from .common import Layout, checks_divisor, compute_dtype
from .cpu import CppSource, ctype, expression, literal, load, store

OPS = ("max_pooling2d", "max_pooling2d_gradient", "avg_pooling2d")
_TYPES = ("float32", "float64")


def _parallel(threads: str) -> list[str]:
    """The parallel region of a loop nest that `_threads` gives `threads`: none for one thread (entering
    OpenMP's runtime costs about a microsecond, as much as a small kernel's work)."""
    return [] if threads == "1" else [f"    #pragma omp parallel num_threads({threads})"]


def _threads(units: int, per_unit: int) -> str:
    """The thread count of a loop over `units` of `per_unit` elements each: one thread below 2**15 elements
    in all (waking a second costs more than it saves), as for the other CPU kernels."""
    return "threads" if units > 1 and units * per_unit >= 1 << 15 else "1"


def supports(op: Operation) -> bool:
    """Whether `op`, not a kernel of the stitcher's, has a native CPU form here (`source`): pooling, and the
    weights' gradient of a small convolution."""
    if op.op == "convolution2d_weights_gradient":
        return _direct_fits(op, 1, 2)
    return op.op in OPS and op.outputs[0].dtype.name in _TYPES and all(t.dtype.name in _TYPES for t in op.inputs)


def _geometry(op: Operation, x_shape: tuple) -> dict:
    attrs = op.attrs
    n, c, h, w = _nchw_shape(x_shape, attrs["data_layout"])
    kernel, stride, dil = attrs["kernel_size"], attrs["stride"], attrs["dilation"]
    pad = _resolve_padding(attrs["padding"], (h, w), kernel, stride, dil)
    out = tuple(_window_out((h, w)[a], kernel[a], stride[a], dil[a], pad[2 * a], pad[2 * a + 1], attrs["ceil_mode"])
                for a in range(2))
    return {"n": n, "c": c, "h": h, "w": w, "kh": kernel[0], "kw": kernel[1], "sh": stride[0], "sw": stride[1],
            "dh": dil[0], "dw": dil[1], "top": pad[0], "left": pad[2], "oh": out[0], "ow": out[1], "pad": pad}


def _nchw_strides(layout: Layout, data_layout: str) -> tuple[int, int, int, int]:
    s = layout.strides
    return s if data_layout == "NCHW" else (s[0], s[3], s[1], s[2])


def _window(g: dict, x_strides: tuple, t: str) -> list[str]:
    """Lines that leave the window (oh, ow)'s maximum in `m` and its element's row and column in `ay`, `ax`
    (ay = -1: padding won; the padded input PyTorch sees has its first cell at (-top, -left))."""
    sh, sw = x_strides[2], x_strides[3]
    if g["top"] == 0 and g["left"] == 0 and (g["oh"] - 1) * g["sh"] + g["dh"] * (g["kh"] - 1) < g["h"] and \
            (g["ow"] - 1) * g["sw"] + g["dw"] * (g["kw"] - 1) < g["w"]:  # no window reaches outside: no checks
        lines = [f"            {t} m = -({t})INF_D; int64_t ay = oh * {g['sh']}, ax = ow * {g['sw']};"]
        for i in range(g["kh"]):  # unrolled: straight-line selects, which vectorise over ow
            for j in range(g["kw"]):
                y, x = f"oh * {g['sh']} + {i * g['dh']}", f"ow * {g['sw']} + {j * g['dw']}"
                lines.append(f"            {{ const {t} v = src[({y}) * {sh}LL + ({x}) * {sw}LL]; "
                             "const bool win = v > m || v != v; "
                             f"m = win ? v : m; ay = win ? {y} : ay; ax = win ? {x} : ax; }}")
        return lines
    return [
        # PyTorch starts from the window's first cell with -inf: a window of -inf values sends its gradient there
        f"            {t} m = -({t})INF_D; "
        f"int64_t ay = oh * {g['sh']} - {g['top']}, ax = ow * {g['sw']} - {g['left']};",
        "            if (ay < 0 || ax < 0) ay = -1;",
        f"            for (int64_t i = 0; i < {g['kh']}; ++i) {{",
        f"                const int64_t y = oh * {g['sh']} - {g['top']} + i * {g['dh']};",
        f"                for (int64_t j = 0; j < {g['kw']}; ++j) {{",
        f"                    const int64_t x = ow * {g['sw']} - {g['left']} + j * {g['dw']};",
        f"                    const bool inside = y >= 0 && y < {g['h']} && x >= 0 && x < {g['w']};",
        f"                    const {t} v = inside ? src[y * {sh}LL + x * {sw}LL] : -({t})INF_D;",
        "                    if (v > m || v != v) { m = v; ay = inside ? y : -1; ax = x; }",
        "                }",
        "            }",
    ]


def _average(g: dict, xs: tuple, t: str, with_padding: bool) -> list[str]:
    """Lines that leave the window (oh, ow)'s sum in `s` and the count it divides by in `k`: the cells inside
    the input, or with `with_padding` inside the padded input (a ceil-mode window's cells past the padding
    never count), as the op-by-op implementation's window sums of padded ones."""
    bottom, right = g["pad"][1], g["pad"][3]
    lo_y, hi_y, lo_x, hi_x = (-g["top"], g["h"] + bottom, -g["left"], g["w"] + right) if with_padding \
        else (0, g["h"], 0, g["w"])
    return [
        f"            {t} s = 0; int64_t k = 0;",
        f"            for (int64_t i = 0; i < {g['kh']}; ++i) {{",
        f"                const int64_t y = oh * {g['sh']} - {g['top']} + i;",
        f"                for (int64_t j = 0; j < {g['kw']}; ++j) {{",
        f"                    const int64_t x = ow * {g['sw']} - {g['left']} + j;",
        f"                    k += y >= {lo_y} && y < {hi_y} && x >= {lo_x} && x < {hi_x};",
        f"                    if (y >= 0 && y < {g['h']} && x >= 0 && x < {g['w']}) "
        f"s += src[y * {xs[2]}LL + x * {xs[3]}LL];",
        "                }",
        "            }",
    ]


def pooling(name: str, op: Operation, in_layouts: list[Layout]) -> CppSource:
    """C++ for max_pooling2d or avg_pooling2d (inputs: source) or max_pooling2d_gradient (inputs: dy, source);
    the output is a contiguous buffer of the op's shape (in its data layout)."""
    layout = op.attrs["data_layout"]
    grad = op.op == "max_pooling2d_gradient"
    x_layout = in_layouts[1] if grad else in_layouts[0]
    g = _geometry(op, x_layout.shape)
    xs = _nchw_strides(x_layout, layout)
    t = ctype(op.outputs[0].dtype)
    planes = g["n"] * g["c"]
    os_ = _nchw_strides(Layout.contiguous(op.outputs[0].shape), layout)  # the output (forward) or dx
    params = [f"const {ctype(x.dtype)}* __restrict__ in{i}" for i, x in enumerate(op.inputs)]
    lines = [f'extern "C" void {name}({", ".join(params)}, {t}* __restrict__ out0, int threads) {{',
             *[f"    #pragma omp parallel for schedule(static) num_threads({n})"
               for n in [_threads(planes, g['h'] * g['w'])] if n != "1"],
             f"    for (int64_t p = 0; p < {planes}LL; ++p) {{",
             f"        const int64_t n = p / {g['c']}, c = p % {g['c']};",
             f"        const {t}* src = in{1 if grad else 0} + n * {xs[0]}LL + c * {xs[1]}LL;"]
    if op.op == "avg_pooling2d":
        lines += [f"        for (int64_t oh = 0; oh < {g['oh']}; ++oh) {{",
                  f"          for (int64_t ow = 0; ow < {g['ow']}; ++ow) {{",
                  *_average(g, xs, t, op.attrs["include_zero_padding"]),
                  f"            out0[n * {os_[0]}LL + c * {os_[1]}LL + oh * {os_[2]}LL + ow * {os_[3]}LL] = "
                  f"s / ({t})k;",
                  "          }", "        }", "    }", "}"]
        return CppSource(name, "\n".join(lines) + "\n", "window")
    if grad:
        ds = _nchw_strides(in_layouts[0], layout)
        lines += [f"        const {t}* dy = in0 + n * {ds[0]}LL + c * {ds[1]}LL;",
                  f"        {t}* dx = out0 + n * {os_[0]}LL + c * {os_[1]}LL;"]
        tiles = (g["sh"], g["sw"], g["dh"], g["dw"], g["top"], g["left"]) == (g["kh"], g["kw"], 1, 1, 0, 0) and \
            g["oh"] * g["kh"] == g["h"] and g["ow"] * g["kw"] == g["w"]
        if tiles:  # every cell is in exactly one window: written once, no zeroing pass ((T)0 + dy as 0 += dy)
            store = [f"            const {t} d = dy[oh * {ds[2]}LL + ow * {ds[3]}LL];"]
            for i in range(g["kh"]):  # unrolled: a loop here keeps GCC from vectorising over ow (7x slower)
                for j in range(g["kw"]):
                    y, x = f"oh * {g['kh']} + {i}", f"ow * {g['kw']} + {j}"
                    store.append(f"            dx[({y}) * {os_[2]}LL + ({x}) * {os_[3]}LL] = "
                                 f"({y} == ay && {x} == ax) ? ({t})0 + d : ({t})0;")
        else:
            lines += [f"        for (int64_t y = 0; y < {g['h']}; ++y)",
                      f"            for (int64_t x = 0; x < {g['w']}; ++x) dx[y * {os_[2]}LL + x * {os_[3]}LL] = 0;"]
            store = [f"            if (ay >= 0) dx[ay * {os_[2]}LL + ax * {os_[3]}LL] += "
                     f"dy[oh * {ds[2]}LL + ow * {ds[3]}LL];"]
    else:
        store = [f"            out0[n * {os_[0]}LL + c * {os_[1]}LL + oh * {os_[2]}LL + ow * {os_[3]}LL] = m;"]
        ph = (g["oh"] - 1) * g["sh"] + g["dh"] * (g["kh"] - 1) + 1  # the rows and columns the windows cover
        pw = (g["ow"] - 1) * g["sw"] + g["dw"] * (g["kw"] - 1) + 1
        if (g["top"], g["left"]) != (0, 0) or ph > g["h"] or pw > g["w"]:
            # windows reach outside the input: the plane is copied into a block of -inf (which never wins) kept
            # per thread, where the windows need no checks and vectorise over ow (a check per cell did not:
            # ResNet's stem pooling, 3x3 stride 2 over 8 x 16x16 at batch 8, 44-50 -> 21 us)
            lines += [f"        static thread_local {t}* xp = nullptr;",
                      "        if (xp == nullptr) {",
                      f"            xp = ({t}*)__builtin_malloc({ph * pw}LL * sizeof({t}));",
                      f"            for (int64_t q = 0; q < {ph * pw}LL; ++q) xp[q] = -({t})INF_D;",
                      "        }",
                      f"        for (int64_t y = 0; y < {g['h']}; ++y) {{",
                      f"            const int64_t py = y + {g['top']};",
                      f"            if (py < 0 || py >= {ph}) continue;",
                      f"            for (int64_t x = 0; x < {g['w']}; ++x) {{",
                      f"                const int64_t px = x + {g['left']};",
                      f"                if (px >= 0 && px < {pw}) "
                      f"xp[py * {pw}LL + px] = src[y * {xs[2]}LL + x * {xs[3]}LL];",
                      "            }", "        }",
                      "        src = xp;"]
            g, xs = {**g, "top": 0, "left": 0, "h": ph, "w": pw}, (0, 0, pw, 1)
    lines += [f"        for (int64_t oh = 0; oh < {g['oh']}; ++oh) {{",
              "          #pragma omp simd",
              f"          for (int64_t ow = 0; ow < {g['ow']}; ++ow) {{",
              *_window(g, xs, t), *store, "          }", "        }", "    }", "}"]
    return CppSource(name, "\n".join(lines) + "\n", "window")


# -- direct convolution --------------------------------------------------------------------------------------
# Below this many multiply-adds per output (input channels x window), oneDNN's convolution is slow (its
# im2col and blocking are made for many channels: the first layer of an image network, one channel of 5x5,
# runs at a fifth of the speed of this loop nest); above it the library keeps the work.
DIRECT_MAX_TAPS = 32
# A forward convolution with more taps, up to DIRECT_MAX_SMALL_TAPS, still runs as the loop nest when an
# image's whole product is small (at most DIRECT_SMALL_MACS multiply-adds): there oneDNN's fixed cost per
# call dominates (8 -> 16 channels, 3x3, 8x8 pixels: 17.6 us against 6.2 at batch 1, 122 against 28 at
# batch 8; 16 -> 16 at 8x8, 144 taps: 22 against 20 and 126 against 47, one thread). Larger products keep
# the library: the loop nest reloads its sums once per window row (32 -> 32 at 16x16: 3x slower).
DIRECT_MAX_SMALL_TAPS = 160
DIRECT_SMALL_MACS = 160_000


# Any other forward convolution (a stride, more taps) runs as the patch loop nest (`_patch_convolution`) where
# an image's product is at most DIRECT_PATCH_MACS multiply-adds and a window at most DIRECT_PATCH_MAX_TAPS:
# ResNet-18's 7x7 stride-2 stem over three channels at 32x32 (301k) took oneDNN 73 us at batch 1, its
# 3x3 convolutions over 32-64 channels at 2x2 and 1x1 pixels 8-16 us a call, mostly the library's fixed cost.
DIRECT_PATCH_MACS = 320_000
DIRECT_PATCH_MAX_TAPS = 1024


def _conv_sizes(op: Operation) -> tuple[int, int]:
    """(multiply-adds per output, multiply-adds per image) of convolution2d `op` (NCHW, OIHW; an output
    reads its group's input channels only, the weights' second axis)."""
    w = op.inputs[1].shape
    taps = w[1] * w[2] * w[3]
    return taps, w[0] * op.outputs[0].shape[2] * op.outputs[0].shape[3] * taps


class Epilogue:
    """A convolution kernel's pointwise epilogue (`fused_epilogue`): the product's value and per-channel
    operands (a bias, a batch norm's statistics) in, the kernel's output out, computed at the end of the
    convolution's own kernel over each output plane while it is in cache (`_tail`): no kernel of its own,
    no product buffer, no per-element index of the channel's operands."""

    def __init__(self, lines: list[str], result: str, inputs: int, t: str):
        self.lines, self.result, self.inputs, self.t = lines, result, inputs, t

    def params(self) -> str:
        """The kernel's parameters for the epilogue's operands (after the source and the weights)."""
        return "".join(f"const {self.t}* __restrict__ in{2 + k}, " for k in range(self.inputs))

    def store(self, target: str, value: str, channel: str) -> str:
        """A C++ statement storing the epilogue of `value` (output channel `channel`) into `target`."""
        body = " ".join(line.replace("@V", f"({value})").replace("@C", f"({channel})") for line in self.lines)
        return f"{{ {body} {target} = {self.result}; }}"


def fused_epilogue(body, layouts: list[Layout]) -> Epilogue | None:
    """The epilogue `body` of a convolution (its first placeholder the product, of contiguous NCHW layout
    `layouts[0]`) as an `Epilogue`, or None where it does not fit one: one output of the product's shape
    and type, elementwise ops with no checks, and every other operand of the same type read per output
    channel (its layout's strides over images, rows and columns all zero)."""
    placeholders = [op.outputs[0] for op in body.operations if op.op == "placeholder"]
    product = placeholders[0]
    shape, dt = tuple(product.shape), product.dtype
    if len(body.outputs) != 1 or tuple(body.outputs[0].shape) != shape or body.outputs[0].dtype != dt or \
            len(shape) != 4 or any(t.dtype != dt for t in placeholders):
        return None
    value = {product.id: "@V"}
    lines = []
    for k, (t, lay) in enumerate(zip(placeholders[1:], layouts[1:])):
        strides = lay.broadcast_to(shape).strides
        if any(strides[a] and shape[a] != 1 for a in (0, 2, 3)):
            return None
        value[t.id] = f"p{k}"
        lines.append(f"const {ctype(compute_dtype(dt))} p{k} = {load(f'in{2 + k}', f'@C * {strides[1]}LL', dt)};")
    for op in body.operations:
        out = op.outputs[0]
        if op.op == "placeholder":
            continue
        if op.op == "constant":
            value[out.id] = literal(op.attrs["value"], out.dtype)
            continue
        # elementwise over the product and per-channel operands: each value is the output's or its channel's
        if lookup(op.op).kind != ELEMENTWISE or len(op.outputs) != 1 or checks_divisor(op):
            return None
        try:
            code = expression(op, [value[t.id] for t in op.inputs])
        except NotImplementedError:
            return None
        value[out.id] = f"e{len(lines)}"
        lines.append(f"const {ctype(compute_dtype(out.dtype))} e{len(lines)} = {code};")
    return Epilogue(lines, store(value[body.outputs[0].id], dt), len(placeholders) - 1, ctype(dt))


def direct_convolution_fits(op: Operation) -> bool:
    """Whether convolution2d `op` runs as a native loop nest: NCHW, OIHW, any groups, float32 or float64, and
    either stride 1 with at most DIRECT_MAX_TAPS multiply-adds per output (or DIRECT_MAX_SMALL_TAPS where an
    image's product is at most DIRECT_SMALL_MACS multiply-adds), or any stride with an image's product at
    most DIRECT_PATCH_MACS (the patch loop nest)."""
    if op.op != "convolution2d" or op.outputs[0].dtype.name not in _TYPES or \
            any(t.dtype.name not in _TYPES for t in op.inputs) or op.inputs[0].rank != 4:
        return False
    a = op.attrs
    if (a["data_layout"], a["weights_layout"]) != ("NCHW", "OIHW"):
        return False
    taps, macs = _conv_sizes(op)
    if _rows_fit(op):
        return True
    return taps <= DIRECT_PATCH_MAX_TAPS and macs <= DIRECT_PATCH_MACS


def _rows_fit(op: Operation) -> bool:
    """Whether the row loop nest (`direct_convolution`'s own, stride 1) takes `op`."""
    taps, macs = _conv_sizes(op)
    small = taps <= DIRECT_MAX_SMALL_TAPS and macs <= DIRECT_SMALL_MACS
    return tuple(op.attrs["stride"]) == (1, 1) and (taps <= DIRECT_MAX_TAPS or small)


# A depthwise convolution (one input channel a group) over at most this many output pixels an image runs
# vectorised over channels (`_depthwise_pixels`), at stride 1 up to the first count, strided up to the
# second, while its windows' taps written out (pixels x taps) stay at most DEPTHWISE_TERMS. MobileNetV2's
# 3x3 over 96 channels at 2x2 pixels: 0.8 us against 2.5 for the row nest and 10 for the patch nest; 48
# channels from 16x16 to 8x8 at stride 2: 6.6 us against 13 (patch); at stride 1 over 8x8 the row nest is
# faster (4.0 against 6.0).
DEPTHWISE_PIXELS = (16, 64)
DEPTHWISE_TERMS = 1024
# A 1x1 convolution at stride 1 without padding (a matrix product per image) over at least PATCH_COLUMNS
# pixels an image runs as the patch nest's columns, whose sums of eight outputs stay in registers across the
# input channels (the row nest loads and stores its sums once a channel): 8 -> 48 channels at 16x16, 4.2 us
# against 9.8. Over fewer pixels the pixels of all images are one matrix's columns (`_pointwise_images`: the
# weights read once, not once an image; 80 -> 1280 channels at 1x1 pixel, batch 8: 101 us as dot products
# an image), or at one pixel in all the dot products of the patch nest (27 us against 66 for the row nest).


def _form(op: Operation) -> str:
    """Which loop nest `direct_convolution` makes for `op`: "depthwise" (`_depthwise_pixels`), "pointwise"
    (`_pointwise_images`), "rows" (its own) or "patch" (`_patch_convolution`)."""
    _, cg, kh, kw = op.inputs[1].shape
    pixels = op.outputs[0].shape[2] * op.outputs[0].shape[3]
    stride = tuple(op.attrs["stride"])
    if cg == 1 and pixels <= DEPTHWISE_PIXELS[stride != (1, 1)] and pixels * kh * kw <= DEPTHWISE_TERMS:
        return "depthwise"
    if (kh, kw, op.attrs["groups"]) == (1, 1, 1) and stride == (1, 1) and \
            _resolve_padding(op.attrs["padding"], (1, 1), (1, 1), (1, 1), (1, 1)) == (0, 0, 0, 0):
        if pixels >= PATCH_COLUMNS or op.inputs[0].shape[0] * pixels == 1:
            return "patch"
        return "pointwise"
    return "rows" if _rows_fit(op) else "patch"


def _units(t: str, n: int, groups: int, c: int, xs: tuple) -> list[str]:
    """C++ opening the loop over a convolution's units of work, an image's group each (`n` images, `groups`
    of `c` input channels): `n` and `g` its image and group, `img` the group's first input channel."""
    return [f"        for (int64_t p = 0; p < {n * groups}LL; ++p) {{",
            f"            const int64_t n = p / {groups}, g = p % {groups};",
            f"            const {t}* img = in0 + g * {c * xs[1]}LL;"]


def _padded_copy(indent: str, src: str, c: int, h: int, w: int, top: int, left: int, ph: int, pw: int,
                 xs: tuple) -> list[str]:
    """C++ lines copying `c` channels of image `n` of `src` (NCHW strides `xs`; a group's channels from a
    pointer to its first) into the zero-padded block `xp`, whose rows have the padded width `pw` and planes
    `ph` rows, `top` rows and `left` columns of padding before it."""
    return [f"{indent}for (int64_t c = 0; c < {c}; ++c)",
            f"{indent}    for (int64_t y = 0; y < {h}; ++y) {{",
            f"{indent}        const int64_t py = y + {top};",
            f"{indent}        if (py < 0 || py >= {ph}) continue;",
            f"{indent}        for (int64_t x = 0; x < {w}; ++x) {{",
            f"{indent}            const int64_t px = x + {left};",
            f"{indent}            if (px >= 0 && px < {pw}) xp[(c * {ph} + py) * {pw}LL + px] = "
            f"{src}[n * {xs[0]}LL + c * {xs[1]}LL + y * {xs[2]}LL + x * {xs[3]}LL];",
            f"{indent}        }}", f"{indent}    }}"]


def _head(name: str, t: str, epilogue: Epilogue | None) -> str:
    """A convolution kernel's signature: source, weights, the epilogue's operands, the output."""
    params = epilogue.params() if epilogue is not None else ""
    return (f'extern "C" void {name}(const {t}* __restrict__ in0, const {t}* __restrict__ in1, {params}'
            f'{t}* __restrict__ out0, int threads) {{')


def _tail(epilogue: Epilogue | None, op: Operation) -> list[str]:
    """The end of a convolution kernel: with an epilogue, a pass replacing each output plane, still in cache,
    by its epilogue (the channel's operands read once a plane). Inside the loop nests' stores it kept GCC
    from vectorising them (8 -> 48 channels at 16x16, batch 8: 21 us became 185)."""
    if epilogue is None:
        return ["}"]
    n, o, oh, ow = op.outputs[0].shape
    return [*[f"    #pragma omp parallel for schedule(static) num_threads({k})"
              for k in [_threads(n * o, oh * ow)] if k != "1"],
            f"    for (int64_t i = 0; i < {n * o}LL; ++i) {{",
            f"        {epilogue.t}* plane = out0 + i * {oh * ow}LL;",
            f"        const int64_t c = i % {o};",
            "        #pragma omp simd",
            f"        for (int64_t q = 0; q < {oh * ow}LL; ++q) {epilogue.store('plane[q]', 'plane[q]', 'c')}",
            "    }", "}"]


def direct_convolution(name: str, op: Operation, in_layouts: list[Layout],
                       epilogue: Epilogue | None = None) -> CppSource:
    """C++ for a small convolution2d (see `direct_convolution_fits`) writing a contiguous NCHW result.

    Threads take images (with groups, an image's groups). An image's channels are copied once into a
    zero-padded block whose rows are the padded width PW; an output plane is then accumulated in that same
    row pitch, one row of the window at a time, as one contiguous pass over oh x PW elements adding each of
    the row's taps at its offset (no bounds checks, no short rows: it vectorises; one load and store of the
    sums per kw multiply-adds), and the columns past the output width are dropped when the plane is
    stored. A pass serves up to four output
    channels, which share its loads of the input (each output's sum is added in the same order). With
    groups, each group of an image is such a unit of work on its own (its input channels in, its output
    channels out; a depthwise convolution's is one plane). Other convolutions that
    `direct_convolution_fits` takes run as `_patch_convolution` or `_depthwise_pixels` (`_form`). With an
    `epilogue` (`fused_epilogue`), the kernel ends with it (`_tail`)."""
    form = _form(op)
    if form != "rows":
        return {"depthwise": _depthwise_pixels, "pointwise": _pointwise_images,
                "patch": _patch_convolution}[form](name, op, in_layouts, epilogue)
    x_lay, w_lay = in_layouts
    n, _, h, w = x_lay.shape
    o, c, kh, kw = w_lay.shape  # c: the input channels of a group
    groups = op.attrs["groups"]
    og = o // groups
    oh, ow = op.outputs[0].shape[2:]
    dh, dw = op.attrs["dilation"]
    pad = _resolve_padding(op.attrs["padding"], (h, w), (kh, kw), (1, 1), (dh, dw))
    top, left = pad[0], pad[2]
    ph, pw = oh + dh * (kh - 1), ow + dw * (kw - 1)
    block = c * ph * pw + pw  # a last tap reads up to (kw - 1) * dw past the padded plane: zeros
    xs, ws = x_lay.strides, w_lay.strides
    t = ctype(op.outputs[0].dtype)
    ob = next(b for b in (4, 2, 1) if og % b == 0)  # output channels per pass: they share its loads
    lines = [_head(name, t, epilogue),
             # a unit's work is its multiply-adds, not its elements: eight images of 8 -> 16 channels at 8x8
             # (72 taps) take two threads, 36 -> 22 us
             *_parallel(_threads(n * groups, c * h * w + og * oh * ow * c * kh * kw)),
             "    {",
             f"        {t}* xp = ({t}*)__builtin_malloc(({block}LL + {ob * oh * pw}LL) * sizeof({t}));",
             f"        {t}* acc = xp + {block}LL;",
             f"        for (int64_t q = 0; q < {block}LL; ++q) xp[q] = 0;",
             "        #pragma omp for schedule(static)",
             *_units(t, n, groups, c, xs),
             *_padded_copy(" " * 12, "img", c, h, w, top, left, ph, pw, xs),
             f"            for (int64_t o = g * {og}; o < (g + 1) * {og}; o += {ob}) {{",
             "                #pragma omp simd",
             f"                for (int64_t q = 0; q < {ob * oh * pw}LL; ++q) acc[q] = 0;",
             f"                for (int64_t c = 0; c < {c}; ++c)",
             f"                    for (int64_t i = 0; i < {kh}; ++i)",
             "                        {",
             *[f"                            const {t} w{u}_{j} = "
               f"in1[(o + {u}) * {ws[0]}LL + c * {ws[1]}LL + i * {ws[2]}LL + {j * ws[3]}LL];"
               for u in range(ob) for j in range(kw)],
             f"                            const {t}* src = xp + (c * {ph} + i * {dh}) * {pw}LL;",
             "                            #pragma omp simd",  # a window row's taps in one pass over the sums
             f"                            for (int64_t q = 0; q < {oh * pw}LL; ++q) {{",
             *[f"                                acc[{u * oh * pw}LL + q] += "
               + " + ".join(f"w{u}_{j} * src[q + {j * dw}]" for j in range(kw)) + ";" for u in range(ob)],
             "                            }",
             "                        }",
             f"                for (int64_t u = 0; u < {ob}; ++u) {{",
             f"                    {t}* dst = out0 + (n * {o} + o + u) * {oh * ow}LL;",
             f"                    const {t}* sums = acc + u * {oh * pw}LL;",
             f"                    for (int64_t y = 0; y < {oh}; ++y)",
             "                        #pragma omp simd",
             f"                        for (int64_t x = 0; x < {ow}; ++x) dst[y * {ow}LL + x] = sums[y * {pw}LL + x];",
             "                }",
             "            }", "        }", "        __builtin_free(xp);", "    }", *_tail(epilogue, op)]
    return CppSource(name, "\n".join(lines) + "\n", "convolution")


def _patch_convolution(name: str, op: Operation, in_layouts: list[Layout],
                       epilogue: Epilogue | None = None) -> CppSource:
    """C++ for a small convolution2d of any stride and dilation writing a contiguous NCHW result.

    Threads take images (with groups, an image's groups, each a unit of its own). An image is copied once
    into a zero-padded block; from there each window (every input channel's taps, in the weights' OIHW
    order) is gathered, and the image's product is a small
    matrix product of the weights with those windows: by columns of pixels where an image has at least
    PATCH_COLUMNS of them (`_patch_columns`), else one dot product per output (`_patch_dots`). The work is
    the product itself, with no fixed cost of the library's (its blocking and reorders are made for many
    channels and pixels)."""
    x_lay, w_lay = in_layouts
    n, _, h, w = x_lay.shape
    o, c, kh, kw = w_lay.shape  # c: the input channels of a group
    groups = op.attrs["groups"]
    oh, ow = op.outputs[0].shape[2:]
    sh, sw = op.attrs["stride"]
    dh, dw = op.attrs["dilation"]
    pad = _resolve_padding(op.attrs["padding"], (h, w), (kh, kw), (sh, sw), (dh, dw))
    top, left = pad[0], pad[2]
    ph, pw = (oh - 1) * sh + dh * (kh - 1) + 1, (ow - 1) * sw + dw * (kw - 1) + 1
    taps = c * kh * kw
    xs, ws = x_lay.strides, w_lay.strides
    t = ctype(op.outputs[0].dtype)
    dense = tuple(ws) == (taps, kh * kw, kw, 1)  # OIHW rows as they are; else copied so once a call
    weights = "in1" if dense else "wk"
    lines = [_head(name, t, epilogue),
             *([] if dense else [
                 f"    {t}* wk = ({t}*)__builtin_malloc({o * taps}LL * sizeof({t}));",
                 f"    for (int64_t o = 0; o < {o}; ++o) for (int64_t c = 0; c < {c}; ++c)",
                 f"        for (int64_t i = 0; i < {kh}; ++i) for (int64_t j = 0; j < {kw}; ++j)",
                 f"            wk[((o * {c} + c) * {kh} + i) * {kw} + j] = "
                 f"in1[o * {ws[0]}LL + c * {ws[1]}LL + i * {ws[2]}LL + j * {ws[3]}LL];"]),
             # one image of one group over few pixels (a 1x1 convolution of a vector): threads take its outputs
             *_parallel(_threads(o, oh * ow * taps) if n * groups == 1 and oh * ow < PATCH_COLUMNS else
                        _threads(n * groups, c * h * w + o // groups * oh * ow * taps)),
             "    {",
             *(_patch_columns(t, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, top, left, ph, pw, xs, weights, n, groups)
               if oh * ow >= PATCH_COLUMNS else
               _patch_dots(t, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, top, left, ph, pw, xs, weights, n, groups)),
             "    }",
             *([] if dense else ["    __builtin_free(wk);"]), *_tail(epilogue, op)]
    return CppSource(name, "\n".join(lines) + "\n", "convolution")


def _window_taps(op: Operation, x_shape: tuple, w_shape: tuple) -> list[list[tuple[int, int, int, int]]]:
    """For each output pixel (row-major) of convolution2d `op`, the taps (i, j) of its window that fall on the
    input, with the input's row and column there."""
    h, w = x_shape[2:]
    kh, kw = w_shape[2:]
    (sh, sw), (dh, dw) = op.attrs["stride"], op.attrs["dilation"]
    top, _, left, _ = _resolve_padding(op.attrs["padding"], (h, w), (kh, kw), (sh, sw), (dh, dw))
    oh, ow = op.outputs[0].shape[2:]
    return [[(i, j, y * sh - top + i * dh, x * sw - left + j * dw) for i in range(kh) for j in range(kw)
             if 0 <= y * sh - top + i * dh < h and 0 <= x * sw - left + j * dw < w]
            for y in range(oh) for x in range(ow)]


def _depthwise_pixels(name: str, op: Operation, in_layouts: list[Layout],
                      epilogue: Epilogue | None = None) -> CppSource:
    """C++ for a depthwise convolution2d (one input channel a group, any channel multiplier) over few output
    pixels (`DEPTHWISE_PIXELS`): vectorised over the output channels, each pixel's sum written out over the
    taps of its window that fall on the input (known here: no padded copy, no checks; at 1x1 pixels a 3x3
    window is one tap). A channel's taps are loaded once for all its pixels."""
    x_lay, w_lay = in_layouts
    n = x_lay.shape[0]
    o, _, kh, kw = w_lay.shape
    mult = o // op.attrs["groups"]
    xs, ws = x_lay.strides, w_lay.strides
    t = ctype(op.outputs[0].dtype)
    pixels = _window_taps(op, x_lay.shape, w_lay.shape)
    used = sorted({(i, j) for taps in pixels for i, j, _, _ in taps})
    channel = "o" if mult == 1 else f"(o / {mult})"
    sums = [" + ".join([f"({t})0"] + [f"w{i}_{j} * xc[{y * xs[2] + x * xs[3]}LL]" for i, j, y, x in taps])
            for taps in pixels]
    lines = [_head(name, t, epilogue),
             *[f"    #pragma omp parallel for schedule(static) num_threads({k})"
               for k in [_threads(n, o * len(pixels) * kh * kw)] if k != "1"],
             f"    for (int64_t n = 0; n < {n}LL; ++n) {{",
             f"        {t}* y = out0 + n * {o * len(pixels)}LL;",
             "        #pragma omp simd",
             f"        for (int64_t o = 0; o < {o}; ++o) {{",
             f"            const {t}* xc = in0 + n * {xs[0]}LL + {channel} * {xs[1]}LL;",
             *[f"            const {t} w{i}_{j} = in1[o * {ws[0]}LL + {i * ws[2] + j * ws[3]}LL];" for i, j in used],
             *[f"            y[o * {len(pixels)}LL + {p}] = {expr};" for p, expr in enumerate(sums)],
             "        }", "    }", *_tail(epilogue, op)]
    return CppSource(name, "\n".join(lines) + "\n", "convolution")


def _pointwise_images(name: str, op: Operation, in_layouts: list[Layout],
                      epilogue: Epilogue | None = None) -> CppSource:
    """C++ for a 1x1 convolution2d at stride 1 without padding over few pixels an image: one matrix product
    of the weights (outputs x channels) with the pixels of all images as columns. The columns are first laid
    out contiguously (a row per input channel, padded with zeros to whole blocks); then for up to eight
    outputs and a block of up to 16 columns the sums stay in registers across the channels (each in order of
    the channels). Threads take the channels' rows, then (outputs, columns) blocks."""
    x_lay, w_lay = in_layouts
    n, c, h, w = x_lay.shape
    o = w_lay.shape[0]
    xs, ws = x_lay.strides, w_lay.strides
    t = ctype(op.outputs[0].dtype)
    pixels, columns = h * w, n * h * w
    b = 16 if columns > 8 else 8
    npad = -(-columns // b) * b
    ob = next(u for u in (8, 4, 2, 1) if o % u == 0)
    column = f"(q / {pixels}) * {xs[0]}LL + ((q % {pixels}) / {w}) * {xs[2]}LL + (q % {w}) * {xs[3]}LL"
    lines = [_head(name, t, epilogue),
             f"    {t}* cols = ({t}*)__builtin_malloc({c * npad}LL * sizeof({t}));",
             *_parallel(_threads(o // ob * (npad // b), c * b * ob)),
             "    {",
             "        #pragma omp for schedule(static)",
             f"        for (int64_t k = 0; k < {c}; ++k) {{",
             f"            {t}* row = cols + k * {npad}LL;",
             f"            const {t}* src = in0 + k * {xs[1]}LL;",
             f"            for (int64_t q = 0; q < {columns}; ++q) row[q] = src[{column}];",
             f"            for (int64_t q = {columns}; q < {npad}; ++q) row[q] = 0;",
             "        }",
             "        #pragma omp for schedule(static) collapse(2)",
             f"        for (int64_t o = 0; o < {o}; o += {ob})",
             f"            for (int64_t q0 = 0; q0 < {npad}; q0 += {b}) {{",
             f"                {t} {', '.join(f'a{u}[{b}]' for u in range(ob))};",
             *[f"                for (int64_t v = 0; v < {b}; ++v) a{u}[v] = 0;" for u in range(ob)],
             f"                for (int64_t k = 0; k < {c}; ++k) {{",
             f"                    const {t}* col = cols + k * {npad}LL + q0;",
             *[f"                    const {t} w{u} = in1[(o + {u}) * {ws[0]}LL + k * {ws[1]}LL];" for u in range(ob)],
             "                    #pragma omp simd",
             f"                    for (int64_t v = 0; v < {b}; ++v) {{",
             *[f"                        a{u}[v] += w{u} * col[v];" for u in range(ob)],
             "                    }",
             "                }",
             f"                const int64_t m = {columns} - q0 < {b} ? {columns} - q0 : {b};",
             "                for (int64_t v = 0; v < m; ++v) {",
             "                    const int64_t q = q0 + v;",
             *[f"                    out0[((q / {pixels}) * {o} + o + {u}) * {pixels}LL + q % {pixels}] = a{u}[v];"
               for u in range(ob)],
             "                }",
             "            }",
             "    }",
             "    __builtin_free(cols);", *_tail(epilogue, op)]
    return CppSource(name, "\n".join(lines) + "\n", "convolution")


# Output pixels per image from which the patch loop nest multiplies by columns (`_patch_columns`: vectorised
# over pixels, PATCH_BLOCK of them at a time) rather than by dot products over the window (`_patch_dots`).
PATCH_COLUMNS = 16
PATCH_BLOCK = 16


def _patch_dots(t, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, top, left, ph, pw, xs, weights, n,
                groups) -> list[str]:
    """The patch loop nest over few pixels: each pixel's window gathered, each output a dot product (`c`
    input channels of a group, `o` outputs of all `groups`). Threads take units of work, or where there is
    one, each gathers the windows and takes a share of the outputs."""
    block, taps, og = c * ph * pw, c * kh * kw, o // groups
    ob = next(b for b in (4, 2, 1) if og % b == 0)
    one = n * groups == 1
    return [
        f"        {t}* xp = ({t}*)__builtin_malloc(({block}LL + {taps}LL) * sizeof({t}));",
        f"        {t}* patch = xp + {block}LL;",
        f"        for (int64_t q = 0; q < {block}LL; ++q) xp[q] = 0;",
        *([] if one else ["        #pragma omp for schedule(static)"]),
        *_units(t, n, groups, c, xs),
        *_padded_copy(" " * 12, "img", c, h, w, top, left, ph, pw, xs),
        f"            for (int64_t y = 0; y < {oh}; ++y)",
        f"                for (int64_t x = 0; x < {ow}; ++x) {{",
        f"                    const {t}* corner = xp + y * {sh * pw}LL + x * {sw}LL;",
        f"                    for (int64_t c = 0; c < {c}; ++c)",
        f"                        for (int64_t i = 0; i < {kh}; ++i)",
        f"                            for (int64_t j = 0; j < {kw}; ++j)",
        f"                                patch[(c * {kh} + i) * {kw} + j] = "
        f"corner[(c * {ph} + i * {dh}) * {pw}LL + j * {dw}];",
        *(["                    #pragma omp for schedule(static) nowait"] if one else []),
        f"                    for (int64_t o = g * {og}; o < (g + 1) * {og}; o += {ob}) {{",
        *[f"                        const {t}* w{u} = {weights} + (o + {u}) * {taps}LL;" for u in range(ob)],
        f"                        {t} {', '.join(f's{u} = 0' for u in range(ob))};",
        f"                        #pragma omp simd reduction(+:{','.join(f's{u}' for u in range(ob))})",
        f"                        for (int64_t k = 0; k < {taps}; ++k) {{",
        f"                            const {t} p = patch[k];",
        *[f"                            s{u} += w{u}[k] * p;" for u in range(ob)],
        "                        }",
        *[f"                        out0[((n * {o} + o + {u}) * {oh} + y) * {ow}LL + x] = s{u};"
          for u in range(ob)],
        "                    }",
        "                }",
        "        }", "        __builtin_free(xp);"]


def _patch_columns(t, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, top, left, ph, pw, xs, weights, n,
                   groups) -> list[str]:
    """The patch loop nest over many pixels. The padded image is kept split into its stride's phases (rows
    y % sh, columns x % sw), where a tap's pixels along an output row lie next to each other at a fixed
    offset. For up to eight output channels and a block of PATCH_BLOCK pixels the sums stay in registers
    across the taps (each pixel's sum in order of the taps). Where the blocks tile the output rows they read
    the phases directly; else the windows are first laid out as columns (im2col: a row per tap, padded to a
    whole number of blocks). With groups, `c` is a group's input channels and each group a unit of its own."""
    qh, qw = -(-ph // sh), -(-pw // sw)
    block, taps, pixels = c * sh * sw * qh * qw, c * kh * kw, oh * ow
    b = PATCH_BLOCK
    direct = ow % b == 0
    npad = 0 if direct else -(-pixels // b) * b
    og = o // groups
    ob = next(u for u in (8, 4, 2, 1) if og % u == 0)
    offsets = [((ci * sh + i * dh % sh) * sw + j * dw % sw) * qh * qw + (i * dh // sh) * qw + j * dw // sw
               for ci in range(c) for i in range(kh) for j in range(kw)]
    copy = []  # image n into the phases: per input row and column phase, a strided run of the row
    for phase in range(sw):
        first = next((x for x in range(w) if 0 <= x + left < pw and (x + left) % sw == phase), None)
        if first is None:
            continue
        count = len(range(first, min(w, pw - left), sw))
        copy += [f"                    {{ {t}* d = dst + {phase * qh * qw + (first + left) // sw}LL;",
                 f"                      const {t}* s = src + {first * xs[3]}LL;",
                 f"                      for (int64_t x = 0; x < {count}; ++x) d[x] = s[x * {sw * xs[3]}LL]; }}"]
    if direct:
        blocks = [f"                for (int64_t y = 0; y < {oh}; ++y)",
                  f"                for (int64_t x0 = 0; x0 < {ow}; x0 += {b}) {{"]
        column, store = f"xp + off[k] + y * {qw}LL + x0", f"y * {ow}LL + x0 + v"
        limit = str(b)
    else:
        blocks = [f"            for (int64_t c = 0; c < {taps}; ++c) {{",
                  f"                {t}* row = cols + c * {npad}LL;",
                  f"                const {t}* src = xp + off[c];",
                  f"                for (int64_t y = 0; y < {oh}; ++y)",
                  "                    #pragma omp simd",
                  f"                    for (int64_t x = 0; x < {ow}; ++x) row[y * {ow} + x] = src[y * {qw} + x];",
                  "            }",
                  f"            for (int64_t p = 0; p < {npad}; p += {b})",
                  "                {"]
        column, store = f"cols + k * {npad}LL + p", "p + v"
        limit = f"({pixels} - p < {b} ? {pixels} - p : {b})"
    return [
        f"        static const int64_t off[{taps}] = {{{', '.join(map(str, offsets))}}};",
        # each thread's phases (and columns), made and zeroed on its first call and kept: over 128 KiB (the
        # stem's 147 taps by 256 pixels) malloc maps fresh pages every call; the padding is never written after
        f"        static thread_local {t}* xp = nullptr;",
        "        if (xp == nullptr) {",
        f"            xp = ({t}*)__builtin_malloc(({block}LL + {taps * npad + 1}LL) * sizeof({t}));",
        f"            for (int64_t q = 0; q < {block + taps * npad + 1}LL; ++q) xp[q] = 0;",
        "        }",
        f"        {t}* cols = xp + {block}LL;",
        "        #pragma omp for schedule(static)",
        *_units(t, n, groups, c, xs),
        f"            for (int64_t c = 0; c < {c}; ++c)",
        f"                for (int64_t y = 0; y < {h}; ++y) {{",
        f"                    const int64_t py = y + {top};",
        f"                    if (py < 0 || py >= {ph}) continue;",
        f"                    {t}* dst = xp + ((c * {sh} + py % {sh}) * {sw}) * {qh * qw}LL + (py / {sh}) * {qw}LL;",
        f"                    const {t}* src = img + n * {xs[0]}LL + c * {xs[1]}LL + y * {xs[2]}LL;",
        *copy,
        "                }",
        *blocks,
        f"                for (int64_t o = g * {og}; o < (g + 1) * {og}; o += {ob}) {{",
        f"                    {t} {', '.join(f'a{u}[{b}]' for u in range(ob))};",
        *[f"                    for (int64_t v = 0; v < {b}; ++v) a{u}[v] = 0;" for u in range(ob)],
        f"                    for (int64_t k = 0; k < {taps}; ++k) {{",
        f"                        const {t}* col = {column};",
        *[f"                        const {t} w{u} = {weights}[(o + {u}) * {taps}LL + k];" for u in range(ob)],
        "                        #pragma omp simd",
        f"                        for (int64_t v = 0; v < {b}; ++v) {{",
        *[f"                            a{u}[v] += w{u} * col[v];" for u in range(ob)],
        "                        }",
        "                    }",
        f"                    const int64_t m = {limit};",
        *[f"                    for (int64_t v = 0; v < m; ++v) "
          f"out0[(n * {o} + o + {u}) * {pixels}LL + {store}] = a{u}[v];" for u in range(ob)],
        "                }",
        "            }",
        "        }"]

def _direct_fits(op: Operation, x_index: int, w_index: int) -> bool:
    if op.outputs[0].dtype.name not in _TYPES or any(t.dtype.name not in _TYPES for t in op.inputs):
        return False
    a = op.attrs
    w = op.inputs[w_index].shape
    return (a["data_layout"], a["weights_layout"], tuple(a["stride"])) == ("NCHW", "OIHW", (1, 1)) \
        and w[1] * w[2] * w[3] <= DIRECT_MAX_TAPS and op.inputs[x_index].rank == 4


def direct_weights_gradient(name: str, op: Operation, in_layouts: list[Layout]) -> CppSource:
    """C++ for convolution2d_weights_gradient (inputs dy, source, weights) of a small convolution (as
    `direct_convolution_fits`): threads take output channels; for each image the source is copied into the
    zero-padded block of `direct_convolution` and dy's plane into the same row pitch (zeros past the output
    width), and each weight's gradient is one contiguous dot product of the two at the tap's offset (a window
    row's taps in one pass). With groups, an output channel's block holds its group's input channels only."""
    dy_lay, x_lay, w_lay = in_layouts
    n, _, h, w = x_lay.shape
    o, c, kh, kw = w_lay.shape  # c: the input channels of a group
    og = o // op.attrs["groups"]
    oh, ow = dy_lay.shape[2:]
    dh, dw = op.attrs["dilation"]
    pad = _resolve_padding(op.attrs["padding"], (h, w), (kh, kw), (1, 1), (dh, dw))
    top, left = pad[0], pad[2]
    ph, pw = oh + dh * (kh - 1), ow + dw * (kw - 1)
    block = c * ph * pw + pw
    xs, ds = x_lay.strides, dy_lay.strides
    t = ctype(op.outputs[0].dtype)
    taps = c * kh * kw
    lines = [f'extern "C" void {name}(const {t}* __restrict__ in0, const {t}* __restrict__ in1, '
             f'const {t}* __restrict__ in2, {t}* __restrict__ out0, int threads) {{',
             *_parallel(_threads(o, n * (c * h * w + oh * ow))),
             "    {",
             f"        {t}* xp = ({t}*)__builtin_malloc(({block}LL + {oh * pw}LL) * sizeof({t}));",
             f"        {t}* dyp = xp + {block}LL;",
             f"        for (int64_t q = 0; q < {block + oh * pw}LL; ++q) xp[q] = 0;",
             "        #pragma omp for schedule(static)",
             f"        for (int64_t o = 0; o < {o}LL; ++o) {{",
             f"            {t} acc[{taps}];",
             f"            for (int64_t k = 0; k < {taps}; ++k) acc[k] = 0;",
             f"            const {t}* img = in1 + (o / {og}) * {c * xs[1]}LL;",
             f"            for (int64_t n = 0; n < {n}LL; ++n) {{",
             *_padded_copy(" " * 16, "img", c, h, w, top, left, ph, pw, xs),
             f"                for (int64_t y = 0; y < {oh}; ++y)",
             f"                    for (int64_t x = 0; x < {ow}; ++x) "
             f"dyp[y * {pw}LL + x] = in0[n * {ds[0]}LL + o * {ds[1]}LL + y * {ds[2]}LL + x * {ds[3]}LL];",
             f"                for (int64_t c = 0; c < {c}; ++c)",
             f"                    for (int64_t i = 0; i < {kh}; ++i)",
             "                        {",  # a window row's taps in one pass over dy's plane
             f"                            const {t}* src = xp + (c * {ph} + i * {dh}) * {pw}LL;",
             f"                            {t} {', '.join(f's{j} = 0' for j in range(kw))};",
             f"                            #pragma omp simd reduction(+:{','.join(f's{j}' for j in range(kw))})",
             f"                            for (int64_t q = 0; q < {oh * pw}LL; ++q) {{",
             f"                                const {t} d = dyp[q];",
             *[f"                                s{j} += d * src[q + {j * dw}];" for j in range(kw)],
             "                            }",
             *[f"                            acc[(c * {kh} + i) * {kw} + {j}] += s{j};" for j in range(kw)],
             "                        }",
             "            }",
             f"            for (int64_t k = 0; k < {taps}; ++k) out0[o * {taps}LL + k] = acc[k];",
             "        }", "        __builtin_free(xp);", "    }", "}"]
    return CppSource(name, "\n".join(lines) + "\n", "convolution")


def source(name: str, op: Operation, in_layouts: list[Layout]) -> CppSource:
    """The C++ of an op `supports` accepts."""
    if op.op == "convolution2d_weights_gradient":
        return direct_weights_gradient(name, op, in_layouts)
    return pooling(name, op, in_layouts)
