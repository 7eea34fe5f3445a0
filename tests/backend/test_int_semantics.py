"""Integer semantics every backend must share: division is total (numpy's values), arithmetic wraps around.

Division: `x // 0 = x % 0 = 0` (numpy; torch raises, a deliberate difference: a lazy library can't raise on a
data-dependent value), `INT_MIN // -1 = INT_MIN` (wraps, as torch and numpy), `x % -1 = 0`. In C, LLVM and OpenCL
the plain ops trap (SIGFPE) or give garbage there, so these cases run in a child process: a crash is a failed test,
not a dead interpreter. Wrap-around: `(x + 1) > x` is False at INT_MAX, as in torch and numpy, although the C-family
compilers may assume signed overflow never happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import zeptograd
from zeptograd import Device, Tensor, dtypes
from zeptograd.dtype import to_numpy_dtype

INTS = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint32, dtypes.uint64]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(zeptograd.__file__)))


def edge_values(dt) -> list[int]:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    vals = [lo, lo + 1, -7, -2, -1, 0, 1, 2, 7, hi - 1, hi] if lo < 0 else [0, 1, 2, 7, hi // 2, hi - 1, hi]
    return vals


# the child: every division case of one device and dtype, as JSON (each value is exact in a JSON int)
CHILD = """
import json, sys
import numpy as np
from zeptograd import Tensor, dtypes
dev, name, a, b = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
dt = getattr(dtypes, name)
x, y = Tensor(a, dtype=dt, device=dev), Tensor(b, dtype=dt, device=dev)
out = {
    "floordiv": x // y, "mod": x % y, "trunc": x.div(y, rounding_mode="trunc"), "fmod": x.fmod(y),
    "floordiv_m1": x // -1, "mod_m1": x % -1, "floordiv_0": x // 0, "mod_0": x % 0,
}
Tensor.realize(*out.values())
print(json.dumps({k: [int(v) for v in t.numpy().tolist()] for k, t in out.items()}))
"""


def run_child(device: str, dt, a: list[int], b: list[int]) -> dict[str, list[int]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, device, dt.name, json.dumps(a), json.dumps(b)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, f"{device} {dt.name}: the child died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def trunc_div(a: int, b: int, dt) -> int:
    """C's truncating division, total: x / 0 = 0, and the quotient wraps (INT_MIN / -1 = INT_MIN)."""
    if b == 0:
        return 0
    q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
    return int(np.array(q % 2 ** (8 * dt.itemsize), dtype=np.uint64).astype(to_numpy_dtype(dt)))


@pytest.mark.slow
@pytest.mark.parametrize("dt", INTS, ids=lambda d: d.name)
def test_division_is_total(device, dt):
    vals = edge_values(dt)
    a = [x for x in vals for _ in vals]  # every pair: 49 to 121 lanes, so vector kernels and their tails run
    b = [y for _ in vals for y in vals]
    got = run_child(device, dt, a, b)
    npdt = to_numpy_dtype(dt)
    na, nb = np.array(a, dtype=npdt), np.array(b, dtype=npdt)
    with np.errstate(all="ignore"):  # numpy warns at x // 0 and INT_MIN // -1, and gives the values we want
        want = {
            "floordiv": np.floor_divide(na, nb),
            "mod": np.remainder(na, nb),
            "trunc": np.array([trunc_div(x, y, dt) for x, y in zip(a, b)], dtype=npdt),
            "fmod": np.fmod(na, nb),
            "floordiv_m1": np.floor_divide(na, npdt.type(-1)) if dtypes.min(dt) < 0 else None,
            "mod_m1": np.remainder(na, npdt.type(-1)) if dtypes.min(dt) < 0 else None,
            "floordiv_0": np.floor_divide(na, npdt.type(0)),
            "mod_0": np.remainder(na, npdt.type(0)),
        }
    for k, w in want.items():
        if w is None:  # -1 as an unsigned int is the dtype's max: a different case
            continue
        np.testing.assert_array_equal(np.array(got[k], dtype=npdt), w, err_msg=f"{k} on {device}, {dt.name}")


