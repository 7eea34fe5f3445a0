"""The UOp IR and the rewrite engine: interning, graph walks, UPat matching, PatternMatcher and graph_rewrite."""

import gc
import inspect
import math

import pytest

import zeptograd.uop.upat as upat
from zeptograd.dtype import dtypes
from zeptograd.helpers import Context
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_substitute

CHAIN_LEN = 100_000


def var(name="x", lo=0, hi=10):
    return UOp.variable(name, lo, hi)


def c(v, dtype=dtypes.int):
    return UOp.const(dtype, v)


# ----------------------------------------------------------------------------- interning


def test_interning_equal_uops_are_the_same_object():
    assert c(3) is c(3)
    assert var("x", 0, 10) is var("x", 0, 10)
    x, y = var("x"), var("y")
    assert x + y is x + y
    assert UOp(Ops.ADD, dtypes.int, (x, y)) is x + y
    assert (x * 2 + y) // 4 is (x * 2 + y) // 4
    assert UOp(Ops.GROUP, dtypes.void, (), ("a", 1)) is UOp(Ops.GROUP, dtypes.void, (), ("a", 1))


@pytest.mark.slow
def test_interning_is_weak():
    # the intern table does not keep dead graphs alive, and a rebuilt node is again one object
    import weakref

    x = var("x")
    r = weakref.ref(x * 12345 + 678)
    gc.collect()
    assert r() is None
    assert x * 12345 + 678 is x * 12345 + 678


def test_interning_different_arg_dtype_src_are_different():
    x, y = var("x"), var("y")
    assert c(3) is not c(4)
    assert c(3) is not c(3, dtypes.int64)
    assert c(3) is not c(3.0, dtypes.float)
    assert c(1, dtypes.bool) is not c(1)
    assert var("x", 0, 10) is not var("x", 0, 11)
    assert var("x", 0, 10) is not var("y", 0, 10)
    assert x + y is not y + x  # source order is part of the identity
    assert x + y is not x * y
    assert UOp(Ops.ADD, dtypes.int, (x, y)) is not UOp(Ops.ADD, dtypes.int64, (x, y))
    assert UOp.range(4, 0) is not UOp.range(4, 1)
    assert UOp.range(4, 0) is not UOp.range(5, 0)


def test_interning_negative_zero_is_not_positive_zero():
    # -0.0 == 0.0 in Python, but they are different float constants (1/-0.0 is -inf): they must not be merged
    neg = UOp.const(dtypes.float, -0.0)
    pos = UOp.const(dtypes.float, 0.0)
    assert math.copysign(1.0, neg.arg) == -1.0
    assert math.copysign(1.0, pos.arg) == 1.0, "UOp.const(float, 0.0) returned the interned -0.0 constant"
    assert neg is not pos


def test_interning_nan_constant():
    # a nan constant is one value; building it twice should give the same node like every other constant
    a = UOp.const(dtypes.float, math.nan)
    b = UOp.const(dtypes.float, math.nan)
    assert math.isnan(a.arg) and math.isnan(b.arg)
    assert a is b


def test_float32_constants_round_as_numpy():
    """A float32 constant holds numpy's float32 of the value (dtype.truncate rounds through struct, numpy past the
    range): random doubles of every exponent, the range's edges, subnormals, signed zeros, inf and nan."""
    import random
    import struct

    import numpy as np

    from zeptograd.dtype import truncate

    rng = random.Random(0)
    edges = [0.0, -0.0, 1e-46, -1e-46, 1.4e-45, 3.4028235e38, 3.40282357e38, 3.402823669e38, 3.5e38, -3.5e38, 1e308]
    edges += [math.inf, -math.inf, math.nan, 2**128, 0.1, 1 / 3, 2**24 + 1, -(2**31)]
    bits = [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0] for _ in range(20000)]
    for x in edges + bits:
        with np.errstate(over="ignore"):
            want = float(np.float32(float(x)))
        got = truncate(dtypes.float32, x)
        assert struct.pack("f", got) == struct.pack("f", want) or (math.isnan(got) and math.isnan(want)), x


