"""Renderers turn linearized UOps into source. `ProgramSpec` is what a runtime needs to call the result."""

from __future__ import annotations

from dataclasses import dataclass

from zeptograd.dtype import DType, dtypes
from zeptograd.uop.ops import Ops, UOp, _alu_range


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    src: str
    n_bufs: int  # pointer arguments, in DEFINE_GLOBAL order
    vars: tuple[str, ...] = ()  # int arguments after the pointers, in DEFINE_VAR order
    global_size: tuple[int, int, int] = (1, 1, 1)  # GPU groups; on CPU, global_size[0] is the number of cores
    local_size: tuple[int, int, int] = (1, 1, 1)  # GPU work-group size
    # a CPU kernel threaded over a symbolic loop: its loop iterations as a Python expression of `vars`; where that is
    # below MIN_THREAD_WORK at a call's values its cores run one after another in the caller (no pool handoff)
    work: str | None = None


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


class Renderer:
    device = "base"
    simd_bytes = 64  # the widest vector the optimizer makes (AVX-512: 16 floats)
    has_threads = True  # kernels may take a core_id and run on several cores
    alu_transcendentals = False  # vector exp2/log2/sin/cos/tan written as ALU ops (codegen/transcendental.py)
    alu_trig = False  # float sin/cos/tan written as ALU ops also as scalars: the target's own are not within 2 ulp
    masked_vectors = False  # a vector load/store may take a vector of gates (one per lane); else it is split in lanes

    def keeps_vector(self, x: UOp) -> bool:
        """Whether the target computes x (an ALU, CAST or BITCAST with a vector dtype) as one vector op."""
        return True

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        raise NotImplementedError
