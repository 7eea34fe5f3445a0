"""Python threads and os.fork: TinyJit captures per thread, concurrent realizes are serialized by the engine lock,
and a forked child gets its own kernel thread pool."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from zeptograd import Tensor, TinyJit


def rnd(*shape, seed=None):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run_threads(fns, timeout=120.0) -> list:
    """Run each fn in its own thread; the exceptions they raised (a hang fails instead of hanging)."""
    errors: list = []

    def wrap(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001  (reported to the test)
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def test_another_threads_kernels_are_not_captured():
    w = Tensor(np.zeros(4, np.float32)).realize()
    other = Tensor(rnd(4, seed=1)).realize()
    seen: list = []

    def other_thread():  # runs while the jit's call 2 captures, in the jit's thread
        w.assign(w + 1).realize()
        seen.append((other * 2).numpy())  # not refused: this thread is not capturing

    def body(x):
        body.runs += 1
        if body.runs == 2:
            assert run_threads([other_thread]) == []
        return (x * 3).contiguous()

    body.runs = 0
    f = TinyJit(body)
    for i in range(6):
        x = rnd(4, seed=10 + i)
        np.testing.assert_allclose(f(Tensor(x)).numpy(), x * 3, rtol=1e-6)
    assert body.runs == 2
    np.testing.assert_array_equal(w.numpy(), np.ones(4))  # the other thread's assign ran once, never replayed
    np.testing.assert_allclose(seen[0], other.numpy() * 2)
    assert len(f.captured.calls) == 1


@pytest.mark.slow
def test_threads_realizing_at_once():
    n_iter = 50

    def worker(k):
        def run():
            acc = Tensor(np.zeros(8, np.float32)).realize()
            acc_ref = np.zeros(8, np.float32)
            jit = TinyJit(lambda a, b: (a * b + k).relu().contiguous())
            for i in range(n_iter):
                a, b = rnd(8, seed=1000 * k + i), rnd(8, seed=1000 * k + i + 500)
                got = [
                    ((Tensor(a) + k) * Tensor(b)).sum(axis=0).numpy(),  # a different graph in each thread
                    jit(Tensor(a), Tensor(b)).numpy(),
                ]
                acc.assign(acc + Tensor(a)).realize()
                acc_ref += a
                np.testing.assert_allclose(got[0], ((a + k) * b).sum(), rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(got[1], np.maximum(a * b + k, 0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(acc.numpy(), acc_ref, rtol=1e-5, atol=1e-5)

        return run

    assert run_threads([worker(k) for k in range(4)]) == []


def test_one_jit_called_from_several_threads():
    def fn(x, out):  # each thread passes its own output buffer: no returned buffer is shared between threads
        out.assign(x * 2 + 1)

    f = TinyJit(fn)

    def run(k):
        out = Tensor(np.zeros(4096, np.float32)).realize()
        for i in range(40):
            x = rnd(4096, seed=100 * k + i)
            f(Tensor(x), out)
            np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)

    assert run_threads([lambda k=k: run(k) for k in range(3)]) == []
    assert f.cnt == 120


FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time
    import numpy as np
    from zeptograd import Tensor, TinyJit
    import zeptograd.device as device

    N = 1 << 20  # large enough to run on every core
    x = Tensor(np.ones(N, np.float32)).realize()
    assert float((x * 2).sum().item()) == 2 * N
    parent_pool = device._pool
    if parent_pool is None:
        sys.exit(2)  # no threaded kernel ran: the test would prove nothing
    stop, entered = threading.Event(), threading.Event()

    def body(t):
        entered.set()
        stop.wait()  # this call is still running in the other thread when the main thread forks
        return (t * 2).contiguous()

    jit = TinyJit(body)

    def busy():  # another thread realizing while the main thread forks
        y = Tensor(np.ones(N, np.float32)).realize()
        while not stop.is_set():
            y.assign(y * 1.0).realize()

    def in_jit():
        jit(Tensor(np.ones(4, np.float32)))

    stuck = threading.Thread(target=in_jit)
    stuck.start()
    entered.wait()

    t = threading.Thread(target=busy)
    t.start()
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            ok = float((x * (3 + k)).sum().item()) == (3 + k) * N and device._pool not in (None, parent_pool)
            stop.set()  # in the child, no thread is left to finish the jit's call: it must not stay locked
            ok = ok and jit(Tensor(np.full(4, k, np.float32))).tolist() == [2.0 * k] * 4
            os._exit(0 if ok else 1)
        for _ in range(600):  # up to 30 s, then the child is killed: a hang fails instead of hanging
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            stop.set()
            sys.exit(3)
        if os.waitstatus_to_exitcode(status) != 0:
            stop.set()
            sys.exit(4)
    stop.set()
    t.join()
    stuck.join()
    print("ok")
    """
)


