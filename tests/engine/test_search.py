"""BEAM search: values unchanged, the choice cached on disk, the cache hit on a second run."""

import os

import numpy as np
import pytest

from zeptograd import Context, Tensor
from zeptograd.device import Device
from zeptograd.engine import kernels, realize, search


@pytest.mark.slow
def test_beam_finds_a_valid_kernel_and_caches_it(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    an = np.random.default_rng(0).standard_normal((48, 40)).astype(np.float32)
    bn = np.random.default_rng(1).standard_normal((40, 32)).astype(np.float32)
    a, b = Tensor(an).realize(), Tensor(bn).realize()

    def matmul():
        return (a.reshape(48, 1, 40) * b.permute(1, 0).reshape(1, 32, 40)).sum(2)

    with Context(BEAM=2, BEAM_BUDGET=4):
        out = matmul().numpy()
    np.testing.assert_allclose(out, an @ bn, rtol=1e-4, atol=1e-4)
    files = os.listdir(tmp_path / "zeptograd" / "beam")
    assert len(files) == 1

    # a second run (a fresh compile cache) reads the choice from disk: no candidate is rendered again
    cache: dict = {}
    monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
    monkeypatch.setattr(realize, "_kernel_cache", cache)
    calls = []
    monkeypatch.setattr(search, "_render", lambda *a: calls.append(a))
    with Context(BEAM=2):
        out2 = matmul().numpy()
    assert calls == []
    np.testing.assert_allclose(out2, out, rtol=1e-6)


def test_actions_cover_every_kind():
    x = Tensor(np.ones((8, 16), np.float32))
    (item,) = x.sum(axis=1).schedule()
    ops = {a.op.name for a in search.actions(item.ast, threads=2)}
    assert {"UPCAST", "UNROLL", "THREAD"} <= ops


def test_cached_choice_is_keyed_by_target_not_device_index(monkeypatch):
    (item,) = Tensor(np.ones((8, 16), np.float32)).sum(axis=1).schedule()
    name = search._cache_name("CPU", item.ast, 2)
    assert search._cache_name("CPU:1", item.ast, 2) == name  # another CPU device: the same compiler and registers
    assert search._cache_name("CPU:C", item.ast, 2) != name  # another compiler
    assert search._cache_name("CPU", item.ast, 4) != name  # another beam width
    # the same cache on a host with other vector registers: its choice would tile for the wrong width
    monkeypatch.setattr(Device["CPU"].renderer, "simd_bytes", Device["CPU"].renderer.simd_bytes // 2)
    assert search._cache_name("CPU", item.ast, 2) != name


def test_cached_choice_is_keyed_by_the_code_generator(monkeypatch):
    """A choice made by another version of codegen's passes (which apply its actions) is searched again."""
    (item,) = Tensor(np.ones((8, 16), np.float32)).sum(axis=1).schedule()
    name = search._cache_name("CPU", item.ast, 2)
    assert len(search.codegen_fingerprint()) == 16 and search.codegen_fingerprint() == search.codegen_fingerprint()
    monkeypatch.setattr(search, "codegen_fingerprint", lambda: "another codegen")
    assert search._cache_name("CPU", item.ast, 2) != name


@pytest.mark.slow
def test_beam_on_a_kernel_whose_loops_the_range_rewrites_merge(monkeypatch, tmp_path):
    """A 3-D softmax's kernel has its row loops merged by the range rewrites before the optimizer numbers its axes:
    BEAM applies its actions to that kernel, as optimize does (it replayed the heuristic's on the unmerged one: an
    OptError, 'UPCAST 1, 8 does not fit the axis size 5')."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    xn = np.random.default_rng(0).standard_normal((3, 5, 40)).astype(np.float32)
    with Context(BEAM=2, BEAM_BUDGET=4):
        out = Tensor(xn).softmax(-1).numpy()
    e = np.exp(xn - xn.max(-1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
