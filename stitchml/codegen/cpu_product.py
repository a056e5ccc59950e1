"""A native matrix product for the small products of a prepared CPU dispatch (pipeline/cpu_run.py).

At a packaged transformer's sizes (a few tokens times a few dozen features) a product is a few thousand
multiply-adds, under a microsecond of work, while `torch.mm` costs one to two microseconds of dispatch and
argument checking around MKL's kernel. For such shapes MKL's single-precision and double-precision GEMM
computes each output as one chain of fused multiply-adds in order of the contraction index, starting from
zero; `product` is that chain, so it gives MKL's bits, and as a native kernel it joins its neighbours in one
call of the prepared run's runner. The prepared run checks the bits on the values at hand and keeps the
library call wherever they differ (other shapes, where MKL blocks the contraction or takes a matrix-vector
path).

The loop keeps a block of `ROWS` rows x `VECTORS` vectors of outputs in registers across the contraction
(independent chains of whole-vector multiply-adds).
"""
from __future__ import annotations

from .cpu import CppSource

# PyTorch multiplies batched matrices with fewer multiply-adds than this per matrix (rows x columns x
# contraction) in a plain loop of its own (ATen's baddbmm_cpu_kernel): for each output, products added in
# order of the contraction index to a sum starting at zero, each product and sum rounded to the type.
# `small_batched_product` is that loop, so its results are bit for bit PyTorch's.
TORCH_SMALL_BMM = 400

# The register block: output rows times vectors of columns whose sums stay in registers across the
# contraction (eight independent multiply-add chains for the core's two FMA ports).
ROWS, VECTORS = 4, 2
VECTOR_BYTES = 64
# Products above this many multiply-adds (all matrices of a batch) stay library calls: there the library's
# own blocking and threads pay for its dispatch cost; so do right operands above this many elements (the
# loop copies each into a padded block on its stack).
MAX_MULTIPLY_ADDS = 1 << 18
MAX_RIGHT = 1 << 14


