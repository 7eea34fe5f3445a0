"""Recurrent and sequence-state ops: RNN, GRU, LSTM, CausalConvWithState, LinearAttention."""

from __future__ import annotations

import math
from typing import Callable

from zeptograd.dtype import dtypes
from zeptograd.tensor import Tensor

from . import Node
from .oputil import op

# ***** recurrent *****


def _rnn_act(name: str, alpha=None, beta=None) -> Callable[[Tensor], Tensor]:
    name = name.lower()

    def a_or(d):
        return alpha if alpha is not None else d

    def b_or(d):
        return beta if beta is not None else d

    table = {
        "sigmoid": Tensor.sigmoid, "tanh": Tensor.tanh, "relu": Tensor.relu,
        "leakyrelu": lambda x: x.leaky_relu(a_or(0.01)),
        "hardsigmoid": lambda x: (x * a_or(0.2) + b_or(0.5)).clip(0, 1),
        "elu": lambda x: (x > 0).where(x, (x.exp() - 1) * a_or(1.0)),
        "softsign": Tensor.softsign, "softplus": lambda x: (x.exp() + 1).log(),
        "affine": lambda x: x * a_or(1.0) + b_or(0.0),
        "scaledtanh": lambda x: (x * b_or(1.0)).tanh() * a_or(1.0),
        "thresholdedrelu": lambda x: (x > a_or(1.0)).where(x, 0),
    }  # fmt: skip
    if name not in table:
        raise ValueError(f"unknown activation {name!r}")
    return table[name]


def _rnn_common(node: Node, x: Tensor, default_acts: list[str]):
    if node.attr("layout", 0):
        x = x.transpose(0, 1)
    direction = node.attr("direction", "forward", choices=("forward", "reverse", "bidirectional"))
    ndir = 2 if direction == "bidirectional" else 1
    names = node.attr("activations", default_acts * ndir)
    alphas, betas = node.attr("activation_alpha", []), node.attr("activation_beta", [])
    acts = [
        _rnn_act(n, alphas[i] if i < len(alphas) else None, betas[i] if i < len(betas) else None)
        for i, n in enumerate(names)
    ]
    return x, direction, ndir, acts


def _rnn_run(node, x, direction, ndir, step, init_states, per_dir_acts):
    seq = x.shape[0]
    ys, finals = [], []
    for d in range(ndir):
        rev = direction == "reverse" or d == 1
        states = [s[d] for s in init_states]
        outs = [None] * seq
        for t in range(seq - 1, -1, -1) if rev else range(seq):
            states = step(d, x[t], states, per_dir_acts[d])
            outs[t] = states[0]
        ys.append(Tensor.stack(*outs, dim=0))
        finals.append(states)
    y = Tensor.stack(*ys, dim=1)  # (seq, ndir, batch, hidden)
    final = [Tensor.stack(*[f[i] for f in finals], dim=0) for i in range(len(init_states))]
    if node.attr("layout", 0):
        y = y.permute(2, 0, 1, 3)
        final = [f.transpose(0, 1) for f in final]
    return y, final


def _initial_state(node, s0, ndir: int, bsz: int, h: int, dtype) -> Tensor:
    """An initial hidden (or cell) state: zeros when absent, (directions, batch, hidden) when given batch first."""
    if s0 is None:
        return Tensor.zeros(ndir, bsz, h, dtype=dtype)
    return s0.transpose(0, 1) if node.attr("layout", 0) else s0


def _rnn(r, node, x, w, rw, b=None, _seq_lens=None, h0=None):
    x, direction, ndir, acts = _rnn_common(node, x, ["Tanh"])
    h = rw.shape[-1]
    bsz = x.shape[1]
    if b is None:
        b = Tensor.zeros(ndir, 2 * h, dtype=x.dtype)
    h0 = _initial_state(node, h0, ndir, bsz, h, x.dtype)

    def step(d, xt, st, act):
        return [act[0](xt.matmul(w[d].T) + st[0].matmul(rw[d].T) + b[d, :h] + b[d, h:])]

    y, (hn,) = _rnn_run(node, x, direction, ndir, step, [h0], [acts[i : i + 1] for i in range(ndir)])
    return y, hn


def _gru(r, node, x, w, rw, b=None, _seq_lens=None, h0=None):
    x, direction, ndir, acts = _rnn_common(node, x, ["Sigmoid", "Tanh"])
    h = rw.shape[-1]
    bsz = x.shape[1]
    lbr = node.attr("linear_before_reset", 0)
    if b is None:
        b = Tensor.zeros(ndir, 6 * h, dtype=x.dtype)
    h0 = _initial_state(node, h0, ndir, bsz, h, x.dtype)

    def step(d, xt, st, act):
        f, g = act
        hp = st[0]
        gx = xt.matmul(w[d].T) + b[d, : 3 * h]
        wbr = b[d, 3 * h :]
        rz_h = hp.matmul(rw[d, : 2 * h].T) + wbr[: 2 * h]
        z = f(gx[:, :h] + rz_h[:, :h])
        rr = f(gx[:, h : 2 * h] + rz_h[:, h:])
        if lbr:
            hh = g(gx[:, 2 * h :] + rr * (hp.matmul(rw[d, 2 * h :].T) + wbr[2 * h :]))
        else:
            hh = g(gx[:, 2 * h :] + (rr * hp).matmul(rw[d, 2 * h :].T) + wbr[2 * h :])
        return [(1 - z) * hh + z * hp]

    y, (hn,) = _rnn_run(node, x, direction, ndir, step, [h0], [acts[2 * i : 2 * i + 2] for i in range(ndir)])
    return y, hn


