"""A table of kernel calls run by one native function: a TinyJit replay's kernels in one foreign call.

Each ctypes call of a kernel costs about 3,000 CPU instructions (argument conversion, libffi's call interface made
again, the GIL released and taken back): more than a small kernel's work. A CallTable holds the captured calls as
words in one ctypes array, `[n, fn0, k0, arg0_0 .. arg0_k0-1, fn1, k1, ...]` (fn a C function that takes k pointer
arguments), and `zg_run_calls(table)` calls them in order: one foreign call per replay, the pointers written into
the table only where they change. The runner is compiled once per backend (its source never changes, so the
on-disk cache keeps it): LLVM IR for the LLVM backend, C for CPU:C.
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

MAX_ARGS = 32  # a kernel with more pointer arguments is called on its own (the runner has one call per count)
RUNNER = "zg_run_calls"
usable = ctypes.sizeof(ctypes.c_void_p) == 8  # the runner reads 64-bit words


def c_source() -> str:
    cases = []
    for k in range(MAX_ARGS + 1):
        proto = ", ".join(["void*"] * k) or "void"
        args = ", ".join(f"a[{i}]" for i in range(k))
        cases.append(f"    case {k}: ((void (*)({proto}))f)({args}); break;")
    return "\n".join(
        [
            f"void {RUNNER}(void **t) {{",
            "  long n = (long)t[0];",
            "  void **p = t + 1;",
            "  for (long i = 0; i < n; i++) {",
            "    void *f = p[0];",
            "    long k = (long)p[1];",
            "    void **a = p + 2;",
            "    switch (k) {",
            *cases,
            "    }",
            "    p += 2 + k;",
            "  }",
            "}",
            "",
        ]
    )


def llvm_source() -> str:
    switch = " ".join(f"i64 {k}, label %c{k}" for k in range(MAX_ARGS + 1))
    lines = [
        f"define void @{RUNNER}(ptr %t) nounwind {{",
        "entry:",
        "  %n = load i64, ptr %t",
        "  %p0 = getelementptr ptr, ptr %t, i64 1",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%i1, %next]",
        "  %p = phi ptr [%p0, %entry], [%pn, %next]",
        "  %done = icmp sge i64 %i, %n",
        "  br i1 %done, label %exit, label %body",
        "body:",
        "  %f = load ptr, ptr %p",
        "  %kp = getelementptr ptr, ptr %p, i64 1",
        "  %k = load i64, ptr %kp",
        "  %a = getelementptr ptr, ptr %p, i64 2",
        f"  switch i64 %k, label %next [ {switch} ]",
    ]
    for k in range(MAX_ARGS + 1):
        lines.append(f"c{k}:")
        for i in range(k):
            lines += [f"  %c{k}p{i} = getelementptr ptr, ptr %a, i64 {i}", f"  %c{k}a{i} = load ptr, ptr %c{k}p{i}"]
        lines += [f"  call void %f({', '.join(f'ptr %c{k}a{i}' for i in range(k))})", "  br label %next"]
    lines += [
        "next:",
        "  %i1 = add i64 %i, 1",
        "  %step = add i64 %k, 2",
        "  %pn = getelementptr ptr, ptr %p, i64 %step",
        "  br label %loop",
        "exit:",
        "  ret void",
        "}",
        "",
    ]
    return "\n".join(lines)


HOLD_GIL_BYTES = 1 << 18  # a table whose kernels touch less memory in all runs without releasing the GIL


def runner_at(addr: int) -> Callable[[Any], None]:
    """The runner at a loaded address as a ctypes function: no argtypes (the table array is passed as its address,
    the cheapest conversion ctypes has); a CFUNCTYPE, so the GIL is released while the kernels run."""
    return ctypes.CFUNCTYPE(None)(addr)


def holding_gil(runner: Any) -> Callable[[Any], None]:
    """The same runner called without releasing the GIL (a PYFUNCTYPE): for kernels that touch so little memory
    that dropping and taking back the GIL (a lock handoff) costs more than they run. The kernels never call Python."""
    return ctypes.PYFUNCTYPE(None)(ctypes.cast(runner, ctypes.c_void_p).value or 0)


# ***** the spin wait: how the caller of a kernel split over cores waits for the other cores *****

SPIN_WAIT = "zg_spin_wait"
# polls with a pause instruction (~25 ns each on this AMD VM: about 100 us), then polls that each yield the core
# (sched_yield, 0.4-1.2 us when nothing else is runnable), before the caller gives up and sleeps on the worker's lock
# (about 0.5 ms in all). A pause keeps a spinning core from flooding the memory system with loads while the other
# streams; a yield hands the core to a runnable thread (the worker waited on, where both share a core)
SPIN_PAUSES = 1 << 12
SPIN_LIMIT = SPIN_PAUSES + (1 << 9)


def _pause_c() -> str:
    return "\n".join(
        [
            "#if defined(__x86_64__) || defined(__i386__)",
            "      __builtin_ia32_pause();",
            "#elif defined(__aarch64__)",
            '      __asm__ __volatile__("yield");',
            "#endif",
        ]
    )


def spin_c_source() -> str:
    """`zg_spin_wait(flag, n)`: returns once the int at flag is nonzero (read with acquire order) or after n polls:
    the first SPIN_PAUSES with a pause, the rest each with a sched_yield."""
    return "\n".join(
        [
            "int sched_yield(void);",
            f"void {SPIN_WAIT}(int *flag, long long n) {{",
            "  for (long long i = 0; i < n; i++) {",
            "    if (__atomic_load_n(flag, __ATOMIC_ACQUIRE)) return;",
            f"    if (i < {SPIN_PAUSES}) {{",
            _pause_c(),
            "    } else",
            "      sched_yield();",
            "  }",
            "}",
            "",
        ]
    )


def _pause_llvm(machine: str) -> tuple[list[str], list[str]]:
    """the host's pause instruction as LLVM IR: (declarations, the call); none where it has none we know"""
    if machine in ("x86_64", "amd64", "i386", "i686"):
        return ["declare void @llvm.x86.sse2.pause()"], ["  call void @llvm.x86.sse2.pause()"]
    if machine in ("aarch64", "arm64"):
        return ["declare void @llvm.aarch64.hint(i32)"], ["  call void @llvm.aarch64.hint(i32 1)"]
    return [], []


