"""Choosing a backend (DEV, CPU_LLVM), what DEBUG=4 prints for each, the LLVM compile cache, the NULL device."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback

import numpy as np
import pytest

from zeptograd import Context, Device, GlobalCounters, Tensor
from zeptograd.device import CompileError
from zeptograd.engine.realize import get_kernel
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.runtime import ops_cpu
from zeptograd.runtime.ops_llvm import LLVMCompiler, LLVMDevice


def test_default_cpu_is_llvm(monkeypatch):
    monkeypatch.delenv("DEV", raising=False)
    monkeypatch.delenv("CPU_LLVM", raising=False)
    assert Device.DEFAULT == "CPU"
    assert isinstance(Device["CPU"], LLVMDevice)


def test_env_is_read_at_call_time(monkeypatch):
    monkeypatch.delenv("DEV", raising=False)
    monkeypatch.setenv("CPU_LLVM", "1")
    assert Device.DEFAULT == "CPU:LLVM" and isinstance(Device["CPU:LLVM"], LLVMDevice)
    assert Tensor([1.0, 2.0]).device == "CPU:LLVM"
    monkeypatch.setenv("DEV", "CPU:C")
    assert Device.DEFAULT == "CPU:C" and isinstance(Device["CPU:C"].renderer, CStyleRenderer)
    assert Tensor([1.0, 2.0]).sum().item() == 3.0
    monkeypatch.setenv("DEV", "python")
    assert Device.DEFAULT == "PYTHON" and Tensor([1.0]).device == "PYTHON"


def test_cpu_llvm_0_makes_plain_cpu_the_c_backend(monkeypatch):
    monkeypatch.setenv("CPU_LLVM", "0")
    assert isinstance(ops_cpu.open_device("CPU").renderer, CStyleRenderer)  # a fresh device, not the registry's


def test_names():
    assert Device.canonicalize("cpu:llvm") == "CPU:LLVM"
    with pytest.raises(ValueError, match="unknown device"):
        Device.canonicalize("NOPE")
    with pytest.raises(ValueError, match=r"'CPU:FORTRAN' doesn't follow KIND\[:INDEX\]\[:COMPILER\]: CPU's compilers"):
        Device["CPU:FORTRAN"]


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("cpu", "CPU"),
        ("CPU:0", "CPU"),
        ("cpu:0:c", "CPU:C"),
        ("CPU:C", "CPU:C"),
        ("CPU:0:LLVM", "CPU:LLVM"),
        ("python:0", "PYTHON"),
        ("NULL:0", "NULL"),
        ("CL:0", "CL"),
        ("CL:1", "CL:1"),
        ("cuda:2", "CUDA:2"),
    ],
)
def test_device_grammar_kind_index_compiler(name, canonical):
    """KIND[:INDEX][:COMPILER]: an integer field is the device index (0 is the kind itself), a name the compiler."""
    assert Device.canonicalize(name) == canonical


def test_device_index_zero_is_the_same_device():
    a, b = Tensor([1.0, 2.0], device="CPU:0"), Tensor([3.0, 4.0], device="CPU")
    assert a.device == b.device == "CPU" and (a + b).tolist() == [4.0, 6.0]  # one device: no cross-device error
    assert Device["CPU:0:C"] is Device["CPU:C"]
    assert Tensor([1.0, 2.0], device="CPU:0:C").sum().item() == 3.0


def test_several_cpu_devices_in_one_process():
    """CPU:1, CPU:2:C: more devices on the same cores, each its own memory; values move between them by COPY and
    gradients flow back through it."""
    assert Device["CPU:1"] is not Device["CPU"] and Device["CPU:1:C"] is not Device["CPU:C"]
    x = Tensor([1.0, 2.0, 3.0], device="CPU:1", requires_grad=True)
    y = (x * 2).to("CPU:2:C") + 1
    assert y.device == "CPU:2:C" and y.tolist() == [3.0, 5.0, 7.0]
    (y.to("CPU") * 3).sum().backward()
    assert x.grad is not None and x.grad.device == "CPU:1" and x.grad.tolist() == [6.0, 6.0, 6.0]


@pytest.mark.parametrize(
    "name, message",
    [
        ("PYTHON:2", r"device 'PYTHON:2': PYTHON has only device index 0 \(KIND\[:INDEX\]\[:COMPILER\]"),
        ("CPU:C:LLVM", r"'CPU:C:LLVM' doesn't follow KIND\[:INDEX\]\[:COMPILER\]"),
        ("CPU:LLVM:0", r"'CPU:LLVM:0' doesn't follow"),  # the index comes before the compiler
        ("PYTHON:C", r"PYTHON has no compiler choice"),
        ("CL:LLVM", r"CL has no compiler choice"),
        ("GPU:0", r"unknown device 'GPU:0'"),
    ],
)
def test_device_grammar_errors_name_the_value(name, message):
    with pytest.raises(RuntimeError, match=message) as info:
        Tensor([1.0], device=name)
    assert isinstance(info.value, ValueError)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert not any("/runtime/" in f.filename for f in frames), "raised from the backend, not at the call"


@pytest.mark.slow
def test_import_does_not_load_llvmlite():
    code = "import sys, zeptograd; from zeptograd import Tensor; assert 'llvmlite' not in sys.modules, 'loaded'"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_debug4_prints_llvm_ir(capsys):
    x = Tensor(np.arange(7, dtype=np.float32), device="CPU")
    with Context(DEBUG=4):
        (x * 7.25 - 3).sqrt().realize()
    out = capsys.readouterr().out
    assert "define void @E_" in out and "noalias" in out and "ret void" in out
    assert "@llvm.sqrt." in out  # an intrinsic, not a libm call


def test_debug4_prints_python_listing(capsys):
    x = Tensor(np.arange(5, dtype=np.float32), device="PYTHON")
    with Context(DEBUG=4):
        (x * 5.25 + 1).realize()
    out = capsys.readouterr().out
    assert "# PYTHON kernel E_" in out and " STORE " in out


def test_llvm_compile_cache_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = "define void @zg_cache_probe(ptr noalias %a) {\nentry:\n  store float 1.0, ptr %a\n  ret void\n}\n"
    obj = LLVMCompiler().compile(src)
    files = sorted(os.listdir(tmp_path / "zeptograd" / "llvm"))
    assert len(files) == 2 and files[0].endswith(".o") and files[1] == files[0] + ".sha256"  # the entry, its hash

    def no_compile(*args):
        raise AssertionError("compiled again instead of reading the cache")

    c = LLVMCompiler()
    monkeypatch.setattr(c, "optimize", no_compile)
    assert c.compile(src) == obj


def test_invalid_llvm_ir_is_a_compile_error(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(CompileError, match="invalid"):
        LLVMCompiler().compile("define void @f() {\nentry:\n  ret i32 0\n}\n")


def test_null_device_runs_nothing():
    x = Tensor(np.arange(6, dtype=np.float32), device="NULL")
    GlobalCounters.reset()
    (x * 2 + 1).realize()  # scheduled, rendered, "run"
    assert GlobalCounters.kernel_count == 1
    item = (x * 3 + 5).schedule()[-1]
    kernel = get_kernel(item.device, item.ast)
    assert "void E_6(" in kernel.src  # C source
    kernel.program(0, 0)  # null pointers: a kernel that ran would crash
