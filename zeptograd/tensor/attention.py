"""scaled_dot_product_attention's helpers (tensor/nn_ops.py): causal attention gated by its mask, and the keys read
from a copy in column panels."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from zeptograd.dtype import dtypes
from zeptograd.gradient import with_gradient
from zeptograd.tensor.matmul_layout import PANEL, _packs_right_operand

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


# is_causal over more keys than this gates every step by the mask (`_causal_attention`): its key loops end at the
# query tile's last key. At 32 keys (one panel, the loop unrolled) nothing is skipped and the gated graph's kernels
# cost more than the additive mask's (examples/gpt_tiny.py's training step at ctx 32: 4.1 -> 4.8 ms on one core)
CAUSAL_SKIP_MIN_KEYS = 32


def _causal_attention(
    x: Tensor, value: Tensor, dropout_p: float, q: Tensor | None = None, key: Tensor | None = None, scale: float = 1.0
) -> Tensor:
    """softmax(x) @ value over the keys torch's tril(ones(L, S)) keeps (key j <= query i), every step gated by the
    mask itself: the scores' max reduces where(seen, x, -inf), the exp's sum where(seen, e, 0), the product with value
    where(seen, e * v, 0). A masked key's contribution is so the reduce's identity whatever x and v hold (torch skips
    those keys: an inf or nan in them changes nothing), and codegen ends each key loop of a tile of query rows at the
    tile's last seen key (`codegen/gated_reduce.py`): half the work of the full rows. Key 0 is seen by every row, so the
    max is never -inf from the mask alone. Given the scores' operands (x = (q @ key.T) * scale), the gradient goes to
    them directly, gated as the forward (`_causal_attention_grad_qkv`)."""
    seen = _causal_mask(x)
    s = seen.where(x, -math.inf)
    e = seen.where((s - s.detach()._max(-1, keepdim=True)).exp(), 0)
    total = e.sum(-1, keepdim=True)
    products = e.dropout(dropout_p).unsqueeze(-1) * value.unsqueeze(-3)  # (..., L, S, D): a matmul's broadcast product
    out = seen.unsqueeze(-1).where(products, 0).sum(-2) / total
    if dropout_p > 0:
        return out
    if q is not None and key is not None and q.shape[:-2] == key.shape[:-2] == value.shape[:-2] == x.shape[:-2]:
        return with_gradient(out, (x, q, key, value), functools.partial(_causal_attention_grad_qkv, scale=scale))
    return with_gradient(out, (x, value), _causal_attention_grad)


def _causal_mask(x: Tensor) -> Tensor:
    """torch's tril(ones(L, S)) for scores x of (..., L, S): key j seen by query i where j <= i"""
    L, S = x.shape[-2:]
    return type(x).arange(S, device=x.device).reshape(1, S) < type(x).arange(L, device=x.device).reshape(L, 1) + 1


def _causal_attention_grad(g: Tensor, out: Tensor, x: Tensor, value: Tensor) -> tuple[Tensor, ...]:
    """The gradient of the same attention with an additive mask, x + mask.where(0, -inf), and e @ v, to x and value:
    where q, key and value broadcast along a batch dimension (`_causal_attention_grad_qkv` sums over none). Equal
    where the gated forward is: every row sees key 0, so its max is finite and a masked key's e is 0."""
    y = x + _causal_mask(x).where(0, -math.inf).cast(x.dtype)
    e = (y - y.detach()._max(-1, keepdim=True)).exp()
    return tuple((e @ value / e.sum(-1, keepdim=True)).gradient(x, value, gradient=g))


def _causal_attention_grad_qkv(
    g: Tensor, out: Tensor, x: Tensor, q: Tensor, key: Tensor, value: Tensor, scale: float
) -> tuple[Tensor | None, ...]:
    """The gradient of causal attention out = P @ v, P = softmax over the seen keys of x = (q @ key.T) * scale, to
    q, key and value (none to x): dS = P * (dO @ v.T - rowsum(dO * out)) (the softmax's), dq = dS @ key * scale,
    dk = dS.T @ q * scale, dv = P.T @ dO, each a sum whose every product is gated by the mask as the forward's. A
    masked (query, key) pair adds the identity, so codegen runs each loop only over the seen pairs
    (`codegen/gated_reduce.py`: the key loops of dq end at the tile's last query, the query loops of dk and dv start
    at the tile's first key): half the work of the full N x N products. The rows' max and sum are the forward's."""
    seen = _causal_mask(x)
    y = x + seen.where(0, -math.inf).cast(x.dtype)
    e = (y - y.detach()._max(-1, keepdim=True)).exp()
    p = e / e.sum(-1, keepdim=True)
    d_scores = p * ((g @ value.transpose(-2, -1)) - (g * out).sum(-1, keepdim=True)) * scale
    gate = seen.unsqueeze(-1)
    dq = gate.where(d_scores.unsqueeze(-1) * key.unsqueeze(-3), 0).sum(-2)
    dk = gate.where(d_scores.unsqueeze(-1) * q.unsqueeze(-2), 0).sum(-3)
    dv = gate.where(p.unsqueeze(-1) * g.unsqueeze(-2), 0).sum(-3)
    return None, dq.cast(q.dtype), dk.cast(key.dtype), dv.cast(value.dtype)


