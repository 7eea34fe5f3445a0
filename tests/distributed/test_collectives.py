"""zeptograd.distributed's collectives in a job of 2 ranks (mpi_collectives.py), and in a job of one."""

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow


def test_collectives_two_ranks(run_ranks):
    job = run_ranks("mpi_collectives.py")
    assert job.returncode == 0, job.describe()
    for r in range(2):
        assert f"rank {r} ok" in job.stdout, job.describe()


def test_one_process_without_mpiexec():
    pytest.importorskip("mpi4py", reason='mpi4py is not installed (pip install -e ".[distributed]")')
    code = (
        "from zeptograd import Tensor, distributed as d\n"
        "try:\n    d.rank()\nexcept RuntimeError as e:\n    print('before init:', e)\n"
        "print('initialized:', d.is_initialized())\n"
        "d.init()\n"
        "print('initialized:', d.is_initialized())\n"
        "print(d.rank(), d.world_size(), d.all_reduce(Tensor([1.0, 2.0]), 'mean').tolist(),"
        " d.all_gather(Tensor([3])).tolist(), d.broadcast(Tensor([4]), 0).tolist())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ}
    )
    assert proc.returncode == 0, proc.stderr
    assert "before init: zeptograd.distributed: call distributed.init() first" in proc.stdout
    assert "initialized: False\ninitialized: True" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "0 1 [1.0, 2.0] [[3]] [4]"
