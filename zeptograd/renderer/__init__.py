"""Renderers turn linearized UOps into source. `ProgramSpec` is what a runtime needs to call the result."""

from __future__ import annotations

import os
from dataclasses import dataclass

from zeptograd.dtype import DType, dtypes
from zeptograd.uop.ops import Ops, UOp, _alu_range

# loop iterations below which a second core costs more than it saves: a kernel split over 2 cores pays ~45-50 us of
# handoff on this AVX-512 VM (waking the idle vCPU, the pool's lock and GIL), more than the 1-20 us most kernels of a
# small training step take on one core (1 << 15, set on an AVX2 host, split 47 of digits_train's 85 kernels: its
# TinyJit step 2.84 -> 0.89 ms at 1 << 20, torch 1.23-1.61; mlp_train 1.16 -> 0.80 ms, torch 0.89-1.12)
MIN_THREAD_WORK = 1 << 20


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    src: str
    n_bufs: int  # pointer arguments, in DEFINE_GLOBAL order
    vars: tuple[str, ...] = ()  # int arguments after the pointers, in DEFINE_VAR order
    global_size: tuple[int, int, int] = (1, 1, 1)  # GPU groups per id; a CPU kernel's is (cores, 1, 1)
    local_size: tuple[int, int, int] = (1, 1, 1)  # GPU work-group size
    # a CPU kernel threaded over a symbolic loop: its loop iterations as a Python expression of `vars`; where that is
    # below MIN_THREAD_WORK at a call's values its cores run one after another in the caller (no pool handoff)
    work: str | None = None

    @property
    def cores(self) -> int:
        """A CPU kernel (a renderer without has_local) with cores > 1 takes its core_id as its last int argument and
        is called once per core; with 1 it takes none and is called once."""
        return self.global_size[0]


def loop_var(r) -> str:
    """The C name of a RANGE's loop variable: ridx<axis id>; a cache block's loop (TILE) has a negative id."""
    return f"ridx{r.arg[0]}" if r.arg[0] >= 0 else f"ridxb{-r.arg[0]}"


def reject_bf16_cast(frm: DType, to: DType) -> None:
    """A renderer knows bf16 only as its raw bits: its conversions are integer ops made in codegen (lower.py)."""
    if frm.scalar != to.scalar and dtypes.bfloat16 in (frm.scalar, to.scalar):
        raise NotImplementedError(f"a {frm} -> {to} cast reached the renderer: codegen/lower.py lowers bf16 casts")


_WRAPPING_OPS = (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.SHL, Ops.MULACC)
_UNSIGNED = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def wrapping_dtype(u: UOp) -> DType | None:
    """The unsigned dtype a C-family renderer computes the integer op u in, or None where the plain C op is defined.

    Signed overflow is undefined in C (and OpenCL C, CUDA): compilers assume it can't happen, so `x + 1 > x` is true
    at INT_MAX. A user's ints wrap (torch, numpy), so an op whose exact result may leave its dtype (value ranges
    can't show it stays inside: loaded values) is computed in unsigned and cast back; index arithmetic the value
    ranges bound keeps the plain op and the compiler's optimizations. Scalars are computed in at least 32 bits: C
    promotes narrower unsigned ints to (signed) int, where 65535 * 65535 overflows; vectors are not promoted."""
    dt = u.dtype.scalar
    if u.op not in _WRAPPING_OPS or not dtypes.is_int(dt) or (dtypes.is_unsigned(dt) and dt.itemsize >= 4):
        return None
    exact = _alu_range(u.op, [s.vrange for s in u.src]) if u.op not in (Ops.SHL, Ops.MULACC) else None
    if exact is not None and dtypes.min(dt) <= exact[0] and exact[1] <= dtypes.max(dt):
        return None
    if u.dtype.count > 1:
        return _UNSIGNED[dt.itemsize].vec(u.dtype.count)
    return _UNSIGNED[max(dt.itemsize, 4)]


def simd_bytes_for(features: set[str]) -> int:
    """The widest vector (in bytes) a CPU with these features (LLVM's names: `avx512f`, `avx2`, `avx`, `sse2`, `neon`)
    has registers for, which is how wide a CPU renderer's vectors are (`Renderer.simd_bytes`): AVX-512 64 bytes (16
    floats), AVX 32 (8 floats), else 16 (4 floats: SSE, NEON). Wider vectors than the registers are legal in LLVM IR
    and C, but each op is split in halves and a register tile of them spills (8 rows x 2 vectors of 16 lanes are 32
    ymm registers where AVX2 has 16)."""
    return 64 if "avx512f" in features else 32 if "avx" in features or "avx2" in features else 16


def cpu_simd_bytes(host: int) -> int:
    """The vector width CPU kernels use: the host's (`host`), or narrower where the SIMD_BYTES knob says so (16, 32
    or 64; a width over the host's is the host's). Narrower vectors also mean the register tiles of a host with that
    many registers (codegen/opt/tiles.py: `vector_registers`), so SIMD_BYTES=32 on an AVX-512 host compiles the
    kernels an AVX2 host would (with AVX-512 instructions where the compiler picks them)."""
    knob = os.getenv("SIMD_BYTES", "")
    if knob == "":
        return host
    if knob not in ("16", "32", "64"):
        raise ValueError(f"SIMD_BYTES={knob!r}: the vector width in bytes must be 16, 32 or 64")
    return min(host, int(knob))


class Renderer:
    """What codegen asks of a target, and `render`. A backend's renderer subclasses it, sets the fields where its
    target differs and implements `render`; tests/backend/test_conformance.py checks the fields' types."""

    device: str = "base"
    simd_bytes: int = 64  # the widest vector the optimizer makes (AVX-512: 16 floats); CPU backends: the host's
    has_threads: bool = True  # kernels may take a core_id and run on several cores (ProgramSpec.cores)
    # GPU work-group threads and local memory: codegen maps loops to thread ids (codegen/gpudims.py) within the
    # limits below, and the GPU heuristic (codegen/opt/heuristic_gpu.py) replaces the CPU one
    has_local: bool = False
    global_max: tuple[int, ...] = ()  # has_local: the most groups per id
    local_max: tuple[int, ...] = ()  # has_local: the most threads per work-group per id
    local_threads_max: int = 0  # has_local: the most threads per work-group
    local_memory_bytes: int = 0  # has_local: the local (shared) memory a work-group's arrays may take
    # the vector exp2/log2/sin/cos/tan written as ALU ops (codegen/transcendental.py): polynomials that stay vectors
    alu_transcendentals: frozenset[Ops] = frozenset()
    alu_trig: bool = False  # float sin/cos/tan as ALU ops also as scalars: the target's own are not within 2 ulp
    prefetches: bool = False  # renders PREFETCH: codegen hints the next row of a row re-read (codegen/prefetch.py)
    masked_vectors: bool = False  # a vector load/store may take a vector of gates (one per lane); else split in lanes

    def keeps_vector(self, x: UOp) -> bool:
        """Whether the target computes x (an ALU, CAST or BITCAST with a vector dtype) as one vector op."""
        return True

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        """The linearized kernel `uops` as a program named `name`."""
        raise NotImplementedError
