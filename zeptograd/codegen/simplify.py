"""Range and reduce rewrites on the kernel graph, run after the first symbolic pass, before the optimizer.

`pm_index_given_valid` runs first (codegen/__init__.py: ranges_simplified): a gated INDEX's index simplified with
the bounds its gate puts on the index's parts.

`simplify_ranges(sink)` runs, in order:

1. flattening: `END(END(x, r1), r0)` -> `END(x, r0, r1)`; an END/REDUCE whose range list holds an expression of
   ranges (after a substitution) lists those ranges instead;
2. load collapse: a REDUCE whose body has a closed form in one of its ranges loses that range (O(N) -> O(1)): the
   parts of the body that do not depend on the reduce's ranges become opaque DEFINE_VARs, `pm_reduce_collapse`
   (+ symbolic) rewrites it, and the result is kept only if it runs fewer reduce loops; then reduce unparented;
3. range splitting: `RANGE(n) % c` with `n % c == 0` -> `RANGE(n/c)*c + RANGE(c)`, all candidates at once at the
   SINK; the outer part keeps the range's axis id, the inner one gets a fresh id (the largest): loops nest in
   axis-id order (linearize), so the inner part nests inside every other loop, as an UPCAST would;
4. range merging: two adjacent ranges of one kind (outer, inner) -> one `RANGE(n0*n1)` read through `//` and `%`,
   kept only if the count of divmods in the kernel does not grow.

The values never change; float sums may round differently where a closed form replaces a loop (reduce unparented
multiplies instead of adding n times) or where a split moves a reduce's inner part innermost. `x * bool.cast()` ->
`where(bool, x, 0)` inside a collapsed reduce also drops the NaN of `inf * 0`.
"""

from __future__ import annotations

from zeptograd.dtype import PtrDType, dtypes
from zeptograd.uop.ops import AxisType, Ops, UOp, const_trip_count, trip_count
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

# ***** helpers *****


def uses(u: UOp, r: UOp) -> bool:
    return r in u.toposort()


def has_range(u: UOp) -> bool:
    return any(x.op is Ops.RANGE for x in u.toposort())


def count_divmod(u: UOp) -> int:
    return sum(x.op in (Ops.IDIV, Ops.MOD) for x in u.toposort())


def is_zero(u: UOp) -> bool:
    return u.op is Ops.CONST and u.arg == 0 and u.dtype.count == 1


def is_int(u: UOp) -> bool:
    return u.dtype.count == 1 and dtypes.is_int(u.dtype)


def negated(g: UOp) -> UOp | None:
    """b when g is `b != True` for a bool b (MathMixin's >= writes the True as an int 1: accepted too)"""
    if g.op is Ops.CMPNE and g.src[0].dtype == dtypes.bool and g.src[1].op is Ops.CONST and g.src[1].arg == 1:
        return g.src[0]
    return None


def _ge(a: UOp, b: UOp) -> UOp:
    return (a < b).logical_not()


def _min(a: UOp, b: UOp) -> UOp:
    return (a < b).where(a, b)


def _clamp(c: UOp, lo: int, hi: int | UOp) -> UOp:
    """min(max(c, lo), hi), max first so that nothing can overflow"""
    return _min(c.maximum(UOp.const(c.dtype, lo)), hi.cast(c.dtype) if isinstance(hi, UOp) else UOp.const(c.dtype, hi))


def _len_as(r: UOp, dtype) -> UOp:
    n = trip_count(r)
    return n.cast(dtype) if isinstance(n, UOp) else UOp.const(dtype, n)


# ***** 1. flattening *****


def flatten_range(u: UOp) -> UOp | None:
    """# END/REDUCE(x, f(r1, r0), ...) -> END/REDUCE(x, r0, r1, ...): the ranges the list uses, by axis id (the
    linearizer nests loops in axis-id order)"""
    new = sorted(
        {x for x in UOp(Ops.SINK, dtypes.void, u.src[1:]).toposort() if x.op is Ops.RANGE}, key=lambda r: r.arg[0]
    )
    if tuple(new) == u.src[1:]:
        return None
    if not new and (u.op is Ops.END or u.dtype == u.src[0].dtype):
        return u.src[0]
    return UOp(u.op, u.dtype, (u.src[0], *new), u.arg)


