"""The prepared run's host path in C (runtime/native_run.py, native_run.c), exercised on the CPU: a stand-in
driver compiled here takes the place of libcuda's launch entries, and its "kernel" doubles the buffer its
parameter block points at, so every run's values, parameter block, alignment refusal, feed-check misses,
fallbacks and errors are checked against torch; plus the extension's disk cache and the fallback without
a compiler."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import types
import weakref

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.errors import ExecutionError, FeedError
from stitchml.runtime import direct, executable, native_run
from stitchml.runtime.compiled import ExecutableCache
from stitchml.runtime.launch import KernelLaunch

FAKE_DRIVER = r"""
#include <stdint.h>
typedef struct { unsigned gx, gy, gz, bx, by, bz, shared; void *stream; void *attrs; unsigned nattrs; } Config;
int refuse_ex = 0, fail_plain = 0, fail_ex = 0;
long long ex_calls = 0, plain_calls = 0;
unsigned long long seen[12];  /* function, grid x y z, block x y z, shared, stream, in, out, n */
static void run(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                unsigned shared, void *stream, void **params) {
    float *in = (float *)(uintptr_t)*(uint64_t *)params[0], *out = (float *)(uintptr_t)*(uint64_t *)params[1];
    int n = *(int32_t *)params[2];
    unsigned long long v[12] = {(uintptr_t)f, gx, gy, gz, bx, by, bz, shared, (uintptr_t)stream,
                                (uintptr_t)in, (uintptr_t)out, (unsigned long long)n};
    for (int i = 0; i < 12; i++) seen[i] = v[i];
    if (*(uint64_t *)params[3] != 0 || *(uint64_t *)params[4] != 0) return;  /* scratch: must be null */
    for (int i = 0; i < n; i++) out[i] = 2.0f * in[i];
}
int launch_ex(const Config *c, void *f, void **params, void **extra) {
    if (refuse_ex || fail_ex || extra) return 1;
    ex_calls++;
    run(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shared, c->stream, params);
    return 0;
}
int launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shared,
           void *stream, void **params, void **extra) {
    if (fail_plain || extra) return 1;
    plain_calls++;
    run(f, gx, gy, gz, bx, by, bz, shared, stream, params);
    return 0;
}
"""
N = 64


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """The stand-in driver library (ctypes), or a skip where this machine has no C compiler."""
    try:
        cc, _ = native_run.compiler()
    except native_run.Unavailable as e:
        pytest.skip(str(e))
    folder = tmp_path_factory.mktemp("fake_driver")
    (folder / "fake.c").write_text(FAKE_DRIVER)
    subprocess.run([cc, "-O1", "-shared", "-fPIC", str(folder / "fake.c"), "-o", str(folder / "fake.so")], check=True)
    lib = ctypes.CDLL(str(folder / "fake.so"))
    lib.launch.restype = lib.launch_ex.restype = ctypes.c_int
    if native_run.module() is None:
        pytest.skip(native_run.reason)
    return lib


def _var(lib, name, ctype=ctypes.c_int):
    return ctype.in_dll(lib, name)


class _Driver:
    """direct.bind's view of the driver: the stand-in's entries and a parameter layout of two buffers, an
    i32 extent and Triton's two scratch pointers."""

    def __init__(self, lib):
        self.launch, self.launch_ex = lib.launch, lib.launch_ex

    def params(self, function):
        return [(0, 8), (8, 8), (16, 4), (24, 8), (32, 8)]


def _compiled():
    metadata = types.SimpleNamespace(num_warps=4, warp_size=32, shared=96, num_ctas=1, global_scratch_size=0,
                                     profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False)
    src = types.SimpleNamespace(fn=types.SimpleNamespace(arg_names=["in0", "out0", "n", "BLOCK"]),
                                signature={"in0": "*fp32", "out0": "*fp32", "n": "i32", "BLOCK": "constexpr"})
    ptx = ".entry k(.param .u64 a, .param .u64 b, .param .u32 c, .param .u64 d, .param .u64 e)"
    return types.SimpleNamespace(src=src, metadata=metadata, function=4321, asm={"ptx": ptx})


class _Launch(KernelLaunch):
    """A kernel step with a direct launch over the stand-in driver; its own run (the Python path `resume`
    takes) doubles the input with torch, or raises `error` when set."""

    def __init__(self, direct_launch, slots):
        self.direct, self.slots, self.device_index = direct_launch, slots, -1
        self.calls, self.error = 0, None

    def __call__(self, env):
        self.calls += 1
        if self.error is not None:
            raise self.error
        torch.mul(env[self.slots[0]], 2.0, out=env[self.slots[1]])


