"""In-kernel tensor operations (stitchml.shader): matmul2d at each scope, transpose and precision against
float64 NumPy, the descriptor's errors, tile loads and bilinear sampling, the MLP helper against its
reference, packing. Kernels run under TRITON_INTERPRET=1 on the CPU."""
from __future__ import annotations

import doctest
import itertools
import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # Triton reads this when a kernel is decorated, i.e. at import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from stitchml.errors import ShapeError  # noqa: E402
from stitchml.shader import (PROGRAM, THREAD, Matmul2dDescriptor, MLPSpec, TensorView, descriptor,  # noqa: E402
                             from_sequential, spec as spec_module)
from stitchml.shader.kernels import mlp_rows  # noqa: E402
from stitchml.shader.language import load_tile, matmul2d, sample_bilinear, store_tile  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, A0: tl.constexpr, A1: tl.constexpr, B0: tl.constexpr, B1: tl.constexpr,
                   MM_M: tl.constexpr, MM_N: tl.constexpr, MM_K: tl.constexpr, MM_TRANSPOSE_LEFT: tl.constexpr,
                   MM_TRANSPOSE_RIGHT: tl.constexpr, MM_REDUCED_PRECISION: tl.constexpr, MM_SCOPE: tl.constexpr):
    a = load_tile(a_ptr, A0, A1, A1, 1)
    b = load_tile(b_ptr, B0, B1, B1, 1)
    c = matmul2d(a, b, MM_M, MM_N, MM_K, MM_TRANSPOSE_LEFT, MM_TRANSPOSE_RIGHT, MM_REDUCED_PRECISION, MM_SCOPE)
    store_tile(c_ptr, c, MM_M, MM_N, MM_N, 1)


def _run_matmul(d: Matmul2dDescriptor, scope: str, a: np.ndarray, b: np.ndarray, dtype=torch.float32) -> np.ndarray:
    ta = torch.tensor(a, dtype=dtype, device=DEVICE)
    tb = torch.tensor(b, dtype=dtype, device=DEVICE)
    c = torch.empty((d.m, d.n), dtype=torch.float32, device=DEVICE)
    _matmul_kernel[(1,)](ta, tb, c, *a.shape, *b.shape, **d.constexprs(scope, "MM_"))
    return c.cpu().double().numpy()


@pytest.mark.parametrize("scope,transpose_left,transpose_right,reduced",
                         list(itertools.product([THREAD, PROGRAM], [False, True], [False, True], [False, True])))
def test_matmul2d_against_float64(scope, transpose_left, transpose_right, reduced):
    m, n, k = (16, 32, 16) if scope == PROGRAM else (4, 8, 2)
    d = Matmul2dDescriptor(m, n, k, transpose_left, transpose_right, reduced)
    rng = np.random.default_rng(hash((scope, transpose_left, transpose_right, reduced)) % 2**32)
    a = rng.standard_normal(d.left_shape())
    b = rng.standard_normal(d.right_shape())
    got = _run_matmul(d, scope, a, b)
    af = a.astype(np.float32).astype(np.float64)
    bf = b.astype(np.float32).astype(np.float64)
    if reduced:  # operands rounded to half, products and sums in float32
        af, bf = af.astype(np.float16).astype(np.float64), bf.astype(np.float16).astype(np.float64)
    want = (af.T if transpose_left else af) @ (bf.T if transpose_right else bf)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k)
    if reduced:  # the rounding is real: float32 operands would give a different answer
        exact = (a.T if transpose_left else a) @ (b.T if transpose_right else b)
        assert np.abs(got - exact).max() > 1e-4


def test_matmul2d_half_operands_are_exact_products():
    d = Matmul2dDescriptor(16, 16, 32)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 32)).astype(np.float16)
    b = rng.standard_normal((32, 16)).astype(np.float16)
    got = _run_matmul(d, PROGRAM, a, b, torch.float16)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-4)


