"""Run ONNX models: `OnnxRunner(model)(inputs)` builds each call's graph lazily from zeptograd Tensor ops.

The model is parsed with the `onnx` package (the `onnx` extra). A node's ONNX type is enforced at its outputs: a
Tensor whose dtype differs from the declared (or inferred) type is cast to it, and types zeptograd has no dtype for
(bfloat16, the float8/float4 formats, int4/uint4/int2/uint2) are emulated at the node boundary: such a value is held
as a numpy array of the ml_dtypes type and an op computes on it in float32 (int8/uint8 for the small ints); its
result is rounded back to the declared type. Strings are numpy object arrays and only the string ops accept them.
Sequences are Python lists, an absent optional value is None.

Repeated calls: a call's graph is a function of its inputs' shapes and dtypes unless an op reads an input-dependent
value on the host (NonZero, a Reshape whose shape is computed from the data, an If's condition). From the second
call with the same input shapes on, the runner builds the graph once more on placeholder inputs whose memory can't
be read (a read raises `_InputRead`): if the build reads none, the graph is kept as a template and later calls only
substitute their inputs into it (SqueezeNet: ~3 ms instead of ~25 ms of Tensor ops per call); if one is read, that
signature is built from the real inputs on every call, as before. A template with Tensor inputs runs under a TinyJit of
its own (engine/jit.py): its first use builds the graph, its second captures the kernels, and later calls replay them
with the call's input buffers and return realized outputs, each call's own (no graph built, walked or scheduled:
DenseNet-121 spent ~22 ms of Python per call there, SqueezeNet ~4 ms). The kernels that read only the model's weights
(a conv's weights copied into the layout its kernel reads: 17 ms of ResNet-50's batch-1 call) run once, at the capture
(prune=True: the runner's weights are its own, never written). A JitError (one buffer given as two inputs) drops the
jit: that template's calls substitute their inputs again.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from zeptograd.buffers import buffer_under, new_buffer_uop, reshape_uop
from zeptograd.device import Buffer
from zeptograd.dtype import DType, dtypes
from zeptograd.engine.jit import JitError, TinyJit
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor import Tensor
from zeptograd.uop.ops import UOp

__all__ = ["OnnxRunner", "OnnxError", "UnsupportedOpError", "onnx_load", "model_summary"]


class OnnxError(ArgumentError):
    """A model the runner can't run: names the node, its op type, the opset and the attribute at fault."""


class UnsupportedOpError(OnnxError):
    """An op (or an op's mode) the runner has no implementation for."""


def _require_onnx():
    try:
        import onnx
    except ImportError as e:  # the optional extra
        raise ImportError("zeptograd.nn.onnx parses models with the onnx package: pip install 'zeptograd[onnx]'") from e
    return onnx


# ONNX TensorProto element types held as zeptograd dtypes
ONNX_DTYPES: dict[int, DType] = {
    1: dtypes.float32,
    2: dtypes.uint8,
    3: dtypes.int8,
    4: dtypes.uint16,
    5: dtypes.int16,
    6: dtypes.int32,
    7: dtypes.int64,
    9: dtypes.bool,
    10: dtypes.float16,
    11: dtypes.float64,
    12: dtypes.uint32,
    13: dtypes.uint64,
}
STRING = 8
# emulated: held as numpy arrays of the ml_dtypes type, computed on as this dtype
EMULATED: dict[int, DType] = {
    16: dtypes.float32,  # bfloat16
    17: dtypes.float32,  # float8e4m3fn
    18: dtypes.float32,  # float8e4m3fnuz
    19: dtypes.float32,  # float8e5m2
    20: dtypes.float32,  # float8e5m2fnuz
    21: dtypes.uint8,  # uint4
    22: dtypes.int8,  # int4
    23: dtypes.float32,  # float4e2m1
    24: dtypes.float32,  # float8e8m0
    25: dtypes.uint8,  # uint2
    26: dtypes.int8,  # int2
}
TYPE_NAMES = {
    0: "UNDEFINED", 1: "FLOAT", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 8: "STRING",
    9: "BOOL", 10: "FLOAT16", 11: "DOUBLE", 12: "UINT32", 13: "UINT64", 14: "COMPLEX64", 15: "COMPLEX128",
    16: "BFLOAT16", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2", 20: "FLOAT8E5M2FNUZ", 21: "UINT4",
    22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2",
}  # fmt: skip


