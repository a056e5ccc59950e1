"""Can a Triton matmul with the bias + GeLU epilogue fused match cuBLAS? (informs the matmul template choice)."""
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
from bench_compiler import cuda_time  # noqa: E402


@triton.jit
def matmul_bias_gelu(a, b, bias, c, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    width = GROUP * grid_n
    group = pid // width
    first_m = group * GROUP
    size_m = min(grid_m - first_m, GROUP)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_ptr = a + rm[:, None] * K + rk[None, :]
    b_ptr = b + rk[:, None] * N + rn[None, :]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        acc = tl.dot(tl.load(a_ptr), tl.load(b_ptr), acc)
        a_ptr += BK
        b_ptr += BK * N
    x = acc + tl.load(bias + rn)[None, :].to(tl.float32)
    y = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(c + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16))


def main():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / n ** 0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
    bare = cuda_time(lambda: a @ b, 3, 20)
    print(f"cuBLAS bare matmul {bare:.4f} ms  {2 * n ** 3 / bare / 1e9:.0f} TFLOP/s")
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for bm, bn, bk, warps, stages in ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
                                      (128, 128, 64, 4, 4), (128, 256, 32, 8, 4), (256, 128, 64, 8, 4)):
        grid = (triton.cdiv(n, bm) * triton.cdiv(n, bn),)
        try:
            fn = lambda: matmul_bias_gelu[grid](a, b, bias, c, n, n, n, bm, bn, bk, 8,  # noqa: E731
                                                num_warps=warps, num_stages=stages)
            fn()
            err = float((c.float() - ref).norm() / ref.norm())
            ms = cuda_time(fn, 3, 20)
            print(f"triton {bm}x{bn}x{bk} w{warps} s{stages}: {ms:.4f} ms  {2 * n ** 3 / ms / 1e9:.0f} TFLOP/s  "
                  f"{ms / bare:.3f}x cuBLAS  rel err {err:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"triton {bm}x{bn}x{bk} w{warps} s{stages}: failed {type(e).__name__}: {str(e)[:120]}")


if __name__ == "__main__":
    main()
