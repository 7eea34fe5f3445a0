"""The one IR: `UOp(op, dtype, src, arg)`, immutable and interned, and the `Ops` it is made of."""

from __future__ import annotations

import math
import weakref
from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]  # CPython's, not in typeshed
from enum import Enum, EnumType, auto
from typing import TYPE_CHECKING, Any, Callable, Container

from zeptograd.dtype import DType, PtrDType, dtypes, truncate
from zeptograd.helpers import prod


class _MembersInDictType(EnumType):
    """Python 3.11's EnumType defines __getattr__, so every read of a class attribute (`Ops.ADD`, a few hundred
    instructions) went through a Python-visible call of type.__getattribute__ (3.12 dropped it). An enum whose members
    are all in its own __dict__ is read there directly (object.__getattribute__: what the class's own dict holds, as
    type.__getattribute__ gives it for members and plain functions); any other name falls back to
    type.__getattribute__. (Where EnumType has no __getattr__, this is EnumType.)"""

    if "__getattr__" in vars(EnumType):
        __getattribute__ = object.__getattribute__

        def __getattr__(cls, name: str) -> Any:
            return type.__getattribute__(cls, name)


class Ops(Enum, metaclass=_MembersInDictType):
    # tensor graph: buffers, constants and movement
    BUFFER = auto()  # arg=(uid, size, device); shape (size,)
    CONST = auto()  # arg=value; shape (); in the tensor graph src=(DEVICE,)
    DEVICE = auto()  # arg=device name
    IOTA = auto()  # arg=n; shape (n,): the values 0..n-1, an index-only tensor (arange builds on it)
    RESHAPE = auto()  # arg=new shape
    PERMUTE = auto()  # arg=order
    EXPAND = auto()  # arg=new shape
    PAD = auto()  # arg=((before, after), ...)
    SHRINK = auto()  # arg=((start, end), ...)
    FLIP = auto()  # arg=(bool per axis)
    REDUCE_AXIS = auto()  # arg=(alu op, axes); keeps reduced axes as size 1
    CONTIGUOUS = auto()  # force a buffer
    DETACH = auto()  # stops gradients; otherwise the identity
    ASSIGN = auto()  # src=(target, value)
    COPY = auto()  # src=(value, DEVICE target): the value moved to another device (a copy item, not a kernel)
    MULTI = auto()  # src=one part per device, arg=sharded axis or None (replicated): a sharded tensor (tensor/multi.py)
    # scheduling
    BUFFERIZE = auto()  # src=(value, *ranges): a value that may be materialized
    SINK = auto()  # groups outputs
    # kernel graph
    DEFINE_GLOBAL = auto()  # arg=argument slot; dtype is a PtrDType
    DEFINE_VAR = auto()  # arg=(name, min, max): a symbolic integer
    BIND = auto()  # src=(DEFINE_VAR, CONST): a variable bound to a value (shapes hold it; uop/variable.py)
    DEFINE_REG = auto()  # arg=register id; an accumulator
    RANGE = auto()  # src=(end,), arg=(axis id, AxisType)
    REDUCE = auto()  # src=(value, *ranges), arg=alu op
    INDEX = auto()  # src=(buffer, index[, valid])
    LOAD = auto()  # src=(index,) or (index, alt) for a gated load
    STORE = auto()  # src=(index, value)
    AFTER = auto()  # src=(x, *deps): x, ordered after deps
    END = auto()  # src=(store, *ranges): closes the loops of ranges
    VECTORIZE = auto()  # src=scalars -> one vector
    GEP = auto()  # arg=(lane, ...): lanes of a vector
    SPECIAL = auto()  # arg=name: a thread id
    GROUP = auto()  # src=statements (stores) that belong together, e.g. the lanes of an expanded store
    DEFINE_LOCAL = auto()  # arg=name; dtype base.ptr(size, local=True): GPU shared memory of a work-group
    BARRIER = auto()  # src=stores it waits for: a GPU work-group barrier
    PREFETCH = auto()  # src=(INDEX,): a hint that this memory is read soon; no value, no effect (codegen/prefetch.py)
    # alu
    CAST = auto()
    BITCAST = auto()
    EXP2 = auto()
    LOG2 = auto()
    SIN = auto()
    COS = auto()
    TAN = auto()
    SQRT = auto()
    RECIPROCAL = auto()
    NEG = auto()
    TRUNC = auto()
    ADD = auto()
    SUB = auto()
    MUL = auto()
    FDIV = auto()
    IDIV = auto()  # truncates toward zero, as C does
    MOD = auto()  # the sign of the dividend, as C does
    MAX = auto()
    CMPLT = auto()
    CMPNE = auto()
    CMPEQ = auto()
    AND = auto()
    OR = auto()
    XOR = auto()
    SHL = auto()
    SHR = auto()
    WHERE = auto()
    MULACC = auto()

    def __repr__(self):
        return f"Ops.{self.name}"

    __hash__ = object.__hash__  # members are singletons; Enum's own hash hashes the name on every dict lookup