def test_unhashable_arg_is_rejected():
    with pytest.raises(TypeError):
        UOp(Ops.GROUP, dtypes.void, (), [1, 2])


# ----------------------------------------------------------------------------- immutability


def snapshot(u):
    return [(n.op, n.dtype, n.src, n.arg) for n in u.toposort()]


def test_uops_are_hashable_dict_keys():
    x, y = var("x"), var("y")
    d = {x + y: 1, x * y: 2}
    assert d[x + y] == 1 and d[x * y] == 2


def test_operations_do_not_mutate_their_inputs():
    x, y = var("x"), var("y")
    e = (x * 2 + y * 3 + 0) * 1 - x
    before = snapshot(e)
    vr = e.vrange
    s = e.simplify()
    sub = e.substitute({x: c(5)})
    rep = e.replace(op=Ops.MUL)
    rw = graph_rewrite(e, PatternMatcher([(UPat(Ops.CONST, arg=2), lambda: c(20))]))
    assert snapshot(e) == before
    assert e.vrange == vr
    for out in (s, sub, rep, rw):
        assert out is not e
    assert rep.op is Ops.MUL and rep.src is e.src
    assert e.replace() is e
    assert e.replace(op=Ops.SUB) is e  # e is already a SUB: same fields, the same interned node
    assert (x + 1).replace(src=(y, c(1))) is y + 1


def test_replace_and_substitute_keep_identity_when_nothing_changes():
    x, y, z = var("x"), var("y"), var("z")
    e = x * 2 + y
    assert e.substitute({z: c(1)}) is e
    assert e.substitute({}) is e
    assert e.substitute({y: z}) is x * 2 + z


# ----------------------------------------------------------------------------- toposort


def assert_topo_order(u):
    order = list(u.toposort())
    pos = {n: i for i, n in enumerate(order)}
    assert len(pos) == len(order), "a node appears twice"
    for n in order:
        for s in n.src:
            assert pos[s] < pos[n], f"source {s.op} after its user {n.op}"
    assert order[-1] is u
    return order


