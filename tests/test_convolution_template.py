"""The Triton convolution template (codegen/convolution.py) under Triton's interpreter, against float64 torch:
the forward convolution with its epilogue, the stride-1 transposed convolution of the data gradient and the
split weights gradient, over the paddings, strides, dilations and layouts the template claims."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import stitchml as sm
from stitchml.errors import GraphError
from stitchml.passes.program import CompileError

from tolerance import allowed

# (input NCHW shape, output channels, kernel, padding, stride, dilation, layout, options): one input channel
# (unrolled multiply-adds), asymmetric padding with stride 2, channels-last with dilation (tiled products over the
# flattened window), 16 and 17 channels (tiled products one tap at a time, input tiles loaded either way, or
# over the flattened window as measured variants), 256 pixels (the weights gradient in four slices, summed two at
# a time)
CASES = [((2, 1, 7, 9), 5, 3, "same", 1, 1, "NCHW", {}),
         ((2, 5, 8, 9), 6, 3, (1, 0, 2, 1), 2, 1, "NCHW", {}),
         ((1, 6, 9, 8), 4, 3, "same", 1, 2, "NHWC", {}),
         ((1, 16, 6, 5), 17, 3, "same", 1, 1, "NCHW", {}),
         ((1, 16, 6, 5), 17, 3, "valid", 1, 1, "NCHW", {"conv_order": "pixels"}),
         ((1, 16, 5, 6), 17, 3, "same", 1, 1, "NCHW", {"conv_form": "flat", "wgrad_form": "flat"}),
         ((1, 3, 16, 16), 4, 3, "same", 1, 1, "NCHW", {})]


def _pads(padding, k: int, dilation: int) -> tuple[int, int, int, int]:
    if padding == "same":
        total = dilation * (k - 1)
        return (total // 2, total - total // 2) * 2
    return (0, 0, 0, 0) if padding == "valid" else tuple(padding)


def _check(got: torch.Tensor, want: torch.Tensor, cond: torch.Tensor, n: int, what: str) -> None:
    """Within the suite's rule for a contraction of `n` terms whose sensitivity is `cond` (sum |a| |b|)."""
    tol = allowed(sm.float32, "contraction", want, (cond, torch.full_like(want, float(n)), torch.zeros_like(want)))
    err = (got.double() - want).abs()
    assert bool((err <= tol).all()), f"{what}: worst {float((err - tol).max())} beyond the tolerance"


@pytest.mark.parametrize("case", CASES, ids=["cin1-same", "stride2-asymmetric", "nhwc-dilation2", "cin16-same",
                                             "cin16-valid-pixels", "cin16-flat", "four-slices"])
