"""The PYTHON device: an interpreter of the linear UOps, the reference the compiled backends are checked against.

Its "renderer" writes the UOp list as text, one numbered line per UOp (`i OP dtype [sources] arg`), which is
what DEBUG=4 prints and what the interpreter parses back. Every value is a Python scalar with the exact semantics
of its dtype (`exec_alu`: wraparound ints, float32/float16/bfloat16 rounding after each op), a vector is a tuple of
them. Loops, gated loads and stores, vectors and accumulators are all executed; an access outside a buffer raises.
It needs no compiler; it is slow (a few microseconds per UOp executed), so keep its shapes small.
"""

from __future__ import annotations

import ctypes
import math
import struct
from typing import Any, Callable

import numpy as np

from zeptograd.device import CompiledDevice, Compiler, HostAllocator, Program
from zeptograd.dtype import DType, PtrDType, dtypes, to_numpy_dtype, truncate
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec, Renderer
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp, exec_alu

# ***** the "renderer": the UOp list as text *****


def dtype_text(dt: DType) -> str:
    if isinstance(dt, PtrDType):
        return f"{dtype_text(dt.base)}.ptr({dt.size}{',True' if dt.local else ''})"
    return f"{dt.scalar.name}.vec({dt.count})" if dt.count > 1 else dt.name


_DTYPE_NS = {d.name: d for d in dtypes.all} | {"void": dtypes.void}
_ARG_NS = {"AxisType": AxisType, "Ops": Ops, "inf": math.inf, "nan": math.nan, "__builtins__": {}}


class PythonRenderer(Renderer):
    device = "PYTHON"
    masked_vectors = True  # a gated vector access reads/writes lane by lane

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        pos = {u: i for i, u in enumerate(uops)}
        lines = [f"# PYTHON kernel {name}"]
        for i, u in enumerate(uops):
            srcs = ",".join(str(pos[s]) for s in u.src)
            lines.append(f"{i} {u.op.name} {dtype_text(u.dtype)} [{srcs}] {u.arg!r}")
        n_bufs = sum(u.op is Ops.DEFINE_GLOBAL for u in uops)
        var_names = tuple(u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR)
        cores = next((u.src[0].arg for u in uops if u.op is Ops.SPECIAL and u.arg == "core_id"), 1)
        return ProgramSpec(name, "\n".join(lines) + "\n", n_bufs, var_names, global_size=(cores, 1, 1))


def parse(src: str) -> list[tuple[Ops, DType, tuple[int, ...], Any]]:
    out = []
    for line in src.splitlines():
        if not line or line.startswith("#"):
            continue
        _, op, dt, rest = line.split(" ", 3)
        srcs, arg = rest.split("] ", 1)
        out.append(
            (
                Ops[op],
                eval(dt, {"__builtins__": {}}, _DTYPE_NS),
                tuple(int(s) for s in srcs[1:].split(",") if s),
                eval(arg, _ARG_NS),
            )
        )
    return out


# ***** memory *****


def _bf16_bits_to_float(b: int) -> float:
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


def _float_to_bf16_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", truncate(dtypes.bfloat16, x)))[0] >> 16


class Memory:
    """A buffer or an accumulator, counted in scalars: load/store of `count` consecutive ones, bounds checked."""

    def __init__(self, data: Any, dtype: DType, name: str):
        self.data, self.dtype, self.name, self.size = data, dtype, name, len(data)
        self.bf16 = dtype == dtypes.bfloat16 and isinstance(data, np.ndarray)

    def check(self, off: int, count: int):
        if off < 0 or off + count > self.size:
            raise IndexError(
                f"PYTHON: access to elements {off}..{off + count - 1} of {self.name} "
                f"({self.size} elements of {self.dtype.name})"
            )

    def load(self, off: int, count: int):
        self.check(off, count)
        d = self.data
        if isinstance(d, list):
            return d[off] if count == 1 else tuple(d[off : off + count])
        vals = [d.item(off + i) for i in range(count)]
        if self.bf16:
            vals = [_bf16_bits_to_float(b) for b in vals]
        return vals[0] if count == 1 else tuple(vals)

    def store(self, off: int, val, count: int):
        self.check(off, count)
        vals = (val,) if count == 1 else val
        if self.bf16:
            vals = tuple(_float_to_bf16_bits(v) for v in vals)
        for i, v in enumerate(vals):
            self.data[off + i] = v


def buffer_view(ptr: int, dt: PtrDType, slot: int) -> Memory:
    if dt.size < 0:
        raise ValueError(f"PYTHON: buffer {slot} has no size in its DEFINE_GLOBAL ({dt})")
    base = dt.base.scalar
    nbytes = dt.size * base.itemsize * dt.base.count
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(ptr)) if nbytes else np.zeros(0, np.uint8)
    return Memory(raw.view(to_numpy_dtype(base)), base, f"data{slot}")


