"""matmul + bias + GeLU: the whole-product epilogue against the slabbed ones (passes/slabs.py).

    python benchmarks/bench_epilogue.py --json results.json      # the H200 figures (about 50 s)
    python benchmarks/bench_epilogue.py --device cpu --quick     # a smoke run

Per case (M x N x K, dtype): the bare cuBLAS product, cuBLAS addmm (bias in its
epilogue) and cuBLASLt's bias+GELU(tanh) epilogue, a copy of the product (the
bytes an epilogue pass moves), the epilogue kernel alone over the whole
product (bias only; GeLU with several launch blocks), StitchML as it compiles
by default (the tanh form: the measured choice, `chose`, and what it measured),
StitchML with each slab layout forced (`epilogue_slabs` bytes, in place,
overlapped on a second stream, other epilogue blocks), with slabs off, and
with the persistent TMA template (option `matmul_tma`) measured or forced,
PyTorch eager and torch.compile, for the erf and the tanh GeLU; then jax.jit.
A row in between runs a slabbed, overlapped, in-place product inside an
executable that replays a CUDA graph, and checks every replay.

Every result is checked against a float32 reference before it is timed. The
GPU's clocks drift under a long run of large products (they climb from idle
after a compile, and sag under sustained load), so after half a second of
products every contender of a case is timed in interleaved rounds: the median
of CUDA-event medians (benchmarks/timing.py) over the rounds. JAX's times are
wall-clock means of back-to-back calls, taken after the others.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402

ROWS: list[dict] = []
MB = 1 << 20
OUTPUT: dict = {}  # "path", "env": where `write` puts the rows after each one (a run stopped early keeps them)


def record(case: str, contender: str, ms: float, bare: float | None, **extra) -> None:
    row = {"case": case, "contender": contender, "ms": ms, **extra}
    if bare:
        row["vs_bare"] = round(ms / bare, 3)
    ROWS.append(row)
    if OUTPUT.get("path"):
        with open(OUTPUT["path"], "w") as f:
            json.dump({"environment": OUTPUT["env"], "rows": ROWS}, f, indent=1, default=str)
    note = " ".join(f"{k}={v}" for k, v in extra.items())
    ratio = f"{ms / bare:6.3f}x" if bare else "       "
    print(f"{case:26} {contender:44} {ms:8.4f} ms {ratio} {note}", flush=True)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def slabs_of(run) -> str:
    """How a step's run computes: the slabbed run's slab count, or the class name (through the measured
    choice and the TF32 wrapper)."""
    while True:
        if getattr(run, "candidates", None) is not None and run.chosen:
            run = run.candidates[run.chosen]
        elif type(run).__name__ == "TF32":
            run = run.fn
        else:
            break
    return f"{len(run.slabs)} slabs" if type(run).__name__ == "Slabs" else type(run).__name__


def block(size: int, warps: int) -> dict:
    """Compile options for the epilogue kernel's launch blocks (every pointwise kernel of the executable)."""
    return {"pointwise_block": size, "pointwise_warps": warps}


def mlp_graph(m: int, n: int, k: int, dtype, approximate: str, tail: bool = False):
    g = sm.Graph("mlp")
    x = g.placeholder((m, k), dtype, name="x")
    w = g.placeholder((k, n), dtype, name="w")
    b = g.placeholder((n,), dtype, name="b")
    y = g.gelu(x @ w + b, approximate=approximate)
    if tail:  # a second kernel: the executable then replays a CUDA graph of its run
        y = g.reduction_sum(y, axes=[1])
    return g, x, w, b, y


def interleaved(contenders: list, dev, reps: int, rounds: int) -> list[float]:
    """Median milliseconds of each contender's fn() over `rounds` rounds, each timing every contender `reps`
    times in turn (CUDA events, two warm-up calls a round), every other round in reverse order: the GPU's
    clocks drift under a long run of large products, also within a round (on an H200 the products timed
    late in a round ran a few per cent slower), and interleaving spreads that drift over all contenders
    alike."""
    samples = [[] for _ in contenders]
    for r in range(rounds):
        order = range(len(contenders)) if r % 2 == 0 else reversed(range(len(contenders)))
        for i in order:
            samples[i].append(median_ms(contenders[i][1], dev, reps, warmup=2))
    return [statistics.median(s) for s in samples]