def _lstm(r, node, x, w, rw, b=None, _seq_lens=None, h0=None, c0=None, p=None):
    x, direction, ndir, acts = _rnn_common(node, x, ["Sigmoid", "Tanh", "Tanh"])
    h = rw.shape[-1]
    bsz = x.shape[1]
    if b is None:
        b = Tensor.zeros(ndir, 8 * h, dtype=x.dtype)
    h0 = _initial_state(node, h0, ndir, bsz, h, x.dtype)
    c0 = _initial_state(node, c0, ndir, bsz, h, x.dtype)
    if p is None:
        p = Tensor.zeros(ndir, 3 * h, dtype=x.dtype)
    clip = node.attr("clip", None)
    couple = node.attr("input_forget", 0)

    def step(d, xt, st, act):
        f, g, hact = act
        hp, cp = st
        gates = xt.matmul(w[d].T) + hp.matmul(rw[d].T) + b[d, : 4 * h] + b[d, 4 * h :]
        if clip is not None:
            gates = gates.clip(-clip, clip)
        gi, go, gf, gc = gates[:, :h], gates[:, h : 2 * h], gates[:, 2 * h : 3 * h], gates[:, 3 * h :]
        i = f(gi + p[d, :h] * cp)
        fg = f(gf + p[d, 2 * h :] * cp)
        if couple:
            fg = 1 - i
        c = fg * cp + i * g(gc)
        o = f(go + p[d, h : 2 * h] * c)
        return [o * hact(c), c]

    y, (hn, cn) = _rnn_run(node, x, direction, ndir, step, [h0, c0], [acts[3 * i : 3 * i + 3] for i in range(ndir)])
    return y, hn, cn


def _causal_conv_with_state(r, node, x, w, b=None, past=None):
    act = node.attr("activation", "none", choices=("none", "silu", "swish"))
    bsz, ch, _ = x.shape
    k = w.shape[2]
    if past is None:
        past = Tensor.zeros(bsz, ch, k - 1, dtype=x.dtype)
    padded = past.cat(x, dim=2) if k > 1 else x
    y = padded.conv2d(w, b, groups=ch).cast(x.dtype)
    if act != "none":
        yf = y.cast(dtypes.float32)
        y = (yf * yf.sigmoid()).cast(x.dtype)
    return y, padded[:, :, padded.shape[2] - (k - 1) :]


def _linear_attention(r, node, q, k, v, past=None, decay=None, beta=None):
    rule = node.attr("update_rule", "gated_delta", choices=("linear", "gated", "delta", "gated_delta"))
    hq, hkv = node.attr("q_num_heads"), node.attr("kv_num_heads")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    b, t, _ = q.shape
    dk, dv = q.shape[-1] // hq, v.shape[-1] // hkv
    f32 = dtypes.float32

    def heads(x, h):
        return x.reshape(b, t, h, -1).permute(0, 2, 1, 3).cast(f32)

    q4, k4, v4 = heads(q, hq), heads(k, hkv), heads(v, hkv)
    if gating:
        decay4 = heads(decay, hkv)  # (b, hkv, t, 1 or dk)
    if delta:
        beta4 = beta.reshape(b, t, beta.shape[-1], 1).permute(0, 2, 1, 3).cast(f32)
    state = past.cast(f32) if past is not None else Tensor.zeros(b, hkv, dk, dv, dtype=f32)
    scale = node.attr("scale", 0.0) or 1.0 / math.sqrt(dk)
    outs = []
    for i in range(t):
        k_t, v_t = k4[:, :, i, :], v4[:, :, i, :]
        if gating:
            state = state * decay4[:, :, i, :].exp().unsqueeze(-1)
        if delta:
            retrieved = (state * k_t.unsqueeze(-1)).sum(2)
            v_t = beta4[:, :, i, :] * (v_t - retrieved)
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state.repeat_interleave(hq // hkv, 1) if hq != hkv else state
        outs.append((q4[:, :, i, :].unsqueeze(-1) * read).sum(2) * scale)
    out = Tensor.stack(*outs, dim=2).permute(0, 2, 1, 3).reshape(b, t, hq * dv).cast(q.dtype)
    return out, state.cast(past.dtype if past is not None else q.dtype)


# ***** registered as (domain, op type) -> implementation *****

op("RNN")(_rnn)
op("GRU")(_gru)
op("LSTM")(_lstm)
op("CausalConvWithState")(_causal_conv_with_state)
op("LinearAttention")(_linear_attention)
