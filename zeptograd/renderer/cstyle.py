"""The C renderer: each linear UOp becomes one line of C, or an inline expression when it has one use."""

from __future__ import annotations

import math
from typing import Callable

from zeptograd.dtype import DType, PtrDType, dtypes
from zeptograd.renderer import ProgramSpec, Renderer, loop_var, wrapping_dtype
from zeptograd.uop.ops import Ops, UOp

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

PRELUDE = """#include <math.h>
static inline float zg_bf16_to_f(unsigned short x) { unsigned int u = (unsigned int)x << 16; float f;
  __builtin_memcpy(&f, &u, 4); return f; }
static inline unsigned short zg_f_to_bf16(float f) { unsigned int u; __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 64u);
  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16); }
"""


def _float_fn(name: str) -> Callable[[DType, str], str]:
    return lambda dt, a: (
        f"{name}f({a})"
        if dt == dtypes.float32
        else f"{name}({a})"
        if dt == dtypes.float64
        else f"({C_TYPES[dt]}){name}f((float){a})"
    )


def _nan_wins(dt: DType, a: str) -> str:
    """max(a, b) is NaN when a is (numpy and torch propagate NaN; `a > b ? a : b` alone would return b)"""
    return f"||({a}!={a})" if dtypes.is_float(dt) else ""


