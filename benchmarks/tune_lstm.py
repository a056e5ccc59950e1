"""Variants of the LSTM demo's compiled generation loop, side by side (the launch blocks of the fused kernels).

Run on a CUDA machine:  python benchmarks/tune_lstm.py --json tune_lstm.json
Here, to see that it works:  python benchmarks/tune_lstm.py --device cpu --quick

For each batch size (1, 8, 64), the demo's generation graph (`build_generator`, 256 characters) is compiled
with each variant's options (passes/recurrent.py's fusions on or off, the generation step persistent or
split, the blocks of codegen/lstm_step.py, codegen/lstm.py and codegen/product_argmax.py) and
`runtime.blocks.CHUNK` (iterations per replayed CUDA graph). Reported per variant: tokens/s
(CUDA-event median of whole runs after warm-up), whether the greedy text (temperature 0) equals the unfused
compile's token for token, and the fraction of sampled tokens (temperature 0.8, the same draws: a fresh graph
of the same seed, its first run) equal to the unfused compile's. Then bench_lstm.py's contenders at the same
sizes (the default compile, PyTorch's cuDNN loop, torch.compile, a CUDA graph per token) while the time
budget (--budget seconds) lasts. The JSON is rewritten after every row, so a run cut short keeps its rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from stitchml.demos import lstm  # noqa: E402
from stitchml.runtime import blocks  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import bench_lstm  # noqa: E402

UNFUSED = {"lstm_cell_fusion": False, "product_arg_max_fusion": False}
THREE = {"lstm_step_fusion": False}  # a kernel per layer and one for the draw (the default before lstm_step)
SMALL = {  # batch 1: matrix-vector products; hidden units per program, K depth, warps; the generation step
    "unfused": (UNFUSED, 16),
    "lstm only": ({**THREE, "product_arg_max_fusion": False}, 16),
    "3 kernels": (THREE, 16),
    "3k h2 k512 w8": ({**THREE, "lstm_block_hidden": 2, "lstm_block_depth": 512, "lstm_warps": 8}, 16),
    "3k argmax k128 w16": ({**THREE, "arg_max_block_depth": 128, "arg_max_warps": 16}, 16),
    "step split": ({"lstm_step_fusion": "split"}, 16),
    "step": ({}, 16),
    "step chunk 64": ({}, 64),
    "step k256": ({"lstm_step_depth": 256}, 16),
    "step k512 w8": ({"lstm_step_depth": 512, "lstm_step_warps": 8}, 16),
    "step u4": ({"lstm_step_units": 4}, 16),
    "step u16": ({"lstm_step_units": 16}, 16),
    "step u8 k64": ({"lstm_step_depth": 64}, 16),
    "step u8 w8": ({"lstm_step_warps": 8}, 16),
}
MID = {  # batch 8: the largest the recurrent pass fuses
    "unfused": (UNFUSED, 16),
    "3 kernels": (THREE, 16),
    "step split": ({"lstm_step_fusion": "split"}, 16),
    "step": ({}, 16),
}
LARGE = {  # batch 64: the demo's cuBLAS form (above recurrent.MAX_BATCH), and its draw fused
    "unfused": (UNFUSED, 16),
    "default": ({}, 16),
    "argmax fused": ({"recurrent_max_batch": 64}, 16),
}


def run_variant(params, batch: int, length: int, options: dict, chunk: int, device: str, warmup: int, reps: int):
    """(tokens/s, greedy tokens, sampled tokens of the first run, the report's last lstm_step line) of the
    generation graph compiled with `options`, its loops replayed `chunk` iterations per CUDA graph."""
    blocks.CHUNK = chunk
    vocab = params["output/weights"].shape[1]
    first = np.random.default_rng(batch).integers(0, vocab, size=(batch, 1)).astype(np.int64)
    gen = lstm.build_generator(params, batch, 1, length, seed=0)
    types = {gen.prompt: sm.TensorType((batch, 1), sm.int64), gen.temperature: sm.TensorType((), sm.float32)}
    exe = gen.graph.compile(types, [gen.tokens], device=device, options=options)
    step = [line for line in exe.fusion_report().splitlines() if line.startswith("lstm_step")]
    sampled = exe.run({gen.prompt: first, gen.temperature: np.float32(0.8)})[gen.tokens].numpy()
    greedy = exe.run({gen.prompt: first, gen.temperature: np.float32(0.0)})[gen.tokens].numpy()
    feeds = {gen.prompt: first, gen.temperature: np.float32(0.8)}
    seconds = bench_lstm.timed(lambda: exe.run(feeds), device, warmup, reps)
    return batch * length / seconds, greedy, sampled, step[-1] if step else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="small model and runs: check that it works")
    parser.add_argument("--budget", type=float, default=115.0, help="seconds; contenders are skipped past it")
    parser.add_argument("--only", nargs="+", help="run just these variants (by name; the first is the reference)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    cuda = args.device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    width, embed, length = (16, 8, 4) if args.quick else (512, 64, 256)
    warmup, reps = (0, 1) if args.quick else (2, 7)
    params = lstm.init_parameters(96, width, embed, seed=0)
    env = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "width": width, "length": length}
    out = {"environment": env, "variants": [], "contenders": []}

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)

    sizes = [(1, SMALL), (8, MID), (64, LARGE)]
    if args.quick:  # the dot tiles under the interpreter only where asked for: keep the check fast
        sizes = [(1, {k: SMALL[k] for k in ("unfused", "3 kernels", "step split")}),
                 (4, {k: LARGE[k] for k in ("unfused", "default")})]
    if args.only:
        sizes = [(b, {k: v[k] for k in args.only if k in v}) for b, v in sizes]
    print(f"{'batch':>5} {'variant':>16} {'tokens/s':>12} {'greedy = unfused':>17} {'sampled = unfused':>18}")
    for batch, variants in sizes:
        reference = None
        for name, (options, chunk) in variants.items():
            row = {"batch": batch, "variant": name, "options": options, "chunk": chunk}
            try:
                speed, greedy, sampled, step = run_variant(params, batch, length, options, chunk, args.device,
                                                           warmup, reps)
                if reference is None:
                    reference = greedy, sampled
                row.update(tokens_per_s=speed, greedy_equal=bool((greedy == reference[0]).all()),
                           sampled_agreement=float((sampled == reference[1]).mean()), lstm_step=step)
                print(f"{batch:>5} {name:>16} {speed:>12,.0f} {str(row['greedy_equal']):>17} "
                      f"{row['sampled_agreement']:>18.1%}")
            except Exception as e:  # noqa: BLE001  (a variant that fails is reported, never the end of the run)
                row["error"] = f"{type(e).__name__}: {e}"
                print(f"{batch:>5} {name:>16} failed: {row['error'][:300]}")
            out["variants"].append(row)
            save()
    blocks.CHUNK = 16
    for batch, _ in sizes[::2]:
        if time.perf_counter() - start > args.budget:
            print(f"contenders at batch {batch} skipped: past the {args.budget:.0f} s budget")
            continue
        compile_torch = cuda and time.perf_counter() - start < args.budget - 30
        row = bench_lstm.bench_batch(params, batch, length, args.device, compile_torch, warmup, reps)
        out["contenders"].append(row)
        cells = ", ".join(f"{k} {v:,.0f}" for k, v in row.items() if isinstance(v, float) and k not in
                          ("greedy_agreement", "stitchml_first_run_s"))
        print(f"contenders at batch {batch}: {cells}; greedy agreement with cuDNN {row.get('greedy_agreement')}")
        save()
    print(f"total {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
