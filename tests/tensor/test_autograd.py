"""Autograd: requires_grad, backward, .grad, gradient(), detach, no_grad, train; against torch 2.13 (CPU)."""

import sys

import numpy as np
import pytest
import torch

from tests.tensor.api_helpers import data
from zeptograd import Tensor, dtypes, gradient
from zeptograd.gradient import pm_gradient
from zeptograd.uop.ops import Ops


def test_backward_accumulates_into_grad():
    x = data((3, 4), seed=1)
    z = Tensor(x, requires_grad=True)
    t = torch.tensor(x, requires_grad=True)
    for _ in range(2):  # .grad accumulates over backward calls, as torch
        (z * z).sum().backward()
        (t * t).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-6)
    assert z.grad.dtype == dtypes.float32 and z.grad.shape == (3, 4)


def test_requires_grad_flags():
    x = Tensor([1.0, 2.0])
    assert x.requires_grad is None and x.grad is None
    assert x.requires_grad_() is x and x.requires_grad is True
    y = x * 2
    assert y.requires_grad is True
    assert (Tensor([1.0]) * 2).requires_grad is None
    assert x.detach().requires_grad is False
    for ctor in (
        lambda: Tensor.zeros(3, requires_grad=True),
        lambda: Tensor.ones(2, 2, requires_grad=True),
        lambda: Tensor.full((2,), 3.0, requires_grad=True),
        lambda: Tensor.rand(3, requires_grad=True),
        lambda: Tensor.randn(3, requires_grad=True),
        lambda: Tensor(2.0, requires_grad=True),
        lambda: Tensor.eye(2, requires_grad=True),
        lambda: Tensor.arange(3.0, requires_grad=True),
        lambda: Tensor.uniform(3, requires_grad=True),
        lambda: Tensor.empty(2, requires_grad=True),
    ):
        assert ctor().requires_grad is True


def test_constants_requiring_grad_are_distinct():
    """two equal constants that require grad are two leaves (constants are interned, so each gets a buffer)"""
    a, b = Tensor.ones(3, requires_grad=True), Tensor.ones(3, requires_grad=True)
    (a * 2 + b * 3).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [2, 2, 2])
    np.testing.assert_array_equal(b.grad.numpy(), [3, 3, 3])
    c = Tensor(4.0, requires_grad=True)
    (c * c).backward()
    assert c.grad.item() == 8.0


@pytest.mark.slow
def test_backward_with_gradient_argument():
    x = data((2, 3), seed=2)
    g = data((2, 3), seed=3)
    z, t = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    z.exp().backward(Tensor(g))
    t.exp().backward(torch.tensor(g))
    np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-5)


def test_backward_non_scalar_raises():
    x = Tensor.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="non-scalar"):
        (x * 2).backward()
    with pytest.raises(ValueError):
        (x * 2).backward(Tensor.ones(4))


def test_backward_without_grad_leaves_raises():
    with pytest.raises(RuntimeError, match="requires grad"):
        (Tensor([1.0, 2.0]) * 2).sum().backward()


