"""Asynchronous runs: one queue per graph, runs execute in submission order.

`Graph.run_async` returns a `RunHandle`; its completion handler receives
``(results, error)`` with exactly one of them None, like MPSGraph's
completion handler. The handler runs on the queue's thread right after its
run, before the handle counts as done: once `wait()` returns, the handler has
run. A handler that raises is logged and its exception kept on the handle
(`handler_exception()`); the run's own result is not changed by it.
"""
from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import weakref
from typing import Any, Callable

_log = logging.getLogger("stitchml")
_lock = threading.Lock()
_queues: "weakref.WeakKeyDictionary[Any, cf.ThreadPoolExecutor]" = weakref.WeakKeyDictionary()


class RunHandle:
    """A queued run. ``wait()`` blocks until it and its completion handler have ended; ``result()`` returns
    its results or raises its error."""

    def __init__(self):
        self._future: cf.Future = cf.Future()
        self._handler_error: BaseException | None = None

    def done(self) -> bool:
        """True once the run and its completion handler have ended."""
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run and its handler end (or `timeout` seconds pass); True when they have."""
        cf.wait([self._future], timeout=timeout)
        return self._future.done()

    def result(self, timeout: float | None = None):
        """The run's {target: TensorData}, after its handler has run; raises the run's error."""
        results, error = self._future.result(timeout)
        if error is not None:
            raise error
        return results

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The run's error, or None, after its handler has run."""
        return self._future.result(timeout)[1]

    def handler_exception(self, timeout: float | None = None) -> BaseException | None:
        """What the completion handler raised (it is also logged), or None."""
        self._future.result(timeout)
        return self._handler_error


def _queue_for(owner) -> cf.ThreadPoolExecutor:
    with _lock:
        q = _queues.get(owner)
        if q is None:
            q = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stitchml-run")
            _queues[owner] = q
            weakref.finalize(owner, q.shutdown, wait=False)
        return q


def submit(owner, work: Callable[[], Any], on_complete: Callable[[Any, BaseException | None], None] | None) -> RunHandle:
    """Queue `work` on `owner`'s queue; `on_complete(results, error)` runs after it, before the handle is done."""
    handle = RunHandle()

    def job() -> None:
        try:
            outcome = (work(), None)
        except Exception as e:  # the run's error belongs to the handle, as its result would
            outcome = (None, e)
        if on_complete is not None:
            try:
                on_complete(*outcome)
            except Exception as e:
                handle._handler_error = e
                _log.exception("run_async: the completion handler %r raised", on_complete)
        handle._future.set_result(outcome)

    _queue_for(owner).submit(job)
    return handle
