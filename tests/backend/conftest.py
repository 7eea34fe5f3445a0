"""The `device` fixture: every backend test runs once per device that can open here.

To add a backend (OpenCL "CL", "CUDA", ...): register it in `zeptograd/device.py`'s `_BACKENDS` and append its
name to `DEVICES` below (CL and CUDA are listed already). A device that can't open on this machine (no driver,
no GPU, not registered yet) is skipped with the reason. `ZG_TEST_DEVICES=CPU,PYTHON` narrows the list.
"""

from __future__ import annotations

import functools
import os
import tempfile

import pytest

from zeptograd import Device

# PoCL (the CL device on a CPU) caches compiled kernels on disk: keep that cache out of the home directory
os.environ.setdefault("POCL_CACHE_DIR", os.path.join(tempfile.gettempdir(), "zeptograd-pocl-cache"))

DEVICES = ["CPU", "CPU:C", "PYTHON", "CL", "CUDA"]  # CPU is LLVM; PYTHON is the reference
REFERENCE = "PYTHON"


@functools.cache
def unavailable(device: str) -> str | None:
    """Why `device` can't run here, or None when it can."""
    try:
        Device[device]
    except Exception as e:  # unknown name, missing driver or compiler
        return f"{device} is not available: {type(e).__name__}: {e}"
    return None


def _selected() -> list[str]:
    only = os.getenv("ZG_TEST_DEVICES")
    return [d for d in DEVICES if not only or d in only.split(",")]


@pytest.fixture(params=_selected())
def device(request) -> str:
    if (why := unavailable(request.param)) is not None:
        pytest.skip(why)
    return request.param