pm_flatten_range = PatternMatcher(
    [
        # END(END(x, r1), r0) -> END(x, r0, r1): r1 (closed first) is the inner loop
        (
            UPat(Ops.END, src=(UPat(Ops.END, name="inner"),), allow_any_len=True, name="outer"),
            lambda outer, inner: UOp(Ops.END, outer.dtype, (inner.src[0], *outer.src[1:], *inner.src[1:])),
        ),
        # END/REDUCE(x, f(r1, r0)) -> END/REDUCE(x, r0, r1), by axis id
        (UPat((Ops.END, Ops.REDUCE), name="u"), flatten_range),
    ]
)


pm_symbolic_flatten = symbolic + pm_flatten_range


# ***** 1b. an index simplified where its gate holds *****


def gate_intervals(valid: UOp) -> dict[UOp, tuple[int, int]]:
    """The bounds [lo, hi] the gate valid puts on int expressions: each clause of its AND tree that compares an
    expression with a constant (x < c, c < x, and their negations) narrows that expression's interval."""
    bounds: dict[UOp, tuple[int, int]] = {}
    stack = [valid]
    while stack:
        g = stack.pop()
        if g.op is Ops.AND and g.dtype == dtypes.bool:
            stack.extend(g.src)
            continue
        neg = (inner := negated(g)) is not None
        cmp = inner if inner is not None else g
        if cmp.op is not Ops.CMPLT or not all(is_int(s) for s in cmp.src):
            continue
        (a, b), lo, hi = cmp.src, None, None
        if b.op is Ops.CONST and a.op is not Ops.CONST:  # a < c: a <= c-1; not: a >= c
            x, (lo, hi) = a, ((b.arg, None) if neg else (None, b.arg - 1))
        elif a.op is Ops.CONST and b.op is not Ops.CONST:  # c < b: b >= c+1; not: b <= c
            x, (lo, hi) = b, ((None, a.arg) if neg else (a.arg + 1, None))
        else:
            continue
        old_lo, old_hi = bounds.get(x, (x.vmin, x.vmax))
        bounds[x] = (old_lo if lo is None else max(old_lo, lo), old_hi if hi is None else min(old_hi, hi))
    return bounds


def index_given_valid(x: UOp) -> UOp | None:
    """INDEX(buf, i, valid) -> INDEX(buf, i', valid), i' = i where valid holds, simplified with the bounds valid puts
    on i's parts: the index of a padded read, c*12544 + h*112 + w - 113 with 1 <= h, w <= 112, gives
    (.. // 112) % 112 -> h - 1 and .. % 112 -> w - 1. Where valid is false the load reads nothing, so i' may differ."""
    buf, idx, valid = x.src
    nodes = set(idx.toposort())
    if not any(u.op in (Ops.IDIV, Ops.MOD) for u in nodes):  # nothing the bounds could fold (most gated reads)
        return None
    narrowed = {e: b for e, b in gate_intervals(valid).items() if e in nodes and b != (e.vmin, e.vmax) and b[0] <= b[1]}
    if not narrowed:
        return None
    # each narrowed expression stands in as a variable of its interval while simplifying, then is put back
    stand_in = {e: UOp.variable(f"\x00valid{k}", lo, hi, e.dtype) for k, (e, (lo, hi)) in enumerate(narrowed.items())}
    simplified = graph_rewrite(graph_substitute(idx, stand_in), symbolic)
    new = graph_substitute(simplified, {v: e for e, v in stand_in.items()})
    if new is idx or count_divmod(new) >= count_divmod(idx):
        return None
    return UOp(Ops.INDEX, x.dtype, (buf, new, valid), x.arg)


