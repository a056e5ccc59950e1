"""The Metal-4-style runtime on the CPU: pipelines, argument tables, command buffers, events, traces."""
import json
import threading
import time

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml.package import Package, current_target, kernels, zoo


@pytest.fixture(scope="module")
def cnn():
    model, (x,) = zoo.build("cnn")
    batch = torch.export.Dim("batch", min=1, max=64)
    fn = sm.package.from_torch(model, (x,), dynamic_shapes=({0: batch},)).function()
    return model, fn


def _scale_fn(factor=2.0):
    g = sm.Graph()
    x = g.placeholder((-1, 4), sm.float32, name="x")
    return Package.from_graph(g, {"x": x}, {"y": g.tanh(x) * factor}).function()


def _pipeline(fn, dev, dims=None):
    desc = sm.MLPipelineDescriptor(fn)
    for name, d in (dims or {}).items():
        desc.set_input_dimensions(name, d)
    return sm.Compiler(dev).new_ml_pipeline(desc)


def test_network_between_compute_kernels_matches_pytorch(cnn):
    model, fn = cnn
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (3, 3, 16, 16)})
    assert pipe.output_shapes == {"output": (3, 10)}
    heap = dev.new_heap(pipe.intermediates_heap_size)
    raw = torch.randn(3, 3, 16, 16)
    xin = dev.new_tensor((3, 3, 16, 16), sm.float32)
    out_np = np.zeros((3, 10), np.float32)
    yout = sm.TensorData(out_np)  # the caller's memory: results land here, zero copy
    probs = dev.new_tensor((3, 10), sm.float32)
    cb = dev.new_command_queue("main").command_buffer("frame")
    with cb.compute_encoder("prepare") as ce:
        ce.dispatch(lambda: xin.torch().copy_(raw * 0.5), name="scale_input")
    cb.barrier("dispatch", "machine_learning")
    enc = cb.ml_encoder("net")
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": xin, "output": yout})
    enc.dispatch_network(heap)
    enc.end()
    cb.barrier("machine_learning", "dispatch")
    with cb.compute_encoder("post") as ce:
        ce.dispatch(lambda: probs.torch().copy_(torch.softmax(yout.torch(), -1)), name="softmax")
    cb.commit()
    cb.wait()
    assert cb.status == "completed"
    with torch.no_grad():
        want = model(raw * 0.5)
    assert np.abs(out_np - want.numpy()).max() <= 1e-4
    assert np.abs(probs.numpy() - torch.softmax(want, -1).numpy()).max() <= 1e-5
    names = [s.name for s in cb.timeline]
    assert names == ["scale_input", "barrier dispatch -> machine_learning", "main", "barrier machine_learning -> dispatch",
                     "softmax"]
    starts = [s.start_us for s in cb.timeline]
    assert starts == sorted(starts) and all(s.end_us >= s.start_us for s in cb.timeline)


def test_argument_table_is_checked(cnn):
    _, fn = cnn
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (2, 3, 16, 16)})
    enc = dev.new_command_queue().command_buffer().ml_encoder()
    with pytest.raises(sm.PipelineError, match="set_pipeline first"):
        enc.set_argument_table({})
    enc.set_pipeline(pipe)
    good_in, good_out = dev.new_tensor((2, 3, 16, 16), sm.float32), dev.new_tensor((2, 10), sm.float32)
    with pytest.raises(sm.PipelineError, match=r"missing \['output'\]"):
        enc.set_argument_table({"x": good_in})
    with pytest.raises(sm.PipelineError, match=r"unknown names \['z'\]"):
        enc.set_argument_table({"x": good_in, "output": good_out, "z": good_in})
    with pytest.raises(sm.PipelineError, match=r"input .x. must be TensorData float32\[2,3,16,16\].*float64"):
        enc.set_argument_table({"x": dev.new_tensor((2, 3, 16, 16), sm.float64), "output": good_out})
    with pytest.raises(sm.PipelineError, match=r"output 'output' must be TensorData float32\[2,10\].*\[3, 10\]"):
        enc.set_argument_table({"x": good_in, "output": dev.new_tensor((3, 10), sm.float32)})
    with pytest.raises(sm.PipelineError, match="got ndarray"):
        enc.set_argument_table({"x": np.zeros((2, 3, 16, 16), np.float32), "output": good_out})
    with pytest.raises(sm.PipelineError, match="set_pipeline and set_argument_table first"):
        enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size))
    enc.set_argument_table({"x": good_in, "output": good_out})
    if pipe.intermediates_heap_size:
        with pytest.raises(sm.PipelineError, match="needs a heap"):
            enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size - 1))