def test_gradient_returns_list():
    x, y = Tensor(data((3,), seed=4)), Tensor(data((3,), seed=5))
    loss = (x * y).sum()
    gx, gy = loss.gradient(x, y)
    np.testing.assert_allclose(gx.numpy(), data((3,), seed=5))
    np.testing.assert_allclose(gy.numpy(), data((3,), seed=4))
    assert isinstance(loss.gradient(x), list)
    (gxx,) = (x * x).gradient(x, gradient=Tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(gxx.numpy(), 2 * data((3,), seed=4) * [1, 2, 3], rtol=1e-6)


def test_gradient_not_in_graph_raises():
    x, other = Tensor([1.0, 2.0]), Tensor([3.0, 4.0])
    with pytest.raises(ValueError, match="not in the graph"):
        (x * 2).sum().gradient(other)


def test_gradient_blocked_by_detach_is_zero():
    x = Tensor([1.0, 2.0])
    (g,) = (x.detach() * x).sum().gradient(x)  # only the non-detached path counts
    np.testing.assert_array_equal(g.numpy(), [1.0, 2.0])
    (g0,) = (x.detach() * 2 + x.sum() * 0).sum().gradient(x)
    np.testing.assert_array_equal(g0.numpy(), [0.0, 0.0])


def test_no_grad():
    w = Tensor([1.0, 2.0], requires_grad=True)
    with Tensor.no_grad():
        frozen = w * 3
    assert frozen.requires_grad is not True
    (frozen * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [3.0, 6.0])  # no gradient through `frozen`

    @Tensor.no_grad()
    def step(p):
        p.assign(p - 0.5 * p.grad)

    step(w)
    np.testing.assert_array_equal(w.numpy(), [-0.5, -1.0])


def test_train_context():
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(False):
            assert Tensor.training is False
        assert Tensor.training is True
    assert Tensor.training is False


def test_backward_after_realize_and_item():
    """reading a value (item/numpy) keeps the graph for backward, as torch"""
    x = data((4,), seed=6)
    z, t = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    zl, tl = (z.exp() * z).sum(), (t.exp() * t).sum()
    assert abs(zl.item() - tl.item()) < 1e-4
    mid = z.exp().realize()
    (mid * 2).sum().backward()
    zl.backward()
    tl.backward()
    (t.exp() * 2).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-5)


@pytest.mark.slow
def test_training_loop_matches_torch():
    """a small MLP trained for 3 SGD steps: the same weights as torch"""
    rng = np.random.default_rng(7)
    xs, ys = rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, size=8)
    w1, w2 = rng.normal(size=(4, 5)).astype(np.float32) * 0.5, rng.normal(size=(5, 3)).astype(np.float32) * 0.5
    zw = [Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)]
    tw = [torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)]
    for _ in range(3):
        zl = (Tensor(xs) @ zw[0]).gelu("none").matmul(zw[1]).cross_entropy(Tensor(ys))
        tl = torch.nn.functional.cross_entropy(
            torch.nn.functional.gelu(torch.tensor(xs) @ tw[0]) @ tw[1], torch.tensor(ys)
        )
        zl.backward()
        tl.backward()
        with Tensor.no_grad():
            for p in zw:
                p.assign(p - 0.1 * p.grad)
                p.grad = None
            Tensor.realize(zl, *zw)  # one schedule: the loss reads the weights before the step overwrites them
        with torch.no_grad():
            for p in tw:
                p -= 0.1 * p.grad
                p.grad = None
        np.testing.assert_allclose(zl.numpy(), tl.detach().numpy(), rtol=1e-4, atol=1e-6)
    for z, t in zip(zw, tw):
        np.testing.assert_allclose(z.numpy(), t.detach().numpy(), rtol=1e-4, atol=1e-5)
        assert z.requires_grad and (z * 2).requires_grad


def test_realized_update_leaves_the_leaf_on_its_buffer():
    """a leaf realized with its update (an SGD step written by hand) is its buffer again, requiring grad: the next
    step's graph is built on no realized node (the scheduler substitutes nothing, walks once)"""
    from zeptograd.engine import realize, schedule_cache

    w = Tensor([1.0, 2.0, 3.0], requires_grad=True).realize()
    x = Tensor([0.5, -1.0, 2.0])
    for _ in range(2):
        loss = (w * x).sum()
        loss.backward()
        w.assign(w.detach() - 0.5 * w.grad)
        Tensor.realize(loss, w)
        w.grad = None
        assert w.uop.op is not Ops.ASSIGN and w.requires_grad and (w * 2).requires_grad
        nxt = (w * x).sum()
        assert schedule_cache.walk([nxt.uop], realize._realized) is not None  # no realized node in the graph
    np.testing.assert_allclose(w.numpy(), [0.5, 3.0, 1.0])


