"""A max whose input requires grad, and the hand-written log-softmax loss built on it: its gradient compares the input
with the max (`x == max`), so the input is stored once (tensor/reduce.py); where the schedule stores it anyway (a
matmul's output), the max reads that buffer rather than a copy of it (schedule/bufferize.py: contiguous_aliases).
Values and gradients are torch's, rows of -inf, huge logits and nans included."""

import numpy as np
import pytest
import torch

from zeptograd import GlobalCounters, Tensor

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
def test_a_max_of_a_stored_value_reads_its_buffer(biased_output):
    """(a @ w).max(1) with a gradient: the product is stored for its other readers, and the max and its gradient read
    that buffer (before: a copy kernel of it too). So is a @ w + b realized with the loss (a tensor the caller keeps:
    an output). Kernels: the product, the max with the loss, the gradient of the product (a's and w's gradients read
    it: stored), a's gradient, w's gradient."""
    an, wn, _ = _data()
    bn = np.linspace(-1, 1, CLASSES, dtype=np.float32)
    a, w = Tensor(an, requires_grad=True).realize(), Tensor(wn, requires_grad=True).realize()
    ta, tw = torch.tensor(an, requires_grad=True), torch.tensor(wn, requires_grad=True)
    z, tz = a @ w, ta @ tw
    if biased_output:
        z, tz = z + Tensor(bn), tz + torch.tensor(bn)
    out = (z.max(1) * z.sum(1)).sum()
    out.backward()
    assert _kernels(out, a.grad, w.grad, *([z] if biased_output else [])) == 5
    tout = (tz.amax(1) * tz.sum(1)).sum()
    tout.backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-5)
    _close(a.grad, ta.grad)
    _close(w.grad, tw.grad)


def test_a_max_realized_before_its_backward_reads_the_same_buffer():
    """The forward realized alone, its backward in a later schedule: the max's input is remembered as the product's
    buffer (the CONTIGUOUS's node maps to it), so the backward compares the very values the max was taken of, read
    from that buffer."""
    an, wn, _ = _data(1)
    a, w = Tensor(an, requires_grad=True).realize(), Tensor(wn, requires_grad=True).realize()
    z = a @ w  # recomputed in another kernel its sums could be an ulp off
    out = (z.max(1) * z.sum(1)).sum()
    assert _kernels(out) == 2  # the product; the max and the loss (before: a copy of the product too)
    out.backward()
    assert _kernels(a.grad, w.grad) == 3  # the product's gradient, a's, w's: the product's buffer read, not copied
    ta, tw = torch.tensor(an, requires_grad=True), torch.tensor(wn, requires_grad=True)
    tz = ta @ tw
    (tz.amax(1) * tz.sum(1)).sum().backward()
    _close(a.grad, ta.grad)
    _close(w.grad, tw.grad)


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


def test_the_bench_mlp_step_is_sixteen_kernels():
    """bench's mlp_step (784-512-10, batch 256, the loss written by hand, SGD by assign): the logits' max and sum of
    exp in one kernel, no copy of the logits; its locals (logits, the max, the log-probabilities) are live tensors,
    stored as they read the weights the step overwrites. 18 kernels before, 6 of them the loss and its gradient."""
    from bench.run import _mlp_data, _zg_mlp

    step = _zg_mlp(*_mlp_data(256, False))
    losses = [step().item()]
    GlobalCounters.reset()
    losses.append(step().item())
    assert GlobalCounters.kernel_count == 16
    assert losses[1] < losses[0]
