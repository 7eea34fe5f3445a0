"""Devices, buffers, and the interfaces a backend implements: Allocator, Compiler, Program and CompiledDevice (with
the Renderer of renderer/__init__.py)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Generic, Hashable, TypeVar

import numpy as np

from zeptograd.dtype import DType, dtypes, to_numpy_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.renderer import MIN_THREAD_WORK, ProgramSpec, Renderer
from zeptograd.runtime import diskcache
from zeptograd.runtime.call_table import SPIN_LIMIT


class _GlobalCounters:
    """Totals since the last reset(): kernels run, operations, bytes moved, seconds spent in kernels. One instance,
    `GlobalCounters` (an instance's attributes are written for a fraction of what a class's cost: every kernel run
    and buffer allocated updates them)."""

    __slots__ = ("kernel_count", "global_ops", "global_mem", "time_sum_s", "mem_used", "mem_peak")

    def __init__(self):
        self.kernel_count = self.global_ops = self.global_mem = 0
        self.time_sum_s = 0.0
        self.mem_used = 0  # bytes held by live buffers now
        self.mem_peak = 0  # the most bytes held at once since reset()

    def reset(self):
        self.kernel_count = self.global_ops = self.global_mem = 0
        self.time_sum_s = 0.0
        self.mem_peak = self.mem_used


GlobalCounters = _GlobalCounters()


ALIGN = 64  # bytes: a whole AVX-512 vector, so vector loads at aligned offsets never straddle a cache line


@functools.cache
def _host_memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


MemT = TypeVar("MemT")  # what an allocator's alloc returns: a numpy array of host memory, a cl.Buffer, ...


class Allocator(Generic[MemT]):
    """A device's memory, with a cache of freed blocks keyed by size (a fresh page or a driver call costs).

    A backend implements `alloc`/`free` of its memory objects, `copyin`/`copyout` of bytes, `handle(mem)` (what a
    kernel call receives for the buffer), `from_handle`, its inverse (a copy item, schedule/copy.py, is called with
    handles as a kernel is), and `capacity()`; `HostAllocator` is the host's."""

    host = True  # the memory is this process's: a handle is its address (CL, CUDA: memory of their own)

    def __init__(self):
        self.free_cache: dict[int, list[MemT]] = {}

    def alloc(self, nbytes: int) -> MemT:
        raise NotImplementedError

    def free(self, mem: MemT) -> None:
        raise NotImplementedError

    def alloc_with_handle(self, nbytes: int) -> tuple[MemT, Any]:
        """alloc and its handle (HostAllocator remembers the handles of the memory it caches)."""
        mem = self.alloc(nbytes)
        return mem, self.handle(mem)

    def free_with_handle(self, mem: MemT, handle: Any) -> None:
        """free, given the memory's handle if it was read (None if not)."""
        self.free(mem)

    def capacity(self) -> int:
        """The most bytes one buffer can have."""
        raise NotImplementedError

    def handle(self, mem: MemT) -> Any:
        """What a Program call receives for the buffer (a host address, a cl.Buffer, a device pointer)."""
        raise NotImplementedError

    def copyin(self, mem: MemT, src: np.ndarray) -> None:
        """src: the bytes (a flat uint8 array of mem's size)."""
        raise NotImplementedError

    def copyout(self, mem: MemT) -> np.ndarray:
        """A copy of the bytes, a flat uint8 array."""
        raise NotImplementedError

    def from_handle(self, handle: Any, nbytes: int) -> MemT:
        """The memory whose handle() is `handle` (nbytes of it), for copyin/copyout."""
        raise NotImplementedError


