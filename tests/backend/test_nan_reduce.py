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
