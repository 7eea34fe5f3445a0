"""Attention against torch.nn.functional.scaled_dot_product_attention at the shapes that stress its CPU paths
(tests/schedule/test_attention_kernel.py tests their structure): key counts off the panels of 32 keys and the vector
width (tensor/attention.py: `_keys_in_panels`), odd head sizes, queries and keys of different lengths (cross attention,
is_causal's top-left aligned mask), broadcast boolean and float masks, fully masked rows, `scale=`, views in
(B, N, H, d) layout, scores of large magnitude, float16, gradients, and the other devices and NOOPT (the score tile,
codegen/opt/tiles.py: `score_tile`, and the row buffers per lane, codegen/opt: `_row_buffer_per_lane`, off)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.slow import fast_first
from zeptograd import Context, Tensor, TinyJit
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.schedule import cost

F = torch.nn.functional
rng = np.random.default_rng(7)


@pytest.fixture(params=["default", "one_kernel"])
def bounds(request, monkeypatch):
    """At the default memory bounds, and with both lowered to 0 so every size takes the one-kernel path (the schedule
    cache off: no schedule made under other bounds is reused)."""
    if request.param == "one_kernel":
        monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", 0)
        monkeypatch.setattr(cost, "ROW_TILED_BUFFER_BYTES", 0)
    with Context(**{SCHEDULE_CACHE.key: 0}):
        yield request.param


def randn(*shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def ours(q, k, v, device="CPU", mask=None, **kw) -> np.ndarray:
    zq, zk, zv = (Tensor(a, device=device) for a in (q, k, v))
    zm = None if mask is None else Tensor(mask, device=device)
    return zq.scaled_dot_product_attention(zk, zv, attn_mask=zm, **kw).numpy()


def theirs(q, k, v, mask=None, **kw) -> np.ndarray:
    tm = None if mask is None else torch.from_numpy(mask)
    return F.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=tm, **kw).numpy()


def check(q, k, v, device="CPU", mask=None, rtol=1e-5, atol=3e-6, **kw):
    np.testing.assert_allclose(ours(q, k, v, device, mask, **kw), theirs(q, k, v, mask, **kw), rtol=rtol, atol=atol)


SELF_SHAPES = [
    (1, 1, 64, 16),
    (1, 1, 31, 16),
    (1, 1, 33, 8),
    (1, 2, 100, 24),
    (1, 1, 257, 16),
    (1, 1, 32, 8),
    (2, 3, 64, 8),
    (1, 1, 96, 80),
    (1, 1, 160, 64),
    (1, 1, 288, 128),
    (2, 1, 40, 16),
    (1, 1, 8, 8),
    (1, 1, 7, 3),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", fast_first(SELF_SHAPES, 5))
def test_self_attention(shape, causal, bounds):
    q, k, v = randn(*shape), randn(*shape), randn(*shape)
    check(q, k, v, is_causal=causal)


def test_by_hand_matches_torch(bounds):
    """softmax(q @ k.T / sqrt(d)) @ v written out: the keys read from k itself (no panels)."""
    for shape in [(1, 2, 64, 16), (1, 1, 100, 24), (2, 1, 33, 8)]:
        q, k, v = randn(*shape), randn(*shape), randn(*shape)
        zq, zk, zv = Tensor(q), Tensor(k), Tensor(v)
        got = ((zq @ zk.transpose(-2, -1)) / math.sqrt(shape[-1])).softmax(-1) @ zv
        np.testing.assert_allclose(got.numpy(), theirs(q, k, v), rtol=1e-5, atol=3e-6, err_msg=str(shape))


CROSS = [
    ((1, 2, 48, 32), (1, 2, 96, 32)),
    ((1, 2, 48, 32), (1, 2, 100, 32)),
    ((1, 1, 96, 16), (1, 1, 32, 16)),
    ((1, 2, 1, 32), (1, 2, 256, 32)),  # one query row (a decoding step) against panels of keys
    ((1, 1, 33, 16), (1, 1, 64, 16)),  # an odd count of query rows (the score tile takes rows in 2s, 4s, 8s)
    ((2, 2, 17, 16), (2, 2, 128, 16)),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qshape,kshape", fast_first(CROSS, 4, unpack=True))
def test_cross_attention(qshape, kshape, causal, bounds):
    """Queries and keys of different lengths; is_causal masks top-left aligned (torch: tril of the (Nq, Nk) ones)."""
    q, k, v = randn(*qshape), randn(*kshape), randn(*kshape)
    check(q, k, v, is_causal=causal)


def test_grouped_query_attention(bounds):
    """enable_gqa: 4 query heads share each of 2 key/value heads (repeat_interleave before the panels)."""
    q, k, v = randn(1, 4, 64, 16), randn(1, 2, 64, 16), randn(1, 2, 64, 16)
    check(q, k, v, enable_gqa=True, is_causal=True)


def test_batch_broadcast(bounds):
    """k and v of batch 1 against q of batch 2 (broadcast by the matmuls, and by the panels' copy of k)."""
    q, k, v = randn(2, 3, 64, 16), randn(1, 3, 64, 16), randn(1, 3, 64, 16)
    check(q, k, v)
    check(q, k, v, is_causal=True)


def test_jit_replay(bounds):
    """TinyJit replays the panels' copy of k and the attention kernel on new inputs."""
    step = TinyJit(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True).realize())
    for _ in range(4):
        q, k, v = randn(1, 2, 128, 16), randn(1, 2, 128, 16), randn(1, 2, 128, 16)
        got = step(Tensor(q), Tensor(k), Tensor(v)).numpy()
        np.testing.assert_allclose(got, theirs(q, k, v, is_causal=True), rtol=1e-5, atol=3e-6)