# ***** the interpreter *****


def _zero(dt: DType):
    z = truncate(dt.scalar, 0)
    return z if dt.count == 1 else (z,) * dt.count


def bitcast(x, frm: DType, to: DType):
    def to_bits(v, d):
        if d == dtypes.bfloat16:
            return struct.pack("<H", _float_to_bf16_bits(v))
        return struct.pack("<" + d.fmt, v)

    def from_bits(b, d):
        if d == dtypes.bfloat16:
            return _bf16_bits_to_float(struct.unpack("<H", b)[0])
        return struct.unpack("<" + d.fmt, b)[0]

    frm_vals = x if frm.count > 1 else (x,)
    raw = b"".join(to_bits(v, frm.scalar) for v in frm_vals)
    n = to.scalar.itemsize
    out = [from_bits(raw[i : i + n], to.scalar) for i in range(0, len(raw), n)]
    return tuple(out) if to.count > 1 else out[0]


def _alu_fn(op: Ops, dt: DType, srcs: tuple[int, ...], src_counts: tuple[int, ...]) -> Callable[[list], Any]:
    scalar = dt.scalar
    if dt.count == 1 and all(c == 1 for c in src_counts):
        if len(srcs) == 1:
            a = srcs[0]
            return lambda v: exec_alu(op, scalar, [v[a]])
        if len(srcs) == 2:
            a, b = srcs
            return lambda v: exec_alu(op, scalar, [v[a], v[b]])
        return lambda v: exec_alu(op, scalar, [v[s] for s in srcs])
    n = max((dt.count,) + src_counts)
    vec = tuple(c > 1 for c in src_counts)

    def fn(v):
        ops = [v[s] for s in srcs]
        return tuple(exec_alu(op, scalar, [o[lane] if isv else o for o, isv in zip(ops, vec)]) for lane in range(n))

    return fn


