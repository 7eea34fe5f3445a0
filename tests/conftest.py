"""Suite-wide markers. The fast inner loop, under 30 s on two cores, runs what is not marked `slow`:

    python -m pytest -q -n 2 -m "not slow" tests

CI (`.ci/run`) runs everything. `slow` marks what takes seconds: the 10^5-node graphs, the examples, the pretrained
model, the property-based tests, the bench harness, the cache-security subprocesses; every case on a device other
than the default CPU (LLVM) — PYTHON (the interpreter), CL (PoCL), CPU:C (a gcc run per kernel), CUDA — is slow
here (a `device` parameter, see tests/backend/conftest.py); large families keep their first cases in the inner loop
and mark the rest (tests/slow.py's `fast_first`). Mark a new test slow when it takes over ~0.1 s on CPU. The whole
suite runs with SPEC=1.

Some torch calls import seconds of torch's compiler stack at their first use in a process, which the inner loop
avoids: a torch.optim optimizer or any op on the meta device (torch._dynamo, ~3 s), `out.backward(gradient)` (sympy,
~1 s: `(out * gradient).sum().backward()` gives the same gradients). Nothing opens the CL device or imports
scikit-learn at import time. After collection the objects made so far are frozen out of the cyclic garbage
collector (`gc.freeze`): each full collection walks only what the tests made."""

from __future__ import annotations

import gc
import os
import sys
import tempfile

import pytest

# PYTHONDONTWRITEBYTECODE=1 (set on these machines) made every run re-parse each module and rewrite the asserts of
# every test module: half of the collection time. The suite caches its bytecode outside the tree instead.
sys.dont_write_bytecode = False
sys.pycache_prefix = sys.pycache_prefix or os.path.join(tempfile.gettempdir(), "zeptograd-pycache")

# every stage's invariants are checked after each pass (uop/spec.py) in the whole suite; read when zeptograd's
# knobs are first imported, which is after this file
os.environ.setdefault("SPEC", "1")

SLOW_MODULES = {
    "test_deep",
    "test_examples",
    "test_minilm",
    "test_property",
    "test_symbolic_property",
    "test_bench",
    "test_startup",
    "test_browser",  # tests/viz: a headless Chromium
    "test_train_digits",  # tests/multi: imports scikit-learn (2-3 s in each worker) for one training run
    "test_layers",  # parses every module of the package
}


@pytest.fixture(autouse=True)
def _fresh_gradient_cache():
    """Each test starts without the gradient cache's templates (zeptograd/gradient_cache.py): a test may patch a
    module's constant that a gradient rule reads (a vector width, a size threshold), which no template's key holds."""
    from zeptograd import gradient_cache

    gradient_cache.clear()


# a parameter naming one of these devices (or "DEVICE-..."): the inner loop runs the default CPU only
SLOW_DEVICES = ("PYTHON", "CL", "CPU:C", "CUDA")


def _runs_on_a_slow_device(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and v.split("-")[0] in SLOW_DEVICES for v in params.values())


def pytest_ignore_collect(collection_path, config):
    """The inner loop (-m "not slow") does not import the modules that are slow as a whole: hypothesis alone takes
    seconds to import in each worker. None: let pytest decide as usual."""
    if config.getoption("markexpr", "") == "not slow" and collection_path.stem in SLOW_MODULES:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rsplit(".", 1)[-1] in SLOW_MODULES or _runs_on_a_slow_device(item):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session):
    """What collection made (torch, numpy, the test modules: ~170k objects, ~300k once torch._dynamo is in) lives
    until the end: gc.freeze moves it out of the cyclic collector's reach, so each full collection (automatic ones,
    the tests' gc.collect, pytest's five at exit) walks only what the tests made: ~1.5 s each -> a few ms.
    Reference counting still frees frozen objects; only cycles among them stay."""
    gc.freeze()