def spin_llvm_source() -> str:
    """spin_c_source's function as LLVM IR"""
    import platform

    declare, pause = _pause_llvm(platform.machine().lower())
    return "\n".join(
        [
            *declare,
            "declare i32 @sched_yield()",
            f"define void @{SPIN_WAIT}(ptr %flag, i64 %n) nounwind {{",
            "entry:",
            "  br label %poll",
            "poll:",
            "  %i = phi i64 [0, %entry], [%i1, %again]",
            "  %v = load atomic i32, ptr %flag acquire, align 4",
            "  %set = icmp ne i32 %v, 0",
            "  br i1 %set, label %out, label %wait",
            "wait:",
            f"  %early = icmp slt i64 %i, {SPIN_PAUSES}",
            "  br i1 %early, label %pause, label %yield",
            "pause:",
            *pause,
            "  br label %again",
            "yield:",
            "  %y = call i32 @sched_yield()",
            "  br label %again",
            "again:",
            "  %i1 = add i64 %i, 1",
            "  %more = icmp slt i64 %i1, %n",
            "  br i1 %more, label %poll, label %out",
            "out:",
            "  ret void",
            "}",
            "",
        ]
    )


def spin_wait_at(addr: int) -> Callable[[int, int], None]:
    """The spin wait at a loaded address as a ctypes function (flag's address, polls): the GIL released meanwhile,
    so the worker that sets the flag can run its Python."""
    return ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(addr)


class CallTable:
    """Kernel calls `(fn address, pointers)` as one table; `run()` makes them all in one foreign call."""

    def __init__(self, runner: Callable[[Any], None], calls: list[tuple[int, list[int]]], small: bool = False):
        self.runner = holding_gil(runner) if small else runner
        self.words = ctypes.c_void_p * (1 + sum(2 + len(ptrs) for _, ptrs in calls))
        self.array = self.words()
        self.at: list[int] = []  # per call, the index of its first argument
        self.array[0] = len(calls)
        i = 1
        for addr, ptrs in calls:
            if len(ptrs) > MAX_ARGS:  # the runner has no case for it: it would skip the call, silently
                raise ValueError(f"a call table call takes at most {MAX_ARGS} pointers, not {len(ptrs)}")
            self.array[i], self.array[i + 1] = addr, len(ptrs)
            self.at.append(i + 2)
            for j, p in enumerate(ptrs):
                self.array[i + 2 + j] = p
            i += 2 + len(ptrs)

    def set_ptr(self, call: int, pos: int, ptr: int):
        self.array[self.at[call] + pos] = ptr

    def run(self):
        self.runner(self.array)
