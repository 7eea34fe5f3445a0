"""Reverse-mode autodiff as rewrite rules: one rule per primitive op maps (the gradient of a node, the node) to the
gradients of its sources. Every composite op (softmax, conv2d, sort, ...) is built from these primitives, so its
gradient comes for free; the few whose primitives would give the wrong gradient at special values (pow at 0, inf,
nan) register their own rule with `with_gradient`. The graph is walked in reverse topological order: no recursion on
its depth."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

from zeptograd import gradient_cache
from zeptograd.dtype import dtypes, sum_acc_dtype
from zeptograd.helpers import argsort
from zeptograd.schedule.copy import tensor_device
from zeptograd.tensor import multi
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


def _t(u: UOp, like: Tensor) -> Tensor:
    """A forward UOp as a Tensor, so that the rules can use the Tensor ops (broadcasting, dtypes, constants)."""
    if type(like.device) is str and (tensor_of := _tensor_of[0]) is not None:
        return tensor_of(u, like.device)  # Tensor(u, device), without __init__'s steps for other data
    return type(like)(u, device=like.device)


_tensor_of: list = [None]  # tensor/tensor.py's _tensor_of, set when it is imported (it imports this module)


_OWN_SUM_DTYPES = frozenset(d for d in dtypes.all if sum_acc_dtype(d) is d)  # (the dtypes a sum accumulates in)
# (globals: on 3.11 an Ops.X read goes through the enum metaclass's getattr hook, uop/ops.py)
_RESHAPE, _EXPAND, _PERMUTE, _REDUCE_AXIS, _ADD = Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.REDUCE_AXIS, Ops.ADD


# The movements and the sum the rules apply to a gradient take their shapes and axes from a forward node, valid by
# construction: where the gradient is on one device and no shape is symbolic, each builds the very node the Tensor
# method would (t.reshape(shape), ...) without that method's argument checks; otherwise it is that method.
def _symbolic(*shapes: tuple) -> bool:
    """Whether a size of these shapes is a Variable's expression (asked once a Variable was bound: none is before)."""
    return any(isinstance(s, UOp) for shape in shapes for s in shape)


def _reshape(t: Tensor, shape: tuple) -> Tensor:
    """t.reshape(shape), shape a forward node's (t's element count)."""
    if type(t.device) is not str or (variable.in_use and _symbolic(shape, t.shape)):
        return t.reshape(shape)
    return t if shape == t.shape else t._new(UOp(_RESHAPE, t.dtype, (t.uop,), shape))


def _expand(t: Tensor, shape: tuple) -> Tensor:
    """t.expand(shape), shape a forward node's of t's dimensions (t's sizes, or 1 grown)."""
    if type(t.device) is not str or len(shape) != len(t.shape) or (variable.in_use and _symbolic(shape, t.shape)):
        return t.expand(shape)
    return t if shape == t.shape else t._new(UOp(_EXPAND, t.dtype, (t.uop,), shape))


def _sum_keepdim(t: Tensor, axes: tuple[int, ...]) -> Tensor:
    """t.sum(axes, keepdim=True), axes sorted, distinct and in range (a forward node's)."""
    if type(t.device) is not str or t.uop.dtype not in _OWN_SUM_DTYPES:
        return t.sum(axes, keepdim=True)
    return t if not axes or not t.shape else t._new(UOp(_REDUCE_AXIS, t.dtype, (t.uop,), (_ADD, axes)))


def _expanded_axes(ret: UOp) -> tuple[int, ...]:
    """The axes an EXPAND grows (its source's sizes that differ from its own)."""
    axes = []
    for i, (a, b) in enumerate(zip(ret.src[0].shape, ret.shape)):  # type: ignore[arg-type]
        if a != b:
            axes.append(i)
    return tuple(axes)


def _permute(t: Tensor, order: tuple[int, ...]) -> Tensor:
    """t.permute(order), order a permutation of t's dimensions (a forward node's, inverted)."""
    if type(t.device) is not str:
        return t.permute(order)
    return t if order == tuple(range(len(order))) else t._new(UOp(_PERMUTE, t.dtype, (t.uop,), order))


# Composite ops whose gradient is not the one their primitives give (pow: torch's values at 0, inf, nan and negative
# bases): out UOp -> (the inputs, rule(grad, out, *inputs) -> a gradient per input). The rule must not hold `out`
# (the key is weak); tensors are passed to it. Interned UOps make an equal graph the same key, with the same rule.
_custom_rules: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], Callable]] = weakref.WeakKeyDictionary()
_custom_data = _custom_rules.data  # type: ignore[attr-defined]  # its own dict (looked up without a Python frame)


