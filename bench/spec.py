"""What a bench case returns (`Spec`) and the helpers every case module shares. The case modules
(bench/cases_*.py) import this, not bench.run, which imports them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


def threads() -> int:
    return int(os.getenv("THREADS") or os.cpu_count() or 1)


def torch_or_none():
    """torch with zeptograd's thread count, or None where it is not installed."""
    try:
        import torch

        torch.set_num_threads(threads())
        return torch
    except ImportError:
        return None


@dataclass
class Spec:
    """What one case runs: a callable per implementation (None: n/a), and how to turn seconds into a rate.
    `runners` holds "zeptograd" and the peers it is compared with, by name: numpy and torch for most cases, any
    other (onnxruntime) where it applies; the report gets a column for each peer a case names."""

    runners: dict[str, Callable[[], Any] | None]
    kind: str  # "bw" (GB/s from nbytes), "flops" (GFLOPS from flops), "rate" (per second), "latency" (time)
    nbytes: int = 0
    flops: int = 0
    note: str = ""
    loop: int = 0  # >0: cheap calls, timed as batches of `loop` calls
    warmups: int = 0  # at least this many warm-up calls whatever the first costs (2 for a TinyJit step: it captures
    # on its second call, which can take seconds where the first took over 10 s to compile)
    runs: int = 0  # a "latency" case: this many calls (0: 5), fewer for a slow one
