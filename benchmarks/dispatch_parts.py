"""Where the host time of one packaged-network dispatch goes (informs pipeline/commands.py's commit path).

    $ python benchmarks/dispatch_parts.py [--model cnn] [--batch 1]
    $ python benchmarks/dispatch_parts.py --device cpu --model hf:t5 --batch 1 --threads 1
    $ python benchmarks/dispatch_parts.py --device cpu --model hf:mobilenetv2 --threads 1 --steps [--top 20]
    $ python benchmarks/dispatch_parts.py --device cpu --model cnn --host
    $ python benchmarks/dispatch_parts.py --model resnet18 --kernels [--variant triton '{"conv_template": "triton"}']

On CUDA each line is the median host time of one piece over many calls, each
call starting from an idle queue: encoding (command buffer, encoder, pipeline,
argument table, dispatch_network, end), commit (stream switch, timestamps,
the launch), the bound launch alone (one CUDA-graph replay), and the CUDA
primitives under it.

On the CPU a dispatch runs the prepared list of calls of pipeline/cpu_run.py:
each line is one call (a run of native kernels in one runner call, a library
call, a step run as it is) with the ops it computes and its median time, called
in order as a dispatch calls them; then the whole dispatch and the
preparation's counts (hoisted views, native kernels, products, copies, parts
left as they are).

With --device cpu --host: the host parts of one dispatch on the CPU queue (encode, commit with the
work it runs, wait() on a finished buffer, with and without a completed handler), as on CUDA.

With --kernels (CUDA): each compile variant of the network (default: the measured choice, cuDNN only,
the Triton template only; --variant NAME JSON adds compile options), bound and replayed as a CUDA graph:
the GPU time per replay (back to back and from an idle stream), every kernel of a replay with its median
time (torch.profiler over the replays), what each measured choice picked, and the error against PyTorch.

With --device cpu --steps: the dispatch's median wall time, what its prepared list of calls holds, and the
executable's steps timed one by one (medians over runs; the step-by-step run pays a little host time per step
that the prepared dispatch does not): the time by kind of step, then the slowest steps with the ops inside them.
"""
import argparse
import os
import statistics
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from stitchml.package import zoo  # noqa: E402
from stitchml.runtime import cudart  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from bench_package import _median_host as median_host, encode_dispatch as _encode  # noqa: E402


def median_us(fn, after=lambda _: None, n=2000, warmup=50):
    return median_host(fn, after, warmup, n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--per-kernel", action="store_true",
                        help="CPU: each native kernel its own call (timed alone) instead of runs of them in one")
    parser.add_argument("--steps", action="store_true", help="CPU: the executable's steps timed one by one")
    parser.add_argument("--top", type=int, default=15, help="CPU --steps: how many of the slowest steps to list")
    parser.add_argument("--host", action="store_true", help="CPU: the host parts of a dispatch")
    parser.add_argument("--kernels", action="store_true", help="CUDA: every kernel of a replay, per variant")
    parser.add_argument("--variant", nargs=2, action="append", default=[], metavar=("NAME", "JSON"),
                        help="--kernels: a compile variant (options as JSON) besides the default ones")
    parser.add_argument("--only", nargs="+", default=None, help="--kernels: only these variants, by name")
    parser.add_argument("--json", default=None, help="--kernels: write the rows here")
    args = parser.parse_args()
    if args.kernels:
        return kernel_parts(args)
    if args.device == "cpu":
        return cpu_host(args) if args.host else cpu_steps(args) if args.steps else cpu_parts(args)
    note, rows = measure(args.model, args.batch)
    print(note)
    for name, us in rows:
        print(f"{name:<36} {us:8.2f} us")
    return 0


