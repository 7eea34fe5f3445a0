"""Kernel counts: what the scheduler fuses, checked together with the values."""

import numpy as np
import pytest

from zeptograd import GlobalCounters, Tensor, dtypes
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


def realized(*shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return Tensor(x), x


def count_kernels(t: Tensor) -> int:
    return len(t.schedule())


def run(t: Tensor) -> tuple[int, np.ndarray]:
    GlobalCounters.reset()
    out = t.numpy()
    return GlobalCounters.kernel_count, out


def test_constants_schedule_no_kernel():
    t = Tensor.ones(10) * 15 + Tensor.ones(10) * 30
    assert count_kernels(t) == 0
    n, out = run(t)
    assert n == 0
    np.testing.assert_equal(out, np.full(10, 45, np.float32))


def test_const_reduce_folds():
    t = Tensor.full((4, 5), 2.0).sum(axis=1)
    assert count_kernels(t) == 0
    np.testing.assert_equal(t.numpy(), np.full(4, 10, np.float32))


def test_elementwise_chain_is_one_kernel():
    (a, an), (b, bn), (c, cn) = realized(8, 8), realized(8, 8), realized(8, 8)
    t = ((a + b) * c).exp2()
    assert count_kernels(t) == 1
    n, out = run(t)
    assert n == 1
    np.testing.assert_allclose(out, np.exp2((an + bn) * cn), rtol=1e-5)


def test_reduce_with_prologue_is_one_kernel():
    x, xn = realized(16, 32)
    t = (x * 2 + 1).sum(axis=1)
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), (xn * 2 + 1).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_reduce_with_epilogue_is_one_kernel():
    x, xn = realized(16, 32)
    t = x.max(axis=1).exp2() + 1
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), np.exp2(xn.max(axis=1)) + 1, rtol=1e-5)


def test_broadcasting_chain_is_one_kernel():
    (a, an), (b, bn) = realized(4, 1), realized(1, 5)
    t = (a + b) * b - a
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), (an + bn) * bn - an, rtol=1e-6)


def test_movement_ops_make_no_kernel_of_their_own():
    x, xn = realized(6, 4)
    t = (x.permute(1, 0).flip(0).pad(((1, 1), (0, 2))).reshape(2, 3, 8)[:, 1:, ::2] + 1).exp2()
    assert count_kernels(t) == 1
    ref = np.exp2(np.pad(xn.T[::-1], ((1, 1), (0, 2))).reshape(2, 3, 8)[:, 1:, ::2] + 1)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-6)


def test_lerp_is_one_kernel():
    (a, an), (b, bn), (w, wn) = realized(32), realized(32), realized(32)
    t = a * (1 - w) + b * w
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), an * (1 - wn) + bn * wn, rtol=1e-5, atol=1e-6)


def test_softmax_is_one_kernel():
    x, xn = realized(8, 50)
    e = (x - x.max(axis=1, keepdim=True)).exp()
    t = e / e.sum(axis=1, keepdim=True)
    assert count_kernels(t) == 1  # the row's max and sum computed before its outputs
    ref = np.exp(xn - xn.max(axis=1, keepdims=True))
    np.testing.assert_allclose(t.numpy(), ref / ref.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_layernorm_is_one_kernel():
    x, xn = realized(8, 64)
    mean = x.mean(axis=1, keepdim=True)
    var = ((x - mean) * (x - mean)).mean(axis=1, keepdim=True)
    t = (x - mean) / (var + 1e-5).sqrt()
    assert count_kernels(t) == 1
    ref = (xn - xn.mean(1, keepdims=True)) / np.sqrt(xn.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-5)


def test_matmul_bias_relu_is_one_kernel():
    (a, an), (b, bn), (bias, biasn) = realized(8, 16), realized(16, 12), realized(12)
    t = ((a.reshape(8, 1, 16) * b.permute(1, 0).reshape(1, 12, 16)).sum(axis=2) + bias).relu()
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), np.maximum(an @ bn + biasn, 0), rtol=1e-4, atol=1e-5)


def test_arange_feeds_its_consumer_without_a_kernel():
    x, xn = realized(10)
    t = x * Tensor.arange(10).float()
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), xn * np.arange(10), rtol=1e-6)
    assert count_kernels(Tensor.arange(10) * 2) == 1  # a realize of arange itself is a kernel: its output


