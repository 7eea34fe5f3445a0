"""zeptograd.distributed measured: all_reduce bandwidth, and data-parallel training throughput.

    python bench/distributed.py                 # both, a table on stdout (about a minute)
    python bench/distributed.py --quick         # tiny sizes and few steps: checks that it runs
    python bench/distributed.py --json out.json
    python bench/distributed.py --accuracy 3    # train_digits' accuracy, 2 ranks vs one process, seeds 0..2

1. all_reduce of float32 tensors of 1 to 64 MiB between 2 ranks on this host: `distributed.all_reduce(t)` on a
   realized CPU tensor (its agreement check, the result's new buffer, the Tensor around it) against mpi4py's
   `comm.Allreduce(a, b)` on numpy arrays directly. Bandwidth is the tensor's bytes over the median time of one
   call (each call starts after a barrier; the two take turns, so the machine's load falls on both). The bench drops
   the previous result before each call, so its buffer is reused, as mpi4py's b is. A third column skips the
   agreement check (check=False): one round trip between the ranks less.
2. Training throughput of examples/train_digits.py's ConvNet (batches of 64, Adam, TinyJit): 2 ranks x THREADS=1
   (DataParallel, 32 images each) against 1 process x THREADS=2. Samples per second over the median step, after
   the warm-up steps that compile and capture.

3. (--accuracy N) examples/train_digits.py's test accuracy for seeds 0..N-1: `mpiexec -n 2 ... --distributed`
   (nn.SyncBatchNorm: the whole batch's statistics, the computation of the example as it is), `--distributed
   --per-rank-bn` (DDP's BatchNorm over each rank's half) and its computation in one process (BatchNorm over each half
   of every batch), and the example as it is.

Each part runs in its own job (mpiexec for the ranks, a plain process for one); the machine may be shared, so
medians are reported. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import numpy as np  # noqa: E402

MiB = 1 << 20


def _interleaved_times(fns: list, barrier, reps: int) -> list[list[float]]:
    """The times of reps calls of each function, the functions taking turns (so a change in the machine's load
    falls on all of them), each call after a barrier."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            barrier()
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return times


def worker_allreduce(sizes_mib: list[float], reps: int) -> dict:
    from zeptograd import Tensor
    from zeptograd import distributed as dist

    dist.init()
    comm = dist._state.comm
    rows = []
    for mib in sizes_mib:
        n = int(mib * MiB) // 4
        a = np.random.default_rng(dist.rank()).standard_normal(n).astype(np.float32)
        b = np.empty_like(a)
        t = Tensor(a).realize()
        outs: list = [None]

        def zepto(check: bool = True):
            outs[0] = None  # the previous result's buffer goes back to the allocator, as mpi4py reuses b
            outs[0] = dist.all_reduce(t, check=check)

        zepto()  # warm-up
        comm.Allreduce(a, b)
        np.testing.assert_allclose(outs[0].numpy(), b, rtol=1e-6)
        fns = [lambda: comm.Allreduce(a, b), zepto, lambda: zepto(check=False)]
        raw, zepto, unchecked = _interleaved_times(fns, comm.Barrier, reps)
        row = {"MiB": mib}
        for name, ts in (("mpi4py", raw), ("zeptograd", zepto), ("unchecked", unchecked)):
            row[f"{name}_s"], row[f"{name}_best_s"] = statistics.median(ts), min(ts)
        rows.append(row)
    return {"rank": dist.rank(), "allreduce": rows}  # a collective's time: rank 0's stands for both