pm_index_given_valid = PatternMatcher(
    [
        # INDEX(buf, i, valid) -> INDEX(buf, i simplified where valid holds, valid)
        (UPat(Ops.INDEX, src=(UPat(), UPat(), UPat()), name="x"), index_given_valid),
    ]
)


# ***** 2. reduce collapse: closed forms of gated ADD reductions *****


def range_of(x: UOp, r: UOp) -> bool:
    """x is r, or r cast to an int type that holds all of r's values"""
    if x is r:
        return True
    return x.op is Ops.CAST and x.src[0] is r and is_int(x) and dtypes.max(x.dtype) >= r.vmax and x.dtype.count == 1


def _bound_side(cmp: UOp, r: UOp) -> tuple[UOp, bool] | None:
    """for cmp(a, b) with exactly one side r (or r cast): (the other side, whether r is on the left)"""
    a, b = cmp.src
    if range_of(a, r) and not uses(b, r) and is_int(b):
        return b, True
    if range_of(b, r) and not uses(a, r) and is_int(a):
        return a, False
    return None


def gate_bounds(g: UOp, r: UOp, neg: bool) -> list[tuple[str, UOp]] | None:
    """The gate g (or not g) as a list of ("lo"|"lo1"|"hi"|"hi1", c) bounds on r, and ("gate", g') for parts not
    using r: lo c is r >= c, hi c is r < c, lo1/hi1 the same with c+1. None if it is not an interval in r."""
    if not uses(g, r):
        return [("gate", g.logical_not() if neg else g)]
    if (inner := negated(g)) is not None:
        return gate_bounds(inner, r, not neg)
    if g.op is Ops.AND and not neg and g.dtype == dtypes.bool:
        a, b = gate_bounds(g.src[0], r, False), gate_bounds(g.src[1], r, False)
        return None if a is None or b is None else a + b
    if g.op is Ops.CMPLT and (side := _bound_side(g, r)) is not None:
        c, r_left = side
        if r_left:  # r < c
            return [("lo", c)] if neg else [("hi", c)]
        return [("hi1", c)] if neg else [("lo1", c)]  # c < r, i.e. r >= c+1
    if g.op in (Ops.CMPEQ, Ops.CMPNE) and (side := _bound_side(g, r)) is not None:
        if (g.op is Ops.CMPEQ) != neg:  # r == c
            return [("lo", side[0]), ("hi1", side[0])]
    return None


def eq_target(g: UOp, r: UOp, neg: bool) -> UOp | None:
    """e when the gate (or not gate) is r == e, with e not using r"""
    if (b := negated(g)) is not None:
        return eq_target(b, r, not neg)
    if g.op in (Ops.CMPEQ, Ops.CMPNE) and (g.op is Ops.CMPEQ) != neg and (side := _bound_side(g, r)) is not None:
        return side[0]
    return None


def count_in(bounds: list[tuple[str, UOp]], r: UOp) -> UOp:
    """how many r in 0..n-1 satisfy the bounds: max(0, min(n, his) - max(0, los)), every bound clamped to 0..n"""
    n = trip_count(r)
    lo: UOp = UOp.const(r.dtype, 0)
    hi: UOp = _len_as(r, r.dtype)
    for kind, c in bounds:
        if kind == "gate":
            continue
        if c.dtype.itemsize < r.dtype.itemsize:
            c = c.cast(r.dtype)  # exact, and n fits
        low = 0 if dtypes.is_unsigned(c.dtype) else -1
        v = _clamp(c, 0, n) if kind in ("lo", "hi") else _clamp(c, low, n - 1) + UOp.const(c.dtype, 1)
        v = v.cast(r.dtype)  # in 0..n, so any int type holds it
        lo, hi = (lo.maximum(v), hi) if kind.startswith("lo") else (lo, _min(hi, v))
    return (hi - lo).maximum(UOp.const(r.dtype, 0))


