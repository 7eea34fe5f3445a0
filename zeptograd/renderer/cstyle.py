"""The C family's statement loop and its shared rule table, and the C dialect (gcc) as rules put before them.

Each linear UOp becomes one line of C or an expression inlined where it is used; which string comes from a
`PatternMatcher` of `(UPat, fn)` rules (tinygrad's `base_rewrite`); OpenCL and CUDA (`gpu.py`) are other rule lists
before the same shared ones, on the same loop."""

from __future__ import annotations

import math
from typing import Any, Callable, Generic, TypeVar

from zeptograd.dtype import DType, PtrDType, dtypes
from zeptograd.renderer import ProgramSpec, Renderer, loop_var, reject_bf16_cast, wrapping_dtype
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat

C_TYPES = {
    dtypes.bool: "_Bool",
    dtypes.int8: "signed char",
    dtypes.uint8: "unsigned char",
    dtypes.int16: "short",
    dtypes.uint16: "unsigned short",
    dtypes.int32: "int",
    dtypes.uint32: "unsigned int",
    dtypes.int64: "long long",
    dtypes.uint64: "unsigned long long",
    dtypes.float16: "_Float16",
    dtypes.bfloat16: "unsigned short",
    dtypes.float32: "float",
    dtypes.float64: "double",
}

PRELUDE = "#include <math.h>\n"


def _float_fn(name: str) -> Callable[[DType, str], str]:
    return lambda dt, a: (
        f"{name}f({a})"
        if dt == dtypes.float32
        else f"{name}({a})"
        if dt == dtypes.float64
        else f"({C_TYPES[dt]}){name}f((float){a})"
    )


def _c_max(dt: DType, a: str, b: str) -> str:
    """the reference's max(a, b): b where b > a or b is NaN, else a. NaN wins (numpy and torch propagate it; `b > a`
    alone would return a NaN b's other operand) and a tie is a, so max(-0, +0) is -0 as torch's."""
    nan_b = f"||({b}!={b})" if dtypes.is_float(dt) else ""
    return f"((({b}>{a}){nan_b})?{b}:{a})"


# ***** the C family: one statement loop driven by a table of rules *****


class Stmts(str):
    """A value rule's output that is already whole statements declaring the value (emitted as written)."""


R = TypeVar("R", bound="CFamilyRenderer")


class RenderContext(Generic[R]):
    """One kernel's rendering state, the `ctx` of the rules: the names already rendered and the kernel's parameters.
    Generic in the renderer, so that a dialect's rules are checked against that dialect's hooks."""

    def __init__(self, ren: R, uops: list[UOp]):
        self.ren = ren
        self.r: dict[UOp, str] = {}  # each UOp's C expression or variable name
        self.counts: dict[str, int] = {}
        self.args: list[tuple[int, str]] = []  # (DEFINE_GLOBAL index, parameter)
        self.var_names: list[str] = []
        self.special: list[UOp] = []
        self.vector_types: set[DType] = set()  # vectors the rules name beyond the kernel's dtypes: typedefs
        self.masks: dict[UOp, tuple[str, int]] = {}  # a bool vector that is a compare's mask: (its name, lane bytes)
        self.has_local = any(u.op is Ops.SPECIAL and u.arg.startswith("lidx") for u in uops)

    def __getitem__(self, u: UOp) -> str:
        return self.r[u]

    def new_name(self, prefix: str) -> str:
        self.counts[prefix] = self.counts.get(prefix, 0) + 1
        return f"{prefix}{self.counts[prefix] - 1}"


