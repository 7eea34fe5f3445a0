"""The compiled matchers (uop/upat.py: _compile_rules): lazy binding, the order bindings are tried in, and the
agreement of compiled patterns with the eager reference matcher on random patterns and graphs."""

import random

import pytest

import zeptograd.uop.upat as upat
from tests.slow import fast_first
from zeptograd.dtype import dtypes
from zeptograd.helpers import Context
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat


def var(name="x", lo=0, hi=10):
    return UOp.variable(name, lo, hi)


def c(v, dtype=dtypes.int):
    return UOp.const(dtype, v)


def reference_match(p: UPat, u: UOp, store: dict) -> list[dict]:
    """Every binding, eagerly, in order: the matcher as it was before patterns were compiled."""
    if p.op is not None and u.op not in p.op:
        return []
    if p.dtype is not None and u.dtype not in p.dtype and u.dtype.scalar not in p.dtype:
        return []
    if p.arg is not None and u.arg != p.arg:
        return []
    if p.arg is not None and type(u.arg) is not type(p.arg) and not isinstance(p.arg, Ops):
        return []
    if p.custom is not None and not p.custom(u):
        return []
    if p.name is not None:
        if p.name in store and store[p.name] is not u:
            return []
        store = {**store, p.name: u}
    if p.src is None:
        return [store]
    if len(u.src) < len(p.src) or (len(u.src) != len(p.src) and not p.allow_any_len):
        return []
    orders = [p.src]
    if len(p.src) == 2 and p.op is not None and p.op <= GroupOp.Commutative:
        orders = [p.src, p.src[::-1]]
    out = []
    for order in orders:
        stores = [store]
        for q, s in zip(order, u.src):
            stores = [m for st in stores for m in reference_match(q, s, st)]
        out.extend(stores)
    return out


@pytest.fixture(autouse=True)
def compile_at_once(monkeypatch):
    """Rules compiled on an op's first rewrite (not after PatternMatcher's warm-up), so the tests see compiled code."""
    monkeypatch.setattr(upat, "COMPILE_AFTER", 1)


def test_rules_are_interpreted_until_an_op_was_rewritten_compile_after_times(monkeypatch):
    monkeypatch.setattr(upat, "COMPILE_AFTER", 3)
    x = var("x")
    pm = PatternMatcher([(UPat.var("a") + 0, lambda a: a)])
    assert pm.rewrite(x + 0) is x and isinstance(pm._by_op[Ops.ADD], upat._Warmup)
    assert pm.rewrite(x + 1) is None and isinstance(pm._by_op[Ops.ADD], upat._Warmup)
    assert pm.rewrite(c(0) + x) is x and not isinstance(pm._by_op[Ops.ADD], upat._Warmup)  # the third: compiled
    assert pm.rewrite(x + 0) is x and pm.rewrite(x + 1) is None


def test_commutative_pattern_matches_both_orders():
    x = var("x")
    seen = []

    def rule(k, y):
        seen.append((k, y))
        return y * k

    pm = PatternMatcher([(UPat.cvar("k") + UPat.var("y"), rule)])
    assert pm.rewrite(c(3) + x) is x * 3
    assert pm.rewrite(x + c(3)) is x * 3  # the swapped order binds k to the constant all the same
    assert seen == [(c(3), x), (c(3), x)]
    assert pm.rewrite(x + x) is None and len(seen) == 2  # neither order has a constant: the rule is not called


def test_rule_runs_on_the_first_binding_before_the_next_is_looked_for():
    """Lazy binding: the checks of the swapped order run only if the rule rejects the first binding."""
    x, y = var("x"), var("y")
    checked, calls = [], []

    def look(u):
        checked.append(u)
        return True

    def rule(a, b):
        calls.append((a, b))
        return a - b

    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat(name="a", custom=look), UPat(name="b"))), rule)])
    assert pm.rewrite(x + y) is x - y
    assert checked == [x] and calls == [(x, y)]  # the eager matcher checked both orders before the rule ran
    checked.clear()
    calls.clear()
    rejecting = PatternMatcher([(UPat(Ops.ADD, src=(UPat(name="a", custom=look), UPat(name="b"))), lambda a, b: None)])
    assert rejecting.rewrite(x + y) is None
    assert checked == [x, y]  # the rule said None to the first order: the second was tried


def test_failing_match_stops_at_the_first_failing_check():
    x, y = var("x"), var("y")
    checked, calls = [], []

    def look(u):
        checked.append(u)
        return True

    def rule(**kw):
        calls.append(kw)
        return c(0)

    # the first source must be a CONST: neither order of x + y has one, so the custom check of the other source
    # never runs, and the rule is never called
    pat = UPat(Ops.ADD, name="s", src=(UPat(Ops.CONST, name="k"), UPat(name="v", custom=look)))
    pm = PatternMatcher([(pat, rule)])
    assert pm.rewrite(x + y) is None
    assert checked == [] and calls == []
    # a failing op check at the root: nothing of the sources is looked at
    deep = UPat(Ops.MUL, src=(UPat(name="a", custom=look), UPat(name="b", custom=look)))
    assert not PatternMatcher([(deep, rule)]).rewrite(x + y) and checked == []
    assert pat.match(x + y, {}) == []


def test_rule_returning_its_node_is_no_rewrite_and_the_next_binding_is_tried():
    x, y = var("x"), var("y")
    got = []

    def rule(a, s):
        got.append(a)
        return s if a is x else a  # the node itself for the first order: try the swapped one

    pm = PatternMatcher([(UPat(Ops.ADD, name="s", src=(UPat.var("a"), UPat.var("b"))), lambda a, s, b: rule(a, s))])
    assert pm.rewrite(x + y) is y and got == [x, y]