# _MembersInDictType reads Ops.X from Ops.__dict__: every member must be there (none hidden by a base's descriptor)
assert all(vars(Ops).get(name) is member for name, member in Ops.__members__.items())


class GroupOp:
    Unary = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC}
    Transcendental = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN, Ops.SQRT, Ops.RECIPROCAL}  # costly per element
    # computed by range reduction and a polynomial where a target has no instruction for them: a vector's lanes and
    # a scalar call may differ in the last bits
    Approximated = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.COS, Ops.TAN}
    Binary = {
        Ops.ADD,
        Ops.SUB,
        Ops.MUL,
        Ops.FDIV,
        Ops.IDIV,
        Ops.MOD,
        Ops.MAX,
        Ops.CMPLT,
        Ops.CMPNE,
        Ops.CMPEQ,
        Ops.AND,
        Ops.OR,
        Ops.XOR,
        Ops.SHL,
        Ops.SHR,
    }
    Ternary = {Ops.WHERE, Ops.MULACC}
    ALU = Unary | Binary | Ternary
    Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
    Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}
    Comparison = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
    Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
    Idempotent = {Ops.AND, Ops.OR, Ops.MAX}


class AxisType(Enum):
    """How a RANGE will be emitted; optimizer actions change it."""

    LOOP = auto()  # an output axis, a plain loop
    REDUCE = auto()  # an axis a reduce consumes
    UPCAST = auto()  # an output axis turned into vector lanes
    UNROLL = auto()  # a reduce axis turned into vector lanes
    LOCAL = auto()
    GROUP = auto()

    def __repr__(self):
        return f"AxisType.{self.name}"


# ***** the arithmetic shared by UOp and UPat: operators build ALU nodes *****


class MathMixin:
    __slots__ = ()

    def alu(self, op: Ops, *src: Any) -> Any:
        raise NotImplementedError

    def const_like(self, b: Any) -> Any:
        raise NotImplementedError

    def _binop(self, op: Ops, x: Any, reverse: bool) -> Any:
        x = x if isinstance(x, MathMixin) else self.const_like(x)
        return x.alu(op, self) if reverse else self.alu(op, x)

    def __add__(self, x):
        return self._binop(Ops.ADD, x, False)

    def __radd__(self, x):
        return self._binop(Ops.ADD, x, True)

    def __mul__(self, x):
        return self._binop(Ops.MUL, x, False)

    def __rmul__(self, x):
        return self._binop(Ops.MUL, x, True)

    def __sub__(self, x):
        return self._binop(Ops.SUB, x, False)

    def __rsub__(self, x):
        return self._binop(Ops.SUB, x, True)

    def __floordiv__(self, x):
        return self._binop(Ops.IDIV, x, False)

    def __mod__(self, x):
        return self._binop(Ops.MOD, x, False)

    def __truediv__(self, x):
        return self._binop(Ops.FDIV, x, False)

    def __neg__(self):
        return self.alu(Ops.NEG)

    def __and__(self, x):
        return self._binop(Ops.AND, x, False)

    def __or__(self, x):
        return self._binop(Ops.OR, x, False)

    def __xor__(self, x):
        return self._binop(Ops.XOR, x, False)

    def __lt__(self, x):
        return self._binop(Ops.CMPLT, x, False)

    def __gt__(self, x):
        return self._binop(Ops.CMPLT, x, True)

    def __ge__(self, x):
        lt = self._binop(Ops.CMPLT, x, False)
        return lt.alu(Ops.CMPNE, lt.const_like(True))

    def __le__(self, x):
        gt = self._binop(Ops.CMPLT, x, True)
        return gt.alu(Ops.CMPNE, gt.const_like(True))

    def ne(self, x):
        return self._binop(Ops.CMPNE, x, False)

    def eq(self, x):
        return self._binop(Ops.CMPEQ, x, False)

    def maximum(self, x):
        return self._binop(Ops.MAX, x, False)

    def minimum(self, x):
        return -((-self).maximum(-x)) if not isinstance(x, MathMixin) else -((-self).maximum(-x))

    def where(self, x, y):
        x = x if isinstance(x, MathMixin) else self.const_like(x)
        y = y if isinstance(y, MathMixin) else x.const_like(y)
        return self.alu(Ops.WHERE, x, y)

    def logical_not(self):
        return self.alu(Ops.CMPNE, self.const_like(True))  # self is a bool