class PythonProgram(Program):
    """Parses the listing once; each call runs it (once per core_id when the kernel has one)."""

    def __init__(self, spec: ProgramSpec):
        super().__init__(spec)
        self.insts = parse(spec.src)
        self.compile()

    def compile(self):
        insts = self.insts
        n = len(insts)
        self.kind: list[int] = [0] * n  # 0 compute, 1 RANGE, 2 END, 3 LOAD, 4 STORE, 5 nothing
        self.fns: list[Any] = [None] * n
        self.consts: dict[int, Any] = {}
        self.globals: list[tuple[int, int, PtrDType]] = []  # (position, slot, dtype)
        self.regs: list[tuple[int, PtrDType]] = []
        self.var_pos: list[int] = []
        self.core_pos: list[int] = []
        self.end_of: dict[int, tuple[int, int]] = {}  # RANGE position -> (its END's position, its place there)
        self.end_ranges: dict[int, list[int]] = {}  # END position -> its RANGEs' positions, innermost first
        for i, (op, dt, src, arg) in enumerate(insts):
            if op is Ops.CONST:
                self.consts[i], self.kind[i] = arg, 5
            elif op is Ops.DEFINE_GLOBAL:
                self.globals.append((i, arg, dt))
                self.kind[i] = 5
            elif op is Ops.DEFINE_REG:
                self.regs.append((i, dt))
                self.kind[i] = 5
            elif op is Ops.DEFINE_VAR:
                self.var_pos.append(i)
                self.kind[i] = 5
            elif op is Ops.SPECIAL:
                if arg != "core_id":
                    raise NotImplementedError(f"PYTHON has no GPU index {arg!r}")
                self.core_pos.append(i)
                self.kind[i] = 5
            elif op is Ops.RANGE:
                self.kind[i], self.fns[i] = 1, src[0]
            elif op is Ops.END:
                rngs = [s for s in src[1:] if insts[s][0] is Ops.RANGE][::-1]
                self.end_ranges[i] = rngs
                for k, rp in enumerate(rngs):
                    self.end_of[rp] = (i, k)
                self.kind[i] = 2
            elif op in (Ops.GROUP, Ops.SINK):
                self.kind[i] = 5
            elif op is Ops.LOAD:
                self.kind[i], self.fns[i] = 3, (src[0], dt.count, dt)
            elif op is Ops.STORE:
                self.kind[i], self.fns[i] = 4, (src[0], src[1], insts[src[1]][1].count)
            else:
                self.fns[i] = self.compute_fn(i, op, dt, src, arg)

    def compute_fn(self, i: int, op: Ops, dt: DType, src: tuple[int, ...], arg) -> Callable[[list], Any]:
        insts = self.insts
        if op is Ops.AFTER:
            s0 = src[0]
            return lambda v: v[s0]
        if op is Ops.INDEX:
            buf, idx = src[0], src[1]
            valid = src[2] if len(src) > 2 else None
            ptr = insts[buf][1]  # a pointer: its element count per index step (vector-based registers)
            unit = ptr.base.count if isinstance(ptr, PtrDType) else 1
            return lambda v: (v[buf], v[idx] * unit, True if valid is None else v[valid])
        if op is Ops.VECTORIZE:
            return lambda v: tuple(v[s] for s in src)
        if op is Ops.GEP:
            s0 = src[0]
            if len(arg) == 1:
                lane = arg[0]
                return lambda v: v[s0][lane]
            return lambda v: tuple(v[s0][j] for j in arg)
        if op is Ops.CAST:
            s0, to, n = src[0], dt.scalar, dt.count
            if n == 1:
                return lambda v: truncate(to, v[s0])
            return lambda v: tuple(truncate(to, x) for x in v[s0])
        if op is Ops.BITCAST:
            s0, frm = src[0], insts[src[0]][1]
            return lambda v: bitcast(v[s0], frm, dt)
        if op in GroupOp.ALU:
            return _alu_fn(op, dt, src, tuple(insts[s][1].count for s in src))
        raise NotImplementedError(f"PYTHON has no rule for {op}")

    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        for core in range(self.spec.cores if self.core_pos else 1):
            self.run(ptrs, vals, core)

    def run(self, ptrs: tuple[int, ...], vals: tuple[int, ...], core: int):
        insts, kind, fns = self.insts, self.kind, self.fns
        v: list[Any] = [None] * len(insts)
        for i, c in self.consts.items():
            v[i] = c
        for i, slot, dt in self.globals:
            v[i] = buffer_view(ptrs[slot], dt, slot)
        for i, dt in self.regs:
            base = dt.base
            v[i] = Memory([_zero(base.scalar)] * (dt.size * base.count), base.scalar, f"reg{i}")
        for i, x in zip(self.var_pos, vals):
            v[i] = x
        for i in self.core_pos:
            v[i] = core
        pc, n = 0, len(insts)
        while pc < n:
            k = kind[pc]
            if k == 0:
                v[pc] = fns[pc](v)
            elif k == 3:  # LOAD
                idx, count, dt = fns[pc]
                mem, off, valid = v[idx]
                v[pc] = (
                    mem.load(off, count)
                    if _all(valid)
                    else _zero(dt)
                    if not _any(valid)
                    else tuple(mem.load(off + j, 1) if ok else _zero(dt.scalar) for j, ok in enumerate(valid))
                )
            elif k == 4:  # STORE
                idx, val, count = fns[pc]
                mem, off, valid = v[idx]
                if _all(valid):
                    mem.store(off, v[val], count)
                elif _any(valid):
                    for j, ok in enumerate(valid):
                        if ok:
                            mem.store(off + j, v[val][j], 1)
            elif k == 1:  # RANGE
                if v[fns[pc]] > 0:
                    v[pc] = 0
                else:  # no iterations: continue at its END, as if the loop had just finished
                    end, place = self.end_of[pc]
                    pc = self.close(v, end, place + 1)
                    continue
            elif k == 2:  # END
                pc = self.close(v, pc, 0)
                continue
            pc += 1

    def close(self, v: list, end: int, start: int) -> int:
        """The next pc after END `end`, stepping its loops from the start-th innermost outwards."""
        for rp in self.end_ranges[end][start:]:
            v[rp] += 1
            if v[rp] < v[self.fns[rp]]:
                return rp + 1
        return end + 1


def _all(valid) -> bool:
    return all(valid) if isinstance(valid, tuple) else bool(valid)


def _any(valid) -> bool:
    return any(valid) if isinstance(valid, tuple) else bool(valid)


class PythonCompiler(Compiler):
    key = "python"
    disk_cached = False  # the listing is the program

    def compile(self, src: str) -> bytes:
        return src.encode()


class PythonDevice(CompiledDevice):
    beam_timing = False  # an interpreter's time says nothing about compiled code
    shares_programs = True  # an interpreter of host memory (one device; the key is the same rule as CPU's)

    def build(self, spec: ProgramSpec) -> PythonProgram:
        return PythonProgram(spec)


def open_device(name: str) -> PythonDevice:
    if name != "PYTHON":
        raise ArgumentError(f"unknown PYTHON backend {name!r}; available: PYTHON")
    return PythonDevice(name, PythonRenderer(), PythonCompiler(), HostAllocator())