def test_pipeline_dimensions_are_checked(cnn):
    _, fn = cnn
    dev = sm.device("cpu")
    with pytest.raises(sm.PipelineError, match="symbolic extents; call set_input_dimensions"):
        _pipeline(fn, dev)
    with pytest.raises(sm.PipelineError, match="do not fit its signature"):
        _pipeline(fn, dev, {"x": (2, 3, 16)})
    with pytest.raises(sm.PackageError, match="no input named .y."):
        _pipeline(fn, dev, {"y": (2, 3, 16, 16)})


def test_pipeline_takes_its_work_from_the_compile(monkeypatch):
    """The pipeline's output types are the compiled program's, dimensions an op refuses are a
    PipelineError naming the op, and the argument table is the only check of a dispatch's tensors."""
    from stitchml.runtime import bound

    g = sm.Graph()
    x, w = g.placeholder((-1, 4), sm.float32, name="x"), g.placeholder((-1, 3), sm.float32, name="w")
    fn = Package.from_graph(g, {"x": x, "w": w}, {"y": g.matrix_multiplication(x, w)}).function()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (2, 4), "w": (4, 3)})
    assert pipe.output_types["y"] is pipe.executable.program.outputs[0].type
    assert pipe.output_shapes == {"y": (2, 3)}
    with pytest.raises(sm.PipelineError, match=r"do not fit: matrix_multiplication \("):
        _pipeline(fn, dev, {"x": (2, 4), "w": (5, 3)})
    seen = []
    original = bound.BoundRun.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("checked", args[5] if len(args) > 5 else False))
        original(self, *args, **kwargs)

    monkeypatch.setattr(bound.BoundRun, "__init__", spy)
    xv, wv = torch.randn(2, 4), torch.randn(4, 3)
    y = dev.new_tensor((2, 3), sm.float32)
    cb = dev.new_command_queue().command_buffer()
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": sm.TensorData(xv), "w": sm.TensorData(wv), "y": y})
    enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size))
    enc.end()
    cb.commit()
    cb.wait()
    assert seen == [True]
    assert torch.allclose(y.torch().double(), xv.double() @ wv.double(), atol=1e-5)


def test_encoder_rules():
    dev = sm.device("cpu")
    cb = dev.new_command_queue().command_buffer()
    ce = cb.compute_encoder()
    with pytest.raises(sm.PipelineError, match="is open; end\\(\\) it first"):
        cb.ml_encoder()
    with pytest.raises(sm.PipelineError, match="is open"):
        cb.commit()
    ce.end()
    with pytest.raises(sm.PipelineError, match="used after end"):
        ce.dispatch(lambda: None)
    with pytest.raises(sm.PipelineError, match="expected a callable"):
        cb.compute_encoder().dispatch(42)
    cb2 = dev.new_command_queue().command_buffer()
    with pytest.raises(sm.PipelineError, match="before commit"):
        cb2.wait()
    cb2.commit()
    with pytest.raises(sm.PipelineError, match="after commit"):
        cb2.commit()
    cb2.wait(5)


def test_events_order_work_across_queues():
    dev = sm.device("cpu")
    ev = dev.new_shared_event("ready")
    order, data = [], dev.new_tensor((4,), sm.float32)
    consumer = dev.new_command_queue("consumer").command_buffer()
    consumer.wait_for_event(ev, 1, timeout=10)
    with consumer.compute_encoder() as ce:
        ce.dispatch(lambda: order.append(("consume", float(data.torch().sum()))), name="consume")
    producer = dev.new_command_queue("producer").command_buffer()
    with producer.compute_encoder() as ce:
        ce.dispatch(lambda: (time.sleep(0.05), data.torch().fill_(2.0), order.append(("produce", 8.0))),
                    name="produce")
    producer.signal_event(ev, 1)
    consumer.commit()  # committed first; it must still run after the producer's signal
    producer.commit()
    consumer.wait(10)
    producer.wait(10)
    assert order == [("produce", 8.0), ("consume", 8.0)]
    assert ev.signaled_value == 1
    trace = sm.pipeline.trace_events([producer, consumer])
    flows = [e for e in trace if e["ph"] in ("s", "f")]
    assert {e["ph"] for e in flows} == {"s", "f"} and len({e["id"] for e in flows}) == 1


