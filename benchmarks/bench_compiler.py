"""StitchML's compiled executables side by side with PyTorch eager, torch.compile and JAX.

Run on a CUDA machine:  python benchmarks/bench_compiler.py [--cases gelu,softmax,...] [--json out.json]

Every case first checks StitchML's result against a float64 PyTorch reference,
then times each contender: CUDA-event medians after warm-up for StitchML,
PyTorch eager and torch.compile; for JAX (its own streams) the wall-clock
median of `block_until_ready` calls. Bandwidth is reported as a percentage of
a measured device-to-device copy (bytes read + written).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # let JAX and torch share the GPU

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from timing import batched_cuda_ms  # noqa: E402

DEV = "cuda"
ROWS: list[dict] = []


def cuda_time(fn, warmup: int = 5, reps: int = 30) -> float:
    """Median milliseconds per call of `fn()`, between CUDA events, over batches of back-to-back calls."""
    return batched_cuda_ms(fn, reps, warmup)


def host_time(fn, warmup: int = 5, reps: int = 30) -> float:
    """Median wall-clock milliseconds of a blocking `fn()`."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def reps_for(ms_estimate: float) -> int:
    return max(10, min(200, int(200 / max(ms_estimate, 0.01))))


def copy_bandwidth() -> float:
    """Bytes/s of a large device-to-device copy, counting read + write."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = cuda_time(lambda: b.copy_(a), 3, 20)
    return 2 * n / (ms / 1e3)


def record(case, size, who, ms, bytes_moved=None, flops=None, bw=None, check=None, note=""):
    row = {"case": case, "size": size, "who": who, "ms": ms}
    if bytes_moved and bw:
        row["pct_copy_bw"] = 100 * bytes_moved / (ms / 1e3) / bw
    if flops:
        row["tflops"] = flops / (ms / 1e3) / 1e12
    if check is not None:
        row["rel_err"] = check
    if note:
        row["note"] = note
    ROWS.append(row)
    extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                     if k not in ("case", "size", "who", "ms"))
    print(f"{case:<14} {size:<22} {who:<14} {ms:10.4f} ms  {extra}", flush=True)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def try_jax():
    try:
        import jax
        import jax.numpy as jnp

        return jax, jnp
    except Exception as e:  # noqa: BLE001
        print("jax unavailable:", e)
        return None, None


# -- GeLU from primitives ------------------------------------------------------------------
def gelu_graph(dtype):
    g = sm.Graph("gelu")
    x = g.placeholder((-1,), dtype, name="x")
    y = 0.5 * x * (1.0 + g.erf(x * g.reciprocal(g.square_root(g.constant(2.0, dtype)))))
    return g, x, y


def torch_gelu_ops(x):
    return 0.5 * x * (1.0 + torch.erf(x * torch.reciprocal(torch.sqrt(torch.tensor(2.0, dtype=x.dtype, device=x.device)))))


def case_gelu(bw, sizes=(4096, 1 << 20, 1 << 28)):
    jax, jnp = try_jax()
    for dtype, tdt in ((sm.float32, torch.float32), (sm.bfloat16, torch.bfloat16)):
        g, x, y = gelu_graph(dtype)
        for n in sizes:
            a = torch.randn(n, device=DEV, dtype=tdt)
            exe = g.compile({x: sm.TensorType((n,), dtype)}, [y], device=DEV)
            out = exe.run({x: a})[y].torch()
            err = rel_err(out, torch.nn.functional.gelu(a.double()))
            nbytes = 2 * n * a.element_size()
            size = f"{n} {dtype.name}"
            est = nbytes / bw * 1e3
            r = reps_for(est)
            record("gelu", size, "stitchml", cuda_time(lambda: exe.run({x: a}), reps=r), nbytes, bw=bw, check=err,
                   note=f"{exe.kernel_count} kernel")
            record("gelu", size, "torch-eager", cuda_time(lambda: torch_gelu_ops(a), reps=r), nbytes, bw=bw)
            comp = torch.compile(torch_gelu_ops)
            comp(a)
            record("gelu", size, "torch.compile", cuda_time(lambda: comp(a), reps=r), nbytes, bw=bw)
            if jax is not None:
                jf = jax.jit(lambda v: 0.5 * v * (1.0 + jax.scipy.special.erf(v * (1 / jnp.sqrt(jnp.asarray(2.0, v.dtype))))))
                ja = jnp.asarray(a.float().cpu().numpy()).astype(jnp.bfloat16 if tdt == torch.bfloat16 else jnp.float32)
                jf(ja).block_until_ready()
                record("gelu", size, "jax.jit", host_time(lambda: jf(ja).block_until_ready(), reps=r), nbytes, bw=bw)
            del a, out


# -- 4K executable latency -------------------------------------------------------------------
def case_latency(bw):
    g, x, y = gelu_graph(sm.float32)
    n = 4096
    a = torch.randn(n, device=DEV)
    exe = g.compile({x: sm.TensorType((n,), sm.float32)}, [y], device=DEV)
    exe.run({x: a})
    host = host_time(lambda: exe.run({x: a}), 20, 2000)
    torch.cuda.synchronize()
    record("latency-4K", "host us/run", "stitchml", host, note="wall clock per run, launch included (ms)")
    record("latency-4K", "host us/run", "torch-eager", host_time(lambda: torch_gelu_ops(a), 20, 2000))
    comp = torch.compile(torch_gelu_ops)
    comp(a)
    record("latency-4K", "host us/run", "torch.compile", host_time(lambda: comp(a), 20, 2000))
    torch.cuda.synchronize()


# -- softmax and layer norm -------------------------------------------------------------------
def case_rows(bw, widths=(1024, 8192, 65536), rows=8192):
    jax, jnp = try_jax()
    for kind in ("softmax", "layernorm"):
        for c in widths:
            g = sm.Graph(kind)
            x = g.placeholder((rows, c), sm.float32, name="x")
            y = g.softmax(x, axis=-1) if kind == "softmax" else g.layer_normalization(x, -1, epsilon=1e-5)
            a = torch.randn(rows, c, device=DEV)
            exe = g.compile({x: sm.TensorType((rows, c), sm.float32)}, [y], device=DEV)
            out = exe.run({x: a})[y].torch()
            ref = torch.softmax(a.double(), -1) if kind == "softmax" else torch.nn.functional.layer_norm(a.double(), (c,))
            nbytes = 2 * a.numel() * 4
            size = f"{rows}x{c}"
            r = reps_for(nbytes / bw * 1e3)
            record(kind, size, "stitchml", cuda_time(lambda: exe.run({x: a}), reps=r), nbytes, bw=bw,
                   check=rel_err(out, ref), note=f"{exe.kernel_count} kernel")

            def eager(v=a):
                if kind == "softmax":
                    m = v.amax(-1, keepdim=True)
                    e = torch.exp(v - m)
                    return e / e.sum(-1, keepdim=True)
                mu = v.mean(-1, keepdim=True)
                d = v - mu
                return d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5)

            record(kind, size, "torch-eager", cuda_time(eager, reps=r), nbytes, bw=bw, note="op by op")
            fused = (lambda: torch.softmax(a, -1)) if kind == "softmax" else (lambda: torch.nn.functional.layer_norm(a, (c,)))
            record(kind, size, "torch-fused", cuda_time(fused, reps=r), nbytes, bw=bw, note="torch's own kernel")
            comp = torch.compile(eager)
            comp(a)
            record(kind, size, "torch.compile", cuda_time(lambda: comp(a), reps=r), nbytes, bw=bw)
            if jax is not None:
                if kind == "softmax":
                    jf = jax.jit(lambda v: jax.nn.softmax(v, axis=-1))
                else:
                    jf = jax.jit(lambda v: (v - v.mean(-1, keepdims=True)) * jax.lax.rsqrt(v.var(-1, keepdims=True) + 1e-5))
                ja = jnp.asarray(a.cpu().numpy())
                jf(ja).block_until_ready()
                record(kind, size, "jax.jit", host_time(lambda: jf(ja).block_until_ready(), reps=r), nbytes, bw=bw)
            del a, out


# -- matmul + bias + GeLU -----------------------------------------------------------------------
def case_matmul(bw, n=8192):
    a = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    wt = torch.randn(n, n, device=DEV, dtype=torch.bfloat16) / math.sqrt(n)
    bt = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    flops = 2 * n ** 3
    size = f"{n}^3 bf16"
    record("matmul+gelu", size, "cublas-bare", cuda_time(lambda: a @ wt, 3, 20), flops=flops, note="the matmul alone")
    for approximate in ("none", "tanh"):
        g = sm.Graph("mlp")
        x = g.placeholder((n, n), sm.bfloat16, name="x")
        w = g.placeholder((n, n), sm.bfloat16, name="w")
        b = g.placeholder((n,), sm.bfloat16, name="b")
        y = g.gelu(x @ w + b, approximate=approximate)
        feeds = {x: a, w: wt, b: bt}
        exe = g.compile(feeds, [y], device=DEV)
        out = exe.run(feeds)[y].torch()
        ref = torch.nn.functional.gelu(a.float() @ wt.float() + bt.float(), approximate=approximate)
        chosen = [getattr(s.run, "chosen", None) for s in exe.steps if s.kind == "matmul"]
        record("matmul+gelu", f"{size} gelu={approximate}", "stitchml", cuda_time(lambda: exe.run(feeds), 3, 20),
               flops=flops, check=rel_err(out, ref), note=f"{exe.kernel_count} kernel, chose {chosen}")
        record("matmul+gelu", f"{size} gelu={approximate}", "torch-eager",
               cuda_time(lambda: torch.nn.functional.gelu(a @ wt + bt, approximate=approximate), 3, 20), flops=flops)
        comp = torch.compile(lambda p, q, r: torch.nn.functional.gelu(p @ q + r, approximate=approximate))
        comp(a, wt, bt)
        record("matmul+gelu", f"{size} gelu={approximate}", "torch.compile", cuda_time(lambda: comp(a, wt, bt), 3, 20),
               flops=flops)


# -- MNIST CNN training step ------------------------------------------------------------------
def mnist_params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = {"w1": (32, 1, 5, 5), "b1": (32, 1, 1), "w2": (64, 32, 5, 5), "b2": (64, 1, 1),
              "w3": (3136, 1024), "b3": (1024,), "w4": (1024, 10), "b4": (10,)}
    out = {}
    for k, s in shapes.items():
        fan_in = int(np.prod(s[1:])) if k.startswith("w") and len(s) == 4 else s[0]
        out[k] = (torch.randn(s, generator=gen) / math.sqrt(fan_in)) if k.startswith("w") else torch.zeros(s)
    return out


def mnist_stitchml(params, batch, lr=0.05):
    g = sm.Graph("mnist")
    x = g.placeholder((-1, 1, 28, 28), sm.float32, name="images")
    y = g.placeholder((-1,), sm.int64, name="labels")
    v = {k: g.variable(p.numpy(), name=k) for k, p in params.items()}
    same = sm.Convolution2DDescriptor(padding="same")
    pool = sm.Pooling2DDescriptor(2)
    h = g.max_pooling2d(g.relu(g.convolution2d(x, v["w1"], same) + v["b1"]), pool)
    h = g.max_pooling2d(g.relu(g.convolution2d(h, v["w2"], same) + v["b2"]), pool)
    h = g.relu(g.reshape(h, (-1, 3136)) @ v["w3"] + v["b3"])
    loss = g.softmax_cross_entropy(h @ v["w4"] + v["b4"], y, reduction="mean")
    grads = g.gradients(loss, list(v.values()))
    ups = [g.assign_variable(t, t - lr * grads[t]) for t in v.values()]
    return g, x, y, loss, ups


def mnist_torch(params):
    p = {k: t.to(DEV).clone().requires_grad_(True) for k, t in params.items()}

    def forward(img, lab):
        h = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(img, p["w1"], padding=2) + p["b1"]), 2)
        h = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(h, p["w2"], padding=2) + p["b2"]), 2)
        h = torch.relu(h.reshape(-1, 3136) @ p["w3"] + p["b3"])
        return torch.nn.functional.cross_entropy(h @ p["w4"] + p["b4"], lab)

    opt = torch.optim.SGD(p.values(), lr=0.05)
    return p, forward, opt


def case_mnist(bw, batches=(128, 1024)):
    jax, jnp = try_jax()
    params = mnist_params()
    for batch in batches:
        img = torch.randn(batch, 1, 28, 28, device=DEV)
        lab = torch.randint(0, 10, (batch,), device=DEV)
        g, x, y, loss, ups = mnist_stitchml(params, batch)
        exe = g.compile({x: img, y: lab}, [loss], ups, device=DEV)
        feeds = {x: img, y: lab}
        p, forward, opt = mnist_torch(params)
        l_sm = exe.run(feeds)[loss].item()
        l_t = forward(img, lab).item()
        record("mnist-step", f"batch {batch}", "stitchml", cuda_time(lambda: exe.run(feeds), 5, 50),
               check=abs(l_sm - l_t) / abs(l_t), note=f"{exe.kernel_count} kernels, heap {exe.intermediates_heap_size}, "
                                                     f"graph replay {exe._graph_state is not None} {exe.capture_error or ''}")
        if os.environ.get("PROFILE_STEPS"):
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    exe.run(feeds)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))

        def eager_step():
            opt.zero_grad(set_to_none=True)
            forward(img, lab).backward()
            opt.step()

        record("mnist-step", f"batch {batch}", "torch-eager", cuda_time(eager_step, 5, 50))
        cforward = torch.compile(forward)

        def compiled_step():
            opt.zero_grad(set_to_none=True)
            cforward(img, lab).backward()
            opt.step()

        compiled_step()
        record("mnist-step", f"batch {batch}", "torch.compile", cuda_time(compiled_step, 5, 50),
               note="compiled forward+backward, eager optimizer")
        if jax is not None:
            jp = {k: jnp.asarray(t.numpy()) for k, t in params.items()}

            def jloss(q, im, lb):
                conv = lambda a, w: jax.lax.conv_general_dilated(a, w, (1, 1), "SAME")  # noqa: E731
                pool = lambda a: jax.lax.reduce_window(a, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")  # noqa: E731
                h = pool(jax.nn.relu(conv(im, q["w1"]) + q["b1"]))
                h = pool(jax.nn.relu(conv(h, q["w2"]) + q["b2"]))
                h = jax.nn.relu(h.reshape(-1, 3136) @ q["w3"] + q["b3"])
                logits = h @ q["w4"] + q["b4"]
                return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), lb[:, None], 1))

            @jax.jit
            def jstep(q, im, lb):
                val, gr = jax.value_and_grad(jloss)(q, im, lb)
                return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, q, gr), val

            jim, jlb = jnp.asarray(img.cpu().numpy()), jnp.asarray(lab.cpu().numpy())
            state = [jp]

            def run_j():
                state[0], val = jstep(state[0], jim, jlb)
                val.block_until_ready()

            run_j()
            record("mnist-step", f"batch {batch}", "jax.jit", host_time(run_j, 5, 50))


# -- memory plan ------------------------------------------------------------------------------------
def case_heap(bw):
    params = mnist_params()
    for batch in (128, 1024):
        g, x, y, loss, ups = mnist_stitchml(params, batch)
        exe = g.compile({x: sm.TensorType((batch, 1, 28, 28), sm.float32), y: sm.TensorType((batch,), sm.int64)},
                        [loss], ups, device=DEV)
        plan = exe.plan
        print(f"heap mnist batch {batch}: heap {plan.arena_size} B, lower bound {plan.lower_bound} B "
              f"({plan.arena_size / plan.lower_bound:.3f}x), separate allocations {plan.separate_size} B")
        ROWS.append({"case": "heap", "size": f"mnist batch {batch}", "heap": plan.arena_size,
                     "lower_bound": plan.lower_bound, "separate": plan.separate_size})


CASES = {"gelu": case_gelu, "latency": case_latency, "rows": case_rows, "matmul": case_matmul,
         "mnist": case_mnist, "heap": case_heap}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "bench_compiler.json"))
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    bw = copy_bandwidth()
    import triton

    env = {"gpu": props.name, "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
           "python": sys.version.split()[0], "copy_bw_GBps": bw / 1e9, "date": time.strftime("%Y-%m-%d")}
    try:
        import jax

        env["jax"] = jax.__version__
    except Exception:  # noqa: BLE001
        pass
    print(env, flush=True)
    for name in args.cases.split(","):
        try:
            CASES[name](bw)
        except Exception as e:  # noqa: BLE001  (one failing case must not hide the others' numbers)
            import traceback

            traceback.print_exc()
            ROWS.append({"case": name, "error": repr(e)})
    with open(args.json, "w") as f:
        json.dump({"env": env, "rows": ROWS}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
