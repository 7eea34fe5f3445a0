"""Causal attention skips the keys no row of a query tile sees (tensor/attention.py: `_causal_attention`, which gates
the scores' max, the exp's sum and the product with v by the mask itself; codegen/gated_reduce.py, which ends each
such gated reduce's loop at the bound its gate puts on its range: the tile's last seen key, the iterations where the
gate holds on every lane as a loop without it, the partial ones after it with it). Half the key loop iterations of
the full rows, and a masked key's score, exp and value never reach the output, as torch's (it skips those keys)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite, graph_substitute

rng = np.random.default_rng(0)


def attention_uops(shape_q, shape_k, causal, device="CPU") -> list[UOp]:
    """The linearized UOps of the attention kernel (the schedule's last)"""
    q, k, v = Tensor.empty(*shape_q, device=device), Tensor.empty(*shape_k, device=device), Tensor.empty(*shape_k)
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [it for it in q.scaled_dot_product_attention(k, v.to(device), is_causal=causal).schedule()]
    items = [it for it in items if it.ast.op is Ops.SINK]
    return full_rewrite(items[-1].ast, Device[device].renderer)[0]


def key_loops_bounded_by_the_query(uops: list[UOp]) -> list[UOp]:
    """the loops whose end is an expression of another loop (the query rows' loop, or a GPU's thread id)"""
    return [u for u in uops if u.op is Ops.RANGE and any(x.op in (Ops.RANGE, Ops.SPECIAL) for x in u.src[0].toposort())]


def end_at(r: UOp, last: bool) -> int:
    """r's trip count in the first query tile (every loop and core id its end depends on at 0) or the last one (each
    at its largest value: where the kernel splits the query rows over cores, the last core's last tile)"""
    outer = {
        x: UOp.const(x.dtype, x.vmax if last else 0) for x in r.src[0].toposort() if x.op in (Ops.RANGE, Ops.SPECIAL)
    }
    end = graph_rewrite(graph_substitute(r.src[0], outer), symbolic)
    assert end.op is Ops.CONST, end
    return end.arg


@pytest.mark.parametrize("noopt", [0, 1])
def test_key_loops_end_at_the_query_tiles_last_key(noopt):
    """(1, 1, 256, 64) causal: the scores' max, the exp's sum and the product with v each loop over keys up to the
    query tile's last row only: loops whose end depends on the query loop, the first tile's short (at most one 32-key
    panel or 16-key vector step), the last one's full. Not causal: no such loop."""
    with Context(NOOPT=noopt):
        bounded = key_loops_bounded_by_the_query(attention_uops((1, 1, 256, 64), (1, 1, 256, 64), True))
        assert not key_loops_bounded_by_the_query(attention_uops((1, 1, 256, 64), (1, 1, 256, 64), False))
    assert len(bounded) >= 3
    assert all(r.arg[1] is AxisType.REDUCE for r in bounded)
    first_tile, last_tile = sum(end_at(r, False) for r in bounded), sum(end_at(r, True) for r in bounded)
    assert first_tile * 8 <= last_tile, (first_tile, last_tile)


def test_key_loops_of_cross_attention_end_at_the_query_tile():
    """Fewer queries than keys (tril(ones(L, S)) top-left aligned: query i sees keys 0..i): the loops end by the
    query's index, not the key count"""
    assert len(key_loops_bounded_by_the_query(attention_uops((1, 2, 64, 32), (1, 2, 256, 32), True))) >= 3


def reference(q, k, v, causal=True, dtype=torch.float32):
    ts = [torch.from_numpy(a).to(dtype) for a in (q, k, v)]
    return torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal).float().numpy()


SHAPES = [
    ((1, 1, 256, 64), (1, 1, 256, 64)),  # keys in panels: one attention kernel
    ((2, 3, 37, 16), (2, 3, 37, 16)),  # odd: no multiple of the panels, vector tails
    ((1, 2, 100, 32), (1, 2, 100, 32)),
    ((1, 2, 40, 16), (1, 2, 70, 16)),  # fewer queries than keys
    ((1, 2, 70, 16), (1, 2, 40, 16)),  # more queries than keys: the last rows see every key
    ((1, 1, 1, 16), (1, 1, 64, 16)),  # one query row: key 0 only
    ((2, 2, 257, 64), (2, 2, 257, 64)),  # keys padded to panels, one query row more: the gradient to the padded key
    ((1, 1, 1000, 32), (1, 1, 1000, 32)),
]


