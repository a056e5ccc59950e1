"""Tile search for the attention kernels (codegen/attention.py, attention_backward.py): informs GPU_TILES.

    python benchmarks/tune_attention.py --json tune.json           # CUDA, float16, bench_attention's shapes
    python benchmarks/tune_attention.py --device cpu --quick        # the interpreter, tiny shapes

For every shape, causal and not, each candidate launch shape (BLOCK_M, BLOCK_N, warps, stages) of the
forward, dQ and dK/dV kernels is generated straight from the templates, checked against float32 SDPA (O
and the gradients of sum(O * dO)) and timed alone (medians of CUDA events after warm-up). The best of
each kernel, run as a training step would (forward, dQ, dK/dV), is set against SDPA's flash backend;
the table's own tiles are also timed with the probabilities rounded once (`split=False`). On CUDA the
candidates compile first in parallel processes (Triton's disk cache keeps them for the timing process);
past `--budget` seconds what is left is skipped and said so. Results are written after every case.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import os
import statistics
import sys
import time

import torch
import torch.nn.attention  # noqa: F401  (sdpa_kernel, to pin the flash backend)
import torch.nn.functional as F
from timing import median_ms  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from stitchml.codegen import attention, attention_backward  # noqa: E402
from stitchml.codegen.attention import AttentionSpec, Tiles  # noqa: E402
from stitchml.codegen.common import Layout  # noqa: E402
from stitchml.runtime import loader  # noqa: E402

SHAPES = [(4, 16, 1024, 64), (2, 16, 4096, 128), (1, 8, 16384, 64)]
QUICK = [(1, 2, 48, 16)]
T = Tiles
CANDIDATES = {  # (kernel, head ≤ 64) -> launch shapes; causal and not try the same ones
    ("forward", True): [T(128, 64, 4, 3), T(128, 64, 8, 3), T(128, 128, 8, 3), T(64, 64, 4, 3), T(128, 32, 4, 3),
                        T(128, 64, 4, 4)],
    ("forward", False): [T(128, 64, 8, 3), T(128, 32, 8, 3), T(128, 128, 8, 2), T(64, 64, 4, 3), T(128, 64, 4, 3),
                         T(64, 128, 4, 2)],
    ("dq", True): [T(128, 64, 8, 2), T(128, 64, 4, 2), T(64, 64, 4, 3), T(128, 32, 4, 3), T(64, 128, 4, 2),
                   T(128, 128, 8, 2)],
    ("dq", False): [T(128, 64, 8, 2), T(64, 64, 4, 2), T(64, 64, 4, 3), T(128, 32, 8, 2), T(64, 32, 4, 3),
                    T(64, 128, 8, 2)],
    ("dkv", True): [T(64, 128, 8, 2), T(32, 128, 4, 3), T(64, 64, 4, 2), T(64, 128, 4, 2), T(32, 64, 4, 3),
                    T(128, 128, 8, 2)],
    ("dkv", False): [T(64, 128, 8, 2), T(32, 128, 8, 2), T(64, 64, 4, 2), T(32, 64, 4, 3), T(32, 128, 4, 2),
                     T(64, 128, 8, 3)],
}
QUICK_CANDIDATES = [T(16, 16, 4, 1), T(32, 16, 4, 1), T(16, 32, 4, 1)]


def layouts(shape):
    """(Q, Kᵀ as a transposed view of a contiguous K, V, lse, O in float32, dO) layouts of a (B, H, L, d)
    problem."""
    b, h, n, d = shape
    q = Layout.contiguous(shape)
    kt = Layout((b, h, d, n), (h * n * d, n * d, 1, d))
    return [q, kt, q, Layout.contiguous((b, h, n)), q, q]


def kernels(shape, causal: bool, kernel: str, tile: Tiles, split: bool, interpret: bool):
    """The KernelSource of `kernel` for this problem and launch shape."""
    spec = AttentionSpec(1 / math.sqrt(shape[-1]), False, False, causal)
    lays = layouts(shape)
    if kernel == "forward":
        return attention.generate("attention_tune", spec, lays[:3], shape, "float16", interpret, split, lse=True,
                                  tile=tile)
    kv, dq = attention_backward.generate("attention_tune", spec, lays, [shape, shape, shape], "float16", interpret,
                                         split, dkv_tile=tile, dq_tile=tile)
    return kv if kernel == "dkv" else dq


def _warm(job) -> tuple[str, float, str]:
    """Compile one kernel in a worker process (Triton's warmup: no launch), so its binary is in the disk cache."""
    name, source, grid, warps, constexprs, dtypes = job
    began = time.perf_counter()
    try:
        fn = loader.load(name, source)
        args = [torch.empty(16, dtype=getattr(torch, dt), device="cuda") for dt in dtypes]
        fn.warmup(*args, grid=grid, num_warps=warps, **constexprs)
        return source, time.perf_counter() - began, ""
    except Exception as e:  # noqa: BLE001  (a launch shape that does not compile is a finding)
        return source, time.perf_counter() - began, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"


class Problem:
    """Inputs, buffers and float32 references of one (shape, causal) case."""

    def __init__(self, shape, causal: bool, device: str, dtype):
        gen = torch.Generator().manual_seed(0)
        self.shape, self.causal, self.device = shape, causal, device
        self.q, self.k, self.v, self.do = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
                                           for _ in range(4))
        b, h, n, d = shape
        self.out = torch.empty_like(self.q)
        self.o32 = torch.empty(shape, device=device, dtype=torch.float32)  # O before its rounding
        self.lse = torch.empty((b, h, n), device=device, dtype=torch.float32)
        self.delta = torch.empty_like(self.lse)
        self.dq, self.dk, self.dv = (torch.empty_like(self.q) for _ in range(3))
        leaves = [t.float().requires_grad_() for t in (self.q, self.k, self.v)]
        o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        grads = torch.autograd.grad(o, leaves, self.do.float())
        self.want = [o.detach()] + list(grads)

    def args(self, kernel: str) -> list[torch.Tensor]:
        kt = self.k.transpose(-1, -2)
        if kernel == "forward":
            return [self.q, kt, self.v, self.out, self.lse, self.o32]
        return [self.q, kt, self.v, self.lse, self.o32, self.do, self.dq, self.dk, self.dv, self.delta]

    def errors(self, kernel: str) -> dict[str, float]:
        """Largest error of this kernel's results against float32 SDPA, relative to the largest reference."""
        got = {"forward": [("O", self.out, 0)], "dq": [("dQ", self.dq, 1)],
               "dkv": [("dK", self.dk, 2), ("dV", self.dv, 3)]}[kernel]
        return {name: ((t.float() - self.want[i]).abs().max() / self.want[i].abs().max()).item()
                for name, t, i in got}


