"""Python's cycle collector is off while a schedule is built and run (helpers.gc_paused on
engine/realize.py's _realize_tensors), and as it was before afterwards."""

import gc

import numpy as np
import pytest

import zeptograd.engine.realize as realize
from zeptograd import Tensor
from zeptograd.helpers import gc_paused


def test_collector_off_while_scheduling_and_on_after(monkeypatch):
    seen: list[bool] = []
    schedule = realize.create_schedule

    def recording(*args, **kwargs):
        seen.append(gc.isenabled())
        return schedule(*args, **kwargs)

    monkeypatch.setattr(realize, "create_schedule", recording)
    assert gc.isenabled()
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    out = ((x * 3 + 1).exp2().sum(1) * 0.25).numpy()  # a graph no earlier test scheduled
    np.testing.assert_allclose(out, (2 ** (np.arange(12).reshape(3, 4) * 3 + 1)).sum(1) * 0.25, rtol=1e-6)
    assert seen and not any(seen)
    assert gc.isenabled()


def test_gc_paused_restores_the_collector():
    @gc_paused
    def fails():
        assert not gc.isenabled()
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        fails()
    assert gc.isenabled()  # back on after an exception

    gc.disable()
    try:
        gc_paused(lambda: None)()
        assert not gc.isenabled()  # left off where it was off
    finally:
        gc.enable()
