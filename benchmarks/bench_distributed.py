"""Data-parallel training steps: StitchML (gradients averaged in the graph) against PyTorch
DistributedDataParallel, eager and under torch.compile, on one process and on N.

Run it under torchrun, once per process count, on the same machine:

    torchrun --standalone --nproc-per-node 1 benchmarks/bench_distributed.py --json one.json
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_distributed.py --json two.json
    python benchmarks/bench_distributed.py --scaling one.json two.json   # scaling efficiency table

Workloads: the CNN training step (3x3 convolutions 1->32->64, dense 3136->256->10, SGD with
momentum) and a transformer block training step (width 256, 4 heads, sequence 128, MLP 1024,
Adam), at several per-process batch sizes. Times are medians of CUDA-event timings after
warm-up (host clocks on the CPU); every process runs the same steps and rank 0 writes the JSON.
`--device cpu --quick` runs the same code with gloo on CPU processes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import stitchml as sm  # noqa: E402


# -- the models, twice: as a StitchML graph and as a torch module with the same weights --------------
def cnn_weights(rng):
    return {"c1": rng.standard_normal((32, 1, 3, 3)) * 0.3, "b1": np.zeros(32), "c2": rng.standard_normal((64, 32, 3, 3)) * 0.06,
            "b2": np.zeros(64), "d1": rng.standard_normal((3136, 256)) * 0.02, "e1": np.zeros(256),
            "d2": rng.standard_normal((256, 10)) * 0.06, "e2": np.zeros(10)}


def cnn_graph(weights, batch, data_parallel):
    g = sm.Graph()
    x = g.placeholder((batch, 1, 28, 28), name="x")
    y = g.placeholder((batch,), sm.int64, name="y")
    v = {k: g.variable(w.astype(np.float32), name=k) for k, w in weights.items()}
    pool = sm.Pooling2DDescriptor(kernel_size=2)
    same = sm.Convolution2DDescriptor(padding="same")
    h = g.max_pooling2d(g.relu(sm.nn.conv2d(g, x, v["c1"], v["b1"], same)), pool)
    h = g.max_pooling2d(g.relu(sm.nn.conv2d(g, h, v["c2"], v["b2"], same)), pool)
    h = g.relu(sm.nn.dense(g, g.reshape(h, (batch, 3136)), v["d1"], v["e1"]))
    loss = g.softmax_cross_entropy(sm.nn.dense(g, h, v["d2"], v["e2"]), y, reduction="mean")
    steps = sm.optim.SGD(0.01, momentum=0.9).minimize(g, loss, list(v.values()), data_parallel=data_parallel)
    return g, x, y, loss, steps


class TorchCNN(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.d1 = torch.nn.Linear(3136, 256)
        self.d2 = torch.nn.Linear(256, 10)
        with torch.no_grad():
            for layer, w, b in ((self.c1, "c1", "b1"), (self.c2, "c2", "b2")):
                layer.weight.copy_(torch.from_numpy(weights[w]))
                layer.bias.copy_(torch.from_numpy(weights[b]))
            for layer, w, b in ((self.d1, "d1", "e1"), (self.d2, "d2", "e2")):
                layer.weight.copy_(torch.from_numpy(weights[w]).T)
                layer.bias.copy_(torch.from_numpy(weights[b]))

    def forward(self, x):
        f = torch.nn.functional
        h = f.max_pool2d(f.relu(self.c1(x)), 2)
        h = f.max_pool2d(f.relu(self.c2(h)), 2)
        return self.d2(f.relu(self.d1(h.flatten(1))))


WIDTH, HEADS, SEQ, HIDDEN = 256, 4, 128, 1024


def block_weights(rng):
    s = WIDTH ** -0.5
    return {"wq": rng.standard_normal((WIDTH, WIDTH)) * s, "wk": rng.standard_normal((WIDTH, WIDTH)) * s,
            "wv": rng.standard_normal((WIDTH, WIDTH)) * s, "wo": rng.standard_normal((WIDTH, WIDTH)) * s,
            "w1": rng.standard_normal((WIDTH, HIDDEN)) * s, "w2": rng.standard_normal((HIDDEN, WIDTH)) * HIDDEN ** -0.5}


def block_graph(weights, batch, data_parallel):
    g = sm.Graph()
    inp = x = g.placeholder((batch, SEQ, WIDTH), name="x")
    t = g.placeholder((batch, SEQ, WIDTH), name="target")
    v = {k: g.variable(w.astype(np.float32), name=k) for k, w in weights.items()}
    d = WIDTH // HEADS

    def heads(z):
        return g.transpose(g.reshape(z, (batch, SEQ, HEADS, d)), (0, 2, 1, 3))

    h = g.layer_normalization(x)
    q, k, val = heads(h @ v["wq"]), heads(h @ v["wk"]), heads(h @ v["wv"])
    att = g.softmax(q @ g.transpose(k, (0, 1, 3, 2)) * (d ** -0.5), axis=-1) @ val
    x = x + g.reshape(g.transpose(att, (0, 2, 1, 3)), (batch, SEQ, WIDTH)) @ v["wo"]
    x = x + g.gelu(g.layer_normalization(x) @ v["w1"]) @ v["w2"]
    loss = g.reduction_mean((x - t) * (x - t))
    steps = sm.optim.Adam(1e-4).minimize(g, loss, list(v.values()), data_parallel=data_parallel)
    return g, inp, t, loss, steps


class TorchBlock(torch.nn.Module):
    def __init__(self, weights):
        super().__init__()
        self.w = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.from_numpy(w).float()) for k, w in weights.items()})

    def forward(self, x):
        f, w, b = torch.nn.functional, self.w, x.shape[0]

        def heads(z):
            return z.view(b, SEQ, HEADS, WIDTH // HEADS).transpose(1, 2)

        h = f.layer_norm(x, (WIDTH,))
        q, k, v = heads(h @ w["wq"]), heads(h @ w["wk"]), heads(h @ w["wv"])
        att = torch.softmax(q @ k.transpose(-1, -2) * (WIDTH // HEADS) ** -0.5, dim=-1) @ v
        x = x + att.transpose(1, 2).reshape(b, SEQ, WIDTH) @ w["wo"]
        return x + f.gelu(f.layer_norm(x, (WIDTH,)) @ w["w1"]) @ w["w2"]


# -- timing ---------------------------------------------------------------------------------------------
def timed(fn, device, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_one(workload, batch, device, size, args):
    rng = np.random.default_rng(0)
    weights = cnn_weights(rng) if workload == "cnn" else block_weights(rng)
    if workload == "cnn":
        xs = torch.randn(batch, 1, 28, 28, device=device)
        ys = torch.randint(0, 10, (batch,), device=device)
    else:
        xs = torch.randn(batch, SEQ, WIDTH, device=device)
        ys = torch.randn(batch, SEQ, WIDTH, device=device)
    row = {"workload": workload, "batch_per_process": batch, "processes": size}
    # StitchML: one executable per step, gradients averaged in the graph
    build = cnn_graph if workload == "cnn" else block_graph
    g, x, y, loss, steps = build(weights, batch, "world" if size > 1 else None)
    exe = g.compile({x: sm.TensorType(tuple(xs.shape), sm.float32),
                     y: sm.TensorType(tuple(ys.shape), sm.int64 if workload == "cnn" else sm.float32)},
                    [loss], steps, device=str(device))
    feeds = {x: sm.TensorData(xs), y: sm.TensorData(ys)}
    row["stitchml_ms"] = timed(lambda: exe.run(feeds), device, args.warmup, args.iters)
    row["stitchml_capture"] = getattr(exe, "capture_error", None) or "captured or not attempted"
    # PyTorch DDP, eager and compiled
    for label, compile_it in (("ddp_eager_ms", False), ("ddp_compile_ms", True)):
        if compile_it and args.no_compile:
            continue
        model = (TorchCNN(weights) if workload == "cnn" else TorchBlock(weights)).to(device)
        if size > 1:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        forward = torch.compile(model) if compile_it else model
        opt = (torch.optim.SGD(model.parameters(), 0.01, momentum=0.9) if workload == "cnn"
               else torch.optim.Adam(model.parameters(), 1e-4))

        def step():
            opt.zero_grad(set_to_none=True)
            out = forward(xs)
            lo = (torch.nn.functional.cross_entropy(out, ys) if workload == "cnn"
                  else torch.nn.functional.mse_loss(out, ys))
            lo.backward()
            opt.step()

        row[label] = timed(step, device, args.warmup, args.iters)
    return row


def scaling(paths):
    runs = [json.load(open(p)) for p in paths]
    one = {(r["workload"], r["batch_per_process"]): r for r in runs[0]["results"]}
    print("| workload | batch/process | processes | ours one (ms) | ours N (ms) | ours efficiency | DDP N (ms) | "
          "DDP+compile N (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for run in runs[1:]:
        for r in run["results"]:
            base = one[(r["workload"], r["batch_per_process"])]
            eff = base["stitchml_ms"] / r["stitchml_ms"]  # N x the work in the time of one: throughput / (N x one's)
            print(f"| {r['workload']} | {r['batch_per_process']} | {r['processes']} | {base['stitchml_ms']:.3f} | "
                  f"{r['stitchml_ms']:.3f} | {eff:.1%} | {r['ddp_eager_ms']:.3f} | {r.get('ddp_compile_ms', float('nan')):.3f} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--workloads", nargs="+", default=["cnn", "block"])
    p.add_argument("--batch", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--quick", action="store_true", help="tiny sizes and few iterations (a smoke run)")
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--json")
    p.add_argument("--scaling", nargs="+", metavar="JSON", help="print the scaling table of earlier runs")
    args = p.parse_args(argv)
    if args.scaling:
        return scaling(args.scaling)
    if args.quick:
        args.batch, args.warmup, args.iters = [4], 1, 3
    rank, size = sm.distributed.init("nccl" if args.device.startswith("cuda") else "gloo")
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}")
    torch.manual_seed(0)
    results = []
    for workload in args.workloads:
        for batch in args.batch:
            results.append(bench_one(workload, batch, device, size, args))
            if rank == 0:
                r = results[-1]
                print(f"{workload:6} batch {batch:5} x{size}: stitchml {r['stitchml_ms']:.3f} ms, "
                      f"DDP {r['ddp_eager_ms']:.3f} ms, DDP+compile {r.get('ddp_compile_ms', float('nan')):.3f} ms")
    if rank == 0 and args.json:
        env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "processes": size, "date": time.strftime("%Y-%m-%d")}
        with open(args.json, "w") as f:
            json.dump({"environment": env, "results": results}, f, indent=1)
    sm.distributed.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
