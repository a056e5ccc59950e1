"""One pass over the shader-ML choices on one GPU: every variant is checked against a float64 reference,
then timed, and the table printed (what chose the defaults of `shade`, `mlp_rows` and the material
training step; numbers in benchmarks/RESULTS.md).

    $ PYTHONPATH=$PWD python benchmarks/tune_shader.py --json tune.json          # CUDA, ~3 minutes
    $ PYTHONPATH=$PWD TRITON_INTERPRET=1 python benchmarks/tune_shader.py --device cpu --quick
    $ for i in 0 1 2 3; do python benchmarks/tune_shader.py --only decode --warm --shard $i/4 & done; wait

Parts: "decode", the neural-material shading kernel at 3840x2160 (4 + 12 int8 latent channels,
16->32->6, 8 half channels out) at the candidates of DECODE_VARIANTS (launch settings, half sums, the
float32 lane conversion of levels above 8, optionally an earlier kernel: --previous), the byte-gather
kernel, the same decoder on plain features, a copy of the bytes; "mlp",
16->64->64->8 at 1080p through `mlp_rows` at several settings, with float32 sums and with half sums
(precision "float16-sums"), with eager and torch.compile; "train", `bench_material_training`'s step with
resize's GPU path and without it. GPU times are CUDA-graph replays (bench_shader.median_us).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


WARM = False  # --warm: run every variant once (compiling it), time nothing


def timer(device: str):
    if WARM:
        def once(fn) -> float:
            fn()
            return float("nan")
        return once
    if device == "cuda":
        from bench_shader import median_us
        return median_us

    def wall_us(fn, reps: int = 2) -> float:
        fn()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e6
    return wall_us


def _weights(spec, seed):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
            for a, b in zip(spec.widths, spec.widths[1:])]


def _reference_decode(latents, h, w, fine, coarse, levels, spec, weights, device):
    """float64 decode (bilinear latents, the spec's network, normal rebuilt and made unit), (h * w, 8)."""
    n_fine = (h // 2) * (w // 2) * fine
    grids = [latents[:n_fine].reshape(h // 2, w // 2, fine), latents[n_fine:].reshape(h // 4, w // 4, coarse)]
    feats = [torch.nn.functional.interpolate(q.permute(2, 0, 1)[None].double() / levels, size=(h, w),
                                             mode="bilinear", align_corners=False)[0] for q in grids]
    x = torch.cat(feats).reshape(fine + coarse, -1).T
    y = spec.reference(x, weights)
    xy = y[:, 3:5]
    z = (1 - (xy ** 2).sum(1, keepdim=True)).clamp(min=0).sqrt()
    normal = torch.nn.functional.normalize(torch.cat([xy, z], 1), dim=1)
    return torch.cat([y[:, :3].clamp(0, 1), normal, y[:, 5:6].clamp(0, 1), torch.zeros_like(z)], 1), x


# Decode candidates: (label, kernel module or None for the installed one, texels per block, warps, programs
# per SM or None, pipeline stages, texels per group, decoder precision, levels).
DECODE_VARIANTS = [
    ("default", None, None, None, None, 1, None, "float16", 7),
    ("previous kernel 256x2w/p8 g4", "previous", 256, 2, 8, 1, 4, "float16", 7),
    ("256x2w/p6 g4", None, 256, 2, 6, 1, 4, "float16", 7),
    ("256x2w/p4 g4", None, 256, 2, 4, 1, 4, "float16", 7),
    ("256x2w/p12 g4", None, 256, 2, 12, 1, 4, "float16", 7),
    ("256x2w/p6s2 g4", None, 256, 2, 6, 2, 4, "float16", 7),
    ("256x2w g4 (a program a block)", None, 256, 2, None, 1, 4, "float16", 7),
    ("512x2w/p4 g4", None, 512, 2, 4, 1, 4, "float16", 7),
    ("128x1w/p16 g4", None, 128, 1, 16, 1, 4, "float16", 7),
    ("256x4w/p8 g2", None, 256, 4, 8, 1, 2, "float16", 7),
    ("128x1w/p12 g4", None, 128, 1, 12, 1, 4, "float16", 7),
    ("256x2w/p8s2 g4", None, 256, 2, 8, 2, 4, "float16", 7),
    ("default, float16-sums", None, None, None, None, 1, None, "float16-sums", 7),
    ("float16-sums 256x2w/p12 g4", None, 256, 2, 12, 1, 4, "float16-sums", 7),
    ("float16-sums 256x2w g4 (a program a block)", None, 256, 2, None, 1, 4, "float16-sums", 7),
    ("default, levels 9 (float32 lanes)", None, None, None, None, 1, None, "float16", 9),
]


def _decode_variants(quick: bool, shard: tuple[int, int]) -> list:
    """The variants of `shard` (i, n): all for n = 1; else none for i = 0 (which warms the byte-gather and
    plain-feature kernels) and every (n - 1)-th from i - 1 for the others."""
    variants = DECODE_VARIANTS[:2] + DECODE_VARIANTS[-2:] if quick else DECODE_VARIANTS
    i, n = shard
    return variants if n == 1 else [] if i == 0 else variants[i - 1::n - 1]


def part_decode(device: str, quick: bool, log: dict, previous: str | None = None,
                shard: tuple[int, int] = (0, 1)) -> None:
    """The shading kernel at 3840x2160 (4 + 12 int8 latent channels in [-7, 7], 16->32->6, 8 half channels)
    at the candidates of DECODE_VARIANTS, each checked against float64 (colour and roughness; normals
    reported) and against the default's bits, then timed; the byte-gather kernel, the same decoder on
    plain fp16 features and a copy of the bytes. `previous`: a module holding an earlier `shade_words_kernel`
    (same arguments), timed through `shade` in its place."""
    import importlib

    from stitchml.shader import MLPSpec, shading

    measure = timer(device)
    h, w = (8, 256) if quick else (2160, 3840)
    fine, coarse = 4, 12
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 1
    n = (h // 2) * (w // 2) * fine + (h // 4) * (w // 4) * coarse
    latents = torch.randint(-7, 8, (n,), dtype=torch.int8, generator=torch.Generator().manual_seed(2)).to(device)
    out = torch.empty(h * w, 8, dtype=torch.float16, device=device)
    installed = shading.shading_fast
    refs: dict = {}
    rows = []
    base = None
    for label, module, block, warps, per_sm, stages, group, precision, levels in _decode_variants(quick, shard):
        if module == "previous" and not previous:
            continue
        spec = MLPSpec((fine + coarse, 32, 6), ("relu", "none"), precision, "program")
        weights = _weights(spec, 1)
        packed = spec.pack(weights, device)

        def call(b=block, nw=warps, p=per_sm, s=stages, g=group, net=spec, pk=packed, lv=levels):
            shading.shade(latents, pk, (h, w), fine, coarse, lv, net, block=b, num_warps=nw,
                          programs=p and p * sms, stages=s, out=out, group=g, check_range=False)
        try:
            shading.shading_fast = importlib.import_module(previous) if module == "previous" else installed
            out.fill_(float("nan"))
            call()
            if WARM:
                continue
            if levels not in refs:
                refs[levels] = _reference_decode(latents, h, w, fine, coarse, levels, spec, weights, device)[0]
            ref = refs[levels]
            # colour and roughness; the normals, rebuilt from x and y, amplify the decoder's half roundings
            # wherever x² + y² nears 1, so they are reported, not checked
            err = (out[:, [0, 1, 2, 6, 7]].double() - ref[:, [0, 1, 2, 6, 7]]).abs().max().item()
            err_normal = (out[:, 3:6].double() - ref[:, 3:6]).abs().max().item()
            if base is None and label == "default":
                base = out.clone()
            same = torch.equal(out, base) if base is not None and precision == "float16" and levels == 7 else None
            t = measure(call) if err < 6e-3 and torch.isfinite(out).all() else float("nan")
        except Exception as e:  # noqa: BLE001  (one setting failing leaves the others)
            print(f"  decode {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        finally:
            shading.shading_fast = installed
        rows.append({"variant": label, "us": t, "err": err, "err_normal": err_normal, "same_bits_as_default": same})
        print(f"  decode {h}x{w} {label:<36} {t:8.1f} us  max err vs fp64 {err:.1e} (normals {err_normal:.1e})"
              f"{'' if same is None else '  same bits as default: ' + str(same)}", flush=True)
    if WARM and shard[0] != 0:
        return
    spec = MLPSpec((fine + coarse, 32, 6), ("relu", "none"), "float16", "program")
    weights = _weights(spec, 1)
    packed = spec.pack(weights, device)
    gather_out = torch.empty_like(out)

    def gather():
        shading._shade_kernel[(16 * sms,)](
            latents, packed, gather_out, h, w, (h // 2) * (w // 2) * fine, BLOCK=64, C_FINE=fine, C_COARSE=coarse,
            LEVELS=7, OUT_P=spec.padded[-1], num_warps=4, **spec.constexprs("MLP_"))
    gather()
    if base is not None:
        # the same tap sums; the decoder's float32 sums may round otherwise (a half ulp, which the rebuilt
        # normal can amplify at a rare texel)
        off = ((gather_out.float() - base.float()).abs() > 2e-3).float().mean().item()
        diff = (gather_out.float() - base.float()).abs().max().item()
        t = measure(gather)
        rows.append({"variant": "byte-gather kernel", "us": t, "max_diff_vs_default": diff, "share_off": off})
        print(f"  byte-gather kernel {t:.1f} us; default against it: max diff {diff:.1e}, {off:.1e} of channels "
              f"off by > 2e-3", flush=True)
    feats = torch.zeros(h * w, 16, dtype=torch.float16, device=device)
    feats[:] = (torch.rand(h * w, 16, device=device, generator=torch.Generator(device).manual_seed(4)) * 2 - 1)
    for block, warps, per_sm, stages in [(128, 4, None, 1), (128, 4, 8, 3), (256, 4, 4, 3)][:1 if quick else 3]:
        t = measure(lambda b=block, nw=warps, p=per_sm, s=stages: shading.shade_plain(
            feats, packed, spec, block=b, num_warps=nw, programs=p and p * sms, stages=s, out=out))
        rows.append({"variant": f"plain features {block}x{warps}w/p{per_sm}s{stages}", "us": t})
        print(f"  plain features {block}x{warps}w/p{per_sm}s{stages}: {t:.1f} us", flush=True)
    # read and written: as many bytes in all as the decode reads (n) and writes (16 a texel)
    src = torch.empty((h * w * 16 + n) // 2, dtype=torch.int8, device=device)
    dst = torch.empty_like(src)
    copy = measure(lambda: dst.copy_(src))
    rows.append({"variant": "copy of the decode's bytes", "us": copy})
    print(f"  copy of its bytes ({(h * w * 16 + n) / 1e6:.0f} MB): {copy:.1f} us", flush=True)
    log["decode"] = {"height": h, "width": w, "rows": rows}


def part_mlp(device: str, quick: bool, log: dict) -> None:
    from stitchml.shader import MLPSpec
    from stitchml.shader.kernels import mlp_rows

    measure = timer(device)
    widths, acts = (16, 64, 64, 8), ("relu", "relu", "none")
    rows = 256 if quick else 1920 * 1080
    spec = MLPSpec(widths, acts, "float16", "program")
    weights = _weights(spec, 0)
    packed = spec.pack(weights, device)
    x = torch.randn(rows, 16, device=device, generator=torch.Generator(device).manual_seed(0)).half()
    y = torch.empty(rows, 8, device=device, dtype=torch.float16)
    ref = spec.reference(x.double(), weights)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else 1
    settings = [(None, 4, None, 1), (128, 4, 8, 3), (128, 4, 4, 3), (128, 4, 12, 3), (128, 4, 8, 4), (128, 4, 8, 2),
                (64, 4, 16, 3), (64, 4, 24, 3), (64, 4, 32, 3), (64, 4, 16, 4), (128, 8, 4, 3), (128, 8, 8, 3),
                (256, 8, 4, 3), (64, 2, 32, 3)]
    if quick:
        settings = settings[:2]
    out = []
    variants = [("rows", s) for s in settings]
    variants += [("sums", s) for s in [(None, 4, None, 1), (128, 4, 8, 3), (128, 4, 12, 3), (128, 4, 16, 3),
                                       (64, 4, 16, 3), (64, 4, 24, 3), (128, 8, 4, 3), (128, 8, 8, 3),
                                       (256, 8, 4, 3)][:2 if quick else 9]]
    sums = MLPSpec(widths, acts, "float16-sums", "program")
    for kind, (block, warps, per_sm, stages) in variants:
        label = f"{kind} " + ("default" if block is None else f"{block}x{warps}w/p{per_sm}s{stages}")
        def call(b=block, nw=warps, p=per_sm, s=stages, net=spec if kind == "rows" else sums):
            mlp_rows(x, packed, net, block=b, num_warps=nw, programs=p and p * sms, stages=s, out=y)
        try:
            y.fill_(float("nan"))
            call()
            err = (y.double() - ref).abs().max().item()
            t = measure(call) if err < 1e-2 else float("nan")
        except Exception as e:  # noqa: BLE001
            print(f"  mlp {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        out.append({"variant": label, "us": t, "err": err})
        print(f"  16->64->64->8 {rows} rows {label:<26} {t:8.1f} us  max err vs fp64 {err:.1e}", flush=True)
    if device == "cuda" and not quick:
        w16 = [(torch.tensor(a, dtype=torch.float16, device=device), torch.tensor(b, dtype=torch.float16,
                                                                                  device=device)) for a, b in weights]

        def eager(v):
            h = v
            for (a, b), act in zip(w16, acts):
                h = torch.addmm(b, h, a)
                h = torch.relu(h) if act == "relu" else h
            return h
        compiled = torch.compile(eager)
        src = torch.empty(rows * 24 // 4, device=device)  # 16 + 8 halves a row: 48 bytes read and written
        dst = torch.empty_like(src)
        for label, fn in [("eager fp16", lambda: eager(x)), ("torch.compile fp16", lambda: compiled(x)),
                          ("copy of its bytes", lambda: dst.copy_(src))]:
            t = measure(fn)
            out.append({"variant": label, "us": t})
            print(f"  16->64->64->8 {rows} rows {label:<26} {t:8.1f} us", flush=True)
    log["mlp"] = out


def part_train(device: str, quick: bool, log: dict) -> None:
    import bench_material_training as bmt
    from stitchml.ops import image

    sizes = [32] if quick else [1024, 2048]
    warmup, reps = (1, 2) if quick or WARM else (3, 10)
    if WARM:
        sizes = sizes[:1]
    rows = []
    fast = image._fast
    for label, use_fast in [("resize GPU path", True), ("resize float64 reference", False)]:
        image._fast = fast if use_fast else (lambda *a, **k: False)
        for size in sizes if use_fast else sizes[:1]:
            r = bmt.bench_size(size, device, warmup, reps, compile_torch=use_fast and size == sizes[0] and not quick,
                               use_jax=False)
            r["variant"] = label
            rows.append(r)
            base = r["torch eager"]["step_ms"]
            for name in ("stitchml", "torch eager", "torch.compile"):
                if name in r:
                    v = r[name]
                    print(f"  train {size} {label:<26} {name:<14} {v['step_ms']:8.3f} ms {v['texels_per_s']:9.3g} "
                          f"texels/s {base / v['step_ms']:5.2f}x eager  loss diff {v['loss_rel_diff']:.1e}", flush=True)
    image._fast = fast
    log["train"] = rows
    if device == "cuda" and not WARM:
        log["train_profile"] = _profile_step(sizes[0])


def _profile_step(size: int) -> list:
    """GPU time per kernel over five StitchML training steps at `size` (what the step spends its time on)."""
    from torch.profiler import ProfilerActivity, profile

    from stitchml.demos import neural_materials as nm

    layout = nm.Layout(size)
    t = nm.training_graph(layout, seed=0)
    target = torch.from_numpy(nm.make_material(size).targets().reshape(-1, nm.OUTPUTS)).cuda()
    feeds = {t.target: target, t.learning_rate: np.float32(0.05), t.noise: np.float32(1.0)}
    for _ in range(3):
        t.graph.run(feeds, [t.loss], t.updates, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            t.graph.run(feeds, [t.loss], t.updates, device="cuda")
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events)
    out = [{"kernel": e.key[:90], "us_per_step": e.device_time_total / 5, "calls_per_step": e.count / 5}
           for e in events[:14]]
    print(f"  StitchML step at {size}: {total / 5:.0f} us of GPU time in {sum(e.count for e in events) / 5:.0f} "
          f"kernels a step; the largest:", flush=True)
    for e in out:
        print(f"    {e['us_per_step']:8.1f} us  x{e['calls_per_step']:.0f}  {e['kernel']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, two settings (to check the script)")
    parser.add_argument("--only", nargs="+", choices=["decode", "mlp", "train"], default=["decode", "mlp", "train"])
    parser.add_argument("--json", help="write the results here (after every part)")
    parser.add_argument("--previous", metavar="MODULE",
                        help="decode: also time this module's shade_words_kernel (an earlier version, importable)")
    parser.add_argument("--shard", default="0/1", metavar="I/N",
                        help="with --warm: one of N parts of the decode variants (warm in N processes side by side)")
    parser.add_argument("--warm", action="store_true",
                        help="run every variant once and time nothing: fills the compile caches (run the parts "
                             "side by side with --warm, then time them one after another)")
    args = parser.parse_args(argv)
    global WARM
    WARM = args.warm
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; use --device cpu --quick")
    import triton

    log: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "torch": torch.__version__,
                 "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}
    print(log, flush=True)
    for part in args.only:
        start = time.perf_counter()
        try:
            if part == "decode":
                i, n = (int(v) for v in args.shard.split("/"))
                part_decode(args.device, args.quick, log, args.previous, (i, n))
            else:
                {"mlp": part_mlp, "train": part_train}[part](args.device, args.quick, log)
        except Exception as e:  # noqa: BLE001  (the other parts still run)
            import traceback

            traceback.print_exc()
            log[part] = {"failed": f"{type(e).__name__}: {e}"}
        print(f"{part}: {time.perf_counter() - start:.0f} s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(log, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