def test_convolution_epilogue_and_gradients_match_float64(triton_interpreter, case):
    shape, cout, k, padding, stride, dilation, layout, options = case
    n, cin, h, w = shape
    gen = torch.Generator().manual_seed(0)
    a, wt = torch.randn(shape, generator=gen), torch.randn(cout, cin, k, k, generator=gen)
    bias = torch.randn(cout, generator=gen)
    top, bottom, left, right = _pads(padding, k, dilation)

    def conv(x, weights):  # float64 NCHW reference
        return F.conv2d(F.pad(x, (left, right, top, bottom)), weights, stride=stride, dilation=dilation)

    pre = conv(a.double(), wt.double()) + bias.double()[None, :, None, None]
    r = torch.randn(pre.shape, generator=gen)
    g = sm.Graph("conv")
    nhwc = layout == "NHWC"
    x = g.placeholder(tuple(a.permute(0, 2, 3, 1).shape) if nhwc else shape, sm.float32, name="x")
    wv = g.placeholder((k, k, cin, cout) if nhwc else (cout, cin, k, k), sm.float32, name="w")
    b = g.placeholder((cout,), sm.float32, name="b")
    rv = g.placeholder(tuple(r.permute(0, 2, 3, 1).shape) if nhwc else tuple(r.shape), sm.float32, name="r")
    desc = sm.Convolution2DDescriptor(padding=padding, stride=stride, dilation=dilation, data_layout=layout,
                                      weights_layout="HWIO" if nhwc else "OIHW")
    y = g.relu(g.convolution2d(x, wv, desc) + g.reshape(b, (1, 1, 1, cout) if nhwc else (1, cout, 1, 1)))
    grads = g.gradients(g.reduction_sum(y * rv), [x, wv])
    feeds = {x: a.permute(0, 2, 3, 1).contiguous() if nhwc else a, b: bias,
             wv: wt.permute(2, 3, 1, 0).contiguous() if nhwc else wt,
             rv: r.permute(0, 2, 3, 1).contiguous() if nhwc else r}
    exe = g.compile(feeds, [y, grads[x], grads[wv]], device="cpu", options={"conv_template": "triton", **options})
    sources = exe.kernel_sources()
    made = sorted(t for t in ("convolution kernel", "transposed convolution kernel", "weights gradient")
                  if any(t in s for s in sources.values()))
    assert made == (["convolution kernel", "transposed convolution kernel", "weights gradient"] if stride == 1
                    else ["convolution kernel", "weights gradient"]), made  # stride 2: cuDNN's data gradient
    if shape == (1, 3, 16, 16):
        assert any("for k0 in range(0, 4, WAYS)" in s for s in sources.values())
    out = exe.run(feeds)

    def nchw(t):
        t = t.torch()
        return t.permute(0, 3, 1, 2) if nhwc and t.dim() == 4 and t.shape != wt.shape else t

    taps = cin * k * k
    cond = conv(a.double().abs(), wt.double().abs()) + bias.double().abs()[None, :, None, None]
    _check(nchw(out[y]), pre.relu(), cond, taps + 1, "forward")
    # gradients of sum(relu(pre) * r): dy = r where pre > 0 (both sides agree where |pre| is not tiny)
    dy = torch.where(pre > 0, r.double(), 0.0)
    a64, w64 = a.double().requires_grad_(), wt.double().requires_grad_()
    dx_ref, dw_ref = torch.autograd.grad(conv(a64, w64), [a64, w64], dy)
    a64, w64 = a.double().abs().requires_grad_(), wt.double().abs().requires_grad_()
    dx_cond, dw_cond = torch.autograd.grad(conv(a64, w64), [a64, w64], dy.abs())
    assert bool(((pre.abs() > 1e-4) | (pre == 0)).all())  # no ReLU decision within float32 rounding
    _check(nchw(out[grads[x]]), dx_ref, dx_cond, cout * k * k, "data gradient")
    dw = out[grads[wv]].torch()
    _check(dw.permute(3, 2, 0, 1) if nhwc else dw, dw_ref, dw_cond, n * pre.shape[2] * pre.shape[3], "weights gradient")


def test_the_default_measures_on_cuda_and_keeps_the_library_under_the_interpreter(triton_interpreter):
    g = sm.Graph("conv")
    x = g.placeholder((1, 2, 5, 5), sm.float32, name="x")
    w = g.placeholder((3, 2, 3, 3), sm.float32, name="w")
    y = g.relu(g.convolution2d(x, w, sm.Convolution2DDescriptor(padding="same")))
    feeds = {x: torch.randn(1, 2, 5, 5), w: torch.randn(3, 2, 3, 3)}
    exe = g.compile(feeds, [y], device="cpu")
    assert not any("convolution kernel" in s for s in exe.kernel_sources().values())
    with pytest.raises(GraphError, match="conv_template expects 'measure', 'triton' or 'library', got 'cudnn'"):
        g.compile(feeds, [y], device="cpu", options={"conv_template": "cudnn"})


# (batch, input channels, output channels, height, width, window): 2x2 windows that tile the output pool in the
# convolution's kernel, pooling whole rows of windows (the default) or the window's cells one after another
# (`conv_pool` "cells", which also takes a window of one column); a window of 3 (no power-of-two axes to
# reshape a tile into) and odd extents, which cut the last window (torch drops it), keep a pooling step of
# their own
POOLS = [(2, 3, 6, 8, 10, (2, 2), "rows"), (1, 3, 5, 12, 15, (3, 3), "rows"), (1, 1, 7, 9, 7, (2, 2), "rows"),
         (2, 17, 5, 6, 4, (2, 2), "rows"), (2, 3, 6, 8, 10, (2, 2), "cells"), (1, 17, 5, 6, 4, (2, 2), "cells"),
         (1, 2, 3, 8, 5, (2, 1), "cells"), (1, 1, 7, 9, 7, (2, 2), "cells")]