def np_dtype(elem_type: int) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def to_emulated(x: Tensor | np.ndarray, elem_type: int) -> np.ndarray:
    """A computed value rounded to an emulated type (numpy/ml_dtypes does the rounding: to nearest, ties even)."""
    arr = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
    target = np_dtype(elem_type)
    if elem_type in (21, 22, 25, 26):  # the small ints wrap as their two's complement low bits
        bits = 4 if elem_type in (21, 22) else 2
        v = arr.astype(np.int64) & ((1 << bits) - 1)
        if elem_type in (22, 26):
            v = np.where(v >= 1 << (bits - 1), v - (1 << bits), v)
        return v.astype(target)
    return arr.astype(np.float32).astype(target)


def value_to_tensor(v: Any, device: str | None = None) -> Any:
    """A numpy value as the runner computes on it: emulated types widened (float32 / int8 / uint8), strings kept."""
    if isinstance(v, np.ndarray) or np.isscalar(v):
        arr = np.asarray(v)
        if arr.dtype == object or arr.dtype.kind in "SU":
            return arr.astype(object)
        if arr.dtype.kind == "V" or arr.dtype.name in _ML_NAMES:  # an ml_dtypes type
            wide = (
                np.int8
                if arr.dtype.name in ("int4", "int2")
                else np.uint8
                if arr.dtype.name in ("uint4", "uint2")
                else np.float32
            )
            arr = arr.astype(wide)
        return Tensor(arr if arr.flags.c_contiguous else arr.copy(), device=device)
    return v


_ML_NAMES = {
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int4", "uint4", "int2", "uint2",
    "float4_e2m1fn", "float8_e8m0fnu",
}  # fmt: skip


@dataclass
class ValueType:
    """What the graph declares (or shape inference found) for a value: element type and shape (a str is symbolic)."""

    elem_type: int | None
    shape: tuple[int | str | None, ...] | None
    kind: str = "tensor"  # tensor, sequence, optional

    @staticmethod
    def from_proto(tp) -> ValueType:
        which = tp.WhichOneof("value")
        if which == "tensor_type":
            tt = tp.tensor_type
            shape = None
            if tt.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)
            return ValueType(tt.elem_type or None, shape)
        if which == "sequence_type":
            inner = ValueType.from_proto(tp.sequence_type.elem_type) if tp.sequence_type.HasField("elem_type") else None
            return ValueType(inner.elem_type if inner else None, None, "sequence")
        if which == "optional_type":
            inner = ValueType.from_proto(tp.optional_type.elem_type)
            return ValueType(inner.elem_type, inner.shape, "optional")
        return ValueType(None, None, which or "tensor")


def onnx_load(model: Any, load_external_data: bool = True):
    """A ModelProto from a path, bytes, a uint8 Tensor of the file's bytes, or a ModelProto."""
    onnx = _require_onnx()
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, Tensor):
        if model.dtype != dtypes.uint8 or model.ndim != 1:
            raise ArgumentTypeError(
                f"an ONNX model as a Tensor must be 1-d uint8 bytes, got {model.dtype} {model.shape}"
            )
        model = model.numpy().tobytes()
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as e:
            raise OnnxError(f"these {len(model)} bytes are not an ONNX model: {e}") from None
    if isinstance(model, (str, os.PathLike)):
        if not os.path.exists(model):
            raise ArgumentError(f"no ONNX model at {os.fspath(model)!r}")
        try:
            return onnx.load(os.fspath(model), load_external_data=load_external_data)
        except Exception as e:
            raise OnnxError(f"{os.fspath(model)!r} is not a loadable ONNX model: {e}") from None
    raise ArgumentTypeError(f"OnnxRunner takes a path, bytes, a uint8 Tensor or an onnx.ModelProto, got {type(model)}")


