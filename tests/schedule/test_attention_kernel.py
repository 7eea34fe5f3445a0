"""Attention in one kernel (schedule/policy.py: `row_buffer_request`, `first_reduce`, `reduces_below`,
`reads_row_contiguously`; schedule/cost.py: `row_buffer_is_cheaper`, `expands`). Per tile of query rows: the scores
(a contraction over d per key) are computed into row buffers in their max's loop, exp(score - max) into second ones
in its sum's loop, and the product with v reads those: no N x N buffer is ever written to memory, and the division by
the sum comes after the product (tensor/nn_ops.py: scaled_dot_product_attention). On the CPU backends sdpa reads its
keys from a copy in panels of 32 keys (`_keys_in_panels`: one small kernel, O(N*d) memory), so codegen's score tile
(codegen/opt/tiles.py: `score_tile`) loads vectors of keys: then one attention kernel at every size whose scores
outgrow q and k (`ROW_TILED_BUFFER_BYTES`). Keys gathered (a length that is no multiple of 32, or attention written
by hand) take that path only over `EXPANDED_BUFFER_BYTES`: the `one_kernel` fixture lowers both bounds to 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, GlobalCounters, Tensor
from zeptograd.codegen import full_rewrite, ranges_simplified
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.schedule import cost
from zeptograd.schedule.policy import MaterializationPolicy
from zeptograd.tensor import attention
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


@pytest.fixture
def one_kernel(monkeypatch):
    """Every scores buffer counts as over the memory bound: the one-kernel path at any size (the schedule cache off,
    so no schedule made under the default bound is reused)."""
    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", 0)
    monkeypatch.setattr(cost, "ROW_TILED_BUFFER_BYTES", 0)
    with Context(**{SCHEDULE_CACHE.key: 0}):
        yield


def kernels(t: Tensor) -> list:
    with Context(**{SCHEDULE_CACHE.key: 0}):  # the policy is patched in some tests: schedule again each time
        return [item for item in t.schedule() if item.ast.op is Ops.SINK]


def attention_kernel(t: Tensor, n_copies: int = 1):
    """The attention kernel, after the copy of k in panels (n_copies kernels: 0 where the keys are gathered)."""
    items = kernels(t)
    assert len(items) == n_copies + 1, [[b.size for b in it.bufs] for it in items]
    return items[-1]


def row_buffer_sizes(ast) -> list[int]:
    return sorted(u.dtype.size for u in ast.toposort() if u.op is Ops.DEFINE_REG and u.dtype.size > 1)


def count(ast, op) -> int:
    return sum(u.op is op for u in ast.toposort())


def sdpa(shape, causal, device="CPU"):
    q, k, v = (Tensor.empty(*shape, device=device) for _ in range(3))
    return q.scaled_dot_product_attention(k, v, is_causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 2048, 64), (2, 3, 256, 32)])
def test_one_kernel_and_no_n_by_n_buffer(shape, causal):
    """At the default bounds: k copied in panels of keys (a kernel of B*H*N*d elements), then one attention kernel;
    its buffers are the output and q, k's panels, v (each B*H*N*d elements), nothing of N x N; inside it two row
    buffers of N floats (the scores row and the exp row), exp computed once per score."""
    copy, item = kernels(sdpa(shape, causal))
    b, h, n, d = shape
    assert [buf.size for buf in copy.bufs] == [b * h * n * d] * 2
    assert [buf.size for buf in item.bufs] == [b * h * n * d] * 4
    assert row_buffer_sizes(item.ast) == [n, n]
    assert count(item.ast, Ops.EXP2) == 1


def test_the_decision_before_and_after(monkeypatch, one_kernel):
    """Before (no reduce in a row buffer's fill: the scores row costs a load, and its contraction is decided on its
    own): the scores are stored, an N x N buffer written by a tiled matmul kernel and read by a second kernel. After:
    the scores' contraction is computed in their row buffer's fill, one kernel. The walk's decisions: the scores
    (the scale's MUL) and the exp are row-buffered, the q @ k.T reduce is inlined into the scores' fill."""
    n = 256
    decided: dict = {}
    orig = MaterializationPolicy.row_buffer_request

    def spy(self, x, reqs):
        fill = orig(self, x, reqs)
        if fill is not None:
            decided[x.op] = (self.rf.red_ranges, fill, set(self.row_fill_reduces))
        return fill

    monkeypatch.setattr(MaterializationPolicy, "row_buffer_request", spy)
    after = attention_kernel(sdpa((1, 1, n, 64), False))
    assert set(decided) == {Ops.EXP2, Ops.MUL}
    (fill_reduce,) = decided[Ops.MUL][2]
    assert fill_reduce.op is Ops.REDUCE_AXIS and fill_reduce.tensor_shape == (1, 1, n, n, 1)  # q @ k.T
    assert row_buffer_sizes(after.ast) == [n, n]
    monkeypatch.setattr(MaterializationPolicy, "reduces_below", lambda self, x, fill: set())
    before = kernels(sdpa((1, 1, n, 64), False))[1:]  # (after the copy of k in panels)
    assert len(before) == 2
    assert n * n in [buf.size for item in before for buf in item.bufs]
    assert row_buffer_sizes(before[1].ast) == [n]  # the exp row only


def test_scores_no_larger_than_q_and_k_are_stored():
    """Where the scores are no larger than q and k together (N <= 2d) the memory cliff is not there: the cost model
    weighs the stored scores (a tiled matmul) against the row buffer and stores them; exp stays row-buffered."""
    items = kernels(sdpa((1, 2, 64, 64), True))
    assert len(items) == 2
    assert sum(count(item.ast, Ops.EXP2) for item in items) == 1


def test_the_exp_row_is_filled_in_its_sum_not_in_the_product_with_v(one_kernel):
    """exp is read in two reduces over the keys: its sum (per query row) and the product with v (per query row and
    output column). The sum's loop runs first (fewer loops around it), so it fills the row buffer; the product's
    loop loads it, after the sum's REDUCE."""
    item = attention_kernel(sdpa((1, 1, 128, 16), False))
    nodes = list(item.ast.toposort())
    exp = next(u for u in nodes if u.op is Ops.EXP2)
    stores = [u for u in nodes if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_REG]
    fill_stores = [u for u in stores if exp in u.toposort()]
    assert len(fill_stores) == 1
    buf = fill_stores[0].src[0].src[0]
    loads = [u for u in nodes if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.AFTER and u.src[0].src[0].src[0] is buf]
    (load,) = loads
    sum_reduce = load.src[0].src[0].src[1]
    assert sum_reduce.op is Ops.REDUCE and sum_reduce.arg is Ops.ADD and exp in sum_reduce.toposort()


def test_the_score_tile(one_kernel, monkeypatch):
    """Keys in panels: the scores are a register tile of 4 query rows x 2 vectors of 8 keys (AVX2's 32 bytes), the
    exp loop a vector along the keys, the product with v the same 4 rows x 2 vectors of its columns
    (codegen/opt/tiles.py: score_tile). Keys gathered (k itself, 264 = 8 x 33 keys not padded to panels): 8 rows x 1
    vector, each gathered vector feeding 8 rows."""
    item = attention_kernel(sdpa((1, 1, 256, 64), False))
    _, opts = hand_coded_optimizations(ranges_simplified(item.ast), 32, threads=1)  # (as codegen/optimize: the keys
    # split in panels of 32, their inner loop the one the tile unrolls)
    assert [(o.op, o.arg) for o in opts] == [
        (OptOps.UPCAST, 4),
        (OptOps.UNROLL, 8),
        (OptOps.UNROLL, 2),
        (OptOps.UNROLL, 8),
        (OptOps.UPCAST, 8),
        (OptOps.UPCAST, 2),
    ]
    monkeypatch.setattr(attention, "_panels_cost_less", lambda *args: False)  # (else 264 keys may be padded to 288)
    item = attention_kernel(sdpa((1, 1, 264, 64), False), n_copies=0)
    _, opts = hand_coded_optimizations(ranges_simplified(item.ast), 32, threads=1)
    gathered = [(OptOps.UPCAST, 8), (OptOps.UNROLL, 8), (OptOps.UNROLL, 8), (OptOps.UPCAST, 8)]
    assert [(o.op, o.arg) for o in opts] == gathered


def score_loop(src: str, k_arg: str) -> list[str]:
    """The lines of the first loop that loads k's panels (the contraction over d in the scores' fill)."""
    lines = src.splitlines()
    first = next(i for i, line in enumerate(lines) if f"({k_arg}+" in line and "__builtin_memcpy(&" in line)
    start = max(i for i in range(first) if lines[i].lstrip().startswith("for ("))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == " " * indent + "}")
    return lines[start : end + 1]