_EXPRESSION_OPS = (Ops.CONST, Ops.INDEX, Ops.AFTER)  # inlined where used; a one-lane GEP too
_VALUE_PREFIX = {Ops.LOAD: "val", Ops.CAST: "cast", Ops.BITCAST: "bits", Ops.VECTORIZE: "vec", Ops.GEP: "vec"}
_NAMED = {
    Ops.RANGE: loop_var,
    Ops.SPECIAL: lambda u: u.arg,
    Ops.DEFINE_LOCAL: lambda u: u.arg,
    Ops.DEFINE_GLOBAL: lambda u: f"data{u.arg}",
    Ops.DEFINE_VAR: lambda u: f"var_{u.arg[0]}",  # prefixed: a Variable's name never meets a C keyword or a local
}


def _define_reg(ctx: RenderContext[CFamilyRenderer], x: UOp) -> str:
    dt = x.dtype
    assert isinstance(dt, PtrDType), "a DEFINE_REG is a pointer to its registers"
    acc, base = ctx[x], ctx.ren.render_dtype(dt.base)
    if dt.size == 1:  # a plain variable, so the compiler keeps it in a register
        ctx.r[x] = f"(&{acc})"
        return f"{base} {acc};"
    return f"{base} {acc}[{dt.size}];"


def _define_global(ctx: RenderContext[CFamilyRenderer], x: UOp) -> str:
    assert isinstance(x.dtype, PtrDType), "a DEFINE_GLOBAL is a pointer"
    ctx.args.append((x.arg, ctx.ren.param(x.dtype, ctx[x])))
    return ""


def _define_var(ctx: RenderContext[CFamilyRenderer], x: UOp) -> str:
    ctx.var_names.append(x.arg[0])
    return ""


def _gated(ctx: RenderContext[CFamilyRenderer], idx: UOp, load: str, dt: DType) -> str:
    """A gated load: an index outside the valid region reads 0."""
    return f"({ctx[idx.src[2]]}?{load}:{ctx.ren.render_const(0, dt)})" if len(idx.src) > 2 else load


# the rules every C dialect shares; a dialect's own rules come before them and so win
cfamily_rules: list[tuple[UPat, Callable]] = [
    # for (T i = 0; i < n; i++) {   (T: int, or a 64-bit type for a loop past 2**31; the loop indents what follows)
    (
        UPat(Ops.RANGE, name="x"),
        lambda ctx, x: f"for ({ctx.ren.render_dtype(x.dtype)} {ctx[x]} = 0; {ctx[x]} < {ctx[x.src[0]]}; {ctx[x]}++) {{",
    ),
    # END(x, r0, r1) -> one `}` per range it closes
    (UPat(Ops.END, name="x"), lambda x: "\n".join("}" for s in x.src[1:] if s.op is Ops.RANGE)),
    # AFTER(x, deps) -> x   (ordering only)
    (UPat(Ops.AFTER, name="x"), lambda ctx, x: ctx[x.src[0]]),
    # INDEX(p, 0) -> p ; INDEX(p, i) -> (p+i)
    (UPat(Ops.INDEX, src=(UPat.var("p"), UPat.const(None, 0)), allow_any_len=True), lambda ctx, p: ctx[p]),
    (UPat(Ops.INDEX, src=(UPat.var("p"), UPat.var("i")), allow_any_len=True), lambda ctx, p, i: f"({ctx[p]}+{ctx[i]})"),
    (UPat(Ops.GROUP), lambda: ""),
    (UPat(Ops.CONST, name="x"), lambda ctx, x: ctx.ren.render_const(x.arg, x.dtype)),
    (UPat(Ops.DEFINE_GLOBAL, name="x"), _define_global),
    (UPat(Ops.DEFINE_VAR, name="x"), _define_var),
    (UPat(Ops.DEFINE_REG, name="x"), _define_reg),
    # LOAD(INDEX(p, i[, gate])) -> the dialect's load of *(p+i), gated: (gate?load:0)
    (
        UPat(Ops.LOAD, src=(UPat.var("idx"),), allow_any_len=True, name="x"),
        lambda ctx, idx, x: _gated(ctx, idx, ctx.ren.render_load(x.dtype, idx.src[0], ctx[idx]), x.dtype),
    ),
    # STORE(INDEX(p, i[, gate]), v) -> *(p+i) = v;  gated: if (gate) ...
    (
        UPat(Ops.STORE, src=(UPat.var("idx"), UPat.var("v"))),
        lambda ctx, idx, v: (f"if ({ctx[idx.src[2]]}) " if len(idx.src) > 2 else "") + f"*{ctx[idx]} = {ctx[v]};",
    ),
    # VECTORIZE(a, b, ...) -> the dialect's vector literal
    (UPat(Ops.VECTORIZE, name="x"), lambda ctx, x: ctx.ren.render_vectorize([ctx[s] for s in x.src], x.dtype)),
    # GEP(v, (i,)) -> lane i of v
    (
        UPat(Ops.GEP, src=(UPat.var("v"),), name="x", custom=lambda u: len(u.arg) == 1),
        lambda ctx, v, x: ctx.ren.render_gep(ctx[v], v.dtype, x.arg[0]),
    ),
    # CAST(x) of a scalar -> the dialect's conversion
    (
        UPat(Ops.CAST, src=(UPat.var("a"),), name="x", custom=lambda u: u.dtype.count == 1),
        lambda ctx, a, x: ctx.ren.render_cast(x.dtype, a.dtype, ctx[a]),
    ),
]