def _setup(fake, monkeypatch, alignment=(True, True)):
    """A CPU executable of y = 2x whose step is a direct launch over the stand-in, and its native runner."""
    for name in ("refuse_ex", "fail_plain", "fail_ex"):
        _var(fake, name).value = 0
    monkeypatch.setattr(direct, "driver", lambda: _Driver(fake))
    g = sm.Graph("native")
    x = g.placeholder((N,), sm.float32, name="x")
    y = x * 2.0
    exe = g.compile({x: sm.TensorType((N,), sm.float32)}, [y], device="cpu")
    exe.run({x: torch.randn(N)})  # the first run binds the template and prepares
    slots = exe.steps[0].run.slots
    d, how = direct.bind(_compiled(), (3, 1, 1), slots, (N,), alignment)
    assert how == "direct"
    launch = exe.steps[0].run = _Launch(d, slots)
    prepared = native_run.runner(exe, executable._Prepared(exe, exe._template), stream=lambda index: 77)
    assert prepared is not None
    exe._prepared = prepared
    return g, x, y, exe, launch, prepared


def _seen(fake) -> list[int]:
    return list((ctypes.c_ulonglong * 12).in_dll(fake, "seen"))


def test_a_run_launches_in_c_with_the_prepared_parameter_block(fake, monkeypatch):
    g, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    a = torch.randn(N)
    runs, count, ex_calls = exe.runs, g.run_count, _var(fake, "ex_calls", ctypes.c_longlong).value
    got = exe.run({x: a})[y]
    assert isinstance(got, sm.TensorData)
    out = got.torch()
    np.testing.assert_array_equal(out.numpy(), (a.double() * 2).float().numpy())
    assert _seen(fake) == [4321, 3, 1, 1, 128, 1, 1, 96, 77, a.data_ptr(), out.data_ptr(), N]
    assert _var(fake, "ex_calls", ctypes.c_longlong).value == ex_calls + 1 and launch.calls == 0
    assert (exe.runs, g.run_count) == (runs + 1, count + 1) and runner.counts == (1, 0)
    assert runner.entries() == ("cuLaunchKernelEx",)
    again = exe.run({x: sm.TensorData(a)})[y].torch()  # a TensorData feed; a fresh output each run
    assert again.data_ptr() not in (out.data_ptr(), a.data_ptr()) and torch.equal(again, out)
    assert again.shape == (N,) and again.dtype == torch.float32 and again.is_contiguous()


def test_small_outputs_come_from_blocks_and_every_result_keeps_its_values(fake, monkeypatch):
    _, x, y, exe, _, _ = _setup(fake, monkeypatch)
    feeds = [torch.randn(N) for _ in range(2 * native_run.BLOCK_OUTPUTS + 3)]
    results = [exe.run({x: a})[y].torch() for a in feeds]  # all kept: later runs must not write into them
    for a, got in zip(feeds, results):
        np.testing.assert_array_equal(got.numpy(), (a.double() * 2).float().numpy())
        assert got.shape == (N,) and got.is_contiguous() and got.data_ptr() % 16 == 0
    assert len({r.data_ptr() for r in results}) == len(results)
    blocks = {r.untyped_storage().data_ptr() for r in results}
    assert len(blocks) == 3  # BLOCK_OUTPUTS outputs per allocation
    monkeypatch.setattr(native_run, "BLOCK_BYTES", 4 * N - 1)  # a 256-byte output is now too large for a block
    exe._prepared = native_run.runner(exe, executable._Prepared(exe, exe._template), stream=lambda index: 77)
    alone = [exe.run({x: a})[y].torch() for a in feeds[:2]]
    assert all(r.untyped_storage().nbytes() == 4 * N for r in alone)


def test_a_caller_buffer_is_launched_on_in_place(fake, monkeypatch):
    _, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    a, buf = torch.randn(N), torch.full((N,), float("nan"))
    got = exe.run({x: a}, outputs={y: buf})[y].torch()
    assert got.data_ptr() == buf.data_ptr() and _seen(fake)[10] == buf.data_ptr()
    np.testing.assert_array_equal(buf.numpy(), (a.double() * 2).float().numpy())
    assert runner.counts == (1, 0)
    wide = torch.full((N, 2), float("nan"))  # strided: not the kernel's to write; the general path copies
    assert runner({x: a}, {y: wide[:, 0]}) is None
    exe.run({x: a}, outputs={y: wide[:, 0]})
    np.testing.assert_array_equal(wide[:, 0].numpy(), (a.double() * 2).float().numpy())


