"""Linearize: loops in an order that keeps each reduce's accumulator and its loops together, and the linear
program's scope check (uop/spec.py `check_linear`): a value computed inside a loop is not read after the loop.

The case: the gradient of `max` over a slice of a sum, found by the property test. Its backward kernel computed, for
each output, one sum (the compared value) and a max over sums (the row's max), two reduces initialised in the same
loop. The max's loop opened first and the sum's loop opened inside it, so the sum added up once per row of the max
with its accumulator set only once, and was read after the max's loop closed: invalid LLVM IR and uncompilable C,
and a silently wrong gradient on PYTHON.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.backend.conftest import unavailable
from zeptograd import Tensor, dtypes
from zeptograd.codegen import full_rewrite
from zeptograd.device import Device
from zeptograd.engine.realize import schedule_tensors
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.spec import SpecError, check_linear

X = np.random.default_rng(0).standard_normal((4, 4, 3)).astype(np.float32)


def max_grad_by_hand(x, mx, sl, pad):
    """The gradient of sl(x.permute(1, 0, 2).sum(0)).max(0) written out (autograd stores the max's input now, which
    gives other kernels): each element's share of the max, back through the slice, the sum and the permute."""
    s = sl(x.permute(1, 0, 2).sum(0))  # (4, 1)
    is_max = (s == mx(s)).float()
    g = pad(is_max / is_max.sum(0, keepdim=True))  # (4, 3)
    return g.reshape(1, 4, 3).expand(4, 4, 3).permute(1, 0, 2)


def zg_grad(device: str) -> Tensor:
    x = Tensor(X, device=device)
    return max_grad_by_hand(
        x, lambda s: s.max(0, keepdim=True), lambda s: s[:, 2:1:-1], lambda g: g.pad(((0, 0), (2, 0)))
    )


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON", "CL"])
def test_gradient_of_a_max_over_a_sliced_sum(device):
    if (why := unavailable(device)) is not None:
        pytest.skip(why)
    pad = torch.nn.functional.pad
    want = max_grad_by_hand(
        torch.tensor(X), lambda s: s.amax(0, keepdim=True), lambda s: s[:, 2:3], lambda g: pad(g, (2, 0))
    )
    np.testing.assert_allclose(zg_grad(device).numpy(), want.numpy(), rtol=1e-6)
    x, xt = Tensor(X, device=device, requires_grad=True), torch.tensor(X, requires_grad=True)  # and by autograd
    x.permute(1, 0, 2).sum(0)[:, 2:1:-1].max(0).sum().backward()
    xt.permute(1, 0, 2).sum(0)[:, 2:3].max(0).values.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-6)


def _loops_around(uops: list[UOp]) -> dict[UOp, tuple[UOp, ...]]:
    """Each UOp -> the loops open where it is placed, outermost first."""
    open_loops: list[UOp] = []
    around = {}
    for u in uops:
        if u.op is Ops.END:
            del open_loops[len(open_loops) - sum(s.op is Ops.RANGE for s in u.src[1:]) :]
        around[u] = tuple(open_loops)
        if u.op is Ops.RANGE:
            open_loops.append(u)
    return around


def test_each_reduce_loop_opens_where_its_accumulator_is_initialised():
    # the gradient's share of the max before its pad: the pad's gate would store the reduces it reads (each would
    # run at every padded column), so this kernel keeps the sum, the max and the count together
    s = Tensor(X).permute(1, 0, 2).sum(0)[:, 2:1:-1]
    is_max = (s == s.max(0, keepdim=True)).float()
    items = [i for i in schedule_tensors([is_max / is_max.sum(0, keepdim=True)]) if i.ast.op is Ops.SINK]
    kernels = [full_rewrite(i.ast, Device["CPU"].renderer)[0] for i in items]
    two_reduces = [k for k in kernels if sum(u.op is Ops.DEFINE_REG for u in k) >= 2]
    assert two_reduces, "the backward has a kernel with two accumulators"
    for uops in two_reduces:
        around = _loops_around(uops)
        for after in (u for u in uops if u.op is Ops.AFTER):
            init = [s for s in after.src[1:] if s.op is Ops.STORE]
            loops = [s for s in after.src[1:] if s.op is Ops.RANGE]
            for store in init:
                # the reduce's outermost loop is opened in the loops its accumulator's init was placed in
                assert around[min(loops, key=uops.index)] == around[store]


def test_check_linear_refuses_a_value_read_after_its_loop():
    r = UOp.range(4, 0)
    inside = r.cast(dtypes.float32) * 2.0
    reg = UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1), (), 0)
    store = UOp(Ops.STORE, dtypes.void, (reg.index(UOp.const(dtypes.int32, 0)), inside))
    end = store.end(r)
    after_loop = inside + 1.0
    loop = list(end.toposort())  # the loop, in a valid order: RANGE ... END
    late = [u for u in after_loop.toposort() if u not in set(loop)]
    check_linear(loop)
    with pytest.raises(SpecError, match="after the loop that computes them"):
        check_linear(loop + late)


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON"])
def test_reduce_used_inside_another_reduce_runs_before_it(device):
    """The gradient of (x @ b).cumsum(0).sum(1), found by the property test: two reduces ready side by side inside a
    third, the second used inside the first. Opened first, the first could not close until the second ran, and the
    second could not open inside it (its accumulator starts outside): it runs first."""
    if (why := unavailable(device)) is not None:
        pytest.skip(why)
    xn = np.random.default_rng(1).standard_normal((2, 3, 1)).astype(np.float32)
    bn = np.random.default_rng(2).standard_normal((1, 2)).astype(np.float32)
    w = np.random.default_rng(3).uniform(-1, 1, (2, 2)).astype(np.float32)
    x, b = Tensor(xn, device=device, requires_grad=True), Tensor(bn, device=device, requires_grad=True)
    ((x @ b).cumsum(0).sum(axis=1) * Tensor(w, device=device)).sum().backward()
    xt, bt = torch.tensor(xn, requires_grad=True), torch.tensor(bn, requires_grad=True)
    ((xt @ bt).cumsum(0).sum(1) * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), bt.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n, ops", [(3, ("abs", "sin", "abs")), (2, ("abs", "abs", "sin"))])