def measure(model_name: str, batch: int, n: int = 2000) -> tuple[str, list[tuple[str, float]]]:
    """(a line saying what ran, [(piece, median host microseconds)]) for one dispatch of zoo model
    `model_name` at `batch` on the current CUDA device."""
    model, (example,) = zoo.build(model_name)
    x = example[:1].repeat(batch, *[1] * (example.dim() - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x,)).function()
    dev = sm.device("cuda")
    pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    heap, q = dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue("parts")
    (in_name,), (out_name, shape) = list(pipe.input_types), next(iter(pipe.output_shapes.items()))
    table = {in_name: sm.TensorData(x.cuda()), out_name: dev.new_tensor(shape, sm.float32)}

    heaps = {q: heap}  # a heap per queue: one in use by a buffer of one queue is not another queue's to take

    def encode(queue=q):
        cb = queue.command_buffer()
        enc = cb.ml_encoder()
        enc.set_pipeline(pipe)
        enc.set_argument_table(table)
        enc.dispatch_network(heaps[queue])
        enc.end()
        return cb

    def whole(queue=q):
        cb = encode(queue)
        cb.commit()
        return cb

    for _ in range(5):
        whole().wait()
    pending = [encode()]  # commit alone: each timed commit takes a buffer encoded before the timing
    rows = [("encode + commit (one dispatch)", median_us(whole, lambda cb: cb.wait(), n=n))]
    rows.append(("  encode alone", median_us(encode, n=n)))
    timed = dev.new_command_queue("parts-timed", timestamps=True)
    heaps[timed] = dev.new_heap(pipe.intermediates_heap_size)
    rows.append(("encode + commit, GPU timestamps on", median_us(lambda: whole(timed), lambda cb: cb.wait(), n=n)))

    def eight():
        cb = q.command_buffer()
        enc = cb.ml_encoder()
        enc.set_pipeline(pipe)
        for _ in range(8):
            enc.set_argument_table(table)
            enc.dispatch_network(heap)
        enc.end()
        cb.commit()
        return cb
    rows.append(("  per dispatch, 8 in one buffer", median_us(eight, lambda cb: cb.wait(), n=n // 4) / 8))

    def commit():
        cb = pending.pop()
        cb.commit()
        return cb
    rows.append(("  commit alone", median_us(commit, lambda cb: (cb.wait(), pending.append(encode())), n=n)))
    finished = [whole()]  # a dispatch whose GPU work is over before each timing: what wait() itself costs
    q.stream.synchronize()

    def next_finished(_):
        finished.append(whole())
        q.stream.synchronize()
    rows.append(("  wait() once the GPU is done", median_us(lambda: finished.pop().wait(), next_finished, n=n)))
    launch = pipe.launcher(pipe._checked_table, heap)
    bound = getattr(launch, "__self__", None)
    idle = lambda _: q.stream.synchronize()  # noqa: E731
    rows.append(("  the bound launch on the queue", median_us(lambda: launch(q.stream), idle, n=n)))
    if bound is not None and bound.graph is not None:
        with torch.cuda.stream(q.stream):
            rows.append(("  torch's CUDAGraph.replay()", median_us(bound.graph.replay, idle, n=n)))
    ev = torch.cuda.Event(enable_timing=True)
    ev.record(q.stream)
    rows.append(("  timing event record (torch)", median_us(lambda: ev.record(q.stream), n=n)))
    rt = cudart.runtime()
    if rt is not None:
        record = lambda: rt.event_record(ev.cuda_event, q.stream.cuda_stream)  # noqa: E731
        rows.append(("  timing event record (direct)", median_us(record, n=n)))
    get, put = torch._C._cuda_getCurrentStream, torch._C._cuda_setStream
    ids = (q.stream.stream_id, q.stream.device_index, q.stream.device_type)

    def switch():
        prev = get(0)
        put(*ids)
        put(*prev)
    rows.append(("  stream switch and back", median_us(switch, n=n)))
    rows.append(("  torch.cuda.stream() context", median_us(lambda: _ctx(q.stream), n=n)))
    note = (f"{model_name} batch {batch} on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
            f"kernels {pipe.executable.kernel_count}, replayed {bool(bound and bound.graph is not None)}, "
            f"zero copy {bool(bound and bound.zero_copy)}, direct CUDA calls {cudart.runtime() is not None}")
    return note, rows


def _cpu_dispatch(args):
    """(the package function, its input, the CPU pipeline, its heap, one dispatch encoded, committed and
    waited for) for zoo model args.model at args.batch, on args.threads threads."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, (example,) = zoo.build(args.model)
    x = example[:1].repeat(args.batch, *[1] * (example.dim() - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x,)).function()
    dev = sm.device("cpu")
    pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    heap, q = dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue("parts")
    (in_name,), (out_name, shape) = list(pipe.input_types), next(iter(pipe.output_shapes.items()))
    table = {in_name: sm.TensorData(x), out_name: dev.new_tensor(shape, sm.float32)}

    def dispatch():
        cb = _encode(q, pipe, table, heap)
        cb.commit()
        cb.wait()

    return fn, x, pipe, heap, dispatch


def cpu_parts(args) -> int:
    """The prepared CPU dispatch's calls, one line each, timed in order."""
    import time

    from stitchml.pipeline import cpu_run

    if args.per_kernel:
        cpu_run._native_runner = lambda: None  # no runner: every kernel stays a call of its own
    fn, x, pipe, heap, dispatch = _cpu_dispatch(args)
    for _ in range(3):  # the bound run, the preparing run, a prepared run
        dispatch()
    run = pipe.launcher(pipe._checked_table, heap).__self__
    times: list[list[float]] = [[] for _ in run.calls]
    for _ in range(500):
        for i, call in enumerate(run.calls):
            t0 = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - t0)
    rows = [(statistics.median(t) * 1e6, label) for t, label in zip(times, run.labels)]
    print(f"{args.model} batch {args.batch}, {torch.get_num_threads()} thread(s), torch {torch.__version__}: "
          f"{len(run.calls)} calls; prepared {run.prepared}")
    for us, label in rows:
        kernels = label.split(" | ")
        more = f" (and {len(kernels) - 1} more kernels)" if len(kernels) > 1 else ""
        print(f"{us:8.2f} us  {kernels[0][:110]}{more}")
    print(f"{sum(us for us, _ in rows):8.2f} us  the calls, one by one")
    print(f"{median_us(dispatch, n=500):8.2f} us  one dispatch (encode, commit, wait)")
    return 0


def cpu_steps(args) -> int:
    """The CPU dispatch's wall time, its prepared calls, and the executable's steps timed one by one."""
    fn, x, pipe, _, dispatch = _cpu_dispatch(args)
    in_name = next(iter(pipe.input_types))
    whole = median_us(dispatch, n=500)
    exe = pipe.executable
    prepared = pipe._last[2].__self__.prepared
    placeholder = fn.input_tensor(in_name)
    times: dict[str, list[float]] = {}
    for _ in range(100):
        exe.run({placeholder: x}, profile=True)
        for name, _, ms in exe.last_profile:
            times.setdefault(name, []).append(ms * 1e3)
    kinds = {s.name: s.kind for s in exe.steps}
    ops = {f"kernel{e['kernel']}_{e['template']}": e["ops"] for e in exe.fusion_entries}
    steps = sorted(((statistics.median(v), name) for name, v in times.items()), reverse=True)
    by_kind: dict[str, float] = {}
    for us, name in steps:
        by_kind[kinds[name]] = by_kind.get(kinds[name], 0.0) + us
    print(f"{args.model} batch {args.batch} on the CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"kernels {exe.kernel_count}\ndispatch (encode, commit, wait) {whole:8.1f} us\nprepared calls: {prepared}\n"
          f"steps one by one {sum(us for us, _ in steps):8.1f} us: "
          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for us, name in steps[:args.top]:
        inside = ", ".join(o.split(" ")[0] for o in ops.get(name, []))
        print(f"{us:8.1f} us  {kinds[name]:<11} {name:<24} {inside[:90]}")
    return 0


def cpu_host(args) -> int:
    """The host parts of one CPU dispatch (encode; commit, which runs the work on an idle queue; wait)."""
    fn, x, pipe, heap, dispatch = _cpu_dispatch(args)
    dispatch()
    q = pipe.device.new_command_queue("host")
    table = dict(pipe._checked_table)

    def encode():
        return _encode(q, pipe, table, heap)

    def committed(handler=False):
        cb = encode()
        if handler:
            cb.add_completed_handler(lambda _: None)
        cb.commit()
        return cb

    for _ in range(5):
        committed().wait()
    pending, done = [encode()], [committed()]
    rows = [("encode alone", median_us(encode, n=2000)),
            ("commit alone (runs the work)", median_us(lambda: pending.pop().commit(),
                                                       lambda _: pending.append(encode()), n=2000)),
            ("wait() on a finished buffer", median_us(lambda: done.pop().wait(),
                                                      lambda _: done.append(committed()), n=2000)),
            ("encode + commit + wait", median_us(lambda: committed().wait(), n=2000)),
            ("  with a completed handler", median_us(lambda: committed(True).wait(), n=2000))]
    print(f"{args.model} batch {args.batch} on the CPU, torch {torch.__version__}")
    for name, us in rows:
        print(f"{name:<36} {us:8.2f} us")
    return 0


def _profiled_kernels(launch, stream, replays: int) -> list[tuple[str, int, float]]:
    """(kernel name, launches per replay, median us per launch) over `replays` replays, in first-run order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            launch(stream)
        stream.synchronize()
    seen: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            seen.setdefault(e.name, []).append(e.time_range.elapsed_us())
    return [(name, round(len(t) / replays), statistics.median(t)) for name, t in seen.items()]


def _choices(exe) -> list[str]:
    """What each measured choice of `exe` picked, with its candidates' milliseconds."""
    from stitchml.runtime.choices import Chooser

    out = []
    for step in exe.steps:
        run = step.run
        if isinstance(run, Chooser):
            times = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in run.timings.items()) or "stored decision"
            out.append(f"{step.name}: {run.chosen} ({times} us)")
    return out


def kernel_parts(args) -> int:
    """Per compile variant: GPU time of a replay of the bound network and every kernel in it."""
    import json

    model, (example,) = zoo.build(args.model)
    x = example[:1].repeat(args.batch, *[1] * (example.dim() - 1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x,)).function()
    with torch.no_grad():
        want = model(x).double()
    variants = [("measure", {}), ("library", {"conv_template": "library"}), ("triton", {"conv_template": "triton"})]
    variants += [(name, json.loads(text)) for name, text in args.variant]
    variants = [(name, options) for name, options in variants if args.only is None or name in args.only]
    stream, rows = torch.cuda.Stream(), []
    (port,), (out,) = fn.inputs, fn.outputs
    xin = x.cuda()
    for name, options in variants:
        exe = fn.graph.compile({fn.input_tensor(port.name): sm.TensorData(xin)}, [fn.output_tensor(out.name)],
                               device="cuda", options=options)
        y = torch.empty(tuple(want.shape), device="cuda")
        bound = exe.bind({fn.input_tensor(port.name): xin}, {fn.output_tensor(out.name): y})
        with torch.cuda.stream(stream):
            for _ in range(3):  # the steps (measured choices decide), the capture, a replay
                bound.launch(stream)
        stream.synchronize()
        error = float((y.double().cpu() - want).abs().max())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(200):
            bound.launch(stream)
        end.record(stream)
        end.synchronize()
        back_to_back = start.elapsed_time(end) * 1e3 / 200
        idle = []
        for _ in range(100):
            stream.synchronize()
            start.record(stream)
            bound.launch(stream)
            end.record(stream)
            end.synchronize()
            idle.append(start.elapsed_time(end) * 1e3)
        kernels = _profiled_kernels(bound.launch, stream, 20)
        row = {"variant": name, "options": options, "kernel_steps": exe.kernel_count,
               "replayed": bound.graph is not None, "gpu_us_back_to_back": back_to_back,
               "gpu_us_from_idle": statistics.median(idle), "max_error": error,
               "kernels": kernels, "choices": _choices(exe)}
        rows.append(row)
        print(f"{args.model} batch {args.batch}, {name} {options}: {exe.kernel_count} kernel steps, "
              f"{sum(k[1] for k in kernels)} kernels per replay, GPU {back_to_back:.1f} us per replay back to "
              f"back, {row['gpu_us_from_idle']:.1f} from idle; max error {error:.2e}; replayed {row['replayed']}")
        for kname, count, us in kernels:
            print(f"  {us:7.2f} us x{count}  {kname[:100]}")
        for line in row["choices"]:
            print(f"  choice {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "batch": args.batch, "gpu": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


def _ctx(stream):
    with torch.cuda.stream(stream):
        pass


if __name__ == "__main__":
    sys.exit(main())
