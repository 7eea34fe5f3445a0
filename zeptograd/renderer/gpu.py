"""GPU dialects of the C renderer: OpenCL C and CUDA C.

The C family's statement loop of `cstyle.py` renders both: the GPU rules come before its shared rules and each
dialect's rules before those (a dialect is a rule list, never a loop of its own); a handful of hooks give the
dialects' types, literals and memory access. Shared conventions:

- half values are computed as `float` and rounded to half after every op (`zg_rh`), so results match a device
  with native half math without needing one (PoCL has no cl_khr_fp16); in memory they are 16-bit halves.
- bfloat16 values are their 16 bits (`ushort`): codegen/lower.py converts them with integer ops.
- vectors: OpenCL's native `floatN` (N = 2, 4, 8, 16; vloadN/vstoreN), else (CUDA, bool, other widths) a struct
  `zg_<type>x<N> { <type> v[N]; }` handled lane by lane.
- thread ids: SPECIAL `gidxN` (group id), `lidxN` (local id); `ProgramSpec.global_size` counts groups and
  `local_size` threads per group. An OpenCL kernel without local ids uses global ids and lets the runtime
  pick the work-group size.
"""

from __future__ import annotations

import math
import struct
from typing import Callable

from zeptograd.dtype import DType, PtrDType, dtypes
from zeptograd.renderer import ProgramSpec, reject_bf16_cast, wrapping_dtype
from zeptograd.renderer.cstyle import CFamilyRenderer, RenderContext, cfamily_rules
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat

_NATIVE_OPS = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.MULACC}
_FLOAT_NATIVE_OPS = {Ops.FDIV, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL}
_SMALL = (dtypes.float16, dtypes.bfloat16, dtypes.bool)


def gpu_code_for_op(float_suffix: str) -> dict[Ops, Callable[..., str]]:
    """Each ALU op's C from its dtype and its sources' strings. float_suffix: exp2f, fmaf (CUDA) or exp2, fma
    (OpenCL's overloaded builtins); none for doubles."""

    def suffix(dt: DType) -> str:
        return float_suffix if dt.scalar != dtypes.float64 else ""

    def math_fn(name: str) -> Callable[..., str]:
        return lambda dt, a: f"{name}{suffix(dt)}({a})"

    def binary(sym: str, bool_sym: str | None = None) -> Callable[..., str]:
        # bool + is or, bool * is and
        return lambda dt, a, b: f"({a}{bool_sym if bool_sym and dt.scalar == dtypes.bool else sym}{b})"

    def nan_wins(dt: DType, b: str) -> str:  # NaN wins, as numpy/torch's max
        return f"||({b}!={b})" if dtypes.is_float(dt.scalar) else ""

    return {
        **{op: math_fn(op.name.lower()) for op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN, Ops.SQRT, Ops.TRUNC)},
        Ops.RECIPROCAL: lambda dt, a: f"(({'double' if dt.scalar == dtypes.float64 else 'float'})1/{a})",
        Ops.NEG: lambda dt, a: f"(!{a})" if dt.scalar == dtypes.bool else f"(-{a})",
        # the reference's max: b where b > a or b is NaN, else a (a tie is a: max(-0, +0) is -0, as torch's)
        Ops.MAX: lambda dt, a, b: f"((({b}>{a}){nan_wins(dt, b)})?{b}:{a})",
        Ops.WHERE: lambda dt, c, a, b: f"({c}?{a}:{b})",
        Ops.MULACC: lambda dt, a, b, c: (
            f"fma{suffix(dt)}({a},{b},{c})" if dtypes.is_float(dt.scalar) else f"(({a}*{b})+{c})"
        ),
        Ops.ADD: binary("+", "|"),
        Ops.SUB: binary("-"),
        Ops.MUL: binary("*", "&"),
        Ops.FDIV: binary("/"),
        Ops.IDIV: binary("/"),
        Ops.MOD: binary("%"),
        Ops.CMPLT: binary("<"),
        Ops.CMPNE: binary("!="),
        Ops.CMPEQ: binary("=="),
        Ops.AND: binary("&"),
        Ops.OR: binary("|"),
        Ops.XOR: binary("^"),
        Ops.SHL: binary("<<"),
        Ops.SHR: binary(">>"),
    }


