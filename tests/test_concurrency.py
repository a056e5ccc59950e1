"""Graphs, executables, heaps and interpreted kernels used from several threads at once.

Each test starts its threads on a barrier and shortens the interpreter's switch interval, so
threads interleave inside every run; each one fails when the lock it covers is taken away
(docs/semantics.md, "Threads"). Results are checked against what the same work gives on one
thread. As for every interpreter test, TRITON_INTERPRET=1 must be set before Triton is imported
(`.ci/run` exports it for the whole run).
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest
import torch

import stitchml as sm

THREADS = 4


@pytest.fixture(autouse=True)
def interleave():
    """Switch threads every few microseconds instead of every 5 ms: a race shows within a few runs."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def _in_threads(work, n: int = THREADS) -> list:
    """`work(i)` on `n` threads started together; their results in thread order (errors re-raised)."""
    start = threading.Barrier(n)
    results, errors = [None] * n, []

    def body(i):
        start.wait()
        try:
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001  (re-raised on the calling thread)
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def _counter():
    g = sm.Graph("counter")
    c = g.variable(np.zeros((), np.float64), name="c")
    step = g.assign_variable(c, c + 1.0)
    return g, c, step


def _slowed(exe):
    """`exe` with a pause after each step: a run that reads a variable and writes it later keeps the
    window between the two open long enough for any other thread to run in it."""
    for st in exe.steps:
        st.run = (lambda run: lambda env: (run(env), time.sleep(2e-4)))(st.run)
    return exe


def _copying(g, c):
    """An executable that computes c + 1 into a buffer and copies it into c after its kernels (a target
    keeps the new value out of the variable's storage), so the read and the write are apart."""
    new = c + 1.0
    exe = g.compile(targets=[new], target_ops=[g.assign_variable(c, new)], device="cpu")
    assert exe._assigns and not exe._in_place
    return _slowed(exe)


# -- variables and run_count: one run lock per graph ---------------------------------------------------------
def test_counter_from_eager_and_two_executables_loses_no_increment():
    """Eager runs, and runs of two executables of the graph, all read-modify-write one variable."""
    g, c, step = _counter()
    first, second = _slowed(g.compile(target_ops=[step], device="cpu")), _copying(g, c)
    runs = 60
    paths = [lambda: g.run(target_ops=[step], device="cpu"), first.run, second.run]

    def work(i):
        for k in range(runs):
            paths[(i + k) % 3]()

    _in_threads(work)
    assert g.variable_value(c).item() == THREADS * runs
    assert g.run_count == THREADS * runs


def test_two_executables_of_one_graph_lose_no_increment():
    g, c, _ = _counter()
    exes = [_copying(g, c), _copying(g, c)]
    runs = 80
    _in_threads(lambda i: [exes[i % 2].run() for _ in range(runs)])
    assert g.variable_value(c).item() == THREADS * runs
    assert g.run_count == THREADS * runs


def test_random_draws_are_unique_and_those_of_sequential_runs():
    """Run k draws from (seed, k): concurrent runs take distinct run indices, so no draw repeats and the
    draws are exactly those of as many runs on one thread."""
    def build():
        g = sm.Graph("draws")
        r = g.random_uniform((4,), seed=11, name="r")
        return g, r

    g, r = build()
    exe = _slowed(g.compile(targets=[r], device="cpu"))
    runs = 30

    def work(i):
        out = []
        for k in range(runs):
            res = g.run(targets=[r], device="cpu") if (i + k) % 2 else exe.run()
            out.append(tuple(res[r].numpy().tolist()))
        return out

    draws = [d for per in _in_threads(work) for d in per]
    assert len(set(draws)) == len(draws) == THREADS * runs
    ref, rr = build()
    want = {tuple(ref.run(targets=[rr], device="cpu")[rr].numpy().tolist()) for _ in range(THREADS * runs)}
    assert set(draws) == want


def test_compiled_runs_from_threads_compile_once(monkeypatch):
    from stitchml.runtime import compiled

    compile_graph, together = compiled.compile_graph, threading.Barrier(THREADS)

    def meeting_compile(*args):
        """Waits (up to 0.5 s) for every thread to be compiling too: only a cache that lets one
        thread compile while the others wait for it lets them meet here."""
        try:
            together.wait(0.5)
        except threading.BrokenBarrierError:
            pass
        return compile_graph(*args)

    monkeypatch.setattr(compiled, "compile_graph", meeting_compile)
    g = sm.Graph("cached")
    x = g.placeholder((8,), sm.float32, name="x")
    y = g.exponent(x) * 2.0
    feed = np.linspace(-1, 1, 8, dtype=np.float32)
    out = _in_threads(lambda i: g.run({x: feed}, [y], device="cpu", compiled=True)[y].numpy())
    for o in out:
        np.testing.assert_allclose(o, np.exp(feed.astype(np.float64)) * 2.0, rtol=1e-6)
    assert len(g.compile_log) == 1, g.compile_log