class Node:
    """One node as the ops see it: its inputs' names, its attributes (parsed once), the opset of its domain."""

    __slots__ = ("proto", "op_type", "domain", "name", "inputs", "outputs", "attrs", "opset", "out_types")

    def __init__(self, proto, opset: int, out_types: list[ValueType | None]):
        from onnx import helper, numpy_helper

        self.proto, self.op_type, self.domain = proto, proto.op_type, proto.domain or "ai.onnx"
        self.name, self.inputs, self.outputs = proto.name, list(proto.input), list(proto.output)
        self.opset, self.out_types = opset, out_types
        self.attrs: dict[str, Any] = {}
        for a in proto.attribute:
            if a.ref_attr_name:
                raise UnsupportedOpError(f"{self.where()}: attribute {a.name!r} refers to a function attribute")
            v = helper.get_attribute_value(a)
            if a.type == a.TENSOR:
                v = numpy_helper.to_array(v)
            elif a.type == a.TENSORS:
                v = [numpy_helper.to_array(t) for t in v]
            elif a.type == a.STRING:
                v = v.decode()
            elif a.type == a.STRINGS:
                v = [s.decode() for s in v]
            self.attrs[a.name] = v

    def where(self) -> str:
        name = f" {self.name!r}" if self.name else ""
        dom = "" if self.domain == "ai.onnx" else f"{self.domain}."
        return f"node{name} ({dom}{self.op_type}, opset {self.opset})"

    def attr(self, name: str, default: Any = None, choices: tuple | None = None) -> Any:
        v = self.attrs.get(name, default)
        if choices is not None and v not in choices:
            raise UnsupportedOpError(f"{self.where()}: attribute {name}={v!r} is not supported (supported: {choices})")
        return v

    def fail(self, msg: str, unsupported: bool = False) -> OnnxError:
        return (UnsupportedOpError if unsupported else OnnxError)(f"{self.where()}: {msg}")


class Graph:
    """A parsed GraphProto: nodes in order, initializers (numpy), declared/inferred types."""

    def __init__(self, proto, opsets: dict[str, int], types: dict[str, ValueType]):
        from onnx import numpy_helper

        self.proto, self.opsets = proto, opsets
        self.initializers: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in proto.initializer}
        for st in proto.sparse_initializer:
            self.initializers[st.values.name] = _sparse_to_dense(st)
        self.types = dict(types)
        for vi in list(proto.input) + list(proto.output) + list(proto.value_info):
            if vi.type.WhichOneof("value"):
                self.types[vi.name] = ValueType.from_proto(vi.type)
        self.inputs = [vi.name for vi in proto.input]
        self.outputs = [vi.name for vi in proto.output]
        self.input_types = {vi.name: ValueType.from_proto(vi.type) for vi in proto.input}
        self.nodes = []
        for n in proto.node:
            opset = opsets.get(n.domain or "ai.onnx", opsets.get("", 1) if not n.domain else 1)
            self.nodes.append(Node(n, opset, [self.types.get(o) for o in n.output]))


def _sparse_to_dense(st) -> np.ndarray:
    from onnx import numpy_helper

    values, idx = numpy_helper.to_array(st.values), numpy_helper.to_array(st.indices)
    dense = np.zeros(tuple(st.dims), values.dtype)
    if idx.ndim == 1:
        dense.reshape(-1)[idx] = values
    else:
        dense[tuple(idx.T)] = values
    return dense


def _opsets(model) -> dict[str, int]:
    ret = {}
    for o in model.opset_import:
        ret[o.domain or "ai.onnx"] = o.version
    ret.setdefault("ai.onnx", 1)
    ret[""] = ret["ai.onnx"]
    return ret


def _inferred_types(model) -> dict[str, ValueType]:
    """The types shape inference finds for intermediate values. It runs on a copy whose large initializers are
    replaced by typed graph inputs: inference serializes the model, and a 100 MB ResNet-50 took 8 s that way."""
    import onnx
    from onnx import helper, shape_inference

    light = onnx.ModelProto()
    light.ir_version, light.producer_name = model.ir_version, model.producer_name
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.name = model.graph.name
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    declared = {vi.name for vi in model.graph.input}
    for t in model.graph.initializer:
        if np.prod(t.dims, dtype=np.int64) <= 1024 and t.data_location != t.EXTERNAL:
            g.initializer.append(t)  # small ones may be shapes inference reads
        elif t.name not in declared:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        inferred = shape_inference.infer_shapes(light)
    except Exception:  # a model shape inference can't follow still runs, with fewer declared types
        return {}
    return {vi.name: ValueType.from_proto(vi.type) for vi in inferred.graph.value_info if vi.type.WhichOneof("value")}


class _InputRead(Exception):
    """A template build read a placeholder input's value: the call's graph depends on the input data."""


