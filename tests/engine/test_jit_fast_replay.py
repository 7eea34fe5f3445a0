"""TinyJit's replay function written for each capture of positional Tensor arguments (engine/jit.py,
_build_fast_replay): the same results as the general replay for alternating and repeated inputs, inputs that
change signature fall back to the general path (which raises), aliased inputs are copied."""

import numpy as np
import pytest

from zeptograd import Tensor, TinyJit
from zeptograd.engine.jit import JitError


def _jit_add():
    f = TinyJit(lambda x, y: x + y)
    for _ in range(2):  # run, capture
        f(Tensor(np.zeros(4, np.float32)), Tensor(np.zeros(4, np.float32)))
    return f


def test_a_capture_of_positional_tensors_gets_a_written_replay():
    f = _jit_add()
    assert f.captured is not None and f.captured.fast_replay is not None
    assert f.captured.fast_replay.__code__.co_filename.startswith("<TinyJit replay of ")
    g = TinyJit(lambda x, k: x * k)  # a non-Tensor argument: the general path
    for _ in range(2):
        g(Tensor([1.0]), 2.0)
    assert g.captured is not None and g.captured.fast_replay is None


def test_alternating_and_repeated_inputs():
    f = _jit_add()
    xs = [Tensor(np.full(4, i, np.float32)).realize() for i in range(3)]
    ys = [Tensor(np.arange(4, dtype=np.float32) * i).realize() for i in range(3)]
    kept = []
    for step in range(9):  # the same pair twice in a row, then the others: pointers in place or written again
        i = (step // 2) % 3
        out = f(xs[i], ys[i])
        kept.append((i, out))
        np.testing.assert_equal(out.numpy(), xs[i].numpy() + ys[i].numpy())
    for i, out in kept:  # every returned output kept its values
        np.testing.assert_equal(out.numpy(), xs[i].numpy() + ys[i].numpy())


def test_swapped_argument_order():
    f2 = TinyJit(lambda x, y: x - y)
    for _ in range(2):
        f2(Tensor([0.0, 0.0]), Tensor([0.0, 0.0]))
    a, b = Tensor([5.0, 7.0]).realize(), Tensor([1.0, 2.0]).realize()
    for _ in range(2):
        np.testing.assert_equal(f2(a, b).numpy(), [4.0, 5.0])
        np.testing.assert_equal(f2(b, a).numpy(), [-4.0, -5.0])


def test_an_input_written_in_place_between_replays_is_read_again():
    f = _jit_add()
    x, y = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.ones(4, np.float32)).realize()
    np.testing.assert_equal(f(x, y).numpy(), [2.0] * 4)
    x.assign(Tensor(np.full(4, 5.0, np.float32))).realize()
    np.testing.assert_equal(f(x, y).numpy(), [6.0] * 4)


def test_changed_input_falls_back_and_raises():
    f = _jit_add()
    x, y = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.ones(4, np.float32)).realize()
    f(x, y)
    with pytest.raises(JitError, match="captured as"):
        f(Tensor(np.ones(5, np.float32)), y)
    with pytest.raises(JitError, match="captured as"):
        f(Tensor(np.ones(4, np.int32)), y)
    with pytest.raises(JitError, match="same buffer"):
        f(x, x)
    np.testing.assert_equal(f(x, y).numpy(), [2.0] * 4)  # the written replay still works after the fallbacks


def test_lazy_and_view_inputs_take_the_general_path_with_the_same_result():
    f = _jit_add()
    y = Tensor(np.ones(4, np.float32)).realize()
    np.testing.assert_equal(f(Tensor(np.arange(4, dtype=np.float32)) * 2, y).numpy(), [1.0, 3.0, 5.0, 7.0])
    base = Tensor(np.arange(8, dtype=np.float32)).realize()
    np.testing.assert_equal(f(base.reshape(2, 4)[1], y).numpy(), [5.0, 6.0, 7.0, 8.0])