@pytest.mark.slow
def test_fork_after_a_threaded_kernel():
    env = {**os.environ, "THREADS": "2", "DEV": "CPU"}
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stdout, proc.stderr[-2000:])


def test_run_on_cores_runs_each_core_once_and_raises_a_workers_error():
    from zeptograd.device import run_on_cores

    seen: list[int] = []
    run_on_cores(seen.append, 3)
    assert sorted(seen) == [0, 1, 2]

    def fail_on_core_2(core: int):
        if core == 2:
            raise ValueError(f"core {core} failed")

    with pytest.raises(ValueError, match="core 2 failed"):
        run_on_cores(fail_on_core_2, 3)
    seen.clear()
    run_on_cores(seen.append, 3)  # the pool still works after an error
    assert sorted(seen) == [0, 1, 2]


def test_run_on_cores_from_several_threads_at_once():
    # a caller that finds the workers busy runs its cores itself: every call still runs each of its cores once
    from zeptograd.device import run_on_cores

    lock = threading.Lock()
    counts: dict[tuple[int, ...], int] = {}

    def call(k: int):
        for i in range(200):

            def core_fn(core: int, key=(k, i)):
                with lock:
                    counts[key + (core,)] = counts.get(key + (core,), 0) + 1

            run_on_cores(core_fn, 2)

    assert run_threads([lambda k=k: call(k) for k in range(3)]) == []
    assert len(counts) == 3 * 200 * 2 and set(counts.values()) == {1}


@pytest.mark.parametrize("dev", ["CPU", "CPU:C"])
def test_spin_wait_returns_once_the_flag_is_set_or_after_its_polls(dev):
    # the native poll a threaded kernel's caller waits for a worker with (CorePool.run's `wait`), on both backends
    import ctypes

    from zeptograd import Device
    from zeptograd.runtime.ops_cpu import NoCompilerError

    try:
        wait = Device[dev].spin_waiter()
    except NoCompilerError:
        pytest.skip("no C compiler")
    assert wait is not None
    flag = (ctypes.c_int * 1)()
    wait(ctypes.addressof(flag), 1000)  # never set: returns after its polls
    flag[0] = 1
    wait(ctypes.addressof(flag), 1 << 62)  # set: returns at its first poll (a hang fails the test's timeout)


def test_spin_wait_pauses_between_polls_and_then_yields_the_core():
    # a caller waiting for a worker neither floods the memory system with loads while the other core streams nor
    # keeps a core a runnable thread (the worker, where both share a core) waits for
    import platform

    from zeptograd.runtime import call_table

    ir = call_table.spin_llvm_source()
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "call void @llvm.x86.sse2.pause()" in ir
    assert "call i32 @sched_yield()" in ir
    assert "sched_yield()" in call_table.spin_c_source() and "pause" in call_table.spin_c_source()
    assert call_table.SPIN_PAUSES < call_table.SPIN_LIMIT < 1 << 16


def test_threaded_kernel_caller_polls_each_workers_flag_before_it_sleeps(monkeypatch):
    # a threaded kernel's caller, its own core done, polls each worker's done-flag in native code (the device's
    # spin wait) rather than sleeping on the worker's lock at once: a wake-up from sleep costs tens of us on a VM
    import ctypes

    import zeptograd.device as device
    from zeptograd import Device
    from zeptograd.runtime import call_table

    seen: list[tuple[int, int]] = []

    def wait(addr: int, polls: int):
        native(addr, polls)
        seen.append((addr, polls))

    native = Device["CPU"].spin_waiter()
    assert native is not None
    device.run_on_cores(lambda core: None, 3, wait=wait)
    pool = device._pool
    assert pool is not None
    flags = ctypes.addressof(pool.flags)
    assert [(a - flags) // ctypes.sizeof(ctypes.c_int) for a, _ in seen] == [0, 1]
    assert all(polls == call_table.SPIN_LIMIT for _, polls in seen)
    # the spin may give up on a loaded machine (a worker not yet scheduled); the caller then sleeps on the worker's
    # lock, so every flag is set once the run returns
    assert all(ctypes.c_int.from_address(a).value == 1 for a, _ in seen)

    # and a kernel split over cores hands the device's spin wait to the pool
    from zeptograd.helpers import Context
    from zeptograd.renderer import MIN_THREAD_WORK

    waits: list = []
    orig = device.CorePool.run

    def run(self, fn, n, wait=None):
        waits.append(wait)
        return orig(self, fn, n, wait)

    monkeypatch.setattr(device.CorePool, "run", run)
    a = np.random.default_rng(0).standard_normal((MIN_THREAD_WORK // 1024, 1024), dtype=np.float32)
    with Context(THREADS=2):
        np.testing.assert_allclose(Tensor(a).sum(1).numpy(), a.sum(1), rtol=1e-4, atol=1e-4)
    assert waits and all(w is not None for w in waits)
