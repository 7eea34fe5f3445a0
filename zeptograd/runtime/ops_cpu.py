"""The CPU device. CPU:C: C source from the C renderer, compiled by the system C compiler, loaded with ctypes.

CPU (the default) and CPU:LLVM open the LLVM backend instead: `runtime/ops_llvm.py`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os

from zeptograd.device import CompiledDevice, CompileError, Compiler, HostAllocator, Program, run_on_cores, small_work
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec
from zeptograd.runtime import diskcache

CFLAGS = ["-O2", "-march=native", "-shared", "-fPIC", "-fno-math-errno", "-ffp-contract=fast"]


class NoCompilerError(RuntimeError):
    pass


class CCompiler(Compiler):
    """cc (or $CC) into a shared library, cached on disk by the hash of compiler, flags and source."""

    cache_subdir, suffix = "cpu", ".so"

    def __init__(self):
        self.cc = os.getenv("CC", "cc")

    @functools.cached_property
    def key(self) -> str:
        """What the on-disk cache is keyed by besides the source: the compiler (its path and version), the flags,
        and the host CPU (-march=native). The version is asked once per compiler binary and host, and remembered in
        `<cache>/zeptograd/hosts/`, so that a process whose kernels are cached runs no compiler."""
        import shutil

        found = shutil.which(self.cc)
        if found is None:
            raise NoCompilerError(
                f"no C compiler found ({self.cc!r} is not on PATH): install one "
                f"(e.g. `apt-get install gcc`) or set CC to its path"
            )
        real = os.path.realpath(found)
        st = os.stat(real)
        identity = f"{real} {st.st_size} {st.st_mtime_ns} {st.st_ino}\n{diskcache.host_cpu() or os.uname().machine}"
        memo = f"cc-{hashlib.sha256(identity.encode()).hexdigest()[:32]}.txt"
        version = diskcache.read_text("hosts", memo)
        if version is None or not (version.startswith("cc ") and version.endswith("\n")):  # missing or torn
            import subprocess

            proc = subprocess.run([found, "--version"], capture_output=True, text=True)
            version = f"cc {proc.stdout.splitlines()[0] if proc.stdout else ''}\n"
            diskcache.write_text("hosts", memo, version)
        return f"{version.strip()} {identity} {' '.join(CFLAGS)}"

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
    def __init__(self, spec: ProgramSpec, path: str):
        super().__init__(spec)
        self.lib = ctypes.CDLL(path)
        self.fxn = self.lib[spec.name]
        self.fxn.restype = None
        self.small = small_work(spec)

    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        args = [ctypes.c_void_p(p) for p in ptrs] + [ctypes.c_int(v) for v in vals]
        if self.spec.cores == 1:
            self.fxn(*args)
        else:  # one call per core; ctypes releases the GIL during each
            run_on_cores(
                lambda core: self.fxn(*args, ctypes.c_int(core)),
                self.spec.cores,
                self.small is not None and self.small(vals),
            )


class CPUDevice(CompiledDevice):
    compiler: CCompiler

    def build(self, spec: ProgramSpec) -> CPUProgram:
        """The library from the cache (its owner, mode and hash checked); one the loader rejects is compiled again."""
        try:
            return CPUProgram(spec, self.compiler.compile_to_file(spec.src))
        except OSError as e:  # dlopen refused it (e.g. not an ELF library): never trusted again
            diskcache.warn_once(spec.name, f"the cached library of {spec.name} did not load ({e}): compiling it again")
            self.compiler.evict(spec.src)
            return CPUProgram(spec, self.compiler.compile_to_file(spec.src))


def open_device(name: str) -> CompiledDevice:
    """CPU and CPU:LLVM: LLVM IR compiled in-process (CPU_LLVM=0 makes plain CPU the C backend); CPU:C: C and cc."""
    if name not in ("CPU", "CPU:C", "CPU:LLVM"):
        raise ArgumentError(f"unknown CPU backend {name!r}; available: CPU (LLVM), CPU:LLVM, CPU:C")
    if name == "CPU:LLVM" or (name == "CPU" and os.getenv("CPU_LLVM", "1") != "0"):
        from zeptograd.runtime.ops_llvm import LLVMDevice  # imports llvmlite only now

        return LLVMDevice(name)
    from zeptograd.renderer.cstyle import CStyleRenderer  # imported only for CPU:C (startup time)

    return CPUDevice(name, CStyleRenderer(), CCompiler(), HostAllocator())
