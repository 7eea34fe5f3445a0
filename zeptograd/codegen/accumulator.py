"""REDUCE -> an explicit accumulator register (seed 000's graph).

acc = DEFINE_REG
acc.after(*outer ranges).index(0).store(identity)        # initialised once per outer iteration
acc.after(init, *reduce ranges).index(0).load() op value  # updated inside the reduce loops
acc.index(0).store(new).end(*reduce ranges)               # the loops close after the update
acc.after(end).index(0).load()                            # read once after them
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat


def reduce_identity(op: Ops, dtype) -> object:
    return {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(dtype)}[op]


def range_scopes(sink: UOp) -> dict[tuple[UOp, ...], tuple[UOp, ...]]:
    """For each REDUCE (keyed by its ranges): the loops it sits in, outermost first.

    Walked from the stores towards the loads: a STORE under END(store, *R) sits in R; a REDUCE's value sits in
    the REDUCE's own loops plus its ranges.
    """
    scope: dict[UOp, set[UOp]] = {}
    out: dict[tuple[UOp, ...], tuple[UOp, ...]] = {}
    for u in reversed(list(sink.toposort())):
        here = scope.get(u, set())
        if u.op is Ops.END:
            srcs_scope = here | set(u.src[1:])
        elif u.op is Ops.REDUCE:
            out[u.src[1:]] = tuple(sorted(here, key=lambda r: r.arg[0]))
            srcs_scope = here | set(u.src[1:])
        else:
            srcs_scope = here
        for s in u.src:
            scope.setdefault(s, set()).update(srcs_scope)
    return out


@dataclass
class AccContext:
    scopes: dict[tuple[UOp, ...], tuple[UOp, ...]]
    regs: itertools.count = field(default_factory=itertools.count)
    last_end: dict[tuple[UOp, ...], UOp] = field(default_factory=dict)


def reduce_to_acc(ctx: AccContext, red: UOp) -> UOp:
    value, ranges = red.src[0], red.src[1:]
    outer = ctx.scopes.get(ranges, ())
    acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1), (), next(ctx.regs))
    # a sibling reduce over other loops must finish before this one starts: order the init after its END
    prev = ctx.last_end.get(outer)
    deps = outer + ((prev,) if prev is not None and prev.src[1:] != ranges else ())
    init = (
        (acc.after(*deps) if deps else acc)
        .index(UOp.const(dtypes.index, 0))
        .store(UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
    )
    current = acc.after(init, *ranges).index(UOp.const(dtypes.index, 0)).load()
    updated = accumulate(red.arg, current, value)
    end = acc.index(UOp.const(dtypes.index, 0)).store(updated).end(*ranges)
    ctx.last_end[outer] = end
    return acc.after(end).index(UOp.const(dtypes.index, 0)).load()


def accumulate(op: Ops, acc: UOp, value: UOp) -> UOp:
    """acc op value; a float sum of products becomes a chain of fused multiply-adds: acc = a*b + acc."""
    if op is not Ops.ADD or not dtypes.is_float(acc.dtype):
        return UOp(op, acc.dtype, (acc, value))
    terms, stack = [], [value]
    while stack:  # the terms of value's sum, in order
        u = stack.pop()
        if u.op is Ops.ADD:
            stack.extend(reversed(u.src))
        else:
            terms.append(u)
    if not all(t.op is Ops.MUL for t in terms):
        return UOp(op, acc.dtype, (acc, value))
    for t in terms:
        acc = UOp(Ops.MULACC, acc.dtype, (t.src[0], t.src[1], acc))
    return acc


def merge_ends(sink: UOp) -> UOp:
    """Accumulators updated in the same loops share them: END(a, r), END(b, r) -> END(GROUP(a, b), r)."""
    groups: dict[tuple[UOp, ...], list[UOp]] = {}
    for u in sink.toposort():
        if u.op is Ops.END:
            groups.setdefault(u.src[1:], []).append(u)
    mapping = {}
    for ranges, ends in groups.items():
        if len(ends) > 1:
            merged = UOp(Ops.GROUP, dtypes.void, tuple(e.src[0] for e in ends)).end(*ranges)
            mapping.update({e: merged for e in ends})
    return sink.substitute(mapping) if mapping else sink


pm_reduce_to_acc = PatternMatcher(
    [
        (UPat(Ops.REDUCE, name="red"), reduce_to_acc),
    ]
)
