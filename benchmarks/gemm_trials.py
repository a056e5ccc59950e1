"""A persistent Triton GEMM with TMA descriptors and the bias + GeLU(erf) epilogue in registers: can a fused
epilogue come within 3 % of the bare cuBLAS product? Warp specialisation, epilogue subtiling and two CTAs per
SM are each switched on and off, beside the compiler's own TMA template (codegen/matmul_tma.py).

    python benchmarks/gemm_trials.py --json trials.json     # the H200 figures (about 65 s)
    python benchmarks/gemm_trials.py --device cpu --quick   # a smoke run (TRITON_INTERPRET=1)

Every contender is checked against a float32 reference of the same bf16/fp16 inputs before it is timed;
then, after half a second of products, the bare cuBLAS product, PyTorch eager and torch.compile, StitchML
(its measured choice, cuBLAS + the epilogue kernel alone, and each TMA configuration forced) and the
hand-written variants are timed in interleaved rounds (medians of CUDA-event medians, benchmarks/timing.py);
jax.jit after them (wall-clock mean). A ragged product (8000 x 8184 x 8120), one through a transposed
weight and one whose operand sits at an odd address are checked, not timed. `persistent_gelu` is also what
bench_targets.py --explore times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
from timing import median_ms  # noqa: E402


@triton.jit
def _epilogue(acc, bias, cols, N, GELU: tl.constexpr, dtype: tl.constexpr):
    # as StitchML's fused epilogue: the product rounded to its dtype, then float32 until one final rounding
    x = acc.to(dtype).to(tl.float32)
    if GELU:
        x = x + tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        x = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    return x.to(dtype)


@triton.jit
def _persistent_gelu(a_desc, b_desc, c_desc, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, GROUP: tl.constexpr, PROGRAMS: tl.constexpr, WS: tl.constexpr,
                     FLATTEN: tl.constexpr, SUBTILE: tl.constexpr, GELU: tl.constexpr):
    start = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    in_group = GROUP * tiles_n
    dtype = c_desc.dtype
    for tile in tl.range(start, tiles_m * tiles_n, PROGRAMS, flatten=FLATTEN, warp_specialize=WS):
        group = tile // in_group
        first_m = group * GROUP
        size_m = min(tiles_m - first_m, GROUP)
        om = (first_m + (tile % size_m)) * BM
        on = ((tile % in_group) // size_m) * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in range(k_tiles):
            acc = tl.dot(a_desc.load([om, kt * BK]), b_desc.load([kt * BK, on]), acc)
        if SUBTILE:  # two halves: the second half's arithmetic overlaps the first half's TMA store
            halves = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
            cols = on + tl.arange(0, BN // 2)
            c_desc.store([om, on], _epilogue(halves[0], bias, cols, N, GELU, dtype))
            c_desc.store([om, on + BN // 2], _epilogue(halves[1], bias, cols + BN // 2, N, GELU, dtype))
        else:
            cols = on + tl.arange(0, BN)
            c_desc.store([om, on], _epilogue(acc, bias, cols, N, GELU, dtype))


@dataclass(frozen=True)
class Config:
    """One variant: tiles, warps, pipeline stages, warp specialisation, flattened tile loop, epilogue in two
    halves, programs per SM, and whether the epilogue is bias + GeLU (False: the bare product)."""

    bm: int = 128
    bn: int = 256
    bk: int = 64
    warps: int = 8
    stages: int = 3
    ws: bool = False
    flatten: bool = True
    subtile: bool = False
    per_sm: int = 1
    gelu: bool = True

    @property
    def label(self) -> str:
        flags = [f for f, on in (("ws", self.ws), ("flat", self.flatten), ("sub", self.subtile)) if on]
        tail = "" if self.gelu else " (product only)"
        return (f"{self.bm}x{self.bn}x{self.bk} w{self.warps} s{self.stages} x{self.per_sm}/SM "
                f"{'+'.join(flags) or 'plain'}{tail}")


def persistent_gelu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, bm: int = 128, bn: int = 256, bk: int = 64,
                    warps: int = 8, stages: int = 3, config: Config | None = None):
    """(gelu(a @ b + bias), a callable that recomputes it into the same buffer)."""
    cfg = config or Config(bm, bn, bk, warps, stages)
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    a_desc = TensorDescriptor.from_tensor(a, [cfg.bm, cfg.bk])
    b_desc = TensorDescriptor.from_tensor(b, [cfg.bk, cfg.bn])
    c_desc = TensorDescriptor.from_tensor(c, [cfg.bm, cfg.bn // 2 if cfg.subtile else cfg.bn])
    programs = min(sms * cfg.per_sm, triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn))

    def run():
        return _persistent_gelu[(programs,)](a_desc, b_desc, c_desc, bias, m, n, k, cfg.bm, cfg.bn, cfg.bk, 8, programs,
                                      cfg.ws, cfg.flatten, cfg.subtile, cfg.gelu, num_warps=cfg.warps,
                                      num_stages=cfg.stages)

    run.kernel = run()  # the compiled kernel: its PTX says whether warps were specialised
    return c, run


# The first call (results/gemm_trials_h200_2026-12-02_first.json) timed warp specialisation on and off: it
# never beat the plain loop, and 128 x 128 tiles of 4 warps failed in Triton 3.6's Hopper pass. What is left
# to try is a second program per SM, whose main loop can run while the other's epilogue computes.
VARIANTS = [
    Config(),  # the best of the first call
    Config(bn=128, warps=4, stages=3, subtile=True, per_sm=2),
    Config(bn=128, warps=4, stages=3, subtile=True, per_sm=2, gelu=False),
    Config(bn=128, warps=4, stages=2, per_sm=2),
    Config(bn=128, bk=32, warps=4, stages=4, subtile=True, per_sm=2),
    Config(bm=64, bn=256, warps=4, stages=2, subtile=True, per_sm=2),
    Config(bm=256, bn=128, warps=8, stages=3, subtile=True),
]
QUICK = [Config(16, 32, 16, 4, 1), Config(16, 32, 16, 4, 1, ws=True, flatten=False, subtile=True)]

ROWS: list[dict] = []
OUT: dict = {}


def record(case: str, name: str, ms: float, bare: float | None, **extra) -> None:
    row = {"case": case, "contender": name, "ms": ms, **extra}
    if bare and ms == ms:
        row["vs_bare"] = round(ms / bare, 3)
    ROWS.append(row)
    if OUT.get("path"):
        with open(OUT["path"], "w") as f:
            json.dump({"environment": OUT["env"], "rows": ROWS}, f, indent=1, default=str)
    ratio = f"{ms / bare:6.3f}x" if bare and ms == ms else "       "
    print(f"{case:24} {name:58} {ms:8.4f} ms {ratio} {' '.join(f'{k}={v}' for k, v in extra.items())}", flush=True)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def kernel_facts(kernel) -> dict:
    """Registers, spills and whether the PTX shows warp specialisation (setmaxnreg moves registers between
    the producer and consumer warps) of a compiled kernel."""
    try:
        ptx = kernel.asm.get("ptx", "")
        warps, shared = kernel.metadata.num_warps, kernel.metadata.shared
        per_warp = -(-kernel.n_regs * 32 // 256) * 256  # registers are allocated per warp in blocks of 256
        fit = min(65536 // (per_warp * warps), 233472 // (shared + 1024))  # an H100/H200 SM's file and memory
        return {"regs": kernel.n_regs, "spills": kernel.n_spills, "shared": shared, "ctas_per_sm": fit,
                "setmaxnreg": "setmaxnreg" in ptx}
    except Exception:  # noqa: BLE001  (the interpreter's launch returns no compiled kernel)
        return {}


def stitchml_path(a, w, bias, dev, options=None, transposed: bool = False):
    """StitchML's compiled gelu(a @ w + bias) (`transposed`: w holds the weight's transpose, read through a
    transpose view), a callable that runs it again, and how its step ran (its measured choice)."""
    import stitchml as sm

    g = sm.Graph("mlp")
    x = g.placeholder(tuple(a.shape), sm.as_dtype(str(a.dtype)[6:]), name="x")
    wt = g.placeholder(tuple(w.shape), sm.as_dtype(str(w.dtype)[6:]), name="w")
    b = g.placeholder(tuple(bias.shape), sm.as_dtype(str(bias.dtype)[6:]), name="b")
    y = g.gelu(x @ (g.transpose(wt, [1, 0]) if transposed else wt) + b)
    feeds = {x: a, wt: w, b: bias}
    exe = g.compile(feeds, [y], device=str(dev), options=options)
    out = exe.run(feeds)[y].torch()
    step = next(s for s in exe.steps if s.kind == "matmul")
    info = {"runs": type(step.run).__name__, "chose": getattr(step.run, "chosen", None),
            "measured": {k: round(v, 4) for k, v in getattr(step.run, "timings", {}).items()},
            "failures": getattr(step.run, "failures", {})}
    return out, (lambda: exe.run(feeds)), {k: v for k, v in info.items() if v}, step


def interleaved(contenders: list, dev, reps: int, rounds: int) -> list[float]:
    """Median over `rounds` rounds of each contender's median of `reps` calls; every other round reversed."""
    samples = [[] for _ in contenders]
    for r in range(rounds):
        for i in range(len(contenders)) if r % 2 == 0 else reversed(range(len(contenders))):
            samples[i].append(median_ms(contenders[i][1], dev, reps, warmup=2))
    return [statistics.median(s) for s in samples]


