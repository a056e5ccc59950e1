"""A CPU dispatch runs its prepared list of calls (pipeline/cpu_run.py): the same answers, bit for bit, as the
executable's own run of its steps, whatever the inputs hold from one dispatch to the next; and the typed error
of a failing op."""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.package import zoo

from test_timeline import _dispatch  # one command buffer: encode, commit, wait (bounded)


@pytest.fixture(autouse=True)
def native_backend(tmp_path_factory, monkeypatch):
    """The native CPU backend (not the Triton interpreter), with a cache of this test run's own."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "native-cache"))



def _pipeline(fn, dims: dict | None = None):
    dev = sm.device("cpu")
    desc = sm.MLPipelineDescriptor(fn)
    for name, d in (dims or {}).items():
        desc.set_input_dimensions(name, d)
    pipe = sm.Compiler(dev).new_ml_pipeline(desc)
    return dev, pipe, dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue()


def _bound_zoo_model(model, example: torch.Tensor):
    """A zoo model packaged through torch.export and bound to a CPU pipeline: (fn, dev, pipe, heap, queue,
    x, y, table, out_name), `x` holding a copy of `example` and `y` the output's buffer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (example,)).function()
    dev, pipe, heap, queue = _pipeline(fn)
    (out_name, shape), = pipe.output_shapes.items()
    x, y = sm.TensorData(example.clone()), dev.new_tensor(shape, sm.float32)
    return fn, dev, pipe, heap, queue, x, y, {fn.inputs[0].name: x, out_name: y}, out_name


_needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                         reason="needs the transformers package")


@pytest.mark.parametrize("name, batch, parts", [
    ("transformer", 1, ("hoisted", "product", "copy", "batched", "native_product", "native_copy")),
    ("transformer", 3, ("hoisted", "product", "copy", "native_product", "native_copy")),
    ("cnn", 2, ("hoisted", "product", "batched")),
    # depthwise convolutions (7x7; 3x3 at strides 1 and 2 after TensorFlow's "same" pads) as native loop nests
    pytest.param("hf:convnext", 2, ("hoisted", "product", "batched"), marks=_needs_transformers),
    pytest.param("hf:mobilenetv2", 1, ("batched",), marks=_needs_transformers),
])
def test_prepared_dispatches_match_the_executables_run_bit_for_bit(name, batch, parts):
    model, (example,) = zoo.build(name)
    x0 = example[:1].repeat(batch, *[1] * (example.dim() - 1))
    fn, dev, pipe, heap, queue, x, y, table, out_name = _bound_zoo_model(model, x0)
    placeholder, target = fn.input_tensor(fn.inputs[0].name), fn.output_tensor(out_name)
    gen = torch.Generator().manual_seed(5)
    for i in range(4):  # the first dispatch runs the bound steps, the second prepares, the rest run the calls
        x.torch().copy_(torch.randn(x0.shape, generator=gen))  # same tensor, new contents
        _dispatch(queue, pipe, heap, table)
        want = pipe.executable.run({placeholder: x.torch().clone()})[target].torch()
        assert torch.equal(y.torch(), want), f"dispatch {i}"
        with torch.no_grad():
            ref = model.double()(x.torch().double())
            model.float()
        torch.testing.assert_close(y.torch().double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    prepared = pipe._last[2].__self__.prepared
    assert all(prepared.get(p, 0) > 0 for p in parts), prepared
    if name.startswith("hf:"):  # no step runs as it is: no convolution is a library call
        assert prepared["as_is"] == 0, prepared


def test_a_change_of_thread_count_prepares_again():
    model, (example,) = zoo.build("transformer")
    _, _, pipe, heap, queue, _, y, table, _ = _bound_zoo_model(model, example)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for _ in range(3):
            _dispatch(queue, pipe, heap, table)
        run = pipe._last[2].__self__
        assert run.threads == 1
        first = y.torch().clone()
        torch.set_num_threads(2)
        _dispatch(queue, pipe, heap, table)
        assert run.threads == 2 and torch.equal(y.torch(), first)
    finally:
        torch.set_num_threads(threads)


def test_a_failing_prepared_dispatch_raises_the_ops_error_and_recovers():
    g = sm.Graph()
    a, b = g.placeholder((4,), sm.int32, name="a"), g.placeholder((4,), sm.int32, name="b")
    q = g.floor_division(g.reshape(a, (2, 2)), g.reshape(b, (2, 2))) + 1
    fn = sm.package.Package.from_graph(g, {"a": a, "b": b}, {"q": q}).function()
    dev, pipe, heap, queue = _pipeline(fn)
    av, bv = sm.TensorData(np.array([7, -7, 8, 9], np.int32)), sm.TensorData(np.array([2, 2, -3, 4], np.int32))
    out = dev.new_tensor((2, 2), sm.int32)
    table = {"a": av, "b": bv, "q": out}
    for _ in range(3):
        _dispatch(queue, pipe, heap, table)
    assert out.numpy().tolist() == [[4, -3], [-2, 3]]
    bv.torch()[1] = 0
    with pytest.raises(sm.ExecutionError, match="floor_division.*integer division by zero"):
        _dispatch(queue, pipe, heap, table)
    bv.torch()[1] = -2
    _dispatch(queue, pipe, heap, table)
    assert out.numpy().tolist() == [[4, 4], [-2, 3]]


def test_small_batched_products_are_pytorchs_bit_for_bit():
    """The loop PyTorch runs for small batched products, compiled: the same bits as torch.bmm on random
    shapes below the size where PyTorch calls its BLAS, strided operands included (a multiply-add
    instruction, which GCC would otherwise make, rounds once and differs)."""
    import ctypes

    from stitchml.codegen import cpu, cpu_product

    rng = np.random.default_rng(7)
    module, cases = cpu.Module(), []
    while len(cases) < 16:
        c = len(cases)
        m, k, n = (int(v) for v in rng.integers(1, [12, 40, 12], endpoint=True))
        if m * k * n >= cpu_product.TORCH_SMALL_BMM:
            continue
        batch = int(rng.integers(1, 20))
        dtype = (torch.float32, torch.float64)[c % 2]
        a = torch.from_numpy(rng.standard_normal((batch, k, m))).to(dtype).transpose(1, 2) if c % 3 == 0 else \
            torch.from_numpy(rng.standard_normal((batch, m, k))).to(dtype)
        b = torch.from_numpy(rng.standard_normal((batch, n, k))).to(dtype).transpose(1, 2) if c % 4 == 0 else \
            torch.from_numpy(rng.standard_normal((batch, k, n))).to(dtype)
        name = f"small_product_test_{c}"
        module.add(cpu_product.small_batched_product(name, batch, m, k, n, a.stride(), b.stride(),
                                                    str(dtype).replace("torch.", "")))
        cases.append((name, a, b))
    module.build()
    for name, a, b in cases:
        out = torch.empty(a.shape[0], a.shape[1], b.shape[2], dtype=a.dtype)
        fn = module.functions[name]
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int]
        fn(a.data_ptr(), b.data_ptr(), out.data_ptr(), 1)
        assert torch.equal(out, torch.bmm(a, b)), (name, tuple(a.shape), tuple(b.shape))