# ***** UOp *****


# key -> a weak reference to the live UOp of that key (what a WeakValueDictionary holds, without its Python-level
# get/set: interning runs on every node built). A reference's callback removes its entry once the UOp is gone, unless
# a new UOp of the same key replaced it meanwhile (_remove_dead_weakref checks that atomically).
class _CacheRef(weakref.ref):
    """A weak reference that knows its cache key: weakref.KeyedRef without KeyedRef's Python-level __new__ and
    __init__ (two Python calls for each node built; this one is built in C and given its key after)."""

    __slots__ = ("key",)
    key: tuple


_uop_cache: dict[tuple, _CacheRef] = {}


def _uncache(ref: _CacheRef, _cache: dict = _uop_cache, _remove: Callable = _remove_dead_weakref) -> None:
    _remove(_cache, ref.key)


def _arg_key(arg: Any) -> Any:
    """A key under which equal args meet: nan equals nan, and -0.0 is not 0.0 (Python's == says otherwise)."""
    if isinstance(arg, float) and (arg != arg or (arg == 0.0 and math.copysign(1.0, arg) < 0)):
        return ("float", repr(arg))
    return arg


_object_new = object.__new__


class UOpMeta(type):
    def __call__(cls: Any, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
        key = (op, dtype, src, _arg_key(arg) if isinstance(arg, float) else arg)
        try:
            ref = _uop_cache.get(key)
        except TypeError as e:  # an unhashable arg
            raise TypeError(f"UOp arg must be hashable, got {arg!r} for {op}") from e
        if ref is not None and (ret := ref()) is not None:
            return ret
        # built here, not by type.__call__ and an __init__ (two calls through slot wrappers per node)
        ret = _object_new(cls)
        ret.op, ret.dtype, ret.src, ret.arg = op, dtype, src, arg
        # its shape, O(1) from its sources' (the common cases here, without _infer_shape's call)
        if not src or op in _LEAF_OPS:
            ret.shape = (arg[1],) if op is _BUFFER else _infer_shape(ret)
        elif src[0].shape is None:  # a kernel-graph node
            ret.shape = None
        elif op in _SHAPE_OF_LAST_SOURCE:
            ret.shape = src[-1].shape if op is not _WHERE else src[1].shape
        elif op is _RESHAPE or op is _EXPAND:  # (_infer_shape's next case, inline)
            ret.shape = tuple(arg)
        else:
            ret.shape = _infer_shape(ret)
        ret._vrange = ret._cache_key = ret._mems = None
        ret._clean = -1
        ref = _CacheRef(ret, _uncache)
        ref.key = key  # (before it is published: the callback reads it)
        # published by one atomic setdefault: two threads building the same new node get one object (`is` is
        # equality); the other thread's node was built outside any lock, as building one may build others (a shape)
        while (known_ref := _uop_cache.setdefault(key, ref)) is not ref:
            if (known := known_ref()) is not None:
                return known
            _remove_dead_weakref(_uop_cache, key)  # a dead node's entry whose callback has not run yet
        return ret


def fresh_uop(op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any, shape: tuple | None) -> UOp:
    """UOp(op, dtype, src, arg) for a key no node has had (its arg holds a number drawn for it: a new BUFFER's), with
    its `shape`: built and published without UOpMeta's lookup and shape inference (every realize makes one)."""
    ret = _object_new(UOp)
    ret.op, ret.dtype, ret.src, ret.arg, ret.shape = op, dtype, src, arg, shape
    ret._vrange = ret._cache_key = ret._mems = None
    ret._clean = -1
    ref = _CacheRef(ret, _uncache)
    ref.key = key = (op, dtype, src, arg)
    _uop_cache[key] = ref  # (no other thread can build this key: no node of it existed)
    return ret


def interned_uop(op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any, key_arg: Any, shape: tuple | None) -> UOp:
    """UOp(op, dtype, src, arg) where its `shape` is known (a gradient-cache template's, zeptograd/gradient_cache.py)
    and `key_arg` is arg as the cache keys it (_arg_key): the live node of that key, else a new one published as
    UOpMeta.__call__ does, without its shape inference."""
    key = (op, dtype, src, key_arg)
    if (ref := _uop_cache.get(key)) is not None and (ret := ref()) is not None:
        return ret
    ret = _object_new(UOp)
    ret.op, ret.dtype, ret.src, ret.arg, ret.shape = op, dtype, src, arg, shape
    ret._vrange = ret._cache_key = ret._mems = None
    ret._clean = -1
    ref = _CacheRef(ret, _uncache)
    ref.key = key
    while (known_ref := _uop_cache.setdefault(key, ref)) is not ref:  # (UOpMeta.__call__'s publication)
        if (known := known_ref()) is not None:
            return known
        _remove_dead_weakref(_uop_cache, key)
    return ret


class UOp(MathMixin, metaclass=UOpMeta):
    """A node of every graph zeptograd builds. Equal UOps are the same object, so `is` is equality."""

    # _cache_key: the schedule cache's memo of this node's structure (engine/schedule_cache.py: fast_key), or None;
    # _mems: the memories its graph reads (engine/realize.py: _memories_read), or None until asked; _clean: the count
    # of nodes realized when its graph was found to hold none of them (engine/realize.py: with_realized_values)
    __slots__ = ("op", "dtype", "src", "arg", "shape", "_vrange", "_cache_key", "_mems", "_clean", "__weakref__")

    if TYPE_CHECKING:  # (UOpMeta.__call__ builds every UOp but a new BUFFER's, fresh_uop's: no __init__ call)

        def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None): ...

    # (set by UOpMeta.__call__)
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    shape: tuple | None
    _vrange: tuple[Any, Any] | None
    _cache_key: list | None
    _mems: frozenset[int] | None
    _clean: int

    def __reduce__(self):
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __repr__(self):
        if self.op in (Ops.DEFINE_VAR, Ops.BIND) or (
            self.dtype is dtypes.index and self.shape is None and self.op in GroupOp.ALU
        ):
            from zeptograd.uop.variable import render_sint

            if (text := render_sint(self)) is not None:
                return text
        return pretty(self)

    # --- construction helpers ---
    def alu(self, op: Ops, *src: UOp) -> UOp:
        out_dtype = src[-1].dtype if src else self.dtype
        if out_dtype.scalar is dtypes.int32:  # index math with an int64 term (past 2**31) is int64
            if self.dtype.scalar is dtypes.int64 or any(s.dtype.scalar is dtypes.int64 for s in src):
                out_dtype = dtypes.int64.vec(out_dtype.count)
        if op in GroupOp.Comparison:
            out_dtype = dtypes.bool.vec(self.dtype.count)
        if op is Ops.WHERE:
            out_dtype = src[0].dtype
        return UOp(op, out_dtype, (self, *src))

    def const_like(self, b: Any) -> UOp:
        return UOp.const(self.dtype, b)

    @staticmethod
    def const(dtype: DType, b: Any) -> UOp:
        if isinstance(b, UOp):
            return b
        if dtype.count > 1:
            return UOp(Ops.VECTORIZE, dtype, (UOp.const(dtype.scalar, b),) * dtype.count)
        if dtype == dtypes.index and isinstance(b, int) and not dtypes.min(dtype) <= b <= dtypes.max(dtype):
            dtype = dtypes.int64  # index arithmetic is exact: a size, stride or offset past int32 is an int64
        return UOp(Ops.CONST, dtype, (), truncate(dtype, b))

    @staticmethod
    def variable(name: str, vmin: int, vmax: int, dtype: DType = dtypes.index) -> UOp:
        return UOp(Ops.DEFINE_VAR, dtype, (), (name, vmin, vmax))

    def bind(self, val: int) -> UOp:
        """This DEFINE_VAR bound to `val` (a BIND): usable in shapes; kernels see the unbound variable."""
        from zeptograd.uop.variable import bind

        return bind(self, val)

    def unbind(self) -> tuple[UOp, int]:
        """(the variable, its value) of a BIND."""
        if self.op is not Ops.BIND:
            raise ValueError(f"unbind() needs a bound variable (Variable(...).bind(value)), not {self.op}")
        return self.src[0], self.src[1].arg

    @staticmethod
    def range(end: int | UOp, axis: int, kind: AxisType = AxisType.LOOP) -> UOp:
        end = end if isinstance(end, UOp) else UOp.const(dtypes.index, end)
        return UOp(Ops.RANGE, dtypes.int64 if end.dtype == dtypes.int64 else dtypes.index, (end,), (axis, kind))

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        return UOp(Ops.BITCAST, dtype, (self,))

    def index(self, idx: UOp, valid: UOp | None = None) -> UOp:
        return UOp(Ops.INDEX, self.dtype, (self, idx) if valid is None else (self, idx, valid))

    def load(self, *src: UOp, dtype: DType | None = None) -> UOp:
        base = self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype
        return UOp(Ops.LOAD, dtype or base, (self, *src))

    def store(self, val: UOp) -> UOp:
        return UOp(Ops.STORE, dtypes.void, (self, val))

    def after(self, *deps: UOp) -> UOp:
        return UOp(Ops.AFTER, self.dtype, (self, *deps))

    def end(self, *ranges: UOp) -> UOp:
        return UOp(Ops.END, dtypes.void, (self, *ranges)) if ranges else self

    def sink(self, *src: UOp) -> UOp:
        return UOp(Ops.SINK, dtypes.void, (self, *src))

    def replace(self, **kwargs) -> UOp:
        args = {"op": self.op, "dtype": self.dtype, "src": self.src, "arg": self.arg} | kwargs
        return UOp(args["op"], args["dtype"], tuple(args["src"]), args["arg"])

    # --- properties ---
    @property
    def size(self) -> int:
        return prod(self.tensor_shape)

    @property
    def ndim(self) -> int:
        return len(self.tensor_shape)

    @property
    def tensor_shape(self) -> tuple[int, ...]:
        """The shape of a node of the tensor graph (where the caller knows it is one): not None."""
        if self.shape is None:  # an index expression or a kernel's node
            raise TypeError(f"{self.op} has no shape")
        return self.shape

    @property
    def vmin(self):
        return self.vrange[0]

    @property
    def vmax(self):
        return self.vrange[1]

    @property
    def vrange(self) -> tuple[Any, Any]:
        if self._vrange is None:
            for s in self.src:
                if s._vrange is None:
                    break
            else:  # the common case, a node built on known sources: no walk
                self._vrange = _value_range(self)
                return self._vrange
            for u in self.toposort(gate=lambda x: x._vrange is None):  # sources first, no recursion
                if u._vrange is None:
                    u._vrange = _value_range(u)
        assert self._vrange is not None  # the walk ends at self
        return self._vrange

    # --- graph walks, all iterative ---
    def toposort(
        self, gate: Callable[[UOp], bool] | None = None, stops: Container[UOp] | None = None
    ) -> dict[UOp, None]:
        """Every UOp this one depends on, sources before users (a dict used as an ordered set). A node the gate
        refuses, or one of `stops` (the gate `lambda u: u not in stops` without its Python call per node), is listed
        without its sources."""
        # a depth-first walk, each stack entry a node and the iterator over its sources still to visit: the order of
        # the recursive postorder (first source first)
        visited: dict[UOp, None] = {}
        if (gate is not None and not gate(self)) or (stops is not None and self in stops):
            visited[self] = None
            return visited
        stack: list[tuple[UOp, Any]] = [(self, iter(self.src))]
        push, pop = stack.append, stack.pop
        while stack:
            u, it = stack[-1]
            for s in it:
                if s not in visited:
                    if (gate is None or gate(s)) and (stops is None or s not in stops):
                        push((s, iter(s.src)))
                        break
                    visited[s] = None
            else:
                pop()
                visited[u] = None
        return visited

    def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
        from zeptograd.uop.upat import graph_substitute

        return graph_substitute(self, mapping)

    def simplify(self) -> UOp:
        from zeptograd.uop.symbolic import simplify

        return simplify(self)

    @property
    def ranges(self) -> list[UOp]:
        return [u for u in self.toposort() if u.op is Ops.RANGE]