def warm_up(dev, a: torch.Tensor, w: torch.Tensor, seconds: float) -> None:
    """Products for `seconds`: the clocks reach their loaded state before anything is timed."""
    if dev.type != "cuda":
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            torch.matmul(a, w)
        torch.cuda.synchronize()


def run_case(dev, m: int, n: int, k: int, dtype: torch.dtype, variants: list, reps: int, rounds: int,
             approximations=("none", "tanh"), blocks=((4096, 4),), others: bool = False) -> None:
    """Check every contender, then time them all in interleaved rounds (JAX's rows after them)."""
    name = str(dtype).replace("torch.", "")
    case = f"{m}x{n}x{k} {name}"
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dev, dtype)
    w = (torch.randn(k, n, generator=gen) / k ** 0.5).to(dev, dtype)
    bias = torch.randn(n, generator=gen).to(dev, dtype)
    pre = a.float() @ w.float() + bias.float()
    prod = torch.empty(m, n, device=dev, dtype=dtype)
    contenders = [("cuBLAS bare product", lambda: torch.matmul(a, w, out=prod), {}),
                  ("cuBLAS addmm (bias)", lambda: torch.addmm(bias, a, w, out=prod), {})]
    if dev.type == "cuda":
        lt = torch._addmm_activation(bias, a, w, use_gelu=True)
        contenders.append(("cuBLASLt GELU(tanh) epilogue", lambda: torch._addmm_activation(bias, a, w, use_gelu=True,
                                                                                            out=lt), {}))
    torch.matmul(a, w, out=prod)
    copy = torch.empty_like(prod)
    contenders.append(("copy of the product (the epilogue's bytes)", lambda: copy.copy_(prod), {}))
    smdtype = sm.as_dtype(name)
    keep = []  # executables and buffers the timed functions use
    g = sm.Graph("bias")  # the epilogue's memory traffic and little arithmetic: the bias alone
    p = g.placeholder((m, n), smdtype, name="p")
    bb = g.placeholder((n,), smdtype, name="b")
    y = g.addition(p, bb)
    exe = g.compile({p: prod, bb: bias}, [y], device=str(dev))
    assert rel_err(exe.run({p: prod, bb: bias}, outputs={y: copy})[y].torch(), prod.float() + bias.float()) < 1e-2
    keep.append(exe)
    contenders.append(("epilogue kernel alone, bias only",
                       lambda exe=exe, feeds={p: prod, bb: bias}, y=y: exe.run(feeds, outputs={y: copy}), {}))
    for approximate in approximations:
        ref = torch.nn.functional.gelu(pre, approximate=approximate)
        form = f"gelu({approximate})"
        product = torch.matmul(a, w)
        for block in blocks if approximate == approximations[0] else blocks[:1] + ((1024, 4),):
            # the epilogue kernel alone over the whole product
            g = sm.Graph("epilogue")
            p = g.placeholder((m, n), smdtype, name="p")
            bb = g.placeholder((n,), smdtype, name="b")
            y = g.gelu(p + bb, approximate=approximate)
            exe = g.compile({p: product, bb: bias}, [y], device=str(dev),
                            options={"pointwise_block": block[0], "pointwise_warps": block[1]})
            out = torch.empty_like(product)
            feeds = {p: product, bb: bias}
            err = rel_err(exe.run(feeds, outputs={y: out})[y].torch(), ref)
            keep.append((exe, out))
            contenders.append((f"epilogue kernel alone {form} block {block[0]}x{block[1]}",
                               lambda exe=exe, feeds=feeds, y=y, out=out: exe.run(feeds, outputs={y: out}),
                               {"rel_err": f"{err:.1e}"}))
        g, x, wt, b, y = mlp_graph(m, n, k, smdtype, approximate)
        feeds = {x: a, wt: w, b: bias}
        runs = [("default", {})]
        if approximate == "none":
            runs += variants
        for label, options in runs:
            exe = g.compile(feeds, [y], device=str(dev), options=options)
            err = rel_err(exe.run(feeds)[y].torch(), ref)
            assert err < 2e-2, (case, label, err)
            step = next(s for s in exe.steps if s.kind == "matmul")
            chosen = getattr(step.run, "chosen", None)
            timings = {k_: round(v, 4) for k_, v in getattr(step.run, "timings", {}).items()}
            keep.append(exe)
            contenders.append((f"stitchml {form} {label}", lambda exe=exe, feeds=feeds: exe.run(feeds),
                               {"rel_err": f"{err:.1e}", "runs": slabs_of(step.run),
                                **({"chose": chosen, "measured": timings} if chosen else {})}))
        if others:
            contenders += torch_contenders(approximate, a, w, bias, ref)
    warm_up(dev, a, w, 0.5)
    times = interleaved(contenders, dev, reps, rounds)
    bare = times[0]
    for (label, _, extra), ms in zip(contenders, times):
        record(case, label, ms, bare, **extra)
    if others:
        for approximate in approximations:
            jax_row(case, f"gelu({approximate})", approximate, a, w, bias,
                    torch.nn.functional.gelu(pre, approximate=approximate), bare, reps * rounds)