def tma_options(config) -> dict:
    """Compile options that force the compiler's TMA template with `config` (a matmul_tma.TmaConfig)."""
    import dataclasses

    return {"matmul_tma": "always", "matmul_tma_configs": [dataclasses.asdict(config)]}


def forced(dev) -> list[tuple[str, dict]]:
    """(name, compile options) forcing each TMA configuration a GPU measures; the interpreter's tiles on a CPU."""
    from stitchml.codegen import matmul_tma

    if dev.type != "cuda":
        return [("interpreter tiles", {"matmul_tma": "always"})]
    return [(c.name, tma_options(c)) for c in matmul_tma.CONFIGS]


def compiled_contenders(a, w, bias, ref, dev, force: bool) -> list:
    """StitchML as it compiles by default, with its TMA template off, and (`force`) each TMA configuration."""
    found = []
    runs = [("stitchml default (measured choice)", None), ("stitchml cuBLAS + epilogue kernel", {"matmul_tma": "never"})]
    if force:
        runs += [(f"stitchml {name}", options) for name, options in forced(dev)]
    for label, options in runs:
        try:
            t = time.perf_counter()
            out, fn, info, _ = stitchml_path(a, w, bias, dev, options)
            err = rel_err(out, ref)
            assert err < 1e-2, err
            found.append((label, fn, {"rel_err": f"{err:.1e}", "compile_s": round(time.perf_counter() - t, 1), **info}))
        except Exception as e:  # noqa: BLE001  (a failure is a finding)
            record(f"{a.shape[0]}x{w.shape[1]}x{a.shape[1]}", label, float("nan"), None,
                   failed=f"{type(e).__name__}: {' '.join(str(e).split())}"[:300])
    return found


