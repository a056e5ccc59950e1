"""The native gather, concat and constant pad of a prepared CPU dispatch (codegen/cpu_movement.py,
pipeline/cpu_run.py): each loop against torch on strided operands of several types, and a dispatch whose
gathers, concats and pads no longer run through the reference every run, with the same bits as the
executable's own run, float64 PyTorch's answer, and the reference's error for an index out of range."""
from __future__ import annotations

import ctypes
import warnings

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.codegen import cpu, cpu_movement
from stitchml.package import zoo

from test_timeline import _dispatch  # one command buffer: encode, commit, wait (bounded)


@pytest.fixture(autouse=True)
def native_backend(tmp_path_factory, monkeypatch):
    """The native CPU backend (not the Triton interpreter), with a cache of this test run's own."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))


def _strided(shape: tuple, dtype: torch.dtype, gen: torch.Generator, transposed: bool) -> torch.Tensor:
    """Random values of `shape`, as a transposed view of their storage where `transposed` (rank >= 2)."""
    if transposed and len(shape) >= 2:
        return _strided(shape[:-2] + (shape[-1], shape[-2]), dtype, gen, False).transpose(-1, -2)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return torch.randint(-50, 50, shape, generator=gen).to(dtype)


def _run(module: cpu.Module, name: str, tensors: list[torch.Tensor]) -> None:
    fn = module.functions[name]
    fn.argtypes = [ctypes.c_void_p] * len(tensors) + [ctypes.c_int]
    fn(*[t.data_ptr() for t in tensors], 1)


DTYPES = (torch.float64, torch.float32, torch.float16, torch.int64, torch.bool)


def test_native_gather_concat_and_pad_are_torchs_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    module, cases = cpu.Module(), []
    for c in range(10):
        dtype = DTYPES[c % len(DTYPES)]
        shape = tuple(int(v) for v in torch.randint(1, 6, (1 + c % 3,), generator=gen))
        x = _strided(shape, dtype, gen, c % 2 == 1)
        axis = c % x.dim()
        n = x.shape[axis]
        index = torch.randint(-n, n, (2, 3) if c % 3 else (4,), generator=gen).to((torch.int64, torch.int32)[c % 2])
        name = f"gather_test_{c}"
        module.add(cpu_movement.gather(name, tuple(x.shape), x.stride(), tuple(index.shape), index.stride(),
                                       index.dtype, axis, x.element_size()))
        want = x.index_select(axis, torch.where(index < 0, index + n, index).reshape(-1).long()).reshape(
            x.shape[:axis] + index.shape + x.shape[axis + 1:])
        cases.append((name, [x, index, torch.zeros(1, dtype=torch.int32)], want))
        parts = [_strided(shape[:axis] + (k,) + shape[axis + 1:], dtype, gen, (c + k) % 2 == 0) for k in (1, 3, 2)]
        name = f"concat_test_{c}"
        module.add(cpu_movement.concat(name, [tuple(p.shape) for p in parts], [p.stride() for p in parts], axis,
                                       x.element_size()))
        cases.append((name, parts, torch.cat(parts, axis)))
        left = tuple(int(v) for v in torch.randint(0, 3, (x.dim(),), generator=gen))
        right = tuple(int(v) for v in torch.randint(0, 3, (x.dim(),), generator=gen))
        value = torch.tensor(-1.5 if dtype.is_floating_point else 1).to(dtype)
        name = f"pad_test_{c}"
        module.add(cpu_movement.pad(name, tuple(x.shape), x.stride(), left, right, value))
        spec = [p for a, b in zip(reversed(left), reversed(right)) for p in (a, b)]
        cases.append((name, [x], torch.nn.functional.pad(x, spec, value=value.item())))
    module.build()
    for name, inputs, want in cases:
        out = torch.full_like(want, 7)
        _run(module, name, inputs + [out])
        assert torch.equal(out, want), name
        if name.startswith("gather"):
            assert inputs[2].item() == 0, name


def test_a_native_gathers_index_out_of_range_sets_its_flag():
    x = torch.arange(12.0, dtype=torch.float64).reshape(4, 3)
    index = torch.tensor([1, 4, -5, -4], dtype=torch.int64)  # 4 and -5 are out of range for 4 rows
    module = cpu.Module()
    module.add(cpu_movement.gather("gather_flag_test", (4, 3), x.stride(), (4,), index.stride(), index.dtype, 0, 8))
    module.build()
    flag, out = torch.zeros(1, dtype=torch.int32), torch.full((4, 3), 7.0, dtype=torch.float64)
    _run(module, "gather_flag_test", [x, index, flag, out])
    assert flag.item() == 1
    assert torch.equal(out[0], x[1]) and torch.equal(out[3], x[0])


def _pipeline(fn):
    dev = sm.device("cpu")
    pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    return dev, pipe, dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue()


def test_a_dispatch_runs_gathers_concats_and_pads_natively_and_raises_the_gathers_error():
    """An embedding lookup (ids fed each run), a concat with a strided operand and a pad: after the
    preparing dispatch, nothing runs through the reference, the answers are the executable's bit for bit
    and float64 PyTorch's; an id out of range raises the gather's typed error, and the next dispatch with
    valid ids runs again."""
    gen = torch.Generator().manual_seed(0)
    table, bias = torch.randn(10, 6, generator=gen), torch.randn(3, 4, generator=gen)
    g = sm.Graph()
    ids = g.placeholder((3,), sm.int64, name="ids")
    rows = g.gather(g.constant(table), ids, 0)  # (3, 6)
    joined = g.concat([g.tanh(rows), g.transpose(g.constant(bias.t().contiguous()), (1, 0))], 1)  # (3, 10)
    y = g.pad(joined * 2.0, [1, 0], [0, 2], constant_value=-1.0)
    fn = sm.package.Package.from_graph(g, {"ids": ids}, {"y": y}).function()
    dev, pipe, heap, queue = _pipeline(fn)
    ids_in, out = sm.TensorData(np.array([0, 9, -1], np.int64)), dev.new_tensor((4, 12), sm.float32)
    args = {"ids": ids_in, "y": out}
    placeholder, target = fn.input_tensor("ids"), fn.output_tensor("y")
    for i in range(4):
        ids_in.torch().copy_(torch.randint(-10, 10, (3,), generator=gen))
        _dispatch(queue, pipe, heap, args)
        assert torch.equal(out.torch(), pipe.executable.run({placeholder: ids_in.torch().clone()})[target].torch())
        t = table.double()[ids_in.torch()]
        want = torch.nn.functional.pad(torch.cat([torch.tanh(t), bias.double()], 1) * 2, (0, 2, 1, 0), value=-1)
        torch.testing.assert_close(out.torch().double(), want, rtol=1e-6, atol=1e-6)
    prepared = pipe._last[2].__self__.prepared
    assert prepared["as_is"] == 0 and prepared["native_gather"] == 1, prepared
    assert prepared["native_concat"] == 1 and prepared["native_pad"] == 1, prepared
    ids_in.torch()[1] = 10
    with pytest.raises(sm.ExecutionError, match="gather.*index out of range"):
        _dispatch(queue, pipe, heap, args)
    ids_in.torch()[1] = 2
    for _ in range(2):  # the failed dispatch dropped the prepared calls: one runs the steps, the next prepares
        _dispatch(queue, pipe, heap, args)
        assert torch.equal(out.torch(), pipe.executable.run({placeholder: ids_in.torch().clone()})[target].torch())


def test_llamas_dispatch_has_no_reference_parts_and_matches_eager():
    """Llama's embedding and rotary halves (gather, concats) no longer run through the reference, and its
    products are native kernels: the whole run is one call of the native runner and the index check."""
    pytest.importorskip("transformers")
    model, (example,) = zoo.build("hf:llama")
    x0 = example[:1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x0,)).function()
    dev, pipe, heap, queue = _pipeline(fn)
    (out_name, shape), = pipe.output_shapes.items()
    x, y = sm.TensorData(x0.clone()), dev.new_tensor(shape, sm.float32)
    args = {fn.inputs[0].name: x, out_name: y}
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x.torch().copy_(torch.randint(0, 100, x0.shape, generator=gen))
        _dispatch(queue, pipe, heap, args)
    want = pipe.executable.run({fn.input_tensor(fn.inputs[0].name): x.torch().clone()})[
        fn.output_tensor(out_name)].torch()
    assert torch.equal(y.torch(), want)
    with torch.no_grad():
        ref = model.double()(x.torch())
        model.float()
    torch.testing.assert_close(y.torch().double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    prepared = pipe._last[2].__self__.prepared
    assert prepared["as_is"] == 0 and prepared["native_gather"] == 1 and prepared["native_concat"] >= 2, prepared
    assert prepared["native_product"] == prepared["product"] > 0, prepared
    assert len(pipe._last[2].__self__.calls) == 2, prepared


def test_native_small_products_are_mkls_bit_for_bit_and_near_float64():
    """The chain of multiply-adds MKL computes small products with (codegen/cpu_product.py): torch.mm's and
    torch.bmm's bits on random shapes at a transformer's sizes, register-block tails and a transposed right
    operand included, and within float32 rounding of the float64 product."""
    from stitchml.codegen import cpu_product

    gen = torch.Generator().manual_seed(11)
    module, cases = cpu.Module(), []
    for c, (batch, m, k, n) in enumerate([(1, 8, 32, 96), (1, 5, 32, 32), (1, 13, 64, 40), (1, 64, 32, 96),
                                          (4, 8, 8, 8), (3, 7, 17, 33), (1, 2, 5, 3), (5, 17, 8, 17),
                                          (2, 6, 17, 50)]):
        dtype = (torch.float32, torch.float64)[c % 2]
        a = torch.randn(batch, m, k, generator=gen, dtype=dtype)
        b = torch.randn(batch, n, k, generator=gen, dtype=dtype).transpose(1, 2) if c % 3 == 1 else \
            torch.randn(batch, k, n, generator=gen, dtype=dtype)
        name = f"product_test_{c}"
        module.add(cpu_product.product(name, (batch,), m, k, n, a.stride(), b.stride(), str(dtype)[6:]))
        cases.append((name, a, b))
    # two batch axes that do not fold into one (heads split from a permuted projection, as attention has)
    # (above PyTorch's own small-product loop, which its batched products of fewer multiply-adds take)
    a = torch.randn(3, 8, 4, 16, generator=gen).permute(0, 2, 1, 3)
    b = torch.randn(3, 8, 4, 16, generator=gen).permute(0, 2, 3, 1)
    module.add(cpu_product.product("product_test_heads", (3, 4), 8, 16, 8, a.stride(), b.stride(), "float32"))
    cases.append(("product_test_heads", a, b))
    module.build()
    for name, a, b in cases:
        out = torch.full(a.shape[:-1] + b.shape[-1:], 7.0, dtype=a.dtype)
        _run(module, name, [a, b, out])
        want = torch.mm(a[0], b[0])[None] if a.shape[0] == 1 else torch.matmul(a, b)
        assert torch.equal(out, want), name
        exact = torch.matmul(a.double(), b.double())
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5 * a.shape[-1])


def test_a_transposed_read_with_short_rows_loops_per_axis_and_a_short_softmax_folds_as_a_tree():
    """Attention's head split (a transposed read whose contiguous runs are 8 long, too short to split into
    rows) compiles to one loop per axis, no element dividing its index; a softmax over rows of 17 folds its
    sixteen partial results as a balanced tree. Both against float64 PyTorch."""
    import re

    g = sm.Graph()
    x = g.placeholder((8, 17, 4, 8), name="x")
    y = g.transpose(x, (0, 2, 1, 3)) * 0.5
    s = g.placeholder((6, 17), name="s")
    z = g.softmax(s, axis=-1)
    xv, sv = torch.randn(8, 17, 4, 8), torch.randn(6, 17)
    for target, feeds, ref in ((y, {x: xv}, xv.double().transpose(1, 2) * 0.5),
                               (z, {s: sv}, torch.softmax(sv.double(), -1))):
        types = {p: sm.TensorType(tuple(v.shape), sm.float32) for p, v in feeds.items()}
        exe = g.compile(types, [target], device="cpu", options={"backend": "native"})
        (source,) = [st.source for st in exe.steps if st.source]
        if target is y:
            assert "for (int64_t i3 = 0;" in source
            indices = re.findall(r"\bin\d+\[([^\]]*)\]", source)
            assert indices and not any("/" in index or "%" in index for index in indices), indices
        else:
            assert re.search(r"\(\(\(\w+\[0\]\) \+ \(\w+\[1\]\)\) \+", source), source
        got = exe.run(feeds)[target].torch()
        torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
