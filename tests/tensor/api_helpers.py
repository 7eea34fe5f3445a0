"""Harness for the Tensor op suites (one per op family: test_creation, test_movement, test_elementwise, test_reduce,
test_indexing, test_nn_ops, test_autograd). Two oracles:
- `check(zfn, tfn, *inputs)`: run one op on zeptograd and on torch (CPU) with the same inputs, then compare values
  (floats to atol 1e-6 / rtol 1e-3, others exactly), dtypes, shapes, and the gradients of every float input (to
  atol 1e-4 / rtol 1e-3) under the same random upstream gradient.
- `check_numpy(t, expected, dtype)`: a zeptograd result against numpy's, usually computed in float64 and rounded,
  with tighter default tolerances (rtol 1e-5 / atol 1e-6), the dtype of both the Tensor and its `.numpy()`, and
  dtypes torch lacks (uint16/32/64 arithmetic)."""

import contextlib
import math
import signal

import numpy as np
import torch

from zeptograd import Tensor, dtypes

NP_OF = {
    "bool": np.bool_,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
}
TORCH_OF = {
    "bool": torch.bool,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "uint16": torch.uint16,
    "uint32": torch.uint32,
    "uint64": torch.uint64,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
}
ZEPTO_OF = {name: getattr(dtypes, name) for name in NP_OF}


def data(shape, dtype="float32", lo=-2.0, hi=2.0, seed=0, distinct=False, avoid_zero=False):
    """Deterministic test data. distinct=True: no two values equal (so max/sort have a unique answer);
    avoid_zero=True: no zero (ints) or nothing within 0.25 of it (floats), for divisors."""
    if not isinstance(dtype, str):  # data(shape, lo, hi): float32
        dtype, lo, hi = "float32", dtype, lo
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(rng.random(shape) > 0.5)
    if np.issubdtype(NP_OF[dtype], np.integer):
        x = rng.integers(math.floor(lo), math.ceil(hi) + 1, size=shape)
        return np.asarray(np.where(x == 0, 1, x) if avoid_zero else x).astype(NP_OF[dtype])
    if distinct:
        n = int(np.prod(shape))
        return (
            (lo + (hi - lo) * (rng.permutation(n) + rng.random(n) * 0.5) / max(n, 1))
            .reshape(shape)
            .astype(NP_OF[dtype])
        )
    x = rng.uniform(lo, hi, size=shape)
    if avoid_zero:
        x = np.where(np.abs(x) < 0.25, 0.5, x)
    return np.asarray(x).astype(NP_OF[dtype])


class V:
    """An input: numpy data, optionally seen through a view (the same lambda works on both libraries, e.g. a permute or
    a slice, which makes it non-contiguous). Gradients are compared on the base tensor."""

    def __init__(self, arr, view=None, grad=True):
        self.arr, self.view, self.grad = np.asarray(arr), view, grad


def same_dtype(z, t):
    name = str(t.dtype).replace("torch.", "")
    assert z.dtype == ZEPTO_OF[name], f"dtype {z.dtype} != torch's {t.dtype}"


def compare(z, t, atol=1e-6, rtol=1e-3, what="value"):
    same_dtype(z, t)
    zn, tn = z.numpy(), t.detach().numpy()
    assert zn.shape == tn.shape, f"{what}: shape {zn.shape} != torch's {tn.shape}"
    if np.issubdtype(tn.dtype, np.floating):
        np.testing.assert_allclose(zn, tn, atol=atol, rtol=rtol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(zn, tn, err_msg=what)


def check(zfn, tfn, *inputs, grad=True, atol=1e-6, rtol=1e-3, gatol=1e-4, grtol=1e-3, seed=100):
    """zfn(*zeptograd inputs) against tfn(*torch inputs): values, dtypes, shapes, then gradients."""
    zs, ts, leaves = [], [], []
    for inp in inputs:
        if not isinstance(inp, V):
            zs.append(inp)
            ts.append(inp)
            continue
        rg = grad and inp.grad and np.issubdtype(inp.arr.dtype, np.floating)
        zb, tb = Tensor(inp.arr, requires_grad=rg or None), torch.tensor(inp.arr, requires_grad=rg)
        zs.append(inp.view(zb) if inp.view else zb)
        ts.append(inp.view(tb) if inp.view else tb)
        if rg:
            leaves.append((zb, tb))
    zo, to = zfn(*zs), tfn(*ts)
    zo, to = (list(zo), list(to)) if isinstance(to, (tuple, list)) else ([zo], [to])
    assert len(zo) == len(to), f"{len(zo)} outputs, torch has {len(to)}"
    for i, (z, t) in enumerate(zip(zo, to)):
        compare(z, t, atol, rtol, f"output {i}")
    outs = [(z, t) for z, t in zip(zo, to) if t.requires_grad and t.dtype.is_floating_point]
    if not leaves or not outs:
        return zo
    rng = np.random.default_rng(seed)
    gs = [rng.uniform(-1, 1, size=t.shape).astype(np.float32) for _, t in outs]
    tloss = sum((t * torch.tensor(g).to(t.dtype)).sum() for (_, t), g in zip(outs, gs))
    zloss = sum((z * Tensor(g).cast(z.dtype)).sum() for (z, _), g in zip(outs, gs))
    tloss.backward()
    if zloss.requires_grad:  # else no float input reaches the output differentiably (x ** 0): all gradients are 0
        zloss.backward()
    for i, (zb, tb) in enumerate(leaves):
        tg = tb.grad if tb.grad is not None else torch.zeros_like(tb)
        zg = zb.grad if zb.grad is not None else zb.zeros_like()
        compare(zg, tg, gatol, grtol, f"gradient of input {i}")
    return zo


def tol_for(dtype_name, transcendental=False):
    """check_numpy's tolerances for a result of dtype `dtype_name`"""
    if dtype_name == "float16":
        return dict(rtol=2e-3, atol=2e-3)
    if transcendental:
        return dict(rtol=1e-4, atol=1e-6)
    return dict(rtol=1e-5, atol=1e-6)


def check_numpy(t, expected, dtype=None, rtol=1e-5, atol=1e-6):
    """A zeptograd Tensor against a numpy array. dtype: the expected dtype name (checked on both t.dtype and
    t.numpy().dtype); defaults to the name of expected's numpy dtype."""
    expected = np.asarray(expected)
    if dtype is None:
        dtype = expected.dtype.name
    assert t.dtype == ZEPTO_OF[dtype], f"dtype {t.dtype} != {dtype}"
    out = t.numpy()
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(NP_OF[dtype]), f"numpy dtype {out.dtype} != {dtype}"
    assert out.shape == expected.shape, f"shape {out.shape} != {expected.shape}"
    assert tuple(t.shape) == expected.shape
    if np.issubdtype(out.dtype, np.floating):
        np.testing.assert_allclose(out, expected.astype(out.dtype), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(out, expected.astype(out.dtype))


@contextlib.contextmanager
def time_limit(seconds):
    """fail (instead of hanging the whole run) if the body takes longer than `seconds`"""

    def handler(signum, frame):
        raise TimeoutError(f"took longer than {seconds}s (hang?)")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
