"""Packaged networks against ONNX Runtime, PyTorch eager and torch.compile: dispatch time and memory.

    $ python benchmarks/bench_package.py --device cpu --compile --models cnn transformer --json bench_package.json
    $ python benchmarks/bench_package.py --device cuda --compile --models cnn resnet18 transformer --batch 1 8
    $ python benchmarks/bench_package.py --device cuda --compile --models hf --batch 1 8
          # "hf": every transformers family of zoo.py from small configs (BERT, GPT-2, Llama, ViT, ConvNeXt,
          # ResNet, T5, Wav2Vec2, Swin, MobileNetV2); or name them: --models hf:t5 hf:swin

For each zoo model (stitchml/package/zoo.py, random weights) and batch size:

* **stitchml**: the package built through torch.export, compiled into an ML
  pipeline, one dispatch per command buffer (encode, commit, wait). Host
  time: the caller's time to encode and commit one dispatch, from an idle
  queue and back to back (on the CPU an idle queue runs the dispatch inside
  commit(), so this is most of the wall time); on CUDA also the bound
  launch alone (the CUDA-graph launch a dispatch makes on the queue's
  stream) and whether it
  ran in the caller's memory; and the wall time without the device-wide
  synchronize after `wait()` (which already waits for the work);
* **onnxruntime**: the same module exported to ONNX (TorchScript exporter,
  opset 17), one InferenceSession.run (on CUDA with I/O bound to device
  memory); skipped with a note when onnxruntime or its CUDA provider is
  missing;
* **torch eager**: ``module(x)`` under no_grad; **torch.compile** (with
  --compile): on CUDA mode="reduce-overhead", PyTorch's own CUDA-graph
  replay; on the CPU the default mode (Inductor's C++ kernels).

On the CPU every contender runs with the same thread count (--threads,
default torch's): ONNX Runtime's intra-op pool gets that many threads.

Times are medians over --iters runs after --warmup runs. Every backend gets a
synchronized wall-clock median (the only fair clock for ONNX Runtime's own
streams); on a GPU stitchml and eager also get CUDA-event medians on the
stream the work runs on. Memory: the pipeline's `intermediates_heap_size`,
the lower bound of the compiler's memory plan (the largest sum of
intermediates alive at once over its fused schedule), and (on CUDA)
PyTorch's peak allocated bytes for the forward pass above what the weights
and input already held. Prints a table and writes JSON.
"""
from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import time
import warnings

import torch


def encode_dispatch(q, pipe, table, heap):
    """A command buffer of `q` holding one dispatch of `pipe` on `table` with `heap`, encoded, not committed."""
    cb = q.command_buffer()
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table(table)
    enc.dispatch_network(heap)
    enc.end()
    return cb


def _median_wall(fn, warmup: int, iters: int, sync) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _median_host(fn, finish, warmup: int, iters: int) -> float:
    """Median host time of `fn()` alone; `finish(result)` runs after each, outside the timing."""
    times = []
    for i in range(warmup + iters):
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        finish(out)
        if i >= warmup:
            times.append(t1 - t0)
    return statistics.median(times) * 1e6


def _back_to_back(fn, finish, n: int) -> float:
    """Host time per call of `n` calls of `fn()` in a row (then `finish` on the last result)."""
    finish(fn())
    t0 = time.perf_counter()
    for _ in range(n):
        out = fn()
    t1 = time.perf_counter()
    finish(out)
    return (t1 - t0) / n * 1e6


