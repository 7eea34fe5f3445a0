"""A rank that raises, dies or leaves ends the whole job with a clear error, in seconds (mpi_faults.py)."""

import re
import time

import pytest

pytestmark = pytest.mark.slow

LIMIT_S = 30  # the job must be over within this after the fault (the test's own timeout is above it: a hang fails)


def seconds_after_start(job) -> float:
    """From the moment both ranks were running (their start-up on a loaded machine does not count) to the job's end."""
    # the two ranks share stdout: one's line can land inside the other's (its newline is a separate write)
    starts = [float(t) for t in re.findall(r"started at (\d+\.\d+)", job.stdout)]
    assert len(starts) == 2, job.describe()
    return time.time() - max(starts)


def test_a_rank_that_raises_aborts_every_rank(run_ranks):
    job = run_ranks("mpi_faults.py", "raise", timeout=90)
    assert job.returncode != 0, job.describe()
    assert "RuntimeError: rank 1 failed on purpose" in job.stderr, job.describe()  # the traceback
    assert "zeptograd.distributed: rank 1 of 2: RuntimeError: rank 1 failed on purpose; aborting every rank" in (
        job.stderr
    ), job.describe()
    assert "returned from all_reduce" not in job.stdout
    assert seconds_after_start(job) < LIMIT_S, job.describe()


def test_a_rank_that_dies_ends_the_job(run_ranks):
    job = run_ranks("mpi_faults.py", "kill", timeout=90)
    assert job.returncode != 0, job.describe()
    assert "returned from all_reduce" not in job.stdout
    assert seconds_after_start(job) < LIMIT_S, job.describe()


def test_a_rank_that_leaves_times_the_others_out(run_ranks):
    job = run_ranks("mpi_faults.py", "leave", "3", timeout=90)
    assert job.returncode != 0, job.describe()
    # rank 0 waits in all_reduce's agreement check, the first exchange of the call
    assert "zeptograd.distributed: rank 0 of 2: all_reduce (the agreement check) waited 3 s for the other ranks" in (
        job.stderr
    ), job.describe()
    assert "returned from all_reduce" not in job.stdout
    assert seconds_after_start(job) < LIMIT_S, job.describe()
