"""Index propagation: every tensor node gets the index expressions at which its consumers read it.

Walking consumers before producers, a node that is materialized gets fresh RANGEs (a kernel boundary) and every
other node inherits its consumers' requests, translated through its op by `Rangeify.src_requests`: RESHAPE
flattens and divmods, PERMUTE reorders, EXPAND reads 0, PAD subtracts and adds a validity, SHRINK adds, FLIP
mirrors, REDUCE_AXIS makes fresh REDUCE ranges. Which nodes are materialized is the policy's decision
(`schedule/policy.py`); this module only propagates indices.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from zeptograd.dtype import dtypes
from zeptograd.helpers import strides_for_shape
from zeptograd.schedule.fold import uniform_const
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import simplify

Request = tuple[tuple[UOp, ...], UOp | None]  # (index per dimension, validity or None)
Requests = dict[Request, set[UOp]]  # each request of a node -> the ranges in scope where it is read


def flat_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    ret = UOp.const(dtypes.index, 0)
    for i, st in zip(idx, strides_for_shape(shape)):
        ret = ret + i * st
    return simplify(ret)


def reshape_index(idx: tuple[UOp, ...], shape: tuple, src_shape: tuple) -> tuple[UOp, ...]:
    """The index into a RESHAPE's source read at `idx`, by groups of dimensions whose sizes multiply to the same
    product on both sides (a reshape splits, merges, adds or drops size-1 dimensions): each source dimension is a
    divmod of its group's flat index only. Where the read is valid every index is in range, so this equals the
    divmod of the whole flat index, which the simplifier could not always reduce (a padded read's index can be
    negative where it is masked: c*3136 + (y-1)*56 + (x-1) kept its divs and mods; ResNet-50 schedules in half the
    time). The outermost dimension needs no `% size`."""
    if not all(isinstance(d, int) for d in (*shape, *src_shape)):  # symbolic sizes: one group
        return tuple(_group_index(idx, shape, src_shape, True))
    new: list[UOp] = []
    n, m = len(shape), len(src_shape)
    k0 = l0 = k = l = 0
    po = ps = 1  # the products of shape[:k] and src_shape[:l]
    while k < n or l < m:
        if k < n and (l == m or po < ps or (po == ps and shape[k] == 1)):
            po, k = po * shape[k], k + 1
        else:
            ps, l = ps * src_shape[l], l + 1
        if po == ps and l > l0 and (k == n or shape[k] != 1 or l == m):  # a group ends here
            new += _group_index(idx[k0:k], shape[k0:k], src_shape[l0:l], l0 == 0)
            k0, l0 = k, l
    return tuple(new)


def _group_index(idx: tuple[UOp, ...], shape: tuple, src_shape: tuple, outermost: bool) -> list[UOp]:
    lin = flat_index(idx, shape)
    return [
        UOp.const(dtypes.index, 0) if s == 1 else simplify(lin // st if outermost and i == 0 else (lin // st) % s)
        for i, (st, s) in enumerate(zip(strides_for_shape(src_shape), src_shape))
    ]


def and_valid(a: UOp | None, b: UOp | None) -> UOp | None:
    if a is None or b is None:
        return a if b is None else b
    return simplify(a & b)


def pad_validity(x: UOp, idx: tuple[UOp, ...]) -> UOp | None:
    """Where a PAD read at `idx` lands inside its source: the AND over padded dims of 0 <= i-before < size."""
    valid = None
    for i, s, (b, _) in zip(idx, x.src[0].tensor_shape, x.arg):
        j = simplify(i - b)
        if j.vmin < 0 or isinstance(s, UOp) or j.vmax >= s:  # a symbolic size: always checked
            valid = and_valid(valid, simplify((j >= 0) & (j < s)))
    return valid


def is_window(i: UOp) -> bool:
    """An index that moves with both an output loop and a reduce loop: a sliding window (conv, pooling)."""
    kinds = {r.arg[1] for r in i.ranges}
    return AxisType.LOOP in kinds and AxisType.REDUCE in kinds


class Rangeify:
    def __init__(self, sink: UOp):
        self.sink = sink
        self.nodes = list(sink.toposort())
        self.axis = itertools.count()
        self.realize: set[UOp] = set()
        self.reqs: dict[UOp, Requests] = {}
        self.red_ranges: dict[tuple[UOp, Request], tuple[UOp, ...]] = {}
        self.kernel_ranges: dict[UOp, tuple[UOp, ...]] = {}
        self.device: dict[UOp, str] = {}
        self.group_ranges: dict[UOp, tuple[UOp, ...]] = {}  # outputs computed in one kernel share their loops
        self.row_buffered: dict[UOp, Request] = {}  # a node kept in a row buffer -> the request that fills it
        # src_requests is a function of (node, request) (a reduce's fresh ranges are remembered in red_ranges), and the
        # cost model and bufferize ask it again for what assign_ranges asked (ResNet-50: 4478 asks, 1722 distinct)
        self._translated: dict[tuple[UOp, Request], list[tuple[UOp, Request, tuple[UOp, ...]]]] = {}
        for u in self.nodes:  # which device each node is computed on
            srcs_dev = (self.device[s] for s in u.src if self.device[s])
            self.device[u] = u.arg if u.op is Ops.DEVICE else u.src[1].arg if u.op is Ops.COPY else next(srcs_dev, "")

    def fresh_ranges(self, shape: tuple[int, ...], kind: AxisType) -> tuple[UOp, ...]:
        return tuple(UOp.range(s, next(self.axis), kind) if s != 1 else UOp.const(dtypes.index, 0) for s in shape)

    # --- how a node reads its sources, given the index it is read at ---
    def src_requests(self, x: UOp, req: Request) -> list[tuple[UOp, Request, tuple[UOp, ...]]]:
        """[(source, its request, new reduce ranges)] for node x read at `req` (callers don't change the list)."""
        if (known := self._translated.get((x, req))) is None:
            known = self._translated[(x, req)] = self._src_requests(x, req)
        return known

    def _src_requests(self, x: UOp, req: Request) -> list[tuple[UOp, Request, tuple[UOp, ...]]]:
        idx, valid = req
        op, arg = x.op, x.arg
        if op in (Ops.BUFFER, Ops.CONST, Ops.IOTA, Ops.DEVICE, Ops.COPY):  # a COPY's source: not read by a kernel
            return []
        if op is Ops.ASSIGN:  # the value is read where the target is written; the target itself is not read
            return [(x.src[1], req, ())]
        src = x.src[0]
        if op is Ops.RESHAPE:
            return [(src, (reshape_index(idx, x.tensor_shape, src.tensor_shape), valid), ())]
        if op is Ops.PERMUTE:
            new_list: list[UOp] = [UOp.const(dtypes.index, 0)] * len(arg)
            for out_dim, in_dim in enumerate(arg):
                new_list[in_dim] = idx[out_dim]
            return [(src, (tuple(new_list), valid), ())]
        if op is Ops.EXPAND:
            new = tuple(UOp.const(dtypes.index, 0) if s == 1 else i for i, s in zip(idx, src.tensor_shape))
            return [(src, (new, valid), ())]
        if op is Ops.SHRINK:
            return [(src, (tuple(simplify(i + b) if b else i for i, (b, _) in zip(idx, arg)), valid), ())]
        if op is Ops.FLIP:
            new = tuple(simplify((s - 1) - i) if f else i for i, s, f in zip(idx, src.tensor_shape, arg))
            return [(src, (new, valid), ())]
        if op is Ops.PAD:
            shape = src.tensor_shape
            zero = UOp.const(dtypes.index, 0)
            new = tuple(simplify(i - b) if s != 1 else zero for i, s, (b, _) in zip(idx, shape, arg))
            return [(src, (new, and_valid(valid, pad_validity(x, idx))), ())]
        if op is Ops.REDUCE_AXIS:
            key = (x, req)
            if key not in self.red_ranges:
                self.red_ranges[key] = self.fresh_ranges(tuple(src.tensor_shape[a] for a in arg[1]), AxisType.REDUCE)
            rr = iter(self.red_ranges[key])
            new = tuple(next(rr) if d in arg[1] else i for d, i in enumerate(idx))
            return [(src, (new, valid), tuple(r for r in self.red_ranges[key] if r.op is Ops.RANGE))]
        return [(s, req, ()) for s in x.src if s.op is not Ops.DEVICE]

    def assign_ranges(self, realize: set[UOp], must_realize: Callable[[UOp, Requests], bool]):
        """Walk from the outputs to the inputs, giving every node its requests. `realize` holds the nodes
        materialized up front; `must_realize(x, reqs)` decides the others once all of x's consumers are seen."""
        self.realize |= realize
        for x in reversed(self.nodes):
            if x.op in (Ops.SINK, Ops.DEVICE, Ops.BUFFER) or uniform_const(x) is not None:
                continue
            reqs = self.reqs.get(x, {})
            if x not in self.realize and must_realize(x, reqs):
                self.realize.add(x)
            if x in self.realize:
                rngs = self.group_ranges.get(x) or self.fresh_ranges(x.tensor_shape, AxisType.LOOP)
                self.kernel_ranges[x] = rngs
                reqs = {(rngs, None): {r for r in rngs if r.op is Ops.RANGE}}
            elif x in self.row_buffered:  # computed at its fill only; its other reads load the row buffer
                fill = self.row_buffered[x]
                reqs = {fill: reqs[fill]}
            for req, scope in reqs.items():
                if x.op is Ops.REDUCE_AXIS:  # inlined, it runs before the loops it does not vary along open
                    scope = scope & {r for i in req[0] for r in i.ranges}
                for s, sreq, new_ranges in self.src_requests(x, req):
                    self.reqs.setdefault(s, {}).setdefault(sreq, set()).update(scope, new_ranges)
