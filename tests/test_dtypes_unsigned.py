"""uint16, uint32, uint64 and the float8 types through the stack.

* every op database record that takes uint8 takes the wider unsigned types too: its first sample, with
  its uint8 operands as each unsigned type, runs eagerly (reference implementations widen where PyTorch has
  no kernel, stitchml/ops/widen.py) and compiled (Triton under the interpreter for kernels, the native C++
  backend for elementwise ops), against the record's own reference computed in int64 and wrapped back to
  the type (unsigned arithmetic is modulo 2^bits, as in NumPy and ONNX);
* values at the top of uint64's range, where int64 arithmetic would go wrong, eager and compiled against
  NumPy's uint64;
* the promotion rule (NumPy's for the unsigned types) and the float8 storage types: casts, arithmetic in
  float32 rounded back once, serialization, and the typed error for unsupported cases.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.errors import ExecutionError
from stitchml.registry import ELEMENTWISE, REDUCTION, REGISTRY

from opdb import OPS
from opdb.core import as_outputs, assert_reference, ref_args

UNSIGNED = (sm.uint16, sm.uint32, sm.uint64)
RECORDS = [r for r in OPS.values() if sm.uint8 in r.dtypes and r.ref is not None and r.inputs != "variable"
           and not r.name.startswith(("all_", "reduce_", "broadcast", "collective"))]
KERNEL_KINDS = (ELEMENTWISE, REDUCTION)


def _as(args, dtype):
    return tuple(a.to(dtype.torch) if isinstance(a, torch.Tensor) and a.dtype == torch.uint8 else a for a in args)


def _check(record, dtype, args, got, kwargs, what):
    def widened(a):
        return a.to(torch.int64) if isinstance(a, torch.Tensor) and a.dtype == dtype.torch else a

    wide = tuple(widened(a) for a in args)
    want = as_outputs(record.ref(*ref_args(record, wide), **{k: widened(v) for k, v in kwargs.items()}))
    assert len(got) == len(want), f"{what}: {len(got)} outputs, the reference has {len(want)}"
    for i, (a, w) in enumerate(zip(got, want)):
        if a.is_floating_point():
            assert len(got) == 1, f"{what}: several outputs, some floating"
            assert_reference(record, [a], wide, kwargs, f"{what} output {i}")
            continue
        w = w.to(a.dtype)  # int64 results wrap to the unsigned type as unsigned arithmetic does
        assert torch.equal(a, w), f"{what} output {i}: {a.tolist()} vs {w.tolist()}"


@pytest.mark.parametrize("record", [pytest.param(r, id=r.name) for r in RECORDS])
def test_op_database_on_unsigned_types(record):
    sample = record.samples_for(sm.uint8)[0]
    for dtype in UNSIGNED:
        args = _as(sample.args, dtype)
        kwargs = {k: _as((v,), dtype)[0] for k, v in sample.kwargs.items()}
        g = sm.Graph(record.name)
        ins = [g.placeholder(tuple(a.shape), sm.as_dtype(a.dtype), name=f"in{i}") for i, a in enumerate(args)]
        outs = record.call(g, ins, kwargs)
        feeds = dict(zip(ins, args))
        want_dtype = record.out_dtype(dtype, kwargs)
        wants = want_dtype if isinstance(want_dtype, tuple) else (want_dtype,) * len(outs)
        assert [o.dtype for o in outs] == list(wants), f"{record.name} {dtype}: dtypes {[o.dtype for o in outs]}"
        eager = [v.torch() for v in g.run(feeds, outs, device="cpu").values()]
        _check(record, dtype, args, eager, kwargs, f"{record.name} {dtype} eager")
        prim = REGISTRY.get(record.name)
        if prim is None or prim.kind not in KERNEL_KINDS or not outs:
            continue
        backends = ("interpret", "native") if prim.kind == ELEMENTWISE else ("interpret",)
        for backend in backends:
            exe = g.compile(feeds, outs, device="cpu", options={"backend": backend})
            got = [exe.run(feeds)[o].torch() for o in outs]
            for a, b in zip(got, eager):
                assert a.dtype == b.dtype and (torch.equal(a, b) or a.is_floating_point()), \
                    f"{record.name} {dtype} {backend}: {a.tolist()} vs eager {b.tolist()}"
            _check(record, dtype, args, got, kwargs, f"{record.name} {dtype} {backend}")


@pytest.mark.parametrize("backend", ["eager", "interpret", "native"])
def test_uint64_beyond_int64(backend):
    """Values of 2^63 and more, where int64 arithmetic would go wrong: kernels compute in uint64, the
    reference in int64 bits with an unsigned order and an exact unsigned division (ops/widen.py)."""
    rng = np.random.default_rng(1)
    u64 = np.uint64
    a_np = np.concatenate([rng.integers(0, 2**64 - 1, 12, dtype=u64), np.array([1, 2**63 + 7, 2**64 - 1, 0], u64)])
    b_np = np.concatenate([rng.integers(1, 2**64 - 1, 6, dtype=u64), rng.integers(1, 99, 6, dtype=u64),
                           np.array([2, 3, 2**63 + 1, 9], u64)])
    g = sm.Graph()
    a, b = g.placeholder((16,), sm.uint64), g.placeholder((16,), sm.uint64)
    outs = [a + b, a - b, a * b, g.maximum(a, b), a < b, g.floor_division(a, b), g.modulo(a, b),
            g.reduction_maximum(a, [0]), g.cast(a, sm.float64), -a, a + 7, g.absolute(a), g.sign(a),
            g.top_k(a, 3, 0)[0]]
    with np.errstate(over="ignore"):
        want = [a_np + b_np, a_np - b_np, a_np * b_np, np.maximum(a_np, b_np), a_np < b_np, a_np // b_np,
                a_np % b_np, a_np.max(), a_np.astype(np.float64), np.uint64(0) - a_np, a_np + np.uint64(7), a_np,
                (a_np != 0).astype(np.uint64), np.sort(a_np)[::-1][:3]]
    if backend == "eager":
        got = g.run({a: a_np, b: b_np}, outs, device="cpu")
    else:
        got = g.compile({a: a_np, b: b_np}, outs, device="cpu", options={"backend": backend}).run({a: a_np, b: b_np})
    for i, (o, w) in enumerate(zip(outs, want)):
        np.testing.assert_array_equal(got[o].numpy(), w, err_msg=f"output {i}")
    with pytest.raises(ExecutionError, match="division by zero"):
        g.run({a: a_np, b: np.zeros(16, np.uint64)}, [outs[5]], device="cpu")


@pytest.mark.slow
def test_unsigned_kernels_compile_for_cuda(monkeypatch, tmp_path):
    """The interpreter computes with NumPy, which takes any dtype: the kernels of unsigned graphs must also
    compile for a CUDA GPU (sm_90), as tests/test_compiler.py checks for the other types."""
    import inspect
    import json
    import pathlib

    from compiler_util import compile_for_cuda
    from stitchml.codegen.common import LIBDEVICE_CUDA, LIBDEVICE_INTERPRET
    from stitchml.runtime.launch import KernelLaunch

    jobs = set()
    original = KernelLaunch.__call__

    def record(self, env):
        source = pathlib.Path(inspect.getsourcefile(self.fn.fn)).read_text()
        jobs.add(json.dumps({"name": self.fn.fn.__name__, "warps": self.warps, "constexprs": self.meta,
                             "source": source.replace(LIBDEVICE_INTERPRET, LIBDEVICE_CUDA),
                             "dtypes": [str(env[s].dtype).replace("torch.", "") for s in self.slots],
                             "sizes": list(self.sizes)}, sort_keys=True))
        original(self, env)

    monkeypatch.setattr(KernelLaunch, "__call__", record)
    for dt in UNSIGNED:
        g = sm.Graph(str(dt))
        a, b = g.placeholder((4, 9), dt), g.placeholder((9,), dt)
        outs = [g.modulo(a * b + 7, g.maximum(b, 1)), g.floor_division(a, g.maximum(b, 1)) < a, -a, g.sign(a),
                g.reduction_maximum(a - b, [1]), g.reduction_sum(a * b, [0]), g.cast(a, sm.float32) * 0.5]
        feeds = {a: np.arange(36, dtype=dt.numpy).reshape(4, 9), b: np.arange(9, dtype=dt.numpy)}
        g.compile(feeds, outs, device="cpu", options={"backend": "interpret"}).run(feeds)
    assert len(jobs) >= 6
    failed = compile_for_cuda(sorted(jobs), tmp_path)
    assert not failed, "kernels that do not compile for CUDA:\n" + "\n".join(failed.values())


@pytest.mark.parametrize("a, b, want", [
    (sm.uint16, sm.int8, sm.int32), (sm.uint16, sm.int16, sm.int32), (sm.uint32, sm.int32, sm.int64),
    (sm.uint32, sm.uint16, sm.uint32), (sm.uint64, sm.int64, sm.float64), (sm.uint64, sm.uint8, sm.uint64),
    (sm.uint16, sm.bool, sm.uint16), (sm.uint32, sm.float16, sm.float16), (sm.uint64, sm.float32, sm.float32),
    (sm.float8_e4m3fn, sm.float8_e5m2, sm.float16), (sm.float8_e4m3fn, sm.bfloat16, sm.bfloat16),
    (sm.float8_e5m2, sm.int32, sm.float8_e5m2),
])
def test_promotion_of_the_new_types(a, b, want):
    assert sm.dtypes.promote(a, b) == want and sm.dtypes.promote(b, a) == want
    if not (a.is_floating or b.is_floating):
        assert np.promote_types(a.numpy, b.numpy) == want.numpy  # NumPy's rule (with floats, the category rule)


FLOAT8 = sm.dtypes.FLOAT8


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_casts_and_arithmetic_round_once(dtype):
    rng = np.random.default_rng(0)
    x_np = rng.uniform(-4, 4, 16).astype(np.float32)
    g = sm.Graph()
    x = g.placeholder((16,), sm.float32)
    x8 = g.cast(x, dtype)
    outs = [g.cast(x8, sm.float32), g.cast(x8 * x8 + x8, sm.float32), g.cast(g.reduction_sum(x8, [0]), sm.float32)]
    x8_t = torch.from_numpy(x_np).to(dtype.torch)
    x8_f = x8_t.float()
    want = [x8_f, (x8_f * x8_f).to(dtype.torch).float().add(x8_f).to(dtype.torch).float(),
            x8_f.sum().to(dtype.torch).float()]
    for run in ("eager", "compiled"):
        if run == "eager":
            got = g.run({x: x_np}, outs, device="cpu")
        else:
            got = g.compile({x: x_np}, outs, device="cpu", options={"backend": "interpret"}).run({x: x_np})
        for i, (o, w) in enumerate(zip(outs, want)):
            assert torch.equal(got[o].torch(), w), f"{dtype} {run} output {i}: {got[o].torch()} vs {w}"


def test_new_types_serialize_and_go_through_tensor_data(tmp_path):
    import ml_dtypes

    g = sm.Graph()
    outs = [g.placeholder((3,), dt, name=f"x_{dt}") + g.constant(torch.tensor([1, 2, 3]).to(dt.torch))
            for dt in UNSIGNED + FLOAT8]
    g.save(tmp_path / "g.json")
    loaded = sm.Graph.load(tmp_path / "g.json")
    feeds = {loaded.tensor(f"x_{dt}"): torch.tensor([4, 4, 4]).to(dt.torch) for dt in UNSIGNED + FLOAT8}
    got = loaded.run(feeds, [loaded.tensor(o.name) for o in outs], device="cpu")
    for o, dt in zip(outs, UNSIGNED + FLOAT8):
        value = got[loaded.tensor(o.name)].torch()
        assert value.dtype == dt.torch and value.to(torch.float64).tolist() == [5.0, 6.0, 7.0], dt
    e4 = sm.TensorData(np.array([0.5, 448.0], ml_dtypes.float8_e4m3fn))
    assert e4.dtype == sm.float8_e4m3fn and e4.numpy().astype(np.float32).tolist() == [0.5, 448.0]
    u = sm.TensorData(np.array([2**64 - 1], np.uint64))
    assert u.dtype == sm.uint64 and u.numpy().tolist() == [2**64 - 1]