def _gpu_alu(ctx: RenderContext[GPURenderer], x: UOp) -> str:
    code, srcs = ctx.ren.code_for_op[x.op], [ctx[s] for s in x.src]
    if (wrap := wrapping_dtype(x)) is not None:  # computed in unsigned so that it wraps, reinterpreted back
        n = 1 if x.op is Ops.SHL else len(srcs)  # a shift's count stays as it is
        wide = [ctx.ren.reinterpret(a, s.dtype, wrap) for a, s in zip(srcs[:n], x.src)] + srcs[n:]
        return ctx.ren.reinterpret(code(wrap, *wide), wrap, x.dtype)
    return ctx.ren.half_round(x.dtype, code(x.dtype, *srcs))


def _gpu_special(ctx: RenderContext[GPURenderer], x: UOp) -> str:
    if x.arg[:4] not in ("gidx", "lidx"):
        raise NotImplementedError(f"{ctx.ren.device} has no thread index {x.arg!r}")
    ctx.special.append(x)
    return f"int {x.arg} = {ctx.ren.special(x.arg, ctx.has_local)};"


def _gpu_store(ctx: RenderContext[GPURenderer], idx: UOp, v: UOp) -> str:
    stores = ctx.ren.render_store(v.dtype, idx.src[0], ctx[idx], ctx[v])
    if len(idx.src) > 2:  # gated: only inside the valid region
        stores = [f"if ({ctx[idx.src[2]]}) {{ {' '.join(stores)} }}"]
    return "\n".join(stores)


_is_vector = lambda u: u.dtype.count > 1  # noqa: E731


def _holds_scalars(ptr: UOp) -> bool:
    """a local or register array of scalars (a row buffer, schedule/kernel.py), not a vector accumulator"""
    return isinstance(ptr.dtype, PtrDType) and ptr.dtype.base.count == 1


# the rules of both GPU dialects, before the C family's shared ones
gpu_rules: list[tuple[UPat, Callable]] = [
    (UPat(GroupOp.ALU, name="x"), _gpu_alu),
    (UPat(Ops.SPECIAL, name="x"), _gpu_special),
    # DEFINE_LOCAL -> a work-group's array: __local float smem[n];
    (
        UPat(Ops.DEFINE_LOCAL, name="x"),
        lambda ctx, x: f"{ctx.ren.shared}{ctx.ren.vtype(x.dtype.base)} {ctx[x]}[{x.dtype.size}];",
    ),
    (UPat(Ops.BARRIER), lambda ctx: ctx.ren.barrier),
    # STORE(INDEX(p, i[, gate]), v) -> the dialect's store; gated: if (gate) { ... }
    (UPat(Ops.STORE, src=(UPat.var("idx"), UPat.var("v"))), _gpu_store),
    # GEP(v, (i, j, ...)) -> a vector of those lanes
    (
        UPat(Ops.GEP, src=(UPat.var("v"),), name="x", custom=lambda u: len(u.arg) > 1),
        lambda ctx, v, x: ctx.ren.render_vectorize([ctx.ren.render_gep(ctx[v], v.dtype, i) for i in x.arg], x.dtype),
    ),
]


