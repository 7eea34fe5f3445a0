"""An LLVM IR renderer: linear UOps -> the text of one LLVM module with one function.

Values are SSA registers; loops are basic blocks (a header with a phi for the counter, a latch that increments it);
accumulators (DEFINE_REG) are allocas in the entry block, which the optimizer promotes to registers (SROA/mem2reg).
Types: bool is i1 in registers and i8 in memory, float16 is `half`, bfloat16 is i16 (codegen/lower.py computes bf16
math in float32 and converts with integer ops), vectors are `<n x T>`. Gated loads and stores branch around the access.

Which instructions a UOp becomes is a rule table, as the C family's: `llvm_rules`, a PatternMatcher of `(UPat, fn)`
rules whose ctx is the kernel's `_Function` (its SSA names, its current basic block, its parameters and declarations:
an instruction's text depends on that state, so a rule emits its instructions and returns the value's name), and
for the ALU ops `_ALU`, a table of op -> function of the coerced operands.
"""

from __future__ import annotations

import math
import struct
from typing import Callable, NamedTuple

from zeptograd.dtype import DType, PtrDType, dtypes
from zeptograd.renderer import ProgramSpec, Renderer, reject_bf16_cast
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat

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
    alu_transcendentals = frozenset(GroupOp.Approximated)  # llvm.exp2.v16f32 is 16 libm calls (4.5x on softmax)
    masked_vectors = True  # llvm.masked.load/store: one instruction with AVX-512's mask registers (AVX: vmaskmov)
    prefetches = True  # llvm.prefetch

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
        self.bufs: list[tuple[int, str]] = []  # (DEFINE_GLOBAL index, parameter)
        self.var_names: list[str] = []
        self.specials: list[UOp] = []
        self.loops: dict[UOp, tuple[str, str]] = {}  # RANGE -> (its counter, its block prefix)

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
        """The ALU op on its operands, coerced to one type (the sources' type: compares give bools), by `_ALU`."""
        if op is Ops.WHERE:
            args = args[:1] + self.coerce(srcs[1:], args[1:], dt)
        elif len(srcs) > 1:
            width = max(s.dtype.count for s in srcs)
            base = dt.scalar if op is Ops.MULACC else srcs[0].dtype.scalar
            args = self.coerce(srcs, args, base.vec(width) if width > 1 else base)
        sdt = srcs[0].dtype.scalar.vec(max(s.dtype.count for s in srcs)) if srcs else dt
        if sdt.count == 1:
            sdt = srcs[0].dtype if srcs else dt
        return _ALU[op](self, _Operands(op, dt, sdt, srcs, args))

    # --- the walk: each UOp's instructions from the first rule of `llvm_rules` that matches ---
    def render(self, uops: list[UOp]) -> ProgramSpec:
        for u in uops:
            value = llvm_rules.rewrite(u, self)
            if value is None:
                raise NotImplementedError(f"the LLVM renderer has no rule for {u.op}")
            assert isinstance(value, str)
            if value:  # a value's name or constant; "" for an op that only emits (STORE, END)
                self.r[u] = value
        params = [a for _, a in sorted(self.bufs)] + [f"i32 %var_{v}" for v in self.var_names]
        params += ["i32 %core_id"] if self.specials else []
        body = ["entry:"] + ["  " + a for a in self.allocas] + self.lines + ["  ret void"]
        src_text = (
            "\n".join(sorted(self.decls))
            + ("\n\n" if self.decls else "")
            + f"define void @{self.name}({', '.join(params)}) nounwind {{\n"
            + "\n".join(body)
            + "\n}\n"
        )
        cores = self.specials[0].src[0].arg if self.specials else 1
        return ProgramSpec(self.name, src_text, len(self.bufs), tuple(self.var_names), global_size=(cores, 1, 1))


# ***** the rules: (ctx, the UOp's parts) -> the value's name (or a constant), "" where the op is only emitted *****


def _define_global(ctx: _Function, x: UOp) -> str:
    ctx.bufs.append((x.arg, f"ptr noalias align 64 %data{x.arg}"))
    return f"%data{x.arg}"