def test_toposort_sources_before_users():
    x, y = var("x"), var("y")
    shared = x * y
    e = (shared + x) * (shared - y) + shared // 3
    order = assert_topo_order(e)
    assert set(order) == {x, y, shared, shared + x, shared - y, (shared + x) * (shared - y), c(3), shared // 3, e}
    assert order.count(shared) == 1


def test_toposort_gate_stops_descent():
    x, y = var("x"), var("y")
    inner = x + y
    e = inner * 2
    order = e.toposort(gate=lambda u: u is not inner)
    assert inner in order and x not in order and y not in order


def test_toposort_stops_are_the_gate_without_its_calls():
    """toposort(stops=s) lists what toposort(gate=lambda u: u not in s) lists, in the same order (the root too)."""
    x, y = var("x"), var("y")
    shared = x * y
    e = (shared + x) * (shared - y) + shared // 3
    for stops in ({shared}, {x, shared - y}, {e}, set()):
        assert list(e.toposort(stops=stops)) == list(e.toposort(gate=lambda u: u not in stops))
    assert list(e.toposort(stops={shared})) == list(e.toposort(gate=lambda u: u is not shared, stops=set()))


def make_chain(n=CHAIN_LEN):
    x = var("x", 0, 10)
    one = c(1)
    u = x
    for _ in range(n):
        u = UOp(Ops.ADD, dtypes.int, (u, one))
    return x, one, u


@pytest.fixture(scope="module")
def chain():
    return make_chain()


@pytest.mark.slow
def test_deep_chain_toposort(chain):
    x, one, u = chain
    order = list(u.toposort())
    assert len(order) == CHAIN_LEN + 2
    assert order[0] is x and order[1] is one and order[-1] is u
    # every ADD is after the previous one
    assert all(order[i].src[0] is order[i - 1] for i in range(3, len(order)))


@pytest.mark.slow
def test_deep_chain_vmin_vmax(chain):
    _, _, u = chain
    assert u.vmin == CHAIN_LEN and u.vmax == CHAIN_LEN + 10


@pytest.mark.slow
def test_deep_chain_graph_rewrite(chain):
    x, one, u = chain
    two = c(2)
    pm = PatternMatcher([(UPat(Ops.CONST, arg=1, name="k"), lambda k: two)])
    out = graph_rewrite(u, pm)
    assert out is not u
    n, depth = out, 0
    while n.op is Ops.ADD:
        assert n.src[1] is two
        n, depth = n.src[0], depth + 1
    assert n is x and depth == CHAIN_LEN
    out_bu = graph_rewrite(u, pm, bottom_up=True)
    assert out_bu is out


@pytest.mark.slow
def test_deep_chain_graph_substitute(chain):
    x, one, u = chain
    y = var("y", 0, 3)
    out = graph_substitute(u, {x: y})
    assert out is not u
    assert out.vmin == CHAIN_LEN and out.vmax == CHAIN_LEN + 3
    n = out
    for _ in range(CHAIN_LEN):
        n = n.src[0]
    assert n is y
    assert u.substitute({x: y}) is out


@pytest.mark.slow
def test_deep_chain_graph_rewrite_noop_returns_same(chain):
    _, _, u = chain
    pm = PatternMatcher([(UPat(Ops.MUL, name="m"), lambda m: None)])
    assert graph_rewrite(u, pm) is u


# ----------------------------------------------------------------------------- UPat matching


def matches(pat, u):
    return pat.match(u, {})


def test_upat_by_op_and_op_set():
    x, y = var("x"), var("y")
    assert matches(UPat(Ops.ADD), x + y)
    assert not matches(UPat(Ops.MUL), x + y)
    assert matches(UPat({Ops.ADD, Ops.MUL}), x * y)
    assert matches(UPat((Ops.ADD, Ops.MUL)), x + y)
    assert not matches(UPat({Ops.ADD, Ops.MUL}), x // y)
    assert matches(UPat(), x // y)  # no op: anything


def test_upat_by_dtype():
    x = var("x")
    f = UOp(Ops.DEFINE_VAR, dtypes.float, (), ("f", 0, 1))
    assert matches(UPat(dtype=dtypes.int), x)
    assert not matches(UPat(dtype=dtypes.float), x)
    assert matches(UPat(dtype={dtypes.float, dtypes.half}), f)
    assert not matches(UPat(dtype={dtypes.int64, dtypes.half}), x)
    assert matches(UPat.var("b", dtypes.bool), x < 3)
    assert not matches(UPat.var("b", dtypes.bool), x + 3)


def test_upat_by_arg():
    assert matches(UPat(Ops.CONST, arg=3), c(3))
    assert not matches(UPat(Ops.CONST, arg=3), c(4))
    assert matches(UPat.const(dtypes.int, 3), c(3))
    assert not matches(UPat.const(dtypes.int, 3), c(3, dtypes.int64))
    # 1 == 1.0 == True, but a pattern's constant names one value of one type
    assert not matches(UPat(Ops.CONST, arg=1), c(1.0, dtypes.float))
    assert not matches(UPat(Ops.CONST, arg=1), c(True, dtypes.bool))
    assert matches(UPat(Ops.CONST, arg=1.0), c(1.0, dtypes.float))
    r = UOp.range(8, 2)
    assert matches(UPat(Ops.RANGE, arg=r.arg), r)
    assert not matches(UPat(Ops.RANGE, arg=UOp.range(8, 3).arg), r)


def test_upat_named_bindings():
    x, y = var("x"), var("y")
    pat = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b")), name="s")
    (store,) = matches(UPat(Ops.SUB, src=(UPat.var("a"), UPat.var("b")), name="s"), x - y)
    assert store == {"a": x, "b": y, "s": x - y}
    stores = matches(pat, x + y)
    assert {"a": x, "b": y, "s": x + y} in stores
    # the same name must bind the same node
    same = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
    assert matches(same, x + x) and all(st == {"a": x} for st in matches(same, x + x))
    assert not matches(same, x + y)
    deep = UPat(Ops.MUL, src=(UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), UPat.var("a")))
    assert matches(deep, (x + y) * x)
    assert matches(deep, (x + y) * y)  # ADD is commutative: a may bind y
    assert not matches(deep, (x + y) * c(2))


def test_upat_src_length_and_allow_any_len():
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float.ptr(16), (), 0)
    i, v = var("i", 0, 15), var("i", 0, 15) < 8
    two, three = buf.index(i), buf.index(i, v)
    pat = UPat(Ops.INDEX, src=(UPat.var("b"), UPat.var("i")))
    anylen = UPat(Ops.INDEX, src=(UPat.var("b"), UPat.var("i")), allow_any_len=True)
    assert matches(pat, two)
    assert not matches(pat, three)
    assert matches(anylen, two)
    (store,) = matches(anylen, three)
    assert store == {"b": buf, "i": i}
    # a UOp with fewer sources than the pattern never matches
    assert not matches(UPat(Ops.INDEX, src=(UPat(), UPat(), UPat()), allow_any_len=True), two)


def test_upat_commutative_tries_both_orders():
    x = var("x")
    pat = UPat.cvar("c") + UPat.var("x")
    stores = matches(pat, x + 3)
    assert {"c": c(3), "x": x} in stores
    assert {"c": c(3), "x": x} in matches(pat, c(3) + x)
    pm = PatternMatcher([(UPat.cvar("k") * UPat.var("y"), lambda k, y: y + k)])
    assert graph_rewrite(x * 3, pm) is x + 3
    assert graph_rewrite(c(3) * x, pm) is x + 3
    # commutative comparisons too
    assert matches(UPat(Ops.CMPNE, src=(UPat.cvar("c"), UPat.var("x"))), x.ne(3))


def test_upat_non_commutative_not_swapped():
    x = var("x")
    for op in (Ops.SUB, Ops.IDIV, Ops.MOD, Ops.CMPLT):
        pat = UPat(op, src=(UPat.cvar("c"), UPat.var("x")))
        u = UOp(op, dtypes.bool if op is Ops.CMPLT else dtypes.int, (x, c(3)))
        assert not matches(pat, u), op
        assert matches(pat, UOp(op, u.dtype, (c(3), x))), op


def test_upat_custom():
    x = var("x")
    pat = UPat(Ops.CONST, name="k", custom=lambda u: u.arg > 2)
    assert matches(pat, c(3)) and not matches(pat, c(2)) and not matches(pat, x)


def test_upat_named_copy():
    p = UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k")))
    q = p.named("s")
    x = var("x")
    assert {"a": x, "k": c(1), "s": x + 1} in matches(q, x + 1)
    assert p.name is None


# ----------------------------------------------------------------------------- PatternMatcher / graph_rewrite


def test_pattern_matcher_rule_order_first_wins():
    x = var("x")
    pm = PatternMatcher(
        [
            (UPat(Ops.ADD, name="a"), lambda a: c(1)),
            (UPat(Ops.ADD, name="a"), lambda a: c(2)),
        ]
    )
    assert pm.rewrite(x + 1) is c(1)
    assert pm.rewrite(x * 1) is None


def test_pattern_matcher_ctx():
    x, y = var("x"), var("y")
    seen = []

    def log(ctx, v):
        ctx.append(v)
        return None

    pm = PatternMatcher(
        [
            (UPat(Ops.DEFINE_VAR, name="v"), log),
            (UPat(Ops.MUL, src=(UPat.var("a"), UPat.var("b"))), lambda a, b: a + b),  # no ctx: not passed one
        ]
    )
    out = graph_rewrite(x * y, pm, ctx=seen)
    assert out is x + y
    assert set(seen) == {x, y}

    vals = {"x": 7}
    subst = PatternMatcher(
        [(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: c(ctx[v.arg[0]]) if v.arg[0] in ctx else None)]
    )
    assert graph_rewrite(x + y, subst, ctx=vals) is c(7) + y
    assert graph_rewrite(x + y, subst, ctx={}) is x + y


def test_graph_rewrite_rule_returning_none_leaves_node():
    x = var("x")
    calls = []
    pm = PatternMatcher([(UPat(Ops.ADD, name="a"), lambda a: calls.append(a))])
    e = (x + 1) * (x + 2)
    assert graph_rewrite(e, pm) is e
    assert graph_rewrite(e, pm, bottom_up=True) is e
    assert set(calls) == {x + 1, x + 2}


def test_graph_rewrite_reaches_fixed_point():
    x = var("x")
    pm = PatternMatcher(
        [
            (UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(dtypes.int, 2))), lambda a: a + a),
            (UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a"))), lambda a: UOp(Ops.SHL, a.dtype, (a, c(1)))),
        ]
    )
    shl = UOp(Ops.SHL, dtypes.int, (x, c(1)))
    assert graph_rewrite(x * 2, pm) is shl
    assert graph_rewrite(x * 2, pm, bottom_up=True) is shl
    # a rewrite creates a node whose new parent then matches: ((x*2)*2) -> (x<<1)*2 -> ... -> (x<<1)<<1
    assert graph_rewrite((x * 2) * 2, pm) is UOp(Ops.SHL, dtypes.int, (shl, c(1)))

    # a counter that counts down to 0, one step per rewrite
    count = PatternMatcher(
        [(UPat(Ops.GROUP, name="n"), lambda n: UOp(Ops.GROUP, dtypes.void, (), n.arg - 1) if n.arg > 0 else None)]
    )
    start = UOp(Ops.GROUP, dtypes.void, (), 50)
    assert graph_rewrite(start, count) is UOp(Ops.GROUP, dtypes.void, (), 0)
    sink = UOp(Ops.SINK, dtypes.void, (start, UOp(Ops.GROUP, dtypes.void, (), 3)))
    zero = UOp(Ops.GROUP, dtypes.void, (), 0)
    assert graph_rewrite(sink, count) is UOp(Ops.SINK, dtypes.void, (zero, zero))
    assert graph_rewrite(sink, count, bottom_up=True) is UOp(Ops.SINK, dtypes.void, (zero, zero))


