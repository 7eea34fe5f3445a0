"""A reduce whose every contribution is gated by a bound on its own range ends its loop at that bound.

    REDUCE(where(a*r + rest < 0, x, identity), r, ...)  ->  the same with r ending at ceil(-min(rest) / a)

where identity is the reduce's (0 for a sum, -inf for a max, 1 for a product), a > 0, and rest is linear in the
kernel's ranges: a loop around the reduce (a fixed value in it) counts at its value, vector lanes, unrolled copies
and the reduce's other ranges at their smallest term, so an iteration past the bound gives every lane the identity
and skipping it changes no bit of the result. The gate stays: the last iterations before the bound are partial
(some lanes or rows of a tile still gated). Causal attention (`tensor/attention.py: _causal_attention`): the key loops
of a tile of 4 query rows q..q+3 stop after key q+3, not at the row's end. A gate that bounds r from below (a < 0)
runs the loop reversed, r -> n-1 - r', which makes the bound an end (`_reversed`): causal attention's dk and dv sum
over the queries from the key tile's first key on.

Such a reduce may also fill a row buffer (a DEFINE_REG it stores to in its loop, read by later loops): a skipped
iteration leaves its slot unwritten, so the pass ends the loop only where every other read of that buffer is itself
under the same gate at the index it reads (where(rest + j < 0, ...buf[j]..., y)): a slot is read only where the gate
holds at it, and the filling loop wrote every such slot. Runs after the optimizer (the bound is the tile's last row,
the granularity the loop's step) and before expand.
"""

from __future__ import annotations

from zeptograd.codegen.accumulator import reduce_identity
from zeptograd.dtype import dtypes
from zeptograd.uop.ops import AxisType, Ops, UOp, trip_count
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

Linear = tuple[dict[UOp, int], int]  # sum of coefficient * atom, plus a constant


def linear_form(u: UOp) -> Linear | None:
    """u as a sum of integer multiples of atoms (anything but ADD, a MUL by a constant and CONST) plus a constant.
    Unlike uop.symbolic.split_sum it distributes a constant multiple over a sum ((q*4 + lane)*8: q*32 + lane*8) and
    takes the constant on either side, so a gate's bound on a tiled range compares atom by atom."""
    if u.dtype.count != 1 or not dtypes.is_int(u.dtype):
        return None
    terms: dict[UOp, int] = {}
    const = 0
    stack = [(u, 1)]
    while stack:
        x, k = stack.pop()
        if x.op is Ops.CONST:
            const += k * x.arg
        elif x.op is Ops.ADD:
            stack += [(x.src[0], k), (x.src[1], k)]
        elif x.op is Ops.MUL and x.src[1].op is Ops.CONST:
            stack.append((x.src[0], k * x.src[1].arg))
        elif x.op is Ops.MUL and x.src[0].op is Ops.CONST:
            stack.append((x.src[1], k * x.src[0].arg))
        else:
            terms[x] = terms.get(x, 0) + k
    return {a: k for a, k in terms.items() if k != 0}, const


def _plus(a: Linear, b: Linear, sign: int = 1) -> Linear:
    terms = dict(a[0])
    for x, k in b[0].items():
        terms[x] = terms.get(x, 0) + sign * k
    return {x: k for x, k in terms.items() if k != 0}, a[1] + sign * b[1]


def _minus(a: Linear, b: Linear) -> Linear:
    return _plus(a, b, -1)


def gate_forms(g: UOp) -> list[Linear]:
    """Linear forms F with g implying F < 0: g's comparisons a < b (and not(a < b), b - a - 1 < 0 for ints) and those
    of each part of an AND (g false where any one of them is)"""
    out: list[Linear] = []
    stack = [g]
    while stack:
        x = stack.pop()
        if x.op is Ops.AND and x.dtype == dtypes.bool:
            stack += list(x.src)
        elif x.op is Ops.CMPLT and (a := linear_form(x.src[0])) is not None and (b := linear_form(x.src[1])):
            out.append(_minus(a, b))
        elif (
            x.op is Ops.CMPNE
            and x.src[0].op is Ops.CMPLT
            and x.src[1].op is Ops.CONST
            and x.src[1].arg in (True, 1)
            and (a := linear_form(x.src[0].src[0])) is not None
            and (b := linear_form(x.src[0].src[1])) is not None
        ):  # not(a < b): b - a - 1 < 0
            f = _minus(b, a)
            out.append((f[0], f[1] - 1))
    return out