def launcher(src, problem: Problem, kernel: str):
    fn = loader.load(src.name, src.source)
    grid = tuple(src.grid) + (1,) * (3 - len(src.grid))
    args = problem.args(kernel)
    return lambda: fn[grid](*args, num_warps=src.num_warps, **src.constexprs)


def sdpa(problem, causal: bool, device: str, backward: bool):
    """PyTorch's scaled_dot_product_attention on `problem`'s q, k, v (the flash backend on CUDA), with its
    backward for `problem.do` when `backward`: a contender to time."""
    leaves = [t.detach().clone().requires_grad_(backward) for t in (problem.q, problem.k, problem.v)]

    def run():
        if device == "cuda":
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        else:
            o = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        if backward:
            torch.autograd.grad(o, leaves, problem.do)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget", type=float, default=140.0, help="seconds after which candidates are skipped")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    device = args.device
    interpret = loader.interpreting()
    dtype = torch.float16
    shapes = QUICK if args.quick else SHAPES
    reps = 3 if args.quick else 15
    cases = [(shape, causal) for shape in shapes for causal in (False, True)]

    def candidates(shape, kernel):
        return QUICK_CANDIDATES if args.quick else CANDIDATES[(kernel, shape[-1] <= 64)]

    def table_tile(shape, causal, kernel):
        return candidates(shape, kernel)[0] if args.quick else attention.tiles(kernel, shape[2], shape[2],
                                                                               shape[-1], causal, False)

    plan = []  # (case index, kernel, tile, split, KernelSource)
    for i, (shape, causal) in enumerate(cases):
        for kernel in ("forward", "dq", "dkv"):
            for tile in candidates(shape, kernel):
                plan.append((i, kernel, tile, True, kernels(shape, causal, kernel, tile, True, interpret)))
            plan.append((i, kernel, table_tile(shape, causal, kernel), False,
                         kernels(shape, causal, kernel, table_tile(shape, causal, kernel), False, interpret)))
    pool, futures = None, []
    if device == "cuda" and not interpret:
        workers = max(1, min(15, (os.cpu_count() or 2) - 1))
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        for _, kernel, _, _, src in plan:
            dts = ["float16"] * 3 + (["float16", "float32", "float32"] if kernel == "forward" else
                                     ["float32", "float32", "float16", "float16", "float16", "float16", "float32"])
            futures.append(pool.submit(_warm, (src.name, src.source, tuple(src.grid) + (1,) * (3 - len(src.grid)),
                                               src.num_warps, src.constexprs, dts)))
        print(f"compiling {len(plan)} kernels in {workers} processes", flush=True)
    rows = []
    out = {"environment": {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                           "torch": torch.__version__, "triton": __import__("triton").__version__,
                           "dtype": str(dtype)}, "cases": rows}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    for i, (shape, causal) in enumerate(cases):
        problem = Problem(shape, causal, device, dtype)
        row = {"shape": list(shape), "causal": causal, "candidates": [], "skipped": []}

        row["sdpa_fwd_ms"] = median_ms(sdpa(problem, causal, device, False), device, reps, warmup=2)
        row["sdpa_fwd_bwd_ms"] = median_ms(sdpa(problem, causal, device, True), device, reps, warmup=2)
        best: dict[str, tuple] = {}
        for j, (case, kernel, tile, split, src) in enumerate(plan):
            if case != i:
                continue
            entry = {"kernel": kernel, "tile": list(tile.__dict__.values()), "split": split}
            if time.perf_counter() - began > args.budget:
                row["skipped"].append(entry)
                continue
            if futures:
                try:
                    _, entry["compile_s"], error = futures[j].result()
                except Exception as e:  # noqa: BLE001  (a lost worker: this process compiles it instead)
                    error, entry["warm_error"] = "", f"{type(e).__name__}: {e}"[:200]
                if error:
                    entry["error"] = error
                    row["candidates"].append(entry)
                    continue
            try:
                run = launcher(src, problem, kernel)
                if kernel != "forward":  # the log-sum-exp and O come from the forward, Δ from the dQ kernel
                    for before in ("forward", "dq")[:1 if kernel == "dq" else 2]:
                        launcher(kernels(shape, causal, before, table_tile(shape, causal, before), True, interpret),
                                 problem, before)()
                run()
                entry["errors"] = problem.errors(kernel)
                entry["ms"] = median_ms(run, device, reps, warmup=2)
            except Exception as e:  # noqa: BLE001  (out of shared memory and the like: the candidate is out)
                entry["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            row["candidates"].append(entry)
            if split and "ms" in entry and (kernel not in best or entry["ms"] < best[kernel][0]):
                best[kernel] = (entry["ms"], tile, src)
            if not split and "ms" in entry:
                row[f"one_rounding_{kernel}_ms"] = entry["ms"]
        if len(best) == 3:
            runs = [launcher(best[k][2], problem, k) for k in ("forward", "dq", "dkv")]
            row["best"] = {k: list(best[k][1].__dict__.values()) for k in best}
            row["stitchml_fwd_ms"] = best["forward"][0]
            row["stitchml_fwd_bwd_ms"] = median_ms(lambda: [r() for r in runs], device, reps, warmup=2)
            row["best_errors"] = {**problem.errors("forward"), **problem.errors("dq"), **problem.errors("dkv")}
        rows.append(row)
        save()
        problem = None
        if device == "cuda":
            torch.cuda.empty_cache()
    out["seconds"] = time.perf_counter() - began
    save()
    print(f"attention tiles, {str(dtype).replace('torch.', '')}, {device}; median ms; tile = BLOCK_M, BLOCK_N, "
          "warps, stages; err = max |error| / max |reference| against float32 SDPA")
    for r in rows:
        print(f"{str(tuple(r['shape'])):>20} causal={r['causal']!s:5} SDPA fwd {r['sdpa_fwd_ms']:.4f} "
              f"fwd+bwd {r['sdpa_fwd_bwd_ms']:.4f}" + (f"  skipped {len(r['skipped'])}" if r["skipped"] else ""))
        for c in r["candidates"]:
            what = f"{c['ms']:9.4f}  err " + " ".join(f"{k} {v:.1e}" for k, v in c["errors"].items()) \
                if "ms" in c else c.get("error", "")[:90]
            print(f"    {c['kernel']:>7} {str(tuple(c['tile'])):>18} {'split' if c['split'] else 'once':>5} {what}")
        if "best" in r:
            fb = r["stitchml_fwd_bwd_ms"]
            fwd = r["stitchml_fwd_ms"]
            print(f"    best {r['best']}: fwd {fwd:.4f} ({fwd / r['sdpa_fwd_ms']:.2f}x"
                  f" SDPA), fwd+bwd {fb:.4f} ({fb / r['sdpa_fwd_bwd_ms']:.2f}x SDPA); errors {r['best_errors']}")
            once = [r.get(f"one_rounding_{k}_ms") for k in ("forward", "dq", "dkv")]
            if all(once):
                print(f"    one rounding, table tiles: fwd {once[0]:.4f}, fwd+bwd (sum of kernels) {sum(once):.4f} "
                      f"({sum(once) / r['sdpa_fwd_bwd_ms']:.2f}x SDPA)")
    took = [c["compile_s"] for r in rows for c in r["candidates"] if "compile_s" in c]
    if took:
        print(f"compile: {len(took)} kernels, median {statistics.median(took):.1f} s, longest {max(took):.1f} s")
    print(f"{out['seconds']:.1f} s", flush=True)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
