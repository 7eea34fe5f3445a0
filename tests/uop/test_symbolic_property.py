"""Hypothesis tests of the `symbolic` rules: on random expression trees over bounded variables, simplify() keeps
every integer value, substituting constants folds to the value, and simplify() is idempotent. Slow as a whole (see
tests/conftest.py): the inner loop does not import hypothesis."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.uop.test_symbolic import c, evaluate, fmt
from zeptograd.uop.ops import Ops, UOp, python_alu

# ----------------------------------------------------------------------------- hypothesis: random expression trees

LIMIT = 2**20  # every intermediate value of a generated expression stays well inside int32


@st.composite
def variables(draw):
    vs = []
    for name in ("a", "b", "c")[: draw(st.integers(2, 3))]:
        kind = draw(st.sampled_from(["nonneg", "neg", "mixed"]))
        width = draw(st.integers(0, 12))
        if kind == "nonneg":
            lo = draw(st.integers(0, 6))
        elif kind == "neg":
            lo = draw(st.integers(-18, -width))
        else:
            lo = draw(st.integers(-12, 0))
        vs.append(UOp.variable(name, lo, lo + width))
    return vs


def _idiv(a, b):
    return python_alu[Ops.IDIV](a, b)


def _mod(a, b):
    return python_alu[Ops.MOD](a, b)


def _bounds_mul(l0, l1, r0, r1):
    p = [l0 * r0, l0 * r1, l1 * r0, l1 * r1]
    return min(p), max(p)


def expr_trees(vs):
    """(uop, lo, hi): an int expression over vs and exact-enough bounds (a superset) used to avoid overflow."""

    @st.composite
    def tree(draw, depth):
        if depth == 0 or draw(st.integers(0, 5)) == 0:
            if draw(st.booleans()):
                v = draw(st.sampled_from(vs))
                return v, v.arg[1], v.arg[2]
            k = draw(st.integers(-10, 10))
            return c(k), k, k
        op = draw(
            st.sampled_from(
                [
                    "add",
                    "sub",
                    "mulc",
                    "cmul",
                    "mul",
                    "div",
                    "mod",
                    "max",
                    "min",
                    "neg",
                    "where",
                    "cadd",
                    "adiv",
                    "amod",
                    "ddiv",
                    "recombine",
                    "where",
                ]
            )
        )
        l, l0, l1 = draw(tree(depth - 1))
        if op == "neg":
            return -l, -l1, -l0
        if op in ("mulc", "cmul"):
            k = draw(st.integers(-6, 6))
            b = _bounds_mul(l0, l1, k, k)
            return (l * k if op == "mulc" else c(k) * l), b[0], b[1]
        if op == "cadd":
            k = draw(st.integers(-10, 10))
            return c(k) + l, l0 + k, l1 + k
        if op in ("adiv", "amod"):
            # sum of subexpressions times multiples of k, of divisors of k, and small coefficients, then // or % k
            k = draw(st.integers(2, 12))
            m0 = k * draw(st.integers(-2, 3))
            e = l * m0
            e0, e1 = _bounds_mul(l0, l1, m0, m0)
            for _ in range(draw(st.integers(1, 3))):
                t, t0, t1 = draw(tree(depth - 1))
                divs = [m for m in range(1, k + 1) if k % m == 0]
                m = draw(st.sampled_from(divs + [k * 2, -k, 1, -1, 3]))
                b = _bounds_mul(t0, t1, m, m)
                e, e0, e1 = e + t * m, e0 + b[0], e1 + b[1]
            kc = draw(st.integers(-2 * k, 3 * k))
            e, e0, e1 = e + kc, e0 + kc, e1 + kc
            if max(abs(e0), abs(e1)) > LIMIT:
                return l, l0, l1
            if op == "adiv":
                return e // k, min(_idiv(e0, k), 0), max(_idiv(e1, k), 0)
            return e % k, -(k - 1) if e0 < 0 else 0, k - 1
        if op == "recombine":
            # (l//k)*(k*m) + (l%k)*m [+ r] == l*m [+ r] for C's // and % at any sign of l
            k, m = draw(st.integers(1, 9)), draw(st.integers(-3, 3))
            r, r0, r1 = draw(tree(depth - 1)) if draw(st.booleans()) else (c(0), 0, 0)
            parts = [(l // k) * (k * m), (l % k) * m, r]
            order = draw(st.permutations(range(3)))
            e = parts[order[0]] + parts[order[1]] + parts[order[2]]
            b = _bounds_mul(min(l0, 0), max(l1, 0), m, m)
            return e, 2 * b[0] + r0 - abs(m) * k, 2 * b[1] + r1 + abs(m) * k
        if op == "ddiv":
            k1, k2 = draw(st.integers(1, 5)), draw(st.integers(1, 5))
            return (l // k1) // k2, min(l0, 0), max(l1, 0)
        if op in ("div", "mod"):
            k = draw(st.integers(1, 9))
            if op == "div":
                return l // k, min(_idiv(l0, k), 0), max(_idiv(l1, k), 0)
            return l % k, -(k - 1) if l0 < 0 else 0, k - 1
        r, r0, r1 = draw(tree(depth - 1))
        if op == "add":
            return l + r, l0 + r0, l1 + r1
        if op == "sub":
            return l - r, l0 - r1, l1 - r0
        if op == "mul":
            b = _bounds_mul(l0, l1, r0, r1)
            if max(abs(b[0]), abs(b[1])) > LIMIT:
                return l + r, l0 + r0, l1 + r1
            return l * r, b[0], b[1]
        if op == "max":
            return l.maximum(r), max(l0, r0), max(l1, r1)
        if op == "min":
            return l.minimum(r), min(l0, r0), min(l1, r1)
        # where(cmp(p, q), l, r)
        p, p0, p1 = draw(tree(depth - 1))
        if draw(st.booleans()):
            q, _, _ = draw(tree(depth - 1))
        else:  # p < K, (p + k) < K, (p * k) < K with K inside p's range: the forms lift_cmplt moves
            k = draw(st.integers(-4, 6))
            form = draw(st.sampled_from(["p", "add", "mul"]))
            if form == "add":
                p, p0, p1 = p + k, p0 + k, p1 + k
            elif form == "mul":
                p, (p0, p1) = p * k, _bounds_mul(p0, p1, k, k)
            q = c(draw(st.integers(max(p0, -LIMIT), min(p1 + 1, LIMIT))))
        cmp = draw(st.sampled_from(["<", ">", "<=", ">=", "!=", "=="]))
        cond = {
            "<": lambda: p < q,
            ">": lambda: p > q,
            "<=": lambda: p <= q,
            ">=": lambda: p >= q,
            "!=": lambda: p.ne(q),
            "==": lambda: p.eq(q),
        }[cmp]()
        return cond.where(l, r), min(l0, r0), max(l1, r1)

    return tree(5)


@st.composite
def case(draw):
    vs = draw(variables())
    e, lo, hi = draw(expr_trees(vs))
    seed = draw(st.integers(0, 2**32 - 1))
    return vs, e, (lo, hi), seed


def assignments(vs, seed, n=60):
    """Corners of the box, 0 where it is inside, and random points."""
    rng = random.Random(seed)
    out = []
    corners = [[v.arg[1], v.arg[2]] + ([0] if v.arg[1] <= 0 <= v.arg[2] else []) for v in vs]
    for _ in range(n):
        out.append({v.arg[0]: rng.randint(v.arg[1], v.arg[2]) for v in vs})
    for i in range(16):
        out.append({v.arg[0]: corners[j][(i >> j) % len(corners[j])] for j, v in enumerate(vs)})
    return out


def check_case(vs, e, seed):
    s = e.simplify()
    for env in assignments(vs, seed):
        want = evaluate(e, env)[e]
        got_vals = evaluate(s, env)
        got = got_vals[s]
        assert got == want, f"simplify changed the value at {env}: {fmt(e)} = {want}, but simplified {fmt(s)} = {got}"
        assert s.vmin <= got <= s.vmax
        assert e.vmin <= want <= e.vmax
    return s


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(case())
def test_simplify_keeps_values(cs):
    vs, e, (lo, hi), seed = cs
    check_case(vs, e, seed)


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(case())
def test_substituted_constants_fold_to_value(cs):
    vs, e, _, seed = cs
    env = assignments(vs, seed, n=1)[0]
    want = evaluate(e, env, check_ranges=False)[e]
    sub = e.substitute({v: c(env[v.arg[0]]) for v in vs})
    folded = sub.simplify()
    assert folded.op is Ops.CONST, f"{fmt(sub)} did not fold: {fmt(folded)}"
    assert folded.arg == want, f"{fmt(e)} at {env}: {want}, but folded to {folded.arg}"
    # substituting into the simplified expression gives the same value
    s = e.simplify()
    folded_s = s.substitute({v: c(env[v.arg[0]]) for v in vs}).simplify()
    assert folded_s.op is Ops.CONST and folded_s.arg == want, f"{fmt(s)} at {env}: {fmt(folded_s)} != {want}"


@pytest.mark.slow
@settings(max_examples=120, deadline=None)
@given(case())
def test_simplify_is_idempotent(cs):
    _, e, _, _ = cs
    s = e.simplify()
    assert s.simplify() is s, f"{fmt(e)} -> {fmt(s)} -> {fmt(s.simplify())}"