def _keys_in_panels(q: Tensor, keys_t: Tensor) -> bool:
    """Whether attention reads its keys, k.T of shape (..., d, N), from a copy stored in panels of PANEL keys (d x 32
    each, contiguous): where its scores are computed in one kernel with no N x N buffer (schedule/cost.py:
    row_buffer_is_cheaper, over ROW_TILED_BUFFER_BYTES of scores), codegen's score tile (codegen/opt/heuristic.py:
    score_tile) loads a vector of keys per step of d: in panels, 32 bytes of one panel walked down d; from k itself,
    8 scalar loads and shuffles of keys 4*d bytes apart ((1, 1, 2048, 64) on 2 AVX2 cores, median kernel CPU time:
    0.72x the stored scores' kernels in panels, 1.05x gathered). The copy is O(N*d) memory and one small kernel.
    Float32 on the CPU backends (a GPU computes the scores in several kernels), and not where x @ k.T packs them
    already (`_packs_right_operand`). Keys not a multiple of PANEL are padded to one (`_keys_padded_to_panels`) where
    that adds at most a PANEL_PAD_MAX_FRACTION of them."""
    from zeptograd.schedule import cost  # (the bound is read at the call: tests lower it)

    if keys_t.ndim < 2 or not isinstance(keys_t.device, str) or keys_t.device.split(":")[0] != "CPU":
        return False
    if q.dtype != dtypes.float32 or keys_t.dtype != dtypes.float32:
        return False
    (m, d), n = q.shape[-2:], keys_t.shape[-1]
    batch = [max(a, b) for a, b in zip(q.shape[-3::-1], keys_t.shape[-3::-1])]
    if not all(isinstance(v, int) for v in (m, d, n, *batch)) or m * n <= (m + n) * d:
        return False  # (scores no larger than q and k: stored, schedule/cost.py: expands)
    if math.prod(batch) * m * n * q.dtype.itemsize <= cost.ROW_TILED_BUFFER_BYTES:
        return False
    if (-n % PANEL) > n * PANEL_PAD_MAX_FRACTION:
        return False
    return not _packs_right_operand(q, keys_t)


# keys padded to whole panels: the padded keys' scores are computed and masked, so at most this fraction more of them.
# (1, 1, 2000, 64) padded to 2016, one core's CPU time, stored scores -> panels: AVX2 kernels (SIMD_BYTES=32) 15.7 ->
# 12.8 ms, causal 11.7 -> 6.8; AVX-512 6.8 -> 7.1, causal 6.0 -> 4.2 (as a multiple of 32 keys takes the panels there)
PANEL_PAD_MAX_FRACTION = 0.25


def _keys_padded_to_panels(key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """key and value (..., N, d) padded with zero keys to a multiple of PANEL, whose scores `_padded_keys_masked` sets
    to -inf: from its panels the scores are the same one kernel with its score tile as at a multiple of PANEL, where
    k read in place takes scalar loads and stores its N x N scores (codegen/opt/tiles.py: score_tile)."""
    pad = -key.shape[-2] % PANEL
    if pad == 0:
        return key, value
    return key.pad(((0, 0),) * (key.ndim - 2) + ((0, pad), (0, 0))), value.pad(
        ((0, 0),) * (value.ndim - 2) + ((0, pad), (0, 0))
    )


def _padded_keys_masked(qk: Tensor, keys: int) -> Tensor:
    """Scores (..., L, S) over keys padded past `keys`: -inf past them, so their exp is 0 (a zero key in v adds 0) and
    every row's max is a real key's (a row whose real keys are all masked stays one of -inf, as unpadded)."""
    if qk.shape[-1] == keys:
        return qk
    real = type(qk).arange(qk.shape[-1], device=qk.device) < keys
    return real.where(qk, -math.inf)


def _one_query_row_more(q: Tensor, attn_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """q (..., L, d) with a zero query row after its L, and attn_mask's rows (where it has L of them) with one of
    False / 0 (that row's output is dropped): the score tile pairs query rows (codegen/opt/tiles.py: score_tile), an
    odd L none ((1, 1, 1001, 64) sdpa, its keys padded to 1024, one AVX-512 core's CPU time: 11.7 ms, 2.4 with the
    row)."""
    rows = q.pad(((0, 0),) * (q.ndim - 2) + ((0, 1), (0, 0)))
    if attn_mask is None or attn_mask.ndim < 2 or attn_mask.shape[-2] != q.shape[-2]:
        return rows, attn_mask
    return rows, attn_mask.pad(((0, 0),) * (attn_mask.ndim - 2) + ((0, 1), (0, 0)))