@pytest.mark.parametrize("qshape,kshape", SHAPES)
def test_values_and_gradients_match_torch(qshape, kshape):
    q, k, v = rng.standard_normal(qshape), rng.standard_normal(kshape), rng.standard_normal(kshape)
    q, k, v = (a.astype(np.float32) for a in (q, k, v))
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
    (out * out).sum().backward()
    rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=3e-6)
    for ours, theirs in ((tq, rq), (tk, rk), (tv, rv)):
        assert ours.grad is not None and theirs.grad is not None
        np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("device", ["CPU:C", "PYTHON", "CL", "NOOPT"])
def test_other_devices(device):
    if device == "CL":
        pytest.importorskip("pyopencl")
    shapes = SHAPES[1:4] if device != "PYTHON" else [((1, 1, 9, 4), (1, 1, 9, 4)), ((1, 2, 5, 3), (1, 2, 11, 3))]
    with Context(NOOPT=int(device == "NOOPT")):
        for qshape, kshape in shapes:
            q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (qshape, kshape, kshape))
            dev = "CPU" if device == "NOOPT" else device
            got = Tensor(q, device=dev).scaled_dot_product_attention(
                Tensor(k, device=dev), Tensor(v, device=dev), is_causal=True
            )
            np.testing.assert_allclose(got.numpy(), reference(q, k, v), rtol=1e-5, atol=3e-6, err_msg=str(qshape))


@pytest.mark.parametrize("device", ["CPU:C", "PYTHON", "CL", "NOOPT"])
def test_gradients_on_other_devices(device):
    """the gated gradient (dq's key loops ended, dk's and dv's query loops reversed and ended) on each renderer"""
    if device == "CL":
        pytest.importorskip("pyopencl")
    shapes = SHAPES[1:4] if device != "PYTHON" else [((1, 1, 40, 8), (1, 1, 40, 8)), ((1, 2, 5, 3), (1, 2, 11, 3))]
    with Context(NOOPT=int(device == "NOOPT")):
        for qshape, kshape in shapes:
            q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (qshape, kshape, kshape))
            dev = "CPU" if device == "NOOPT" else device
            tq, tk, tv = (Tensor(a, device=dev, requires_grad=True) for a in (q, k, v))
            out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
            (out * out).sum().backward()
            rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
            ref = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True)
            (ref * ref).sum().backward()
            for ours, theirs in ((tq, rq), (tk, rk), (tv, rv)):
                assert ours.grad is not None and theirs.grad is not None
                np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=2e-5)


def test_float16():
    q, k, v = (rng.standard_normal((1, 2, 100, 32)).astype(np.float16) for _ in range(3))
    got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True)
    assert got.dtype == Tensor(q).dtype
    np.testing.assert_allclose(got.numpy().astype(np.float32), reference(q, k, v, dtype=torch.float16), atol=2e-3)


@pytest.mark.parametrize("n", [64, 256])
def test_masked_keys_never_reach_the_output(n):
    """An inf or nan in a key or value no row sees (the last 4 keys; rows before them see none of them) changes no
    row before them: every step is gated by the mask, not multiplied by a 0 (0 * nan is nan). Those rows are
    torch's on the keys they see."""
    q, k, v = (rng.standard_normal((1, 2, n, 16)).astype(np.float32) for _ in range(3))
    k[..., n - 4 :, :], v[..., n - 4 :, :] = np.inf, np.nan
    got = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=True).numpy()
    clean_k, clean_v = k.copy(), v.copy()
    clean_k[..., n - 4 :, :], clean_v[..., n - 4 :, :] = 0, 0
    want = reference(q, clean_k, clean_v)
    np.testing.assert_allclose(got[..., : n - 4, :], want[..., : n - 4, :], rtol=1e-5, atol=3e-6)
    assert np.isnan(got[..., n - 4 :, :]).all()


@pytest.mark.parametrize("renderer", ["OpenCL", "CUDA", "C", "LLVM"])
def test_the_renderers_take_a_loop_end_of_the_query_index(renderer):
    """A key loop's end is an expression of the query loop (a GPU's query thread id): each renderer writes it as the
    loop's bound, not a literal"""
    from zeptograd.renderer.cstyle import CStyleRenderer
    from zeptograd.renderer.gpu import CUDARenderer, OpenCLRenderer
    from zeptograd.renderer.llvmir import LLVMRenderer

    ren = {"OpenCL": OpenCLRenderer, "CUDA": CUDARenderer, "C": CStyleRenderer, "LLVM": LLVMRenderer}[renderer]()
    q, k, v = (Tensor.empty(1, 2, 128, 32) for _ in range(3))
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [it for it in q.scaled_dot_product_attention(k, v, is_causal=True).schedule() if it.ast.op is Ops.SINK]
    uops = full_rewrite(items[-1].ast, ren)[0]
    assert key_loops_bounded_by_the_query(uops)
    src = ren.render("k", uops).src
    assert src