def torch_contenders(a, w, bias, ref, with_compile: bool) -> list:
    """PyTorch eager (addmm then GeLU; and product, add, GeLU) and torch.compile of the latter, checked."""
    found = [("torch eager gelu(addmm)", lambda: torch.nn.functional.gelu(torch.addmm(bias, a, w)), {}),
             ("torch eager gelu(a @ w + b)", lambda: torch.nn.functional.gelu(a @ w + bias), {})]
    if with_compile:
        try:
            t = time.perf_counter()
            compiled = torch.compile(lambda p, q, r: torch.nn.functional.gelu(p @ q + r))
            compiled(a, w, bias)
            found.append(("torch.compile gelu(a @ w + b)", lambda: compiled(a, w, bias),
                          {"compile_s": round(time.perf_counter() - t, 1)}))
        except Exception as e:  # noqa: BLE001
            record(f"{a.shape[0]}x{w.shape[1]}x{a.shape[1]}", "torch.compile", float("nan"), None,
                   failed=f"{type(e).__name__}: {e}"[:200])
    for _, fn, extra in found:
        extra["rel_err"] = f"{rel_err(fn(), ref):.1e}"
    return found


def case(dev, m: int, n: int, k: int, dtype, variants: list[Config], reps: int, rounds: int, time_it: bool = True,
         others: bool = True, with_compile: bool = False, force: bool = False) -> tuple:
    name = f"{m}x{n}x{k} {str(dtype)[6:]}"
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dev, dtype)
    w = (torch.randn(k, n, generator=gen) / k ** 0.5).to(dev, dtype)
    bias = torch.randn(n, generator=gen).to(dev, dtype)
    product = a.float() @ w.float()
    ref = torch.nn.functional.gelu(product + bias.float())
    prod = torch.empty(m, n, device=dev, dtype=dtype)
    contenders = [("cuBLAS bare product", lambda: torch.matmul(a, w, out=prod), {})]
    if others:
        contenders += torch_contenders(a, w, bias, ref, with_compile)
        contenders += compiled_contenders(a, w, bias, ref, dev, force)
    for cfg in variants:
        try:
            t = time.perf_counter()
            out, fn = persistent_gelu(a, w, bias, config=cfg)
            compile_s = time.perf_counter() - t
            err = rel_err(out, ref if cfg.gelu else product)
            if err > 1e-2:
                record(name, cfg.label, float("nan"), None, rel_err=f"{err:.1e}", failed="wrong result")
                continue
            contenders.append((cfg.label, fn, {"rel_err": f"{err:.1e}", "compile_s": round(compile_s, 1),
                                               **kernel_facts(fn.kernel)}))
        except Exception as e:  # noqa: BLE001  (a variant this GPU or Triton refuses is a finding)
            record(name, cfg.label, float("nan"), None, failed=f"{type(e).__name__}: {' '.join(str(e).split())}"[:240])
    if not time_it:
        for label, _, extra in contenders[1:]:
            record(name, label, float("nan"), None, checked=True, **extra)
        return a, w, bias, ref
    if dev.type == "cuda":
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            for _ in range(10):
                torch.matmul(a, w, out=prod)
            torch.cuda.synchronize()
    times = interleaved(contenders, dev, reps, rounds)
    for (label, _, extra), ms in zip(contenders, times):
        record(name, label, ms, times[0], **extra)
    return a, w, bias, ref, times[0]