def substitute_gated(x: UOp, r: UOp, new: UOp, valid: UOp) -> UOp:
    """x with r := new, and every INDEX that used r gated by valid (its loads read 0 and touch no memory outside)"""
    done: dict[UOp, UOp] = {}
    for u in x.toposort():
        if u is r:
            done[u] = new
            continue
        srcs = tuple(done[s] for s in u.src)
        if u.op is Ops.INDEX and srcs != u.src:
            v = valid if len(srcs) < 3 else srcs[2] & valid
            done[u] = UOp(Ops.INDEX, u.dtype, (srcs[0], srcs[1], v), u.arg)
        else:
            done[u] = u if srcs == u.src else UOp(u.op, u.dtype, srcs, u.arg)
    return done[x]


def fold_one_range(body: UOp, r: UOp) -> UOp | None:
    """sum over r of a gated body -> its closed form, or None"""
    gates: list[tuple[UOp, bool]] = []
    x = body
    while x.op is Ops.WHERE and (is_zero(x.src[1]) or is_zero(x.src[2])):
        g, a, b = x.src
        gates.append((g, not is_zero(b)))  # neg: where(g, 0, b) keeps b where not g
        x = b if is_zero(a) else a
    if not gates or x.dtype == dtypes.bool:
        return None
    zero = UOp.const(body.dtype, 0)
    if not uses(x, r):
        # sum(lo <= r < hi ? v : 0) -> max(0, min(n, hi) - max(0, lo)) * v
        bounds = [gate_bounds(g, r, neg) for g, neg in gates]
        count: UOp | None = None
        if sum(b is None for b in bounds) == 1 and sum(uses(g, r) for g, _ in gates) == 1:
            # one gate is the complement of an interval (r != e, !(lo <= r < hi)): n - the interval's count
            i = next(i for i, b in enumerate(bounds) if b is None)
            if (inv := gate_bounds(gates[i][0], r, not gates[i][1])) is not None:
                count, bounds[i] = _len_as(r, r.dtype) - count_in(inv, r), []
        if any(b is None for b in bounds):
            return None
        flat = [b for bs in bounds if bs is not None for b in bs]
        ret = (count_in(flat, r) if count is None else count).cast(x.dtype) * x
        for kind, g in flat:
            if kind == "gate":
                ret = g.where(ret, zero)
        return ret
    # sum(r == e ? expr : 0) -> (0 <= e < n) ? expr[r := e] : 0, the loads of expr gated by 0 <= e < n
    for i, (g, neg) in enumerate(gates):
        if (e := eq_target(g, r, neg)) is None:
            continue
        if e.dtype.itemsize < r.dtype.itemsize:
            e = e.cast(r.dtype)  # exact, and n fits
        inb = _ge(e, UOp.const(e.dtype, 0)) & (e < _len_as(r, e.dtype))
        inner = x
        for g2, neg2 in reversed(gates[:i] + gates[i + 1 :]):
            inner = g2.where(zero, inner) if neg2 else g2.where(inner, zero)
        return inb.where(substitute_gated(inner, r, e.cast(r.dtype), inb), zero)
    return None


def fold_gated_reduce(red: UOp) -> UOp | None:
    """# sum(r < cut ? 0 : v) -> clamp(n-cut, 0, n)*v ; sum(r < cut ? v : 0) -> clamp(cut, 0, n)*v ; two-sided;
    sum(r != e ? v : 0) -> (n - in_bounds(e))*v ; sum(r == e ? expr : 0) -> in_bounds(e) ? expr[r:=e] : 0"""
    if red.arg is not Ops.ADD:
        return None
    for r in red.src[1:]:
        if (ret := fold_one_range(red.src[0], r)) is not None:
            rest = tuple(x for x in red.src[1:] if x is not r)
            return UOp(Ops.REDUCE, red.dtype, (ret, *rest), red.arg) if rest else ret
    return None