def test_event_timeout_fails_the_buffer_not_the_queue():
    dev = sm.device("cpu")
    q = dev.new_command_queue()
    cb = q.command_buffer()
    cb.wait_for_event(dev.new_shared_event("never"), 1, timeout=0.05)
    cb.commit()
    with pytest.raises(sm.PipelineError, match="did not reach 1 within 0.05 s"):
        cb.wait(10)
    assert cb.status == "error"
    after = q.command_buffer()
    ran = []
    with after.compute_encoder() as ce:
        ce.dispatch(lambda: ran.append(1))
    after.commit()
    after.wait(10)
    assert ran == [1]


def test_kernel_error_is_reported_with_its_cause():
    dev = sm.device("cpu")
    cb = dev.new_command_queue().command_buffer()
    with cb.compute_encoder() as ce:
        ce.dispatch(lambda: 1 / 0, name="broken")
    cb.commit()
    with pytest.raises(sm.PipelineError, match="ZeroDivisionError"):
        cb.wait(10)


def test_completed_handler_is_called():
    dev = sm.device("cpu")
    cb = dev.new_command_queue().command_buffer()
    called = threading.Event()
    cb.add_completed_handler(lambda c: called.set() if c.status == "completed" else None)
    cb.commit()
    assert called.wait(10)
    late = []
    cb.add_completed_handler(lambda c: late.append(c.status))
    assert late == ["completed"]


def test_trace_json(tmp_path):
    dev = sm.device("cpu")
    fn = _scale_fn()
    pipe = _pipeline(fn, dev, {"x": (2, 4)})
    x, y = sm.TensorData(np.ones((2, 4), np.float32)), dev.new_tensor((2, 4), sm.float32)
    cb = dev.new_command_queue("q").command_buffer("frame0")
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": x, "y": y})
    enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size))
    enc.end()
    cb.barrier()
    cb.commit()
    cb.wait()
    np.testing.assert_allclose(y.numpy(), 2 * np.tanh(1.0), rtol=1e-6)
    sm.write_trace(tmp_path / "t.json", [cb])
    doc = json.loads((tmp_path / "t.json").read_text())
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in slices] == ["main"] and slices[0]["args"]["command_buffer"] == "frame0"
    assert any(e["ph"] == "i" and e["cat"] == "barrier" for e in doc["traceEvents"])
    assert any(e["ph"] == "M" and e["args"]["name"] == "q" for e in doc["traceEvents"])


def test_package_kernels_absent_or_mismatched_compile_and_say_so(tmp_path):
    dev = sm.device("cpu")
    fn = _scale_fn()
    pkg = fn.package
    assert "no compiled kernels" in _pipeline(fn, dev, {"x": (2, 4)}).kernel_note
    sm90 = {"arch": "sm_90", "triton": "3.6.0"}
    pkg.add_kernels("main", {"x": (2, 4)}, sm90, kernels.pack(kernels.Bundle(sm90, {}, {}, {})))
    pkg.save(tmp_path / "k.smpkg")
    loaded = sm.load_package(tmp_path / "k.smpkg").function()
    note = _pipeline(loaded, dev, {"x": (2, 4)}).kernel_note
    assert note.startswith("compiled here") and "sm_90" in note and "cpu" in note
    here = current_target("cpu")
    pkg.add_kernels("main", {"x": (2, 4)}, here, kernels.pack(kernels.Bundle(here, {}, {}, {})))
    assert _pipeline(fn, dev, {"x": (2, 4)}).kernel_note.startswith("using the package's compiled kernels (0 kernels")