def test_pattern_too_deep_to_compile_is_matched_by_the_interpreter():
    x = var("x")
    pat, u = UPat.var("leaf"), x
    for _ in range(120):  # 240 levels of indentation: more than Python compiles
        pat, u = UPat(Ops.NEG, src=(pat,)), UOp(Ops.NEG, dtypes.int, (u,))
    pm = PatternMatcher([(pat, lambda leaf: leaf)])
    assert pm.rewrite(u) is x
    assert pat.match(u, {}) == [{"leaf": x}]
    assert pm.rewrite(UOp(Ops.NEG, dtypes.int, (x,))) is None


def test_track_match_stats_counts_each_rule():
    x = var("x")

    def declines(a):
        return None

    def folds(a):
        return c(7)

    first, second = (UPat(Ops.ADD, name="a"), declines), (UPat(Ops.ADD, name="a"), folds)
    pm = PatternMatcher([first, second])
    upat.match_stats.clear()
    with Context(TRACK_MATCH_STATS=1):
        assert pm.rewrite(x + 1) is c(7)
    (tries_a, hits_a, _), (tries_b, hits_b, _) = [upat.match_stats[upat._rule_name(*r)] for r in (first, second)]
    assert (tries_a, hits_a, tries_b, hits_b) == (1, 0, 1, 1)
    upat.match_stats.clear()
    assert pm.rewrite(x + 1) is c(7) and not upat.match_stats  # off: nothing recorded


# ----------------------------------------------------------------------------- random patterns against the reference

LEAVES = [var("x"), var("y"), c(0), c(1), c(2), c(1.0, dtypes.float)]
BINARY = [Ops.ADD, Ops.MUL, Ops.SUB, Ops.MAX, Ops.IDIV]


def random_uop(rng: random.Random, depth: int) -> UOp:
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(LEAVES[:5])
    if rng.random() < 0.15:
        return UOp(Ops.NEG, dtypes.int, (random_uop(rng, depth - 1),))
    return UOp(rng.choice(BINARY), dtypes.int, (random_uop(rng, depth - 1), random_uop(rng, depth - 1)))


def random_upat(rng: random.Random, depth: int, names: str) -> UPat:
    name = rng.choice([None, None, *names])
    r = rng.random()
    if depth == 0 or r < 0.3:
        kind = rng.random()
        if kind < 0.3:
            return UPat.cvar(name)
        if kind < 0.4:
            return UPat(Ops.CONST, arg=rng.choice([0, 1, 1.0]), name=name)
        if kind < 0.5:
            return UPat(dtype=rng.choice([dtypes.int, dtypes.float]), name=name)
        if kind < 0.6:
            return UPat(name=name, custom=lambda u: u.op is not Ops.NEG)
        return UPat(name=name)
    if r < 0.4:
        return UPat(Ops.NEG, name=name, src=(random_upat(rng, depth - 1, names),))
    if r < 0.45:
        return UPat(name=name, src=(random_upat(rng, depth - 1, names),), allow_any_len=True)
    op = rng.choice([*BINARY, {Ops.ADD, Ops.MUL}, {Ops.ADD, Ops.SUB}])
    return UPat(op, name=name, src=(random_upat(rng, depth - 1, names), random_upat(rng, depth - 1, names)))


@pytest.mark.parametrize("seed", fast_first(range(4), 2))
def test_compiled_bindings_equal_the_reference_in_order(seed, monkeypatch):
    """Every binding, in the reference's order (the order a rule sees them), on random patterns and graphs."""
    rng = random.Random(seed)
    nodes = list(dict.fromkeys(u for _ in range(12) for u in random_uop(rng, 4).toposort()))
    n_matched = 0
    tried: list[dict] = []
    for _ in range(80):
        pat = random_upat(rng, 3, "abc")
        # the rule sees the bindings in that order: each call records one, the last one is taken. One matcher per
        # pattern for every node: compiled (an op's rules compiled at its first rewrite, then kept), and interpreted
        # (an op's first rewrites)
        matchers = {n: PatternMatcher([(pat, lambda **kw: tried.append(kw))]) for n in (1, 10**9)}
        for u in nodes:
            want = reference_match(pat, u, {})
            assert pat.match(u, {}) == want, (pat, u)
            n_matched += bool(want)
            for compile_after, pm in matchers.items():
                monkeypatch.setattr(upat, "COMPILE_AFTER", compile_after)
                tried.clear()
                assert pm.rewrite(u) is None
                assert tried == want, (pat, u, compile_after)
    assert n_matched > 50  # the random patterns do match often enough to compare orders


def test_both_sources_with_several_bindings_keep_the_reference_order():
    """Each source of a commutative node holds a commutative node: the swapped order visits its sources in sequence."""
    x, y = var("x"), var("y")
    side = UPat(Ops.ADD, src=(UPat(name="a"), UPat(name="b")))
    pat = UPat(Ops.MUL, src=(side, UPat(Ops.MUL, src=(UPat(name="c"), UPat(name="d")))))
    u = (x + y) * (y * x)
    tried = []
    PatternMatcher([(pat, lambda **kw: tried.append(kw))]).rewrite(u)
    assert tried == reference_match(pat, u, {}) and len(tried) == 4
    swapped = (y * x) * (x + y)
    assert pat.match(swapped, {}) == reference_match(pat, swapped, {}) and len(reference_match(pat, swapped, {})) == 4
