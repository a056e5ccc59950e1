"""The benchmark scripts' shared timers (import them as `from timing import median_ms`; a script's own folder
is on its path when it runs)."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from stitchml.demos.gelu import cuda_ms as batched_cuda_ms  # noqa: F401  (the GeLU demo's timer)


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

