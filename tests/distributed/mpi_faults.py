"""An MPI job's rank (run by test_faults.py) in which rank 1 fails as argv[1] says while rank 0 waits in an
all_reduce: `raise` (an exception), `kill` (SIGKILL: the process dies), `leave` (it ends normally without taking
part, MPI_Finalize and exit code 0: only the timeout ends rank 0's wait)."""

import os
import signal
import sys
import time

from zeptograd import Tensor
from zeptograd import distributed as dist

how = sys.argv[1]
dist.init(timeout=float(sys.argv[2]) if len(sys.argv) > 2 else 60)
dist.barrier()
print(f"rank {dist.rank()} started at {time.time()}", flush=True)  # the test's clock starts here, after start-up
if dist.rank() == 1:
    time.sleep(0.5)  # rank 0 is waiting in all_reduce by now
    if how == "raise":
        raise RuntimeError("rank 1 failed on purpose")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "leave":
        sys.exit(0)  # MPI_Finalize at exit, as a normal end
dist.all_reduce(Tensor.ones(4))
print(f"rank {dist.rank()} returned from all_reduce", flush=True)