def test_no_order_edge_puts_a_loop_before_the_reduce_it_is_inside(n, ops):
    """The gradient of an expanded matmul's elementwise tail, found by the property profile: a reduce nested inside
    another reduce's loop must not be ordered before it (an ordering edge there made a cycle, or closed loops out of
    their nesting)."""
    xn = np.random.default_rng(4).standard_normal((4, 1)).astype(np.float32)
    bn = np.random.default_rng(5).standard_normal((1, 2)).astype(np.float32)
    x, b = Tensor(xn, requires_grad=True), Tensor(bn, requires_grad=True)
    xt, bt = torch.tensor(xn, requires_grad=True), torch.tensor(bn, requires_grad=True)
    y, yt = (x + 0.5).reshape(1, 4, 1).expand(n, 4, 1) @ b, (xt + 0.5).reshape(1, 4, 1).expand(n, 4, 1) @ bt
    for op in ops:
        y, yt = getattr(y, op)(), getattr(yt, op)()
    w = np.random.default_rng(6).uniform(-1, 1, y.shape).astype(np.float32)
    (y * Tensor(w)).sum().backward()
    (yt * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), xt.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad.numpy(), bt.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_loop_with_an_accumulator_of_another_kind_is_hoisted_like_a_reduce():
    """A boolean-mask index's kernel keeps an UNROLL range as a loop with an accumulator: ordered as a reduce's loop
    (before the output loops it does not vary along), it opens where its accumulator starts (it waited: an error)."""
    xn = np.random.default_rng(5).standard_normal((4, 5)).astype(np.float32)
    mask = np.array([True, False, True, True])
    np.testing.assert_array_equal(Tensor(xn)[Tensor(mask)].numpy(), xn[mask])


X23 = np.array([[0.54784673, -0.92085314, -1.836106], [-1.9338895, 1.253081, 1.6510223]], np.float32)
M22 = np.array([[0.54784673, -0.92085314], [-1.836106, -1.9338895]], np.float32)
X222 = np.stack([M22, M22[::-1] * 0.5])
CAT_AND_PAD_PROGRAMS = {  # zeptograd, numpy
    "cat_of_padded_sum": (
        lambda x, T: (s := x.pad(((0, 0), (2, 1))).sum(axis=0)).cat(2 * s, dim=0),
        lambda: np.concatenate([s := np.pad(X23, ((0, 0), (2, 1))).sum(0), 2 * s]),
        X23,
    ),
    "sum_of_cat_of_padded_sum": (
        lambda x, T: (s := x.pad(((0, 0), (2, 1))).sum(axis=0).abs()).cat(2 * s, dim=0).sum(axis=0),
        lambda: np.concatenate([s := np.abs(np.pad(X23, ((0, 0), (2, 1))).sum(0)), 2 * s]).sum(0),
        X23,
    ),
    "padded_matmul_matmul": (
        lambda x, T: (x @ T(M22[:, :1])).pad(((1, 0), (0, 0), (0, 1))) @ T(M22),
        lambda: np.pad(X222 @ M22[:, :1], ((1, 0), (0, 0), (0, 1))) @ M22,
        X222,
    ),
    "padded_row_matmul": (
        lambda x, T: x.reshape(1, 1, 2).pad(((1, 0), (0, 1), (0, 0))) @ T(M22),
        lambda: np.pad(X23[0, :2].reshape(1, 1, 2), ((1, 0), (0, 1), (0, 0))) @ M22,
        X23[0, :2],
    ),
}


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON", "CL"])
@pytest.mark.parametrize("name", list(CAT_AND_PAD_PROGRAMS))
def test_reduces_sharing_a_loop_run_where_any_of_them_varies(name, device):
    """Found by the property profile on a 16-core machine: after an upcast, two reduces over the same ranges (a cat's
    halves, a padded matmul's parts) share one loop, and one of them does not vary along an output loop the other
    reads. The accumulator pass keyed each reduce's loops by its ranges, so the second one's scope replaced the
    first's: the shared loop's accumulators were set up outside that output loop while one of them read it (a cycle,
    or an END closing a loop that was not innermost). The shared loop now runs in the loops any of them varies along."""
    if (why := unavailable(device)) is not None:
        pytest.skip(why)
    zg, ref, x = CAT_AND_PAD_PROGRAMS[name]
    got = zg(Tensor(x, device=device), lambda a: Tensor(a, device=device)).numpy()
    np.testing.assert_allclose(got, ref(), rtol=1e-5, atol=1e-5)