def with_gradient(out: Tensor, inputs: tuple[Tensor, ...], rule: Callable) -> Tensor:
    """`out` (computed from `inputs`) with its gradient given by `rule(grad, out, *inputs)` instead of by the
    primitives it is built from. Each input must be in out's graph."""
    if out.uop.op is Ops.MULTI:  # sharded (tensor/multi.py): the rule on each device where device i's output is
        if multi.per_device_function(out.uop, [t.uop for t in inputs]):  # the function of its inputs' parts
            for i, part in enumerate(out.uop.src):
                _custom_rules[part] = (tuple(t.uop.src[i] for t in inputs), rule)
        return out  # otherwise the primitives' gradient
    _custom_rules[out.uop] = (tuple(t.uop for t in inputs), rule)
    return out


def _max_grad(ctx: Tensor, ret: UOp) -> tuple:
    """torch's maximum: a tie shares the gradient; each side gets all of it unless it is the smaller (so a nan, which
    compares neither way, gives both sides all of it)."""
    a, b = _t(ret.src[0], ctx), _t(ret.src[1], ctx)
    tie = a == b
    return tie.where(ctx * 0.5, (a < b).where(0, ctx)), tie.where(ctx * 0.5, (b < a).where(0, ctx))


def _is_zero(u: UOp) -> bool:
    """Whether u is the constant 0 (broadcast by reshapes and expands)."""
    while u.op in (Ops.RESHAPE, Ops.EXPAND):
        u = u.src[0]
    return u.op is Ops.CONST and u.arg == 0


def _reduce_grad(ctx: Tensor, ret: UOp) -> tuple:
    op, axes = ret.arg
    if op is Ops.ADD:
        return (_expand(ctx, ret.src[0].tensor_shape),)
    x, out = _t(ret.src[0], ctx), _t(ret, ctx)
    if op is Ops.MAX:  # the maxima share the gradient evenly, as torch's amax
        is_max = (x == _expand(out, x.shape)).cast(ctx.dtype)
        return (is_max / _expand(_sum_keepdim(is_max, axes), x.shape) * _expand(ctx, x.shape),)
    if op is Ops.MUL:  # d(prod)/dx_i = prod of the others; at zeros, count them
        zero = x == 0
        others = zero.where(1, x).prod(axes, keepdim=True).expand(x.shape)
        n_zero = zero.cast(dtypes.int32).sum(axes, keepdim=True).expand(x.shape)
        g = (n_zero == 0).where(out.expand(x.shape) / zero.where(1, x), (n_zero == 1).where(zero.where(others, 0), 0))
        return (g * ctx.expand(x.shape),)
    raise NotImplementedError(f"no gradient for a {op} reduce")


pm_gradient = PatternMatcher(
    [
        (UPat(Ops.ADD), lambda ctx: (ctx, ctx)),
        (UPat(Ops.SUB), lambda ctx: (ctx, -ctx)),
        (UPat(Ops.NEG), lambda ctx: (-ctx,)),
        (UPat(Ops.MUL, name="ret"), lambda ctx, ret: (ctx * _t(ret.src[1], ctx), ctx * _t(ret.src[0], ctx))),
        (
            UPat(Ops.FDIV, name="ret"),
            lambda ctx, ret: (ctx / _t(ret.src[1], ctx), -ctx * _t(ret, ctx) / _t(ret.src[1], ctx)),
        ),
        (UPat(Ops.MAX, name="ret"), _max_grad),
        (
            UPat(Ops.WHERE, name="ret"),
            lambda ctx, ret: (None, _t(ret.src[0], ctx).where(ctx, 0), _t(ret.src[0], ctx).where(0, ctx)),
        ),
        (UPat(Ops.EXP2, name="ret"), lambda ctx, ret: (ctx * _t(ret, ctx) * math.log(2),)),
        (UPat(Ops.LOG2, name="ret"), lambda ctx, ret: (ctx / (_t(ret.src[0], ctx) * math.log(2)),)),
        (UPat(Ops.SIN, name="ret"), lambda ctx, ret: (ctx * _t(ret.src[0], ctx).cos(),)),
        (UPat(Ops.COS, name="ret"), lambda ctx, ret: (-ctx * _t(ret.src[0], ctx).sin(),)),
        # tan' = 1 + tan**2, from the forward value
        (UPat(Ops.TAN, name="ret"), lambda ctx, ret: (ctx * (_t(ret, ctx) * _t(ret, ctx) + 1),)),
        (UPat(Ops.SQRT, name="ret"), lambda ctx, ret: (ctx / (_t(ret, ctx) * 2),)),
        (UPat(Ops.RECIPROCAL, name="ret"), lambda ctx, ret: (-ctx * _t(ret, ctx) * _t(ret, ctx),)),
        (UPat(Ops.TRUNC), lambda ctx: (ctx.zeros_like(),)),
        (UPat(Ops.CAST, name="ret"), lambda ctx, ret: (ctx.cast(ret.src[0].dtype),)),
        (UPat(Ops.REDUCE_AXIS, name="ret"), _reduce_grad),
        (UPat(Ops.RESHAPE, name="ret"), lambda ctx, ret: (_reshape(ctx, ret.src[0].shape),)),
        (UPat(Ops.PERMUTE, name="ret"), lambda ctx, ret: (_permute(ctx, tuple(argsort(list(ret.arg)))),)),
        (UPat(Ops.EXPAND, name="ret"), lambda ctx, ret: (_sum_keepdim(ctx, _expanded_axes(ret)),)),
        (
            UPat(Ops.PAD, name="ret"),
            lambda ctx, ret: (ctx.shrink(tuple((b, b + s) for s, (b, _) in zip(ret.src[0].shape, ret.arg))),),
        ),
        (
            UPat(Ops.SHRINK, name="ret"),
            lambda ctx, ret: (ctx.pad(tuple((b, s - e) for s, (b, e) in zip(ret.src[0].shape, ret.arg))),),
        ),
        (UPat(Ops.FLIP, name="ret"), lambda ctx, ret: (ctx.flip([i for i, f in enumerate(ret.arg) if f]),)),
        (UPat(Ops.CONTIGUOUS), lambda ctx: (ctx,)),
        (UPat(Ops.DETACH), lambda: (None,)),
        (UPat(Ops.ASSIGN), lambda ctx: (None, ctx)),
        # copy(x, device)' = the gradient copied back to x's device
        (UPat(Ops.COPY, name="ret"), lambda ctx, ret: (ctx.to(tensor_device(ret.src[0])),)),
        # a sharded tensor at the root of a backward: each part its slice of the gradient (tensor/multi.py)
        (UPat(Ops.MULTI, name="ret"), lambda ctx, ret: multi.source_gradients(ctx, ret)),
    ]
)

