"""The scheduler's cost model (schedule/cost.py): keep-or-inline decided by the recomputation an inline causes
against a buffer's store, loads and kernel. Each case is a cliff that inlining fell off (measured before the model:
`(x*g + b) @ w` at 512^3 took 202 ms against 1 ms for `x @ w`; a cat of 8 matmuls ran every part's matmul at every
output of the cat; `y + y.T` read every input of `y` across rows), checked by kernel count and by value; the same
programs at small sizes stay one kernel, where a kernel's fixed cost outweighs the recomputation."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Context, Tensor
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.schedule.cost import CostModel, reads_across_rows
from zeptograd.uop.ops import AxisType, Ops, UOp

rng = np.random.default_rng(0)


def realized(*shape):
    n = rng.standard_normal(shape).astype(np.float32)
    return Tensor(n).realize(), n


def kernels(t: Tensor) -> list:
    return [item for item in t.schedule() if item.ast.op is Ops.SINK]


def test_a_prologue_recomputed_per_output_column_is_stored_before_the_matmul():
    """x*g + b is read at (i, k) inside a loop over j: inlined, it runs n times per element."""
    (x, xn), (w, wn), (g, gn), (b, bn) = realized(256, 256), realized(256, 256), realized(256), realized(256)
    items = kernels((x * g + b) @ w)
    assert len(items) == 2
    assert not any(u.op is Ops.REDUCE for u in items[0].ast.toposort())  # the prologue: elementwise, stored
    np.testing.assert_allclose(((x * g + b) @ w).numpy(), (xn * gn + bn) @ wn, rtol=1e-4, atol=1e-3)
    (xs, _), (ws, _), (gs, _) = realized(8, 8), realized(8, 8), realized(8)
    assert len(kernels((xs * gs) @ ws)) == 1  # 512 multiplies recomputed cost less than a kernel


def test_a_unary_prologue_of_a_large_matmul_is_stored():
    (x, xn), (w, wn) = realized(512, 512), realized(512, 480)  # (480 columns: no copy of w in column panels)
    assert len(kernels(x.abs() @ w)) == 2
    np.testing.assert_allclose((x.abs() @ w).numpy(), np.abs(xn) @ wn, rtol=1e-4, atol=1e-3)


def test_reduces_read_through_a_cat_are_each_stored():
    """cat pads each part and adds: an inlined part's matmul would run at every output row of the cat."""
    parts = [realized(64, 128) for _ in range(4)]
    w, wn = realized(128, 32)
    out = Tensor.cat(*[a @ w for a, _ in parts])
    assert len(kernels(out)) == 5
    np.testing.assert_allclose(out.numpy(), np.concatenate([an @ wn for _, an in parts]), rtol=1e-4, atol=1e-3)


def test_row_reduces_concatenated_along_columns_are_each_stored():
    """cat(a0.max(1, keepdim=True), ..., a7.max(1, keepdim=True), dim=1): each part's max is read at its own column
    under a pad's gate, which gates the max's loads, so inlined every max ran at all 8 columns of a row (one kernel,
    3-4x the no-fusion time). The reduce is not hoisted past the loops its gate varies along: each max is stored."""
    parts = [realized(256, 128) for _ in range(8)]
    out = Tensor.cat(*[a.max(1, keepdim=True) for a, _ in parts], dim=1)
    assert len(kernels(out)) == 9
    np.testing.assert_array_equal(out.numpy(), np.concatenate([an.max(1, keepdims=True) for _, an in parts], 1))
    (x, xn) = realized(4, 8)  # small: the work recomputed costs less than a kernel
    small = Tensor.cat(x.max(1, keepdim=True), x.sum(1, keepdim=True), dim=1)
    assert len(kernels(small)) == 1
    np.testing.assert_allclose(small.numpy(), np.stack([xn.max(1), xn.sum(1)], 1), rtol=1e-6)


def test_a_value_read_transposed_is_stored():
    """y + y.T: the transposed read of an inlined y reads each of y's four inputs across rows."""
    (a, an), (b, bn), (c, cn), (d, dn) = (realized(256, 256) for _ in range(4))
    y = a * b + c * d
    assert len(kernels(y + y.T)) == 2
    yn = an * bn + cn * dn
    np.testing.assert_allclose((y + y.T).numpy(), yn + yn.T, rtol=1e-5, atol=1e-5)
    (s, _), (t, _) = realized(8, 8), realized(8, 8)
    assert len(kernels((s * t) + (s * t).T)) == 1


