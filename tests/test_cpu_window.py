"""The native CPU backend's window kernels (codegen/cpu_window.py): max pooling and its gradient as C++ loop
nests, bit for bit the op-by-op run's results (PyTorch's), and against PyTorch in float64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.codegen import cpu_window
from stitchml.runtime import native_conv

NATIVE = {"backend": "native"}
F = torch.nn.functional


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))


def _pool_graph(shape, descriptor, dtype):
    """y = maxpool(x * 1.5), loss = sum(y * w): returns the graph, its feeds and targets y and dL/dx."""
    g = sm.Graph()
    x = g.placeholder(shape, dtype, name="x")
    y = g.max_pooling2d(x * 1.5, descriptor)
    w = g.placeholder(y.shape, dtype, name="w")
    dx = g.gradients(g.reduction_sum(y * w), [x])[x]
    return g, x, w, y, dx


POOLS = [  # (input shape, descriptor): tiling 2x2, overlapping padded ceil-mode 3x3, dilated NHWC
    ((3, 4, 8, 10), sm.Pooling2DDescriptor(kernel_size=2)),
    ((2, 3, 9, 9), sm.Pooling2DDescriptor(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((2, 7, 6, 3), sm.Pooling2DDescriptor(kernel_size=2, stride=1, dilation=2, data_layout="NHWC")),
]


@pytest.mark.parametrize("shape, descriptor", POOLS, ids=["tiles", "overlap-pad-ceil", "dilated-nhwc"])
@pytest.mark.parametrize("dtype", [sm.float32, sm.float64])
def test_max_pooling_and_its_gradient_match_pytorch(shape, descriptor, dtype):
    g, x, w, y, dx = _pool_graph(shape, descriptor, dtype)
    rng = np.random.default_rng(1)
    xv = rng.standard_normal(shape).astype(dtype.numpy)
    wv = rng.standard_normal(tuple(y.shape)).astype(dtype.numpy)
    feeds = {x: xv, w: wv}
    exe = g.compile({x: sm.TensorType(shape, dtype), w: sm.TensorType(tuple(y.shape), dtype)}, [y, dx],
                    device="cpu", options=NATIVE)
    assert sum(s.kind == "window" for s in exe.steps) == 2, [s.kind for s in exe.steps]
    got = exe.run(feeds)
    eager = g.run(feeds, [y, dx], device="cpu", compiled=False)
    for t in (y, dx):  # the same maxima, the same winners, the same order of accumulation
        assert torch.equal(got[t].torch(), eager[t].torch()), t.name
    # independently: PyTorch in float64, NCHW
    nhwc = descriptor.data_layout == "NHWC"
    x64 = torch.from_numpy(xv).double()
    x64 = (x64.permute(0, 3, 1, 2) if nhwc else x64).requires_grad_(True)
    a = descriptor.attrs()
    pad = a["padding"] if isinstance(a["padding"], tuple) else (0, 0, 0, 0)
    y64 = F.max_pool2d(F.pad(x64 * 1.5, (pad[2], pad[3], pad[0], pad[1]), value=-np.inf), a["kernel_size"],
                       a["stride"], 0, a["dilation"], ceil_mode=a["ceil_mode"])
    w64 = torch.from_numpy(wv).double()
    w64 = w64.permute(0, 3, 1, 2) if nhwc else w64
    y64 = y64[:, :, :w64.shape[2], :w64.shape[3]]  # ceil mode: PyTorch's last window may start in padding
    (dx64,) = torch.autograd.grad((y64 * w64).sum(), x64)
    back = (lambda t: t.permute(0, 2, 3, 1)) if nhwc else (lambda t: t)
    tol = 1e-6 if dtype == sm.float32 else 1e-14
    torch.testing.assert_close(got[y].torch().double(), back(y64.detach()), rtol=tol, atol=tol)
    torch.testing.assert_close(got[dx].torch().double(), back(dx64), rtol=tol, atol=tol)


def test_max_pooling_follows_pytorch_on_nan_infinities_and_ties():
    """NaN wins its window, a window of -inf sends its gradient to its first cell, ties go to the first."""
    shape = (1, 2, 4, 6)
    g, x, w, y, dx = _pool_graph(shape, sm.Pooling2DDescriptor(kernel_size=3, stride=2, padding=1), sm.float32)
    xv = np.full(shape, 2.0, np.float32)
    xv[0, 0, 0, 0] = np.nan
    xv[0, 0, 2:4, 2:4] = -np.inf
    xv[0, 1, 1, 3] = np.nan
    xv[0, 1, 3, 5] = np.inf
    wv = np.arange(np.prod(y.shape), dtype=np.float32).reshape(y.shape) + 1
    exe = g.compile({x: sm.TensorType(shape, sm.float32), w: sm.TensorType(tuple(y.shape), sm.float32)},
                    [y, dx], device="cpu", options=NATIVE)
    got = exe.run({x: xv, w: wv})
    eager = g.run({x: xv, w: wv}, [y, dx], device="cpu", compiled=False)
    for t in (y, dx):
        torch.testing.assert_close(got[t].torch(), eager[t].torch(), rtol=0, atol=0, equal_nan=True)


CONVS = [  # (input shape, weights shape, descriptor): "same" with an odd kernel, strided with even padding
    # (the transposed convolution needs an output padding), dilated, and an even kernel's uneven "same"
    # padding, which keeps the op-by-op call
    ((2, 3, 9, 9), (4, 3, 5, 5), sm.Convolution2DDescriptor(padding="same"), True),
    ((2, 3, 10, 10), (4, 3, 3, 3), sm.Convolution2DDescriptor(stride=2, padding=(1, 1, 1, 1)), True),
    ((1, 2, 11, 8), (3, 2, 3, 3), sm.Convolution2DDescriptor(dilation=2, padding=(2, 2, 2, 2)), True),
    ((2, 2, 8, 8), (3, 2, 4, 4), sm.Convolution2DDescriptor(padding="same"), False),
]


@pytest.mark.parametrize("shape, wshape, descriptor, library_padding", CONVS,
                         ids=["same", "strided", "dilated", "even-kernel"])
def test_convolutions_and_their_gradients_match_pytorch_in_float64(shape, wshape, descriptor, library_padding):
    g = sm.Graph()
    x = g.placeholder(shape, sm.float32, name="x")
    w = g.placeholder(wshape, sm.float32, name="w")
    y = g.relu(g.convolution2d(x, w, descriptor) + 0.25)
    dx, dw = (grads := g.gradients(g.reduction_sum(y * y), [x, w]))[x], grads[w]
    rng = np.random.default_rng(2)
    xv, wv = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    exe = g.compile({x: sm.TensorType(shape, sm.float32), w: sm.TensorType(wshape, sm.float32)}, [y, dx, dw],
                    device="cpu", options=NATIVE)
    got = exe.run({x: xv, w: wv})
    eager = g.run({x: xv, w: wv}, [y, dx, dw], device="cpu", compiled=False)
    x64 = torch.from_numpy(xv).double().requires_grad_(True)
    w64 = torch.from_numpy(wv).double().requires_grad_(True)
    a = descriptor.attrs()
    pad = a["padding"]
    if pad == "same":
        total = wshape[2] - 1
        pad = (total // 2, total - total // 2, total // 2, total - total // 2)
    y64 = F.relu(F.conv2d(F.pad(x64, (pad[2], pad[3], pad[0], pad[1])), w64, stride=a["stride"],
                          dilation=a["dilation"]) + 0.25)
    dx64, dw64 = torch.autograd.grad((y64 * y64).sum(), [x64, w64])
    for t, ref in ((y, y64.detach()), (dx, dx64), (dw, dw64)):
        scale = ref.abs().max().item()
        for result in (got[t].torch(), eager[t].torch()):
            torch.testing.assert_close(result.double(), ref, rtol=1e-5, atol=1e-5 * scale)
    conv_ops = [op for op in exe.program.operations if op.op in ("convolution_transpose2d",
                                                                  "convolution2d_weights_gradient")]
    assert conv_ops and all((native_conv.call(op) is not None) == library_padding for op in conv_ops)
    # few taps per output at stride 1: the weights' gradient is the native loop nest (held to float64 above)
    small = wshape[1] * wshape[2] * wshape[3] <= 32 and a["stride"] == (1, 1)
    assert any(st.kind == "window" and "_weights_gradient" in st.name for st in exe.steps) == small


@pytest.mark.parametrize("shape, wshape, descriptor", [
    ((3, 1, 9, 7), (5, 1, 5, 5), sm.Convolution2DDescriptor(padding="same")),
    ((2, 2, 8, 9), (3, 2, 3, 3), sm.Convolution2DDescriptor(dilation=2, padding=(2, 1, 0, 3))),
    ((2, 8, 8, 8), (16, 8, 3, 3), sm.Convolution2DDescriptor(padding="same")),  # 72 taps, a small product
    # the patch loop nest: strides, many taps over few pixels
    ((2, 3, 32, 32), (8, 3, 7, 7), sm.Convolution2DDescriptor(stride=2, padding=3)),  # ResNet's stem
    ((3, 16, 4, 4), (32, 16, 1, 1), sm.Convolution2DDescriptor(stride=2)),  # a strided skip
    ((2, 32, 2, 2), (32, 32, 3, 3), sm.Convolution2DDescriptor(padding="same")),  # 288 taps at 2x2
    ((2, 5, 9, 8), (6, 5, 3, 2), sm.Convolution2DDescriptor(stride=(2, 3), dilation=2, padding=(2, 1, 0, 3))),
    # 66 pixels in rows of 11: the windows laid out as columns first
    ((2, 5, 12, 10), (6, 5, 3, 2), sm.Convolution2DDescriptor(stride=(2, 1), dilation=(1, 2), padding=(1, 0, 2, 1))),
], ids=["one-channel-same", "dilated-uneven-padding", "small-product", "stem-stride-2", "skip-1x1-stride-2",
        "many-taps-few-pixels", "strided-dilated-uneven",
        "strided-columns"])
def test_small_convolutions_run_as_the_direct_loop_nest(shape, wshape, descriptor):
    """Few taps per output, or a small product: the native direct convolution, alone (writing the output) and
    under an epilogue."""
    g = sm.Graph()
    x = g.placeholder(shape, sm.float32, name="x")
    w = g.placeholder(wshape, sm.float32, name="w")
    y = g.convolution2d(x, w, descriptor)
    z = g.relu(y - 0.5)
    rng = np.random.default_rng(3)
    xv, wv = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    a = descriptor.attrs()
    pad = a["padding"]
    if pad == "same":
        pad = ((wshape[2] - 1) // 2,) * 4
    y64 = F.conv2d(F.pad(torch.from_numpy(xv).double(), (pad[2], pad[3], pad[0], pad[1])),
                   torch.from_numpy(wv).double(), stride=a["stride"], dilation=a["dilation"])
    for target, ref in ((y, y64), (z, F.relu(y64 - 0.5))):
        exe = g.compile({x: sm.TensorType(shape, sm.float32), w: sm.TensorType(wshape, sm.float32)}, [target],
                        device="cpu", options=NATIVE)
        assert any("_direct(" in (s.source or "") for s in exe.steps)
        got = exe.run({x: xv, w: wv})[target].torch()
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def test_large_products_keep_the_library_convolution():
    """Many taps over a large image: oneDNN's convolution, not the loop nest (3x slower there)."""
    g = sm.Graph()
    x = g.placeholder((1, 32, 16, 16), sm.float32, name="x")
    w = g.placeholder((32, 32, 3, 3), sm.float32, name="w")
    y = g.convolution2d(x, w, sm.Convolution2DDescriptor(padding="same"))
    exe = g.compile({x: sm.TensorType((1, 32, 16, 16), sm.float32), w: sm.TensorType((32, 32, 3, 3), sm.float32)},
                    [y], device="cpu", options=NATIVE)
    assert not any("_direct(" in (s.source or "") for s in exe.steps)