def test_variable_value_is_a_copy_that_later_runs_leave_alone():
    """Compiled runs write a variable's storage in place; the value handed out earlier must not move."""
    g, c, step = _counter()
    exe = g.compile(target_ops=[step], device="cpu")
    exe.run()
    snapshot = g.variable_value(c)
    exe.run()
    assert snapshot.item() == 1.0
    assert g.variable_value(c).item() == 2.0
    snapshot.torch().fill_(100.0)  # and writing into it does not reach the graph
    assert g.variable_value(c).item() == 2.0

    def work(i):
        seen = []
        for _ in range(20):
            v = g.variable_value(c)
            exe.run()
            seen.append((v.item(), v))
        return [(a, b.item()) for a, b in seen]

    for pairs in _in_threads(work):
        assert all(a == b for a, b in pairs)


def test_save_between_runs_sees_whole_runs(tmp_path):
    """A save from another thread while runs go on holds the variables and run_count of one moment."""
    g = sm.Graph("pair")
    a = g.variable(np.zeros((), np.float64), name="a")
    b = g.variable(np.zeros((), np.float64), name="b")
    steps = [g.assign_variable(a, a + 1.0), g.assign_variable(b, b + 1.0)]
    exe = g.compile(target_ops=steps, device="cpu")

    def work(i):
        if i:
            for k in range(40):
                exe.run() if k % 2 else g.run(target_ops=steps, device="cpu")
            return None
        snaps = []
        for k in range(8):
            path = tmp_path / f"g{k}.json"
            g.save(path)
            loaded = sm.Graph.load(path)
            snaps.append((loaded.variable_value(loaded.tensor("a")).item(),
                          loaded.variable_value(loaded.tensor("b")).item(), loaded.run_count))
        return snaps

    for va, vb, count in _in_threads(work)[0]:
        assert va == vb == count


# -- bound runs share the executable's arena -------------------------------------------------------------------
def test_bound_and_plain_runs_of_one_executable_share_its_arena_safely():
    g = sm.Graph("arena")
    x = g.placeholder((16, 16), sm.float32, name="x")
    w = g.constant(np.random.RandomState(0).randn(16, 16).astype(np.float32) / 4, name="w")
    y = g.tanh(g.matrix_multiplication(g.relu(x @ w), w))  # intermediates that live in the arena
    exe = g.compile({x: sm.TensorType((16, 16), sm.float32)}, [y], device="cpu")
    assert exe.intermediates_heap_size > 0
    wn = w.op.attrs["value"].double().numpy()
    rng = np.random.RandomState(1)
    inputs = [rng.randn(16, 16).astype(np.float32) for _ in range(THREADS)]
    want = [np.tanh(np.maximum(xi.astype(np.float64) @ wn, 0) @ wn) for xi in inputs]

    def work(i):
        if i % 2:
            for _ in range(15):
                np.testing.assert_allclose(exe.run({x: inputs[i]})[y].numpy(), want[i], rtol=1e-4, atol=1e-5)
            return
        xin, out = torch.from_numpy(inputs[i]), torch.empty(16, 16)
        bound = exe.bind({x: xin}, {y: out})  # heap=None: the executable's own arena
        for _ in range(15):
            bound.launch()
            np.testing.assert_allclose(out.numpy(), want[i], rtol=1e-4, atol=1e-5)

    _in_threads(work)


# -- building ----------------------------------------------------------------------------------------------------
def test_building_from_threads_gives_unique_ids_in_program_order(monkeypatch):
    import stitchml.graph

    class SlowOperation(stitchml.graph.Operation):
        """Takes its time to construct: a builder that reads the id counter and bumps it later lets every
        other thread read the same id meanwhile."""

        def __init__(self, *args, **kwargs):
            time.sleep(1e-5)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(stitchml.graph, "Operation", SlowOperation)
    g = sm.Graph("built")
    x = g.placeholder((3,), sm.float32, name="x")
    per_thread = 150

    def work(i):
        t = x
        for k in range(per_thread):
            t = g.addition(t, float(k))
        return t

    ends = _in_threads(work)
    ops = g.operations
    op_ids = [op.id for op in ops]
    tensor_ids = [t.id for op in ops for t in op.outputs]
    assert op_ids == sorted(set(op_ids)), "op ids repeat or are out of program order"
    assert len(set(tensor_ids)) == len(tensor_ids)
    assert g._next_op == len(ops) and g._next_tensor == len(tensor_ids)
    got = g.run({x: np.zeros(3, np.float32)}, ends, device="cpu")
    for t in ends:
        np.testing.assert_array_equal(got[t].numpy(), np.full(3, sum(range(per_thread)), np.float32))


