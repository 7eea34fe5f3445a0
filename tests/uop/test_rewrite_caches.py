"""The rewrite engine's caches: UOp interning, symbolic's remembered fixed points and simplify's memo. Each must give
exactly what the uncached computation gives, forget what died, and hold up under threads sharing it."""

import gc
import threading

from zeptograd.dtype import dtypes
from zeptograd.uop import ops, symbolic
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import simplify
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, rewrite_steps


def _index_expr(n: int, k: int = 3) -> UOp:
    r = UOp.range(n, 0, AxisType.LOOP)
    return ((r * k + 1) // k) * 4 + (r % 2) * 0 + UOp.const(dtypes.index, n)


def _fresh_expr(tag: int) -> UOp:
    """An expression no other test built (its constants are new): nothing about it is cached yet."""
    r = UOp.range(1000 + tag, 7, AxisType.LOOP)
    return (r + 3 * tag) * 2 + (r + 3 * tag) * 5 - UOp.const(dtypes.index, tag)


def test_interning_forgets_dead_nodes_and_builds_them_again():
    key_arg = ("test_interning_forgets", 12345)
    u = UOp(Ops.DEFINE_VAR, dtypes.index, (), key_arg)
    key = (Ops.DEFINE_VAR, dtypes.index, (), key_arg)
    assert ops._uop_cache[key]() is u and UOp(Ops.DEFINE_VAR, dtypes.index, (), key_arg) is u
    del u
    gc.collect()
    assert key not in ops._uop_cache  # the dead node's entry is gone, not left as a dead reference
    v = UOp(Ops.DEFINE_VAR, dtypes.index, (), key_arg)
    assert ops._uop_cache[key]() is v


def test_interning_keeps_nan_and_signed_zero_apart():
    nan1, nan2 = UOp.const(dtypes.float32, float("nan")), UOp.const(dtypes.float32, float("nan"))
    assert nan1 is nan2
    assert UOp.const(dtypes.float32, -0.0) is not UOp.const(dtypes.float32, 0.0)
    assert UOp.const(dtypes.float32, 1.0) is not UOp.const(dtypes.int32, 1)


def test_interning_from_threads_publishes_one_node():
    barrier, got = threading.Barrier(8), []

    def build():
        barrier.wait()
        got.append(UOp(Ops.DEFINE_VAR, dtypes.index, (), ("test_interning_threads", 1, 2)))

    threads = [threading.Thread(target=build) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(g is got[0] for g in got)


def test_simplify_memo_equals_the_rewrite():
    for n in (4, 7, 64):
        e = _index_expr(n)
        assert simplify(e) is graph_rewrite(e, symbolic.symbolic) is e.simplify()
        assert simplify(e) is simplify(e)


def test_simplify_memo_keeps_nothing_alive():
    e = _fresh_expr(1)
    r = simplify(e)
    assert e in symbolic._simplified
    n = len(symbolic._simplified)
    del e, r
    gc.collect()
    assert len(symbolic._simplified) < n  # the entry went with its expression


def test_fixed_points_skip_walks_without_changing_results():
    e = _fresh_expr(2)
    before = rewrite_steps[0]
    first = graph_rewrite(e, symbolic.symbolic)
    steps_first = rewrite_steps[0] - before
    assert first in symbolic.symbolic.fixed_points
    before = rewrite_steps[0]
    assert graph_rewrite(first, symbolic.symbolic) is first
    assert rewrite_steps[0] == before  # a known fixed point: not walked at all
    bigger = first * 3 + 1  # a new node on top of a simplified graph: only the new nodes are visited
    before = rewrite_steps[0]
    graph_rewrite(bigger, symbolic.symbolic)
    assert 0 < rewrite_steps[0] - before < steps_first
    assert symbolic.symbolic.fixed_points is not None


def test_fixed_points_only_for_pure_matchers():
    calls = []

    def count(x):  # a rule with a side effect: its matcher is not declared pure, so every node is matched again
        calls.append(x)

    pm = PatternMatcher([(UPat(Ops.ADD, name="x"), count)])
    assert pm.fixed_points is None
    e = _fresh_expr(3)
    graph_rewrite(e, pm)
    n = len(calls)
    graph_rewrite(e, pm)
    assert len(calls) == 2 * n > 0
    with_ctx = symbolic.symbolic  # a ctx turns the memo off too: rules may read it
    f = _fresh_expr(4)
    graph_rewrite(f, with_ctx, ctx=object())
    assert f not in with_ctx.fixed_points


def test_fixed_points_forget_dead_nodes():
    e = _fresh_expr(5)
    graph_rewrite(e, symbolic.symbolic)
    n = len(symbolic.symbolic.fixed_points)
    del e
    gc.collect()
    assert len(symbolic.symbolic.fixed_points) < n


def test_simplify_from_threads_agrees():
    exprs = [_fresh_expr(10 + i) for i in range(6)]
    expected = [graph_rewrite(e, PatternMatcher(symbolic.symbolic.rules)) for e in exprs]  # a fresh matcher: no memo
    barrier, errors = threading.Barrier(4), []

    def work():
        barrier.wait()
        for _ in range(5):  # ~50 ms of rewrites per thread: many switches of the interpreter's 5 ms interval
            for e, want in zip(exprs, expected):
                if simplify(e) is not want or graph_rewrite(e * 2, symbolic.symbolic) is not simplify(e * 2):
                    errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_sums_remembered_as_canonical_rebuild_to_themselves():
    from zeptograd.uop.symbolic import _like_terms_done, build_sum, fold_like_terms, split_sum

    r0, r1 = UOp.range(50, 20, AxisType.LOOP), UOp.range(60, 21, AxisType.LOOP)
    inner = r0 + r1 * 3
    exprs = [
        (r0 + 7) * 2 + r1 + (r0 + 7) * 5 + 11,
        inner * 2 + r0 + inner * (-1),  # inner's coefficients merge to 1: a term that is itself a sum
        (r0 * 3) * 2 + r1 * 2 + (r0 * 3) * (-1) + 1,  # a merged coefficient of 1 on a scaled node
        r0 * (2**31 - 1) + r1 * (2**31 - 1) + (2**31 - 1),  # coefficients near the index dtype's edge
    ]
    for e in exprs:
        fold_like_terms(e)  # on the sums as built: their terms are not simplified first
        simplify(e)
    canonical = [u for u, v in list(_like_terms_done.items()) if v is None]
    assert canonical
    for p in canonical:
        terms, const = split_sum(p)
        assert build_sum(terms, const, p) is p, p
