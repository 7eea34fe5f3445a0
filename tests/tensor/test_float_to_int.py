"""Casting a float that does not fit (or nan, +-inf) to an integer dtype gives torch's result (x86's conversion:
out of range and nan give INT_MIN of int32 or int64, narrower types wrap from int32, uint32 from int64, uint64 as
gcc converts) on every backend. C and LLVM leave it undefined (LLVM's fptosi/fptoui: poison), so the tensor layer
selects an in-range value before the conversion and the result after it."""

import numpy as np
import pytest
import torch

from tests.backend.conftest import unavailable
from zeptograd import Tensor, dtypes

DEVICES = ["CPU", "CPU:C", "PYTHON", "CL"]
VALUES = [1e10, -1e10, float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 2.5e9, 300.0, -1.0, 65536.0,
          -32769.0, 2.0**31, -(2.0**31), 2.0**63, 1.5e19, 2.0**64, -2.0**63, 0.5, -0.5, 127.9, -128.9, 4e9]  # fmt: skip
TARGETS = [(dtypes.int8, torch.int8), (dtypes.int16, torch.int16), (dtypes.int32, torch.int32),
           (dtypes.int64, torch.int64), (dtypes.uint8, torch.uint8), (dtypes.uint16, torch.uint16),
           (dtypes.uint32, torch.uint32), (dtypes.uint64, torch.uint64)]  # fmt: skip
SOURCES = [(dtypes.float32, torch.float32), (dtypes.float64, torch.float64), (dtypes.float16, torch.float16),
           (dtypes.bfloat16, torch.bfloat16)]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("zsrc,tsrc", SOURCES, ids=[str(t) for _, t in SOURCES])
def test_out_of_range_casts_match_torch(device, zsrc, tsrc):
    if (why := unavailable(device)) is not None:
        pytest.skip(why)
    tx = torch.tensor(VALUES, dtype=tsrc)
    x = Tensor(tx.double().numpy(), device=device).cast(zsrc) + 0  # in a kernel, not folded from a constant
    outs = [x.cast(zdt) for zdt, _ in TARGETS]
    Tensor.realize(*outs)  # one schedule
    for (zdt, tdt), out in zip(TARGETS, outs):
        np.testing.assert_array_equal(out.numpy(), _torch_cast(tx, tdt), err_msg=f"{zsrc} -> {zdt} on {device}")


def _torch_cast(tx: torch.Tensor, tdt: torch.dtype) -> np.ndarray:
    """torch's result; to uint32 one element at a time: torch (and numpy) convert out-of-range values to uint32
    through int64 in their scalar path and otherwise in their vector path, zeptograd as the scalar path does."""
    if tdt == torch.uint32:
        return np.array([t.reshape(1).to(tdt).item() for t in tx], np.uint32)
    return tx.to(tdt).numpy()


def test_constant_casts_fold_to_the_same_values():
    for zdt, tdt in TARGETS:
        want = _torch_cast(torch.tensor(VALUES, dtype=torch.float32), tdt)
        np.testing.assert_array_equal(Tensor(VALUES, dtype=dtypes.float32).cast(zdt).numpy(), want, err_msg=str(zdt))