def test_feeds_the_prepared_key_misses_go_to_the_general_path(fake, monkeypatch):
    g, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    a = torch.randn(N)
    other = g.placeholder((N,), sm.float32, name="other")
    for feeds in ({x: a.double()}, {x: a[:N - 1]}, {x: torch.randn(2 * N)[::2]}, {x: a.numpy()}, {},
                  {x: a, other: a}, [(x, a)]):
        assert runner(feeds) is None, feeds  # nothing run, nothing counted
    assert runner.counts == (0, 0) and exe.runs == 1
    with pytest.raises(FeedError, match=r"compiled for \(64,\) float32, got \(64,\) float64"):
        exe.run({x: a.double()})
    with pytest.raises(FeedError, match="needs a feed for placeholder x"):
        exe.run({})
    strided = torch.randn(2 * N)[::2]  # converted (made contiguous) by the general path, then run
    np.testing.assert_array_equal(exe.run({x: strided})[y].numpy(), (strided.double() * 2).float().numpy())
    np.testing.assert_array_equal(exe.run({x: a.numpy()})[y].numpy(), (a.double() * 2).float().numpy())


def test_a_buffer_off_the_compiled_alignment_goes_back_to_the_step(fake, monkeypatch):
    _, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    base = torch.randn(N + 1)
    shifted = base[1:]  # contiguous, 4 bytes past a 16-byte boundary
    assert shifted.data_ptr() % 16
    ex_calls = _var(fake, "ex_calls", ctypes.c_longlong).value
    got = exe.run({x: shifted})[y]
    np.testing.assert_array_equal(got.numpy(), (shifted.double() * 2).float().numpy())
    assert launch.calls == 1 and runner.counts == (0, 1)
    assert _var(fake, "ex_calls", ctypes.c_longlong).value == ex_calls  # the stand-in never saw it
    _, x2, _, _, launch2, runner2 = _setup(fake, monkeypatch, alignment=(False, True))
    runner2({x2: shifted})  # compiled for any alignment of its input: launched here
    assert launch2.calls == 0 and runner2.counts == (1, 0)


def test_an_ex_entry_refused_at_first_hands_over_to_cu_launch_kernel_for_good(fake, monkeypatch):
    _, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    _var(fake, "refuse_ex").value = 1
    plain = _var(fake, "plain_calls", ctypes.c_longlong).value
    a = torch.randn(N)
    np.testing.assert_array_equal(exe.run({x: a})[y].numpy(), (a.double() * 2).float().numpy())
    assert runner.entries() == ("cuLaunchKernel",) and launch.calls == 0
    _var(fake, "refuse_ex").value = 0
    exe.run({x: a})
    assert _var(fake, "plain_calls", ctypes.c_longlong).value == plain + 2 and runner.counts == (2, 0)


def test_a_failing_launch_raises_the_typed_error_and_releases_the_lock(fake, monkeypatch):
    _, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    a = torch.randn(N)
    exe.run({x: a})  # the Ex entry has launched: a later refusal is that launch's failure
    _var(fake, "fail_ex").value = 1
    launch.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(ExecutionError, match=r"multiplication.*failed on inputs \[x: \(64,\).*illegal memory"):
        exe.run({x: a})
    assert launch.calls == 1 and runner.entries() == ("cuLaunchKernelEx",)
    took = []

    def other_thread():
        took.append(exe.run_lock.acquire(timeout=5))
        if took[0]:
            exe.run_lock.release()
    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert took == [True]  # the failed run let go of the graph's run lock
    _var(fake, "fail_ex").value = 0
    launch.error = None
    np.testing.assert_array_equal(exe.run({x: a})[y].numpy(), (a.double() * 2).float().numpy())