_EXACT_FLOAT_INT = {dtypes.float32: 1 << 24, dtypes.float64: 1 << 53}


def fold_gauss(red: UOp, x: UOp) -> UOp | None:
    """# sum(r for r in 0..n-1) -> n*(n-1)/2 (ints; floats while every partial sum is exact)"""
    for r in red.src[1:]:
        n = const_trip_count(r)
        if n is None or not (x is r or (x.op is Ops.CAST and x.src[0] is r)):
            continue
        total = n * (n - 1) // 2
        if not (range_of(x, r) or (x.dtype in _EXACT_FLOAT_INT and total <= _EXACT_FLOAT_INT[x.dtype])):
            return None
        rest = tuple(s for s in red.src[1:] if s is not r)
        ret = UOp.const(red.dtype, total)
        return UOp(Ops.REDUCE, red.dtype, (ret, *rest), red.arg) if rest else ret
    return None


def _reduce_free(red: UOp, x: UOp) -> bool:
    return not any(r in x.toposort() for r in red.src[1:])


def _pow(x: UOp, n: int) -> UOp:
    """x**n by repeated squaring, as MULs"""
    ret: UOp | None = None
    while n:
        if n & 1:
            ret = x if ret is None else ret * x
        n >>= 1
        if n:
            x = x * x
    assert ret is not None
    return ret


def reduce_unparented(red: UOp) -> UOp | None:
    """# a range the body does not use: ADD -> *n ; MUL -> **n ; MAX -> the range is dropped"""
    if red.arg not in (Ops.ADD, Ops.MUL, Ops.MAX):
        return None
    body = red.src[0]
    ranges = body.toposort()
    unused = [r for r in red.src[1:] if r not in ranges]
    if not unused or (red.arg is not Ops.MAX and any((const_trip_count(r) or 0) < 1 for r in unused)):
        return None
    used = tuple(r for r in red.src[1:] if r in ranges)
    ret = UOp(Ops.REDUCE, red.dtype, (body, *used), red.arg) if used else body
    for r in unused:
        if red.arg is Ops.ADD:
            ret = ret * UOp.const(ret.dtype, const_trip_count(r))
        elif red.arg is Ops.MUL:
            ret = _pow(ret, const_trip_count(r) or 0)  # a symbolic size (None) returned above
    return ret


def lift_add(x: UOp, y: UOp, c: UOp, cmp) -> UOp | None:
    """# (x + y) cmp c -> x cmp c - y, x holding the reduce's ranges; c - y in int64 where it could overflow"""
    if not is_int(x) or not has_range(x) or has_range(y) or has_range(c):
        return None
    if dtypes.min(x.dtype) <= c.vmin - y.vmax and c.vmax - y.vmin <= dtypes.max(x.dtype):
        return cmp(x, c - y)
    if x.dtype.itemsize < 8 and (x.op is Ops.RANGE or (x.op is Ops.CAST and x.src[0].op is Ops.RANGE)):
        return cmp(x.cast(dtypes.int64), c.cast(dtypes.int64) - y.cast(dtypes.int64))
    return None


def lift_mul(x: UOp, k: UOp, c: UOp) -> UOp | None:
    """# x*k < c -> x < ceil(c/k) for k > 0, x >= 0 (c clamped first: the + k-1 cannot overflow)"""
    if not is_int(x) or k.arg <= 0 or x.vmin < 0 or not has_range(x) or has_range(c) or c.op is Ops.CONST:
        return None
    top = k.arg * (x.vmax + 1)
    if top + k.arg > dtypes.max(c.dtype):
        return None
    return x < (_min(c, UOp.const(c.dtype, top)) + (k.arg - 1)) // k