def checks(dev, shapes, odd_size: int) -> None:
    """Not timed: each TMA configuration forced on `shapes` ((m, n, k, weight transposed)), and a run whose
    operand is not 16-byte aligned (the template's step runs cuBLAS + the epilogue kernel for it)."""
    import stitchml as sm

    gen = torch.Generator().manual_seed(3)
    for m, n, k, transposed in shapes:
        a = torch.randn(m, k, generator=gen).to(dev, torch.bfloat16)
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(dev, torch.bfloat16)
        bias = torch.randn(n, generator=gen).to(dev, torch.bfloat16)
        ref = torch.nn.functional.gelu(a.float() @ w.float().T + bias.float())
        weight = w if transposed else w.T.contiguous()
        old = stitchml_path(a, weight, bias, dev, {"matmul_tma": "never"}, transposed)[0]
        for name, options in forced(dev):
            label = f"check {m}x{n}x{k}{' w.T' if transposed else ''} {name}"
            try:
                out, _, info, _ = stitchml_path(a, weight, bias, dev, options, transposed)
                record("checks", label, float("nan"), None, rel_err=f"{rel_err(out, ref):.1e}",
                       max_vs_old=float((out.float() - old.float()).abs().max()), **info)
            except Exception as e:  # noqa: BLE001
                record("checks", label, float("nan"), None, failed=f"{type(e).__name__}: {e}"[:300])
    m = n = k = odd_size
    g = sm.Graph("odd")
    x, wt, b = (g.placeholder(s, sm.bfloat16, name=nm) for s, nm in (((m, k), "x"), ((k, n), "w"), ((n,), "b")))
    y = g.gelu(x @ wt + b)
    feeds = {x: torch.randn(m, k, generator=gen).to(dev, torch.bfloat16),
             wt: (torch.randn(k, n, generator=gen) / k ** 0.5).to(dev, torch.bfloat16),
             b: torch.randn(n, generator=gen).to(dev, torch.bfloat16)}
    ref = torch.nn.functional.gelu(feeds[x].float() @ feeds[wt].float() + feeds[b].float())
    exe = g.compile(feeds, [y], device=str(dev), options=forced(dev)[0][1])
    launch = next(s for s in exe.steps if s.kind == "matmul").run
    aligned = exe.run(feeds)[y].torch()
    odd = torch.empty(m * k + 1, device=dev, dtype=torch.bfloat16)[1:].view(m, k)
    odd.copy_(feeds[x])
    shifted = exe.run({**feeds, x: odd})[y].torch()
    record("checks", f"{m}^3 operand at an odd address", float("nan"), None, runs=type(launch).__name__,
           fallbacks=getattr(launch, "fallbacks", None), rel_err=f"{rel_err(shifted, ref):.1e}",
           max_vs_aligned=float((shifted.float() - aligned.float()).abs().max()))


