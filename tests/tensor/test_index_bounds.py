"""Out-of-range integer tensor indices are an IndexError at the user's call, naming the value, the dim and its size
(t[idx], t[idx] = v, gather, scatter, nn.Embedding); in range, negative indices of t[idx] wrap as in numpy and
torch. Under TinyJit the check runs at the capture and again on every replay (tensor.indexing.check_index_bounds)."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import GlobalCounters, Tensor, TinyJit, dtypes, nn

A = np.arange(12, dtype=np.float32).reshape(3, 4)


def test_getitem_out_of_range():
    t = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError, match=r"^index 5 is out of bounds for dimension 0 with size 3$"):
        t[Tensor([5])]
    with pytest.raises(IndexError, match=r"^index -4 is out of bounds for dimension 0 with size 3$"):
        t[Tensor([0, -4])]
    with pytest.raises(IndexError, match=r"index 3 is out of bounds for dimension 0 with size 3"):
        t[[0, 3]]  # a list becomes an index tensor
    with pytest.raises(IndexError, match=r"index 7 .* dimension 1 with size 4 \(out-of-bounds values: 7, -9\)"):
        Tensor(A)[:, Tensor([[0, 7], [1, -9]])]
    with pytest.raises(IndexError, match=r"index 4 is out of bounds for dimension 1 with size 4"):
        Tensor(A)[1, Tensor([4])]  # the dim of the input tensor, counted before the int index drops one
    with pytest.raises(IndexError, match=r"index 3 is out of bounds for dimension 0 with size 3"):
        Tensor(A)[Tensor([3]), Tensor([0])]


@pytest.mark.slow
def test_getitem_in_range_and_negative_wraps():
    t = Tensor(A)
    idx = np.array([[0, -1], [2, -3]])
    np.testing.assert_array_equal(t[Tensor(idx)].numpy(), A[idx])
    np.testing.assert_array_equal(t[:, Tensor([-4, 3, 0])].numpy(), A[:, [-4, 3, 0]])
    np.testing.assert_array_equal(t[Tensor([-1, 0]), Tensor([-1, 1])].numpy(), A[[-1, 0], [-1, 1]])
    np.testing.assert_array_equal(t[t > 5].numpy(), A[A > 5])  # bool masks are not int indices: not checked
    assert t[Tensor.zeros(0, dtype=dtypes.int32)].shape == (0, 4)  # no index: nothing to check


def test_lazy_index_is_checked():
    t = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError, match="index 3 is out of bounds"):
        t[Tensor([0, 1]) * 3]
    np.testing.assert_array_equal(t[Tensor([2, 1]) - 1].numpy(), [2.0, 1.0])


def test_setitem_out_of_range_and_wrapping():
    t = Tensor(A.copy())
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        t[Tensor([3])] = 0.0
    np.testing.assert_array_equal(t.numpy(), A)  # nothing was written
    t[Tensor([-1])] = 0.0
    ref = A.copy()
    ref[-1] = 0.0
    np.testing.assert_array_equal(t.numpy(), ref)


def test_gather_out_of_range():
    t = Tensor(A)
    with pytest.raises(IndexError, match=r"^gather: index 4 is out of bounds for dimension 1 with size 4$"):
        t.gather(1, Tensor([[0, 4], [1, 1], [2, 2]]))
    with pytest.raises(IndexError, match=r"^gather: index -1 is out of bounds for dimension 0 with size 3$"):
        t.gather(0, Tensor([[0, -1, 0, 0]]))  # gather does not wrap (as torch)
    idx = np.array([[3, 0], [1, 1], [2, 0]])
    np.testing.assert_array_equal(t.gather(1, Tensor(idx)).numpy(), np.take_along_axis(A, idx, 1))


def test_scatter_out_of_range():
    with pytest.raises(IndexError, match=r"^scatter: index 3 is out of bounds for dimension 0 with size 3$"):
        Tensor.zeros(3).scatter(0, Tensor([3]), Tensor.ones(1))
    with pytest.raises(IndexError, match="scatter: index -1 is out of bounds"):
        Tensor.zeros(3).scatter_reduce(0, Tensor([-1]), Tensor.ones(1), "sum")
    np.testing.assert_array_equal(Tensor.zeros(3).scatter(0, Tensor([2, 0]), Tensor([5.0, 6.0])).numpy(), [6, 0, 5])


def test_embedding_out_of_range():
    emb = nn.Embedding(5, 3)
    w = emb.weight.numpy()
    with pytest.raises(IndexError, match=r"^Embedding: index 5 is out of bounds for dimension 0 with size 5$"):
        emb(Tensor([[0, 5]]))
    with pytest.raises(IndexError, match="Embedding: index -1 is out of bounds"):
        emb(Tensor([-1]))
    np.testing.assert_array_equal(emb(Tensor([[4, 0], [2, 2]])).numpy(), w[[[4, 0], [2, 2]]])


def test_internal_indices_are_not_read_back():
    """interpolate's indices are in range by construction; nll_loss's ignore_index labels are masked: neither is
    an error, and interpolate stays one lazy graph (no index read back: one schedule, no extra kernels)."""
    x = Tensor(np.arange(8, dtype=np.float32).reshape(1, 1, 8))
    GlobalCounters.reset()
    y = x.interpolate((16,), mode="linear")
    assert GlobalCounters.kernel_count == 0  # nothing ran while building the graph
    assert y.shape == (1, 1, 16)
    logits = Tensor(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    loss = logits.log_softmax(1).nll_loss(Tensor([1, -100, 3]), ignore_index=-100).item()
    lp = logits.log_softmax(1).numpy()
    assert loss == pytest.approx(-(lp[0, 1] + lp[2, 3]) / 2, rel=1e-5)


def test_null_device_is_not_checked():
    t = Tensor.empty(3, device="NULL")
    assert t[Tensor.empty(2, dtype=dtypes.int32, device="NULL")].shape == (2,)  # no values to read there


# ***** TinyJit: the check runs on every replay *****


def test_jit_embedding_checks_every_replay():
    emb = nn.Embedding(5, 2)
    w = emb.weight.numpy()

    @TinyJit
    def f(idx: Tensor) -> Tensor:
        return (emb(idx) * 2).sum(-1)

    for ids in ([0, 1], [2, 3], [4, 0], [3, 3]):  # eager, capture, replays
        np.testing.assert_allclose(f(Tensor(ids)).numpy(), (w[ids] * 2).sum(-1), rtol=1e-6)
    assert f.cnt >= 3
    for bad, shown in (([1, 5], 5), ([-1, 0], -1), ([7, -2], 7)):
        with pytest.raises(IndexError, match=f"Embedding: index {shown} is out of bounds for dimension 0 with size 5"):
            f(Tensor(bad))
    np.testing.assert_allclose(f(Tensor([4, 1])).numpy(), (w[[4, 1]] * 2).sum(-1), rtol=1e-6)  # replays go on


def test_jit_getitem_wraps_and_checks():
    x = Tensor([1.0, 2.0, 3.0])

    @TinyJit
    def g(x: Tensor, idx: Tensor) -> Tensor:
        return x[idx] + 1

    for ids in ([0, 1], [2, -3], [1, 2], [-1, -2]):
        np.testing.assert_array_equal(g(x, Tensor(ids)).numpy(), np.array([1.0, 2.0, 3.0])[ids] + 1)
    with pytest.raises(IndexError, match="^index 3 is out of bounds for dimension 0 with size 3$"):
        g(x, Tensor([3, 0]))
    with pytest.raises(IndexError, match="^index -4 is out of bounds for dimension 0 with size 3$"):
        g(x, Tensor([0, -4]))


def test_jit_capture_raises_and_captures_again():
    @TinyJit
    def g(x: Tensor, idx: Tensor) -> Tensor:
        return x.gather(0, idx) * 2

    x = Tensor([1.0, 2.0, 3.0])
    assert g(x, Tensor([0, 1])).tolist() == [2.0, 4.0]
    with pytest.raises(IndexError, match="gather: index 3 is out of bounds"):
        g(x, Tensor([3, 1]))  # the capture call
    assert g(x, Tensor([2, 2])).tolist() == [6.0, 6.0]  # captures now
    assert g(x, Tensor([1, 0])).tolist() == [4.0, 2.0]  # replays
    with pytest.raises(IndexError, match="gather: index 3 is out of bounds"):
        g(x, Tensor([1, 3]))


def test_jit_replay_raises_before_later_kernels_run():
    """An optimizer-like assign after the lookup: a bad replay raises before it is applied."""
    emb = nn.Embedding(4, 2)
    acc = Tensor.zeros(2).contiguous().realize()

    @TinyJit
    def step(idx: Tensor) -> Tensor:
        acc.assign(acc + emb(idx).sum(0))
        return acc.realize()

    for ids in ([0], [1], [2]):
        step(Tensor(ids))
    before = acc.numpy().copy()
    with pytest.raises(IndexError, match="Embedding: index 4 is out of bounds"):
        step(Tensor([4]))
    np.testing.assert_array_equal(acc.numpy(), before)
    step(Tensor([3]))
    np.testing.assert_allclose(acc.numpy(), before + emb.weight.numpy()[3], rtol=1e-6)


def test_index_views_and_pending_writes_are_read_exactly():
    """The values checked are the index's own: read through reshape/expand views of a buffer, not through a shrink
    (it drops values), and after a pending assign (its new values)."""
    t = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(IndexError, match="gather: index 3 is out of bounds for dimension 0 with size 3"):
        Tensor(A).gather(0, Tensor([[3]]).expand(2, 4))
    assert t[Tensor([0, 9])[0:1]].tolist() == [1.0]  # the 9 is shrunk away
    assert t[Tensor([[2, 1]]).expand(2, 2).reshape(4)].tolist() == [3.0, 2.0, 3.0, 2.0]
    assert t[Tensor.full((2,), -1, dtype=dtypes.int32)].tolist() == [3.0, 3.0]  # a constant index
    idx = Tensor([0, 1]).contiguous().realize()
    idx.assign(Tensor([5, 0]))
    with pytest.raises(IndexError, match="index 5 is out of bounds"):
        t[idx]