def _define_var(ctx: _Function, x: UOp) -> str:
    ctx.var_names.append(x.arg[0])
    return f"%var_{x.arg[0]}"


def _special(ctx: _Function, x: UOp) -> str:
    if x.arg != "core_id":
        raise NotImplementedError(f"the LLVM (CPU) renderer has no GPU index {x.arg!r}")
    ctx.specials.append(x)
    return "%core_id"


def _vectorize(ctx: _Function, x: UOp) -> str:
    vec, st = "poison", ltype(x.dtype.scalar)
    for i, s in enumerate(x.src):
        vec = ctx.instr(f"insertelement {ltype(x.dtype)} {vec}, {st} {ctx.r[s]}, i32 {i}")
    return vec


def _shuffle(ctx: _Function, x: UOp, v: UOp) -> str:
    vt, mask = ltype(v.dtype), ", ".join(f"i32 {i}" for i in x.arg)
    return ctx.instr(f"shufflevector {vt} {ctx.r[v]}, {vt} poison, <{len(x.arg)} x i32> <{mask}>")


def _define_reg(ctx: _Function, x: UOp) -> str:
    dt = x.dtype
    assert isinstance(dt, PtrDType), "a DEFINE_REG is a pointer to its registers"
    acc = ctx.tmp("acc")
    ctx.allocas.append(f"{acc} = alloca {ltype(dt.base, True)}, i32 {dt.size}, align 64")
    return acc


def _range(ctx: _Function, x: UOp, n: UOp) -> str:
    """the loop's header block: the counter's phi (0 from the block before, +1 from the latch) and the exit test"""
    k = ctx.n = ctx.n + 1
    counter, blk, before = f"%ridx{k}", f"loop{k}", ctx.block
    ctx.loops[x] = (counter, blk)
    ctx.emit(f"br label %{blk}")
    ctx.label(blk)
    ctx.emit(f"{counter} = phi {ltype(x.dtype)} [ 0, %{before} ], [ {counter}_next, %{blk}_latch ]")
    cond = ctx.instr(f"icmp slt {ltype(x.dtype)} {counter}, {ctx.r[n]}")
    ctx.emit(f"br i1 {cond}, label %{blk}_body, label %{blk}_exit")
    ctx.label(f"{blk}_body")
    return counter


def _end(ctx: _Function, x: UOp) -> str:
    """each loop it closes, innermost first: the latch (counter + 1, back to the header), then the exit block"""
    for rng in reversed([s for s in x.src[1:] if s.op is Ops.RANGE]):
        counter, blk = ctx.loops[rng]
        ctx.emit(f"br label %{blk}_latch")
        ctx.label(f"{blk}_latch")
        ctx.emit(f"{counter}_next = add nuw nsw {ltype(rng.dtype)} {counter}, 1")
        ctx.emit(f"br label %{blk}")
        ctx.label(f"{blk}_exit")
    return ""


def _index(ctx: _Function, x: UOp, p: UOp, i: UOp) -> str:
    assert isinstance(p.dtype, PtrDType), "an INDEX indexes a pointer"
    inb = "" if len(x.src) > 2 else "inbounds "  # a gated index may point outside the buffer
    offset = f"{ltype(i.dtype)} {ctx.r[i]}"  # i32, or i64 for index math past 2**31
    return ctx.instr(f"getelementptr {inb}{ltype(p.dtype.base, True)}, ptr {ctx.r[p]}, {offset}")


def _prefetch(ctx: _Function, x: UOp, p: UOp, i: UOp) -> str:
    """a read hint for the cache: its address without `inbounds` (the next row of the last may be past the buffer)"""
    assert isinstance(p.dtype, PtrDType), "a PREFETCH indexes a pointer"
    ptr = ctx.instr(f"getelementptr {ltype(p.dtype.base, True)}, ptr {ctx.r[p]}, {ltype(i.dtype)} {ctx.r[i]}")
    ctx.decls.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    # a read (arg True: a write), kept in all cache levels, of data
    ctx.emit(f"call void @llvm.prefetch.p0(ptr {ptr}, i32 {int(bool(x.arg))}, i32 3, i32 1)")
    return ""


