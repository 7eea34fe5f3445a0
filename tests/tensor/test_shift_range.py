"""Shifts by a count outside [0, bits) are defined as torch defines them, on every backend: `x << s` is 0 and
`x >> s` fills with the sign bit (0 or -1). In C, LLVM and OpenCL such a shift is undefined (LLVM: poison, which
came out as garbage; OpenCL: the count taken modulo bits), so the tensor layer never emits one."""

import numpy as np
import pytest
import torch

from tests.backend.conftest import unavailable
from tests.slow import fast_first
from zeptograd import Tensor, dtypes

DEVICES = ["CPU", "CPU:C", "PYTHON", "CL"]
DTYPES = [(dtypes.int8, torch.int8), (dtypes.int16, torch.int16), (dtypes.int32, torch.int32),
          (dtypes.int64, torch.int64), (dtypes.uint8, torch.uint8)]  # fmt: skip
COUNTS = [0, 1, 7, 8, 9, 15, 16, 31, 32, 33, 40, 63, 64, 100, -1, -33]


def _values(tdt) -> np.ndarray:
    info = torch.iinfo(tdt)
    np_dtype = torch.empty(0, dtype=tdt).numpy().dtype
    return np.array([1, 7, info.max, info.min, -1 if info.min < 0 else 2, 3], dtype=np_dtype)


def _skip(device):
    if (why := unavailable(device)) is not None:
        pytest.skip(why)


@pytest.mark.parametrize("device", DEVICES)
# the inner loop: the narrowest signed, the widest and the unsigned type (32 count kernels each); the full run all
@pytest.mark.parametrize(
    "zdt,tdt",
    fast_first([DTYPES[i] for i in (0, 3, 4, 1, 2)], 3, unpack=True),
    ids=[str(DTYPES[i][1]) for i in (0, 3, 4, 1, 2)],
)
def test_shift_by_a_constant(device, zdt, tdt):
    _skip(device)
    vals = _values(tdt)
    x, tx = Tensor(vals, device=device) + 0, torch.tensor(vals)  # x computed in a kernel, not folded
    got = Tensor.stack(*(x.lshift(s) for s in COUNTS), *(x.rshift(s) for s in COUNTS)).numpy()
    want = torch.stack([tx << s for s in COUNTS] + [tx >> s for s in COUNTS]).numpy()
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"{zdt} {'<<' if i < len(COUNTS) else '>>'} {COUNTS[i % 16]}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zdt,tdt", DTYPES, ids=[str(t) for _, t in DTYPES])
def test_shift_by_a_tensor_of_counts(device, zdt, tdt):
    _skip(device)
    vals = np.repeat(_values(tdt), len(COUNTS))
    counts = np.tile(np.array(COUNTS), len(_values(tdt)))
    if tdt == torch.uint8:
        counts = counts.clip(0, 255)  # (a negative count is not a uint8)
    counts = counts.astype(vals.dtype) if tdt != torch.int8 else counts.clip(-128, 127).astype(vals.dtype)
    x, c = Tensor(vals, device=device), Tensor(counts, device=device)
    tx, tc = torch.tensor(vals), torch.tensor(counts)
    np.testing.assert_array_equal((x << c).numpy(), (tx << tc).numpy())
    np.testing.assert_array_equal((x >> c).numpy(), (tx >> tc).numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_a_scalar_shifted_by_a_tensor(device):
    _skip(device)
    counts = np.array([1, 30, 31, 32, 40, -1], np.int32)
    c, tc = Tensor(counts, device=device), torch.tensor(counts)
    np.testing.assert_array_equal((2 << c).numpy(), (2 << tc).numpy())
    np.testing.assert_array_equal((-64 >> c).numpy(), (-64 >> tc).numpy())
