"""Whole-process startup (issue 6): a fresh Python process that imports the library, computes one small sum and
prints it, timed from the parent (process start to exit), as a user running a short script sees it.

    startup        python -c "from zeptograd import Tensor; print(Tensor([1.0]).sum().item())", the kernel in the
                   on-disk cache (a warm-up run puts it there)
    startup_cold   the same with an empty on-disk cache (a fresh XDG_CACHE_HOME per run): the kernel is compiled

numpy and torch run the same line with their own arrays. The note gives a bare `python -c pass` (the interpreter's
own start, the floor of every column). The processes inherit the environment: with PYTHONDONTWRITEBYTECODE=1 every
module is compiled from source in each process, which costs more than anything zeptograd does at import.

Registered in bench/run.py's CASES (`**STARTUP_CASES`); the case functions return an object with Spec's fields, so
this module does not import bench.run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from bench.spec import Spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = {
    "zeptograd": "from zeptograd import Tensor; print(Tensor([1.0]).sum().item())",
    "numpy": "import numpy as np; print(np.array([1.0], dtype=np.float32).sum().item())",
    "torch": "import torch; print(torch.tensor([1.0]).sum().item())",
}


def _process(code: str, cache_dirs: list[str] | None = None) -> Callable[[], None]:
    """A runner: one process running `code` in the repository root (so it imports this checkout's zeptograd)."""

    def run():
        env = dict(os.environ)
        env.pop("DEV", None)
        if cache_dirs is not None:  # a fresh, empty cache for this run (made beforehand: not timed)
            env["XDG_CACHE_HOME"] = cache_dirs.pop() if cache_dirs else tempfile.mkdtemp(prefix="zg_startup_")
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)

    return run


def _available(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def bare_python_s(runs: int = 5) -> float:
    """The median time of `python -c pass`: the interpreter's own start."""
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=ROOT)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _case(cold: bool) -> Callable[[bool], Spec]:
    def case(q: bool) -> Spec:
        dirs: list[str] | None = None
        if cold:
            dirs = [tempfile.mkdtemp(prefix="zg_startup_") for _ in range(4 if q else 8)]
            top = list(dirs)
            atexit.register(lambda: [shutil.rmtree(d, ignore_errors=True) for d in top])
        else:
            _process(LINES["zeptograd"])()  # warm-up: the kernel is in the on-disk cache from here on
        runners: dict[str, Callable[[], Any] | None] = {"zeptograd": _process(LINES["zeptograd"], dirs)}
        for impl in ("numpy", "torch"):
            runners[impl] = _process(LINES[impl]) if _available(impl) else None
        bare = bare_python_s(2 if q else 5)
        pyc = " (PYTHONDONTWRITEBYTECODE=1: modules compiled each run)" if os.getenv("PYTHONDONTWRITEBYTECODE") else ""
        note = (
            f"whole process, {'empty' if cold else 'warm'} kernel cache; bare `python -c pass` {bare * 1e3:.0f} ms{pyc}"
        )
        return Spec(runners, "latency", note=note)

    return case


STARTUP_CASES: dict[str, Callable[[bool], Spec]] = {
    "startup": _case(cold=False),
    "startup_cold": _case(cold=True),
}
