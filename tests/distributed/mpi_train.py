"""An MPI job's rank (run by test_data_parallel.py): DataParallel training of dp_model's Net, eager and under
TinyJit, each rank on its half of every batch; it writes its parameters, buffers and losses to argv[1]/rank<r>.npz.
Rank 1 starts from other weights than rank 0: DataParallel gives it rank 0's."""

import os
import sys

import numpy as np
from dp_model import loss_and_accuracy, make, state, train_on_my_part

from zeptograd import Tensor
from zeptograd import distributed as dist

BUCKET = 64  # bytes: the 91 parameters and the two metrics (372 bytes of float32) in 6 messages a step

dist.init(timeout=60)
r, n = dist.rank(), dist.world_size()
saved = {}
with Tensor.train():
    for mode in ("eager", "jit"):
        net, opt = make(seed=r)
        ddp = dist.DataParallel(opt, bucket_bytes=BUCKET)
        step = ddp.train_step(lambda x, y: loss_and_accuracy(net, x, y), jit=mode == "jit")
        per_step, losses = train_on_my_part(step, r, n, lambda: dist.stats.messages)
        if mode == "jit":  # both jits replayed their captured kernels from the third step on
            assert [(j.cnt, j.captured is not None) for j in ddp.jits] == [(len(losses), True)] * 2, ddp.jits
        saved[f"{mode}.messages"] = per_step
        saved[f"{mode}.losses"] = losses
        ddp.sync_buffers()
        saved.update({f"{mode}.{k}": v for k, v in state(net).items()})
np.savez(os.path.join(sys.argv[1], f"rank{r}.npz"), **saved)
print(f"rank {r} ok")