class CFamilyRenderer(Renderer):
    """The statement loop of the C dialects: each linear UOp's string comes from `string_rewrite`, a PatternMatcher
    whose rules map (ctx, the UOp) to its C; the loop only names values, declares them and indents.

    What the loop does with a rule's string depends on the op: CONST, INDEX, AFTER and a one-lane GEP are inlined
    where used; ALU ops, LOAD, CAST, BITCAST, VECTORIZE and a shuffling GEP are declared (`T val0 = <string>;`) unless
    the rule wrote the declaration itself (`Stmts`); any other op's string is its statements (one per line, none when
    empty). END's lines each close one level."""

    string_rewrite: PatternMatcher
    code_for_op: dict[Ops, Callable[..., str]]  # an ALU op's C from its dtype and its sources' strings

    # the hooks the shared rules call; each dialect implements them
    def render_dtype(self, dt: DType) -> str:
        raise NotImplementedError

    def param(self, dt: PtrDType, name: str) -> str:
        raise NotImplementedError

    def render_const(self, x, dt: DType) -> str:
        raise NotImplementedError

    def render_cast(self, to: DType, frm: DType, x: str) -> str:
        raise NotImplementedError

    def render_load(self, dt: DType, ptr: UOp, addr: str) -> str:
        raise NotImplementedError

    def render_vectorize(self, lanes: list[str], dt: DType) -> str:
        raise NotImplementedError

    def render_gep(self, x: str, dt: DType, lane: int) -> str:
        raise NotImplementedError

    def render_kernel(self, name: str, ctx: RenderContext[Any], body: list[str], uops: list[UOp]) -> ProgramSpec:
        raise NotImplementedError

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        ctx = RenderContext(self, uops)
        body: list[str] = []
        depth = 1
        for u in uops:
            is_value = u.op in GroupOp.ALU or (u.op in _VALUE_PREFIX and (u.op is not Ops.GEP or len(u.arg) > 1))
            if is_value:
                ctx.r[u] = ctx.new_name("alu" if u.op in GroupOp.ALU else _VALUE_PREFIX[u.op])
            elif u.op is Ops.DEFINE_REG:
                ctx.r[u] = ctx.new_name("acc")
            elif u.op in _NAMED:
                ctx.r[u] = _NAMED[u.op](u)
            code = self.string_rewrite.rewrite(u, ctx)
            if code is None:
                raise NotImplementedError(f"the {self.device} renderer has no rule for {u.op}")
            assert isinstance(code, str)
            if u.op in _EXPRESSION_OPS or (u.op is Ops.GEP and not is_value):
                ctx.r[u] = code
            elif is_value and not isinstance(code, Stmts):
                body.append("  " * depth + f"{self.render_dtype(u.dtype)} {ctx[u]} = {code};")
            else:
                for line in code.split("\n") if code else []:
                    if u.op is Ops.END:  # each `}` one level out
                        depth -= 1
                    body.append("  " * depth + line)
            if u.op is Ops.RANGE:
                depth += 1
        return self.render_kernel(name, ctx, body, uops)