def _gated_load(ctx: _Function, x: UOp, idx: UOp, valid: UOp) -> str:
    """0 where the index is not valid: a branch around the load, a phi after it"""
    before, _, join = ctx.gated(ctx.r[valid])
    v = ctx.load(ctx.r[idx], x.dtype)
    inner = ctx.block
    ctx.emit(f"br label %{join}")
    ctx.label(join)
    return ctx.instr(f"phi {ltype(x.dtype)} [ {v}, %{inner} ], [ zeroinitializer, %{before} ]")


def _gated_store(ctx: _Function, idx: UOp, valid: UOp, v: UOp) -> str:
    _, _, join = ctx.gated(ctx.r[valid])
    ctx.store(ctx.r[idx], ctx.r[v], v.dtype)
    ctx.emit(f"br label %{join}")
    ctx.label(join)
    return ""


def _is_vector(u: UOp) -> bool:
    return u.dtype.count > 1


# INDEX(p, i, gate): the gate by its lanes (one gate: a branch; a vector of gates: a masked access)
_GATED = UPat(Ops.INDEX, src=(UPat(), UPat(), UPat.var("valid")), name="idx")
_VECTOR_GATED = UPat(Ops.INDEX, src=(UPat(), UPat(), UPat(custom=_is_vector, name="valid")), name="idx")

