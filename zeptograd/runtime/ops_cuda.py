"""The CUDA device (CUDA, CUDA:1, ...): CUDA C from renderer/gpu.py, compiled by NVRTC, run by the driver API.

Both libraries are loaded with ctypes: libnvrtc (from the CUDA toolkit, or `pip install nvidia-cuda-nvrtc`, whose
wheel holds it under nvidia/cu13/lib/) and libcuda.so.1 (the NVIDIA driver). NVRTC compiles without a GPU
(`nvrtc_compile`), so the generated source can be checked anywhere; opening the device needs the driver and a
GPU, and says so in one sentence when either is missing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import os

import numpy as np

from zeptograd.device import Allocator, CompiledDevice, CompileError, Compiler, Program
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec
from zeptograd.renderer.gpu import CUDARenderer
from zeptograd.runtime.ops_cl import DeviceUnavailable

# ***** NVRTC *****


def _nvrtc_candidates() -> list[str]:
    found = [os.environ["ZG_NVRTC"]] if os.getenv("ZG_NVRTC") else []
    try:
        import nvidia  # the namespace package of NVIDIA's pip wheels

        for root in nvidia.__path__:
            found += sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")), reverse=True)
    except ImportError:
        pass
    if lib := ctypes.util.find_library("nvrtc"):
        found.append(lib)
    found += [os.path.join(d, "lib64", "libnvrtc.so") for d in ("/usr/local/cuda", os.getenv("CUDA_PATH", ""))]
    return [f for f in found if "builtins" not in os.path.basename(f)]


def _preload_builtins(libnvrtc: str) -> None:
    """NVRTC dlopens libnvrtc-builtins by its soname at the first compile, through the loader's search path, which
    does not include the folder of a pip wheel's libnvrtc: that compile then fails ("failed to open
    libnvrtc-builtins.so.13.0"). Loading the builtins beside libnvrtc first, globally, makes NVRTC's dlopen find
    the copy already in the process, from any pip layout."""
    folder = os.path.dirname(libnvrtc)
    for builtins in sorted(glob.glob(os.path.join(folder, "libnvrtc-builtins.so*"))) if folder else []:
        try:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue


@functools.cache
def nvrtc() -> ctypes.CDLL:
    for path in _nvrtc_candidates():
        try:
            _preload_builtins(path)
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    raise DeviceUnavailable(
        "CUDA needs NVRTC (libnvrtc), which was not found: `pip install nvidia-cuda-nvrtc` "
        "(or install the CUDA toolkit, or set ZG_NVRTC to the library's path)"
    )


def nvrtc_compile(src: str, arch: str = "sm_90", name: str = "kernel.cu") -> bytes:
    """CUDA C -> a cubin for arch `sm_XX`, or PTX (text, NUL-terminated) for `compute_XX`. No GPU needed."""
    lib = nvrtc()
    prog = ctypes.c_void_p()

    def check(status: int, what: str):
        if status != 0:
            log = b""
            size = ctypes.c_size_t()
            if lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) == 0 and size.value > 1:
                buf = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, buf)
                log = buf.value
            raise CompileError(
                f"internal error: NVRTC {what} failed ({lib.nvrtcGetErrorString(status).decode()}):\n"
                f"{log.decode(errors='replace')}\n{src}"
            )

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None), "create")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"-default-device"]
        check(lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts)), "compile")
        kind = "CUBIN" if arch.startswith("sm_") else "PTX"
        size = ctypes.c_size_t()
        check(getattr(lib, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"get {kind} size")
        out = ctypes.create_string_buffer(size.value)
        check(getattr(lib, f"nvrtcGet{kind}")(prog, out), f"get {kind}")
        return out.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


class NVRTCCompiler(Compiler):
    disk_cached = False  # NVRTC compiles in the process; its binaries are not cached on disk

    def __init__(self, arch: str):
        self.arch = arch

    @property
    def key(self) -> str:
        return f"nvrtc {self.arch}"

    def compile(self, src: str) -> bytes:
        return nvrtc_compile(src, self.arch)


# ***** the driver API *****


def _driver() -> ctypes.CDLL:
    for name in ("libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")):
        if name is None:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise DeviceUnavailable(
        "CUDA needs the NVIDIA driver (libcuda.so.1), which is not installed here: use a "
        "machine with an NVIDIA GPU and its driver"
    )


class CUDAError(RuntimeError):
    pass


class _Driver:
    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib

    def __call__(self, fn: str, *args):
        status = getattr(self.lib, fn)(*args)
        if status != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorName(status, ctypes.byref(msg))
            raise CUDAError(f"{fn} failed: {(msg.value or b'error %d' % status).decode()}")


class CUDAMem:
    __slots__ = ("ptr", "nbytes")

    def __init__(self, ptr: int, nbytes: int):
        self.ptr, self.nbytes = ptr, nbytes


class CUDAAllocator(Allocator[CUDAMem]):
    host = False

    def __init__(self, dev: CUDADevice):
        super().__init__()
        self.dev = dev

    def alloc(self, nbytes: int) -> CUDAMem:
        if cached := self.free_cache.get(nbytes):
            return cached.pop()
        self.dev.set_current()
        ptr = ctypes.c_uint64()
        self.dev.cu("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1)))
        return CUDAMem(ptr.value, nbytes)

    def free(self, mem: CUDAMem) -> None:
        self.free_cache.setdefault(mem.nbytes, []).append(mem)

    def capacity(self) -> int:
        """The GPU's memory (cuDeviceTotalMem), not the host's."""
        total = ctypes.c_size_t()
        self.dev.cu("cuDeviceTotalMem_v2", ctypes.byref(total), self.dev.cu_dev)
        return total.value

    def handle(self, mem: CUDAMem) -> int:
        return mem.ptr

    def from_handle(self, handle: int, nbytes: int) -> CUDAMem:
        return CUDAMem(handle, nbytes)

    def copyin(self, mem: CUDAMem, src: np.ndarray) -> None:
        if src.nbytes:
            self.dev.set_current()
            self.dev.cu(
                "cuMemcpyHtoD_v2",
                ctypes.c_uint64(mem.ptr),
                ctypes.c_void_p(src.ctypes.data),
                ctypes.c_size_t(src.nbytes),
            )

    def copyout(self, mem: CUDAMem) -> np.ndarray:
        out = np.empty(mem.nbytes, dtype=np.uint8)
        if out.nbytes:
            self.dev.set_current()
            self.dev.cu(
                "cuMemcpyDtoH_v2",
                ctypes.c_void_p(out.ctypes.data),
                ctypes.c_uint64(mem.ptr),
                ctypes.c_size_t(out.nbytes),
            )
        return out


class CUDAProgram(Program):
    def __init__(self, dev: CUDADevice, spec: ProgramSpec, image: bytes):
        super().__init__(spec)
        self.dev = dev
        dev.set_current()
        self.module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        dev.cu("cuModuleLoadData", ctypes.byref(self.module), ctypes.c_char_p(image))
        dev.cu("cuModuleGetFunction", ctypes.byref(self.fn), self.module, spec.name.encode())

    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        if 0 in self.spec.global_size:
            return
        args = [ctypes.c_uint64(p) for p in ptrs] + [ctypes.c_int32(v) for v in vals]
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self.dev.set_current()
        self.dev.cu(
            "cuLaunchKernel",
            self.fn,
            *[ctypes.c_uint(g) for g in self.spec.global_size],
            *[ctypes.c_uint(x) for x in self.spec.local_size],
            ctypes.c_uint(0),
            None,
            params,
            None,
        )
        self.dev.cu("cuCtxSynchronize")


_ATTR = {
    "max_threads": 1,
    "block_x": 2,
    "block_y": 3,
    "block_z": 4,
    "grid_x": 5,
    "grid_y": 6,
    "grid_z": 7,
    "cc_major": 75,
    "cc_minor": 76,
}


class CUDADevice(CompiledDevice):
    def __init__(self, name: str, ordinal: int):
        self.cu = _Driver(_driver())
        try:
            self.cu("cuInit", 0)
        except CUDAError as e:
            raise DeviceUnavailable(f"no usable CUDA GPU here ({e})") from None
        count = ctypes.c_int()
        self.cu("cuDeviceGetCount", ctypes.byref(count))
        if ordinal >= count.value:
            raise DeviceUnavailable(f"{name}: there are {count.value} CUDA GPUs")
        self.cu_dev = ctypes.c_int()
        self.cu("cuDeviceGet", ctypes.byref(self.cu_dev), ordinal)
        attr = {}
        for k, a in _ATTR.items():
            v = ctypes.c_int()
            self.cu("cuDeviceGetAttribute", ctypes.byref(v), a, self.cu_dev)
            attr[k] = v.value
        self.ctx = ctypes.c_void_p()
        self.cu("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.cu_dev)
        renderer = CUDARenderer(f"sm_{attr['cc_major']}{attr['cc_minor']}")
        renderer.global_max = (attr["grid_x"], attr["grid_y"], attr["grid_z"])
        renderer.local_max = (attr["block_x"], attr["block_y"], attr["block_z"])
        renderer.local_threads_max = attr["max_threads"]
        nvrtc()  # fail now, in one sentence, when NVRTC is missing
        super().__init__(name, renderer, NVRTCCompiler(renderer.arch), CUDAAllocator(self))

    def set_current(self):
        self.cu("cuCtxSetCurrent", self.ctx)

    def build(self, spec: ProgramSpec) -> CUDAProgram:
        return CUDAProgram(self, spec, self.compiler.compile(spec.src))


def open_device(name: str) -> CUDADevice:
    """CUDA: GPU 0; CUDA:n: GPU n."""
    base, _, num = name.partition(":")
    if base != "CUDA" or (num and not num.isdigit()):
        raise ArgumentError(f"unknown CUDA device {name!r}; available: CUDA, CUDA:0, CUDA:1, ...")
    return CUDADevice(name, int(num or 0))