@pytest.mark.parametrize("case", POOLS, ids=["2x2", "3x3-batch1", "odd-cut", "cin17-tiled", "cells-2x2",
                                             "cells-cin17-batch1", "cells-2x1", "cells-odd-cut"])
def test_a_max_pooling_of_the_epilogue_is_computed_in_the_convolution_kernel(triton_interpreter, case):
    """conv + bias + ReLU + max pooling whose windows tile the output: one kernel stores the ReLU and its mask
    (which the gradients read) and the pooled values; all and the data gradient match float64."""
    n, cin, cout, h, w, window, form = case
    gen = torch.Generator().manual_seed(1)
    a, wt = torch.randn(n, cin, h, w, generator=gen), torch.randn(cout, cin, 3, 3, generator=gen)
    bias = torch.randn(cout, generator=gen)
    g = sm.Graph("conv_pool")
    x = g.placeholder((n, cin, h, w), sm.float32, name="x")
    wv = g.placeholder((cout, cin, 3, 3), sm.float32, name="w")
    b = g.placeholder((cout,), sm.float32, name="b")
    relu = g.relu(g.convolution2d(x, wv, sm.Convolution2DDescriptor(padding="same")) +
                  g.reshape(b, (1, cout, 1, 1)))
    pooled = g.max_pooling2d(relu, sm.Pooling2DDescriptor(kernel_size=window))
    dx = g.gradients(g.reduction_sum(pooled * pooled), [x])[x]
    feeds = {x: a, wv: wt, b: bias}
    options = {"conv_template": "triton"} | ({"conv_pool": "cells"} if form == "cells" else {})
    exe = g.compile(feeds, [relu, pooled, dx], device="cpu", options=options)
    cut = h % window[0] or w % window[1] or window[0] & (window[0] - 1)
    assert (pooled.op.name in [s.name for s in exe.steps]) == bool(cut)
    source = exe.kernel_sources()["kernel0_convolution"]
    assert ("tl.store(pooled" in source) == (not cut)
    assert ("tl.join" in source) == (not cut and form == "cells" and window[1] == 2)
    out = exe.run(feeds)
    a64, w64 = a.double().requires_grad_(), wt.double()
    pre = F.conv2d(a64, w64, bias.double(), padding=1)
    want = F.max_pool2d(pre.relu(), window)
    cond = F.conv2d(a.double().abs(), wt.double().abs(), bias.double().abs(), padding=1)
    _check(out[relu].torch(), pre.relu().detach(), cond, 9 * cin + 1, "relu")
    _check(out[pooled].torch(), want.detach(), F.max_pool2d(cond, window), 9 * cin + 1, "pooled")
    grad = torch.autograd.grad((want * want).sum(), a64)[0]
    assert torch.allclose(out[dx].torch().double(), grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()))