llvm_rules = PatternMatcher(
    [
        # DEFINE_GLOBAL n -> a `ptr noalias` parameter %data<n>; DEFINE_VAR v -> an i32 parameter %var_<v>
        (UPat(Ops.DEFINE_GLOBAL, name="x"), _define_global),
        (UPat(Ops.DEFINE_VAR, name="x"), _define_var),
        # SPECIAL core_id -> the last i32 parameter (GPU indices: none on a CPU)
        (UPat(Ops.SPECIAL, name="x"), _special),
        # CONST -> its literal (a vector's splatted)
        (UPat(Ops.CONST, name="x"), lambda x: render_const(x.arg, x.dtype)),
        # VECTORIZE(consts) -> a vector literal; VECTORIZE(a, b, ...) -> insertelement per lane
        (
            UPat(Ops.VECTORIZE, custom=lambda u: all(s.op is Ops.CONST for s in u.src), name="x"),
            lambda ctx, x: "<" + ", ".join(f"{ltype(s.dtype)} {ctx.r[s]}" for s in x.src) + ">",
        ),
        (UPat(Ops.VECTORIZE, name="x"), _vectorize),
        # GEP(v, (i,)) -> extractelement ; GEP(v, lanes) -> shufflevector
        (
            UPat(Ops.GEP, src=(UPat.var("v"),), custom=lambda u: len(u.arg) == 1, name="x"),
            lambda ctx, x, v: ctx.instr(f"extractelement {ltype(v.dtype)} {ctx.r[v]}, i32 {x.arg[0]}"),
        ),
        (UPat(Ops.GEP, src=(UPat.var("v"),), name="x"), _shuffle),
        # DEFINE_REG -> an alloca in the entry block (promoted to registers by the optimizer)
        (UPat(Ops.DEFINE_REG, name="x"), _define_reg),
        # RANGE(n) -> a loop's header and body blocks ; END(x, ranges) -> their latches and exits
        (UPat(Ops.RANGE, src=(UPat.var("n"),), allow_any_len=True, name="x"), _range),
        (UPat(Ops.END, name="x"), _end),
        # AFTER(x, deps) -> x (ordering only) ; GROUP, SINK -> nothing
        (UPat(Ops.AFTER, src=(UPat.var("x"),), allow_any_len=True), lambda ctx, x: ctx.r[x]),
        (UPat((Ops.GROUP, Ops.SINK)), lambda: ""),
        # INDEX(p, 0) -> p ; INDEX(p, i[, gate]) -> getelementptr (inbounds unless gated)
        (UPat(Ops.INDEX, src=(UPat.var("p"), UPat.const(None, 0)), allow_any_len=True), lambda ctx, p: ctx.r[p]),
        (UPat(Ops.INDEX, src=(UPat.var("p"), UPat.var("i")), allow_any_len=True, name="x"), _index),
        # PREFETCH(INDEX(p, i)) -> llvm.prefetch of p + i (arg True: for writing)
        (UPat(Ops.PREFETCH, src=(UPat(Ops.INDEX, src=(UPat.var("p"), UPat.var("i"))),), name="x"), _prefetch),
        # LOAD(INDEX(p, i, gates)) -> llvm.masked.load ; LOAD(INDEX(p, i, gate)) -> a branch ; LOAD(idx) -> load
        (
            UPat(Ops.LOAD, src=(_VECTOR_GATED,), allow_any_len=True, name="x"),
            lambda ctx, x, idx, valid: ctx.masked_load(ctx.r[idx], x.dtype, ctx.r[valid]),
        ),
        (UPat(Ops.LOAD, src=(_GATED,), allow_any_len=True, name="x"), _gated_load),
        (
            UPat(Ops.LOAD, src=(UPat.var("idx"),), allow_any_len=True, name="x"),
            lambda ctx, x, idx: ctx.load(ctx.r[idx], x.dtype),
        ),
        # STORE(INDEX(p, i, gates), v) -> llvm.masked.store ; with one gate -> a branch ; STORE(idx, v) -> store
        (
            UPat(Ops.STORE, src=(_VECTOR_GATED, UPat.var("v"))),
            lambda ctx, idx, valid, v: ctx.masked_store(ctx.r[idx], v.dtype, ctx.r[valid], ctx.r[v]) or "",
        ),
        (UPat(Ops.STORE, src=(_GATED, UPat.var("v"))), _gated_store),
        (
            UPat(Ops.STORE, src=(UPat.var("idx"), UPat.var("v"))),
            lambda ctx, idx, v: ctx.store(ctx.r[idx], ctx.r[v], v.dtype) or "",
        ),
        # CAST, BITCAST -> the conversion instructions ; ALU ops -> `alu`
        (UPat(Ops.CAST, src=(UPat.var("a"),), name="x"), lambda ctx, x, a: ctx.cast(ctx.r[a], a.dtype, x.dtype)),
        (UPat(Ops.BITCAST, src=(UPat.var("a"),), name="x"), lambda ctx, x, a: ctx.bitcast(ctx.r[a], a.dtype, x.dtype)),
        (UPat(GroupOp.ALU, name="x"), lambda ctx, x: ctx.alu(x.op, x.dtype, list(x.src), [ctx.r[s] for s in x.src])),
    ]
)


# ***** the ALU ops: (the function, its operands) -> the value's name *****


class _Operands(NamedTuple):
    op: Ops
    dt: DType  # the result's type
    sdt: DType  # the operands' type (a compare's result is a bool of their width)
    srcs: list[UOp]
    a: list[str]  # the operands' names, coerced to sdt

    @property
    def t(self) -> str:
        return ltype(self.sdt)


def _neg(f: _Function, o: _Operands) -> str:
    if _is_float(o.sdt):
        return f.instr(f"fneg {o.t} {o.a[0]}")
    if dtypes.is_bool(o.sdt):  # not x
        return f.instr(f"xor {o.t} {o.a[0]}, {render_const(True, o.sdt)}")
    return f.instr(f"sub {o.t} {render_const(0, o.sdt)}, {o.a[0]}")


def _mulacc(f: _Function, o: _Operands) -> str:
    """a*b+c: llvm.fma for floats (one rounding, as the reference's fused multiply-add); mul and add for ints"""
    if _is_float(o.sdt):
        return f.intrinsic("fma", o.dt, [(o.dt, a) for a in o.a])
    m = f.alu(Ops.MUL, o.dt, o.srcs[:2], o.a[:2])
    return f.alu(Ops.ADD, o.dt, o.srcs[1:], [m, o.a[2]])


