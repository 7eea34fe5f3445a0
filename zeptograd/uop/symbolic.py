"""Algebra on UOps: constant folding, identities, like terms, and folds decided by value ranges.

Integer rules keep index arithmetic small: the scheduler writes every movement op as index math and relies on
these rules to make a reshape, a permute or a shrink cost nothing at run time.
"""

from __future__ import annotations

import math
import weakref

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import GroupOp, Ops, UOp, exec_alu
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite


def is_int(u: UOp) -> bool:
    return u.dtype.count == 1 and dtypes.is_int(u.dtype)


def is_intlike(u: UOp) -> bool:
    return u.dtype.count == 1 and (dtypes.is_int(u.dtype) or u.dtype == dtypes.bool)


# ***** sums as (term, coefficient) lists *****


def and_terms(u: UOp) -> list[UOp]:
    """The conjuncts of a bool expression: (a & b) & c -> [a, b, c] (a gate's conditions)."""
    out, stack = [], [u]
    while stack:
        x = stack.pop()
        if x.op is Ops.AND and x.dtype == dtypes.bool:
            stack.extend(x.src)
        else:
            out.append(x)
    return out


def split_sum(x: UOp) -> tuple[list[tuple[UOp, int]], int]:
    """x == sum(base*coef for base, coef in terms) + const, for an integer x (walked without recursion)."""
    terms: dict[UOp, int] = {}
    const, stack = 0, [x]
    while stack:
        u = stack.pop()
        if u.op is Ops.ADD:
            stack.extend(reversed(u.src))  # keep first-seen order of terms
            continue
        if u.op is Ops.CONST:
            const += u.arg
            continue
        base, coef = u, 1
        if u.op is Ops.MUL and u.src[1].op is Ops.CONST:
            base, coef = u.src[0], u.src[1].arg
        terms[base] = terms.get(base, 0) + coef
    return [(b, c) for b, c in terms.items() if c != 0], const


def build_sum(terms: list[tuple[UOp, int]], const: int, like: UOp) -> UOp:
    ret: UOp | None = None
    for base, coef in terms:
        t = base if coef == 1 else base * UOp.const(like.dtype, coef)
        ret = t if ret is None else ret + t
    if ret is None:
        return UOp.const(like.dtype, const)
    return ret if const == 0 else ret + UOp.const(like.dtype, const)


# a sum -> its canonical form (None: it is canonical already), while the sum lives. graph_rewrite meets one sum in
# many passes (each stage simplifies again) and most are canonical: split and rebuilt, they come back as themselves
_like_terms_done: weakref.WeakKeyDictionary[UOp, UOp | None] = weakref.WeakKeyDictionary()


def fold_like_terms(x: UOp) -> UOp | None:
    """# a*2 + b + a*3 + 1 + 2 -> a*5 + b + 3 (and the sum in canonical left-nested order)"""
    if not is_int(x):
        return None
    if (known := _like_terms_done.get(x, x)) is not x:
        return known
    terms, const = split_sum(x)
    ret = build_sum(terms, const, x)
    _like_terms_done[x] = None if ret is x else ret  # never x itself: a value holding its key would never die
    if ret is not x:
        _note_canonical(ret, terms, const, x)
    return ret


def _note_canonical(ret: UOp, terms: list[tuple[UOp, int]], const: int, x: UOp):
    """Remember a built sum, and the partial sums along its left spine, as canonical: graph_rewrite visits each of them
    next, and splitting and rebuilding them would give them back. Only where that is checked: ret splits into exactly
    the terms and constant it was built from (no term is itself a sum or a scaled node, no coefficient wrapped) and
    every sum on the spine has x's dtype (so a rebuild makes the same constants)."""
    if ret.op is not Ops.ADD or ret.dtype is not x.dtype or split_sum(ret) != (terms, const):
        return
    _like_terms_done[ret] = None
    p = ret.src[0] if const != 0 else ret  # the sum of all the terms, then of all but the last, ...
    for _ in range(len(terms) - 1):
        if p.op is not Ops.ADD or p.dtype is not x.dtype:
            return
        _like_terms_done[p] = None
        p = p.src[0]