# ***** the C dialect (gcc): its rules, before the shared ones *****


def _c_alu(ctx: RenderContext[CStyleRenderer], x: UOp) -> str | None:
    code = ctx.ren.code_for_op.get(x.op)
    if code is None:
        return None
    srcs = [ctx[s] for s in x.src]
    if (ut := wrapping_dtype(x)) is None:
        return code(x.dtype, *srcs)
    # wraps as torch's ints: computed in unsigned, cast back (a shift's count stays as it is)
    wide = [f"(({ctx.ren.render_dtype(ut)}){a})" for a in (srcs[:1] if x.op is Ops.SHL else srcs)]
    ctx.vector_types.add(ut)
    return f"(({ctx.ren.render_dtype(x.dtype)}){code(ut, *wide, *srcs[len(wide) :])})"


def _c_vector_load(ctx: RenderContext[CStyleRenderer], x: UOp, idx: UOp) -> Stmts:
    """A vector from a scalar pointer: copied (the pointer need not be aligned), gated by an if."""
    copy = f"__builtin_memcpy(&{ctx[x]}, {ctx[idx]}, {x.dtype.itemsize});"
    return Stmts(
        f"{ctx.ren.render_dtype(x.dtype)} {ctx[x]} = {{0}};\n"
        + (f"if ({ctx[idx.src[2]]}) {copy}" if len(idx.src) > 2 else copy)
    )


def _c_vector_store(ctx: RenderContext[CStyleRenderer], idx: UOp, v: UOp) -> str:
    t = ctx.ren.render_dtype(v.dtype)
    store = f"{{ {t} t_ = {ctx[v]}; __builtin_memcpy({ctx[idx]}, &t_, {v.dtype.itemsize}); }}"
    return f"if ({ctx[idx.src[2]]}) {store}" if len(idx.src) > 2 else store


def _c_special(ctx: RenderContext[CStyleRenderer], x: UOp) -> str:
    ctx.special.append(x)  # a core id: a parameter of the kernel
    return ""


def _c_bitcast(ctx: RenderContext[CStyleRenderer], x: UOp, a: UOp) -> Stmts:
    to, frm, name = C_TYPES[x.dtype], C_TYPES[a.dtype], ctx[x]
    return Stmts(f"{to} {name}; {{ {frm} t_ = {ctx[a]}; __builtin_memcpy(&{name}, &t_, sizeof({name})); }}")


# the signed int of each lane width: a vector compare's lanes are all ones or zeros of its operands' width
_MASK_INT = {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}
_COMPARE_C = {Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "=="}


def _mask_type(ctx: RenderContext[CStyleRenderer], width: int, n: int) -> str:
    dt = _MASK_INT[width].vec(n)
    ctx.vector_types.add(dt)
    return ctx.ren.render_dtype(dt)


def _declare_mask(ctx: RenderContext[CStyleRenderer], x: UOp, width: int, mask: str) -> str:
    """`T maskK = mask;` and the bool vector x as its 0/1 bytes (what stores, casts and lanes read; gcc drops them
    where only the mask is used)"""
    name, t = ctx.new_name("mask"), _mask_type(ctx, width, x.dtype.count)
    ctx.masks[x] = (name, width)
    return f"{t} {name} = ({t})({mask});\n{ctx.ren.render_dtype(x.dtype)} {ctx[x]} = " + (
        f"__builtin_convertvector({name}&1, {ctx.ren.render_dtype(x.dtype)});"
    )