_FLOAT_DTYPES = frozenset(dtypes.floats)  # (dtypes.is_float's, read inline per node)
_NO_GRAD = {
    Ops.CMPLT,
    Ops.CMPNE,
    Ops.CMPEQ,
    Ops.AND,
    Ops.OR,
    Ops.XOR,
    Ops.SHL,
    Ops.SHR,
    Ops.IDIV,
    Ops.MOD,
    Ops.BITCAST,
    Ops.BUFFER,
    Ops.CONST,
    Ops.IOTA,
    Ops.DEVICE,
}


GRADIENT_CACHE = gradient_cache.GRADIENT_CACHE


def compute_gradient(
    root: UOp,
    root_grad: Tensor,
    targets: set[UOp],
    stops: frozenset[UOp] = frozenset(),
    nodes: dict[UOp, None] | None = None,
) -> dict[UOp, Tensor]:
    """d(root)/d(t) for each t in targets that root depends on differentiably (as lazy Tensors). A target in `stops`
    passes nothing on to its sources: the parts of a sharded leaf are independent variables even where one is a copy
    of another (tensor/multi.py). `nodes`: root.toposort(), where the caller has it."""
    topo = list(root.toposort() if nodes is None else nodes)
    cached = None  # (the gradient graph of an equal-structure graph: zeptograd/gradient_cache.py)
    if GRADIENT_CACHE.value and not stops:
        if (cached := gradient_cache.structure(topo, root_grad, targets)) is not None:
            if (template := gradient_cache._cache.get(cached[0])) is gradient_cache.REFUSED:
                cached = None  # (the rules run, as the first time: nothing to store)
            elif template is not None:
                return gradient_cache.rebuild(template, cached[1], root_grad)
    on_path: set[UOp] = set()  # nodes through which a target reaches the root
    for u in topo:
        if u in targets:
            on_path.add(u)
            continue
        for s in u.src:  # (a loop, not any() over a generator: a call per node)
            if s in on_path:
                on_path.add(u)
                break
    grads: dict[UOp, Tensor] = {root: root_grad}
    floats = _FLOAT_DTYPES
    for u in reversed(topo):
        g = grads.get(u)
        if g is None or u.op in _NO_GRAD or u.dtype.scalar not in floats or u in stops:  # (dtypes.is_float, inline)
            continue
        if _custom_data and (custom := _custom_data.get(weakref.ref(u))) is not None:  # (_custom_rules.get(u))
            srcs, rule = custom
            src_grads = rule(g, _t(u, g), *(_t(s, g) for s in srcs))
        elif u in targets and on_path.isdisjoint(u.src):  # a leaf's node (a weight's reshape of its buffer): its
            continue  # sources' gradients would go nowhere
        else:
            srcs, src_grads = u.src, pm_gradient.rewrite(u, ctx=g)
        if src_grads is None:
            raise NotImplementedError(f"no gradient rule for {u.op}")
        for s, sg in zip(srcs, src_grads):
            if sg is None or s not in on_path or s.dtype.scalar not in floats:
                continue
            if sg.uop.shape != s.shape:
                raise RuntimeError(f"gradient of {u.op} has shape {sg.shape}, its source {s.shape}")
            grads[s] = sg if (known := grads.get(s)) is None else known + sg
    result = {t: grads[t] for t in targets if t in grads}
    if cached is not None:
        gradient_cache.remember(cached[0], cached[1], cached[2], result)
    return result
