"""The gradient of a max pooling whose windows tile the input, as one Triton kernel.

torch computes it by pooling again with int64 indices and scattering `dy`
through them: the input is read twice and eight bytes of index are written
and read per window element. Where the windows tile the input exactly
(window = stride, no padding or dilation, extents divisible by the window,
NCHW), each program instance instead takes a block of windows, finds each
window's maximum as torch does (the first strictly greater element, NaN
winning from where it appears: the last NaN) and writes `dy` there and zero
elsewhere: one read of the input and `dy`, one write of the result.

For 2x2 windows `max_pool_gradient_rows` takes whole rows of windows
instead: each program loads its two input rows per window row contiguously
(rows padded to a power of two), splits them into the four positions of each
window in registers and stores the result rows contiguously, where the
per-window kernel reads and writes every other element per instruction. Which
is faster is measured (passes/lower.py). `max_pool_rows` is the forward 2x2
pooling the same way, measured against torch's.
"""
from __future__ import annotations

from ..dtypes import DType
from .common import header
from .pointwise import KernelSource

BLOCK = 256


def fits(attrs: dict, shape: tuple[int, ...]) -> bool:
    """Whether a max_pooling2d_gradient with these attributes, over an input of `shape`, is one this kernel
    computes: windows that tile the NCHW input exactly, and fewer than 2**31 elements."""
    kh, kw = attrs["kernel_size"]
    if attrs.get("data_layout", "NCHW") != "NCHW" or len(shape) != 4 or tuple(attrs["stride"]) != (kh, kw):
        return False
    if tuple(attrs["dilation"]) != (1, 1) or attrs["padding"] not in ("valid", (0, 0, 0, 0), [0, 0, 0, 0]):
        return False
    n, c, h, w = shape
    return h % kh == 0 and w % kw == 0 and 0 < n * c * h * w < 2 ** 31