def test_the_native_cpu_backend_keeps_its_own_convolutions_and_poolings(monkeypatch):
    """The native CPU backend runs no Triton kernels: `conv_template="triton"` leaves its convolutions and the
    max pooling after them as its own steps, and the network matches float64 (a pooling folded into a template
    kernel the backend never ran was lost: outputs of 1e35)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(2)
    a, wt, bias = torch.randn(2, 3, 8, 10, generator=gen), torch.randn(6, 3, 3, 3, generator=gen), torch.randn(6)
    g = sm.Graph("native_conv_pool")
    x = g.placeholder(tuple(a.shape), sm.float32, name="x")
    wv = g.placeholder(tuple(wt.shape), sm.float32, name="w")
    b = g.placeholder((6,), sm.float32, name="b")
    relu = g.relu(g.convolution2d(x, wv, sm.Convolution2DDescriptor(padding="same")) + g.reshape(b, (1, 6, 1, 1)))
    pooled = g.max_pooling2d(relu, sm.Pooling2DDescriptor(kernel_size=(2, 2)))
    feeds = {x: a, wv: wt, b: bias}
    exe = g.compile(feeds, [pooled], device="cpu", options={"conv_template": "triton"})
    assert pooled.op.name in [s.name for s in exe.steps], [s.name for s in exe.steps]
    pre = F.conv2d(a.double(), wt.double(), bias.double(), padding=1)
    cond = F.conv2d(a.double().abs(), wt.double().abs(), bias.double().abs(), padding=1)
    _check(exe.run(feeds)[pooled].torch(), F.max_pool2d(pre.relu(), 2), F.max_pool2d(cond, 2), 28, "pooled")


@pytest.mark.parametrize("window, width, candidates", [
    ((2, 2), 10, ["library", "triton", "triton-cells", "triton+pooling", "triton-16x32x32x2x2+pooling"]),
    ((2, 4), 12, ["library", "triton", "triton+pooling", "triton-16x32x32x2x2+pooling"]),
    ((2, 2), 9, ["library", "triton", "triton-16x32x32x2x2"])], ids=["2x2", "2x4", "cut"])
def test_on_cuda_the_pooling_forms_are_measured_candidates(monkeypatch, window, width, candidates):
    """What the first run on CUDA times for conv + bias + ReLU + max pooling: the library call with a pooling
    after it, the template pooling rows of windows ("triton"), pooling by cells where a window has at most two
    columns, and the template with the pooling kernel after it; a cut window keeps a pooling step of its own.
    Lowered for CUDA on the CPU (nothing runs)."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "stand-in")
    g = sm.Graph("conv_pool")
    x = g.placeholder((2, 3, 8, width), sm.float32, name="x")
    wv = g.placeholder((6, 3, 3, 3), sm.float32, name="w")
    b = g.placeholder((6,), sm.float32, name="b")
    relu = g.relu(g.convolution2d(x, wv, sm.Convolution2DDescriptor(padding="same")) + g.reshape(b, (1, 6, 1, 1)))
    pooled = g.max_pooling2d(relu, sm.Pooling2DDescriptor(kernel_size=window))
    types = {t: sm.TensorType(tuple(t.shape), sm.float32) for t in (x, wv, b)}
    exe = g.compile(types, [relu, pooled], device="cpu", options={"backend": "triton"})
    step = next(s for s in exe.steps if s.name == "kernel0_convolution")
    assert list(step.run.candidates) == candidates
    assert (pooled.op.name in [s.name for s in exe.steps]) == (width % window[1] != 0)


@pytest.mark.parametrize("batch, size, taps, cin, few", [(1, 8, 3, 8, True), (1, 40, 7, 3, False), (4, 16, 3, 8, True),
                                                       (5, 16, 3, 8, False), (1, 2, 3, 64, True)])
def test_on_cuda_convolutions_with_few_output_pixels_also_measure_small_tiles(monkeypatch, batch, size, taps, cin,
                                                                                few):
    """At most FEW_PIXELS output pixels (batch x height x width): the first run on CUDA also times the template
    with 16-row tiles; many-channel windows keep their other forms. Lowered for CUDA on the CPU."""
    from stitchml.codegen import convolution

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "stand-in")
    g = sm.Graph("few_pixels")
    x = g.placeholder((batch, cin, size, size), sm.float32, name="x")
    wv = g.placeholder((8, cin, taps, taps), sm.float32, name="w")
    y = g.relu(g.convolution2d(x, wv, sm.Convolution2DDescriptor(padding="same")))
    types = {t: sm.TensorType(tuple(t.shape), sm.float32) for t in (x, wv)}
    exe = g.compile(types, [y], device="cpu", options={"backend": "triton"})
    candidates = list(next(s for s in exe.steps if s.kind == "convolution").run.candidates)
    assert ("triton-16x32x32x2x2" in candidates) == few == (batch * size * size <= convolution.FEW_PIXELS)
    assert ("triton-flat" in candidates) == (cin * taps * taps > convolution.SMALL_TAPS and
                                             cin >= convolution.TAP_MAJOR_CHANNELS)