def test_without_a_compiler_prepared_runs_stay_in_python_and_say_why(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(native_run, "_module", False)
    monkeypatch.setattr(native_run, "compiler", lambda: (_ for _ in ()).throw(native_run.Unavailable("no C compiler")))
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="stitchml.runtime"):
        assert native_run.module() is None
    assert "no C compiler" in native_run.reason and "stay in Python" in caplog.text
    monkeypatch.setattr(native_run, "_module", False)
    monkeypatch.setattr(native_run.sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    assert native_run.module() is None and "no Python headers" in native_run.reason
    # a runner is asked for and refused: the executable keeps _Prepared, and runs
    g = sm.Graph("plain")
    x = g.placeholder((N,), sm.float32, name="x")
    y = x * 2.0
    exe = g.compile({x: sm.TensorType((N,), sm.float32)}, [y], device="cpu")
    a = torch.randn(N)
    exe.run({x: a})
    exe.steps[0].run = _Launch(types.SimpleNamespace(drv=None), exe.steps[0].run.slots)
    assert native_run.runner(exe, executable._Prepared(exe, exe._template), stream=lambda i: 0) is None
    assert isinstance(executable._prepare(exe), executable._Prepared)


def test_the_native_path_can_be_turned_off(fake, monkeypatch):
    _, x, y, exe, _, _ = _setup(fake, monkeypatch)
    monkeypatch.setenv("STITCHML_NATIVE_RUN", "0")
    assert native_run.runner(exe, executable._Prepared(exe, exe._template), stream=lambda i: 77) is None
    assert native_run.lookup(ExecutableCache(), lambda device: None, None) is None


def test_the_disk_cache_is_keyed_and_safe_between_processes(tmp_path, monkeypatch):
    try:
        cc, version = native_run.compiler()
    except native_run.Unavailable as e:
        pytest.skip(str(e))
    monkeypatch.setenv("STITCHML_CACHE_DIR", str(tmp_path))
    include = native_run.sysconfig.get_paths()["include"]
    with open(native_run.SOURCE) as f:
        source = f.read()
    so = native_run.library_path(source, cc, version, include)
    assert so.startswith(str(tmp_path))
    assert native_run.library_path(source + " ", cc, version, include) != so  # the source is in the key
    assert native_run.library_path(source, cc, version + "x", include) != so  # so are the compiler
    monkeypatch.setattr(native_run, "FLAGS", native_run.FLAGS + ["-g"])
    assert native_run.library_path(source, cc, version, include) != so  # and the flags
    # two processes building the same extension into an empty cache at once: both load a whole library
    script = textwrap.dedent("""
        from stitchml.runtime import native_run
        m = native_run.module()
        assert m is not None, native_run.reason
        print(m.__file__)
    """)
    env = {**os.environ, "STITCHML_CACHE_DIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert {o.strip() for o, _ in outs} == {so}
    assert os.listdir(os.path.dirname(so)) == [os.path.basename(so)]  # no temporaries left behind


def test_runners_and_lookups_are_collected_with_their_graph(fake, monkeypatch):
    g, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    exe.run({x: torch.randn(N)})
    for _ in range(2):  # compiled at once; then `quick` is the native lookup (on the CPU: the stand-in driver
        g.run({x: torch.randn(N)}, [y], device="cpu", compiled=True)  # must not launch a CUDA executable's kernels)
    assert type(g._executables.quick).__name__ == "Lookup"
    # the runner holds the DirectLaunch; the executable and the runner, the cache and its lookup hold each other
    refs = [weakref.ref(o) for o in (g, exe, launch.direct, g._executables)]
    del g, x, y, exe, launch, runner
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_requests_of_another_form_go_to_the_python_lookup():
    g = sm.Graph("forms")
    x = g.placeholder((N,), sm.float32, name="x")
    y = x * 2.0
    a = torch.randn(N)
    g.run({x: a}, [y], device="cpu", compiled=True)
    cache = g._executables
    if type(cache.quick).__name__ != "Lookup":
        pytest.skip(f"no native lookup here: {native_run.reason}")
    for device in (torch.device("cpu"), "cpu", None):
        for _ in range(2):
            hits = cache.fast_hits
            got = g.run({x: a}, [y], device=device, compiled=True)[y]
            np.testing.assert_array_equal(got.numpy(), (a.double() * 2).float().numpy())
        assert cache.fast_hits == hits + 1, device  # the second of each is answered by a lookup


def test_the_launch_entries_can_be_swapped_for_measurements(fake, monkeypatch):
    _, x, y, exe, launch, runner = _setup(fake, monkeypatch)
    ex, plain = runner.launchers()
    assert (ex, plain) == (ctypes.cast(fake.launch_ex, ctypes.c_void_p).value,
                           ctypes.cast(fake.launch, ctypes.c_void_p).value)
    calls = [_var(fake, name, ctypes.c_longlong).value for name in ("ex_calls", "plain_calls")]
    noop = native_run.module().noop_launch()
    runner.set_launchers(noop, noop)  # the host path alone: nothing launched, the run still completes
    assert runner({x: torch.randn(N)})[y].shape == (N,) and runner.counts == (1, 0)
    runner.set_launchers(0, plain)  # no Ex entry: cuLaunchKernel
    a = torch.randn(N)
    np.testing.assert_array_equal(runner({x: a})[y].numpy(), (a.double() * 2).float().numpy())
    assert runner.entries() == ("cuLaunchKernel",)
    assert [_var(fake, name, ctypes.c_longlong).value for name in ("ex_calls", "plain_calls")] == \
        [calls[0], calls[1] + 1]
