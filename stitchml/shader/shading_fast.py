"""The neural-material shading kernel's fast path: latent channels in 32-bit words, filtered as integers,
one texel (or a group of texels) per thread, and the decoder's output layer arranged so that the
shading outputs need no reductions across threads. `stitchml.shader.shading.shade` calls it when it applies (`fits`).

Why it is shaped this way (an H200 at 4096 x 4096 is bound by instructions, not bytes: 1.8 bytes of
latents and 16 bytes of output per texel move in ~72 µs, while the byte-gather kernel issued ~2000
instructions per texel):

* Magnification by exactly 2 and 4 at half-pixel centres has bilinear weights in quarters and eighths,
  so every tap weight is a whole number of 64ths. The four taps are summed as integers, two channels
  per 32-bit lane pair (SWAR): a signed byte b is biased to b + 128, so a lane's weighted sum stays
  under 64 * 255 < 2**16 and no carry crosses lanes. Four channels cost one 32-bit load per tap.
* Latents within [-8, 8] (levels <= 8) leave every lane's tap sum within 1024 64ths of its lowest value:
  with 0x6400 added (folded into the sums' starting value), a lane read as a half is 1024 + its offset,
  exactly, and one fma.rn.f16x2 turns a lane pair into the two decoder inputs. Larger levels go through
  float32, one lane at a time (2**23 + lane read as a float). The decoder sees the same values.
* Latent words are addressed from row pointers: a column's pointer is one wide multiply-add, and the
  words of a column are constant offsets from it.
* Per-texel values (tap indices, weights) are one-dimensional, so each is computed once per texel
  rather than once per channel; the 16 channels are joined in registers, and the first layer's weight
  rows are permuted on load to match the joined order.
* Magnified by 2 and 4, consecutive texels of a row fall between the same latent columns: sampled
  in pairs or fours (`GROUP`), each column is blended along y once for the texels that share it, and
  along x with weights that are constants of a texel's place in its group.
* The output layer's columns are permuted on load so that, in the tensor-core accumulator layout
  (each thread holds columns 2k, 2k+1, 8+2k, 9+2k of a row), every thread has the normal's x and y
  beside the colour channels it writes: the normal is rebuilt and the store assembled without
  cross-thread sums.

Import after setting TRITON_INTERPRET=1 to run on the CPU (Triton reads it when decorating).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .language import _PTX, mlp_apply, mlp_load
from .spec import MLPSpec


def fits(spec: MLPSpec, fine: int, coarse: int) -> bool:
    """Whether the fast kernel applies: channel counts multiples of 4 that fill at most 16 inputs, a
    decoder with a hidden layer and 6 outputs padded to 16, at program scope."""
    return (fine % 4 == 0 and coarse % 4 == 0 and spec.padded[0] == 16 and spec.padded[-1] == 16
            and spec.layers >= 2 and spec.scope == "program")


@triton.jit
def _input_rows(w_ptr, P1: tl.constexpr, HALF: tl.constexpr):
    """The first layer's (16, P1) weights with rows in the order `_texel_vector` joins the channels: row m
    holds channel 8 * (m & 1) + 4 * ((m >> 1) & 1) + 2 * (m >> 3) + ((m >> 2) & 1) (float lanes), or
    8 * ((m >> 1) & 1) + 4 * ((m >> 2) & 1) + 2 * (m & 1) + (m >> 3) (half lanes)."""
    m = tl.arange(0, 16)
    if HALF:
        c = 8 * ((m >> 1) & 1) + 4 * ((m >> 2) & 1) + 2 * (m & 1) + (m >> 3)
    else:
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
def _biased_lanes(u, w, lo, hi):
    """lo + w * (bytes 0 and 2 of u, each + 128), hi + w * (bytes 1 and 3 + 128), in 16-bit lanes. One
    xor biases all four bytes (b + 128 = b ^ 0x80 as a byte); on the GPU one byte permute moves bytes 1
    and 3 down (a shift and a mask otherwise)."""
    v = u ^ -0x7F7F7F80  # 0x80808080 as an int32
    if _PTX:
        odd = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0, 0x4341;", "=r,r", [v], dtype=tl.int32, is_pure=True,
                                        pack=1)
    else:
        odd = (v >> 8) & 0x00FF00FF
    return lo + (v & 0x00FF00FF) * w, hi + odd * w


@triton.jit
def _word(J: tl.constexpr, FW: tl.constexpr, CW: tl.constexpr, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10,
          g11, h00, h01, h10, h11, KLANE: tl.constexpr):
    """The weighted tap sums (lo: bytes 0 and 2, hi: bytes 1 and 3, each biased by 128, in 64ths, plus
    KLANE per lane) of latent word J (fine words first, then coarse), two 16-bit lanes to an int32 (SWAR).
    f.., c..: pointers to the first fine and coarse word of each tap; g.., h..: their weights in 64ths."""
    lo = tl.full(f00.shape, KLANE * 65537, tl.int32)
    hi = lo
    if J < FW:
        lo, hi = _biased_lanes(tl.load(f00 + J), g00, lo, hi)
        lo, hi = _biased_lanes(tl.load(f01 + J), g01, lo, hi)
        lo, hi = _biased_lanes(tl.load(f10 + J), g10, lo, hi)
        lo, hi = _biased_lanes(tl.load(f11 + J), g11, lo, hi)
    elif J < FW + CW:
        lo, hi = _biased_lanes(tl.load(c00 + (J - FW)), h00, lo, hi)
        lo, hi = _biased_lanes(tl.load(c01 + (J - FW)), h01, lo, hi)
        lo, hi = _biased_lanes(tl.load(c10 + (J - FW)), h10, lo, hi)
        lo, hi = _biased_lanes(tl.load(c11 + (J - FW)), h11, lo, hi)
    # Words past the channels give finite inputs that meet the zero rows the packing pads with.
    return lo, hi


@triton.jit
def _float_lanes(lo, hi):
    """The four 16-bit lanes of `lo` and `hi` as floats 2**23 + lane, shape (..., 2, 2): [lane, lo or hi],
    i.e. byte 2 * lane + (hi) of the latent word."""
    if _PTX:
        # Each lane under the exponent of 2**23 in one byte permute.
        lanes = tl.join(tl.join(_float_lane(lo, False), _float_lane(lo, True)),
                        tl.join(_float_lane(hi, False), _float_lane(hi, True)))
    else:
        lanes = tl.join(tl.join(lo & 0xFFFF, lo >> 16), tl.join(hi & 0xFFFF, hi >> 16)) | 0x4B000000
    return lanes.to(tl.float32, bitcast=True)


@triton.jit
def _float_lane(word, HIGH: tl.constexpr):
    """The bits of the float 2**23 + the low (or high) 16-bit lane of `word`: one prmt.b32 picking the
    lane's two bytes and then bytes of 0x4B000000 (selector nibble i names result byte i; 0-3 are
    word's bytes, 4-7 the constant's)."""
    if HIGH:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0x4B000000, 0x7632;", "=r,r", [word], dtype=tl.int32,
                                        is_pure=True, pack=1)
    else:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, 0x4B000000, 0x7610;", "=r,r", [word], dtype=tl.int32,
                                        is_pure=True, pack=1)
    return out


@triton.jit
def _half_lanes(word, LEVELS: tl.constexpr):
    """The two 16-bit lanes of `word`, each 1024 + 64 * (LEVELS + value) with the value in [-LEVELS,
    LEVELS] (LEVELS <= 8) and read as a half (bits 0x6400 + lane: exact below 2048), as the halves
    lane / 64 - 16 - LEVELS: the value, exactly. On the GPU one fma.rn.f16x2 for both lanes."""
    if _PTX:
        # 1/64 in both halves; -(16 + LEVELS) as a half is 0xCC00 + 64 * LEVELS, in both (as an int32)
        scale = tl.full(word.shape, 0x24002400, tl.int32)
        shift = tl.full(word.shape, (0xCC00 + 64 * LEVELS) * 65537 - 4294967296, tl.int32)
        low, high = tl.inline_asm_elementwise(
            "{ .reg .b32 t; fma.rn.f16x2 t, $2, $3, $4; mov.b32 {$0, $1}, t; }", "=h,=h,r,r,r", [word, scale, shift],
            dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    else:
        low = (word & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        high = ((word >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        low = (low * (1.0 / 64) - (16.0 + LEVELS)).to(tl.float16)
        high = (high * (1.0 / 64) - (16.0 + LEVELS)).to(tl.float16)
    return low, high


@triton.jit
def _texel_vector(lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3, HALF: tl.constexpr, LEVELS: tl.constexpr):
    """A texel's 16 decoder inputs (..., 16) from its four words' tap sums, in `_input_rows`' order: the
    latent values (levels, not yet / LEVELS), as float32 (float lanes) or halves (HALF)."""
    if HALF:
        # the two lanes of one conversion sit side by side (the last join), ready to pack two to a register
        a0, b0 = _half_lanes(lo0, LEVELS)
        c0, d0 = _half_lanes(hi0, LEVELS)
        a1, b1 = _half_lanes(lo1, LEVELS)
        c1, d1 = _half_lanes(hi1, LEVELS)
        a2, b2 = _half_lanes(lo2, LEVELS)
        c2, d2 = _half_lanes(hi2, LEVELS)
        a3, b3 = _half_lanes(lo3, LEVELS)
        c3, d3 = _half_lanes(hi3, LEVELS)
        first = tl.join(tl.join(tl.join(a0, c0), tl.join(a1, c1)), tl.join(tl.join(a2, c2), tl.join(a3, c3)))
        second = tl.join(tl.join(tl.join(b0, d0), tl.join(b1, d1)), tl.join(tl.join(b2, d2), tl.join(b3, d3)))
        x = tl.reshape(tl.join(first, second), (lo0.shape[0], 16))
    else:
        q0 = _float_lanes(lo0, hi0)
        q1 = _float_lanes(lo1, hi1)
        q2 = _float_lanes(lo2, hi2)
        q3 = _float_lanes(lo3, hi3)
        # 2**23 + lane, read as a float, is exact; / 64 - (2**23 + 128 * 64) / 64 is exact too (one fma)
        x = tl.reshape(tl.join(tl.join(q0, q1), tl.join(q2, q3)), (lo0.shape[0], 16)) * (1.0 / 64) - 131200.0
    return x


@triton.jit
def _ylerp(top, bottom, a, b, START: tl.constexpr):
    """One latent word at two rows (pointers `top`, `bottom`), its bytes biased and blended a : b along y,
    from START, as 16-bit lanes: (bytes 0 and 2, bytes 1 and 3)."""
    lo_t, hi_t = _biased_lanes(tl.load(top), a, START, START)
    return _biased_lanes(tl.load(bottom), b, lo_t, hi_t)


@triton.jit
def _group_word(J: tl.constexpr, FW: tl.constexpr, CW: tl.constexpr, GROUP: tl.constexpr, T0, T1, T2, T3, B0, B1,
                B2, B3, S0, S1, S2, R0, R1, R2, fa, wa, wb, k1a, k1b, KLANE: tl.constexpr):
    """Latent word J of the GROUP texels of each group as tap sums (lo, hi) per texel (texels 2 and 3
    only for GROUP 4). Columns are y-blended once per group and shared: T0.. / B0.. point to the fine
    columns' first word in the top / bottom row, S0.. / R0.. to the coarse ones'; fa / wa: the bottom
    row's weight (quarters / eighths; the top row's is 4 - fa / 8 - wa). Along x the fine weights are
    constants (in 16ths of the quarters: 64ths in all); the coarse ones too for GROUP 4, per group (k1a,
    k1b for the second texel, wb for the first) for GROUP 2."""
    if J < FW:
        start: tl.constexpr = (KLANE // 16) * 65537  # the x weights sum to 16
        l0, h0 = _ylerp(T0 + J, B0 + J, 4 - fa, fa, start)
        l1, h1 = _ylerp(T1 + J, B1 + J, 4 - fa, fa, start)
        l2, h2 = _ylerp(T2 + J, B2 + J, 4 - fa, fa, start)
        # texel k: columns (k + 1) >> 1 and the next; the upper weighs 3/4 for even k, 1/4 for odd
        x0, y0 = l0 * 4 + l1 * 12, h0 * 4 + h1 * 12
        x1, y1 = l1 * 12 + l2 * 4, h1 * 12 + h2 * 4
        x2, y2, x3, y3 = x0, y0, x0, y0
        if GROUP == 4:
            l3, h3 = _ylerp(T3 + J, B3 + J, 4 - fa, fa, start)
            x2, y2 = l1 * 4 + l2 * 12, h1 * 4 + h2 * 12
            x3, y3 = l2 * 12 + l3 * 4, h2 * 12 + h3 * 4
    elif J < FW + CW:
        start: tl.constexpr = (KLANE // 8) * 65537  # the x weights sum to 8
        l0, h0 = _ylerp(S0 + (J - FW), R0 + (J - FW), 8 - wa, wa, start)
        l1, h1 = _ylerp(S1 + (J - FW), R1 + (J - FW), 8 - wa, wa, start)
        if GROUP == 4:
            # texel k: columns k >> 1 and the next; upper weights 5, 7, 1, 3 eighths
            l2, h2 = _ylerp(S2 + (J - FW), R2 + (J - FW), 8 - wa, wa, start)
            x0, y0 = l0 * 3 + l1 * 5, h0 * 3 + h1 * 5
            x1, y1 = l0 + l1 * 7, h0 + h1 * 7
            x2, y2 = l1 * 7 + l2, h1 * 7 + h2
            x3, y3 = l1 * 5 + l2 * 3, h1 * 5 + h2 * 3
        else:
            # both texels of a pair share their two columns; the weights depend on the pair's phase
            x0, y0 = l0 * (8 - wb) + l1 * wb, h0 * (8 - wb) + h1 * wb
            x1, y1 = l0 * k1a + l1 * k1b, h0 * k1a + h1 * k1b
            x2, y2, x3, y3 = x0, y0, x0, y0
    else:
        x0 = tl.zeros(wb.shape, tl.int32)
        y0, x1, y1, x2, y2, x3, y3 = x0, x0, x0, x0, x0, x0, x0
    return x0, y0, x1, y1, x2, y2, x3, y3


@triton.jit
def _texel_inputs(words, py, px, fine_h, fine_w, coarse_h, coarse_w, coarse_word, FW: tl.constexpr,
                  CW: tl.constexpr, HALF: tl.constexpr, LEVELS: tl.constexpr, KLANE: tl.constexpr):
    """The decoder inputs of the texels (py, px) as (BLOCK, 16) (`_texel_vector`), each texel's four taps
    on its own."""
    # Half-pixel centres: at scale 1/2 the lower tap is (p - 1) >> 1 and the upper one weighs
    # ((p - 1) & 1) / 2 + 1/4; at 1/4, (p - 2) >> 2 and ((p - 2) & 3) / 4 + 1/8. Edges repeat.
    fy = py - 1
    fx = px - 1
    cy = py - 2
    cx = px - 2
    fr0 = tl.maximum(fy >> 1, 0) * fine_w
    fr1 = tl.minimum((fy >> 1) + 1, fine_h - 1) * fine_w
    fc0 = tl.maximum(fx >> 1, 0)
    fc1 = tl.minimum((fx >> 1) + 1, fine_w - 1)
    cr0 = tl.maximum(cy >> 2, 0) * coarse_w
    cr1 = tl.minimum((cy >> 2) + 1, coarse_h - 1) * coarse_w
    cc0 = tl.maximum(cx >> 2, 0)
    cc1 = tl.minimum((cx >> 2) + 1, coarse_w - 1)
    fwy = (fy & 1) * 2 + 1  # the upper tap's weight, in quarters
    fwx = (fx & 1) * 2 + 1
    cwy = (cy & 3) * 2 + 1  # in eighths
    cwx = (cx & 3) * 2 + 1
    f00 = words + (fr0 + fc0) * FW
    f01 = words + (fr0 + fc1) * FW
    f10 = words + (fr1 + fc0) * FW
    f11 = words + (fr1 + fc1) * FW
    coarse = words + coarse_word
    c00 = coarse + (cr0 + cc0) * CW
    c01 = coarse + (cr0 + cc1) * CW
    c10 = coarse + (cr1 + cc0) * CW
    c11 = coarse + (cr1 + cc1) * CW
    g00 = 4 * (4 - fwy) * (4 - fwx)
    g01 = 4 * (4 - fwy) * fwx
    g10 = 4 * fwy * (4 - fwx)
    g11 = 4 * fwy * fwx
    h00 = (8 - cwy) * (8 - cwx)
    h01 = (8 - cwy) * cwx
    h10 = cwy * (8 - cwx)
    h11 = cwy * cwx
    lo0, hi0 = _word(0, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11, KLANE)
    lo1, hi1 = _word(1, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11, KLANE)
    lo2, hi2 = _word(2, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11, KLANE)
    lo3, hi3 = _word(3, FW, CW, f00, f01, f10, f11, c00, c01, c10, c11, g00, g01, g10, g11, h00, h01, h10, h11, KLANE)
    return _texel_vector(lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3, HALF, LEVELS)


@triton.jit
def _group_inputs(words, py, x0, fine_h, fine_w, coarse_h, coarse_w, coarse_word, BLOCK: tl.constexpr,
                  FW: tl.constexpr, CW: tl.constexpr, GROUP: tl.constexpr, HALF: tl.constexpr, LEVELS: tl.constexpr,
                  KLANE: tl.constexpr):
    """The decoder inputs of the BLOCK texels x0, x0 + 1, ... of row py (x0 a multiple of GROUP), as
    (BLOCK, 16), sampled GROUP texels at a time: magnification by 2 and 4 puts GROUP consecutive texels
    on GROUP / 2 + 2 fine and GROUP / 2 + 1 coarse columns, blended along y once for the group."""
    G: tl.constexpr = BLOCK // GROUP
    gx = x0 + tl.arange(0, G) * GROUP
    fy = py - 1
    cy = py - 2
    # the rows' first words as scalar pointers: a column's pointer is one wide multiply-add, and the words
    # of a column are constant offsets from it
    top = words + tl.maximum(fy >> 1, 0) * fine_w * FW
    bottom = words + tl.minimum((fy >> 1) + 1, fine_h - 1) * fine_w * FW
    upper = words + coarse_word + tl.maximum(cy >> 2, 0) * coarse_w * CW
    lower = words + coarse_word + tl.minimum((cy >> 2) + 1, coarse_h - 1) * coarse_w * CW
    fa = (fy & 1) * 2 + 1  # the second row's weight in quarters (the first row's: 4 - fa)
    wa = (cy & 3) * 2 + 1  # in eighths (8 - wa)
    f = (gx - 1) >> 1
    F0 = tl.maximum(f, 0) * FW
    F1 = tl.minimum(f + 1, fine_w - 1) * FW
    F2 = tl.minimum(f + 2, fine_w - 1) * FW
    F3 = tl.minimum(f + 3, fine_w - 1) * FW
    c = (gx - 2) >> 2
    C0 = tl.maximum(c, 0) * CW
    C1 = tl.minimum(c + 1, coarse_w - 1) * CW
    C2 = tl.minimum(c + 2, coarse_w - 1) * CW
    T0, T1, T2, T3 = top + F0, top + F1, top + F2, top + F3
    B0, B1, B2, B3 = bottom + F0, bottom + F1, bottom + F2, bottom + F3
    S0, S1, S2 = upper + C0, upper + C1, upper + C2
    R0, R1, R2 = lower + C0, lower + C1, lower + C2
    # pairs (GROUP 2) at x = 0 or 2 mod 4: the coarse x weights of their texels are 5, 7 or 1, 3 eighths
    wb = 5 - 2 * (gx & 2)
    k1b = wb + 2
    k1a = 8 - k1b
    a0, e0, a1, e1, a2, e2, a3, e3 = _group_word(0, FW, CW, GROUP, T0, T1, T2, T3, B0, B1, B2, B3, S0, S1, S2, R0, R1,
                                                 R2, fa, wa, wb, k1a, k1b, KLANE)
    b0, f0, b1, f1, b2, f2, b3, f3 = _group_word(1, FW, CW, GROUP, T0, T1, T2, T3, B0, B1, B2, B3, S0, S1, S2, R0, R1,
                                                 R2, fa, wa, wb, k1a, k1b, KLANE)
    c0, g0, c1, g1, c2, g2, c3, g3 = _group_word(2, FW, CW, GROUP, T0, T1, T2, T3, B0, B1, B2, B3, S0, S1, S2, R0, R1,
                                                 R2, fa, wa, wb, k1a, k1b, KLANE)
    d0, h0, d1, h1, d2, h2, d3, h3 = _group_word(3, FW, CW, GROUP, T0, T1, T2, T3, B0, B1, B2, B3, S0, S1, S2, R0, R1,
                                                 R2, fa, wa, wb, k1a, k1b, KLANE)
    if HALF:
        # The texels of a group joined first and the channels after: the channels lie side by side in
        # registers (two a word, as the conversion makes them) when the block goes to the dot.
        x = _texel_vector(_texels(a0, a1, a2, a3, GROUP), _texels(e0, e1, e2, e3, GROUP),
                          _texels(b0, b1, b2, b3, GROUP), _texels(f0, f1, f2, f3, GROUP),
                          _texels(c0, c1, c2, c3, GROUP), _texels(g0, g1, g2, g3, GROUP),
                          _texels(d0, d1, d2, d3, GROUP), _texels(h0, h1, h2, h3, GROUP), HALF, LEVELS)
    else:
        # Float32 values one at a time: neighbouring texels side by side (each float32 pair is rounded
        # to one word of halves for the dot). sm_90 SASS: 227 instructions a texel against 242 the other way.
        x0_ = _texel_vector(a0, e0, b0, f0, c0, g0, d0, h0, HALF, LEVELS)  # (G, 16) per texel of the group
        x1_ = _texel_vector(a1, e1, b1, f1, c1, g1, d1, h1, HALF, LEVELS)
        if GROUP == 4:
            x2_ = _texel_vector(a2, e2, b2, f2, c2, g2, d2, h2, HALF, LEVELS)
            x3_ = _texel_vector(a3, e3, b3, f3, c3, g3, d3, h3, HALF, LEVELS)
            # [g, channel, k & 1, k >> 1] -> [g, k >> 1, k & 1, channel]: row 4 g + k
            x = tl.reshape(tl.permute(tl.join(tl.join(x0_, x1_), tl.join(x2_, x3_)), (0, 3, 2, 1)), (BLOCK, 16))
        else:
            x = tl.reshape(tl.permute(tl.join(x0_, x1_), (0, 2, 1)), (BLOCK, 16))
    return x


@triton.jit
def _texels(t0, t1, t2, t3, GROUP: tl.constexpr):
    """One value of each texel of the groups (G,) as (G * GROUP,): texel GROUP * g + k from tk."""
    if GROUP == 4:
        # [g, k >> 1, k & 1], the last index fastest: row-major, so the reshape moves nothing
        v = tl.reshape(tl.join(tl.join(t0, t2), tl.join(t1, t3)), (t0.shape[0] * 4,))
    else:
        v = tl.reshape(tl.join(t0, t1), (t0.shape[0] * 2,))
    return v


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
def _packed_halves(out):
    """(BLOCK, 8) float32 as (BLOCK, 4) int32 holding channels 2k (low half) and 2k + 1 (high half) as
    halves, so a store writes two channels per 32-bit word (in the accumulator layout a thread holds both)."""
    even, odd = tl.split(tl.reshape(out, (out.shape[0], 4, 2)))
    if _PTX:
        words = tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [even, odd], dtype=tl.int32,
                                          is_pure=True, pack=1)
    else:
        words = (even.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) | \
            (odd.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) << 16)
    return words


@triton.jit
def shade_words_kernel(lat_ptr, w_ptr, out_ptr, height, width, coarse_word, BLOCK: tl.constexpr, FW: tl.constexpr,
                       CW: tl.constexpr, LEVELS: tl.constexpr, MLP_LAYERS: tl.constexpr, MLP_P0: tl.constexpr,
                       MLP_P1: tl.constexpr, MLP_P2: tl.constexpr, MLP_P3: tl.constexpr, MLP_P4: tl.constexpr,
                       MLP_A0: tl.constexpr, MLP_A1: tl.constexpr, MLP_A2: tl.constexpr, MLP_A3: tl.constexpr,
                       MLP_SCOPE: tl.constexpr, MLP_REDUCED: tl.constexpr, ROW_BLOCKS: tl.constexpr,
                       STAGES: tl.constexpr, PACKED: tl.constexpr, GROUP: tl.constexpr):
    """`shading._shade_kernel` for inputs that `fits`: FW fine and CW coarse words per texel.
    ROW_BLOCKS: the blocks per image row when BLOCK divides the width (a constant, so a block's row and
    column come without a division at run time), else 0. PACKED: fp16 outputs stored two to a word.
    GROUP (2 or 4, with ROW_BLOCKS): texels sampled that many at a time, sharing their latent columns;
    1: each texel on its own."""
    tl.static_assert((GROUP == 1) or (ROW_BLOCKS > 0), "shade: grouped sampling needs blocks within rows")
    w0, b0, w1, b1, w2, b2, w3, b3 = mlp_load(w_ptr, MLP_LAYERS, MLP_P0, MLP_P1, MLP_P2, MLP_P3, MLP_P4)
    # The inputs arrive as LEVELS * value; 1 / LEVELS goes into the first layer's weights (rounded to
    # half once), which saves a multiply per input.
    # Latents within [-LEVELS, LEVELS], LEVELS <= 8, keep a lane's tap sum within 1024 64ths of its lowest:
    # converted two at a time as halves (1024 + offset read as a half is exact; then one fma.rn.f16x2), else
    # one at a time through float32. Either way the decoder sees the same values.
    HALF: tl.constexpr = LEVELS <= 8
    # what each 16-bit lane adds to its tap sum for the half conversion: 0x6400 + 64 * LEVELS less the
    # bytes' bias of 128 * 64
    KLANE: tl.constexpr = (0x6400 + 64 * LEVELS - 8192) if HALF else 0
    w0 = (_input_rows(w_ptr, MLP_P1, HALF).to(tl.float32) * (1.0 / LEVELS)).to(w0.dtype)
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
    fine_h, fine_w = height // 2, width // 2
    coarse_h, coarse_w = height // 4, width // 4
    for block in tl.range(tl.program_id(0), tl.cdiv(height * width, BLOCK), tl.num_programs(0), num_stages=STAGES):
        r = tl.arange(0, BLOCK)
        if ROW_BLOCKS > 0:  # the block lies in one image row, whose index is one scalar
            py = block // ROW_BLOCKS
            px = (block % ROW_BLOCKS) * BLOCK + r
        else:
            t = block * BLOCK + r  # int32: 64-bit division is slow on the GPU
            texel = t < height * width
            py = tl.minimum(t // width, height - 1)  # rows past the end read the last row; their stores are masked
            px = t % width
        if GROUP > 1:
            x = _group_inputs(words, py, (block % ROW_BLOCKS) * BLOCK, fine_h, fine_w, coarse_h, coarse_w,
                              coarse_word, BLOCK, FW, CW, GROUP, HALF, LEVELS, KLANE)
        else:
            x = _texel_inputs(words, py, px, fine_h, fine_w, coarse_h, coarse_w, coarse_word, FW, CW, HALF, LEVELS,
                              KLANE)
        y = mlp_apply(x, w0, b0, w1, b1, w2, b2, w3, b3, MLP_LAYERS, MLP_A0, MLP_A1, MLP_A2, MLP_A3, MLP_SCOPE,
                      MLP_REDUCED)
        # 64-bit arithmetic only on the block's start; per-element offsets stay int32 so stores vectorize.
        if PACKED:
            ob = out_ptr.to(tl.pointer_type(tl.int32)) + tl.cast(block, tl.int64) * (BLOCK * 4)
            o = r[:, None] * 4 + tl.arange(0, 4)[None, :]
            out = _packed_halves(_shading_outputs(y))
        else:
            ob = out_ptr + tl.cast(block, tl.int64) * (BLOCK * 8)
            o = r[:, None] * 8 + tl.arange(0, 8)[None, :]
            out = _shading_outputs(y).to(out_ptr.dtype.element_ty)
        if ROW_BLOCKS > 0:
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
