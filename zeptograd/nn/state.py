"""Model state: finding a model's tensors, loading them, and the safetensors and PyTorch file formats.

get_state_dict(model) walks attributes, lists, tuples and dicts and names each Tensor by its path, as PyTorch
names a module's state (`layers.0.weight`); get_parameters(model) is its values. load_state_dict assigns into the
model's existing tensors (so optimizers and TinyJit captures that hold them see the new values).

safe_save / safe_load read and write the safetensors format directly: an 8-byte little-endian header length, a
JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the raw
little-endian data. All of zeptograd's dtypes are supported (BF16 as its raw bits). torch_load reads a file written
by torch.save (the zip format, and the legacy pickle format) of a plain state_dict, without torch.

Files may be hostile: every pickle goes through one restricted unpickler, every tensor view is checked against its
storage, every safetensors header is validated as the reference implementation validates it (docs/security.md).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from collections import OrderedDict
from typing import Any, Literal

import numpy as np

from zeptograd.buffers import buffers, new_buffer_uop, reshape_uop
from zeptograd.dtype import DType, dtypes
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor import Tensor, multi
from zeptograd.uop.ops import Ops

__all__ = [
    "get_state_dict",
    "get_parameters",
    "load_state_dict",
    "safe_load",
    "safe_save",
    "safe_load_metadata",
    "torch_load",
    "SafetensorError",
    "CheckpointError",
]


def _realize_leaves(*tensors: Tensor, others: tuple[Tensor, ...] = ()) -> None:
    """Realize tensors (and `others`, as they are) together so that each tensor's uop becomes its buffer, also for
    tensors that require grad.

    Tensor.realize keeps the lazy graph of tensors that require grad (for a later backward); for a parameter that
    graph is an ASSIGN chain that grows every step, and that a TinyJit capture would run again (applying the previous
    update twice). Parameters are leaves: their graph is only their value, so they are realized as plain tensors and
    re-marked as requiring grad."""
    grad = [t for t in tensors if t.requires_grad]
    for t in grad:
        t.requires_grad = False
    try:
        if tensors or others:
            Tensor.realize(*tensors, *others)
        for t in tensors:
            _fresh_buffer_uop(t)
    finally:
        for t in grad:
            t.requires_grad_(True)


def _is_whole_buffer(t: Tensor) -> bool:
    u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
    return u.op is Ops.BUFFER and u.arg[1] == t.numel()


def _fresh_buffer_uop(t: Tensor) -> None:
    """Give a realized tensor a new BUFFER uop on the same Buffer (same memory, a new graph node).

    The engine remembers the value of every realized node (engine/realize.py's `realized`), keyed by the node; a
    graph built again over the same BUFFER nodes (the same model on the same input tensor after an update) would get
    the remembered value from before the update while the old graph is alive. A new node per update makes each
    step's graph new; the schedule cache still matches them (it keys buffers by position)."""
    if t.uop.op is Ops.MULTI:  # a sharded tensor: each device's part (tensor/multi.py)
        parts = multi.parts(t)
        for p in parts:
            _fresh_buffer_uop(p)
        t.uop = multi.multi([p.uop for p in parts], t.uop.arg)
        return
    u = t.uop
    base = u.src[0] if u.op is Ops.RESHAPE else u
    if base.op is Ops.BUFFER and base.arg[1] == t.numel() and (buf := buffers.get(base)) is not None:
        t.uop = reshape_uop(new_buffer_uop(buf.device, buf.size, buf.dtype, buf), t.shape)


# ***** finding the tensors *****


def get_state_dict(obj: Any, prefix: str = "", tensor_type: type[Tensor] = Tensor) -> dict[str, Tensor]:
    """{dotted name: Tensor} for every tensor reachable from obj through attributes, lists, tuples and dicts."""
    if isinstance(obj, tensor_type):
        return {prefix.strip("."): obj}
    if hasattr(obj, "_asdict"):  # namedtuple
        return get_state_dict(obj._asdict(), prefix, tensor_type)
    if isinstance(obj, OrderedDict):
        return get_state_dict(dict(obj), prefix, tensor_type)
    if hasattr(obj, "__dict__"):
        return get_state_dict(obj.__dict__, prefix, tensor_type)
    state_dict: dict[str, Tensor] = {}
    if isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            state_dict.update(get_state_dict(x, f"{prefix}{i}.", tensor_type))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            state_dict.update(get_state_dict(v, f"{prefix}{k}.", tensor_type))
    return state_dict


def get_parameters(obj: Any) -> list[Tensor]:
    """Every tensor of get_state_dict(obj), each once (buffers like running statistics included: an optimizer
    updates only those that require grad)."""
    return list({id(t): t for t in get_state_dict(obj).values()}.values())  # each once, in first-seen order


def load_state_dict(
    model: Any,
    state_dict: dict[str, Any],
    strict: bool = True,
    verbose: bool = False,
    consume: bool = False,
    realize: bool = True,
) -> None:
    """Assign each tensor of state_dict (Tensors or numpy arrays) into the model's tensor of the same name, cast to
    its dtype. strict: a name missing from state_dict or not in the model is an error (all of them are listed);
    otherwise they are skipped. A shape mismatch is always an error. consume: remove the loaded names from
    state_dict."""
    model_sd = get_state_dict(model)
    missing = [k for k in model_sd if k not in state_dict]
    unexpected = [k for k in state_dict if k not in model_sd]
    if strict and (missing or unexpected):
        parts = []
        if missing:
            parts.append(f"missing key(s) in state_dict: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected key(s) in state_dict: {', '.join(unexpected)}")
        raise KeyError(f"load_state_dict: {'; '.join(parts)}")
    bad = []
    for k, v in model_sd.items():
        if k not in state_dict:
            continue
        new_shape = tuple(state_dict[k].shape if isinstance(state_dict[k], Tensor) else np.shape(state_dict[k]))
        # a 0-d tensor takes a one-element 1-d one, as torch does (old checkpoints saved BatchNorm's
        # num_batches_tracked with shape (1,))
        if new_shape != v.shape and not (v.shape == () and new_shape == (1,)):
            bad.append(f"{k}: the model has {v.shape}, the state_dict {new_shape}")
    if bad:
        raise ArgumentError(f"load_state_dict: shape mismatch for {'; '.join(bad)}")
    if verbose and (missing or unexpected):
        print(f"load_state_dict: skipped missing {missing} and unexpected {unexpected}")
    done = []
    for k, v in model_sd.items():
        if k not in state_dict:
            continue
        new = state_dict[k]
        if not isinstance(new, Tensor):
            new = Tensor(np.asarray(new), device=v.device, dtype=v.dtype)
        new = new.to(v.device).cast(v.dtype).detach().reshape(v.shape)
        if not _is_whole_buffer(v):  # a lazy tensor takes the value itself: a copy, not the state_dict's buffer
            new = new.contiguous()
        v.assign(new)
        done.append(v)
        if consume:
            del state_dict[k]
    if realize:
        _realize_leaves(*done)


# ***** safetensors *****

_ST_DTYPES: dict[str, DType] = {
    "BOOL": dtypes.bool,
    "U8": dtypes.uint8,
    "I8": dtypes.int8,
    "U16": dtypes.uint16,
    "I16": dtypes.int16,
    "U32": dtypes.uint32,
    "I32": dtypes.int32,
    "U64": dtypes.uint64,
    "I64": dtypes.int64,
    "F16": dtypes.float16,
    "BF16": dtypes.bfloat16,
    "F32": dtypes.float32,
    "F64": dtypes.float64,
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_NP = {
    dtypes.bool: np.bool_,
    dtypes.uint8: np.uint8,
    dtypes.int8: np.int8,
    dtypes.uint16: np.uint16,
    dtypes.int16: np.int16,
    dtypes.uint32: np.uint32,
    dtypes.int32: np.int32,
    dtypes.uint64: np.uint64,
    dtypes.int64: np.int64,
    dtypes.float16: np.float16,
    dtypes.bfloat16: np.uint16,
    dtypes.float32: np.float32,
    dtypes.float64: np.float64,
}


def _tensor_from_raw(raw: np.ndarray, dt: DType, shape: tuple[int, ...], device: str | None = None) -> Tensor:
    """A Tensor from little-endian raw element data (bfloat16 as its uint16 bits)."""
    arr: np.ndarray = raw.view(np.dtype(_NP[dt]).newbyteorder("<")).astype(_NP[dt]).reshape(shape)
    if dt == dtypes.bfloat16:  # widen the bits to float32 exactly; the constructor keeps the top 16 bits
        return Tensor((arr.astype(np.uint32) << 16).view(np.float32), device=device, dtype=dtypes.bfloat16)
    return Tensor(arr, device=device, dtype=dt)


def _raw_bytes(t: Tensor) -> bytes:
    arr = t.numpy()
    if t.dtype == dtypes.bfloat16:
        arr = (np.ascontiguousarray(arr, np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.ascontiguousarray(arr, dtype=np.dtype(_NP[t.dtype]).newbyteorder("<")).tobytes()


def _read_bytes(fn: str | os.PathLike | bytes) -> memoryview:
    if isinstance(fn, (bytes, bytearray, memoryview)):
        return memoryview(fn)
    with open(fn, "rb") as f:
        return memoryview(f.read())


class SafetensorError(ArgumentError):
    """A safetensors file (or a safe_save call) that breaks the format: the message names the tensor and the field.
    A ValueError and RuntimeError, as every bad-input error."""


_ST_MAX_HEADER = 100_000_000  # the reference implementation's limit on the JSON header's length
_U64 = 2**64  # sizes and offsets are usize in the reference implementation: one past the largest


def _safe_header(data: memoryview, where: str) -> tuple[dict, int]:
    """The JSON header as a dict, and where the data section starts; the header's own layout is checked here, its
    entries by _safe_entries."""
    if len(data) < 8:
        raise SafetensorError(f"{where}: not a safetensors file (shorter than its 8-byte header length)")
    n = struct.unpack("<Q", data[:8])[0]
    if n > _ST_MAX_HEADER:
        raise SafetensorError(f"{where}: header length {n} is over the format's limit of {_ST_MAX_HEADER} bytes")
    if n > len(data) - 8:
        raise SafetensorError(f"{where}: not a safetensors file (header length {n} is past the end of the file)")
    try:
        header = json.loads(bytes(data[8 : 8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise SafetensorError(f"{where}: not a safetensors file (the header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise SafetensorError(f"{where}: not a safetensors file (the header is not a JSON object)")
    meta = header.get("__metadata__")
    if meta is not None and not (
        isinstance(meta, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())
    ):
        raise SafetensorError(f"{where}: field '__metadata__' is {str(meta)[:100]}, not a map of strings to strings")
    return header, 8 + n


def _usize(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < _U64


def _safe_entries(header: dict, body_len: int, where: str) -> dict[str, tuple[DType, tuple[int, ...], int, int]]:
    """{name: (dtype, shape, begin, end)} of every tensor, checked as the reference implementation checks them:
    each entry a map with a known "dtype", a "shape" of ints >= 0 and two "data_offsets" ints >= 0; its byte size
    (computed without overflowing 64 bits) equal to end - begin; the tensors, in offset order, covering the data
    section exactly (no gap, no overlap, nothing after the last)."""
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise SafetensorError(f"{where}: tensor {name!r} is {str(info)[:100]}, not a map")
        for field in ("dtype", "shape", "data_offsets"):
            if field not in info:
                raise SafetensorError(f"{where}: tensor {name!r} has no field {field!r}")
        dt, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or dt not in _ST_DTYPES:
            raise SafetensorError(
                f"{where}: tensor {name!r}: field 'dtype' is {dt!r}, which zeptograd does not support "
                f"(supported: {', '.join(_ST_DTYPES)})"
            )
        if not (isinstance(shape, list) and all(_usize(d) for d in shape)):
            raise SafetensorError(f"{where}: tensor {name!r}: field 'shape' is {shape!r}, not a list of ints >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_usize(o) for o in offsets)):
            raise SafetensorError(
                f"{where}: tensor {name!r}: field 'data_offsets' is {offsets!r}, not a list of two ints >= 0"
            )
        entries[name] = (_ST_DTYPES[dt], tuple(shape), offsets[0], offsets[1])
    at = 0
    for name, (dt, shape, b, e) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if b != at or e < b:
            raise SafetensorError(
                f"{where}: tensor {name!r}: field 'data_offsets' is [{b}, {e}], expected it to begin at {at} (the "
                f"tensors must cover the data section in order, without gaps or overlaps)"
            )
        numel = 1
        for d in shape:  # in order, as the reference's checked multiplication
            numel *= d
            if numel >= _U64:
                break
        if numel >= _U64 or numel * dt.itemsize >= _U64:
            raise SafetensorError(
                f"{where}: tensor {name!r}: field 'shape' is {list(shape)}, whose byte size overflows 64 bits"
            )
        if e - b != numel * dt.itemsize:
            raise SafetensorError(
                f"{where}: tensor {name!r} of {_ST_NAMES[dt]} {list(shape)} needs {numel * dt.itemsize} bytes, its "
                f"field 'data_offsets' is [{b}, {e}]"
            )
        at = e
    if at != body_len:
        raise SafetensorError(
            f"{where}: the tensors end at byte {at} of a data section of {body_len} bytes (the file is "
            f"{'truncated' if at > body_len else 'longer than its header says'})"
        )
    return entries


def safe_load_metadata(fn: str | os.PathLike | bytes) -> dict[str, str]:
    """The "__metadata__" of a safetensors file ({} when it has none)."""
    header, _ = _safe_header(_read_bytes(fn), str(fn)[:100])
    return header.get("__metadata__", {}) or {}


def safe_load(fn: str | os.PathLike | bytes, device: str | None = None) -> dict[str, Tensor]:
    """{name: Tensor} from a safetensors file (a path, or the file's bytes). The file is validated as the reference
    implementation validates it (a SafetensorError naming the tensor and the field otherwise); BOOL bytes other than
    0 and 1 are read as True (nonzero), so every op sees one value."""
    where = str(fn)[:100] if not isinstance(fn, (bytes, bytearray, memoryview)) else "safe_load"
    data = _read_bytes(fn)
    header, start = _safe_header(data, where)
    body = np.frombuffer(data, dtype=np.uint8, offset=start)
    ret = {}
    for name, (dt, shape, b, e) in _safe_entries(header, len(body), where).items():
        if dt == dtypes.bool:
            ret[name] = Tensor((body[b:e] != 0).reshape(shape), device=device, dtype=dtypes.bool)
        else:
            ret[name] = _tensor_from_raw(body[b:e], dt, shape, device)
    return ret


def safe_save(tensors: dict[str, Tensor], fn: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """Write {name: Tensor} as a safetensors file (tensors in name order, header padded to 8 bytes as the
    reference implementation). Names are strings; "__metadata__" is the format's own and is refused."""
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise ArgumentTypeError("safetensors metadata must map str to str")
        header["__metadata__"] = dict(metadata)
    if bad := [k for k in tensors if not isinstance(k, str)]:
        raise ArgumentTypeError(f"safe_save: tensor names must be strings, got {bad[:5]}")
    if "__metadata__" in tensors:
        raise SafetensorError("safe_save: '__metadata__' is the format's metadata field, not a tensor name")
    blobs, off = [], 0
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"safe_save: {name!r} is a {type(t).__name__}, not a Tensor")
        raw = _raw_bytes(t)
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * (-len(hdr) % 8)
    with open(fn, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for raw in blobs:
            f.write(raw)


# ***** PyTorch files *****

_TORCH_STORAGES: dict[str, Any] = {
    "DoubleStorage": np.float64,
    "FloatStorage": np.float32,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bf16",
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}
_TORCH_DTYPES = {
    "float64": "DoubleStorage",
    "float32": "FloatStorage",
    "float16": "HalfStorage",
    "bfloat16": "BFloat16Storage",
    "int64": "LongStorage",
    "int32": "IntStorage",
    "int16": "ShortStorage",
    "int8": "CharStorage",
    "uint8": "ByteStorage",
    "bool": "BoolStorage",
    "float": "FloatStorage",
    "double": "DoubleStorage",
    "half": "HalfStorage",
    "long": "LongStorage",
    "int": "IntStorage",
}


class CheckpointError(ArgumentError, pickle.UnpicklingError):
    """A torch.save file that torch_load refuses: a pickle that names a global a state_dict does not need, a
    tensor view outside its storage, a truncated or inconsistent file. A ValueError and RuntimeError (as every
    bad-input error) and a pickle.UnpicklingError (as torch.load(weights_only=True) raises)."""


def _refuse_setstate(self, state):
    """BUILD on one of the loader's own objects would set its attributes from the file (a storage type marker is
    shared by every load): refused."""
    raise CheckpointError(f"torch_load: the pickle sets the state of a {type(self).__name__.strip('_')}")


class _StorageType:
    __setstate__ = _refuse_setstate

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise CheckpointError(
            f"torch_load: the storage type torch.{self.name} is called in the pickle; a state_dict only names it"
        )


def _byte_order(big_endian: bool) -> Literal["<", ">"]:
    return ">" if big_endian else "<"


class _Storage:
    """A storage of a torch file: its element type and the raw bytes (read when first needed)."""

    __setstate__ = _refuse_setstate

    def __init__(self, kind: str, key: str, read, big_endian: bool = False):
        self.kind, self.key, self._read, self.big_endian = kind, key, read, big_endian
        self._data: np.ndarray | None = None

    def array(self) -> np.ndarray:
        if self._data is None:
            raw = self._read()
            kind = _TORCH_STORAGES[self.kind]
            dt = np.dtype(np.uint16 if kind == "bf16" else kind).newbyteorder(_byte_order(self.big_endian))
            if len(raw) % dt.itemsize:
                raise CheckpointError(
                    f"torch_load: storage {self.key!r} ({self.kind}) has {len(raw)} bytes, not a whole number of "
                    f"{dt.itemsize}-byte elements"
                )
            self._data = np.frombuffer(raw, dtype=dt)
            if self.kind == "BoolStorage":  # bytes other than 0/1 are True (nonzero), so every op reads one value
                self._data = self._data.view(np.uint8) != 0
        return self._data


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class _TorchTensor:
    """A tensor of a torch file before conversion: a strided view of a storage."""

    __setstate__ = _refuse_setstate

    def __init__(self, storage: _Storage, offset: int, size: tuple, stride: tuple):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)

    def to_tensor(self, device: str | None) -> Tensor:
        data = self.storage.array()
        n = int(np.prod(self.size, dtype=object))
        if n == 0:
            arr = np.zeros(self.size, dtype=data.dtype)
        else:
            # the lowest and highest element the view touches, whatever the signs of the strides; a dimension of
            # size 1 touches only index 0 whatever its stride (so its stride is 0 in the numpy view)
            lo = self.offset + sum(min(0, (s - 1) * st) for s, st in zip(self.size, self.stride))
            hi = self.offset + sum(max(0, (s - 1) * st) for s, st in zip(self.size, self.stride))
            if lo < 0 or hi >= len(data):
                raise CheckpointError(
                    f"torch_load: a tensor of size {self.size} stride {self.stride} at offset {self.offset} "
                    f"touches elements {lo} to {hi} of storage {self.storage.key!r}, which has {len(data)} elements"
                )
            strides = [0 if s == 1 else st * data.itemsize for s, st in zip(self.size, self.stride)]
            arr = np.lib.stride_tricks.as_strided(data[self.offset :], self.size, strides, writeable=False)
        try:  # a stride-0 (expanded) view can declare far more elements than its storage holds
            arr = arr.copy(order="C")  # (np.ascontiguousarray would make a 0-d tensor 1-d)
        except MemoryError:
            raise CheckpointError(
                f"torch_load: a tensor of size {self.size} stride {self.stride} does not fit in memory"
            ) from None
        if self.storage.kind == "BFloat16Storage":
            bits = arr.astype(np.uint32)
            return Tensor((bits << 16).view(np.float32), device=device, dtype=dtypes.bfloat16)
        return Tensor(arr.astype(arr.dtype.newbyteorder("=")), device=device)


def _rebuild_tensor(storage, storage_offset, size, stride, *args, **kwargs):
    if not isinstance(storage, _Storage):
        raise CheckpointError(f"torch_load: a tensor is rebuilt from a {type(storage).__name__}, not a storage")
    if not _is_int(storage_offset) or storage_offset < 0:
        raise CheckpointError(f"torch_load: a tensor has storage offset {storage_offset!r}, not an int >= 0")
    if not (isinstance(size, tuple) and all(_is_int(s) and s >= 0 for s in size)):
        raise CheckpointError(f"torch_load: a tensor has size {size!r}, not a tuple of ints >= 0")
    if not (isinstance(stride, tuple) and len(stride) == len(size) and all(_is_int(s) for s in stride)):
        raise CheckpointError(
            f"torch_load: a tensor of size {size} has stride {stride!r}, not a tuple of {len(size)} ints"
        )
    return _TorchTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=None, backward_hooks=None, *args):
    if not isinstance(data, _TorchTensor):
        raise CheckpointError(f"torch_load: a parameter is rebuilt from a {type(data).__name__}, not a tensor")
    return data


# every global a pickle in a torch.save file of a state_dict may name, and what it becomes; anything else is refused
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("builtins", "set"): set,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(name) for name in _TORCH_STORAGES},
    # a dtype object (newer files name a storage by its dtype)
    **{("torch", name): _StorageType(storage) for name, storage in _TORCH_DTYPES.items()},
    **{
        ("torch.storage", name): _StorageType("ByteStorage")
        for name in ("UntypedStorage", "_LegacyStorage", "TypedStorage")
    },
}


class _RestrictedUnpickler(pickle.Unpickler):
    """The one unpickler for every pickle torch_load reads from a file: a global is looked up in _ALLOWED_GLOBALS
    (nothing is imported, no other callable can be reached), and a persistent id (a storage reference) is allowed
    only where load_storage is given (the state_dict pickle)."""

    def __init__(self, f, what: str, load_storage=None):
        super().__init__(f)
        self.what, self.load_storage = what, load_storage

    def find_class(self, module: str, name: str):
        if (found := _ALLOWED_GLOBALS.get((module, name))) is not None:
            return found
        raise CheckpointError(
            f"torch_load: the {self.what} pickle names the global {module}.{name}, which is not part of a plain "
            f"state_dict; only tensors, dicts and plain values can be loaded (refused before anything ran)"
        )

    def persistent_load(self, pid):
        if self.load_storage is None:
            raise CheckpointError(f"torch_load: the {self.what} pickle holds a persistent id {pid!r}")
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise CheckpointError(f"torch_load: unknown persistent id {pid!r}")
        _, stype, key, _location, numel = pid[:5]
        if not isinstance(key, (str, int)) or not _is_int(numel) or numel < 0:
            raise CheckpointError(f"torch_load: a storage reference {pid!r} has a bad key or element count")
        kind = stype.name if isinstance(stype, _StorageType) else "ByteStorage"
        return self.load_storage(kind, str(key), numel)


def _unpickle(f, what: str, load_storage=None) -> Any:
    try:
        return _RestrictedUnpickler(f, what, load_storage).load()
    except CheckpointError:
        raise
    except Exception as e:  # truncated or malformed pickle data
        raise CheckpointError(f"torch_load: the {what} pickle cannot be read ({type(e).__name__}: {e})") from None


def torch_load(fn: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
    """{name: Tensor} from a torch.save file of a state_dict (nested dicts are flattened with dotted names).

    Every pickle in the file is read by one restricted unpickler (see _ALLOWED_GLOBALS): a file that names any
    other global is refused before anything in it runs. Every tensor view is checked against its storage."""
    if zipfile.is_zipfile(fn):
        with zipfile.ZipFile(fn) as zf:
            names = zf.namelist()
            pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
            if pkl is None:
                raise CheckpointError(f"torch_load: {fn} is a zip file without data.pkl: not a torch.save file")
            prefix = pkl[: -len("data.pkl")]
            big_endian = f"{prefix}byteorder" in names and zf.read(f"{prefix}byteorder").strip() == b"big"
            storages: dict[str, _Storage] = {}

            def load_storage(kind: str, key: str, numel: int) -> _Storage:
                if key not in storages:
                    path = f"{prefix}data/{key}"
                    if path not in names:
                        raise CheckpointError(f"torch_load: {fn} lacks the storage {path}")
                    storages[key] = _Storage(kind, key, lambda p=path: _zip_read(zf, p), big_endian)
                return storages[key]

            obj = _unpickle(io.BytesIO(_zip_read(zf, pkl)), "state_dict", load_storage)
            return {k: v.to_tensor(device) for k, v in _flatten_state(obj).items()}
    obj = _legacy_load(fn)
    return {k: v.to_tensor(device) for k, v in _flatten_state(obj).items()}


def _zip_read(zf: zipfile.ZipFile, name: str) -> bytes:
    try:
        return zf.read(name)
    except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError) as e:  # bad CRC, truncated, unknown method
        raise CheckpointError(f"torch_load: {zf.filename}: {name} cannot be read ({type(e).__name__}: {e})") from None


_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def _legacy_load(fn: str | os.PathLike) -> Any:
    """The pre-1.6 format: pickles of (magic, protocol, sys_info, the object, the storage keys), then each
    storage's element count (8 bytes) and data, in key order."""
    with open(fn, "rb") as f:
        data = f.read()
    bio = io.BytesIO(data)
    try:
        magic = _RestrictedUnpickler(bio, "magic number").load()
    except CheckpointError:
        raise
    except Exception:
        raise CheckpointError(f"torch_load: {fn} is neither a zip nor a legacy torch.save file") from None
    if magic != _LEGACY_MAGIC:
        raise CheckpointError(f"torch_load: {fn} is not a torch.save file (bad magic number)")
    _unpickle(bio, "protocol version")
    sys_info = _unpickle(bio, "sys_info")
    big_endian = isinstance(sys_info, dict) and sys_info.get("little_endian") is False
    kinds: dict[str, _Storage] = {}

    def load_storage(kind: str, key: str, numel: int) -> _Storage:
        if key not in kinds:
            kinds[key] = _Storage(kind, key, lambda k=key: raws[k], big_endian)
        return kinds[key]

    raws: dict[str, bytes] = {}
    obj = _unpickle(bio, "state_dict", load_storage)
    keys = _unpickle(bio, "storage keys")
    if not (isinstance(keys, list) and all(isinstance(k, (str, int)) for k in keys)):
        raise CheckpointError(f"torch_load: {fn}'s storage keys are {str(keys)[:100]}, not a list of names")
    for key in keys:
        head = bio.read(8)
        n = struct.unpack("<q", head)[0] if len(head) == 8 else -1
        kind = kinds[str(key)].kind if str(key) in kinds else "ByteStorage"
        kt = _TORCH_STORAGES[kind]
        nbytes = n * (2 if kt == "bf16" else np.dtype(kt).itemsize)
        raw = bio.read(nbytes) if n >= 0 else b""
        if n < 0 or len(raw) != nbytes:
            raise CheckpointError(f"torch_load: {fn} is truncated or corrupt at storage {key!r}")
        raws[str(key)] = raw
    if missing := [k for k in kinds if k not in raws]:
        raise CheckpointError(f"torch_load: {fn} lacks the data of storage(s) {missing}")
    return obj


def _flatten_state(obj: Any) -> dict[str, _TorchTensor]:
    """{dotted name: tensor} of the tensors in nested dicts, lists and tuples, in order. Iterative (a pickle can nest
    deeper than Python's recursion limit); a container met twice (a cycle, or a shared one that could multiply the
    names exponentially) is refused."""
    ret: dict[str, _TorchTensor] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        x, prefix = stack.pop()
        if isinstance(x, _TorchTensor):
            ret[prefix.strip(".")] = x
            continue
        if isinstance(x, dict):
            children = [(v, f"{prefix}{k}.") for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            children = [(v, f"{prefix}{i}.") for i, v in enumerate(x)]
        else:
            continue
        if id(x) in seen:
            raise CheckpointError(f"torch_load: the container at {prefix.strip('.')!r} appears twice in the state_dict")
        seen.add(id(x))
        stack.extend(reversed(children))
    return ret