# -- what a dispatch does with the caller's memory -------------------------------------------------------
def test_dispatch_writes_the_callers_outputs_and_uses_the_callers_heap():
    g = sm.Graph()
    x = g.placeholder((-1, 64), sm.float32, name="x")
    w = g.constant(np.random.RandomState(0).randn(64, 64).astype(np.float32) / 8)
    y = g.tanh(g.matrix_multiplication(g.relu(x @ w), w))  # intermediates that no fusion removes
    fn = Package.from_graph(g, {"x": x}, {"y": y}).function()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (16, 64)})
    assert pipe.intermediates_heap_size > 0
    heap = dev.new_heap(pipe.intermediates_heap_size)
    heap.data.torch().fill_(0xAB)
    xin = sm.TensorData(np.random.RandomState(1).randn(16, 64).astype(np.float32))
    out = np.full((16, 64), np.nan, np.float32)
    cb = dev.new_command_queue().command_buffer()
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": xin, "y": sm.TensorData(out)})
    enc.dispatch_network(heap)
    enc.end()
    cb.commit()
    cb.wait()
    wn = w.op.attrs["value"].numpy()
    np.testing.assert_allclose(out, np.tanh(np.maximum(xin.numpy() @ wn, 0) @ wn), rtol=1e-5, atol=1e-6)
    assert (heap.data.torch()[:pipe.intermediates_heap_size] != 0xAB).any()  # intermediates went there


def test_timeline_example_runs_with_triton_interpreter(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "timeline.json"
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "timeline.py"), "--size", "16",
                           "--frames", "2", "--out", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert names == ["render depth+normals", "shader", "composite"] * 2
    assert "max error against torch" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pipeline_streams_events_and_timestamps(cnn):
    model, fn = cnn
    dev = sm.device("cuda")
    pipe = _pipeline(fn, dev, {"x": (4, 3, 16, 16)})
    heap = dev.new_heap(pipe.intermediates_heap_size)
    x = torch.randn(4, 3, 16, 16, device="cuda")
    xin, yout = dev.new_tensor((4, 3, 16, 16), sm.float32), dev.new_tensor((4, 10), sm.float32)
    ev = dev.new_shared_event("input ready")
    upload = dev.new_command_queue("upload", timestamps=True).command_buffer()
    with upload.compute_encoder() as ce:
        ce.dispatch(lambda: xin.torch().copy_(x), name="upload")
    upload.signal_event(ev, 1)
    infer = dev.new_command_queue("infer", timestamps=True).command_buffer()
    infer.wait_for_event(ev, 1)
    enc = infer.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": xin, "output": yout})
    enc.dispatch_network(heap)
    enc.end()
    infer.commit()
    upload.commit()
    infer.wait(60)
    upload.wait(60)
    with torch.no_grad():
        want = model.cuda()(x)
    model.cpu()
    assert (yout.torch() - want).abs().max().item() <= 1e-4
    spans = {s.name: s for s in upload.timeline + infer.timeline}
    assert spans["main"].start_us >= spans["upload"].end_us - 1.0
    assert {s.clock for s in spans.values()} == {"gpu"} and spans["main"].end_us > spans["main"].start_us


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_zoo_pipelines_match_pytorch(name):
    """Every zoo network, compiled into a pipeline and dispatched from a command buffer."""
    import warnings

    model, (x,) = zoo.build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = sm.package.from_torch(model, (x,)).function()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev)
    (in_name,), (out_name, shape) = list(pipe.input_types), next(iter(pipe.output_shapes.items()))
    y = dev.new_tensor(shape, sm.float32)
    cb = dev.new_command_queue().command_buffer()
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({in_name: sm.TensorData(x), out_name: y})
    enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size))
    enc.end()
    cb.commit()
    cb.wait(120)
    with torch.no_grad():
        assert (y.torch() - model(x)).abs().max().item() <= 1e-4


def test_module_examples():
    import doctest
    import importlib

    for name in ("commands", "device", "ml", "resources"):
        module = importlib.import_module(f"stitchml.pipeline.{name}")
        failures, tried = doctest.testmod(module)
        assert tried > 0 and failures == 0


# -- bound runs: a dispatch on the caller's memory, placed once ------------------------------------------
def _two_output_fn():
    """y = tanh(relu(x @ w) @ w) through an intermediate, z = x * 3 + 1 (both kernels write outputs)."""
    g = sm.Graph()
    x = g.placeholder((-1, 8), sm.float32, name="x")
    w = g.constant(np.random.RandomState(0).randn(8, 8).astype(np.float32) / 3)
    y = g.tanh(g.matrix_multiplication(g.relu(x @ w), w))
    return Package.from_graph(g, {"x": x}, {"y": y, "z": x * 3.0 + 1.0}).function(), w.op.attrs["value"].double()


