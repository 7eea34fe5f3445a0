"""GPU dialects of the C renderer: OpenCL C and CUDA C.

One line per linear UOp, as in `cstyle.py`; what differs by dialect is a handful of hooks (thread ids, address
spaces, barriers, vectors, type names). Shared conventions:

- half values are computed as `float` and rounded to half after every op (`zg_rh`), so results match a device
  with native half math without needing one (PoCL has no cl_khr_fp16); in memory they are 16-bit halves.
- bfloat16 values are their 16 bits (`ushort`), converted with `zg_bf2f` / `zg_f2bf` as in the C renderer.
- vectors: OpenCL's native `floatN` (N = 2, 4, 8, 16; vloadN/vstoreN), else (CUDA, bool, other widths) a struct
  `zg_<type>x<N> { <type> v[N]; }` handled lane by lane.
- thread ids: SPECIAL `gidxN` (group id), `lidxN` (local id); `ProgramSpec.global_size` counts groups and
  `local_size` threads per group. An OpenCL kernel without local ids uses global ids and lets the runtime
  pick the work-group size.
"""

from __future__ import annotations

import math
import struct

from zeptograd.dtype import DType, PtrDType, dtypes
from zeptograd.renderer import ProgramSpec, Renderer, loop_var, wrapping_dtype
from zeptograd.uop.ops import GroupOp, Ops, UOp

_NATIVE_OPS = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.MULACC}
_FLOAT_NATIVE_OPS = {Ops.FDIV, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN, Ops.SQRT, Ops.TRUNC, Ops.RECIPROCAL}
_SMALL = (dtypes.float16, dtypes.bfloat16, dtypes.bool)