def torch_contenders(approximate, a, w, bias, ref) -> list:
    """PyTorch eager and torch.compile of the same function, checked."""
    form = f"gelu({approximate})"
    eager = lambda: torch.nn.functional.gelu(a @ w + bias, approximate=approximate)  # noqa: E731
    assert rel_err(eager(), ref) < 2e-2
    found = [(f"torch eager {form}", eager, {})]
    try:
        compiled = torch.compile(lambda p, q, r: torch.nn.functional.gelu(p @ q + r, approximate=approximate))
        err = rel_err(compiled(a, w, bias), ref)
        assert err < 2e-2, err
        found.append((f"torch.compile {form}", lambda: compiled(a, w, bias), {"rel_err": f"{err:.1e}"}))
    except Exception as e:  # noqa: BLE001  (a contender that fails is a finding, not the end of the run)
        record(f"{a.shape[0]}x{w.shape[1]}x{a.shape[1]}", f"torch.compile {form}", float("nan"), None,
               failed=f"{type(e).__name__}: {e}"[:160])
    return found


def jax_row(case, form, approximate, a, w, bias, ref, bare, reps) -> None:
    """jax.jit of the same function where JAX sees a GPU: wall-clock mean of back-to-back calls."""
    if a.device.type != "cuda":
        return
    try:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp

        if jax.default_backend() != "gpu":
            return
        ja, jw, jb = (jax.dlpack.from_dlpack(t.contiguous()) for t in (a, w, bias))
        f = jax.jit(lambda p, q, r: jax.nn.gelu(jnp.matmul(p, q) + r, approximate=approximate == "tanh"))
        out = f(ja, jw, jb).block_until_ready()
        err = rel_err(torch.from_dlpack(out), ref)
        assert err < 2e-2, err
        for _ in range(3):
            f(ja, jw, jb).block_until_ready()
        t = time.perf_counter()
        for _ in range(reps):
            out = f(ja, jw, jb)
        out.block_until_ready()
        record(case, f"jax.jit {form} (wall mean)", (time.perf_counter() - t) / reps * 1e3, bare, rel_err=f"{err:.1e}")
    except Exception as e:  # noqa: BLE001
        record(case, f"jax.jit {form}", float("nan"), None, failed=f"{type(e).__name__}: {e}"[:160])


