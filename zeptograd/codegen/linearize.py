"""Linearize: a kernel graph -> an ordered list of UOps with explicit loops (RANGE ... END).

A priority toposort: loops open as late as possible (so loop-invariant work is placed before them, i.e. hoisted)
and close as early as possible. Extra ordering edges: a reduce's loops open after its accumulator is initialised
(the init is AFTER(acc, init, *ranges)'s second source), in the loop that init was placed in and not deeper (two
reduces initialised side by side run one after the other, not one inside the other); the loops of the SINK's second
loop nest (a tail) open after its first is done, and so on.
"""

from __future__ import annotations

import heapq

from zeptograd.uop.ops import AxisType, Ops, UOp


class LinearizeError(RuntimeError):
    pass


def _reduce_before_loops_using_it(
    nodes: list[UOp], deps: dict[UOp, set[UOp]], inits: dict[UOp, list[UOp]], siblings: dict[UOp, set[UOp]]
) -> None:
    """A reduce whose result is used inside another reduce's loop, and which is initialised in loops open where that
    loop opens (not inside it: it reads nothing of it), runs before that loop opens: deps[loop] gets the reduce's END.
    Otherwise, both ready, the loop could open first and the reduce could not open inside it (`linearize`'s wait).
    (Output loops it does not vary along: `priority` opens it before them.)
    Opened inside that loop, it would have to wait for it to close (its loop opens where its init is), and the loop
    can't close without it."""
    if len(inits) < 2:  # an edge joins two reduces' loops (most kernels have one reduce or none: no walk)
        return
    ends = {r: e for e in nodes if e.op is Ops.END for r in e.src[1:] if r.op is Ops.RANGE}
    users: dict[UOp, list[UOp]] = {u: [] for u in nodes}
    for u in nodes:
        for s in u.src:
            users[s].append(u)
    # the loops each reduce's accumulator init reads (the loops it is initialised in)
    init_loops = {
        r: frozenset(u for st in stores for u in st.toposort() if u.op is Ops.RANGE) for r, stores in inits.items()
    }
    for r in inits:
        if (end_r := ends.get(r)) is None:
            continue
        after: set[UOp] = set()  # what uses the reduce's result
        stack = [end_r]
        while stack:
            for v in users[stack.pop()]:
                if v not in after:
                    after.add(v)
                    stack.append(v)
        needs = {u for u in end_r.toposort() if u.op is Ops.RANGE}  # the loops the reduce reads or is inside
        for loop, end_loop in ends.items():
            if loop in needs or loop in siblings[r] or loop not in inits or end_loop not in after:
                continue
            # the loops that are open when that loop opens: its init's, and its reduce's other loops opened before it
            around = init_loops[loop] | {s for s in siblings[loop] if s.arg[0] < loop.arg[0]}
            if init_loops[r] <= around and not init_loops[loop] & (siblings[r] | {r}):  # (that loop is not inside r)
                deps[loop].add(end_r)


def linearize(sink: UOp) -> list[UOp]:
    nodes = list(sink.toposort())
    order = {u: i for i, u in enumerate(nodes)}
    deps: dict[UOp, set[UOp]] = {u: set(u.src) for u in nodes}
    inits: dict[UOp, list[UOp]] = {}  # a reduce's loop -> the stores that initialise its accumulators
    siblings: dict[UOp, set[UOp]] = {}  # a reduce's loop -> the loops of the same reduce (a window's rows and columns)
    for u in nodes:  # a loop opens only after the accumulator it updates is initialised
        if u.op is Ops.AFTER:
            ranges = [s for s in u.src[1:] if s.op is Ops.RANGE]
            others = [s for s in u.src[1:] if s.op is Ops.STORE]  # the accumulator init
            for r in ranges:
                deps[r].update(others)
                inits.setdefault(r, []).extend(others)
                siblings.setdefault(r, set()).update(ranges)
    _reduce_before_loops_using_it(nodes, deps, inits, siblings)
    # the kernel's loop nests (a main part and its tails: codegen/opt/tail.py) run one after another, in SINK order:
    # a nest's loops open after the previous nest is done, whatever their axis ids
    seen: set[UOp] = set()
    for prev, nest in zip(sink.src, sink.src[1:]) if sink.op is Ops.SINK else ():
        seen.update(prev.toposort())
        for r in nest.toposort():
            if r.op is Ops.RANGE and r not in seen:
                deps[r].add(prev)
    users: dict[UOp, list[UOp]] = {u: [] for u in nodes}
    for u, ds in deps.items():
        for d in ds:
            users[d].append(u)
    pending = {u: len(ds) for u, ds in deps.items()}

    def priority(u: UOp) -> tuple[int, int]:
        if u.op is Ops.RANGE:  # ready loops open in axis order (the optimizer's nesting), but a reduce whose
            # accumulator is initialised runs before an output loop it does not vary along opens: hoisted out of it
            # (an UNROLL is a reduce's loop too, where the expander left it a loop)
            return (2, u.arg[0] - (1 << 30) if u.arg[1] in (AxisType.REDUCE, AxisType.UNROLL) else u.arg[0])
        return (0 if u.op is Ops.END else 1, order[u])

    ready = [(priority(u), order[u], u) for u, n in pending.items() if n == 0]
    heapq.heapify(ready)
    out: list[UOp] = []
    open_loops: list[UOp] = []
    # the innermost loop open when each node was placed. A reduce's loop opens inside the loop its accumulator was
    # initialised in (or inside the reduce's other loops), never deeper: inside another loop it would add up once per
    # iteration of that loop (the init stays outside it) and its result would be read after that loop closed. It
    # waits for that loop's END.
    placed_in: dict[UOp, UOp | None] = {}
    waiting: list[UOp] = []

    def opens_where_its_accumulator_starts(r: UOp) -> bool:
        for init in inits.get(r, ()):
            home = placed_in[init]
            if home is not None and home not in open_loops:
                return False
            deeper = open_loops[open_loops.index(home) + 1 :] if home is not None else open_loops
            if any(loop not in siblings[r] for loop in deeper):
                return False
        return True

    while ready or waiting:
        if not ready:
            raise LinearizeError(f"the loops {[r.arg for r in waiting]} can't open where their accumulators start")
        _, _, u = heapq.heappop(ready)
        if u.op is Ops.RANGE and not opens_where_its_accumulator_starts(u):
            waiting.append(u)
            continue
        innermost = open_loops[-1] if open_loops else None
        if u.op is Ops.RANGE:
            open_loops.append(u)
        elif u.op is Ops.END:
            for r in reversed([s for s in u.src[1:] if s.op is Ops.RANGE]):
                if not open_loops or open_loops[-1] is not r:
                    raise LinearizeError(
                        f"END closes loop {r.arg} but the innermost open loop is "
                        f"{open_loops[-1].arg if open_loops else None}"
                    )
                open_loops.pop()
            for w in waiting:  # the loop they waited in may have closed
                heapq.heappush(ready, (priority(w), order[w], w))
            waiting.clear()
        placed_in[u] = innermost if u.op is not Ops.RANGE else u
        out.append(u)
        for v in users[u]:
            pending[v] -= 1
            if pending[v] == 0:
                heapq.heappush(ready, (priority(v), order[v], v))
    if len(out) != len(nodes):
        raise LinearizeError("the kernel graph has a cycle")
    return [u for u in out if u.op not in (Ops.SINK,)]