def _median_cuda(fn, warmup: int, iters: int, stream) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _stitchml(sm, model, x, dev, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model.cpu(), (x.cpu(),)).function()
    desc = sm.MLPipelineDescriptor(fn)
    pipeline = sm.Compiler(dev).new_ml_pipeline(desc)
    heap = dev.new_heap(pipeline.intermediates_heap_size)
    queue = dev.new_command_queue("bench")
    name = fn.inputs[0].name
    xin = sm.TensorData(x.to(dev.torch_device))
    out_name, shape = next(iter(pipeline.output_shapes.items()))
    yout = dev.new_tensor(shape, sm.float32)
    table = {name: xin, out_name: yout}

    def encode_commit(q=queue):
        cb = encode_dispatch(q, pipeline, table, heap)
        cb.commit()
        return cb

    sync = torch.cuda.synchronize if dev.is_cuda else (lambda: None)
    result = {"wall_us": _median_wall(lambda: encode_commit().wait(), args.warmup, args.iters, sync),
              "_timed": (lambda: encode_commit().wait(), sync)}
    # wait() returns once the GPU work is done: the device-wide synchronize every contender gets after each
    # forward pass (ONNX Runtime's run, eager's kernels need it) is redundant after it; this is the wall without
    result["wall_wait_only_us"] = _median_wall(lambda: encode_commit().wait(), args.warmup, args.iters,
                                               lambda: None)
    # host time of one dispatch (encode + commit), starting from an idle queue each time
    result["encode_commit_us"] = _median_host(encode_commit, lambda cb: cb.wait(), args.warmup, args.iters)
    # the same with dispatches back to back (a frame loop that does not wait for each one)
    result["encode_commit_back_to_back_us"] = _back_to_back(encode_commit, lambda cb: cb.wait(), args.iters * 10)
    if dev.is_cuda:
        result["cuda_event_us"] = _median_cuda(lambda: encode_commit().wait(), args.warmup, args.iters, queue.stream)
        timed = dev.new_command_queue("bench-timed", timestamps=True)
        result["encode_commit_timestamps_us"] = _median_host(lambda: encode_commit(timed), lambda cb: cb.wait(),
                                                             args.warmup, args.iters)
        launch = pipeline.launcher(pipeline._checked_table, heap)  # what one dispatch runs: a graph replay
        result["launch_us"] = _median_host(lambda: launch(queue.stream), lambda _: queue.stream.synchronize(),
                                           args.warmup, args.iters)
        bound = getattr(launch, "__self__", None)
        result["replayed"] = bool(bound is not None and bound.graph is not None)
        result["zero_copy"] = bool(bound is not None and bound.zero_copy)
    result["heap_bytes"] = pipeline.intermediates_heap_size
    plan = getattr(pipeline.executable, "plan", None)  # the compiler's memory plan over its fused schedule
    result["heap_lower_bound_bytes"] = getattr(plan, "lower_bound", None)
    result["kernel_count"] = getattr(pipeline.executable, "kernel_count", None)
    result["kernels"] = pipeline.kernel_note
    with torch.no_grad():
        result["check_max_error"] = float((yout.torch().cpu() - model.cpu()(x.cpu())).abs().max())
    return result


def _onnxruntime(model, x, device, args):
    try:
        import onnxruntime as ort
    except ImportError:
        return {"skipped": "onnxruntime is not installed"}
    f = io.BytesIO()
    # torch.onnx cannot export scaled_dot_product_attention with grouped-query heads (Llama): a transformers
    # model exports with the library's eager attention, the same function, and gets its own back after.
    inner = getattr(model, "model", None)
    attention = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if attention is not None and hasattr(inner, "set_attn_implementation"):
                inner.set_attn_implementation("eager")
            torch.onnx.export(model.cpu(), (x.cpu(),), f, dynamo=False, opset_version=17, input_names=["x"],
                              output_names=["y"])
        except Exception as e:  # noqa: BLE001  (torch.onnx cannot export some models)
            return {"skipped": f"torch.onnx.export failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"}
        finally:
            if attention is not None and hasattr(inner, "set_attn_implementation"):
                inner.set_attn_implementation(attention)
    providers = ["CUDAExecutionProvider"] if device.startswith("cuda") else ["CPUExecutionProvider"]
    if providers[0] not in ort.get_available_providers():
        return {"skipped": f"{providers[0]} is not available in onnxruntime {ort.__version__}"}
    options = ort.SessionOptions()
    if not device.startswith("cuda"):  # the CPU provider gets as many threads as torch (and so StitchML) uses
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
    sess = ort.InferenceSession(f.getvalue(), options, providers=providers)
    if not device.startswith("cuda"):
        feed = {"x": x.cpu().numpy()}
        with torch.no_grad():
            error = float((torch.from_numpy(sess.run(None, feed)[0]) - model.cpu()(x.cpu())).abs().max())
        return {"wall_us": _median_wall(lambda: sess.run(None, feed), args.warmup, args.iters, lambda: None),
                "_timed": (lambda: sess.run(None, feed), lambda: None),
                "max_error": error, "version": ort.__version__, "threads": options.intra_op_num_threads}
    xin = x.cuda().contiguous()
    y = torch.empty(tuple(model(x.cpu()).shape), device="cuda")
    result = {"version": ort.__version__}
    for key, options in (("wall_us", {}), ("cuda_graph_wall_us", {"enable_cuda_graph": "1"})):
        try:  # with enable_cuda_graph ONNX Runtime captures the first run and replays it after
            s = sess if not options else ort.InferenceSession(f.getvalue(), providers=[(providers[0], options)])
            binding = s.io_binding()
            binding.bind_input("x", "cuda", 0, _ort_type(xin), list(xin.shape), xin.data_ptr())
            binding.bind_output("y", "cuda", 0, _ort_type(y), list(y.shape), y.data_ptr())
            result[key] = _median_wall(lambda: s.run_with_iobinding(binding), args.warmup, args.iters,
                                       torch.cuda.synchronize)
            with torch.no_grad():
                result[key.replace("wall_us", "max_error")] = float((y.cpu() - model.cpu()(x.cpu())).abs().max())
        except Exception as e:  # noqa: BLE001  (a provider option a model cannot take is reported, not fatal)
            result[key.replace("wall_us", "error")] = f"{type(e).__name__}: {str(e)[:200]}"
    return result


