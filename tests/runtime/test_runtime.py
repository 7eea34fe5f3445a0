"""The CPU runtime: compile cache, a clear error without a compiler, DEBUG output, GlobalCounters."""

import os

import numpy as np
import pytest

from zeptograd import Context, GlobalCounters, Tensor
from zeptograd.runtime.ops_cpu import CCompiler, NoCompilerError


def test_missing_compiler_is_one_clear_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "zeptograd-no-such-cc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(NoCompilerError, match="no C compiler found.*apt-get install gcc.*CC"):
        CCompiler().compile_to_file("void f(void) {}\n")


def test_compile_cache_on_disk(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    src = "void zg_cache_probe(float* restrict a) { a[0] = 1.0f; }\n"
    path = CCompiler().compile_to_file(src)
    assert os.path.exists(path) and path.startswith(str(tmp_path))
    mtime = os.path.getmtime(path)
    assert CCompiler().compile_to_file(src) == path and os.path.getmtime(path) == mtime  # not rebuilt


def test_debug_levels_print(capsys):
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with Context(DEBUG=4):
        (x * 3 + 0.5).sum(axis=1).realize()
    out = capsys.readouterr().out
    assert "scheduled 1 kernel" in out  # DEBUG=1
    assert "r_2_3" in out and "us" in out  # DEBUG=2: a line per kernel with its time
    assert "void r_2_3(" in out or "void @r_2_3(" in out  # DEBUG=4: the source (C, or LLVM IR on the default CPU)


def test_global_counters_count_kernels_and_ops():
    x = Tensor(np.ones((32, 32), np.float32))
    GlobalCounters.reset()
    (x + 2).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops == 32 * 32
    assert GlobalCounters.global_mem == 2 * 32 * 32 * 4
    assert GlobalCounters.time_sum_s > 0


def test_ops_after_a_reduce_count_once_per_element():
    """softmax's kernel: 6 ops per element (max, subtract, scale, exp2, sum, multiply); before, each op after a reduce
    counted once per step of that reduce's loop too (DEBUG=2 printed 1.9 PFLOPS for a causal attention's softmax)"""
    x = Tensor(np.ones((64, 128), np.float32)).realize()
    GlobalCounters.reset()
    x.softmax(-1).realize()
    assert GlobalCounters.global_ops <= 8 * 64 * 128
    a, b = Tensor(np.ones((16, 32), np.float32)).realize(), Tensor(np.ones((32, 24), np.float32)).realize()
    GlobalCounters.reset()
    (a @ b).realize()
    assert GlobalCounters.global_ops == 2 * 16 * 32 * 24  # a multiply and an add per step of the reduce


def test_freed_buffers_are_reused():
    x = Tensor(np.ones(1 << 16, np.float32))
    (x + 1).realize()
    used = GlobalCounters.mem_used
    for _ in range(5):
        (x + 1).realize()  # each result dies at once: its memory goes back to the allocator
    assert GlobalCounters.mem_used == used


def test_reused_host_memory_keeps_its_address_without_reading_it_again(monkeypatch):
    """A buffer freed to the host allocator's cache keeps its address beside it: the next buffer of that size gets
    the memory and its address together (numpy's .ctypes builds an object per read), and the address is right."""
    from zeptograd.device import Buffer, Device
    from zeptograd.dtype import dtypes

    allocator = Device["CPU"].allocator
    for mem in allocator.free_cache.pop(1000003 * 4, []):  # another test of this worker may have freed this size
        allocator.cached_handles.pop(id(mem), None)
    first = Buffer("CPU", 1000003, dtypes.float32)
    address = first.ptr
    del first
    assert len(allocator.free_cache[1000003 * 4]) == 1 and allocator.cached_handles
    monkeypatch.setattr(type(allocator), "handle", lambda self, mem: pytest.fail("the address was read again"))
    second = Buffer("CPU", 1000003, dtypes.float32)
    assert second.ptr == address
    monkeypatch.undo()
    assert second.ptr == second._mem.ctypes.data
    assert id(second._mem) not in allocator.cached_handles  # only memory in the cache has an entry
    second.copyin(np.arange(1000003, dtype=np.float32))
    assert second.numpy()[-1] == 1000002


def test_eager_kernels_are_called_without_the_programs_frame(monkeypatch):
    """run_schedule calls a kernel that needs no cores or Variables through Program.direct_call (the compiled function
    itself), kept on the CompiledKernel: the Program's __call__ is not on the path."""
    from zeptograd.device import Program
    from zeptograd.engine import realize

    program_type = type(realize.get_kernel("CPU", (Tensor([1.0], device="CPU") + 1).schedule()[0].ast).program)
    if program_type.direct_call is Program.direct_call:
        pytest.skip("this CPU backend has no direct call")
    x, y = np.arange(16, dtype=np.float32), np.full(16, 3.0, np.float32)
    a, b = Tensor(x, device="CPU").realize(), Tensor(y, device="CPU").realize()
    monkeypatch.setattr(program_type, "__call__", lambda *args, **kw: pytest.fail("called through the Program"))
    GlobalCounters.reset()
    out = (a * b + a).realize()
    assert GlobalCounters.kernel_count == 1
    monkeypatch.undo()
    np.testing.assert_allclose(out.numpy(), x * y + x)
