"""ONNX transformer and training-loss operators, decomposed into registry ops.

Handlers as in onnx_ops.py. Each follows the operator's definition in the
ONNX specification (and its reference implementation) step by step with
ops the registry already has, so nothing new needs kernels or gradients:

* ``Attention`` (opset 23): 3-D or 4-D inputs, boolean or additive masks
  (padded with "masked" up to the key length), causal masking aligned
  bottom-right after a KV cache, grouped-query heads, softcap, the four
  ``qk_matmul_output_mode``\\ s and ``softmax_precision``; a row whose keys
  are all masked gives zeros, as the specification says.
* ``RotaryEmbedding`` (opset 23): interleaved or half-split rotation of
  the first ``rotary_embedding_dim`` features, with position ids or not.
* ``LinearAttention``: the linear, gated, delta and gated-delta state updates,
  unrolled over the known sequence length (counted against max_unrolled_steps).
* ``NegativeLogLikelihoodLoss`` and ``SoftmaxCrossEntropyLoss``: class
  weights, ``ignore_index``, the three reductions.
"""
from __future__ import annotations

import numpy as np

from .. import dtypes
from ..ir import UNKNOWN, Tensor
from .onnx_ops import _rank, _t, handles
from .onnx_values import onnx_dtype


def _known(cx, x: Tensor, what: str) -> tuple[int, ...]:
    if x.shape is None or UNKNOWN in x.shape:
        raise cx.fail(f"{what} needs known extents, got {x.type}")
    return tuple(x.shape)