MASKS = [(64, 64), (1, 1, 64, 64), (2, 1, 1, 64), (2, 3, 64, 64), (3, 1, 64)]


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("mshape", MASKS)
def test_broadcast_masks(mshape, kind, bounds):
    q, k, v = randn(2, 3, 64, 16), randn(2, 3, 64, 16), randn(2, 3, 64, 16)
    mask = rng.random(mshape) > 0.3 if kind == "bool" else randn(*mshape)
    if kind == "bool":
        mask[..., 0] = True  # (no row fully masked here: test_fully_masked_rows)
    check(q, k, v, mask=mask)


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("n", [64, 33])
def test_fully_masked_rows(n, kind, bounds):
    """A query row whose every key is masked: torch 2.13 gives zeros there (its safe softmax), not nan."""
    q, k, v = randn(1, 2, n, 16), randn(1, 2, n, 16), randn(1, 2, n, 16)
    keep = rng.random((n, n)) > 0.5
    keep[:, 0] = True
    keep[3] = False
    mask = keep if kind == "bool" else np.where(keep, 0.0, -np.inf).astype(np.float32)
    check(q, k, v, mask=mask)


@pytest.mark.parametrize("scale", [0.5, 1.0, 1e-3])
def test_scale_argument(scale, bounds):
    q, k, v = randn(1, 2, 64, 16), randn(1, 2, 64, 16), randn(1, 2, 64, 16)
    check(q, k, v, scale=scale)
    check(q, k, v, scale=scale, is_causal=True)


@pytest.mark.parametrize("n", [64, 50])
def test_views_from_bnhd_layout(n, bounds):
    """q, k, v as (B, N, H, d).transpose(1, 2): non-contiguous views, as a transformer's heads are split."""
    q, k, v = randn(2, n, 3, 16), randn(2, n, 3, 16), randn(2, n, 3, 16)
    zq, zk, zv = (Tensor(a).transpose(1, 2) for a in (q, k, v))
    got = zq.scaled_dot_product_attention(zk, zv, is_causal=True).numpy()
    tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
    ref = F.scaled_dot_product_attention(tq, tk, tv, is_causal=True).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [64, 100])
def test_large_scores(n, causal, bounds):
    """q and k scaled by 30: scores in the hundreds, whose exp overflows float32 unless each row's max is subtracted.
    A float32 dot product of such terms is exact to ~eps * sum |q_i k_i| and that error goes into each exp's
    exponent, so the result is held to float64's within one of those (torch's own error, summed in another order,
    is of the same order or less)."""
    q, k, v = randn(1, 1, n, 32, scale=30), randn(1, 1, n, 32, scale=30), randn(1, 1, n, 32)
    got = ours(q, k, v, is_causal=causal)
    exact = theirs(*(a.astype(np.float64) for a in (q, k, v)), is_causal=causal)
    dot_error = np.finfo(np.float32).eps * (np.abs(q) @ np.abs(k).swapaxes(-1, -2)).max() / math.sqrt(32)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, exact, rtol=0, atol=dot_error * np.abs(v).max())


def test_float16(bounds):
    """float16 inputs give float16 (torch computes in float32 inside and rounds the output)."""
    q, k, v = (randn(1, 2, 64, 16).astype(np.float16) for _ in range(3))
    got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True)
    ref = theirs(q, k, v, is_causal=True)
    assert got.numpy().dtype == np.float16 == ref.dtype
    np.testing.assert_allclose(got.numpy().astype(np.float32), ref.astype(np.float32), rtol=1e-2, atol=2e-3)


