"""DataParallel over 2 ranks (mpi_train.py) against one process that normalizes each half of every batch on its own
(torch DDP's BatchNorm semantics): the same parameters, identical on both ranks, eager and under TinyJit, with the
gradients sent in the expected number of messages. With nn.SyncBatchNorm (mpi_syncbn.py) against one process on the
whole batch (torch's SyncBatchNorm semantics)."""

import math
import re

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.distributed import BUCKET_BYTES

from .dp_model import BATCH, batches, loss_and_accuracy, make, make_two_norm, state

pytestmark = pytest.mark.slow


def reference(split: bool = True) -> tuple[dict[str, np.ndarray], list[float]]:
    """One process, rank 0's initial weights; each step's loss is the mean of the two halves' losses, each half
    through the model on its own (its own BatchNorm statistics). split=False: the whole batch at once."""
    net, opt = make(seed=0)
    losses = []
    with Tensor.train():
        for x, y in batches():
            opt.zero_grad()
            parts = (0, BATCH // 2) if split else (0,)
            size = BATCH // len(parts)
            halves = [loss_and_accuracy(net, Tensor(x[a : a + size]), Tensor(y[a : a + size]))[0] for a in parts]
            loss = sum(halves[1:], halves[0]) / len(halves)
            loss.backward()
            opt.step(loss)
            losses.append(loss.item())
    return state(net), losses


def test_data_parallel_matches_half_batch_normalization(run_ranks, tmp_path):
    job = run_ranks("mpi_train.py", str(tmp_path), timeout=240)
    assert job.returncode == 0, job.describe()
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(2)]
    want, want_losses = reference()
    n_values = sum(v.size for k, v in want.items() if not k.startswith("bn.running") and "num_batches" not in k)
    assert n_values == 91
    for mode in ("eager", "jit"):
        # 91 gradients and 2 metrics of float32 in 64-byte buckets, every step (the jit's capture and replays too)
        assert ranks[0][f"{mode}.messages"].tolist() == [math.ceil((91 + 2) * 4 / 64)] * 5
        for k in want:
            np.testing.assert_array_equal(ranks[0][f"{mode}.{k}"], ranks[1][f"{mode}.{k}"], err_msg=f"{mode} {k}")
            if not k.startswith("bn.running") and "num_batches" not in k:  # the running statistics are rank 0's
                np.testing.assert_allclose(ranks[0][f"{mode}.{k}"], want[k], rtol=1e-4, atol=1e-5, err_msg=mode + k)
        np.testing.assert_allclose(ranks[0][f"{mode}.losses"], want_losses, rtol=1e-5)
    # the comparison tells the semantics apart: BatchNorm over the whole batch ends elsewhere
    whole, _ = reference(split=False)
    assert not np.allclose(whole["l2.weight"], want["l2.weight"], rtol=1e-3, atol=1e-4)
    assert BUCKET_BYTES == 25 * 1024 * 1024  # torch DDP's bucket_cap_mb


@pytest.mark.parametrize("flags", [(), ("--per-rank-bn",)])
def test_train_digits_example_distributed(run_ranks, flags):
    """The README's command in its short form (SyncBatchNorm; --per-rank-bn: DDP's BatchNorm, TinyJit): both ranks
    end with the same parameters and accuracy."""
    pytest.importorskip("sklearn")
    job = run_ranks("../../examples/train_digits.py", "--distributed", *flags, "--short", "--steps", "6", timeout=300)
    assert job.returncode == 0, job.describe()
    # searched in the whole output, not line by line: mpiexec forwards each rank's output in the chunks it reads, so
    # one rank's line can end inside another's (seen: "... sha256 07595a2d0f6abb33rank 0/2: 6 steps ...")
    for pattern in (r"parameters sha256 ([0-9a-f]{16})", r"test accuracy: (\d+\.\d%)"):
        found = re.findall(pattern, job.stdout)
        assert len(found) == 2 and found[0] == found[1], job.describe()
    assert job.stdout.count("loss fell") == 2, job.describe()


def test_sync_batchnorm_matches_the_global_batch(run_ranks, tmp_path):
    """nn.SyncBatchNorm over 2 ranks (mpi_syncbn.py) against one process on the whole batch with BatchNorm (torch's
    SyncBatchNorm semantics): the same parameters, losses and running statistics, identical on both ranks."""
    job = run_ranks("mpi_syncbn.py", str(tmp_path), timeout=240)
    assert job.returncode == 0, job.describe()
    ranks = [dict(np.load(tmp_path / f"sync{r}.npz")) for r in range(2)]
    net, opt = make_two_norm(seed=0)
    losses = []
    with Tensor.train():
        for x, y in batches():
            opt.zero_grad()
            loss = loss_and_accuracy(net, Tensor(x), Tensor(y))[0]
            loss.backward()
            opt.step(loss)
            losses.append(loss.item())
    want = state(net)
    for k in want:
        np.testing.assert_array_equal(ranks[0][k], ranks[1][k], err_msg=k)
        np.testing.assert_allclose(ranks[0][k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
    np.testing.assert_allclose(ranks[0]["losses"], losses, rtol=1e-5)
    # per step: the gradients' and metrics' buckets (25 MiB: one message) plus 2 all-reduces forward and 2 backward
    # in each of the two SyncBatchNorms
    assert ranks[0]["messages"].tolist() == [1 + 2 * 4] * len(losses)