_SHAPE_OF_LAST_SOURCE = frozenset(GroupOp.Elementwise | {Ops.FLIP, Ops.CONTIGUOUS, Ops.DETACH})
_LEAF_OPS = frozenset({Ops.BUFFER, Ops.CONST, Ops.IOTA})  # a shape from the arg, whatever the sources
_BUFFER, _WHERE = Ops.BUFFER, Ops.WHERE  # (globals for UOpMeta.__call__: a global read is cheaper than Ops.X's)
# (and for _infer_shape)
_CONST, _IOTA, _RESHAPE, _EXPAND, _PERMUTE, _PAD = Ops.CONST, Ops.IOTA, Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD
_SHRINK, _REDUCE_AXIS, _ASSIGN, _COPY, _MULTI = Ops.SHRINK, Ops.REDUCE_AXIS, Ops.ASSIGN, Ops.COPY, Ops.MULTI


def _infer_shape(u: UOp) -> tuple[int, ...] | None:
    """The shape of a tensor-graph node from its sources' shapes; None for kernel-graph nodes."""
    op, src, arg = u.op, u.src, u.arg
    if op is _BUFFER:
        return (arg[1],)
    if op is _CONST:
        return ()
    if op is _IOTA:
        return (arg,)
    if not src or src[0].shape is None:
        return None
    if op in _SHAPE_OF_LAST_SOURCE:  # (first: the most common nodes of a tensor graph)
        return src[-1].shape if op is not _WHERE else src[1].shape
    if op in (_RESHAPE, _EXPAND):
        return tuple(arg)
    if op is _PERMUTE:
        return tuple(src[0].shape[i] for i in arg)
    if op is _PAD:
        return _sints(tuple(s + b + a for s, (b, a) in zip(src[0].shape, arg)))
    if op is _SHRINK:
        return _sints(tuple(e - b for b, e in arg))
    if op is _REDUCE_AXIS:
        return tuple(1 if i in arg[1] else s for i, s in enumerate(src[0].shape))
    if op in (_ASSIGN, _COPY):
        return src[0].shape
    if op is _MULTI:  # the logical shape: the parts joined along the sharded axis
        if arg is None:
            return src[0].shape
        joined = sum(p.tensor_shape[arg] for p in src)
        return _sints(tuple(joined if i == arg else s for i, s in enumerate(src[0].shape)))
    return None