@pytest.mark.parametrize("descriptor", [
    sm.Pooling2DDescriptor(kernel_size=2),
    sm.Pooling2DDescriptor(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    sm.Pooling2DDescriptor(kernel_size=3, stride=2, padding=1, ceil_mode=True, include_zero_padding=True),
    sm.Pooling2DDescriptor(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0, 1, 1), data_layout="NHWC"),
], ids=["tiles", "pad-ceil", "pad-ceil-count-padding", "nhwc-uneven"])
def test_average_pooling_matches_the_op_by_op_run_and_pytorch(descriptor):
    shape = (2, 3, 9, 10) if descriptor.data_layout == "NCHW" else (2, 9, 10, 3)
    g = sm.Graph()
    x = g.placeholder(shape, sm.float64, name="x")
    y = g.avg_pooling2d(x, descriptor)
    xv = np.random.default_rng(4).standard_normal(shape)
    exe = g.compile({x: sm.TensorType(shape, sm.float64)}, [y], device="cpu", options=NATIVE)
    assert [s.kind for s in exe.steps] == ["window"]
    got = exe.run({x: xv})[y].torch()
    torch.testing.assert_close(got, g.run({x: xv}, [y], device="cpu", compiled=False)[y].torch(), rtol=1e-14,
                               atol=1e-14)
    a = descriptor.attrs()
    x64 = torch.from_numpy(xv)
    x64 = x64.permute(0, 3, 1, 2) if descriptor.data_layout == "NHWC" else x64
    if a["padding"] == (1, 0, 1, 1):  # PyTorch pads evenly only: pad explicitly, count the real cells
        ones = F.pad(torch.ones_like(x64[:1, :1]), (1, 1, 1, 0))
        sums = F.avg_pool2d(F.pad(x64, (1, 1, 1, 0)), a["kernel_size"], a["stride"], divisor_override=1)
        ref = sums / F.avg_pool2d(ones, a["kernel_size"], a["stride"], divisor_override=1)
        ref = ref.permute(0, 2, 3, 1)
    else:
        pad = a["padding"][0] if isinstance(a["padding"], tuple) else 0
        ref = F.avg_pool2d(x64, a["kernel_size"], a["stride"], pad, a["ceil_mode"], a["include_zero_padding"])
    torch.testing.assert_close(got, ref, rtol=1e-13, atol=1e-13)


