"""Several processes, on one host or many, over MPI (mpi4py): collectives on Tensors and data-parallel training.

    pip install -e ".[distributed]"          # mpi4py and MPICH, both from pip
    mpiexec -n 2 python examples/train_digits.py --distributed

    from zeptograd import distributed as dist
    dist.init()
    total = dist.all_reduce(Tensor([dist.rank() + 1.0]))     # [3.0] on both ranks of 2

Collectives take a Tensor and return a new, realized Tensor on its device (the input is left as it was; results
do not carry gradients): `all_reduce(t, op)` with op "sum", "mean" or "max", `broadcast(t, root)`,
`all_gather(t)` (shape (world_size, *t.shape)) and `barrier()`. On a host device (CPU, CPU:C, PYTHON) MPI reads
the input's buffer and writes the result's buffer directly: no copy beside MPI's own. Other devices (CL) go through
a host copy each way. Every rank must make the same calls in the same order, as MPI requires; before moving data
each collective checks that the ranks agree on the call, the shape and the dtype (one small allgather), and
raises an ArgumentError on every rank naming what each rank passed (check=False skips this round trip).

Faults never hang a job: init() installs a sys.excepthook that prints the exception and aborts every rank
(MPI_Abort; mpiexec then ends the others), a rank that dies is noticed by mpiexec, which ends the others, and a
watchdog thread aborts the job when one collective has waited longer than `timeout` seconds (a rank that left the
collective sequence: it returned early, or it hangs elsewhere), printing which collective timed out on which rank.

DataParallel(optimizer): torch DDP's scheme. It broadcasts the parameters and buffers from rank 0, then each step
averages the gradients (and the step's metrics) over the ranks in flat buckets of at most `bucket_bytes` (25 MiB,
torch's default), so a step sends ceil(bytes / bucket_bytes) messages per dtype, not one per parameter.
BatchNorm normalizes each rank's part of the batch on its own (DDP's semantics); the running statistics of rank 0
are given to every rank by `sync_buffers()`. `nn.SyncBatchNorm` normalizes over the whole batch of every rank
instead (`sync_batch_stats`: its sums all-reduced in the forward, their gradients in backward, `sum_over_ranks`),
eagerly: a collective inside a TinyJit is an error (a replay would not run it), so train_step(jit=False) then.
`train_step(loss_fn)` builds the step; with TinyJit the collective stays outside the jitted functions: forward and
backward are one jitted function, the optimizer update another, and between them the outputs are copied into one
flat host array per dtype, all-reduced in place (a plain MPI call) and given to the update as new tensors.

The MPI library is whatever mpi4py loads; the `distributed` extra installs MPICH's wheel (see docs/distributed.md).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from zeptograd.buffers import buffers, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import HostAllocator
from zeptograd.dtype import DType, dtypes, to_numpy_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor import Tensor

BUCKET_BYTES = 25 << 20  # the most bytes one gradient message carries (torch DDP's bucket_cap_mb)
DEFAULT_TIMEOUT_S = 60.0
_OPS = ("sum", "mean", "max")


@dataclass
class Stats:
    """Collectives made through this module: `messages` move data (all_reduce, broadcast, all_gather, each bucket of
    DataParallel), `checks` are the agreement checks before them (and barriers)."""

    messages: int = 0
    checks: int = 0
    bytes: int = 0


stats = Stats()


class _State:
    comm: Any = None
    MPI: Any = None
    timeout: float | None = DEFAULT_TIMEOUT_S
    waiting: tuple[str, float] | None = None  # (the collective, when it started): what the watchdog looks at
    mine, every = np.zeros(1, np.int64), np.zeros(0, np.int64)  # the agreement check's buffers, kept


_state = _State()


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError:
        raise ImportError(
            'zeptograd.distributed needs mpi4py and an MPI library: pip install -e ".[distributed]" '
            "(mpi4py and MPICH from pip)"
        ) from None
    return MPI


def init(timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
    """Join the MPI job this process was started in (`mpiexec -n N python ...`; a plain `python ...` is a job of
    one). timeout: seconds one collective may wait for the other ranks before the whole job is aborted (None: wait
    forever). Calling init again only changes the timeout."""
    if timeout is not None and (not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ArgumentError(f"init: timeout must be a positive number of seconds or None, got {timeout!r}")
    _state.timeout = timeout
    if _state.comm is not None:
        return
    MPI = _mpi()
    _state.MPI, _state.comm = MPI, MPI.COMM_WORLD
    if _state.comm.Get_size() > 1:
        _install_excepthook()
        threading.Thread(target=_watchdog, name="zeptograd.distributed watchdog", daemon=True).start()


def is_initialized() -> bool:
    return _state.comm is not None


def _comm():
    if _state.comm is None:
        raise RuntimeError("zeptograd.distributed: call distributed.init() first")
    return _state.comm


def rank() -> int:
    """This process's index in the job, 0 .. world_size() - 1."""
    return _comm().Get_rank()


