"""The model, data and loss shared by the data-parallel worker (mpi_train.py) and its single-process reference
(test_data_parallel.py): a small MLP with BatchNorm, trained with Adam on fixed random batches."""

from __future__ import annotations

import numpy as np

from zeptograd import Tensor, nn
from zeptograd.nn.state import get_parameters

STEPS, BATCH, FEATURES, CLASSES = 5, 8, 6, 3


class Net:
    def __init__(self):
        self.l1, self.bn, self.l2 = nn.Linear(FEATURES, 8, bias=False), nn.BatchNorm(8), nn.Linear(8, CLASSES)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l2(self.bn(self.l1(x)).relu())


def make(seed: int) -> tuple[Net, nn.optim.Optimizer]:
    Tensor.manual_seed(seed)
    net = Net()
    return net, nn.optim.Adam(get_parameters(net), lr=0.05)


def batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [
        (rng.standard_normal((BATCH, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, BATCH).astype(np.int32))
        for _ in range(STEPS)
    ]


def loss_and_accuracy(net: Net, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    out = net(x)
    return out.sparse_categorical_crossentropy(y), (out.argmax(axis=1) == y).float().mean()


def state(net: Net) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in nn.state.get_state_dict(net).items()}


class TwoNormNet:
    """Two normalized layers (`norm`: nn.BatchNorm or nn.SyncBatchNorm): the lower one's gradient passes through the
    upper one's statistics, so SyncBatchNorm's backward all-reduces twice per layer, in the walk's order."""

    def __init__(self, norm=nn.BatchNorm):
        self.l1, self.bn1 = nn.Linear(FEATURES, 8, bias=False), norm(8)
        # no bias before a norm: its gradient is 0 up to rounding, which Adam turns into steps of ~lr either way
        self.l2, self.bn2, self.l3 = nn.Linear(8, 8, bias=False), norm(8), nn.Linear(8, CLASSES)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l3(self.bn2(self.l2(self.bn1(self.l1(x)).relu())).relu())


def make_two_norm(seed: int, norm=nn.BatchNorm) -> tuple[TwoNormNet, nn.optim.Optimizer]:
    Tensor.manual_seed(seed)
    net = TwoNormNet(norm)
    return net, nn.optim.Adam(get_parameters(net), lr=0.05)


def train_on_my_part(step, r: int, n: int, messages) -> tuple[np.ndarray, np.ndarray]:
    """Run step(x, y) on rank r's part of every batch: (the collective messages each step sent, the losses).
    `messages()` reads the running message count (zeptograd.distributed.stats.messages)."""
    part = BATCH // n
    losses, per_step = [], []
    for x, y in batches():
        before = messages()
        loss, _ = step(Tensor(x[r * part : (r + 1) * part]), Tensor(y[r * part : (r + 1) * part]))
        per_step.append(messages() - before)
        losses.append(loss.item())
    return np.array(per_step), np.array(losses, np.float32)
