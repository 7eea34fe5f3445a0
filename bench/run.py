"""zeptograd against numpy and torch on the same machine, in one process.

    python -m bench                      # every case, a table on stdout (a few minutes)
    python -m bench --only softmax --only matmul --json out.json
    python -m bench --quick              # tiny sizes: checks that the harness runs, times mean nothing

Each case is timed for zeptograd and each peer it names (numpy and torch; onnxruntime for the ONNX models): one
warm-up call (zeptograd compiles its kernels there), then the median of several calls. zeptograd is timed end to
end as a user sees it (build the graph, schedule, run, realize; the CPU runtime is synchronous), with the time spent
inside kernels alongside. torch runs with
torch.set_num_threads(THREADS) (env THREADS, default os.cpu_count()), the count zeptograd's threads read.
Two probes measure the machine: memory bandwidth (numpy and zeptograd copy/sum of 256 MiB, the best of them is
the limit) and FMA throughput (numpy/torch matmul, the practical peak); each case's ratio to its limit is printed.
Peers must not disturb each other: OpenBLAS's (and torch's) worker threads busy-wait for about 0.1 s after a
call, so each system's measurement of a case starts after a 0.25 s pause (PEER_PAUSE_S). numpy's BLAS runs with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (`python -m bench` re-executes itself without them: a Haswell core
type halves sgemm on AVX-512), and the kernel OpenBLAS chose is printed (threadpoolctl).
Benchmarks are never tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from bench.spec import Spec, threads, torch_or_none

IMPLS = ("zeptograd", "numpy", "torch")  # the table's usual columns; a case may name other peers (onnxruntime)
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
PEER_PAUSE_S = 0.25  # idle time before each system's measurement, so none runs beside another's spinning threads


# ***** timing *****


@dataclass
class Timing:
    median_s: float
    runs: int
    best_s: float = 0.0  # the fastest run: what the probes report (a limit is the best the machine did)
    kernel_s: float | None = None  # zeptograd: median time inside kernels (GlobalCounters.time_sum_s)


def measure(
    fn: Callable[[], Any],
    quick: bool,
    budget_s: float = 2.0,
    max_runs: int = 10,
    counters: bool = False,
    warmups: int = 0,
) -> Timing:
    """Two warm-up calls (one if it is very slow, unless `warmups` asks for two), then the median of several calls
    (fewer when one call is slow)."""
    from zeptograd import GlobalCounters

    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    if warm < 10.0 or warmups >= 2:  # a second warm-up: a TinyJit'd function captures on its second call
        t0 = time.perf_counter()
        fn()
        warm = time.perf_counter() - t0
    if quick:
        budget_s, max_runs = 0.05, 2
    min_runs = 1 if warm > 3.0 else min(3, max_runs)
    times, kernel = [], []
    start = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - start < budget_s):
        k0 = GlobalCounters.time_sum_s
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        kernel.append(GlobalCounters.time_sum_s - k0)
    return Timing(statistics.median(times), len(times), min(times), statistics.median(kernel) if counters else None)


LOOP_BATCHES = 25  # a batch another process preempts reads several times slower (one lost slice: 4-25 ms)


def measure_loop(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call of a cheap fn: the median of LOOP_BATCHES batches of n calls, after a warm-up batch. On a
    shared machine a batch of a 5 us call takes ~1.5 ms and one preemption adds 4-25 ms to it: a median of 5 batches
    moved with every third batch hit (a row read 5-33 us at load 8-11 with unchanged CPU time per call); of 25 it
    moves only when most are."""
    for _ in range(n):
        fn()
    batches = []
    for _ in range(LOOP_BATCHES):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - t) / n)
    return statistics.median(batches)


# ***** cases *****


@dataclass
class CaseResult:
    name: str
    kind: str
    note: str = ""
    seconds: dict[str, float | None] = field(default_factory=dict)
    kernel_seconds: float | None = None
    metric: dict[str, float | None] = field(default_factory=dict)  # GB/s, GFLOPS or per second
    unit: str = ""
    ratio_to_best_peer: float | None = None  # zeptograd time / the best peer's time (>1: slower)
    fraction_of_limit: float | None = None  # zeptograd's GB/s or GFLOPS / the machine's probe
    errors: dict[str, str] = field(default_factory=dict)


