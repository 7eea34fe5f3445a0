"""A loop whose iterations grow in work along it is split over cores by every amt-th iteration (OptOps.
THREAD_INTERLEAVED), not in contiguous blocks: causal attention's key loops end at the query tile's last row
(codegen/gated_reduce.py), so with contiguous halves core 0 ran ~1/4 of the key iterations and core 1 ~3/4. The
balance is counted from the UOps: each core's key-loop trip counts (their ends are expressions of the core id and the
query loop), summed over the query loop. Every other kernel keeps the contiguous split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite, graph_substitute

rng = np.random.default_rng(0)


@pytest.fixture(params=[32, 64], ids=["avx2", "avx512"])
def simd_bytes(request, monkeypatch):
    """the kernels as an AVX2 host's (32-byte vectors) and an AVX-512 host's render them"""
    monkeypatch.setattr(Device["CPU"].renderer, "simd_bytes", request.param)
    return request.param


def last_kernel(t: Tensor) -> tuple[list[UOp], list[Opt]]:
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [it for it in t.schedule() if it.ast.op is Ops.SINK]
    return full_rewrite(items[-1].ast, Device["CPU"].renderer)


def attention_kernel(shape, causal: bool) -> tuple[list[UOp], list[Opt]]:
    q, k, v = (Tensor.empty(*shape) for _ in range(3))
    with Context(THREADS=2):
        return last_kernel(q.scaled_dot_product_attention(k, v, is_causal=causal))


def work_per_core(uops: list[UOp]) -> list[int]:
    """each core's iterations of the loops whose end depends on another loop or the core id: every such loop's end
    summed over the values of the loops it depends on, the core id fixed"""
    core = next(u for u in uops if u.op is Ops.SPECIAL and u.arg == "core_id")
    ends_vary = [u for u in uops if u.op is Ops.RANGE and u.src[0].op is not Ops.CONST]
    bounded = [r for r in ends_vary if any(x.op in (Ops.RANGE, Ops.SPECIAL) for x in r.src[0].toposort())]
    assert bounded
    out = []
    for c in range(core.src[0].arg):
        total = 0
        for r in bounded:
            outer = sorted({x for x in r.src[0].toposort() if x.op is Ops.RANGE}, key=lambda x: x.arg[0])
            for values in itertools.product(*(range(x.vmin, x.vmax + 1) for x in outer)):
                at = {x: UOp.const(x.dtype, v) for x, v in zip(outer, values)} | {core: UOp.const(core.dtype, c)}
                end = graph_rewrite(graph_substitute(r.src[0], at), symbolic)
                assert end.op is Ops.CONST, end
                total += end.arg
        out.append(total)
    return out


@pytest.mark.parametrize("shape", [(1, 1, 256, 64), (1, 1, 520, 32)])
def test_causal_attention_interleaves_the_query_tiles(shape, simd_bytes):
    """the query loop takes THREAD_INTERLEAVED; 520 rows: an odd count of query tiles, one core one more"""
    _, opts = attention_kernel(shape, True)
    assert [o.op for o in opts if o.op in (OptOps.THREAD, OptOps.THREAD_INTERLEAVED)] == [OptOps.THREAD_INTERLEAVED]


@pytest.mark.parametrize("shape", [(1, 1, 256, 64), (1, 1, 520, 32)])
def test_causal_attention_cores_share_the_key_loops_evenly(shape, simd_bytes):
    """the cores' key-loop iterations are within 10% of each other (contiguous halves: 2336 and 6816 at
    (1, 1, 256, 64) with 64-byte vectors)"""
    work = work_per_core(attention_kernel(shape, True)[0])
    assert len(work) == 2 and max(work) <= 1.1 * min(work), work


def test_non_triangular_kernels_keep_contiguous_blocks(simd_bytes):
    """attention without the mask, a matmul and a hand-written additive causal mask (its loops all run to the end:
    equal work per iteration) split in contiguous blocks"""
    _, opts = attention_kernel((1, 1, 256, 64), False)
    a, b = Tensor.empty(256, 256), Tensor.empty(256, 256)
    with Context(THREADS=2):
        _, mm_opts = last_kernel(a @ b)
        q, k = Tensor.empty(1, 1, 512, 64), Tensor.empty(1, 1, 512, 64)
        mask = Tensor.ones(512, 512).tril().log()
        _, mask_opts = last_kernel((q @ k.transpose(-1, -2) / 8 + mask).softmax(-1))
    for o in (opts, mm_opts, mask_opts):
        assert OptOps.THREAD in [x.op for x in o] and OptOps.THREAD_INTERLEAVED not in [x.op for x in o], o


@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_rows_narrower_than_a_cache_line_interleave_in_blocks_of_a_line(device):
    """a triangular row sum (row i sums x[i, :i+1]: its loop ends by i) stores 4-byte rows: the cores take blocks of a
    cache line's 16 rows in turn (TILE, then the block loop interleaved), so neighbouring cores never write one line;
    the work balanced, the values numpy's"""
    n = 2048  # n^2 / 2 iterations: over MIN_THREAD_WORK
    x = rng.standard_normal((n, n)).astype(np.float32)
    seen = Tensor.arange(n, device=device).reshape(1, n) < Tensor.arange(n, device=device).reshape(n, 1) + 1
    with Context(THREADS=2):
        out = seen.where(Tensor(x, device=device), 0).sum(-1)
        uops, opts = last_kernel(out)
        assert opts[-2:] == [Opt(OptOps.TILE, 0, 64 // 4), Opt(OptOps.THREAD_INTERLEAVED, 0, 2)], opts
        work = work_per_core(uops)
        assert max(work) <= 1.1 * min(work), work
        # float32 sums of up to 2048 normal terms (magnitude ~45) against float64's: the order differs with the
        # vector width, so the error is a few ulps of the terms' scale, not of the (sometimes small) result
        np.testing.assert_allclose(out.numpy(), np.tril(x.astype(np.float64)).sum(-1), rtol=1e-5, atol=1e-4)


def test_interleaved_split_algebra():
    """RANGE(n) -> RANGE(n/amt)*amt + core_id, and for an amount that does not divide, core c runs ceil((n-c)/amt)
    iterations: every index below n exactly once"""
    from zeptograd.codegen.opt import apply_opt

    for n in (8, 9):
        r = UOp.range(n, 0)
        buf = UOp(Ops.DEFINE_GLOBAL, Tensor.empty(1).dtype.ptr(n), (), 0)
        ast = UOp.sink(buf.index(r).store(UOp.const(Tensor.empty(1).dtype, 1.0)).end(r))
        new = apply_opt(ast, Opt(OptOps.THREAD_INTERLEAVED, 0, 2))
        core = next(u for u in new.toposort() if u.op is Ops.SPECIAL)
        (loop,) = [u for u in new.toposort() if u.op is Ops.RANGE]
        idx = next(u for u in new.toposort() if u.op is Ops.INDEX).src[1]
        seen = []
        for c in range(2):
            end = graph_rewrite(graph_substitute(loop.src[0], {core: UOp.const(core.dtype, c)}), symbolic).arg
            for i in range(end):
                at = {core: UOp.const(core.dtype, c), loop: UOp.const(loop.dtype, i)}
                seen.append(graph_rewrite(graph_substitute(idx, at), symbolic).arg)
        assert sorted(seen) == list(range(n)), (n, seen)


def reference(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), is_causal=True)


@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
@pytest.mark.parametrize("shape", [(1, 1, 256, 64), (1, 1, 520, 32), (2, 2, 300, 16)])
def test_values_on_two_cores_match_torch(device, shape):
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    with Context(THREADS=2):
        got = Tensor(q, device=device).scaled_dot_product_attention(
            Tensor(k, device=device), Tensor(v, device=device), is_causal=True
        )
        np.testing.assert_allclose(got.numpy(), reference(q, k, v).numpy(), rtol=1e-5, atol=3e-6)


def test_beam_offers_the_interleaved_split_where_work_grows():
    """BEAM's actions (engine/search.py) include THREAD_INTERLEAVED for the causal query loop, not without the mask"""
    from zeptograd.codegen import ranges_simplified
    from zeptograd.engine.search import actions

    def kernel_actions(causal: bool) -> set[OptOps]:
        q, k, v = (Tensor.empty(1, 1, 256, 64) for _ in range(3))
        with Context(**{SCHEDULE_CACHE.key: 0}):
            t = q.scaled_dot_product_attention(k, v, is_causal=causal)
            items = [it for it in t.schedule() if it.ast.op is Ops.SINK]
        return {a.op for a in actions(ranges_simplified(items[-1].ast), 2)}

    assert OptOps.THREAD_INTERLEAVED in kernel_actions(True)
    assert OptOps.THREAD_INTERLEAVED not in kernel_actions(False) and OptOps.THREAD in kernel_actions(False)