def _ort_type(t: torch.Tensor):
    import numpy as np

    return {torch.float32: np.float32, torch.float16: np.float16}[t.dtype]


def _torch_eager(model, x, device, args):
    m, xin = model.to(device), x.to(device)
    result = {}
    with torch.no_grad():
        if device.startswith("cuda"):
            result["wall_us"] = _median_wall(lambda: m(xin), args.warmup, args.iters, torch.cuda.synchronize)
            result["host_us"] = _median_host(lambda: m(xin), lambda _: torch.cuda.synchronize(), args.warmup, args.iters)
            result["cuda_event_us"] = _median_cuda(lambda: m(xin), args.warmup, args.iters, torch.cuda.current_stream())
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = m(xin)
            torch.cuda.synchronize()
            result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated() - base
            result["output_bytes"] = out.numel() * out.element_size()
        else:
            result["wall_us"] = _median_wall(lambda: m(xin), args.warmup, args.iters, lambda: None)
            result["_timed"] = (lambda: m(xin), lambda: None)
    m.cpu()
    return result


def _torch_compile(model, x, device, args):
    """torch.compile: on CUDA with mode="reduce-overhead" (its own CUDA-graph replay, the closest PyTorch
    analogue); on the CPU the default mode (Inductor's C++ kernels)."""
    if not args.compile:
        return {"skipped": "not asked for (--compile)"}
    import torch._dynamo

    torch._dynamo.reset()
    cuda = device.startswith("cuda")
    m, xin = model.to(device), x.to(device)
    compiled = torch.compile(m, mode="reduce-overhead") if cuda else torch.compile(m)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    result = {}
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(3):
            compiled(xin)
        sync()
        result["compile_s"] = time.perf_counter() - t0
        result["wall_us"] = _median_wall(lambda: compiled(xin), args.warmup, args.iters, sync)
        result["_timed"] = (lambda: compiled(xin), sync)
        if cuda:
            result["host_us"] = _median_host(lambda: compiled(xin), lambda _: torch.cuda.synchronize(), args.warmup,
                                             args.iters)
        result["max_error"] = float((compiled(xin).float().cpu() - model.cpu()(x.cpu())).abs().max())
    m.cpu()
    return result


