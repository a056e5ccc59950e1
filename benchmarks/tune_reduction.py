"""Sweep the reduction template's BLOCK_R and num_warps on softmax and layer norm rows (informs codegen/reduction)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from bench_compiler import copy_bandwidth, cuda_time  # noqa: E402


def main():
    bw = copy_bandwidth()
    for kind in ("softmax", "layernorm"):
        for c in (1024, 8192):
            rows = 8192
            g = sm.Graph(kind)
            x = g.placeholder((rows, c), sm.float32, name="x")
            y = g.softmax(x, axis=-1) if kind == "softmax" else g.layer_normalization(x, -1)
            a = torch.randn(rows, c, device="cuda")
            for block_r in ((1, 2, 4, 8) if c == 1024 else (1, 2)):
                for warps in (4, 8, 16):
                    opts = {"reduction_block_r": block_r, "reduction_warps": warps}
                    exe = g.compile({x: sm.TensorType((rows, c), sm.float32)}, [y], device="cuda", options=opts)
                    step = exe.steps[0].run
                    out = torch.empty_like(a)
                    grid = ((rows + block_r - 1) // block_r,)
                    ms = cuda_time(lambda: step.fn[grid](a, out, num_warps=warps, **step.meta), 3, 30)
                    print(f"{kind:9} {rows}x{c:<6} BLOCK_R={block_r} warps={warps:2} {ms:8.4f} ms "
                          f"{100 * 2 * a.numel() * 4 / (ms / 1e3) / bw:5.1f}% of copy bw", flush=True)


if __name__ == "__main__":
    main()
