"""The OpenCL device (CL, CL:1, ...): OpenCL C from renderer/gpu.py, built and run through pyopencl.

One context and in-order queue per device; buffers are `cl.Buffer`s (copied in and out by the allocator); each
kernel call waits for its kernel, so DEBUG=2 times are kernel times. Program builds are cached by the OpenCL
implementation itself (PoCL: under POCL_CACHE_DIR) and per process by the realize cache.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from zeptograd.device import Allocator, CompiledDevice, CompileError, Compiler, Program
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec
from zeptograd.renderer.gpu import OpenCLRenderer

BUILD_OPTIONS = ["-cl-fp32-correctly-rounded-divide-sqrt"]  # IEEE division and sqrt, as the CPU backends


class DeviceUnavailable(RuntimeError):
    """The device can't open on this machine (missing driver, package or hardware); the message says the fix."""


def _cl():
    try:
        import pyopencl as cl
    except ImportError:
        raise DeviceUnavailable(
            "OpenCL needs the pyopencl package: `pip install pyopencl` (and an OpenCL platform, "
            "e.g. `apt-get install pocl-opencl-icd` for the CPU)"
        ) from None
    return cl


def cl_devices() -> list:
    """Every OpenCL device of every platform, GPUs first; [] when there is no platform."""
    cl = _cl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # no ICD loaded: "PLATFORM_NOT_FOUND_KHR"
        platforms = []
    devs = [d for p in platforms for d in p.get_devices()]
    return sorted(devs, key=lambda d: not d.type & cl.device_type.GPU)


class CLAllocator(Allocator[Any]):  # pyopencl's cl.Buffer (pyopencl has no type information)
    """cl.Buffers (at least 1 byte: OpenCL has no empty buffers), reused by size."""

    host = False

    def __init__(self, cl, ctx, queue):
        super().__init__()
        self.cl, self.ctx, self.queue = cl, ctx, queue

    def alloc(self, nbytes: int):
        if cached := self.free_cache.get(nbytes):
            return cached.pop()
        buf = self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, size=max(nbytes, 1))
        buf.zg_nbytes = nbytes
        return buf

    def free(self, mem):
        self.free_cache.setdefault(mem.zg_nbytes, []).append(mem)

    def capacity(self) -> int:
        return self.ctx.devices[0].max_mem_alloc_size  # OpenCL's limit for one buffer

    def handle(self, mem):
        return mem

    def from_handle(self, handle, nbytes: int):
        return handle  # the cl.Buffer itself

    def copyin(self, mem, src: np.ndarray):
        if src.nbytes:
            self.cl.enqueue_copy(self.queue, mem, src, is_blocking=True)

    def copyout(self, mem) -> np.ndarray:
        out = np.empty(mem.zg_nbytes, dtype=np.uint8)
        if out.nbytes:
            self.cl.enqueue_copy(self.queue, out, mem, is_blocking=True)
        return out


class CLCompiler(Compiler):
    disk_cached = False  # the OpenCL implementation caches its builds (PoCL: under POCL_CACHE_DIR)

    def __init__(self, cl, ctx, device):
        self.cl, self.ctx, self.device = cl, ctx, device

    @functools.cached_property
    def key(self) -> str:
        return f"cl {self.device.platform.name} {self.device.name} {' '.join(BUILD_OPTIONS)}"

    def program(self, src: str) -> Any:
        """src built for this device: a cl.Program."""
        try:
            return self.cl.Program(self.ctx, src).build(options=BUILD_OPTIONS)
        except self.cl.RuntimeError as e:  # a build failure: the log is in the message
            raise CompileError(f"internal error: the generated OpenCL C did not build:\n{e}\n{src}") from None

    def build(self, src: str) -> bytes:
        return self.program(src).get_info(self.cl.program_info.BINARIES)[0]

    def compile(self, src: str) -> bytes:
        return self.build(src)


class CLProgram(Program):
    def __init__(self, dev: CLDevice, spec: ProgramSpec):
        super().__init__(spec)
        self.dev = dev
        self.kernel = getattr(dev.compiler.program(spec.src), spec.name)
        self.local = None if spec.local_size == (1, 1, 1) else spec.local_size  # None: the runtime picks
        self.global_ = tuple(g * loc for g, loc in zip(spec.global_size, spec.local_size))

    def __call__(self, *bufs, vals: tuple[int, ...] = ()):
        cl = self.dev.cl
        for i, b in enumerate(bufs):
            self.kernel.set_arg(i, b)
        for i, v in enumerate(vals):
            self.kernel.set_arg(len(bufs) + i, np.int32(v))
        if 0 in self.global_:
            return
        cl.enqueue_nd_range_kernel(self.dev.queue, self.kernel, self.global_, self.local).wait()


class CLDevice(CompiledDevice):
    compiler: CLCompiler

    def __init__(self, name: str, cl, device):
        self.cl, self.cl_device = cl, device
        self.ctx = cl.Context([device])
        self.queue = cl.CommandQueue(self.ctx, device)
        sizes = tuple(device.max_work_item_sizes)[:3]
        renderer = OpenCLRenderer(
            local_max=tuple(min(s, 256) for s in sizes), local_threads_max=min(device.max_work_group_size, 256)
        )
        super().__init__(name, renderer, CLCompiler(cl, self.ctx, device), CLAllocator(cl, self.ctx, self.queue))

    def build(self, spec: ProgramSpec) -> CLProgram:
        return CLProgram(self, spec)


def open_device(name: str) -> CLDevice:
    """CL: the first OpenCL device (GPUs first); CL:n: the n-th."""
    base, _, num = name.partition(":")
    if base != "CL" or (num and not num.isdigit()):
        raise ArgumentError(f"unknown OpenCL device {name!r}; available: CL, CL:0, CL:1, ...")
    cl = _cl()
    devs = cl_devices()
    if not devs:
        raise DeviceUnavailable(
            "no OpenCL platform found: install one (e.g. `apt-get install pocl-opencl-icd "
            "ocl-icd-libopencl1` for the CPU, or your GPU vendor's OpenCL driver)"
        )
    idx = int(num or 0)
    if idx >= len(devs):
        raise DeviceUnavailable(f"{name}: there are only {len(devs)} OpenCL devices")
    return CLDevice(name, cl, devs[idx])