def test_graph_built_on_a_realized_update_reaches_the_leaf():
    """a graph built on a leaf's pending write, realized later, still differentiates to the leaf, as torch (where the
    write is an in-place update under no_grad)"""
    z = Tensor([1.0, 2.0], requires_grad=True).realize()
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    z.assign(z.detach() * 3)
    with torch.no_grad():
        t.mul_(3)
    zy, ty = (z * z).sum(), (t * t).sum()
    z.realize()
    assert z.uop.op is not Ops.ASSIGN
    zs = (z * 5).sum()  # one more path, built on the leaf's new buffer
    (zy + zs).backward()
    (ty + (t * 5).sum()).backward()
    np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-6)
    (g,) = zy.gradient(z)
    np.testing.assert_allclose(g.numpy(), [6.0, 12.0], rtol=1e-6)
    lazy = Tensor.ones(3, requires_grad=True)  # a lazy leaf is an ASSIGN into a new buffer: read, then backward
    y = (lazy * 2).sum()
    lazy.numpy()
    y.backward()
    np.testing.assert_array_equal(lazy.grad.numpy(), [2.0, 2.0, 2.0])


def test_higher_order():
    x = Tensor([0.5, 1.5], requires_grad=True)
    (g,) = (x * x * x).sum().gradient(x)
    (gg,) = g.sum().gradient(x)
    np.testing.assert_allclose(gg.numpy(), 6 * np.array([0.5, 1.5]), rtol=1e-6)


@pytest.mark.slow
def test_deep_graph_backward_no_recursion():
    """backward walks the toposort, not the graph's depth"""
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x
    for i in range(3000):
        y = y * 1.0001 if i % 2 else y + 0.001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001**1500] * 2, rtol=1e-4)


def test_int_paths_have_no_gradient():
    x = Tensor([1.5, -2.5], requires_grad=True)
    y = x * x.floor() + x.cast(dtypes.int32).cast(dtypes.float32) + (x > 0).where(x, 0)
    y.sum().backward()
    t = torch.tensor([1.5, -2.5], requires_grad=True)
    (t * t.floor() + t.int().float() + torch.where(t > 0, t, 0)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy())


def test_one_rule_per_primitive():
    """the backward rules are one PatternMatcher over the primitive ops"""
    for op in (
        Ops.ADD,
        Ops.MUL,
        Ops.MAX,
        Ops.REDUCE_AXIS,
        Ops.RESHAPE,
        Ops.PERMUTE,
        Ops.EXPAND,
        Ops.PAD,
        Ops.SHRINK,
        Ops.FLIP,
        Ops.EXP2,
        Ops.LOG2,
        Ops.SIN,
        Ops.SQRT,
        Ops.RECIPROCAL,
        Ops.WHERE,
        Ops.CAST,
    ):
        assert op in pm_gradient.pdict, f"no gradient rule for {op}"


