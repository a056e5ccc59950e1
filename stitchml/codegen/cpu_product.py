"""A native matrix product for the small products of a prepared CPU dispatch (pipeline/cpu_run.py).

At a packaged transformer's sizes (a few tokens times a few dozen features) a product is a few thousand
multiply-adds, under a microsecond of work, while `torch.mm` costs one to two microseconds of dispatch and
argument checking around MKL's kernel. For such shapes MKL's single-precision and double-precision GEMM
computes each output as one chain of fused multiply-adds in order of the contraction index, starting from
zero; `product` is that chain, so it gives MKL's bits, and as a native kernel it joins its neighbours in one
call of the prepared run's runner. The prepared run checks the bits on the values at hand and keeps the
library call wherever they differ (other shapes, where MKL blocks the contraction or takes a matrix-vector
path).

The loop keeps a block of `ROWS` x `COLUMNS` outputs in registers across the contraction (independent
chains, vectorised over columns where a row of the right operand is contiguous).
"""
from __future__ import annotations

from .cpu import CppSource

# The register block: output rows times columns whose sums stay in registers across the contraction (eight
# vectors of sixteen floats: independent multiply-add chains for the core's two FMA ports).
ROWS, COLUMNS = 4, 32
# Products above this many multiply-adds (all matrices of a batch) stay library calls: there the library's own blocking
# and threads pay for its dispatch cost.
MAX_MULTIPLY_ADDS = 1 << 18


def product(name: str, batch: int, m: int, k: int, n: int, a_strides: tuple, b_strides: tuple,
            dtype: str) -> CppSource:
    """C++ for out[b] = a[b] @ b[b] (a: batch x m x k, b: batch x k x n, any strides in elements; out
    contiguous): each output one fused multiply-add chain over k from zero.

    Signature: ``(a, b, out, threads)``."""
    t = {"float32": "float", "float64": "double"}[dtype]
    fma = {"float32": "__builtin_fmaf", "float64": "__builtin_fma"}[dtype]
    (sa0, sa1, sa2), (sb0, sb1, sb2) = a_strides, b_strides

    def block(rows: int, cols: int, i: str, j: str) -> list[str]:
        """The sums of rows i..i+rows and columns j..j+cols over the whole contraction, then stored."""
        unroll = "_Pragma(\"GCC unroll 64\")"
        return ["            {",
                f"                {t} acc[{rows}][{cols}] = {{}};",
                f"                for (int64_t p = 0; p < {k}; ++p) {{",
                f"                    const {t}* y = in1 + b * {sb0}LL + p * {sb1}LL + ({j}) * {sb2}LL;",
                f"                    {unroll} for (int r = 0; r < {rows}; ++r) {{",
                f"                        const {t} x = in0[b * {sa0}LL + ({i} + r) * {sa1}LL + p * {sa2}LL];",
                f"                        {unroll} for (int c = 0; c < {cols}; ++c)",
                f"                            acc[r][c] = {fma}(x, y[c * {sb2}LL], acc[r][c]);",
                "                    }",
                "                }",
                f"                {unroll} for (int r = 0; r < {rows}; ++r) {unroll} for (int c = 0; c < {cols}; ++c)",
                f"                    out0[(b * {m}LL + {i} + r) * {n}LL + {j} + c] = acc[r][c];",
                "            }"]

    lines = [f'extern "C" void {name}(const {t}* __restrict__ in0, const {t}* __restrict__ in1, '
             f"{t}* __restrict__ out0, int threads) {{",
             f"    for (int64_t b = 0; b < {batch}; ++b) {{"]
    row_parts = [(ROWS, f"for (int64_t i = 0; i < {m - m % ROWS}; i += {ROWS})", "i")] if m >= ROWS else []
    if m % ROWS:
        row_parts.append((m % ROWS, "", str(m - m % ROWS)))
    for rows, row_loop, i in row_parts:
        lines.append(f"        {row_loop} {{")
        if n >= COLUMNS:
            lines.append(f"        for (int64_t j = 0; j < {n - n % COLUMNS}; j += {COLUMNS})")
            lines += block(rows, COLUMNS, i, "j")
        if n % COLUMNS:
            lines += block(rows, n % COLUMNS, i, str(n - n % COLUMNS))
        lines.append("        }")
    lines += ["    }", "}"]
    return CppSource(name, "\n".join(lines) + "\n", "matmul")
