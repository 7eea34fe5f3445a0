"""Startup: what `import zeptograd` and a first small computation load, and the LLVM backend's loader that lets a
process whose kernels are all in the on-disk cache run them without importing llvmlite (runtime/elf.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from zeptograd import Device, Tensor
from zeptograd.device import CompileError
from zeptograd.runtime import elf
from zeptograd.runtime.ops_llvm import LLVMCompiler, LLVMDevice, unique_symbol

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str, cache: str) -> str:
    env = dict(os.environ, XDG_CACHE_HOME=cache, PYTHONPATH=ROOT)
    env.pop("DEV", None)
    env.pop("CPU_LLVM", None)
    return subprocess.run(
        [sys.executable, "-c", code], check=True, cwd=ROOT, env=env, capture_output=True, text=True
    ).stdout


def test_import_loads_only_what_a_computation_needs(tmp_path):
    code = (
        "import sys; from zeptograd import Tensor; print(Tensor([1.0, 2.0]).sum().item()); "
        "print(sorted(m for m in sys.modules if m.startswith(('zeptograd.nn', 'zeptograd.engine.jit', "
        "'zeptograd.engine.search', 'zeptograd.codegen.gpudims', 'zeptograd.renderer.cstyle', "
        "'zeptograd.renderer.gpu', 'zeptograd.runtime.ops_python', 'concurrent.futures', 'subprocess'))))"
    )
    assert _run(code, str(tmp_path)).split() == ["3.0", "[]"]


def test_lazy_package_attributes(tmp_path):
    code = "import zeptograd; print(zeptograd.nn.Linear.__name__, zeptograd.TinyJit.__name__)"
    assert _run(code, str(tmp_path)).split() == ["Linear", "TinyJit"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import zeptograd

        zeptograd.nope  # noqa: B018


def test_cached_kernels_run_without_llvmlite(tmp_path):
    code = (
        "import sys; from zeptograd import Tensor; "
        "print((Tensor([1.0, 4.0, 9.0]).sqrt() * 2).exp2().tolist(), 'llvmlite.binding' in sys.modules)"
    )
    assert _run(code, str(tmp_path)).split("]")[1].strip() == "True"  # the first run compiles
    out = _run(code, str(tmp_path))
    assert out.strip() == "[4.0, 16.0, 64.0] False"
    assert len(os.listdir(tmp_path / "zeptograd" / "hosts")) == 1


def test_host_memo_is_the_llvm_key(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    c = LLVMCompiler()
    fresh = f"llvm {c.llvm.llvm_version_info} {c.cpu} {c.features} O{c.opt}"
    assert c.key == fresh
    c2 = LLVMCompiler()
    assert c2.key == fresh and "llvm" not in c2.__dict__  # read from the memo: LLVM not asked


@pytest.mark.skipif(os.uname().machine != "x86_64" or not sys.platform.startswith("linux"), reason="x86-64 ELF")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
def test_loader_runs_kernels(dtype, monkeypatch):
    """Kernels with constant pools and libm calls (scalar exp2/log2/sin), all loaded by runtime/elf.py."""
    from zeptograd.engine import kernels, realize

    dev = LLVMDevice("CPU")
    monkeypatch.setitem(Device._opened, "CPU", dev)
    cache: dict = {}  # every kernel is built by this device
    monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
    monkeypatch.setattr(realize, "_kernel_cache", cache)
    x = np.array([0.5, 1.5, 2.25], dtype=dtype)
    t = Tensor(x, device="CPU")
    got = ((t * 3 + 1).cast("float32" if dtype != np.float64 else "float64").exp2().log2().sin()).numpy()
    want = np.sin(np.log2(np.exp2((x * 3 + 1).astype(np.float64))))
    np.testing.assert_allclose(got, want, rtol=2e-3 if dtype == np.float16 else 1e-5)
    one = Tensor([0.25], dtype="float64", device="CPU").exp2().item()  # a lone scalar: a call to libm's exp2
    assert one == pytest.approx(2**0.25)
    assert dev.objects and dev._engine is None  # no object needed MCJIT


def test_loaded_code_equals_mcjit_on_real_objects(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = (
        "define void @probe(ptr noalias %out, ptr noalias %in) {\nentry:\n"
        "  %x = load double, ptr %in\n  %e = call double @llvm.exp2.f64(double %x)\n"
        "  %s = fadd double %e, 0x400921FB54442D18\n  store double %s, ptr %out\n  ret void\n}\n"
        "declare double @llvm.exp2.f64(double)\n"
    )
    dev = LLVMDevice("CPU")
    obj = dev.compiler.compile(src)
    renamed = unique_symbol(src)
    addrs = [elf.LoadedObject(obj).symbols[renamed], dev.mcjit_load(obj, renamed)]
    import ctypes

    for addr in addrs:
        out, inp = np.zeros(1), np.array([3.0])
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(addr)(out.ctypes.data, inp.ctypes.data)
        assert out[0] == 8.0 + np.pi


def test_loader_refuses_what_it_does_not_handle():
    with pytest.raises(elf.UnsupportedObject, match="ELF64"):
        elf.LoadedObject(b"\xcf\xfa\xed\xfe" + bytes(60))  # Mach-O
    dev = LLVMDevice("CPU")
    src = (
        "define void @calls_missing(ptr noalias %a) {\nentry:\n  call void @zg_no_such_function(ptr %a)\n"
        "  ret void\n}\ndeclare void @zg_no_such_function(ptr)\n"
    )
    obj = dev.compiler.compile(src)
    with pytest.raises(elf.UnsupportedObject, match="zg_no_such_function"):
        elf.LoadedObject(obj)


def test_unsupported_object_falls_back_to_mcjit(monkeypatch):
    def refuse(obj):
        raise elf.UnsupportedObject("refused for the test")

    import zeptograd.runtime.ops_llvm as ops_llvm

    monkeypatch.setattr(ops_llvm, "LoadedObject", refuse)
    dev = LLVMDevice("CPU")
    monkeypatch.setitem(Device._opened, "CPU", dev)
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    np.testing.assert_allclose(
        (Tensor(x, device="CPU") * 2.5 + 0.125).exp2().numpy(), np.exp2(x * 2.5 + 0.125), rtol=1e-6
    )
    assert dev._engine is not None and not dev.objects


def test_missing_symbol_is_a_compile_error(monkeypatch):
    import zeptograd.runtime.ops_llvm as ops_llvm

    class NoSymbols:
        def __init__(self, obj):
            self.symbols: dict[str, int] = {}

    monkeypatch.setattr(ops_llvm, "LoadedObject", NoSymbols)
    dev = LLVMDevice("CPU")
    spec = dev.renderer.render("E_1", [])  # type: ignore[attr-defined]
    with pytest.raises(CompileError, match="not found in its compiled object"):
        dev.build(spec)


def test_bench_startup_cases_run():
    sys.path.insert(0, ROOT)
    from bench.cases_startup import STARTUP_CASES

    for name in ("startup", "startup_cold"):
        spec = STARTUP_CASES[name](True)
        assert spec.kind == "latency" and "bare `python -c pass`" in spec.note
        spec.runners["zeptograd"]()  # one whole process; raises if it fails
