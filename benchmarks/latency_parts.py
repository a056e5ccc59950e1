"""Where the host time of a one-kernel run goes (informs runtime/executable.py's plain path and
runtime/native_run.py)."""
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from stitchml.runtime import native_run  # noqa: E402


def per_call(fn, n=5000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


@contextlib.contextmanager
def stubbed(exe):
    """Runs of `exe` with its launches stubbed out: the native runner (runtime/native_run.py) launches
    through an entry that does nothing and succeeds, the Python prepared run's steps do nothing."""
    runner, steps = exe._prepared, exe.steps
    native = type(runner).__name__ == "Runner"
    saved, real = runner.launchers() if native else None, [s.run for s in steps]
    if native:
        noop = native_run.module().noop_launch()
        runner.set_launchers(noop, noop)
    for s in steps:
        s.run = lambda env: None
    try:
        yield
    finally:
        for s, r in zip(steps, real):
            s.run = r
        if native:
            runner.set_launchers(*saved)


def main():
    g = sm.Graph()
    x = g.placeholder((-1,), sm.float32, name="x")
    y = 0.5 * x * (1.0 + g.erf(x * g.reciprocal(g.square_root(g.constant(2.0, sm.float32)))))
    exe = g.compile({x: sm.TensorType((4096,), sm.float32)}, [y], device="cuda")
    a = torch.randn(4096, device="cuda")
    out = torch.empty_like(a)
    exe.run({x: a})
    launch = exe.steps[0].run
    env = [None] * exe.slot_count
    env[launch.slots[0]], env[launch.slots[1]] = a, out
    rows = [("exe.run", per_call(lambda: exe.run({x: a}))),
            ("step launch (direct launcher)", per_call(lambda: launch(env))),
            ("triton jit entry", per_call(lambda: launch.fn[launch.grid](a, out, *launch.sizes, num_warps=launch.warps,
                                                                         **launch.meta))),
            ("torch.empty 4K", per_call(lambda: torch.empty((4096,), dtype=torch.float32, device="cuda"))),
            ("torch.erf 4K (one eager op)", per_call(lambda: torch.erf(a))),
            ("g.run (a request seen before)", per_call(lambda: g.run({x: a}, [y])))]
    with stubbed(exe):
        rows.append(("exe.run without the launch", per_call(lambda: exe.run({x: a}))))
    # g.run's lookup: its run over its executable's own, both with the kernel's work stubbed out
    gexe = next(iter(g._executables.entries.values()))
    with stubbed(gexe):
        own, both = per_call(lambda: gexe.run({x: a})), per_call(lambda: g.run({x: a}, [y]))
    rows.append(("g.run lookup (g.run - exe.run, launches stubbed)", both - own))
    for name, us in rows:
        print(f"{name:<50} {us:7.2f} us")
    print(f"g.run requests answered by the fast lookup: {g._executables.fast_hits}")


if __name__ == "__main__":
    main()