def jax_row(a, w, bias, ref, bare: float, reps: int) -> None:
    """jax.jit of gelu(a @ w + b) where JAX sees a GPU: wall-clock mean of back-to-back calls."""
    try:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        import jax
        import jax.numpy as jnp

        if jax.default_backend() != "gpu":
            return
        ja, jw, jb = (jax.dlpack.from_dlpack(t.contiguous()) for t in (a, w, bias))
        f = jax.jit(lambda p, q, r: jax.nn.gelu(jnp.matmul(p, q) + r, approximate=False))
        err = rel_err(torch.from_dlpack(f(ja, jw, jb).block_until_ready()), ref)
        for _ in range(5):
            f(ja, jw, jb).block_until_ready()
        t = time.perf_counter()
        for _ in range(reps):
            out = f(ja, jw, jb)
        out.block_until_ready()
        record(f"{a.shape[0]}x{w.shape[1]}x{a.shape[1]} {str(a.dtype)[6:]}", "jax.jit gelu(a @ w + b) (wall mean)",
               (time.perf_counter() - t) / reps * 1e3, bare, rel_err=f"{err:.1e}")
    except Exception as e:  # noqa: BLE001
        record("jax", "jax.jit", float("nan"), None, failed=f"{type(e).__name__}: {e}"[:200])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    dev = torch.device(args.device)
    started = time.perf_counter()
    env = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}
    OUT.update(path=args.json, env=env)
    if args.quick:
        case(dev, 40, 72, 48, torch.float16, QUICK, 2, 2, with_compile=True, force=True)
        checks(dev, ((40, 56, 24, False), (32, 48, 40, True)), 32)
    else:
        a, w, bias, ref, bare = case(dev, 8192, 8192, 8192, torch.bfloat16, VARIANTS, 10, 6, with_compile=True,
                                     force=True)
        case(dev, 8192, 8192, 8192, torch.float16, [], 10, 4, force=True)
        case(dev, 4096, 4096, 1024, torch.bfloat16, [], 20, 4)
        checks(dev, ((8000, 8184, 8120, False), (4096, 4096, 4096, True)), 2048)
        jax_row(a, w, bias, ref, bare, 60)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