# -- heaps: one queue at a time ----------------------------------------------------------------------------------
def _pipeline_and_table(dev):
    g = sm.Graph("net")
    x = g.placeholder((8, 16), sm.float32, name="x")
    w = g.constant(np.random.RandomState(2).randn(16, 16).astype(np.float32) / 4, name="w")
    y = g.tanh(g.matrix_multiplication(g.relu(x @ w), w))
    fn = sm.package.Package.from_graph(g, {"x": x}, {"y": y}).function()
    pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    return pipe, w.op.attrs["value"].double().numpy()


def _encode(queue, pipe, heap, xin, yout, label):
    cb = queue.command_buffer(label)
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": xin, "y": yout})
    enc.dispatch_network(heap)
    enc.end()
    return cb


def test_heap_used_by_a_pending_buffer_of_another_queue_is_refused():
    dev = sm.device("cpu")
    pipe, wn = _pipeline_and_table(dev)
    assert pipe.intermediates_heap_size > 0
    heap = dev.new_heap(pipe.intermediates_heap_size)
    q1, q2 = dev.new_command_queue("left"), dev.new_command_queue("right")
    xin = sm.TensorData(np.random.RandomState(3).randn(8, 16).astype(np.float32))
    y1, y2 = dev.new_tensor((8, 16), sm.float32), dev.new_tensor((8, 16), sm.float32)
    cb1 = _encode(q1, pipe, heap, xin, y1, "first")
    with pytest.raises(sm.PipelineError, match=r"in use by command buffer 'first' on queue 'left' \(encoding"):
        _encode(q2, pipe, heap, xin, y2, "second")
    same_queue = _encode(q1, pipe, heap, xin, y2, "after")  # buffers of one queue run in order: allowed
    cb1.commit()
    same_queue.commit()
    same_queue.wait()
    cb1.wait()
    cb2 = _encode(q2, pipe, heap, xin, y2, "second")  # both done: the heap is free for another queue
    cb2.commit()
    cb2.wait()
    want = np.tanh(np.maximum(xin.numpy().astype(np.float64) @ wn, 0) @ wn)
    np.testing.assert_allclose(y1.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2.numpy(), want, rtol=1e-5, atol=1e-6)


def test_heap_shared_by_queues_on_threads_is_refused_or_correct():
    """Threads each drive their own queue on one heap: a dispatch is either refused or computes exactly."""
    dev = sm.device("cpu")
    pipe, wn = _pipeline_and_table(dev)
    heap = dev.new_heap(pipe.intermediates_heap_size)
    rng = np.random.RandomState(4)
    inputs = [sm.TensorData(rng.randn(8, 16).astype(np.float32)) for _ in range(THREADS)]
    want = [np.tanh(np.maximum(t.numpy().astype(np.float64) @ wn, 0) @ wn) for t in inputs]

    def work(i):
        q, out, refused = dev.new_command_queue(f"q{i}"), dev.new_tensor((8, 16), sm.float32), 0
        for k in range(20):
            try:
                cb = _encode(q, pipe, heap, inputs[i], out, f"t{i}-{k}")
            except sm.PipelineError as e:
                assert "in use by command buffer" in str(e)
                refused += 1
                continue
            time.sleep(1e-3)  # the buffer holds the heap a moment: the threads overlap however fast a run is
            cb.commit()
            cb.wait()
            np.testing.assert_allclose(out.numpy(), want[i], rtol=1e-5, atol=1e-6)
        return refused

    assert sum(_in_threads(work)) > 0  # the threads did contend for the heap


# -- Triton's interpreter ------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("triton_interpreter")
def test_interpreted_kernels_run_from_threads():
    """Under TRITON_INTERPRET=1 the generated kernels of different graphs (no shared run lock) run at once."""
    rng = np.random.RandomState(5)
    feeds = [rng.randn(32, 16).astype(np.float32) for _ in range(THREADS)]
    exes = []
    for i in range(THREADS):
        g = sm.Graph(f"k{i}")
        x = g.placeholder((32, 16), sm.float32, name="x")
        y = g.reduction_sum(g.exponent(x * 0.5) + float(i), [1])
        exe = g.compile({x: sm.TensorType((32, 16), sm.float32)}, [y], device="cpu")
        assert exe.backend == "interpret" and exe.kernel_count >= 1
        exes.append((exe, x, y))

    def work(i):
        exe, x, y = exes[i]
        want = (np.exp(feeds[i].astype(np.float64) * 0.5) + i).sum(1)
        for _ in range(6):
            np.testing.assert_allclose(exe.run({x: feeds[i]})[y].numpy(), want, rtol=1e-5)

    _in_threads(work)
