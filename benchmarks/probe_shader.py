"""Variants of the in-kernel MLP and of the neural-material decode, checked then timed in one process
(what chose the shader kernels' shapes; numbers in benchmarks/RESULTS.md).

    $ PYTHONPATH=$PWD python benchmarks/probe_shader.py --json out.json      # needs CUDA

MLP epilogues ("epi"): f32 = bias, activation in float32, then a cast to half for the next dot (what
`language.mlp_apply` did); h16 = cast the float32 accumulator to half first, bias and activation in
half; acc16 = half accumulators. Decode: the byte-gather kernel, the word kernel at several settings,
and the same decoder reading plain fp16 features (no sampling).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
import triton
import triton.language as tl

from bench_shader import median_us
from stitchml.shader import MLPSpec
from stitchml.shader import shading
from stitchml.shader.language import mlp_load


@triton.jit
def _layer(h, w, b, ACT: tl.constexpr, EPI: tl.constexpr, LAST: tl.constexpr):
    a = h.to(tl.float16)
    if EPI == "acc16":
        y = tl.dot(a, w, out_dtype=tl.float16)
        y = y + b
    elif (EPI == "h16") and (not LAST):
        y = tl.dot(a, w, out_dtype=tl.float32).to(tl.float16) + b
    else:
        y = tl.dot(a, w, out_dtype=tl.float32) + b.to(tl.float32)[None, :]
    if ACT == "relu":
        y = tl.maximum(y, 0.0)
    return y


@triton.jit
def _probe_kernel(x_ptr, w_ptr, y_ptr, rows, IN: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr,
                  MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr, MLP_P1: tl.constexpr, MLP_P2: tl.constexpr,
                  MLP_P3: tl.constexpr, MLP_P4: tl.constexpr, MLP_A0: tl.constexpr, MLP_A1: tl.constexpr,
                  MLP_A2: tl.constexpr, MLP_A3: tl.constexpr, MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr,
                  OUT_P: tl.constexpr, STAGES: tl.constexpr, EPI: tl.constexpr):
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    i = tl.arange(0, BLOCK)[:, None]
    ci = tl.arange(0, MLP_P0)[None, :]
    co = tl.arange(0, OUT_P)[None, :]
    for block in tl.range(tl.program_id(0), tl.cdiv(rows, BLOCK), tl.num_programs(0), num_stages=STAGES):
        start = tl.cast(block, tl.int64) * BLOCK
        x = tl.load(x_ptr + start * IN + i * IN + ci)
        h = _layer(x, w0, b0, MLP_A0, EPI, MLP_LAYERS == 1)
        if MLP_LAYERS >= 2:
            h = _layer(h, w1, b1, MLP_A1, EPI, MLP_LAYERS == 2)
        if MLP_LAYERS >= 3:
            h = _layer(h, w2, b2, MLP_A2, EPI, MLP_LAYERS == 3)
        if OUT == OUT_P:
            tl.store(y_ptr + start * OUT + i * OUT + co, h.to(tl.float16))
        else:
            tl.store(y_ptr + start * OUT + i * OUT + co, h.to(tl.float16), mask=co < OUT)


MLP_CASES = [((16, 64, 64, 8), ("relu", "relu", "none"), 1920 * 1080), ((16, 64, 16), ("relu", "none"), 3840 * 2160),
             ((16, 128, 16), ("relu", "none"), 3840 * 2160)]
MLP_SETTINGS = [(128, 4, 8, 3), (128, 4, 4, 3), (256, 8, 2, 3), (64, 4, 16, 3), (128, 8, 4, 3)]


def probe_mlp(log):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for widths, acts, rows in MLP_CASES:
        spec = MLPSpec(widths, acts, "float16", "program")
        rng = np.random.default_rng(0)
        weights = [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
                   for a, b in zip(widths, widths[1:])]
        packed = spec.pack(weights, "cuda")
        x = torch.randn(rows, widths[0], device="cuda", dtype=torch.float16)
        y = torch.empty(rows, widths[-1], device="cuda", dtype=torch.float16)
        src = torch.empty(rows * (widths[0] + widths[-1]) // 4, device="cuda")
        dst = torch.empty_like(src)
        copy = median_us(lambda: dst.copy_(src))
        idx = torch.randint(0, rows, (4096,), device="cuda")
        ref = spec.reference(x[idx].double(), weights)
        res = []
        for epi in ("f32", "h16", "acc16"):
            for block, warps, per_sm, stages in MLP_SETTINGS:
                def call(b=block, w=warps, p=per_sm, s=stages, e=epi):
                    _probe_kernel[(min(p * sms, rows // b),)](
                        x, packed, y, rows, IN=widths[0], OUT=widths[-1], BLOCK=b, OUT_P=spec.padded[-1], STAGES=s,
                        EPI=e, num_warps=w, **spec.constexprs("MLP_"))
                name = f"{epi} {block}x{warps}w/p{per_sm}s{stages}"
                try:
                    y.fill_(float("nan"))
                    call()
                    err = (y[idx].double() - ref).abs().max().item()
                    t = median_us(call) if err < 3e-2 else float("nan")
                except Exception as e:  # noqa: BLE001
                    print(f"  {name}: {type(e).__name__} {str(e)[:120]}")
                    continue
                res.append((t, name, err))
                log.append({"net": widths, "rows": rows, "variant": name, "us": t, "err": err, "copy": copy})
        res.sort(key=lambda r: (np.isnan(r[0]), r[0]))
        print(f"{'->'.join(map(str, widths))} rows {rows}: copy {copy:.1f} us; " + "; ".join(
            f"{n} {t:.1f} ({copy / t:.0%}, err {e:.1e})" for t, n, e in res[:5]), flush=True)
        for epi in ("f32", "h16", "acc16"):
            best = [r for r in res if r[1].startswith(epi + " ")]
            if best:
                print(f"   best {epi}: {best[0][1]} {best[0][0]:.1f} us err {best[0][2]:.1e}")


def probe_decode(log, size=4096):
    fine, coarse, levels = 4, 12, 7
    spec = MLPSpec((16, 32, 6), ("relu", "none"), "float16", "program")
    rng = np.random.default_rng(1)
    weights = [(rng.standard_normal((a, b)) / np.sqrt(a), rng.standard_normal(b) * 0.1)
               for a, b in zip(spec.widths, spec.widths[1:])]
    n_fine = (size // 2) ** 2 * fine
    n = n_fine + (size // 4) ** 2 * coarse
    latents = torch.randint(-levels, levels + 1, (n,), dtype=torch.int8, device="cuda")
    packed = spec.pack(weights, "cuda")
    out = torch.empty(size * size, 8, dtype=torch.float16, device="cuda")
    ref = torch.empty_like(out)
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def old(block=64, warps=4, per_sm=16):
        shading._shade_kernel[(per_sm * sms,)](
            latents, packed, ref, size, n_fine, BLOCK=block, C_FINE=fine, C_COARSE=coarse, LEVELS=levels,
            OUT_P=spec.padded[-1], num_warps=warps, **spec.constexprs("MLP_"))
    old()
    src = torch.empty((size * size * 16 + n) // 8, device="cuda")
    dst = torch.empty_like(src)
    copy = median_us(lambda: dst.copy_(src))
    rows = [("bytes (old)", median_us(old))]
    for block, warps, per_sm, stages in [(128, 4, None, 1), (128, 4, 8, 1), (128, 4, 8, 3), (256, 4, 4, 1),
                                         (256, 8, 4, 1), (64, 4, 16, 1), (128, 4, 4, 1), (256, 4, None, 1),
                                         (128, 4, None, 1)]:
        def call(b=block, w=warps, p=per_sm, s=stages):
            shading.shade(latents, packed, size, fine, coarse, levels, spec, block=b, num_warps=w,
                          programs=p and p * sms, stages=s, out=out, check_range=False)
        out.fill_(float("nan"))
        call()
        err = (out.float() - ref.float()).abs().max().item()
        name = f"words {block}x{warps}w" + (f"/p{per_sm}s{stages}" if per_sm else "")
        rows.append((name, median_us(call) if err < 5e-3 else float("nan"), err))
    feats = torch.randn(size * size, 16, device="cuda", dtype=torch.float16)
    for block, warps, per_sm, stages in [(128, 4, None, 1), (128, 4, 8, 3), (256, 8, 4, 3), (128, 4, 4, 3)]:
        def plain(b=block, w=warps, p=per_sm, s=stages):
            shading.shade_plain(feats, packed, spec, block=b, num_warps=w, programs=p and p * sms, stages=s, out=out)
        rows.append((f"plain {block}x{warps}w" + (f"/p{per_sm}s{stages}" if per_sm else ""), median_us(plain)))
    print(f"decode {size}x{size}: copy of its bytes {copy:.1f} us")
    for r in rows:
        diff = f" max diff vs bytes {r[2]:.1e}" if len(r) > 2 else ""
        print(f"   {r[0]:<24} {r[1]:8.1f} us ({copy / r[1]:.0%}){diff}")
        log.append({"decode": r[0], "us": r[1], "copy": copy})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument("--only", choices=["mlp", "decode"])
    args = parser.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    log: list = []
    if args.only != "mlp":
        probe_decode(log)
    if args.only != "decode":
        probe_mlp(log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(log, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
