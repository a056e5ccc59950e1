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
def _word(words, J: tl.constexpr, FW: tl.constexpr, CW: tl.constexpr, f00, f01, f10, f11, c00, c01, c10, c11,
          g00, g01, g10, g11, h00, h01, h10, h11):
    """The weighted tap sums of latent word J (fine words first, then coarse) for its bytes 0, 2, 1, 3,
    each biased by 128 and summed in 64ths (integers summed two to an int32, SWAR), as float32 values
    2**23 + sum. f.., c..: word offsets of the fine and coarse taps; g.., h..: their weights in 64ths."""
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
            lo, hi = _biased_lanes(u, w, lo, hi)
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
            lo, hi = _biased_lanes(u, w, lo, hi)
    # Words past the channels stay 0: finite inputs that meet the zero rows the packing pads with.
    return _lanes(lo, hi)


@triton.jit
def _lanes(lo, hi):
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
def _ylerp(words, top, bottom, a, b):
    """One latent word at two rows (word offsets `top`, `bottom`), its bytes biased and blended a : b
    along y, as 16-bit lanes: (bytes 0 and 2, bytes 1 and 3)."""
    lo_t, hi_t = _biased_lanes(tl.load(words + top), a, 0, 0)
    return _biased_lanes(tl.load(words + bottom), b, lo_t, hi_t)


@triton.jit
def _joined(q0, q1, q2, q3):
    """One texel's 16 inputs (..., 16) from its four words' `_lanes`, in `_input_rows`' order."""
    return tl.reshape(tl.join(tl.join(q0, q1), tl.join(q2, q3)), (q0.shape[0], 16))


@triton.jit
def _group_word(words, J: tl.constexpr, FW: tl.constexpr, CW: tl.constexpr, GROUP: tl.constexpr, ft, fb, ca, cb,
                F0, F1, F2, F3, C0, C1, C2, fa, wa, wb, k1a, k1b):
    """Latent word J of the GROUP texels of each group, as `_lanes` per texel (q0, q1, q2, q3; the last
    two only for GROUP 4). Columns are y-blended once per group and shared: F0.. fine and C0.. coarse
    column offsets; ft, fb / ca, cb: the two rows' word offsets; fa / wa: the second row's weight (quarters /
    eighths; the first row's is 4 - fa / 8 - wa). Along x
    the fine weights are constants (in 16ths of the quarters: 64ths in all); the coarse ones too for
    GROUP 4, per group (k1a, k1b for the second texel, wa.. reused) for GROUP 2."""
    if J < FW:
        l0, h0 = _ylerp(words, ft + F0 * FW + J, fb + F0 * FW + J, 4 - fa, fa)
        l1, h1 = _ylerp(words, ft + F1 * FW + J, fb + F1 * FW + J, 4 - fa, fa)
        l2, h2 = _ylerp(words, ft + F2 * FW + J, fb + F2 * FW + J, 4 - fa, fa)
        # texel k: columns (k + 1) >> 1 and the next; the upper weighs 3/4 for even k, 1/4 for odd
        q0 = _lanes(l0 * 4 + l1 * 12, h0 * 4 + h1 * 12)
        q1 = _lanes(l1 * 12 + l2 * 4, h1 * 12 + h2 * 4)
        q2 = q0
        q3 = q0
        if GROUP == 4:
            l3, h3 = _ylerp(words, ft + F3 * FW + J, fb + F3 * FW + J, 4 - fa, fa)
            q2 = _lanes(l1 * 4 + l2 * 12, h1 * 4 + h2 * 12)
            q3 = _lanes(l2 * 12 + l3 * 4, h2 * 12 + h3 * 4)
    elif J < FW + CW:
        l0, h0 = _ylerp(words, ca + C0 * CW + (J - FW), cb + C0 * CW + (J - FW), 8 - wa, wa)
        l1, h1 = _ylerp(words, ca + C1 * CW + (J - FW), cb + C1 * CW + (J - FW), 8 - wa, wa)
        if GROUP == 4:
            # texel k: columns k >> 1 and the next; upper weights 5, 7, 1, 3 eighths
            l2, h2 = _ylerp(words, ca + C2 * CW + (J - FW), cb + C2 * CW + (J - FW), 8 - wa, wa)
            q0 = _lanes(l0 * 3 + l1 * 5, h0 * 3 + h1 * 5)
            q1 = _lanes(l0 + l1 * 7, h0 + h1 * 7)
            q2 = _lanes(l1 * 7 + l2, h1 * 7 + h2)
            q3 = _lanes(l1 * 5 + l2 * 3, h1 * 5 + h2 * 3)
        else:
            # both texels of a pair share their two columns; the weights depend on the pair's phase
            q0 = _lanes(l0 * (8 - wb) + l1 * wb, h0 * (8 - wb) + h1 * wb)
            q1 = _lanes(l0 * k1a + l1 * k1b, h0 * k1a + h1 * k1b)
            q2 = q0
            q3 = q0
    else:
        q0 = _lanes(tl.zeros(F0.shape, tl.int32), tl.zeros(F0.shape, tl.int32))
        q1, q2, q3 = q0, q0, q0
    return q0, q1, q2, q3


