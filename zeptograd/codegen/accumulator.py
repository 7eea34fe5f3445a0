"""REDUCE -> an explicit accumulator register (DEFINE_REG, a store of the identity, the loop's
update after it, END, then the read after the loop).

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
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace


def reduce_identity(op: Ops, dtype) -> object:
    return {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(dtype)}[op]


def range_scopes(sink: UOp) -> dict[tuple[UOp, ...], tuple[UOp, ...]]:
    """For each REDUCE (keyed by its ranges): the loops it sits in, outermost first.

    Walked from the stores towards the loads: a STORE under END(store, *R) sits in R; a REDUCE's value sits in
    the REDUCE's own loops plus its ranges. A loop's count is computed before the loop opens, and so is x in
    AFTER(x, *R) (x ordered before the loops R open: a branch's input, `codegen/transcendental.py`).
    """
    scope: dict[UOp, set[UOp]] = {}
    out: dict[tuple[UOp, ...], tuple[UOp, ...]] = {}
    for u in reversed(list(sink.toposort())):
        here = scope.get(u, set())
        first = here
        if u.op in (Ops.END, Ops.REDUCE):
            first = here | set(u.src[1:])
            if u.op is Ops.REDUCE:  # only the loops its value varies along: it runs before the others open
                used = {r for r in u.src[0].toposort() if r.op is Ops.RANGE}
                # reduces over the same ranges share one loop: it runs in the loops any of them varies along (a cat's
                # halves, one hoisted out of an output loop and one not: the shared loop's accumulators were set up
                # outside that loop while one of them read it)
                loops = (here & used) | set(out.get(u.src[1:], ()))
                out[u.src[1:]] = tuple(sorted(loops, key=lambda r: r.arg[0]))
        elif u.op is Ops.AFTER:
            first = here - {s for s in u.src[1:] if s.op is Ops.RANGE}
        elif u.op is Ops.RANGE:
            here = first = here - {u}
        for i, s in enumerate(u.src):
            scope.setdefault(s, set()).update(first if i == 0 else here)
    return out


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


@dataclass
class AccContext:
    scopes: dict[tuple[UOp, ...], tuple[UOp, ...]]
    regs: itertools.count = field(default_factory=itertools.count)


def reduce_to_acc(ctx: AccContext, red: UOp) -> UOp:
    """One REDUCE -> one accumulator in the loops its scope names (gpudims lowers a thread's slice with it)."""
    zero, ranges = UOp.const(dtypes.index, 0), red.src[1:]
    outer = ctx.scopes.get(ranges, ())
    acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1), (), next(ctx.regs))
    init = (
        (acc.after(*outer) if outer else acc)
        .index(zero)
        .store(UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
    )
    current = acc.after(init, *ranges).index(zero).load()
    end = acc.index(zero).store(accumulate(red.arg, current, red.src[0])).end(*ranges)
    return acc.after(end).index(zero).load()


Group = tuple[tuple[tuple[UOp, ...], tuple[UOp, ...]], list[UOp]]


def ordered_groups(groups: dict) -> list[Group]:
    """Deepest nests first (stable: siblings keep their order), and a group after every group with a reduce inside
    one of its reduces' sources, even where that one is first seen later (two reduces over one loop, the second
    holding an inner reduce of its own) or sits in fewer loops (a row's max inside a matmul over the softmax of the
    row: it runs before the output loop)."""
    pending: list[Group] = sorted(groups.items(), key=lambda group: -len(group[0][0]))
    owner = {red: key for key, reds in pending for red in reds}
    inner: dict = {}
    for key, reds in pending:
        below = {u for red in reds for s in red.src for u in s.toposort()}
        inner[key] = {owner[u] for u in below if u in owner} - {key}
    out: list[Group] = []
    done: set = set()
    while pending:
        i = next((i for i, (key, _) in enumerate(pending) if inner[key] <= done), 0)  # 0: a cycle, keep the order
        key, reds = pending.pop(i)
        out.append((key, reds))
        done.add(key)
    return out


@named_pass("lower_reduces", "REDUCE -> accumulators; reduces over the same loops share them")
def lower_reduces(sink: UOp) -> UOp:
    """Every REDUCE -> an accumulator. REDUCEs over the same loops inside the same enclosing loops share one loop
    nest (one END over a GROUP of their updates); sibling loop nests run one after another in first-seen order
    (each group's inits wait for the previous group's END). Inner reduces are lowered before the ones around them (the
    deeper nests first).
    """
    scopes = range_scopes(sink)
    groups: dict[tuple[tuple[UOp, ...], tuple[UOp, ...]], list[UOp]] = {}
    for u in sink.toposort():
        if u.op is Ops.REDUCE:
            groups.setdefault((scopes.get(u.src[1:], ()), u.src[1:]), []).append(u)
    zero = UOp.const(dtypes.index, 0)
    regs = itertools.count()
    replaced: dict[UOp, UOp] = {}
    last_end: dict[tuple[UOp, ...], UOp] = {}
    for (outer, ranges), reds in ordered_groups(groups):
        key = outer
        if replaced:  # a loop's count may read a reduce lowered already (a branch on a reduced value)
            outer, ranges = (tuple(r.substitute(replaced) for r in rs) for rs in (outer, ranges))
        deps = outer + ((last_end[key],) if key in last_end else ())
        accs, updates = [], []
        for red in reds:
            value = red.src[0].substitute(replaced) if replaced else red.src[0]  # inner reduces already lowered
            acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1), (), next(regs))
            init = (
                (acc.after(*deps) if deps else acc)
                .index(zero)
                .store(UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
            )
            current = acc.after(init, *ranges).index(zero).load()
            updates.append(acc.index(zero).store(accumulate(red.arg, current, value)))
            accs.append(acc)
        end = (updates[0] if len(updates) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(updates))).end(*ranges)
        last_end[key] = end
        for red, acc in zip(reds, accs):
            replaced[red] = acc.after(end).index(zero).load()
    return sink.substitute(replaced) if replaced else sink
