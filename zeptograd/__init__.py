"""zeptograd: a small tensor compiler. A lazy Tensor, one IR of UOps, rewrites, C code generation.

`nn` and `TinyJit` are imported on first use (PEP 562 `__getattr__`): a program that only computes with Tensors
never compiles or runs their modules, which keeps `import zeptograd` short.
"""

from zeptograd.device import Device, GlobalCounters
from zeptograd.dtype import dtypes
from zeptograd.helpers import Context, getenv
from zeptograd.tensor import Tensor
from zeptograd.uop.variable import Variable

__all__ = ["Tensor", "dtypes", "Device", "Context", "getenv", "GlobalCounters", "TinyJit", "Variable", "nn"]


def __getattr__(name: str):
    if name == "nn":
        import zeptograd.nn as nn

        return nn
    if name == "TinyJit":
        from zeptograd.engine.jit import TinyJit

        globals()["TinyJit"] = TinyJit
        return TinyJit
    raise AttributeError(f"module 'zeptograd' has no attribute {name!r}")