@pytest.mark.slow
@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64], ids=lambda d: d.name)
def test_division_agrees_with_torch(device, dt):
    """torch's //, % and fmod (nonzero divisors: torch raises on an integer division by zero). Not
    div(rounding_mode="trunc"): torch 2.13 itself dies of SIGFPE at INT_MIN / -1 (test_division_is_total checks it)."""
    torch = pytest.importorskip("torch")
    vals = edge_values(dt)
    a = [x for x in vals for y in vals if y != 0]
    b = [y for _ in vals for y in vals if y != 0]
    got = run_child(device, dt, a, b)
    tdt = {dtypes.int32: torch.int32, dtypes.int64: torch.int64}[dt]
    ta, tb = torch.tensor(a, dtype=tdt), torch.tensor(b, dtype=tdt)
    assert got["floordiv"] == torch.floor_divide(ta, tb).tolist()
    assert got["mod"] == torch.remainder(ta, tb).tolist()
    assert got["fmod"] == torch.fmod(ta, tb).tolist()


WRAP_DTYPES = [dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint16, dtypes.uint32]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 37], ids=["scalar", "vector"])
@pytest.mark.parametrize("dt", WRAP_DTYPES, ids=lambda d: d.name)
def test_arithmetic_wraps(device, dt, n):
    """x + 1 > x is False at the dtype's max, -INT_MIN = INT_MIN, 65535 * 65535 = 1 in uint16: numpy's values."""
    npdt = to_numpy_dtype(dt)
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    base = np.array([hi, lo, hi - 1, lo + 1, 0, 1, hi // 3], dtype=npdt)
    a = np.resize(base, n)
    x = Tensor(a, device=device)
    cases = {
        "inc_gt": ((x + 1) > x, lambda v: (v + npdt.type(1)) > v),
        "dec_lt": ((x - 1) < x, lambda v: (v - npdt.type(1)) < v),
        "mul": (x * x, lambda v: v * v),
        "mul_gt": ((x * 2) > x, lambda v: (v * npdt.type(2)) > v),
        "mul_add": (x * 3 + x, lambda v: v * npdt.type(3) + v),
    }
    if lo < 0:
        cases["neg"] = (-x, lambda v: -v)
        cases["neg_lt"] = ((-x) < 0, lambda v: (-v) < 0)
    Tensor.realize(*[t for t, _ in cases.values()])
    with np.errstate(all="ignore"):
        for k, (t, f) in cases.items():
            np.testing.assert_array_equal(t.numpy(), f(a), err_msg=f"{k} on {device}, {dt.name}")


def test_index_arithmetic_keeps_plain_ops():
    """Only values a user sees wrap: the C source of a float add indexes with plain (signed) int arithmetic."""
    pytest.importorskip("subprocess")
    try:
        Device["CPU:C"]
    except Exception as e:
        pytest.skip(f"no C compiler: {e}")
    from zeptograd.codegen import full_rewrite, kernel_name
    from zeptograd.engine.realize import schedule_tensors

    a = Tensor.empty(4, 37, device="CPU:C")
    t = (a[:, 1:] + a[:, :-1]).permute(1, 0)
    renderer = Device["CPU:C"].renderer
    (item,) = schedule_tensors([t])
    uops, _ = full_rewrite(item.ast, renderer)
    src = renderer.render(kernel_name(item.ast), uops).src
    assert "unsigned int)" not in src.split("void ", 1)[1], src
    i = Tensor.empty(37, dtype=dtypes.int32, device="CPU:C")
    (item,) = schedule_tensors([i + i])
    uops, _ = full_rewrite(item.ast, renderer)
    assert "unsigned int" in renderer.render(kernel_name(item.ast), uops).src.split("void ", 1)[1]