class _Placeholder(Buffer):
    """An input's memory while a template graph is built: never allocated, so any read of it raises _InputRead."""

    def _memory(self):
        raise _InputRead

    @property
    def ptr(self):
        raise _InputRead


@dataclass
class _Template:
    """A call's graph built on placeholder inputs: a later call with the same signature substitutes its inputs."""

    placeholders: dict[str, UOp]  # input name -> the placeholder Tensor's uop
    sink: UOp  # SINK of the outputs' uops
    devices: list[str]  # each output's device
    jit: TinyJit | None = None  # its kernels replayed (calls with Tensor inputs only); None once it raised JitError

    def outputs(self, *inputs: Tensor) -> list[Tensor]:
        """The outputs for `inputs` (the placeholders' order): the template's graph with them substituted."""
        outs = self.sink.substitute({p: t.uop for p, t in zip(self.placeholders.values(), inputs)}).src
        return [Tensor(u, device=d) for u, d in zip(outs, self.devices)]


_SEEN = "seen"  # a signature called once: its second call builds a template

MAX_TEMPLATES = 8  # input signatures kept per runner (oldest dropped first)


class OnnxRunner:
    """`OnnxRunner(model)(inputs)` -> {output name: Tensor}; tinygrad's interface.

    model: a path, bytes, a 1-d uint8 Tensor of the file or an `onnx.ModelProto`. inputs: {name: Tensor, numpy
    array, Python scalar or list}; a graph input with an initializer may be left out. Symbolic dimensions
    (dim_param) take any size (the graph is built for each call's shapes, then scheduled and cached by shape).
    Sequences come back as lists, emulated types (bfloat16, float8, int4, ...) as numpy arrays of ml_dtypes types.
    """

    def __init__(self, model: Any, device: str | None = None):
        self.model = onnx_load(model)
        self.device = device
        self._scope: dict[str, Any] = {}  # the values a subgraph (If/Loop/Scan body) sees of its enclosing graph
        self.opsets = _opsets(self.model)
        self.graph = Graph(self.model.graph, self.opsets, _inferred_types(self.model))
        from .ops import OPS

        self._ops = OPS
        bad = [n for n in _all_nodes(self.graph) if (n.domain, n.op_type) not in OPS]
        if bad:
            names = sorted({f"{'' if n.domain == 'ai.onnx' else n.domain + '.'}{n.op_type}" for n in bad})
            raise UnsupportedOpError(f"unsupported ops: {', '.join(names)} (first at {bad[0].where()})")
        self._consts: dict[str, Any] = {k: self._wrap_init(v) for k, v in self.graph.initializers.items()}
        # input signature -> its template, _SEEN after one call, None where the graph reads input values
        self._templates: dict[tuple, _Template | str | None] = {}

    def _wrap_init(self, v: np.ndarray) -> Any:
        if v.dtype.name in _ML_NAMES or v.dtype == object:
            return v
        return value_to_tensor(v, self.device)

    @property
    def inputs(self) -> dict[str, ValueType]:
        """The graph inputs a call must give (those without an initializer)."""
        return {k: t for k, t in self.graph.input_types.items() if k not in self.graph.initializers}

    def __call__(self, inputs: dict[str, Any] | None = None, debug: bool = False) -> dict[str, Any]:
        inputs = dict(inputs or {})
        unknown = set(inputs) - set(self.graph.inputs)
        if unknown:
            raise ArgumentError(f"unknown model inputs {sorted(unknown)}; the model's inputs are {self.graph.inputs}")
        given: dict[str, Any] = {}
        for name in self.graph.inputs:
            if name in inputs:
                given[name] = self._check_input(name, inputs[name])
            elif name not in self._consts:
                need = list(self.inputs)
                raise ArgumentError(f"missing model input {name!r} (the model needs {need}, got {list(inputs)})")
        key = None if debug else _signature(given)
        state = self._templates.get(key, None) if key is not None else None
        if key is not None and state is _SEEN:  # the second call with this signature: build its template
            state = self._templates[key] = self._template(given)
        if isinstance(state, _Template):
            values = [given[n] for n in state.placeholders]
            if state.jit is not None and all(isinstance(t, Tensor) for t in values):
                try:  # (realized outputs: from its third call on, the captured kernels run, no graph is built)
                    return dict(zip(self.graph.outputs, state.jit(*values)))
                except JitError:  # the graph draws random numbers, one buffer is two inputs, ...: built each call
                    state.jit = None
            return dict(zip(self.graph.outputs, state.outputs(*values)))
        env = self.run_graph(self.graph, {**self._consts, **given}, debug=debug)
        if key is not None and key not in self._templates:
            if len(self._templates) >= MAX_TEMPLATES:
                del self._templates[next(iter(self._templates))]
            self._templates[key] = _SEEN
        return {name: env[name] for name in self.graph.outputs}

    def _template(self, given: dict[str, Tensor]) -> _Template | None:
        """The graph built on placeholders for `given` (same shapes, dtypes, devices), or None where the build reads
        an input's value on the host (or fails: the build from the real inputs then raises the error)."""
        placeholders = {}
        for name, t in given.items():
            size = int(np.prod(t.shape, dtype=np.int64))
            buf = new_buffer_uop(t.device, size, t.dtype, _Placeholder(t.device, size, t.dtype))
            placeholders[name] = Tensor(reshape_uop(buf, t.shape), device=t.device)
        try:
            env = self.run_graph(self.graph, {**self._consts, **placeholders})
        except Exception:  # _InputRead, or an error the real build reports
            return None
        outs = [env[name] for name in self.graph.outputs]
        if not all(isinstance(o, Tensor) for o in outs):  # sequences, emulated types and strings are host values
            return None
        sink = UOp.sink(*[o.uop for o in outs])
        # each placeholder's memory must be reached only through the placeholder's own node, which is substituted
        views = {p.uop for p in placeholders.values()}
        bufs = {buffer_under(p.uop) for p in placeholders.values()}
        if any(u in bufs and u not in views for u in sink.toposort(gate=lambda u: u not in views)):
            return None
        template = _Template({n: p.uop for n, p in placeholders.items()}, sink, [o.device for o in outs])
        template.jit = TinyJit(template.outputs, prune=True)
        return template

    def _check_input(self, name: str, v: Any) -> Any:
        t = self.graph.input_types[name]
        if t.kind == "sequence" or isinstance(v, list):  # a sequence, or an optional one
            return [self._as_value(x, t.elem_type) for x in v]
        if v is None:
            if t.kind != "optional":
                raise ArgumentError(f"model input {name!r} is None but not optional")
            return None
        val = self._as_value(v, t.elem_type)
        if t.shape is not None and isinstance(val, (Tensor, np.ndarray)):
            shape = tuple(val.shape)
            # a fixed dimension must match; a rank that differs only by size-1 dims is taken as given
            if len(shape) == len(t.shape) and any(
                isinstance(d, int) and d > 0 and d != s for d, s in zip(t.shape, shape)
            ):
                raise ArgumentError(f"model input {name!r} has shape {shape}, the model expects {t.shape}")
        return val

    def _as_value(self, v: Any, elem_type: int | None) -> Any:
        if type(v).__name__ == "TensorProto":
            from onnx import numpy_helper

            v = numpy_helper.to_array(v)
        if elem_type in EMULATED:
            arr = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
            return arr if arr.dtype == np_dtype(elem_type) else to_emulated(arr, elem_type)
        if elem_type == STRING:
            return np.asarray(v, dtype=object)
        if isinstance(v, Tensor):
            want = ONNX_DTYPES.get(elem_type) if elem_type else None
            if want is not None and v.dtype != want:
                raise ArgumentTypeError(f"model input has dtype {v.dtype}, the model expects {want}")
            return v
        arr = np.asarray(v)
        if elem_type in ONNX_DTYPES:
            arr = arr.astype(np_dtype(elem_type), copy=False)
        return value_to_tensor(arr, self.device)

    def run_graph(self, graph: Graph, env: dict[str, Any], debug: bool = False) -> dict[str, Any]:
        """Evaluate graph's nodes in order over env (the outer scope for a subgraph) and return env."""
        if graph is not self.graph:  # a subgraph's own initializers (the main graph's are in env already)
            for name, v in graph.initializers.items():
                if name not in graph.inputs:  # they shadow the outer scope's names
                    env[name] = self._wrap_init(v)
        for node in graph.nodes:
            fn = self._ops[(node.domain, node.op_type)]
            args = [env[i] if i else None for i in node.inputs]
            for i, a in zip(node.inputs, args):
                if i and i not in env:
                    raise node.fail(f"input {i!r} is not produced by any earlier node or graph input")
            args = [_widen(a) for a in args]
            outer, self._scope = self._scope, env  # a subgraph (If/Loop/Scan body) sees env
            try:
                out = fn(self, node, *args)
            except OnnxError:
                raise
            except (ArgumentError, ArgumentTypeError, IndexError, ValueError, TypeError, NotImplementedError) as e:
                raise node.fail(f"{type(e).__name__}: {e}") from e
            finally:
                self._scope = outer
            outs = list(out) if isinstance(out, (tuple,)) else [out]
            for name, val, vt in zip(node.outputs, outs, node.out_types):
                if name:
                    env[name] = _to_declared(val, vt)
            if debug:
                print(node.where(), [getattr(env.get(o), "shape", None) for o in node.outputs if o])
        return env