def _want(x, w):
    x = x.double()
    return torch.tanh(torch.relu(x @ w) @ w), x * 3 + 1


def _dispatch(q, pipe, heap, table, times=1):
    for _ in range(times):
        cb = q.command_buffer()
        enc = cb.ml_encoder()
        enc.set_pipeline(pipe)
        enc.set_argument_table(table)
        enc.dispatch_network(heap)
        enc.end()
        cb.commit()
        cb.wait(60)


def test_bound_run_writes_the_callers_memory_in_place():
    fn, w = _two_output_fn()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (5, 8)})
    heap, q = dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue()
    x = sm.TensorData(torch.randn(5, 8))
    y, z = dev.new_tensor((5, 8), sm.float32), dev.new_tensor((5, 8), sm.float32)
    table = {"x": x, "y": y, "z": z}
    _dispatch(q, pipe, heap, table, times=3)
    (run, *_), = pipe._bindings.values()  # one binding for one table, reused
    bound = run.__self__
    assert bound.zero_copy and bound.launches == 3
    assert bound.env[bound.results[0][0]] is y.torch() and bound.env[bound.results[1][0]] is z.torch()
    want_y, want_z = _want(x.torch(), w)
    assert (y.torch().double() - want_y).abs().max() <= 1e-5
    assert (z.torch().double() - want_z).abs().max() <= 1e-6
    x.torch().copy_(torch.randn(5, 8))  # same tensors, new contents: the binding reads them
    _dispatch(q, pipe, heap, table)
    assert (y.torch().double() - _want(x.torch(), w)[0]).abs().max() <= 1e-5 and len(pipe._bindings) == 1


def test_bound_run_stages_strided_and_aliased_memory():
    fn, w = _two_output_fn()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (5, 8)})
    heap, q = dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue()
    big = torch.randn(8, 10)
    x = sm.TensorData(big.t()[:5, :8])  # strided (column-major) view: staged into a contiguous buffer
    y_cols = torch.zeros(8, 5)
    y = sm.TensorData(y_cols.t())  # a non-contiguous output
    z = sm.TensorData(torch.zeros(5, 8))
    _dispatch(q, pipe, heap, {"x": x, "y": y, "z": z})
    want_y, want_z = _want(big.t()[:5, :8], w)
    assert (y_cols.t().double() - want_y).abs().max() <= 1e-5 and (z.torch().double() - want_z).abs().max() <= 1e-6
    bound = next(iter(pipe._bindings.values()))[0].__self__
    assert not bound.zero_copy and len(bound.stage_in) == 1
    # z written over x itself: the network reads all of x before anything lands there
    xz = torch.randn(5, 8)
    x0 = xz.clone()
    same = sm.TensorData(xz)
    _dispatch(q, pipe, heap, {"x": same, "y": dev.new_tensor((5, 8), sm.float32), "z": same})
    assert (xz.double() - _want(x0, w)[1]).abs().max() <= 1e-6
    shared = dev.new_tensor((5, 8), sm.float32)
    cb = q.command_buffer()
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": x, "y": shared, "z": shared})
    with pytest.raises(sm.PipelineError, match="output z shares memory with another output"):
        enc.dispatch_network(heap)


def test_bindings_are_kept_for_recent_tables_and_released():
    import importlib

    pipeline_device = importlib.import_module("stitchml.pipeline.device")  # the module, not sm.device
    fn, w = _two_output_fn()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (2, 8)})
    heap, q = dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue()
    tables = [{"x": sm.TensorData(torch.randn(2, 8)), "y": dev.new_tensor((2, 8), sm.float32),
               "z": dev.new_tensor((2, 8), sm.float32)} for _ in range(pipeline_device.BINDINGS + 2)]
    for t in tables:
        _dispatch(q, pipe, heap, t)
        assert (t["y"].torch().double() - _want(t["x"].torch(), w)[0]).abs().max() <= 1e-5
    assert len(pipe._bindings) == pipeline_device.BINDINGS
    first = pipe._bindings[next(iter(pipe._bindings))]
    assert first[2][0][1] is tables[2]["x"]  # the two oldest tables were dropped
    pipe.release_bindings()
    assert not pipe._bindings


