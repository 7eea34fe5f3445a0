"""Devices of one backend, renderer and compiler share each compiled kernel (engine/kernels.py: get_kernel keyed by
CompiledDevice.program_key): a model sharded over n CPU devices compiles as one device does."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor, nn
from zeptograd.device import Device
from zeptograd.engine import kernels, realize
from zeptograd.nn.optim import SGD
from zeptograd.uop.ops import Ops


@pytest.fixture
def codegens(monkeypatch):
    """An empty kernel cache and a list that gets each kernel graph codegen runs on (once per compile)."""
    cache: dict = {}
    monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
    monkeypatch.setattr(realize, "_kernel_cache", cache)
    seen: list = []
    full_rewrite = kernels.full_rewrite

    def counting(ast, renderer, opts=None):
        seen.append(ast)
        return full_rewrite(ast, renderer, opts)

    monkeypatch.setattr(kernels, "full_rewrite", counting)
    return seen


def _replicated_mlp(devices: tuple[str, ...]) -> np.ndarray:
    rng = np.random.default_rng(1)
    x, w1, w2 = (Tensor(rng.standard_normal(s).astype(np.float32)) for s in ((8, 16), (16, 32), (32, 4)))
    if len(devices) > 1:  # a whole copy on each device: every device runs the one-device kernels
        x, w1, w2 = (t.shard(devices) for t in (x, w1, w2))
    out = ((x @ w1).relu() @ w2).softmax(1)
    return out.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_n_devices_compile_as_one(codegens, n):
    one = _replicated_mlp(("CPU",))
    compiled_for_one = len(codegens)
    assert compiled_for_one > 0
    codegens.clear()
    kernels._kernel_cache.clear()
    devices = tuple(f"CPU:{i}" for i in range(n))
    np.testing.assert_allclose(_replicated_mlp(devices), one, rtol=1e-6, atol=1e-7)
    assert len(codegens) == compiled_for_one  # not n times


@pytest.mark.slow
def test_sharded_step_compiles_each_kernel_once(codegens):
    """Data parallel over two devices: each distinct kernel graph is compiled once, whichever devices run it (the two
    halves of the batch are the same kernels on CPU and CPU:1)."""
    devices = ("CPU:0", "CPU:1")
    rng = np.random.default_rng(2)
    lin = nn.Linear(12, 5)
    for p in (lin.weight, lin.bias):
        p.shard_(devices)
    opt = SGD([lin.weight, lin.bias], lr=0.1)
    x = Tensor(rng.standard_normal((16, 12)).astype(np.float32)).shard(devices, axis=0)
    y = Tensor(rng.integers(0, 5, 16)).shard(devices, axis=0)
    with Tensor.train():
        opt.zero_grad()
        lin(x).cross_entropy(y).backward()
        opt.step()
    lin.weight.numpy()
    entries = [k for k in kernels._kernel_cache if k[1].op is not Ops.COPY]
    assert len(codegens) == len(set(codegens)) == len({k[1] for k in entries})
    assert len(entries) == len({k[1] for k in entries})  # one entry per graph: not one per device


def test_program_keys():
    """CPU:0 and CPU:1 share programs; other compilers, and devices whose programs belong to a context, do not."""
    assert Device["CPU:1"].program_key == Device["CPU"].program_key != "CPU"
    assert Device["NULL:1"].program_key == Device["NULL"].program_key
    assert Device["CPU"].program_key != Device["NULL"].program_key
    assert Device["CPU:C"].program_key != Device["CPU"].program_key
    assert Device["CPU:1:C"].program_key == Device["CPU:C"].program_key