@pytest.mark.parametrize("template", ["measure", "library", "triton"])
def test_on_cuda_channels_last_is_a_measured_candidate_when_asked(monkeypatch, template):
    """`conv_channels_last="measure"`: the first run on CUDA also times cuDNN with channels-last operands for
    the forward convolution (with its pooling), its data gradient and its weights gradient, also when the
    template is not measured; a forced template stays the template. Lowered for CUDA on the CPU."""
    from stitchml.runtime.choices import Chooser

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "stand-in")
    g = sm.Graph("channels_last")
    x = g.placeholder((2, 4, 8, 10), sm.float32, name="x")
    wv = g.placeholder((6, 4, 3, 3), sm.float32, name="w")
    relu = g.relu(g.convolution2d(x, wv, sm.Convolution2DDescriptor(padding="same")))
    pooled = g.max_pooling2d(relu, sm.Pooling2DDescriptor(kernel_size=(2, 2)))
    grads = g.gradients(g.reduction_sum(pooled * pooled), [x, wv])
    types = {t: sm.TensorType(tuple(t.shape), sm.float32) for t in (x, wv)}
    options = {"backend": "triton", "conv_channels_last": "measure", "conv_template": template}
    exe = g.compile(types, [pooled, grads[x], grads[wv]], device="cpu", options=options)
    convolutions = [s for s in exe.steps if s.name.startswith(("kernel0_convolution", "convolution"))]
    assert len(convolutions) == 3, [s.name for s in exe.steps]
    for step in convolutions:
        if template == "triton":
            assert not isinstance(step.run, Chooser), step.name
            continue
        candidates = list(step.run.candidates)
        assert candidates[0] == "library" and "library-channels-last" in candidates, (step.name, candidates)
        assert (len(candidates) > 2) == (template == "measure"), (step.name, candidates)
    keys = {step.run.key for step in convolutions if isinstance(step.run, Chooser)}
    assert all(":channels_last=measure" in key for key in keys)
    with pytest.raises(CompileError, match="conv_channels_last expects"):
        g.compile(types, [pooled], device="cpu", options={"backend": "triton", "conv_channels_last": "yes"})


def test_a_candidate_that_fails_when_measured_is_not_chosen(tmp_path, monkeypatch):
    """A generated kernel that this GPU or Triton refuses (a compile error) leaves the measured choice to the
    others, with the reason kept; when every candidate fails, the first failure is raised."""
    from stitchml.runtime import choices

    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(choices, "_decisions", {})
    monkeypatch.setattr(choices, "_time", lambda fn, env: fn(env) or 1.0)
    monkeypatch.setattr(choices.torch.cuda, "is_current_stream_capturing", lambda: False)  # no CUDA here

    def refused(env):
        raise RuntimeError("PassManager::run failed")

    ran = []
    chooser = choices.Chooser("conv", {"triton-convolution": refused, "library": lambda env: ran.append(1)})
    chooser([])
    assert chooser.chosen == "library"
    assert len(ran) == choices.WARM_ROUNDS + choices.ROUNDS + 1  # warmed up, measured, then run
    assert chooser.failures == {"triton-convolution": "RuntimeError: PassManager::run failed"}
    with pytest.raises(RuntimeError, match="PassManager"):
        choices.Chooser("other", {"a": refused, "b": refused})([])


def test_an_epilogue_the_template_has_no_form_for_keeps_the_library_call(triton_interpreter):
    """An integer division in the epilogue (the template does not flag zero divisors): the library call and
    the generated epilogue, with the pooling after them, even where the template is asked for."""
    g = sm.Graph("conv")
    x = g.placeholder((1, 2, 4, 4), sm.float32, name="x")
    w = g.placeholder((3, 2, 3, 3), sm.float32, name="w")
    d = g.placeholder((1, 3, 4, 4), sm.int32, name="d")
    y = g.convolution2d(x, w, sm.Convolution2DDescriptor(padding="same"))
    quotient = g.cast(g.floor_division(g.cast(y, sm.int32), d), sm.float32)
    z = g.max_pooling2d(quotient, sm.Pooling2DDescriptor(kernel_size=2))
    feeds = {x: torch.randn(1, 2, 4, 4) * 4, w: torch.randn(3, 2, 3, 3),
             d: torch.randint(1, 3, (1, 3, 4, 4), dtype=torch.int32)}
    exe = g.compile(feeds, [z], device="cpu", options={"conv_template": "triton"})
    assert not any("convolution kernel" in s for s in exe.kernel_sources().values())
    want = F.max_pool2d(torch.div(F.conv2d(feeds[x], feeds[w], padding=1).to(torch.int32), feeds[d],
                                  rounding_mode="floor").float(), 2)
    assert torch.equal(exe.run(feeds)[z].torch(), want)


