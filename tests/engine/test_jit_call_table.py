"""A TinyJit replay makes its kernels' calls in one foreign call (runtime/call_table.py): the captured CPU kernels in
one table, the written replay calling the runner once, the pointers it changes (new inputs, swapped output buffers)
written into the table; CPU:C's kernels are called through a prototype bound once."""

import ctypes
import shutil

import numpy as np
import pytest

from zeptograd import Tensor, TinyJit
from zeptograd.runtime import call_table


def _chain(n_kernels: int):
    """A function of n_kernels small kernels (each .contiguous() ends one)."""

    def fxn(x, y):
        for i in range(n_kernels - 1):
            x = (x + y).contiguous() * (i + 2)
        return x + y

    return fxn


def _expected(n_kernels: int, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    for i in range(n_kernels - 1):
        x = (x + y) * (i + 2)
    return x + y


def _foreign_calls(f: TinyJit) -> list[str]:
    """The names the written replay calls kernels by: R<i> a table's runner, F<i> one kernel."""
    assert f.captured is not None and f.captured.fast_replay is not None
    return sorted(n for n in f.captured.fast_replay.__code__.co_names if n[0] in "RF" and n[1:].isdigit())


@pytest.mark.skipif(not call_table.usable, reason="the runner reads 64-bit words")
@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_the_kernels_of_a_capture_run_in_one_foreign_call(device):
    if device == "CPU:C" and shutil.which("cc") is None:
        pytest.skip("no C compiler")
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(16, dtype=np.float32) for _ in range(3)]
    ys = [rng.standard_normal(16, dtype=np.float32) for _ in range(3)]
    zx = [Tensor(x, device=device).realize() for x in xs]
    zy = [Tensor(y, device=device).realize() for y in ys]
    f = TinyJit(_chain(10))
    kept = []
    for step in range(12):  # the same inputs twice in a row, then others; some outputs kept (a swapped buffer)
        i = (step // 2) % 3
        out = f(zx[i], zy[i])
        np.testing.assert_allclose(out.numpy(), _expected(10, xs[i], ys[i]), rtol=1e-6)
        if step % 3 == 0:
            kept.append((i, out))
    cap = f.captured
    assert cap is not None and len(cap.calls) == 10
    assert [table is not None for table, _ in cap.steps] == [True]  # all ten in one table
    assert _foreign_calls(f) == ["R0"]
    for i, out in kept:  # what a replay wrote through the table stayed with the call that returned it
        np.testing.assert_allclose(out.numpy(), _expected(10, xs[i], ys[i]), rtol=1e-6)


def test_a_kernel_on_several_cores_is_called_between_tables():
    big = 1 << 20
    f = TinyJit(lambda x, y: ((x + 1).contiguous() * y).sum() + (x[:16] * 2).contiguous().sum())
    x, y = Tensor(np.ones(big, np.float32)).realize(), Tensor(np.full(big, 2.0, np.float32)).realize()
    for _ in range(4):
        np.testing.assert_allclose(f(x, y).numpy(), 4.0 * big + 32.0)
    cap = f.captured
    assert cap is not None
    native = [getattr(program, "native")() is not None for program, _, _ in cap.calls]
    # every native call is in a table, every other one called on its own, in the captured order
    order = [ci for table, ci in cap.steps for ci in ([ci] if table is None else [c for c in range(len(cap.calls))
             if cap.table_of[c] is not None and cap.table_of[c][0] is table])]  # fmt: skip
    assert order == list(range(len(cap.calls)))
    assert all((cap.table_of[ci] is not None) == native[ci] for ci in range(len(cap.calls)))


def test_a_multi_kernel_replay_tests_aliasing_inline():
    f = TinyJit(_chain(3))
    x, y = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    for _ in range(3):
        f(x, y)
    assert f.captured is not None and f.captured.written  # intermediates: buffers the replay writes

    def no_call(*args):
        raise AssertionError("copy_aliased called for inputs that alias nothing")

    f.captured.fast_replay.__globals__["copy_aliased"] = no_call
    np.testing.assert_allclose(f(x, y).numpy(), _expected(3, np.ones(16), np.ones(16)))


def test_an_output_passed_back_into_a_multi_kernel_capture_is_copied():
    f = TinyJit(_chain(3))
    x, y = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    for _ in range(3):
        h = f(x, y)
    ref = _expected(3, np.ones(16, np.float32), np.ones(16, np.float32))
    for _ in range(3):
        h_np = h.numpy()
        h = f(h, y)
        ref = _expected(3, h_np, np.ones(16, np.float32))
        np.testing.assert_allclose(h.numpy(), ref, rtol=1e-6)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_cpu_c_kernels_have_their_prototype_bound_once():
    f = TinyJit(lambda x, y: x + y)
    x, y = Tensor(np.ones(16, np.float32), device="CPU:C").realize(), Tensor(np.ones(16, np.float32), device="CPU:C")
    for _ in range(3):
        f(x, y.realize())
    assert f.captured is not None
    program = f.captured.calls[0][0]
    assert program.fxn.argtypes == (ctypes.c_void_p,) * 3
    assert program.direct_call() == (program.fxn, None)  # plain ints: no c_void_p made per pointer


def _releases_gil(runner) -> bool:
    return not runner._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # a CFUNCTYPE drops the GIL, a PYFUNCTYPE keeps it


@pytest.mark.skipif(not call_table.usable, reason="the runner reads 64-bit words")
def test_a_small_replay_keeps_the_gil_and_a_large_one_releases_it():
    small = TinyJit(lambda x, y: x + y)
    x, y = Tensor(np.ones(16, np.float32)).realize(), Tensor(np.ones(16, np.float32)).realize()
    for _ in range(3):
        small(x, y)
    assert small.captured is not None and small.captured.steps[0][0] is not None
    assert not _releases_gil(small.captured.steps[0][0].runner)
    large = TinyJit(lambda x, y: x + y)
    n = call_table.HOLD_GIL_BYTES // 4
    bx, by = Tensor(np.ones(n, np.float32)).realize(), Tensor(np.ones(n, np.float32)).realize()
    for _ in range(3):
        np.testing.assert_equal(large(bx, by).numpy()[:4], [2.0] * 4)
    tables = [table for table, _ in large.captured.steps if table is not None] if large.captured else []
    assert all(_releases_gil(table.runner) for table in tables)


def test_a_call_with_more_pointers_than_the_runner_takes_is_refused():
    """The runner has one case per pointer count up to MAX_ARGS; a call past it would be skipped without a word, so
    the table refuses it (Program.native keeps such kernels out of tables: they are called on their own)."""
    from zeptograd.runtime import call_table

    call_table.CallTable(lambda table: None, [(0, [0] * call_table.MAX_ARGS)])
    with pytest.raises(ValueError, match=f"at most {call_table.MAX_ARGS} pointers"):
        call_table.CallTable(lambda table: None, [(0, [0] * (call_table.MAX_ARGS + 1))])


@pytest.mark.skipif(not call_table.usable, reason="the runner reads 64-bit words")
def test_a_training_step_with_a_label_check_replays_through_tables():
    """A training step (weights updated in place: no written replay) whose loss checks its labels on every replay
    (tensor/indexing.py) runs its kernels through call tables too, a table ending at the kernel the check follows:
    the check still raises before the update's kernels run."""
    from zeptograd.nn.optim import SGD

    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 5)).astype(np.float32)
    w = Tensor(w0.copy(), requires_grad=True)
    opt = SGD([w], lr=0.1)
    x = Tensor(rng.standard_normal((6, 4)).astype(np.float32)).realize()

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (x @ w).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step(loss)
        return loss

    ys = [[0, 1, 2, 3, 4, 0], [1, 2, 3, 4, 0, 1], [4, 4, 4, 0, 0, 0], [2, 2, 3, 3, 1, 1]]
    for y in ys:
        step(x, Tensor(y))
    cap = step.captured
    assert cap is not None and cap.checks and cap.fast_replay is None
    tables = [table for table, _ in cap.steps if table is not None]
    assert tables and sum(len(t.at) for t in tables) == sum(t is not None for t in cap.table_of)
    assert all(ci in cap.step_ends for ci in cap.checks if ci >= 0)  # a check runs between two steps
    before = w.numpy().copy()
    with pytest.raises(IndexError, match="Target 5 is out of bounds"):
        step(x, Tensor([0, 1, 5, 3, 4, 0]))
    np.testing.assert_array_equal(w.numpy(), before)
    import torch

    tw = torch.tensor(w0, requires_grad=True)
    for y in ys:
        tw.grad = None
        torch.nn.functional.cross_entropy(torch.tensor(x.numpy()) @ tw, torch.tensor(y)).backward()
        with torch.no_grad():
            tw -= 0.1 * tw.grad
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-5)
