"""The CPU device's LLVM backend: LLVM IR from the LLVM renderer, optimized and compiled in-process by llvmlite.

The IR is optimized with LLVM's new pass manager (O2, for the host CPU and its features) and compiled to an object
file, cached on disk by the hash of (LLVM version, CPU, features, pipeline, source). Each object is loaded into
executable memory by `runtime/elf.py` (no LLVM needed) and called through a ctypes function pointer (ctypes
releases the GIL); an object that loader does not handle is linked into the device's MCJIT engine instead.

llvmlite is imported only when a kernel is compiled (a miss in the on-disk cache) or linked by MCJIT: the cache key
needs LLVM's name for the host CPU and its features, which are asked once per host and remembered in
`<cache>/zeptograd/hosts/` (keyed by /proc/cpuinfo's identity lines and llvmlite's version). So a process whose
kernels are all cached never imports llvmlite (~25 ms of startup).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
from typing import Any, Callable

from zeptograd.device import CompiledDevice, CompileError, Compiler, HostAllocator, Program, run_on_cores, small_work
from zeptograd.helpers import DEBUG, getenv
from zeptograd.renderer import ProgramSpec, cpu_simd_bytes, simd_bytes_for
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.runtime import call_table, diskcache
from zeptograd.runtime.elf import LoadedObject, MalformedObject, UnsupportedObject

OPT_LEVEL = 2  # the speed level of the optimization pipeline (O2); LLVM_OPT=3 for O3


class LLVMCompiler(Compiler):
    """LLVM IR text -> an object file for the host CPU (optimized), cached on disk."""

    cache_subdir, suffix = "llvm", ".o"

    def __init__(self):
        self.opt = getenv("LLVM_OPT", OPT_LEVEL)

    @functools.cached_property
    def llvm(self) -> Any:
        """llvmlite.binding with the native target initialized: imported at the first use (~25 ms)."""
        import llvmlite.binding as llvm

        llvm.initialize_native_target()  # not llvm.initialize(): it raises in llvmlite >= 0.45
        llvm.initialize_native_asmprinter()
        return llvm

    @functools.cached_property
    def cpu(self) -> str:
        return self.llvm.get_host_cpu_name()

    @functools.cached_property
    def features(self) -> str:
        return self.llvm.get_host_cpu_features().flatten()

    @functools.cached_property
    def tm(self) -> Any:
        """The target machine compiles use (made at the first compile)."""
        return self.target_machine()

    @functools.cached_property
    def key(self) -> str:
        """What the on-disk cache is keyed by besides the source: LLVM's version, the host CPU and features, level.

        Remembered per host, so that a process whose kernels are cached needs no LLVM to find them."""
        memo = _host_memo_name(self.opt)
        if memo is not None:
            key = diskcache.read_text("hosts", memo)
            if key is not None and key.startswith("llvm ") and key.endswith(f" O{self.opt}"):  # not torn
                return key
        key = f"llvm {self.llvm.llvm_version_info} {self.cpu} {self.features} O{self.opt}"
        if memo is not None:
            diskcache.write_text("hosts", memo, key)
        return key

    @functools.cached_property
    def vector_bytes(self) -> int:
        """The widest vector the host's features give registers for (`simd_bytes_for`: 64 bytes with AVX-512, 32 with
        AVX, else 16), read from the host's key (its features, remembered per host: no llvmlite needed)."""
        return simd_bytes_for({f[1:] for word in self.key.split() for f in word.split(",") if f.startswith("+")})

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

    def build(self, src: str) -> bytes:
        """The object of src, its function renamed to `unique_symbol(src)` (one JIT engine holds every kernel)."""
        name = _DEFINE.search(src)
        renamed = src.replace(f"@{name.group(1)}(", f"@{unique_symbol(src)}(", 1) if name else src
        return self.tm.emit_object(self.optimize(renamed))


_DEFINE = re.compile(r"^define void @([A-Za-z0-9_.$]+)\(", re.MULTILINE)


def unique_symbol(src: str) -> str:
    """The kernel's name and a hash of its source: kernels with equal names but other code share one engine."""
    name = _DEFINE.search(src)
    return f"{name.group(1) if name else 'kernel'}_{hashlib.sha256(src.encode()).hexdigest()[:16]}"


def _host_memo_name(opt: int) -> str | None:
    """The memo of this host's LLVM key: named by its CPU (/proc/cpuinfo) and llvmlite's version (which fixes
    LLVM's); None where there is no /proc/cpuinfo."""
    cpu = diskcache.host_cpu()
    if cpu is None:
        return None
    import llvmlite  # the package's version only: cheap, unlike llvmlite.binding

    digest = hashlib.sha256(f"{cpu}\n{llvmlite.__version__}\nO{opt}".encode()).hexdigest()[:32]
    return f"llvm-{digest}.txt"