class HostAllocator(Allocator[np.ndarray]):
    """Host memory (CPU, PYTHON, NULL): aligned numpy arrays; a kernel receives the address."""

    def __init__(self):
        super().__init__()
        # id of an array in free_cache -> its address (numpy's .ctypes.data builds an object per read); an entry is
        # added before its array enters the cache and removed when the array leaves it, so the id is never reused
        self.cached_handles: dict[int, int] = {}

    def _reuse(self, nbytes: int) -> tuple[np.ndarray, int | None] | None:
        """A freed array of nbytes from the cache with its address if it was kept, or None."""
        if cached := self.free_cache.get(nbytes):
            try:
                mem = cached.pop()
            except IndexError:  # another thread took the last one since the check
                return None
            return mem, self.cached_handles.pop(id(mem), None)
        return None

    def alloc(self, nbytes: int) -> np.ndarray:
        if (reused := self._reuse(nbytes)) is not None:
            return reused[0]
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        off = (-raw.ctypes.data) % ALIGN
        return raw[off : off + nbytes]

    def alloc_with_handle(self, nbytes: int) -> tuple[np.ndarray, int]:
        if cached := self.free_cache.get(nbytes):  # (_reuse, inline: every realize allocates its outputs here)
            try:
                mem = cached.pop()
            except IndexError:  # another thread took the last one since the check
                pass
            else:
                handle = self.cached_handles.pop(id(mem), None)
                return mem, mem.ctypes.data if handle is None else handle
        mem = self.alloc(nbytes)
        return mem, mem.ctypes.data

    def free(self, mem: np.ndarray) -> None:
        self.free_cache.setdefault(mem.nbytes, []).append(mem)

    def free_with_handle(self, mem: np.ndarray, handle: int | None) -> None:
        if handle is not None:
            self.cached_handles[id(mem)] = handle
        self.free_cache.setdefault(mem.nbytes, []).append(mem)

    def capacity(self) -> int:
        """The host's physical memory."""
        return _host_memory()

    def handle(self, mem: np.ndarray) -> int:
        return mem.ctypes.data

    def from_handle(self, handle: int, nbytes: int) -> np.ndarray:
        """Here nbytes at that address, not copied."""
        if not nbytes:
            return np.zeros(0, np.uint8)
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(handle))

    def copyin(self, mem: np.ndarray, src: np.ndarray) -> None:
        mem[:] = src

    def copyout(self, mem: np.ndarray) -> np.ndarray:
        return mem.copy()


def check_capacity(buffers: list[Buffer]):
    """A MemoryError naming the bytes and the device for a buffer not yet allocated that its device can't hold,
    before anything is compiled or run (a loop over 10**12 elements would otherwise be compiled first)."""
    for b in buffers:  # every device holds 128 MiB (OpenCL's least max_mem_alloc_size): only larger ones are asked
        if (
            b.size * b.dtype.itemsize > 1 << 27
            and not b.is_allocated
            and b.nbytes > (cap := Device[b.device].allocator.capacity())
        ):
            raise MemoryError(
                f"can't allocate {b.nbytes} bytes ({b.size} x {b.dtype}) on {b.device}: it holds at most {cap} bytes"
            )


class Buffer:
    """`size` elements of `dtype` on `device`; memory is allocated on first use and returned on deletion."""

    def __init__(self, device: str, size: int, dtype: DType):
        self.device, self.size, self.dtype = device, size, dtype
        self._mem: Any = None  # what the device's allocator returned (host memory on CPU); None until allocated
        self._allocator: Allocator | None = None
        self._ptr: Any = None  # the address kernels take, read once (numpy's .ctypes makes an object per read)
        # weak references to the lazy nodes realized to a view of this memory (engine/realize.py: an ASSIGN into it
        # forgets them), or None
        self.readers: list | None = None

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def _memory(self) -> tuple[Allocator, Any]:
        """The allocator and the memory, allocated now if it was not."""
        if self._allocator is None:
            allocator = Device[self.device].allocator
            self._mem = allocator.alloc(self.nbytes)  # (a failed alloc leaves the buffer unallocated)
            self._allocator = allocator
            GlobalCounters.mem_used += self.nbytes
            GlobalCounters.mem_peak = max(GlobalCounters.mem_peak, GlobalCounters.mem_used)
        return self._allocator, self._mem

    def ensure_allocated(self) -> Buffer:
        self._memory()
        return self

    @property
    def is_allocated(self) -> bool:
        return self._allocator is not None

    @property
    def ptr(self) -> Any:
        """What a kernel call receives for this buffer (Allocator.handle): for host memory its address. Read once:
        numpy's .ctypes makes an object per read."""
        if (p := self._ptr) is None:
            if self._allocator is None:  # allocated with its handle (a host allocator's cache keeps the addresses)
                allocator = (Device._opened.get(self.device) or Device[self.device]).allocator
                nbytes = self.size * self.dtype.itemsize
                self._mem, p = allocator.alloc_with_handle(nbytes)
                self._allocator = allocator
                used = GlobalCounters.mem_used = GlobalCounters.mem_used + nbytes
                if used > GlobalCounters.mem_peak:
                    GlobalCounters.mem_peak = used
            else:
                p = self._allocator.handle(self._mem)
            self._ptr = p
        return p

    def copyin(self, data: np.ndarray) -> Buffer:
        allocator, mem = self._memory()
        allocator.copyin(mem, np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        return self

    def numpy(self) -> np.ndarray:
        """A copy of the contents as a flat numpy array."""
        allocator, mem = self._memory()
        raw = allocator.copyout(mem).view(to_numpy_dtype(self.dtype))
        if self.dtype == dtypes.bfloat16:
            return (raw.astype(np.uint32) << 16).view(np.float32)
        return raw

    def __del__(self):
        if self._allocator is not None:
            GlobalCounters.mem_used -= self.size * self.dtype.itemsize
            try:
                if type(allocator := self._allocator) is HostAllocator:  # (free_with_handle, inline: every realize's
                    mem = self._mem  # outputs come back here)
                    if self._ptr is not None:
                        allocator.cached_handles[id(mem)] = self._ptr
                    allocator.free_cache.setdefault(mem.nbytes, []).append(mem)
                else:
                    allocator.free_with_handle(self._mem, self._ptr)
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self):
        return f"<Buffer {self.device} {self.size} {self.dtype}>"


