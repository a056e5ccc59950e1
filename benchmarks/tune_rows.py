"""Short rows on the GPU: softmax and an RMSNorm built from primitives, 8192 x 1024 float32, through the
reduction template at several BLOCK_R x num_warps, against PyTorch eager, torch.compile and jax.jit.

    $ PYTHONPATH=$PWD python benchmarks/tune_rows.py --json rows.json     # needs CUDA
    $ PYTHONPATH=$PWD python benchmarks/tune_rows.py --device cpu --quick  # checks the script runs

Two times per row: "gpu" is the kernel alone (CUDA-graph replays of 20 launches, median / 20), "run" is
`Executable.run` called back to back (host launch included, as bench_compiler times it). Each variant is
checked against float64 first. "% copy" is bytes read + written over time, against a copy of the same
64 MB timed the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from timing import batched_cuda_ms  # noqa: E402

SETTINGS = [(1, 4), (2, 4), (4, 4), (8, 4), (1, 8), (2, 8), (4, 8), (8, 8), (16, 8), (4, 16), (8, 16), (16, 16)]


def gpu_us(fn, launches: int = 20, reps: int = 25) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / launches)
    return statistics.median(times)


def run_us(fn, inner: int = 50, reps: int = 15) -> float:
    return batched_cuda_ms(fn, reps, warmup=5, inner=inner) * 1000


def build(kind: str, rows: int, cols: int):
    g = sm.Graph(kind)
    x = g.placeholder((rows, cols), sm.float32, name="x")
    if kind == "softmax":
        y = g.softmax(x, axis=-1)
        ref = lambda a: torch.softmax(a, -1)  # noqa: E731
    else:
        y = x * g.reverse_square_root(g.reduction_mean(x * x, [1], keep_dims=True) + 1e-6)
        ref = lambda a: a * torch.rsqrt((a * a).mean(-1, keepdim=True) + 1e-6)  # noqa: E731
    return g, x, y, ref


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small rows, two settings (a check that it runs)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows, cols = (64, 128) if args.quick else (8192, 1024)
    settings = SETTINGS[:2] if args.quick else SETTINGS
    cuda = args.device == "cuda"
    if cuda:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    record = []
    for kind in ("softmax", "rmsnorm"):
        g, x, y, ref = build(kind, rows, cols)
        a = torch.randn(rows, cols, device=args.device)
        want = ref(a.double())
        nbytes = 2 * a.numel() * 4
        results = []
        for block_r, warps in [(None, None)] + settings:
            opts = {} if block_r is None else {"reduction_block_r": block_r, "reduction_warps": warps}
            exe = g.compile({x: sm.TensorType((rows, cols), sm.float32)}, [y], device=args.device, options=opts)
            got = exe.run({x: a})[y].torch()
            err = ((got.double() - want).norm() / want.norm()).item()
            name = "default" if block_r is None else f"R{block_r} w{warps}"
            if not err < 1e-5:
                print(f"  {kind} {name}: WRONG rel err {err:.1e}")
                continue
            if not cuda:
                t0 = time.perf_counter()
                exe.run({x: a})
                results.append({"kind": kind, "setting": name, "err": err, "cpu_s": time.perf_counter() - t0})
                continue
            step = exe.steps[0].run
            out = torch.empty_like(a)
            direct = lambda: step.fn[step.grid](a, out, num_warps=step.warps, **step.meta)  # noqa: E731
            results.append({"kind": kind, "setting": name, "err": err, "gpu": gpu_us(direct),
                            "run": run_us(lambda: exe.run({x: a})), "kernels": exe.kernel_count})
        if cuda:
            src, dst = torch.empty_like(a), torch.empty_like(a)
            copy = gpu_us(lambda: dst.copy_(src))
            eager = gpu_us(lambda: ref(a))
            compiled = torch.compile(ref)
            comp = gpu_us(lambda: compiled(a))
            jax_us = None
            try:
                os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
                import jax
                import jax.numpy as jnp

                jf = jax.jit((lambda v: jax.nn.softmax(v, -1)) if kind == "softmax" else
                             (lambda v: v * jax.lax.rsqrt(jnp.mean(v * v, -1, keepdims=True) + 1e-6)))
                va = jnp.asarray(a.cpu().numpy())
                jf(va).block_until_ready()
                ts = []
                for _ in range(20):
                    t0 = time.perf_counter()
                    for _ in range(20):
                        r = jf(va)
                    r.block_until_ready()
                    ts.append((time.perf_counter() - t0) / 20 * 1e6)
                jax_us = statistics.median(ts)
            except Exception as e:  # noqa: BLE001  (JAX is optional)
                print(f"  jax: {type(e).__name__}: {str(e)[:100]}")
            print(f"{kind} {rows}x{cols} fp32: copy {copy:.1f} us; eager {eager:.1f}, torch.compile {comp:.1f}, "
                  f"jax.jit {jax_us if jax_us is None else round(jax_us, 1)} us (wall, back to back)")
            for r in sorted(results, key=lambda r: r["gpu"]):
                print(f"   {r['setting']:<8} gpu {r['gpu']:6.1f} us ({copy / r['gpu']:4.0%} of copy, "
                      f"{nbytes / r['gpu'] / 1e6:5.0f} GB/s)  run {r['run']:6.1f} us  err {r['err']:.0e}")
                r.update(copy=copy, eager=eager, compile=comp, jax=jax_us)
        else:
            print(kind, [(r["setting"], f"{r['err']:.0e}") for r in results])
        record += results
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