pm_reduce_collapse = (
    PatternMatcher(
        [
            # (x + y) < c -> x < c - y, y and c free of the reduce's ranges (ints; in int64 if c - y could overflow)
            ((UPat.var("x") + UPat.var("y")) < UPat.var("c"), lambda x, y, c: lift_add(x, y, c, lambda a, b: a < b)),
            # c < (x + y) -> c - y < x
            (UPat.var("c") < (UPat.var("x") + UPat.var("y")), lambda x, y, c: lift_add(x, y, c, lambda a, b: b < a)),
            # (x + y) != c -> x != c - y ; (x + y) == c -> x == c - y
            (
                (UPat.var("x") + UPat.var("y")).ne(UPat.var("c")),
                lambda x, y, c: lift_add(x, y, c, lambda a, b: a.ne(b)),
            ),
            (
                (UPat.var("x") + UPat.var("y")).eq(UPat.var("c")),
                lambda x, y, c: lift_add(x, y, c, lambda a, b: a.eq(b)),
            ),
            # x*k < c -> x < (min(c, k*(max(x)+1)) + k-1)//k for k > 0, x >= 0 (ceil(c/k); c <= 0 gives a bound <= 0)
            ((UPat.var("x") * UPat.cvar("k")) < UPat.var("c"), lift_mul),
            # bool.cast(int).cast(float) -> bool.cast(float): 0 and 1 survive any cast (one_hot(...).float())
            (
                UPat(Ops.CAST, name="x", src=(UPat(Ops.CAST, src=(UPat.var("b", dtypes.bool),)),)),
                lambda x, b: b.cast(x.dtype),
            ),
            # x * bool.cast() -> where(bool, x, 0)
            (
                UPat.var("x") * UPat(Ops.CAST, src=(UPat.var("b", dtypes.bool),)),
                lambda x, b: b.where(x, UOp.const(x.dtype, 0)) if x.dtype.count == 1 else None,
            ),
            # where(!b, x, y) -> where(b, y, x)
            (
                UPat(Ops.WHERE, src=(UPat(Ops.CMPNE, name="g"), UPat.var("x"), UPat.var("y"))),
                lambda g, x, y: b.where(y, x) if (b := negated(g)) is not None else None,
            ),
            # (a < b) | (a == b) -> !(b < a) (ints: Tensor's a <= b)
            (
                UPat(Ops.CMPLT, src=(UPat.var("a"), UPat.var("b")))
                | UPat(Ops.CMPEQ, src=(UPat.var("a"), UPat.var("b"))),
                lambda a, b: (b < a).logical_not() if is_int(a) else None,
            ),
            # cast(where(g, a, b)) -> where(g, cast(a), cast(b)) with constant arms
            (
                UPat(Ops.CAST, name="x", src=(UPat(Ops.WHERE, src=(UPat.var("g"), UPat.cvar("a"), UPat.cvar("b"))),)),
                lambda x, g, a, b: g.where(a.cast(x.dtype), b.cast(x.dtype)) if x.dtype.count == 1 else None,
            ),
            # where(g, load(index(buf, i, g)), 0) -> load(index(buf, i, g)): the gated load already reads 0
            (
                UPat(
                    Ops.WHERE,
                    src=(UPat.var("g"), UPat(Ops.LOAD, src=(UPat(Ops.INDEX, name="idx"),), name="ld"), UPat.cvar("z")),
                ),
                lambda g, idx, ld, z: ld if is_zero(z) and len(idx.src) == 3 and idx.src[2] is g else None,
            ),
            # sum(bool.cast()) -> sum(where(bool, 1, 0))
            (
                UPat(
                    Ops.REDUCE,
                    arg=Ops.ADD,
                    src=(UPat(Ops.CAST, src=(UPat.var("b", dtypes.bool),), name="c"),),
                    allow_any_len=True,
                    name="red",
                ),
                lambda red, c, b: red.replace(
                    src=(b.where(UOp.const(c.dtype, 1), UOp.const(c.dtype, 0)), *red.src[1:])
                ),
            ),
            # sum(x + y) -> sum(x) + sum(y): kept only when the whole reduce collapses (see reduce_collapse)
            (
                UPat(Ops.REDUCE, arg=Ops.ADD, src=(UPat.var("x") + UPat.var("y"),), allow_any_len=True, name="red"),
                lambda red, x, y: red.replace(src=(x, *red.src[1:])) + red.replace(src=(y, *red.src[1:])),
            ),
            # sum(x * y) -> sum(x) * y for y free of the reduce's ranges
            (
                UPat(Ops.REDUCE, arg=Ops.ADD, src=(UPat.var("x") * UPat.var("y"),), allow_any_len=True, name="red"),
                lambda red, x, y: (
                    red.replace(src=(x, *red.src[1:])) * y
                    if _reduce_free(red, y) and not _reduce_free(red, x)
                    else None
                ),
            ),
            # sum(where(g, x, 0)) -> where(g, sum(x), 0) for g free of the reduce's ranges
            (
                UPat(
                    Ops.REDUCE,
                    arg=Ops.ADD,
                    src=(UPat(Ops.WHERE, src=(UPat.var("g"), UPat.var("x"), UPat.cvar("z"))),),
                    allow_any_len=True,
                    name="red",
                ),
                lambda red, g, x, z: (
                    g.where(red.replace(src=(x, *red.src[1:])), z) if is_zero(z) and _reduce_free(red, g) else None
                ),
            ),
            # gated sums: lower, upper, two-sided bounds, and the gather
            (UPat(Ops.REDUCE, name="red"), fold_gated_reduce),
            # sum(r) -> n*(n-1)/2
            (UPat(Ops.REDUCE, arg=Ops.ADD, src=(UPat.var("x"),), allow_any_len=True, name="red"), fold_gauss),
            # a range the body does not use: ADD -> *n ; MUL -> **n ; MAX -> dropped
            (UPat(Ops.REDUCE, name="red"), reduce_unparented),
        ]
    )
    + symbolic
)


