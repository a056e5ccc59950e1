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


# Cycles the GPU spins before each timed run (about 1 ms on an H200): the host enqueues the run meanwhile, so
# the events time the GPU's work alone. Timed from an idle GPU they would time the host's enqueueing too: on
# an H200 a batch-1 cuDNN convolution of ResNet-18 read 70-110 us that way against 19-40 us for the Triton
# template, which picked the template, though replayed in a CUDA graph the cuDNN kernel takes 5.8 us and the
# template up to 81 (benchmarks/dispatch_parts.py --kernels).
SPIN_CYCLES = 2_000_000


def _time(fn: Callable[[list], None], env: list) -> float:
    """Milliseconds of the GPU's work for one run of `fn`, between CUDA events recorded behind a spin."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spin = getattr(torch.cuda, "_sleep", None)  # private to torch: without it, timed from where the GPU is
    if spin is not None:
        spin(SPIN_CYCLES)
    a.record()
    fn(env)
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


# Untimed rounds, then timed ones, every candidate once a round. The GPU's clocks move with what ran just
# before: on an H200 one 8192^3 product with its epilogue in slabs read 1.74 ms timed after its compile
# (three warm-up runs) and 1.54 ms timed after ~25 runs of its measured choice (benchmarks/bench_epilogue.py,
# benchmarks/results/epilogue_h200_2026-12-02_first.json). Warm-up rounds take the clocks to their loaded state;
# interleaving spreads what is left of the drift over all candidates alike.
WARM_ROUNDS, ROUNDS = 2, 6


def measure(candidates: dict[str, Callable[[list], None]], env: list,
            failures: dict[str, BaseException] | None = None) -> dict[str, float]:
    """Median milliseconds per candidate over ROUNDS interleaved rounds, after WARM_ROUNDS untimed ones. A
    candidate that raises (a generated kernel this GPU or Triton refuses) is left out, and what it raised put
    in `failures` when given (it raises otherwise)."""
    live = dict(candidates)
    for _ in range(WARM_ROUNDS):  # queued: the first timed run's events start after them
        for name, fn in list(live.items()):
            try:
                fn(env)
            except Exception as e:  # noqa: BLE001  (see the docstring)
                if failures is None:
                    raise
                failures[name] = e
                del live[name]
    samples: dict[str, list[float]] = {name: [] for name in live}
    names = list(live)
    for r in range(ROUNDS):
        for name in names if r % 2 == 0 else names[::-1]:  # a drift within a round cancels too
            samples[name].append(_time(live[name], env))
    return {name: statistics.median(times) for name, times in samples.items()}


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
        raised: dict[str, BaseException] = {}
        self.timings = measure(self.candidates, env, raised)
        self.failures = {name: f"{type(e).__name__}: {e}" for name, e in raised.items()}
        if not self.timings:
            raise next(iter(raised.values()))
        best = min(self.timings, key=self.timings.get)
        _store(self.key, best)
        return best
