"""The NULL device: kernels are rendered (C) but neither compiled nor run, for codegen tests and search dry runs.

Buffers are ordinary host memory (copies in and out work); a kernel's output keeps whatever the memory held.
"""

from __future__ import annotations

from zeptograd.device import CompiledDevice, Compiler, HostAllocator, Program
from zeptograd.helpers import ArgumentError
from zeptograd.renderer import ProgramSpec
from zeptograd.renderer.cstyle import CStyleRenderer


class NullRenderer(CStyleRenderer):
    device = "NULL"


class NullCompiler(Compiler):
    key = "null"
    disk_cached = False  # nothing is compiled

    def compile(self, src: str) -> bytes:
        return b""


class NullProgram(Program):
    def __call__(self, *ptrs: int, vals: tuple[int, ...] = ()):
        pass


class NullDevice(CompiledDevice):
    beam_timing = False  # it runs nothing
    shares_programs = True  # its programs run nothing: NULL:1 takes NULL's

    def build(self, spec: ProgramSpec) -> NullProgram:
        return NullProgram(spec)


def open_device(name: str) -> NullDevice:
    kind, *fields = name.split(":")
    if kind != "NULL" or len(fields) > 1 or (fields and not fields[0].isdigit()):
        raise ArgumentError(f"unknown NULL backend {name!r}; available: NULL, NULL:N")
    return NullDevice(name, NullRenderer(), NullCompiler(), HostAllocator())