def world_size() -> int:
    """The number of processes in the job."""
    return _comm().Get_size()


ABORT_FLUSH_S = 0.3  # the wait between the abort message and MPI_Abort


def _abort(message: str, code: int) -> None:
    sys.stderr.write(f"zeptograd.distributed: rank {rank()} of {world_size()}: {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    # mpiexec forwards a rank's output through a pipe of its own, and MPI_Abort tears the job down at once: the
    # message, already written, was lost in about 1 run of 5 (the job ended 124 with an empty stderr). A moment for
    # the forwarder to pass it on; the job is ending anyway.
    time.sleep(ABORT_FLUSH_S)
    _state.comm.Abort(code)


def _install_excepthook() -> None:
    previous = sys.excepthook

    def abort_on_exception(kind, value, tb):
        previous(kind, value, tb)  # the traceback first, as Python prints it
        _abort(f"{kind.__name__}: {value}; aborting every rank (MPI_Abort)", 1)

    sys.excepthook = abort_on_exception


def _watchdog() -> None:
    """Abort the job when a collective has waited past the timeout (MPI_Abort is safe from another thread: mpi4py
    initializes MPI with MPI_THREAD_MULTIPLE)."""
    while True:
        time.sleep(0.25)
        waiting, timeout = _state.waiting, _state.timeout
        if waiting is not None and timeout is not None and time.monotonic() - waiting[1] > timeout:
            _abort(
                f"{waiting[0]} waited {timeout:g} s for the other ranks (one of them died, returned early or hangs "
                f"outside the collective sequence); aborting every rank (MPI_Abort)",
                124,
            )


class _Waiting:
    """Marks a blocking collective for the watchdog."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        _state.waiting = (self.name, time.monotonic())

    def __exit__(self, *exc):
        _state.waiting = None


def mpiexec(n: int) -> list[str] | None:
    """The command line that starts n ranks on this host (append the program), or None where there is no mpiexec:
    MPICH's as it is; Open MPI's with the flags to run as root and with more ranks than cores. The mpiexec installed
    beside this Python (the `mpich` wheel's) comes first, then the one on PATH."""
    beside = os.path.join(sysconfig.get_path("scripts"), "mpiexec")
    exe = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if exe is None:
        return None
    try:
        version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    extra = ["--oversubscribe", "--allow-run-as-root"] if "Open MPI" in version or "OpenRTE" in version else []
    return [exe, *extra, "-n", str(n)]


# ***** agreement between ranks *****


def _agree(name: str, desc: str) -> None:
    """Check that every rank makes the same call (name and desc: shapes, dtypes, op, root) before data moves: one
    allgather of a hash, and on a mismatch one more of the descriptions, so every rank raises the same error."""
    comm = _comm()
    key = zlib.crc32(f"{name} {desc}".encode())
    if len(_state.every) != comm.Get_size():
        _state.every = np.empty(comm.Get_size(), np.int64)
    _state.mine[0] = key
    with _Waiting(f"{name} (the agreement check)"):
        comm.Allgather(_state.mine, _state.every)
    stats.checks += 1
    if any(k != key for k in _state.every.tolist()):
        with _Waiting(f"{name} (the agreement check)"):
            descs = comm.allgather(f"{name} {desc}")
        stats.checks += 1
        raise ArgumentError(
            f"{name}: the ranks disagree: " + "; ".join(f"rank {r} called {d}" for r, d in enumerate(descs))
        )


def _describe(t: Tensor) -> str:
    return f"shape {t.shape} {t.dtype!r}"


# ***** Tensor memory as numpy *****


def _check_tensor(name: str, t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise ArgumentTypeError(f"{name} takes a Tensor, got a {type(t).__name__}")
    from zeptograd.engine.realize import is_capturing

    if is_capturing():  # a replay runs the captured kernels only: the MPI call would be left out
        from zeptograd.engine.jit import JitError

        raise JitError(
            f"{name} inside a TinyJit: a replay would not run the collective (SyncBatchNorm's statistics are one); "
            f"keep collectives outside the jitted function (DataParallel.train_step(jit=False) for SyncBatchNorm)"
        )
    if not all(isinstance(s, int) for s in t.shape):
        raise ArgumentError(f"{name}: a tensor of symbolic shape {t.shape} (bind its variables' values first)")
    return t


def _host_view(t: Tensor) -> np.ndarray | None:
    """The flat memory of t's buffer as a numpy array (no copy), where t is realized to a whole buffer in host memory;
    else None. Realizes t."""
    base = view_base(t.uop)  # a buffer already (a leaf, a realized tensor): nothing to run, nor to look up
    if base is None:
        from zeptograd.engine.realize import realized_value

        t.realize()
        base = view_base(realized_value(t.uop))
    if base is None or (buf := buffers.get(base)) is None:
        return None
    allocator, mem = buf._memory()
    if not isinstance(allocator, HostAllocator) or t.dtype == dtypes.bfloat16:
        return None
    return mem.view(to_numpy_dtype(t.dtype))[: t.numel()]


def _flat_values(t: Tensor) -> np.ndarray:
    """t's elements as a flat numpy array: its own memory where it has a host buffer, else a copy."""
    view = _host_view(t)
    return view if view is not None else np.ascontiguousarray(t.numpy()).reshape(-1)


def _new_tensor(shape: tuple[int, ...], dtype: DType, device: str) -> tuple[Tensor, np.ndarray, Callable[[], None]]:
    """(a Tensor on a new buffer, a numpy array to write its elements into, a function to call once they are
    written): on a host device the array is the buffer's memory, elsewhere a host array copied in by the function."""
    u = new_buffer_uop(device, math.prod(shape), dtype)
    buf = buffers[u]
    allocator, mem = buf._memory()
    if isinstance(allocator, HostAllocator):
        return Tensor(reshape_uop(u, shape), device=device), mem.view(to_numpy_dtype(dtype)), lambda: None
    host = np.empty(buf.size, to_numpy_dtype(dtype))

    def copy_in() -> None:
        buf.copyin(host)

    return Tensor(reshape_uop(u, shape), device=device), host, copy_in


def _mpi_op(op: str, dtype: DType):
    MPI = _state.MPI
    if dtype == dtypes.bool:
        return MPI.LOR  # the sum and the max of booleans are both "any"
    return MPI.MAX if op == "max" else MPI.SUM


# ***** collectives *****


def all_reduce(t: Tensor, op: str = "sum", check: bool = True) -> Tensor:
    """The elementwise sum, mean or max of t over every rank, on every rank (a new tensor of t's shape and dtype).
    check=False skips the agreement check (one round trip between the ranks), for a loop whose calls are known to
    match: mismatched calls are then MPI's undefined behaviour (an MPI error, a hang until the timeout, or garbage)."""
    t = _check_tensor("all_reduce", t)
    if op not in _OPS:
        raise ArgumentError(f"all_reduce: op must be one of {', '.join(map(repr, _OPS))}, got {op!r}")
    if op == "mean" and not dtypes.is_float(t.dtype):
        raise ArgumentTypeError(f"all_reduce: op 'mean' of a {t.dtype.name} tensor: cast it to a float dtype first")
    if check:
        _agree("all_reduce", f"(op {op!r}) of {_describe(t)}")
    if t.dtype == dtypes.bfloat16:  # MPI has no bfloat16: reduce the (exact) float32 values
        return all_reduce(t.cast(dtypes.float32), op, check=False).cast(dtypes.bfloat16)
    send = _flat_values(t)
    out, recv, done = _new_tensor(t.shape, t.dtype, t.device)
    with _Waiting("all_reduce"):
        _state.comm.Allreduce(send, recv, op=_mpi_op(op, t.dtype))
    stats.messages += 1
    stats.bytes += send.nbytes
    if op == "mean":
        np.divide(recv, world_size(), out=recv)
    done()
    return out


def sum_over_ranks(t: Tensor, check: bool = True) -> Tensor:
    """The sum of t over every rank, as all_reduce's, but differentiable (torch.distributed.nn's all_reduce): the
    gradient of t on each rank is the sum over the ranks of the result's gradients, all-reduced while backward()
    walks the graph (every rank must call backward on graphs that reach it). check: as all_reduce's."""
    from zeptograd.gradient import with_gradient

    total = all_reduce(t, "sum", check=check)
    # total's value with t in its graph: t - t is exactly 0 (t is realized: both read one buffer), so every rank keeps
    # the very sum MPI gave; backward goes through the rule below, not through these ops
    out = t - t.detach() + total
    return with_gradient(out, (t,), lambda grad, _out, _t: (all_reduce(grad, "sum", check=False),))


def sync_batch_stats(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor, int]:
    """SyncBatchNorm's statistics (torch's nn.SyncBatchNorm): the mean and the biased variance of x over `axes` and
    over every rank's x, and the number of values each is over. Every rank passes a tensor of the same shape
    (checked: the count is this rank's times world_size()). Two all-reduces forward (the sums, then the squared
    deviations from the global mean: no E[x^2] - E[x]^2 cancellation), two in backward (their gradients)."""
    x = _check_tensor("SyncBatchNorm", x)
    _agree("SyncBatchNorm", f"of {_describe(x)} over axes {axes}")
    n = math.prod(x.shape[a] for a in axes) * world_size()
    local_sum = x.sum(axis=axes)
    Tensor.realize(x, local_sum)  # x is read by the sums, the deviations and the normalization: computed once
    mean = sum_over_ranks(local_sum, check=False) / n
    kept = [1 if a in axes else s for a, s in enumerate(x.shape)]
    y = x - mean.detach().reshape(kept)  # d(var)/d(mean) = 0 over the global batch, as BatchNorm's
    return mean, sum_over_ranks((y * y).sum(axis=axes), check=False) / n, n


def broadcast(t: Tensor, root: int = 0, check: bool = True) -> Tensor:
    """Rank `root`'s t on every rank (a new tensor; every rank passes a tensor of the same shape and dtype). check:
    as all_reduce's."""
    t = _check_tensor("broadcast", t)
    if not isinstance(root, int) or not 0 <= root < world_size():
        raise ArgumentError(f"broadcast: root must be a rank in [0, {world_size()}), got {root!r}")
    if check:
        _agree("broadcast", f"(root {root}) of {_describe(t)}")
    if t.dtype == dtypes.bfloat16:
        return broadcast(t.cast(dtypes.float32), root, check=False).cast(dtypes.bfloat16)
    out, recv, done = _new_tensor(t.shape, t.dtype, t.device)
    if rank() == root:
        recv[:] = _flat_values(t)
    with _Waiting("broadcast"):
        _state.comm.Bcast(recv, root=root)
    stats.messages += 1
    stats.bytes += recv.nbytes
    done()
    return out


def all_gather(t: Tensor, check: bool = True) -> Tensor:
    """Every rank's t stacked: shape (world_size(), *t.shape), rank r's tensor at index r. check: as all_reduce's."""
    t = _check_tensor("all_gather", t)
    if check:
        _agree("all_gather", f"of {_describe(t)}")
    if t.dtype == dtypes.bfloat16:
        return all_gather(t.cast(dtypes.float32), check=False).cast(dtypes.bfloat16)
    send = _flat_values(t)
    out, recv, done = _new_tensor((world_size(), *t.shape), t.dtype, t.device)
    with _Waiting("all_gather"):
        _state.comm.Allgather(send, recv)
    stats.messages += 1
    stats.bytes += send.nbytes
    done()
    return out


def barrier() -> None:
    """Wait until every rank has called barrier() (it is an agreement check: a rank in another collective is an
    error)."""
    _agree("barrier", "")


# ***** data parallel *****


def _chunks(n: int, itemsize: int, bucket_bytes: int) -> list[tuple[int, int]]:
    step = max(1, bucket_bytes // itemsize)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


class DataParallel:
    """Data-parallel training over the ranks with one optimizer per rank: the same parameters everywhere, each rank
    on its own part of every batch, gradients averaged. See the module's docstring.

        ddp = dist.DataParallel(opt)            # broadcasts rank 0's parameters and buffers
        step = ddp.train_step(loss_fn)          # loss_fn(x, y) -> loss or (loss, *metrics), each on this rank's part
        loss, acc = step(x_part, y_part)        # the means over every rank
        ddp.sync_buffers()                      # BatchNorm's running statistics: rank 0's, before evaluating
    """

    def __init__(self, optimizer: Any, bucket_bytes: int = BUCKET_BYTES, root: int = 0):
        from zeptograd.nn.optim import Optimizer

        if not isinstance(optimizer, Optimizer):
            raise ArgumentTypeError(f"DataParallel takes a zeptograd optimizer, got a {type(optimizer).__name__}")
        if not isinstance(bucket_bytes, int) or bucket_bytes < 8:
            raise ArgumentError(f"DataParallel: bucket_bytes must be an int >= 8, got {bucket_bytes!r}")
        self.opt, self.bucket_bytes = optimizer, bucket_bytes
        self.world = world_size()
        self.jits: tuple = ()
        self._broadcast_into(self.opt.params + self.opt.buffers, root, "DataParallel (the parameters and buffers)")

    def sync_buffers(self, root: int = 0) -> None:
        """Give every rank `root`'s buffers (BatchNorm's running statistics, which each rank moved with its own part
        of the batches), as torch DDP does before each forward; call it before evaluating or saving."""
        self._broadcast_into(self.opt.buffers, root, "DataParallel.sync_buffers")

    def _broadcast_into(self, tensors: list[Tensor], root: int, name: str) -> None:
        from zeptograd.nn.state import _realize_leaves

        if not isinstance(root, int) or not 0 <= root < self.world:
            raise ArgumentError(f"{name}: root must be a rank in [0, {self.world}), got {root!r}")
        _agree(name, f"(root {root}) of " + ", ".join(_describe(t) for t in tensors))
        for dtype, idx in _by_dtype(tensors).items():
            group = [tensors[i] for i in idx]
            wire = dtypes.float32 if dtype == dtypes.bfloat16 else dtype
            flat = np.empty(sum(t.numel() for t in group), to_numpy_dtype(wire))
            if rank() == root:
                _fill(flat, group, wire)
            for a, b in _chunks(len(flat), flat.itemsize, self.bucket_bytes):
                with _Waiting(name):
                    _state.comm.Bcast(flat[a:b], root=root)
                stats.messages += 1
                stats.bytes += (b - a) * flat.itemsize
            off = 0
            for t in group:
                value = flat[off : off + t.numel()].reshape(t.shape)
                t.assign(Tensor(value, device=t.device, dtype=wire).cast(t.dtype))
                off += t.numel()
        _realize_leaves(*tensors)

    def all_reduce_mean(self, tensors: list[Tensor]) -> list[np.ndarray]:
        """The mean over every rank of each tensor, as numpy arrays of their shapes: per dtype one flat buffer, sent
        in messages of at most bucket_bytes."""
        out: list[np.ndarray] = [np.empty(0)] * len(tensors)
        groups = _by_dtype(tensors)
        if bad := [dtype.name for dtype in groups if not dtypes.is_float(dtype)]:  # before anything is sent
            raise ArgumentTypeError(f"DataParallel averages float tensors (gradients, metrics), got {', '.join(bad)}")
        for dtype, idx in groups.items():
            group = [tensors[i] for i in idx]
            wire = dtypes.float32 if dtype == dtypes.bfloat16 else dtype
            flat = np.empty(sum(t.numel() for t in group), to_numpy_dtype(wire))
            _fill(flat, group, wire)
            for a, b in _chunks(len(flat), flat.itemsize, self.bucket_bytes):
                with _Waiting("DataParallel's gradient all-reduce"):
                    _state.comm.Allreduce(_state.MPI.IN_PLACE, flat[a:b], op=_state.MPI.SUM)
                stats.messages += 1
                stats.bytes += (b - a) * flat.itemsize
            flat *= flat.dtype.type(1 / self.world)
            off = 0
            for i, t in zip(idx, group):
                out[i] = flat[off : off + t.numel()].reshape(t.shape)
                off += t.numel()
        return out

    def train_step(self, loss_fn: Callable[..., Any], jit: bool = True) -> Callable[..., tuple[Tensor, ...]]:
        """A function running one data-parallel step: loss_fn(*args, **kwargs) on this rank's part of the batch
        (returning the loss, or a tuple (loss, *metrics) of float tensors), backward, the gradients (and metrics)
        averaged over the ranks, and the optimizer's update. It returns (loss, *metrics) averaged over the ranks.

        jit: forward+backward and the update are each a TinyJit (their kernels replayed from the third call); the
        all-reduce runs between them, outside both."""
        from zeptograd.engine.jit import TinyJit
        from zeptograd.nn.state import _realize_leaves

        opt = self.opt
        n_out: list[int] = []

        def forward_backward(*args, **kwargs) -> list[Tensor]:
            opt.zero_grad()
            ret = loss_fn(*args, **kwargs)
            loss, *metrics = ret if isinstance(ret, (tuple, list)) else (ret,)
            loss.backward()
            for i, p in enumerate(opt.params):
                if p.grad is None:
                    raise RuntimeError(f"parameter {i} (shape {p.shape}) has no gradient: the loss does not use it")
            outs = [loss.detach(), *[m.detach() for m in metrics], *[p.grad for p in opt.params if p.grad is not None]]
            outs = [o.cast(dtypes.float32) if o.dtype == dtypes.bfloat16 else o for o in outs]
            _realize_leaves(*opt.buffers, others=tuple(outs))  # one schedule, BatchNorm's running statistics too
            n_out[:] = [len(outs) - len(opt.params)]
            return outs

        def update(*grads: Tensor) -> None:
            _realize_leaves(*opt.schedule_step_with_grads(list(grads)))

        fb = TinyJit(forward_backward) if jit else forward_backward
        up = TinyJit(update) if jit else update
        self.jits = (fb, up) if jit else ()  # the latest train_step's TinyJits (their call counts, their captures)

        def step(*args, **kwargs) -> tuple[Tensor, ...]:
            outs = fb(*args, **kwargs)
            means = self.all_reduce_mean(outs)
            k = n_out[0]
            grads = [Tensor(g, device=p.device, dtype=o.dtype) for g, p, o in zip(means[k:], opt.params, outs[k:])]
            up(*grads)
            return tuple(Tensor(m, device=o.device, dtype=o.dtype) for m, o in zip(means[:k], outs[:k]))

        return step


def _by_dtype(tensors: list[Tensor]) -> dict[DType, list[int]]:
    """The tensors' indices grouped by dtype (one flat buffer per dtype)."""
    groups: dict[DType, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(_check_tensor("DataParallel", t).dtype, []).append(i)
    return groups


def _fill(flat: np.ndarray, group: list[Tensor], wire: DType) -> None:
    off = 0
    for t in group:
        flat[off : off + t.numel()] = _flat_values(t if t.dtype == wire else t.cast(wire))
        off += t.numel()
