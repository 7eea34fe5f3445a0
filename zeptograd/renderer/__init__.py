"""Renderers turn linearized UOps into source. `ProgramSpec` is what a runtime needs to call the result."""

from __future__ import annotations

from dataclasses import dataclass

from zeptograd.uop.ops import UOp


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
