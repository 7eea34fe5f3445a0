"""A stencil over a computed value on every device: the scheduler inlines the prologue at each of the 9 shifted reads
(schedule/bufferize.py: inline_read), so each read's loads must stay gated by the pad's validity — the PYTHON
reference checks every load's bounds."""

import numpy as np

from zeptograd import Tensor


def test_box_sum_of_a_prologue(device):
    x = np.random.default_rng(0).standard_normal((24, 40)).astype(np.float32)
    p = (Tensor(x, device=device) * 2 + 1).pad(((1, 1), (1, 1)))
    t = sum(p[i : i + 24, j : j + 40] for i in range(3) for j in range(3))
    assert len(t.schedule()) == 1
    want = np.pad(x * 2 + 1, 1)
    want = sum(want[i : i + 24, j : j + 40] for i in range(3) for j in range(3))
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-5)