def test_the_scores_are_vectors_along_the_keys(one_kernel):
    """In the rendered score loop (CPU:C): per step of d, two vector loads of k's panels (the host's widest vector:
    8 keys with AVX2, 16 with AVX-512), one scalar load of q per query row broadcast to a vector, 4 x 2
    multiply-adds, and no shuffle: no horizontal sum of a dot product anywhere in the loop."""
    item = attention_kernel(sdpa((1, 1, 128, 16), False, "CPU:C"))
    renderer = Device["CPU:C"].renderer
    uops, _ = full_rewrite(item.ast, renderer)
    loop = score_loop(renderer.render("k", uops).src, "data2")
    vector_load = f", {renderer.simd_bytes});"
    assert sum("__builtin_memcpy(&" in line and "(data2+" in line and vector_load in line for line in loop) == 2
    assert sum("= (*(data1+" in line for line in loop) == 4
    assert not any("shufflevector" in line for line in loop)


def test_the_exp_loop_is_vectorized(one_kernel):
    """The exp loop reads the scores row and fills the exp row, both row buffers, and no buffer in memory: it gets a
    vector of its own (codegen/opt/heuristic.py: vectorize_own_loops counts row-buffer accesses, as the expander's
    choose_vector_ranges does), so LLVM computes exp2 as a vector polynomial, not one libm call per score."""
    item = attention_kernel(sdpa((1, 1, 256, 64), True))
    uops, _ = full_rewrite(item.ast, Device["CPU"].renderer)
    src = Device["CPU"].renderer.render("k", uops).src
    assert "@llvm.exp2.f32(float" not in src


