"""Cases with sizes the vector width (16 floats) and the core count do not divide: the tails of issue 5.

    add_odd              a + b on 2**24+3 f32
    sum_odd              a.sum() on 2**24+3 f32
    sum_last_axis_odd    x.sum(1) on (4096, 1000)
    sum_first_axis_odd   x.sum(0) on (4099, 1003): the reduce over a non-last axis
    softmax_odd          x.softmax(-1) on (4096, 1000)
    matmul1000_odd       (1000, 1000) @ (1000, 1000)
    matmul513_odd        (513, 257) @ (257, 513)  (not matmul_*: `--only matmul` selects the square cases)
    setitem_loop_odd     1000 `t[i] = i` on a realized (1000,) f32, then one realize: the Python work of a loop
                         of lazy setitems (one kernel, compiled at the first call; the median call hits the cache)

Registered in bench/run.py's CASES (`**ODD_CASES`). Like bench/cases_train.py, the case functions return an object
with Spec's fields, so this module does not import bench.run.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from bench.spec import Spec, torch_or_none


def _np(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def _zg(arr):
    from zeptograd import Tensor

    return Tensor(arr).realize()


def _three(np_fn, zg_fn, torch_fn, arrays, **kw) -> Spec:
    """runners for zeptograd, numpy and torch over the same input arrays"""
    t = torch_or_none()
    zs, ts = [_zg(a) for a in arrays], [t.from_numpy(a) for a in arrays] if t else None
    return Spec(
        {
            "zeptograd": lambda: zg_fn(*zs).realize(),
            "numpy": lambda: np_fn(*arrays),
            "torch": (lambda: torch_fn(*ts)) if ts else None,
        },
        **kw,
    )


def case_add_odd(q):
    n = 2**12 + 3 if q else 2**24 + 3
    a, b = _np(n, 1), _np(n, 2)
    return _three(
        lambda x, y: x + y,
        lambda x, y: x + y,
        lambda x, y: x + y,
        [a, b],
        kind="bw",
        nbytes=3 * a.nbytes,
        note=f"{n} f32",
    )


def case_sum_odd(q):
    n = 2**12 + 3 if q else 2**24 + 3
    a = _np(n)
    return _three(
        lambda x: x.sum(), lambda x: x.sum(), lambda x: x.sum(), [a], kind="bw", nbytes=a.nbytes, note=f"{n} f32"
    )


def case_sum_last_axis_odd(q):
    shape = (64, 100) if q else (4096, 1000)
    x = _np(shape)
    return _three(
        lambda v: v.sum(axis=1),
        lambda v: v.sum(axis=1),
        lambda v: v.sum(1),
        [x],
        kind="bw",
        nbytes=x.nbytes,
        note=f"{shape}",
    )


def case_sum_first_axis_odd(q):
    shape = (67, 103) if q else (4099, 1003)
    x = _np(shape)
    return _three(
        lambda v: v.sum(axis=0),
        lambda v: v.sum(axis=0),
        lambda v: v.sum(0),
        [x],
        kind="bw",
        nbytes=x.nbytes,
        note=f"{shape}",
    )


def _np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def case_softmax_odd(q):
    shape = (64, 100) if q else (4096, 1000)
    x = _np(shape)
    t = torch_or_none()
    return _three(
        _np_softmax,
        lambda v: v.softmax(-1),
        lambda v: t.softmax(v, -1),
        [x],
        kind="bw",
        nbytes=2 * x.nbytes,
        note=f"{shape}",
    )


def _case_matmul(m, k, n):
    def case(q):
        mm, kk, nn = (m // 16 + 1, k // 16 + 1, n // 16 + 1) if q else (m, k, n)
        a, b = _np((mm, kk), 1), _np((kk, nn), 2)
        return _three(
            lambda x, y: x @ y,
            lambda x, y: x @ y,
            lambda x, y: x @ y,
            [a, b],
            kind="flops",
            flops=2 * mm * kk * nn,
            note=f"({mm},{kk})@({kk},{nn})",
        )

    return case


def case_setitem_loop_odd(q):
    n = 50 if q else 1000
    t = torch_or_none()

    def zg():
        from zeptograd import Tensor

        x = Tensor.zeros(n).contiguous().realize()
        for i in range(n):
            x[i] = i
        return x.realize()

    def loop(x):
        for i in range(n):
            x[i] = i
        return x

    return Spec(
        {
            "zeptograd": zg,
            "numpy": lambda: loop(np.zeros(n, np.float32)),
            "torch": (lambda: loop(t.zeros(n))) if t else None,
        },
        "latency",
        note=f"{n} setitems + realize, f32",
    )


ODD_CASES: dict[str, Callable[[bool], Spec]] = {
    "add_odd": case_add_odd,
    "sum_odd": case_sum_odd,
    "sum_last_axis_odd": case_sum_last_axis_odd,
    "sum_first_axis_odd": case_sum_first_axis_odd,
    "softmax_odd": case_softmax_odd,
    "matmul1000_odd": _case_matmul(1000, 1000, 1000),
    "matmul513_odd": _case_matmul(513, 257, 513),
    "setitem_loop_odd": case_setitem_loop_odd,
}
