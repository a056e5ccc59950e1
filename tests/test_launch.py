"""Kernel launches: the direct launcher's parameter block (runtime/direct.py), its refusals, the fallback
under the interpreter, and caller output buffers written in place."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.errors import GraphError
from stitchml.runtime import direct
from stitchml.runtime.launch import KernelLaunch


class _Driver:
    """A stand-in for libcuda: reports a parameter layout and records the block of every launch."""

    def __init__(self, sizes):
        self.sizes, self.launches = sizes, []

    def params(self, function):
        return [(8 * i, s) for i, s in enumerate(self.sizes)]

    def launch(self, *args):
        assert all(isinstance(a, (ctypes.c_void_p, ctypes.c_uint, ctypes.Array)) for a in args[:-1]) and \
            args[-1] is None  # no argtypes: every argument must arrive as a C object of its width
        function, gx, gy, gz, bx, by, bz, shared, stream, block, extra = \
            [a.value if isinstance(a, (ctypes.c_void_p, ctypes.c_uint)) else a for a in args]
        values = []
        for kind in ("ptr", "ptr", "i32", "ptr", "ptr"):
            addr = block[len(values)]
            ctype = ctypes.c_int32 if kind == "i32" else ctypes.c_uint64
            values.append(ctype.from_address(addr).value)
        self.launches.append(((gx, gy, gz), (bx, by, bz), shared, stream, values, function))
        return 0


def _compiled(ptx_sizes=(8, 8, 4, 8, 8), **meta):
    """A CompiledKernel's outline: two buffers and an i32 extent, then BLOCK (constexpr)."""
    decls = ",\n".join(f".param .{'u64' if s == 8 else 'u32'} k_param_{i}" for i, s in enumerate(ptx_sizes))
    metadata = types.SimpleNamespace(num_warps=4, warp_size=32, shared=128, num_ctas=1, global_scratch_size=0,
                                     profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
    for k, v in meta.items():
        setattr(metadata, k, v)
    src = types.SimpleNamespace(fn=types.SimpleNamespace(arg_names=["in0", "out0", "n", "BLOCK"]),
                                signature={"in0": "*fp32", "out0": "*fp32", "n": "i32", "BLOCK": "constexpr"})
    return types.SimpleNamespace(src=src, metadata=metadata, function=1234, asm={"ptx": f".entry k(\n{decls}\n)"})


def test_the_parameter_block_holds_addresses_extents_and_null_scratch(monkeypatch):
    drv = _Driver([8, 8, 4, 8, 8])
    monkeypatch.setattr(direct, "driver", lambda: drv)
    launch, how = direct.bind(_compiled(), (3, 1, 1), [0, 1], (4096,), (True, True))
    assert how == "direct"
    a, b = torch.zeros(64), torch.zeros(64)
    assert launch([a, b], 77)
    grid, block, shared, stream, values, _ = drv.launches[-1]
    assert (grid, block, shared, stream) == ((3, 1, 1), (128, 1, 1), 128, 77)
    assert drv.launches[-1][5] == 1234  # the compiled kernel's CUfunction
    assert values == [a.data_ptr(), b.data_ptr(), 4096, 0, 0]  # Triton's two scratch pointers: null
    c = torch.zeros(64)
    assert launch([c, a], 78) and drv.launches[-1][4][:2] == [c.data_ptr(), a.data_ptr()]  # the slots' buffers now


class _DriverEx(_Driver):
    """A driver with cuLaunchKernelEx: decodes the launch config; `refuse` answers an error code instead."""

    def __init__(self, sizes, refuse=False):
        super().__init__(sizes)
        self.refuse, self.ex_launches = refuse, []

    def launch_ex(self, config, function, block, extra):
        assert isinstance(config, ctypes.c_void_p) and extra is None
        c = direct.LaunchConfig.from_address(config.value)
        if self.refuse:
            return 1  # CUDA_ERROR_INVALID_VALUE
        values = [ctypes.c_uint64.from_address(block[i]).value for i in (0, 1)]
        values.append(ctypes.c_int32.from_address(block[2]).value)
        self.ex_launches.append(((c.grid_x, c.grid_y, c.grid_z), (c.block_x, c.block_y, c.block_z), c.shared,
                                 c.stream or 0, c.num_attrs, function.value, values))
        return 0


def test_the_ex_entry_takes_the_prepared_config_and_follows_the_stream(monkeypatch):
    drv = _DriverEx([8, 8, 4, 8, 8])
    monkeypatch.setattr(direct, "driver", lambda: drv)
    launch, _ = direct.bind(_compiled(), (3, 2, 1), [0, 1], (4096,), (True, True))
    a, b = torch.zeros(64), torch.zeros(64)
    assert launch([a, b], 77) and launch([b, a], 0)
    assert drv.ex_launches == [((3, 2, 1), (128, 1, 1), 128, 77, 0, 1234, [a.data_ptr(), b.data_ptr(), 4096]),
                               ((3, 2, 1), (128, 1, 1), 128, 0, 0, 1234, [b.data_ptr(), a.data_ptr(), 4096])]
    assert not drv.launches  # the eleven-argument entry was not called


def test_an_ex_entry_refusing_the_first_launch_hands_over_to_cu_launch_kernel(monkeypatch):
    drv = _DriverEx([8, 8, 4, 8, 8], refuse=True)
    monkeypatch.setattr(direct, "driver", lambda: drv)
    launch, _ = direct.bind(_compiled(), (3, 1, 1), [0, 1], (4096,), (True, True))
    a, b = torch.zeros(64), torch.zeros(64)
    assert launch([a, b], 5) and launch.ex is None and len(drv.launches) == 1
    assert drv.launches[0][3] == 5 and drv.launches[0][4][:2] == [a.data_ptr(), b.data_ptr()]
    accepted, _ = direct.bind(_compiled(), (3, 1, 1), [0, 1], (4096,), (True, True))
    drv.refuse = False
    assert accepted([a, b], 5)
    drv.refuse = True  # a refusal after launches went through is the launch's failure, not the entry's
    assert not accepted([a, b], 5) and accepted.ex is not None and len(drv.launches) == 1


def test_a_buffer_off_the_compiled_alignment_is_not_launched(monkeypatch):
    drv = _Driver([8, 8, 4, 8, 8])
    monkeypatch.setattr(direct, "driver", lambda: drv)
    launch, _ = direct.bind(_compiled(), (1, 1, 1), [0, 1], (4096,), (True, False))
    base = torch.zeros(64)
    assert not launch([base[1:], base], 0) and not drv.launches  # buffer 0 was specialised as aligned
    assert launch([base, base[1:]], 0) and len(drv.launches) == 1  # buffer 1 was not: any address serves


@pytest.mark.parametrize("case, reason", [
    ({"sizes": [8, 8, 8, 8, 8]}, "do not match"),  # the driver says the extent is 8 bytes
    ({"ptx": (8, 8, 4, 8)}, "do not match"),  # the PTX disagrees with the driver about the scratch count
    ({"meta": {"global_scratch_size": 64}}, "scratch memory"),
    ({"meta": {"num_ctas": 2}}, "CTA clusters"),
    ({"meta": {"launch_pdl": True}}, "programmatic"),
    ({"grid": (0, 1, 1)}, "empty grid"),
])
def test_a_kernel_not_known_to_launch_exactly_keeps_tritons_launcher(monkeypatch, case, reason):
    monkeypatch.setattr(direct, "driver", lambda: _Driver(case.get("sizes", [8, 8, 4, 8, 8])))
    compiled = _compiled(case.get("ptx", (8, 8, 4, 8, 8)), **case.get("meta", {}))
    launch, why = direct.bind(compiled, case.get("grid", (1, 1, 1)), [0, 1], (4096,), (True, True))
    assert launch is None and reason in why


def test_the_direct_launcher_can_be_turned_off(monkeypatch):
    monkeypatch.setattr(direct, "driver", lambda: _Driver([8, 8, 4, 8, 8]))
    monkeypatch.setenv("STITCHML_DIRECT_LAUNCH", "0")
    assert direct.bind(_compiled(), (1, 1, 1), [0, 1], (4096,), (True, True)) == (None, "STITCHML_DIRECT_LAUNCH=0")


def test_the_layout_of_a_real_kernel_compiled_for_sm90(tmp_path):
    """Triton compiles a generated kernel down to PTX without a GPU: the parameters derived from its
    signature, and Triton's trailing scratch pointers, are those of its PTX entry. The max-pool gradient
    kernel (codegen/pooling.py), which the interpreter runs in the other tests, compiles too."""
    code = """
import json, triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource
import stitchml as sm
from stitchml.runtime import direct
g = sm.Graph(); x = g.placeholder((4096,), sm.float32, name="x")
exe = g.compile({x: sm.TensorType((4096,), sm.float32)}, [g.tanh(x) * 2.0], device="cpu", options={"backend": "triton"})
k = exe.steps[0].run
sig = {"in0": "*fp32", "out0": "*fp32", "n": "i32", **{n: "constexpr" for n in k.meta}}
c = triton.compile(ASTSource(k.fn, sig, constexprs=k.meta), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": k.warps})
kinds = [t if t == "ptr" else [type(t).__name__, t.value] for t in direct.parameter_types(c, 2, k.sizes)]
from stitchml.codegen import pooling
from stitchml.runtime import loader
pool = pooling.max_pool_gradient("pool_grad", (2, 3, 8, 6), (2, 2), sm.bfloat16, False)
fn = loader.load(pool.name, pool.source)
psig = {"dy": "*bf16", "x": "*bf16", "dx": "*bf16", "windows": "i32", "ho": "i32", "wo": "i32", "w": "i32",
        "BLOCK": "constexpr"}
pc = triton.compile(ASTSource(fn, psig, constexprs=pool.constexprs), target=GPUTarget("cuda", 90, 32),
                    options={"num_warps": pool.num_warps})
print(json.dumps({"sizes": list(k.sizes), "kinds": kinds, "ptx": direct.ptx_parameters(c),
                  "pool": direct.ptx_parameters(pc),
                  "hidden": direct.hidden_parameters(direct.parameter_types(c, 2, k.sizes), direct.ptx_parameters(c)),
                  "refusal": direct.refusal(type("Loaded", (), {"metadata": c.metadata, "function": 1})())}))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "triton"), STITCHML_CACHE_DIR=str(tmp_path / "sm"),
               TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sizes"] == [4096]
    assert got["kinds"] == ["ptr", "ptr", ["c_int", 4096]]
    assert got["ptx"][:3] == [8, 8, 4] and got["hidden"] == len(got["ptx"]) - 3 and got["refusal"] is None
    assert got["pool"][:7] == [8, 8, 8, 4, 4, 4, 4]  # the max-pool gradient kernel compiles for sm_90 too


def _gelu_graph():
    g = sm.Graph("launch")
    x = g.placeholder((-1,), sm.float32, name="x")
    y = 0.5 * x * (1.0 + g.erf(x * (1.0 / np.sqrt(2.0))))
    return g, x, y, g.tanh(x)


def _gelu_ref(a):
    return torch.nn.functional.gelu(a.double())


def test_interpreted_kernels_keep_the_jit_entry(triton_interpreter):
    g, x, y, _ = _gelu_graph()
    exe = g.compile({x: sm.TensorType((100,), sm.float32)}, [y], device="cpu")
    a = torch.randn(100)
    for _ in range(2):
        np.testing.assert_allclose(exe.run({x: a})[y].numpy(), _gelu_ref(a).numpy(), rtol=1e-5, atol=1e-6)
    launch = exe.steps[0].run
    assert isinstance(launch, KernelLaunch) and launch.direct is None and launch.launcher == "triton"


def test_caller_outputs_are_written_in_place(triton_interpreter):
    g, x, y, z = _gelu_graph()
    exe = g.compile({x: sm.TensorType((100,), sm.float32)}, [y, z], device="cpu")
    a = torch.randn(100)
    out = torch.full((100,), float("nan"))
    for _ in range(2):
        got = exe.run({x: a}, outputs={y: out})
        assert got[y].torch().data_ptr() == out.data_ptr()  # the kernel wrote the caller's buffer
        np.testing.assert_allclose(out.numpy(), _gelu_ref(a).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[z].numpy(), np.tanh(a.double().numpy()), rtol=1e-5)
    strided = torch.full((200,), float("nan"))[::2]  # not contiguous: filled by a copy
    got = exe.run({x: a}, outputs={y: sm.TensorData(strided)})
    np.testing.assert_allclose(strided.numpy(), _gelu_ref(a).numpy(), rtol=1e-5, atol=1e-6)
    assert got[y].torch().data_ptr() == strided.data_ptr()
    with pytest.raises(GraphError, match=r"output buffer for .*expected \(100,\)"):
        exe.run({x: a}, outputs={y: torch.empty(99)})


@pytest.mark.parametrize("dtype", [sm.float32, sm.bfloat16])
def test_a_tiling_max_pool_gradient_is_one_kernel_equal_to_the_op_by_op_run(triton_interpreter, dtype):
    """Ties (the ReLU's zeros), NaN and -inf windows route the gradient where torch routes it."""
    g = sm.Graph("pool")
    x = g.placeholder((2, 3, 8, 6), dtype, name="x")
    tiled = g.max_pooling2d(x, sm.Pooling2DDescriptor(kernel_size=2))
    overlapping = g.max_pooling2d(x, sm.Pooling2DDescriptor(kernel_size=3, stride=2))
    dx = g.gradients(g.reduction_sum(tiled * tiled) + g.reduction_sum(overlapping), [x])[x]
    a = torch.randn(2, 3, 8, 6, generator=torch.Generator().manual_seed(0)).to(dtype.torch)
    a[0, 0, :2, :2] = 0.0
    a[0, 1, 2, 2] = a[0, 1, 3, 3] = float("nan")
    a[1, 2, :2, :2] = float("-inf")
    exe = g.compile({x: a}, [dx], device="cpu")
    kinds = [s.kind for s in exe.steps if any(o.op == "max_pooling2d_gradient" for o in s.ops)]
    assert kinds == ["pooling", "vendor"] or kinds == ["vendor", "pooling"], kinds  # 3x3 stride 2: torch's
    got = exe.run({x: a})[dx].torch().float()
    want = g.run({x: a}, [dx], device="cpu", compiled=False)[dx].torch().float()
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
