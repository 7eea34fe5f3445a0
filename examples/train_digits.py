"""Train a small convnet on scikit-learn's 8x8 handwritten digits (bundled with scikit-learn: nothing is downloaded).

    pip install -e ".[examples]"
    python examples/train_digits.py              # full run: prints `test accuracy: NN.N%` (>= 97%)
    python examples/train_digits.py --no-jit     # eager: every step scheduled again (the default --jit replays the
                                                 # captured kernels of the TinyJit'd step)
    python examples/train_digits.py --short      # a few steps; exits non-zero unless the loss fell (CI)
    mpiexec -n 2 python examples/train_digits.py --distributed   # data parallel over 2 processes (MPI): each rank
                                                 # trains on its half of every batch (pip install -e ".[distributed]"),
                                                 # BatchNorm synchronized (nn.SyncBatchNorm; --per-rank-bn: DDP's)
    python examples/train_digits.py --shard CPU:0,CPU:1   # data parallel over 2 devices in this process: every
                                                 # batch split between them, weights replicated (Tensor.shard)

1797 images, 1437 to train and 360 to test (a fixed shuffle). The model: two 3x3 convolutions with BatchNorm, ReLU
and 2x2 max pooling, then a linear layer (~7k parameters), trained with Adam on batches of 64.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from zeptograd import Tensor, TinyJit, nn  # noqa: E402
from zeptograd.nn.state import get_parameters  # noqa: E402


def load_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, Y_train, X_test, Y_test): images (N, 1, 8, 8) float32 in [0, 1], labels int32."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit('this example needs scikit-learn: pip install -e ".[examples]"') from None
    digits = load_digits()
    x = (digits.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    n_test = 360
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


class ConvNet:
    def __init__(self, norm=nn.BatchNorm2d):
        self.layers = [
            nn.Conv2d(1, 16, 3, padding=1),
            norm(16),
            Tensor.relu,
            Tensor.max_pool2d,  # 4x4
            nn.Conv2d(16, 32, 3, padding=1),
            norm(32),
            Tensor.relu,
            Tensor.max_pool2d,  # 2x2
            lambda x: x.flatten(1),
            nn.Linear(32 * 2 * 2, 10),
        ]

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


def accuracy(model: ConvNet, x: np.ndarray, y: np.ndarray, devices: tuple[str, ...] | None = None) -> float:
    with Tensor.train(False), Tensor.no_grad():
        pred = model(_batch(x, devices)).argmax(axis=1).numpy()
    return float((pred == y).mean())


def _batch(x: np.ndarray, devices: tuple[str, ...] | None) -> Tensor:
    """A batch as a Tensor, split along the batch axis over `devices` (--shard)."""
    return Tensor(x) if devices is None else Tensor(x).shard(devices, axis=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--jit",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the training step under TinyJit, its kernels replayed (default; --no-jit: eager, every "
        "step scheduled again)",
    )
    ap.add_argument("--short", action="store_true", help="train a few steps and check that the loss fell (for CI)")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: 200, or 12 with --short)")
    ap.add_argument("--bs", type=int, default=64, help="batch size")
    ap.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--distributed",
        action="store_true",
        help="data parallel over the ranks of an MPI job (mpiexec -n N): each rank takes its 1/N of every batch, "
        "gradients averaged (zeptograd.distributed.DataParallel), BatchNorm synchronized over the ranks "
        "(nn.SyncBatchNorm: the whole batch's statistics; its collectives run eagerly, so no TinyJit)",
    )
    ap.add_argument(
        "--per-rank-bn",
        action="store_true",
        help="with --distributed: BatchNorm over each rank's part of the batch (torch DDP's default), the step "
        "under TinyJit",
    )
    ap.add_argument(
        "--shard",
        default=None,
        help="data parallel over devices of this process, e.g. CPU:0,CPU:1: every batch split between them, the "
        "weights replicated, gradients all-reduced (Tensor.shard; BatchNorm normalizes the whole batch)",
    )
    args = ap.parse_args(argv)
    if args.distributed:
        return main_distributed(args)
    steps = args.steps if args.steps is not None else (12 if args.short else 200)
    model, losses, accs, train_s = train(args, steps)
    devices = tuple(args.shard.split(",")) if args.shard else None
    _, _, x_test, y_test = load_data(args.seed)
    acc = accuracy(model, x_test, y_test, devices)
    return report(losses, steps, train_s, acc, args.short)


def report(
    losses: list[float], steps: int, train_s: float, acc: float, short: bool, who: str = "", more: str = ""
) -> int:
    """Print the run's speed, loss and test accuracy (each line after `who`); with --short, the exit status says
    whether the loss fell."""
    print(
        f"{who}{steps} steps in {train_s:.1f} s ({steps / train_s:.1f} steps/s); loss {np.mean(losses[:3]):.3f} -> "
        f"{np.mean(losses[-3:]):.3f}{more}"
    )
    print(f"{who}test accuracy: {acc * 100:.1f}%")
    if short:
        fell = np.mean(losses[-3:]) < np.mean(losses[:3])
        print(who + ("loss fell" if fell else "loss did NOT fall"))
        return 0 if fell else 1
    return 0


def train(args: argparse.Namespace, steps: int) -> tuple[ConvNet, list[float], list[float], float]:
    """(the trained model, the losses, the batch accuracies, the seconds): `steps` Adam steps on random batches."""
    from tqdm import tqdm

    Tensor.manual_seed(args.seed)
    x_train, y_train, _, _ = load_data(args.seed)
    model = ConvNet()
    devices = tuple(args.shard.split(",")) if args.shard else None
    if devices is not None:  # every weight (and BatchNorm's statistics) replicated on each device
        for t in nn.state.get_state_dict(model).values():
            t.shard_(devices).realize()
    opt = nn.optim.Adam(get_parameters(model), lr=args.lr)

    def train_step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        opt.zero_grad()
        out = model(x)
        loss = out.sparse_categorical_crossentropy(y)
        loss.backward()
        loss, acc = loss.detach(), (out.detach().argmax(axis=1) == y).float().mean()
        opt.step(loss, acc)  # one schedule: forward, backward, the update, the loss and the accuracy
        return loss, acc

    step = TinyJit(train_step) if args.jit else train_step
    rng = np.random.default_rng(args.seed)
    losses: list[float] = []
    accs: list[float] = []
    t0 = time.perf_counter()
    with Tensor.train(), tqdm(range(steps), unit="step", disable=args.short and not sys.stdout.isatty()) as bar:
        for i in bar:
            idx = rng.integers(0, len(x_train), args.bs)
            loss, acc = step(_batch(x_train[idx], devices).realize(), _batch(y_train[idx], devices).realize())
            losses.append(loss.item())
            accs.append(acc.item())
            if i % 10 == 9 or i == steps - 1:
                bar.set_postfix(loss=f"{np.mean(losses[-10:]):.3f}", acc=f"{np.mean(accs[-10:]):.1%}")
    return model, losses, accs, time.perf_counter() - t0


def main_distributed(args: argparse.Namespace) -> int:
    """--distributed: the same model, data and batches as main(), each rank on its contiguous 1/N of every batch."""
    import hashlib

    from zeptograd import distributed as dist

    dist.init()
    rank, world = dist.rank(), dist.world_size()
    if args.bs % world:
        raise SystemExit(f"--bs {args.bs} does not split into {world} equal parts")
    steps = args.steps if args.steps is not None else (12 if args.short else 200)
    Tensor.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    sync = not args.per_rank_bn  # SyncBatchNorm: statistics of the whole batch, as the single-process run's
    model = ConvNet(nn.BatchNorm2d if args.per_rank_bn else nn.SyncBatchNorm)
    opt = nn.optim.Adam(get_parameters(model), lr=args.lr)
    ddp = dist.DataParallel(opt)  # rank 0's initial parameters everywhere

    def loss_and_accuracy(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        out = model(x)
        return out.sparse_categorical_crossentropy(y), (out.detach().argmax(axis=1) == y).float().mean()

    step = ddp.train_step(loss_and_accuracy, jit=args.jit and not sync)  # a collective can't be inside a TinyJit
    rng = np.random.default_rng(args.seed)  # the same batches on every rank; each takes its part
    part = args.bs // world
    losses: list[float] = []
    t0 = time.perf_counter()
    with Tensor.train():
        for _ in range(steps):
            idx = rng.integers(0, len(x_train), args.bs)[rank * part : (rank + 1) * part]
            loss, _acc = step(Tensor(x_train[idx]), Tensor(y_train[idx]))
            losses.append(loss.item())  # the mean over the ranks: the same on every rank
    train_s = time.perf_counter() - t0
    ddp.sync_buffers()  # per-rank BatchNorm's running statistics: rank 0's on every rank (SyncBatchNorm's agree)
    acc = accuracy(model, x_test, y_test)
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in get_parameters(model))).hexdigest()[:16]
    return report(losses, steps, train_s, acc, args.short, f"rank {rank}/{world}: ", f"; parameters sha256 {digest}")


if __name__ == "__main__":
    sys.exit(main())