def test_hand_written_sgd_loop_reading_the_loss_matches_torch():
    """The bench's eager step (update by `p.assign(p.detach() - lr * p.grad)`, the loss realized with the update and
    read after it): each step's loss is torch's. (Once the write's schedule came from the cache it gave the weight
    back its old BUFFER node, and a loss graph realized from the old values, kept alive for backward, answered for
    a later step's: losses repeated.)"""
    rng = np.random.default_rng(3)
    x, w0 = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32) * 0.5
    labels = rng.integers(0, 3, size=8)
    onehot = np.eye(3, dtype=np.float32)[labels]
    zw, tw = Tensor(w0, requires_grad=True).realize(), torch.tensor(w0, requires_grad=True)
    zx, zy = Tensor(x), Tensor(onehot)

    def step():
        loss = -((zx @ zw).log_softmax(1) * zy).sum(1).mean()
        loss.backward()
        zw.assign(zw.detach() - 0.1 * zw.grad)
        Tensor.realize(loss, zw)
        zw.grad = None
        return loss

    for _ in range(5):
        zl = step().item()
        tl = torch.nn.functional.cross_entropy(torch.tensor(x) @ tw, torch.tensor(labels))
        tl.backward()
        with torch.no_grad():
            tw -= 0.1 * tw.grad
            tw.grad = None
        assert zl == pytest.approx(tl.item(), rel=1e-5)
    np.testing.assert_allclose(zw.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_grad_after_backward_does_not_require_grad():
    # torch: a leaf's .grad after backward() (no create_graph) is detached, even where the gradient reads the leaf
    # (w * w, a relu mask); so is the hand-written update built from it, and an accumulated .grad
    x = data((4, 5), seed=2)
    w1, w2 = data((5, 6), seed=3), data((6, 3), seed=4)
    zw1, zw2 = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
    tw1, tw2 = torch.tensor(w1, requires_grad=True), torch.tensor(w2, requires_grad=True)
    for _ in range(2):
        ((Tensor(x) @ zw1).relu() @ zw2 * (zw2 * zw2).sum()).sum().backward()
        ((torch.tensor(x) @ tw1).relu() @ tw2 * (tw2 * tw2).sum()).sum().backward()
    for z, t in ((zw1, tw1), (zw2, tw2)):
        assert t.grad.requires_grad is False and not z.grad.requires_grad  # (None: tinygrad's "not asked for")
        assert not (z.detach() - 0.1 * z.grad).requires_grad
        np.testing.assert_allclose(z.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def _movement_and_sum_calls_in_backward(loss):
    """The calls of Tensor.reshape/expand/permute/sum that the gradient rules (gradient.py) make in the backward of
    `loss` (the Tensor ops they call may call these too: broadcasting, with a Variable bound)."""
    calls = []
    saved = {name: getattr(Tensor, name) for name in ("reshape", "expand", "permute", "sum")}

    def counting(name):
        def method(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename == gradient.__file__:
                calls.append(name)
            return saved[name](self, *args, **kwargs)

        return method

    try:
        for name in saved:
            setattr(Tensor, name, counting(name))
        loss.backward()
    finally:
        for name, method in saved.items():
            setattr(Tensor, name, method)
    return calls


def _log_softmax_mlp(np_dtype=np.float32):
    rng = np.random.default_rng(3)
    x = Tensor(rng.standard_normal((8, 6)).astype(np_dtype)).realize()
    y = Tensor(rng.standard_normal((8, 3)).astype(np_dtype)).realize()
    ws = [Tensor(rng.standard_normal(s).astype(np_dtype), requires_grad=True) for s in ((6, 5), (5,), (5, 3))]
    logits = (x @ ws[0] + ws[1]).relu() @ ws[2]
    m = logits.max(axis=1, keepdim=True)
    return -((logits - m - (logits - m).exp().sum(axis=1, keepdim=True).log()) * y).sum(axis=1).mean(), ws


@pytest.mark.parametrize("variables_bound", [False, True])
def test_gradient_rules_build_movements_and_sums_without_the_tensor_methods(variables_bound, monkeypatch):
    """The rules of RESHAPE, EXPAND, PERMUTE and REDUCE take their shapes from forward nodes, valid by construction:
    an MLP's backward builds its movements and sums without the Tensor methods' argument checks (eager training
    builds the gradient graph on every step), and the graph is the one the methods build. So it does once a
    Variable was bound somewhere (its shapes hold none)."""
    from zeptograd.uop import variable

    monkeypatch.setattr(variable, "in_use", variables_bound)
    loss, ws = _log_softmax_mlp()
    assert _movement_and_sum_calls_in_backward(loss) == []
    fast = [w.grad.uop for w in ws]
    for w in ws:
        w.grad = None
    saved = (gradient._reshape, gradient._expand, gradient._permute, gradient._sum_keepdim)
    try:  # the rules through the Tensor methods: the same nodes (interned: the same objects)
        gradient._reshape = lambda t, shape: t.reshape(shape)
        gradient._expand = lambda t, shape: t.expand(shape)
        gradient._permute = lambda t, order: t.permute(order)
        gradient._sum_keepdim = lambda t, axes: t.sum(axes, keepdim=True)
        loss.backward()
    finally:
        gradient._reshape, gradient._expand, gradient._permute, gradient._sum_keepdim = saved
    assert all(w.grad.uop is u for w, u in zip(ws, fast))


def test_half_gradient_sums_accumulate_in_float32_as_before():
    """A half gradient's sum takes Tensor.sum (float32 accumulation, cast back), not the rules' direct node."""
    loss, ws = _log_softmax_mlp(np.float16)
    assert "sum" in _movement_and_sum_calls_in_backward(loss)
    loss32, ws32 = _log_softmax_mlp()
    loss32.backward()
    for w, w32 in zip(ws, ws32):
        assert w.grad.dtype == dtypes.float16
        np.testing.assert_allclose(w.grad.numpy().astype(np.float32), w32.grad.numpy(), rtol=2e-2, atol=2e-3)


def test_no_rule_runs_for_a_leafs_own_node(monkeypatch):
    """A 2-D weight's node is a reshape of its buffer; its gradient is the weight's, and the reshape's rule (a
    gradient for the buffer node, which nothing reads) is not applied."""
    w = Tensor(np.ones((3, 4), dtype=np.float32), requires_grad=True)
    x = Tensor(np.ones((4, 2), dtype=np.float32))
    applied = []

    class Recording:
        def rewrite(self, u, ctx=None):
            applied.append(u)
            return pm_gradient.rewrite(u, ctx=ctx)

    monkeypatch.setattr(gradient, "pm_gradient", Recording())
    (w @ x).sum().backward()
    assert w.uop.op is Ops.RESHAPE and applied and w.uop not in applied
    np.testing.assert_allclose(w.grad.numpy(), np.full((3, 4), 2.0))


def test_relu_gradient_at_special_values_is_torchs():
    """relu's gradient rule reads the output (gradient.py): as torch's threshold_backward, 0 where the output is 0
    (x <= 0, -0.0, -inf) and the gradient itself where it is nan or positive."""
    x = np.array([np.nan, -0.0, 0.0, 1.5, -1.0, np.inf, -np.inf, 1e-30], np.float32)
    g = np.arange(1, 9, dtype=np.float32)
    zx, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (zx.relu() * Tensor(g)).sum().backward()
    (torch.relu(tx) * torch.tensor(g)).sum().backward()
    np.testing.assert_array_equal(zx.grad.numpy(), tx.grad.numpy())


def test_a_hand_written_relu_where_has_wheres_gradient():
    """relu's own gradient rule (none at 0) is relu's: (x < 0).where(0, x) written by hand is a where, whose gradient
    torch passes at 0 and -0.0."""
    x = np.array([-1.0, -0.0, 0.0, 2.0], np.float32)
    zx, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (zx < 0).where(0, zx).sum().backward()
    torch.where(tx < 0, 0.0, tx).sum().backward()
    np.testing.assert_array_equal(zx.grad.numpy(), tx.grad.numpy())


def test_relu6_values_and_gradient_at_its_bounds_are_torchs():
    """torch's relu6 is hardtanh(0, 6): no gradient at 0 or 6, nan passes, -0.0 keeps its sign."""
    x = np.array([-1.0, -0.0, 0.0, 3.0, 6.0, 7.0, np.nan, np.inf], np.float32)
    zx, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    zy, ty = zx.relu6(), torch.nn.functional.relu6(tx)
    zy.sum().backward()
    ty.sum().backward()
    np.testing.assert_array_equal(zy.numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(np.signbit(zy.numpy()), np.signbit(ty.detach().numpy()))
    np.testing.assert_array_equal(zx.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gelu_gradient_in_half_dtypes_is_computed_in_float32_as_torch(dtype):
    """In float16, 1 - sigmoid(2u) is 0 from x ~ 2.5 on: computed in float16 the tanh GELU's gradient loses its
    second term there (0.0059 off torch at x = 3.25); torch computes it in float32 and rounds once."""
    from zeptograd import dtypes

    x = np.linspace(-12, 12, 4001).astype(np.float32)
    zx = Tensor(x, dtype=getattr(dtypes, dtype), requires_grad=True)
    tx = torch.tensor(x).to(getattr(torch, dtype)).requires_grad_(True)
    zx.gelu().sum().backward()
    torch.nn.functional.gelu(tx, approximate="tanh").sum().backward()
    assert zx.grad.dtype == getattr(dtypes, dtype)
    got, want = zx.grad.cast(dtypes.float32).numpy(), tx.grad.float().numpy()
    ulp = 2.0**-10 if dtype == "float16" else 2.0**-7  # one ulp at 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=ulp)