def test_descriptor_errors_on_the_host():
    with pytest.raises(ShapeError, match=r"Matmul2dDescriptor\(m=12.*power of two"):
        Matmul2dDescriptor(12, 16, 16)
    with pytest.raises(ShapeError, match=r"Matmul2dDescriptor\(m=8, n=16, k=16.*tl.dot.*M, N and K ≥ 16"):
        Matmul2dDescriptor(8, 16, 16).constexprs(PROGRAM)
    with pytest.raises(ShapeError, match=r"scope must be one of \('thread', 'program'\), got 'warp'"):
        Matmul2dDescriptor(8, 16, 16).check("warp")
    assert Matmul2dDescriptor(8, 16, 2).constexprs(THREAD)["SCOPE"] == "thread"


def _compile_error(fn) -> str:
    with pytest.raises(Exception) as info:  # CompilationError on a GPU, InterpreterError on the CPU
        fn()
    e, messages = info.value, []
    while e is not None:  # the compiler's error says where; the assertion's message is in its cause
        messages.append(str(e))
        e = e.__cause__ or e.__context__
    return "\n".join(messages)


def test_descriptor_errors_when_the_kernel_compiles():
    a, b = np.ones((8, 16)), np.ones((16, 16))
    bad = dict(Matmul2dDescriptor(8, 16, 16).constexprs(THREAD, "MM_"), MM_SCOPE=PROGRAM)  # skips the host check
    assert "program scope (tl.dot) needs the Matmul2dDescriptor M >= 16" in _compile_error(
        lambda: _matmul_kernel[(1,)](torch.ones(8, 16, device=DEVICE), torch.ones(16, 16, device=DEVICE),
                                     torch.empty(8, 16, device=DEVICE), 8, 16, 16, 16, **bad))
    wrong = Matmul2dDescriptor(8, 16, 32).constexprs(THREAD, "MM_")  # K=32, but the tiles are K=16
    msg = _compile_error(lambda: _matmul_kernel[(1,)](torch.tensor(a, dtype=torch.float32, device=DEVICE),
                                                      torch.tensor(b, dtype=torch.float32, device=DEVICE),
                                                      torch.empty(8, 16, device=DEVICE), 8, 16, 16, 16, **wrong))
    assert "left operand must be (M, K) of the Matmul2dDescriptor" in msg
    warp = dict(wrong, MM_SCOPE="warp")
    assert "Matmul2dDescriptor scope must be thread or program" in _compile_error(
        lambda: _matmul_kernel[(1,)](torch.ones(8, 16, device=DEVICE), torch.ones(16, 16, device=DEVICE),
                                     torch.empty(8, 16, device=DEVICE), 8, 16, 16, 16, **warp))


def test_tensor_view():
    buf = torch.arange(40, dtype=torch.float32)
    v = TensorView((3, 4), (8, 2), torch.float32, offset=3)
    assert v.rank == 2 and v.span() == 3 + 2 * 8 + 3 * 2 + 1
    np.testing.assert_array_equal(v.of(buf).numpy(), np.arange(40)[3:].reshape(-1)[: 2 * 8 + 3 * 2 + 1]
                                  [np.add.outer(np.arange(3) * 8, np.arange(4) * 2)])
    with pytest.raises(ShapeError, match="expected a flat torch.float32 buffer of at least 26 elements"):
        v.of(torch.zeros(20))
    with pytest.raises(ShapeError, match="one stride per extent"):
        TensorView((3, 4), (1,), torch.float32)


@triton.jit
def _sample_kernel(grid_ptr, y_ptr, x_ptr, out_ptr, height, width, row_stride, col_stride, N: tl.constexpr,
                   C: tl.constexpr):
    i = tl.arange(0, N)
    v = sample_bilinear(grid_ptr, tl.load(y_ptr + i), tl.load(x_ptr + i), height, width, row_stride, col_stride, C)
    store_tile(out_ptr, v, N, C, C, 1)