def reference(arrs, causal):
    return torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, arrs), is_causal=causal).numpy()


def keys_in_panels(device: str, keys: int, d: int, causal: bool) -> bool:
    """Whether sdpa reads these keys from panels on this device (tensor/attention.py: _keys_in_panels; 197 keys of 64
    padded to 224 cost more than stored with AVX-512's vectors: the scores are then a row buffer in the one kernel)."""
    if not device.startswith("CPU"):
        return False
    return attention._panels_cost_less(keys, d, causal, Device[device].renderer.simd_bytes, False)


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON", "CL"])
def test_values_match_torch(device, one_kernel):
    """Odd lengths (300 and 197 keys padded to panels of 32 where that costs less, 197 query rows to 198 for the
    score tile: a copy of the output's 197 rows), several heads, keys in panels (256: the copy's kernel and the
    attention kernel); PYTHON at small sizes. CL (no panels): one kernel too, a work-group per query row with the exp
    row in local memory (codegen/gpudims.py: split_rows)."""
    if device == "CL":
        pytest.importorskip("pyopencl")
    shapes = [(1, 2, 40, 8), (2, 1, 64, 8)]
    if device != "PYTHON":
        shapes = [(1, 2, 300, 16), (2, 2, 197, 64), (1, 2, 256, 16)]
    for shape in shapes:
        arrs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        for causal in (False, True):
            GlobalCounters.reset()
            q, k, v = (Tensor(a, device=device) for a in arrs)
            got = q.scaled_dot_product_attention(k, v, is_causal=causal).numpy()
            np.testing.assert_allclose(got, reference(arrs, causal), rtol=1e-5, atol=2e-6, err_msg=str(shape))
            if device == "CL":
                assert GlobalCounters.kernel_count == 1
            else:
                panels = keys_in_panels(device, shape[2], shape[3], causal)
                assert GlobalCounters.kernel_count == (2 + shape[2] % 2 if panels else 1)


