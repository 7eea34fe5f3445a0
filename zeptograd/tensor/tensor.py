"""The Tensor class: construction, running (realize, numpy, assign), autograd entry points, creation, and the
movement primitives (reshape, permute, expand, pad, shrink, flip). The other op families are mixins beside it."""

from __future__ import annotations

import itertools
import math
import weakref
from contextlib import ContextDecorator
from typing import Any, ClassVar

import numpy as np

from zeptograd import gradient as _gradient
from zeptograd.buffers import buffer_under, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import Device
from zeptograd.dtype import DType, DTypeLike, dtypes, from_numpy_dtype, to_dtype, to_numpy_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.schedule.fold import const_broadcast
from zeptograd.tensor import multi
from zeptograd.tensor.assign_helpers import _buffer_uop, _reads_target_elsewhere, _substitute_walked, _wide_int
from zeptograd.tensor.elementwise import ElementwiseMixin
from zeptograd.tensor.helpers import PY_CONST, ConstType, argfix, iota_uop, normalize_axis, prod
from zeptograd.tensor.indexing import IndexMixin
from zeptograd.tensor.live import (
    _grad_data,
    _grad_leaves,
    _grad_leaves_data,
    _grad_remove,
    _grad_targets,
    _grad_uops,
    _leaf_grads,
    _live_remove,
    _LiveRef,
    _realize_keeping_graphs,
    _register_live,
    _tensor_ids,
    live_tensors,
)
from zeptograd.tensor.movement import MovementMixin
from zeptograd.tensor.nn_ops import NNMixin
from zeptograd.tensor.random import RandomMixin
from zeptograd.tensor.reduce import ReduceMixin
from zeptograd.tensor.symbolic_shapes import _capturing, _check_symbolic_bounds, _symbolic_shape
from zeptograd.tensor.unary import UnaryMixin
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.variable import is_sint, sint_arg

_assign_ids = itertools.count()  # makes every ASSIGN a distinct UOp: two equal writes at different times differ


_device_spellings = Device._spellings  # a valid device name -> its one spelling
_tensor_new = object.__new__
_engine_realize: list[Any] = [None]  # engine/realize.py's realize_tensors, once Tensor.realize imported it


def _tensor_of(uop: UOp, device: str) -> Tensor:
    """Tensor(uop, device) for a tensor-graph node and a device in its one spelling, without __init__'s steps for
    other data (every op makes a Tensor)."""
    t = _tensor_new(Tensor)
    t.uop, t.device, t.requires_grad, t.grad = uop, device, None, None
    ref = _LiveRef(t, _live_remove)  # (_register_live, inline)
    ref.key = next(_tensor_ids)
    live_tensors[ref] = None
    return t


_gradient._tensor_of[0] = _tensor_of  # (gradient.py's rules make a Tensor of each forward node they read)


_PERMUTE, _DETACH = Ops.PERMUTE, Ops.DETACH  # (global reads: on 3.11 Ops.X goes through the enum metaclass's hook)


