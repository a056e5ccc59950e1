"""Per-pixel MLPs inside a Triton kernel (stitchml.shader) against PyTorch eager and torch.compile, on one GPU.

    $ PYTHONPATH=$PWD python benchmarks/bench_shader.py            # needs CUDA

Rows: 16->H->16 for H in 16, 32, 64, 128 and 16->64->64->8, fp16 in and out, at 1080p and 4K
(one row per pixel), and 16->64->64->8 with its hidden layers summed in half (precision
"float16-sums"); the neural-material shading kernel at 4K (3840x2160). Times are GPU time per call from
CUDA-graph replays after warm-up (`median_us`: host launch costs are left out, for every row alike;
"+launch" is one call of ours timed alone, host launch included). The copy row is the same bytes read
and written by `Tensor.copy_`, measured in the same run, and "of copy" is copy time / kernel time over
the same bytes. The in-kernel MLP runs each shape at a few settings and reports the fastest, named:
rows per block x warps, and for persistent programs /pN sS: N programs per SM, S pipeline stages.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
import torch

RESOLUTIONS = {"1080p": 1920 * 1080, "4K": 3840 * 2160}
SHAPES = [((16, h, 16), ("relu", "none"), "float16") for h in (16, 32, 64, 128)] + \
    [((16, 64, 64, 8), ("relu", "relu", "none"), p) for p in ("float16", "float16-sums")]
# (rows per block, warps, programs per SM or None for one program per block, pipeline stages)
SETTINGS = [(128, 4, None, 1), (256, 4, None, 1), (128, 8, None, 1), (64, 4, None, 1), (128, 4, 4, 2), (128, 4, 8, 3),
            (256, 8, 4, 3), (256, 4, 4, 3), (64, 4, 16, 3), (128, 4, 16, 3)]


def median_us(fn, warmup: int = 10, reps: int = 25, launches: int = 20) -> float:
    """GPU time of one `fn()` in microseconds: the median over `reps` replays of a CUDA graph holding
    `launches` calls, divided by `launches`. A graph keeps the host's launch cost out of the figure (one
    launch through Triton's Python launcher takes tens of µs, as long as a 1080p kernel), for every row
    alike. Falls back to `launches` back-to-back calls between two events if `fn` cannot be captured."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                fn()
        run = graph.replay
    except Exception:  # noqa: BLE001  (not capturable: time the calls back to back instead)
        torch.cuda.synchronize()

        def run():
            for _ in range(launches):
                fn()
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def launch_us(fn, warmup: int = 10, reps: int = 50) -> float:
    """Median time of one `fn()` alone between two events, host launch included (an idle GPU waits for it)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def _fastest(launch, settings=None):
    """(median µs, a call of the fastest setting, its name) over `settings` (default SETTINGS); a setting
    that fails to compile is reported and skipped."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    best = None
    for block, warps, per_sm, stages in settings or SETTINGS:
        def call(block=block, warps=warps, per_sm=per_sm, stages=stages):
            return launch(block, warps, per_sm and per_sm * sms, stages)
        name = f"{block}x{warps}w" + (f"/p{per_sm}s{stages}" if per_sm else "")
        try:
            t = median_us(call)
        except Exception as e:  # noqa: BLE001  (a benchmark row still prints)
            print(f"  setting {name} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        if best is None or t < best[0]:
            best = (t, call, name)
    return best


def torch_mlp(weights, acts):
    def run(x):
        h = x
        for (w, b), a in zip(weights, acts):
            h = torch.addmm(b, h, w)
            if a == "relu":
                h = torch.relu(h)
        return h
    return run


def bench_mlp(widths, acts, rows: int, device: str, precision: str = "float16", baselines: dict | None = None) -> dict:
    """`mlp_rows` at its fastest setting, the copy of its bytes, eager and torch.compile (`baselines`:
    those of the same network measured before, reused)."""
    from stitchml.shader import MLPSpec
    from stitchml.shader.kernels import mlp_rows

    spec = MLPSpec(widths, acts, precision, "program")
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
               for a, b in zip(widths, widths[1:])]
    packed = spec.pack(weights, device)
    x = torch.randn(rows, widths[0], device=device, dtype=torch.float16)
    y = torch.empty(rows, widths[-1], device=device, dtype=torch.float16)
    copy_src = torch.empty(rows * (widths[0] + widths[-1]) // 4, device=device, dtype=torch.float32)
    copy_dst = torch.empty_like(copy_src)  # reads and writes as many bytes as the kernel's fp16 inputs and outputs
    copy = median_us(lambda: copy_dst.copy_(copy_src))
    best = _fastest(lambda block, warps, programs, stages: mlp_rows(
        x, packed, spec, block=block, num_warps=warps, programs=programs, stages=stages, out=y),
        None if precision == "float16" else SETTINGS[4:])
    ref = spec.reference(x[:4096].double(), weights)
    y.zero_()
    best[1]()
    err = (y[:4096].double() - ref).abs().max().item()
    if baselines:
        return {"ours": best[0], "setting": best[2], "launch": launch_us(best[1]), "copy": copy, "err": err,
                **{k: baselines[k] for k in ("eager16", "eager32", "compile16")}}
    w16 = [(torch.tensor(w, dtype=torch.float16, device=device), torch.tensor(b, dtype=torch.float16, device=device))
           for w, b in weights]
    w32 = [(w.float(), b.float()) for w, b in w16]
    eager16 = median_us(lambda: torch_mlp(w16, acts)(x))
    x32 = x.float()
    eager32 = median_us(lambda: torch_mlp(w32, acts)(x32))
    compiled = torch.compile(torch_mlp(w16, acts))
    compiled16 = median_us(lambda: compiled(x))
    return {"ours": best[0], "setting": best[2], "launch": launch_us(best[1]), "copy": copy, "eager16": eager16,
            "eager32": eager32, "compile16": compiled16, "err": err}


# The shading kernel's candidates: (rows per block, warps, programs per SM or None, stages, texels per group).
DECODE_SETTINGS = [(256, 2, 6, 1, 4), (256, 2, None, 1, 4), (512, 2, 4, 1, 4), (128, 1, 16, 1, 4), (256, 4, 8, 1, 2)]


def bench_decode(height: int, width: int, device: str) -> dict:
    """The shading kernel at its defaults and at DECODE_SETTINGS (texels sampled alone, in pairs, in
    fours), the byte-gather kernel, and the same decoder on plain fp16 features (`shade_plain`). Every
    candidate is compared with the byte-gather kernel's output, and the default's colour and roughness
    with a float64 decode (the normals, rebuilt from x and y, amplify the decoder's half roundings
    wherever x² + y² nears 1: their error is reported apart)."""
    from stitchml.shader import MLPSpec
    from stitchml.shader import shading

    fine, coarse, levels = 4, 12, 7
    spec = MLPSpec((16, 32, 6), ("relu", "none"), "float16", "program")
    rng = np.random.default_rng(1)
    weights = [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
               for a, b in zip(spec.widths, spec.widths[1:])]
    n_fine = (height // 2) * (width // 2) * fine
    n = n_fine + (height // 4) * (width // 4) * coarse
    latents = torch.randint(-levels, levels + 1, (n,), dtype=torch.int8, device=device)
    packed = spec.pack(weights, device)
    out = torch.empty(height * width, 8, dtype=torch.float16, device=device)
    ref = torch.empty_like(out)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def gather():
        shading._shade_kernel[(16 * sms,)](
            latents, packed, ref, height, width, n_fine, BLOCK=64, C_FINE=fine, C_COARSE=coarse, LEVELS=levels,
            OUT_P=spec.padded[-1], num_warps=4, **spec.constexprs("MLP_"))
    ref.fill_(float("nan"))
    gather()

    def default():
        shading.shade(latents, packed, (height, width), fine, coarse, levels, spec, out=out, check_range=False)
    out.fill_(float("nan"))
    default()
    diff = (out.float() - ref.float()).abs().max().item()
    grids = [latents[:n_fine].reshape(height // 2, width // 2, fine),
             latents[n_fine:].reshape(height // 4, width // 4, coarse)]
    feats = [torch.nn.functional.interpolate(q.permute(2, 0, 1)[None].double() / levels, size=(height, width),
                                             mode="bilinear", align_corners=False)[0] for q in grids]
    want = spec.reference(torch.cat(feats).reshape(16, -1).T, weights)
    err = (out[:, [0, 1, 2, 6]].double() - torch.cat([want[:, :3], want[:, 5:6]], 1).clamp(0, 1)).abs().max().item()
    del feats, want
    base = out.clone()
    times = {"default": median_us(default)}
    for block, warps, per_sm, stages, group in DECODE_SETTINGS:
        name = f"{block}x{warps}w" + (f"/p{per_sm}s{stages}" if per_sm else "") + f" g{group}"

        def call(b=block, w=warps, p=per_sm, s=stages, g=group):
            shading.shade(latents, packed, (height, width), fine, coarse, levels, spec, block=b, num_warps=w,
                          programs=p and p * sms, stages=s, group=g, out=out, check_range=False)
        try:
            out.fill_(float("nan"))
            call()
            # the same tap sums; the decoder's float32 sums may round otherwise with other warps (a half ulp,
            # which the rebuilt normal can amplify at a rare texel)
            off = ((out.float() - base.float()).abs() > 2e-3).float().mean().item()
            times[name] = median_us(call) if off < 1e-5 else float("nan")
        except Exception as e:  # noqa: BLE001  (a benchmark row still prints)
            print(f"  setting {name} failed: {type(e).__name__}: {str(e)[:200]}")
    best = min(((t, k) for k, t in times.items() if k != "default" and t == t), default=(times["default"], "default"))
    features = torch.rand(height * width, 16, device=device, dtype=torch.float16) * 2 - 1
    plain = _fastest(lambda block, warps, programs, stages: shading.shade_plain(
        features, packed, spec, block=block, num_warps=warps, programs=programs, stages=stages, out=out),
        [(128, 4, None, 1), (128, 4, 8, 3), (256, 4, 4, 3)])
    src = torch.empty((height * width * 16 + n) // 8, dtype=torch.float32, device=device)  # 8 fp16 out, int8 in
    dst = torch.empty_like(src)
    psrc = torch.empty(height * width * (32 + 16) // 8, dtype=torch.float32, device=device)  # plain: 16 in, 8 out
    pdst = torch.empty_like(psrc)
    return {"height": height, "width": width, "default": times["default"], "ours": best[0], "setting": best[1],
            "settings": times, "gather": median_us(gather), "diff": diff, "err_colour": err, "plain": plain[0],
            "plain_setting": plain[2], "copy": median_us(lambda: dst.copy_(src)),
            "plain_copy": median_us(lambda: pdst.copy_(psrc))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["mlp", "decode"], help="one part of the benchmark")
    parser.add_argument("--json", help="write every row's numbers here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_shader needs a CUDA device", file=sys.stderr)
        return 2
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    record: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "mlp": [], "decode": None}
    if args.only != "decode":
        print(f"{'network':<21}{'res':>6}{'ours us':>9}{'setting':>14}{'+launch':>9}{'copy us':>9}{'of copy':>8}"
              f"{'eager16':>9}{'eager32':>9}{'compile':>9}{'x compile':>10}{'max err':>9}")
        seen: dict = {}
        for widths, acts, precision in SHAPES:
            for res, rows in RESOLUTIONS.items():
                r = bench_mlp(widths, acts, rows, "cuda", precision, seen.get((widths, res)))
                seen[(widths, res)] = r
                record["mlp"].append({"widths": widths, "precision": precision, "res": res, **r})
                name = "->".join(map(str, widths)) + (" sums16" if precision != "float16" else "")
                print(f"{name:<21}{res:>6}{r['ours']:>9.1f}{r['setting']:>14}"
                      f"{r['launch']:>9.1f}{r['copy']:>9.1f}{r['copy'] / r['ours']:>8.0%}{r['eager16']:>9.1f}"
                      f"{r['eager32']:>9.1f}{r['compile16']:>9.1f}"
                      f"{r['compile16'] / r['ours']:>9.1f}x{r['err']:>9.1e}", flush=True)
    if args.only != "mlp":
        r = bench_decode(2160, 3840, "cuda")
        record["decode"] = r
        print(f"neural-material shading 3840x2160 (16->32->6, bilinear int8 latents, 8 fp16 out; copy of its bytes "
              f"{r['copy']:.1f} us): default {r['default']:.1f} us ({r['copy'] / r['default']:.0%} of copy), best "
              f"{r['ours']:.1f} us ({r['setting']}); byte-gather kernel {r['gather']:.1f} us (max diff "
              f"{r['diff']:.1e}; colour and roughness vs float64 {r['err_colour']:.1e}); plain fp16 features "
              f"{r['plain']:.1f} us ({r['plain_setting']}; copy of its bytes {r['plain_copy']:.1f} us); decode / "
              f"plain {r['default'] / r['plain']:.2f}x")
        print("  settings: " + ", ".join(f"{k} {v:.1f}" for k, v in r["settings"].items()))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