def _heads_first(cx, x: Tensor, heads: int, what: str) -> Tensor:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    b, s, hidden = _known(cx, x, what)
    if heads <= 0 or hidden % heads:
        raise cx.fail(f"{what}: hidden size {hidden} is not a multiple of {heads} heads")
    return cx.g.transpose(cx.g.reshape(x, [b, s, heads, hidden // heads]), [0, 2, 1, 3])


def _additive(cx, mask: Tensor, dt) -> Tensor:
    """A boolean mask (True attends) as a bias of 0 and -inf; an additive one as is."""
    g = cx.g
    if mask.dtype == dtypes.bool_:
        return g.select(mask, g.constant(0.0, dt), g.constant(-np.inf, dt))
    return mask


@handles("Attention")
def _attention(cx, node, args, attrs):
    g = cx.g
    q, k, v = (_t(cx, a) for a in args[:3])
    args = list(args) + [None] * (7 - len(args))
    three_d = _rank(cx, q) == 3
    if three_d:
        q = _heads_first(cx, q, attrs.get("q_num_heads", 0), "Attention Q")
        k = _heads_first(cx, k, attrs.get("kv_num_heads", 0), "Attention K")
        v = _heads_first(cx, v, attrs.get("kv_num_heads", 0), "Attention V")
    if _rank(cx, q) != 4 or _rank(cx, k) != 4 or _rank(cx, v) != 4:
        raise cx.fail(f"Q, K and V must all be 3-D or all 4-D, got {q.type}, {k.type}, {v.type}")
    dt = q.dtype
    batch, q_heads, q_len, head = _known(cx, q, "Attention Q")
    if args[4] is not None:
        k = g.concat([_t(cx, args[4]), k], axis=2)
    if args[5] is not None:
        v = g.concat([_t(cx, args[5]), v], axis=2)
    present_k, present_v = k, v
    kv_heads, kv_len = _known(cx, k, "Attention K")[1:3]
    past = _known(cx, _t(cx, args[4]), "past_key")[2] if args[4] is not None else 0

    bias = None
    if args[3] is not None:
        mask = _t(cx, args[3])
        short = kv_len - _known(cx, mask, "attn_mask")[-1]
        if short > 0:  # the mask may cover fewer keys than the cache holds: the rest are masked
            fill = False if mask.dtype == dtypes.bool_ else -np.inf
            mask = g.pad(mask, [0] * (_rank(cx, mask) - 1) + [0], [0] * (_rank(cx, mask) - 1) + [short],
                         constant_value=fill)
        bias = _additive(cx, mask, dt)
    # Where this query block starts among the keys: after the internal cache, or per batch after the
    # external one (nonpad_kv_seqlen valid keys, the last q_len of them being this block's).
    nonpad = None
    if args[6] is not None:
        if args[4] is not None:
            raise cx.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        nonpad = g.reshape(g.cast(_t(cx, args[6]), dtypes.int64), [batch, 1, 1, 1])
        offset = nonpad - q_len
    else:
        offset = g.constant(np.array(past, np.int64))
    rows = g.constant(np.arange(q_len, dtype=np.int64).reshape(q_len, 1))
    cols = g.constant(np.arange(kv_len, dtype=np.int64).reshape(1, kv_len))
    ahead = rows + offset - cols  # how far key j lies before query i (negative: after it)
    allowed = []
    if attrs.get("is_causal", 0):
        allowed.append(ahead >= 0)
    left, right = attrs.get("left_window_size", -1), attrs.get("right_window_size", -1)
    if left >= 0:
        allowed.append(ahead <= left)
    if right >= 0:
        allowed.append(-ahead <= right)
    if nonpad is not None:
        allowed.append(cols < nonpad)
    for a in allowed:
        part = _additive(cx, a, dt)
        bias = part if bias is None else bias + part

    if q_heads != kv_heads:
        if q_heads % kv_heads:
            raise cx.fail(f"{q_heads} query heads are not a multiple of {kv_heads} key/value heads")
        rep = q_heads // kv_heads

        def repeat(x):  # each key/value head serves `rep` consecutive query heads
            b, h, n, d = _known(cx, x, "Attention K/V")
            return g.reshape(g.tile(g.expand_dims(x, [2]), [1, 1, rep, 1, 1]), [b, h * rep, n, d])

        k, v = repeat(k), repeat(v)

    scale = attrs.get("scale", 1.0 / np.sqrt(head))
    root = g.constant(float(np.sqrt(scale)), dt)
    scores = g.matrix_multiplication(q * root, g.transpose(k * root, [0, 1, 3, 2]))
    softcap = attrs.get("softcap", 0.0)
    if softcap > 0:
        scores = g.tanh(scores / softcap) * softcap
    qk_out = scores
    biased = scores if bias is None else scores + bias
    mode = attrs.get("qk_matmul_output_mode", 0)
    if mode == 2:
        qk_out = biased
    precision = attrs.get("softmax_precision")
    sdt = onnx_dtype(precision, "Attention softmax_precision") if precision is not None else dt
    biased = g.cast(biased, sdt) if sdt != dt else biased
    # The specification's softmax: a row whose largest score is -inf (every key masked) gives zeros, not NaN.
    top = g.reduction_maximum(biased, [-1], keep_dims=True)
    zero = g.constant(0.0, sdt)
    top = g.select(top == float("-inf"), zero, top)
    e = g.exponent(biased - top)
    total = g.reduction_sum(e, [-1], keep_dims=True)
    probs = e / g.select(total == 0.0, g.constant(1.0, sdt), total)
    if bias is not None:  # a row with every key masked attends to nothing
        row_masked = g.reduction_maximum(bias, [-1], keep_dims=True) == float("-inf")
        probs = g.select(row_masked, zero, probs)
    if mode == 3:
        qk_out = probs
    probs = g.cast(probs, dt) if sdt != dt else probs
    y = g.matrix_multiplication(probs, v)
    if three_d:
        y = g.reshape(g.transpose(y, [0, 2, 1, 3]), [batch, q_len, -1])
    qk_out = g.cast(qk_out, dt) if qk_out.dtype != dt else qk_out
    return [y, present_k, present_v, qk_out]


@handles("RotaryEmbedding")
def _rotary(cx, node, args, attrs):
    g = cx.g
    x, cos, sin = (_t(cx, a) for a in args[:3])
    pos = _t(cx, args[3]) if len(args) > 3 and args[3] is not None else None
    rank = _rank(cx, x)
    if rank == 3:
        b, s, hidden = _known(cx, x, "RotaryEmbedding input")
        heads = attrs.get("num_heads", 0)
        if heads <= 0 or hidden % heads:
            raise cx.fail(f"a 3-D input needs num_heads dividing its hidden size {hidden}, got {heads}")
        x4 = g.reshape(x, [b, s, heads, hidden // heads])
    elif rank == 4:  # (batch, heads, seq, size) -> (batch, seq, heads, size)
        x4 = g.transpose(x, [0, 2, 1, 3])
    else:
        raise cx.fail(f"the input must be 3-D or 4-D, got {x.type}")
    b, s, h, d = _known(cx, x4, "RotaryEmbedding input")
    rot = attrs.get("rotary_embedding_dim", 0) or d
    if rot > d or rot % 2:
        raise cx.fail(f"rotary_embedding_dim {rot} must be even and at most the head size {d}")
    if pos is not None:  # caches (max_pos, rot/2) indexed by (batch, seq) position ids
        cos, sin = g.gather(cos, pos, axis=0), g.gather(sin, pos, axis=0)
    cos, sin = g.expand_dims(cos, [2]), g.expand_dims(sin, [2])  # (batch, seq, 1, rot/2)
    part = g.slice(x4, [0, 0, 0, 0], [b, s, h, rot]) if rot < d else x4
    half = rot // 2
    if attrs.get("interleaved", 0):
        pairs = g.reshape(part, [b, s, h, half, 2])
        x1 = g.squeeze(g.slice(pairs, [0, 0, 0, 0, 0], [b, s, h, half, 1]), [4])
        x2 = g.squeeze(g.slice(pairs, [0, 0, 0, 0, 1], [b, s, h, half, 2]), [4])
        r1, r2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        out = g.reshape(g.concat([g.expand_dims(r1, [4]), g.expand_dims(r2, [4])], axis=4), [b, s, h, rot])
    else:
        x1 = g.slice(part, [0, 0, 0, 0], [b, s, h, half])
        x2 = g.slice(part, [0, 0, 0, half], [b, s, h, rot])
        out = g.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=3)
    if rot < d:
        out = g.concat([out, g.slice(x4, [0, 0, 0, rot], [b, s, h, d])], axis=3)
    return [g.reshape(out, [b, s, h * d]) if rank == 3 else g.transpose(out, [0, 2, 1, 3])]


def _nll(cx, logp: Tensor, target: Tensor, weight: Tensor | None, attrs) -> Tensor:
    """Negative log-likelihood of log-probabilities (N, C, d...) at targets (N, d...), as ONNX defines it."""
    g = cx.g
    target = g.cast(target, dtypes.int64) if target.dtype != dtypes.int64 else target
    ignore = attrs.get("ignore_index")
    valid = None
    if ignore is not None:
        valid = g.not_equal(target, g.constant(np.array(ignore, np.int64)))
        target = g.select(valid, target, g.constant(np.zeros((), np.int64)))
    picked = g.squeeze(g.gather_along_axis(logp, g.expand_dims(target, [1]), 1), [1])
    w = g.gather(weight, target, axis=0) if weight is not None else None
    if valid is not None:
        mask = g.cast(valid, logp.dtype)
        w = mask if w is None else w * mask
    loss = -picked if w is None else -(picked * w)
    reduction = attrs.get("reduction", "mean")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return g.reduction_sum(loss)
    if reduction != "mean":
        raise cx.fail(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
    if w is None:
        return g.reduction_mean(loss)
    return g.reduction_sum(loss) / g.reduction_sum(w)


@handles("NegativeLogLikelihoodLoss")
def _nll_loss(cx, node, args, attrs):
    weight = _t(cx, args[2]) if len(args) > 2 and args[2] is not None else None
    return [_nll(cx, _t(cx, args[0]), _t(cx, args[1]), weight, attrs)]


@handles("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(cx, node, args, attrs):
    scores = _t(cx, args[0])
    if _rank(cx, scores) < 2:
        raise cx.fail(f"scores must be (N, C) or (N, C, d...), got {scores.type}")
    logp = cx.g.log_softmax(scores, 1)
    weight = _t(cx, args[2]) if len(args) > 2 and args[2] is not None else None
    return [_nll(cx, logp, _t(cx, args[1]), weight, attrs), logp]


@handles("LinearAttention")
def _linear_attention(cx, node, args, attrs):
    # A recurrent state (batch, kv heads, d_k, d_v), unrolled over the known sequence length as the recurrent
    # operators are: decayed ("gated"), corrected towards the value ("delta"), then added the key x value
    # outer product; each query head reads its kv head's state. The state is kept in float32.
    g = cx.g
    f32 = dtypes.float32
    args = list(args) + [None] * (6 - len(args))
    rule = attrs.get("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise cx.fail(f"update_rule must be linear, gated, delta or gated_delta, got {rule!r}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (args[4] is not None) or delta != (args[5] is not None):
        raise cx.fail(f"update_rule {rule!r} needs decay {'given' if gating else 'absent'} and beta "
                      f"{'given' if delta else 'absent'}")
    qh, kvh = attrs.get("q_num_heads", 0), attrs.get("kv_num_heads", 0)
    if qh <= 0 or kvh <= 0 or qh % kvh:
        raise cx.fail(f"q_num_heads ({qh}) must be a positive multiple of kv_num_heads ({kvh})")
    query = _t(cx, args[0])
    out_dt = query.dtype
    q, k, v = (g.cast(_heads_first(cx, _t(cx, a), h, n), f32)
               for a, h, n in ((args[0], qh, "query"), (args[1], kvh, "key"), (args[2], kvh, "value")))
    b, _, steps, dk = _known(cx, q, "query")
    dv = _known(cx, v, "value")[3]
    cx.unrolled_steps += steps
    if cx.unrolled_steps > cx.limits.max_unrolled_steps:
        raise cx.over("max_unrolled_steps", cx.unrolled_steps, "unrolled recurrent steps")

    def per_step(x, name):  # (batch, steps, n) -> (batch, kv heads, steps, n / kv heads or 1)
        x = _t(cx, x)
        last = _known(cx, x, name)[2]
        if last in (kvh, 1) and not (name == "decay" and last == kvh * dk):
            return g.cast(g.transpose(g.reshape(x, [b, steps, last, 1]), [0, 2, 1, 3]), f32)
        return g.cast(_heads_first(cx, x, kvh, name), f32)

    decay = per_step(args[4], "decay") if gating else None
    beta = per_step(args[5], "beta") if delta else None
    past = _t(cx, args[3]) if args[3] is not None else None
    state = g.cast(past, f32) if past is not None else g.constant(np.zeros((b, kvh, dk, dv), np.float32))
    scale = attrs.get("scale", 0.0) or 1.0 / float(np.sqrt(dk))

    def at(x, i):  # step i of a (batch, heads, steps, n) tensor: (batch, heads, n)
        shape = list(x.shape)
        return g.squeeze(g.slice(x, [0, 0, i, 0], shape[:2] + [i + 1, shape[3]]), [2])

    outputs = []
    for i in range(steps):
        k_t, v_t = at(k, i), at(v, i)
        if gating:
            state = state * g.expand_dims(g.exponent(at(decay, i)), [3])
        if delta:
            retrieved = g.reduction_sum(state * g.expand_dims(k_t, [3]), [2])
            v_t = at(beta, i) * (v_t - retrieved)
        state = state + g.expand_dims(k_t, [3]) * g.expand_dims(v_t, [2])
        q_t = g.reshape(at(q, i), [b, kvh, qh // kvh, dk])  # query head h reads kv head h // group
        outputs.append(g.reshape(g.matrix_multiplication(q_t, state) * scale, [b, qh, 1, dv]))
    y = g.reshape(g.transpose(g.concat(outputs, axis=2), [0, 2, 1, 3]), [b, steps, qh * dv])
    return [g.cast(y, out_dt), g.cast(state, past.dtype if past is not None else out_dt)]
