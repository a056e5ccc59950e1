"""uint16, uint32, uint64 and the float8 types on a device: correctness of every path, and one timing.

    python benchmarks/check_dtypes.py --json dtypes.json          # CUDA: eager and Triton kernels
    python benchmarks/check_dtypes.py --device cpu --quick        # CPU: eager, interpreted Triton, native C++

PyTorch's kernels for these types differ between versions and devices (most ops have none), so this
checks on the machine at hand what the test suite checks on the CPU:

* which ATen ops PyTorch has for each type there (the reference implementations widen where it has none,
  stitchml/ops/widen.py);
* a graph of arithmetic, comparisons, integer division, reductions, top-k and casts on uint16/32/64
  (uint64 values up to 2^64 - 1), op by op and compiled, bit for bit against NumPy;
* float8 casts and arithmetic (computed in float32, rounded back once) against PyTorch on the CPU;
* the time of a fused uint32 hash-like chain, (x * 2654435761 + y) % 1000003 wrapping modulo 2^32, compiled by
  StitchML into one kernel, against PyTorch eager and torch.compile computing it in int64 (what PyTorch
  users write, uint32 having no arithmetic kernels), medians of CUDA-event timings after warm-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from timing import median_ms  # noqa: E402

UNSIGNED = (sm.uint16, sm.uint32, sm.uint64)
PROBES = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "maximum": torch.maximum, "lt": torch.lt,
          "floor_divide": lambda a, b: a // b, "remainder": torch.remainder, "sum": lambda a, b: a.sum(),
          "amax": lambda a, b: a.amax(), "sort": lambda a, b: a.sort()[0], "cat": lambda a, b: torch.cat([a, b]),
          "where": lambda a, b: torch.where(a > b, a, b), "to_float": lambda a, b: a.float()}


def probe(device: str) -> dict:
    out = {}
    for dt in UNSIGNED:
        a = torch.tensor([1, 2, 3], device=device).to(dt.torch)
        ok = []
        for name, fn in PROBES.items():
            try:
                fn(a, a)
                ok.append(name)
            except Exception:  # noqa: BLE001  (no kernel: what this probe records)
                pass
        out[str(dt)] = ok
    return out


def unsigned_graph(dt: sm.DType, n: int, rng: np.random.Generator):
    top = np.iinfo(dt.numpy).max
    a_np = rng.integers(0, top, n, dtype=dt.numpy, endpoint=True)
    b_np = rng.integers(1, top, n, dtype=dt.numpy, endpoint=True)
    b_np[: n // 2] = rng.integers(1, 1000, n // 2, dtype=dt.numpy)
    g = sm.Graph(str(dt))
    a, b = g.placeholder((n,), dt), g.placeholder((n,), dt)
    outs = {"add": a + b, "sub": a - b, "mul": a * b, "max": g.maximum(a, b), "lt": a < b,
            "floordiv": g.floor_division(a, b), "mod": g.modulo(a, b), "sum": g.reduction_sum(a, [0]),
            "rmax": g.reduction_maximum(a, [0]), "float64": g.cast(a, sm.float64), "topk": g.top_k(a, 4, 0)[0],
            "chain": g.modulo(a * b + a, b)}
    with np.errstate(over="ignore"):
        want = {"add": a_np + b_np, "sub": a_np - b_np, "mul": a_np * b_np, "max": np.maximum(a_np, b_np),
                "lt": a_np < b_np, "floordiv": a_np // b_np, "mod": a_np % b_np, "sum": a_np.sum(dtype=dt.numpy),
                "rmax": a_np.max(), "float64": a_np.astype(np.float64), "topk": np.sort(a_np)[::-1][:4],
                "chain": (a_np * b_np + a_np) % b_np}
    return g, {a: a_np, b: b_np}, outs, want


def check_unsigned(device: str, backends: list[str], n: int) -> list[dict]:
    rows, rng = [], np.random.default_rng(0)
    for dt in UNSIGNED:
        g, feeds, outs, want = unsigned_graph(dt, n, rng)
        for mode in ["eager"] + backends:
            try:
                if mode == "eager":
                    got = g.run(feeds, list(outs.values()), device=device)
                else:
                    exe = g.compile(feeds, list(outs.values()), device=device, options={"backend": mode})
                    got = exe.run(feeds)
                wrong = [k for k, t in outs.items() if not np.array_equal(got[t].numpy(), want[k])]
                rows.append({"dtype": str(dt), "mode": mode, "ok": not wrong, "wrong": wrong})
            except Exception as e:  # noqa: BLE001  (reported in the table)
                rows.append({"dtype": str(dt), "mode": mode, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    return rows


def check_float8(device: str, backends: list[str], n: int) -> list[dict]:
    rows, rng = [], np.random.default_rng(1)
    x_np = rng.uniform(-4, 4, n).astype(np.float32)
    for dt in sm.dtypes.FLOAT8:
        g = sm.Graph(str(dt))
        x = g.placeholder((n,), sm.float32)
        x8 = g.cast(x, dt)
        outs = [g.cast(x8, sm.float32), g.cast(x8 * x8 + x8, sm.float32)]
        f = torch.from_numpy(x_np).to(dt.torch).float()
        want = [f, (f * f).to(dt.torch).float().add(f).to(dt.torch).float()]
        for mode in ["eager"] + backends:
            try:
                got = g.run({x: x_np}, outs, device=device) if mode == "eager" else \
                    g.compile({x: x_np}, outs, device=device, options={"backend": mode}).run({x: x_np})
                ok = all(torch.equal(got[o].torch().cpu(), w) for o, w in zip(outs, want))
                rows.append({"dtype": str(dt), "mode": mode, "ok": ok})
            except Exception as e:  # noqa: BLE001
                rows.append({"dtype": str(dt), "mode": mode, "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    return rows


def timed(fn, device: str, reps: int) -> float:
    """Median microseconds of `fn()` after warm-up (CUDA events on a GPU, the wall clock on the CPU)."""
    return median_ms(fn, device, reps) * 1e3


def timing(device: str, backend: str, n: int, reps: int, with_compile: bool) -> dict:
    g = sm.Graph("hash")
    x, y = g.placeholder((n,), sm.uint32), g.placeholder((n,), sm.uint32)
    out = g.modulo(x * 2654435761 + y, 1000003)
    rng = np.random.default_rng(2)
    xs = torch.from_numpy(rng.integers(0, 2**32, n, dtype=np.uint32)).to(device)
    ys = torch.from_numpy(rng.integers(0, 2**32, n, dtype=np.uint32)).to(device)
    feeds = {x: sm.TensorData(xs), y: sm.TensorData(ys)}
    exe = g.compile(feeds, [out], device=device, options={"backend": backend})

    def torch_int64(a, b):
        return ((a.long() * 2654435761 + b.long()) % (2**32) % 1000003).to(torch.uint32)

    want = torch_int64(xs, ys)
    got = exe.run(feeds)[out].torch()
    same = np.array_equal(got.cpu().numpy(), want.cpu().numpy())  # (uint32 may have no == kernel on the GPU)
    result = {"n": n, "ok": bool(same), "kernels": exe.kernel_count,
              "stitchml_us": timed(lambda: exe.run(feeds), device, reps),
              "torch_eager_int64_us": timed(lambda: torch_int64(xs, ys), device, reps)}
    if with_compile:
        compiled = torch.compile(torch_int64)
        result["torch_compile_int64_us"] = timed(lambda: compiled(xs, ys), device, reps)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--json", default="check_dtypes.json")
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    backends = ["triton"] if cuda else ["interpret", "native"]
    n = 64 if args.quick else 4096
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if cuda else "cpu",
              "kernels_in_torch": probe(args.device),
              "unsigned": check_unsigned(args.device, backends, n), "float8": check_float8(args.device, backends, n),
              "timing": timing(args.device, backends[-1], 1 << (12 if args.quick else 24), 5 if args.quick else 50,
                               with_compile=cuda)}
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"torch {report['torch']} on {report['device']}")
    for dt, ops in report["kernels_in_torch"].items():
        print(f"  torch kernels for {dt}: {', '.join(ops) or 'none'}")
    print(f"{'dtype':<16} {'mode':<10} result")
    for r in report["unsigned"] + report["float8"]:
        print(f"{r['dtype']:<16} {r['mode']:<10} {'ok' if r['ok'] else 'FAIL ' + str(r.get('wrong') or r.get('error'))}")
    t = report["timing"]
    print(f"uint32 hash chain, n={t['n']}: stitchml {t['stitchml_us']:.1f} us ({t['kernels']} kernel, "
          f"{'exact' if t['ok'] else 'WRONG'}), torch eager int64 {t['torch_eager_int64_us']:.1f} us"
          + (f", torch.compile int64 {t['torch_compile_int64_us']:.1f} us" if "torch_compile_int64_us" in t else ""))
    print(f"wrote {args.json}")
    return 0 if all(r["ok"] for r in report["unsigned"] + report["float8"]) and t["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