def _np(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _zg(arr):
    from zeptograd import Tensor

    return Tensor(arr).realize()


_torch = torch_or_none


def _peers(np_fn, torch_fn):
    return {"numpy": np_fn, "torch": torch_fn if _torch() is not None else None}


def case_sum(q):
    n = 2**12 if q else 2**24
    a = _np(n)
    za, ta = _zg(a), _torch().from_numpy(a) if _torch() else None
    return Spec(
        {"zeptograd": lambda: za.sum().realize(), **_peers(lambda: a.sum(), lambda: ta.sum())},
        "bw",
        nbytes=a.nbytes,
        note=f"{n} f32",
    )


def case_add(q):
    n = 2**12 if q else 2**24
    a, b = _np(n, 1), _np(n, 2)
    za, zb = _zg(a), _zg(b)
    t = _torch()
    ta, tb = (t.from_numpy(a), t.from_numpy(b)) if t else (None, None)
    return Spec(
        {"zeptograd": lambda: (za + zb).realize(), **_peers(lambda: a + b, lambda: ta + tb)},
        "bw",
        nbytes=3 * a.nbytes,
        note=f"{n} f32",
    )


def case_mul_add_relu(q):
    n = 2**12 if q else 2**24
    a, b, c = _np(n, 1), _np(n, 2), _np(n, 3)
    za, zb, zc = _zg(a), _zg(b), _zg(c)
    t = _torch()
    ta, tb, tc = (t.from_numpy(a), t.from_numpy(b), t.from_numpy(c)) if t else (None,) * 3
    return Spec(
        {
            "zeptograd": lambda: (za * zb + zc).relu().realize(),
            **_peers(lambda: np.maximum(a * b + c, 0), lambda: (ta * tb + tc).relu()),
        },
        "bw",
        nbytes=4 * a.nbytes,
        note=f"(a*b+c).relu() {n} f32",
    )


def case_sin(q):
    """sin of uniform [0, 1) float32s (torch.rand's range): every lane takes the Cody-Waite reduction; the Payne-Hanek
    one (|x| >= 4096) is branched around"""
    n = 2**12 if q else 2**22
    a = np.random.default_rng(0).random(n, dtype=np.float32)
    za = _zg(a)
    t = _torch()
    ta = t.from_numpy(a) if t else None
    return Spec(
        {"zeptograd": lambda: za.sin().realize(), **_peers(lambda: np.sin(a), lambda: t.sin(ta))},
        "bw",
        nbytes=2 * a.nbytes,
        note=f"{n} f32 in [0, 1)",
    )


def _square(q):
    return 64 if q else 4096


def case_sum_last_axis(q):
    n = _square(q)
    x = _np((n, n))
    zx = _zg(x)
    t = _torch()
    tx = t.from_numpy(x) if t else None
    return Spec(
        {"zeptograd": lambda: zx.sum(axis=1).realize(), **_peers(lambda: x.sum(axis=1), lambda: tx.sum(1))},
        "bw",
        nbytes=x.nbytes + n * 4,
        note=f"({n},{n})",
    )


def _zg_softmax(x):
    if hasattr(x, "softmax"):
        return x.softmax(-1)
    e = (x - x.max(axis=-1, keepdim=True)).exp()
    return e / e.sum(axis=-1, keepdim=True)


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def case_softmax(q):
    n = _square(q)
    x = _np((n, n))
    zx = _zg(x)
    t = _torch()
    tx = t.from_numpy(x) if t else None
    from zeptograd import Tensor

    how = "Tensor.softmax" if hasattr(Tensor, "softmax") else "composed max/exp/sum"
    return Spec(
        {"zeptograd": lambda: _zg_softmax(zx).realize(), **_peers(lambda: _np_softmax(x), lambda: t.softmax(tx, -1))},
        "bw",
        nbytes=2 * x.nbytes,
        note=f"({n},{n}) {how}",
    )


def _zg_layernorm(x, eps=1e-5):
    if hasattr(x, "layernorm"):
        return x.layernorm(axis=-1, eps=eps)
    mean = x.mean(axis=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(axis=-1, keepdim=True)
    return xc * (var + eps).rsqrt()


def _np_layernorm(x, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    xc = x - mean
    return xc / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)


def case_layernorm(q):
    n = _square(q)
    x = _np((n, n))
    zx = _zg(x)
    t = _torch()
    tx = t.from_numpy(x) if t else None
    from zeptograd import Tensor

    how = "Tensor.layernorm" if hasattr(Tensor, "layernorm") else "composed mean/var"
    return Spec(
        {
            "zeptograd": lambda: _zg_layernorm(zx).realize(),
            **_peers(lambda: _np_layernorm(x), lambda: t.nn.functional.layer_norm(tx, (n,))),
        },
        "bw",
        nbytes=2 * x.nbytes,
        note=f"({n},{n}) {how}",
    )


def _zg_matmul(a, b):
    from zeptograd import Tensor

    if hasattr(Tensor, "__matmul__"):
        return a @ b
    (m, k), n = a.shape, b.shape[1]
    bt = b.T if hasattr(b, "T") else b.permute(1, 0)
    return (a.reshape(m, 1, k) * bt.reshape(1, n, k)).sum(2)


def matmul_how() -> str:
    from zeptograd import Tensor

    return "a @ b" if hasattr(Tensor, "__matmul__") else "(a.reshape(M,1,K)*b.T.reshape(1,N,K)).sum(2)"


def _case_matmul(n_full):
    def case(q):
        n = max(n_full // 32, 16) if q else n_full
        a, b = _np((n, n), 1), _np((n, n), 2)
        za, zb = _zg(a), _zg(b)
        t = _torch()
        ta, tb = (t.from_numpy(a), t.from_numpy(b)) if t else (None, None)
        return Spec(
            {"zeptograd": lambda: _zg_matmul(za, zb).realize(), **_peers(lambda: a @ b, lambda: ta @ tb)},
            "flops",
            flops=2 * n**3,
            note=f"{n}^3 via {matmul_how()}",
        )

    return case


def _case_sdpa(causal: bool):
    """scaled_dot_product_attention forward, (1, 1, 2048, 64) float32, against torch's (numpy: n/a); FLOPs of the
    full rows (q @ k.T and the product with v: 4 N^2 d), also for causal, which needs half of them."""

    def case(q):
        import zeptograd  # noqa: F401

        shape = (1, 1, 64, 16) if q else (1, 1, 2048, 64)
        arrs = [_np(shape, seed) for seed in (1, 2, 3)]
        zq, zk, zv = (_zg(a) for a in arrs)
        t = _torch()
        tq, tk, tv = (t.from_numpy(a) for a in arrs) if t else (None, None, None)
        n, d = shape[2], shape[3]
        torch_fn = (lambda: t.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)) if t else None
        return Spec(
            {
                "zeptograd": lambda: zq.scaled_dot_product_attention(zk, zv, is_causal=causal).realize(),
                "numpy": None,
                "torch": torch_fn,
            },
            "flops",
            flops=4 * n * n * d,
            note=f"{shape} float32{', is_causal' if causal else ''}, forward; numpy: n/a",
        )

    return case


def _np_conv2d(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # N,C,H,W,3,3
    return np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def case_conv2d(q):
    from zeptograd import Tensor

    bs, c, hw = (2, 8, 8) if q else (8, 64, 56)
    x, w = _np((bs, c, hw, hw), 1), _np((c, c, 3, 3), 2) * 0.1
    t = _torch()
    tx, tw = (t.from_numpy(x), t.from_numpy(w)) if t else (None, None)
    flops = 2 * bs * c * hw * hw * c * 9
    zg = None
    if hasattr(Tensor, "conv2d"):
        zx, zw = _zg(x), _zg(w)
        zg = lambda: zx.conv2d(zw, padding=1).realize()  # noqa: E731
    peers = _peers(lambda: _np_conv2d(x, w), lambda: t.nn.functional.conv2d(tx, tw, padding=1))
    return Spec(
        {"zeptograd": zg, **peers},
        "flops",
        flops=flops,
        note=f"({bs},{c},{hw},{hw})x({c},{c},3,3) pad 1" + ("" if zg else "; zeptograd: n/a (not implemented)"),
    )


def _np_conv2d_stride2(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]  # N,C,H/2,W/2,3,3
    return np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def case_conv2d_stride2(q):
    bs, c, co, hw = (2, 8, 16, 8) if q else (8, 64, 128, 56)
    x, w = _np((bs, c, hw, hw), 1), _np((co, c, 3, 3), 2) * 0.1
    t = _torch()
    tx, tw = (t.from_numpy(x), t.from_numpy(w)) if t else (None, None)
    zx, zw = _zg(x), _zg(w)
    peers = _peers(lambda: _np_conv2d_stride2(x, w), lambda: t.nn.functional.conv2d(tx, tw, padding=1, stride=2))
    return Spec(
        {"zeptograd": lambda: zx.conv2d(zw, padding=1, stride=2).realize(), **peers},
        "flops",
        flops=2 * bs * co * (hw // 2) ** 2 * c * 9,
        note=f"({bs},{c},{hw},{hw})x({co},{c},3,3) stride 2 pad 1",
    )


def case_conv2d_backward(q):
    """The input and weight gradients of conv2d given the output's gradient, without the forward on either side:
    zeptograd's Tensor.gradient of the (linear) convolution reads only the weight, the input and the output's
    gradient, and torch runs aten.convolution_backward (what autograd calls) with the same three. Two
    convolutions, each with the forward's FLOPs."""
    bs, c, hw = (2, 8, 8) if q else (8, 64, 56)
    x, w, g = _np((bs, c, hw, hw), 1), _np((c, c, 3, 3), 2) * 0.1, _np((bs, c, hw, hw), 3)
    zx, zw, zg = _zg(x), _zg(w), _zg(g)

    def zg_grads():
        gx, gw = zx.conv2d(zw, padding=1).gradient(zx, zw, gradient=zg)
        return gx.realize(gw), gw

    t = _torch()
    tgrads = None
    if t:
        tx, tw, tg = t.from_numpy(x), t.from_numpy(w), t.from_numpy(g)
        conv_backward = t.ops.aten.convolution_backward

        def tgrads():
            gx, gw, _ = conv_backward(tg, tx, tw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
            return gx, gw

    return Spec(
        {"zeptograd": zg_grads, "numpy": None, "torch": tgrads},
        "flops",
        flops=2 * (2 * bs * c * hw * hw * c * 9),
        note=f"d/dx, d/dw of ({bs},{c},{hw},{hw})x({c},{c},3,3) pad 1, no forward; numpy: n/a",
    )


def _mlp_data(bs, q):
    d_in, d_h, d_out = (32, 16, 10) if q else (784, 512, 10)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((bs, d_in), dtype=np.float32)
    y = np.eye(d_out, dtype=np.float32)[rng.integers(0, d_out, bs)]
    ws = [(rng.standard_normal(s, dtype=np.float32) * 0.05) for s in ((d_in, d_h), (d_h,), (d_h, d_out), (d_out,))]
    return x, y, ws


def _np_mlp_step(x, y, ws, lr=0.01):
    w1, b1, w2, b2 = ws
    h = np.maximum(x @ w1 + b1, 0)
    logits = h @ w2 + b2
    e = np.exp(logits - logits.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    g = (p - y) / x.shape[0]  # d(mean cross-entropy)/d logits
    gw2, gb2 = h.T @ g, g.sum(0)
    gh = (g @ w2.T) * (h > 0)
    gw1, gb1 = x.T @ gh, gh.sum(0)
    for w, gw in zip(ws, (gw1, gb1, gw2, gb2)):
        w -= lr * gw


def _zg_mlp(x, y, ws, lr=0.01, jit=False):
    """A zeptograd SGD step: params updated in place by assign (or rebound when Tensor.assign is missing)."""
    import zeptograd
    from zeptograd import Tensor

    params = [Tensor(w.copy(), requires_grad=True).realize() for w in ws]
    zx, zy = _zg(x), _zg(y)
    has_assign = hasattr(Tensor, "assign")

    def step(xb, yb):
        w1, b1, w2, b2 = params
        h = (_zg_matmul(xb, w1) + b1).relu()
        logits = _zg_matmul(h, w2) + b2
        m = logits.max(axis=1, keepdim=True)
        logp = logits - m - (logits - m).exp().sum(axis=1, keepdim=True).log()
        loss = -(logp * yb).sum(axis=1).mean()
        loss.backward()
        new = [p.detach() - lr * p.grad for p in params]
        if has_assign:
            for p, n in zip(params, new):
                p.assign(n)
            Tensor.realize(loss, *params)  # forward, backward and the update in one schedule
        else:
            Tensor.realize(loss, *new)
            params[:] = [Tensor(n.uop, requires_grad=True) for n in new]
        for p in params:
            p.grad = None
        return loss

    if jit:
        jitted = zeptograd.TinyJit(step)
        return lambda: jitted(zx, zy)
    return lambda: step(zx, zy)


def _case_mlp_step(jit: bool):
    def case(q):
        import zeptograd
        from zeptograd import Tensor

        bs = 16 if q else 256
        x, y, ws = _mlp_data(bs, q)
        np_ws = [w.copy() for w in ws]
        t = _torch()
        tstep = None
        if t:
            tws = [t.tensor(w, requires_grad=True) for w in ws]
            tx, ty = t.from_numpy(x), t.from_numpy(y)

            def tstep():
                w1, b1, w2, b2 = tws
                logits = t.relu(tx @ w1 + b1) @ w2 + b2
                loss = -(t.log_softmax(logits, 1) * ty).sum(1).mean()
                loss.backward()
                with t.no_grad():
                    for w in tws:
                        w -= 0.01 * w.grad
                        w.grad = None

        missing = [
            what
            for what, ok in [
                ("autograd", hasattr(Tensor, "backward")),
                ("TinyJit", not jit or hasattr(zeptograd, "TinyJit")),
                ("assign", not jit or hasattr(Tensor, "assign")),
            ]
            if not ok
        ]
        zg = None if missing else _zg_mlp(x, y, ws, jit=jit)
        note = (
            f"{x.shape[1]}-{ws[0].shape[1]}-10 batch {bs} SGD, "
            + ("TinyJit step" if jit else "eager")
            + (f"; zeptograd: n/a (no {', '.join(missing)})" if missing else "")
        )
        runners = {"zeptograd": zg, "numpy": lambda: _np_mlp_step(x, y, np_ws), "torch": tstep}
        return Spec(runners, "rate", note=note, warmups=2 if jit else 0)

    return case


def case_first_call(q):
    """A never-compiled elementwise kernel: unique constants, so neither the kernel cache nor the disk cache hit."""
    n = 1024
    x = np.abs(_np(n))
    zx = _zg(x)
    t = _torch()
    tx = t.from_numpy(x) if t else None
    rng = random.Random(time.time_ns())

    def zg():
        c1, c2 = rng.randint(1, 2**22) / 64.0, rng.randint(1, 2**22) / 128.0
        (zx * c1 + c2).sqrt().exp2().numpy()

    c = 1.2345
    return Spec(
        {"zeptograd": zg, **_peers(lambda: np.exp2(np.sqrt(x * c + c)), lambda: (tx * c + c).sqrt().exp2())},
        "latency",
        note=f"build+schedule+compile+run+numpy, {n} f32",
    )


def _small(q):
    a, b = _np(16, 1), _np(16, 2)
    t = _torch()
    return a, b, _zg(a), _zg(b), t, (t.from_numpy(a), t.from_numpy(b)) if t else (None, None)


def case_overhead(q):
    a, b, za, zb, t, (ta, tb) = _small(q)
    return Spec(
        {"zeptograd": lambda: (za + zb).realize(), **_peers(lambda: a + b, lambda: ta + tb)},
        "latency",
        note="(a+b).realize() on 16 f32, eager",
        loop=20 if q else 300,
    )


def case_overhead_jit(q):
    import zeptograd

    a, b, za, zb, t, (ta, tb) = _small(q)
    jit = getattr(zeptograd, "TinyJit", None)
    f = jit(lambda x, y: x + y) if jit else None
    return Spec(
        {"zeptograd": (lambda: f(za, zb)) if f else None, **_peers(lambda: a + b, lambda: ta + tb)},
        "latency",
        note="TinyJit(a+b) replay on 16 f32" + ("" if f else "; n/a (no TinyJit)"),
        loop=20 if q else 2000,
    )


CASES: dict[str, Callable[[bool], Spec]] = {
    "sum": case_sum,
    "add": case_add,
    "mul_add_relu": case_mul_add_relu,
    "sin": case_sin,
    "sum_last_axis": case_sum_last_axis,
    "softmax": case_softmax,
    "layernorm": case_layernorm,
    "matmul_512": _case_matmul(512),
    "matmul_1024": _case_matmul(1024),
    "matmul_2048": _case_matmul(2048),
    "conv2d": case_conv2d,
    "conv2d_stride2": case_conv2d_stride2,
    "conv2d_backward": case_conv2d_backward,
    "sdpa": _case_sdpa(causal=False),
    "sdpa_causal": _case_sdpa(causal=True),
    "mlp_step": _case_mlp_step(jit=False),
    "mlp_step_jit": _case_mlp_step(jit=True),
    "first_call": case_first_call,
    "overhead": case_overhead,
    "overhead_jit": case_overhead_jit,
    **__import__("bench.cases_train", fromlist=["TRAIN_CASES"]).TRAIN_CASES,  # mlp_train, digits_train, *_shard2
    **__import__("bench.cases_odd", fromlist=["ODD_CASES"]).ODD_CASES,  # sizes 16 and the cores don't divide
    **__import__("bench.cases_models", fromlist=["MODEL_CASES"]).MODEL_CASES,  # minilm: a pretrained BERT
    **__import__("bench.cases_onnx", fromlist=["ONNX_CASES"]).ONNX_CASES,  # ONNX models vs onnxruntime
    **__import__("bench.cases_startup", fromlist=["STARTUP_CASES"]).STARTUP_CASES,  # whole-process startup
}


def select(only: list[str] | None) -> list[str]:
    """Case names for --only values: an exact name, else every case it prefixes ('matmul' -> matmul_*)."""
    if not only:
        return list(CASES)
    wanted = [w for o in only for w in o.split(",") if w]
    match = {w: [w] if w in CASES else [n for n in CASES if n.startswith(w + "_")] for w in wanted}
    unknown = [w for w, names in match.items() if not names]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    chosen = {n for names in match.values() for n in names}
    return [n for n in CASES if n in chosen]


def run_case(name: str, quick: bool) -> CaseResult:
    spec = CASES[name](quick)
    res = CaseResult(name, spec.kind, spec.note)
    for impl in ("zeptograd", *(k for k in spec.runners if k != "zeptograd")):
        fn = spec.runners.get(impl)
        if fn is None:
            res.seconds[impl] = None
            continue
        if not quick:
            time.sleep(PEER_PAUSE_S)  # the previous system's BLAS threads spin for ~0.1 s after its last call
        try:
            if spec.loop:
                res.seconds[impl] = measure_loop(fn, spec.loop)
            elif spec.kind == "latency":  # every call is a first call: no warm-up to drop
                ts = []
                for _ in range(2 if quick else spec.runs or 5):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                res.seconds[impl] = statistics.median(ts)
            else:
                tm = measure(fn, quick, counters=impl == "zeptograd", warmups=spec.warmups)
                res.seconds[impl] = tm.median_s
                if impl == "zeptograd":
                    res.kernel_seconds = tm.kernel_s
        except Exception as e:  # a broken implementation is a row in the table, not a crash
            res.seconds[impl] = None
            res.errors[impl] = f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    res.unit = {"bw": "GB/s", "flops": "GFLOPS", "rate": "steps/s", "latency": "us"}[spec.kind]
    for impl, s in res.seconds.items():
        if s is None or s <= 0:
            res.metric[impl] = None
        elif spec.kind == "bw":
            res.metric[impl] = spec.nbytes / s / 1e9
        elif spec.kind == "flops":
            res.metric[impl] = spec.flops / s / 1e9
        elif spec.kind == "rate":
            res.metric[impl] = 1 / s
        else:
            res.metric[impl] = s * 1e6
    peers = [s for i, s in res.seconds.items() if i != "zeptograd" and s]
    if res.seconds.get("zeptograd") and peers:
        res.ratio_to_best_peer = res.seconds["zeptograd"] / min(peers)
    return res


# ***** probes: the machine's limits *****


def _best(fn: Callable[[], Any], quick: bool) -> float:
    """The fastest of up to 15 runs (3 s): a limit is the best the machine did, not its typical run."""
    return measure(fn, quick, budget_s=3.0, max_runs=15).best_s


def _bw_numpy(a: np.ndarray, quick: bool) -> dict[str, float]:
    dst = np.empty_like(a)
    return {
        "numpy_copy_GBps": 2 * a.nbytes / _best(lambda: np.copyto(dst, a), quick) / 1e9,
        "numpy_read_GBps": a.nbytes / _best(lambda: a.sum(), quick) / 1e9,
    }


def _bw_zeptograd(a: np.ndarray, quick: bool) -> dict[str, Any]:
    try:
        za = _zg(a)
        return {
            "zeptograd_copy_GBps": 2 * a.nbytes / _best(lambda: za.contiguous().realize(), quick) / 1e9,
            "zeptograd_read_GBps": a.nbytes / _best(lambda: za.sum().realize(), quick) / 1e9,
        }
    except Exception as e:
        return {"zeptograd_probe_error": f"{type(e).__name__}: {e}"}


def probes(quick: bool) -> dict[str, Any]:
    """Bandwidth: a copy (read + write counted) and a read of 256 MiB; FMA: a 2048^3 matmul. Best runs."""
    a = np.ones((2**20 if quick else 2**28) // 4, np.float32)
    out: dict[str, Any] = {**_bw_numpy(a, quick), **_bw_zeptograd(a, quick)}
    del a
    gc.collect()
    out["bandwidth_limit_GBps"] = max(v for k, v in out.items() if k.endswith("GBps"))
    m = 256 if quick else 2048
    x, y = _np((m, m), 1), _np((m, m), 2)
    out["numpy_matmul_GFLOPS"] = 2 * m**3 / _best(lambda: x @ y, quick) / 1e9
    t = _torch()
    if t:
        tx, ty = t.from_numpy(x), t.from_numpy(y)
        out["torch_matmul_GFLOPS"] = 2 * m**3 / _best(lambda: tx @ ty, quick) / 1e9
    out["fma_peak_GFLOPS"] = max(v for k, v in out.items() if k.endswith("GFLOPS"))
    return out


# ***** the whole run *****


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    t = _torch()
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "threads": threads(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": t.__version__ if t else None,
        "blas_env": {k: os.environ[k] for k in BLAS_ENV if k in os.environ},
        "blas": blas_kernel(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def blas_kernel() -> str | None:
    """numpy's BLAS and the kernel it picked for this CPU (threadpoolctl), e.g. 'openblas SkylakeX, 2 threads'."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for lib in threadpool_info():
        if lib.get("user_api") == "blas" and "numpy" in lib.get("filepath", ""):
            return f"{lib.get('internal_api')} {lib.get('architecture')}, {lib.get('num_threads')} threads"
    return None


def run_bench(
    only: list[str] | None = None, quick: bool = False, progress: bool = True, with_probes: bool = True
) -> dict[str, Any]:
    """Run the selected cases (and the probes); returns {"machine", "limits", "cases": [CaseResult as dict]}."""
    from tqdm import tqdm

    names = select(only)
    machine = machine_info()
    steps = (["probes"] if with_probes else []) + names
    results, limits = [], {}
    bar = tqdm(steps, desc="bench", unit="case", disable=not progress, file=sys.stderr, leave=False)
    for step in bar:
        bar.set_postfix_str(step)
        if step == "probes":
            limits = probes(quick)
            continue
        res = run_case(step, quick)
        zg = res.metric.get("zeptograd")
        if zg and limits:
            lim = {"bw": limits["bandwidth_limit_GBps"], "flops": limits["fma_peak_GFLOPS"]}.get(res.kind)
            res.fraction_of_limit = zg / lim if lim else None
        results.append(res)
        gc.collect()
    bar.close()
    return {"machine": machine, "quick": quick, "limits": limits, "cases": [asdict(r) for r in results]}


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def columns(cases: list[dict[str, Any]]) -> list[str]:
    """zeptograd, numpy and torch, then every other peer a case names (onnxruntime), in the order met."""
    out = list(IMPLS)
    for c in cases:
        out += [i for i in c["seconds"] if i not in out]
    return out


def format_report(report: dict[str, Any]) -> str:
    m, lim = report["machine"], report["limits"]
    lines = [
        f"zeptograd bench: {m['cpu']}, {m['cpu_count']} cpus, THREADS={m['threads']} "
        f"(torch.set_num_threads), numpy {m['numpy']}, torch {m['torch']}, python {m['python']}"
        + (" [--quick: tiny sizes, times mean nothing]" if report.get("quick") else "")
    ]
    if m.get("load_avg_1m") is not None:
        busy = m["load_avg_1m"] > 0.5 * (m["cpu_count"] or 1)
        lines.append(
            f"load average at the start: {m['load_avg_1m']:.1f}"
            + (" (the machine is busy: times are inflated)" if busy else "")
        )
    if m.get("blas"):
        lines.append(f"numpy's BLAS: {m['blas']}")
    for k, v in m["blas_env"].items():
        lines.append(f"WARNING: {k}={v} is set: it can slow numpy's BLAS (BENCH_KEEP_BLAS_ENV=1 kept it)")
    if lim:
        bw = ", ".join(
            f"{k.removesuffix('_GBps')} {v:.1f}"
            for k, v in lim.items()
            if k.endswith("GBps") and k != "bandwidth_limit_GBps"
        )
        fl = ", ".join(
            f"{k.removesuffix('_GFLOPS')} {v:.0f}"
            for k, v in lim.items()
            if k.endswith("GFLOPS") and k != "fma_peak_GFLOPS"
        )
        lines.append(
            f"limits: bandwidth {lim['bandwidth_limit_GBps']:.1f} GB/s ({bw}); "
            f"FMA peak {lim['fma_peak_GFLOPS']:.0f} GFLOPS ({fl})"
        )
        if "zeptograd_probe_error" in lim:
            lines.append(f"  zeptograd probe failed: {lim['zeptograd_probe_error']}")
    impls = columns(report["cases"])
    peers = impls[1:]
    hdr = (
        f"{'case':<15} {'zeptograd':>10} {'(kernels)':>10} "
        + "".join(f"{p[:11]:>12}" for p in peers)
        + f"  {'unit':<7} {'zg':>7} "
        + "".join(f"{p[:7]:>8}" for p in peers)
        + f" {'zg/best':>8} {'zg/limit':>8}  note"
    )
    lines += [hdr, "-" * len(hdr)]
    for c in report["cases"]:
        s, mt = c["seconds"], c["metric"]
        r = c["ratio_to_best_peer"]
        ratio = "-" if not r else f"{r:.2g}x" if r < 10 else f"{r:.1f}x" if r < 100 else f"{r:.0f}x"
        frac = f"{c['fraction_of_limit'] * 100:.0f}%" if c["fraction_of_limit"] else "-"
        kern = _fmt_time(c["kernel_seconds"]) if c["kernel_seconds"] else ""
        metric = [_fmt_num(mt.get(i)) if c["unit"] != "us" else "" for i in impls]
        note = c["note"] + "".join(f"; {i} error: {e}" for i, e in c["errors"].items())
        lines.append(
            f"{c['name']:<15} {_fmt_time(s.get('zeptograd')):>10} {kern:>10} "
            + "".join(f"{_fmt_time(s.get(p)):>12}" for p in peers)
            + f"  {c['unit'] if c['unit'] != 'us' else 'time':<7} {metric[0]:>7} "
            + "".join(f"{m:>8}" for m in metric[1:])
            + f" {ratio:>8} {frac:>8}  {note}"
        )
    lines.append(
        "zg/best: zeptograd's time / the fastest peer's (>1 is slower); zg/limit: zeptograd's GB/s or "
        "GFLOPS / the probe's best (over 100%: zeptograd beat the probe); (kernels): time inside kernels"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only this case (repeatable; a prefix like 'matmul' selects all): {', '.join(CASES)}",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few runs (a smoke test of the harness)")
    ap.add_argument("--no-probes", action="store_true", help="skip the bandwidth and FMA probes")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    report = run_bench(args.only, quick=args.quick, with_probes=not args.no_probes)
    report["wall_s"] = time.perf_counter() - t0
    print(format_report(report))
    print(f"(whole run: {report['wall_s']:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))


if __name__ == "__main__":
    main()