_object_new = object.__new__


def allocated_buffer(device: str, size: int, dtype: DType, allocator: Allocator) -> Buffer:
    """Buffer(device, size, dtype) with its memory from `allocator` (its device's) and its handle read now, as
    `Buffer.ptr` does on first use, in one Python frame (not __init__'s, ptr's and the allocator's own): the schedule
    cache's plans (engine/realize.py: _run_plan) allocate every new buffer of a realize here."""
    b = _object_new(Buffer)
    b.device, b.size, b.dtype, b.readers = device, size, dtype, None
    nbytes = size * dtype.itemsize
    if type(allocator) is HostAllocator and (cached := allocator.free_cache.get(nbytes)):  # (alloc_with_handle's
        try:  # reuse, inline: every realize allocates its outputs here)
            b._mem = mem = cached.pop()
        except IndexError:  # another thread took the last one since the check
            b._mem, b._ptr = allocator.alloc_with_handle(nbytes)
        else:
            b._ptr = mem.ctypes.data if (handle := allocator.cached_handles.pop(id(mem), None)) is None else handle
    else:
        b._mem, b._ptr = allocator.alloc_with_handle(nbytes)
    b._allocator = allocator
    used = GlobalCounters.mem_used = GlobalCounters.mem_used + nbytes
    if used > GlobalCounters.mem_peak:
        GlobalCounters.mem_peak = used
    return b


# ***** the interfaces of a backend *****


class CompileError(RuntimeError):
    pass


