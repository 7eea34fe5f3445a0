"""An LLVM IR renderer: linear UOps -> the text of one LLVM module with one function.

Values are SSA registers; loops are basic blocks (a header with a phi for the counter, a latch that increments it);
accumulators (DEFINE_REG) are allocas in the entry block, which the optimizer promotes to registers (SROA/mem2reg).
Types: bool is i1 in registers and i8 in memory, float16 is `half`, bfloat16 is i16 (codegen/lower.py computes bf16
math in float32 and converts with integer ops), vectors are `<n x T>`. Gated loads and stores branch around the access.
"""

from __future__ import annotations

import math
import struct

from zeptograd.dtype import DType, PtrDType, dtypes
from zeptograd.renderer import ProgramSpec, Renderer, reject_bf16_cast
from zeptograd.uop.ops import GroupOp, Ops, UOp

_SCALAR = {
    dtypes.bool: "i1",
    dtypes.int8: "i8",
    dtypes.uint8: "i8",
    dtypes.int16: "i16",
    dtypes.uint16: "i16",
    dtypes.int32: "i32",
    dtypes.uint32: "i32",
    dtypes.int64: "i64",
    dtypes.uint64: "i64",
    dtypes.float16: "half",
    dtypes.bfloat16: "i16",
    dtypes.float32: "float",
    dtypes.float64: "double",
}
_INTRINSIC_SUFFIX = {dtypes.float16: "f16", dtypes.float32: "f32", dtypes.float64: "f64"}
_UNARY_INTRINSIC = {
    Ops.EXP2: "exp2",
    Ops.LOG2: "log2",
    Ops.SIN: "sin",
    Ops.COS: "cos",
    Ops.TAN: "tan",
    Ops.SQRT: "sqrt",
    Ops.TRUNC: "trunc",
}


def _is_float(dt: DType) -> bool:  # computes as an LLVM float type (bfloat16 is only stored, as i16)
    return dt.scalar in (dtypes.float16, dtypes.float32, dtypes.float64)


def _signed(dt: DType) -> bool:
    return dtypes.is_int(dt) and not dtypes.is_unsigned(dt)


def ltype(dt: DType, mem: bool = False) -> str:
    """The LLVM type of a value of dt in a register (or in memory: bool is a byte there)."""
    if isinstance(dt, PtrDType):
        return "ptr"
    s = "i8" if mem and dt.scalar == dtypes.bool else _SCALAR[dt.scalar]
    return f"<{dt.count} x {s}>" if dt.count > 1 else s


def _const_scalar(x, dt: DType) -> str:
    dt = dt.scalar
    if dt == dtypes.bool:
        return "true" if x else "false"
    if _is_float(dt):  # the exact double, in hex: the value is representable in dt (codegen rounded it)
        if math.isnan(x):
            return "0x7FF8000000000000"
        return "0x%016X" % struct.unpack("<Q", struct.pack("<d", float(x)))[0]
    bits = 8 * dt.itemsize
    x = int(x) & ((1 << bits) - 1)
    return str(x - (1 << bits) if x >= 1 << (bits - 1) else x)


def render_const(x, dt: DType) -> str:
    """An LLVM constant of dt (x is one value; a vector type splats it)."""
    s = _const_scalar(x, dt)
    if dt.count == 1:
        return s
    return "<" + ", ".join(f"{_SCALAR[dt.scalar]} {s}" for _ in range(dt.count)) + ">"


def _suffix(dt: DType) -> str:
    """The type suffix of an overloaded intrinsic: f32, v16f32, i64, v4i1."""
    s = _INTRINSIC_SUFFIX.get(dt.scalar) or _SCALAR[dt.scalar]
    return f"v{dt.count}{s}" if dt.count > 1 else s


def _masked_intrinsic(kind: str, dt: DType) -> str:
    """llvm.masked.load or .store of a vector of dt in memory (bools are bytes there)."""
    return f"llvm.masked.{kind}.{_suffix(dtypes.uint8.vec(dt.count) if dt.scalar == dtypes.bool else dt)}.p0"


