"""Sweep BLOCK and num_warps of a generated pointwise kernel (GeLU) on the GPU: informs codegen/pointwise._block."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import stitchml as sm  # noqa: E402
from bench_compiler import copy_bandwidth, cuda_time, gelu_graph  # noqa: E402


def main():
    bw = copy_bandwidth()
    for dtype, tdt in ((sm.float32, torch.float32), (sm.bfloat16, torch.bfloat16)):
        for n, stream in ((1 << 28, False), (1 << 28, True)):
            g, x, y = gelu_graph(dtype)
            exe = g.compile({x: sm.TensorType((n,), dtype)}, [y], device="cuda", options={"pointwise_stream": stream})
            launch = exe.steps[0].run
            a = torch.randn(n, device="cuda", dtype=tdt)
            out = torch.empty_like(a)
            for block in (1024, 2048, 4096):
                for warps in (4, 8):
                    grid = ((n + block - 1) // block,)
                    ms = cuda_time(lambda: launch.fn[grid](a, out, num_warps=warps, BLOCK=block), 3, 30)
                    print(f"stream={stream:d} {dtype.name:9} n={n:>10} BLOCK={block:5} warps={warps:2} {ms:8.4f} ms "
                          f"{100 * 2 * n * a.element_size() / (ms / 1e3) / bw:5.1f}% of copy bw", flush=True)


if __name__ == "__main__":
    main()