def test_the_patch_convolution_reads_strided_weights():
    """Weights given as a transposed view (HWIO stored, OIHW read): the patch loop nest copies them into OIHW
    rows first; both of its forms (dot products over few pixels, columns over many) against float64."""
    for shape in ((2, 6, 4, 4), (2, 6, 12, 12)):  # 4 and 36 output pixels at stride 2
        g = sm.Graph()
        x = g.placeholder(shape, sm.float32, name="x")
        w_hwio = g.placeholder((3, 3, 6, 8), sm.float32, name="w")
        y = g.convolution2d(x, g.transpose(w_hwio, (3, 2, 0, 1)), sm.Convolution2DDescriptor(stride=2, padding=1))
        rng = np.random.default_rng(4)
        xv, wv = rng.standard_normal(shape).astype(np.float32), rng.standard_normal((3, 3, 6, 8)).astype(np.float32)
        exe = g.compile({x: sm.TensorType(shape, sm.float32), w_hwio: sm.TensorType((3, 3, 6, 8), sm.float32)}, [y],
                        device="cpu", options=NATIVE)
        direct = [s.source for s in exe.steps if "_direct(" in (s.source or "")]
        assert direct and "wk[" in direct[0]  # the strided weights' copy
        ref = F.conv2d(torch.from_numpy(xv).double(), torch.from_numpy(wv).double().permute(3, 2, 0, 1),
                       stride=2, padding=1)
        got = exe.run({x: xv, w_hwio: wv})[y].torch()
        torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