@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_values_under_noopt(device, one_kernel):
    """No optimizer actions: the scores' dot product is a reduce loop nested in the max's loop (codegen/prefetch.py
    hints no load of a nested reduce's loop at the outer loop)."""
    arrs = [rng.standard_normal((1, 2, 100, 16)).astype(np.float32) for _ in range(3)]
    with Context(NOOPT=1):
        for causal in (False, True):
            GlobalCounters.reset()
            q, k, v = (Tensor(a, device=device) for a in arrs)
            got = q.scaled_dot_product_attention(k, v, is_causal=causal).numpy()
            assert GlobalCounters.kernel_count == 1 + keys_in_panels(device, 100, 16, causal)  # (the panels' copy)
            np.testing.assert_allclose(got, reference(arrs, causal), rtol=1e-5, atol=2e-6)


def test_a_user_mask_and_the_gradients_match_torch(one_kernel):
    """A float mask added to the scores (data, read in the scores' fill), and the backward through the one-kernel
    forward: every gradient as torch's."""
    arrs = [rng.standard_normal((1, 2, 48, 16)).astype(np.float32) for _ in range(3)]
    mask = rng.standard_normal((48, 48)).astype(np.float32)
    q, k, v = (Tensor(a, requires_grad=True) for a in arrs)
    out = q.scaled_dot_product_attention(k, v, attn_mask=Tensor(mask))
    (out * out).sum().backward()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrs)
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(mask))
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=2e-6)
    for g, t in ((q.grad, tq), (k.grad, tk), (v.grad, tv)):
        assert g is not None and t.grad is not None
        np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_renderers_hold_the_rows_on_the_stack(one_kernel):
    """CPU:C renders the two row buffers as C arrays of a row per query row of the tile (4 rows of 96; 4 rows of 128
    and a cache line: rows 512 bytes apart would share L1 sets, codegen/opt: row_buffer_lane_stride)."""
    for n, row in ((96, 96), (128, 144)):
        item = attention_kernel(sdpa((1, 1, n, 16), True, "CPU:C"))
        uops, _ = full_rewrite(item.ast, Device["CPU:C"].renderer)
        src = Device["CPU:C"].renderer.render("k", uops).src
        assert src.count(f"[{4 * row}];") == 2


@pytest.mark.parametrize("causal", [False, True])
def test_gathered_keys_below_the_memory_bound_are_stored(causal, monkeypatch):
    """Without panels of keys (ROW_TILED_BUFFER_BYTES raised over (1, 1, 2048, 64)'s 16 MiB of scores, so sdpa
    reads k itself), the scores are under EXPANDED_BUFFER_BYTES: the cost model weighs storing them and does (a
    tiled matmul); the exp stays a row buffer computed once per score, read by its sum and by the product with v:
    2 kernels, is_causal too (its mask gates the attention kernel's reads of the stored scores, not the scores:
    `tensor/attention.py: _causal_attention`)."""
    monkeypatch.setattr(cost, "ROW_TILED_BUFFER_BYTES", 1 << 30)
    n = 2048
    items = kernels(sdpa((1, 1, n, 64), causal))
    assert len(items) == 2
    assert n * n in [buf.size for item in items for buf in item.bufs]
    assert sum(count(item.ast, Ops.EXP2) for item in items) == 1