_OPAQUE_KEEP = (Ops.CONST, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR)


def reduce_collapse(red: UOp) -> UOp | None:
    """Load collapse: the REDUCE with its range-free parts as opaque variables, rewritten by pm_reduce_collapse; kept
    when it runs over fewer of its ranges (a closed form took one out: O(n) -> O(1) in that range)."""
    rngs = red.src[1:]
    if not rngs or not all(r.op is Ops.RANGE for r in rngs):
        return None
    dep: dict[UOp, bool] = {}
    for u in red.toposort():
        dep[u] = u in rngs or any(dep[s] for s in u.src)
    included = [u for u in dep if dep[u]]
    if any(u.op in (Ops.STORE, Ops.REDUCE, Ops.END, Ops.DEFINE_REG, Ops.AFTER) and u is not red for u in included):
        return None
    replaces: dict[UOp, UOp] = {}
    for u in included:
        for s in u.src:
            if not dep[s] and s not in replaces and s.op not in _OPAQUE_KEEP:
                if s.dtype.count != 1 or s.dtype == dtypes.void or isinstance(s.dtype, PtrDType):
                    return None
                replaces[s] = UOp(Ops.DEFINE_VAR, s.dtype, (), (f"__collapse{len(replaces)}", s.vmin, s.vmax))
    ret = graph_rewrite(graph_substitute(red, replaces), pm_reduce_collapse)
    left = {u for u in ret.toposort() if u.op is Ops.RANGE}
    if not left < set(rngs) or any(u.op is Ops.RANGE and u not in rngs for u in left):
        return None
    return graph_substitute(ret, {v: k for k, v in replaces.items()}) if replaces else ret


pm_load_collapse = PatternMatcher(
    [
        # a REDUCE with a closed form in one of its ranges loses that range
        (UPat(Ops.REDUCE, name="red"), reduce_collapse),
        # a range the body does not use: ADD -> *n ; MUL -> **n ; MAX -> dropped
        (UPat(Ops.REDUCE, name="red"), reduce_unparented),
    ]
)


# ***** 3. range splitting *****


