"""The live-tensor registry and gradient bookkeeping of tensor/tensor.py: every Tensor alive (`live_tensors`, weakly,
in creation order), the nodes computed from a tensor that requires grad (`_grad_uops`), the leaves the user made
require grad, a realized leaf's former ASSIGNs, and how realize keeps a graph for backward and backward finds each
leaf's gradient."""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Callable

from zeptograd.helpers import gc_paused
from zeptograd.tensor import multi
from zeptograd.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from zeptograd.tensor.tensor import Tensor

_grad_uops: weakref.WeakSet[UOp] = weakref.WeakSet()  # UOps computed from a tensor that requires grad
_grad_leaves: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()  # requires_grad=True by the user
# a leaf's ASSIGN that was realized, while a graph built on it lives -> the leaf (`_keep_graph`): gradients through it
# are the leaf's, as they were before the leaf moved onto its new buffer
_former_leaf_uops: weakref.WeakKeyDictionary[UOp, weakref.ref[Tensor]] = weakref.WeakKeyDictionary()
# every Tensor alive, in the order they were made: when an assign overwrites a buffer, the engine finds here the lazy
# tensors that must read its old contents first, and the views of it that must read the new ones
# (engine/realize.py: _live_readers). Ordered, so that the same program schedules the same graph (schedule cache).
# A dict of weak references (each its own key; its `key` the tensor's number in creation order) whose callback is the
# dict's own pop: a tensor's death removes it without a Python frame (a WeakValueDictionary's callback is one).
live_tensors: dict[_LiveRef, None] = {}
_tensor_ids = itertools.count()
_live_remove = live_tensors.pop
_grad_data = _grad_uops.data  # type: ignore[attr-defined]  # WeakSet's own set of weak references
# (the set's own discard: no Python frame when the node dies; nothing iterates _grad_uops, so WeakSet's guard is moot)
_grad_remove = _grad_data.discard
_former_data = _former_leaf_uops.data  # type: ignore[attr-defined]  # its own dict (empty: nothing to look for)
_grad_leaves_data = _grad_leaves.data  # type: ignore[attr-defined]  # its own dict of weak references
# (the dict's own pop as its references' callback: no Python frame when the node dies; nothing iterates it)
_former_remove = _former_data.pop


_MULTI = Ops.MULTI  # (a global read: on 3.11 Ops.X goes through the enum metaclass's getattr hook)


class _LiveRef(weakref.ref):
    """live_tensors' reference to a tensor, hashed by its own identity (a weak reference hashes its referent: a
    Python-level Tensor.__hash__ call for every tensor made), `key` the tensor's number in creation order."""

    __slots__ = ("key",)
    key: int
    __hash__ = object.__hash__
    __eq__ = object.__eq__


def _register_live(t: Tensor) -> None:
    ref = _LiveRef(t, _live_remove)
    ref.key = next(_tensor_ids)
    live_tensors[ref] = None


@gc_paused
def _realize_keeping_graphs(tensors: list[Tensor], realize_tensors: Callable[[list[Tensor]], None]) -> None:
    """Tensor.realize: `tensors` realized in one schedule, each that requires grad pointed at its graph again (for
    backward). The cycle collector stays paused until the graphs let go here (a parameter's write: the whole step
    that computed its update) are freed, by reference count, as this returns: those frees bring the count of young
    objects back down, so the realize's own allocations trigger no collection that would scan that whole graph,
    alive just before, find nothing to collect and promote it (one per eager training step, and every few steps a
    full collection of the process)."""
    keep = [(t, t.uop) for t in tensors if t.requires_grad]  # keep their graph for backward; the scheduler
    sharded = {t: multi.parts(t) for t in tensors if t.uop.op is _MULTI}  # each part on its own device
    # (the tensors themselves where none is sharded: no Tensor.__hash__ call per tensor in sharded.get)
    realize_tensors([p for t in tensors for p in sharded.get(t, [t])] if sharded else list(tensors))
    # (substitutes the realized buffer wherever the graph is used again)
    for t, ps in sharded.items():
        t.uop = multi.multi([p.uop for p in ps], t.uop.arg)
    for t, u in keep:
        _keep_graph(t, u)


def _keep_graph(t: Tensor, graph: UOp) -> None:
    """After realizing t, which requires grad, point it at its graph again (a later backward goes through it: the
    scheduler substitutes the realized value wherever the graph is read). Not a leaf whose graph is a write into it
    (an optimizer's update, `p.assign(p.detach() - lr * p.grad)`): a leaf's value has no history (torch updates a
    leaf under no_grad), and its ASSIGN kept would drag the whole step that computed the update into every graph
    built on the leaf, each walk of the next step's graph substituting it again. The leaf stays on its new buffer,
    requiring grad, as nn/optim.py's step leaves a parameter; a graph built on the ASSIGN before still finds the leaf
    there (`_former_leaf_uops`)."""
    if (
        graph.op is Ops.ASSIGN
        and t.uop is not graph
        and (leaf := _grad_leaves_data.get(id(t))) is not None  # (_grad_leaves.get, without a frame)
        and leaf() is t
    ):
        _grad_data.add(weakref.ref(t.uop, _grad_remove))  # (_grad_uops.add, without a frame)
        _former_data[weakref.ref(graph, _former_remove)] = weakref.ref(t)  # (_former_leaf_uops[graph] = ..., ditto)
    else:
        t.uop = graph


def _grad_targets(nodes: dict[UOp, None], leaves: list[Tensor]) -> dict[UOp, Tensor]:
    """The nodes of a graph (`nodes`) whose gradient is a leaf's, for each tensor of `leaves` the graph reaches: its
    uop (a sharded leaf's parts), and the ASSIGNs it was realized from that the graph was built on."""
    targets: dict[UOp, Tensor] = {}
    for t in leaves:
        parts = multi.gradient_targets(t.uop)
        if any(u in nodes for u in parts):
            targets.update((u, t) for u in parts)
    if _former_data:
        ids = {id(t) for t in leaves}
        for u in nodes:
            if (ref := _former_data.get(weakref.ref(u))) is not None and (t := ref()) is not None and id(t) in ids:
                targets[u] = t
    return targets


def _leaf_grads(t: Tensor, targets: dict[UOp, Tensor], grads: dict[UOp, Tensor]) -> Tensor | None:
    """Leaf t's gradient: its uop's plus that of each ASSIGN it was realized from that the graph was built on."""
    g = _leaf_grad(t.uop, grads)
    for u, owner in targets.items():
        if owner is t and u is not t.uop and u.op is Ops.ASSIGN and (more := grads.get(u)) is not None:
            g = more if g is None else g + more
    return g


def _leaf_grad(u: UOp, grads: dict[UOp, Tensor]) -> Tensor | None:
    """A leaf's gradient; a sharded leaf's is put together from its parts' (tensor/multi.py)."""
    return multi.leaf_gradient(u, grads) if u.op is Ops.MULTI else grads.get(u)