class GPURenderer(Renderer):
    device = "GPU"
    has_local = True  # codegen makes work-group threads (codegen/gpudims.py, opt/heuristic_gpu.py)
    alu_trig = True  # OpenCL allows sin/cos 4 ulp and tan 5 (PoCL's tan is 2.3 ulp off), CUDA's tanf 4
    has_threads = False
    simd_bytes = 16
    global_max: tuple[int, ...] = (2**31 - 1, 65535, 65535)  # group counts per id
    local_max: tuple[int, ...] = (1024, 1024, 64)  # threads per work-group per id
    local_threads_max = 1024  # threads per work-group
    # dialect
    types: dict[DType, str] = {}  # value types
    mem_types: dict[DType, str] = {}  # element types in global memory where they differ
    native_vector_counts: tuple[int, ...] = ()
    prelude = ""
    barrier = ""
    shared = ""  # the DEFINE_LOCAL qualifier
    float_suffix = "f"  # exp2f (CUDA) or exp2 (OpenCL: overloaded builtins)

    # ----- types -----
    def is_native(self, dt: DType) -> bool:
        return dt.count in self.native_vector_counts and dt.scalar != dtypes.bool

    def vtype(self, dt: DType) -> str:
        """The type of a value (a vector: native or struct)."""
        if dt.count == 1:
            return self.types[dt]
        scalar = self.types[dt.scalar]
        return f"{scalar}{dt.count}" if self.is_native(dt) else f"zg_{scalar.replace(' ', '_')}x{dt.count}"

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
        if dt == dtypes.bfloat16:
            bits = struct.unpack("<I", struct.pack("<f", x))[0] >> 16
            return f"(({self.types[dt]}){bits}u)"
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
        if frm == dtypes.bfloat16:
            return f"zg_bf2f({x})"  # codegen routes every other bf16 cast through float32
        if to == dtypes.bfloat16:
            return f"zg_f2bf({x})"
        if to == dtypes.float16:
            return f"zg_rh((float)({x}))"
        return f"({self.types[to]})({x})"

    def render_vector_cast(self, to: DType, x: str) -> str:
        raise NotImplementedError

    def render_bitcast(self, to: DType, frm: DType, x: str) -> str:
        raise NotImplementedError

    def reinterpret(self, x: str, frm: DType, to: DType) -> str:
        """x as an int of another signedness (a wider one for scalars): a C cast, modulo 2^n back to signed."""
        return f"(({self.vtype(to)}){x})"

    # ----- ALU -----
    def math_fn(self, name: str, dt: DType, a: str) -> str:
        fn = name + (self.float_suffix if dt.scalar != dtypes.float64 else "")
        return f"{fn}({a})"

    def render_alu(self, op: Ops, dt: DType, srcs: list[str], src_dts: list[DType], wrap: DType | None = None) -> str:
        """wrap: the unsigned dtype to compute an integer op in so that it wraps around (`wrapping_dtype`)."""
        if wrap is not None:
            n = 1 if op is Ops.SHL else len(srcs)  # a shift's count stays as it is
            wide = [self.reinterpret(x, sdt, wrap) for x, sdt in zip(srcs[:n], src_dts)] + srcs[n:]
            return self.reinterpret(self.render_alu(op, wrap, wide, [wrap] * len(srcs)), wrap, dt)
        a = srcs[0]
        if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN, Ops.SQRT, Ops.TRUNC):
            ret = self.math_fn(op.name.lower(), dt, a)
        elif op is Ops.RECIPROCAL:
            ret = f"(({self.types[dt.scalar]})1/{a})"
        elif op is Ops.NEG:
            ret = f"(!{a})" if dt.scalar == dtypes.bool else f"(-{a})"
        elif op is Ops.MAX:
            nan = f"||({a}!={a})" if dtypes.is_float(dt.scalar) else ""  # NaN wins, as numpy/torch's max
            ret = f"((({a}>{srcs[1]}){nan})?{a}:{srcs[1]})"
        elif op is Ops.WHERE:
            ret = self.render_where(dt, a, srcs[1], srcs[2])
        elif op is Ops.MULACC:
            ret = self.render_fma(dt, *srcs) if dtypes.is_float(dt.scalar) else f"(({a}*{srcs[1]})+{srcs[2]})"
        else:
            sym = {
                Ops.ADD: "+",
                Ops.SUB: "-",
                Ops.MUL: "*",
                Ops.FDIV: "/",
                Ops.IDIV: "/",
                Ops.MOD: "%",
                Ops.CMPLT: "<",
                Ops.CMPNE: "!=",
                Ops.CMPEQ: "==",
                Ops.AND: "&",
                Ops.OR: "|",
                Ops.XOR: "^",
                Ops.SHL: "<<",
                Ops.SHR: ">>",
            }[op]
            if dt.scalar == dtypes.bool and op in (Ops.ADD, Ops.MUL):
                sym = {Ops.ADD: "|", Ops.MUL: "&"}[op]
            ret = f"({a}{sym}{srcs[1]})"
        return f"zg_rh({ret})" if dt == dtypes.float16 else ret

    def render_fma(self, dt: DType, a: str, b: str, c: str) -> str:
        return f"fma({a},{b},{c})"

    def render_where(self, dt: DType, c: str, a: str, b: str) -> str:
        return f"({c}?{a}:{b})"

    # ----- memory -----
    def render_load(self, dt: DType, ptr: UOp, addr: str) -> str:
        """A load of dt at addr (a pointer expression) from a global, local or register pointer."""
        if ptr.op is not Ops.DEFINE_GLOBAL:
            return f"(*{addr})"
        if dt.count == 1:
            return self.load_scalar(dt, addr)
        if self.is_native(dt):
            return self.load_native(dt, addr)
        return self.render_vectorize([self.load_scalar(dt.scalar, f"({addr}+{i})") for i in range(dt.count)], dt)

    def render_store(self, dt: DType, ptr: UOp, addr: str, val: str) -> list[str]:
        if ptr.op is not Ops.DEFINE_GLOBAL:
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

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        r: dict[UOp, str] = {}
        lines: list[str] = []
        args: list[tuple[int, str]] = []
        var_names: list[str] = []
        counts: dict[str, int] = {}
        sizes: dict[str, int] = {}
        depth = 1
        has_local = any(u.op is Ops.SPECIAL and u.arg.startswith("lidx") for u in uops)

        def new_name(prefix: str) -> str:
            counts[prefix] = counts.get(prefix, 0) + 1
            return f"{prefix}{counts[prefix] - 1}"

        def emit(line: str):
            lines.append("  " * depth + line)

        def decl(u: UOp, prefix: str, expr: str):
            r[u] = new_name(prefix)
            emit(f"{self.vtype(u.dtype)} {r[u]} = {expr};")

        for u in uops:
            op, dt, src = u.op, u.dtype, u.src
            if op is Ops.DEFINE_GLOBAL:
                r[u] = f"data{u.arg}"
                args.append((u.arg, self.param(dt, r[u])))  # type: ignore[arg-type]
            elif op is Ops.DEFINE_VAR:
                r[u] = f"var_{u.arg[0]}"  # prefixed: a Variable's name never meets a C keyword or a local
                var_names.append(u.arg[0])
            elif op is Ops.SPECIAL:
                if u.arg[:4] not in ("gidx", "lidx"):
                    raise NotImplementedError(f"{self.device} has no thread index {u.arg!r}")
                r[u] = u.arg
                sizes[u.arg] = src[0].arg
                emit(f"int {u.arg} = {self.special(u.arg, has_local)};")
            elif op is Ops.CONST:
                r[u] = self.render_const(u.arg, dt)
            elif op is Ops.DEFINE_REG:
                acc = new_name("acc")
                if dt.size == 1:  # type: ignore[attr-defined]
                    emit(f"{self.vtype(dt.base)} {acc};")  # type: ignore[attr-defined]
                    r[u] = f"(&{acc})"
                else:
                    emit(f"{self.vtype(dt.base)} {acc}[{dt.size}];")  # type: ignore[attr-defined]
                    r[u] = acc
            elif op is Ops.DEFINE_LOCAL:
                r[u] = u.arg
                emit(f"{self.shared}{self.vtype(dt.base)} {u.arg}[{dt.size}];")  # type: ignore[attr-defined]
            elif op is Ops.BARRIER:
                emit(self.barrier)
            elif op is Ops.RANGE:
                r[u] = loop_var(u)
                emit(f"for ({self.vtype(dt)} {r[u]} = 0; {r[u]} < {r[src[0]]}; {r[u]}++) {{")
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
                load = self.render_load(dt, idx.src[0], r[idx])
                if len(idx.src) > 2:  # gated: an index outside the valid region reads 0
                    load = f"({r[idx.src[2]]}?{load}:{self.render_const(0, dt)})"
                decl(u, "val", load)
            elif op is Ops.STORE:
                idx, val = src
                stores = self.render_store(val.dtype, idx.src[0], r[idx], r[val])
                if len(idx.src) > 2:
                    stores = [f"if ({r[idx.src[2]]}) {{ {' '.join(stores)} }}"]
                for s in stores:
                    emit(s)
            elif op is Ops.VECTORIZE:
                decl(u, "vec", self.render_vectorize([r[s] for s in src], dt))
            elif op is Ops.GEP:
                if len(u.arg) == 1:
                    r[u] = self.render_gep(r[src[0]], src[0].dtype, u.arg[0])
                else:
                    decl(
                        u,
                        "vec",
                        self.render_vectorize([self.render_gep(r[src[0]], src[0].dtype, i) for i in u.arg], dt),
                    )
            elif op in (Ops.GROUP, Ops.NOOP):
                pass
            elif op is Ops.CAST:
                if dt.count > 1:
                    decl(u, "cast", self.render_vector_cast(dt, r[src[0]]))
                else:
                    decl(u, "cast", self.render_cast(dt, src[0].dtype, r[src[0]]))
            elif op is Ops.BITCAST:
                decl(u, "bits", self.render_bitcast(dt, src[0].dtype, r[src[0]]))
            elif op in GroupOp.ALU:
                srcs, src_dts = [r[s] for s in src], [s.dtype for s in src]
                decl(u, "alu", self.render_alu(op, dt, srcs, src_dts, wrapping_dtype(u)))
            else:
                raise NotImplementedError(f"the {self.device} renderer has no rule for {op}")

        params = [a for _, a in sorted(args)] + [f"int var_{v}" for v in var_names]
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
            + "\n".join(lines)
            + "\n}\n"
        )
        return ProgramSpec(name, code, len(args), tuple(var_names), global_size=gsize, local_size=lsize)  # type: ignore

    def prelude_for(self, uops: list[UOp]) -> str:
        return self.prelude