def _sints(shape: tuple) -> tuple:
    """A shape computed with symbolic sizes (uop/variable.py): each simplified, an int where it is a constant."""
    if not any(isinstance(s, UOp) for s in shape):
        return shape
    from zeptograd.uop.variable import sint_simplify

    return tuple(sint_simplify(s) for s in shape)


# ***** evaluating ALU ops on Python values (constant folding, value ranges, the PYTHON device) *****


def _idiv(a, b):
    return 0 if b == 0 else abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)


def _mod(a, b):
    return 0 if b == 0 else a - _idiv(a, b) * b


def _safe(fn: Callable) -> Callable:
    def wrapped(*x):
        try:
            return fn(*x)
        except (OverflowError, ValueError, ZeroDivisionError):
            return math.nan

    return wrapped


python_alu: dict[Ops, Callable] = {
    Ops.EXP2: _safe(lambda x: math.inf if x >= 1024 else 2.0**x),  # (nan: 2.0**nan is nan)
    Ops.LOG2: lambda x: math.log2(x) if x > 0 else -math.inf if x == 0 else math.nan,
    Ops.SIN: lambda x: math.sin(x) if not math.isinf(x) else math.nan,
    Ops.COS: lambda x: math.cos(x) if not math.isinf(x) else math.nan,
    Ops.TAN: lambda x: math.tan(x) if not math.isinf(x) else math.nan,
    Ops.SQRT: lambda x: math.sqrt(x) if x >= 0 else math.nan,
    Ops.RECIPROCAL: lambda x: 1 / x if x != 0 else math.copysign(math.inf, x),
    Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x,
    Ops.TRUNC: lambda x: x if math.isinf(x) or math.isnan(x) else float(math.trunc(x)),
    Ops.ADD: lambda a, b: a + b,
    Ops.SUB: lambda a, b: a - b,
    Ops.MUL: lambda a, b: a * b,
    Ops.FDIV: lambda a, b: (
        a / b
        if b != 0
        else (
            math.nan
            if a == 0 or a != a
            else math.copysign(math.inf, a * b)
            if math.copysign(1, b) > 0
            else -math.copysign(math.inf, a)
        )
    ),
    Ops.IDIV: _idiv,
    Ops.MOD: _mod,
    Ops.MAX: lambda a, b: a if a != a else b if b != b else max(a, b),
    Ops.CMPLT: lambda a, b: a < b,
    Ops.CMPNE: lambda a, b: a != b,
    Ops.CMPEQ: lambda a, b: a == b,
    Ops.AND: lambda a, b: a & b,
    Ops.OR: lambda a, b: a | b,
    Ops.XOR: lambda a, b: a ^ b,
    Ops.SHL: lambda a, b: a << b if 0 <= b < 64 else 0,
    Ops.SHR: lambda a, b: a >> b if 0 <= b < 64 else 0,
    Ops.WHERE: lambda c, a, b: a if c else b,
    Ops.MULACC: lambda a, b, c: a * b + c,
}