@triton.jit
def _texel_inputs(words, py, px, fine_h, fine_w, coarse_h, coarse_w, coarse_word, FW: tl.constexpr,
                  CW: tl.constexpr):
    """`_lanes` of the texels (py, px) as (BLOCK, 16), each texel's four taps on its own."""
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
    return _joined(q0, q1, q2, q3)


@triton.jit
def _group_inputs(words, py, x0, fine_h, fine_w, coarse_h, coarse_w, coarse_word, BLOCK: tl.constexpr,
                  FW: tl.constexpr, CW: tl.constexpr, GROUP: tl.constexpr):
    """`_lanes` of the BLOCK texels x0, x0 + 1, ... of row py (x0 a multiple of GROUP), as (BLOCK, 16),
    sampled GROUP texels at a time: magnification by 2 and 4 puts GROUP consecutive texels on
    GROUP / 2 + 2 fine and GROUP / 2 + 1 coarse columns, blended along y once for the group."""
    G: tl.constexpr = BLOCK // GROUP
    gx = x0 + tl.arange(0, G) * GROUP
    fy = py - 1
    cy = py - 2
    ft = tl.maximum(fy >> 1, 0) * fine_w * FW
    fb = tl.minimum((fy >> 1) + 1, fine_h - 1) * fine_w * FW
    ca = coarse_word + tl.maximum(cy >> 2, 0) * coarse_w * CW
    cb = coarse_word + tl.minimum((cy >> 2) + 1, coarse_h - 1) * coarse_w * CW
    fa = (fy & 1) * 2 + 1  # the second row's weight in quarters (the first row's: 4 - fa)
    wa = (cy & 3) * 2 + 1  # in eighths (8 - wa)
    f = (gx - 1) >> 1
    F0 = tl.maximum(f, 0)
    F1 = tl.minimum(f + 1, fine_w - 1)
    F2 = tl.minimum(f + 2, fine_w - 1)
    F3 = tl.minimum(f + 3, fine_w - 1)
    c = (gx - 2) >> 2
    C0 = tl.maximum(c, 0)
    C1 = tl.minimum(c + 1, coarse_w - 1)
    C2 = tl.minimum(c + 2, coarse_w - 1)
    # pairs (GROUP 2) at x = 0 or 2 mod 4: the coarse x weights of their texels are 5, 7 or 1, 3 eighths
    wb = 5 - 2 * (gx & 2)
    k1b = wb + 2
    k1a = 8 - k1b
    a0, a1, a2, a3 = _group_word(words, 0, FW, CW, GROUP, ft, fb, ca, cb, F0, F1, F2, F3, C0, C1, C2, fa, wa, wb, k1a,
                                 k1b)
    b0, b1, b2, b3 = _group_word(words, 1, FW, CW, GROUP, ft, fb, ca, cb, F0, F1, F2, F3, C0, C1, C2, fa, wa, wb, k1a,
                                 k1b)
    c0, c1, c2, c3 = _group_word(words, 2, FW, CW, GROUP, ft, fb, ca, cb, F0, F1, F2, F3, C0, C1, C2, fa, wa, wb, k1a,
                                 k1b)
    d0, d1, d2, d3 = _group_word(words, 3, FW, CW, GROUP, ft, fb, ca, cb, F0, F1, F2, F3, C0, C1, C2, fa, wa, wb, k1a,
                                 k1b)
    x0_ = _joined(a0, b0, c0, d0)  # (G, 16) per texel of the group
    x1_ = _joined(a1, b1, c1, d1)
    if GROUP == 4:
        x2_ = _joined(a2, b2, c2, d2)
        x3_ = _joined(a3, b3, c3, d3)
        # [g, channel, k & 1, k >> 1] -> [g, k >> 1, k & 1, channel]: row 4 g + k
        x = tl.reshape(tl.permute(tl.join(tl.join(x0_, x1_), tl.join(x2_, x3_)), (0, 3, 2, 1)), (BLOCK, 16))
    else:
        x = tl.reshape(tl.permute(tl.join(x0_, x1_), (0, 2, 1)), (BLOCK, 16))
    return x


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
    w0 = (_input_rows(w_ptr, MLP_P1).to(tl.float32) * (1.0 / LEVELS)).to(w0.dtype)
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
            lanes = _group_inputs(words, py, (block % ROW_BLOCKS) * BLOCK, fine_h, fine_w, coarse_h, coarse_w,
                                  coarse_word, BLOCK, FW, CW, GROUP)
        else:
            lanes = _texel_inputs(words, py, px, fine_h, fine_w, coarse_h, coarse_w, coarse_word, FW, CW)
        # 2**23 + lane, read as a float, is exact; / 64 - (2**23 + 128 * 64) / 64 is exact too (one fma):
        # the tap sum in latent steps.
        x = lanes * (1.0 / 64) - 131200.0
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