def test_a_returned_output_passed_back_in_is_copied_first():
    f = TinyJit(lambda h, x: h * 2 + x)
    h, x = Tensor(np.ones(3, np.float32)).realize(), Tensor(np.ones(3, np.float32)).realize()
    expected = np.ones(3, np.float32)
    for _ in range(6):
        h = f(h, x)
        expected = expected * 2 + 1
        np.testing.assert_equal(h.numpy(), expected)


def test_a_written_replay_is_not_taken_while_another_jit_captures():
    calls = []
    inner = _jit_add()
    real = inner.captured.fast_replay
    inner.captured.fast_replay = lambda args: calls.append(args) or real(args)
    outer = TinyJit(lambda x, y: inner(x, y) * 2)
    a, b = Tensor([1.0, 2.0, 3.0, 4.0]).realize(), Tensor([1.0, 1.0, 1.0, 1.0]).realize()
    for _ in range(3):
        np.testing.assert_equal(outer(a, b).numpy(), [4.0, 6.0, 8.0, 10.0])
    assert len(calls) == 1  # the outer jit's first call (not capturing): inner's own replay; then captured inside


def _out_buffer(t: Tensor):
    from zeptograd.buffers import buffers, view_base

    return buffers[view_base(t.uop)]


def test_a_loop_that_keeps_the_last_output_alternates_two_buffers():
    """`out = f(x)` in a loop: the replay writes the buffer of the call before last (the spare, no longer referred
    to) while the last call's output stays as it was."""
    f = _jit_add()
    y = Tensor(np.ones(4, np.float32)).realize()
    xs = [Tensor(np.full(4, float(i), np.float32)).realize() for i in range(6)]
    out, used = None, []
    for i, x in enumerate(xs):
        prev, out = out, f(x, y)
        np.testing.assert_equal(out.numpy(), [i + 1.0] * 4)
        if prev is not None:  # the last output kept its values
            np.testing.assert_equal(prev.numpy(), [float(i)] * 4)
        used.append(id(_out_buffer(out)))
        del prev
    assert len(set(used[1:])) == 2 and used[1] != used[2] and used[1::2] == [used[1]] * len(used[1::2])


def test_a_kept_spare_is_not_written():
    f = _jit_add()
    y = Tensor(np.ones(4, np.float32)).realize()
    kept = [f(Tensor(np.full(4, float(i), np.float32)).realize(), y) for i in range(3)]  # both buffers referred to
    out = f(Tensor(np.full(4, 9.0, np.float32)).realize(), y)
    np.testing.assert_equal(out.numpy(), [10.0] * 4)
    for i, k in enumerate(kept):
        np.testing.assert_equal(k.numpy(), [i + 1.0] * 4)


def test_captures_running_counts_only_running_captures():
    """A replay skips its thread's capture stack while no capture runs anywhere (realize._captures_running): each
    capture, one that raises included, leaves the count as it found it."""
    from zeptograd.engine import realize

    def boom(x):
        assert realize._captures_running and realize._capturing.stack  # counted while it captures
        if f.cnt == 1:
            raise KeyError("failed in the capture")
        return x + 1

    f = TinyJit(boom)
    with pytest.raises(AssertionError):
        f(Tensor([1.0]))  # call 1: not a capture
    f.cnt = 1
    with pytest.raises(KeyError, match="failed in the capture"):
        f(Tensor([1.0]))
    assert not realize._captures_running
    g = _jit_add()
    assert not realize._captures_running and g.captured is not None


def test_debug_2_prints_the_replayed_kernels_and_counters_count_them(capsys):
    from zeptograd import GlobalCounters
    from zeptograd.helpers import Context

    f = _jit_add()
    x, y = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.full(4, 2.0, np.float32)).realize()
    for debug in (0, 2):
        with Context(DEBUG=debug):
            GlobalCounters.reset()
            np.testing.assert_equal(f(x, y).numpy(), [3.0] * 4)
            assert GlobalCounters.kernel_count == 1 and GlobalCounters.global_mem == f.captured.mem
        printed = capsys.readouterr().out
        assert ("*** JIT replay: 1 kernels" in printed) == (debug == 2)
