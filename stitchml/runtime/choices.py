"""Choosing between equivalent implementations by measuring them once.

Where a kernel has several correct implementations whose speed depends on
shape, dtype and GPU (cuBLAS plus a generated epilogue kernel, or cuBLASLt
with the epilogue inside the GEMM), the first run times each candidate on
the real inputs and keeps the fastest. Decisions are stored in
``$STITCHML_CACHE_DIR/choices.json`` keyed by the problem and the GPU, so a
later process measures nothing.
"""
from __future__ import annotations

import json
import os
import statistics
import threading
from typing import Callable

import torch

from .loader import cache_dir

_lock = threading.Lock()
_decisions: dict[str, str] | None = None


def _path() -> str:
    return os.path.join(os.path.dirname(cache_dir()), "choices.json")


def _load() -> dict[str, str]:
    global _decisions
    if _decisions is None:
        try:
            with open(_path()) as f:
                data = json.load(f)
            _decisions = {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
        except (OSError, ValueError):
            _decisions = {}
    return _decisions


def _store(key: str, name: str) -> None:
    with _lock:
        decisions = _load()
        decisions[key] = name
        tmp = _path() + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(decisions, f, indent=1, sort_keys=True)
        os.replace(tmp, _path())


def _time(fn: Callable[[list], None], env: list, reps: int = 5) -> float:
    fn(env)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(env)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


class Chooser:
    """A step that runs the fastest of its candidates (all must compute the same values)."""

    def __init__(self, key: str, candidates: dict[str, Callable[[list], None]]):
        self.key = key
        self.candidates = candidates
        self.chosen: str | None = None
        self.timings: dict[str, float] = {}
        self.failures: dict[str, str] = {}  # candidates that raised when measured, and what they raised
        # Set when every candidate must run once even if a decision is stored: compiling kernels for a
        # package has to compile each candidate's kernels, since the machine that loads it may choose another.
        self.remeasure = False

    def __call__(self, env: list) -> None:
        if self.chosen is None:
            self.chosen = self._decide(env)
        self.candidates[self.chosen](env)

    def _decide(self, env: list) -> str:
        if len(self.candidates) == 1:
            return next(iter(self.candidates))
        known = None if self.remeasure else _load().get(self.key)
        if known in self.candidates:
            return known
        if torch.cuda.is_current_stream_capturing():
            return next(iter(self.candidates))
        self.timings, first = {}, None
        for name, fn in self.candidates.items():
            try:
                self.timings[name] = _time(fn, env)
            except Exception as e:  # noqa: BLE001  (a generated kernel this GPU or Triton refuses is not chosen)
                self.failures[name] = f"{type(e).__name__}: {e}"
                first = first or e
        if not self.timings:
            raise first
        best = min(self.timings, key=self.timings.get)
        _store(self.key, best)
        return best
