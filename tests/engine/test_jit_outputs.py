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
