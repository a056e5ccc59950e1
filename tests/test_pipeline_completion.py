"""A command buffer's completion on a GPU queue, checked on the CPU: a real CPU network dispatched on a queue
whose stream and CUDA runtime are stand-ins that script what the device answers. Work already done costs one
query and no synchronize; running work is synchronized once; CUDA errors, a bound run's division check,
handlers, timeouts and GPU timestamps keep their behaviour."""
import gc
import threading

import numpy as np
import pytest

import stitchml as sm
from stitchml.errors import ExecutionError, PipelineError
from stitchml.runtime.cudart import NOT_READY


class FakeRuntime:
    """The direct-call CUDA runtime: queries answer from `answers` (then 0), calls are logged."""

    def __init__(self, answers=(), sync_code=0):
        self.answers, self.sync_code, self.calls = list(answers), sync_code, []

    def _query(self, what, handle):
        self.calls.append((what, handle))
        return self.answers.pop(0) if self.answers else 0

    def stream_query(self, handle):
        return self._query("stream_query", handle)

    def event_query(self, handle):
        return self._query("event_query", handle)

    def stream_synchronize(self, handle):
        self.calls.append(("stream_synchronize", handle))
        self.answers = []  # the work is over once a synchronize returns
        return self.sync_code

    def event_synchronize(self, handle):
        self.calls.append(("event_synchronize", handle))
        self.answers = []
        return self.sync_code

    def event_record(self, handle, stream):
        self.calls.append(("event_record", handle))
        return 0

    def fail(self, what, code):
        raise RuntimeError(f"{what} failed: CUDA error {code} (scripted)")


class FakeEvent:
    """A pooled timing event: `cuda_event` is its handle, `at` its time in ms."""

    def __init__(self, handle, at=0.0):
        self.cuda_event, self.at = handle, at

    def elapsed_time(self, other):
        return other.at - self.at


@pytest.fixture(scope="module")
def network():
    g = sm.Graph()
    x = g.placeholder((2, 3), sm.float32, name="x")
    fn = sm.package.Package.from_graph(g, {"x": x}, {"y": g.relu(x) * 3.0}).function()
    dev = sm.device("cpu")
    pipe = sm.Compiler(dev).new_ml_pipeline(sm.MLPipelineDescriptor(fn))
    return dev, pipe


def _gpu_queue(dev, rt, events=0, timestamps=False):
    q = dev.new_command_queue("gpu", timestamps=timestamps)
    q.stream, q._direct, q._handle = object(), rt, 77  # what a CUDA queue holds: a stream and its handle
    q.timestamps = timestamps
    q._events.extend(FakeEvent(100 + i, at=float(i)) for i in range(events))
    return q


def _dispatch(q, pipe, heap, x, y, check=None, timestamps=None):
    if check is not None:  # as a bound CUDA run whose kernels flag integer divisions
        pipe._last = (None, None, None, None)
        real = pipe.bound
        pipe.bound = lambda table, h: (real(table, h)[0], check)
    cb = q.command_buffer(timestamps=timestamps)
    enc = cb.ml_encoder()
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": x, "y": y})
    enc.dispatch_network(heap)
    enc.end()
    if check is not None:
        del pipe.bound
        pipe._last = (None, None, None, None)
    return cb


def _tensors(dev):
    data = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    return sm.TensorData(data), dev.new_tensor((2, 3), sm.float32), np.maximum(data, 0) * 3.0


def test_wait_on_finished_work_queries_once_and_does_not_synchronize(network):
    dev, pipe = network
    rt = FakeRuntime()
    q = _gpu_queue(dev, rt)
    heap = dev.new_heap(pipe.intermediates_heap_size)
    x, y, want = _tensors(dev)
    cb = _dispatch(q, pipe, heap, x, y)
    cb.commit()
    cb.wait()
    assert rt.calls == [("stream_query", 77)]
    assert cb.status == "completed" and np.array_equal(y.numpy(), want)
    cb.wait()  # a second wait asks the device nothing
    assert rt.calls == [("stream_query", 77)]


def test_wait_on_running_work_synchronizes_once(network):
    dev, pipe = network
    rt = FakeRuntime(answers=[NOT_READY, NOT_READY])
    q = _gpu_queue(dev, rt)
    cb = _dispatch(q, pipe, dev.new_heap(pipe.intermediates_heap_size), *_tensors(dev)[:2])
    cb.commit()
    assert cb.status == "committed"  # the status asks the device, which still runs it
    cb.wait()
    assert rt.calls == [("stream_query", 77), ("stream_query", 77), ("stream_synchronize", 77)]
    assert cb.status == "completed"