def _compare(f: _Function, o: _Operands) -> str:
    if _is_float(o.sdt):  # ordered: NaN < x and NaN == x are false; unordered: NaN != x is true
        pred = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}[o.op]
        return f.instr(f"fcmp {pred} {o.t} {o.a[0]}, {o.a[1]}")
    pred = {Ops.CMPLT: "slt" if _signed(o.sdt) else "ult", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}[o.op]
    return f.instr(f"icmp {pred} {o.t} {o.a[0]}, {o.a[1]}")


def _max(f: _Function, o: _Operands) -> str:
    if _is_float(o.sdt):  # the reference's max(a, b): a NaN b, else b where b > a, else a (NaN a and ties: a)
        # x86: one maxps (b > a ? b : a), a compare and a blend; llvm.maximum took two blends more (it orders -0 below
        # +0, which the reference does not: max(-0, +0) is -0); a max reduce's loop is these 3 ops a vector
        a, b = o.a
        mask = ltype(dtypes.bool.vec(o.dt.count))
        bigger = f.instr(f"select {mask} {f.instr(f'fcmp ogt {o.t} {b}, {a}')}, {o.t} {b}, {o.t} {a}")
        return f.instr(f"select {mask} {f.instr(f'fcmp uno {o.t} {b}, {b}')}, {o.t} {b}, {o.t} {bigger}")
    if dtypes.is_bool(o.sdt):
        return f.instr(f"or {o.t} {o.a[0]}, {o.a[1]}")
    return f.intrinsic("smax" if _signed(o.sdt) else "umax", o.dt, [(o.dt, o.a[0]), (o.dt, o.a[1])])


def _unary_intrinsic(f: _Function, o: _Operands) -> str:
    return f.intrinsic(_UNARY_INTRINSIC[o.op], o.dt, [(o.dt, o.a[0])])


_FLOAT_INSTR = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
_BOOL_INSTR = {Ops.ADD: "or", Ops.MUL: "and", Ops.SUB: "xor"}
_INT_INSTR = {
    Ops.ADD: "add",
    Ops.SUB: "sub",
    Ops.MUL: "mul",
    Ops.AND: "and",
    Ops.OR: "or",
    Ops.XOR: "xor",
    Ops.SHL: "shl",
}
_SIGNED_INSTR = {Ops.IDIV: ("sdiv", "udiv"), Ops.MOD: ("srem", "urem"), Ops.SHR: ("ashr", "lshr")}  # (signed, unsigned)


def _binary(f: _Function, o: _Operands) -> str:
    """one instruction: float arithmetic, bool arithmetic as logic, int ops (signed or unsigned where they differ)"""
    if _is_float(o.sdt):
        instr = _FLOAT_INSTR[o.op]
    elif dtypes.is_bool(o.sdt) and o.op in _BOOL_INSTR:
        instr = _BOOL_INSTR[o.op]
    elif o.op in _SIGNED_INSTR:
        instr = _SIGNED_INSTR[o.op][0 if _signed(o.sdt) else 1]
    else:
        instr = _INT_INSTR[o.op]
    return f.instr(f"{instr} {o.t} {o.a[0]}, {o.a[1]}")


_ALU: dict[Ops, Callable[[_Function, _Operands], str]] = {
    # EXP2/LOG2/SIN/COS/TAN/SQRT/TRUNC -> llvm.<name>.<type>
    **{op: _unary_intrinsic for op in _UNARY_INTRINSIC},
    # 1/x -> fdiv 1.0, x
    Ops.RECIPROCAL: lambda f, o: f.instr(f"fdiv {o.t} {render_const(1.0, o.sdt)}, {o.a[0]}"),
    Ops.NEG: _neg,
    # where(c, a, b) -> select
    Ops.WHERE: lambda f, o: f.instr(f"select {o.t} {o.a[0]}, {ltype(o.dt)} {o.a[1]}, {ltype(o.dt)} {o.a[2]}"),
    Ops.MULACC: _mulacc,
    **{op: _compare for op in (Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ)},
    Ops.MAX: _max,
    **{op: _binary for op in {*_FLOAT_INSTR, *_INT_INSTR, *_SIGNED_INSTR}},
}
