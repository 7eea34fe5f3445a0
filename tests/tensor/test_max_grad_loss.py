"""A max whose input requires grad, and the hand-written log-softmax loss built on it: its gradient compares the input
with the max (`x == max`), so the input is stored once (tensor/reduce.py), in a buffer of its own: a later assign to
the tensor it was computed as must not change it.
Values and gradients are torch's, rows of -inf, huge logits and nans included."""

import numpy as np
import pytest
import torch

from zeptograd import Device, GlobalCounters, Tensor

ROWS, K, CLASSES = 256, 32, 10


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((ROWS, K), dtype=np.float32)
    w = rng.standard_normal((K, CLASSES), dtype=np.float32)
    y = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, ROWS)]
    return a, w, y


def _close(got: Tensor, want: torch.Tensor):
    """Equal to float32 rounding of sums that cancel: relative to the largest element (a wrong max is off by it)."""
    w = want.detach().numpy()
    np.testing.assert_allclose(got.numpy(), w, rtol=1e-4, atol=1e-5 * max(float(np.abs(w).max()), 1e-30))


def _kernels(*ts: Tensor) -> int:
    GlobalCounters.reset()
    Tensor.realize(*ts)
    return GlobalCounters.kernel_count


@pytest.mark.parametrize("biased_output", [False, True])
def test_a_max_of_a_product_with_its_gradient(biased_output):
    """(a @ w).max(1) with a gradient: the max's input is stored once (its own copy, tensor/reduce.py), so the max and
    its gradient compare the same bits. Kernels: the product, its copy, the max with the loss, the gradient of the
    product, a's gradient, w's gradient."""
    an, wn, _ = _data()
    bn = np.linspace(-1, 1, CLASSES, dtype=np.float32)
    a, w = Tensor(an, requires_grad=True).realize(), Tensor(wn, requires_grad=True).realize()
    ta, tw = torch.tensor(an, requires_grad=True), torch.tensor(wn, requires_grad=True)
    z, tz = a @ w, ta @ tw
    if biased_output:
        z, tz = z + Tensor(bn), tz + torch.tensor(bn)
    out = (z.max(1) * z.sum(1)).sum()
    out.backward()
    assert _kernels(out, a.grad, w.grad, *([z] if biased_output else [])) == 6
    tout = (tz.amax(1) * tz.sum(1)).sum()
    tout.backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5)
    _close(a.grad, ta.grad)
    _close(w.grad, tw.grad)


