"""NN ops against torch 2.13 (CPU): products, einsum, convolutions, pooling, interpolation, normalization,
attention, dropout and losses, forward and backward."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.slow import fast_first
from tests.tensor.api_helpers import V, check, data
from zeptograd import Context, GlobalCounters, Tensor, dtypes, nn
from zeptograd.tensor import matmul_layout, nn_ops

# ----------------------------------------------------------------------------- products


@pytest.mark.parametrize(
    "sa,sb",
    fast_first(
        [
            ((3,), (3,)),
            ((2, 3), (3,)),
            ((3,), (3, 4)),
            ((2, 3), (3, 4)),
            ((2, 2, 3), (3, 4)),
            ((2, 1, 2, 3), (3, 3, 2)),
            ((0, 3), (3, 2)),
            ((2, 0), (0, 3)),
        ],
        unpack=True,
    ),
)
def test_matmul(sa, sb):
    a, b = V(data(sa, seed=1)), V(data(sb, seed=2))
    check(lambda x, y: x @ y, lambda x, y: x @ y, a, b)
    check(lambda x, y: x.matmul(y), torch.matmul, a, b)


def _kernels(t: Tensor) -> int:
    return sum(item.ast.op.name == "SINK" for item in t.schedule())


def test_a_large_right_operand_is_read_from_column_panels():
    """x @ w with w a stored matrix whose rows are a page or more apart (1024 floats) reads w from a copy in panels
    of 32 columns (one kernel more); gradients flow through the copy as through any view; small, odd, computed,
    broadcast or non-float32 operands and the PYTHON device do not copy."""
    rng = np.random.default_rng(0)
    xn, wn = rng.standard_normal((160, 192), dtype=np.float32), rng.standard_normal((2, 192, 1024), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    assert _kernels(x @ w[0]) == 2 and _kernels(x @ w) == 2  # batched: every batch's panels in one copy
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    (x @ w).square().sum().backward()
    (xt @ wt).square().sum().backward()
    np.testing.assert_allclose((x @ w).numpy(), (xt @ wt).detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-2)
    assert _kernels(x @ Tensor(wn[0].T).T) == 2  # a transposed operand too: the copy reads it once
    assert _kernels(x[:64] @ w[0]) == 1  # few rows to share the copy
    assert _kernels(x @ w[0, :, :1000]) == 1  # not a whole number of panels
    assert _kernels(x @ w[0, :, :512]) == 1  # rows 2 KB apart stay in the caches
    assert _kernels(Tensor(xn.astype(np.float64)) @ Tensor(wn[0].astype(np.float64))) == 1
    assert _kernels(x @ Tensor.ones(192, 1024)) == 1  # a broadcast: a copy would make it a full matrix
    assert not matmul_layout._packs_right_operand(x, w[0] * 2)  # computed: the copy would be its materialization
    on_python = Tensor(xn, device="PYTHON") @ Tensor(wn[0], device="PYTHON")
    assert _kernels(on_python) == 1


def test_a_linear_weight_shared_by_many_rows_is_read_from_column_panels():
    """x @ W.T, W (N, K) stored row-major (nn.Linear's weight, contiguous along K as x is), reads W.T from a copy in
    column panels where 1024+ rows of x share it, the rows of every batch dim W broadcasts along counted (a BERT
    layer's (batch, seq, K)), or 128+ rows over a depth of 1024+; fewer rows over a short depth keep the tile of dot
    products (no copy). Values and gradients match torch's through the copy."""
    rng = np.random.default_rng(0)
    xn, wn = rng.standard_normal((4, 256, 384), dtype=np.float32), rng.standard_normal((384, 384), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    assert _kernels(x @ w.T) == 2  # 4 x 256 rows share the copy
    assert _kernels(x[:2] @ w.T) == 1  # 512 rows over a depth of 384: the dot tile
    deep_x, deep_w = Tensor.empty(128, 1024), Tensor.empty(256, 1024).realize()
    assert _kernels(deep_x @ deep_w.T) == 2 and _kernels(deep_x[:64] @ deep_w.T) == 1
    layer = nn.Linear(384, 384)
    Tensor.realize(layer.weight, layer.bias)  # loaded weights: stored buffers
    assert _kernels(layer(Tensor.empty(4, 256, 384))) == 2  # the bias added in the product's kernel
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    (x @ w.T).square().sum().backward()
    (xt @ wt.T).square().sum().backward()
    np.testing.assert_allclose((x @ w.T).numpy(), (xt @ wt.T).detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-2)


def test_a_linear_over_a_depth_of_no_whole_vectors_reads_copies_with_padded_rows():
    """x @ W.T (W (N, K) stored, the dot tile) where K leaves a tail of scalar copies (no power of two) over a large
    enough product reads copies of x and W whose rows are padded with zeros to whole vectors of the renderer (two
    kernels more, no tail left, every row aligned); a tail of one vector, a whole number of vectors, a small product
    or W read from panels keep the product as it is."""
    lanes = matmul_layout._vector_lanes("CPU", 4)
    padded = -(-263 // lanes) * lanes  # 263 = 16 * 16 + 7 = 32 * 8 + 7: 7 scalar copies on AVX-512 and AVX2
    x, w = Tensor.empty(512, 263), Tensor.empty(513, 263).realize()
    sched = (x @ w.T).schedule()
    assert sum(item.ast.op.name == "SINK" for item in sched) == 3
    assert sorted(b.size for item in sched[:2] for b in item.bufs[:1]) == [512 * padded, 513 * padded]
    assert _kernels(Tensor.empty(2, 256, 263) @ w.T) == 3  # a Linear over (batch, seq, K): its rows counted
    assert _kernels(x[:, : lanes * 16] @ Tensor.empty(513, lanes * 16).realize().T) == 1  # whole vectors
    assert _kernels(x[:, :257] @ Tensor.empty(513, 257).realize().T) == 1  # one scalar copy: the copies cost more
    assert _kernels(x[:64] @ w[:64].T) == 1  # a small product
    assert _kernels(Tensor.empty(2048, 263) @ Tensor.empty(512, 263).realize().T) == 2  # column panels
    assert _kernels(Tensor.empty(512, 263, device="PYTHON") @ Tensor.empty(513, 263, device="PYTHON").T) == 1


def test_a_linear_over_a_depth_of_no_whole_vectors_reads_column_panels_from_fewer_rows():
    """x @ W.T with K no whole number of vectors (the dot tile's tail and misaligned rows) and N a multiple of 32 reads
    W.T from column panels from 128 rows and ~25M multiply-adds on, not only from 1024 rows or a depth of 1024."""
    w = Tensor.empty(384, 263).realize()  # 263 = 7 past whole vectors of 16 and of 8
    assert _kernels(Tensor.empty(256, 263) @ w.T) == 2
    assert _kernels(Tensor.empty(2, 128, 263) @ w.T) == 2  # batched: its rows counted
    assert _kernels(Tensor.empty(256, 256) @ Tensor.empty(384, 256).realize().T) == 1  # whole vectors: the dot tile
    assert _kernels(Tensor.empty(256, 257) @ Tensor.empty(256, 257).realize().T) == 1  # a small product
    assert _kernels(Tensor.empty(64, 1001) @ Tensor.empty(1024, 1001).realize().T) == 1  # few rows


@pytest.mark.parametrize("device,noopt", [("CPU", 0), ("CPU", 1), ("CPU:C", 0)])
@pytest.mark.parametrize("k", [257, 1001])
def test_odd_depth_column_panels_values_and_gradients(device, noopt, k, monkeypatch):
    """Through the column panels of an odd depth (forced at a small size), values and gradients match torch's."""
    monkeypatch.setattr(matmul_layout, "TRANSPOSED_PANEL_TAIL_MIN_MACS", 0)
    rng = np.random.default_rng(k)
    xn, wn = rng.standard_normal((2, 64, k), dtype=np.float32), rng.standard_normal((32, k), dtype=np.float32)
    x, w = Tensor(xn, device=device, requires_grad=True), Tensor(wn, device=device, requires_grad=True)
    assert _kernels(x @ w.T) == 2
    with Context(NOOPT=noopt):
        out = x @ w.T
        out.square().sum().backward()
        out_n, xg, wg = out.numpy(), x.grad.numpy(), w.grad.numpy()
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    out_t = xt @ wt.T
    out_t.square().sum().backward()
    np.testing.assert_allclose(out_n, out_t.detach().numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(xg, xt.grad.numpy(), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(wg, wt.grad.numpy(), rtol=1e-3, atol=5e-2)


@pytest.mark.parametrize("m,k,n", [(256, 1024, 256), (256, 263, 384), (512, 263, 513)])
def test_a_linear_read_from_copies_takes_its_gradients_from_x_and_w_themselves(m, k, n):
    """x @ W.T read from copies (column panels, padded rows) has the gradients of x @ W.T itself: x's is g @ W, W
    row-major (a tile of rows and vectors along K), not a reduce along the panels' split N (a tile of dot products of
    32: 256x1024x256's backward 28 ms on 1 AVX-512 core, 2.4 with g @ W)."""
    from zeptograd.codegen.opt import OptOps

    x, w = Tensor.empty(m, k, requires_grad=True), Tensor.empty(n, k, requires_grad=True).realize()
    assert _kernels(x @ w.T) == (2 if n % 32 == 0 else 3)  # (the copies)
    (x @ w.T).square().sum().backward()
    assert not any(o.op is OptOps.UNROLL for o in _matmul_reduce_opts(x.grad))
    assert x.grad.shape == (m, k) and w.grad.shape == (n, k)


@pytest.mark.parametrize("device,noopt", [("CPU", 0), ("CPU", 1), ("CPU:C", 0), ("PYTHON", 0)])
@pytest.mark.parametrize("k", [1, 3, 17, 257, 1001])
def test_padded_depth_copies_values_and_gradients(device, noopt, k, monkeypatch):
    """Through the padded copies (forced at small sizes), values and gradients match torch's, a batched x too."""
    if device == "PYTHON" and k == 1001:
        pytest.skip("slow on the PYTHON device")
    monkeypatch.setattr(matmul_layout, "PADDED_DEPTH_MIN_MACS", 0)
    monkeypatch.setattr(matmul_layout, "TAIL_PIECES_PER_COPIED_DEPTH", 0.0)
    rng = np.random.default_rng(k)
    xn, wn = rng.standard_normal((2, 3, k), dtype=np.float32), rng.standard_normal((5, k), dtype=np.float32)
    x, w = Tensor(xn, device=device, requires_grad=True), Tensor(wn, device=device, requires_grad=True)
    lanes = matmul_layout._vector_lanes(device, 4)
    assert _kernels(x @ w.T) == (3 if lanes and k % lanes else 1)
    with Context(NOOPT=noopt):
        out = x @ w.T
        (out.square() * Tensor(np.arange(30, dtype=np.float32).reshape(2, 3, 5), device=device)).sum().backward()
        out_n, xg, wg = out.numpy(), x.grad.numpy(), w.grad.numpy()
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    out_t = xt @ wt.T
    (out_t.square() * torch.arange(30, dtype=torch.float32).reshape(2, 3, 5)).sum().backward()
    np.testing.assert_allclose(out_n, out_t.detach().numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(xg, xt.grad.numpy(), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(wg, wt.grad.numpy(), rtol=1e-4, atol=1e-2)


def _matmul_reduce_opts(t: Tensor) -> list:
    """The hand-coded optimizer's actions for the last kernel of t's schedule, for an AVX2 host on one core."""
    from zeptograd.codegen import ranges_simplified
    from zeptograd.codegen.opt.heuristic import hand_coded_optimizations

    return hand_coded_optimizations(ranges_simplified(t.schedule()[-1].ast), 32, threads=1)[1]


@pytest.mark.parametrize("m,k,n", [(256, 512, 10), (70, 100, 9), (64, 64, 15)])
def test_a_narrow_right_operand_is_read_transposed(m, k, n):
    """x @ w with w a stored row-major matrix of fewer than 16 columns, not a multiple of 8 (a classifier's 10
    outputs), reads w from a copy stored transposed (one kernel more), so the product is a tile of dot products along
    K (its reduce UNROLLed), not one vector along N and a tail; the gradients flow through the copy, and x's
    gradient reads the copy with its columns contiguous."""
    from zeptograd.codegen.opt import OptOps

    rng = np.random.default_rng(1)
    xn, wn = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    assert _kernels(x @ w) == 2
    assert any(o.op is OptOps.UNROLL for o in _matmul_reduce_opts(x @ w))  # the vector runs along K
    xt, wt = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    (x @ w).relu().sum().backward()
    (xt @ wt).relu().sum().backward()
    np.testing.assert_allclose((x @ w).numpy(), (xt @ wt).detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_narrow_right_operands_that_are_not_copied():
    rng = np.random.default_rng(2)
    x = Tensor(rng.standard_normal((256, 512), dtype=np.float32))
    assert _kernels(x @ Tensor(rng.standard_normal((10, 512), dtype=np.float32)).T) == 1  # stored transposed already
    for shape in ((512, 8), (512, 16), (512, 24)):  # whole vectors of 8
        assert _kernels(x @ Tensor(rng.standard_normal(shape, dtype=np.float32))) == 1
    assert _kernels(x[:32] @ Tensor(rng.standard_normal((512, 10), dtype=np.float32))) == 1  # few rows
    assert _kernels(x[:, :32] @ Tensor(rng.standard_normal((32, 10), dtype=np.float32))) == 1  # a short depth
    assert not matmul_layout._transposes_right_operand(x, Tensor(rng.standard_normal((512, 10), dtype=np.float32)) * 2)
    ones64 = Tensor.ones(512, 10, dtype="float64").contiguous()
    assert not matmul_layout._transposes_right_operand(x.cast("float64"), ones64)


@pytest.mark.slow
def test_matmul_views_and_ints():
    check(
        lambda x, y: x @ y,
        lambda x, y: x @ y,
        V(data((4, 3), seed=3), lambda t: t.T),
        V(data((5, 8), seed=4), lambda t: t[1:5, ::2]),
    )
    check(
        lambda x, y: x.dot(y),
        lambda x, y: x @ y,
        V(data((2, 3), "int32", -5, 5, seed=5)),
        V(data((3, 2), "int32", -5, 5, seed=6)),
    )
    check(
        lambda x, y: x.dot(y, dtype=dtypes.float64),
        lambda x, y: (x @ y).double(),
        V(data((2, 3), seed=7)),
        V(data((3, 2), seed=8)),
        grad=False,
    )


@pytest.mark.parametrize("sa,sb", [((2, 3), (4,)), ((2, 3), (2, 3)), ((3,), (4, 5)), ((), (3,))])
def test_matmul_incompatible_raises(sa, sb):
    with pytest.raises(ValueError, match="matmul"):
        Tensor.ones(*sa) @ Tensor.ones(*sb)


def test_linear():
    x, w, b = V(data((4, 3), seed=9)), V(data((5, 3), seed=10)), V(data((5,), seed=11))
    check(lambda x, w, b: x.linear(w.T, b), F.linear, x, w, b)
    check(lambda x, w: x.linear(w.T), F.linear, x, w)


@pytest.mark.parametrize(
    "formula,shapes",
    fast_first(
        [
            ("ij,jk->ik", [(2, 3), (3, 4)]),
            ("ij,jk", [(2, 3), (3, 4)]),
            ("i,i->", [(4,), (4,)]),
            ("i,j->ij", [(3,), (2,)]),
            ("bij,bjk->bik", [(2, 3, 4), (2, 4, 2)]),
            ("ij->ji", [(2, 3)]),
            ("ii->i", [(3, 3)]),
            ("ii", [(3, 3)]),
            ("...ij,...jk->...ik", [(2, 2, 3), (2, 3, 2)]),
            ("ijk,k->ij", [(2, 3, 4), (4,)]),
            ("ij,ij,ij->i", [(2, 3)] * 3),
            ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
        ],
        unpack=True,
    ),
)
def test_einsum(formula, shapes):
    ins = [V(data(s, seed=12 + i)) for i, s in enumerate(shapes)]
    check(lambda *xs: Tensor.einsum(formula, *xs), lambda *xs: torch.einsum(formula, *xs), *ins)


def test_einsum_list_operands():
    check(
        lambda a, b: Tensor.einsum("ij,jk->ik", [a, b]),
        lambda a, b: torch.einsum("ij,jk->ik", [a, b]),
        V(data((2, 3), seed=20)),
        V(data((3, 2), seed=21)),
    )


# ----------------------------------------------------------------------------- convolutions

CONV = [  # (input shape, weight shape, kwargs)
    ((1, 2, 5, 5), (3, 2, 3, 3), {}),
    ((2, 2, 6, 5), (4, 2, 3, 2), {"padding": 1}),
    ((1, 2, 7, 7), (2, 2, 3, 3), {"stride": 2}),
    ((1, 2, 7, 7), (2, 2, 2, 2), {"dilation": 2, "padding": (1, 2)}),
    ((1, 4, 5, 5), (6, 2, 3, 3), {"groups": 2}),
    ((1, 2, 6, 6), (3, 2, 3, 3), {"stride": (2, 1), "padding": (2, 1, 0, 1)}),
    ((2, 3, 8), (4, 3, 3), {"padding": 1, "stride": 2}),  # 1-D through the same code
    ((1, 2, 4, 4, 4), (2, 2, 2, 2, 2), {"padding": 1}),  # 3-D
]


def _torch_conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    nd = w.ndim - 2
    if isinstance(padding, tuple) and len(padding) == 2 * nd:  # torch-style flat pads: pad first, then conv
        x, padding = F.pad(x, padding), 0
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd](x, w, b, stride, padding, dilation, groups)


@pytest.mark.slow
@pytest.mark.parametrize("xs,ws,kw", CONV)
def test_conv2d(xs, ws, kw):
    b = V(data((ws[0],), seed=23))
    check(
        lambda x, w, b: x.conv2d(w, b, **kw),
        lambda x, w, b: _torch_conv(x, w, b, **kw),
        V(data(xs, seed=21)),
        V(data(ws, seed=22)),
        b,
    )


@pytest.mark.slow
def test_conv2d_noncontiguous_input():
    check(
        lambda x, w: x.conv2d(w),
        lambda x, w: F.conv2d(x, w),
        V(data((1, 5, 5, 2), seed=24), lambda t: t.permute(0, 3, 1, 2)),
        V(data((2, 2, 2, 2), seed=25)),
    )


def test_conv2d_wrong_channels_raises():
    with pytest.raises(ValueError, match="channels"):
        Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(4, 2, 3, 3))
    with pytest.raises(ValueError, match="channels"):
        Tensor.ones(1, 4, 5, 5).conv2d(Tensor.ones(4, 3, 3, 3), groups=2)


@pytest.mark.slow
def test_conv2d_kernel_count():
    x, w = Tensor(data((1, 2, 6, 6), seed=26)).realize(), Tensor(data((3, 2, 3, 3), seed=27)).realize()
    GlobalCounters.reset()
    x.conv2d(w, padding=1).realize()
    assert GlobalCounters.kernel_count <= 2


CONVT = [
    ((1, 2, 4, 4), (2, 3, 3, 3), {}),
    ((1, 2, 3, 3), (2, 2, 3, 3), {"stride": 2}),
    ((1, 2, 4, 4), (2, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
    ((1, 4, 3, 3), (4, 1, 2, 2), {"groups": 2, "dilation": 2}),
    ((2, 2, 5), (2, 3, 3), {"stride": 3, "padding": 1}),  # 1-D
]


@pytest.mark.slow
@pytest.mark.parametrize("xs,ws,kw", CONVT)
def test_conv_transpose2d(xs, ws, kw):
    fn = {3: F.conv_transpose1d, 4: F.conv_transpose2d}[len(ws)]
    b = V(data((ws[1] * kw.get("groups", 1),), seed=30))
    check(
        lambda x, w, b: x.conv_transpose2d(w, b, **kw),
        lambda x, w, b: fn(x, w, b, **kw),
        V(data(xs, seed=28)),
        V(data(ws, seed=29)),
        b,
    )


# ----------------------------------------------------------------------------- pooling

POOL = [
    {"kernel_size": (2, 2)},
    {"kernel_size": (3, 3), "stride": 2},
    {"kernel_size": (3, 2), "stride": (2, 1), "padding": 1},
    {"kernel_size": (3, 3), "stride": 2, "ceil_mode": True},
    {"kernel_size": (2, 2), "stride": 2, "padding": 1, "ceil_mode": True},
    {"kernel_size": (2, 3), "dilation": (2, 1)},
]


@pytest.mark.slow
@pytest.mark.parametrize("kw", POOL)
def test_max_pool2d(kw):
    x = V(data((1, 2, 7, 6), seed=31, distinct=True))
    check(lambda t: t.max_pool2d(**kw), lambda t: F.max_pool2d(t, **kw), x)
    check(lambda t: t.max_pool2d(**kw, return_indices=True), lambda t: F.max_pool2d(t, **kw, return_indices=True), x)


@pytest.mark.slow
@pytest.mark.parametrize("kw", [k for k in POOL if "dilation" not in k])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(kw, count_include_pad):
    check(
        lambda t: t.avg_pool2d(**kw, count_include_pad=count_include_pad),
        lambda t: F.avg_pool2d(t, **kw, count_include_pad=count_include_pad),
        V(data((2, 1, 7, 6), seed=32)),
    )


@pytest.mark.slow
def test_pool_1d_and_views():
    check(lambda t: t.max_pool2d((3,), 2), lambda t: F.max_pool1d(t, 3, 2), V(data((1, 2, 9), seed=33, distinct=True)))
    check(lambda t: t.avg_pool2d((2,)), lambda t: F.avg_pool1d(t, 2), V(data((1, 2, 8), seed=34)))
    check(
        lambda t: t.avg_pool2d(),
        lambda t: F.avg_pool2d(t, 2),
        V(data((1, 4, 4, 2), seed=35), lambda t: t.permute(0, 3, 1, 2)),
    )


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{"kernel_size": (2, 2)}, {"kernel_size": (3, 3), "stride": 2, "padding": 1}])
def test_max_unpool2d(kw):
    x = data((1, 2, 6, 6), seed=36, distinct=True)
    tv, ti = F.max_pool2d(torch.tensor(x), **kw, return_indices=True)
    zv, zi = Tensor(x).max_pool2d(**kw, return_indices=True)
    if "padding" not in kw:  # else torch's default output size (5x5) can't hold its own indices
        check(
            lambda v, i: v.max_unpool2d(i, **kw), lambda v, i: F.max_unpool2d(v, i, **kw), V(tv.numpy()), V(ti.numpy())
        )
    check(
        lambda v: v.max_unpool2d(zi, **kw, output_size=(6, 6)),
        lambda v: F.max_unpool2d(v, ti, **kw, output_size=(6, 6)),
        V(zv.numpy()),
        grad="padding" not in kw,
    )  # overlapping windows: torch passes each duplicate the whole gradient


@pytest.mark.parametrize(
    "size,mode,align",
    fast_first(
        [
            ((6,), "nearest", False),
            ((3,), "nearest", False),
            ((7,), "linear", False),
            ((7,), "linear", True),
            ((2,), "linear", False),
        ],
        unpack=True,
    ),
)
def test_interpolate_1d(size, mode, align):
    kw = {"align_corners": align} if mode == "linear" else {}
    check(
        lambda t: t.interpolate(size, mode, **kw),
        lambda t: F.interpolate(t, size, mode=mode, **kw),
        V(data((1, 2, 4), seed=37)),
    )


@pytest.mark.parametrize(
    "size,mode,align",
    fast_first(
        [((5, 7), "nearest", False), ((2, 3), "nearest", False), ((5, 7), "linear", False), ((6, 3), "linear", True)],
        unpack=True,
    ),
)
def test_interpolate_2d(size, mode, align):
    kw = {"align_corners": align} if mode == "linear" else {}
    tmode = "bilinear" if mode == "linear" else mode
    check(
        lambda t: t.interpolate(size, mode, **kw),
        lambda t: F.interpolate(t, size, mode=tmode, **kw),
        V(data((1, 2, 3, 4), seed=38)),
    )


# ----------------------------------------------------------------------------- normalization, attention, dropout


@pytest.mark.slow
def test_layernorm():
    check(lambda t: t.layernorm(), lambda t: F.layer_norm(t, (4,)), V(data((3, 4), seed=39)))
    check(
        lambda t: t.layernorm((1, 2), eps=1e-3),
        lambda t: F.layer_norm(t, (3, 4), eps=1e-3),
        V(data((2, 3, 4), seed=40)),
    )
    check(lambda t: t.layernorm(), lambda t: F.layer_norm(t, (3,)), V(data((3, 2), seed=41), lambda t: t.T))


def test_batchnorm():
    x, w, b = V(data((2, 3, 4), seed=42)), V(data((3,), seed=43)), V(data((3,), seed=44))
    mean, var = data((3,), seed=45), data((3,), 0.5, 2, seed=46)
    check(
        lambda x, w, b: x.batchnorm(w, b, Tensor(mean), Tensor(1 / np.sqrt(var + 1e-5))),
        lambda x, w, b: F.batch_norm(x, torch.tensor(mean), torch.tensor(var), w, b, eps=1e-5),
        x,
        w,
        b,
    )
    check(
        lambda x: x.batchnorm(None, None, Tensor(mean), Tensor(1 / np.sqrt(var + 1e-5))),
        lambda x: F.batch_norm(x, torch.tensor(mean), torch.tensor(var), eps=1e-5),
        x,
    )


@pytest.mark.parametrize("p,dim", fast_first([(2.0, 1), (1.0, 0), (3.0, -1)], unpack=True))
def test_normalize(p, dim):
    check(lambda t: t.normalize(p, dim), lambda t: F.normalize(t, p, dim), V(data((3, 4), seed=47)))


def test_dropout():
    x = Tensor.ones(1000)
    assert (x.dropout(0.5).numpy() == 1).all()  # not training: the identity
    with Tensor.train():
        Tensor.manual_seed(3)
        out = x.dropout(0.25).numpy()
        assert set(np.unique(out).tolist()) <= {0.0, float(np.float32(1 / 0.75))}
        assert 0.15 < (out == 0).mean() < 0.35
        assert (x.dropout(0.0).numpy() == 1).all() and (x.dropout(1.0).numpy() == 0).all()
    assert not Tensor.training
    with pytest.raises(ValueError):
        x.dropout(1.5)


def test_dropout_grad():
    with Tensor.train():
        x = Tensor.ones(64, requires_grad=True)
        y = x.dropout(0.5)
        y.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), y.numpy())  # the same mask scales the gradient


@pytest.mark.slow
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"}])
def test_scaled_dot_product_attention(kw):
    q, k, v = V(data((2, 2, 3, 4), seed=48)), V(data((2, 2, 5, 4), seed=49)), V(data((2, 2, 5, 3), seed=50))
    if kw.get("is_causal"):
        k, v = V(data((2, 2, 3, 4), seed=49)), V(data((2, 2, 3, 3), seed=50))
    mask = kw.get("mask")
    m = data((3, 5), "bool", seed=51) if mask == "bool" else data((3, 5), seed=51) if mask else None
    if mask == "bool":
        m[:, 0] = True
    zk = {"is_causal": True} if kw.get("is_causal") else {"attn_mask": Tensor(m)} if mask else {}
    tk = {"is_causal": True} if kw.get("is_causal") else {"attn_mask": torch.tensor(m)} if mask else {}
    with Context(NOOPT=1):  # see test_batched_softmax_matmul_backward_codegen
        check(
            lambda q, k, v: q.scaled_dot_product_attention(k, v, **zk),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **tk),
            q,
            k,
            v,
        )


def test_batched_softmax_matmul_backward_codegen():  # an UPCAST by 1 once broke the expander here
    qd, kd, wd = data((2, 3, 4), seed=69), data((2, 5, 4), seed=70), data((2, 3, 5), seed=71)
    q = Tensor(qd, requires_grad=True)
    ((q @ Tensor(kd).transpose(-2, -1)).softmax(-1) * Tensor(wd)).sum().backward()
    tq = torch.tensor(qd, requires_grad=True)
    ((tq @ torch.tensor(kd).transpose(-2, -1)).softmax(-1) * torch.tensor(wd)).sum().backward()
    np.testing.assert_allclose(q.grad.numpy(), tq.grad.numpy(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- classification and losses


def test_one_hot():
    y = data((2, 3), "int64", 0, 4, seed=52)
    check(lambda t: t.one_hot(5), lambda t: F.one_hot(t, 5), V(y))
    check(lambda t: t.one_hot(), lambda t: F.one_hot(t), V(y))
    with pytest.raises(TypeError):
        Tensor([1.0]).one_hot(3)


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_cross_entropy(reduction, ls):
    x, y = V(data((4, 5), seed=53)), V(data((4,), "int64", 0, 4, seed=54))
    check(
        lambda x, y: x.cross_entropy(y, reduction, ls),
        lambda x, y: F.cross_entropy(x, y, reduction=reduction, label_smoothing=ls),
        x,
        y,
    )
    probs = V(np.abs(data((4, 5), seed=55)) / np.abs(data((4, 5), seed=55)).sum(1, keepdims=True))
    check(
        lambda x, p: x.cross_entropy(p, reduction, ls),
        lambda x, p: F.cross_entropy(x, p, reduction=reduction, label_smoothing=ls),
        x,
        probs,
    )


@pytest.mark.slow
def test_cross_entropy_shapes():
    check(
        lambda x, y: x.cross_entropy(y),
        F.cross_entropy,
        V(data((2, 3, 4), seed=56)),
        V(data((2, 4), "int64", 0, 2, seed=57)),
    )
    check(lambda x, y: x.cross_entropy(y), F.cross_entropy, V(data((5,), seed=58)), V(np.array(3, np.int64)))


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction):
    x, y, w = V(data((4, 5), seed=59)), V(np.array([0, 4, 2, 2], np.int64)), V(data((5,), 0.5, 2, seed=60), grad=False)
    check(lambda x, y: x.nll_loss(y, reduction=reduction), lambda x, y: F.nll_loss(x, y, reduction=reduction), x, y)
    check(
        lambda x, y, w: x.nll_loss(y, w, reduction=reduction),
        lambda x, y, w: F.nll_loss(x, y, w, reduction=reduction),
        x,
        y,
        w,
    )
    check(
        lambda x, y: x.nll_loss(y, ignore_index=2, reduction=reduction),
        lambda x, y: F.nll_loss(x, y, ignore_index=2, reduction=reduction),
        x,
        y,
    )


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_sparse_categorical_crossentropy(reduction):
    x, y = V(data((4, 5), seed=61)), V(np.array([0, 4, -1, 2], np.int64))
    check(
        lambda x, y: x.sparse_categorical_crossentropy(y, reduction=reduction),
        lambda x, y: F.cross_entropy(x, y, ignore_index=-1, reduction=reduction),
        x,
        y,
    )
    y2 = V(np.array([0, 4, 3, 2], np.int64))
    check(
        lambda x, y: x.sparse_categorical_crossentropy(y, label_smoothing=0.1, reduction=reduction),
        lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1, reduction=reduction),
        x,
        y2,
    )


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(reduction):
    p, y = V(data((3, 4), 0.05, 0.95, seed=62)), V(data((3, 4), 0, 1, seed=63))
    check(
        lambda p, y: p.binary_crossentropy(y, reduction),
        lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction),
        p,
        y,
    )
    x = V(data((3, 4), -3, 3, seed=64))
    check(
        lambda x, y: x.binary_crossentropy_logits(y, reduction),
        lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction),
        x,
        y,
    )
    pw = V(data((4,), 0.5, 2, seed=65), grad=False)  # torch: no gradient for pos_weight
    check(
        lambda x, y, w: x.binary_crossentropy_logits(y, reduction, pos_weight=w),
        lambda x, y, w: F.binary_cross_entropy_with_logits(x, y, reduction=reduction, pos_weight=w),
        x,
        y,
        pw,
    )


def test_bad_reduction_raises():
    with pytest.raises(ValueError):
        Tensor.ones(2, 3).cross_entropy(Tensor([0, 1]), reduction="avg")


def test_sequential():
    w1, w2 = data((3, 4), seed=66), data((4, 2), seed=67)
    out = Tensor(data((2, 3), seed=68)).sequential([lambda t: t @ Tensor(w1), Tensor.relu, lambda t: t @ Tensor(w2)])
    exp = np.maximum(data((2, 3), seed=68) @ w1, 0) @ w2
    np.testing.assert_allclose(out.numpy(), exp, rtol=1e-5, atol=1e-6)


def test_sparse_categorical_crossentropy_batch16():
    """two sibling reduces inside an outer reduce, vectorized by the optimizer (was a cycle in the kernel graph)"""
    x, y = data((16, 10), seed=71), data((16,), "int64", 0, 9, seed=72)
    out = Tensor(x).sparse_categorical_crossentropy(Tensor(y)).numpy()
    np.testing.assert_allclose(out, F.cross_entropy(torch.tensor(x), torch.tensor(y)).numpy(), rtol=1e-5)


@pytest.mark.parametrize("loss", ["cross_entropy", "sparse_categorical_crossentropy"])
def test_a_class_index_loss_and_its_gradient_are_three_kernels(loss):
    """The loss over integer labels with its gradient: the rows' log-sum-exp (max and sum of exp in one kernel:
    schedule/policy.py, is_unhoistable_row_statistic), the mean over the rows, the gradient softmax - onehot reading
    x and the log-sum-exp (torch's log_softmax_backward, nn_ops._loss_log_softmax). Before: the max and the sum of
    exp, read by the primitives' gradient and inside the loss's reduce over the rows, each stored in a kernel: 4."""
    xn, yn = data((256, 10), seed=73), data((256,), "int64", 0, 9, seed=74)
    x, y = Tensor(xn, requires_grad=True).realize(), Tensor(yn).realize()
    out = getattr(x, loss)(y)
    out.backward()
    GlobalCounters.reset()
    Tensor.realize(out, x.grad)
    assert GlobalCounters.kernel_count == 3
    tx = torch.tensor(xn, requires_grad=True)
    tout = F.cross_entropy(tx, torch.tensor(yn))
    tout.backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shapes", [((256, 784), (784, 1024)), ((256, 512), (512, 10))])
def test_an_operand_copys_gradient_is_handed_straight_to_the_operand(shapes, monkeypatch):
    """The copy of w in column panels or transposed has w's gradient as its own (gradient.with_gradient): the
    gradient graph is the one of the product without the copy, not one with its movement ops undone at every
    backward (mlp_step: that cost more Python per step than the copies' kernels saved)."""
    rng = np.random.default_rng(3)
    xn, wn = (rng.standard_normal(s, dtype=np.float32) for s in shapes)

    def nodes():  # (the forward's nodes, the gradient's, the gradient)
        x, w = Tensor(xn), Tensor(wn, requires_grad=True)
        out = x @ w
        out.relu().sum().backward()
        return len(out.uop.toposort()), len(w.grad.uop.toposort()), w.grad.numpy()

    fwd, copied, g = nodes()
    # (on nn_ops, whose dot reads them: matmul_layout's own names are left as they are)
    monkeypatch.setattr(nn_ops, "_packs_right_operand", lambda x, w: False)
    monkeypatch.setattr(nn_ops, "_transposes_right_operand", lambda x, w: False)
    fwd_plain, plain, g_plain = nodes()
    assert fwd > fwd_plain  # the copy's nodes, which the gradient reads through the forward's product
    assert copied - plain == fwd - fwd_plain  # and no more: before, its movement ops undone (panels: 5 -> 9)
    np.testing.assert_allclose(g, g_plain, rtol=1e-5, atol=1e-4)


def test_a_transposed_left_operand_with_rows_a_page_apart_is_read_from_row_panels():
    """A.T @ g with A (K, M) stored, its rows a page or more apart (a weight gradient's x.T @ g, attention's k.T @ g),
    reads A.T from a copy in panels of 16 rows (one kernel more) whose walk down K is sequential, not a few floats of
    every row of A in a few cache sets; values and gradients as torch's. Short walks, narrow products, rows closer
    than a page or not a whole number of panels, and computed operands read A.T in place."""
    rng = np.random.default_rng(0)
    an, gn = rng.standard_normal((128, 1024), dtype=np.float32), rng.standard_normal((128, 64), dtype=np.float32)
    a, g = Tensor(an, requires_grad=True), Tensor(gn, requires_grad=True)
    assert _kernels(a.T @ g) == 2
    at, gt = torch.tensor(an, requires_grad=True), torch.tensor(gn, requires_grad=True)
    (a.T @ g).square().sum().backward()
    (at.T @ gt).square().sum().backward()
    np.testing.assert_allclose((a.T @ g).numpy(), (at.T @ gt).detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(a.grad.numpy(), at.grad.numpy(), rtol=1e-3, atol=1e-2)
    np.testing.assert_allclose(g.grad.numpy(), gt.grad.numpy(), rtol=1e-3, atol=1e-2)
    assert _kernels(Tensor.empty(2048, 2048).realize().T @ Tensor.empty(2048, 64).realize()) == 2
    assert _kernels(a[:64].T @ g[:64]) == 1  # a walk of 64 rows stays in L1
    assert _kernels(a.T @ g[:, :32]) == 1  # too few columns share the copy
    assert _kernels(a[:, :512].T @ g) == 1  # rows 2 KiB apart
    assert _kernels(a[:, :1000].T @ g) == 1  # not a whole number of panels
    assert not matmul_layout._packs_left_operand((a * 2).T, g)  # computed: the copy would be its materialization


def test_a_deep_right_operand_is_read_from_column_panels_from_64_rows():
    """From a depth of 1024, B's rows a page or more apart, 64 rows of A share B's column panels (q.T @ A, (64,
    2048) x (2048, 2048)): the walk down K falls out of L2 and every row tile walks it again; not at a depth of 512."""
    a, b = Tensor.empty(2048, 64).realize(), Tensor.empty(2048, 2048).realize()
    assert _kernels(a.T @ b) == 2 and _kernels(Tensor.empty(64, 1024).realize() @ b[:1024, :1024]) == 2
    assert _kernels(Tensor.empty(64, 512).realize() @ b[:512, :1024]) == 1
    assert _kernels(Tensor.empty(32, 2048).realize() @ b) == 1  # 32 rows: too few to share the copy
    rng = np.random.default_rng(0)
    xn, wn = rng.standard_normal((64, 1024), dtype=np.float32), rng.standard_normal((1024, 1024), dtype=np.float32)
    np.testing.assert_allclose((Tensor(xn) @ Tensor(wn)).numpy(), xn @ wn, rtol=1e-4, atol=1e-3)
