"""Every sample graph of the compiler tests, compiled for CUDA and checked against the eager run on CUDA.

CI has no GPU: there the same kernels run under Triton's interpreter. This script is the GPU half of
that check, run on a CUDA machine:  python benchmarks/gpu_check.py [--json out.json]
It prints one line per failing case and a summary; the exit status is 1 when any case fails.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from compiler_util import Feeds, all_cases, assert_match, assert_reference, seeded  # noqa: E402
from tolerance import sensitivity  # noqa: E402

import stitchml as sm  # noqa: E402


def check(case) -> str | None:
    g = sm.Graph(case.name)
    feeds = Feeds(g, seeded(case.name))
    targets = list(case.build(g, feeds))
    exe = g.compile({p: v.cuda() for p, v in feeds.items()}, targets, device="cuda")
    first = exe.run({p: v.cuda() for p, v in feeds.items()})  # runs the steps one by one
    got = exe.run({p: v.cuda() for p, v in feeds.items()})  # replays the graph captured after the first run
    # Op by op on the same device: cuBLAS and cuDNN calls are the same on both sides.
    want = g.run({p: v.cuda() for p, v in feeds.items()}, targets, device="cuda", compiled=False)
    refs = [None] * len(targets)
    if case.reference is not None:  # as in CI: a kernel may be closer to float64 than half-type eager is
        args = [v.double() if v.dtype.is_floating_point else v for v in feeds.values()]
        refs = [torch.as_tensor(r) for r in case.reference(*args)]
        scales = sensitivity(case.reference, args)
        for i, (t, r) in enumerate(zip(targets, refs)):
            scale = scales[i] if i < len(scales) else None
            assert_reference(got[t].torch().cpu(), r, f"{case.name}: target {i} cuda vs float64 reference",
                             case.family, scale)
    for i, (t, r) in enumerate(zip(targets, refs)):
        for run, result in (("first run", first), ("replay", got)):
            assert_match(result[t].torch().cpu(), want[t].torch().cpu(), f"{case.name}: target {i} cuda {run} vs eager",
                         case.tol, reference=r, family=case.family)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gpu_check.json"))
    parser.add_argument("--budget", type=float, default=1e9, help="stop starting new cases after this many seconds")
    parser.add_argument("--only", nargs="*", help="check just these cases (by name)")
    args = parser.parse_args()
    # Full float32 convolutions on both sides, so that the float64 reference check means something
    # (cuDNN may use TF32 by default; matmuls already default to full float32).
    torch.backends.cudnn.allow_tf32 = False
    cases = [c for c in all_cases() if not c.known_failure and (not args.only or c.name in args.only)]
    failures = {}
    start, done = time.perf_counter(), 0
    for case in cases:
        if time.perf_counter() - start > args.budget:
            break
        done += 1
        try:
            check(case)
        except Exception as e:  # noqa: BLE001  (every case is reported, one failure must not hide others)
            failures[case.name] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"FAIL {case.name}: {failures[case.name]}", flush=True)
            if len(failures) <= 3:
                traceback.print_exc()
    print(f"{done - len(failures)} of {done} sample graphs checked ({len(cases)} in all) match on "
          f"{torch.cuda.get_device_name()} in {time.perf_counter() - start:.0f} s")
    with open(args.json, "w") as f:
        json.dump({"cases": len(cases), "checked": done, "failures": failures}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
