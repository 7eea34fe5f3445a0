"""Graph leaves and assign helpers of tensor/tensor.py: a Python int's dtype, a numpy array's buffer, and what
Tensor.assign checks of a write's value (whether it reads the target other than elementwise) and folds into it."""

from __future__ import annotations

import numpy as np

from zeptograd.buffers import buffer_under, buffers, new_buffer_uop, reshape_uop
from zeptograd.dtype import DType, dtypes
from zeptograd.helpers import ArgumentError
from zeptograd.uop.ops import GroupOp, Ops, UOp


def _wide_int(value: int) -> DType:
    if not dtypes.int64.min <= value <= dtypes.int64.max:
        raise ArgumentError(f"the int {value} is out of the range of dtypes.long (torch: Overflow when unpacking long)")
    return dtypes.int64


def _buffer_uop(arr: np.ndarray, dtype: DType, device: str) -> UOp:
    buf = new_buffer_uop(device, arr.size, dtype)
    buffers[buf].copyin(arr)
    return reshape_uop(buf, arr.shape)


_ELEMENTWISE_OR_DETACH = frozenset(GroupOp.Elementwise | {Ops.DETACH})


def _reads_target_elsewhere(target: UOp, value: UOp, stops: set[UOp]) -> bool:
    """Whether `value` reads the target's buffer other than elementwise at the element being written: then the
    one kernel that writes the buffer would read values it has already overwritten. The search goes down value's
    graph to `stops`: the target, and the pending ASSIGN to it that value's write folds into, which counts as a read of
    the target: its own value was checked when it was built (it reads the target elementwise, or is CONTIGUOUS), so
    the search stops there and costs what was built since; it ends at the first read elsewhere it meets (an SGD
    update's value, which reads its parameter through the whole step's graph, is decided in a few nodes)."""
    buf = buffer_under(target)
    elementwise, stack = set(), [value]
    while stack:
        u = stack.pop()
        if u not in elementwise and u.op in _ELEMENTWISE_OR_DETACH:  # (detach: the value)
            elementwise.add(u)
            stack.extend(u.src)
    # each node is asked as it is met (not when its turn on the stack comes: a read among a node's sources ends the
    # search before the siblings pushed before it are looked into)
    seen: set[UOp] = {value}
    found = value not in stops and (
        (value is buf and buf is not target) or (value not in elementwise and not stops.isdisjoint(value.src))
    )
    stack = [value] if not found and value not in stops else []
    while stack and not found:
        for s in stack.pop().src:
            if s in seen:
                continue
            seen.add(s)
            if s in stops:  # (its own graph is not looked into)
                continue
            if (s is buf and buf is not target) or (s not in elementwise and not stops.isdisjoint(s.src)):
                found = True
                break
            stack.append(s)
    reads_target_elsewhere_seen[0] = len(seen)
    return found


reads_target_elsewhere_seen = [0]  # the nodes the last _reads_target_elsewhere met (a count for tests)


def _substitute_walked(root: UOp, nodes: dict[UOp, None], old: UOp, new: UOp) -> UOp:
    """root with `old` replaced by `new`, where `nodes` is root's toposort down to at least `old` (graph_substitute
    without a second walk): only the nodes above `old` are rebuilt."""
    done = {old: new}
    for n in nodes:
        if n is not old and not done.keys().isdisjoint(n.src):
            done[n] = UOp(n.op, n.dtype, tuple(done.get(s, s) for s in n.src), n.arg)
    return done.get(root, root)