def test_attention_by_hand_reads_gathered_keys():
    """Attention written as softmax(q @ k.T) @ v reads k itself (no panels: only sdpa makes them): its scores row
    is no contiguous read of the keys (MaterializationPolicy.reads_row_contiguously), so below EXPANDED_BUFFER_BYTES
    the scores are stored, as before."""
    q, k, v = (Tensor.empty(1, 1, 2048, 64) for _ in range(3))
    items = kernels((q @ k.transpose(-2, -1)).softmax(-1) @ v)
    assert 2048 * 2048 in [buf.size for item in items for buf in item.bufs]


@pytest.mark.parametrize("n, panels", [(2048, True), (128, True), (72, False), (64, False)])
def test_keys_in_panels_where_the_scores_outgrow_q_and_k(n, panels):
    """sdpa copies k in panels of 32 keys on the CPU backends where N is a multiple of 32 and the scores outgrow q and
    k (N > 2d): then one attention kernel and no N x N buffer. (1, 1, 64, 32): N = 2d, stored scores. 72 keys padded
    to 96, a third more scores, cost more than stored with either vector width (tensor/attention.py: SCORE_COST)."""
    items = kernels(sdpa((1, 1, n, 32), False))
    assert (n * n in [buf.size for item in items for buf in item.bufs]) != panels
    assert len(items) == 2


def test_steps_by_one():
    """The contiguity the policy looks for in a read's flat index: j, or panels (j // P) * c + j % P with P >= 8."""
    from zeptograd.dtype import dtypes
    from zeptograd.schedule.policy import steps_by_one
    from zeptograd.uop.ops import AxisType, UOp

    j, d = UOp.range(UOp.const(dtypes.index, 2048), 0, AxisType.REDUCE), UOp.range(UOp.const(dtypes.index, 64), 1)
    assert steps_by_one((j * 64 + d).simplify() * 0 + j + d * 2048, j)
    assert not steps_by_one(j * 64 + d, j)
    assert steps_by_one((j // 32) * 2048 + d * 32 + j % 32, j)
    assert not steps_by_one((j // 4) * 256 + d * 4 + j % 4, j)


def test_over_the_memory_bound_one_kernel(monkeypatch):
    """Gathered keys (no panels): the same program whose scores' buffer exceeds the bound (lowered to just under a
    small shape's scores): one kernel, no N x N buffer; just over it, the scores are stored."""
    monkeypatch.setattr(cost, "ROW_TILED_BUFFER_BYTES", 1 << 30)
    shape, n = (1, 2, 256, 32), 256
    scores_bytes = 2 * n * n * 4
    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", scores_bytes - 1)
    (item,) = kernels(sdpa(shape, False))
    assert max(buf.size for buf in item.bufs) == 2 * n * 32
    assert row_buffer_sizes(item.ast) == [n, n]
    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", scores_bytes)
    stored = kernels(sdpa(shape, False))
    assert len(stored) == 2
    assert 2 * n * n in [buf.size for item in stored for buf in item.bufs]


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_through_the_keys_panels(causal):
    """At the default bounds with keys in panels ((1, 2, 64, 16): 64 keys, two panels): the forward is the copy and
    one attention kernel, and every gradient (k's through the panels' copy) is torch's."""
    arrs = [rng.standard_normal((1, 2, 64, 16)).astype(np.float32) for _ in range(3)]
    q, k, v = (Tensor(a, requires_grad=True) for a in arrs)
    out = q.scaled_dot_product_attention(k, v, is_causal=causal)
    assert len(kernels(out)) == 2
    (out * out).sum().backward()
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrs)
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    (ref * ref).sum().backward()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=2e-6)
    for g, t in ((q.grad, tq), (k.grad, tk), (v.grad, tv)):
        assert g is not None and t.grad is not None
        np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)