class Compiler:
    """Source -> binary, cached on disk by (compiler key, source) in `runtime/diskcache.py` (which checks an entry's
    owner, mode and content hash before it is used): a backend implements `build` or `build_file`, or overrides
    `compile` where its binaries are not cached here (NULL, PYTHON; OpenCL's implementation caches its own)."""

    cache_subdir: str = "base"  # the cache's folder for this compiler's binaries
    suffix: str = ".bin"  # a cached binary's file name ending
    disk_cached: bool = True  # compile_to_file writes the cache (BEAM's workers fill it for the parent)

    @property
    def key(self) -> str:
        """Names the compiler, its version and flags: a cached binary is used only by the same key."""
        return "base"

    def build(self, src: str) -> bytes:
        """Compile src (a cache miss); by default through `build_file` into a private temporary directory."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="zeptograd-build-") as tmp:  # mode 0700
            out = os.path.join(tmp, f"out{self.suffix}")
            self.build_file(src, out)
            with open(out, "rb") as f:
                return f.read()

    def build_file(self, src: str, out_path: str):
        """Compile src into out_path (a fresh temporary file)."""
        raise NotImplementedError

    def check(self, data: bytes):
        """Raise diskcache.CorruptEntry if a cached binary that compile_to_file returns cannot be loaded safely."""

    def entry_name(self, src: str) -> str:
        return hashlib.sha256((self.key + "\0" + src).encode()).hexdigest()[:32] + self.suffix

    def compile(self, src: str) -> bytes:
        """The binary of src: from the on-disk cache, else built and stored there (kept in memory if it cannot be)."""
        name = self.entry_name(src)
        hit = diskcache.load_entry(self.cache_subdir, name, self.key)
        if hit is not None:
            return hit[0]
        data = self.build(src)
        diskcache.store_entry(self.cache_subdir, name, self.key, data, private=False)
        return data

    def compile_to_file(self, src: str) -> str:
        """The path of src's binary, checked (or built) just now; in this process's private directory if the cache
        cannot be used. Safe for parallel processes (BEAM workers)."""
        name = self.entry_name(src)
        hit = diskcache.load_entry(self.cache_subdir, name, self.key)
        if hit is not None:
            try:
                self.check(hit[0])
                return hit[1]
            except diskcache.CorruptEntry as e:
                diskcache.warn_once(hit[1], f"{hit[1]} cannot be loaded ({e}): compiling it again")
                self.evict(src)
        path = diskcache.store_entry(self.cache_subdir, name, self.key, self.build(src), private=True)
        if path is None:
            raise CompileError(f"cannot write the compiled kernel to {diskcache.private_root()} (see the warning)")
        return path

    def evict(self, src: str):
        """Remove src's cache entry (it failed to load), so that the next compile builds it again."""
        diskcache.remove_entry(self.cache_subdir, self.entry_name(src))


class Program:
    """A loaded kernel: called with each buffer's `Allocator.handle` (DEFINE_GLOBAL order) and `vals`, the int
    values of `spec.vars`; it returns when the kernel has finished (so a caller's clock times the kernel)."""

    def __init__(self, spec: ProgramSpec):
        self.spec = spec

    def __call__(self, *bufs: Any, vals: tuple[int, ...] = ()) -> None:
        raise NotImplementedError

    def direct_call(self) -> tuple[Callable[..., None], Callable[[Any], Any] | None] | None:
        """(fn, arg) where `fn(*[arg(h) for h in handles])` runs the kernel as `self(*handles)` does (no `vals`),
        without this object's Python frame: a TinyJit replay prepares the arguments once and calls fn (arg None:
        the handles as they are). None where a call needs more than that (cores, Variables)."""
        return None

    def native(self) -> tuple[int, Callable[[Any], None]] | None:
        """(the address of a C function that runs the kernel given only its buffers' pointers, a call_table runner
        that can call it): a TinyJit replay makes all such calls in one foreign call (runtime/call_table.py). None
        where the kernel is not such a function (cores, Variables, too many arguments) or no runner could be built."""
        return None


@dataclass
class CompiledDevice:
    """A backend: its renderer (what codegen targets), compiler, allocator, and `build` (a rendered kernel ->
    a Program). A new backend subclasses each; tests/backend/test_conformance.py says what one lacks."""

    name: str
    renderer: Renderer
    compiler: Compiler
    allocator: Allocator = field(default_factory=HostAllocator)
    # BEAM may choose a kernel's optimizations by timing candidates here: False where time means nothing (PYTHON
    # interprets kernels, NULL runs none)
    beam_timing: ClassVar[bool] = True
    # a Program built here runs on every device of this class with an equal program_key: code in this process called
    # with host addresses (CPU, NULL, PYTHON). False where a program belongs to a context (an OpenCL or CUDA device's)
    shares_programs: ClassVar[bool] = False

    @functools.cached_property
    def program_key(self) -> Hashable:
        """What the compiled-kernel cache (engine/realize.py) is keyed by instead of the device's name: devices with
        an equal key share one compile of each kernel (CPU:0 ... CPU:3 compile a sharded model's kernels once). The
        renderer's settings fix the code, the compiler's key the binary."""
        if not self.shares_programs:
            return self.name
        settings = repr(sorted(vars(self.renderer).items()))  # simd_bytes: the host's, read by each device
        return (type(self).__name__, type(self.renderer).__name__, settings, self.compiler.key)

    def build(self, spec: ProgramSpec) -> Program:
        """The kernel spec rendered, compiled (or from the cache) and loaded, ready to call."""
        raise NotImplementedError


