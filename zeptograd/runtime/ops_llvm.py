"""The CPU device's LLVM backend: LLVM IR from the LLVM renderer, optimized and compiled in-process by llvmlite.

The IR is optimized with LLVM's new pass manager (O2, for the host CPU and its features) and compiled to an object
file, cached on disk by the hash of (LLVM version, CPU, features, pipeline, source). Objects are linked into one
MCJIT engine per device; each kernel is called through a ctypes function pointer (ctypes releases the GIL).
llvmlite is imported only when this device opens.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
from typing import Any

from zeptograd.device import Allocator, CompiledDevice, CompileError, Compiler, run_on_cores
from zeptograd.helpers import DEBUG, getenv
from zeptograd.renderer import ProgramSpec
from zeptograd.renderer.llvmir import LLVMRenderer

OPT_LEVEL = 2  # the speed level of the optimization pipeline (O2); LLVM_OPT=3 for O3


class LLVMCompiler(Compiler):
    """LLVM IR text -> an object file for the host CPU (optimized), cached on disk."""

    cache_subdir, suffix = "llvm", ".o"

    def __init__(self):
        import llvmlite.binding as llvm  # lazily: importing llvmlite costs ~70 ms

        llvm.initialize_native_target()  # not llvm.initialize(): it raises in llvmlite >= 0.45
        llvm.initialize_native_asmprinter()
        self.llvm = llvm
        self.cpu, self.features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        self.opt = getenv("LLVM_OPT", OPT_LEVEL)
        self.tm = self.target_machine()
        self.key = f"llvm {llvm.llvm_version_info} {self.cpu} {self.features} O{self.opt}"

    def target_machine(self) -> Any:
        target = self.llvm.Target.from_default_triple()
        return target.create_target_machine(cpu=self.cpu, features=self.features, opt=self.opt, jit=True)

    def optimize(self, src: str) -> Any:
        """Parse and optimize: the module, ready to be emitted."""
        llvm = self.llvm
        try:
            mod = llvm.parse_assembly(src)
            mod.verify()
        except RuntimeError as e:
            raise CompileError(f"internal error: the generated LLVM IR is invalid: {e}\n{src}") from e
        mod.triple, mod.data_layout = self.tm.triple, str(self.tm.target_data)
        pto = llvm.create_pipeline_tuning_options(speed_level=self.opt)
        pb = llvm.create_pass_builder(self.tm, pto)
        pb.getModulePassManager().run(mod, pb)
        if DEBUG >= 7:
            print(str(mod))
        return mod

    def build_file(self, src: str, out_path: str):
        """The object of src, its function renamed to `unique_symbol(src)` (one JIT engine holds every kernel)."""
        name = _DEFINE.search(src)
        renamed = src.replace(f"@{name.group(1)}(", f"@{unique_symbol(src)}(", 1) if name else src
        with open(out_path, "wb") as f:
            f.write(self.tm.emit_object(self.optimize(renamed)))


_DEFINE = re.compile(r"^define void @([A-Za-z0-9_.$]+)\(", re.MULTILINE)


def unique_symbol(src: str) -> str:
    """The kernel's name and a hash of its source: kernels with equal names but other code share one engine."""
    name = _DEFINE.search(src)
    return f"{name.group(1) if name else 'kernel'}_{hashlib.sha256(src.encode()).hexdigest()[:16]}"


class LLVMProgram:
    """A compiled kernel: fn(*buffer pointers, *vars[, core_id]), called once per core when it has a core_id."""

    def __init__(self, spec: ProgramSpec, addr: int, has_core_id: bool):
        self.spec, self.addr, self.has_core_id = spec, addr, has_core_id
        argtypes = [ctypes.c_void_p] * spec.n_bufs + [ctypes.c_int] * (len(spec.vars) + has_core_id)
        self.fxn = ctypes.CFUNCTYPE(None, *argtypes)(addr)

    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        if not self.has_core_id:
            self.fxn(*ptrs, *vals)
            return
        run_on_cores(lambda core: self.fxn(*ptrs, *vals, core), self.spec.global_size[0])


class LLVMDevice(CompiledDevice):
    """One MCJIT engine per device: each kernel's object is added to it under a unique symbol."""

    def __init__(self, name: str):
        compiler = LLVMCompiler()
        super().__init__(name, LLVMRenderer(), compiler, LLVMProgram, Allocator())
        llvm = compiler.llvm
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), compiler.target_machine())
        self.loaded: dict[str, int] = {}  # symbol -> address

    def build(self, spec: ProgramSpec) -> LLVMProgram:
        symbol = unique_symbol(spec.src)
        if symbol not in self.loaded:
            obj = self.compiler.compile(spec.src)
            self.engine.add_object_file(self.compiler.llvm.ObjectFileRef.from_data(obj))  # type: ignore[attr-defined]
            self.engine.finalize_object()
            self.loaded[symbol] = self.engine.get_function_address(symbol)
            if not self.loaded[symbol]:
                raise CompileError(f"internal error: {symbol} not found in its compiled object")
        signature = next((line for line in spec.src.splitlines() if line.startswith("define ")), "")
        return LLVMProgram(spec, self.loaded[symbol], "i32 %core_id)" in signature)


def open_device(name: str) -> LLVMDevice:
    return LLVMDevice(name)