def test_two_reduces_over_the_same_rows_fuse():
    x, xn = realized(8, 32)
    t = x.sum(axis=1) + x.max(axis=1)
    assert count_kernels(t) == 1
    np.testing.assert_allclose(t.numpy(), xn.sum(1) + xn.max(1), rtol=1e-5, atol=1e-5)


def test_nested_reduce():
    x, xn = realized(4, 5, 6)
    t = x.sum(axis=2).max(axis=1)
    np.testing.assert_allclose(t.numpy(), xn.sum(2).max(1), rtol=1e-5, atol=1e-5)


def test_contiguous_forces_a_kernel():
    x, xn = realized(4, 4)
    t = (x + 1).contiguous() * 2
    assert count_kernels(t) == 2
    np.testing.assert_allclose(t.numpy(), (xn + 1) * 2, rtol=1e-6)


def test_realized_results_are_reused():
    x, xn = realized(4, 4)
    y = (x + 1).realize()
    GlobalCounters.reset()
    z = y * 2
    np.testing.assert_allclose(z.numpy(), (xn + 1) * 2, rtol=1e-6)
    assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("n", [1, 7, 33])
def test_full_sum(n):
    x, xn = realized(n, 3)
    np.testing.assert_allclose(x.sum().numpy(), xn.sum(), rtol=1e-5, atol=1e-5)


def test_realize_several_at_once():
    x, xn = realized(4, 4)
    a, b = x + 1, x * 2
    GlobalCounters.reset()
    a.realize(b)
    assert GlobalCounters.kernel_count == 1  # two outputs of one shape from one input: one kernel
    np.testing.assert_allclose(a.numpy(), xn + 1)
    np.testing.assert_allclose(b.numpy(), xn * 2)


def test_big_contractions_of_one_shape_keep_their_own_kernels():
    """Outputs of one shape are one kernel (above), but not big contractions (schedule/rangeify.py: big_contraction):
    x @ w1 and x.T @ w2 at 256 x 256 x 256 would share one register tile and loop order, which suits at most one of
    them (attention's dq, dk and dv: one kernel 22 ms, three 13). Small ones (8 x 8 x 8) still share a kernel."""
    (x, xn), (w1, w1n), (w2, w2n) = realized(256, 256), realized(256, 256), realized(256, 256)
    a, b = x @ w1, x.T @ w2
    assert len([it for it in Tensor.schedule(a, b) if it.ast.op.name == "SINK"]) == 2
    np.testing.assert_allclose(a.numpy(), xn @ w1n, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(b.numpy(), xn.T @ w2n, rtol=1e-4, atol=1e-3)
    (x, _), (w1, _), (w2, _) = realized(8, 8), realized(8, 8), realized(8, 8)
    assert len([it for it in Tensor.schedule(x @ w1, x.T @ w2) if it.ast.op.name == "SINK"]) == 1


@pytest.mark.slow
def test_scheduling_cost_grows_linearly():
    from zeptograd.uop import upat

    steps = []
    for n in (300, 3_000, 30_000):
        x, y = Tensor(np.ones(4, np.float32)), Tensor(np.ones(4, np.float32))
        z = x
        for _ in range(n):
            z = z * y
        before = upat.rewrite_steps[0]
        z.schedule()
        steps.append(upat.rewrite_steps[0] - before)
    assert 5 < steps[1] / steps[0] < 20 and 5 < steps[2] / steps[1] < 20, steps  # ~10x per 10x nodes


@pytest.mark.slow
def test_scheduling_a_chain_of_views_grows_linearly():
    """reshape-permute-reshape composes divmods the simplifier can't fold: the index grows with the chain, so the
    policy copies at a RESHAPE whose index passed MAX_INDEX_NODES (it was quadratic: 8 -> 32 links cost 11x)."""
    from zeptograd.uop import upat

    steps = []
    for n in (8, 32):
        y = Tensor(np.arange(12, dtype=np.float32))
        for _ in range(n):
            y = y.reshape(3, 4).permute(1, 0).reshape(12)
        before = upat.rewrite_steps[0]
        y.schedule()
        steps.append(upat.rewrite_steps[0] - before)
        z = np.arange(12)
        for _ in range(n):
            z = z.reshape(3, 4).T.reshape(12)
        np.testing.assert_array_equal(y.numpy(), z)
    assert steps[1] / steps[0] < 6, steps  # ~4x per 4x views when linear


def test_kernels_read_a_bounded_number_of_buffers():
    xs = [rng.standard_normal(8).astype(np.float32) for _ in range(70)]
    t = Tensor(xs[0])
    for x in xs[1:]:
        t = t + Tensor(x)
    items = t.schedule()
    assert len(items) == 3 and max(len(i.bufs) for i in items) <= 33
    np.testing.assert_allclose(t.numpy(), sum(xs), rtol=1e-5)


def test_a_chain_cut_before_a_matmul_stores_its_input_not_the_product():
    # 30 buffers summed, then @ w: the chain passes MAX_KERNEL_BUFS at the matmul's multiply, a (64, 64, 64)
    # product; the cut stores the sum it reads (64 x 64) instead (ResNet-50's layer-3 conv stored 462 MB there)
    xs = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(30)]
    w = rng.standard_normal((64, 64)).astype(np.float32)
    t = Tensor(xs[0])
    for x in xs[1:]:
        t = t + Tensor(x)
    out = t @ Tensor(w)
    items = out.schedule()
    assert len(items) == 2
    assert max(b.size for i in items for b in i.bufs) == 64 * 64  # was a kernel storing 64 * 64 * 64 floats
    np.testing.assert_allclose(out.numpy(), sum(xs) @ w, rtol=1e-4, atol=1e-3)