# ***** running a CPU kernel on several cores: one call per core_id, on persistent worker threads *****


class CorePool:
    """Worker threads that run core 1..n-1 of a kernel while the calling thread runs core 0. Each worker waits on
    its own lock and answers on another: a call is two lock handoffs per worker, about half the latency of a
    ThreadPoolExecutor's futures and queue (measured: a no-op 2-core call 50 -> 25 us median on this 2-core VM at
    load 5), which every threaded kernel pays.

    A worker also sets its flag when its core is done. Given a `wait` (runtime/call_table.py's spin wait), the
    caller, its own core done, polls that flag in native code before it sleeps on the lock: a thread asleep on a
    lock wakes by the kernel's scheduler, and on a VM whose idle vCPU halts that costs tens of us (at real-time
    priority, this 2-core VM: a call of 200 us work per core 25-30 -> 16-19 us over it, median; the threaded
    (1024, 1024).sum(1) 83-86 -> 64-67 us)."""

    def __init__(self, workers: int):
        self.go = [threading.Lock() for _ in range(workers)]  # held while the worker has nothing to do
        self.done = [threading.Lock() for _ in range(workers)]  # held while the worker runs its core
        for lock in self.go + self.done:
            lock.acquire()
        self.busy = threading.Lock()  # one caller at a time owns the workers
        self.flags = (ctypes.c_int * workers)()  # per worker: 0 while its core runs, 1 once it is done
        self.fn: Callable[[int], None] | None = None
        self.errors: list[BaseException] = []
        for w in range(workers):
            threading.Thread(target=self._work, args=(w,), name=f"zg-core{w + 1}", daemon=True).start()

    def _work(self, w: int):
        go, done = self.go[w], self.done[w]
        while True:
            go.acquire()
            try:
                assert self.fn is not None
                self.fn(w + 1)
            except BaseException as e:  # handed to the caller, which raises it
                self.errors.append(e)
            finally:
                self.flags[w] = 1
                done.release()

    def run(self, fn: Callable[[int], None], n: int, wait: Callable[[int, int], None] | None = None) -> bool:
        """fn(0) here and fn(1..n-1) on the workers; False (nothing run) while another thread holds the pool. `wait`:
        the native spin wait the caller polls each worker's flag with before it sleeps on the worker's lock."""
        if not self.busy.acquire(blocking=False):
            return False
        try:
            self.fn, self.errors = fn, []
            for w in range(n - 1):
                self.flags[w] = 0
                self.go[w].release()
            try:
                fn(0)
            finally:
                for w in range(n - 1):
                    if wait is not None:
                        wait(ctypes.addressof(self.flags) + w * ctypes.sizeof(ctypes.c_int), SPIN_LIMIT)
                    self.done[w].acquire()
                self.fn = None
            if self.errors:
                raise self.errors[0]
            return True
        finally:
            self.busy.release()


_pool: CorePool | None = None  # made at the first parallel call, grown when a call needs more cores


def _forget_pool_in_child():
    """A forked child has none of the parent's threads: the inherited pool's workers do not exist there (the child
    would hang at its first threaded kernel). Drop it; the child makes its own on first use."""
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_pool_in_child)


def small_work(spec: ProgramSpec) -> Callable[[tuple[int, ...]], bool] | None:
    """For a ProgramSpec with `work`: vals -> whether a call is too small to be worth the other cores; else None."""
    if not spec.work:
        return None
    try:
        fn = eval(f"lambda {', '.join(spec.vars)}: {spec.work}", {"max": max})  # noqa: S307  (our own rendering)
    except SyntaxError:  # a Variable named like a keyword
        return None
    return lambda vals: fn(*vals) < MIN_THREAD_WORK


def run_on_cores(
    fn: Callable[[int], None], n: int, serial: bool = False, wait: Callable[[int, int], None] | None = None
):
    """Call fn(core_id) for core_id in 0..n-1 in parallel (serial: in order, in this thread); compiled kernels
    release the GIL while they run. A thread that finds the workers busy with another thread's kernel runs its
    cores in order itself rather than wait. `wait`: CorePool.run's."""
    global _pool
    if n > 1 and not serial:
        if _pool is None or len(_pool.go) < n - 1:
            _pool = CorePool(n - 1)  # an outgrown pool's idle workers stay parked on their locks
        if _pool.run(fn, n, wait):
            return
    for core in range(n):
        fn(core)