class LLVMProgram(Program):
    """A compiled kernel: fn(*buffer pointers, *vars[, core_id]), called once per core when it has a core_id."""

    def __init__(
        self,
        spec: ProgramSpec,
        addr: int,
        runner: Callable[[], Callable[[Any], None] | None] | None = None,
        waiter: Callable[[], Callable[[int, int], None] | None] | None = None,
    ):
        super().__init__(spec)
        self.addr, self.has_core_id = addr, spec.cores > 1
        self.waiter = waiter  # the device's spin wait (CorePool.run's `wait`), built at the first threaded call
        argtypes = [ctypes.c_void_p] * spec.n_bufs + [ctypes.c_int] * (len(spec.vars) + self.has_core_id)
        self.fxn = ctypes.CFUNCTYPE(None, *argtypes)(addr)
        self.small = small_work(spec)
        self.runner = runner  # the device's call_table runner, built at the first ask

    def direct_call(self):
        return None if self.has_core_id or self.spec.vars else (self.fxn, None)

    def native(self):
        if self.has_core_id or self.spec.vars or self.spec.n_bufs > call_table.MAX_ARGS or self.runner is None:
            return None
        runner = self.runner()
        return None if runner is None else (self.addr, runner)

    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        if not self.has_core_id:
            self.fxn(*ptrs, *vals)
            return
        run_on_cores(
            lambda core: self.fxn(*ptrs, *vals, core),
            self.spec.cores,
            self.small is not None and self.small(vals),
            None if self.waiter is None else self.waiter(),
        )


class LLVMDevice(CompiledDevice):
    """Kernels loaded by `runtime/elf.py`, each in its own executable mapping; MCJIT (one engine per device, made
    when first needed) links the objects that loader does not handle."""

    compiler: LLVMCompiler
    shares_programs = True  # host code on host memory: CPU:1 runs what CPU compiled

    def __init__(self, name: str):
        compiler = LLVMCompiler()  # the renderer's vectors are as wide as this host's registers (or SIMD_BYTES)
        renderer = LLVMRenderer(simd_bytes=cpu_simd_bytes(compiler.vector_bytes))
        super().__init__(name, renderer, compiler, HostAllocator())
        self.loaded: dict[str, int] = {}  # symbol -> address
        self.objects: list[LoadedObject] = []  # keeps the loaded code mapped
        self._engine: Any = None
        self._runner: list[Callable[[Any], None] | None] | None = None  # [runner] once asked (call_runner)
        self._spin: list[Callable[[int, int], None] | None] | None = None  # [spin wait] once asked (spin_waiter)

    def build(self, spec: ProgramSpec) -> LLVMProgram:
        return LLVMProgram(spec, self.address_of(spec.src), self.call_runner, self.spin_waiter)

    def address_of(self, src: str) -> int:
        """The address of src's one function, loaded once per device (by the symbol unique to its source)."""
        symbol = unique_symbol(src)
        if symbol not in self.loaded:
            self.loaded[symbol] = self.load(src, symbol)
        return self.loaded[symbol]

    def spin_waiter(self) -> Callable[[int, int], None] | None:
        """runtime/call_table.py's spin wait, compiled from LLVM IR and loaded at the first ask; None where it cannot
        be (the caller of a threaded kernel then sleeps on its workers' locks)."""
        if self._spin is None:
            self._spin = [None]
            try:
                self._spin = [call_table.spin_wait_at(self.address_of(call_table.spin_llvm_source()))]
            except CompileError as e:
                diskcache.warn_once("spin_wait", f"the threaded kernels' spin wait did not compile ({e})")
        return self._spin[0]

    def call_runner(self) -> Callable[[Any], None] | None:
        """runtime/call_table.py's runner, compiled from LLVM IR (once per host: the disk cache keeps it) and loaded
        at the first ask; None where it cannot be (the replay then calls each kernel itself)."""
        if self._runner is None:
            self._runner = [None]
            if call_table.usable:
                try:
                    self._runner = [call_table.runner_at(self.address_of(call_table.llvm_source()))]
                except CompileError as e:
                    diskcache.warn_once("call_table", f"the kernel call table's runner did not compile ({e})")
        return self._runner[0]

    def load(self, src: str, symbol: str) -> int:
        """Load src's object (compiled or from the cache) and return its function's address. An object the ELF loader
        finds malformed is never handed to MCJIT: its cache entry is removed and the kernel compiled again."""
        for attempt in range(2):
            obj = self.compiler.compile(src)
            try:
                loaded = LoadedObject(obj)
            except MalformedObject as e:
                if attempt:
                    raise CompileError(f"internal error: LLVM's object for {symbol} is malformed: {e}") from e
                entry = self.compiler.entry_name(src)
                diskcache.warn_once(entry, f"the cached object {entry} is malformed ({e}): compiling it again")
                self.compiler.evict(src)
                continue
            except UnsupportedObject:
                addr = self.mcjit_load(obj, symbol)
            else:
                self.objects.append(loaded)
                addr = loaded.symbols.get(symbol, 0)
            if not addr:
                raise CompileError(f"internal error: {symbol} not found in its compiled object")
            return addr
        raise AssertionError("unreachable")

    def mcjit_load(self, obj: bytes, symbol: str) -> int:
        """Link an object into this device's MCJIT engine; its function's address."""
        compiler = self.compiler
        llvm = compiler.llvm
        if self._engine is None:  # the engine owns its target machine: not the one compiles use
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), compiler.target_machine())
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()
        return self._engine.get_function_address(symbol)


def open_device(name: str) -> LLVMDevice:
    return LLVMDevice(name)