def exec_alu(op: Ops, dtype: DType, operands: list) -> Any:
    if op is Ops.CAST:
        return truncate(dtype, operands[0])
    return truncate(dtype, python_alu[op](*operands))


# ***** value ranges: the smallest and largest value a UOp can take *****


def _value_range(u: UOp) -> tuple[Any, Any]:
    dt = u.dtype.scalar if not isinstance(u.dtype, PtrDType) else dtypes.int64
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    if u.op is Ops.CONST:
        return u.arg, u.arg
    if u.op is Ops.DEFINE_VAR:
        return u.arg[1], u.arg[2]
    if u.op is Ops.BIND:  # the variable's range, not the bound value: a kernel is valid for every value
        return u.src[0].vrange
    if u.op is Ops.RANGE:
        # a symbolic loop that may run once runs at most once, not "always at 0": folded to 0, its body would no
        # longer depend on it and be hoisted out of a loop that may run 0 times (a tail of n % 2, say)
        return 0, u.src[0].vmax - 1 if u.src[0].op is Ops.CONST else max(u.src[0].vmax - 1, 1)
    if u.op is Ops.VECTORIZE and u.src:
        return min(s.vmin for s in u.src), max(s.vmax for s in u.src)
    if u.op is Ops.SPECIAL:
        return 0, u.src[0].vmax - 1 if u.src else hi
    if not (dtypes.is_int(dt) or dt == dtypes.bool):
        return lo, hi
    if u.op is Ops.CAST and u.src and (dtypes.is_int(u.src[0].dtype) or u.src[0].dtype == dtypes.bool):
        s0 = u.src[0]
        if lo <= s0.vmin and s0.vmax <= hi:
            return int(s0.vmin), int(s0.vmax)
        return lo, hi
    if u.op not in GroupOp.ALU or any(s.dtype.scalar not in dtypes.ints + (dtypes.bool,) for s in u.src[-2:]):
        return lo, hi
    r = _alu_range(u.op, [s.vrange for s in u.src])
    if r is None or r[0] < lo or r[1] > hi:
        return lo, hi
    return r


