"""Compiled kernels carried in a package: does a process that loads it compile nothing?

    $ python benchmarks/check_package_kernels.py [--model cnn] [--batch 8] [--load-batch 16] [--json out.json]

Needs a CUDA GPU. Builds a package of a zoo network (stitchml/package/zoo.py, through torch.export),
compiles its kernels for the batch size (`Package.compile_kernels`) and saves it. Then two fresh
processes, each with empty TRITON_CACHE_DIR and STITCHML_CACHE_DIR, load the package, make an ML
pipeline and dispatch it once:

* **with the bundle**: the pipeline installs the package's kernels before it compiles;
* **without**: the descriptor's `use_package_kernels` is off, so everything compiles there.

With `--load-batch`, the loading processes run another batch size than the bundle was built for: generated
kernels take their sizes as arguments, so the bundle still serves every kernel whose launch blocks agree.

Each reports the pipeline's `kernel_note`, the seconds from loading the package to the pipeline and
to the first result, how many kernels Triton compiled and how many it found in its cache (Triton's
compilation listener), and the cache entries that appeared after the pipeline was made: kernel entries,
and Triton's host libraries (launchers, utilities), which bundles leave out and Triton builds where they
are missing. Both outputs are compared with each other and with PyTorch. Exits 1 when the bundle holds
no compiled kernel, the process with it compiled one or did not use it, or the outputs disagree.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # this checkout's stitchml
MODES = ("with", "without")


def _entries(cache: str) -> dict[str, str]:
    """Triton cache entries by name: "kernel" (a compiled kernel's group), "host" (a .so) or "other"."""
    if not os.path.isdir(cache):
        return {}
    out = {}
    for entry in os.listdir(cache):
        names = os.listdir(os.path.join(cache, entry)) if os.path.isdir(os.path.join(cache, entry)) else []
        out[entry] = "kernel" if any(n.startswith("__grp__") for n in names) else \
            "host" if any(".so" in n for n in names) else "other"
    return out


def _listen(counts: dict) -> bool:
    """Count Triton's compiles and cache hits; False where this Triton has no compilation listener."""
    try:
        from triton import knobs
    except ImportError:
        return False
    if not hasattr(knobs, "compilation") or not hasattr(knobs.compilation, "listener"):
        return False

    def heard(*, cache_hit: bool, **_) -> None:
        counts["cache_hits" if cache_hit else "compiled"] += 1

    knobs.compilation.listener = heard
    return True


def child(args) -> int:
    """One loading process: load, make the pipeline, dispatch once, write what happened as JSON."""
    import numpy as np
    import torch

    import stitchml as sm
    from stitchml.package import kernels

    counts = {"compiled": 0, "cache_hits": 0}
    listening = _listen(counts)
    t0 = time.perf_counter()
    fn = sm.load_package(os.path.join(args.work, "model.smpkg")).function()
    dev = sm.device(args.device)
    desc = sm.MLPipelineDescriptor(fn)
    desc.use_package_kernels = args.child == "with"
    example = np.load(os.path.join(args.work, "input.npy"))
    desc.set_input_dimensions(fn.inputs[0].name, example.shape)
    pipeline = sm.Compiler(dev).new_ml_pipeline(desc)
    pipeline_s = time.perf_counter() - t0
    cache = kernels.triton_cache_dir()
    installed = _entries(cache)
    x = sm.TensorData(torch.from_numpy(example).to(dev.torch_device))
    (out_name, shape), = pipeline.output_shapes.items()
    y = dev.new_tensor(shape, sm.float32)
    cb = dev.new_command_queue("check").command_buffer("first")
    enc = cb.ml_encoder()
    enc.set_pipeline(pipeline)
    enc.set_argument_table({fn.inputs[0].name: x, out_name: y})
    enc.dispatch_network(dev.new_heap(pipeline.intermediates_heap_size))
    enc.end()
    cb.commit()
    cb.wait()
    first_result_s = time.perf_counter() - t0
    new = {e: kind for e, kind in _entries(cache).items() if e not in installed}
    np.save(os.path.join(args.work, f"{args.child}.npy"), y.numpy())
    report = {"note": pipeline.kernel_note, "pipeline_s": pipeline_s, "first_result_s": first_result_s,
              "installed_kernel_entries": sum(k == "kernel" for k in installed.values()),
              "new_kernel_entries": sum(k == "kernel" for k in new.values()),
              "new_host_library_entries": sum(k == "host" for k in new.values()),
              "triton_compiled": counts["compiled"] if listening else None,
              "triton_cache_hits": counts["cache_hits"] if listening else None}
    with open(os.path.join(args.work, f"{args.child}.json"), "w") as f:
        json.dump(report, f)
    return 0


def _run_child(mode: str, args) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(args.work, f"{mode}-triton"),
               STITCHML_CACHE_DIR=os.path.join(args.work, f"{mode}-stitchml"))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--work", args.work,
                           "--device", args.device], env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        raise SystemExit(f"the process {mode} the bundle failed:\n{done.stderr[-4000:]}")
    with open(os.path.join(args.work, f"{mode}.json")) as f:
        report = json.load(f)
    report["process_s"] = time.perf_counter() - t0
    return report


