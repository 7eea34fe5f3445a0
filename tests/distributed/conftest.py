"""Running a worker script of this folder as an MPI job of n ranks on this host (mpiexec; MPI over shared memory and
loopback only), bounded by a timeout. Without mpi4py or mpiexec the tests skip, saying which is missing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def describe(self) -> str:
        head = f"exit {self.returncode} after {self.seconds:.1f} s"
        return f"{head}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


def mpiexec_or_skip(n: int) -> list[str]:
    pytest.importorskip("mpi4py", reason='mpi4py is not installed (pip install -e ".[distributed]")')
    from zeptograd.distributed import mpiexec

    cmd = mpiexec(n)
    if cmd is None:
        pytest.skip('no mpiexec on PATH (pip install -e ".[distributed]" installs MPICH\'s)')
    return cmd


@pytest.fixture
def run_ranks():
    def run(script: str, *args: str, n: int = 2, timeout: float = 120) -> Job:
        cmd = [*mpiexec_or_skip(n), sys.executable, os.path.join(HERE, script), *args]
        # one thread per rank: the ranks share the machine's cores
        env = {**os.environ, "PYTHONPATH": ROOT, "THREADS": "1"}
        t0 = time.monotonic()
        # a session of its own, so that a job past its timeout is ended whole (mpiexec and every rank)
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, start_new_session=True
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{script} {' '.join(args)}: the job did not end within {timeout} s\n{out}\n{err}")
        return Job(proc.returncode, out, err, time.monotonic() - t0)

    return run