def _signature(given: dict[str, Any]) -> tuple | None:
    """What a call's graph is built from, where a template can stand for it: every input a Tensor on one device with
    a static shape, none requiring grad (a template's graph has no custom gradient rules), no TinyJit capturing."""
    from zeptograd.engine.realize import is_capturing

    if is_capturing():
        return None
    key: list[Any] = [Tensor.training]
    for name, t in given.items():
        if type(t) is not Tensor or t.requires_grad or type(t.device) is not str:
            return None
        if not all(type(d) is int for d in t.shape):
            return None
        key.append((name, t.shape, t.dtype, t.device))
    return tuple(key)


def _widen(a: Any) -> Any:
    if isinstance(a, list):
        return [_widen(x) for x in a]
    if isinstance(a, np.ndarray) and (a.dtype.name in _ML_NAMES):
        return value_to_tensor(a)
    return a


def _to_declared(val: Any, vt: ValueType | None) -> Any:
    """A node output as its declared type: emulated types rounded, other Tensors cast where the dtype differs."""
    if vt is None or vt.elem_type is None:
        return val
    if isinstance(val, list):
        return [_to_declared(v, ValueType(vt.elem_type, None)) for v in val]
    if isinstance(val, Tensor):
        if vt.elem_type in EMULATED:
            return to_emulated(val, vt.elem_type)
        want = ONNX_DTYPES.get(vt.elem_type)
        if want is not None and val.dtype != want:
            return val.cast(want)
    return val


