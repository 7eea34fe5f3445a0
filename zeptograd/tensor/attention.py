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


def _keys_in_panels(q: Tensor, keys_t: Tensor, causal: bool = False) -> bool:
    """Whether attention reads its keys, k.T of shape (..., d, N), from a copy stored in panels of PANEL keys (d x 32
    each, contiguous): where its scores are computed in one kernel with no N x N buffer (schedule/cost.py:
    row_buffer_is_cheaper, over ROW_TILED_BUFFER_BYTES of scores), codegen's score tile (codegen/opt/heuristic.py:
    score_tile) loads a vector of keys per step of d: in panels, 32 bytes of one panel walked down d; from k itself,
    8 scalar loads and shuffles of keys 4*d bytes apart ((1, 1, 2048, 64) on 2 AVX2 cores, median kernel CPU time:
    0.72x the stored scores' kernels in panels, 1.05x gathered). The copy is O(N*d) memory and one small kernel.
    Float32 on the CPU backends (a GPU computes the scores in several kernels), and not where x @ k.T packs them
    already (`_packs_right_operand`). Keys not a multiple of PANEL are padded to one (`_keys_padded_to_panels`): the
    panels are taken where their cost over the padded keys is below the stored scores' over the keys
    (`_panels_cost_less`)."""
    from zeptograd.device import Device
    from zeptograd.schedule import cost  # (the bound is read at the call: tests lower it)

    if keys_t.ndim < 2 or not isinstance(keys_t.device, str) or keys_t.device.split(":")[0] != "CPU":
        return False
    if q.dtype != dtypes.float32 or keys_t.dtype != dtypes.float32:
        return False
    (m, d), n = q.shape[-2:], keys_t.shape[-1]
    batch = [max(a, b) for a, b in zip(q.shape[-3::-1], keys_t.shape[-3::-1])]
    if not all(isinstance(v, int) for v in (m, d, n, *batch)) or m * n <= (m + n) * d:
        return False  # (scores no larger than q and k: stored, schedule/cost.py: expands)
    score_bytes = math.prod(batch) * m * n * q.dtype.itemsize
    if score_bytes <= cost.ROW_TILED_BUFFER_BYTES:
        return False
    if not _panels_cost_less(n, d, causal, Device[keys_t.device].renderer.simd_bytes, score_bytes > cost.CACHE_BYTES):
        return False
    return not _packs_right_operand(q, keys_t)


# One score's cost on one core in ns (kernel CPU time, all the path's kernels) as a + b * d for head dim d, by vector
# width: with the keys in panels (their copy, then the one attention kernel and its score tile) and with the scores
# stored (their matmul, then softmax and the product with v), each (a, b), then the share of it causal attention
# costs (panels: each key loop ends at its query tile's last key; stored: the scores' matmul is full, the rest gated).
# Measured at (1, 16, N, d), d = 32, 64, 128, N = 96-512 (AVX-512: the mean over the multiples of 32; AVX2, 8-lane
# code for 16 registers: N = 512). Panels / stored at a multiple of 32: AVX-512 0.84-0.88x at d = 32, 0.93-1.02x at
# 64, 0.92-1.10x at 128; AVX2 0.75-0.8x; causal 0.45-0.72x from 160 keys on. Padded to a multiple of PANEL, so,
# (1, 16, 200, 64) on AVX-512: stored 0.98 ms, panels of 224 keys 1.08 (d = 32: 0.69, 0.65); with AVX2's 2.79, 2.62.
SCORE_COST = {
    64: ((0.34, 0.0179), (0.54, 0.0165), (0.56, 0.9)),  # AVX-512
    32: ((0.46, 0.041), (0.57, 0.054), (0.53, 0.75)),  # AVX2 (also the cost taken for narrower vectors)
}
# stored scores over the cache (schedule/cost.py: CACHE_BYTES) are written to memory and read back: 1.8 ns per element
# for both against 0.24 in the cache (x + 1 over 2^24 floats)
SCORE_MEMORY_COST = 1.5


def _panels_cost_less(keys: int, d: int, causal: bool, simd_bytes: int, scores_out_of_cache: bool) -> bool:
    """Whether a query row's scores cost less over the keys padded to whole panels than stored over the keys
    (SCORE_COST: per score, so the rows and heads cancel)."""
    (pa, pb), (sa, sb), (p_share, s_share) = SCORE_COST[64 if simd_bytes >= 64 else 32]
    panels = (keys + -keys % PANEL) * (pa + pb * d) * (p_share if causal else 1)
    stored = keys * ((sa + sb * d) * (s_share if causal else 1) + (SCORE_MEMORY_COST if scores_out_of_cache else 0))
    return panels < stored


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
