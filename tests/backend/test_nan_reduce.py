"""NaN through max/min on every device: numpy and torch propagate it (the C and GPU renderers' `a > b ? a : b`
returned the other operand when a was NaN, so CPU:C's row max skipped a NaN)."""

import numpy as np
import pytest

from zeptograd import Tensor


@pytest.mark.parametrize("n", [5, 16, 129])
def test_max_and_min_propagate_nan(device, n):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, n)).astype(np.float32)
    x[1, 0] = np.nan
    x[4, min(7, n - 1)] = np.nan
    t = Tensor(x).to(device)
    np.testing.assert_equal(t.max(1).numpy(), np.max(x, 1))
    np.testing.assert_equal(t.min(1).numpy(), np.min(x, 1))
    np.testing.assert_equal(t.maximum(0.0).numpy(), np.maximum(x, 0.0))
    np.testing.assert_equal(t.relu().numpy(), np.where(np.isnan(x), np.nan, np.maximum(x, 0)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_max_reduce_nan_in_every_lane_matches_torch(device, dtype):
    """a NaN in any lane of a vector accumulator, in the first or a later vector of the row, wins (as torch's);
    +-inf and -0.0 next to it. CPU:C keeps the max 16 lanes wide: a vector compare and select by mask."""
    torch = pytest.importorskip("torch")
    if device == "PYTHON":
        pytest.skip("covered by the smaller cases above (the reference interpreter is slow)")
    x = np.random.default_rng(2).standard_normal((40, 512)).astype(dtype)
    for row in range(32):  # one NaN per row, at lane row % 16 of the row's (row // 16 * 7)-th vector
        x[row, 16 * (row // 16 * 7) + row % 16] = np.nan
    x[32, :] = -np.inf
    x[33, :] = np.nan
    x[34, 100], x[34, 200] = np.inf, np.nan
    x[35, :] = -0.0
    t = Tensor(x).to(device)
    want = torch.from_numpy(x)
    np.testing.assert_equal(t.max(1).numpy(), want.amax(1).numpy())
    np.testing.assert_equal(t.min(1).numpy(), want.amin(1).numpy())
    np.testing.assert_equal(t.max().numpy(), want.max().numpy())


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
def test_integer_max_reduce(device, dtype):
    if device == "PYTHON":
        pytest.skip("the reference interpreter is slow")
    x = np.random.default_rng(3).integers(0, 120, (8, 512)).astype(dtype)
    x[3, 77] = 127
    np.testing.assert_equal(Tensor(x).to(device).max(1).numpy(), x.max(1))