def mark_range_mod(ctx: dict[UOp, int], r: UOp, c: UOp) -> None:
    """# collect RANGE(n) % c with n % c == 0 (the first c seen for each range)"""
    n = const_trip_count(r)
    if r not in ctx and n is not None and isinstance(c.arg, int) and 1 < c.arg < n and n % c.arg == 0:
        ctx[r] = c.arg
    return None


def split_at_sink(ctx: dict[UOp, int], sink: UOp) -> UOp | None:
    """# RANGE(n) -> RANGE(n/c)*c + RANGE(c), every collected range at once"""
    if not ctx:
        return None
    next_id = max(u.arg[0] for u in sink.toposort() if u.op is Ops.RANGE) + 1
    subs: dict[UOp, UOp] = {}
    for r, c in ctx.items():
        outer = UOp.range(trip_count(r) // c, r.arg[0], r.arg[1])
        subs[r] = outer * UOp.const(r.dtype, c) + UOp.range(c, next_id, r.arg[1])
        next_id += 1
    ctx.clear()
    return graph_substitute(sink, subs)


pm_split_ranges = PatternMatcher(
    [
        # RANGE(n) % c, n % c == 0: a candidate
        (UPat(Ops.RANGE, name="r") % UPat.cvar("c"), mark_range_mod),
        # at the SINK: RANGE(n) -> RANGE(n/c)*c + RANGE(c) for all candidates
        (UPat(Ops.SINK, name="sink"), split_at_sink),
    ]
)


# ***** 4. range merging *****


def merge_candidates(sink: UOp) -> list[tuple[UOp, UOp]]:
    """(outer, inner) pairs adjacent in one END/REDUCE, of one kind, with constant sizes, that appear together (and
    adjacent, in that order) in every END/REDUCE that lists either"""
    lists = [u.src[1:] for u in sink.toposort() if u.op in (Ops.END, Ops.REDUCE)]
    out = []
    for rl in lists:
        for r0, r1 in zip(rl, rl[1:]):
            if const_trip_count(r0) is None or const_trip_count(r1) is None or r0.arg[1] is not r1.arg[1]:
                continue
            if r0.arg[1] in (AxisType.UPCAST, AxisType.UNROLL):
                continue
            if all((r0 in x) == (r1 in x) and (r0 not in x or x.index(r0) + 1 == x.index(r1)) for x in lists):
                if (r0, r1) not in out:
                    out.append((r0, r1))
    return out


@named_pass("merge_ranges", "adjacent loops merged into one where the divmods do not grow")
def merge_ranges(sink: UOp) -> UOp:
    """# RANGE(n0), RANGE(n1) -> RANGE(n0*n1) read as R//n1, R%n1: kept if the kernel's divmod count does not grow"""
    tried: set[tuple[UOp, UOp]] = set()
    while True:
        for r0, r1 in merge_candidates(sink):
            if (r0, r1) in tried:
                continue
            tried.add((r0, r1))
            n1 = UOp.const(r1.dtype, const_trip_count(r1))
            new = UOp.range(trip_count(r0) * trip_count(r1), r0.arg[0], r0.arg[1])
            cand = graph_rewrite(graph_substitute(sink, {r0: new // n1, r1: new % n1}), pm_symbolic_flatten)
            if count_divmod(cand) <= count_divmod(sink):
                sink = cand
                break
        else:
            return sink


# ***** the pass *****


def simplify_ranges(sink: UOp) -> UOp:
    """The range rewrites on a kernel graph: flatten, load/reduce collapse, split, merge."""
    sink = graph_rewrite(sink, pm_flatten_range)
    sink = graph_rewrite(sink, pm_load_collapse)
    for _ in range(4):  # a split can expose another RANGE % c on its inner range
        split = graph_rewrite(sink, pm_split_ranges, ctx={})
        if split is sink:
            break
        sink = graph_rewrite(split, pm_symbolic_flatten)
    return merge_ranges(graph_rewrite(sink, pm_symbolic_flatten))
