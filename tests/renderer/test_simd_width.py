"""A CPU renderer's vector width is the target's: the host's features decide it (AVX-512: 16 floats, AVX: 8, SSE and
NEON: 4), the LLVM and C backends by one rule, and codegen makes vectors of the renderer's width, none wider."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer import cpu_simd_bytes, simd_bytes_for
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.runtime.ops_llvm import LLVMCompiler


@pytest.mark.parametrize(
    "features, width",
    [
        ({"sse2", "avx", "avx2", "fma", "avx512f", "avx512bw"}, 64),  # skylake-avx512, znver4
        ({"sse2", "avx", "avx2", "fma"}, 32),  # haswell, znver3
        ({"sse2", "avx"}, 32),  # sandybridge: 8-lane float registers
        ({"sse2", "sse4.2"}, 16),
        ({"neon", "fp-armv8"}, 16),
        (set(), 16),
    ],
)
def test_width_rule(features, width):
    assert simd_bytes_for(features) == width


def _with_key(key: str) -> LLVMCompiler:
    compiler = LLVMCompiler()
    compiler.__dict__["key"] = key  # the host's memo, as read from the cache: no llvmlite asked
    return compiler


def test_llvm_width_from_the_host_features():
    """Only the enabled (+) features count: `-avx512f` on an AVX2 host is not AVX-512."""
    avx2 = "llvm (22, 1, 0) znver3 +64bit,+avx,+avx2,-avx512f,-avx512bw,+fma,+sse2 O2"
    assert _with_key(avx2).vector_bytes == 32
    assert _with_key(avx2.replace("-avx512f", "+avx512f")).vector_bytes == 64
    assert _with_key("llvm (22, 1, 0) generic +sse2,-avx,-avx2 O2").vector_bytes == 16
    assert _with_key("llvm (22, 1, 0) apple-m1 +neon,+fp-armv8 O2").vector_bytes == 16


def _llvm_source(t: Tensor, renderer: LLVMRenderer) -> str:
    (item,) = schedule_tensors([t])
    uops, _ = full_rewrite(item.ast, renderer)
    return renderer.render(kernel_name(item.ast), uops).src


@pytest.mark.parametrize("simd_bytes", [16, 32, 64])
def test_llvm_renders_vectors_of_its_width(simd_bytes):
    """elementwise, a sum and a matmul: every float vector is as wide as the renderer's registers, none wider"""
    a = Tensor(np.ones((64, 1024), np.float32))
    b = Tensor(np.ones((1024, 64), np.float32))
    lanes = simd_bytes // 4
    for t in (a + 1, a.sum(axis=1), a @ b):
        src = _llvm_source(t, LLVMRenderer(simd_bytes=simd_bytes))
        widths = {int(n) for n in re.findall(r"<(\d+) x float>", src)}
        assert lanes in widths and max(widths) == lanes, (t.shape, sorted(widths))


def test_cpu_backends_agree_on_the_width():
    """The default CPU device (LLVM) and CPU:C render vectors of one width, this host's (or SIMD_BYTES's)."""
    from zeptograd import Device

    llvm = Device["CPU"]
    assert llvm.compiler.vector_bytes in (16, 32, 64)
    assert llvm.renderer.simd_bytes == cpu_simd_bytes(llvm.compiler.vector_bytes)
    try:
        c = Device["CPU:C"]
    except Exception as e:
        pytest.skip(f"CPU:C: {e}")
    assert c.renderer.simd_bytes == llvm.renderer.simd_bytes


@pytest.mark.parametrize("simd_bytes, lanes, accumulators", [(64, 16, 4), (32, 8, 8), (16, 4, 8)])
def test_a_reduce_keeps_its_adds_in_flight(simd_bytes, lanes, accumulators):
    """a sum along its contiguous axis: vectors of the target's width, and 8 accumulators where they are narrower than
    64 bytes (as many adds in flight as AVX-512's 4 x 16 lanes; AVX2's 4 x 8 lanes were latency-bound)"""
    from zeptograd.codegen.opt import OptOps
    from zeptograd.codegen.opt.heuristic import hand_coded_optimizations

    (item,) = schedule_tensors([Tensor(np.ones((64, 4096), np.float32)).sum(axis=1)])
    _, opts = hand_coded_optimizations(item.ast, simd_bytes, threads=1)
    assert [(o.op, o.arg) for o in opts] == [(OptOps.UNROLL, lanes), (OptOps.UNROLL, accumulators)]


@pytest.mark.parametrize("knob, host, width", [("", 64, 64), ("32", 64, 32), ("16", 32, 16), ("64", 32, 32)])
def test_simd_bytes_knob_narrows_the_host_width(monkeypatch, knob, host, width):
    """SIMD_BYTES renders an AVX-512 host's kernels as an AVX2 host's (32) or an SSE host's (16), never wider than
    the host's registers."""
    monkeypatch.setenv("SIMD_BYTES", knob)
    assert cpu_simd_bytes(host) == width


@pytest.mark.parametrize("knob", ["8", "48", "avx2"])
def test_simd_bytes_knob_rejects_other_widths(monkeypatch, knob):
    monkeypatch.setenv("SIMD_BYTES", knob)
    with pytest.raises(ValueError, match=f"SIMD_BYTES={knob!r}"):
        cpu_simd_bytes(64)


def test_simd_bytes_knob_reaches_both_cpu_renderers():
    """The knob is read when a CPU device is made: both CPU renderers of a fresh process render 4-float vectors."""
    code = "from zeptograd import Device; print(Device['CPU'].renderer.simd_bytes, Device['CPU:C'].renderer.simd_bytes)"
    env = {**os.environ, "SIMD_BYTES": "16"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["16", "16"]
