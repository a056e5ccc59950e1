"""ONNX recurrent operators (LSTM, GRU, RNN), unrolled over a sequence of known length.

The input projection of every step is one matrix product over the whole
sequence; each step then adds the recurrent product and applies the gates,
exactly as the ONNX operator documentation writes the equations (gate orders
i-o-f-c for LSTM and z-r-h for GRU). Bidirectional runs the reverse
direction over the reversed steps and stacks both along the direction axis.
"""
from __future__ import annotations

from ..ir import UNKNOWN
from .onnx_ops import _t, handles

_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _activation(cx, name: str, alpha, beta):
    g = cx.g
    table = {
        "Sigmoid": lambda x: g.sigmoid(x),
        "Tanh": lambda x: g.tanh(x),
        "Relu": lambda x: g.relu(x),
        "HardSigmoid": lambda x: g.maximum(g.minimum(x * (0.2 if alpha is None else alpha) + (0.5 if beta is None else beta), 1.0), 0.0),
        "LeakyRelu": lambda x: g.leaky_relu(x, 0.01 if alpha is None else alpha),
        "Affine": lambda x: x * (1.0 if alpha is None else alpha) + (0.0 if beta is None else beta),
        "ScaledTanh": lambda x: g.tanh(x * (1.0 if beta is None else beta)) * (1.0 if alpha is None else alpha),
        "Softsign": lambda x: x / (1.0 + g.absolute(x)),
        "Softplus": lambda x: g.logarithm(g.exponent(x) + 1.0),
    }
    if name not in table:
        raise cx.fail(f"activation {name} is not supported (supported: {', '.join(table)})")
    return table[name]


def _activations(cx, op: str, attrs: dict, directions: int) -> list[list]:
    names = list(attrs.get("activations", _DEFAULT_ACTIVATIONS[op] * directions))
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    fns = [_activation(cx, n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
           for i, n in enumerate(names)]
    per = len(fns) // directions
    return [fns[d * per:(d + 1) * per] for d in range(directions)]


def _split(g, x, n):
    return g.split(x, n, axis=-1) if n > 1 else [x]


def _step(cx, op, attrs, acts, xw, h, c, r, rb, p):
    """One time step: returns (h, c)."""
    g = cx.g
    clip = attrs.get("clip")

    def pre(v):
        return g.clamp(v, -clip, clip) if clip is not None else v

    if op == "GRU":
        xz, xr, xh = _split(g, xw, 3)
        rz, rr, rh = g.split(r, 3, axis=0)
        rbz, rbr, rbh = _split(g, rb, 3) if rb is not None else (None, None, None)

        def rec(w, b, state):
            y = g.matrix_multiplication(state, g.transpose(w))
            return y + b if b is not None else y
        z = acts[0](pre(xz + rec(rz, rbz, h)))
        rt = acts[0](pre(xr + rec(rr, rbr, h)))
        if attrs.get("linear_before_reset", 0):
            cand = acts[1](pre(xh + rt * rec(rh, rbh, h)))
        else:
            cand = acts[1](pre(xh + rec(rh, rbh, rt * h)))
        return (1.0 - z) * cand + z * h, None
    gates = xw + g.matrix_multiplication(h, g.transpose(r))
    if rb is not None:
        gates = gates + rb
    if op == "RNN":
        return acts[0](pre(gates)), None
    i, o, f, cc = _split(g, gates, 4)
    if p is not None:
        pi, po, pf = _split(g, p, 3)
        i, f = i + pi * c, f + pf * c
    i = acts[0](pre(i))
    f = 1.0 - i if attrs.get("input_forget", 0) else acts[0](pre(f))
    c_next = f * c + i * acts[1](pre(cc))
    if p is not None:
        o = o + po * c_next
    return acts[0](pre(o)) * acts[2](c_next), c_next


@handles("LSTM", "GRU", "RNN")
def _recurrent(cx, node, args, attrs):
    g, op = cx.g, node.op_type
    args = list(args) + [None] * (8 - len(args))
    x, w, r, b, seq_lens, h0, c0, p = args[:8]
    x, w, r = _t(cx, x), _t(cx, w), _t(cx, r)
    if seq_lens is not None:
        raise cx.fail("sequence_lens is not supported; pad the batch to one length")
    layout = attrs.get("layout", 0)
    if layout:
        x = g.transpose(x, (1, 0, 2))
    steps = x.shape[0]
    if steps == UNKNOWN:
        raise cx.fail(f"{op} needs a known sequence length to unroll")
    direction = attrs.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    # Each step is a dozen ops: refuse before building any. Stacked layers are nodes of their own and add up.
    cx.unrolled_steps += steps * dirs
    if cx.unrolled_steps > cx.limits.max_unrolled_steps:
        raise cx.over("max_unrolled_steps", cx.unrolled_steps,
                      "unrolled recurrent steps (sequence length x directions, summed over the model's layers)")
    hidden = attrs.get("hidden_size") or r.shape[-1]
    attrs = dict(attrs, hidden_size=hidden)
    acts = _activations(cx, op, attrs, dirs)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        wd, rd = g.index(w, d), g.index(r, d)
        wb = rb = None
        if b is not None:
            wb, rb = g.split(g.index(_t(cx, b), d), 2, axis=0)
        pd = g.index(_t(cx, p), d) if p is not None and op == "LSTM" else None
        xw = g.matrix_multiplication(x, g.transpose(wd))
        if wb is not None:
            xw = xw + wb
        first = g.index(xw, 0)
        zeros = g.broadcast_to(g.constant(0.0, x.dtype), g.slice(first, [0, 0], [None, hidden]))
        h = g.index(_t(cx, h0), d) if h0 is not None else zeros
        c = g.index(_t(cx, c0), d) if c0 is not None else zeros
        reverse = direction == "reverse" or d == 1
        order = range(steps - 1, -1, -1) if reverse else range(steps)
        outs = [None] * steps
        for t in order:
            h, c_new = _step(cx, op, attrs, acts[d], g.index(xw, t), h, c, rd, rb, pd)
            c = c_new if c_new is not None else c
            outs[t] = g.expand_dims(h, [0])
        ys.append(g.concat(outs, 0))
        hs.append(h)
        cs.append(c)
    y = g.concat([g.expand_dims(v, [1]) for v in ys], 1)  # (seq, dirs, batch, hidden)
    y_h = g.concat([g.expand_dims(v, [0]) for v in hs], 0)
    y_c = g.concat([g.expand_dims(v, [0]) for v in cs], 0)
    if layout:
        y = g.transpose(y, (2, 0, 1, 3))
        y_h, y_c = g.transpose(y_h, (1, 0, 2)), g.transpose(y_c, (1, 0, 2))
    return [y, y_h, y_c] if op == "LSTM" else [y, y_h]