def test_a_cuda_error_fails_the_buffer_and_reaches_its_handler(network):
    dev, pipe = network
    rt = FakeRuntime(answers=[NOT_READY], sync_code=700)
    q = _gpu_queue(dev, rt, events=1)
    cb = _dispatch(q, pipe, dev.new_heap(pipe.intermediates_heap_size), *_tensors(dev)[:2])
    seen = []
    done = threading.Event()
    cb.add_completed_handler(lambda c: (seen.append((c.status, type(c.error))), done.set()))
    cb.commit()
    with pytest.raises(PipelineError, match="CUDA error 700"):
        cb.wait(10)
    assert done.wait(10) and seen == [("error", RuntimeError)]
    # with a handler the buffer records an event after its work and waits for that, not the whole stream
    assert ("event_record", 100) in rt.calls and ("stream_synchronize", 77) not in rt.calls
    assert q._events == []  # the event of a failed buffer does not go back to the pool
    with pytest.raises(PipelineError, match="CUDA error 700"):  # and again, from the finished buffer
        cb.wait()


def test_a_bound_runs_division_check_runs_once_the_work_is_done(network):
    dev, pipe = network
    rt = FakeRuntime(answers=[NOT_READY])
    q = _gpu_queue(dev, rt)
    heap = dev.new_heap(pipe.intermediates_heap_size)
    x, y, _ = _tensors(dev)
    order = []

    def check():
        order.append(rt.calls[-1][0])
        raise ExecutionError("integer division by zero in op 'div' (scripted)")

    cb = _dispatch(q, pipe, heap, x, y, check=check)
    cb.commit()
    with pytest.raises(ExecutionError, match="integer division by zero"):
        cb.wait()
    assert order == ["stream_synchronize"] and cb.status == "error"
    fine = _dispatch(q, pipe, heap, x, y, check=lambda: order.append("checked"))
    fine.commit()
    fine.wait()
    assert order[-1] == "checked" and fine.status == "completed"
    plain = _dispatch(q, pipe, heap, x, y)  # a run that flags nothing has no check
    plain.commit()
    plain.wait()
    assert order[-1] == "checked" and len(order) == 2


def test_wait_with_a_timeout_on_work_that_does_not_finish(network):
    dev, pipe = network
    rt = FakeRuntime(answers=[NOT_READY] * 100000)
    q = _gpu_queue(dev, rt)
    cb = _dispatch(q, pipe, dev.new_heap(pipe.intermediates_heap_size), *_tensors(dev)[:2])
    cb.commit()
    with pytest.raises(PipelineError, match="not done after 0.02 s"):
        cb.wait(0.02)
    assert cb.status == "committed" and ("stream_synchronize", 77) not in rt.calls
    rt.answers = []  # the device finishes
    cb.wait(10)
    assert cb.status == "completed"


def test_gpu_timestamps_become_spans_and_their_events_are_reused(network):
    dev, pipe = network
    rt = FakeRuntime()
    q = _gpu_queue(dev, rt, events=2, timestamps=True)
    dev_origin = dev.origin_event
    dev.origin_event = FakeEvent(0, at=-1.0)
    try:
        cb = _dispatch(q, pipe, dev.new_heap(pipe.intermediates_heap_size), *_tensors(dev)[:2])
        cb.commit()
        cb.wait()
        (span,) = cb.timeline
    finally:
        dev.origin_event = dev_origin
    # the pool hands out its last event first: the mark before the dispatch is at 1 ms, the one after at 0 ms
    assert span.clock == "gpu" and (span.start_us, span.end_us) == (2000.0, 1000.0)
    assert rt.calls[-1] == ("event_query", 100)  # the last mark tells when the buffer is done
    assert sorted(e.cuda_event for e in q._events) == [100, 101]  # both back in the pool


def test_a_heap_forgets_buffers_gone_but_not_one_still_encoding(network):
    dev, pipe = network
    heap = dev.new_heap(pipe.intermediates_heap_size)
    left, right = dev.new_command_queue("left"), dev.new_command_queue("right")
    x, y, want = _tensors(dev)
    pending = _dispatch(left, pipe, heap, x, y)  # encoded, never committed: it holds the heap
    for i in range(300):
        cb = _dispatch(left, pipe, heap, x, y)
        cb.commit()
        cb.wait()
        if i % 50 == 0:
            gc.collect()  # a buffer and its encoders form a cycle: the collector frees them
    del cb
    assert len(heap._users) <= 128 and np.array_equal(y.numpy(), want)
    with pytest.raises(PipelineError, match="in use by command buffer .* on queue 'left'"):
        _dispatch(right, pipe, heap, x, y)
    del pending
    gc.collect()
    _dispatch(right, pipe, heap, x, y).commit()  # gone: the heap is free for the other queue
