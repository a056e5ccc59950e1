"""A persistent Triton GEMM with TMA descriptors and the bias + GeLU(erf) epilogue in registers: can a fused
epilogue come within 3 % of the bare cuBLAS product? Warp specialisation, epilogue subtiling and two CTAs per
SM are each switched on and off.

    python benchmarks/gemm_trials.py --json trials.json     # the H200 figures (about 60 s)
    python benchmarks/gemm_trials.py --device cpu --quick   # a smoke run (TRITON_INTERPRET=1)

Every variant is checked against a float32 reference of the same bf16/fp16 inputs before it is timed; then,
after half a second of products, the bare cuBLAS product, torch addmm + F.gelu, StitchML's compiled graph and
every variant are timed in interleaved rounds (medians of CUDA-event medians, benchmarks/timing.py).
`persistent_gelu` is also what bench_targets.py --explore times.
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


VARIANTS = [
    Config(),  # the earlier trial's best: no warp specialisation
    Config(gelu=False),
    Config(subtile=True),
    Config(ws=True, flatten=False),
    Config(ws=True, flatten=False, gelu=False),
    Config(ws=True, flatten=False, subtile=True),
    Config(ws=True, flatten=False, subtile=True, stages=4),
    Config(ws=True, flatten=True, subtile=True),
    Config(bn=128, stages=4, ws=True, flatten=False),
    Config(bn=128, warps=4, stages=4, ws=True, flatten=False),
    Config(bn=128, warps=4, stages=3, subtile=True, per_sm=2),
    Config(bn=128, warps=4, stages=2, ws=True, flatten=False, per_sm=2),
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
        return {"regs": kernel.n_regs, "spills": kernel.n_spills, "setmaxnreg": "setmaxnreg" in ptx}
    except Exception:  # noqa: BLE001  (the interpreter's launch returns no compiled kernel)
        return {}


def stitchml_path(a, w, bias, dev):
    """StitchML's compiled matmul + bias + GeLU(erf) (whatever it chooses) and the step's choice."""
    import stitchml as sm

    g = sm.Graph("mlp")
    x = g.placeholder(tuple(a.shape), sm.as_dtype(str(a.dtype)[6:]), name="x")
    wt = g.placeholder(tuple(w.shape), sm.as_dtype(str(w.dtype)[6:]), name="w")
    b = g.placeholder(tuple(bias.shape), sm.as_dtype(str(bias.dtype)[6:]), name="b")
    y = g.gelu(x @ wt + b)
    feeds = {x: a, wt: w, b: bias}
    exe = g.compile(feeds, [y], device=str(dev))
    out = exe.run(feeds)[y].torch()
    step = next(s for s in exe.steps if s.kind == "matmul")
    info = {"chose": getattr(step.run, "chosen", None),
            "measured": {k: round(v, 4) for k, v in getattr(step.run, "timings", {}).items()}}
    return out, (lambda: exe.run(feeds)), info


def interleaved(contenders: list, dev, reps: int, rounds: int) -> list[float]:
    """Median over `rounds` rounds of each contender's median of `reps` calls; every other round reversed."""
    samples = [[] for _ in contenders]
    for r in range(rounds):
        for i in range(len(contenders)) if r % 2 == 0 else reversed(range(len(contenders))):
            samples[i].append(median_ms(contenders[i][1], dev, reps, warmup=2))
    return [statistics.median(s) for s in samples]


def case(dev, m: int, n: int, k: int, dtype, variants: list[Config], reps: int, rounds: int, time_it: bool = True,
         others: bool = True) -> None:
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
        eager = lambda: torch.nn.functional.gelu(torch.addmm(bias, a, w))  # noqa: E731
        contenders.append(("torch addmm + F.gelu (eager)", eager, {"rel_err": f"{rel_err(eager(), ref):.1e}"}))
        try:
            out, fn, info = stitchml_path(a, w, bias, dev)
            err = rel_err(out, ref)
            assert err < 1e-2, err
            contenders.append(("stitchml (today's path)", fn, {"rel_err": f"{err:.1e}", **info}))
        except Exception as e:  # noqa: BLE001  (a failure is a finding)
            record(name, "stitchml (today's path)", float("nan"), None, failed=f"{type(e).__name__}: {e}"[:200])
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
        return
    if dev.type == "cuda":
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            for _ in range(10):
                torch.matmul(a, w, out=prod)
            torch.cuda.synchronize()
    times = interleaved(contenders, dev, reps, rounds)
    for (label, _, extra), ms in zip(contenders, times):
        record(name, label, ms, times[0], **extra)


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
        case(dev, 40, 72, 48, torch.float16, QUICK, 2, 2)
    else:
        best = [VARIANTS[0], VARIANTS[3], VARIANTS[5]]
        case(dev, 8192, 8192, 8192, torch.bfloat16, VARIANTS, 10, 6)
        case(dev, 8192, 8192, 8192, torch.float16, best, 10, 4)
        case(dev, 4096, 4096, 1024, torch.bfloat16, best, 20, 4)
        case(dev, 8000, 8184, 8120, torch.bfloat16, best, 0, 0, time_it=False, others=False)
    print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
