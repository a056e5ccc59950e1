"""CPU command queues: an idle queue runs a committed buffer on the committing thread; order, events,
handlers and errors keep the guarantees of the worker path."""
import threading

import pytest

import stitchml as sm
from stitchml.errors import PipelineError

LONG = 10.0  # seconds: a bound that only a deadlock reaches


def _buffer(queue, label, run):
    cb = queue.command_buffer(label)
    with cb.compute_encoder(label) as ce:
        ce.dispatch(run, name=label)
    return cb


def _recorder(log, label):
    """A command that logs its label and the thread that ran it."""
    return lambda: log.append((label, threading.current_thread()))


def test_idle_queue_runs_the_buffer_on_the_committing_thread():
    dev = sm.device("cpu")
    q = dev.new_command_queue("idle")
    log = []
    for i in range(3):
        cb = _buffer(q, f"b{i}", _recorder(log, f"b{i}"))
        cb.commit()
        assert [label for label, _ in log] == [f"b{j}" for j in range(i + 1)]  # it ran inside commit()
        cb.wait()
        assert cb.status == "completed" and cb.error is None
        assert [s.name for s in cb.timeline] == [f"b{i}"]
    assert all(t is threading.current_thread() for _, t in log)


def test_buffers_behind_a_waiting_buffer_keep_queue_order():
    dev = sm.device("cpu")
    q = dev.new_command_queue("busy")
    ev = dev.new_shared_event("gate")
    log = []
    first = q.command_buffer("first")
    first.wait_for_event(ev, 1, timeout=LONG)
    with first.compute_encoder() as ce:
        ce.dispatch(_recorder(log, "first"))
    first.commit()  # the event is not signaled: it goes to the worker and commit() returns
    later = [_buffer(q, f"later{i}", _recorder(log, f"later{i}")) for i in range(3)]
    for cb in later:
        cb.commit()
    assert log == []  # nothing jumped ahead of the waiting buffer
    ev.signal(1)
    for cb in later:
        cb.wait(timeout=LONG)
    first.wait(timeout=LONG)
    assert [label for label, _ in log] == ["first", "later0", "later1", "later2"]
    assert all(t is not threading.current_thread() for _, t in log)
    after = _buffer(q, "after", _recorder(log, "after"))
    after.commit()  # the backlog is gone: the queue is idle again
    assert log[-1] == ("after", threading.current_thread())
    after.wait()


def test_a_buffer_committed_during_a_synchronous_run_waits_for_it_without_blocking_its_committer():
    dev = sm.device("cpu")
    q = dev.new_command_queue("overlap")
    started, release, log = threading.Event(), threading.Event(), []

    def slow():
        started.set()
        assert release.wait(LONG)
        log.append("slow")

    running = _buffer(q, "slow", slow)
    runner = threading.Thread(target=running.commit)
    runner.start()
    assert started.wait(LONG)  # the slow buffer is running on `runner`, inside commit()
    with pytest.raises(PipelineError, match="not done after"):  # another thread's wait() sees it running
        running.wait(timeout=0.05)
    handled = threading.Event()
    running.add_completed_handler(lambda cb: (log.append(("handler", cb.status)), handled.set()))
    quick = _buffer(q, "quick", lambda: log.append("quick"))
    quick.commit()  # returns at once: the quick buffer queues behind the running one
    assert not handled.wait(0.05) and log == []
    release.set()
    runner.join(LONG)
    assert not runner.is_alive()
    quick.wait(timeout=LONG)
    running.wait(timeout=LONG)
    assert handled.wait(LONG)
    assert log.index("slow") < log.index(("handler", "completed")) and log.index("slow") < log.index("quick")


def test_a_command_that_commits_to_its_own_queue_does_not_deadlock():
    dev = sm.device("cpu")
    q = dev.new_command_queue("nested")
    log, inner = [], []

    def outer():
        cb = _buffer(q, "inner", lambda: log.append("inner"))
        cb.commit()  # the queue is busy with this buffer: the inner one runs after it
        inner.append(cb)
        log.append("outer")

    cb = _buffer(q, "outer", outer)
    cb.commit()
    cb.wait(timeout=LONG)
    inner[0].wait(timeout=LONG)
    assert log == ["outer", "inner"]


def test_a_completed_handler_that_commits_and_waits_does_not_deadlock():
    dev = sm.device("cpu")
    q = dev.new_command_queue("handlers")
    done, log = threading.Event(), []

    def handler(cb):
        follow = _buffer(q, "follow", lambda: log.append("follow"))
        follow.commit()
        follow.wait(timeout=LONG)
        log.append(("handler", cb.label, cb.status))
        done.set()

    cb = _buffer(q, "first", lambda: log.append("first"))
    cb.add_completed_handler(handler)
    cb.commit()
    assert done.wait(LONG)
    cb.wait()
    assert log == ["first", "follow", ("handler", "first", "completed")]


def test_an_error_in_a_synchronous_run_belongs_to_its_buffer():
    dev = sm.device("cpu")
    q = dev.new_command_queue("errors")
    called, log = [], []

    def broken():
        log.append("broken")
        raise ValueError("bad input")

    cb = _buffer(q, "broken", broken)
    with cb.compute_encoder() as ce:
        ce.dispatch(lambda: log.append("never"), name="after_the_error")
    cb.add_completed_handler(lambda b: called.append(b.status))
    cb.commit()  # the error is the buffer's, not commit()'s
    with pytest.raises(PipelineError, match="broken failed: ValueError: bad input") as info:
        cb.wait(timeout=LONG)
    assert isinstance(info.value.__cause__, ValueError)
    assert cb.status == "error" and isinstance(cb.error, ValueError)
    assert log == ["broken"]  # the buffer stopped at its failing command
    ok = _buffer(q, "ok", lambda: log.append("ok"))
    ok.commit()
    ok.wait()
    assert ok.status == "completed" and log == ["broken", "ok"]
    assert called == ["error"]
    typed = _buffer(q, "typed", lambda: (_ for _ in ()).throw(PipelineError("typed failure")))
    typed.commit()
    with pytest.raises(PipelineError, match="^typed failure$"):  # StitchML errors come back unwrapped
        typed.wait()


def test_a_buffer_waiting_for_an_unsignaled_event_stays_asynchronous():
    dev = sm.device("cpu")
    q, signaler = dev.new_command_queue("waiter"), dev.new_command_queue("signaler")
    ev = dev.new_shared_event("ready")
    log = []
    waiter = q.command_buffer("waiter")
    waiter.wait_for_event(ev, 1, timeout=LONG)
    with waiter.compute_encoder() as ce:
        ce.dispatch(_recorder(log, "waiter"))
    waiter.commit()  # would block forever on the committing thread: it must return
    assert waiter.status == "committed" and log == []
    with pytest.raises(PipelineError, match="not done after"):
        waiter.wait(timeout=0.05)
    sig = _buffer(signaler, "produce", _recorder(log, "produce"))
    sig.signal_event(ev, 1)
    sig.commit()
    waiter.wait(timeout=LONG)
    assert [label for label, _ in log] == ["produce", "waiter"]
    assert log[0][1] is threading.current_thread() and log[1][1] is not threading.current_thread()
    signaled = q.command_buffer("signaled")  # an event already at its value cannot block: it runs at commit
    signaled.wait_for_event(ev, 1, timeout=LONG)
    with signaled.compute_encoder() as ce:
        ce.dispatch(_recorder(log, "signaled"))
    signaled.commit()
    assert log[-1] == ("signaled", threading.current_thread())
    signaled.wait()
