"""GeLU from primitives, as in the talk: constants, square_root, multiplication, erf and addition.

    $ stitchml demo gelu                                   # check, kernel, source, timings on every device
    $ stitchml demo gelu --device cuda --plot gelu.png --json gelu.json

The custom activation is built from primitives; the compiler stitches them into one kernel, whose
generated Triton source is shown. The check runs it on every device against torch.nn.functional.gelu;
the timing table compares the stitched kernel with the same primitives in PyTorch eager (one kernel
each), PyTorch's own gelu kernel and torch.compile, from 4K elements to 256M on a GPU (small sizes on
the CPU). `--plot FILE` draws the table (matplotlib, in the `plot` extra).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import numpy as np
import torch

import stitchml as sm
from stitchml.cli import device_argument, positive
from stitchml.demos import default_threads

GPU_SIZES = tuple(4 ** k * 4096 for k in range(9))  # 4K, 16K, ... 256M elements
CPU_SIZES = (4096, 65536, 1 << 20)
SQRT_2 = math.sqrt(2.0)


def build(dtype=sm.float32):
    """The activation, ``0.5 x (1 + erf(x / sqrt 2))``, of primitives only; returns (graph, x, y)."""
    g = sm.Graph("gelu")
    x = g.placeholder((-1, -1), dtype, name="x")
    half, one = g.constant(0.5, dtype), g.constant(1.0, dtype)
    root2 = g.square_root(g.constant(2.0, dtype))
    y = g.multiplication(g.multiplication(half, x), g.addition(one, g.erf(g.division(x, root2))), name="gelu")
    return g, x, y


def torch_primitives(x: torch.Tensor) -> torch.Tensor:
    """The same primitives in PyTorch eager: one kernel each."""
    return 0.5 * x * (1.0 + torch.erf(x / SQRT_2))


def size_argument(text: str) -> tuple[int, ...]:
    """argparse `type=` for --sizes: element counts, comma-separated, with K and M suffixes (4K = 4096)."""
    sizes = []
    for part in text.split(","):
        scale = {"K": 1 << 10, "M": 1 << 20}.get(part[-1:].upper(), 1)
        digits = part[:-1] if scale > 1 else part
        if not digits.isdigit() or int(digits) == 0:
            raise argparse.ArgumentTypeError(f"expected element counts above 0 such as 4K,1M,256M, got {part!r}")
        sizes.append(int(digits) * scale)
    return tuple(sizes)


def kernel(g: sm.Graph, x: sm.Tensor, y: sm.Tensor, device: str) -> tuple[str, str]:
    """The fusion report and the generated Triton source of the activation compiled for `device`.

    On a CPU without Triton's interpreter the executable runs its stitched kernel through the reference
    implementation; the source shown is then the one the interpreter would run.
    """
    signature = {x: sm.TensorType((64, 64), x.dtype)}
    exe = g.compile(signature, [y], device=device)
    sources = exe.kernel_sources()
    if not sources:
        try:
            sources = g.compile(signature, [y], device=device, options={"backend": "interpret"}).kernel_sources()
        except ImportError:
            sources = {"": "(Triton is not installed: no generated source)"}
    header = f"{exe.kernel_count} kernel(s) for {len(g.operations)} operations ({exe.backend} backend):"
    return header + "\n" + exe.fusion_report(), "\n\n".join(sources.values())


def cuda_ms(fn, reps: int = 20, warmup: int = 3, inner: int | None = None) -> float:
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


def _timer(device: str):
    """A function giving the median milliseconds of a call: CUDA events on a GPU, the wall clock on the CPU."""
    if device.startswith("cuda"):
        return cuda_ms

    def cpu_ms(fn, reps: int = 20) -> float:
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    return cpu_ms


def timings(g: sm.Graph, x: sm.Tensor, y: sm.Tensor, device: str, sizes: tuple[int, ...], *,
            torch_compile: bool = True, reps: int = 20) -> list[dict]:
    """One row per size: milliseconds per call of each contender, and the stitched kernel's largest error
    against torch.nn.functional.gelu on the same input."""
    timer = _timer(device)
    compiled = torch.compile(torch_primitives) if torch_compile else None
    rows = []
    for n in sizes:
        a = torch.randn(1, n, device=device)
        exe = g.compile({x: sm.TensorType((1, n), sm.float32)}, [y], device=device)
        got = exe.run({x: a})[y].torch()
        want = torch.nn.functional.gelu(a)
        row = {"elements": n, "device": device, "kernels": exe.kernel_count,
               "max_error": float((got - want).abs().max()), "ms": {}}
        contenders = {"stitchml": lambda: exe.run({x: a}), "torch eager": lambda: torch_primitives(a),
                      "torch gelu": lambda: torch.nn.functional.gelu(a)}
        if compiled is not None:
            contenders["torch.compile"] = lambda: compiled(a)
        for who, fn in contenders.items():
            row["ms"][who] = timer(fn, reps)
        rows.append(row)
        print(_format_row(row), flush=True)
        del a, got, want, exe
    return rows


def _label(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _format_header(contenders: list[str]) -> str:
    return f"{'elements':>9} " + " ".join(f"{who + ' ms':>16}" for who in contenders) + \
        f" {'stitchml GB/s':>14} {'vs eager':>9} {'max error':>10}"


def _format_row(row: dict) -> str:
    ms = row["ms"]
    gbs = 8 * row["elements"] / (ms["stitchml"] * 1e-3) / 1e9  # 4 bytes read, 4 written per element
    return f"{_label(row['elements']):>9} " + " ".join(f"{v:16.4f}" for v in ms.values()) + \
        f" {gbs:14.1f} {ms['torch eager'] / ms['stitchml']:8.2f}x {row['max_error']:10.2e}"


def plot(rows: list[dict], path: str) -> None:
    """Time per call and effective bandwidth against size, one line per contender, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sizes = [r["elements"] for r in rows]
    for who in rows[0]["ms"]:
        ms = [r["ms"][who] for r in rows]
        left.plot(sizes, ms, marker="o", label=who)
        right.plot(sizes, [8 * n / (t * 1e-3) / 1e9 for n, t in zip(sizes, ms)], marker="o", label=who)
    for ax, ylabel in ((left, "ms per call"), (right, "GB/s (8 bytes an element)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sizes, [_label(n) for n in sizes], rotation=45)
        ax.set_xlabel("elements")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    left.legend()
    fig.suptitle(f"GeLU from primitives, float32 on {rows[0]['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchml demo gelu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", action="append", type=device_argument,
                        help="cpu, cuda or cuda:N, once per device (default: every available device)")
    parser.add_argument("--rows", type=positive(int), default=1024, help="the check's input rows (default 1024)")
    parser.add_argument("--cols", type=positive(int), default=1024, help="the check's input columns (default 1024)")
    parser.add_argument("--sizes", type=size_argument, help="element counts to time, such as 4K,1M,256M "
                                                            "(default: 4K to 256M on a GPU, 4K to 1M on the CPU)")
    parser.add_argument("--reps", type=positive(int), default=20, help="timed calls per contender and size")
    parser.add_argument("--no-timings", action="store_true", help="only the check, the kernel and its source")
    parser.add_argument("--no-torch-compile", action="store_true",
                        help="leave torch.compile out of the timings (its first compile takes a while on a CPU)")
    parser.add_argument("--plot", help="draw the timings of the last device into this PNG (needs matplotlib)")
    parser.add_argument("--json", help="write the timing rows to this file")
    parser.add_argument("--threads", type=positive(int), help="CPU threads (default: half the cores, at least 1)")
    args = parser.parse_args(argv)
    for option, path in (("--plot", args.plot), ("--json", args.json)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            parser.error(f"{option} {path!r}: the folder {folder!r} does not exist")
    if args.plot and args.no_timings:
        parser.error("--plot draws the timings: leave out --no-timings")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'stitchml[plot]'")
    torch.set_num_threads(args.threads or default_threads())
    devices = args.device or (["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    g, x, y = build()
    print(g)
    a = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    ref = torch.nn.functional.gelu(torch.from_numpy(a).double()).numpy()
    worst = 0.0
    for device in devices:
        out = g.run({x: sm.TensorData(a)}, [y], device=device)[y].numpy()
        err = float(np.abs(out - ref).max())
        worst = max(worst, err)
        print(f"{device:>5}: {args.rows}x{args.cols} max |stitchml - torch gelu| = {err:.3e}")
    report, source = kernel(g, x, y, devices[-1])
    print(f"\ncompiled for {devices[-1]}: {report}\n\n{source}")
    rows = []
    if not args.no_timings:
        for device in devices:
            sizes = args.sizes or (GPU_SIZES if device.startswith("cuda") else CPU_SIZES)
            contenders = ["stitchml", "torch eager", "torch gelu"] + ([] if args.no_torch_compile else ["torch.compile"])
            print(f"\n{device}, float32, median of {args.reps} calls each:\n{_format_header(contenders)}", flush=True)
            device_rows = timings(g, x, y, device, sizes, torch_compile=not args.no_torch_compile, reps=args.reps)
            worst = max([worst] + [r["max_error"] for r in device_rows])
            rows += device_rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"timings written to {args.json}")
    if args.plot:
        plot([r for r in rows if r["device"] == devices[-1]], args.plot)
        print(f"plot written to {args.plot}")
    return 0 if worst < 1e-5 else 1
