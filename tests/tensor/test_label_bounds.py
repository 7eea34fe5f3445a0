"""Class labels out of range are an error at the user's call, as in torch, never a silent loss of 0 for that sample:
cross_entropy, nll_loss and sparse_categorical_crossentropy raise IndexError("Target 7 is out of bounds. (...)") with
the class count, one_hot RuntimeError("Class values must be ..."); labels equal to ignore_index are allowed and left
out. Under TinyJit the check runs at the capture and again on every replay (tensor.indexing.check_label_bounds)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.slow import fast_first
from zeptograd import GlobalCounters, Tensor, TinyJit, dtypes

RNG = np.random.default_rng(0)
X = RNG.standard_normal((6, 5)).astype(np.float32)
X3 = RNG.standard_normal((2, 5, 3)).astype(np.float32)  # classes on dim 1, one extra dim


def close(a: Tensor, b: torch.Tensor):
    np.testing.assert_allclose(a.numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)


# ***** cross_entropy *****


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_cross_entropy_good_labels_and_ignore_index(reduction, ls):
    for y in ([0, 4, 2, 2, 1, 3], [0, -100, 4, -100, 1, 3], [-100] * 6):
        ours = Tensor(X).cross_entropy(Tensor(y), reduction, ls)
        close(ours, F.cross_entropy(torch.tensor(X), torch.tensor(y), reduction=reduction, label_smoothing=ls))
    y = [0, 7, 4, 7, 1, 3]
    close(
        Tensor(X).cross_entropy(Tensor(y), reduction, ls, ignore_index=7),
        F.cross_entropy(torch.tensor(X), torch.tensor(y), reduction=reduction, label_smoothing=ls, ignore_index=7),
    )


def test_cross_entropy_shapes_and_gradient():
    y3 = np.array([[0, 4, -100], [2, 2, 1]])
    close(Tensor(X3).cross_entropy(Tensor(y3)), F.cross_entropy(torch.tensor(X3), torch.tensor(y3)))
    close(Tensor(X[0]).cross_entropy(Tensor(3)), F.cross_entropy(torch.tensor(X[0]), torch.tensor(3)))
    x, tx = Tensor(X, requires_grad=True), torch.tensor(X, requires_grad=True)
    y = [0, -100, 4, 2, -100, 3]
    x.cross_entropy(Tensor(y), label_smoothing=0.1).backward()
    F.cross_entropy(tx, torch.tensor(y), label_smoothing=0.1).backward()
    close(x.grad, tx.grad)


def test_cross_entropy_out_of_range():
    x = Tensor(X)
    with pytest.raises(
        IndexError,
        match=r"^Target 5 is out of bounds\. \(cross_entropy: 5 classes, labels must be in "
        r"\[0, 5\) or ignore_index=-100\)$",
    ):
        x.cross_entropy(Tensor([0, 5, 1, 1, 1, 1]))
    with pytest.raises(IndexError, match=r"^Target -1 is out of bounds\. .*; out-of-bounds values: -1, 9\)$"):
        x.cross_entropy(Tensor([0, -1, 1, 9, -100, 1]))
    with pytest.raises(IndexError, match=r"^Target -100 is out of bounds\."):  # -100 is only ignored by default
        x.cross_entropy(Tensor([-100, 0, 1, 1, 1, 1]), ignore_index=3)
    with pytest.raises(IndexError, match=r"^Target 5 is out of bounds\. \(cross_entropy: 5 classes"):
        Tensor(X3).cross_entropy(Tensor([[0, 1, 2], [3, 4, 5]]))
    with pytest.raises(IndexError, match=r"^Target 7 is out of bounds\."):
        Tensor(X[0]).cross_entropy(Tensor(7))  # one unbatched sample
    with pytest.raises(IndexError, match=r"^Target 6 is out of bounds\. .*values: 6, 8\)$"):
        x.cross_entropy(Tensor([0, 1, 2, 3, 4, 3]) * 2)  # lazy labels are checked too
    with pytest.raises(TypeError, match="integer tensor, got dtypes.float"):
        x.cross_entropy(Tensor([0.0, 1, 2, 3, 4, 1]))
    # class probabilities (the input's shape) are not labels: not checked
    close(
        x.cross_entropy(Tensor(np.full((6, 5), 0.2, np.float32))),
        F.cross_entropy(torch.tensor(X), torch.full((6, 5), 0.2)),
    )


def test_realized_labels_are_read_where_they_lie():
    y = Tensor([0, 4, 2, 2, 1, 3]).realize()
    GlobalCounters.reset()
    loss = Tensor(X).cross_entropy(y)
    assert GlobalCounters.kernel_count == 0  # the check ran no kernel: the labels' buffer was read
    close(loss, F.cross_entropy(torch.tensor(X), torch.tensor([0, 4, 2, 2, 1, 3])))


# ***** nll_loss *****


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_good_labels_and_ignore_index(reduction):
    lp, w = F.log_softmax(torch.tensor(X), 1), torch.tensor([0.5, 1.0, 2.0, 1.5, 0.7])
    for y, ign in (([0, 4, 2, 2, 1, 3], None), ([0, -100, 4, -100, 1, 3], -100), ([0, 9, 4, 9, 1, 3], 9)):
        kw = {} if ign is None else {"ignore_index": ign}
        close(
            Tensor(lp.numpy()).nll_loss(Tensor(y), reduction=reduction, **kw),
            F.nll_loss(lp, torch.tensor(y), reduction=reduction, **kw),
        )
        close(
            Tensor(lp.numpy()).nll_loss(Tensor(y), Tensor(w.numpy()), reduction=reduction, **kw),
            F.nll_loss(lp, torch.tensor(y), w, reduction=reduction, **kw),
        )
    lp3 = F.log_softmax(torch.tensor(X3), 1)
    y3 = np.array([[0, 4, 3], [2, 2, 1]])
    close(Tensor(lp3.numpy()).nll_loss(Tensor(y3)), F.nll_loss(lp3, torch.tensor(y3)))


def test_nll_loss_out_of_range():
    lp = Tensor(X).log_softmax(1)
    with pytest.raises(
        IndexError,
        match=r"^Target 5 is out of bounds\. \(nll_loss: 5 classes, labels must be in "
        r"\[0, 5\)\)$",
    ):
        lp.nll_loss(Tensor([0, 5, 1, 1, 1, 1]))
    with pytest.raises(IndexError, match=r"^Target -3 is out of bounds\."):
        lp.nll_loss(Tensor([0, -3, 1, 1, 1, 1]), ignore_index=-100)
    with pytest.raises(IndexError, match=r"^Target -100 is out of bounds\."):  # no ignore_index: -100 is a label
        lp.nll_loss(Tensor([0, -100, 1, 1, 1, 1]))
    with pytest.raises(
        IndexError,
        match=r"^Target 8 is out of bounds\. \(nll_loss: 5 classes, labels must be in "
        r"\[0, 5\) or ignore_index=-1; out-of-bounds values: 8, 5\)$",
    ):
        lp.nll_loss(Tensor([8, -1, 5, 1, 1, 8]), Tensor.ones(5), ignore_index=-1)


# ***** sparse_categorical_crossentropy *****


@pytest.mark.slow
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_sparse_categorical_crossentropy_good_labels(reduction, ls):
    for y, ign in (([0, 4, 2, 2, 1, 3], -1), ([0, -1, 4, -1, 1, 3], -1), ([0, 6, 4, 6, 1, 3], 6), ([-1] * 6, -1)):
        close(
            Tensor(X).sparse_categorical_crossentropy(Tensor(y), ign, ls, reduction),
            F.cross_entropy(
                torch.tensor(X), torch.tensor(y), ignore_index=ign, label_smoothing=ls, reduction=reduction
            ),
        )


def test_sparse_categorical_crossentropy_out_of_range():
    x = Tensor(X)
    with pytest.raises(
        IndexError,
        match=r"^Target 5 is out of bounds\. \(sparse_categorical_crossentropy: 5 classes, "
        r"labels must be in \[0, 5\) or ignore_index=-1\)$",
    ):
        x.sparse_categorical_crossentropy(Tensor([0, 5, 1, 1, 1, 1]))
    with pytest.raises(IndexError, match=r"^Target -2 is out of bounds\."):
        x.sparse_categorical_crossentropy(Tensor([0, -1, -2, 1, 1, 1]))
    with pytest.raises(IndexError, match=r"^Target -1 is out of bounds\."):
        x.sparse_categorical_crossentropy(Tensor([0, -1, 1, 1, 1, 1]), ignore_index=4)
    with pytest.raises(IndexError, match=r"^Target 255 is out of bounds\."):  # unsigned labels: -1 can't occur
        x.sparse_categorical_crossentropy(Tensor(np.array([0, 255, 1, 1, 1, 1], np.uint8)))


# ***** one_hot *****


def test_one_hot_good_and_out_of_range():
    y = np.array([[0, 3], [4, 1]])
    np.testing.assert_array_equal(Tensor(y).one_hot(5).numpy(), F.one_hot(torch.tensor(y), 5).numpy())
    np.testing.assert_array_equal(Tensor(y).one_hot().numpy(), F.one_hot(torch.tensor(y)).numpy())
    with pytest.raises(
        RuntimeError,
        match=r"^Class values must be smaller than num_classes\. \(one_hot: class value 5 "
        r"with num_classes=5\)$",
    ):
        Tensor([0, 5, 2]).one_hot(5)
    with pytest.raises(
        RuntimeError,
        match=r"^Class values must be non-negative\. \(one_hot: class value -1 with "
        r"num_classes=5\)$",
    ):
        Tensor([0, -1, 9]).one_hot(5)
    with pytest.raises(RuntimeError, match=r"^Class values must be non-negative\. \(one_hot: class value -2"):
        Tensor([1, -2]).one_hot()
    with pytest.raises(RuntimeError, match="Can not infer total number of classes from empty tensor"):
        Tensor.zeros(0, dtype=dtypes.int32).one_hot()
    with pytest.raises(RuntimeError, match="Class values must be smaller than num_classes"):
        Tensor([1]).one_hot(-2)
    assert Tensor.zeros(0, dtype=dtypes.int32).one_hot(3).shape == (0, 3)
    with pytest.raises(TypeError):
        Tensor([True]).one_hot(2)


# ***** TinyJit: the check runs on every replay *****


@pytest.mark.parametrize("fn", fast_first(["cross_entropy", "nll_loss", "sparse_categorical_crossentropy", "one_hot"]))
def test_jit_replay_checks_labels(fn):
    x = Tensor(X)
    ign = {"cross_entropy": -100, "nll_loss": -100, "sparse_categorical_crossentropy": -1}.get(fn)
    call = {
        "cross_entropy": lambda y: x.cross_entropy(y),
        "nll_loss": lambda y: x.log_softmax(1).nll_loss(y, ignore_index=-100),
        "sparse_categorical_crossentropy": lambda y: x.sparse_categorical_crossentropy(y),
        "one_hot": lambda y: y.one_hot(5).sum(0),
    }[fn]
    ref = {
        "cross_entropy": lambda y: F.cross_entropy(torch.tensor(X), y),
        "nll_loss": lambda y: F.nll_loss(F.log_softmax(torch.tensor(X), 1), y),
        "sparse_categorical_crossentropy": lambda y: F.cross_entropy(torch.tensor(X), y, ignore_index=-1),
        "one_hot": lambda y: F.one_hot(y, 5).sum(0),
    }[fn]
    f = TinyJit(lambda y: call(y) * 2)
    goods = [[0, 4, 2, 2, 1, 3], [1, 1, 1, 0, 0, 4], [4, 3, 2, 1, 0, 0], [2, 2, 2, 2, 2, 2]]
    if ign is not None:
        goods += [[0, ign, 2, ign, 1, 3], [ign, 1, 2, 3, 4, 0]]
    for y in goods:  # eager, capture, replays
        close(f(Tensor(y)), ref(torch.tensor(y)) * 2)
    assert f.cnt >= 3
    bads = [([0, 5, 1, 1, 1, 1], 5), ([0, 1, -2, 1, 9, 1], 9), ([-3, 1, 1, 1, 1, 1], -3)]
    if ign is None:
        bads.append(([-100, 1, 1, 1, 1, 1], -100))
    for y, shown in bads:
        msg = (
            f"Target {shown} is out of bounds"
            if fn != "one_hot"
            else f"Class values must be {'non-negative' if shown < 0 else 'smaller than num_classes'}.*value {shown}"
        )
        with pytest.raises(IndexError if fn != "one_hot" else RuntimeError, match=msg):
            f(Tensor(y))
    close(f(Tensor(goods[0])), ref(torch.tensor(goods[0])) * 2)  # replays go on


@pytest.mark.slow
def test_jit_training_step_raises_before_the_update():
    """A training step whose replay sees a bad label raises before the weight update is applied."""
    from zeptograd.nn.optim import SGD

    w = Tensor(RNG.standard_normal((4, 5)).astype(np.float32), requires_grad=True)
    opt = SGD([w], lr=0.1)
    xs = Tensor(RNG.standard_normal((6, 4)).astype(np.float32))

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (x @ w).cross_entropy(y)
            loss.backward()
            opt.step(loss)
        return loss

    for y in ([0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, -100], [4, 4, 4, 0, 0, 0]):
        step(xs, Tensor(y))
    before = w.numpy().copy()
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        step(xs, Tensor([0, 1, 5, 3, 4, 0]))
    np.testing.assert_array_equal(w.numpy(), before)
    tw = torch.tensor(before, requires_grad=True)
    F.cross_entropy(torch.tensor(xs.numpy()) @ tw, torch.tensor([1, 1, -100, 2, 2, 3])).backward()
    step(xs, Tensor([1, 1, -100, 2, 2, 3]))
    np.testing.assert_allclose(w.numpy(), before - 0.1 * tw.grad.numpy(), rtol=1e-5, atol=1e-6)