def test_graph_rewrite_fixed_point_when_parent_rule_enabled_by_child_rewrite():
    x = var("x")
    # x + 0 -> x; then the parent (x) * 3 can only match after its source was rewritten
    pm = PatternMatcher(
        [
            (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(dtypes.int, 0))), lambda a: a),
            (
                UPat(Ops.MUL, src=(UPat(Ops.DEFINE_VAR, name="v"), UPat.cvar("k"))),
                lambda v, k: UOp(Ops.SHL, v.dtype, (v, k)),
            ),
        ]
    )
    want = UOp(Ops.SHL, dtypes.int, (x, c(3)))
    assert graph_rewrite((x + 0) * 3, pm) is want
    assert graph_rewrite((x + 0) * 3, pm, bottom_up=True) is want


def test_graph_rewrite_top_down_vs_bottom_up():
    x, y = var("x"), var("y")
    marker = c(999)
    seen_mul_src = []

    def on_mul(ctx, m, a):
        ctx.append(a)
        return marker

    pm = PatternMatcher(
        [
            (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(dtypes.int, 0))), lambda a: a),
            (UPat(Ops.MUL, name="m", src=(UPat(Ops.ADD, name="a"), UPat.var())), on_mul),
        ]
    )
    e = (x + 0) * y
    # default: sources first, so the MUL sees x (not the ADD) and its rule cannot match
    assert graph_rewrite(e, pm, ctx=seen_mul_src) is x * y
    assert seen_mul_src == []
    # bottom_up: the MUL is matched before its sources are visited, so it sees the original ADD
    assert graph_rewrite(e, pm, ctx=seen_mul_src, bottom_up=True) is marker
    assert seen_mul_src == [x + 0]