def _mask_of(ctx: RenderContext[CStyleRenderer], c: UOp, width: int) -> str:
    """The bool vector c as lanes of -1 or 0, `width` bytes each: a compare's own mask (sign-extended or truncated
    to the width: -1 stays -1), else its bytes negated"""
    t = _mask_type(ctx, width, c.dtype.count)
    if (own := ctx.masks.get(c)) is not None:
        return own[0] if own[1] == width else f"__builtin_convertvector({own[0]}, {t})"
    return f"(-__builtin_convertvector({ctx[c]}, {t}))"


def _blend(ctx: RenderContext[CStyleRenderer], x: UOp, mask: str, a: UOp, b: UOp) -> str:
    """the lanes of a where mask is -1, of b where 0: & and | on the bits (C, unlike C++, has no vector `?:`; a cast
    between vector types of one size keeps the bits)"""
    t, bits = ctx.ren.render_dtype(x.dtype), _mask_type(ctx, x.dtype.scalar.itemsize, x.dtype.count)
    return f"({t})(({mask}&({bits}){ctx[a]})|(~{mask}&({bits}){ctx[b]}))"


def _c_vector_compare(ctx: RenderContext[CStyleRenderer], x: UOp, a: UOp, b: UOp) -> Stmts:
    """a < b, a != b, a == b on vectors: gcc's vector compare (ordered as the scalar one: NaN != x only is true)"""
    return Stmts(_declare_mask(ctx, x, a.dtype.scalar.itemsize, f"{ctx[a]}{_COMPARE_C[x.op]}{ctx[b]}"))


