"""The gradient of a max pooling whose windows tile the input, as one Triton kernel.

torch computes it by pooling again with int64 indices and scattering `dy`
through them: the input is read twice and eight bytes of index are written
and read per window element. Where the windows tile the input exactly
(window = stride, no padding or dilation, extents divisible by the window,
NCHW), each program instance instead takes a block of windows, finds each
window's maximum as torch does (the first strictly greater element, NaN
winning from where it appears: the last NaN) and writes `dy` there and zero
elsewhere: one read of the input and `dy`, one write of the result.
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