def test_a_chain_of_many_buffers_is_cut_below_a_broadcast_product():
    """A conv whose input is computed from 30 buffers (ResNet-50's residual chain: each block's weights and biases
    fused into the next block's input) reaches MAX_KERNEL_BUFS at the conv's product x * w. Cut there, the product
    (cout x the input windows: 115M floats at ResNet-50's stride-2 conv, 54 ms) was stored; it is cut at the computed
    input instead, stored at its own size, and the conv stays one kernel."""
    xs = [rng.standard_normal((1, 8, 6, 6)).astype(np.float32) for _ in range(30)]
    wn = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    t = Tensor(xs[0])
    for x in xs[1:]:
        t = t + Tensor(x)
    out = t.conv2d(Tensor(wn))
    items = [i for i in out.schedule() if i.ast.op is Ops.SINK]
    assert len(items) == 2
    assert items[0].bufs[0].size == 8 * 6 * 6  # the chain's sum is stored ...
    assert max(b.size for i in items for b in i.bufs) < 8 * 8 * 4 * 4 * 9  # ... and no product (cout x windows)
    import torch

    ref = torch.nn.functional.conv2d(torch.from_numpy(sum(xs)), torch.from_numpy(wn)).numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_long_chain_peak_memory_stays_at_a_few_buffers():
    n = 1 << 18
    x, y = Tensor(np.ones(n, np.float32)), Tensor(np.full(n, 0.5, np.float32))
    z = x
    for _ in range(9000):
        z = z + y
    GlobalCounters.reset()
    base = GlobalCounters.mem_used
    assert len(z.schedule()) == 5
    np.testing.assert_allclose(z.numpy()[:4], 4501.0)
    assert GlobalCounters.mem_peak - base <= 3 * n * 4  # the output and two intermediates taking turns


def test_split_reduce_two_kernels_or_one():
    from zeptograd import Context

    xn = rng.standard_normal(1 << 16).astype(np.float32)
    x = Tensor(xn)
    assert count_kernels(x.sum()) == 2
    with Context(SPLIT_REDUCEOP=0):
        assert count_kernels(x.sum()) == 1
    np.testing.assert_allclose(x.sum().numpy(), xn.sum(), rtol=1e-4)
    np.testing.assert_allclose(x.max().numpy(), xn.max())


def test_assign_reads_see_the_old_contents_and_later_graphs_the_new():
    a, b = Tensor([1.0, 2.0]).realize(), Tensor([0.0, 0.0]).realize()
    n = a * 10
    a.assign(n)
    b.assign(n + 1)  # reads a before a's assign writes it
    Tensor.realize(a, b)
    np.testing.assert_array_equal(a.numpy(), [10, 20])
    np.testing.assert_array_equal(b.numpy(), [11, 21])
    c = Tensor([1.0, 2.0]).realize()
    (c * 2).numpy()  # realized once: cached by its graph
    c.assign(c + 1).realize()
    np.testing.assert_array_equal((c * 2).numpy(), [4, 6])  # the same expression over the new contents


def _ops_in(item) -> set:
    return {u.op for u in item.ast.toposort()}