def _c_vector_logic(ctx: RenderContext[CStyleRenderer], x: UOp, a: UOp, b: UOp) -> Stmts | None:
    """and/or/xor of two bool vectors that are masks of one width: the op on the masks (-1/0 lanes stay -1/0)"""
    ma, mb = ctx.masks.get(a), ctx.masks.get(b)
    if ma is None or mb is None or ma[1] != mb[1]:
        return None  # their bytes, by the plain rule
    op = {Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^"}[x.op]
    return Stmts(_declare_mask(ctx, x, ma[1], f"{ma[0]}{op}{mb[0]}"))


def _c_vector_where(ctx: RenderContext[CStyleRenderer], x: UOp, c: UOp, a: UOp, b: UOp) -> Stmts:
    """c ? a : b on vectors: the condition as a mask of the values' lane width, a blend of the bits"""
    mask = ctx.new_name("sel")
    width = x.dtype.scalar.itemsize
    return Stmts(
        f"{_mask_type(ctx, width, x.dtype.count)} {mask} = {_mask_of(ctx, c, width)};\n"
        f"{ctx.ren.render_dtype(x.dtype)} {ctx[x]} = {_blend(ctx, x, mask, a, b)};"
    )


def _c_vector_max(ctx: RenderContext[CStyleRenderer], x: UOp, a: UOp, b: UOp) -> Stmts:
    """max of two vectors lane by lane with the reference's rule (b where b > a or b is NaN, else a: NaN wins, and a
    tie is a, so max(-0, +0) is -0 as torch's): a vector compare's mask, a blend of the bits."""
    va, vb, mask = ctx[a], ctx[b], ctx.new_name("mask")
    take_b = f"({vb}>{va})|({vb}!={vb})" if dtypes.is_float(x.dtype.scalar) else f"{vb}>{va}"
    t = _mask_type(ctx, x.dtype.scalar.itemsize, x.dtype.count)
    value = f"{ctx.ren.render_dtype(x.dtype)} {ctx[x]} = {_blend(ctx, x, mask, b, a)};"
    return Stmts(f"{t} {mask} = ({t})({take_b});\n{value}")


def _has_half(x: UOp) -> bool:
    return any(d.scalar in (dtypes.float16, dtypes.bfloat16) for d in (x.dtype, *(s.dtype for s in x.src)))


def _same_c_type(x: UOp) -> bool:
    return C_TYPES[x.dtype.scalar] == C_TYPES[x.src[0].dtype.scalar] and x.dtype.count == x.src[0].dtype.count


# an access to a buffer of scalars: a global, or a row buffer (an array DEFINE_REG, schedule/kernel.py), not a vector
# accumulator (a DEFINE_REG of one vector, read and written whole)
_global_vector = UPat(
    Ops.INDEX,
    name="idx",
    custom=lambda u: isinstance(u.src[0].dtype, PtrDType) and u.src[0].dtype.base.count == 1,
)
_is_vector = lambda u: u.dtype.count > 1  # noqa: E731

c_rules: list[tuple[UPat, Callable]] = [
    # MAX(vector a, vector b) -> the lanes of b where b > a or b is NaN, else of a, by a mask (no vector ?: in C)
    (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("b")), name="x", custom=_is_vector), _c_vector_max),
    # CMPLT/CMPNE/CMPEQ(vector a, vector b) -> mask = a<b (-1/0 lanes of a's width); the bool vector: mask&1
    (UPat(GroupOp.Comparison, src=(UPat.var("a"), UPat.var("b")), name="x", custom=_is_vector), _c_vector_compare),
    # AND/OR/XOR(mask a, mask b) of one width -> the op on the masks
    (
        UPat((Ops.AND, Ops.OR, Ops.XOR), src=(UPat.var("a"), UPat.var("b")), name="x", custom=_is_vector),
        _c_vector_logic,
    ),
    # WHERE(vector c, a, b) -> (a & mask) | (b & ~mask), mask: c as -1/0 lanes of a's width
    (
        UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("b")), name="x", custom=_is_vector),
        _c_vector_where,
    ),
    # BITCAST of a vector to a vector of its size -> a vector cast (gcc keeps the bits)
    (
        UPat(Ops.BITCAST, src=(UPat.var("a"),), name="x", custom=_is_vector),
        lambda ctx, a, x: f"(({ctx.ren.render_dtype(x.dtype)}){ctx[a]})",
    ),
    (UPat(GroupOp.ALU, name="x"), _c_alu),
    # LOAD(INDEX(global, i)) of a vector -> memcpy into a zeroed vector
    (UPat(Ops.LOAD, src=(_global_vector,), allow_any_len=True, name="x", custom=_is_vector), _c_vector_load),
    (UPat(Ops.STORE, src=(_global_vector, UPat(name="v", custom=_is_vector))), _c_vector_store),
    (UPat(Ops.SPECIAL, name="x"), _c_special),
    # PREFETCH(INDEX(p, i)) -> a read (arg True: write) hint for the cache (never faults, also past the buffer)
    (
        UPat(Ops.PREFETCH, src=(UPat(Ops.INDEX, src=(UPat.var("p"), UPat.var("i"))),), name="x"),
        lambda ctx, x, p, i: f"__builtin_prefetch({ctx[p]}+{ctx[i]}, {int(bool(x.arg))});",
    ),
    # GEP(v, (i, j, ...)) -> a shuffle (GCC 12+, clang)
    (
        UPat(Ops.GEP, src=(UPat.var("v"),), name="x", custom=lambda u: len(u.arg) > 1),
        lambda ctx, v, x: f"__builtin_shufflevector({ctx[v]}, {ctx[v]}, {', '.join(str(i) for i in x.arg)})",
    ),
    # CAST of a vector -> lane by lane conversion
    (
        UPat(Ops.CAST, src=(UPat.var("a"),), name="x", custom=_is_vector),
        lambda ctx, a, x: f"__builtin_convertvector({ctx[a]}, {ctx.ren.render_dtype(x.dtype)})",
    ),
    # BITCAST between dtypes of one C type (bf16's raw bits and uint16: unsigned short) -> the value itself
    (UPat(Ops.BITCAST, src=(UPat.var("a"),), name="x", custom=_same_c_type), lambda ctx, a, x: ctx[a]),
    (UPat(Ops.BITCAST, src=(UPat.var("a"),), name="x"), _c_bitcast),
]