def test_the_backward_sums_only_the_seen_pairs():
    """The gradient to q, k and v (tensor/attention.py: `_causal_attention_grad_qkv`) sums each product gated by the
    mask: dq's loop over keys ends at the query tile's last row, dk's and dv's loops over queries run from the key
    tile's first key on (codegen/gated_reduce.py: a lower bound runs the loop reversed, then ends it), so each is
    short at one end of the matrix (the first query tile, the last key tile) and full at the other: half the
    multiply-adds of the full products ((1, 1, 2048, 64) forward + backward on one core: 36 -> 20 ms)."""
    q, k, v = (Tensor(rng.standard_normal((1, 1, 256, 64)).astype(np.float32), requires_grad=True) for _ in range(3))
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    out.realize()
    (out * out).sum().backward()
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [it for it in Tensor.schedule(q.grad, k.grad, v.grad) if it.ast.op is Ops.SINK]
    bounded = [key_loops_bounded_by_the_query(full_rewrite(it.ast, Device["CPU"].renderer)[0]) for it in items]
    bounded = [loops for loops in bounded if loops]
    assert len(bounded) >= 3  # dq, dk, dv
    for loops in bounded:
        first, last = sum(end_at(r, False) for r in loops), sum(end_at(r, True) for r in loops)
        assert min(first, last) * 8 <= max(first, last), (first, last)
    assert any(end_at(loops[0], False) > end_at(loops[0], True) for loops in bounded)  # a loop from the key tile on


def kernel_uops(t: Tensor) -> list[list[UOp]]:
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [it for it in t.schedule() if it.ast.op is Ops.SINK]
    return [full_rewrite(it.ast, Device["CPU"].renderer)[0] for it in items]


@pytest.mark.parametrize("n", [200, 512])
def test_a_triangular_sum_ends_at_its_row(n):
    """Any reduce whose terms are where(j < i + 1, x, 0) (codegen/gated_reduce.py, not only attention's): row i's
    loop ends by i, the values unchanged"""
    x = rng.standard_normal((n, n)).astype(np.float32)
    seen = Tensor.arange(n).reshape(1, n) < Tensor.arange(n).reshape(n, 1) + 1
    out = seen.where(Tensor(x), 0).sum(-1)
    assert any(key_loops_bounded_by_the_query(u) for u in kernel_uops(out))
    np.testing.assert_allclose(out.numpy(), np.tril(x).sum(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [512, 1000])
def test_a_triangular_sum_over_the_rows_starts_at_its_column(n):
    """A reduce whose terms are where(j < i + 1, x, 0) over i (a bound from below): a tile of columns j loops over the
    rows i >= its first j only (the loop reversed, then ended: the last tile's short), the values unchanged"""
    x = rng.standard_normal((n, n)).astype(np.float32)
    seen = Tensor.arange(n).reshape(1, n) < Tensor.arange(n).reshape(n, 1) + 1
    out = seen.where(Tensor(x), 0).sum(0)
    loops = [r for u in kernel_uops(out) for r in key_loops_bounded_by_the_query(u)]
    assert loops and sum(end_at(r, True) for r in loops) * 2 <= sum(end_at(r, False) for r in loops)
    np.testing.assert_allclose(out.numpy(), np.tril(x).sum(0), rtol=1e-5, atol=1e-4)


def test_a_masked_softmax_read_under_its_gate():
    """A causal softmax written by hand with every step gated: its exp is a row buffer filled in the sum's loop and
    read by the division under the same gate at the index it reads, so the sum's loop ends at the row's last key
    (a skipped slot is never read)"""
    n = 128
    x = Tensor(rng.standard_normal((n, n)).astype(np.float32))
    seen = Tensor.arange(n).reshape(1, n) < Tensor.arange(n).reshape(n, 1) + 1
    s = seen.where(x, -np.inf)
    e = seen.where((s - s.max(-1, keepdim=True)).exp(), 0)
    out = e / e.sum(-1, keepdim=True)
    assert any(key_loops_bounded_by_the_query(u) for u in kernel_uops(out))
    want = torch.softmax(torch.from_numpy(x.numpy()).masked_fill(~torch.ones(n, n).tril().bool(), -np.inf), -1)
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
