"""Asynchronous runs: one queue per graph, runs execute in submission order.

`Graph.run_async` returns a `RunHandle`; its completion callback receives
``(results, error)`` with exactly one of them None, like MPSGraph's
completion handler.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading
import weakref
from typing import Any, Callable

_lock = threading.Lock()
_queues: "weakref.WeakKeyDictionary[Any, cf.ThreadPoolExecutor]" = weakref.WeakKeyDictionary()


class RunHandle:
    """A queued run. ``wait()`` blocks until it ends; ``result()`` returns its results or raises its error."""

    def __init__(self, future: cf.Future):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ends (or `timeout` seconds pass); True when it has ended."""
        cf.wait([self._future], timeout=timeout)
        return self._future.done()

    def result(self, timeout: float | None = None):
        return self._future.result(timeout)

    def exception(self, timeout: float | None = None):
        return self._future.exception(timeout)


def _queue_for(owner) -> cf.ThreadPoolExecutor:
    with _lock:
        q = _queues.get(owner)
        if q is None:
            q = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stitchml-run")
            _queues[owner] = q
            weakref.finalize(owner, q.shutdown, wait=False)
        return q


def submit(owner, work: Callable[[], Any], on_complete: Callable[[Any, BaseException | None], None] | None) -> RunHandle:
    future = _queue_for(owner).submit(work)
    if on_complete is not None:
        def notify(f: cf.Future):
            error = f.exception()
            on_complete(None if error else f.result(), error)

        future.add_done_callback(notify)
    return RunHandle(future)