@pytest.mark.parametrize("dtype", [sm.float32, sm.bfloat16])
def test_the_2x2_pooling_and_its_gradient_by_rows_match_torch(triton_interpreter, dtype):
    """The rows-of-windows kernels (codegen/pooling.py) on rows padded from 6 to 8 lanes: NaN windows pool to
    NaN, and ties (the ReLU's zeros), NaN and -inf windows route the gradient where torch routes it, bit for
    bit."""
    g = sm.Graph("pool")
    x = g.placeholder((2, 3, 8, 6), dtype, name="x")
    tiled = g.max_pooling2d(x, sm.Pooling2DDescriptor(kernel_size=2))
    dx = g.gradients(g.reduction_sum(tiled * tiled), [x])[x]
    a = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(0)).to(dtype.torch)
    a[0, 0, :2, :2] = 0.0
    a[0, 1, 2, 2] = a[0, 1, 3, 3] = float("nan")
    a[1, 2, :2, :2] = float("-inf")
    exe = g.compile({x: a}, [tiled, dx], device="cpu", options={"max_pooling": "rows"})
    assert [s.source.splitlines()[0] for s in exe.steps if s.kind == "pooling"] == \
        [f'"""Generated by StitchML: max pooling 2x2 by rows, {dtype.name}."""',
         f'"""Generated by StitchML: max pooling gradient 2x2 by rows, {dtype.name}."""']
    out = exe.run({x: a})
    a64 = a.double().requires_grad_()
    pooled = F.max_pool2d(a64, 2)
    want = torch.autograd.grad((pooled ** 2).sum(), a64)[0].to(dtype.torch).float()
    for got, ref in ((out[tiled].torch().float(), pooled.detach().to(dtype.torch).float()),
                     (out[dx].torch().float(), want)):
        assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.nan_to_num(), ref.nan_to_num())
    with pytest.raises(GraphError, match="max_pooling expects 'measure', 'windows' or 'rows', got 'torch'"):
        g.compile({x: a}, [dx], device="cpu", options={"max_pooling": "torch"})


@pytest.mark.parametrize("dtype", [sm.float16, sm.bfloat16])
def test_half_convolutions_round_as_the_library_call_does(triton_interpreter, dtype):
    """Half-type operands: products in float32 (the interpreter's bfloat16 widened), the product rounded to
    its type, then the epilogue; within the rule for a graph of half-type ops against float64."""
    gen = torch.Generator().manual_seed(2)
    a, wt, bias = (torch.randn(2, 16, 5, 6, generator=gen), torch.randn(8, 16, 3, 3, generator=gen) * 0.3,
                   torch.randn(8, generator=gen))
    a, wt, bias = a.to(dtype.torch), wt.to(dtype.torch), bias.to(dtype.torch)
    g = sm.Graph("half")
    x = g.placeholder(tuple(a.shape), dtype, name="x")
    wv = g.placeholder(tuple(wt.shape), dtype, name="w")
    b = g.placeholder((8,), dtype, name="b")
    y = g.relu(g.convolution2d(x, wv, sm.Convolution2DDescriptor(padding="same")) + g.reshape(b, (1, 8, 1, 1)))
    feeds = {x: a, wv: wt, b: bias}
    exe = g.compile(feeds, [y], device="cpu", options={"conv_template": "triton"})
    assert any("convolution kernel" in s for s in exe.kernel_sources().values())
    got = exe.run(feeds)[y].torch()
    assert got.dtype == dtype.torch
    want = F.conv2d(a.double(), wt.double(), bias.double(), padding=1).relu()
    cond = F.conv2d(a.double().abs(), wt.double().abs(), bias.double().abs(), padding=1)
    tol = allowed(dtype, "graph", want, (cond, torch.full_like(want, 145.0), torch.zeros_like(want)))
    assert bool(((got.double() - want).abs() <= tol).all())
