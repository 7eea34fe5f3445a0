"""The `symbolic` rules: unit tests of each fold, and hypothesis tests that simplify() keeps integer values."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp, python_alu

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def var(name="a", lo=0, hi=10):
    return UOp.variable(name, lo, hi)


def c(v, dtype=dtypes.int):
    return UOp.const(dtype, v)


def is_const(u, v):
    return u.op is Ops.CONST and u.arg == v and type(u.arg) is type(v)


# ----------------------------------------------------------------------------- evaluation and printing


def evaluate(u: UOp, env: dict[str, int], check_ranges: bool = True) -> dict[UOp, object]:
    """Every node's value (no recursion: toposort puts sources first). Checks vmin <= value <= vmax on the way."""
    vals: dict[UOp, object] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            v = n.arg
        elif n.op is Ops.DEFINE_VAR:
            v = env[n.arg[0]]
        else:
            v = python_alu[n.op](*[vals[s] for s in n.src])
        if n.dtype == dtypes.int:
            assert INT32_MIN <= v <= INT32_MAX, f"int32 overflow at {fmt(n)} = {v}"
        if check_ranges:
            assert n.vmin <= v <= n.vmax, f"value {v} of {fmt(n)} outside its range [{n.vmin}, {n.vmax}] at {env}"
        vals[n] = v
    return vals


_INFIX = {
    Ops.ADD: "+",
    Ops.SUB: "-",
    Ops.MUL: "*",
    Ops.IDIV: "//",
    Ops.MOD: "%",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
}


def fmt(u: UOp) -> str:
    """A UOp as a readable expression (C semantics for // and %)."""
    s: dict[UOp, str] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            s[n] = repr(n.arg)
        elif n.op is Ops.DEFINE_VAR:
            s[n] = n.arg[0]
        elif n.op in _INFIX:
            s[n] = f"({s[n.src[0]]} {_INFIX[n.op]} {s[n.src[1]]})"
        elif n.op is Ops.NEG:
            s[n] = f"(-{s[n.src[0]]})"
        elif n.op is Ops.MAX:
            s[n] = f"max({s[n.src[0]]}, {s[n.src[1]]})"
        elif n.op is Ops.WHERE:
            s[n] = f"({s[n.src[0]]} ? {s[n.src[1]]} : {s[n.src[2]]})"
        else:
            s[n] = f"{n.op.name}({', '.join(s[x] for x in n.src)})"
    return s[u]


# ----------------------------------------------------------------------------- unit tests of the rules


def test_constant_folding():
    assert is_const((c(3) + c(4)).simplify(), 7)
    assert is_const((c(3) * c(4)).simplify(), 12)
    assert is_const((c(3) - c(10)).simplify(), -7)
    assert is_const(((c(3) + c(4)) * c(2) - c(1)).simplify(), 13)
    assert is_const(c(3).maximum(c(-4)).simplify(), 3)
    assert is_const((c(3) < c(4)).simplify(), True)
    assert is_const(c(3).ne(c(3)).simplify(), False)
    assert is_const(c(3).eq(c(3)).simplify(), True)
    assert is_const((-c(5)).simplify(), -5)


