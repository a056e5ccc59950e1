"""Roofline per kernel: how far each step of an executable is from the machine's limits.

Each step's bytes and FLOPs come from the IR: bytes are what it must read and write at least (each
distinct input once, each output once); FLOPs count one per element of every elementwise op and of every
reduction's input, 2*M*N*K for a matrix product and 2 per multiply-add of a convolution. Opaque steps
(gathers, pooling...) and views count their bytes only. The machine's limits are measured once per device
and cached in ``$STITCHML_CACHE_DIR/roofline.json``: the bandwidth of a large device-to-device copy (bytes
read plus written) and the throughput of a large matrix product (bfloat16 on a GPU, its tensor cores;
float32 on the CPU).

`profile(exe, feeds)` (`Executable.profile`) times every step (median of `repeats` profiled runs) and
returns a `Roofline`: per step its time, achieved bandwidth and FLOP/s, their fractions of the measured
limits, the time the step would take at the limit, and the time left on the table (the difference);
steps are sorted by the last, largest first.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

from ..registry import ELEMENTWISE, REDUCTION, lookup

_PEAKS: dict[str, dict[str, float]] = {}
_SKIP = ("placeholder", "variable", "constant", "assign_variable")


def _numel(t) -> int:
    return math.prod(t.shape)


def _nbytes(t) -> int:
    return _numel(t) * t.dtype.itemsize


def _flops(op) -> int:
    """FLOPs of one user-level op (0 for ops that only move data)."""
    kind = lookup(op.op).kind
    if op.op == "matrix_multiplication":
        a = op.inputs[0]
        return 2 * _numel(op.outputs[0]) * a.shape[-1]
    if op.op == "convolution2d":
        w = op.inputs[1]
        out_channels = w.shape[0] if op.attrs.get("weights_layout", "OIHW") == "OIHW" else w.shape[3]
        return 2 * _numel(op.outputs[0]) * (_numel(w) // max(out_channels, 1))
    if kind == ELEMENTWISE:
        return _numel(op.outputs[0])
    if kind == REDUCTION:
        return _numel(op.inputs[0])
    return 0


def cost(op) -> tuple[int, int]:
    """(bytes, FLOPs) of one step's program op: a fused kernel, a vendor call, an opaque op or a view."""
    if lookup(op.op).view is not None and len(op.inputs) == 1:
        return 0, 0
    inputs = {t.id: t for t in op.inputs}
    moved = sum(_nbytes(t) for t in inputs.values()) + sum(_nbytes(t) for t in op.outputs)
    if op.op == "fusion":
        body = op.attrs["body"]
        return moved, sum(_flops(o) for o in body.operations if o.op not in _SKIP)
    return moved, _flops(op)


def _cache_file() -> str:
    root = os.environ.get("STITCHML_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "stitchml")
    return os.path.join(root, "roofline.json")


def device_key(device: torch.device) -> str:
    """What the measured limits are filed under: the GPU's name, or the CPU's kind and thread count."""
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.machine()}:{platform.processor() or 'unknown'}:{torch.get_num_threads()} threads"


def _best(fn, device: torch.device, repeats: int) -> float:
    """Fastest of `repeats` timed calls of `fn()` after one warm-up, in seconds."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(times)


def measure(device: torch.device) -> dict[str, float]:
    """Measure the copy bandwidth (bytes/s, read plus written) and matrix-product throughput (FLOP/s)."""
    cuda = device.type == "cuda"
    n = (1 << 30) if cuda else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    copy = _best(lambda: dst.copy_(src), device, 5)
    size, dtype = (8192, torch.bfloat16) if cuda else (1024, torch.float32)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    product = _best(lambda: torch.matmul(a, b), device, 5)
    return {"copy_bytes_per_s": 2 * n / copy, "matmul_flops_per_s": 2 * size ** 3 / product,
            "matmul_dtype": str(dtype).replace("torch.", "")}


def peaks(device: torch.device) -> dict[str, float]:
    """The device's measured limits, measured on first use and cached (in memory and on disk)."""
    key = device_key(device)
    if key in _PEAKS:
        return _PEAKS[key]
    path = _cache_file()
    stored: dict = {}
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        stored = {}
    entry = stored.get(key) if isinstance(stored, dict) else None
    if not (isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) and entry[k] > 0
                                            for k in ("copy_bytes_per_s", "matmul_flops_per_s"))):
        entry = measure(device)
        stored = stored if isinstance(stored, dict) else {}
        stored[key] = entry
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(stored, f, indent=1)
            os.replace(tmp, path)
        except OSError:  # an unwritable cache only costs measuring again in the next process
            pass
    _PEAKS[key] = entry
    return entry


@dataclass
class Roofline:
    """Per-step figures of a profiled executable, sorted by the time left on the table."""

    device: str
    copy_bytes_per_s: float
    matmul_flops_per_s: float
    rows: list[dict]

    def __str__(self) -> str:
        lines = [f"roofline on {self.device}: copy {self.copy_bytes_per_s / 1e9:.1f} GB/s, "
                 f"matrix product {self.matmul_flops_per_s / 1e12:.2f} TFLOP/s",
                 f"{'step':32} {'kind':10} {'ms':>9} {'GB/s':>9} {'%bw':>6} {'GFLOP/s':>9} {'%peak':>6} "
                 f"{'left ms':>9}"]
        for r in self.rows:
            lines.append(f"{r['step'][:32]:32} {r['kind']:10} {r['ms']:9.4f} {r['bytes_per_s'] / 1e9:9.2f} "
                         f"{100 * r['bandwidth_fraction']:6.1f} {r['flops_per_s'] / 1e9:9.2f} "
                         f"{100 * r['flops_fraction']:6.1f} {r['left_ms']:9.4f}")
        return "\n".join(lines)


def profile(exe, feeds: dict | None = None, repeats: int = 5) -> Roofline:
    """Time each step of `exe` (median of `repeats` profiled runs after one warm-up) against the device's
    measured limits (see the module docstring)."""
    limits = peaks(exe.device)
    ops = {op.name: op for op in exe.program.operations if op.op not in _SKIP}
    exe.run(feeds, profile=True)
    samples: dict[int, list[float]] = {}
    for _ in range(max(1, repeats)):
        exe.run(feeds, profile=True)
        for i, (_, _, ms) in enumerate(exe.last_profile):
            samples.setdefault(i, []).append(ms)
    rows = []
    for i, step in enumerate(exe.steps):
        ms = statistics.median(samples.get(i, [0.0]))
        nbytes, flops = cost(ops[step.name]) if step.name in ops else (0, 0)
        seconds = ms / 1e3
        achieved_bw = nbytes / seconds if seconds > 0 else 0.0
        achieved_flops = flops / seconds if seconds > 0 else 0.0
        ideal_ms = 1e3 * max(nbytes / limits["copy_bytes_per_s"], flops / limits["matmul_flops_per_s"])
        rows.append({"step": step.name, "kind": step.kind, "ms": ms, "bytes": nbytes, "flops": flops,
                     "bytes_per_s": achieved_bw, "flops_per_s": achieved_flops,
                     "bandwidth_fraction": achieved_bw / limits["copy_bytes_per_s"],
                     "flops_fraction": achieved_flops / limits["matmul_flops_per_s"],
                     "ideal_ms": ideal_ms, "left_ms": max(ms - ideal_ms, 0.0)})
    rows.sort(key=lambda r: -r["left_ms"])
    return Roofline(device_key(exe.device), limits["copy_bytes_per_s"], limits["matmul_flops_per_s"], rows)