class Tensor(ElementwiseMixin, UnaryMixin, MovementMixin, ReduceMixin, NNMixin, IndexMixin, RandomMixin):
    """A lazy n-dimensional array. Ops build a graph; `realize()`, `numpy()`, `item()`, `tolist()` run it."""

    __slots__ = ("uop", "device", "requires_grad", "grad", "__weakref__")
    training: ClassVar[bool] = False
    _grad_off: ClassVar[int] = 0  # > 0 inside `no_grad`

    class train(ContextDecorator):
        """`with Tensor.train():` sets Tensor.training (dropout is active only then)."""

        def __init__(self, mode: bool = True):
            self.mode = mode

        def __enter__(self):
            self.prev, Tensor.training = Tensor.training, self.mode

        def __exit__(self, *exc):
            Tensor.training = self.prev

    class no_grad(ContextDecorator):
        """`with Tensor.no_grad():` ops inside build graphs that gradients do not flow through (torch.no_grad)."""

        def __enter__(self):
            Tensor._grad_off += 1

        def __exit__(self, *exc):
            Tensor._grad_off -= 1

    # the same context under other names (torch's inference_mode); declared here so that the type checker sees them
    inference_mode = no_grad
    test = no_grad

    def __init__(
        self,
        data: Any,
        device: str | tuple[str, ...] | None = None,
        dtype: DTypeLike | None = None,
        requires_grad: bool | None = None,
    ):
        _register_live(self)
        if type(device) is str and (known := _device_spellings.get(device)) is not None:
            device = known  # (Device.canonicalize's first step, without its call: every op makes a Tensor)
        elif isinstance(device, (tuple, list)):  # on several devices at once (tensor/multi.py)
            self._init_multi(data, multi.canonical_devices(device), dtype, requires_grad)
            return
        else:
            device = Device.canonicalize(device)
        dt = to_dtype(dtype) if dtype is not None else None
        self.grad: Tensor | None = None
        self.requires_grad, self.device = requires_grad, device
        if isinstance(data, UOp):
            if data.shape is None and is_sint(data):  # Tensor(Variable(...).bind(n)): a 0-d tensor of its value
                data = const_broadcast(sint_arg(data, "Tensor"), dt or dtypes.int32, device, ())
            self.uop = data
            return
        if isinstance(data, Tensor):
            data = data.numpy()
        if isinstance(data, PY_CONST) and not isinstance(data, np.ndarray):
            if dt is None:
                dt = from_numpy_dtype(np.asarray(data).dtype) if isinstance(data, np.generic) else dtypes.from_py(data)
                if isinstance(data, int) and dtypes.is_int(dt) and not dt.min <= data <= dt.max:
                    dt = _wide_int(data)  # as torch's int64, not a silent wraparound of the default int
            if not requires_grad:
                self.uop = const_broadcast(data, dt, device, ())
                return
            data = np.asarray(data)  # a constant that requires grad gets its own buffer: constants are interned
        if isinstance(data, (list, tuple)):
            inferred, dt = dt is None, dt or (dtypes.from_py(data) if len(data) else dtypes.default_float)
            try:
                arr = np.array(data, dtype=to_numpy_dtype(dt) if dt != dtypes.bfloat16 else np.float32)
            except ValueError as e:
                raise ArgumentError(f"can't make a tensor from a ragged or mixed nested list: {e}") from None
            except OverflowError:  # torch: "Overflow when unpacking long"
                if not (inferred and dtypes.is_int(dt)):
                    raise ArgumentError(f"a value in {str(data)[:80]} is out of the range of {dt}") from None
                try:  # ints past the default int: int64, as torch
                    dt, arr = dtypes.int64, np.array(data, dtype=np.int64)
                except OverflowError:
                    raise ArgumentError(f"a value in {str(data)[:80]} is out of the range of dtypes.long") from None
        elif isinstance(data, np.ndarray):
            if data.dtype == object or data.dtype.kind in "cUSVOMm":
                raise ArgumentTypeError(
                    f"numpy dtype {data.dtype} is not supported by zeptograd "
                    f"(supported: bool, int8..int64, uint8..uint64, float16, float32, float64)"
                )
            dt = dt or from_numpy_dtype(data.dtype)
            arr = data.astype(to_numpy_dtype(dt)) if dt != dtypes.bfloat16 else data.astype(np.float32)
        else:
            raise ArgumentTypeError(f"can't make a Tensor from {type(data).__name__}")
        if dt == dtypes.bfloat16:
            arr = (np.asarray(arr, np.float32).view(np.uint32) >> 16).astype(np.uint16)
        self.uop = _buffer_uop(arr, dt, device)
        if requires_grad:
            self.requires_grad_(True)

    def _init_multi(self, data: Any, devices: tuple[str, ...], dtype: DTypeLike | None, requires_grad: bool | None):
        """A tensor on a tuple of devices: a graph built on sharded sources lowered to one graph per device, or data
        made on the first device and replicated on the others."""
        self.grad, self.requires_grad = None, requires_grad
        # typed str: every creation function takes this tuple where it takes a device and passes it on to Tensor
        self.device = devices  # type: ignore[assignment]  # a sharded tensor's device is its tuple, as tinygrad's
        if isinstance(data, UOp):
            self.uop = data if data.op is Ops.MULTI else multi.lower(data, devices)
            return
        one = Tensor(data, device=devices[0], dtype=dtype)
        self.uop = multi.shard_uop(one.uop, devices, None)
        if requires_grad:
            self.requires_grad_(True)

    def _new(
        self, uop: UOp, device: str | tuple[str, ...] | None = None, inputs: tuple[UOp, ...] | None = None
    ) -> Tensor:
        """The Tensor of a UOp built from this tensor's (and others') UOps, on this tensor's device unless `device`
        says otherwise (a COPY): it requires grad if a source does (or one of `inputs`, where it was built from
        them through other nodes: a shard or gather)."""
        if device is None and type(self.device) is str:  # (_tensor_of, inline: every op makes a Tensor here)
            ret = _tensor_new(Tensor)
            ret.uop, ret.device, ret.requires_grad, ret.grad = uop, self.device, None, None
            ref = _LiveRef(ret, _live_remove)
            ref.key = next(_tensor_ids)
            live_tensors[ref] = None
        else:
            ret = Tensor(uop, device=device or self.device)
        if _grad_data:
            for s in uop.src if inputs is None else inputs:  # (a loop, not any() over a generator: every op runs it)
                if weakref.ref(s) in _grad_data:
                    if Tensor._grad_off:
                        ret.uop = UOp(Ops.DETACH, uop.dtype, (ret.uop,))
                        if isinstance(ret.device, tuple):
                            ret.uop = multi.lower(ret.uop, ret.device)
                    else:
                        _grad_data.add(weakref.ref(ret.uop, _grad_remove))  # _grad_uops.add(ret.uop), without a frame
                        ret.requires_grad = True
                    break
        return ret

    # ***** properties *****
    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        return self.numel() * self.element_size()

    def is_floating_point(self) -> bool:
        return dtypes.is_float(self.dtype)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[normalize_axis(dim, self.ndim, "dim")]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise ArgumentTypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        return f"<Tensor {self.shape} {self.dtype} on {self.device}{' requires_grad' if self.requires_grad else ''}>"

    def __hash__(self):
        return id(self)

    def __bool__(self):
        if self.numel() != 1:
            raise ArgumentError(
                f"the truth value of a tensor with shape {self.shape} is ambiguous; use .any() or .all()"
            )
        return bool(self.item())

    # ***** running *****
    def schedule(self, *lst: Tensor) -> list:
        from zeptograd.engine.realize import schedule_tensors

        return schedule_tensors([p for t in (self, *lst) for p in (multi.parts(t) if t.uop.op is Ops.MULTI else [t])])

    def realize(self, *lst: Tensor, do_update_stats: bool = True) -> Tensor:
        """Compute this tensor and `lst` in one schedule. `Tensor.realize(a, b, c)` realizes all three."""
        if (realize_tensors := _engine_realize[0]) is None:  # (engine/ imports this module: imported once, here)
            from zeptograd.engine.realize import realize_tensors

            _engine_realize[0] = realize_tensors
        if not lst and self.uop.op is not Ops.MULTI and not self.requires_grad:  # one tensor on one device, no
            realize_tensors([self])  # graph kept (the common case, fewer steps)
            return self
        _realize_keeping_graphs([self, *lst], realize_tensors)
        return self

    def _realized_uop(self) -> UOp:
        """The BUFFER view or constant holding this tensor's value, running what it needs."""
        from zeptograd.engine.realize import realized_value

        self.realize()
        return realized_value(self.uop)

    def numpy(self) -> np.ndarray:
        from zeptograd.engine.realize import forget_realized, is_memory_view, tensor_to_numpy

        if self.uop.op is Ops.MULTI:
            return multi.numpy(self)
        if not is_memory_view(self.uop):
            return tensor_to_numpy(Tensor(self._realized_uop(), device=self.device))
        # a view of a buffer is read through a copy that is not kept: it goes on showing the buffer's later writes
        view = self.uop
        try:
            return tensor_to_numpy(Tensor(Tensor(view, device=self.device)._realized_uop(), device=self.device))
        finally:
            forget_realized(view)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> ConstType:
        if self.numel() != 1:
            raise ArgumentError(
                f"item() needs a tensor with exactly one element, this one has shape {self.shape} "
                f"({self.numel()} elements)"
            )
        return self.numpy().reshape(()).item()

    def data(self) -> memoryview:
        return self.numpy().data  # the array's own memoryview

    def detach(self) -> Tensor:
        if type(self.device) is str:  # (Tensor(uop, device, requires_grad=False) without __init__'s other steps)
            t = _tensor_of(UOp(_DETACH, self.uop.dtype, (self.uop,)), self.device)
            t.requires_grad = False
            return t
        return Tensor(UOp(Ops.DETACH, self.dtype, (self.uop,)), device=self.device, requires_grad=False)

    def contiguous(self, **kwargs) -> Tensor:
        return self._new(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def contiguous_backward(self) -> Tensor:
        return self  # the gradient is computed lazily and scheduled as a whole: nothing to force

    def clone(self, device: str | None = None) -> Tensor:
        """A copy with its own buffer."""
        return Tensor.empty(*self.shape, dtype=self.dtype, device=self.device).assign(self).to(device or self.device)

    def to(self, device: str | tuple[str, ...] | None) -> Tensor:
        """This tensor on `device`, lazily: a COPY node that the scheduler runs as a copy between the kernels (nothing
        moves at the call; gradients flow back through it). The same device: this tensor itself, as torch."""
        if isinstance(device, (tuple, list)) or isinstance(self.device, tuple):  # to or from several devices
            return self if device == self.device else multi.to(self, device)
        device = Device.canonicalize(device)
        if device == self.device:
            return self
        Device[device]  # a device that can't open here (no OpenCL platform, no driver) fails at this call
        src = self.uop
        if src.op is Ops.ASSIGN and view_base(src.src[0]) is None:  # its value is a view of a larger buffer:
            src = UOp(Ops.CONTIGUOUS, src.dtype, (src,))  # a kernel gathers it, so the copy moves exactly its bytes
        return self._new(UOp(Ops.COPY, self.dtype, (src, UOp(Ops.DEVICE, arg=device))), device)

    def to_(self, device: str | tuple[str, ...] | None) -> Tensor:
        return self.replace(self.to(device))

    def shard(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
        """This tensor on several devices (tinygrad's shard): split along `axis` in slices as equal as they can be
        (the first ones one element larger), or whole on each device (axis None: replicated). Ops on it run on each
        device; `.to(device)` gathers it. See tensor/multi.py."""
        return multi.shard(self, devices, axis)

    def shard_(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
        return self.replace(self.shard(devices, axis))

    def replace(self, x: Tensor) -> Tensor:
        if x.shape != self.shape:
            raise ArgumentError(f"replace needs equal shapes, got {self.shape} and {x.shape}")
        self.uop, self.device = x.uop, x.device
        return self

    def assign(self, x: Tensor | ConstType | list | tuple) -> Tensor:
        """Write x into this tensor, lazily: a buffer-backed tensor gets an ASSIGN whose kernel stores into its
        buffer; a lazy one simply takes x's value. Chained assigns to one buffer fold into one ASSIGN."""
        from zeptograd.engine.realize import (
            current_view,
            note_built,
            note_pending_write,
            note_superseded,
            realized_value,
            with_realized_values,
        )

        if self.uop.op is Ops.MULTI:
            return multi.assign(self, x)
        if not isinstance(x, Tensor):
            x = Tensor(x, device=self.device, dtype=self.dtype)
        if x.device != self.device:
            raise ArgumentError(f"assign: tensors on different devices: {self.device} and {x.device}")
        if x.uop is self.uop:
            return self
        x = x.cast(self.dtype)._broadcast_to(self.shape) if x.shape != self.shape else x.cast(self.dtype)
        target = realized_value(current_view(self.uop))
        value = with_realized_values([x.uop])[0]
        pending = None  # the previous ASSIGN to this buffer, not run yet
        if target.op is Ops.ASSIGN:
            pending, target = target, target.src[0]
        if buffer_under(target) is None:
            self.uop = value  # (pending is None: an ASSIGN's target has a buffer)
        else:
            stops = {target} if pending is None else {target, pending}
            reads_elsewhere = _reads_target_elsewhere(target, value, stops)
            if pending is not None:  # fold into one write whose value reads the previous value
                nodes = value.toposort(stops=stops)  # what was built since `pending` (and no further)
                value = _substitute_walked(value, nodes, pending, pending.src[1])
            if reads_elsewhere:  # computed before the write: (substituted first, so the CONTIGUOUS is the same node)
                value = UOp(Ops.CONTIGUOUS, value.dtype, (value,))
            self.uop = UOp(Ops.ASSIGN, self.dtype, (target, value), next(_assign_ids))
            note_built(self.uop)
            note_pending_write(self)
            if pending is not None:  # it never runs: a tensor built on it reads its value, a view of it the last write
                note_superseded(pending, self.uop)
        if self.requires_grad or weakref.ref(x.uop) in _grad_data:  # a parameter stays one after an optimizer step
            _grad_data.add(weakref.ref(self.uop, _grad_remove))  # (_grad_uops.add, without a frame)
        return self

    def _assign_select(self, mask: UOp, value: UOp, under: UOp | None = None) -> Tensor:
        """self.assign(where(mask, value, self)) for a mask and value of self's shape that read no memory but their
        own (positions and constants: setitem's `t[i] = c`; or buffers of them: `under`, the value the pending write
        had before writes that mask and value stand for, replaces the pending value below the select: setitem's
        compacted run). Where self is a pending write (a loop of setitems after the first),
        the select over that write's value is the folded write, built without assign's walks: it reads the target
        only elementwise at the element it writes, and none of its new nodes can hold a realized buffer (a realized
        copy of a constant holds the same values). Nor are they marked clean (note_built): the next walk that meets
        them (a later assign's, which stops at the nodes the last one marked) marks them, once, so a loop of writes
        of both kinds walks each node a bounded number of times."""
        from zeptograd.engine.realize import current_view, note_pending_write, note_superseded, realized_value

        pending = self.uop
        if (
            pending.op is not Ops.ASSIGN
            or current_view(pending) is not pending
            or realized_value(pending) is not pending
            or pending in _grad_uops
        ):
            return self.assign(self._new(UOp(Ops.WHERE, self.dtype, (mask, value, pending))))
        folded = UOp(Ops.WHERE, self.dtype, (mask, value, pending.src[1] if under is None else under))
        self.uop = UOp(Ops.ASSIGN, self.dtype, (pending.src[0], folded), next(_assign_ids))
        note_pending_write(self)
        note_superseded(pending, self.uop)
        if self.requires_grad:
            _grad_uops.add(self.uop)
        return self

    # ***** autograd *****
    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        if not requires_grad:
            _grad_leaves.pop(id(self), None)
            return self
        if not any(u.op is Ops.BUFFER for u in self.uop.toposort()):  # constants are interned: give it a buffer
            self.uop = Tensor.empty(*self.shape, dtype=self.dtype, device=self.device).assign(self).uop
        _grad_uops.add(self.uop)
        _grad_leaves[id(self)] = self
        return self

    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """d(self)/d(target) for each target, as lazy tensors; self must be a scalar unless `gradient` is given."""
        from zeptograd.gradient import compute_gradient

        root_grad = self._root_grad(gradient)
        nodes = self.uop.toposort()
        found = _grad_targets(nodes, list(targets))
        reached = {id(t) for t in found.values()}
        for t in targets:
            if id(t) not in reached:
                raise ArgumentError(f"gradient asked for {t!r}, which is not in the graph of {self!r}")
        parts = {u for t in targets if t.uop.op is Ops.MULTI for u in t.uop.src}
        grads = compute_gradient(self.uop, root_grad, set(found), frozenset(parts), nodes)
        return [g if (g := _leaf_grads(t, found, grads)) is not None else t.zeros_like() for t in targets]

    def backward(self, gradient: Tensor | None = None) -> Tensor:
        """Accumulate d(self)/d(leaf) into `.grad` of every tensor created with requires_grad=True in the graph."""
        from zeptograd.gradient import compute_gradient

        root_grad = self._root_grad(gradient)
        nodes = self.uop.toposort()
        # (_grad_leaves.values(), from its own dict: a copy in C, not the WeakValueDictionary's Python generator)
        candidates = [t for r in list(_grad_leaves_data.values()) if (t := r()) is not None and t.requires_grad]
        found = _grad_targets(nodes, candidates)
        reached = {id(t) for t in found.values()}
        leaves = [t for t in candidates if id(t) in reached]
        if not leaves:
            raise RuntimeError("backward: no tensor in this graph requires grad (create one with requires_grad=True)")
        parts = {u for t in leaves if t.uop.op is Ops.MULTI for u in t.uop.src}
        grads = compute_gradient(self.uop, root_grad, set(found), frozenset(parts), nodes)
        for t in leaves:  # detached, as torch's without create_graph: an update built from .grad needs no gradient
            if (g := _leaf_grads(t, found, grads)) is not None:
                g = g.detach()
                t.grad = g if t.grad is None else t.grad + g
        return self

    def _root_grad(self, gradient: Tensor | None) -> Tensor:
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(
                    f"backward/gradient of a non-scalar tensor of shape {self.shape} needs a gradient "
                    f"argument of that shape"
                )
            return self.ones_like()
        if gradient.shape != self.shape:
            raise ArgumentError(f"the gradient's shape {gradient.shape} must equal the tensor's shape {self.shape}")
        return gradient.cast(self.dtype)

    # ***** creation *****
    @staticmethod
    def _shape_arg(shape: tuple, symbolic: bool = False) -> tuple:
        """A creation shape; with symbolic=True its sizes may be bound Variables (uop/variable.py)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if any(isinstance(s, UOp) for s in shape):
            if not symbolic:
                raise ArgumentError(
                    f"this creation function needs int sizes, got the symbolic shape {shape}: make it at "
                    f"the largest size and shrink it to the Variable"
                )
            return _symbolic_shape(shape, "shape")
        for s in shape:
            if not isinstance(s, (int, np.integer)) or s < 0:
                raise ArgumentError(f"a shape is made of non-negative ints, got {shape}")
        return tuple(int(s) for s in shape)

    @staticmethod
    def full(
        shape: tuple[int, ...] | int,
        fill_value: ConstType,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        requires_grad: bool | None = None,
        **kwargs,
    ) -> Tensor:
        shape = Tensor._shape_arg(shape if isinstance(shape, (tuple, list)) else (shape,), symbolic=True)
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
        device = Device.canonicalize(device)
        ret = Tensor(const_broadcast(fill_value, dt, device, shape), device=device)
        return ret.requires_grad_(True) if requires_grad else ret

    @staticmethod
    def zeros(*shape, dtype: DTypeLike | None = None, **kwargs) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape, True), 0, dtype=dtype or dtypes.default_float, **kwargs)

    @staticmethod
    def ones(*shape, dtype: DTypeLike | None = None, **kwargs) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape, True), 1, dtype=dtype or dtypes.default_float, **kwargs)

    @staticmethod
    def empty(
        *shape, dtype: DTypeLike | None = None, device: str | None = None, requires_grad: bool | None = None
    ) -> Tensor:
        shape = Tensor._shape_arg(shape, symbolic=True)  # a symbolic shape: a buffer of its largest size
        dt = to_dtype(dtype or dtypes.default_float)
        if isinstance(device, (tuple, list)):  # a buffer on each device
            devices = multi.canonical_devices(device)
            parts = [Tensor.empty(*shape, dtype=dt, device=d).uop for d in devices]
            ret = Tensor(multi.multi(parts, None), device=devices)
            return ret.requires_grad_(True) if requires_grad else ret
        device = Device.canonicalize(device)
        n = prod(shape)
        ret = Tensor(reshape_uop(new_buffer_uop(device, n.vmax if isinstance(n, UOp) else n, dt), shape), device=device)
        return ret.requires_grad_(True) if requires_grad else ret

    def full_like(
        self, fill_value: ConstType, dtype: DTypeLike | None = None, device: str | None = None, **kwargs
    ) -> Tensor:
        return Tensor.full(self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.device, **kwargs)

    def zeros_like(self, **kwargs) -> Tensor:
        return self.full_like(0, **kwargs)

    def ones_like(self, **kwargs) -> Tensor:
        return self.full_like(1, **kwargs)

    def empty_like(self, dtype: DTypeLike | None = None, device: str | None = None, **kwargs) -> Tensor:
        return Tensor.empty(self.shape, dtype=dtype or self.dtype, device=device or self.device, **kwargs)

    def const_like(self, b: ConstType, dtype: DType | None = None) -> Tensor:
        return Tensor.full(self.shape, b, dtype=dtype or self.dtype, device=self.device)

    @staticmethod
    def _iota(n: int, device: str | tuple[str, ...] | None) -> Tensor:
        device = multi.canonical_devices(device) if isinstance(device, (tuple, list)) else Device.canonicalize(device)
        return Tensor(iota_uop(n, device), device=device)

    @staticmethod
    def arange(
        start: ConstType,
        stop: ConstType | None = None,
        step: ConstType = 1,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        **kwargs,
    ) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise ArgumentError("arange: step must not be 0")
        dt = to_dtype(dtype) if dtype is not None else dtypes.from_py([start, stop, step])
        n = max(0, math.ceil((stop - start) / step))
        ret = (Tensor._iota(n, device).cast(dt) * step + start).cast(dt)
        return ret.requires_grad_(True) if kwargs.get("requires_grad") else ret

    @staticmethod
    def linspace(
        start: ConstType,
        stop: ConstType,
        steps: int,
        dtype: DTypeLike | None = None,
        device: str | None = None,
        **kwargs,
    ) -> Tensor:
        if not isinstance(steps, (int, np.integer)) or isinstance(steps, bool):
            raise ArgumentTypeError(f"linspace: steps must be an int, got {type(steps).__name__} {steps!r}")
        if steps < 0:
            raise ArgumentError(f"linspace: steps must be non-negative, got {steps}")
        dt = to_dtype(dtype or dtypes.default_float)
        if dt == dtypes.bool:
            raise ArgumentError("linspace is not implemented for dtype bool (as torch): use an int or float dtype")
        if steps == 1:
            return Tensor.full((1,), start, dtype=dt, device=device, **kwargs)
        step = (stop - start) / max(steps - 1, 1)
        i = Tensor._iota(steps, device).cast(dtypes.float32 if dt != dtypes.float64 else dt)
        half = steps // 2  # as torch: the first half counts up from start, the second half down from stop
        ret = (i < half).where(i * step + start, stop - (steps - 1 - i) * step).cast(dt)
        return ret.requires_grad_(True) if kwargs.get("requires_grad") else ret

    @staticmethod
    def eye(
        n: int, m: int | None = None, dtype: DTypeLike | None = None, device: str | None = None, **kwargs
    ) -> Tensor:
        m = n if m is None else m
        if n < 0 or m < 0:
            raise ArgumentError(f"eye needs non-negative sizes, got {n}, {m}")
        ret = Tensor._iota(n, device).reshape(n, 1) == Tensor._iota(m, device).reshape(1, m)
        ret = ret.cast(to_dtype(dtype or dtypes.default_float))
        return ret.requires_grad_(True) if kwargs.get("requires_grad") else ret

    # ***** movement primitives (one UOp each; composites are in movement.py) *****
    def reshape(self, shape, *args) -> Tensor:
        shape = argfix(shape, *args)
        if not variable.in_use:  # (the common case: sizes that are ints >= 0, without the checks' generators below)
            n = 1
            for s in shape:
                if type(s) is not int or s < 0:
                    break
                n *= s
            else:
                if n != (numel := prod(self.uop.shape)):
                    raise ArgumentError(
                        f"can't reshape a tensor of shape {self.shape} ({numel} elements) to {shape} ({n} elements)"
                    )
                return self if shape == self.uop.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape))
        if shape.count(-1) > 1:
            raise ArgumentError(f"reshape to {shape}: only one dimension can be -1")
        shape = tuple(self.shape[i] if s is None else s for i, s in enumerate(shape))
        if any(isinstance(s, UOp) for s in shape + self.shape):
            return self._reshape_symbolic(shape)
        if -1 in shape:
            known = prod(s for s in shape if s != -1)
            if known == 0 or self.numel() % known:
                raise ArgumentError(f"can't reshape a tensor of shape {self.shape} to {shape}")
            shape = tuple(self.numel() // known if s == -1 else s for s in shape)
        if any(not isinstance(s, (int, np.integer)) or s < 0 for s in shape):
            raise ArgumentError(f"can't reshape to {shape}: sizes must be non-negative ints")
        shape = tuple(int(s) for s in shape)
        if prod(shape) != self.numel():
            raise ArgumentError(
                f"can't reshape a tensor of shape {self.shape} ({self.numel()} elements) to {shape} "
                f"({prod(shape)} elements)"
            )
        return self if shape == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape))

    def _reshape_symbolic(self, shape: tuple) -> Tensor:
        """reshape with bound Variables in the shapes: the sizes must agree at the variables' values (while TinyJit
        captures, for every value: a replay runs with other values)."""
        shape = tuple(-1 if isinstance(s, int) and s == -1 else s for s in shape)
        if -1 in shape:
            known = prod(s for s in shape if not (isinstance(s, int) and s == -1))
            kv, nv = variable.sint_value(known), variable.sint_value(self.numel())
            if kv == 0 or nv % kv:
                raise ArgumentError(f"can't reshape a tensor of shape {self.shape} to {shape}")
            n = self.numel() if isinstance(self.numel(), UOp) else UOp.const(dtypes.index, self.numel())
            shape = tuple(variable.sint_simplify(n // known) if isinstance(s, int) and s == -1 else s for s in shape)
        shape = _symbolic_shape(shape, f"reshape to {shape}")
        old_n, new_n = variable.sint_prod(self.shape), variable.sint_prod(shape)
        if not (old_n is new_n or (isinstance(old_n, int) and old_n == new_n)):
            if _capturing():
                raise ArgumentError(
                    f"can't reshape a tensor of shape {self.shape} to {shape} while TinyJit captures: "
                    f"the element counts {old_n} and {new_n} are equal only for some values of the "
                    f"Variables, and a replay runs with others"
                )
            if variable.sint_value(old_n) != variable.sint_value(new_n):
                raise ArgumentError(
                    f"can't reshape a tensor of shape {self.shape} ({variable.sint_value(old_n)} "
                    f"elements) to {shape} ({variable.sint_value(new_n)} elements)"
                )
        return self if shape == self.shape else self._new(UOp(Ops.RESHAPE, self.dtype, (self.uop,), shape))

    def view(self, shape, *args) -> Tensor:
        return self.reshape(shape, *args)

    def permute(self, order, *args) -> Tensor:
        order = argfix(order, *args)
        if len(order) == (n := len(self.uop.shape)):  # (the common case: ints 0..n-1, without the checks' generators)
            named = 0
            for o in order:
                if type(o) is not int or not 0 <= o < n:
                    break
                named |= 1 << o
            else:
                if named == (1 << n) - 1:  # each dimension once
                    if order == tuple(range(n)):
                        return self
                    return self._new(UOp(_PERMUTE, self.dtype, (self.uop,), order))
        if len(order) != self.ndim:
            raise ArgumentError(f"permute order {order} must name each of the {self.ndim} dimensions of {self.shape}")
        norm = tuple(normalize_axis(o, self.ndim, "permute dimension") for o in order)
        if sorted(norm) != list(range(self.ndim)):
            raise ArgumentError(f"permute order {order} is not a permutation of the dimensions of {self.shape}")
        if norm == tuple(range(self.ndim)):
            return self
        return self._new(UOp(Ops.PERMUTE, self.dtype, (self.uop,), norm))

    def expand(self, shape, *args) -> Tensor:
        shape = argfix(shape, *args)
        if len(shape) < self.ndim:
            raise ArgumentError(f"can't expand shape {self.shape} to {shape}: fewer dimensions")
        src = (1,) * (len(shape) - self.ndim) + self.shape
        lead = len(shape) - self.ndim  # new leading dims take no -1 / None: there is no size to keep
        if any(
            not (n is None or isinstance(n, UOp) or (isinstance(n, (int, np.integer)) and n >= (0 if i < lead else -1)))
            for i, n in enumerate(shape)
        ):
            raise ArgumentError(
                f"can't expand shape {self.shape} to {shape}: sizes are non-negative ints (-1 keeps one)"
            )
        new = tuple(s if n in (-1, None) else n for s, n in zip(src, shape))
        if any(s != n and s != 1 for s, n in zip(src, new)):
            raise ArgumentError(f"can't expand shape {self.shape} to {shape}: only size-1 dimensions can grow")
        x = self.reshape(src)
        return x if new == x.shape else x._new(UOp(Ops.EXPAND, self.dtype, (x.uop,), new))

    def _pad_pairs(self, padding) -> list[tuple[int, int]]:
        if any(isinstance(x, UOp) for p in padding for x in (p if isinstance(p, (tuple, list)) else (p,))):
            return self._pad_pairs_symbolic(padding)
        if all(isinstance(p, (int, float, np.number)) for p in padding) and not all(
            isinstance(p, (int, np.integer)) for p in padding
        ):
            raise ArgumentTypeError(f"flat padding {tuple(padding)} must be ints")
        if all(isinstance(p, (int, np.integer)) for p in padding):
            if len(padding) % 2 or len(padding) // 2 > self.ndim:
                raise ArgumentError(f"flat padding {tuple(padding)} must have an even length <= 2*{self.ndim}")
            return [(0, 0)] * (self.ndim - len(padding) // 2) + [
                (int(padding[i]), int(padding[i + 1])) for i in range(len(padding) - 2, -1, -2)
            ]
        if len(padding) != self.ndim:
            raise ArgumentError(f"padding {tuple(padding)} must have one entry per dimension of {self.shape}")
        if not all(
            p is None
            or (isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(x, (int, np.integer)) for x in p))
            for p in padding
        ):
            raise ArgumentTypeError(
                f"padding {tuple(padding)} must be ints, or a (before, after) pair of ints or None per dim"
            )
        return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]

    def _pad_pairs_symbolic(self, padding) -> list:
        """Padding with bound Variables (cat of symbolic sizes): non-negative at their values (for every value while
        TinyJit captures); constant mode only."""
        if all(not isinstance(p, (tuple, list)) and p is not None for p in padding):  # flat, last dimension first
            if len(padding) % 2 or len(padding) // 2 > self.ndim:
                raise ArgumentError(f"flat padding {tuple(padding)} must have an even length <= 2*{self.ndim}")
            padding = [None] * (self.ndim - len(padding) // 2) + [
                (padding[i], padding[i + 1]) for i in range(len(padding) - 2, -1, -2)
            ]
        if len(padding) != self.ndim:
            raise ArgumentError(f"padding {tuple(padding)} must have one entry per dimension of {self.shape}")
        return [(0, 0) if p is None else tuple(_symbolic_shape(tuple(p), f"padding {tuple(padding)}")) for p in padding]

    def pad(self, padding, mode: str = "constant", value: ConstType = 0.0) -> Tensor:
        """`padding` is ((before, after), ...) per dimension (None for none), or a flat torch-style tuple
        (left, right, top, bottom, ...) starting at the last dimension. Negative padding crops.
        Modes: constant (with `value`), reflect, replicate, circular."""
        pairs = self._pad_pairs(padding)
        if mode not in ("constant", "reflect", "replicate", "circular"):
            raise ArgumentError(f"pad mode must be constant, reflect, replicate or circular, got {mode!r}")
        if any(isinstance(x, UOp) for p in pairs for x in p + tuple(self.shape)):
            if mode != "constant" or any(isinstance(x, int) and x < 0 for p in pairs for x in p):
                raise ArgumentError(
                    f"pad with symbolic sizes is constant and non-negative; got mode {mode!r}, padding "
                    f"{tuple(pairs)} on {self.shape}"
                )
        elif any(b < 0 or a < 0 for b, a in pairs):  # negative padding crops
            return self._pad_negative(pairs, mode, value)
        if mode != "constant":
            return self._pad_mode(pairs, mode)
        arg = tuple(pairs)
        if all(p == (0, 0) for p in arg):
            return self
        x = self._new(UOp(Ops.PAD, self.dtype, (self.uop,), arg))
        if value == 0:
            return x
        mask = Tensor.ones(*self.shape, dtype=dtypes.bool, device=self.device).pad(arg)
        return mask.where(x, value)

    def _pad_negative(self, pairs: list[tuple[int, int]], mode: str, value: ConstType) -> Tensor:
        """Padding with negative amounts, as torch: reflect and replicate pad the original (its edges, its
        reflection) and then crop; constant and circular crop first, and circular wraps around what is left."""
        for d, ((b, a), n) in enumerate(zip(pairs, self.shape)):
            least = 1 if mode in ("reflect", "replicate") and (b, a) != (0, 0) else 0
            if n + b + a < least or (mode in ("constant", "circular") and n + min(b, 0) + min(a, 0) < 0):
                raise ArgumentError(
                    f"{mode} padding ({b}, {a}) leaves dimension {d} of size {n} with size {n + b + a}: "
                    f"the negative amounts crop more than there is"
                )
            left = n + min(b, 0) + min(a, 0)
            if mode == "circular" and max(b, a) > left:  # torch reads uninitialized memory or fails here
                raise ArgumentError(
                    f"circular padding ({b}, {a}) of dimension {d} (size {n}) wraps around more than once: the "
                    f"negative amount leaves {left} element(s) to wrap around"
                )
        crop = tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pairs, self.shape))
        grow = tuple((max(b, 0), max(a, 0)) for b, a in pairs)
        if mode in ("reflect", "replicate"):
            x = self.pad(grow, mode=mode)
            return x.shrink(tuple((lo, x.shape[d] - (s - hi)) for d, ((lo, hi), s) in enumerate(zip(crop, self.shape))))
        return self.shrink(crop).pad(grow, mode=mode, value=value)

    def _pad_mode(self, pairs: list[tuple[int, int]], mode: str) -> Tensor:
        x = self
        for d, (b, a) in enumerate(pairs):
            if b == a == 0:
                continue
            n = x.shape[d]
            limit = n - 1 if mode == "reflect" else n if mode == "circular" else math.inf
            if max(b, a) > limit or n == 0:
                raise ArgumentError(f"{mode} padding ({b}, {a}) is too large for dimension {d} of size {n}")

            def part(lo: int, hi: int) -> Tensor:
                return x.shrink(tuple((lo, hi) if i == d else None for i in range(x.ndim)))

            if mode == "reflect":
                left, right = part(1, b + 1).flip(d), part(n - 1 - a, n - 1).flip(d)
            elif mode == "replicate":
                edge = [s if i != d else 1 for i, s in enumerate(x.shape)]
                left = part(0, 1).expand(*edge[:d], b, *edge[d + 1 :])
                right = part(n - 1, n).expand(*edge[:d], a, *edge[d + 1 :])
            else:
                left, right = part(n - b, n), part(0, a)
            x = left.cat(x, right, dim=d)
        return x

    def shrink(self, arg) -> Tensor:
        if len(arg) != self.ndim:
            raise ArgumentError(f"shrink {tuple(arg)} must have one (start, end) or None per dimension of {self.shape}")
        if any(isinstance(x, UOp) for a in arg if a is not None for x in a) or any(
            isinstance(s, UOp) for s in self.shape
        ):
            norm = tuple(
                (0, s) if a is None else (variable.sint_arg(a[0], "shrink"), variable.sint_arg(a[1], "shrink"))
                for a, s in zip(arg, self.shape)
            )
            _check_symbolic_bounds(norm, self.shape, f"shrink {tuple(arg)}")
        else:
            norm = tuple((0, s) if a is None else (int(a[0]), int(a[1])) for a, s in zip(arg, self.shape))
        for (b, e), s in zip(norm, self.shape):
            if not isinstance(b, UOp) and not isinstance(e, UOp) and not isinstance(s, UOp) and not 0 <= b <= e <= s:
                raise ArgumentError(f"shrink {tuple(arg)} is out of bounds for shape {self.shape}")
        if all(isinstance(b, int) and b == 0 and (e is s or e == s) for (b, e), s in zip(norm, self.shape)):
            return self
        return self._new(UOp(Ops.SHRINK, self.dtype, (self.uop,), norm))

    def flip(self, axis, *args) -> Tensor:
        given = [normalize_axis(a, self.ndim) for a in argfix(axis, *args)]
        axes = set(given)
        if len(axes) != len(given):  # flip((1, -1)) is a typo, not a double flip that cancels
            dup = next(a for a in given if given.count(a) > 1)
            raise ArgumentError(f"flip: dim {dup} appears multiple times in the list of dims {argfix(axis, *args)}")
        if not axes:
            return self
        return self._new(UOp(Ops.FLIP, self.dtype, (self.uop,), tuple(i in axes for i in range(self.ndim))))
