"""The ONNX ops as zeptograd Tensor compositions. Each op is `fn(runner, node, *inputs)`; absent optional inputs are
None. Values that decide shapes (Reshape's shape, Slice's starts, TopK's k, ...) are read back to the host: ONNX
shapes are data, and each call builds its graph for the values it is given. The ops live in the ops_* modules, each
registering its own in OPS when imported."""

from . import ops_host, ops_math, ops_nn, ops_other, ops_recurrent, ops_resample, ops_tensor
from .oputil import OPS

__all__ = ["OPS", "ops_host", "ops_math", "ops_nn", "ops_other", "ops_recurrent", "ops_resample", "ops_tensor"]