class CStyleRenderer(Renderer):
    device = "CPU"
    kernel_prefix = ""
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
        Ops.MAX: lambda dt, a, b: f"((({a}>{b}){_nan_wins(dt, a)})?{a}:{b})",
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
            return f"{self.render_dtype(dt.base)}*"  # type: ignore[arg-type]
        if dt.count > 1:
            return f"zg_{C_TYPES[dt.scalar].replace(' ', '_')}x{dt.count}"
        return C_TYPES[dt]

    def keeps_vector(self, x: UOp) -> bool:
        """gcc's vector extensions: arithmetic and conversions; no bool vectors, no vector select or max."""
        dts = [x.dtype.scalar] + [s.dtype.scalar for s in x.src]
        if any(d in (dtypes.bool, dtypes.float16, dtypes.bfloat16) for d in dts):
            return False
        return x.op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.NEG, Ops.MULACC, Ops.CAST)

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
            if dt == dtypes.bfloat16:
                return f"zg_f_to_bf16({v})"
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
        if frm == dtypes.bfloat16:
            return f"zg_bf16_to_f({x})"  # codegen routes every other bf16 cast through float32
        if to == dtypes.bfloat16:
            return f"zg_f_to_bf16({x})"
        return f"({C_TYPES[to]})({x})"

    def render_bitcast(self, to: DType, frm: DType, x: str, name: str) -> list[str]:
        return [f"{C_TYPES[to]} {name}; {{ {C_TYPES[frm]} t_ = {x}; __builtin_memcpy(&{name}, &t_, sizeof({name})); }}"]

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        r: dict[UOp, str] = {}  # each UOp's C expression or variable name
        lines: list[str] = []
        args: list[tuple[int, str]] = []
        var_names: list[str] = []
        special: list[UOp] = []
        counts: dict[str, int] = {}
        unsigned_types: set[DType] = set()  # the vectors wrapping integer ops are computed in need typedefs
        depth = 1

        def new_name(prefix: str) -> str:
            counts[prefix] = counts.get(prefix, 0) + 1
            return f"{prefix}{counts[prefix] - 1}"

        def emit(line: str):
            lines.append("  " * depth + line)

        for u in uops:
            op, dt, src = u.op, u.dtype, u.src
            if op is Ops.DEFINE_GLOBAL:
                r[u] = f"data{u.arg}"
                args.append((u.arg, f"{self.render_dtype(dt)} restrict data{u.arg}"))
            elif op is Ops.DEFINE_VAR:
                r[u] = f"var_{u.arg[0]}"  # prefixed: a Variable's name never meets a C keyword or a local
                var_names.append(u.arg[0])
            elif op is Ops.SPECIAL:
                r[u] = u.arg
                special.append(u)
            elif op is Ops.CONST:
                r[u] = self.render_const(u.arg, dt)
            elif op is Ops.DEFINE_REG:
                acc = new_name("acc")
                if dt.size == 1:  # a plain variable, so the compiler keeps it in a register
                    emit(f"{self.render_dtype(dt.base)} {acc};")  # type: ignore[attr-defined]
                    r[u] = f"(&{acc})"
                else:
                    emit(f"{self.render_dtype(dt.base)} {acc}[{dt.size}];")  # type: ignore[attr-defined]
                    r[u] = acc
            elif op is Ops.RANGE:
                r[u] = loop_var(u)
                emit(f"for ({self.render_dtype(dt)} {r[u]} = 0; {r[u]} < {r[src[0]]}; {r[u]}++) {{")
                depth += 1
            elif op is Ops.END:
                for _ in [s for s in src[1:] if s.op is Ops.RANGE]:
                    depth -= 1
                    emit("}")
            elif op is Ops.AFTER:
                r[u] = r[src[0]]
            elif op is Ops.INDEX:
                r[u] = f"({r[src[0]]}+{r[src[1]]})" if src[1].op is not Ops.CONST or src[1].arg != 0 else r[src[0]]
            elif op is Ops.LOAD:
                idx = src[0]
                r[u] = new_name("val")
                if dt.count > 1 and idx.src[0].op is Ops.DEFINE_GLOBAL:  # a vector from a scalar pointer
                    copy = f"__builtin_memcpy(&{r[u]}, {r[idx]}, {dt.itemsize});"
                    emit(f"{self.render_dtype(dt)} {r[u]} = {{0}};")
                    emit(f"if ({r[idx.src[2]]}) {copy}" if len(idx.src) > 2 else copy)
                    continue
                load = f"(*{r[idx]})"
                if len(idx.src) > 2:  # gated: an index outside the valid region reads 0
                    load = f"({r[idx.src[2]]}?{load}:{self.render_const(0, dt)})"
                emit(f"{self.render_dtype(dt)} {r[u]} = {load};")
            elif op is Ops.STORE:
                idx, val = src
                if val.dtype.count > 1 and idx.src[0].op is Ops.DEFINE_GLOBAL:
                    store = (
                        f"{{ {self.render_dtype(val.dtype)} t_ = {r[val]}; __builtin_memcpy({r[idx]}, &t_, "
                        f"{val.dtype.itemsize}); }}"
                    )
                else:
                    store = f"*{r[idx]} = {r[val]};"
                emit(f"if ({r[idx.src[2]]}) {store}" if len(idx.src) > 2 else store)
            elif op is Ops.VECTORIZE:
                r[u] = new_name("vec")
                vt = self.render_dtype(dt)
                emit(f"{vt} {r[u]} = ({vt}){{{', '.join(r[s] for s in src)}}};")
            elif op is Ops.GEP and len(u.arg) == 1:
                r[u] = f"{r[src[0]]}[{u.arg[0]}]"
            elif op is Ops.GEP:  # several lanes: a shuffle (GCC 12+, clang)
                r[u] = new_name("vec")
                lanes = ", ".join(str(i) for i in u.arg)
                emit(f"{self.render_dtype(dt)} {r[u]} = __builtin_shufflevector({r[src[0]]}, {r[src[0]]}, {lanes});")
            elif op in (Ops.GROUP, Ops.NOOP):
                pass
            elif op is Ops.CAST:
                r[u] = new_name("cast")
                cast = (
                    f"__builtin_convertvector({r[src[0]]}, {self.render_dtype(dt)})"
                    if dt.count > 1
                    else self.render_cast(dt, src[0].dtype, r[src[0]])
                )
                emit(f"{self.render_dtype(dt)} {r[u]} = {cast};")
            elif op is Ops.BITCAST:
                r[u] = new_name("bits")
                for line in self.render_bitcast(dt, src[0].dtype, r[src[0]], r[u]):
                    emit(line)
            elif op in self.code_for_op:
                r[u] = new_name("alu")
                srcs = [r[s] for s in src]
                if (ut := wrapping_dtype(u)) is not None:  # wraps as torch's ints: computed in unsigned, cast back
                    wide = [f"(({self.render_dtype(ut)}){a})" for a in (srcs[:1] if op is Ops.SHL else srcs)]
                    unsigned_types.add(ut)
                    expr = f"(({self.render_dtype(dt)}){self.code_for_op[op](ut, *wide, *srcs[len(wide) :])})"
                else:
                    expr = self.code_for_op[op](dt, *srcs)
                emit(f"{self.render_dtype(dt)} {r[u]} = {expr};")
            else:
                raise NotImplementedError(f"the C renderer has no rule for {op}")
        params = [a for _, a in sorted(args)] + [f"int var_{v}" for v in var_names] + [f"int {s.arg}" for s in special]
        code = (
            PRELUDE
            + self.render_typedefs(uops, unsigned_types)
            + f"void {self.kernel_prefix}{name}({', '.join(params)}) {{\n"
            + "\n".join(lines)
            + "\n}\n"
        )
        cores = special[0].src[0].arg if special else 1
        return ProgramSpec(name, code, len(args), tuple(var_names), global_size=(cores, 1, 1))
