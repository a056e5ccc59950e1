"""The neural-material shading kernel's fast path: latent channels in 32-bit words, filtered as integers,
one texel per thread, and the decoder's output layer arranged so that the shading outputs need no
reductions across threads. `stitchml.shader.shading.shade` calls it when it applies (`fits`).

Why it is shaped this way (an H200 at 4096 x 4096 is bound by instructions, not bytes: 1.8 bytes of
latents and 16 bytes of output per texel move in ~72 µs, while the byte-gather kernel issued ~2000
instructions per texel):

* Magnification by exactly 2 and 4 at half-pixel centres has bilinear weights in quarters and eighths,
  so every tap weight is a whole number of 64ths. The four taps are summed as integers, two channels
  per 32-bit lane pair (SWAR): a signed byte b is biased to b + 128, so a lane's weighted sum stays
  under 64 * 255 < 2**16 and no carry crosses lanes. Four channels cost one 32-bit load per tap.
* Per-texel values (tap indices, weights) are one-dimensional, so each is computed once per texel
  rather than once per channel; the 16 channels are joined in registers, and the first layer's weight
  rows are permuted on load to match the joined order.
* The output layer's columns are permuted on load so that, in the tensor-core accumulator layout
  (each thread holds columns 2k, 2k+1, 8+2k, 9+2k of a row), every thread has the normal's x and y
  beside the colour channels it writes: the normal is rebuilt and the store assembled without
  cross-thread sums.

Import after setting TRITON_INTERPRET=1 to run on the CPU (Triton reads it when decorating).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .language import mlp_apply, mlp_load
from .spec import MLPSpec


def fits(spec: MLPSpec, fine: int, coarse: int) -> bool:
    """Whether the fast kernel applies: channel counts multiples of 4 that fill at most 16 inputs, a
    decoder with a hidden layer and 6 outputs padded to 16, at program scope."""
    return (fine % 4 == 0 and coarse % 4 == 0 and spec.padded[0] == 16 and spec.padded[-1] == 16
            and spec.layers >= 2 and spec.scope == "program")


@triton.jit
def _input_rows(w_ptr, P1: tl.constexpr):
    """The first layer's (16, P1) weights with rows in the order `_latent_inputs` joins the channels:
    row m holds channel 8 * (m & 1) + 4 * ((m >> 1) & 1) + 2 * (m >> 3) + ((m >> 2) & 1)."""
    m = tl.arange(0, 16)
    c = 8 * (m & 1) + 4 * ((m >> 1) & 1) + 2 * (m >> 3) + ((m >> 2) & 1)
    return tl.load(w_ptr + c[:, None] * P1 + tl.arange(0, P1)[None, :])


@triton.jit
def _output_columns(w_ptr, PIN: tl.constexpr):
    """The output layer's (PIN, 16) weights and its biases with columns rearranged: 2k <- normal x,
    2k + 1 <- normal y (k < 4), 8 <- r, 9 <- g, 10 <- b, 14 <- roughness, the rest zero."""
    j = tl.arange(0, 16)
    src = tl.where(j < 8, 3 + (j & 1), tl.where(j == 14, 5, j - 8))
    valid = (j < 11) | (j == 14)
    w = tl.load(w_ptr + tl.arange(0, PIN)[:, None] * 16 + src[None, :], mask=valid[None, :], other=0.0)
    b = tl.load(w_ptr + PIN * 16 + src, mask=valid, other=0.0)
    return w, b


@triton.jit
def _word(words, J: tl.constexpr, FW: tl.constexpr, CW: tl.constexpr, f00, f01, f10, f11, c00, c01, c10, c11,
          g00, g01, g10, g11, h00, h01, h10, h11):
    """The weighted tap sums of latent word J (fine words first, then coarse) as two int32s of two
    16-bit lanes each: bytes 0 and 2, and bytes 1 and 3, each biased by 128 and summed in 64ths.
    f.., c..: word offsets of the fine and coarse taps; g.., h..: their weights in 64ths."""
    lo = tl.zeros(f00.shape, tl.int32)
    hi = tl.zeros(f00.shape, tl.int32)
    if J < FW:
        for tap in tl.static_range(4):
            if tap == 0:
                u = tl.load(words + f00 + J)
                w = g00
            elif tap == 1:
                u = tl.load(words + f01 + J)
                w = g01
            elif tap == 2:
                u = tl.load(words + f10 + J)
                w = g10
            else:
                u = tl.load(words + f11 + J)
                w = g11
            lo += ((u & 0x00FF00FF) ^ 0x00800080) * w
            hi += (((u >> 8) & 0x00FF00FF) ^ 0x00800080) * w
    elif J < FW + CW:
        for tap in tl.static_range(4):
            if tap == 0:
                u = tl.load(words + c00 + (J - FW))
                w = h00
            elif tap == 1:
                u = tl.load(words + c01 + (J - FW))
                w = h01
            elif tap == 2:
                u = tl.load(words + c10 + (J - FW))
                w = h10
            else:
                u = tl.load(words + c11 + (J - FW))
                w = h11
            lo += ((u & 0x00FF00FF) ^ 0x00800080) * w
            hi += (((u >> 8) & 0x00FF00FF) ^ 0x00800080) * w
    # Words past the channels stay 0: finite inputs that meet the zero rows the packing pads with.
    return tl.join(tl.join(lo & 0xFFFF, lo >> 16), tl.join(hi & 0xFFFF, hi >> 16))


@triton.jit
def _shading_outputs(y):
    """The 8 written channels (BLOCK, 8) from the output layer as `_output_columns` arranges it."""
    BLOCK: tl.constexpr = y.shape[0]
    even, odd = tl.split(tl.reshape(y, (BLOCK, 2, 4, 2)))  # column 8a + 2k + b -> [a, k], split on b
    nx, c_even = tl.split(tl.permute(even, (0, 2, 1)))  # split on a: columns 2k and 8 + 2k
    ny, c_odd = tl.split(tl.permute(odd, (0, 2, 1)))
    # xy longer than 1: z = 0 and the normal scaled to unit; otherwise z = sqrt(1 - x² - y²), already unit.
    s = nx * nx + ny * ny
    inv = tl.rsqrt(tl.maximum(s, 1.0))
    nz = tl.sqrt(tl.maximum(1.0 - s, 0.0))
    k = tl.arange(0, 4)[None, :]
    out_even = tl.where(k == 2, ny * inv, tl.minimum(tl.maximum(c_even, 0.0), 1.0))  # r, b, normal y, roughness
    out_odd = tl.where(k == 0, tl.minimum(tl.maximum(c_odd, 0.0), 1.0),
                       tl.where(k == 1, nx * inv, tl.where(k == 2, nz, 0.0)))  # g, normal x, normal z, 0
    return tl.reshape(tl.join(out_even, out_odd), (BLOCK, 8))


@triton.jit
def shade_words_kernel(lat_ptr, w_ptr, out_ptr, size, coarse_word, BLOCK: tl.constexpr, FW: tl.constexpr,
                       CW: tl.constexpr, LEVELS: tl.constexpr, MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr,
                       MLP_P1: tl.constexpr, MLP_P2: tl.constexpr, MLP_P3: tl.constexpr, MLP_P4: tl.constexpr,
                       MLP_A0: tl.constexpr, MLP_A1: tl.constexpr, MLP_A2: tl.constexpr, MLP_A3: tl.constexpr,
                       MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr, ROW_BLOCKS: tl.constexpr,
                       STAGES: tl.constexpr):
    """`shading._shade_kernel` for inputs that `fits`: FW fine and CW coarse words per texel."""
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    w0 = _input_rows(w_ptr, MLP_P1)
    O1: tl.constexpr = MLP_P0 * MLP_P1 + MLP_P1
    O2: tl.constexpr = O1 + MLP_P1 * MLP_P2 + MLP_P2
    O3: tl.constexpr = O2 + MLP_P2 * MLP_P3 + MLP_P3
    if MLP_LAYERS == 2:
        w1, b1 = _output_columns(w_ptr + O1, MLP_P1)
    elif MLP_LAYERS == 3:
        w2, b2 = _output_columns(w_ptr + O2, MLP_P2)
    else:
        w3, b3 = _output_columns(w_ptr + O3, MLP_P3)
    words = lat_ptr.to(tl.pointer_type(tl.int32))
    half = size // 2
    quarter = size // 4
    for block in tl.range(tl.program_id(0), tl.cdiv(size * size, BLOCK), tl.num_programs(0), num_stages=STAGES):
        r = tl.arange(0, BLOCK)
        if ROW_BLOCKS:  # size % BLOCK == 0: the block lies in one image row, whose index is one scalar
            py = (block * BLOCK) // size
            px = (block * BLOCK) % size + r
            texel = px < size
        else:
            t = block * BLOCK + r  # int32: 64-bit division is slow on the GPU
            texel = t < size * size
            py = tl.minimum(t // size, size - 1)  # rows past the end read the last row; their stores are masked
            px = t % size
        # Half-pixel centres: at scale 1/2 the lower tap is (p - 1) >> 1 and the upper one weighs
        # ((p - 1) & 1) / 2 + 1/4; at 1/4, (p - 2) >> 2 and ((p - 2) & 3) / 4 + 1/8. Edges repeat.
        fy = py - 1
        fx = px - 1
        cy = py - 2
        cx = px - 2
        fr0 = tl.maximum(fy >> 1, 0) * half
        fr1 = tl.minimum((fy >> 1) + 1, half - 1) * half
        fc0 = tl.maximum(fx >> 1, 0)
        fc1 = tl.minimum((fx >> 1) + 1, half - 1)
        cr0 = tl.maximum(cy >> 2, 0) * quarter
        cr1 = tl.minimum((cy >> 2) + 1, quarter - 1) * quarter
        cc0 = tl.maximum(cx >> 2, 0)
        cc1 = tl.minimum((cx >> 2) + 1, quarter - 1)
        fwy = (fy & 1) * 2 + 1  # the upper tap's weight, in quarters
        fwx = (fx & 1) * 2 + 1
        cwy = (cy & 3) * 2 + 1  # in eighths
        cwx = (cx & 3) * 2 + 1
        f00 = (fr0 + fc0) * FW
        f01 = (fr0 + fc1) * FW
        f10 = (fr1 + fc0) * FW
        f11 = (fr1 + fc1) * FW
        c00 = coarse_word + (cr0 + cc0) * CW
        c01 = coarse_word + (cr0 + cc1) * CW
        c10 = coarse_word + (cr1 + cc0) * CW
        c11 = coarse_word + (cr1 + cc1) * CW
        g00 = 4 * (4 - fwy) * (4 - fwx)
        g01 = 4 * (4 - fwy) * fwx
        g10 = 4 * fwy * (4 - fwx)
        g11 = 4 * fwy * fwx
        h00 = (8 - cwy) * (8 - cwx)
        h01 = (8 - cwy) * cwx
        h10 = cwy * (8 - cwx)
        h11 = cwy * cwx
        q0 = _word(words, 0, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11)
        q1 = _word(words, 1, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11)
        q2 = _word(words, 2, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11)
        q3 = _word(words, 3, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11)
        lanes = tl.reshape(tl.join(tl.join(q0, q1), tl.join(q2, q3)), (BLOCK, 16))
        # 2**23 + lane, read as a float's bits, is exact; remove 2**23 and the bias 128 * 64, scale to values.
        x = ((lanes | 0x4B000000).to(tl.float32, bitcast=True) - 8396800.0) * (1.0 / (64 * LEVELS))
        y = mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, MLP_LAYERS, MLP_A0, MLP_A1, MLP_A2, MLP_A3, MLP_SCOPE,
                      MLP_REDUCED)
        out = _shading_outputs(y).to(out_ptr.dtype.element_ty)
        # 64-bit arithmetic only on the block's start; per-element offsets stay int32 so stores vectorize.
        ob = out_ptr + tl.cast(block, tl.int64) * (BLOCK * 8)
        o = r[:, None] * 8 + tl.arange(0, 8)[None, :]
        if ROW_BLOCKS:
            tl.store(ob + o, out)
        else:
            tl.store(ob + o, out, mask=texel[:, None])


@triton.jit
def shade_plain_kernel(x_ptr, w_ptr, out_ptr, texels, MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr,
                       MLP_P1: tl.constexpr, MLP_P2: tl.constexpr, MLP_P3: tl.constexpr, MLP_P4: tl.constexpr,
                       MLP_A0: tl.constexpr, MLP_A1: tl.constexpr, MLP_A2: tl.constexpr, MLP_A3: tl.constexpr,
                       MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr, BLOCK: tl.constexpr,
                       STAGES: tl.constexpr, EVEN: tl.constexpr):
    """The fast kernel's decoder and outputs on plain per-texel features (texels, 16), no sampling: what
    the decode costs without the compression."""
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    O1: tl.constexpr = MLP_P0 * MLP_P1 + MLP_P1
    O2: tl.constexpr = O1 + MLP_P1 * MLP_P2 + MLP_P2
    O3: tl.constexpr = O2 + MLP_P2 * MLP_P3 + MLP_P3
    if MLP_LAYERS == 2:
        w1, b1 = _output_columns(w_ptr + O1, MLP_P1)
    elif MLP_LAYERS == 3:
        w2, b2 = _output_columns(w_ptr + O2, MLP_P2)
    else:
        w3, b3 = _output_columns(w_ptr + O3, MLP_P3)
    r = tl.arange(0, BLOCK)[:, None]
    c = tl.arange(0, MLP_P0)[None, :]
    o = r * 8 + tl.arange(0, 8)[None, :]
    for block in tl.range(tl.program_id(0), tl.cdiv(texels, BLOCK), tl.num_programs(0), num_stages=STAGES):
        start = tl.cast(block, tl.int64) * BLOCK
        if EVEN:
            x = tl.load(x_ptr + start * MLP_P0 + r * MLP_P0 + c)
        else:
            x = tl.load(x_ptr + start * MLP_P0 + r * MLP_P0 + c, mask=r < texels - start, other=0.0)
        y = mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, MLP_LAYERS, MLP_A0, MLP_A1, MLP_A2, MLP_A3, MLP_SCOPE,
                      MLP_REDUCED)
        out = _shading_outputs(y).to(out_ptr.dtype.element_ty)
        if EVEN:
            tl.store(out_ptr + start * 8 + o, out)
        else:
            tl.store(out_ptr + start * 8 + o, out, mask=r < texels - start)


__all__ = ["fits", "shade_words_kernel", "shade_plain_kernel"]