class GPURenderer(CFamilyRenderer):
    device = "GPU"
    has_local = True  # codegen makes work-group threads (codegen/gpudims.py, opt/heuristic_gpu.py)
    alu_trig = True  # OpenCL allows sin/cos 4 ulp and tan 5 (PoCL's tan is 2.3 ulp off), CUDA's tanf 4
    has_threads = False
    simd_bytes = 16
    global_max: tuple[int, ...] = (2**31 - 1, 65535, 65535)  # group counts per id
    local_max: tuple[int, ...] = (1024, 1024, 64)  # threads per work-group per id
    local_threads_max = 1024  # threads per work-group
    # OpenCL's least CL_DEVICE_LOCAL_MEM_SIZE (a full-profile device has at least this; CUDA's static __shared__ is
    # 48 KiB): the row buffers and reduce partials one work-group keeps (codegen/gpudims.py: split_rows) fit any GPU
    local_memory_bytes = 32 << 10
    string_rewrite = PatternMatcher(gpu_rules + cfamily_rules)
    code_for_op = gpu_code_for_op("f")
    # dialect
    types: dict[DType, str] = {}  # value types
    mem_types: dict[DType, str] = {}  # element types in global memory where they differ
    native_vector_counts: tuple[int, ...] = ()
    prelude = ""
    barrier = ""
    shared = ""  # the DEFINE_LOCAL qualifier

    # ----- types -----
    def is_native(self, dt: DType) -> bool:
        return dt.count in self.native_vector_counts and dt.scalar != dtypes.bool

    def vtype(self, dt: DType) -> str:
        """The type of a value (a vector: native or struct)."""
        if dt.count == 1:
            return self.types[dt]
        scalar = self.types[dt.scalar]
        return f"{scalar}{dt.count}" if self.is_native(dt) else f"zg_{scalar.replace(' ', '_')}x{dt.count}"

    def render_dtype(self, dt: DType) -> str:
        return self.vtype(dt)

    def mem_vtype(self, dt: DType) -> str:
        """The element type of a pointer into global memory."""
        return self.mem_types.get(dt, self.vtype(dt)) if dt.count == 1 else self.vtype(dt)

    def struct_decl(self, name: str, scalar: str, n: int) -> str:
        raise NotImplementedError

    def keeps_vector(self, x: UOp) -> bool:
        dts = [x.dtype] + [s.dtype for s in x.src]
        if any(d.scalar in _SMALL or (d.count > 1 and not self.is_native(d)) for d in dts):
            return False
        if len({d.count for d in dts}) != 1:
            return False
        if x.op is Ops.CAST:
            return True
        return x.op in _NATIVE_OPS or (x.op in _FLOAT_NATIVE_OPS and dtypes.is_float(x.dtype.scalar))

    # ----- constants and casts -----
    def float_literal(self, x: float, dt: DType) -> str:
        raise NotImplementedError

    def render_const(self, x, dt: DType) -> str:
        """A literal; a negative one in parentheses (`a-(-1.5f)`, never `a--1.5f`)."""
        if dt.count > 1:
            return self.render_vectorize([self.render_const(x, dt.scalar)] * dt.count, dt)
        if dt == dtypes.bool:
            return "1" if x else "0"
        if dtypes.is_float(dt):
            lit = self.float_literal(x, dtypes.float64 if dt == dtypes.float64 else dtypes.float32)
        elif dt in (dtypes.int64, dtypes.uint64):
            lit = self.long_literal(x, dt)
        elif dt == dtypes.uint32:
            lit = f"{x}u"
        elif dt == dtypes.int32:
            lit = str(x) if x != dtypes.min(dt) else "(-2147483647-1)"
        else:
            lit = f"(({self.types[dt]}){x})"
        return f"({lit})" if lit.startswith("-") else lit

    def long_literal(self, x: int, dt: DType) -> str:
        if dt == dtypes.uint64:
            return f"(({self.types[dt]}){x}ull)"
        return f"{x}ll" if x != dtypes.min(dt) else "(-9223372036854775807ll-1)"

    def render_vectorize(self, lanes: list[str], dt: DType) -> str:
        raise NotImplementedError

    def render_cast(self, to: DType, frm: DType, x: str) -> str:
        reject_bf16_cast(frm, to)
        if to == dtypes.float16:
            return f"zg_rh((float)({x}))"
        return f"({self.types[to]})({x})"

    def reinterpret(self, x: str, frm: DType, to: DType) -> str:
        """x as an int of another signedness (a wider one for scalars): a C cast, modulo 2^n back to signed."""
        return f"(({self.vtype(to)}){x})"

    def half_round(self, dt: DType, x: str) -> str:
        """A half result rounded to half (half values are computed as float)."""
        return f"zg_rh({x})" if dt == dtypes.float16 else x

    # ----- memory -----
    def render_load(self, dt: DType, ptr: UOp, addr: str) -> str:
        """A load of dt at addr (a pointer expression) from a global, local or register pointer."""
        if ptr.op is not Ops.DEFINE_GLOBAL:  # lanes of an array of scalars (a row buffer), or a value of dt whole
            if dt.count > 1 and _holds_scalars(ptr):
                return self.render_vectorize([f"(*({addr}+{i}))" for i in range(dt.count)], dt)
            return f"(*{addr})"
        if dt.count == 1:
            return self.load_scalar(dt, addr)
        if self.is_native(dt):
            return self.load_native(dt, addr)
        return self.render_vectorize([self.load_scalar(dt.scalar, f"({addr}+{i})") for i in range(dt.count)], dt)

    def render_store(self, dt: DType, ptr: UOp, addr: str, val: str) -> list[str]:
        if ptr.op is not Ops.DEFINE_GLOBAL:
            if dt.count > 1 and _holds_scalars(ptr):
                return [f"*({addr}+{i}) = {self.render_gep(val, dt, i)};" for i in range(dt.count)]
            return [f"*{addr} = {val};"]
        if dt.count == 1:
            return [self.store_scalar(dt, addr, val)]
        if self.is_native(dt):
            return [self.store_native(dt, addr, val)]
        return [self.store_scalar(dt.scalar, f"({addr}+{i})", self.render_gep(val, dt, i)) for i in range(dt.count)]

    def load_scalar(self, dt: DType, addr: str) -> str:
        return f"(*{addr})"

    def store_scalar(self, dt: DType, addr: str, val: str) -> str:
        return f"*{addr} = {val};"

    def load_native(self, dt: DType, addr: str) -> str:
        raise NotImplementedError

    def store_native(self, dt: DType, addr: str, val: str) -> str:
        raise NotImplementedError

    def render_gep(self, x: str, dt: DType, lane: int) -> str:
        return f"{x}.v[{lane}]"

    # ----- the kernel -----
    def special(self, name: str, has_local: bool) -> str:
        raise NotImplementedError

    def kernel_header(self, name: str, params: list[str], local_size: tuple[int, ...]) -> str:
        raise NotImplementedError

    def param(self, dt: PtrDType, name: str) -> str:
        raise NotImplementedError

    def prelude_for(self, uops: list[UOp]) -> str:
        return self.prelude

    def render_kernel(
        self, name: str, ctx: RenderContext[GPURenderer], body: list[str], uops: list[UOp]
    ) -> ProgramSpec:
        sizes = {s.arg: s.src[0].arg for s in ctx.special}
        params = [a for _, a in sorted(ctx.args)] + [f"int var_{v}" for v in ctx.var_names]
        gsize = tuple(sizes.get(f"gidx{i}", 1) for i in range(3))
        lsize = tuple(sizes.get(f"lidx{i}", 1) for i in range(3))
        structs = sorted(
            {
                (self.vtype(d), self.types[d.scalar], d.count)
                for u in uops
                for d in (u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype,)
                if d.count > 1 and not self.is_native(d)
            }
        )
        code = (
            self.prelude_for(uops)
            + "".join(self.struct_decl(*s) for s in structs)
            + self.kernel_header(name, params, lsize)
            + " {\n"
            + "\n".join(body)
            + "\n}\n"
        )
        return ProgramSpec(name, code, len(ctx.args), tuple(ctx.var_names), global_size=gsize, local_size=lsize)


