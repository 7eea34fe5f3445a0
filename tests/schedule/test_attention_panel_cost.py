"""Which path sdpa takes over a key count that is no multiple of 32 (tensor/attention.py: `_panels_cost_less`): the keys
padded to whole panels (their copy and one attention kernel, no N x N buffer) where that costs less than the scores
stored over the keys (their matmul, then softmax and the product with v), by each path's cost per score at the
renderer's vector width. With AVX-512's 16 lanes the panels' score tile is about as fast per score as the stored
scores' kernels at d = 64 (so 200 keys padded to 224 cost more: stored 0.98 ms, panels 1.08 at (1, 16, 200, 64), one
core), 0.85x at d = 32 (panels); with AVX2's 8 lanes 0.77x (panels); causal attention's panels skip the masked keys'
tiles (panels)."""

from __future__ import annotations

import pytest

from zeptograd import Context, Device, Tensor
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.uop.ops import Ops


def scores_stored(shape: tuple[int, ...], causal: bool, simd_bytes: int, monkeypatch) -> bool:
    """Whether sdpa over q, k, v of this shape stores its N x N scores (else: reads the keys from panels), scheduled
    for vectors of simd_bytes."""
    monkeypatch.setattr(Device["CPU"].renderer, "simd_bytes", simd_bytes)
    q, k, v = (Tensor.empty(*shape) for _ in range(3))
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [
            it for it in q.scaled_dot_product_attention(k, v, is_causal=causal).schedule() if it.ast.op is Ops.SINK
        ]
    n = shape[-2]
    stored = any(buf.size == shape[0] * shape[1] * n * n for it in items for buf in it.bufs)
    panels = any(buf.size == shape[0] * shape[1] * (n + -n % 32) * shape[-1] for it in items[:1] for buf in it.bufs)
    assert len(items) == 2 and stored != panels  # (the scores' matmul and the rest, or the panels' copy and attention)
    return stored


@pytest.mark.parametrize("batch", [1, 4])
def test_padding_that_costs_more_stores_the_scores(batch, monkeypatch):
    assert scores_stored((batch, 16, 200, 64), False, 64, monkeypatch)


@pytest.mark.parametrize(
    "shape, causal, simd_bytes",
    [
        ((1, 16, 200, 32), False, 64),  # d = 32: the panels' 0.85x pays for 12% more keys
        ((1, 16, 200, 64), True, 64),  # causal: the panels' kernel skips the masked keys' tiles
        ((1, 16, 200, 64), False, 32),  # AVX2's vectors: the panels' 0.77x pays for them
        ((1, 4, 400, 64), False, 64),  # 4% more keys
        ((1, 16, 256, 64), False, 64),  # a multiple of 32: no padding
    ],
)
def test_padding_that_costs_less_reads_panels(shape, causal, simd_bytes, monkeypatch):
    assert not scores_stored(shape, causal, simd_bytes, monkeypatch)