def fits(batch: int, m: int, k: int, n: int, itemsize: int) -> bool:
    """Whether `product` takes these sizes, `batch` matrices in all (small enough that a library call costs
    more than the work)."""
    lanes = VECTOR_BYTES // itemsize
    return batch * m * k * n <= MAX_MULTIPLY_ADDS and k * -(-n // lanes) * lanes <= MAX_RIGHT


def product(name: str, batch: tuple, m: int, k: int, n: int, a_strides: tuple, b_strides: tuple,
            dtype: str) -> CppSource:
    """C++ for out[...] = a[...] @ b[...] over the batch axes `batch` (a: batch + (m, k), b: batch + (k, n),
    any strides in elements, one per axis; out contiguous): each output one fused multiply-add chain over k
    from zero.

    Each right matrix is first copied into a block on the stack whose rows are padded with zeros to whole
    vectors, so that the multiply-adds are full vector operations on aligned loads whatever its layout (a
    transposed key matrix, a column count like 17); the padding columns are computed and not stored.

    Signature: ``(a, b, out, threads)``."""
    t = {"float32": "float", "float64": "double"}[dtype]
    lanes = VECTOR_BYTES // {"float32": 4, "float64": 8}[dtype]
    (sa1, sa2), (sb1, sb2) = a_strides[-2:], b_strides[-2:]
    batch = tuple(batch)
    a_base = " + ".join(f"q{d} * {st}LL" for d, st in enumerate(a_strides[:-2])) or "0"
    b_base = " + ".join(f"q{d} * {st}LL" for d, st in enumerate(b_strides[:-2])) or "0"
    flat = "0"
    for d, extent in enumerate(batch):
        flat = f"q{d}" if d == 0 else f"({flat}) * {extent}LL + q{d}"
    vectors = -(-n // lanes)
    width = vectors * lanes

    def block(rows: int, cols: int, i: str, j: str, tail: int | None) -> list[str]:
        """The sums of rows i..i+rows and `cols` vectors of columns from j over the whole contraction; the
        last vector's first `tail` lanes are columns of the output (all of them where None)."""
        unroll = '_Pragma("GCC unroll 64")'
        return ["            {",
                f"                vec acc[{rows}][{cols}] = {{}};",
                f"                for (int64_t p = 0; p < {k}; ++p) {{",
                f"                    const vec* y = (const vec*)(right + p * {width} + {j});",
                f"                    {unroll} for (int r = 0; r < {rows}; ++r) {{",
                f"                        const {t} x = in0[ia + ({i} + r) * {sa1}LL + p * {sa2}LL];",
                f"                        {unroll} for (int c = 0; c < {cols}; ++c) acc[r][c] = acc[r][c] + x * y[c];",
                "                    }",
                "                }",
                f"                {unroll} for (int r = 0; r < {rows}; ++r) {{",
                f"                    {t}* o = out0 + (b * {m}LL + {i} + r) * {n}LL + {j};",
                *([f"                    {unroll} for (int c = 0; c < {cols}; ++c) __builtin_memcpy(o + c * {lanes}, "
                   f"&acc[r][c], sizeof(vec));"] if tail is None else
                  [f"                    {unroll} for (int c = 0; c < {cols}; ++c) __builtin_memcpy(o + c * {lanes}, "
                   f"&acc[r][c], c + 1 < {cols} ? sizeof(vec) : {tail} * sizeof({t}));"]),
                "                }",
                "            }"]

    lines = ["#pragma GCC push_options",
             '#pragma GCC optimize ("fp-contract=fast")',  # x * y + acc as one fused multiply-add
             f'extern "C" void {name}(const {t}* __restrict__ in0, const {t}* __restrict__ in1, '
             f"{t}* __restrict__ out0, int threads) {{",
             f"    typedef {t} vec __attribute__((vector_size({VECTOR_BYTES})));",
             f"    alignas({VECTOR_BYTES}) {t} right[{k * width}];",
             f"    for (int64_t p = 0; p < {k}; ++p)",
             f"        for (int64_t j = {n}; j < {width}; ++j) right[p * {width} + j] = 0;",
             *[f"    for (int64_t q{d} = 0; q{d} < {e}; ++q{d})" for d, e in enumerate(batch)],
             "    {",
             f"        const int64_t b = {flat}, ia = {a_base}, ib = {b_base};",
             *(  # read the right operand in the order of its memory
                 [f"        for (int64_t p = 0; p < {k}; ++p)", f"            for (int64_t j = 0; j < {n}; ++j)"]
                 if abs(sb2) <= abs(sb1) else
                 [f"        for (int64_t j = 0; j < {n}; ++j)", f"            for (int64_t p = 0; p < {k}; ++p)"]),
             f"                right[p * {width} + j] = in1[ib + p * {sb1}LL + j * {sb2}LL];"]
    row_parts = [(ROWS, f"for (int64_t i = 0; i < {m - m % ROWS}; i += {ROWS})", "i")] if m >= ROWS else []
    if m % ROWS:
        row_parts.append((m % ROWS, "", str(m - m % ROWS)))
    full = vectors - vectors % VECTORS
    for rows, row_loop, i in row_parts:
        lines.append(f"        {row_loop} {{")
        last = n - (vectors - 1) * lanes if n % lanes else None
        if full:
            whole = full if vectors % VECTORS or last is None else full - VECTORS
            if whole:
                lines.append(f"        for (int64_t j = 0; j < {whole * lanes}; j += {VECTORS * lanes})")
                lines += block(rows, VECTORS, i, "j", None)
            if whole < full:
                lines += block(rows, VECTORS, i, str(whole * lanes), last)
        if vectors % VECTORS:
            lines += block(rows, vectors % VECTORS, i, str(full * lanes), last)
        lines.append("        }")
    lines += ["    }", "}", "#pragma GCC pop_options"]
    return CppSource(name, "\n".join(lines) + "\n", "matmul")


def small_batched_product(name: str, batch: int, m: int, k: int, n: int, a_strides: tuple, b_strides: tuple,
                          dtype: str) -> CppSource:
    """C++ for out[b] = a[b] @ b[b] (a: batch x m x k, b: batch x k x n, any strides in elements; out
    contiguous) in PyTorch's order for small products (`TORCH_SMALL_BMM`): sums start at zero and add the
    products in order of k, unfused (no multiply-add instruction: PyTorch's loop has none). The loop over
    columns is innermost, so it vectorises without changing any sum's order."""
    t = {"float32": "float", "float64": "double"}[dtype]
    (sa0, sa1, sa2), (sb0, sb1, sb2) = a_strides, b_strides
    lines = ["#pragma GCC push_options", '#pragma GCC optimize ("fp-contract=off")',
             f'extern "C" void {name}(const {t}* __restrict__ in0, const {t}* __restrict__ in1, '
             f'{t}* __restrict__ out0, int threads) {{',
             f"    for (int64_t b = 0; b < {batch}; ++b)",
             f"        for (int64_t i = 0; i < {m}; ++i) {{",
             f"            {t} acc[{n}];",
             f"            for (int64_t j = 0; j < {n}; ++j) acc[j] = 0;",
             f"            for (int64_t p = 0; p < {k}; ++p) {{",
             f"                const {t} x = in0[b * {sa0}LL + i * {sa1}LL + p * {sa2}LL];",
             f"                const {t}* y = in1 + b * {sb0}LL + p * {sb1}LL;",
             f"                for (int64_t j = 0; j < {n}; ++j) acc[j] = acc[j] + x * y[j * {sb2}LL];",
             "            }",
             f"            for (int64_t j = 0; j < {n}; ++j) out0[(b * {m} + i) * {n}LL + j] = acc[j];",
             "        }", "}", "#pragma GCC pop_options"]
    return CppSource(name, "\n".join(lines) + "\n", "matmul")
