"""sdpa over a key count that is no multiple of 32 (tensor/attention.py: `_keys_padded_to_panels`): k and v padded
with zero keys to whole panels, whose scores are -inf (`_padded_keys_masked`), so the forward is the copy of k in
panels and the one attention kernel with its score tile, as at a multiple of 32 (read in place, the keys' scalar
loads gave stored N x N scores). An odd query count takes one zero row more (`_one_query_row_more`): the score tile
pairs the query rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.codegen import ranges_simplified
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


def kernels(t: Tensor) -> list:
    with Context(**{SCHEDULE_CACHE.key: 0}):
        return [item for item in t.schedule() if item.ast.op is Ops.SINK]


def sdpa(rows: int, keys: int, causal: bool, d: int = 64):
    q = Tensor.empty(1, 1, rows, d)
    k, v = (Tensor.empty(1, 1, keys, d) for _ in range(2))
    return q.scaled_dot_product_attention(k, v, is_causal=causal)


def opts(item) -> list:
    return [(o.op, o.arg) for o in hand_coded_optimizations(ranges_simplified(item.ast), 32, threads=1)[1]]


def sizes(items) -> list[int]:
    return [buf.size for item in items for buf in item.bufs]


@pytest.mark.parametrize("causal", [False, True])
def test_odd_keys_read_padded_panels(causal):
    """2000 keys: the copy of k in 63 panels (2016 keys), then one attention kernel with the optimizations of 2048
    keys' (its score tile), no N x N buffer."""
    items = kernels(sdpa(2000, 2000, causal))
    assert len(items) == 2
    assert 2016 * 64 in sizes(items[:1])
    assert not any(size >= 2000 * 2000 for size in sizes(items))
    assert opts(items[1]) == opts(kernels(sdpa(2048, 2048, causal))[1])


@pytest.mark.parametrize("causal", [False, True])
def test_odd_query_rows_take_a_row_more(causal):
    """1001 queries over 1001 keys: the panels of 1024 keys, the attention kernel over 1002 query rows with the
    optimizations of 1002 rows over 1024 keys, and a copy of the output's 1001 rows; no N x N buffer."""
    items = kernels(sdpa(1001, 1001, causal))
    assert len(items) == 3
    assert 1024 * 64 in sizes(items[:1]) and 1002 * 64 in sizes(items[1:2])
    assert not any(size >= 1001 * 1001 for size in sizes(items))
    assert opts(items[1]) == opts(kernels(sdpa(1002, 1024, causal))[1])


def reference(q, k, v, mask, causal):
    t = [torch.from_numpy(a) for a in (q, k, v)]
    out = torch.nn.functional.scaled_dot_product_attention(
        *t, attn_mask=None if mask is None else torch.from_numpy(mask), is_causal=causal
    )
    return torch.nan_to_num(out, 0.0).numpy()  # (a row whose every key is masked: zeptograd's zeros, torch's nan)


# (queries, keys, d): keys padded by 1, 8 and 6 (3 queries over 31 keys: no panels), q longer than k, odd rows
@pytest.mark.parametrize("rows, keys, d", [(64, 31, 8), (3, 31, 8), (97, 120, 8), (301, 250, 16), (130, 2047, 16)])
@pytest.mark.parametrize("mask", [None, "causal", "bool", "float"])
def test_values_match_torch(rows, keys, d, mask):
    q = rng.standard_normal((1, 2, rows, d)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, keys, d)).astype(np.float32) for _ in range(2))
    attn_mask = None
    if mask == "bool":
        attn_mask = rng.random((rows, keys)) > 0.5
        attn_mask[1] = False  # a row whose every key is masked
    elif mask == "float":
        attn_mask = rng.standard_normal((1, rows, keys)).astype(np.float32)
    got = Tensor(q).scaled_dot_product_attention(
        Tensor(k), Tensor(v), None if attn_mask is None else Tensor(attn_mask), is_causal=mask == "causal"
    )
    np.testing.assert_allclose(got.numpy(), reference(q, k, v, attn_mask, mask == "causal"), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_torch(causal):
    """Through the padded panels and the query row more: every gradient is torch's (none flows to the padding)."""
    arrs = [rng.standard_normal((1, 2, r, 8)).astype(np.float32) for r in (99, 120, 120)]
    g = rng.standard_normal((1, 2, 99, 8)).astype(np.float32)
    q, k, v = (Tensor(a, requires_grad=True) for a in arrs)
    (q.scaled_dot_product_attention(k, v, is_causal=causal) * Tensor(g)).sum().backward()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrs)
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(torch.from_numpy(g))
    for got, t in ((q.grad, tq), (k.grad, tk), (v.grad, tv)):
        assert got is not None and t.grad is not None
        np.testing.assert_allclose(got.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)
