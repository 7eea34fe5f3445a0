"""examples/train_digits.py --shard: the digits convnet trained with every batch split over two devices gives the
parameters of the one-device run (float tolerance)."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import pytest

from zeptograd import nn

pytest.importorskip("sklearn")
pytest.importorskip("tqdm")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import train_digits  # noqa: E402

# A conv bias followed by BatchNorm has a zero gradient (the batch mean cancels it): what Adam steps it by is its
# normalized rounding noise, which differs with the summation order; BatchNorm's running mean carries that bias.
NOISE_ONLY = ("layers.0.bias", "layers.4.bias", "layers.1.running_mean", "layers.5.running_mean")


@pytest.mark.slow
def test_sharded_batch_gives_one_device_parameters():
    def run(shard: str | None) -> dict[str, np.ndarray]:
        args = argparse.Namespace(seed=0, shard=shard, lr=3e-3, bs=64, jit=True, short=True)
        model, losses, _, _ = train_digits.train(args, 4)
        assert losses[-1] < losses[0]
        return {k: v.numpy() for k, v in nn.state.get_state_dict(model).items()}

    one, two = run(None), run("CPU:0,CPU:1")
    assert one.keys() == two.keys()
    for k in one:
        if k not in NOISE_ONLY:
            np.testing.assert_allclose(two[k], one[k], rtol=1e-4, atol=1e-6, err_msg=k)
