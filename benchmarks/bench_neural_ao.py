"""The neural-AO frame on one GPU: the UNet's time per frame and the whole frame through a command buffer,
against the same UNet in PyTorch eager and torch.compile.

    $ PYTHONPATH=$PWD python benchmarks/bench_neural_ao.py --json ao.json              # 1920x1080 on CUDA
    $ PYTHONPATH=$PWD python benchmarks/bench_neural_ao.py --device cpu --quick         # a check that it runs

The network is `stitchml.demos.neural_ao.UNet` (seeded weights: the time does not depend on them),
imported with `package.from_torch` and dispatched by an ML encoder (one CUDA-graph replay of the pipeline).
Rows, each the median over `--iters` frames after `--warmup`:

* network: a command buffer holding only the ML dispatch; GPU time from the queue's timestamps (CUDA
  events between commands), and the host's commit-to-completion wall time;
* frame: G-buffer graph, barrier, network, barrier, compositing graph on one command buffer; the GPU
  time from the first command's start to the last one's end, and each pass's;
* torch eager / torch.compile: the same module on the same G-buffer, CUDA events around one call
  (under `no_grad`); torch.compile with its default mode, compile time reported apart.

On the CPU the times are wall-clock and torch.compile is skipped with --quick.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timer(dev: str):
    """A function timing `fn()` once in microseconds: CUDA events on a GPU, the wall clock on the CPU."""
    if dev == "cuda":
        def once(fn) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1000
    else:
        def once(fn) -> float:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
    return once


def _median(values) -> float:
    return float(statistics.median(values))


def bench_pipeline(frame, queue, warmup: int, iters: int, whole: bool) -> dict:
    """Run `iters` command buffers (the whole frame, or the ML dispatch alone) and take medians."""
    spans_by_kind: dict[str, list[float]] = {}
    gpu, wall = [], []
    for i in range(warmup + iters):
        if whole:
            cb = frame.encode(queue, f"frame {i}")
        else:
            cb = queue.command_buffer(f"network {i}")
            ml = cb.ml_encoder("network")
            ml.set_pipeline(frame.pipeline)
            ml.set_argument_table({frame.pipeline_input: frame.gbuffer, "output": frame.ao})
            ml.dispatch_network(frame.heap)
            ml.end()
        t0 = time.perf_counter()
        cb.commit()
        cb.wait()
        elapsed = (time.perf_counter() - t0) * 1e6
        if cb.error is not None:
            raise cb.error
        if i < warmup:
            continue
        work = [s for s in cb.timeline if s.kind in ("ml", "compute")]
        gpu.append(work[-1].end_us - work[0].start_us)
        wall.append(elapsed)
        for s in work:
            spans_by_kind.setdefault(s.encoder, []).append(s.end_us - s.start_us)
    return {"median_us": _median(gpu), "wall_us": _median(wall), "clock": cb.timeline[0].clock,
            "passes_us": {k: _median(v) for k, v in spans_by_kind.items()}}


def bench_torch(net, x, dev: str, warmup: int, iters: int) -> float:
    once = _timer(dev)
    with torch.no_grad():
        for _ in range(warmup):
            net(x)
        if dev == "cuda":
            torch.cuda.synchronize()
        return _median([once(lambda: net(x)) for _ in range(iters)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--size", default=None, help="WxH (default 1920x1080; 96x64 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a small frame and few iterations, no torch.compile")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device (use --device cpu --quick to check the script)")
    import stitchml as sm
    from stitchml.demos import default_threads
    from stitchml.demos.neural_ao import SCENE, Frame, UNet, import_network

    if args.device == "cpu":
        torch.set_num_threads(default_threads())  # spare threads only spin on a shared machine

    w, h = (int(v) for v in (args.size or ("96x64" if args.quick else "1920x1080")).lower().split("x"))
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 10)
    iters = args.iters if args.iters is not None else (3 if args.quick else 50)
    torch.manual_seed(0)
    net = UNet().eval()
    fn = import_network(net, h, w)
    dev = sm.device(args.device)
    t0 = time.perf_counter()
    frame = Frame.build(fn, h, w, dev, SCENE)
    build_s = time.perf_counter() - t0
    queue = dev.new_command_queue("bench", timestamps=dev.is_cuda)
    rows = {"frame": bench_pipeline(frame, queue, warmup, iters, whole=True)}
    rows["network"] = bench_pipeline(frame, queue, warmup, iters, whole=False)
    x = frame.gbuffer.torch().clone()
    tnet = UNet().to(x.device).eval()
    tnet.load_state_dict(net.state_dict())
    with torch.no_grad():
        want = tnet(x)
    error = float((frame.ao.torch() - want).abs().max())
    rows["torch_eager"] = {"median_us": bench_torch(tnet, x, args.device, warmup, iters)}
    if args.quick and args.device == "cpu":
        rows["torch_compile"] = {"skipped": "--quick on the CPU"}
    else:
        t0 = time.perf_counter()
        compiled = torch.compile(tnet)
        with torch.no_grad():
            compiled(x)
        compile_s = time.perf_counter() - t0
        rows["torch_compile"] = {"median_us": bench_torch(compiled, x, args.device, warmup, iters),
                                 "compile_s": compile_s}
    env = {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device == "cuda" else platform.machine(),
           "torch": torch.__version__, "size": [w, h], "warmup": warmup, "iters": iters,
           "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32), "pipeline_build_s": build_s,
           "heap_bytes": frame.pipeline.intermediates_heap_size}
    doc = {"environment": env, "results": rows, "network_max_error_vs_torch": error}
    unit = "GPU us" if args.device == "cuda" else "wall us"
    print(f"neural AO {w}x{h} on {env['gpu']} ({unit}, medians of {iters} after {warmup} warm-up); "
          f"network vs torch max |error| {error:.2e}")
    print(f"  {'stitchml network (ML encoder)':<38}{rows['network']['median_us']:>12.1f}"
          f"   host commit->done {rows['network']['wall_us']:.1f}")
    print(f"  {'stitchml frame (gbuffer+net+composite)':<38}{rows['frame']['median_us']:>12.1f}   passes "
          + ", ".join(f"{k} {v:.1f}" for k, v in rows["frame"]["passes_us"].items()))
    print(f"  {'torch eager network':<38}{rows['torch_eager']['median_us']:>12.1f}")
    tc = rows["torch_compile"]
    print(f"  {'torch.compile network':<38}" + (f"{tc['median_us']:>12.1f}   compile {tc['compile_s']:.1f} s"
                                                if "median_us" in tc else f"{'skipped':>12}   {tc['skipped']}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    return 0 if error <= (1e-2 if args.device == "cuda" else 1e-4) else 1


if __name__ == "__main__":
    sys.exit(main())
