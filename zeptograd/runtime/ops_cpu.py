"""The CPU device. CPU:C: C source from the C renderer, compiled by the system C compiler, loaded with ctypes.

CPU (the default) and CPU:LLVM open the LLVM backend instead: `runtime/ops_llvm.py`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
from typing import Any, Callable

from zeptograd.device import CompiledDevice, CompileError, Compiler, HostAllocator, Program, run_on_cores, small_work
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec, cpu_simd_bytes, simd_bytes_for
from zeptograd.runtime import call_table, diskcache

CFLAGS = ["-O2", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=fast"]


class NoCompilerError(RuntimeError):
    pass


_MACRO_FEATURES = {"__AVX512F__": "avx512f", "__AVX2__": "avx2", "__AVX__": "avx"}


def widest_vector(macros: str) -> str:
    """the vector bytes a compiler's predefined macros (`cc -dM -E`) promise registers for: the rule the LLVM backend
    applies to LLVM's host features (`simd_bytes_for`), so both CPU backends render vectors of one width"""
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ") and len(line.split()) > 1}
    return str(simd_bytes_for({feature for macro, feature in _MACRO_FEATURES.items() if macro in defined}))


class CCompiler(Compiler):
    """cc (or $CC) into a shared library, cached on disk by the hash of compiler, flags and source."""

    cache_subdir, suffix = "cpu", ".so"

    def __init__(self):
        self.cc = os.getenv("CC", "cc")

    @functools.cached_property
    def _identity(self) -> tuple[str, str]:
        """(the compiler's path, what identifies it and the host: its file's path, size, time and inode, the CPU)"""
        import shutil

        found = shutil.which(self.cc)
        if found is None:
            raise NoCompilerError(
                f"no C compiler found ({self.cc!r} is not on PATH): install one "
                f"(e.g. `apt-get install gcc`) or set CC to its path"
            )
        real = os.path.realpath(found)
        st = os.stat(real)
        return found, f"{real} {st.st_size} {st.st_mtime_ns} {st.st_ino}\n{diskcache.host_cpu() or os.uname().machine}"

    def _ask_once(self, what: str, argv: list[str], answer) -> str:
        """`answer(stdout of cc argv)` (one line), asked once per compiler binary and host and remembered in
        `<cache>/zeptograd/hosts/`, so that a process whose kernels are cached runs no compiler"""
        found, identity = self._identity
        memo = f"{what}-{hashlib.sha256(identity.encode()).hexdigest()[:32]}.txt"
        line = diskcache.read_text("hosts", memo)
        if line is None or not (line.startswith(f"{what} ") and line.endswith("\n")):  # missing or torn
            import subprocess

            proc = subprocess.run([found, *argv], capture_output=True, text=True)
            line = f"{what} {answer(proc.stdout)}\n"
            diskcache.write_text("hosts", memo, line)
        return line[len(what) + 1 : -1]

    @functools.cached_property
    def key(self) -> str:
        """What the on-disk cache is keyed by besides the source: the compiler (its path and version), the flags,
        and the host CPU (-march=native)."""
        version = self._ask_once("cc", ["--version"], lambda out: out.splitlines()[0] if out else "")
        return f"cc {version} {self._identity[1]} {' '.join(CFLAGS)}"

    @functools.cached_property
    def vector_bytes(self) -> int:
        """The widest vector -march=native gives the compiler registers for: 64 bytes with AVX-512, 32 with AVX, else
        16. The C renderer's vectors are this wide: gcc lowers a compare of wider vectors lane by lane and keeps them
        in memory (a 16-lane max reduce on an AVX2 host ran 7x slower than LLVM's; 8 lanes: on par)."""
        width = self._ask_once("ccvec", [*CFLAGS[:2], "-dM", "-E", "-x", "c", os.devnull], widest_vector)
        return int(width) if width in ("16", "32", "64") else 16

    def check(self, data: bytes):
        from zeptograd.runtime.elf import check_library

        check_library(data)

    def build_file(self, src: str, out_path: str):
        import subprocess  # imported at the first compile: the default LLVM backend never needs it

        cmd = [self.cc, *CFLAGS, "-x", "c", "-", "-o", out_path, "-lm"]
        proc = subprocess.run(cmd, input=src.encode(), capture_output=True)
        if proc.returncode != 0:
            raise CompileError(f"internal error: the generated C did not compile:\n{proc.stderr.decode()}\n{src}")