def worker_train(steps: int, warmup: int, distributed: bool) -> dict:
    from train_digits import ConvNet, load_data

    from zeptograd import Tensor, TinyJit, nn
    from zeptograd.nn.state import get_parameters

    Tensor.manual_seed(0)
    x_train, y_train, _, _ = load_data(0)
    model = ConvNet()
    opt = nn.optim.Adam(get_parameters(model), lr=3e-3)
    bs, rank, world = 64, 0, 1

    def loss_and_accuracy(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        out = model(x)
        return out.sparse_categorical_crossentropy(y), (out.detach().argmax(axis=1) == y).float().mean()

    if distributed:
        from zeptograd import distributed as dist

        dist.init()
        rank, world = dist.rank(), dist.world_size()
        step = dist.DataParallel(opt).train_step(loss_and_accuracy)
        barrier = dist.barrier
    else:

        def train_step(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
            opt.zero_grad()
            loss, acc = loss_and_accuracy(x, y)
            loss.backward()
            opt.step(loss.detach(), acc)
            return loss.detach(), acc

        step = TinyJit(train_step)

        def barrier():
            pass

    rng = np.random.default_rng(0)
    part = bs // world
    times = []
    with Tensor.train():
        for i in range(warmup + steps):
            idx = rng.integers(0, len(x_train), bs)[rank * part : (rank + 1) * part]
            x, y = Tensor(x_train[idx]), Tensor(y_train[idx])
            barrier() if i == warmup else None
            t0 = time.perf_counter()
            loss, _ = step(x, y)
            loss.item()
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[warmup:])
    if distributed:  # the slower rank's median: a step ends for both when the slower one's does
        step_s = float(dist.all_reduce(Tensor([step_s], dtype="float64"), "max").item())
    return {"rank": rank, "world": world, "step_s": step_s, "samples_per_s": bs / step_s}


def worker_halves(seed: int, steps: int = 200, bs: int = 64) -> dict:
    """examples/train_digits.py's run in one process with BatchNorm over each half of every batch on its own (the
    computation `--distributed` does with 2 ranks): the loss is the mean of the halves' losses, and the running
    statistics move with the first half only (rank 0's, which --distributed gives every rank before evaluating)."""
    from train_digits import ConvNet, accuracy, load_data

    from zeptograd import Tensor, TinyJit, nn
    from zeptograd.nn.state import get_parameters

    Tensor.manual_seed(seed)
    x_train, y_train, x_test, y_test = load_data(seed)
    model = ConvNet()
    opt = nn.optim.Adam(get_parameters(model), lr=3e-3)
    norms = [layer for layer in model.layers if isinstance(layer, nn.BatchNorm)]

    def train_step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        losses = []
        for half, momentum in ((slice(0, bs // 2), 0.1), (slice(bs // 2, bs), 0.0)):
            for bn in norms:
                bn.momentum = momentum  # 0: the second half leaves the running statistics as they are
            losses.append(model(x[half]).sparse_categorical_crossentropy(y[half]))
        loss = (losses[0] + losses[1]) / 2
        loss.backward()
        opt.step(loss.detach())
        return loss.detach()

    step = TinyJit(train_step)
    rng = np.random.default_rng(seed)
    with Tensor.train():
        for _ in range(steps):
            idx = rng.integers(0, len(x_train), bs)
            step(Tensor(x_train[idx]), Tensor(y_train[idx]))
    return {"rank": 0, "accuracy": accuracy(model, x_test, y_test)}


def _accuracy_of(out: str) -> float:
    found = {line.rsplit(" ", 1)[1] for line in out.splitlines() if "test accuracy: " in line}
    assert len(found) == 1, out  # every rank prints the same
    return float(found.pop().rstrip("%")) / 100


def accuracies(launch: list[str], me: list[str], env: dict, seeds: list[int]) -> list[dict]:
    """examples/train_digits.py's test accuracy for each seed: 2 ranks --distributed (SyncBatchNorm), one process as
    it is (BatchNorm over the whole batch: the same computation), 2 ranks --per-rank-bn, and one process with
    BatchNorm over each half-batch (the same computation as --per-rank-bn)."""
    example = [sys.executable, os.path.join(ROOT, "examples", "train_digits.py")]
    rows = []

    def ranks(*flags: str) -> str:
        return subprocess.run(
            [*launch, *example, "--distributed", *flags, "--seed", str(seed)],
            capture_output=True,
            text=True,
            timeout=1800,
            cwd=ROOT,
            env={**env, "THREADS": "1"},
            check=True,
        ).stdout

    for seed in seeds:
        sync_out = ranks()
        single_out = subprocess.run(
            [*example, "--seed", str(seed)], capture_output=True, text=True, timeout=1800, cwd=ROOT, env=env, check=True
        ).stdout
        per_rank_out = ranks("--per-rank-bn")
        (halves,) = _run([*me, "--worker", "halves", "--seed", str(seed)], env, 1800)
        rows.append(
            {
                "seed": seed,
                "2 ranks --distributed (SyncBatchNorm)": _accuracy_of(sync_out),
                "1 process (the example)": _accuracy_of(single_out),
                "2 ranks --per-rank-bn": _accuracy_of(per_rank_out),
                "1 process, BatchNorm per half-batch": halves["accuracy"],
            }
        )
        print(rows[-1], flush=True)
    return rows


def _run(cmd: list[str], env: dict, timeout: float) -> list[dict]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return [json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few steps: checks that it runs")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument(
        "--accuracy",
        type=int,
        default=0,
        metavar="N",
        help="instead: train_digits' test accuracy for seeds 0..N-1, 2 ranks against one process (minutes per seed)",
    )
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["allreduce", "train", "train-ddp", "halves"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = [0.25, 1] if args.quick else [1, 4, 16, 64]
    reps, steps, warmup = (5, 3, 3) if args.quick else (41, 30, 4)
    if args.worker:
        if args.worker == "allreduce":
            result = worker_allreduce(sizes, reps)
        elif args.worker == "halves":
            result = worker_halves(args.seed)
        else:
            result = worker_train(steps, warmup, args.worker == "train-ddp")
        if result["rank"] == 0:  # one line from one rank: the ranks share stdout
            print("RESULT " + json.dumps(result), flush=True)
        return 0

    from zeptograd.distributed import mpiexec

    launch = mpiexec(2)
    if launch is None:
        raise SystemExit('no mpiexec: pip install -e ".[distributed]"')
    me = [sys.executable, os.path.abspath(__file__)] + (["--quick"] if args.quick else [])
    env = {**os.environ, "PYTHONPATH": ROOT}
    if args.accuracy:
        rows = accuracies(launch, me, env, list(range(args.accuracy)))
        print(f"{'seed':>4} " + " ".join(f"{k:>36}" for k in rows[0] if k != "seed"))
        for row in rows:
            print(f"{row['seed']:>4} " + " ".join(f"{v * 100:>35.1f}%" for k, v in row.items() if k != "seed"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return 0
    report: dict = {"cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
    (allreduce,) = _run([*launch, *me, "--worker", "allreduce"], {**env, "THREADS": "1"}, 600)
    report["allreduce"] = allreduce["allreduce"]
    (ddp,) = _run([*launch, *me, "--worker", "train-ddp"], {**env, "THREADS": "1"}, 900)
    (single,) = _run([*me, "--worker", "train"], {**env, "THREADS": "2"}, 900)
    report["train"] = {"2 ranks x THREADS=1": ddp["step_s"], "1 process x THREADS=2": single["step_s"]}
    report["load_after"] = os.getloadavg()[0]

    print(f"zeptograd.distributed bench: {report['cpus']} cpus, load {report['load_before']:.1f} before")
    print("all_reduce of float32, 2 ranks (median of one call)")
    print("GB/s of the median call (of the best call); in brackets the time over mpi4py's")
    print(f"{'size':>9} {'mpi4py':>14} {'zeptograd':>26} {'check=False':>26}")
    for row in report["allreduce"]:
        nbytes = row["MiB"] * MiB
        cells = [f"{nbytes / row['mpi4py_s'] / 1e9:5.2f} ({nbytes / row['mpi4py_best_s'] / 1e9:5.2f})"]
        for k in ("zeptograd", "unchecked"):
            med, best = row[f"{k}_s"], row[f"{k}_best_s"]
            cells.append(
                f"{nbytes / med / 1e9:5.2f} [{med / row['mpi4py_s']:4.2f}] ({nbytes / best / 1e9:5.2f} "
                f"[{best / row['mpi4py_best_s']:4.2f}])"
            )
        print(f"{row['MiB']:>5g} MiB {cells[0]:>14} {cells[1]:>26} {cells[2]:>26}")
    print("train_digits ConvNet, batches of 64 (median step after warm-up)")
    for name, step_s in report["train"].items():
        print(f"  {name:<24} {step_s * 1e3:8.1f} ms/step {64 / step_s:8.0f} samples/s")
    print(f"load {report['load_after']:.1f} after")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