def gated_body(red: UOp) -> tuple[UOp, UOp] | None:
    """(gate, value) when red's body (under the AFTERs of a row buffer's fill) is where(gate, value, identity)"""
    body = red.src[0]
    while body.op is Ops.AFTER:
        body = body.src[0]
    if body.op is not Ops.WHERE or body.src[2].op is not Ops.CONST or body.dtype.count != 1:
        return None
    if body.src[2].arg != reduce_identity(red.arg, red.dtype):
        return None
    return body.src[0], body.src[1]


def _closed_inside(red: UOp) -> set[UOp]:
    """the ranges of the loops inside red's body: they vary within one of red's iterations"""
    return {r for u in red.src[0].toposort() if u.op in (Ops.REDUCE, Ops.END) for r in u.src[1:]}


_VARYING = (AxisType.UPCAST, AxisType.UNROLL, AxisType.LOCAL, AxisType.GROUP)


def loop_end(red: UOp, form: Linear) -> tuple[UOp, UOp, UOp] | None:
    """(r, end, full) for the reduce range r with the largest coefficient a > 0 in the gate form a*r + rest < 0:
    every lane is gated off from end = ceil(-min(rest) / a) on, and on below full = ceil(-max(rest) / a), where
    min/max(rest) take the loops around red at their values and every range varying within an iteration of r
    (lanes, unrolled copies, a GPU's local ids, red's other ranges, inner loops) at its smallest/largest term.
    None where rest holds anything else that varies (a division of a range, a load)."""
    terms, const = form
    own = [r for r in red.src[1:] if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE and terms.get(r, 0) > 0]
    if not own:
        return None
    r = max(own, key=lambda x: terms[x])
    a = terms[r]
    inside = _closed_inside(red) | set(red.src[1:])
    fixed: UOp = UOp.const(r.dtype, -const)
    lowest = highest = 0
    for x, k in terms.items():
        if x is r:
            continue
        if x.op is Ops.RANGE and (x.arg[1] in _VARYING or x in inside):
            lowest += k * (x.vmin if k > 0 else x.vmax)
            highest += k * (x.vmax if k > 0 else x.vmin)
        elif (
            inside.isdisjoint(y for y in x.toposort() if y.op is Ops.RANGE)
            and all(y.op not in (Ops.LOAD, Ops.REDUCE) for y in x.toposort())
            and all(y.arg[1] not in _VARYING for y in x.toposort() if y.op is Ops.RANGE)
        ):
            fixed = fixed - (x if x.dtype == r.dtype else x.cast(r.dtype)) * k
        else:
            return None
    # a*r + rest >= 0 on every lane once r >= ceil((fixed - lowest) / a); < 0 on every lane while r < ceil((fixed -
    # highest) / a); both clamped to 0..n
    n = trip_count(r)
    n_uop = n if isinstance(n, UOp) else UOp.const(r.dtype, n)

    def bound(x: UOp) -> UOp:
        b = graph_rewrite((x.maximum(UOp.const(r.dtype, 0)) + (a - 1)) // a, symbolic)
        return b if isinstance(n, int) and b.vmax <= n else graph_rewrite((b < n_uop).where(b, n_uop), symbolic)

    end = bound(fixed - lowest)
    if isinstance(n, int) and end.vmin >= n:
        return None
    full = bound(fixed - highest)
    return r, end, graph_rewrite((full < end).where(full, end), symbolic) if full.vmax > end.vmin else full


def _row_buffers_filled(red: UOp) -> list[tuple[UOp, Linear]] | None:
    """the row buffers red's loop stores to, each with its store index's form; None where it stores elsewhere (a
    store that uses none of red's ranges belongs to an earlier loop whose value red reads: the scores' max)"""
    out = []
    own = set(red.src[1:])
    for u in red.src[0].toposort():
        if u.op is Ops.STORE and not own.isdisjoint(u.toposort()):
            idx = u.src[0]
            if idx.op is not Ops.INDEX or idx.src[0].op is not Ops.DEFINE_REG or len(idx.src) != 2:
                return None
            if (f := linear_form(idx.src[1])) is None:
                return None
            out.append((idx.src[0], f))
    return out


def _reads_gated(sink: UOp, buf: UOp, rest: Linear) -> bool:
    """every load of buf other than through its fill's AFTER sits in the true side of a where whose gate has the
    form j + rest < 0 for the index j it loads at: walked from the sink, the set of gates in force along the path"""
    seen: set[tuple[UOp, frozenset]] = set()
    stack: list[tuple[UOp, frozenset]] = [(sink, frozenset())]
    while stack:
        u, guards = stack.pop()
        if (u, guards) in seen:
            continue
        seen.add((u, guards))
        if u.op is Ops.INDEX and (u.src[0] is buf or (u.src[0].op is Ops.AFTER and u.src[0].src[0] is buf)):
            if u.src[0] is buf:  # the fill's store
                continue
            f = linear_form(u.src[1]) if len(u.src) == 2 else None
            if f is None or _key(_plus(f, rest)) not in guards:
                return False
            continue
        if u.op is Ops.WHERE:
            forms = gate_forms(u.src[0])
            inner = guards | {_key(fm) for fm in forms}
            stack += [(u.src[0], guards), (u.src[1], frozenset(inner)), (u.src[2], guards)]
            continue
        stack += [(s, guards) for s in u.src]
    return True


def _key(form: Linear) -> tuple:
    return (frozenset(form[0].items()), form[1])


def gated_end(sink: UOp, red: UOp) -> UOp | None:
    """red with its range ending at its gate's bound, where red's gate allows it (the module's docstring): the
    iterations where the gate holds on every lane as a loop without it, the partial ones after it as a second loop
    with it (as a tail: `codegen/opt/tail.py`)"""
    if red.arg not in (Ops.ADD, Ops.MAX, Ops.MUL) or (gv := gated_body(red)) is None:
        return None
    if (filled := _row_buffers_filled(red)) is None:
        return None
    for form in gate_forms(gv[0]):
        if (found := loop_end(red, form)) is None:
            if not filled and (reversed_red := _reversed(sink, red, form)) is not None:
                return gated_end(sink, reversed_red) or None
            continue
        r, end, full = found
        # each row buffer filled: its gate is a function of the slot, index + rest, and read only under it
        rests = [_minus(form, idx_form) for _, idx_form in filled]
        if not all(
            not any(x in red.src[1:] for x in rest[0]) and _reads_gated(sink, buf, rest)
            for (buf, _), rest in zip(filled, rests)
        ):
            continue
        # a gate of several parts stays whole (only this one is known to hold), and so does a reduce over a GPU's
        # local ids (a second loop would need ids of its own) or over loops besides r and vector lanes (not split:
        # the linearizer found no order for the two nests' accumulators)
        if (
            gv[0].op is not Ops.CMPLT
            or any(x.op is Ops.RANGE and x.arg[1] in (AxisType.LOCAL, AxisType.GROUP) for x in red.toposort())
            or any(x is not r and x.op is Ops.RANGE and x.arg[1] is AxisType.REDUCE for x in red.src[1:])
        ):
            return red.substitute({r: UOp(Ops.RANGE, r.dtype, (end,), r.arg)})
        return _peeled(sink, red, r, end, full, gv[0])
    return None


def _reversed(sink: UOp, red: UOp, form: Linear) -> UOp | None:
    """# REDUCE(where(a*r + rest < 0, x, id), r) with a < 0 -> the same over r = n-1 - r': the gate holds from a bound
    on r on (a lower bound: causal attention's dk and dv sum over the queries from the key on), so on r' below one,
    which `loop_end` ends the loop at. Only where red's only reduce range is r and its trip count n is constant; the
    sum runs in the other order (its rounding is another, no inf or nan is)."""
    terms = form[0]
    own = [r for r in red.src[1:] if r.op is Ops.RANGE and r.arg[1] is AxisType.REDUCE]
    if len(own) != 1 or terms.get(own[0], 0) >= 0 or not isinstance(n := trip_count(r := own[0]), int):
        return None
    from zeptograd.codegen.opt import pm_fix_range_lists

    flipped = UOp.range(n, max(u.arg[0] for u in sink.toposort() if u.op is Ops.RANGE) + 1, AxisType.REDUCE)
    new = graph_rewrite(graph_substitute(red, {r: flipped * -1 + (n - 1)}), pm_fix_range_lists)
    return new if any(u is flipped for u in new.src[1:]) else None


def _peeled(sink: UOp, red: UOp, r: UOp, end: UOp, full: UOp, gate: UOp) -> UOp:
    """# REDUCE(where(g, x, id), r) -> REDUCE(x, r < full) op REDUCE(where(g, x, id), full <= r < end)"""
    from zeptograd.codegen.opt import pm_fix_range_lists
    from zeptograd.codegen.opt.tail import bound_ranges

    next_id = max(u.arg[0] for u in sink.toposort() if u.op is Ops.RANGE) + 1
    fresh: dict[UOp, UOp] = {}
    for s in bound_ranges(red, r):
        if s is not r:
            fresh[s], next_id = UOp.range(s.src[0], next_id, s.arg[1]), next_id + 1
    wheres = {u: u.src[1] for u in red.src[0].toposort() if u.op is Ops.WHERE and u.src[0] is gate}
    main = graph_substitute(graph_substitute(red, wheres), {r: UOp(Ops.RANGE, r.dtype, (full,), r.arg)})
    main = graph_rewrite(main, pm_fix_range_lists)
    rest = graph_rewrite(end - full, symbolic)
    if rest.op is Ops.CONST and rest.arg <= 0:  # no partial block: the loop without the gate is all of it
        return main
    if full.op is Ops.CONST and full.arg <= 0:  # no full block: the gated loop alone
        return red.substitute({r: UOp(Ops.RANGE, r.dtype, (end,), r.arg)})
    # the tail's range list names its own loop, not the ranges full + part is made of (those are loops around it)
    part = UOp(Ops.RANGE, r.dtype, (rest,), (next_id, AxisType.REDUCE))
    body = graph_rewrite(graph_substitute(red.src[0], {**fresh, r: full + part}), pm_fix_range_lists)
    tail = UOp(Ops.REDUCE, red.dtype, (body, *(part if x is r else fresh.get(x, x) for x in red.src[1:])), red.arg)
    return UOp(red.arg, red.dtype, (main, tail))


def ends_along(sink: UOp, r: UOp) -> bool:
    """Whether end_gated_reduces will end a reduce's loop at a bound that depends on loop r: the iterations of r differ
    in work (causal attention's query tiles: the first one's key loops are short, the last one's full). The optimizer
    asks this before the pass runs, of the same graph: it splits such a loop over cores by every other iteration."""
    for red in sink.toposort():
        if red.op is not Ops.REDUCE or red.src[0].op not in (Ops.WHERE, Ops.AFTER) or r not in red.toposort():
            continue
        if (new := gated_end(sink, red)) is not None and any(
            u.op is Ops.RANGE and r in u.src[0].toposort() for u in new.toposort()
        ):
            return True
    return False


@named_pass("end_gated_reduces", "a reduce gated by a bound on its range ends its loop there")
def end_gated_reduces(sink: UOp) -> UOp:
    """every gated reduce's range ends at its bound, one reduce at a time in the kernel's order (a later reduce reads
    an earlier one's row buffer and value), each once: its loops are not bounded again. Done is kept per range node,
    not per axis id: the kernel's loop nests (a main part and its tails, codegen/opt/tail.py) each hold a copy of a
    reduce the output loop does not vary along (the scores' max) over the same range, and every copy ends where the
    first did (one bounded, the other not: two loops of one axis id, and the linearizer finds no order)"""
    done: set[UOp] = set()
    while True:
        for u in sink.toposort():
            if u.op is not Ops.REDUCE or u.src[0].op not in (Ops.WHERE, Ops.AFTER):
                continue
            ranges = {r for r in u.src[1:] if r.op is Ops.RANGE}
            if not ranges.isdisjoint(done):
                continue
            if (new := gated_end(sink, u)) is not None:
                done |= {r for r in new.toposort() if r.op is Ops.RANGE}
                sink = graph_substitute(sink, {u: new})
                break
            done |= ranges
        else:
            return sink