def max_pool_gradient(name: str, shape: tuple[int, ...], kernel: tuple[int, int], dtype: DType,
                      interpret: bool) -> KernelSource:
    """The kernel for `dx = max_pooling2d_gradient(dy, x)` over an input of NCHW `shape` (see `fits`)."""
    n, c, h, w = shape
    kh, kw = kernel
    ho, wo = h // kh, w // kw
    windows = n * c * ho * wo
    lines = [header(f"max pooling gradient {kh}x{kw}, {dtype.name}", interpret), "", "@triton.jit",
             f"def {name}(dy, x, dx, windows, ho, wo, w, BLOCK: tl.constexpr):",
             "    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             "    mask = i < windows",
             "    col = i % wo",
             "    row = (i // wo) % ho",
             "    plane = i // (wo * ho)",
             f"    base = plane * (ho * {kh}) * w + row * {kh} * w + col * {kw}",
             "    g = tl.load(dy + i, mask=mask, other=0)"]
    cells = [(a, b) for a in range(kh) for b in range(kw)]
    for k, (a, b) in enumerate(cells):
        # compared in float32 (exact for every float type; the interpreter holds half types as raw bits)
        lines.append(f"    v{k} = tl.load(x + base + {a} * w + {b}, mask=mask, other=0).to(tl.float32)")
    lines += ["    best = v0", "    at = tl.zeros_like(i)"]
    for k in range(1, len(cells)):
        lines += [f"    take = (v{k} > best) | (v{k} != v{k})",
                  f"    best = tl.where(take, v{k}, best)",
                  f"    at = tl.where(take, {k}, at)"]
    lines.append("    zero = tl.zeros_like(g)")
    for k, (a, b) in enumerate(cells):
        lines.append(f"    tl.store(dx + base + {a} * w + {b}, tl.where(at == {k}, g, zero), mask=mask)")
    source = "\n".join(lines) + "\n"
    return KernelSource(name=name, source=source, grid=((windows + BLOCK - 1) // BLOCK,), num_warps=4,
                        constexprs={"BLOCK": BLOCK}, template="pooling", sizes=(windows, ho, wo, w))


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def rows_fit(attrs: dict, shape: tuple[int, ...]) -> bool:
    """Whether `max_pool_gradient_rows` computes this gradient: 2x2 windows that tile the input (`fits`)."""
    return tuple(attrs["kernel_size"]) == (2, 2) and fits(attrs, shape) and _pow2(shape[3]) <= 4096


def max_pool_gradient_rows(name: str, shape: tuple[int, ...], dtype: DType, interpret: bool) -> KernelSource:
    """The kernel for `dx = max_pooling2d_gradient(dy, x)` with 2x2 windows over an input of NCHW `shape`
    (see `rows_fit`): a program per block of window rows, each row of windows loaded as a [2, width] tile."""
    n, c, h, w = shape
    width = _pow2(w)
    rows = n * c * (h // 2)
    block = max(1, min(64, 2048 // width)) if not interpret else 2
    source = header(f"max pooling gradient 2x2 by rows, {dtype.name}", interpret) + f'''

@triton.jit
def {name}(dy, x, dx, rows, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r_ok = r < rows
    d = tl.arange(0, 2)
    col = tl.arange(0, {width})
    at_x = r[:, None, None] * {2 * w} + d[None, :, None] * {w} + col[None, None, :]
    ok = r_ok[:, None, None] & (d[None, :, None] < 2) & (col[None, None, :] < {w})
    # compared in float32 (exact for every float type; the interpreter holds half types as raw bits)
    v = tl.reshape(tl.load(x + at_x, mask=ok, other=0).to(tl.float32), (BLOCK, 2, {width // 2}, 2))
    left, right = tl.split(v)
    v0, v2 = tl.split(tl.permute(left, (0, 2, 1)))
    v1, v3 = tl.split(tl.permute(right, (0, 2, 1)))
    best = v0
    at = tl.zeros_like(v0).to(tl.int32)
    take = (v1 > best) | (v1 != v1)
    best = tl.where(take, v1, best)
    at = tl.where(take, 1, at)
    take = (v2 > best) | (v2 != v2)
    best = tl.where(take, v2, best)
    at = tl.where(take, 2, at)
    take = (v3 > best) | (v3 != v3)
    at = tl.where(take, 3, at)
    pc = tl.arange(0, {width // 2})
    g = tl.load(dy + r[:, None] * {w // 2} + pc[None, :], mask=r_ok[:, None] & (pc[None, :] < {w // 2}), other=0)
    zero = tl.zeros_like(g)
    left = tl.permute(tl.join(tl.where(at == 0, g, zero), tl.where(at == 2, g, zero)), (0, 2, 1))
    right = tl.permute(tl.join(tl.where(at == 1, g, zero), tl.where(at == 3, g, zero)), (0, 2, 1))
    out = tl.reshape(tl.join(left, right), (BLOCK, 2, {width}))
    tl.store(dx + at_x, out, mask=ok)
'''
    return KernelSource(name=name, source=source, grid=((rows + block - 1) // block,), num_warps=4,
                        constexprs={"BLOCK": block}, template="pooling", sizes=(rows,))


def max_pool_rows(name: str, shape: tuple[int, ...], dtype: DType, interpret: bool) -> KernelSource:
    """The kernel for `y = max_pooling2d(x)` with 2x2 windows over an input of NCHW `shape` (see `rows_fit`),
    a program per block of window rows; a NaN in a window makes its maximum NaN, as torch's does."""
    n, c, h, w = shape
    width = _pow2(w)
    rows = n * c * (h // 2)
    block = max(1, min(64, 2048 // width)) if not interpret else 2
    source = header(f"max pooling 2x2 by rows, {dtype.name}", interpret, reduction=True) + f'''

@triton.jit
def {name}(x, y, rows, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r_ok = r < rows
    d = tl.arange(0, 2)
    col = tl.arange(0, {width})
    ok = r_ok[:, None, None] & (d[None, :, None] < 2) & (col[None, None, :] < {w})
    v = tl.load(x + r[:, None, None] * {2 * w} + d[None, :, None] * {w} + col[None, None, :], mask=ok, other=0)
    v = tl.reshape(v.to(tl.float32), (BLOCK, 2, {width // 2}, 2))
    m = tl.reduce(tl.reduce(v, 3, _maximum), 1, _maximum)
    pc = tl.arange(0, {width // 2})
    tl.store(y + r[:, None] * {w // 2} + pc[None, :], m.to(y.dtype.element_ty),
             mask=r_ok[:, None] & (pc[None, :] < {w // 2}))
'''
    return KernelSource(name=name, source=source, grid=((rows + block - 1) // block,), num_warps=4,
                        constexprs={"BLOCK": block}, template="pooling", sizes=(rows,))
