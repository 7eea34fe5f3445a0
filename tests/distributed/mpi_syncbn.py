"""An MPI job's rank (run by test_data_parallel.py): DataParallel training of dp_model's TwoNormNet with
nn.SyncBatchNorm, each rank on its half of every batch (eager: the statistics' all-reduces run inside forward and
backward); it writes its parameters, buffers and losses to argv[1]/sync<r>.npz. Under TinyJit the capture call is an
error naming the collective."""

import os
import sys

import numpy as np
from dp_model import BATCH, batches, loss_and_accuracy, make_two_norm, state, train_on_my_part

from zeptograd import Tensor, nn
from zeptograd import distributed as dist
from zeptograd.engine.jit import JitError

dist.init(timeout=60)
r, n = dist.rank(), dist.world_size()
part = BATCH // n
saved = {}
with Tensor.train():
    net, opt = make_two_norm(seed=r, norm=nn.SyncBatchNorm)
    ddp = dist.DataParallel(opt)
    step = ddp.train_step(lambda x, y: loss_and_accuracy(net, x, y), jit=False)
    saved["messages"], saved["losses"] = train_on_my_part(step, r, n, lambda: dist.stats.messages)
    saved.update(state(net))
    # TinyJit: the first call runs eagerly, the second (the capture) meets the collective and refuses it
    jitted = ddp.train_step(lambda x, y: loss_and_accuracy(net, x, y), jit=True)
    x, y = batches()[0]
    xs, ys = Tensor(x[r * part : (r + 1) * part]), Tensor(y[r * part : (r + 1) * part])
    jitted(xs, ys)
    try:
        jitted(xs, ys)
        raise AssertionError("a SyncBatchNorm step was captured by TinyJit")
    except JitError as e:
        assert "SyncBatchNorm inside a TinyJit" in str(e), e
dist.barrier()
np.savez(os.path.join(sys.argv[1], f"sync{r}.npz"), **saved)
print(f"rank {r} ok")