# ***** OpenCL C *****

CL_PRELUDE = """ushort zg_f2h(float x) { ushort h; vstore_half_rte(x, 0, (half*)&h); return h; }
float zg_h2f(ushort h) { return vload_half(0, (half*)&h); }
float zg_rh(float x) { return zg_h2f(zg_f2h(x)); }
"""


def _cl_where_select(ctx: RenderContext[OpenCLRenderer], x: UOp, c: UOp, a: UOp, b: UOp) -> str:
    """A float `c ? a : b` through the select builtin: PoCL compiles `x > 0 ? -0.0f : x` to -0.0 at x = +0.0"""
    mask = "long" if x.dtype == dtypes.float64 else "int"
    return ctx.ren.half_round(x.dtype, f"select({ctx[b]},{ctx[a]},({mask})({ctx[c]}))")


def _cl_bitcast(ctx: RenderContext[OpenCLRenderer], x: UOp, a: UOp) -> str:
    v = f"zg_f2h({ctx[a]})" if a.dtype == dtypes.float16 else ctx[a]
    return f"zg_h2f(as_ushort({v}))" if x.dtype == dtypes.float16 else f"as_{ctx.ren.types[x.dtype]}({v})"


# OpenCL's own rules, before the GPU ones
opencl_rules: list[tuple[UPat, Callable]] = [
    # WHERE(c, a, b) of a float scalar -> select(b, a, (int)c)
    (
        UPat(
            Ops.WHERE,
            src=(UPat.var("c"), UPat.var("a"), UPat.var("b")),
            name="x",
            custom=lambda u: u.dtype.count == 1 and dtypes.is_float(u.dtype),
        ),
        _cl_where_select,
    ),
    # CAST of a native vector -> convert_floatN(v)
    (
        UPat(Ops.CAST, src=(UPat.var("a"),), name="x", custom=_is_vector),
        lambda ctx, a, x: f"convert_{ctx.ren.vtype(x.dtype)}({ctx[a]})",
    ),
    # BITCAST(v) -> as_<type>(v)
    (UPat(Ops.BITCAST, src=(UPat.var("a"),), name="x"), _cl_bitcast),
]