class CPUProgram(Program):
    def __init__(
        self,
        spec: ProgramSpec,
        path: str,
        runner: Callable[[], Callable[[Any], None] | None] | None = None,
        waiter: Callable[[], Callable[[int, int], None] | None] | None = None,
    ):
        super().__init__(spec)
        self.waiter = waiter  # the device's spin wait (CorePool.run's `wait`), built at the first threaded call
        self.lib = ctypes.CDLL(path)
        self.addr = ctypes.cast(self.lib[spec.name], ctypes.c_void_p).value or 0
        # the prototype bound once (buffers, Variables, core id): a call converts plain ints without Python wrappers
        argtypes = [ctypes.c_void_p] * spec.n_bufs + [ctypes.c_int] * (len(spec.vars) + (spec.cores > 1))
        self.fxn = ctypes.CFUNCTYPE(None, *argtypes)(self.addr)
        self.small = small_work(spec)
        self.runner = runner  # the device's call_table runner, built at the first ask

    def direct_call(self):
        return None if self.spec.cores != 1 or self.spec.vars else (self.fxn, None)

    def native(self):
        if self.spec.cores != 1 or self.spec.vars or self.spec.n_bufs > call_table.MAX_ARGS or self.runner is None:
            return None
        runner = self.runner()
        return None if runner is None else (self.addr, runner)

    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        if self.spec.cores == 1:
            self.fxn(*ptrs, *vals)
        else:  # one call per core; ctypes releases the GIL during each
            run_on_cores(
                lambda core: self.fxn(*ptrs, *vals, core),
                self.spec.cores,
                self.small is not None and self.small(vals),
                None if self.waiter is None else self.waiter(),
            )


class CPUDevice(CompiledDevice):
    compiler: CCompiler
    shares_programs = True  # host code on host memory: CPU:1 runs what CPU compiled
    _runner: list[Callable[[Any], None] | None] | None = None  # [runner] once asked (call_runner)
    _runner_lib: Any = None  # keeps the runner's library loaded
    _spin: list[Callable[[int, int], None] | None] | None = None  # [spin wait] once asked (spin_waiter)
    _spin_lib: Any = None  # keeps the spin wait's library loaded

    def build(self, spec: ProgramSpec) -> CPUProgram:
        """The library from the cache (its owner, mode and hash checked); one the loader rejects is compiled again."""
        try:
            return CPUProgram(spec, self.compiler.compile_to_file(spec.src), self.call_runner, self.spin_waiter)
        except OSError as e:  # dlopen refused it (e.g. not an ELF library): never trusted again
            diskcache.warn_once(spec.name, f"the cached library of {spec.name} did not load ({e}): compiling it again")
            self.compiler.evict(spec.src)
            return CPUProgram(spec, self.compiler.compile_to_file(spec.src), self.call_runner, self.spin_waiter)

    def _c_function(self, src: str, name: str) -> tuple[ctypes.CDLL, int]:
        """src compiled (or from the disk cache) and loaded: the library (the caller keeps it) and name's address."""
        lib = ctypes.CDLL(self.compiler.compile_to_file(src))
        return lib, ctypes.cast(lib[name], ctypes.c_void_p).value or 0

    def call_runner(self) -> Callable[[Any], None] | None:
        """runtime/call_table.py's runner, compiled from C (once per host: the disk cache keeps it) and loaded at
        the first ask; None where it cannot be (the replay then calls each kernel itself)."""
        if self._runner is None:
            self._runner = [None]
            if call_table.usable:
                try:
                    self._runner_lib, addr = self._c_function(call_table.c_source(), call_table.RUNNER)
                    self._runner = [call_table.runner_at(addr)]
                except (CompileError, OSError) as e:
                    diskcache.warn_once("call_table", f"the kernel call table's runner did not build ({e})")
        return self._runner[0]

    def spin_waiter(self) -> Callable[[int, int], None] | None:
        """runtime/call_table.py's spin wait, compiled from C (once per host: the disk cache keeps it) and loaded at
        the first ask; None where it cannot be (the caller of a threaded kernel then sleeps on its workers' locks)."""
        if self._spin is None:
            self._spin = [None]
            try:
                self._spin_lib, addr = self._c_function(call_table.spin_c_source(), call_table.SPIN_WAIT)
                self._spin = [call_table.spin_wait_at(addr)]
            except (CompileError, OSError) as e:
                diskcache.warn_once("spin_wait", f"the threaded kernels' spin wait did not build ({e})")
        return self._spin[0]


def open_device(name: str) -> CompiledDevice:
    """CPU and CPU:LLVM: LLVM IR compiled in-process (CPU_LLVM=0 makes plain CPU the C backend); CPU:C: C and cc.
    CPU:1, CPU:1:C, ...: more devices of the same kinds (their own memory and queue)."""
    kind, *fields = name.split(":")
    if fields and fields[0].isdigit():
        fields.pop(0)
    choice = fields[0] if fields else ""  # the compiler the name asks for
    if kind != "CPU" or len(fields) > 1 or choice not in ("", "C", "LLVM"):
        raise ArgumentError(f"unknown CPU backend {name!r}; available: CPU (LLVM), CPU:LLVM, CPU:C, CPU:N[:C|:LLVM]")
    if choice == "LLVM" or (choice == "" and os.getenv("CPU_LLVM", "1") != "0"):
        from zeptograd.runtime.ops_llvm import LLVMDevice  # imports llvmlite only now

        return LLVMDevice(name)
    from zeptograd.renderer.cstyle import CStyleRenderer  # imported only for CPU:C (startup time)

    compiler, renderer = CCompiler(), CStyleRenderer()
    renderer.simd_bytes = cpu_simd_bytes(compiler.vector_bytes)  # the host's vector registers (or SIMD_BYTES)
    return CPUDevice(name, renderer, compiler, HostAllocator())