def fold_vrange(x: UOp) -> UOp | None:
    """# an integer or bool whose smallest and largest possible values are equal is that constant"""
    if is_intlike(x) and x.op is not Ops.CONST and x.vmin == x.vmax:
        return UOp.const(x.dtype, x.vmin)
    return None


def fold_const_alu(x: UOp) -> UOp | None:
    """# CONST op CONST -> CONST"""
    if x.dtype.count != 1 or not all(s.op is Ops.CONST for s in x.src):
        return None
    return UOp.const(x.dtype, exec_alu(x.op, x.dtype, [s.arg for s in x.src]))


# IDIV and MOD truncate toward zero (C's division). On x >= 0 that is floor division, where
#   x == d*Q + R  (Q, R integer sums)  gives  x//d == Q + floor(R/d)  and  x%d == R - d*floor(R/d)
# for any split of each coefficient k into k == d*q + r, whatever the signs of k and of the terms. The folds below
# pick the split, and write floor(R/d) with the IR's IDIV only where R >= 0 (there they agree); on x <= 0 truncation
# is odd: x//d == -((-x)//d) and x%d == -((-x)%d).


def _rem_floor(k: int, d: int) -> int:  # r in [0, d)
    return k % d


def _rem_ceil(k: int, d: int) -> int:  # r in (-d, 0]
    return k % d - d if k % d else 0


def _rem_nearest(k: int, d: int) -> int:  # |r| <= d/2: the narrowest remainder
    return k % d if 2 * (k % d) <= d else k % d - d


def _rem_trunc(k: int, d: int) -> int:  # the sign of k, |r| <= |k|: never a larger coefficient
    return k % d if k >= 0 else -(-k % d)