def captured(dev, m: int, n: int, k: int, dtype: torch.dtype, options: dict) -> None:
    """Slabs overlapped on a second stream inside an executable that replays a CUDA graph: every replay
    checked against the reference with fresh inputs."""
    smdtype = sm.as_dtype(str(dtype).replace("torch.", ""))
    g, x, wt, b, y = mlp_graph(m, n, k, smdtype, "none", tail=True)
    exe = None
    worst = 0.0
    for i in range(4):
        gen = torch.Generator().manual_seed(i)
        a = torch.randn(m, k, generator=gen).to(dev, dtype)
        w = (torch.randn(k, n, generator=gen) / k ** 0.5).to(dev, dtype)
        bias = torch.randn(n, generator=gen).to(dev, dtype)
        feeds = {x: a, wt: w, b: bias}
        if exe is None:
            exe = g.compile(feeds, [y], device=str(dev), options=options)
        ref = torch.nn.functional.gelu(a.float() @ w.float() + bias.float()).sum(1)
        worst = max(worst, rel_err(exe.run(feeds)[y].torch(), ref))
    replay = exe._graph_state is not None
    assert worst < 1e-2, worst
    step = next(s for s in exe.steps if s.kind == "matmul")
    record(f"{m}x{n}x{k} {str(dtype)[6:]}", f"CUDA-graph replay check {options}", float("nan"), None,
           rel_err=f"{worst:.1e}", replay=replay, runs=slabs_of(step.run), capture_error=exe.capture_error)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    p.add_argument("--no-others", action="store_true", help="leave torch eager, torch.compile and JAX out")
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    started = time.perf_counter()
    env = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    OUTPUT.update(path=args.json, env=env)
    reps, rounds = (2, 2) if args.quick else (10, 6)
    others = not args.no_others
    if args.quick:
        shape, slab = (96, 80, 64), 17 * 80 * 4  # six slabs, the last of 11 rows
        dtype = torch.float32
        variants = [("slabs off", {"epilogue_slabs": False}), ("slabs 17 rows", {"epilogue_slabs": slab}),
                    ("slabs 17 rows in place", {"epilogue_slabs": slab, "epilogue_in_place": True}),
                    ("slabs 17 rows block 1024x4", {"epilogue_slabs": slab, **block(1024, 4)})]
        run_case(dev, *shape, dtype, variants, reps, rounds, blocks=((4096, 4), (1024, 4)), others=others)
        captured(dev, *shape, dtype, {"epilogue_slabs": slab, "epilogue_overlap": True, "epilogue_in_place": True})
    else:
        dtype = torch.bfloat16
        off = {"epilogue_slabs": False}
        variants = [("slabs off", off)]
        variants += [(f"slabs off block {b}x{w}", {**off, **block(b, w)}) for b, w in ((2048, 4), (1024, 4), (2048, 8))]
        variants += [("slabs 32 MB", {"epilogue_slabs": 32 * MB})]
        variants += [(f"slabs 32 MB block {b}x{w}", {"epilogue_slabs": 32 * MB, **block(b, w)})
                     for b, w in ((1024, 4), (2048, 8))]
        variants += [("slabs 16 MB block 1024x4", {"epilogue_slabs": 16 * MB, **block(1024, 4)}),
                     ("slabs 32 MB overlapped block 1024x4", {"epilogue_slabs": 32 * MB, "epilogue_overlap": True,
                                                              **block(1024, 4)}),
                     ("slabs 64 MB in place block 1024x4", {"epilogue_slabs": 64 * MB, "epilogue_in_place": True,
                                                            **block(1024, 4)}),
                     ("TMA template in the measured choice", {**off, "matmul_tma": "measure"}),
                     ("TMA template forced", {**off, "matmul_tma": "always"}),
                     ("slabs off (again: the spread)", off)]
        blocks = ((4096, 4), (2048, 4), (1024, 4), (2048, 8), (1024, 8), (512, 4))
        run_case(dev, 8192, 8192, 8192, dtype, variants, reps, rounds, blocks=blocks, others=others)
        captured(dev, 4096, 4096, 1024, dtype, {"epilogue_slabs": 8 * MB, "epilogue_overlap": True,
                                                "epilogue_in_place": True})
        short = [("slabs off", off), ("slabs off block 1024x4", {**off, **block(1024, 4)})]
        run_case(dev, 4096, 4096, 1024, dtype, short, reps, rounds, ("none",), ((4096, 4), (1024, 4)))
        short.append(("slabs 32 MB block 1024x4", {"epilogue_slabs": 32 * MB, **block(1024, 4)}))
        short.append(("TMA template in the measured choice", {**off, "matmul_tma": "measure"}))
        run_case(dev, 8192, 8192, 8192, torch.float16, short, reps, rounds, ("none",), ((4096, 4), (1024, 4)))
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