def _alu_range(op: Ops, rs: list[tuple[Any, Any]]) -> tuple[Any, Any] | None:
    if op is Ops.ADD:
        return rs[0][0] + rs[1][0], rs[0][1] + rs[1][1]
    if op is Ops.SUB:
        return rs[0][0] - rs[1][1], rs[0][1] - rs[1][0]
    if op is Ops.NEG:
        return -rs[0][1], -rs[0][0]
    if op is Ops.MUL:
        c = [a * b for a in rs[0] for b in rs[1]]
        return min(c), max(c)
    if op is Ops.MAX:
        return max(rs[0][0], rs[1][0]), max(rs[0][1], rs[1][1])
    if op is Ops.IDIV and rs[1][0] > 0:
        (a0, a1), (b0, b1) = rs
        c = [_idiv(a, b) for a in (a0, a1) for b in (b0, b1)]
        return min(c), max(c)
    if op is Ops.IDIV and rs[1][1] < 0:
        (a0, a1), (b0, b1) = rs
        c = [_idiv(a, b) for a in (a0, a1) for b in (b0, b1)]
        return min(c), max(c)
    if op is Ops.MOD and rs[1][0] > 0:
        (a0, a1), (b0, b1) = rs
        if a0 >= 0:
            return (a0, a1) if a1 < b0 else (0, min(a1, b1 - 1))
        return (-(b1 - 1), b1 - 1) if a1 > 0 else (-(b1 - 1), 0)
    if op is Ops.CMPLT:
        (a0, a1), (b0, b1) = rs
        return (a1 < b0, a0 < b1)
    if op is Ops.CMPNE:
        (a0, a1), (b0, b1) = rs
        if a1 < b0 or b1 < a0:
            return True, True
        if a0 == a1 == b0 == b1:
            return False, False
        return False, True
    if op is Ops.CMPEQ:
        (a0, a1), (b0, b1) = rs
        if a1 < b0 or b1 < a0:
            return False, False
        if a0 == a1 == b0 == b1:
            return True, True
        return False, True
    if op is Ops.WHERE:
        (c0, c1), (a0, a1), (b0, b1) = rs
        if c0 == c1:
            return (a0, a1) if c0 else (b0, b1)
        return min(a0, b0), max(a1, b1)
    if op is Ops.AND and rs[0][0] >= 0 and rs[1][0] >= 0:
        return 0, min(rs[0][1], rs[1][1])
    if op is Ops.OR and isinstance(rs[0][0], bool):
        return rs[0][0] or rs[1][0], rs[0][1] or rs[1][1]
    return None