def test_sample_bilinear_matches_torch_interpolate():
    rng = np.random.default_rng(2)
    grid = rng.integers(-128, 128, (5, 6, 4)).astype(np.int8)  # quantized latents, channels last
    scale = 4
    ys, xs = np.meshgrid(np.arange(5 * scale) + 0.5, np.arange(6 * scale) + 0.5, indexing="ij")
    pick = rng.choice(ys.size, 64, replace=False)
    y, x = ys.ravel()[pick] / scale, xs.ravel()[pick] / scale  # pixel centres in latent texels
    out = torch.empty((64, 4), device=DEVICE)
    _sample_kernel[(1,)](torch.tensor(grid, device=DEVICE), torch.tensor(y, dtype=torch.float32, device=DEVICE),
                         torch.tensor(x, dtype=torch.float32, device=DEVICE), out, 5, 6, 24, 4, N=64, C=4)
    full = torch.nn.functional.interpolate(torch.tensor(grid, dtype=torch.float64).permute(2, 0, 1)[None],
                                           scale_factor=scale, mode="bilinear", align_corners=False)[0]
    want = full.permute(1, 2, 0).reshape(-1, 4)[pick].numpy()
    np.testing.assert_allclose(out.cpu().double().numpy(), want, rtol=1e-5, atol=1e-4)


def _weights(spec: MLPSpec, seed: int):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
            for a, b in zip(spec.widths, spec.widths[1:])]


@pytest.mark.parametrize("widths,acts,precision,scope", [
    ((16, 64, 64, 8), ("relu", "relu", "none"), "float16", PROGRAM),
    ((12, 32, 6), ("tanh", "sigmoid"), "float32", PROGRAM),
    ((3, 8, 8, 8, 2), ("relu", "tanh", "sigmoid", "none"), "float32", THREAD),
    ((5, 4, 3), ("relu", "none"), "float16", THREAD),
])
def test_mlp_rows_against_reference(widths, acts, precision, scope):
    spec = MLPSpec(widths, acts, precision, scope)
    weights = _weights(spec, 3)
    x = torch.randn(40, widths[0], generator=torch.Generator().manual_seed(4))
    packed = spec.pack(weights, DEVICE)
    got = mlp_rows(x.to(DEVICE), packed, spec, block=16).cpu().double()
    persistent = mlp_rows(x.to(DEVICE), packed, spec, block=16, programs=2).cpu().double()  # loops over 3 blocks
    torch.testing.assert_close(persistent, got, rtol=0, atol=0)
    even = mlp_rows(x[:32].to(DEVICE), packed, spec, block=16).cpu().double()  # whole blocks: no row mask
    torch.testing.assert_close(even, got[:32], rtol=0, atol=0)
    default = mlp_rows(x.to(DEVICE), packed, spec).cpu().double()  # launch_settings: other blocks and warps
    torch.testing.assert_close(default, got, rtol=2e-3, atol=2e-3)
    if precision == "float16":  # the kernel rounds the weights and each layer's input to half
        stored = spec.unpack(packed)
        h = x.double()
        for (w, b), act in zip(stored, acts):
            h = h.half().double() @ torch.tensor(w) + torch.tensor(b)
            h = {"none": lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[act](h)
        # a float32 sum in another order can round an intermediate half the other way: one half ulp (2**-11)
        want, tol = h, 2e-3
        assert (got - spec.reference(x, weights)).abs().max() > 1e-5  # half storage really is in the path
    else:
        want, tol = spec.reference(x, weights), 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("widths,acts", [((16, 64, 64, 8), ("relu", "relu", "none")),
                                          ((12, 32, 32, 6), ("sigmoid", "tanh", "none"))])
def test_half_sums_against_reference(widths, acts):
    """Precision "float16-sums": hidden layers summed in half from their biases, the output in float32."""
    spec = MLPSpec(widths, acts, "float16-sums", PROGRAM)
    weights = _weights(spec, 3)
    x = torch.randn(48, widths[0], generator=torch.Generator().manual_seed(4))
    packed = spec.pack(weights, DEVICE)
    assert packed.dtype == torch.float16 and spec.constexprs()["MLP_REDUCED"] == 2
    got = mlp_rows(x.to(DEVICE), packed, spec, block=16).cpu().double()
    float_sums = mlp_rows(x.to(DEVICE), packed, MLPSpec(widths, acts, "float16", PROGRAM), block=16).cpu().double()
    stored = spec.unpack(packed)
    h = x.double()
    for (w, b), act in zip(stored, acts):
        h = h.half().double() @ torch.tensor(w) + torch.tensor(b)
        h = {"none": lambda t: t, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}[act](h)
    # 64 products summed in half: a few half ulps of the hidden values (|h| < 4: 2**-9 each)
    torch.testing.assert_close(got, h, rtol=5e-3, atol=5e-3)
    assert (got - float_sums).abs().max() > 0  # the half sums really are in the path


def test_pack_layout_and_unpack():
    spec = MLPSpec((3, 5, 2), ("relu", "none"), "float32", THREAD)
    assert spec.padded == (4, 8, 2) and spec.packed_numel == 4 * 8 + 8 + 8 * 2 + 2
    weights = _weights(spec, 5)
    packed = spec.pack(weights)
    w0 = packed[:32].reshape(4, 8).double().numpy()
    np.testing.assert_allclose(w0[:3, :5], weights[0][0], rtol=1e-7)
    assert not w0[3:].any() and not w0[:, 5:].any()
    np.testing.assert_allclose(packed[32:37].double().numpy(), weights[0][1], rtol=1e-7)
    for (w, b), (uw, ub) in zip(weights, spec.unpack(packed)):
        np.testing.assert_allclose(uw, w, rtol=1e-6)
        np.testing.assert_allclose(ub, b, rtol=1e-6)
    with pytest.raises(ShapeError, match=r"layer 1 expects weights \(5, 2\) and bias \(2,\), got \(5, 3\)"):
        spec.pack([weights[0], (np.zeros((5, 3)), np.zeros(3))])


def test_from_sequential_runs_in_the_kernel():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 3))
    spec, weights = from_sequential(model, precision="float32")
    assert spec.widths == (6, 32, 16, 3) and spec.activations == ("relu", "tanh", "none")
    x = torch.randn(33, 6)
    with torch.no_grad():
        torch.testing.assert_close(spec.reference(x, weights), model.double()(x.double()))
    got = mlp_rows(x.to(DEVICE), spec.pack(weights, DEVICE), spec, block=16).cpu()
    torch.testing.assert_close(got.double(), spec.reference(x, weights), rtol=1e-5, atol=1e-5)
    with pytest.raises(ShapeError, match="layer 1 is GELU"):
        from_sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU()))