# ***** OpenCL C *****

CL_PRELUDE = """ushort zg_f2h(float x) { ushort h; vstore_half_rte(x, 0, (half*)&h); return h; }
float zg_h2f(ushort h) { return vload_half(0, (half*)&h); }
float zg_rh(float x) { return zg_h2f(zg_f2h(x)); }
float zg_bf2f(ushort x) { return as_float((uint)x << 16); }
ushort zg_f2bf(float f) { uint u = as_uint(f); if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 64u);
  u += 0x7fffu + ((u >> 16) & 1u); return (ushort)(u >> 16); }
"""


class OpenCLRenderer(GPURenderer):
    """OpenCL C 1.2: `__kernel`, `__global` pointers, `__local` arrays, `barrier`, get_group_id / get_local_id."""

    device = "CL"
    simd_bytes = 64  # float16: PoCL maps wide vectors onto AVX-512
    global_max = (2**31 - 1, 2**31 - 1, 2**31 - 1)
    local_max = (256, 256, 256)
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
    float_suffix = ""

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
        fp64 = any(
            (u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar == dtypes.float64  # type: ignore
            for u in uops
        )
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

    def render_vector_cast(self, to: DType, x: str) -> str:
        return f"convert_{self.vtype(to)}({x})"

    def reinterpret(self, x: str, frm: DType, to: DType) -> str:
        return f"as_{self.vtype(to)}({x})" if to.count > 1 else super().reinterpret(x, frm, to)

    def render_bitcast(self, to: DType, frm: DType, x: str) -> str:
        if frm == dtypes.float16:
            x = f"zg_f2h({x})"
        return f"zg_h2f(as_ushort({x}))" if to == dtypes.float16 else f"as_{self.types[to]}({x})"

    def render_fma(self, dt: DType, a: str, b: str, c: str) -> str:
        return f"fma({a},{b},{c})"

    def render_where(self, dt: DType, c: str, a: str, b: str) -> str:
        """A float `c ? a : b` through the select builtin: PoCL compiles `x > 0 ? -0.0f : x` to -0.0 at x = +0.0"""
        if dt.count == 1 and dtypes.is_float(dt):
            return f"select({b},{a},({'long' if dt == dtypes.float64 else 'int'})({c}))"
        return super().render_where(dt, c, a, b)

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
__device__ __forceinline__ float zg_bf2f(unsigned short x) { return __uint_as_float((unsigned int)x << 16); }
__device__ __forceinline__ unsigned short zg_f2bf(float f) { unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 64u);
  u += 0x7fffu + ((u >> 16) & 1u); return (unsigned short)(u >> 16); }
"""


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

    def render_vector_cast(self, to: DType, x: str) -> str:
        raise NotImplementedError("CUDA casts vectors lane by lane")

    def render_bitcast(self, to: DType, frm: DType, x: str) -> str:
        src_t = "unsigned short" if frm == dtypes.float16 else self.types[frm]
        dst_t = "unsigned short" if to == dtypes.float16 else self.types[to]
        val = f"zg_f2h({x})" if frm == dtypes.float16 else x
        ret = f"[&]{{ {src_t} s_ = {val}; {dst_t} d_; memcpy(&d_, &s_, sizeof(d_)); return d_; }}()"
        return f"zg_h2f({ret})" if to == dtypes.float16 else ret

    def render_fma(self, dt: DType, a: str, b: str, c: str) -> str:
        return f"fma{'f' if dt.scalar != dtypes.float64 else ''}({a},{b},{c})"

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