# ***** printing *****


def pretty(u: UOp, max_nodes: int = 200) -> str:
    """A UOp graph as numbered lines, sources first; shared nodes are printed once and referenced."""
    nodes = list(u.toposort())
    if len(nodes) > max_nodes:
        return f"UOp({u.op}, {u.dtype}, <{len(nodes)} nodes>, arg={u.arg!r})"
    names = {n: f"%{i}" for i, n in enumerate(nodes)}
    lines = []
    for n in nodes:
        srcs = ", ".join(names[s] for s in n.src)
        arg = "" if n.arg is None else f" arg={n.arg!r}"
        lines.append(f"{names[n]:>5} = {n.op.name:<13} {str(n.dtype):<16} ({srcs}){arg}")
    return "\n".join(lines)


# ***** a RANGE's trip count, one definition for every pass *****


def trip_count(r: UOp) -> int | UOp:
    """How many times RANGE r runs: its constant end, or the end's index expression when the size is symbolic."""
    return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0]


def const_trip_count(r: UOp) -> int | None:
    """r's constant trip count; None when r is not a RANGE or its size is symbolic."""
    return r.src[0].arg if r.op is Ops.RANGE and r.src[0].op is Ops.CONST else None


def max_trip_count(r: UOp) -> int:
    """r's trip count, or for a symbolic size its largest value (what a heuristic sizes work by)."""
    n = trip_count(r)
    return n if isinstance(n, int) else max(n.vmax, 0)
