"""zeptograd: a small tensor compiler. A lazy Tensor, one IR of UOps, rewrites, C code generation."""

from zeptograd import nn
from zeptograd.device import Device, GlobalCounters
from zeptograd.dtype import dtypes
from zeptograd.engine.jit import TinyJit
from zeptograd.helpers import Context, getenv
from zeptograd.tensor import Tensor

__all__ = ["Tensor", "dtypes", "Device", "Context", "getenv", "GlobalCounters", "TinyJit", "nn"]
