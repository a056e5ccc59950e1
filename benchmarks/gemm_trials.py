"""A persistent Triton GEMM with TMA descriptors and the bias + GeLU(erf) epilogue in registers: a trial of
whether a fused epilogue can come within 3 % of the bare cuBLAS product (bench_targets.py --explore)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _persistent_gelu(a_desc, b_desc, c_desc, bias, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                     BK: tl.constexpr, GROUP: tl.constexpr, SMS: tl.constexpr):
    start = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    in_group = GROUP * tiles_n
    for tile in tl.range(start, tiles_m * tiles_n, SMS, flatten=True):
        group = tile // in_group
        first_m = group * GROUP
        size_m = min(tiles_m - first_m, GROUP)
        pid_m = first_m + (tile % size_m)
        pid_n = (tile % in_group) // size_m
        om, on = pid_m * BM, pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in range(k_tiles):
            acc = tl.dot(a_desc.load([om, kt * BK]), b_desc.load([kt * BK, on]), acc)
        cols = on + tl.arange(0, BN)
        x = acc + tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        c_desc.store([om, on], (0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))).to(c_desc.dtype))


def persistent_gelu(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, bm: int, bn: int, bk: int, warps: int,
                    stages: int):
    """(gelu(a @ b + bias), a callable that recomputes it into the same buffer)."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn])
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)

    def run():
        _persistent_gelu[grid](a_desc, b_desc, c_desc, bias, m, n, k, bm, bn, bk, 8, sms, num_warps=warps,
                               num_stages=stages)

    run()
    return c, run