def _all_nodes(graph: Graph):
    """Every node of the graph and of its subgraphs (If/Loop/Scan bodies), without recursion."""
    stack = [graph]
    while stack:
        g = stack.pop()
        for n in g.nodes:
            yield n
            for v in n.attrs.values():
                for sub in v if isinstance(v, list) else [v]:
                    if type(sub).__name__ == "GraphProto":
                        stack.append(Graph(sub, g.opsets, {}))


def model_summary(model: Any) -> str:
    """Inputs, outputs, op counts and unsupported ops of a model, as `python -m zeptograd.nn.onnx` prints them."""
    from .ops import OPS

    proto = onnx_load(model, load_external_data=False)
    opsets = _opsets(proto)
    graph = Graph(proto.graph, opsets, {})

    def fmt(name: str, t: ValueType) -> str:
        shape = "?" if t.shape is None else "(" + ", ".join("?" if d is None else str(d) for d in t.shape) + ")"
        return f"  {name}: {TYPE_NAMES.get(t.elem_type or 0, t.elem_type)} {shape}" + (
            "" if t.kind == "tensor" else f" [{t.kind}]"
        )

    counts = Counter(f"{'' if n.domain == 'ai.onnx' else n.domain + '.'}{n.op_type}" for n in _all_nodes(graph))
    unsupported = sorted(
        {
            f"{'' if n.domain == 'ai.onnx' else n.domain + '.'}{n.op_type}"
            for n in _all_nodes(graph)
            if (n.domain, n.op_type) not in OPS
        }
    )
    lines = [f"opsets: {', '.join(f'{k}={v}' for k, v in opsets.items() if k)}", "inputs:"]
    lines += [fmt(k, t) for k, t in graph.input_types.items() if k not in graph.initializers]
    lines += ["outputs:"] + [fmt(vi.name, ValueType.from_proto(vi.type)) for vi in proto.graph.output]
    lines += [f"initializers: {len(graph.initializers)}", f"ops ({sum(counts.values())} nodes):"]
    lines += [f"  {k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines.append("unsupported ops: " + (", ".join(unsupported) if unsupported else "none"))
    return "\n".join(lines)