def test_a_contiguous_of_a_stored_value_is_its_own_buffer():
    """c = a.contiguous() where a is stored anyway: c is a buffer of its own, so assigning to a (or to what a was
    computed from) later leaves c's value alone. Sharing a's buffer (a copy kernel saved) made c all zeros here."""
    xn = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    for target in ("a", "c"):
        x = Tensor(xn.copy()).realize()
        a = x.sum(1, keepdim=True)
        c = a.contiguous()
        (c * a.T).sum().realize()
        x.assign(Tensor.zeros(64, 32)).realize()
        (a if target == "a" else c).assign(Tensor.ones(64, 1)).realize()
        kept = c if target == "a" else a
        np.testing.assert_allclose(kept.numpy(), xn.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


def _hand_written_loss(logits, y):
    """mlp_step's loss: log-softmax written out, its max taken of logits that require grad (torch: amax, whose ties
    share the gradient as zeptograd's max does)"""
    m = logits.amax(1, keepdim=True) if isinstance(logits, torch.Tensor) else logits.max(1, keepdim=True)
    logp = logits - m - (logits - m).exp().sum(1, keepdim=True).log()
    return -(logp * y).sum(1).mean()


def _odd_rows(x: np.ndarray) -> np.ndarray:
    """rows of -inf and one -inf, huge logits, a tie of maxima, +inf, nan"""
    x = x.copy()
    x[0] = -np.inf
    x[1, 3] = -np.inf
    x[2] *= 1e30
    x[3, :2] = 3e38
    x[4, 5] = np.inf
    x[5, 7] = np.nan
    x[6] = 7.0
    return x


@pytest.mark.parametrize("odd", [False, True])
def test_a_hand_written_log_softmax_loss_and_its_gradient_are_three_kernels(odd):
    """The loss over a @ w + b with its gradient: the rows' max and sum of exp are one kernel with two stores
    (schedule/row_group.py: the loss reads both inside its reduce over the rows, so both are stored), then the loss
    and the gradient (the max and the sum recomputed in its row loops), as cross_entropy's; and the product, the max's
    input (a @ w + b, stored once: tensor/reduce.py), b's, a's and w's gradients: 8 (before: 9, the max and the sum
    each a kernel). Over stored logits + b: 6 (before: 7). Values and gradients as torch's, on odd rows too (nan
    where torch's are nan)."""
    an, wn, yn = _data(2)
    a, w = Tensor(an, requires_grad=True).realize(), Tensor(wn, requires_grad=True).realize()
    b = Tensor(np.zeros(CLASSES, np.float32), requires_grad=True).realize()
    ta, tw = torch.tensor(an, requires_grad=True), torch.tensor(wn, requires_grad=True)
    tb = torch.zeros(CLASSES, requires_grad=True)
    logits, tlogits = a @ w + b, ta @ tw + tb
    if odd:  # through a stored input: the odd values are the logits themselves (still with a gradient to b)
        on = _odd_rows((an @ wn).astype(np.float32))
        logits, tlogits = Tensor(on).realize() + b, torch.tensor(on) + tb
    loss, tloss = _hand_written_loss(logits, Tensor(yn)), _hand_written_loss(tlogits, torch.tensor(yn))
    loss.backward()
    tloss.backward()
    grads = [b.grad] if odd else [a.grad, w.grad, b.grad]
    assert _kernels(loss, *grads) == (6 if odd else 8)
    np.testing.assert_allclose(loss.numpy(), tloss.detach().numpy(), rtol=1e-5)
    for got, want in zip(grads, [tb.grad] if odd else [ta.grad, tw.grad, tb.grad]):
        _close(got, want)


def test_the_bench_mlp_step_is_seventeen_kernels():
    """bench's mlp_step (784-512-10, batch 256, the loss written by hand, SGD by assign): the logits' max and sum of
    exp in one kernel (and a copy of the logits, the max's input); its locals (logits, the max, the log-probabilities)
    are live tensors, stored as they read the weights the step overwrites. 18 kernels before, 6 of them the loss and
    its gradient."""
    from bench.run import _mlp_data, _zg_mlp

    step = _zg_mlp(*_mlp_data(256, False))
    losses = [step().item()]
    GlobalCounters.reset()
    losses.append(step().item())
    # 8-lane vectors (AVX2) read the first matmul's 784-deep operand from a panel copy (tensor/matmul_layout.py)
    assert GlobalCounters.kernel_count == (17 if Device["CPU"].renderer.simd_bytes >= 64 else 18)
    assert losses[1] < losses[0]


def _long_rows(seed: int) -> np.ndarray:
    """rows too long to keep in a kernel's registers: the max and the sum over them are stored"""
    return np.random.default_rng(seed).standard_normal((4, 40000)).astype(np.float32)


@pytest.mark.parametrize("other_rows", ["mean", "flip"])
def test_a_sum_reading_the_max_at_other_rows_keeps_its_own_kernel(other_rows):
    """The sum of exp reads the row max at its own row and at others (through a mean or a flip): in one kernel with the
    max it would load rows of the max not stored yet (schedule/row_group.py)."""
    xn = _long_rows(2)
    x = Tensor(xn)
    m = x.max(1, keepdim=True)
    other = m.mean() if other_rows == "mean" else m.flip(0)
    s = ((x - m).exp() * other).sum(1, keepdim=True)
    got = (x - m - s.log()).sum().numpy()
    mn = xn.max(1, keepdims=True).astype(np.float64)
    on = mn.mean() if other_rows == "mean" else mn[::-1]
    want = (xn - mn - np.log((np.exp(xn - mn) * on).sum(1, keepdims=True))).sum()
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_two_max_and_sum_pairs_reading_each_others_max_are_not_a_cycle():
    """Each sum of exp reads the other pair's max: grouping each pair into one kernel would make each kernel read the
    other's output."""
    xn, yn = _long_rows(3), _long_rows(4)
    x, y = Tensor(xn), Tensor(yn)
    mx, my = x.max(1, keepdim=True), y.max(1, keepdim=True)
    sx = ((x - mx).exp() * my.flip(0)).sum(1, keepdim=True)
    sy = ((y - my).exp() * mx.flip(0)).sum(1, keepdim=True)
    got = ((x - mx - sx.log()).sum() + (y - my - sy.log()).sum()).numpy()
    mxn, myn = xn.max(1, keepdims=True).astype(np.float64), yn.max(1, keepdims=True).astype(np.float64)
    sxn = (np.exp(xn - mxn) * myn[::-1]).sum(1, keepdims=True)
    syn = (np.exp(yn - myn) * mxn[::-1]).sum(1, keepdims=True)
    want = (xn - mxn - np.log(sxn)).sum() + (yn - myn - np.log(syn)).sum()
    np.testing.assert_allclose(got, want, rtol=1e-4)
