"""Suite-wide markers. `slow` marks what takes seconds per test: the 10^5-node graphs, the examples, the pretrained
model, the property-based tests, the bench harness, and every case that runs on the PYTHON interpreter device.
`python -m pytest -m "not slow" tests` is the quick inner loop; CI runs everything. The whole suite runs with SPEC=1."""

from __future__ import annotations

import os

import pytest

# every stage's invariants are checked after each pass (uop/spec.py) in the whole suite; read when zeptograd's
# knobs are first imported, which is after this file
os.environ.setdefault("SPEC", "1")

SLOW_MODULES = {"test_deep", "test_examples", "test_minilm", "test_property", "test_bench", "test_startup"}


def _runs_on_python_device(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and (v == "PYTHON" or v.startswith("PYTHON-")) for v in params.values())


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES or _runs_on_python_device(item):
            item.add_marker(pytest.mark.slow)
