"""The compiled-kernel cache: each kernel graph compiled once per device's program key (its code rendered, built,
its operations counted for GFLOPS), and a schedule-cache Plan's kernels looked up in it (engine/realize.py's fast
path runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Hashable

from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.codegen.opt.access import symbolic_work
from zeptograd.device import Device
from zeptograd.dtype import dtypes
from zeptograd.engine import schedule_cache
from zeptograd.helpers import BEAM, DEBUG, DEVECTORIZE, NOOPT, THREADS, VIZ, prod
from zeptograd.schedule.copy import CopyProgram, copy_name
from zeptograd.uop.ops import Ops, UOp, pretty


@dataclass
class CompiledKernel:
    name: str
    program: Callable[..., None]  # a device's Program, or a copy item's CopyProgram: (*handles, vals=...)
    n_ops: int  # estimated operations per run, for GFLOPS
    src: str
    vars: tuple[str, ...] = ()  # the Variables it takes as int arguments after the buffers, by name
    # (fn, wrap, program): program.direct_call(), the compiled function a run calls without the Program's frame
    direct: tuple | None = field(init=False, default=None)

    def __post_init__(self):
        if (shortcut := getattr(self.program, "direct_call", lambda: None)()) is not None:
            self.direct = (*shortcut, self.program)


# keyed by the device's program_key, not its name: devices of one backend, renderer and compiler (CPU:0, CPU:1, ...)
# share each compiled kernel, so a model sharded over n of them compiles as one device does
# (engine/realize.py's _run_plan reads it too, as its own global: a test that swaps the cache swaps it in both)
_kernel_cache: dict[tuple, CompiledKernel] = {}
_program_keys: dict[str, Hashable] = {}  # device name -> Device[name].program_key (looked up on every kernel call)


def kernel_key(device: str, ast: UOp) -> tuple:
    """The compiled-kernel cache's key of a kernel graph on a device."""
    if (scope := _program_keys.get(device)) is None:
        scope = _program_keys[device] = Device[device].program_key
    return (scope, ast, BEAM.value, NOOPT.value, DEVECTORIZE.value, THREADS.value)  # the knobs codegen reads


def get_kernel(device: str, ast: UOp, bufs: list | None = None) -> CompiledKernel:
    """The compiled kernel for a kernel graph (a copy item's COPY: its copy call); with BEAM=n and the kernel's
    buffers, its actions are searched."""
    key = kernel_key(device, ast)
    if (known := _kernel_cache.get(key)) is not None:
        return known
    if ast.op is Ops.COPY:  # a copy item: no code, a call that copies through the allocators (schedule/copy.py)
        _kernel_cache[key] = CompiledKernel(copy_name(ast), CopyProgram(ast), 0, "")
        return _kernel_cache[key]
    dev = Device[device]
    if DEBUG >= 5:
        print(pretty(ast))
    opts = None
    if (
        BEAM >= 1
        and bufs is not None
        and dev.beam_timing  # an interpreter's or a dry run's times mean nothing
        and not any(u.op is Ops.DEFINE_VAR for u in ast.toposort())
    ):  # BEAM times kernels without variable values
        from zeptograd.engine.search import beam_search

        opts = beam_search(device, ast, bufs, BEAM.value)
    if VIZ.value:  # its rewrites are recorded until kernel_end (zeptograd/viz/record.py, imported only with VIZ)
        from zeptograd.viz import record as viz_record

        viz_record.kernel_begin(device, ast)
    uops, opts = full_rewrite(ast, dev.renderer, opts)
    if DEBUG >= 3:
        print(f"{kernel_name(ast)}: {opts}")
    if DEBUG >= 6:
        for i, u in enumerate(uops):
            print(f"{i:4d} {u.op.name:<14} {str(u.dtype):<20} {[uops.index(s) for s in u.src]} {u.arg!r}")
    name = kernel_name(ast)
    spec = dev.renderer.render(name, uops)
    if spec.vars and not dev.renderer.has_local and spec.cores > 1:
        spec = replace(spec, work=symbolic_work(ast))  # small values run on one core (device.run_on_cores)
    if DEBUG >= 4:
        print(spec.src)
    ck = CompiledKernel(name, dev.build(spec), estimate_ops(ast), spec.src, spec.vars)
    if VIZ.value:
        from zeptograd.viz import record as viz_record

        viz_record.kernel_end(name, spec.src, opts, ck.n_ops, ck.program)  # a TinyJit replay calls the program
    _kernel_cache[key] = ck
    return ck


_COUNTED_OPS = {
    Ops.ADD,
    Ops.SUB,
    Ops.MUL,
    Ops.FDIV,
    Ops.MAX,
    Ops.EXP2,
    Ops.LOG2,
    Ops.SIN,
    Ops.COS,
    Ops.TAN,
    Ops.SQRT,
    Ops.MULACC,
    Ops.REDUCE,
}


def estimate_ops(ast: UOp) -> int:
    """Float ALU ops executed per run: each counts once per iteration of the loops it depends on."""
    iters: dict[frozenset[UOp], int] = {}  # the product of the sizes of the ranges a node depends on
    ranges: dict[UOp, frozenset[UOp]] = {}
    total = 0
    for u in ast.toposort():
        rs = frozenset().union(*[ranges[s] for s in u.src]) | ({u} if u.op is Ops.RANGE else frozenset())
        # a reduce's value is ready once its loops closed: what uses it runs outside them (softmax's exp(x - max)
        # counted once per element, not once per element per step of the max's loop)
        ranges[u] = rs - frozenset(u.src[1:]) if u.op is Ops.REDUCE else rs
        if u.op in _COUNTED_OPS and not dtypes.is_int(u.dtype):
            if rs not in iters:
                iters[rs] = prod(r.src[0].arg for r in rs if r.src[0].op is Ops.CONST)
            total += iters[rs] * (2 if u.op is Ops.MULACC else 1)
    return total


def _plan_kernels(plan: schedule_cache.Plan) -> list[tuple] | None:
    """(compiled kernel, buffer indices, bytes moved) per call of `plan`, each from the compiled-kernel cache as
    get_kernel finds it, kept on the plan (_run_plan uses them while that cache is the one they were found in and has
    not shrunk); None where one is missing (emptied since: the general path compiles it)."""
    runs = []
    for key, index, mem in plan.calls:
        if (kernel := _kernel_cache.get(key)) is None or kernel.vars:
            return None
        runs.append((kernel, index, mem))
    plan.runs, plan.runs_cache, plan.runs_len = runs, _kernel_cache, len(_kernel_cache)
    return runs