def test_argument_table_check_is_remembered_but_not_fooled():
    fn, _ = _two_output_fn()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev, {"x": (2, 8)})
    table = {"x": dev.new_tensor((2, 8), sm.float32), "y": dev.new_tensor((2, 8), sm.float32),
             "z": dev.new_tensor((2, 8), sm.float32)}
    enc = dev.new_command_queue().command_buffer().ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table(table)
    enc.set_argument_table(dict(table))  # same tensors: accepted from the remembered check
    with pytest.raises(sm.PipelineError, match="output 'z' must be TensorData float32"):
        enc.set_argument_table({**table, "z": dev.new_tensor((3, 8), sm.float32)})
    with pytest.raises(sm.PipelineError, match="unknown names"):
        enc.set_argument_table({**table, "w": table["x"]})


def test_unbindable_executables_still_dispatch():
    g = sm.Graph()
    x = g.placeholder((4,), sm.float32, name="x")
    fn = Package.from_graph(g, {"x": x}, {"y": x + g.random_uniform((4,), seed=3)}).function()
    dev = sm.device("cpu")
    pipe = _pipeline(fn, dev)
    assert pipe.executable.bind({fn.input_tensor("x"): torch.zeros(4)}, {fn.output_tensor("y"): torch.zeros(4)}) is None
    y = dev.new_tensor((4,), sm.float32)
    _dispatch(dev.new_command_queue(), pipe, dev.new_heap(pipe.intermediates_heap_size),
              {"x": sm.TensorData(torch.ones(4)), "y": y})
    assert ((y.torch() >= 1) & (y.torch() < 2)).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_dispatch_replays_in_place_and_allocates_nothing():
    fn, w = _two_output_fn()
    dev = sm.device("cuda")
    pipe = _pipeline(fn, dev, {"x": (64, 8)})
    heap, q = dev.new_heap(pipe.intermediates_heap_size), dev.new_command_queue("frames")
    x, y, z = (dev.new_tensor((64, 8), sm.float32) for _ in range(3))
    source = torch.randn(30, 64, 8, device="cuda")
    done = []
    for frame in range(30):
        cb = q.command_buffer(timestamps=frame >= 28)  # GPU timing asked for on the last two frames
        with cb.compute_encoder() as ce:  # the caller's own work on the queue, before the network reads it
            ce.dispatch(lambda f=frame: x.torch().copy_(source[f]), name="upload")
        enc = cb.ml_encoder()
        enc.set_pipeline(pipe)
        enc.set_argument_table({"x": x, "y": y, "z": z})
        enc.dispatch_network(heap)
        enc.end()
        if frame == 29:
            cb.add_completed_handler(lambda c: done.append(c.status))
        cb.commit()
        if frame == 2:
            torch.cuda.synchronize()
            allocated = torch.cuda.memory_allocated()
        cb.wait(60)
        want_y, want_z = _want(source[frame].cpu(), w)
        assert (y.torch().cpu().double() - want_y).abs().max() <= 1e-5
        assert (z.torch().cpu().double() - want_z).abs().max() <= 1e-5
    assert torch.cuda.memory_allocated() == allocated  # dispatches after the capture allocate nothing
    bound = next(iter(pipe._bindings.values()))[0].__self__
    assert bound.graph is not None and bound.zero_copy and bound.capture_error is None
    deadline = time.time() + 10
    while not done and time.time() < deadline:
        time.sleep(0.01)
    assert done == ["completed"]
    spans = cb.timeline
    assert [s.name for s in spans] == ["upload", "main"] and spans[0].end_us <= spans[1].start_us + 1e-3
    assert spans[1].end_us > spans[1].start_us and {s.clock for s in spans} == {"gpu"}
    cb = q.command_buffer()
    with cb.compute_encoder() as ce:
        ce.dispatch(lambda: x.torch().copy_(source[0]), name="upload")
    cb.commit()
    assert cb.status in ("committed", "completed")
    cb.wait(60)
    assert cb.status == "completed" and [s.clock for s in cb.timeline] == ["host"]