GROUPED = [  # (input shape, weights shape, groups, descriptor, the loop nest's form)
    ((2, 8, 9, 9), (8, 1, 3, 3), 8, sm.Convolution2DDescriptor(padding="same"), "rows"),  # depthwise
    ((1, 8, 8, 8), (8, 1, 7, 7), 8, sm.Convolution2DDescriptor(padding=3), "rows"),  # ConvNeXt's 7x7 depthwise
    ((2, 6, 11, 10), (6, 1, 3, 3), 6, sm.Convolution2DDescriptor(stride=2, padding=(0, 1, 0, 1)), "depthwise"),
    ((2, 6, 20, 20), (6, 1, 3, 3), 6, sm.Convolution2DDescriptor(stride=2, padding=1), "patch"),  # 100 pixels
    ((2, 12, 3, 3), (12, 1, 3, 3), 12, sm.Convolution2DDescriptor(stride=2, padding=1), "depthwise"),
    ((2, 4, 3, 3), (12, 1, 3, 3), 4, sm.Convolution2DDescriptor(padding=1), "depthwise"),  # multiplier 3
    ((2, 4, 9, 8), (8, 1, 3, 3), 4, sm.Convolution2DDescriptor(dilation=2, padding=(2, 1, 0, 3)), "rows"),
    ((2, 6, 12, 10), (9, 2, 3, 2), 3, sm.Convolution2DDescriptor(stride=(2, 1), dilation=(1, 2), padding=1),
     "patch"),
    ((2, 8, 4, 4), (8, 4, 3, 3), 2, sm.Convolution2DDescriptor(stride=2, padding=1), "patch"),  # few pixels
    ((2, 8, 1, 19), (8, 2, 1, 16), 4, sm.Convolution2DDescriptor(padding=(0, 0, 8, 8)), "rows"),  # 1-D (Wav2Vec2)
    ((3, 6, 1, 20), (6, 1, 1, 5), 6, sm.Convolution2DDescriptor(stride=(1, 3), padding=(0, 0, 2, 1)), "depthwise"),
    # 1x1 at stride 1: columns an image over many pixels, dot products over one, else all images' pixels as
    # the columns of one product (17 of them: a block and one more)
    ((2, 8, 8, 8), (24, 8, 1, 1), 1, sm.Convolution2DDescriptor(), "patch"),
    ((1, 40, 1, 1), (64, 40, 1, 1), 1, sm.Convolution2DDescriptor(), "patch"),
    ((1, 80, 1, 1), (512, 80, 1, 1), 1, sm.Convolution2DDescriptor(), "patch"),  # threads share the outputs
    ((17, 40, 1, 1), (64, 40, 1, 1), 1, sm.Convolution2DDescriptor(), "pointwise"),
    ((2, 16, 2, 2), (24, 16, 1, 1), 1, sm.Convolution2DDescriptor(), "pointwise"),
]