def test_graph_rewrite_shared_nodes_rewritten_once():
    x = var("x")
    calls = []

    def f(a):
        calls.append(a)
        return UOp(Ops.SHL, a.dtype, (a, c(1))) if a.op is Ops.DEFINE_VAR else None

    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("a"), UPat.const(dtypes.int, 2))), f)])
    shared = x * 2
    e = (shared + shared) * shared
    out = graph_rewrite(e, pm)
    s = UOp(Ops.SHL, dtypes.int, (x, c(1)))
    assert out is (s + s) * s
    assert calls.count(x) == 1


def test_rewrite_steps_counter():
    x, one, u = make_chain(1000)
    pm = PatternMatcher([(UPat(Ops.CONST, arg=1), lambda: c(2))])
    before = upat.rewrite_steps[0]
    graph_rewrite(u, pm)
    steps = upat.rewrite_steps[0] - before
    assert 1000 <= steps <= 10 * 1000


# ----------------------------------------------------------------------------- TRACK_MATCH_STATS


def _stats_key(fn):
    line = inspect.getsourcelines(fn)[1]
    keys = [k for k in upat.match_stats if k.endswith(f"test_uop.py:{line}")]
    return keys[0] if keys else f"test_uop.py:{line}"


def test_track_match_stats():
    x, y = var("x"), var("y")
    drop_zero = lambda a: a  # noqa: E731
    never = lambda m: None  # noqa: E731
    pm = PatternMatcher(
        [
            (UPat(Ops.ADD, src=(UPat.var("a"), UPat.const(dtypes.int, 0))), drop_zero),
            (UPat(Ops.MUL, name="m"), never),
        ]
    )
    k_drop, k_never = _stats_key(drop_zero), _stats_key(never)
    assert k_drop != k_never

    def get(k):
        return list(upat.match_stats[k]) if k in upat.match_stats else [0, 0, 0.0]

    # off: nothing recorded
    d0, n0 = get(k_drop), get(k_never)
    assert graph_rewrite((x + 0) * y, pm) is x * y
    assert get(k_drop)[:2] == d0[:2] and get(k_never)[:2] == n0[:2]

    with Context(TRACK_MATCH_STATS=1):
        assert graph_rewrite((x + 0) * y + (y + 0), pm) is x * y + y
    d1, n1 = get(k_drop), get(k_never)
    # the ADD rule matched x+0 and y+0 and was also tried (without a match) on the outer sums
    assert d1[1] - d0[1] == 2
    assert d1[0] - d0[0] >= 3
    assert d1[0] - d0[0] >= d1[1] - d0[1]
    # the MUL rule was tried but never matched
    assert n1[0] - n0[0] >= 1
    assert n1[1] - n0[1] == 0
    assert d1[2] >= d0[2] and n1[2] >= n0[2]

    # and off again after the block
    graph_rewrite((x + 0) * y + 5, pm)
    assert get(k_drop)[:2] == d1[:2]


def test_equal_uops_built_by_threads_at_once_are_one_object():
    """Interning is atomic: threads building the same new UOps at the same time all get the same objects (a lost
    race would leave two objects for one node, and every `is` comparison of the IR would miss)."""
    import sys
    import threading

    n, threads = 20000, 4
    results: list[list] = [[] for _ in range(threads)]
    barrier = threading.Barrier(threads)

    def build(t: int):
        barrier.wait()
        results[t] = [UOp(Ops.CONST, dtypes.int, (), 987_000_000 + i) for i in range(n)]

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows in most runs without the lock
    try:
        workers = [threading.Thread(target=build, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(old)
    assert all(results[t][i] is results[0][i] for t in range(1, threads) for i in range(n))