def parent(args) -> int:
    os.environ["TRITON_CACHE_DIR"] = os.path.join(args.work, "build-triton")
    os.environ["STITCHML_CACHE_DIR"] = os.path.join(args.work, "build-stitchml")
    import numpy as np
    import torch

    import stitchml as sm
    from stitchml.package import kernels, zoo

    if not torch.cuda.is_available():
        print("needs a CUDA device: kernels are compiled for a GPU", file=sys.stderr)
        return 2
    model, (example,) = zoo.build(args.model)
    x = torch.randn(args.batch, *example.shape[1:], generator=torch.Generator().manual_seed(1))
    load_batch = args.load_batch or args.batch
    dynamic = ({0: torch.export.Dim("batch", min=2, max=4096)},) if load_batch != args.batch else None
    pkg = sm.package.from_torch(model, (x,), dynamic_shapes=dynamic)
    t0 = time.perf_counter()
    entry = pkg.compile_kernels("main", {pkg.function().inputs[0].name: tuple(x.shape)} if dynamic else {},
                                device=args.device)
    build_s = time.perf_counter() - t0
    blob, _ = pkg.find_kernels("main", entry.input_dimensions, entry.target)
    bundle = kernels.unpack(blob)
    pkg.save(os.path.join(args.work, "model.smpkg"))
    x = torch.randn(load_batch, *example.shape[1:], generator=torch.Generator().manual_seed(2)) \
        if load_batch != args.batch else x
    np.save(os.path.join(args.work, "input.npy"), x.numpy())
    result = {"model": args.model, "batch": args.batch, "load_batch": load_batch, "target": entry.target,
              "built_with": bundle.built_with,
              "bundle_bytes": len(blob), "bundle_sources": len(bundle.sources),
              "bundle_kernels": bundle.kernel_count, "compile_kernels_s": build_s}
    for mode in MODES:
        result[mode] = _run_child(mode, args)
    with torch.no_grad():
        expected = model(x).numpy()
    outputs = {mode: np.load(os.path.join(args.work, f"{mode}.npy")) for mode in MODES}
    result["max_diff_with_vs_without"] = float(np.abs(outputs["with"] - outputs["without"]).max())
    result["max_diff_vs_torch"] = float(np.abs(outputs["with"] - expected).max())
    problems = []
    if not bundle.kernel_count:
        problems.append("the bundle holds no compiled kernels: nothing was found in Triton's cache after compiling")
    w = result["with"]
    if w["triton_compiled"] or w["new_kernel_entries"]:
        problems.append(f"the process with the bundle compiled kernels ({w['triton_compiled']} by Triton's "
                        f"listener, {w['new_kernel_entries']} new cache entries)")
    if not w["note"].startswith("using the package's compiled kernels"):
        problems.append(f"the pipeline did not use the bundle: {w['note']}")
    if result["max_diff_with_vs_without"] > 1e-5 or result["max_diff_vs_torch"] > 1e-3:
        problems.append("the outputs disagree")
    result["problems"] = problems
    _print(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if problems else 0


def _print(r: dict) -> None:
    t = r["target"]
    print(f"{r['model']}, batch {r['batch']} (loaded for batch {r['load_batch']}): "
          f"bundle of {r['bundle_sources']} kernel sources and "
          f"{r['bundle_kernels']} compiled kernels, {r['bundle_bytes'] / 1024:.0f} KiB, built in "
          f"{r['compile_kernels_s']:.1f} s for {t['arch']} / triton {t['triton']} ({r['built_with'].get('device')}, "
          f"torch {r['built_with'].get('torch')})")
    for mode in MODES:
        m = r[mode]
        print(f"{mode} the bundle:")
        print(f"  note: {m['note']}")
        print(f"  package load to pipeline {m['pipeline_s']:.2f} s, to first result {m['first_result_s']:.2f} s "
              f"(whole process {m['process_s']:.1f} s)")
        print(f"  Triton compiled {m['triton_compiled']} kernels and found {m['triton_cache_hits']} in its cache; "
              f"cache entries installed {m['installed_kernel_entries']}, new: {m['new_kernel_entries']} kernels, "
              f"{m['new_host_library_entries']} host libraries (Triton's launchers: never carried, built here)")
    print(f"first result {r['with']['first_result_s']:.2f} s with the bundle, "
          f"{r['without']['first_result_s']:.2f} s without")
    print(f"outputs: with vs without max |diff| {r['max_diff_with_vs_without']:.2e}, "
          f"vs PyTorch {r['max_diff_vs_torch']:.2e}")
    print("PASS" if not r["problems"] else "FAIL: " + "; ".join(r["problems"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", help="a zoo network (default: cnn)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--load-batch", type=int, default=None,
                        help="the batch size the loading processes run (default: --batch)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--timeout", type=float, default=120, help="seconds each loading process may take")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    args.work = tempfile.mkdtemp(prefix="check-package-kernels-")
    try:
        return parent(args)
    finally:
        if args.keep:
            print(f"kept {args.work}")
        else:
            shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