def _one_bucket(terms: list[tuple[UOp, int]], const: int, d: int) -> tuple[list[tuple[UOp, int]], int, int] | None:
    """(q, r, f) with x == d*(sum q) + (sum r) and floor((sum r)/d) == f for every value of the terms: x//d is
    sum q + f and x%d is sum r - d*f, neither dividing. None where no split tried leaves the remainder one bucket."""
    q_const, r_const = divmod(const, d)
    for rem_of in (_rem_floor, _rem_ceil, _rem_nearest):
        lo = hi = r_const
        split = []
        for b, k in terms:
            r = rem_of(k, d)
            lo, hi = lo + min(r * b.vmin, r * b.vmax), hi + max(r * b.vmin, r * b.vmax)
            split.append((b, k, r))
        if lo // d == hi // d:
            quotient = [(b, (k - r) // d) for b, k, r in split if k != r]
            return quotient, q_const + lo // d, lo // d
    return None


def _negated(x: UOp) -> UOp:
    terms, const = split_sum(x)
    return build_sum([(b, -k) for b, k in terms], -const, x)


def fold_div(x: UOp, c: UOp) -> UOp | None:
    """# (a*(q*c+r) + b)//c -> a*q + (a*r + b)//c for a sum >= 0 whose remainder a*r + b stays >= 0 (or all of it when
    # the remainder stays in one multiple of c); drop terms too small to carry; x <= 0: -((-x)//c)"""
    if not is_int(x) or c.arg <= 0:
        return None
    if x.vmin >= 0:
        return _fold_div_nonneg(x, c)
    if x.vmax <= 0 and (folded := _fold_div_nonneg(_negated(x), c)) is not None:
        return folded * -1
    return None


def _fold_div_nonneg(x: UOp, c: UOp) -> UOp | None:
    if x.vmin < 0:
        return None
    d = c.arg
    terms, const = split_sum(x)
    if (bucket := _one_bucket(terms, const, d)) is not None:  # (x*-4 + 7)//4 -> x*-1 + 1 for x in [0, 1]
        quotient, q_const, _ = bucket
        return build_sum(quotient, q_const, x)
    split = [(b, k, _rem_trunc(k, d)) for b, k in terms]
    quotient = [(b, (k - r) // d) for b, k, r in split if k != r]
    rest = [(b, r) for b, _, r in split if r != 0]
    q_const, r_const = divmod(const, d)
    rem = build_sum(rest, r_const, x)
    if rem.vmin < 0:  # floor(rem/d) is not the IR's rem//d
        return None
    g = math.gcd(d, r_const, *[k for _, k in rest])
    if g > 1:  # (g*a + g*b) // (g*e) -> (a + b) // e
        inner = build_sum([(b, k // g) for b, k in rest], r_const // g, x)
        return build_sum(quotient, q_const, x) + inner // UOp.const(x.dtype, d // g)
    # terms with small coefficients whose sum stays in [0, g) never carry past a multiple of g (the gcd of the others)
    rest.sort(key=lambda t: abs(t[1]))
    for i in range(1, len(rest)):
        small, big = rest[:i], rest[i:]
        g = math.gcd(d, *[k for _, k in big])
        small_sum = build_sum(small, r_const, x)
        if g > 1 and small_sum.vmin >= 0 and small_sum.vmax < g and (big_sum := build_sum(big, 0, x)).vmin >= 0:
            return build_sum(quotient, q_const, x) + big_sum // c
    if quotient or q_const:
        return build_sum(quotient, q_const, x) + rem // c
    return None


def fold_mod(x: UOp, c: UOp) -> UOp | None:
    """# (a*(q*c+r) + b) % c -> (a*r + b) % c for a sum >= 0 whose remainder a*r + b stays >= 0; b % c -> b when
    # 0 <= b < c, and a*r + b - c*f when the remainder stays in [c*f, c*(f+1)); x <= 0: -((-x)%c)"""
    if not is_int(x) or c.arg <= 0:
        return None
    if x.vmin >= 0:
        return _fold_mod_nonneg(x, c)
    if x.vmax <= 0 and (folded := _fold_mod_nonneg(_negated(x), c)) is not None:
        return folded * -1
    return None


def _fold_mod_nonneg(x: UOp, c: UOp) -> UOp | None:
    if x.vmin < 0:
        return None
    d = c.arg
    if x.vmax < d:
        return x
    terms, const = split_sum(x)
    if (bucket := _one_bucket(terms, const, d)) is not None:  # (x*-4 + 7)%4 -> 3 for x in [0, 1]
        quotient, _, f = bucket
        q = dict(quotient)
        return build_sum([(b, k - d * q.get(b, 0)) for b, k in terms if k != d * q.get(b, 0)], const % d - d * f, x)
    rest = [(b, r) for b, k in terms if (r := _rem_trunc(k, d)) != 0]
    if rest == terms and 0 <= const < d:
        return None
    rem = build_sum(rest, const % d, x)
    if rem.vmin < 0:  # rem % d would not be the floor remainder
        return None
    return rem if rem.vmax < d else rem % c


def lift_cmplt(x: UOp, c: UOp) -> UOp | None:
    """# a + k < c -> a < c - k ; a*k < c -> a < ceil(c/k) for k > 0 ; a + b < c -> a < c when g divides c and every
    # coefficient of a, and 0 <= b < g"""
    if not is_int(x):
        return None
    if x.op is Ops.ADD and x.src[1].op is Ops.CONST:
        return x.src[0] < UOp.const(x.dtype, c.arg - x.src[1].arg)
    if x.op is Ops.MUL and x.src[1].op is Ops.CONST and x.src[1].arg > 0:
        return x.src[0] < UOp.const(x.dtype, -((-c.arg) // x.src[1].arg))
    if x.op is Ops.ADD:
        return _drop_small_terms_cmplt(x, c)
    return None


def _drop_small_terms_cmplt(x: UOp, c: UOp) -> UOp | None:
    """a + b < c with a a multiple of g, g | c and 0 <= b < g: a < c (a <= c - g, so a + b < c; a + b < c, so a < c).
    A vector lane added to its row's index (8*r + lane < 4096) then leaves the compare: a gate that holds for all the
    lanes of a vector or none is one branch around a plain load, not a mask (a concatenation's masked loads fetch from
    far outside their buffer in the lanes they skip, where a page that is not mapped costs a microcode assist)."""
    terms, const = split_sum(x)
    if const != 0 or len(terms) < 2:
        return None
    by_size = sorted(terms, key=lambda t: abs(t[1]))
    for i in range(1, len(terms)):
        small = by_size[:i]
        g = math.gcd(c.arg, *[k for _, k in by_size[i:]])
        if g > 1 and (rest := build_sum(small, 0, x)).vmin >= 0 and rest.vmax < g:
            return build_sum([t for t in terms if t not in small], 0, x) < c  # (the sum's own order: canonical)
    return None


def fold_divmod_sum(x: UOp) -> UOp | None:
    """# (a//c)*(c*k) + (a%c)*k -> a*k ; ((a//c)%m)*(c*k) + (a%c)*k -> (a%(c*m))*k for c, m > 0 (ints: a ==
    # (a/c)*c + a%c holds for C's division at any sign, and (a/c)/m == a/(c*m), so the second is a - (a/(c*m))*c*m)"""
    if not is_int(x):
        return None
    terms, const = split_sum(x)
    coef = dict(terms)
    for b, k in terms:
        if b.op is Ops.MOD and b.src[1].op is Ops.CONST and b.src[1].arg != 0:
            q = UOp(Ops.IDIV, b.dtype, b.src)
            if coef.get(q) == k * b.src[1].arg:
                new = [(b.src[0], k) if t is q else (t, c) for t, c in terms if t is not b]
                return build_sum(new, const, x)
            c = b.src[1].arg
            for t, kt in terms:  # a flattened reshape's index: ((a//9)%64)*9 + ((a//3)%3)*3 + a%3 -> a%576
                m = t.src[1].arg if t.op is Ops.MOD and t.src[0] is q and t.src[1].op is Ops.CONST else 0
                if c > 0 and m > 0 and kt == k * c:
                    wider = UOp(Ops.MOD, b.dtype, (b.src[0], UOp.const(b.dtype, c * m)))
                    new = [(wider, k) if u is t else (u, cu) for u, cu in terms if u is not b]
                    return build_sum(new, const, x)
    return None


symbolic = PatternMatcher(
    [
        # CONST op CONST -> CONST
        (UPat(GroupOp.ALU | {Ops.CAST}, name="x", src=UPat(Ops.CONST), allow_any_len=True), fold_const_alu),
        # an integer fixed by its value range -> CONST
        (UPat(GroupOp.ALU, name="x"), fold_vrange),
        # c + x -> x + c ; c * x -> x * c
        (
            UPat((Ops.ADD, Ops.MUL), src=(UPat(Ops.CONST, name="c"), UPat(name="x")), name="u"),
            lambda u, c, x: None if x.op is Ops.CONST else UOp(u.op, u.dtype, (x, c)),
        ),
        # x + 0 -> x ; x * 1 -> x ; x // 1 -> x ; x / 1 -> x ; x - 0 -> x
        (UPat.var("x") + 0, lambda x: x),
        (UPat.var("x") * 1, lambda x: x),
        (UPat.var("x") // 1, lambda x: x),
        (UPat.var("x") / 1.0, lambda x: x),
        (UPat.var("x") - 0, lambda x: x),
        # x * 0 -> 0 (ints only: for floats inf*0 is nan)
        (UPat.var("x") * 0, lambda x: UOp.const(x.dtype, 0) if is_intlike(x) else None),
        # x % 1 -> 0
        (UPat.var("x") % 1, lambda x: UOp.const(x.dtype, 0) if is_int(x) else None),
        # x - y -> x + y*-1 (ints), so like terms meet in one sum
        (UPat(Ops.SUB, src=(UPat.var("x"), UPat.var("y"))), lambda x, y: x + y * -1 if is_int(x) else None),
        # -x -> x*-1 (ints)
        (UPat(Ops.NEG, src=(UPat.var("x"),)), lambda x: x * -1 if is_int(x) else None),
        # x - x -> 0 (ints)
        (UPat(Ops.SUB, src=(UPat.var("x"), UPat.var("x"))), lambda x: UOp.const(x.dtype, 0) if is_int(x) else None),
        # (x*c1)*c2 -> x*(c1*c2)
        (
            (UPat.var("x") * UPat.cvar("c1")) * UPat.cvar("c2"),
            lambda x, c1, c2: x * UOp.const(x.dtype, c1.arg * c2.arg) if is_int(x) else None,
        ),
        # (x + y)*c -> x*c + y*c (ints)
        ((UPat.var("x") + UPat.var("y")) * UPat.cvar("c"), lambda x, y, c: x * c + y * c if is_int(x) else None),
        # like terms: x*c1 + x*c2 -> x*(c1+c2), constants gathered, canonical order
        (UPat(Ops.ADD, name="x"), fold_like_terms),
        # (a*c + b)//c -> a + b//c ; (a*c + b)%c -> b%c
        (UPat.var("x") // UPat.cvar("c"), fold_div),
        (UPat.var("x") % UPat.cvar("c"), fold_mod),
        # (x//a)//b -> x//(a*b) for x >= 0
        (
            (UPat.var("x") // UPat.cvar("a")) // UPat.cvar("b"),
            lambda x, a, b: (
                x // UOp.const(x.dtype, a.arg * b.arg)
                if is_int(x) and x.vmin >= 0 and a.arg > 0 and b.arg > 0
                else None
            ),
        ),
        # a + k < c -> a < c-k ; a*k < c -> a < ceil(c/k) ; a*g + b < c -> a*g < c for g | c, 0 <= b < g
        (UPat.var("x") < UPat.cvar("c"), lift_cmplt),
        # where(True, a, b) -> a ; where(False, a, b) -> b ; where(c, a, a) -> a
        (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
        (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("a"))), lambda a: a),
        # x & True -> x ; x & False -> False ; x | False -> x ; x | True -> True (bools)
        (UPat(Ops.AND, src=(UPat.var("x", dtypes.bool), UPat.cvar("c"))), lambda x, c: x if c.arg else c),
        (UPat(Ops.OR, src=(UPat.var("x", dtypes.bool), UPat.cvar("c"))), lambda x, c: c if c.arg else x),
        # x & x -> x ; x | x -> x ; max(x, x) -> x
        (UPat(GroupOp.Idempotent, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
        # max(x, y) -> x when the ranges decide it (ints)
        (
            UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("y"))),
            lambda x, y: (x if x.vmin >= y.vmax else y if y.vmin >= x.vmax else None) if is_int(x) else None,
        ),
        # cast(x) to x's own dtype -> x
        (UPat(Ops.CAST, name="c", src=(UPat.var("x"),)), lambda c, x: x if c.dtype == x.dtype else None),
        # algebra: (a//c)*c*k + (a%c)*k -> a*k ; ((a//c)%m)*c*k + (a%c)*k -> (a%(c*m))*k (merged ranges, reshapes)
        (UPat(Ops.ADD, name="x"), fold_divmod_sum),
    ]
)


# ***** simplify, remembered *****

# symbolic's rules are pure functions of the node (no ctx, no knobs): graph_rewrite remembers its fixed points, so an
# already simplified subgraph (most of an index expression after a range is substituted) is not walked again
symbolic.fixed_points = weakref.WeakSet()
_simplified: weakref.WeakKeyDictionary[UOp, weakref.ref[UOp]] = weakref.WeakKeyDictionary()


def simplify(u: UOp) -> UOp:
    """graph_rewrite(u, symbolic), remembered while u and its result live. The rewrite is a pure function of the
    interned graph (the rules read only nodes and their value ranges), and the scheduler and the expander simplify the
    same index expressions again and again (each consumer's request, each unrolled copy). Weak on both sides, so the
    memo keeps no graph (nor the buffers a gather's index reads) alive; dict reads and writes are atomic, so threads
    sharing it at worst simplify one expression twice, to the same interned result."""
    if (ref := _simplified.get(u)) is not None and (r := ref()) is not None:
        return r
    r = graph_rewrite(u, symbolic)
    _simplified[u] = weakref.ref(r)
    return r