# ***** the registry: Device["CPU"] opens a backend on first use *****

_BACKENDS = {
    "CPU": "zeptograd.runtime.ops_cpu",
    "PYTHON": "zeptograd.runtime.ops_python",
    "NULL": "zeptograd.runtime.ops_null",
    "CL": "zeptograd.runtime.ops_cl",
    "CUDA": "zeptograd.runtime.ops_cuda",
}


_COMPILERS = {"CPU": ("LLVM", "C")}  # the kinds whose compiler a name can choose (plain CPU is LLVM or CPU_LLVM=0's C)
# the kinds with several devices; the others have only index 0. CPU:1, CPU:2, ... are more devices on the same cores
# (each its own allocator and queue, one compiler): kernels run one at a time in a process, so each uses every
# THREADS core while it runs. NULL:1, NULL:2, ... schedule a sharded tensor's graphs without running them
_INDEXED = ("CPU", "CL", "CUDA", "NULL")
DEVICE_GRAMMAR = "KIND[:INDEX][:COMPILER]"


class _Device:
    def __init__(self):
        self._opened: dict[str, CompiledDevice] = {}
        self._spellings: dict[str, str] = {}  # a valid name -> its one spelling (every Tensor() asks)

    def canonicalize(self, device: str | tuple[str, ...] | list[str] | None) -> str:
        """A device name in its one spelling. The grammar is KIND[:INDEX][:COMPILER]: an integer field is a device
        index (index 0 is the kind itself: `CPU:0` is `CPU`, `CL:0` is `CL`), a name selects the compiler (`CPU:C`,
        `CPU:LLVM`, `CPU:0:C`). CPU, CL, CUDA and NULL number their devices; PYTHON has only index 0."""
        if device is None:
            return self.DEFAULT
        if isinstance(device, (tuple, list)):  # a sharded tensor's devices (tensor/multi.py) stay a tuple
            names = tuple(self.canonicalize(d) for d in device)
            if not names or len(set(names)) != len(names):
                raise ArgumentError(f"a tuple of devices names each device once, got {tuple(device)}")
            return names  # type: ignore[return-value]  # callers that take tuples pass them on to Tensor
        if type(device) is str and (known := self._spellings.get(device)) is not None:
            return known
        if not isinstance(device, str):
            raise ArgumentTypeError(f"a device is a string like 'CPU' or 'CL:1', got {type(device).__name__}")
        kind, *fields = device.upper().split(":")
        if kind not in _BACKENDS:
            raise ArgumentError(f"unknown device {device!r}; available: {', '.join(sorted(_BACKENDS))}")
        index = int(fields.pop(0)) if fields and fields[0].isdigit() else 0
        compiler = fields.pop(0) if fields else ""
        compilers = _COMPILERS.get(kind, ())
        if fields or (compiler and compiler not in compilers):
            choice = f"{kind}'s compilers are {', '.join(compilers)}" if compilers else f"{kind} has no compiler choice"
            raise ArgumentError(f"device {device!r} doesn't follow {DEVICE_GRAMMAR}: {choice}")
        if index and kind not in _INDEXED:
            raise ArgumentError(
                f"device {device!r}: {kind} has only device index 0 ({DEVICE_GRAMMAR}: {kind} and {kind}:0 name it)"
            )
        canonical = kind + (f":{index}" if index else "") + (f":{compiler}" if compiler else "")
        if len(self._spellings) < 256:
            self._spellings[device] = canonical
        return canonical

    def __getitem__(self, device: str) -> CompiledDevice:
        device = self.canonicalize(device)
        if device not in self._opened:
            module = importlib.import_module(_BACKENDS[device.split(":")[0]])
            self._opened[device] = module.open_device(device)
        return self._opened[device]

    @property
    def DEFAULT(self) -> str:
        """DEV if set, else CPU (LLVM; CPU_LLVM=1 names it CPU:LLVM), read from the environment at each call."""
        return self.canonicalize(os.getenv("DEV") or ("CPU:LLVM" if os.getenv("CPU_LLVM") == "1" else "CPU"))


Device = _Device()
