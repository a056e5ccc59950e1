"""Launch latency, the CNN training step with and without TF32, and matmul + bias + GeLU(erf).

    python benchmarks/bench_targets.py --json results.json            # the H200 figures (about 90 s)
    python benchmarks/bench_targets.py --explore --json results.json  # plus channels-last and Triton GEMM trials
    python benchmarks/bench_targets.py --device cpu --quick            # a smoke run

Latency: a 4K-element GeLU executable of one kernel; per run, the median wall
time of the call and a synchronisation (`wall`), and the host time per call
when calls go back to back (`per call`), against one eager torch kernel, a
synchronisation alone and the replay of a CUDA graph of one kernel: `exe.run`
(fresh output, and a caller's buffer) through its prepared run in C
(runtime/native_run.py) and through the Python prepared run with its ctypes
launch, `g.run`, the native run through cuLaunchKernel, the output's
allocation (three ways), the runs with their launch stubbed out, and `g.run`'s
lookup, native and Python (its run over the executable's own, launches
stubbed, in alternating rounds). Section `few`: an executable of two steps,
replayed as a CUDA graph (the default) against its steps launched one by one.
Section `package` (not run by default): zoo models (--models, default cnn and
resnet18) at batch 1 through ML pipelines: wall, host and CUDA-event time of a
dispatch, and where one cnn dispatch's host time goes (dispatch_parts.py).
CNN step: 3x3 convolutions 1->32->64, dense 3136->256->10, SGD with momentum,
batch 1024 (bench_distributed.py's model); StitchML with its default (IEEE
float32 products and convolutions) and with `allow_tf32` (with `--explore` also
cuDNN alone, `conv_template="library"`, and cuDNN on channels-last operands),
against PyTorch eager and torch.compile under the same TF32 settings. Matmul: 8192^3
bfloat16 with bias and exact GeLU, against the bare cuBLAS product (timed
together in interleaved rounds; bench_epilogue.py has the whole study).
Every contender's result is checked before it is timed; times are medians of
CUDA-event timings after warm-up.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402
from bench_distributed import TorchCNN, cnn_graph, cnn_weights  # noqa: E402
from bench_epilogue import interleaved, warm_up  # noqa: E402
from stitchml.runtime import native_run  # noqa: E402
from stitchml.runtime.executable import _Prepared  # noqa: E402
from latency_parts import stubbed  # noqa: E402

ROWS: list[dict] = []
OUTPUT: dict = {}  # "path", "device", "failures": where and what `write` puts after every row


def record(section: str, case: str, contender: str, value: float, unit: str, **extra) -> None:
    row = {"section": section, "case": case, "contender": contender, "value": value, "unit": unit, **extra}
    ROWS.append(row)
    if OUTPUT.get("path"):  # after every row: a run stopped by a time limit keeps what it measured
        write(OUTPUT["path"], OUTPUT["device"], OUTPUT["failures"])
    note = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"{section:8} {case:28} {contender:44} {value:10.4g} {unit:3} {note}", flush=True)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def wall_us(fn, dev, n: int, warmup: int = 100) -> float:
    """Median wall microseconds of fn() followed by a synchronisation."""
    for _ in range(warmup):
        fn()
        sync(dev)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync(dev)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def per_call_us(fn, dev, n: int, rounds: int = 5) -> float:
    """Host microseconds per call of back-to-back calls (median of a few rounds of n)."""
    for _ in range(50):
        fn()
    sync(dev)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync(dev)
        times.append((time.perf_counter() - t) / n)
    return statistics.median(times) * 1e6


def paired_us(fn_a, fn_b, dev, n: int, rounds: int = 20) -> tuple[float, float]:
    """Host microseconds per call of two functions, in alternating rounds of n calls, the fastest round of
    each: for a difference of two close figures, which a median of separate runs drowns in noise."""
    best = [math.inf, math.inf]
    for _ in range(rounds):
        for i, fn in enumerate((fn_a, fn_b)):
            sync(dev)
            t = time.perf_counter()
            for _ in range(n):
                fn()
            sync(dev)
            best[i] = min(best[i], (time.perf_counter() - t) / n * 1e6)
    return best[0], best[1]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def set_tf32(matmul: bool, conv: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = conv


# -- launch latency ------------------------------------------------------------------------------------
def latency(dev: torch.device, quick: bool) -> None:
    n = 200 if quick else 3000
    g = sm.Graph("latency")
    x = g.placeholder((-1,), sm.float32, name="x")
    y = 0.5 * x * (1.0 + g.erf(x * (1.0 / math.sqrt(2.0))))
    exe = g.compile({x: sm.TensorType((4096,), sm.float32)}, [y], device=str(dev))
    a = torch.randn(4096, device=dev)
    want = torch.nn.functional.gelu(a.double())
    err = rel_err(exe.run({x: a})[y].torch(), want)
    out = torch.empty_like(a)
    assert exe.run({x: a}, outputs={y: out})[y].torch().data_ptr() == out.data_ptr()
    err = max(err, rel_err(out, want), rel_err(g.run({x: a}, [y], device=str(dev))[y].torch(), want))
    launch = exe.steps[0].run
    big = torch.randn(4097, device=dev)
    shifted = big[1:]  # contiguous, 4 bytes off the 16-byte alignment the kernel was compiled for
    err = max(err, rel_err(exe.run({x: shifted})[y].torch(), torch.nn.functional.gelu(shifted.double())))
    assert err < 1e-6, err
    case = "4K GeLU, one kernel"
    # the prepared run: in C (runtime/native_run.py's Runner) where the extension built, else in Python
    # (_Prepared, the launch through ctypes); both are timed where the first is there
    runner = exe._prepared
    native = type(runner).__name__ == "Runner"
    python_run = _Prepared(exe, exe._template) if exe._prepared is not None else None
    if native:  # the native run's own checks: a feed it does not take goes the general way, typed errors stay
        calls = runner.counts
        err = max(rel_err(exe.run({x: a.cpu()})[y].torch(), want), rel_err(exe.run({x: sm.TensorData(a)})[y].torch(),
                                                                            want))
        assert err < 1e-6 and runner.counts[0] == calls[0] + 1, (err, calls, runner.counts)  # the CPU feed moved
        try:
            exe.run({x: a.double()})
            raise AssertionError("a float64 feed ran")
        except sm.errors.FeedError:
            pass
    record("latency", case, "prepared run", float(native), "", kind="flag", prepared=type(runner).__name__,
           launcher=getattr(launch, "launcher", type(launch).__name__),
           native_reason=native_run.reason, entries=runner.entries() if native else None)
    o2 = torch.empty_like(a)
    contenders = [("synchronize alone", lambda: None),
                  ("torch.erf (one eager kernel)", lambda: torch.erf(a)),
                  ("torch.erf out= (no allocation)", lambda: torch.erf(a, out=o2)),
                  ("exe.run", lambda: exe.run({x: a})),
                  ("exe.run outputs= (caller buffer)", lambda: exe.run({x: a}, outputs={y: out})),
                  ("g.run", lambda: g.run({x: a}, [y], device=str(dev)))]
    if dev.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.erf(a, out=o2)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph):
            torch.erf(a, out=o2)
        contenders.insert(3, ("CUDA graph replay (one kernel)", graph.replay))
    for name, fn in contenders:
        record("latency", case, name, wall_us(fn, dev, n), "us", kind="wall", native=native)
        record("latency", case, name, per_call_us(fn, dev, n // 2), "us", kind="per call", native=native)
    if native:
        record("latency", case, "native runs (launched in C, resumed in Python)", float(runner.counts[0]), "",
               kind="count", resumed=runner.counts[1], entries=runner.entries())
    if native:  # the same runs through the Python prepared run and its ctypes launch
        exe._prepared = python_run
        try:
            assert rel_err(exe.run({x: a})[y].torch(), want) < 1e-6
            for name, fn in (("exe.run, Python prepared run (ctypes launch)", lambda: exe.run({x: a})),
                             ("exe.run outputs=, Python prepared run", lambda: exe.run({x: a}, outputs={y: out}))):
                record("latency", case, name, wall_us(fn, dev, n), "us", kind="wall")
                record("latency", case, name, per_call_us(fn, dev, n // 2), "us", kind="per call")
        finally:
            exe._prepared = runner
        # differences of close figures, in alternating rounds (the fastest round of each)
        mine, theirs = paired_us(lambda: exe.run({x: a}), lambda: torch.erf(a), dev, n // 10)
        record("latency", case, "exe.run / torch.erf, paired", mine / theirs, "x", kind="paired",
               exe_run=round(mine, 2), torch_erf=round(theirs, 2))
        ex, plain = runner.launchers()
        if ex:  # the native run through the eleven-argument cuLaunchKernel
            plain_runner = native_run.runner(exe, python_run)
            plain_runner.set_launchers(0, plain)
            exe._prepared = plain_runner
            try:
                assert rel_err(exe.run({x: a})[y].torch(), want) < 1e-6
            finally:
                exe._prepared = runner
            with_ex, without = paired_us(lambda: runner({x: a}), lambda: plain_runner({x: a}), dev, n // 10)
            record("latency", case, "runner: cuLaunchKernelEx, cuLaunchKernel, paired", with_ex, "us", kind="paired",
                   cu_launch_kernel=round(without, 2))
        saved = native_run.BLOCK_OUTPUTS
        native_run.BLOCK_OUTPUTS = 1  # every output allocated alone
        try:
            single = native_run.runner(exe, python_run)
        finally:
            native_run.BLOCK_OUTPUTS = saved
        blocks, alone = paired_us(lambda: runner({x: a}), lambda: single({x: a}), dev, n // 10)
        record("latency", case, "runner: outputs from blocks, each allocated alone, paired", blocks, "us",
               kind="paired", allocated_alone=round(alone, 2))
        direct_call, through_run = paired_us(lambda: runner({x: a}), lambda: exe.run({x: a}), dev, n // 10)
        record("latency", case, "runner called directly, through exe.run, paired", direct_call, "us", kind="paired",
               through_exe_run=round(through_run, 2))
    assert rel_err(g.run({x: a}, [y], device=str(dev))[y].torch(), want) < 1e-6  # after its lookup's warm-up
    shape, stride, template = (4096,), (1,), torch.empty(0, device=dev)
    record("latency", case, "torch.empty 4K (allocation alone)",
           per_call_us(lambda: torch.empty(shape, dtype=torch.float32, device=dev), dev, n // 2), "us", kind="per call")
    record("latency", case, "new_empty_strided 4K (the prepared run's)",
           per_call_us(lambda: template.new_empty_strided(shape, stride), dev, n // 2), "us", kind="per call")
    record("latency", case, "unbind of 16 x 4K, per tensor (batched allocation)",
           per_call_us(lambda: torch.empty((16, 4096), device=dev).unbind(0), dev, n // 8) / 16, "us", kind="per call")
    # The host work around the launch: the same runs with the launch stubbed out (the native runner launches
    # through an entry that does nothing; the Python one's step does nothing); `g.run`'s lookup is what its
    # run costs over the executable's own.
    with stubbed(exe):
        record("latency", case, "exe.run without its launch", per_call_us(lambda: exe.run({x: a}), dev, n // 2), "us",
               kind="per call", native=native)
        record("latency", case, "exe.run outputs= without its launch",
               per_call_us(lambda: exe.run({x: a}, outputs={y: out}), dev, n // 2), "us", kind="per call")
        if native:
            exe._prepared = python_run
            try:
                record("latency", case, "exe.run without its launch, Python prepared run",
                       per_call_us(lambda: exe.run({x: a}), dev, n // 2), "us", kind="per call")
            finally:
                exe._prepared = runner
    if g._executables is None:  # the graph runs op by op here (the Triton interpreter): no executable to look up
        return
    gexe = next(iter(g._executables.entries.values()))
    cache = g._executables
    with stubbed(gexe):
        own, both = paired_us(lambda: gexe.run({x: a}), lambda: g.run({x: a}, [y], device=str(dev)), dev, n // 4)
        record("latency", case, "g.run lookup alone", both - own, "us", kind="per call",
               g_run_without_launch=round(both, 2), exe_run_without_launch=round(own, 2),
               prepared=type(gexe._prepared).__name__, lookup=type(cache.quick).__name__)
        if "quick" in vars(cache):  # the native lookup: the Python one (ExecutableCache.quick) for comparison
            native_quick = vars(cache).pop("quick")
            try:
                own, both = paired_us(lambda: gexe.run({x: a}), lambda: g.run({x: a}, [y], device=str(dev)), dev,
                                      n // 4)
                record("latency", case, "g.run lookup alone, Python lookup", both - own, "us", kind="per call",
                       g_run_without_launch=round(both, 2), exe_run_without_launch=round(own, 2))
            finally:
                cache.quick = native_quick


def few_steps(dev: torch.device, quick: bool) -> None:
    """An executable of a few steps (64x64 matmul + tanh, then a row softmax): its default on CUDA, the replay
    of a CUDA graph (feeds copied in, results cloned out), against its steps launched by the prepared run."""
    n = 200 if quick else 3000
    g = sm.Graph("few")
    x = g.placeholder((64, 64), sm.float32, name="x")
    y = g.softmax(g.tanh(x @ x), axis=1)
    b = torch.randn(64, 64, device=dev)
    want = torch.softmax(torch.tanh(b.double() @ b.double()), 1)
    for label, capture in (("CUDA-graph replay", True), ("steps launched", False)):
        exe = g.compile({x: sm.TensorType((64, 64), sm.float32)}, [y], device=str(dev))
        if not capture:
            exe._capture_ok = False  # as if capture had failed: the prepared run launches the steps
        for _ in range(2):  # the first run, then a replay or a prepared run
            err = rel_err(exe.run({x: b})[y].torch(), want)
            assert err < 1e-5, (label, err)
        record("latency", f"{len(exe.steps)} steps (matmul+tanh, softmax)", f"exe.run, {label}",
               per_call_us(lambda: exe.run({x: b}), dev, n // 2), "us", kind="per call",
               replay=exe._graph_state is not None, prepared=exe._prepared is not None)


# -- packaged networks through pipelines -----------------------------------------------------------------
def package(dev: torch.device, quick: bool, models: list[str], deadline: float) -> None:
    """Zoo models at batch 1 through an ML pipeline (bench_package.py's stitchml contender): wall per
    dispatch (encode, commit, wait), host time of encode + commit, the bound launch alone, CUDA-event time;
    then where the host time of one cnn dispatch goes (dispatch_parts.py)."""
    import types

    from bench_package import _stitchml
    from stitchml.package import zoo

    args = types.SimpleNamespace(warmup=5 if quick else 20, iters=20 if quick else 200)
    sdev = sm.device(str(dev))
    for name in models:
        if time.perf_counter() > deadline:
            record("package", f"{name} batch 1", "skipped (time)", 0.0, "")
            continue
        model, (example,) = zoo.build(name)
        t0 = time.perf_counter()
        r = _stitchml(sm, model, example[:1], sdev, args)
        assert r["check_max_error"] < 1e-3, (name, r["check_max_error"])
        extra = {k: r[k] for k in ("replayed", "zero_copy", "kernel_count", "check_max_error") if k in r}
        for key in ("wall_us", "encode_commit_us", "encode_commit_back_to_back_us", "launch_us", "cuda_event_us"):
            if key in r:
                record("package", f"{name} batch 1", key, r[key], "us", **extra,
                       setup_s=round(time.perf_counter() - t0, 1))
        if name == "cnn" and dev.type == "cuda":  # before the larger models, which a time limit may cut
            from dispatch_parts import measure

            note, rows = measure("cnn", 1, n=500 if quick else 2000)
            for part, us in rows:
                record("package", "cnn batch 1 dispatch parts", part.strip(), us, "us", note=note)


# -- CNN training step ---------------------------------------------------------------------------------
def cnn(dev: torch.device, quick: bool, explore: bool, with_compile: bool,
        contenders: tuple[str, ...] = ("stitchml", "torch", "jax")) -> None:
    batch = 8 if quick else 1024
    weights = cnn_weights(np.random.default_rng(0))
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(batch, 1, 28, 28, generator=gen).to(dev)
    ys = torch.randint(0, 10, (batch,), generator=gen).to(dev)
    case = f"batch {batch}"
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    reference = None  # the first step's loss in float64 on the CPU
    model = TorchCNN(weights).double()
    reference = torch.nn.functional.cross_entropy(model(xs.cpu().double()), ys.cpu()).item()
    reps = 5 if quick else 30

    # the target's row first: a run stopped by a time limit keeps it (each row is written as it comes)
    variants = [("stitchml allow_tf32", {"allow_tf32": True}), ("stitchml", {})]
    if explore:  # cuDNN alone (no convolution template) and cuDNN on channels-last operands
        variants += [("stitchml allow_tf32 conv_template=library", {"allow_tf32": True, "conv_template": "library"}),
                     ("stitchml conv_template=library", {"conv_template": "library"}),
                     ("stitchml allow_tf32 + conv_channels_last", {"allow_tf32": True, "conv_channels_last": True}),
                     ("stitchml conv_channels_last", {"conv_channels_last": True}),
                     # the pooling gradients without their epilogue (the ReLU's mask) and bias-gradient sum
                     ("stitchml allow_tf32 pool_epilogue=False", {"allow_tf32": True, "pool_epilogue": False})]
    for name, options in variants if "stitchml" in contenders else []:
        try:
            stitchml_cnn(name, options, weights, batch, xs, ys, reference, dev, reps, explore, case)
        except Exception as e:  # noqa: BLE001  (one failing variant must not lose the others' figures)
            record("cnn", case, name, float("nan"), "ms", failed=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if "torch" in contenders:
        torch_cnn(weights, xs, ys, reference, dev, reps, explore, with_compile, case, saved)
    if "jax" in contenders:
        jax_cnn(weights, xs, ys, reference, reps, case)


def stitchml_cnn(name, options, weights, batch, xs, ys, reference, dev, reps, explore, case) -> None:
    """One StitchML variant of the CNN step: its first loss against float64, then its median step time."""
    g, x, y, loss, steps = cnn_graph(weights, batch, None)
    t0 = time.perf_counter()
    exe = g.compile({x: sm.TensorType(tuple(xs.shape), sm.float32), y: sm.TensorType(tuple(ys.shape), sm.int64)},
                    [loss], steps, device=str(dev), options=options)
    feeds = {x: xs, y: ys}
    first = exe.run(feeds)[loss].item()
    err = abs(first - reference) / abs(reference)
    assert err < (1e-2 if options.get("allow_tf32") else 1e-4), (name, first, reference)
    ms = median_ms(lambda: exe.run(feeds), dev, reps)
    launchers = sorted({getattr(s.run, "launcher", None) for s in exe.steps} - {None})
    chosen = {s.name: s.run.chosen for s in exe.steps if getattr(s.run, "chosen", None)}
    # what each candidate of a measured choice took (ms), and why one that failed did
    candidates = {s.name: {k: round(v, 4) for k, v in s.run.timings.items()} |
                  {f"{k} failed": v[:200] for k, v in s.run.failures.items()}
                  for s in exe.steps if getattr(s.run, "chosen", None) and len(s.run.timings) > 1}
    record("cnn", case, name, ms, "ms", loss_rel_err=f"{err:.1e}", kernels=exe.kernel_count,
           replay=exe._graph_state is not None, compile_s=round(time.perf_counter() - t0, 1),
           launchers="|".join(launchers), chosen=chosen, candidates=candidates)
    if explore and dev.type == "cuda" and name in ("stitchml", "stitchml allow_tf32"):
        report = exe.profile({x: xs, y: ys}, repeats=3)
        top = sorted(report.rows, key=lambda r: -r["ms"])[:10]
        print("   slowest steps (ms):", "; ".join(f"{r['step']} {r['ms']:.3f} {chosen.get(r['step']) or ''}".rstrip()
                                                   for r in top), flush=True)
        ROWS.append({"section": "cnn-profile", "case": case, "contender": name,
                     "steps": [{k: r[k] for k in ("step", "kind", "ms")} | {"chosen": chosen.get(r["step"])}
                               for r in report.rows]})


def torch_cnn(weights, xs, ys, reference, dev, reps, explore, with_compile, case, saved) -> None:
    """PyTorch eager and torch.compile's CNN step under each TF32 setting."""
    torch_variants = [("torch eager, IEEE float32", (False, False), "eager", False),
                      ("torch eager, torch's default flags", (False, True), "eager", False),
                      ("torch eager, TF32", (True, True), "eager", False)]
    if explore:
        torch_variants.append(("torch eager, TF32, channels-last", (True, True), "eager", True))
    if with_compile:
        torch_variants += [("torch.compile, IEEE float32", (False, False), "compile", False),
                           ("torch.compile, TF32", (True, True), "compile", False)]
    compiled_forward = None
    for name, flags, mode, channels_last in torch_variants:
        set_tf32(*flags)
        try:
            model = TorchCNN(weights).to(dev)
            images = xs
            if channels_last:
                model = model.to(memory_format=torch.channels_last)
                images = xs.contiguous(memory_format=torch.channels_last)
            if mode == "compile":
                compiled_forward = torch.compile(model)
                forward = compiled_forward
            else:
                forward = model
            opt = torch.optim.SGD(model.parameters(), 0.01, momentum=0.9)

            def step():
                opt.zero_grad(set_to_none=True)
                lo = torch.nn.functional.cross_entropy(forward(images), ys)
                lo.backward()
                opt.step()
                return lo

            first = step().item()
            err = abs(first - reference) / abs(reference)
            t0 = time.perf_counter()
            ms = median_ms(step, dev, reps)
            record("cnn", case, name, ms, "ms", loss_rel_err=f"{err:.1e}", time_s=round(time.perf_counter() - t0, 1))
        finally:
            set_tf32(*saved)


def jax_cnn(weights, xs, ys, reference, reps, case) -> None:
    """jax.jit's CNN step (the same network, weights, data, loss and SGD with momentum) with TF32 and in
    float32: its first loss against float64, then the median wall time of a step to its loss being ready
    (JAX has no CUDA events; the wall time includes its dispatch, tens of µs)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return
    dn = ("NCHW", "OIHW", "NCHW")

    def forward(p, x):
        h = x
        for w, b in (("c1", "b1"), ("c2", "b2")):
            h = jax.lax.conv_general_dilated(h, p[w], (1, 1), "SAME", dimension_numbers=dn) + p[b][None, :, None, None]
            h = jax.lax.reduce_window(jax.nn.relu(h), -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        h = jax.nn.relu(h.reshape(h.shape[0], -1) @ p["d1"] + p["e1"])
        return h @ p["d2"] + p["e2"]

    def loss_of(p, x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(forward(p, x)), y[:, None], axis=1))

    def step(p, m, x, y):  # torch's SGD with momentum: m = 0.9 m + g (m = g at first), p -= 0.01 m
        lo, g = jax.value_and_grad(loss_of)(p, x, y)
        m = jax.tree.map(lambda mi, gi: 0.9 * mi + gi, m, g)
        return jax.tree.map(lambda pi, mi: pi - 0.01 * mi, p, m), m, lo

    x, y = jnp.asarray(xs.cpu().numpy()), jnp.asarray(ys.cpu().numpy())
    for name, precision in (("jax.jit, TF32", "tensorfloat32"), ("jax.jit, IEEE float32", "float32")):
        try:
            with jax.default_matmul_precision(precision):
                jitted = jax.jit(step)
                p = {k: jnp.asarray(v, jnp.float32) for k, v in weights.items()}
                m = jax.tree.map(jnp.zeros_like, p)
                t0 = time.perf_counter()
                p, m, lo = jitted(p, m, x, y)
                err = abs(float(lo) - reference) / abs(reference)
                times = []
                for _ in range(reps + 3):
                    start = time.perf_counter()
                    p, m, lo = jitted(p, m, x, y)
                    lo.block_until_ready()
                    times.append((time.perf_counter() - start) * 1e3)
            record("cnn", case, name, statistics.median(times[3:]), "ms", loss_rel_err=f"{err:.1e}",
                   time_s=round(time.perf_counter() - t0, 1), timing="wall clock")
        except Exception as e:  # noqa: BLE001  (JAX's failure must not lose the other rows)
            record("cnn", case, name, float("nan"), "ms", failed=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")


# -- matmul + bias + GeLU ------------------------------------------------------------------------------
def matmul(dev: torch.device, quick: bool, explore: bool) -> None:
    n = 256 if quick else 8192
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dev, dtype)
    w = (torch.randn(n, n, generator=gen) / math.sqrt(n)).to(dev, dtype)
    bias = torch.randn(n, generator=gen).to(dev, dtype)
    case = f"{n}^3 {str(dtype).replace('torch.', '')}"
    flops = 2 * n ** 3
    reps = 5 if quick else 20
    product = a.float() @ w.float() + bias.float()
    prod = torch.empty_like(a)
    contenders = [("cuBLAS bare product", lambda: torch.matmul(a, w, out=prod), {})]
    for approximate in ("none", "tanh"):
        ref = torch.nn.functional.gelu(product, approximate=approximate)
        g = sm.Graph("mlp")
        x = g.placeholder((n, n), sm.as_dtype(str(dtype).replace("torch.", "")), name="x")
        wt = g.placeholder((n, n), x.dtype, name="w")
        b = g.placeholder((n,), x.dtype, name="b")
        y = g.gelu(x @ wt + b, approximate=approximate)
        feeds = {x: a, wt: w, b: bias}
        exe = g.compile(feeds, [y], device=str(dev))
        err = rel_err(exe.run(feeds)[y].torch(), ref)
        chosen = [getattr(s.run, "chosen", None) for s in exe.steps if s.kind == "matmul"]
        contenders.append((f"stitchml gelu({approximate})", lambda exe=exe, feeds=feeds: exe.run(feeds),
                           {"rel_err": f"{err:.1e}", "chose": chosen}))
    # Timed together in interleaved rounds after warm-up products: timed one after another, each after its
    # compile left the GPU idle, the later contenders ran at other clocks than the bare product
    # (bench_epilogue.py).
    warm_up(dev, a, w, 0.5)
    times = interleaved(contenders, dev, max(reps // 4, 2), 4)
    bare = times[0]
    for (name, _, extra), ms in zip(contenders, times):
        if name == "cuBLAS bare product":
            record("matmul", case, name, ms, "ms", tflops=round(flops / ms / 1e9))
        else:
            record("matmul", case, name, ms, "ms", vs_bare=round(ms / bare, 3), **extra)
    if dev.type != "cuda":
        return
    # cuBLASLt's GELU epilogue: which GeLU does it compute? (on a smaller product, against both forms)
    m = 1024
    p, q, r = a[:m, :m].contiguous(), w[:m, :m].contiguous(), bias[:m].contiguous()
    lt = torch._addmm_activation(r, p, q, use_gelu=True).double()
    pre = (p.double() @ q.double() + r.double())
    e_erf = rel_err(lt, torch.nn.functional.gelu(pre))
    e_tanh = rel_err(lt, torch.nn.functional.gelu(pre, approximate="tanh"))
    dev_erf_tanh = rel_err(torch.nn.functional.gelu(pre, approximate="tanh"), torch.nn.functional.gelu(pre))
    record("matmul", f"{m}^3 bf16", "cuBLASLt GELU epilogue vs erf / vs tanh", e_erf, "err", vs_tanh=f"{e_tanh:.2e}",
           erf_vs_tanh=f"{dev_erf_tanh:.2e}")
    if explore:
        from gemm_trials import persistent_gelu

        ref = torch.nn.functional.gelu(product)
        for config in ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3)):
            try:
                out, fn = persistent_gelu(a, w, bias, *config)
                err = rel_err(out, ref)
                ms = median_ms(fn, dev, reps) if err < 2e-2 else float("nan")
                record("matmul", case, f"triton persistent TMA gelu(erf) {config}", ms, "ms",
                       vs_bare=round(ms / bare, 3), rel_err=f"{err:.1e}")
            except Exception as e:  # noqa: BLE001  (a trial that does not compile is a finding)
                record("matmul", case, f"triton persistent TMA gelu(erf) {config}", float("nan"), "ms",
                       failed=f"{type(e).__name__}: {' '.join(str(e).split())[:160]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    p.add_argument("--explore", action="store_true", help="also the trials: channels-last, Triton persistent GEMM")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--sections", nargs="+", default=["latency", "few", "matmul", "cnn"],
                   help="latency, few, matmul, cnn, package")
    p.add_argument("--models", nargs="+", default=["cnn", "resnet18"], help="zoo models of the package section")
    p.add_argument("--budget", type=float, default=600.0,
                   help="seconds after which the package section skips its remaining models")
    p.add_argument("--cnn-contenders", nargs="+", default=["stitchml", "torch", "jax"],
                   choices=["stitchml", "torch", "jax"], help="who runs the CNN step")
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.init()
    started = time.perf_counter()
    failures = {}
    OUTPUT.update(path=args.json, device=dev, failures=failures)
    for section in args.sections:
        t0 = time.perf_counter()
        try:
            if section == "latency":
                latency(dev, args.quick)
            elif section == "few":
                few_steps(dev, args.quick)
            elif section == "cnn":
                cnn(dev, args.quick, args.explore, not args.no_compile, args.cnn_contenders)
            elif section == "matmul":
                matmul(dev, args.quick, args.explore)
            elif section == "package":
                package(dev, args.quick, args.models, started + args.budget)
        except Exception as e:  # noqa: BLE001  (one failing section must not lose the others' figures)
            failures[section] = f"{type(e).__name__}: {e}"
            print(f"section {section} failed: {failures[section]}", flush=True)
        print(f"-- {section}: {time.perf_counter() - t0:.1f} s", flush=True)
        if args.json:
            write(args.json, dev, failures)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 1 if failures else 0


def write(path: str, dev: torch.device, failures: dict) -> None:
    env = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d")}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    with open(path, "w") as f:
        json.dump({"environment": env, "rows": ROWS, "failures": failures}, f, indent=1, default=str)


if __name__ == "__main__":
    sys.exit(main())