class LLVMRenderer(Renderer):
    device = "CPU"
    has_threads = True
    alu_transcendentals = True  # llvm.exp2.v16f32 is 16 libm calls; the polynomials stay vectors (4.5x on softmax)
    masked_vectors = True  # llvm.masked.load/store: one instruction with AVX-512's mask registers (AVX: vmaskmov)

    def __init__(self, simd_bytes: int = 64):
        self.simd_bytes = simd_bytes  # the device passes its host's (runtime/ops_llvm.py); 64 renders for AVX-512

    def keeps_vector(self, x: UOp) -> bool:
        return True  # LLVM has every op on vectors; the backend splits what the CPU lacks

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        return _Function(name).render(uops)


class _Function:
    """The state of rendering one kernel: value names, the current basic block, the declarations it needs."""

    def __init__(self, name: str):
        self.name = name
        self.r: dict[UOp, str] = {}
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.decls: set[str] = set()
        self.n = 0
        self.block = "entry"

    def tmp(self, prefix: str = "v") -> str:
        self.n += 1
        return f"%{prefix}{self.n}"

    def emit(self, line: str):
        self.lines.append("  " + line)

    def instr(self, rhs: str, prefix: str = "v") -> str:
        name = self.tmp(prefix)
        self.emit(f"{name} = {rhs}")
        return name

    def label(self, block: str):
        self.lines.append(f"{block}:")
        self.block = block

    def intrinsic(self, base: str, dt: DType, args: list[tuple[DType, str]], ret: DType | None = None) -> str:
        fn = f"llvm.{base}.{_suffix(dt)}"
        ret_t = ltype(ret if ret is not None else dt)
        self.decls.add(f"declare {ret_t} @{fn}({', '.join(ltype(t) for t, _ in args)})")
        return self.instr(f"call {ret_t} @{fn}({', '.join(f'{ltype(t)} {v}' for t, v in args)})")

    # --- conversions ---
    def cast(self, x: str, frm: DType, to: DType) -> str:
        n = to.count
        if frm.scalar == to.scalar:
            return x
        reject_bf16_cast(frm, to)
        ft, tt = ltype(frm), ltype(to)
        if to.scalar == dtypes.bool:  # nonzero (and NaN) is true, as in C
            op = "fcmp une" if _is_float(frm) else "icmp ne"
            return self.instr(f"{op} {ft} {x}, {render_const(0, frm)}")
        if _is_float(frm) and _is_float(to):
            return self.instr(f"{'fpext' if to.itemsize > frm.itemsize else 'fptrunc'} {ft} {x} to {tt}")
        if _is_float(to):
            return self.instr(f"{'sitofp' if _signed(frm) else 'uitofp'} {ft} {x} to {tt}")
        if _is_float(frm):  # to an int: truncate toward zero; narrow ints wrap around (through a wider int)
            if to.scalar == dtypes.uint64:
                return self.instr(f"fptoui {ft} {x} to {tt}")
            if to.scalar in (dtypes.int64, dtypes.int32):
                return self.instr(f"fptosi {ft} {x} to {tt}")
            wide = dtypes.int64 if to.scalar == dtypes.uint32 else dtypes.int32
            w = self.instr(f"fptosi {ft} {x} to {ltype(wide.vec(n))}")
            return self.instr(f"trunc {ltype(wide.vec(n))} {w} to {tt}")
        fb, tb = 1 if frm.scalar == dtypes.bool else 8 * frm.itemsize, 8 * to.itemsize
        if fb == tb:
            return x
        if fb > tb:
            return self.instr(f"trunc {ft} {x} to {tt}")
        return self.instr(f"{'sext' if _signed(frm) else 'zext'} {ft} {x} to {tt}")

    def bitcast(self, x: str, frm: DType, to: DType) -> str:
        if ltype(frm) == ltype(to):
            return x
        return self.instr(f"bitcast {ltype(frm)} {x} to {ltype(to)}")

    # --- memory ---
    def to_mem(self, x: str, dt: DType) -> str:
        return self.instr(f"zext {ltype(dt)} {x} to {ltype(dt, True)}") if dt.scalar == dtypes.bool else x

    def from_mem(self, x: str, dt: DType) -> str:
        return self.instr(f"trunc {ltype(dt, True)} {x} to {ltype(dt)}") if dt.scalar == dtypes.bool else x

    def load(self, ptr: str, dt: DType) -> str:
        v = self.instr(f"load {ltype(dt, True)}, ptr {ptr}, align {dt.scalar.itemsize}")
        return self.from_mem(v, dt)

    def store(self, ptr: str, val: str, dt: DType):
        m = self.to_mem(val, dt)
        self.emit(f"store {ltype(dt, True)} {m}, ptr {ptr}, align {dt.scalar.itemsize}")

    def masked_load(self, ptr: str, dt: DType, mask: str) -> str:
        """A vector load of the lanes where mask is true (0 in the others): llvm.masked.load."""
        mt, mk, fn = ltype(dt, True), ltype(dtypes.bool.vec(dt.count)), _masked_intrinsic("load", dt)
        self.decls.add(f"declare {mt} @{fn}(ptr, {mk}, {mt})")
        v = self.instr(f"call {mt} @{fn}(ptr align {dt.scalar.itemsize} {ptr}, {mk} {mask}, {mt} zeroinitializer)")
        return self.from_mem(v, dt)

    def masked_store(self, ptr: str, dt: DType, mask: str, val: str):
        """A vector store of the lanes where mask is true: llvm.masked.store."""
        mt, mk, fn = ltype(dt, True), ltype(dtypes.bool.vec(dt.count)), _masked_intrinsic("store", dt)
        m = self.to_mem(val, dt)
        self.decls.add(f"declare void @{fn}({mt}, ptr, {mk})")
        self.emit(f"call void @{fn}({mt} {m}, ptr align {dt.scalar.itemsize} {ptr}, {mk} {mask})")

    def gated(self, valid: str) -> tuple[str, str, str]:
        """Branch on valid: returns (the block before, the guarded block, the join block); emits up to the guard."""
        k = self.n = self.n + 1
        before, inside, join = self.block, f"gate{k}", f"gate{k}_end"
        self.emit(f"br i1 {valid}, label %{inside}, label %{join}")
        self.label(inside)
        return before, inside, join

    # --- the ALU ---
    def coerce(self, srcs: list[UOp], args: list[str], dt: DType) -> list[str]:
        """Operands converted to dt's scalar type (a bool compared with an int constant, as C would) and scalars
        splat to dt's width."""
        out = []
        for s, a in zip(srcs, args):
            sdt = dt.scalar.vec(s.dtype.count) if s.dtype.count > 1 else dt.scalar
            if s.dtype.scalar != dt.scalar:
                a = render_const(s.arg, sdt) if s.op is Ops.CONST else self.cast(a, s.dtype, sdt)
            if dt.count > 1 and s.dtype.count == 1:
                if s.op is Ops.CONST:
                    a = render_const(s.arg, dt)
                else:
                    one = self.instr(f"insertelement <1 x {ltype(dt.scalar)}> poison, {ltype(dt.scalar)} {a}, i32 0")
                    a = self.instr(
                        f"shufflevector <1 x {ltype(dt.scalar)}> {one}, <1 x {ltype(dt.scalar)}> poison, "
                        f"<{dt.count} x i32> zeroinitializer"
                    )
            out.append(a)
        return out

    def alu(self, op: Ops, dt: DType, srcs: list[UOp], args: list[str]) -> str:
        if op is Ops.WHERE:
            args = args[:1] + self.coerce(srcs[1:], args[1:], dt)
        elif len(srcs) > 1:
            width = max(s.dtype.count for s in srcs)
            base = dt.scalar if op is Ops.MULACC else srcs[0].dtype.scalar
            args = self.coerce(srcs, args, base.vec(width) if width > 1 else base)
        sdt = srcs[0].dtype.scalar.vec(max(s.dtype.count for s in srcs)) if srcs else dt
        if sdt.count == 1:
            sdt = srcs[0].dtype if srcs else dt
        t = ltype(sdt)
        isf = _is_float(sdt)
        is_bool = sdt.scalar == dtypes.bool
        if op in _UNARY_INTRINSIC:
            return self.intrinsic(_UNARY_INTRINSIC[op], dt, [(dt, args[0])])
        if op is Ops.RECIPROCAL:
            return self.instr(f"fdiv {t} {render_const(1.0, sdt)}, {args[0]}")
        if op is Ops.NEG:
            if isf:
                return self.instr(f"fneg {t} {args[0]}")
            if is_bool:  # not x
                return self.instr(f"xor {t} {args[0]}, {render_const(True, sdt)}")
            return self.instr(f"sub {t} {render_const(0, sdt)}, {args[0]}")
        a = args
        if op is Ops.WHERE:
            return self.instr(f"select {ltype(sdt)} {a[0]}, {ltype(dt)} {a[1]}, {ltype(dt)} {a[2]}")
        if op is Ops.MULACC:
            if isf:
                return self.intrinsic("fma", dt, [(dt, a[0]), (dt, a[1]), (dt, a[2])])
            m = self.alu(Ops.MUL, dt, srcs[:2], a[:2])
            return self.alu(Ops.ADD, dt, srcs[1:], [m, a[2]])
        if op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ):
            if isf:
                pred = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}[op]
                return self.instr(f"fcmp {pred} {t} {a[0]}, {a[1]}")
            pred = {Ops.CMPLT: "slt" if _signed(sdt) else "ult", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[op]
            return self.instr(f"icmp {pred} {t} {a[0]}, {a[1]}")
        if op is Ops.MAX:
            if isf:  # NaN-propagating, as the PYTHON reference
                return self.intrinsic("maximum", dt, [(dt, a[0]), (dt, a[1])])
            if is_bool:
                return self.instr(f"or {t} {a[0]}, {a[1]}")
            return self.intrinsic("smax" if _signed(sdt) else "umax", dt, [(dt, a[0]), (dt, a[1])])
        if isf:
            instr = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}[op]
        elif is_bool and op in (Ops.ADD, Ops.MUL, Ops.SUB):
            instr = {Ops.ADD: "or", Ops.MUL: "and", Ops.SUB: "xor"}[op]
        else:
            instr = {
                Ops.ADD: "add",
                Ops.SUB: "sub",
                Ops.MUL: "mul",
                Ops.IDIV: "sdiv" if _signed(sdt) else "udiv",
                Ops.MOD: "srem" if _signed(sdt) else "urem",
                Ops.AND: "and",
                Ops.OR: "or",
                Ops.XOR: "xor",
                Ops.SHL: "shl",
                Ops.SHR: "ashr" if _signed(sdt) else "lshr",
            }[op]
        return self.instr(f"{instr} {t} {a[0]}, {a[1]}")

    # --- the walk ---
    def render(self, uops: list[UOp]) -> ProgramSpec:
        r = self.r
        bufs: list[tuple[int, str]] = []
        var_names: list[str] = []
        specials: list[UOp] = []
        loops: dict[UOp, tuple[str, str]] = {}  # RANGE -> (its index, its block prefix)
        for u in uops:
            op, dt, src = u.op, u.dtype, u.src
            if op is Ops.DEFINE_GLOBAL:
                r[u] = f"%data{u.arg}"
                bufs.append((u.arg, f"ptr noalias align 64 %data{u.arg}"))
            elif op is Ops.DEFINE_VAR:
                r[u] = f"%var_{u.arg[0]}"
                var_names.append(u.arg[0])
            elif op is Ops.SPECIAL:
                if u.arg != "core_id":
                    raise NotImplementedError(f"the LLVM (CPU) renderer has no GPU index {u.arg!r}")
                r[u] = "%core_id"
                specials.append(u)
            elif op is Ops.CONST:
                r[u] = render_const(u.arg, dt)
            elif op is Ops.VECTORIZE:
                if all(s.op is Ops.CONST for s in src):
                    r[u] = "<" + ", ".join(f"{ltype(s.dtype)} {r[s]}" for s in src) + ">"
                    continue
                vec, st = "poison", ltype(dt.scalar)
                for i, s in enumerate(src):
                    vec = self.instr(f"insertelement {ltype(dt)} {vec}, {st} {r[s]}, i32 {i}")
                r[u] = vec
            elif op is Ops.GEP:
                vt = ltype(src[0].dtype)
                if len(u.arg) == 1:
                    r[u] = self.instr(f"extractelement {vt} {r[src[0]]}, i32 {u.arg[0]}")
                else:
                    mask = ", ".join(f"i32 {i}" for i in u.arg)
                    r[u] = self.instr(f"shufflevector {vt} {r[src[0]]}, {vt} poison, <{len(u.arg)} x i32> <{mask}>")
            elif op is Ops.DEFINE_REG:
                assert isinstance(dt, PtrDType), "a DEFINE_REG is a pointer to its registers"
                r[u] = self.tmp("acc")
                self.allocas.append(f"{r[u]} = alloca {ltype(dt.base, True)}, i32 {dt.size}, align 64")
            elif op is Ops.RANGE:
                k = self.n = self.n + 1
                counter, blk, before = f"%ridx{k}", f"loop{k}", self.block
                loops[u] = (counter, blk)
                r[u] = counter
                self.emit(f"br label %{blk}")
                self.label(blk)
                self.emit(f"{counter} = phi {ltype(dt)} [ 0, %{before} ], [ {counter}_next, %{blk}_latch ]")
                cond = self.instr(f"icmp slt {ltype(dt)} {counter}, {r[src[0]]}")
                self.emit(f"br i1 {cond}, label %{blk}_body, label %{blk}_exit")
                self.label(f"{blk}_body")
            elif op is Ops.END:
                for rng in reversed([s for s in src[1:] if s.op is Ops.RANGE]):
                    counter, blk = loops[rng]
                    self.emit(f"br label %{blk}_latch")
                    self.label(f"{blk}_latch")
                    self.emit(f"{counter}_next = add nuw nsw {ltype(rng.dtype)} {counter}, 1")
                    self.emit(f"br label %{blk}")
                    self.label(f"{blk}_exit")
            elif op is Ops.AFTER:
                r[u] = r[src[0]]
            elif op in (Ops.GROUP, Ops.SINK):
                pass
            elif op is Ops.INDEX:
                ptr_dt = src[0].dtype
                assert isinstance(ptr_dt, PtrDType), "an INDEX indexes a pointer"
                if src[1].op is Ops.CONST and src[1].arg == 0:
                    r[u] = r[src[0]]
                else:
                    inb = "" if len(src) > 2 else "inbounds "  # a gated index may point outside the buffer
                    offset = f"{ltype(src[1].dtype)} {r[src[1]]}"  # i32, or i64 for index math past 2**31
                    r[u] = self.instr(f"getelementptr {inb}{ltype(ptr_dt.base, True)}, ptr {r[src[0]]}, {offset}")
            elif op is Ops.LOAD:
                idx = src[0]
                if len(idx.src) > 2:  # gated: 0 where the index is not valid
                    valid = idx.src[2]
                    if valid.dtype.count > 1:
                        r[u] = self.masked_load(r[idx], dt, r[valid])
                        continue
                    before, inside, join = self.gated(r[valid])
                    v = self.load(r[idx], dt)
                    inner = self.block
                    self.emit(f"br label %{join}")
                    self.label(join)
                    r[u] = self.instr(f"phi {ltype(dt)} [ {v}, %{inner} ], [ zeroinitializer, %{before} ]")
                else:
                    r[u] = self.load(r[idx], dt)
            elif op is Ops.STORE:
                idx, val = src
                if len(idx.src) > 2:
                    valid = idx.src[2]
                    if valid.dtype.count > 1:
                        self.masked_store(r[idx], val.dtype, r[valid], r[val])
                        continue
                    _, _, join = self.gated(r[valid])
                    self.store(r[idx], r[val], val.dtype)
                    self.emit(f"br label %{join}")
                    self.label(join)
                else:
                    self.store(r[idx], r[val], val.dtype)
            elif op is Ops.CAST:
                r[u] = self.cast(r[src[0]], src[0].dtype, dt)
            elif op is Ops.BITCAST:
                r[u] = self.bitcast(r[src[0]], src[0].dtype, dt)
            elif op in GroupOp.ALU:
                r[u] = self.alu(op, dt, list(src), [r[s] for s in src])
            else:
                raise NotImplementedError(f"the LLVM renderer has no rule for {op}")
        params = [a for _, a in sorted(bufs)] + [f"i32 %var_{v}" for v in var_names]
        params += ["i32 %core_id"] if specials else []
        body = ["entry:"] + ["  " + a for a in self.allocas] + self.lines + ["  ret void"]
        src_text = (
            "\n".join(sorted(self.decls))
            + ("\n\n" if self.decls else "")
            + f"define void @{self.name}({', '.join(params)}) nounwind {{\n"
            + "\n".join(body)
            + "\n}\n"
        )
        cores = specials[0].src[0].arg if specials else 1
        return ProgramSpec(self.name, src_text, len(bufs), tuple(var_names), global_size=(cores, 1, 1))