def test_costly_prologue_is_stored_before_a_matmul():
    """gelu (exp) between two matmuls: before the rule it was inlined into the second matmul's loop and recomputed
    once per output column; now it is the first matmul's epilogue and the second matmul only loads it. (32 columns:
    with 5, recomputing the GELU's one exp and one division per column costs less than a kernel: it stays inlined.)"""
    from zeptograd.uop.ops import Ops

    (x, _), (w1, _), (w2, _) = realized(6, 8), realized(8, 16), realized(16, 32)
    items = ((x @ w1).gelu() @ w2).schedule()
    assert len(items) == 2
    assert Ops.EXP2 in _ops_in(items[0]) and Ops.REDUCE_AXIS not in _ops_in(items[0])
    assert Ops.EXP2 not in _ops_in(items[1])


def test_gelu_between_matmuls_backward_stores_few_elementwise_kernels():
    """fc2(gelu(fc1(x))) and its weight gradients at examples/gpt_tiny.py's MLP sizes: the GELU's own gradient rule
    (tensor/unary.py) shares only tanh's result with the forward, so at most three elementwise kernels run over the
    hidden layer (tanh, the GELU for fc2's gradient, its gradient for fc1's); through the primitives' gradients each
    stored intermediate of tanh's sigmoid (exp, abs, where) was a kernel of its own (ten). The gradients are torch's."""
    import torch

    (x, xn), (g, gn) = realized(512, 64), realized(512, 64)
    w1n, w2n = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((256, 64)).astype(np.float32)
    w1, w2 = Tensor(w1n * 0.1, requires_grad=True), Tensor(w2n * 0.1, requires_grad=True)
    ((x @ w1).gelu() @ w2).mul(g).sum().backward()
    assert w1.grad is not None and w2.grad is not None
    items = [it for it in Tensor.schedule(w1.grad, w2.grad) if it.ast.op.name == "SINK"]
    hidden = [it for it in items if not any(u.op.name == "REDUCE" for u in it.ast.toposort())]
    assert len([it for it in hidden if it.bufs[0].size == 512 * 256]) <= 3
    tw1, tw2 = torch.tensor(w1n * 0.1, requires_grad=True), torch.tensor(w2n * 0.1, requires_grad=True)
    (torch.nn.functional.gelu(torch.tensor(xn) @ tw1, approximate="tanh") @ tw2).mul(torch.tensor(gn)).sum().backward()
    np.testing.assert_allclose(w1.grad.numpy(), tw1.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(w2.grad.numpy(), tw2.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_gelu_is_one_exp_and_one_division():
    """GELU (tanh) as x * sigmoid(2u), sigmoid(2u) = 1 / (1 + exp(-2u)): one exp and one division per element and no
    select (through tanh's stable sigmoid: an abs, a where and two divisions, 64 -> 43 us over gpt_tiny's 512 x 256
    hidden layer on one core); torch's values and gradients, its inf, nan and -0 included."""
    import torch

    x, _ = realized(64, 32)
    (item,) = x.gelu().schedule()
    ops = [u.op.name for u in item.ast.toposort()]
    assert ops.count("EXP2") == 1 and ops.count("FDIV") + ops.count("RECIPROCAL") == 1 and "WHERE" not in ops
    vals = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e20, -1e20, 30.0, -30.0, 5.0, -5.0, 1e-3, -0.5, 1e-30, 3e12, -3e12]
    z = Tensor(np.array(vals, np.float32), requires_grad=True)
    out = z.gelu()
    out.sum().backward()
    t = torch.tensor(vals, dtype=torch.float32, requires_grad=True)
    ref = torch.nn.functional.gelu(t, approximate="tanh")
    ref.sum().backward()
    assert t.grad is not None and z.grad is not None
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.signbit(out.numpy()), np.signbit(ref.detach().numpy()))
    np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_cheap_index_prologue_stays_inlined_into_a_reduce():
    """An arange mask (no buffer read) or a relu (no transcendental) expanded into a reduce is not stored."""
    x, _ = realized(4, 12)
    below = Tensor.arange(12).reshape(1, 12) <= Tensor.arange(12).reshape(12, 1)  # a triangular mask: j <= i
    assert count_kernels(below.where(x.unsqueeze(1).expand(4, 12, 12), 0).sum(-1)) == 1
    assert count_kernels(x.cumsum(1)) == 1
    (a, an), (w, wn) = realized(6, 8), realized(8, 5)
    n, out = run(a.relu() @ w)
    assert n == 1
    np.testing.assert_allclose(out, np.maximum(an, 0) @ wn, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_costly_epilogue_of_a_large_matmul_is_its_own_kernel():
    """gelu after x @ w.T (256 x 384 outputs, 128 inputs each): the matmul is stored and gelu runs in its own
    elementwise kernel, 16 lanes wide (fused, it ran once per output of a dot-product tile, on scalars: 3x slower).
    The cost model decides (schedule/cost.py: split_epilogue_is_cheaper): 8 x 384 outputs are split too (measured
    91 us fused, 44 us split), a cheap epilogue (relu) and x @ w (vectorized along its outputs) keep theirs."""
    from zeptograd.uop.ops import Ops

    (x, xn), (w, wn) = realized(256, 128), realized(384, 128)
    items = (x @ w.T).gelu().schedule()
    assert len(items) == 2
    assert Ops.EXP2 not in _ops_in(items[0]) and Ops.EXP2 in _ops_in(items[1])
    assert count_kernels((x @ w.T).relu()) == 1
    assert count_kernels((x[:8] @ w.T).gelu()) == 2
    wt, _ = realized(128, 384)
    assert count_kernels((x @ wt).gelu()) == 1
    h = xn @ wn.T
    ref = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose((x @ w.T).gelu().numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_realized_graph_is_not_reused_after_its_buffer_is_written():
    """zeros(6, 4).contiguous() realized, then written by setitem: an equal graph built later is computed again,
    it does not read the written buffer (it returned the 3s)."""
    a = Tensor.zeros(6, 4).contiguous().realize()
    a[1] = 3
    a.realize()
    b = Tensor.zeros(6, 4).contiguous().realize()
    np.testing.assert_equal(b.numpy(), np.zeros((6, 4), np.float32))
    np.testing.assert_equal(a.numpy()[1], np.full(4, 3, np.float32))
    c = Tensor.ones(5).contiguous().realize()
    c.shrink(((0, 2),)).assign(Tensor.full((2,), 7.0)).realize()
    np.testing.assert_equal(Tensor.ones(5).contiguous().numpy(), np.ones(5, np.float32))
    np.testing.assert_equal(c.numpy(), [7, 7, 1, 1, 1])


def test_an_assign_into_a_view_is_read_back_through_that_view():
    """The value of `t[1:3].assign(v)` lives at elements 1..2 of t's buffer: a consumer in the same schedule reads
    it there (it read elements 0..1)."""
    t = Tensor.zeros(4).contiguous().realize()
    np.testing.assert_array_equal((t[1:3].assign(Tensor([5.0, 6.0])) * 2).numpy(), [10, 12])
    m = Tensor.zeros(4, 4).contiguous().realize()
    np.testing.assert_array_equal((m.T[1:3].assign(Tensor.ones(2, 4) * 7) + 1).numpy(), np.full((2, 4), 8))
    np.testing.assert_array_equal(m.numpy()[:, 1:3], np.full((4, 2), 7))


def test_relu_backward_reads_the_output_not_a_stored_mask():
    """relu's gradient is (out == 0).where(0, grad), from the output that the next layer reads anyway: the forward
    stores no bool mask, and the matmul's output has one consumer, so bias + relu stay in its epilogue (an MLP's
    784-512-10 layers at batch 256: 8 kernels on 16-lane vectors, 10 when the backward read x @ w1 + b1 <= 0)."""
    (x, xn), (w1n, b1n, w2n) = (
        realized(256, 784),
        (rng.standard_normal(s).astype(np.float32) for s in ((784, 512), (512,), (512, 10))),
    )
    w1, b1, w2 = (Tensor(a, requires_grad=True) for a in (w1n, b1n, w2n))
    loss = ((x @ w1 + b1).relu() @ w2).sum()
    loss.backward()
    items = loss.schedule(w1.grad, b1.grad, w2.grad)
    assert not any(b.dtype == dtypes.bool for item in items for b in item.bufs)
    # h = relu(x @ w1 + b1) is stored by the kernel that reads x (w1 may come from a layout copy, on 8-lane vectors)
    h_kernels = [i for i in items if i.bufs[0].size == 256 * 512 and {256 * 784, 512} <= {b.size for b in i.bufs}]
    assert len(h_kernels) == 1
    Tensor.realize(loss, w1.grad, b1.grad, w2.grad)
    hn = np.maximum(xn @ w1n + b1n, 0)
    gh = np.ones((256, 10), np.float32) @ w2n.T * (hn > 0)
    np.testing.assert_allclose(w1.grad.numpy(), xn.T @ gh, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(b1.grad.numpy(), gh.sum(0), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(w2.grad.numpy(), hn.T @ np.ones((256, 10), np.float32), rtol=1e-3, atol=1e-3)
