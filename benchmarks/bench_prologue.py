"""Prologue fusion: elementwise work before a matrix product, inside the product's kernel or not.

    python benchmarks/bench_prologue.py --json prologue.json       # CUDA: 8192 tokens, bf16 and fp16
    python benchmarks/bench_prologue.py --device cpu --quick       # CPU (Triton's interpreter), small sizes

Two transformer-layer patterns, y = f(x) @ w with x: (tokens, d_in), w: (d_in, d_out):

* layer_norm: f = LayerNorm's apply step, (x - mean) * rstd * gamma + beta, the statistics from a
  reduction kernel over each row (StitchML: the reduction stores mean and rstd, the matmul kernel
  normalises its A tiles as it loads them);
* scale_cast: f(x) = (x * s).to(dtype) for a float32 x and a per-column float32 scale s.

Columns: StitchML as it runs by default (on CUDA the first run measures the fused Triton kernel, with
128 x 128 and 128 x 256 tiles, against the producer kernel + cuBLAS and keeps the fastest: `chosen`, and
each candidate's time in the JSON's `choice_ms`), the fused kernel forced (128 x 128 tiles)
(`options={"prologue": "fused"}`), the separate kernels forced (`"separate"`: the producer's kernel,
then the vendor GEMM), the pass turned off (`False`: the kernels as stitched without it), PyTorch eager, torch.compile and jax.jit of the same formula. Every StitchML
result (and JAX's) is checked against PyTorch in float32 first; the script exits 1 when one is off.
Medians of CUDA-event timings after warm-up (the wall clock on the CPU and for JAX, which waits with
block_until_ready). About a minute on an H200; torch.compile and JAX are left out of the last
configurations if the run passes 60 seconds (the table says so).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the generated kernels run under Triton's interpreter
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with PyTorch here

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402

CONFIGS = [(8192, 1024, 4096, torch.bfloat16), (8192, 4096, 1024, torch.bfloat16), (8192, 1024, 4096, torch.float16)]
QUICK = [(64, 32, 48, torch.bfloat16)]
MODES = {"stitchml": None, "stitchml_fused": "fused", "stitchml_separate": "separate", "stitchml_off": False}
EPS = 1e-5
BUDGET_S = 60.0


def layer_norm(x, gamma, beta, w):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), gamma, beta, EPS) @ w


def scale_cast(x, s, w):
    return (x * s).to(w.dtype) @ w


def inputs(case: str, tokens: int, d_in: int, d_out: int, dtype, device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(d_in, d_out, generator=gen) / d_in ** 0.5).to(device=device, dtype=dtype)
    if case == "layer_norm":
        x = (torch.randn(tokens, d_in, generator=gen) * 3 + 1).to(device=device, dtype=dtype)
        gamma = (1 + 0.1 * torch.randn(d_in, generator=gen)).to(device=device, dtype=dtype)
        beta = (0.1 * torch.randn(d_in, generator=gen)).to(device=device, dtype=dtype)
        return [x, gamma, beta, w]
    x = torch.randn(tokens, d_in, generator=gen).to(device)
    s = torch.rand(d_in, generator=gen).to(device) + 0.5
    return [x, s, w]


def stitch(case: str, args: list[torch.Tensor], device: str, mode: str | None):
    """(executable, feeds, output) of the formula built from primitives."""
    g = sm.Graph(case)
    ps = [g.placeholder(tuple(a.shape), sm.as_dtype(a.dtype), name=f"in{i}") for i, a in enumerate(args)]
    if case == "layer_norm":
        x, gamma, beta, w = ps
        y = g.layer_normalization(x, -1, gamma, beta, EPS) @ w
    else:
        x, s, w = ps
        y = g.cast(x * s, w.dtype) @ w
    options = {} if mode is None else {"prologue": mode}
    feeds = dict(zip(ps, args))
    return g.compile(feeds, [y], device=device, options=options), feeds, y


def jax_runner(case: str, args: list[torch.Tensor]):
    """(a zero-argument function that runs the jitted formula and waits, its result as a torch tensor) or None."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    try:
        jargs = [jax.dlpack.from_dlpack(a.contiguous()) for a in args]
    except Exception:  # noqa: BLE001 - a JAX without this device or dtype: no JAX column
        return None

    def ln(x, gamma, beta, w):
        xf = x.astype(jnp.float32)
        mean = xf.mean(-1, keepdims=True)
        var = ((xf - mean) ** 2).mean(-1, keepdims=True)
        h = ((xf - mean) * jax.lax.rsqrt(var + EPS) * gamma.astype(jnp.float32) + beta.astype(jnp.float32))
        return h.astype(x.dtype) @ w

    def sc(x, s, w):
        return (x * s).astype(w.dtype) @ w

    fn = jax.jit(ln if case == "layer_norm" else sc)
    out = jax.block_until_ready(fn(*jargs))
    return (lambda: jax.block_until_ready(fn(*jargs))), torch.from_dlpack(out)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest difference relative to the largest reference value."""
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    device = args.device
    cuda = device == "cuda"
    configs = QUICK if args.quick else CONFIGS
    reps = 3 if args.quick else 20
    start = time.perf_counter()
    compiled = {name: torch.compile(fn) for name, fn in (("layer_norm", layer_norm), ("scale_cast", scale_cast))} \
        if cuda else {}
    rows, ok = [], True
    for tokens, d_in, d_out, dtype in configs:
        for case in ("layer_norm", "scale_cast"):
            data = inputs(case, tokens, d_in, d_out, dtype, device)
            fn = layer_norm if case == "layer_norm" else scale_cast
            want = fn(*[a.float() for a in data])
            tol = 2e-2 if dtype == torch.bfloat16 else 4e-3  # one rounding of the operand and of the result
            row = {"case": case, "tokens": tokens, "d_in": d_in, "d_out": d_out,
                   "dtype": str(dtype).replace("torch.", ""), "flop": 2 * tokens * d_in * d_out}
            for column, mode in MODES.items():
                exe, feeds, y = stitch(case, data, device, mode)
                got = exe.run(feeds)[y].torch()
                row[f"{column}_error"] = _error(got, want)
                ok &= row[f"{column}_error"] <= tol
                row[f"{column}_ms"] = median_ms(lambda: exe.run(feeds), device, reps)
                matmul = next(s for s in exe.steps if s.kind == "matmul")
                row[f"{column}_steps"] = sum(1 for s in exe.steps if s.kind != "view")
                if mode is None:
                    row["chosen"] = getattr(matmul.run, "chosen", None) or "fused (one kernel)"
                    row["choice_ms"] = getattr(matmul.run, "timings", {})
                    row["fused"] = "prologue: " in exe.fusion_report()
                exe = feeds = None
                if cuda:
                    torch.cuda.empty_cache()
            row["eager_error"] = _error(fn(*data), want)
            row["torch_eager_ms"] = median_ms(lambda: fn(*data), device, reps)
            late = time.perf_counter() - start > BUDGET_S
            if compiled and not late:
                row["torch_compile_error"] = _error(compiled[case](*data), want)
                row["torch_compile_ms"] = median_ms(lambda: compiled[case](*data), device, reps)
            runner = jax_runner(case, data) if cuda and not late else None
            if runner is not None:
                run, out = runner
                row["jax_error"] = _error(out, want)
                ok &= row["jax_error"] <= tol
                row["jax_ms"] = median_ms(run, "cpu", reps)
            if late:
                row["note"] = "torch.compile and JAX left out: past the time budget"
            rows.append(row)
    print(f"prologue fusion, {device}; median ms (TFLOP/s of the fused kernel)")
    cols = ["stitchml_ms", "stitchml_fused_ms", "stitchml_separate_ms", "stitchml_off_ms", "torch_eager_ms", "torch_compile_ms", "jax_ms"]
    print(f"{'case':>10} {'shape':>18} {'dtype':>8} " + " ".join(f"{c[:-3][:17]:>17}" for c in cols)
          + "  chosen")
    for r in rows:
        cells = " ".join(f"{r[c]:17.4f}" if c in r else f"{'-':>17}" for c in cols)
        shape = f"{r['tokens']}x{r['d_in']}x{r['d_out']}"
        tflops = r["flop"] / r["stitchml_fused_ms"] / 1e9
        print(f"{r['case']:>10} {shape:>18} {r['dtype']:>8} {cells}  {r['chosen']} ({tflops:.0f})")
    late = [f"{r['case']} {r['tokens']}x{r['d_in']}x{r['d_out']} {r['dtype']}" for r in rows if "note" in r]
    if late:
        print("torch.compile and JAX left out (past the time budget): " + "; ".join(late))
    print("results " + ("agree" if ok else "DISAGREE") + " with PyTorch in float32 "
          f"(largest errors: {max(v for r in rows for k, v in r.items() if k.endswith('_error')):.2e})")
    if args.json:
        env = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "seconds": time.perf_counter() - start}
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": rows, "correct": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