def test_constant_folding_c_division():
    # truncation toward zero; the remainder has the sign of the dividend
    assert is_const((c(7) // c(2)).simplify(), 3)
    assert is_const((c(-7) // c(2)).simplify(), -3)
    assert is_const((c(7) // c(-2)).simplify(), -3)
    assert is_const((c(-7) // c(-2)).simplify(), 3)
    assert is_const((c(7) % c(2)).simplify(), 1)
    assert is_const((c(-7) % c(2)).simplify(), -1)
    assert is_const((c(7) % c(-2)).simplify(), 1)
    assert is_const((c(-7) % c(-2)).simplify(), -1)


def test_constant_folding_wraps_int32():
    assert is_const((c(INT32_MAX) + c(1)).simplify(), INT32_MIN)


def test_identities():
    a = var("a", -5, 5)
    assert (a + 0).simplify() is a
    assert (c(0) + a).simplify() is a
    assert (a * 1).simplify() is a
    assert (c(1) * a).simplify() is a
    assert (a - 0).simplify() is a
    assert (a // 1).simplify() is a
    assert is_const((a % 1).simplify(), 0)
    assert is_const((a * 0).simplify(), 0)
    assert is_const((c(0) * a).simplify(), 0)
    assert is_const((a - a).simplify(), 0)
    assert a.maximum(a).simplify() is a


def test_mul_by_zero_float_not_folded():
    f = UOp(Ops.DEFINE_VAR, dtypes.float, (), ("f", 0, 1))
    out = (f * 0.0).simplify()
    assert out.op is not Ops.CONST  # inf * 0 is nan


def test_like_terms():
    a, b = var("a"), var("b")
    assert (a * 2 + a * 3).simplify() is a * 5
    assert (a * 2 + b + a * 3).simplify() in (a * 5 + b, b + a * 5)
    assert (a + a).simplify() is a * 2
    assert is_const((a * 3 - a * 3).simplify(), 0)
    assert (a * 3 - a * 2).simplify() is a
    assert (a + 1 + 2).simplify() is a + 3
    assert (a + 1 - 1).simplify() is a
    assert ((a * 2) * 3).simplify() is a * 6
    assert ((a + 1) * 2).simplify() is a * 2 + 2


def test_div_mod_of_multiple_plus_small():
    a, b = var("a", 0, 10), var("b", 0, 3)
    assert ((a * 4 + b) // 4).simplify() is a
    assert ((a * 4 + b) % 4).simplify() is b
    assert ((b + a * 4) // 4).simplify() is a
    assert ((b + a * 4) % 4).simplify() is b
    assert ((a * 8 + 4) // 4).simplify() is a * 2 + 1
    assert is_const(((a * 8 + 4) % 4).simplify(), 0)
    # b may reach 4 here: not folded to a
    b5 = var("b5", 0, 4)
    assert ((a * 4 + b5) // 4).simplify() is not a


def test_div_mod_by_value_range():
    a = var("a", 0, 3)
    assert is_const((a // 4).simplify(), 0)
    assert (a % 4).simplify() is a
    n = var("n", -3, 3)
    assert is_const((n // 4).simplify(), 0)  # C division: |n| < 4 truncates to 0
    m = (n % 4).simplify()
    for v in range(-3, 4):  # C remainder: n % 4 == n for |n| < 4
        assert evaluate(m, {"n": v})[m] == v


def test_nested_div():
    a = var("a", 0, 100)
    assert ((a // 2) // 3).simplify() is a // 6


def test_comparisons_by_range():
    a, b = var("a", 0, 3), var("b", 5, 9)
    assert is_const((a < 4).simplify(), True)
    assert is_const((a < 0).simplify(), False)
    assert is_const((a < b).simplify(), True)
    assert is_const((b < a).simplify(), False)
    assert is_const(a.ne(b).simplify(), True)
    assert is_const(a.eq(b).simplify(), False)
    assert is_const((a >= 0).simplify(), True)
    assert is_const((a <= 3).simplify(), True)
    assert is_const((a < 2).simplify(), False) is False  # undecided by the range


def test_cmplt_lift():
    a = var("a", -10, 10)
    assert (a + 3 < 5).simplify() is (a < 2)
    assert (a * 3 < 7).simplify() is (a < 3)  # a*3 < 7 <=> a <= 2
    assert (a * 3 < -7).simplify() is (a < -2)  # a*3 < -7 <=> a <= -3


def test_where_with_constant_condition():
    a, b = var("a"), var("b")
    assert c(True, dtypes.bool).where(a, b).simplify() is a
    assert c(False, dtypes.bool).where(a, b).simplify() is b
    assert (var("a", 0, 3) < 4).where(a, b).simplify() is a  # the condition folds first
    assert (var("x", 0, 3) < 2).where(a, a).simplify() is a


def test_max_by_range():
    a, b = var("a", 0, 3), var("b", 5, 9)
    assert a.maximum(b).simplify() is b
    assert b.maximum(a).simplify() is b
    assert is_const(a.maximum(c(-1)).simplify(), 0) is False
    assert a.maximum(c(-1)).simplify() is a


def test_bool_and_or():
    b = var("a", 0, 10) < 5
    assert (b & c(True, dtypes.bool)).simplify() is b
    assert is_const((b & c(False, dtypes.bool)).simplify(), False)
    assert (b | c(False, dtypes.bool)).simplify() is b
    assert is_const((b | c(True, dtypes.bool)).simplify(), True)


def test_simplify_is_idempotent_on_examples():
    a, b = var("a", 0, 10), var("b", -4, 4)
    for e in [(a * 4 + b) // 4, (a * 3 + b * 2 + 7) % 5, (a - b) * 3 + b * 3, (a + b).maximum(a * 2)]:
        s = e.simplify()
        assert s.simplify() is s


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


@settings(max_examples=120, deadline=None)
@given(case())
def test_simplify_keeps_values(cs):
    vs, e, (lo, hi), seed = cs
    check_case(vs, e, seed)


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


@settings(max_examples=120, deadline=None)
@given(case())
def test_simplify_is_idempotent(cs):
    _, e, _, _ = cs
    s = e.simplify()
    assert s.simplify() is s, f"{fmt(e)} -> {fmt(s)} -> {fmt(s.simplify())}"


def test_a_sum_is_rebuilt_once_while_it_lives(monkeypatch):
    """Every stage simplifies again: a sum met before is not rebuilt again (its canonical form is known). No // or %
    here, so only the like-terms rule builds sums."""
    import zeptograd.uop.symbolic as symbolic_module

    a, b = UOp.variable("a", 0, 7), UOp.variable("b", 0, 7)
    messy = (a * 2 + b) + (a * 3 + 5)
    splits = []
    real_build = symbolic_module.build_sum
    monkeypatch.setattr(symbolic_module, "build_sum", lambda *args: splits.append(args[2]) or real_build(*args))
    first = messy.simplify()
    n_first = len(splits)
    assert first is a * 5 + b + 5 and n_first > 0
    assert messy.simplify() is first and len(splits) == n_first  # nothing rebuilt the second time
    assert first.simplify() is first and len(splits) == n_first
