"""The benchmark scripts' shared timers (import them as `from timing import median_ms`; a script's own folder
is on its path when it runs)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], device, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of `fn()` over `reps` calls after `warmup` calls: between CUDA events on a GPU
    (`device` a CUDA device or its name), by the wall clock otherwise."""
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def batched_cuda_ms(fn: Callable[[], object], reps: int = 30, warmup: int = 5, inner: int | None = None) -> float:
    """Median milliseconds per call of `fn()` between CUDA events, each sample timing `inner` back-to-back
    calls (by default enough for ~0.5 ms of work, at most 100) so that the host's launch of the next call
    overlaps the device's work, as in a real program; host-bound contenders show their host cost."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if inner is None:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        inner = max(1, min(100, int(0.5e-3 / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)