def test_spec_errors():
    with pytest.raises(ShapeError, match="one activation per layer"):
        MLPSpec((4, 4), ("gelu",))
    with pytest.raises(ShapeError, match="2 to 5 positive integer widths"):
        MLPSpec((4,) * 7, ("relu",) * 6)
    with pytest.raises(ShapeError, match=r"mlp_rows: expected contiguous inputs \(rows, 4\)"):
        spec = MLPSpec((4, 16), ("none",))
        mlp_rows(torch.zeros(3, 5), spec.pack([(np.zeros((4, 16)), np.zeros(16))]), spec)


def test_doctests():
    for module in (descriptor, spec_module):
        failures, tried = doctest.testmod(module)
        assert tried and not failures


def test_docs_example_runs(capsys):
    import subprocess
    import sys
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "shader_ml.md").read_text()
    start = text.index("```python\n") + len("```python\n")
    code = text[start:text.index("```", start)]
    if DEVICE == "cuda":  # the example runs on the CPU; the interpreter cannot call this process's compiled kernels
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "TRITON_INTERPRET": "1"}, cwd=Path(__file__).parents[1])
        printed = run.stdout
    else:
        exec(compile(code, "docs/shader_ml.md", "exec"), {})
        printed = capsys.readouterr().out
    assert float(printed) < 1e-3  # the kernel's output against spec.reference