def test_float64(bounds):
    """float64 stays float64 (no panels: they are float32 only) and matches torch's to float64 rounding."""
    q, k, v = (randn(1, 2, 64, 16).astype(np.float64) for _ in range(3))
    check(q, k, v, rtol=1e-12, atol=1e-14, is_causal=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_masks_over_threads(kind, bounds):
    """Sizes whose attention kernel runs on several cores (codegen/opt/heuristic.py: thread_nests after the score
    tile), with a padding mask per batch and a float mask per head."""
    q, k, v = randn(2, 4, 256, 32), randn(2, 4, 256, 32), randn(2, 4, 256, 32)
    mask = rng.random((2, 1, 1, 256)) > 0.2 if kind == "bool" else randn(2, 4, 256, 256)
    check(q, k, v, mask=mask)


GRAD_CASES = [
    ((1, 2, 64, 16), (1, 2, 64, 16), dict(is_causal=True)),
    ((1, 2, 48, 32), (1, 2, 100, 32), dict(is_causal=True)),
    ((2, 1, 33, 8), (2, 1, 33, 8), dict(mask=(33, 33))),
    ((1, 1, 96, 24), (1, 1, 96, 24), dict(scale=0.3)),
    ((1, 2, 40, 16), (1, 2, 40, 16), dict(mask="fully masked row")),
    ((1, 2, 64, 16), (1, 2, 64, 16), dict(mask="with a gradient")),
]


@pytest.mark.parametrize("qshape,kshape,kw", fast_first(GRAD_CASES, 2, unpack=True))
def test_gradients(qshape, kshape, kw, bounds):
    kw = dict(kw)
    arrs = [randn(*qshape), randn(*kshape), randn(*kshape)]
    mask = kw.pop("mask", None)
    if mask == "fully masked row":  # (torch: zeros out and zero gradients there)
        mask = np.where(rng.random((qshape[2], kshape[2])) > 0.5, 0.0, -np.inf).astype(np.float32)
        mask[:, 0], mask[5] = 0.0, -np.inf
    elif mask == "with a gradient":  # (a float mask's gradient is the scores', as torch's)
        mask = randn(qshape[0], qshape[1], qshape[2], kshape[2])
        arrs.append(mask)
    elif mask is not None:
        mask = randn(*mask)
    w = randn(*qshape[:-1], kshape[-1])
    zs = [Tensor(a, requires_grad=True) for a in arrs]
    zmask = zs[3] if len(zs) == 4 else None if mask is None else Tensor(mask)
    out = zs[0].scaled_dot_product_attention(zs[1], zs[2], attn_mask=zmask, **kw)
    (out * Tensor(w)).sum().backward()
    ts = [torch.tensor(a, requires_grad=True) for a in arrs]
    tmask = ts[3] if len(ts) == 4 else None if mask is None else torch.from_numpy(mask)
    ref = F.scaled_dot_product_attention(*ts[:3], attn_mask=tmask, **kw)
    (ref * torch.from_numpy(w)).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=3e-6)
    for z, t in zip(zs, ts):
        assert z.grad is not None and t.grad is not None
        np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=2e-5)


DEVICE_CASES = [
    ("CPU:C", (1, 2, 64, 16), (1, 2, 64, 16)),
    ("CPU:C", (1, 1, 33, 24), (1, 1, 33, 24)),
    ("CPU:C", (1, 2, 48, 32), (1, 2, 100, 32)),
    ("PYTHON", (1, 1, 8, 4), (1, 1, 8, 4)),
    ("PYTHON", (1, 1, 5, 3), (1, 1, 7, 3)),
]


@pytest.mark.slow
@pytest.mark.parametrize("device,qshape,kshape", DEVICE_CASES)
def test_other_devices(device, qshape, kshape, bounds):
    q, k, v = randn(*qshape), randn(*kshape), randn(*kshape)
    for causal in (False, True):
        check(q, k, v, device, is_causal=causal)
    mask = rng.random((qshape[2], kshape[2])) > 0.4
    mask[1] = False
    check(q, k, v, device, mask=mask)


@pytest.mark.parametrize("qshape,kshape", [((1, 2, 64, 16), (1, 2, 64, 16)), ((1, 1, 33, 8), (1, 1, 100, 8))])
def test_noopt(qshape, kshape, bounds):
    q, k, v = randn(*qshape), randn(*kshape), randn(*kshape)
    with Context(NOOPT=1):
        for causal in (False, True):
            check(q, k, v, is_causal=causal)
        check(q, k, v, mask=randn(qshape[2], kshape[2]))