class CStyleRenderer(CFamilyRenderer):
    device = "CPU"
    kernel_prefix = ""
    prefetches = True  # __builtin_prefetch
    # a vector's exp2/log2/sin/cos/tan as ALU ops (codegen/transcendental.py), which gcc keeps as vectors now that
    # their integer, compare and select steps are C vectors: a libm call per lane was the 3-4x ((4096, 4096), one
    # process alternating with LLVM: x.exp() 4x, x.log() 3.8x -> 0.98x of LLVM's time, x.sin() 2.9x -> 1.5x)
    alu_transcendentals = frozenset(GroupOp.Approximated)
    string_rewrite = PatternMatcher(c_rules + cfamily_rules)
    code_for_op: dict[Ops, Callable[..., str]] = {
        Ops.EXP2: _float_fn("exp2"),
        Ops.LOG2: _float_fn("log2"),
        Ops.SIN: _float_fn("sin"),
        Ops.COS: _float_fn("cos"),
        Ops.TAN: _float_fn("tan"),
        Ops.SQRT: _float_fn("sqrt"),
        Ops.TRUNC: _float_fn("trunc"),
        Ops.RECIPROCAL: lambda dt, a: f"(({C_TYPES[dt]})1/{a})",
        Ops.NEG: lambda dt, a: f"(-{a})",
        Ops.ADD: lambda dt, a, b: f"({a}+{b})",
        Ops.SUB: lambda dt, a, b: f"({a}-{b})",
        Ops.MUL: lambda dt, a, b: f"({a}*{b})",
        Ops.FDIV: lambda dt, a, b: f"({a}/{b})",
        Ops.IDIV: lambda dt, a, b: f"({a}/{b})",
        Ops.MOD: lambda dt, a, b: f"({a}%{b})",
        Ops.MAX: _c_max,
        Ops.CMPLT: lambda dt, a, b: f"({a}<{b})",
        Ops.CMPNE: lambda dt, a, b: f"({a}!={b})",
        Ops.CMPEQ: lambda dt, a, b: f"({a}=={b})",
        Ops.AND: lambda dt, a, b: f"({a}&{b})",
        Ops.OR: lambda dt, a, b: f"({a}|{b})",
        Ops.XOR: lambda dt, a, b: f"({a}^{b})",
        Ops.SHL: lambda dt, a, b: f"({a}<<{b})",
        Ops.SHR: lambda dt, a, b: f"({a}>>{b})",
        Ops.WHERE: lambda dt, c, a, b: f"({c}?{a}:{b})",
        Ops.MULACC: lambda dt, a, b, c: f"(({a}*{b})+{c})",
    }

    def render_dtype(self, dt: DType) -> str:
        if isinstance(dt, PtrDType):
            return f"{self.render_dtype(dt.base)}*"
        if dt.count > 1:
            return f"zg_{C_TYPES[dt.scalar].replace(' ', '_')}x{dt.count}"
        return C_TYPES[dt]

    def keeps_vector(self, x: UOp) -> bool:
        """gcc's vector extensions: arithmetic, conversions, integer bits and shifts, compares (a mask of -1/0 lanes),
        selects and max by mask (`_blend`); a bool vector is bytes of 0/1, so no arithmetic on it and no conversion to
        it (a cast to bool is != 0, gcc's conversion truncates). Half floats stay lanes."""
        if x.op is Ops.BITCAST:  # bf16 <-> uint16: one vector type, nothing to do; else a vector cast of one size
            return _same_c_type(x) or (
                x.src[0].dtype.count > 1 and x.dtype.itemsize == x.src[0].dtype.itemsize and not _has_half(x)
            )
        if _has_half(x) or any(s.dtype.count != x.dtype.count for s in x.src):
            return False
        operands = [s.dtype.scalar for s in x.src]
        if x.op in GroupOp.Comparison:
            return True
        if x.op is Ops.WHERE:
            return True
        if x.op is Ops.CAST:
            return x.dtype.scalar != dtypes.bool
        if x.op in (Ops.AND, Ops.OR, Ops.XOR):
            return all(dtypes.is_int(d) or d == dtypes.bool for d in operands)
        if x.op in (Ops.SHL, Ops.SHR):
            return all(dtypes.is_int(d) for d in operands)
        if dtypes.bool in operands:
            return False
        return x.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.MULACC, Ops.MAX)

    def render_typedefs(self, uops: list[UOp], extra: set[DType]) -> str:
        vecs = {u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype for u in uops} | extra
        # bool vectors are vectors of bytes (0 or 1): gcc has no _Bool vectors
        return "".join(
            f"typedef {'unsigned char' if d.scalar == dtypes.bool else C_TYPES[d.scalar]} "
            f"{self.render_dtype(d)} __attribute__((vector_size({d.itemsize})));\n"
            for d in sorted((d for d in vecs if d.count > 1), key=lambda d: d.name)
        )

    def render_const(self, x, dt: DType) -> str:
        if dtypes.is_float(dt):
            if math.isnan(x):
                v = "NAN"
            elif math.isinf(x):
                v = "INFINITY" if x > 0 else "(-INFINITY)"
            else:  # a negative literal in parentheses: `a-(-1.5f)`, never `a--1.5f`
                v = repr(float(x)) + ("" if dt == dtypes.float64 else "f")
                v = f"({v})" if v.startswith("-") else v
            return v if dt in (dtypes.float32, dtypes.float64) else f"(({C_TYPES[dt]}){v})"
        if dt == dtypes.bool:
            return "1" if x else "0"
        if dt == dtypes.int64:
            return (f"({x}ll)" if x < 0 else f"{x}ll") if x != dtypes.min(dt) else "(-9223372036854775807ll-1)"
        if dt == dtypes.uint64:
            return f"{x}ull"
        if dt == dtypes.uint32:
            return f"{x}u"
        if dt == dtypes.int32 and x == dtypes.min(dt):
            return "(-2147483647-1)"
        return (f"({x})" if x < 0 else str(x)) if dt == dtypes.int32 else f"(({C_TYPES[dt]}){x})"

    def render_cast(self, to: DType, frm: DType, x: str) -> str:
        reject_bf16_cast(frm, to)
        return f"({C_TYPES[to]})({x})"

    def render_load(self, dt: DType, ptr: UOp, addr: str) -> str:
        return f"(*{addr})"

    def render_vectorize(self, lanes: list[str], dt: DType) -> str:
        return f"({self.render_dtype(dt)}){{{', '.join(lanes)}}}"

    def render_gep(self, x: str, dt: DType, lane: int) -> str:
        return f"{x}[{lane}]"

    def param(self, dt: PtrDType, name: str) -> str:
        return f"{self.render_dtype(dt)} restrict {name}"

    def render_kernel(
        self, name: str, ctx: RenderContext[CStyleRenderer], body: list[str], uops: list[UOp]
    ) -> ProgramSpec:
        params = (
            [a for _, a in sorted(ctx.args)]
            + [f"int var_{v}" for v in ctx.var_names]
            + [f"int {s.arg}" for s in ctx.special]
        )
        code = (
            PRELUDE
            + self.render_typedefs(uops, ctx.vector_types)
            + f"void {self.kernel_prefix}{name}({', '.join(params)}) {{\n"
            + "\n".join(body)
            + "\n}\n"
        )
        cores = ctx.special[0].src[0].arg if ctx.special else 1
        return ProgramSpec(name, code, len(ctx.args), tuple(ctx.var_names), global_size=(cores, 1, 1))
