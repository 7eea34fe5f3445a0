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


class Renderer:
    device = "base"

    def render(self, name: str, uops: list[UOp]) -> ProgramSpec:
        raise NotImplementedError