def test_cheap_values_read_twice_in_a_row_stay_inlined():
    """A value read by a row's sum and by the division at the same rows is recomputed where that is cheap: x * 2.
    softmax's exp (a polynomial of ~20 vector ops) is kept in a row buffer instead (schedule/bufferize.py:
    row_buffer): one kernel at every size. Without one (a row longer than ROW_BUFFER_BYTES), the cost model stores
    the exp where its buffer stays in the cache (two kernels: the row's max and exp, then the sum and the division)
    and recomputes it where it would not (4096^2 floats: stores and loads go to DRAM)."""
    from zeptograd.schedule import policy

    x, xn = realized(64, 1000)
    assert len(kernels((x * 2) / (x * 2).sum(-1, keepdim=True))) == 1
    assert len(kernels(x.softmax(-1))) == 1
    old = policy.ROW_BUFFER_BYTES
    try:
        policy.ROW_BUFFER_BYTES = 0
        with Context(**{SCHEDULE_CACHE.key: 0}):
            assert len(kernels(x.softmax(-1))) == 2
            assert len(kernels(Tensor.empty(4096, 4096).softmax(-1))) == 1
    finally:
        policy.ROW_BUFFER_BYTES = old
    e = np.exp(xn - xn.max(-1, keepdims=True))
    np.testing.assert_allclose(x.softmax(-1).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_an_arange_mask_is_never_stored():
    """An index-only mask (one_hot's compare of an arange) folds into a gather in codegen: kept inline."""
    x, _ = realized(512, 64)
    idx = Tensor(rng.integers(0, 512, 300).astype(np.int32)).realize()
    assert len(kernels(x[idx])) == 1


def test_reads_across_rows_looks_at_the_innermost_loop_in_scope():
    r0, r1 = UOp.range(64, 0, AxisType.LOOP), UOp.range(64, 1, AxisType.LOOP)
    zero = UOp.const(r0.dtype, 0)
    assert not reads_across_rows((r0, r1), {r0, r1})
    assert reads_across_rows((r1, r0), {r0, r1})
    assert not reads_across_rows((r0, r1, zero), {r0, r1})  # a trailing size-1 dimension reads 0
    assert not reads_across_rows((r0,), {r0, r1})


@pytest.mark.parametrize("op,expected", [("exp", 20 + 4), ("add", 1 + 4 + 4)])
def test_the_work_of_an_inlined_node_sums_its_ops_and_loads(op, expected):
    (a, _), (b, _) = realized(4, 4), realized(4, 4)
    t = a.exp2() if op == "exp" else a + b
    sink = t.uop
    model = CostModel(list(sink.toposort()), set(), lambda u, req: [])
    assert model.work[sink] == expected


def test_a_costly_prologue_of_a_large_matmul_is_stored():
    """layernorm's normalized rows (an rsqrt per row, a subtract and a multiply per element) before a 256^3 matmul:
    stored once instead of recomputed per output column: their kernel (with the row's mean and variance) and the
    matmul's."""
    (x, xn), (w, wn) = realized(256, 256), realized(256, 256)
    assert len(kernels(x.layernorm() @ w)) == 2
    y = (xn - xn.mean(-1, keepdims=True)) / np.sqrt(xn.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose((x.layernorm() @ w).numpy(), y @ wn, rtol=1e-3, atol=1e-3)


def test_a_broadcast_product_read_across_its_rows_stays_inline():
    """A matmul written by hand, `(a[:, :, None] * b[None]).sum(1)`: the product's layout is (i, k, j) while the loops
    run k innermost, but its loads are a[i, k] and b[k, j], not the product's rows: nothing is stored (the transposed
    read penalty applies only to a node whose buffers share its layout, as `y + y.T`)."""
    (a, an), (b, bn) = realized(64, 256), realized(256, 32)
    t = (a.reshape(64, 256, 1) * b.reshape(1, 256, 32)).sum(1)
    assert len(kernels(t)) == 1
    np.testing.assert_allclose(t.numpy(), an @ bn, rtol=1e-4, atol=1e-3)


def test_a_prologue_read_across_rows_by_a_conv_is_stored():
    """batchnorm before a 1x1 conv: the conv reduces over channels, so inlined, every load of x moves a whole
    channel plane per step of the reduce (and the prologue runs once per output channel): stored, contiguous."""
    (x, xn), (w, wn) = realized(8, 32, 16, 16), realized(32, 32, 1, 1)
    (g, gn), (b, bn) = realized(32), realized(32)
    t = x.batchnorm(g, b, Tensor.zeros(32), Tensor.ones(32)).conv2d(w)
    assert len(kernels(t)) == 2
    y = xn * gn[None, :, None, None] + bn[None, :, None, None]
    np.testing.assert_allclose(t.numpy(), np.einsum("nchw,oc->nohw", y, wn[:, :, 0, 0]), rtol=1e-4, atol=1e-3)


def test_a_matmul_reducing_its_outer_axis_keeps_its_product_inline():
    """x.T @ g (a weight gradient: the reduce runs over the batch, the operands' outer axis): the loads move across
    rows with the reduce loop, but the optimizer orders a reduce's loops around its loads, so only output loops
    count for the transposed-read penalty (it stored the 256x512x784 product: 400 MB, mlp_step 4x slower)."""
    (x, xn), (g, gn) = realized(256, 784), realized(256, 512)
    assert len(kernels(x.T @ g)) == 1
    np.testing.assert_allclose((x.T @ g).numpy(), xn.T @ gn, rtol=1e-4, atol=1e-3)


def test_a_causal_mask_added_to_scores_is_data_not_an_index():
    """Only an arange, a comparison with one and arithmetic over those are index-only (folded by codegen, never
    stored); `qk + mask.where(0, -inf)` is data. Index-only, it made the whole causal softmax "index-only", and its
    exp was recomputed at each of the head dimension's columns of `@ v` (4 kernels, 1.7x the no-fusion baseline).
    Now it is decided as without the mask: at (1, 2, 64, 64), where the scores are stored (their buffer is no larger
    than q and k: schedule/cost.py, expands), the exp is computed once per score (a row buffer read by its sum and by
    `@ v`) in as many kernels as without the mask; the mask is added as the scores are read, not a kernel of its own."""
    q, _ = realized(1, 2, 64, 64)
    plain = kernels(q.scaled_dot_product_attention(q, q))
    causal = kernels(q.scaled_dot_product_attention(q, q, is_causal=True))
    assert len(causal) == len(plain) == 2
    assert sum(u.op is Ops.EXP2 for item in causal for u in item.ast.toposort()) == 1
    s, _ = realized(4, 4)
    mask = Tensor.ones(4, 4).tril().where(0, -float("inf"))
    sink = (s + mask).uop
    model = CostModel(list(sink.toposort()), set(), lambda u, req: [])
    assert model.index_only[mask.uop] and not model.index_only[sink]


def test_an_epilogue_on_scalars_is_split_off_by_cost():
    """x @ w.T reduces its 16 vector lanes along k: fused, gelu runs once per output on a scalar. A kernel of its
    own (16 lanes wide) pays a kernel, a store and a load per output: at 128 x 128 outputs it does (measured 540 us
    fused, 210 us split), at 4 x 16 outputs it does not (3.9 us fused, 5.4 us split). x @ w vectorizes along the
    outputs, and relu costs nothing measurable on scalars: fused."""
    (x, xn), (w, wn) = realized(128, 128), realized(128, 128)
    items = kernels((x @ w.T).gelu())
    assert len(items) == 2
    assert not any(u.op is Ops.EXP2 for u in items[0].ast.toposort())
    assert len(kernels((x @ w).gelu())) == 1
    assert len(kernels((x @ w.T).relu() * 0.5)) == 1
    assert len(kernels((x[:4, :64] @ w[:16, :64].T).gelu())) == 1
    h = xn @ wn.T
    ref = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose((x @ w.T).gelu().numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_gathers_one_hot_select_is_never_stored():
    """emb[idx] is sum(where(idx == arange, emb, 0)) over the table's rows; codegen folds it to one load, so the cost
    model counts one evaluation (`selects_one`) and never stores the select (a one-hot product of 64 x 128 x 512
    elements here), though layernorm reads the gathered rows three times."""
    emb, embn = realized(512, 64)
    idxn = rng.integers(0, 512, (4, 32)).astype(np.int32)
    idx = Tensor(idxn).realize()
    t = emb[idx].layernorm()
    items = kernels(t)
    assert len(items) == 1  # (layernorm's row statistics computed in the kernel, before each row's outputs)
    assert all(b.size < 512 * 4 * 32 for item in items for b in item.bufs if b.size != 512 * 64)
    g = embn[idxn]
    ref = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(t.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_short_reduce_axis_is_not_a_vector_axis():
    """reduces_its_lanes weighs each load by the vector lanes its loop fills, as codegen picks its vector axis: a 3x3
    conv's kw (3 long) and a 10-class gradient's reduce (g @ w2.T) fill none, so their epilogues stay fused (counted
    as loads along the reduce, conv + batchnorm was split in two and an MLP step stored g @ w2.T's product)."""
    (x, _), (w, _) = realized(2, 16, 16, 16), realized(16, 16, 3, 3)
    g, b, mu, var = (realized(16)[0] for _ in range(4))
    assert len(kernels(x.conv2d(w, padding=1).batchnorm(g, b, mu, var.abs() + 1).relu())) == 1
    (gr, _), (w2, _), (h, _) = realized(256, 10), realized(512, 10), realized(256, 512)
    assert len(kernels((gr @ w2.T) * (h > 0))) == 1


def test_a_contraction_summed_over_its_outputs_is_stored_for_its_register_tile():
    """SqueezeNet's head: a 1x1 conv 512 -> 1000, relu, and a mean over the 13x13 outputs. Fused, the conv is a reduce
    nested in the mean's reduce over its own outputs: no output loop is left for a register tile, and each
    multiply-add loads both operands (31 ms, 5.5 GFLOPS on 2 AVX2 cores). Stored, it is a (1000x512) @ (512x169)
    kernel with a tile (`CostModel.tiled`), and the relu and mean a small kernel after it. Small, one kernel."""
    (x, xn), (w, wn), (b, bn) = realized(1, 512, 13, 13), realized(1000, 512, 1, 1), realized(1000)
    t = x.conv2d(w, b).relu().mean((2, 3))
    items = kernels(t)
    assert len(items) == 2
    conv = items[0].ast
    reduces = [u for u in conv.toposort() if u.op is Ops.REDUCE]
    assert len(reduces) == 1 and all(r.arg[1] is AxisType.REDUCE for r in reduces[0].src[1:])
    assert {r.arg[1] for r in conv.toposort() if r.op is Ops.RANGE} == {AxisType.LOOP, AxisType.REDUCE}
    y = np.maximum(np.einsum("chw,oc->ohw", xn[0], wn[:, :, 0, 0]) + bn[:, None, None], 0).mean((1, 2))
    np.testing.assert_allclose(t.numpy(), y[None], rtol=1e-4, atol=1e-4)
    (a, an), (m, mn) = realized(256, 256), realized(256, 256)
    assert len(kernels((a @ m).relu().sum(-1))) == 2  # a matmul's rows summed: the same nest
    np.testing.assert_allclose((a @ m).relu().sum(-1).numpy(), np.maximum(an @ mn, 0).sum(-1), rtol=1e-4, atol=1e-2)
    (xs, _), (ws, _) = realized(1, 16, 4, 4), realized(16, 16, 1, 1)
    assert len(kernels(xs.conv2d(ws).relu().mean((2, 3)))) == 1  # 4096 multiply-adds: less than a kernel's cost


def test_a_tiled_contraction_shares_each_load_with_the_tile():
    """The work of a contraction in a register tile: per reduced element a multiply, an add and each operand's load
    shared by up to TILE_REUSE rows or columns (x @ w: x broadcast along w's 64 columns, w along x's 64 rows); a
    matrix-vector product's matrix is read once per multiply-add; a sum of an elementwise product is no contraction."""
    from zeptograd.schedule.cost import ALU, LOAD, TILE_REUSE

    (x, _), (w, _), (v, _) = realized(64, 32), realized(32, 64), realized(1, 32)
    for t, per_element in (
        (x @ w, 2 * ALU + 2 * -(-LOAD // TILE_REUSE)),
        (v @ w, 2 * ALU + -(-LOAD // TILE_REUSE) + LOAD),
        ((x * x).sum(-1), None),
    ):
        red = next(u for u in t.uop.toposort() if u.op is Ops.REDUCE_AXIS)
        model = CostModel(list(t.uop.toposort()), set(), lambda u, req: [])
        assert model.tiled.get(red) == (None if per_element is None else per_element * 32)
        assert model.work[red] == (ALU + 2 * LOAD + ALU) * 32


def test_a_conv_read_by_a_padded_copy_is_stored():
    """ResNet-50's stem at batch 16: a 7x7 stride-2 conv, relu, and the max pool's padded copy of it. Its 51 MB output
    leaves the cache, so storing it costs 8x a cached buffer, and the conv was inlined into the padded copy, where
    no register tile forms (its loops are the gated 114x114 border) and its input windows became a 236 MB copy:
    30 s of kernel time. A contraction read under a pad's gate costs its untiled work: stored, 0.14 s."""
    x, w, b = Tensor.empty(16, 3, 224, 224), Tensor.empty(64, 3, 7, 7), Tensor.empty(64)
    items = kernels(x.conv2d(w, b, stride=2, padding=3).relu().max_pool2d(3, 2, padding=1))
    sizes = [item.bufs[0].size for item in items]
    assert 16 * 64 * 112 * 112 in sizes  # the conv, stored at its own size
    assert max(b.size for i in items for b in i.bufs) == 16 * 64 * 114 * 114  # the padded copy: no window copy
    convs = [i for i in items if i.bufs[0].size == 16 * 64 * 112 * 112]
    assert not any(u.op is Ops.WHERE for u in convs[0].ast.toposort())  # no pad's gate in the conv's kernel
