"""TinyJit outputs keep their values after later calls, as an eager call's fresh results do: a replay writes a
returned buffer again only once nothing refers to what the previous call returned (else it writes a new buffer).
State updated in place (an assign to a weight the function reaches) is shared by every call, as in torch."""

import gc

import numpy as np

from zeptograd import GlobalCounters, Tensor, TinyJit


def test_lazy_graph_on_an_old_output_keeps_its_value():
    f = TinyJit(lambda x: (x * 2).realize())
    outs = [f(Tensor([float(i), 1.0])) for i in range(3)]  # run, capture, replay
    y = outs[2] + 1  # lazy, on a replayed output
    f(Tensor([100.0, 1.0]))  # another replay
    np.testing.assert_equal(y.numpy(), [5.0, 3.0])
    np.testing.assert_equal(outs[2].numpy(), [4.0, 2.0])


def test_lazy_graph_on_the_captured_output_keeps_its_value():
    f = TinyJit(lambda x: (x * 2).realize())
    f(Tensor([1.0]))
    captured = f(Tensor([2.0]))  # the capture's own output
    y = captured * 10
    for v in (3.0, 4.0):
        f(Tensor([v]))
    np.testing.assert_equal(y.numpy(), [40.0])
    np.testing.assert_equal(captured.numpy(), [4.0])


def test_every_kept_output_keeps_its_value():
    f = TinyJit(lambda x: (x + 1).contiguous())
    xs = [np.full(5, i, np.float32) for i in range(8)]
    outs = [f(Tensor(x)) for x in xs]
    lazies = [o * 3 for o in outs]
    for x, o, lazy in zip(xs, outs, lazies):
        np.testing.assert_equal(o.numpy(), x + 1)
        np.testing.assert_equal(lazy.numpy(), (x + 1) * 3)


def test_an_output_read_by_a_later_kernel_of_the_same_call():
    # a's buffer is written by the first kernel and read by the second: both see the same (new) buffer
    def fn(x):
        a = (x * 2).realize()
        return a, (a + 1).realize()

    f = TinyJit(fn)
    kept = [f(Tensor(np.full(3, i, np.float32))) for i in range(6)]
    for i, (a, b) in enumerate(kept):
        np.testing.assert_equal(a.numpy(), np.full(3, 2 * i))
        np.testing.assert_equal(b.numpy(), np.full(3, 2 * i + 1))


def test_two_outputs_on_one_buffer():
    def fn(x):
        a = (x * 2).realize()
        return a, a.reshape(2, 2)

    f = TinyJit(fn)
    kept = [f(Tensor(np.full(4, i, np.float32))) for i in range(5)]
    for i, (a, a22) in enumerate(kept):
        np.testing.assert_equal(a.numpy(), np.full(4, 2 * i))
        np.testing.assert_equal(a22.numpy(), np.full((2, 2), 2 * i))


def test_a_loop_that_drops_each_output_reuses_memory():
    f = TinyJit(lambda x: (x * 2).contiguous())
    x = Tensor(np.ones(1 << 10, np.float32))
    out = None
    for _ in range(4):
        out = f(x)
    gc.collect()
    used = GlobalCounters.mem_used
    for i in range(20):
        out = f(x)
    gc.collect()
    assert GlobalCounters.mem_used == used
    np.testing.assert_equal(out.numpy()[:3], [2.0, 2.0, 2.0])


def test_state_updated_in_place_is_shared_as_in_torch():
    # the function returns a weight it assigns to: every returned tensor is that weight (torch returns the parameter)
    w = Tensor([0.0, 0.0]).contiguous().realize()

    def step(x):
        w.assign(w + x).realize()
        return w

    f = TinyJit(step)
    returned = [f(Tensor([1.0, 2.0])) for _ in range(4)]
    np.testing.assert_equal(w.numpy(), [4.0, 8.0])
    for r in returned:
        np.testing.assert_equal(r.numpy(), [4.0, 8.0])


def _doubling_jits():
    """The same jitted function taking the written fast replay (positional Tensors) and the general one (a keyword
    argument), each past its capture."""
    fast = TinyJit(lambda x: (x * 2).realize())
    general = TinyJit(lambda x, scale: (x * scale).realize())
    for i in range(3):
        fast(Tensor([float(i), 1.0]))
        general(Tensor([float(i), 1.0]), scale=2.0)
    return [lambda x: fast(x), lambda x: general(x, scale=2.0)]


def test_an_output_marked_requires_grad_does_not_mark_the_next_calls_output():
    import torch

    for f in _doubling_jits():
        o = f(Tensor([1.0, 1.0]))
        o.requires_grad_()
        (o * 3).sum().backward()
        np.testing.assert_equal(o.grad.numpy(), [3.0, 3.0])
        del o  # the next call may write the same buffer again
        o2 = f(Tensor([5.0, 1.0]))
        loss = (o2 * 3).sum()
        ref = (torch.tensor([10.0, 2.0]) * 3).sum()
        assert bool(o2.requires_grad) is ref.requires_grad is False
        assert bool(loss.requires_grad) is False
        np.testing.assert_equal(loss.numpy(), 36.0)


def test_a_jit_output_in_a_later_autograd_graph_matches_torch():
    import torch

    for f in _doubling_jits():
        w, tw = Tensor([1.0, -2.0], requires_grad=True), torch.tensor([1.0, -2.0], requires_grad=True)
        for v in (1.0, 4.0, -3.0):
            o = f(Tensor([v, 0.5]))
            o.requires_grad_(v > 0)  # some calls' outputs are leaves that require grad, some are not
            to = torch.tensor([v * 2, 1.0]).requires_grad_(v > 0)
            (o * w * o).sum().backward()
            (to * tw * to).sum().backward()
            np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())
            if v > 0:
                np.testing.assert_allclose(o.grad.numpy(), to.grad.numpy())
            else:
                assert o.grad is None and to.grad is None
            w.grad, tw.grad = None, None