class OpenCLRenderer(GPURenderer):
    """OpenCL C 1.2: `__kernel`, `__global` pointers, `__local` arrays, `barrier`, get_group_id / get_local_id."""

    device = "CL"
    simd_bytes = 64  # float16: PoCL maps wide vectors onto AVX-512
    # typed as the base declares them: __init__ replaces them with the limits the device reports
    global_max: tuple[int, ...] = (2**31 - 1, 2**31 - 1, 2**31 - 1)
    local_max: tuple[int, ...] = (256, 256, 256)
    local_threads_max = 256
    types = {
        dtypes.bool: "bool",
        dtypes.int8: "char",
        dtypes.uint8: "uchar",
        dtypes.int16: "short",
        dtypes.uint16: "ushort",
        dtypes.int32: "int",
        dtypes.uint32: "uint",
        dtypes.int64: "long",
        dtypes.uint64: "ulong",
        dtypes.float16: "float",
        dtypes.bfloat16: "ushort",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    mem_types = {dtypes.bool: "uchar", dtypes.float16: "half"}  # no bool kernel arguments; half only in memory
    native_vector_counts = (2, 4, 8, 16)
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    shared = "__local "
    string_rewrite = PatternMatcher(opencl_rules + gpu_rules + cfamily_rules)
    code_for_op = gpu_code_for_op("")

    def __init__(
        self,
        global_max: tuple[int, ...] | None = None,
        local_max: tuple[int, ...] | None = None,
        local_threads_max: int | None = None,
    ):
        if global_max is not None:
            self.global_max = global_max
        if local_max is not None:
            self.local_max = local_max
        if local_threads_max is not None:
            self.local_threads_max = local_threads_max

    def prelude_for(self, uops: list[UOp]) -> str:
        fp64 = any((u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar == dtypes.float64 for u in uops)
        return ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if fp64 else "") + CL_PRELUDE

    def struct_decl(self, name: str, scalar: str, n: int) -> str:
        return f"typedef struct {{ {scalar} v[{n}]; }} {name};\n"

    def vtype(self, dt: DType) -> str:
        if dt.count > 1 and self.is_native(dt) and dt.scalar == dtypes.float16:
            return f"float{dt.count}"
        return super().vtype(dt)

    def float_literal(self, x: float, dt: DType) -> str:
        if math.isnan(x):
            return "NAN" if dt != dtypes.float64 else "(double)NAN"
        if math.isinf(x):
            return (
                ("INFINITY" if x > 0 else "(-INFINITY)")
                if dt != dtypes.float64
                else ("(double)INFINITY" if x > 0 else "(-(double)INFINITY)")
            )
        return repr(float(x)) + ("" if dt == dtypes.float64 else "f")

    def long_literal(self, x: int, dt: DType) -> str:
        if dt == dtypes.uint64:
            return f"{x}ul"
        return f"{x}l" if x != dtypes.min(dt) else "(-9223372036854775807l-1)"

    def render_vectorize(self, lanes: list[str], dt: DType) -> str:
        if self.is_native(dt):
            return f"({self.vtype(dt)})({', '.join(lanes)})"
        return f"(({self.vtype(dt)}){{{{{', '.join(lanes)}}}}})"

    def render_gep(self, x: str, dt: DType, lane: int) -> str:
        return f"{x}.s{lane:x}" if self.is_native(dt) else f"{x}.v[{lane}]"

    def reinterpret(self, x: str, frm: DType, to: DType) -> str:
        return f"as_{self.vtype(to)}({x})" if to.count > 1 else super().reinterpret(x, frm, to)

    def load_scalar(self, dt: DType, addr: str) -> str:
        return f"vload_half(0, {addr})" if dt == dtypes.float16 else f"(*{addr})"

    def store_scalar(self, dt: DType, addr: str, val: str) -> str:
        return f"vstore_half_rte({val}, 0, {addr});" if dt == dtypes.float16 else f"*{addr} = {val};"

    def load_native(self, dt: DType, addr: str) -> str:
        return f"vload_half{dt.count}(0, {addr})" if dt.scalar == dtypes.float16 else f"vload{dt.count}(0, {addr})"

    def store_native(self, dt: DType, addr: str, val: str) -> str:
        if dt.scalar == dtypes.float16:
            return f"vstore_half{dt.count}_rte({val}, 0, {addr});"
        return f"vstore{dt.count}({val}, 0, {addr});"

    def special(self, name: str, has_local: bool) -> str:
        fn = "get_local_id" if name.startswith("lidx") else "get_group_id" if has_local else "get_global_id"
        return f"(int){fn}({name[4:]})"

    def param(self, dt: PtrDType, name: str) -> str:
        return f"__global {self.mem_vtype(dt.base)}* restrict {name}"

    def kernel_header(self, name: str, params: list[str], local_size: tuple[int, ...]) -> str:
        return f"__kernel void {name}({', '.join(params)})"


# ***** CUDA C *****

CUDA_PRELUDE = """__device__ __forceinline__ float zg_h2f(unsigned short h) { float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short zg_f2h(float f) { unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float zg_rh(float x) { return zg_h2f(zg_f2h(x)); }
"""


def _cuda_bitcast(ctx: RenderContext[CUDARenderer], x: UOp, a: UOp) -> str:
    """BITCAST(v) -> its bytes copied (half values are floats: through their 16 bits)"""
    src_t = "unsigned short" if a.dtype == dtypes.float16 else ctx.ren.types[a.dtype]
    dst_t = "unsigned short" if x.dtype == dtypes.float16 else ctx.ren.types[x.dtype]
    val = f"zg_f2h({ctx[a]})" if a.dtype == dtypes.float16 else ctx[a]
    ret = f"[&]{{ {src_t} s_ = {val}; {dst_t} d_; memcpy(&d_, &s_, sizeof(d_)); return d_; }}()"
    return f"zg_h2f({ret})" if x.dtype == dtypes.float16 else ret


# CUDA's own rules, before the GPU ones (no vector CAST: CUDA casts vectors lane by lane)
cuda_rules: list[tuple[UPat, Callable]] = [(UPat(Ops.BITCAST, src=(UPat.var("a"),), name="x"), _cuda_bitcast)]


class CUDARenderer(GPURenderer):
    """CUDA C for NVRTC / nvcc: `extern "C" __global__`, blockIdx / threadIdx, `__shared__`, `__syncthreads()`."""

    device = "CUDA"
    types = {
        dtypes.bool: "bool",
        dtypes.int8: "signed char",
        dtypes.uint8: "unsigned char",
        dtypes.int16: "short",
        dtypes.uint16: "unsigned short",
        dtypes.int32: "int",
        dtypes.uint32: "unsigned int",
        dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long",
        dtypes.float16: "float",
        dtypes.bfloat16: "unsigned short",
        dtypes.float32: "float",
        dtypes.float64: "double",
    }
    mem_types = {dtypes.float16: "unsigned short"}
    prelude = CUDA_PRELUDE
    barrier = "__syncthreads();"
    shared = "__shared__ "
    string_rewrite = PatternMatcher(cuda_rules + gpu_rules + cfamily_rules)

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch

    def struct_decl(self, name: str, scalar: str, n: int) -> str:
        return f"struct {name} {{ {scalar} v[{n}]; }};\n"

    def float_literal(self, x: float, dt: DType) -> str:
        if math.isnan(x) or math.isinf(x):
            if dt == dtypes.float64:
                bits = struct.unpack("<q", struct.pack("<d", x))[0]
                return f"__longlong_as_double({bits}ll)"
            return (
                "__int_as_float(0x7fc00000)"
                if math.isnan(x)
                else "__int_as_float(0x7f800000)"
                if x > 0
                else "__int_as_float(0xff800000)"
            )
        return repr(float(x)) + ("" if dt == dtypes.float64 else "f")

    def render_vectorize(self, lanes: list[str], dt: DType) -> str:
        return f"{self.vtype(dt)}{{{{{', '.join(lanes)}}}}}"

    def load_scalar(self, dt: DType, addr: str) -> str:
        return f"zg_h2f(*{addr})" if dt == dtypes.float16 else f"(*{addr})"

    def store_scalar(self, dt: DType, addr: str, val: str) -> str:
        return f"*{addr} = zg_f2h({val});" if dt == dtypes.float16 else f"*{addr} = {val};"

    def special(self, name: str, has_local: bool) -> str:
        return f"{'threadIdx' if name.startswith('lidx') else 'blockIdx'}.{'xyz'[int(name[4:])]}"

    def param(self, dt: PtrDType, name: str) -> str:
        return f"{self.mem_vtype(dt.base)}* __restrict__ {name}"

    def kernel_header(self, name: str, params: list[str], local_size: tuple[int, ...]) -> str:
        threads = local_size[0] * local_size[1] * local_size[2]
        return f'extern "C" __global__ void __launch_bounds__({threads}) {name}({", ".join(params)})'