def _interleave(row: dict, args) -> None:
    """On the CPU with --rounds above 1: the contenders' wall medians again, round by round in turn (a shared
    machine's load then falls on all of them alike); `wall_us` becomes the median of the rounds' medians."""
    timed = {k: r.pop("_timed") for k, r in row.items() if isinstance(r, dict) and "_timed" in r}
    if args.rounds <= 1 or args.device != "cpu":
        return
    rounds: dict[str, list[float]] = {k: [] for k in timed}
    with torch.no_grad():
        for _ in range(args.rounds):
            for k, (fn, sync) in timed.items():
                rounds[k].append(_median_wall(fn, 2, args.iters, sync))
    for k, values in rounds.items():
        row[k]["wall_us_rounds"] = values
        row[k]["wall_us"] = statistics.median(values)


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}{unit}"
    return f"{v:,}{unit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=["cnn", "resnet18", "transformer"])
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--compile", action="store_true",
                        help="also time torch.compile (mode='reduce-overhead' on CUDA, the default mode on the CPU)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time the contenders again in turn, this many rounds (medians of the rounds' medians)")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for torch, StitchML's native kernels and ONNX Runtime (default: torch's)")
    parser.add_argument("--json", default="bench_package.json", help="where to write the results")
    args = parser.parse_args(argv)

    import stitchml as sm
    from stitchml.package import zoo

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = sm.device(args.device)
    env = {"threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__, "stitchml": sm.__version__,
           "device": dev.name}
    if dev.is_cuda:
        env["gpu"] = torch.cuda.get_device_name(dev.torch_device)
        env["cuda"] = torch.version.cuda
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    rows = []
    names = [n for m in args.models for n in ([f"hf:{f}" for f in zoo.TRANSFORMERS] if m == "hf" else [m])]
    for name in names:
        model, (example,) = zoo.build(name)
        for batch in args.batch:
            x = example[:1].repeat(batch, *[1] * (example.dim() - 1))
            row = {"model": name, "batch": batch,
                   "stitchml": _stitchml(sm, model, x, dev, args),
                   "onnxruntime": _onnxruntime(model, x, args.device, args),
                   "torch_eager": _torch_eager(model, x, args.device, args),
                   "torch_compile": _torch_compile(model, x, args.device, args)}
            _interleave(row, args)
            rows.append(row)
            _save(args.json, env, rows)  # a run cut short keeps the rows it finished
            print(f"done: {name} batch {batch}", flush=True)
    header = (f"{'model':<12} {'batch':>5} | {'wall us: stitchml':>17} {'(wait)':>7} {'ORT':>8} {'ORT gr':>8} {'eager':>8} {'compile':>8} | "
              f"{'host us: dispatch':>17} {'b2b':>6} {'eager':>8} {'compile':>8} | {'heap B':>9} {'lower bd':>9} "
              f"{'torch peak':>10}")
    print(f"{env}\n{header}\n{'-' * len(header)}")
    for r in rows:
        s, o, t, c = r["stitchml"], r["onnxruntime"], r["torch_eager"], r["torch_compile"]
        print(f"{r['model']:<12} {r['batch']:>5} | {_fmt(s['wall_us']):>17} {_fmt(s['wall_wait_only_us']):>7} "
              f"{_fmt(o.get('wall_us')):>8} "
              f"{_fmt(o.get('cuda_graph_wall_us')):>8} "
              f"{_fmt(t.get('wall_us')):>8} {_fmt(c.get('wall_us')):>8} | {_fmt(s['encode_commit_us']):>17} "
              f"{_fmt(s['encode_commit_back_to_back_us']):>6} {_fmt(t.get('host_us')):>8} {_fmt(c.get('host_us')):>8} | "
              f"{_fmt(s['heap_bytes']):>9} {_fmt(s['heap_lower_bound_bytes']):>9} {_fmt(t.get('peak_allocated_bytes')):>10}")
    for r in rows:
        if "skipped" in r["onnxruntime"]:
            print(f"onnxruntime, {r['model']} batch {r['batch']}: {r['onnxruntime']['skipped']}")
    print(f"wall: synchronized wall clock per forward pass (dispatch: encode, commit, wait; then a device "
          f"synchronize, as for every contender; (wait): without that synchronize, wait() being one); host: the caller's "
          f"time to encode and commit one dispatch, alone (dispatch) or back to back (b2b), and to launch an "
          f"eager or compiled forward without waiting; medians of {args.iters} runs after {args.warmup} warm-up runs")
    _save(args.json, env, rows)
    print(f"wrote {args.json}")
    return 0


def _save(path: str, env: dict, rows: list) -> None:
    with open(path, "w") as f:
        json.dump({"environment": env, "results": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
