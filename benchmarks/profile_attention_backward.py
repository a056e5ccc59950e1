"""Per-kernel times and errors of the attention backward (codegen/attention_backward.py), launch shapes side by side.

    python benchmarks/profile_attention_backward.py --json profile.json                 # CUDA, float16
    python benchmarks/profile_attention_backward.py --baseline old_backward.py          # and an earlier generator
    python benchmarks/profile_attention_backward.py --device cpu --quick                # the interpreter, tiny

For each shape, causal and not: the forward (its table tiles) runs once; then the dQ kernel and the dK/dV
kernel are each timed alone at every candidate launch shape (BLOCK_M, BLOCK_N, warps, stages), and
their results held against a float64 reference computed head by head: the largest error relative to
the largest reference value, and the share of elements that are not the reference correctly rounded
to float16 (what the float32 work adds to the result's one rounding). `--baseline PATH` also times a
generator module of the same interface from another revision (inputs Q, Kᵀ, V, lse, dO). SDPA's flash
backend is timed forward and forward+backward. Medians of CUDA events after warm-up; kernels compile
first in parallel processes (tune_attention.py's worker).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import math
import multiprocessing
import os
import sys
import time

import torch
from timing import median_ms  # noqa: E402
from tune_attention import _warm, sdpa  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from stitchml.codegen import attention, attention_backward  # noqa: E402
from stitchml.codegen.attention import AttentionSpec, Tiles  # noqa: E402
from stitchml.codegen.common import Layout  # noqa: E402
from stitchml.runtime import loader  # noqa: E402

T = Tiles
SHAPES = [(1, 8, 16384, 64), (2, 16, 4096, 128)]
QUICK = [(1, 2, 48, 16)]
CANDIDATES = {  # (kernel, head ≤ 64) -> launch shapes besides the table's
    ("dq", True): [T(64, 64, 4, 2), T(64, 64, 4, 3), T(128, 32, 4, 3), T(128, 64, 8, 2), T(64, 32, 4, 3),
                   T(128, 64, 4, 2)],
    ("dkv", True): [T(64, 64, 4, 2), T(32, 128, 4, 3), T(64, 128, 8, 2), T(32, 64, 4, 3), T(64, 128, 4, 2),
                    T(32, 128, 4, 4)],
    ("dq", False): [T(64, 32, 4, 3), T(64, 64, 4, 3)],
    ("dkv", False): [],
}
QUICK_CANDIDATES = [T(16, 16, 4, 1), T(32, 16, 4, 1)]


def layouts(shape):
    """(Q, Kᵀ as a transposed view of a contiguous K, V, lse, O in float32, dO) of a (B, H, L, d) problem."""
    b, h, n, d = shape
    q = Layout.contiguous(shape)
    return [q, Layout((b, h, d, n), (h * n * d, n * d, 1, d)), q, Layout.contiguous((b, h, n)), q, q]


class Case:
    """Inputs, buffers and the float64 reference gradients of one (shape, causal) problem."""

    def __init__(self, shape, causal: bool, device: str):
        gen = torch.Generator().manual_seed(0)
        self.shape, self.causal = shape, causal
        self.q, self.k, self.v, self.do = (torch.randn(shape, generator=gen).to(device=device, dtype=torch.float16)
                                           for _ in range(4))
        b, h, n, d = shape
        self.out, self.o32 = torch.empty_like(self.q), torch.empty(shape, device=device, dtype=torch.float32)
        self.lse = torch.empty((b, h, n), device=device, dtype=torch.float32)
        self.delta = torch.empty_like(self.lse)
        self.dq, self.dk, self.dv = (torch.empty_like(self.q) for _ in range(3))
        self.want = [torch.empty(shape, device=device, dtype=torch.float64) for _ in range(3)]
        scale = 1 / math.sqrt(d)
        for i in range(b):
            for j in range(h):  # one head at a time: its L x L float64 matrices
                q, k, v, do = (t[i, j].double() for t in (self.q, self.k, self.v, self.do))
                s = q @ k.T * scale
                if causal:
                    s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=device).triu(1), float("-inf"))
                p = torch.softmax(s, -1)
                ds = p * (do @ v.T - (do * (p @ v)).sum(-1, keepdim=True))
                self.want[0][i, j], self.want[1][i, j], self.want[2][i, j] = ds @ k * scale, ds.T @ q * scale, p.T @ do
                del s, p, ds

    def args(self, kernel: str, baseline: bool = False) -> list[torch.Tensor]:
        kt = self.k.transpose(-1, -2)
        if kernel == "forward":
            return [self.q, kt, self.v, self.out, self.lse, self.o32]
        given = [self.lse] if baseline else [self.lse, self.o32]
        return [self.q, kt, self.v, *given, self.do, self.dq, self.dk, self.dv, self.delta]

    def errors(self, kernel: str) -> dict[str, float]:
        """Per result: max |error| / max |reference|, and the share of elements not correctly rounded."""
        got = [("dQ", self.dq, 0)] if kernel == "dq" else [("dK", self.dk, 1), ("dV", self.dv, 2)]
        found = {}
        for name, t, i in got:
            want = self.want[i]
            found[f"{name}_err"] = ((t.double() - want).abs().max() / want.abs().max()).item()
            found[f"{name}_off"] = (t != want.to(torch.float16)).double().mean().item()
        if kernel == "dq" and self.causal:  # the first query's softmax is one key: its gradient is exactly 0
            found["dQ_row0_zero"] = bool((self.dq[:, :, 0] == 0).all())
        return found


def sources(shape, causal: bool, interpret: bool, quick: bool, baseline):
    """[(kernel, variant, tile, KernelSource)]: the forward, then the dQ and dK/dV candidates."""
    spec = AttentionSpec(1 / math.sqrt(shape[-1]), False, False, causal)
    lays = layouts(shape)
    small = shape[-1] <= 64
    n = shape[2]

    def table(kernel):
        return QUICK_CANDIDATES[0] if quick else attention.tiles(kernel, n, n, shape[-1], causal, False)

    found = [("forward", "table", table("forward"),
              attention.generate("attn_profile", spec, lays[:3], shape, "float16", interpret, lse=True,
                                 tile=table("forward")))]
    for kernel in ("dq", "dkv"):
        tiles = [table(kernel)] + [t for t in (QUICK_CANDIDATES if quick else CANDIDATES[(kernel, small)])
                                   if t != table(kernel)]
        for tile in tiles:
            kv, dq = attention_backward.generate("attn_profile", spec, lays, [shape] * 3, "float16", interpret,
                                                 dkv_tile=tile, dq_tile=tile)
            variant = "table" if tile == table(kernel) else "candidate"
            found.append((kernel, variant, tile, dq if kernel == "dq" else kv))
    if baseline is not None:
        kv, dq = baseline.generate("attn_profile_base", spec, lays[:4] + lays[5:], [shape] * 3, "float16", interpret,
                                   dkv_tile=table("dkv"), dq_tile=table("dq"))
        found += [("dq", "baseline", table("dq"), dq), ("dkv", "baseline", table("dkv"), kv)]
    return found


def launcher(src, case: Case, kernel: str, baseline: bool = False):
    fn = loader.load(src.name, src.source)
    grid = tuple(src.grid) + (1,) * (3 - len(src.grid))
    args = case.args(kernel, baseline)
    return lambda: fn[grid](*args, num_warps=src.num_warps, **src.constexprs)


def show(r: dict) -> None:
    """One case's lines of the table."""
    print(f"{str(tuple(r['shape'])):>20} causal={r['causal']!s:5} SDPA fwd {r['sdpa_fwd_ms']:.3f} fwd+bwd "
          f"{r['sdpa_fwd_bwd_ms']:.3f}")
    for e in r["kernels"]:
        errs = " ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in e.items()
                        if k.startswith("d"))
        what = f"{e['ms']:8.3f}  {errs}" if "ms" in e else e["error"][:100]
        print(f"    {e['kernel']:>7} {e['variant']:>9} {str(tuple(e['tile'])):>17} {what}")
    line = f"    table chain {r['table_fwd_bwd_ms']:.3f} ({r['table_fwd_bwd_ms'] / r['sdpa_fwd_bwd_ms']:.2f}x SDPA)"
    if "baseline_fwd_bwd_ms" in r:
        line += f", baseline chain {r['baseline_fwd_bwd_ms']:.3f} " \
                f"({r['baseline_fwd_bwd_ms'] / r['sdpa_fwd_bwd_ms']:.2f}x)"
    print(line + f", best tiles {r['best']}: sum {r['best_fwd_bwd_ms']:.3f} "
          f"({r['best_fwd_bwd_ms'] / r['sdpa_fwd_bwd_ms']:.2f}x)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--baseline", default=None, help="an attention_backward generator file to time beside")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    device, interpret = args.device, loader.interpreting()
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_backward", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
    shapes = QUICK if args.quick else SHAPES
    reps = 3 if args.quick else 20
    plans = [(shape, causal, sources(shape, causal, interpret, args.quick, baseline))
             for shape in shapes for causal in (False, True)]
    futures = {}
    if device == "cuda" and not interpret:
        pool = concurrent.futures.ProcessPoolExecutor(max(1, min(15, (os.cpu_count() or 2) - 1)),
                                                      mp_context=multiprocessing.get_context("spawn"))
        for _, _, found in plans:
            for kernel, variant, _, src in found:
                dts = ["float16"] * 3 + (["float16", "float32", "float32"] if kernel == "forward" else
                                         ["float32"] + ([] if variant == "baseline" else ["float32"]) +
                                         ["float16"] * 4 + ["float32"])
                grid = tuple(src.grid) + (1,) * (3 - len(src.grid))
                futures[id(src)] = pool.submit(_warm, (src.name, src.source, grid, src.num_warps, src.constexprs, dts))
    print(f"attention backward, float16, {device}; median ms; tile = BLOCK_M, BLOCK_N, warps, stages; err = max "
          "|error| / max |ref|, off = share not correctly rounded (float64 reference)")
    rows = []
    env = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "triton": __import__("triton").__version__}
    for shape, causal, found in plans:
        case = Case(shape, causal, device)
        row = {"shape": list(shape), "causal": causal, "kernels": []}

        row["sdpa_fwd_ms"] = median_ms(sdpa(case, causal, device, False), device, reps)
        row["sdpa_fwd_bwd_ms"] = median_ms(sdpa(case, causal, device, True), device, reps)
        runs = {}
        for kernel, variant, tile, src in found:
            entry = {"kernel": kernel, "variant": variant, "tile": list(tile.__dict__.values())}
            if id(src) in futures:
                error = futures[id(src)].result()[2]
                if error:
                    entry["error"] = error
                    row["kernels"].append(entry)
                    continue
            base = variant == "baseline"
            run = launcher(src, case, kernel, base)
            if kernel == "dkv":  # Δ from the dQ kernel of the same generator
                runs[("dq", base)]()
            run()
            if kernel != "forward":
                entry.update(case.errors(kernel))
            entry["ms"] = median_ms(run, device, reps)
            if variant != "candidate":
                runs[(kernel, base)] = run
            row["kernels"].append(entry)
        timed = [e for e in row["kernels"] if "ms" in e]
        best = {k: min((e for e in timed if e["kernel"] == k and e["variant"] != "baseline"), key=lambda e: e["ms"])
                for k in ("forward", "dq", "dkv")}
        row["best"] = {k: e["tile"] for k, e in best.items()}
        row["best_fwd_bwd_ms"] = sum(e["ms"] for e in best.values())
        row["table_fwd_bwd_ms"] = median_ms(lambda: [runs[(k, False)]() for k in ("forward", "dq", "dkv")],
                                            device, reps)
        if baseline is not None:
            row["baseline_fwd_bwd_ms"] = median_ms(lambda: [runs[("forward", False)](), runs[("dq", True)](),
                                                            runs[("dkv", True)]()], device, reps)
        rows.append(row)
        show(row)
        if args.json:  # after every case: what a time limit cuts short is kept
            with open(args.json, "w") as f:
                json.dump({"environment": env, "cases": rows, "seconds": time.perf_counter() - began}, f, indent=1)
        case = None
        if device == "cuda":
            torch.cuda.empty_cache()
    print(f"{time.perf_counter() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