@pytest.mark.parametrize("shape, wshape, groups, descriptor, form", GROUPED, ids=[
    "depthwise-same", "depthwise-7x7", "depthwise-stride-2-uneven", "depthwise-stride-2-columns",
    "depthwise-few-pixels", "multiplier-3-few-pixels", "multiplier-2-dilated", "groups-3-strided-dilated",
    "groups-2-few-pixels", "1d-grouped", "1d-depthwise-strided", "1x1-columns", "1x1-one-pixel", "1x1-one-pixel-threads", "1x1-images",
    "1x1-few-pixels"])
@pytest.mark.parametrize("dtype", [sm.float32, sm.float64])
def test_grouped_convolutions_run_as_the_direct_loop_nest(shape, wshape, groups, descriptor, form, dtype):
    """Grouped and depthwise convolutions (any stride, padding, dilation, channel multiplier; 1-D as a
    height of one) and the forms of 1x1 ones: the native loop nest under a bias and ReLU6 epilogue, against
    float64 PyTorch."""
    desc = sm.Convolution2DDescriptor(**{**descriptor.attrs(), "groups": groups})
    g = sm.Graph()
    x = g.placeholder(shape, dtype, name="x")
    w = g.placeholder(wshape, dtype, name="w")
    b = g.placeholder((wshape[0], 1, 1), dtype, name="b")
    y = g.clamp(g.convolution2d(x, w, desc) + b, 0.0, 6.0)
    rng = np.random.default_rng(5)
    xv, wv, bv = (rng.standard_normal(s).astype(dtype.numpy) for s in (shape, wshape, (wshape[0], 1, 1)))
    exe = g.compile({x: sm.TensorType(shape, dtype), w: sm.TensorType(wshape, dtype),
                     b: sm.TensorType((wshape[0], 1, 1), dtype)}, [y], device="cpu", options=NATIVE)
    assert any("_direct(" in (s.source or "") for s in exe.steps)
    conv = next(o for op in exe.program.operations if op.op == "fusion"
                for o in op.attrs["body"].operations if o.op == "convolution2d")
    assert cpu_window._form(conv) == form
    # the bias and ReLU6 are computed as the loop nest stores each output: one kernel, one call
    assert [type(s.run).__name__ for s in exe.steps if s.kind == "convolution"] == ["NativeLaunch"]
    got = exe.run({x: xv, w: wv, b: bv})[y].torch()
    a = desc.attrs()
    pad = a["padding"]
    if pad == "same":
        pad = ((wshape[2] - 1) // 2,) * 2 + ((wshape[3] - 1) // 2,) * 2
    x64 = F.pad(torch.from_numpy(xv).double(), (pad[2], pad[3], pad[0], pad[1]))
    ref = (F.conv2d(x64, torch.from_numpy(wv).double(), stride=a["stride"], dilation=a["dilation"], groups=groups)
           + torch.from_numpy(bv).double()).clamp(0, 6)
    tol = 1e-5 if dtype == sm.float32 else 1e-12
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_a_zero_pad_before_a_convolution_is_its_padding(value):
    """TensorFlow's "same" padding exported as a pad op (MobileNetV2's): a zero pad folds into the convolution
    (no padded copy), any other value stays a pad; forward and gradients against float64 PyTorch."""
    shape, wshape = (2, 6, 9, 8), (6, 1, 3, 3)
    g = sm.Graph()
    x = g.placeholder(shape, sm.float32, name="x")
    w = g.placeholder(wshape, sm.float32, name="w")
    y = g.convolution2d(g.pad(x, [0, 0, 0, 1], [0, 0, 1, 1], constant_value=value),
                        w, sm.Convolution2DDescriptor(stride=2, groups=6))
    grads = g.gradients(g.reduction_sum(y * y), [x, w])
    rng = np.random.default_rng(6)
    xv, wv = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    exe = g.compile({x: sm.TensorType(shape, sm.float32), w: sm.TensorType(wshape, sm.float32)},
                    [y, grads[x], grads[w]], device="cpu", options=NATIVE)
    forward = next(op for op in exe.program.operations if op.op == "convolution2d"
                   or op.op == "fusion" and any(o.op == "convolution2d" for o in op.attrs["body"].operations))
    conv = forward if forward.op == "convolution2d" else \
        next(o for o in forward.attrs["body"].operations if o.op == "convolution2d")
    assert (conv.attrs["padding"] == (0, 1, 1, 1)) == (value == 0.0), conv.attrs["padding"]
    got = exe.run({x: xv, w: wv})
    x64 = torch.from_numpy(xv).double().requires_grad_(True)
    w64 = torch.from_numpy(wv).double().requires_grad_(True)
    y64 = F.conv2d(F.pad(x64, (1, 1, 0, 1), value=value), w64, stride=2, groups=6)
    dx64, dw64 = torch.autograd.grad((y64 * y64).sum(), [x64, w64])
    for t, ref in ((y, y64.detach()), (grads[x], dx64), (grads[w], dw64)):
        torch.testing.assert_close(got[t].torch().double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


@pytest.mark.parametrize("shape, wshape, groups, descriptor", [
    ((2, 6, 7, 8), (6, 1, 3, 3), 6, sm.Convolution2DDescriptor(padding="same")),  # depthwise
    ((2, 4, 9, 8), (8, 2, 3, 3), 2, sm.Convolution2DDescriptor(dilation=2, padding=(2, 1, 0, 3))),
    ((2, 8, 1, 19), (8, 2, 1, 16), 4, sm.Convolution2DDescriptor(padding=(0, 0, 8, 8))),  # 1-D (Wav2Vec2)
], ids=["depthwise", "groups-2-dilated-uneven", "1d-grouped"])
def test_grouped_convolutions_weights_gradient_is_the_native_loop_nest(shape, wshape, groups, descriptor):
    """Few taps at stride 1: the weights' gradient of a grouped convolution is the native loop nest, each
    output channel over its group's input channels; both gradients against float64 PyTorch."""
    desc = sm.Convolution2DDescriptor(**{**descriptor.attrs(), "groups": groups})
    g = sm.Graph()
    x = g.placeholder(shape, sm.float32, name="x")
    w = g.placeholder(wshape, sm.float32, name="w")
    y = g.convolution2d(x, w, desc)
    grads = g.gradients(g.reduction_sum(y * y), [x, w])
    rng = np.random.default_rng(7)
    xv, wv = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    exe = g.compile({x: sm.TensorType(shape, sm.float32), w: sm.TensorType(wshape, sm.float32)},
                    [grads[x], grads[w]], device="cpu", options=NATIVE)
    assert any(st.kind == "window" and "_weights_gradient" in st.name for st in exe.steps)
    got = exe.run({x: xv, w: wv})
    a = desc.attrs()
    pad = a["padding"]
    if pad == "same":
        pad = ((wshape[2] - 1) // 2,) * 2 + ((wshape[3] - 1) // 2,) * 2
    x64 = torch.from_numpy(xv).double().requires_grad_(True)
    w64 = torch.from_numpy(wv).double().requires_grad_(True)
    y64 = F.conv2d(F.pad(x64, (pad[2], pad[3], pad[0], pad[1])), w64, dilation=a["dilation"], groups=groups)
    dx64, dw64 = torch.autograd.grad((y64 * y64).sum(), [x64, w64])
    for t, ref in ((grads[x], dx64), (grads[w], dw64)):
        torch.testing.assert_close(got[t].torch().double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
