"""The LLVM backend's optimization pipeline per kernel (runtime/ops_llvm.py): O2, but O1 for a kernel that writes its
tile one value per store (MANY_STORES or more stores), whose O2 time goes to passes that find nothing in it."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.runtime import ops_llvm
from zeptograd.runtime.ops_llvm import MANY_STORES, LLVMCompiler, LLVMDevice, unique_symbol


def _scatter_kernel(stores: int) -> str:
    """LLVM IR of a kernel like a transposed tile's epilogue: out[37 * i] = in[i % 16], one scalar store each."""
    body = ["  %v = load <16 x float>, ptr %data1, align 64"]
    for i in range(stores):
        body += [
            f"  %e{i} = extractelement <16 x float> %v, i32 {i % 16}",
            f"  %p{i} = getelementptr inbounds float, ptr %data0, i32 {37 * i}",
            f"  store float %e{i}, ptr %p{i}, align 4",
        ]
    head = f"define void @scatter_{stores}(ptr noalias align 64 %data0, ptr noalias align 64 %data1) nounwind {{"
    return "\n".join([head, "entry:", *body, "  ret void", "}", ""])


@pytest.fixture
def levels(monkeypatch):
    """The speed level of each pipeline the compiler builds, in order."""
    seen: list[int] = []
    llvm = LLVMCompiler().llvm
    make = llvm.create_pipeline_tuning_options

    def recording(speed_level=2):
        seen.append(speed_level)
        return make(speed_level=speed_level)

    monkeypatch.setattr(llvm, "create_pipeline_tuning_options", recording)
    return seen


def test_many_stores_compile_at_o1(levels, monkeypatch):
    monkeypatch.delenv("LLVM_OPT", raising=False)
    compiler = LLVMCompiler()
    compiler.build(_scatter_kernel(MANY_STORES - 1))
    compiler.build(_scatter_kernel(MANY_STORES))
    assert levels == [2, 1]
    assert compiler.pipeline in compiler.key  # the rule is part of the disk cache's key


def test_llvm_opt_sets_every_kernel(levels, monkeypatch):
    monkeypatch.setenv("LLVM_OPT", "2")
    LLVMCompiler().build(_scatter_kernel(MANY_STORES))
    assert levels == [2]


def test_matmul_keeps_o2(levels, monkeypatch):
    """A register-tiled matmul writes a few vectors per tile: O2, whose loop unrolling it needs."""
    monkeypatch.delenv("LLVM_OPT", raising=False)
    renderer = LLVMRenderer(simd_bytes=LLVMCompiler().vector_bytes)
    a, b = Tensor.rand(64, 64), Tensor.rand(64, 64)
    (item,) = [i for i in schedule_tensors([a @ b]) if kernel_name(i.ast).startswith("r_")]
    uops, _ = full_rewrite(item.ast, renderer)
    src = renderer.render(kernel_name(item.ast), uops).src
    LLVMCompiler().build(src)
    assert levels == [2]


def test_scatter_kernel_values_at_o1(monkeypatch, tmp_path):
    """The O1-compiled kernel writes what the IR says (each lane to its strided place)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("LLVM_OPT", raising=False)
    src = _scatter_kernel(MANY_STORES)
    dev = LLVMDevice("CPU")
    symbol = unique_symbol(src)
    addr = dev.load(src, symbol)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(addr)
    inp = np.arange(16, dtype=np.float32)
    out = np.zeros(37 * MANY_STORES, dtype=np.float32)
    fn(out.ctypes.data, inp.ctypes.data)
    np.testing.assert_array_equal(out[::37], np.tile(inp, MANY_STORES // 16))
    assert ops_llvm.LLVMCompiler().speed_level(src) == 1
