"""The range rewrites (codegen/simplify.py): each rule's kernel graph before and after, the same values on a
small interpreter of kernel graphs (random inputs, including out-of-range indices), and values through Tensor."""

import itertools
import random

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.simplify import pm_flatten_range, reduce_collapse, reduce_unparented, simplify_ranges
from zeptograd.device import Device
from zeptograd.dtype import dtypes, truncate
from zeptograd.uop.ops import AxisType, Ops, UOp, exec_alu
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite

f32, i32 = dtypes.float32, dtypes.int32
LOOP, RED = AxisType.LOOP, AxisType.REDUCE

# ***** a tiny interpreter of kernel graphs, on zeptograd's Python semantics (exec_alu) *****


def run_kernel(sink: UOp, bufs: dict[int, list]) -> dict[int, list]:
    """Runs SINK(END(STORE(INDEX(...), value), *ranges)) over python lists; out-of-bounds loads/stores raise."""
    bufs = {k: list(v) for k, v in bufs.items()}
    cache: dict = {}

    def ev(u: UOp, env: dict):
        key = (u, tuple(sorted((r.arg[0], v) for r, v in env.items())))
        if key in cache:
            return cache[key]
        op, src = u.op, u.src
        if op is Ops.CONST:
            ret = u.arg
        elif op is Ops.RANGE:
            ret = env[u]
        elif op is Ops.DEFINE_GLOBAL:
            ret = u.arg
        elif op is Ops.INDEX:
            ret = (ev(src[0], env), ev(src[1], env), ev(src[2], env) if len(src) == 3 else True)
        elif op is Ops.LOAD:
            slot, i, valid = ev(src[0], env)
            if valid and not 0 <= i < len(bufs[slot]):
                raise IndexError(f"load of element {i} of buffer {slot}")
            ret = bufs[slot][i] if valid else truncate(u.dtype, 0)
        elif op in (Ops.REDUCE, Ops.END):
            acc = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: dtypes.min(u.dtype)}.get(u.arg)
            for vals in itertools.product(*[range(r.src[0].arg) for r in src[1:]]):
                v = ev(src[0], {**env, **dict(zip(src[1:], vals))})
                acc = exec_alu(u.arg, u.dtype, [acc, v]) if op is Ops.REDUCE else None
            ret = acc
        elif op is Ops.STORE:
            slot, i, valid = ev(src[0], env)
            if valid:
                assert 0 <= i < len(bufs[slot]), f"store to element {i}"
                bufs[slot][i] = truncate(src[0].dtype.base, ev(src[1], env))
            ret = None
        elif op is Ops.SINK:
            ret = [ev(s, env) for s in src]
        else:
            ret = exec_alu(op, u.dtype, [ev(s, env) for s in src])
        cache[key] = ret
        return ret

    ev(sink, {})
    return bufs


def assert_same_values(before: UOp, after: UOp, make_bufs, trials: int = 15, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(trials):
        bufs = make_bufs(rng)
        assert run_kernel(before, bufs)[0] == run_kernel(after, bufs)[0], bufs


# ***** building kernel graphs *****


def glob(slot: int, dt, n: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dt.ptr(n), (), slot)


def red(body: UOp, *ranges: UOp, op: Ops = Ops.ADD) -> UOp:
    return UOp(Ops.REDUCE, body.dtype, (body, *ranges), op)


def c(v, dt=i32) -> UOp:
    return UOp.const(dt, v)


def kernel(value: UOp, *loops: UOp) -> UOp:
    """out[flat(loops)] = value, over the loops"""
    n, idx = 1, c(0)
    for r in reversed(loops):
        idx = idx + r * n
        n *= r.src[0].arg
    return glob(0, value.dtype, n).index(idx).store(value).end(*loops).sink()


def rewrite(ast: UOp) -> UOp:
    return simplify_ranges(graph_rewrite(ast, symbolic))


def ops_of(u: UOp) -> list[Ops]:
    return [x.op for x in u.toposort()]


def ranges_of(u: UOp) -> list[UOp]:
    return sorted((x for x in u.toposort() if x.op is Ops.RANGE), key=lambda r: r.arg[0])


def halves(rng, n):  # floats whose sums are exact: closed forms and loops agree bit for bit
    return [rng.randint(-8, 8) * 0.5 for _ in range(n)]


def ints(rng, n, lo=-20, hi=20):
    return [rng.randint(lo, hi) for _ in range(n)]


def the_kernel(t: Tensor) -> UOp:
    (item,) = t.schedule()
    return item.ast


# ***** flattening *****


def test_flatten_nested_end():
    r0, r1 = UOp.range(3, 0), UOp.range(4, 1)
    x = glob(1, f32, 12)
    store = glob(0, f32, 12).index(r0 * 4 + r1).store(x.index(r0 * 4 + r1).load() * c(2.0, f32))
    before = store.end(r1).end(r0).sink()
    flat = graph_rewrite(before, pm_flatten_range)
    (end,) = [u for u in flat.toposort() if u.op is Ops.END]
    assert end.src[1:] == (r0, r1) and end.src[0] is store  # END(END(x, r1), r0) -> END(x, r0, r1)
    assert_same_values(before, flat, lambda rng: {0: [0.0] * 12, 1: halves(rng, 12)}, trials=2)
    assert_same_values(before, rewrite(before), lambda rng: {0: [0.0] * 12, 1: halves(rng, 12)}, trials=2)


def test_flatten_range_list_of_expressions():
    r0, r1 = UOp.range(3, 0), UOp.range(4, 1)
    store = glob(0, i32, 12).index(r0 * 4 + r1).store(r1 + r0)
    before = UOp(Ops.END, dtypes.void, (store, r1 * 4 + r0)).sink()
    end = next(u for u in graph_rewrite(before, pm_flatten_range).toposort() if u.op is Ops.END)
    assert end.src[1:] == (r0, r1)  # the ranges of the expression, by axis id (the linearizer's nesting order)


# ***** range splitting *****


def test_split_range_mod():
    r = UOp.range(12, 0)
    x = glob(1, f32, 12)
    before = kernel(x.index((r % 3) * 4 + r // 3).load(), r)
    after = rewrite(before)
    assert Ops.MOD in ops_of(before) and Ops.IDIV in ops_of(before)
    assert Ops.MOD not in ops_of(after) and Ops.IDIV not in ops_of(after)
    outer, inner = ranges_of(after)
    assert (outer.src[0].arg, outer.arg) == (4, (0, LOOP))  # RANGE(12) -> RANGE(4)*3 + RANGE(3): outer keeps id 0
    assert (inner.src[0].arg, inner.arg) == (3, (1, LOOP))  # the inner part: a fresh id
    load_idx = next(u for u in after.toposort() if u.op is Ops.INDEX and u.src[0] is x).src[1]
    assert load_idx is (inner * 4 + outer).simplify()
    store_idx = next(u for u in after.toposort() if u.op is Ops.STORE).src[0].src[1]
    assert store_idx is (outer * 3 + inner).simplify()
    assert_same_values(before, after, lambda rng: {0: [0.0] * 12, 1: halves(rng, 12)}, trials=3)


def test_split_keeps_axis_type_and_other_ids():
    r0, r1 = UOp.range(2, 0), UOp.range(32, 1, RED)
    x = glob(1, f32, 64)
    before = kernel(red(x.index(r0 * 32 + (r1 % 4) * 8 + r1 // 4).load(), r1), r0)
    after = rewrite(before)
    assert [(r.src[0].arg, r.arg) for r in ranges_of(after)] == [(2, (0, LOOP)), (8, (1, RED)), (4, (2, RED))]
    assert Ops.MOD not in ops_of(after)
    (reduce,) = [u for u in after.toposort() if u.op is Ops.REDUCE]
    assert [r.arg[0] for r in reduce.src[1:]] == [1, 2]
    assert_same_values(before, after, lambda rng: {0: [0.0] * 2, 1: halves(rng, 64)}, trials=3)


def test_split_through_tensor():
    xn = np.arange(12, dtype=np.float32)
    t = Tensor(xn).reshape(3, 4).permute(1, 0).reshape(12) + 1
    after = rewrite(the_kernel(t))
    assert Ops.MOD not in ops_of(after) and Ops.IDIV not in ops_of(after)
    np.testing.assert_equal(t.numpy(), xn.reshape(3, 4).T.reshape(12) + 1)


# ***** range merging *****


def test_merge_adjacent_output_ranges():
    xn = np.arange(15, dtype=np.float32).reshape(3, 5)
    t = Tensor(xn) * 2
    before = graph_rewrite(the_kernel(t), symbolic)
    assert [r.src[0].arg for r in ranges_of(before)] == [3, 5]
    after = rewrite(before)
    assert [(r.src[0].arg, r.arg) for r in ranges_of(after)] == [(15, (0, LOOP))]  # RANGE(3), RANGE(5) -> RANGE(15)
    assert Ops.MOD not in ops_of(after) and Ops.IDIV not in ops_of(after)
    assert_same_values(before, after, lambda rng: {0: [0.0] * 15, 1: halves(rng, 15)}, trials=2)
    np.testing.assert_equal(t.numpy(), xn * 2)


def test_merge_adjacent_reduce_ranges():
    xn = np.arange(32, dtype=np.float32).reshape(4, 8)
    t = Tensor(xn).sum()
    after = rewrite(the_kernel(t))
    (reduce,) = [u for u in after.toposort() if u.op is Ops.REDUCE]
    assert [r.src[0].arg for r in reduce.src[1:]] == [32]
    assert t.item() == xn.sum()


def test_no_merge_when_divmods_would_grow():
    xn = np.arange(15, dtype=np.float32).reshape(3, 5)
    t = Tensor(xn).permute(1, 0) + 1  # out[r0*3 + r1] = x[r1*5 + r0]: one loop would need r//3 and r%3
    before = graph_rewrite(the_kernel(t), symbolic)
    after = rewrite(before)
    assert after is before
    np.testing.assert_equal(t.numpy(), xn.T + 1)


def test_merge_needs_same_kind():
    r0, r1 = UOp.range(3, 0), UOp.range(5, 1, RED)
    x = glob(1, f32, 15)
    before = kernel(red(x.index(r0 * 5 + r1).load(), r1), r0)
    assert [r.src[0].arg for r in ranges_of(rewrite(before))] == [3, 5]


def test_divmod_sum_folds():
    R, r = UOp.range(32, 0), UOp.range(3, 1)
    assert ((R // 8) * 8 + R % 8).simplify() is R  # algebra: (a//c)*c + a%c -> a
    assert ((R // 8) * 32 + (R % 8) * 4 + r * 1024).simplify() is (R * 4 + r * 1024).simplify()
    n = UOp.variable("n", -50, 50)
    assert ((n // 7) * 7 + n % 7).simplify() is n  # C's truncating division: holds for negative a too


# ***** load collapse / reduce collapse *****


@pytest.mark.slow
def test_load_collapse_count():
    """sum(1 for k in 0..64 if k >= n) -> clamp(64-n, 0, 64): the REDUCE is gone"""
    r0, k = UOp.range(6, 0), UOp.range(64, 1, RED)
    n = glob(1, i32, 6).index(r0).load()
    before = kernel(red((k < n).logical_not().where(c(1), c(0)), k), r0)
    after = rewrite(before)
    assert Ops.REDUCE not in ops_of(after) and Ops.MAX in ops_of(after)
    assert [r.src[0].arg for r in ranges_of(after)] == [6]
    assert_same_values(before, after, lambda rng: {0: [0] * 6, 1: ints(rng, 6, -80, 80)})
    assert_same_values(before, after, lambda rng: {0: [0] * 6, 1: [-(2**31), 2**31 - 1, 0, 64, 65, -1]}, trials=1)


def test_load_collapse_count_through_tensor():
    nn = np.array([5, -3, 70, 64, 0, 63], np.int32)
    t = (Tensor.arange(64).reshape(1, 64) >= Tensor(nn).reshape(6, 1)).where(1, 0).sum(axis=1)
    assert Ops.REDUCE not in ops_of(rewrite(the_kernel(t)))
    np.testing.assert_equal(t.numpy(), np.clip(64 - nn, 0, 64))


def bounds_kernel(gate_fn, v_on_true: bool):
    """out[r0] = sum over r1 in 0..16 of (gate(r1, a[r0], b[r0]) ? v : 0) (or 0 : v), v = x[r0] (floats)"""
    r0, r1 = UOp.range(5, 0), UOp.range(16, 1, RED)
    a, b, v = glob(1, i32, 5).index(r0).load(), glob(2, i32, 5).index(r0).load(), glob(3, f32, 5).index(r0).load()
    gate, zero = gate_fn(r1, a, b), c(0.0, f32)
    return kernel(red(gate.where(v, zero) if v_on_true else gate.where(zero, v), r1), r0)


def bounds_inputs(rng):
    return {0: [0.0] * 5, 1: ints(rng, 5), 2: ints(rng, 5), 3: halves(rng, 5)}


@pytest.mark.parametrize(
    "name,gate_fn,v_on_true",
    fast_first(
        [
            ("lower: sum(r < cut ? 0 : v)", lambda r, a, b: r < a, False),
            ("upper: sum(r < cut ? v : 0)", lambda r, a, b: r < a, True),
            ("two-sided: sum(lo <= r & r < hi ? v : 0)", lambda r, a, b: (r < a).logical_not() & (r < b), True),
            ("reversed: sum(lo < r ? v : 0)", lambda r, a, b: a < r, True),
            ("lifted: sum(r + lo < hi ? v : 0)", lambda r, a, b: (r + a) < b, True),
            ("lifted: sum(hi < r + lo ? 0 : v)", lambda r, a, b: b < (r + a), False),
            ("scaled: sum(r*3 < cut ? v : 0)", lambda r, a, b: (r * 3) < a, True),
            ("equal: sum(r == e ? v : 0)", lambda r, a, b: r.eq(a), True),
            ("complement: sum(r != e ? v : 0)", lambda r, a, b: r.ne(a), True),
            ("complement: sum(lo <= r & r < hi ? 0 : v)", lambda r, a, b: (r < a).logical_not() & (r < b), False),
        ],
        unpack=True,
    ),
)
def test_reduce_collapse_bounds(name, gate_fn, v_on_true):
    before = bounds_kernel(gate_fn, v_on_true)
    after = rewrite(before)
    assert Ops.REDUCE in ops_of(before) and Ops.REDUCE not in ops_of(after), name
    assert_same_values(before, after, bounds_inputs)


EXTREMES = [-(2**31), -(2**31) + 5, -1, 0, 7, 16, 2**31 - 6, 2**31 - 1]


@pytest.mark.parametrize(
    "gate_fn",
    fast_first(
        [
            lambda r, a, b: r < a,
            lambda r, a, b: a < r,
            lambda r, a, b: r.eq(a),
            lambda r, a, b: (r < a).logical_not() & (r < b),
        ]
    ),
)
def test_bounds_at_the_int_limits(gate_fn):
    """clamped before any + 1: no bound overflows, whatever the loaded cut"""
    before = bounds_kernel(gate_fn, True)
    after = rewrite(before)
    assert Ops.REDUCE not in ops_of(after)
    assert_same_values(
        before,
        after,
        lambda rng: {
            0: [0.0] * 5,
            1: [rng.choice(EXTREMES) for _ in range(5)],
            2: [rng.choice(EXTREMES) for _ in range(5)],
            3: halves(rng, 5),
        },
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "gate_fn", [lambda r, a, b: (r + a) < b, lambda r, a, b: b < (r + a), lambda r, a, b: (r + a).eq(b)]
)
def test_lifting_does_not_overflow(gate_fn):
    """r + a < b -> r < b - a: b - a is computed in int64 when int32 could overflow (r + a itself never does here)"""
    before = bounds_kernel(gate_fn, True)
    after = rewrite(before)
    assert Ops.REDUCE not in ops_of(after) and dtypes.int64 in {u.dtype for u in after.toposort()}
    low = [-(2**31), -(2**31) + 5, -(2**31) + 20, -3, 0, 5]
    assert_same_values(
        before,
        after,
        lambda rng: {
            0: [0.0] * 5,
            1: [rng.choice(low) for _ in range(5)],
            2: [rng.choice(EXTREMES) for _ in range(5)],
            3: halves(rng, 5),
        },
    )


def test_reduce_collapse_bounds_form():
    """sum(r < cut ? v : 0) -> max(0, min(16, cut)) * v: a MAX (and a clamp), one multiply, no loop"""
    after = rewrite(bounds_kernel(lambda r, a, b: r < a, True))
    store = next(u for u in after.toposort() if u.op is Ops.STORE)
    value = store.src[1]
    assert value.op is Ops.MUL and value.src[0].op is Ops.CAST and value.src[1].op is Ops.LOAD
    assert Ops.MAX in ops_of(value) and all(r.arg[1] is LOOP for r in ranges_of(value))


def test_two_sided_through_tensor():
    lo, hi = np.array([2, -5, 10, 3, 0], np.int32), np.array([9, 4, 70, 3, 64], np.int32)
    vn = np.array([1.5, -2.0, 0.25, 3.0, 1.0], np.float32)
    ar = Tensor.arange(64).reshape(1, 64)
    gate = (ar >= Tensor(lo).reshape(5, 1)) & (ar < Tensor(hi).reshape(5, 1))
    t = (gate.where(Tensor(vn).reshape(5, 1), 0.0)).sum(axis=1)
    assert Ops.REDUCE not in ops_of(rewrite(the_kernel(t)))
    np.testing.assert_allclose(t.numpy(), np.clip(np.minimum(hi, 64) - np.maximum(lo, 0), 0, None) * vn, rtol=1e-6)


@pytest.mark.slow
def test_mul_casted_bool_and_distributive_law():
    """sum(v*(r < a).cast() + w*(r >= b).cast()) -> two closed forms added (the distributive law enables it)"""
    r0, r1 = UOp.range(5, 0), UOp.range(16, 1, RED)
    a, b = glob(1, i32, 5).index(r0).load(), glob(2, i32, 5).index(r0).load()
    v = glob(3, f32, 5).index(r0).load()
    body = v * (r1 < a).cast(f32) + (v * c(2.0, f32)) * (r1 < b).logical_not().cast(f32)
    before = kernel(red(body, r1), r0)
    after = rewrite(before)
    assert Ops.REDUCE not in ops_of(after)
    assert_same_values(before, after, bounds_inputs)


def test_distributive_law_only_when_it_collapses():
    r0, r1 = UOp.range(5, 0), UOp.range(16, 1, RED)
    a, x = glob(1, i32, 5).index(r0).load(), glob(2, f32, 80)
    body = x.index(r0 * 16 + r1).load() + (r1 < a).where(c(1.0, f32), c(0.0, f32))
    before = graph_rewrite(kernel(red(body, r1), r0), symbolic)
    assert reduce_collapse(next(u for u in before.toposort() if u.op is Ops.REDUCE)) is None
    after = rewrite(before)
    (reduce,) = [u for u in after.toposort() if u.op is Ops.REDUCE]
    assert reduce.src[0].op is Ops.ADD  # sum(x + y) is still one loop: nothing was split off


def test_gauss_sum():
    t = Tensor.arange(64).sum()
    after = rewrite(the_kernel(t))
    assert Ops.REDUCE not in ops_of(after)
    assert t.item() == 64 * 63 // 2


# ***** the gather: sum(idx != r ? 0 : expr) -> in_bounds ? expr[r:=idx] : 0 *****


def gather_kernel(B: int, V: int, D: int, form: str, offset: int = 0) -> UOp:
    """out[b, d] = sum over v of (v [+ offset] == idx[b] ? emb[v, d] : 0), written in one of several forms"""
    rb, rd, rv = UOp.range(B, 0), UOp.range(D, 1), UOp.range(V, 2, RED)
    emb, idx = glob(1, f32, V * D), glob(2, i32, B)
    e, row, lhs = idx.index(rb).load(), emb.index(rv * D + rd).load(), rv + offset if offset else rv
    zero = c(0.0, f32)
    body = {
        "ne": lhs.ne(e).where(zero, row),
        "eq": lhs.eq(e).where(row, zero),
        "cast": row * lhs.eq(e).cast(f32),
        "not_ne": lhs.ne(e).logical_not().where(row * c(2.0, f32), zero),
    }[form]
    return kernel(red(body, rv), rb, rd)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["ne", "eq", "cast", "not_ne"])
@pytest.mark.parametrize("offset", [0, 3])
def test_gather_collapse(form, offset):
    B, V, D = 4, 6, 3
    before = gather_kernel(B, V, D, form, offset)
    after = rewrite(before)
    assert Ops.REDUCE not in ops_of(after)
    assert all(r.src[0].arg != V for r in ranges_of(after))  # no loop over the vocabulary
    emb_load = next(u for u in after.toposort() if u.op is Ops.INDEX and u.src[0].arg == 1)
    assert len(emb_load.src) == 3  # emb[idx, d] is read only where 0 <= idx (- offset) < V: no out-of-bounds load

    def inputs(rng):
        return {0: [0.0] * (B * D), 1: halves(rng, V * D), 2: ints(rng, B, -3, V + 5)}

    assert_same_values(before, after, inputs)
    assert_same_values(
        before,
        after,
        lambda rng: {0: [0.0] * (B * D), 1: halves(rng, V * D), 2: [-(2**31), 2**31 - 1, -1, V]},
        trials=1,
    )


@pytest.mark.parametrize("form", ["where", "cast"])
def test_embedding_is_an_indexed_load(form):
    B, V, D = 5, 7, 4
    idxn = np.array([0, 6, 3, -1, 7], np.int32)  # -1 and 7 are out of range: rows of 0
    embn = np.random.default_rng(0).standard_normal((V, D)).astype(np.float32)
    idx, emb = Tensor(idxn), Tensor(embn)
    mask = Tensor.arange(V).reshape(1, V, 1) == idx.reshape(B, 1, 1)
    if form == "where":
        t = mask.where(emb.reshape(1, V, D), 0).sum(axis=1)
    else:
        t = (mask.cast(dtypes.float32) * emb.reshape(1, V, D)).sum(axis=1)
    ast = the_kernel(t)
    assert any(u.op is Ops.REDUCE for u in ast.toposort())
    after = rewrite(ast)
    assert Ops.REDUCE not in ops_of(after)  # one indexed load per output element, no loop over V
    uops, _ = full_rewrite(ast, Device[Device.DEFAULT].renderer)
    assert all(u.src[0].arg != V for u in uops if u.op is Ops.RANGE)
    ref = np.where(((idxn >= 0) & (idxn < V))[:, None], embn[np.clip(idxn, 0, V - 1)], 0)
    np.testing.assert_array_equal(t.numpy(), ref)


@pytest.mark.slow
def test_one_hot_matmul_and_nn_embedding_are_gathers():
    from zeptograd import nn

    V, D = 10, 4
    idxn = np.array([[1, 9, 3], [0, 12, -2]], np.int32)
    emb = nn.Embedding(V, D)
    w = emb.weight.numpy()
    with pytest.raises(IndexError, match="index 12 is out of bounds for dimension 0 with size 10"):
        emb(Tensor(idxn))  # an out-of-range id is an error at the call (it would be a row of zeros)
    idxn = np.clip(idxn, 0, V - 1)
    for t in (emb(Tensor(idxn)), Tensor(idxn).one_hot(V).float() @ emb.weight):
        ast = t.schedule()[-1].ast
        assert Ops.REDUCE in ops_of(ast) and Ops.REDUCE not in ops_of(rewrite(ast))
    np.testing.assert_array_equal(emb(Tensor(idxn)).numpy(), w[idxn])
    hot = Tensor(idxn).one_hot(V).float() @ emb.weight
    np.testing.assert_array_equal(hot.numpy(), w[idxn])


# ***** reduce unparented *****


def test_unparented_add_multiplies():
    xn = np.arange(32, dtype=np.float32).reshape(4, 1, 8)
    t = Tensor(xn).expand(4, 3, 8).sum(axis=1)
    before = graph_rewrite(the_kernel(t), symbolic)
    assert Ops.REDUCE in ops_of(before)
    after = rewrite(before)
    assert Ops.REDUCE not in ops_of(after)
    value = next(u for u in after.toposort() if u.op is Ops.STORE).src[1]
    assert value.op is Ops.MUL and value.src[1].op is Ops.CONST and value.src[1].arg == 3.0  # sum of 3 copies: *3
    np.testing.assert_equal(t.numpy(), xn.reshape(4, 8) * 3)


def test_unparented_max_drops_the_range():
    xn = np.random.default_rng(1).standard_normal((4, 1, 8)).astype(np.float32)
    t = Tensor(xn).expand(4, 5, 8).max(axis=1)
    after = rewrite(the_kernel(t))
    assert Ops.REDUCE not in ops_of(after) and Ops.MUL not in ops_of(after)
    np.testing.assert_equal(t.numpy(), xn.reshape(4, 8))


@pytest.mark.parametrize(
    "op,n", fast_first([(Ops.ADD, 5), (Ops.MUL, 5), (Ops.MUL, 8), (Ops.MUL, 1), (Ops.MAX, 5)], unpack=True)
)
def test_unparented_unit(op, n):
    r0, r1, r2 = UOp.range(3, 0), UOp.range(n, 1, RED), UOp.range(2, 2, RED)
    x = glob(1, i32, 6)
    before = kernel(red(x.index(r0 * 2 + r2).load(), r1, r2, op=op), r0)
    reduce = next(u for u in before.toposort() if u.op is Ops.REDUCE)
    after_reduce = reduce_unparented(reduce)
    assert after_reduce is not None and r1 not in after_reduce.toposort()
    inner = next(u for u in after_reduce.toposort() if u.op is Ops.REDUCE)
    assert inner.src[1:] == (r2,)  # the used range stays
    if op is Ops.MUL:  # x**n by repeated squaring: 5 -> 3 MULs, 8 -> 3 MULs
        assert ops_of(after_reduce).count(Ops.MUL) - ops_of(reduce).count(Ops.MUL) == {5: 3, 8: 3, 1: 0}[n]
    after = rewrite(before)
    assert_same_values(before, after, lambda rng: {0: [0] * 3, 1: ints(rng, 6, -3, 3)})


# ***** a randomized sweep: random gates, sizes and inputs, before == after *****


@pytest.mark.slow
def test_random_gated_sums():
    rng = random.Random(3)
    gates = [
        lambda r, a, b: r < a,
        lambda r, a, b: a < r,
        lambda r, a, b: (r < a).logical_not() & (r < b),
        lambda r, a, b: (r + b) < a,
        lambda r, a, b: r.eq(a),
        lambda r, a, b: r.ne(b),
    ]
    for _ in range(12):
        n, which, v_on_true = rng.randint(1, 12), rng.randrange(len(gates)), rng.random() < 0.5
        r0, r1 = UOp.range(3, 0), UOp.range(n, 1, RED)
        a, b = glob(1, i32, 3).index(r0).load(), glob(2, i32, 3).index(r0).load()
        v = glob(3, i32, 3).index(r0).load()
        g = gates[which](r1, a, b)
        before = kernel(red(g.where(v, c(0)) if v_on_true else g.where(c(0), v), r1), r0)
        after = rewrite(before)
        assert Ops.REDUCE not in ops_of(after), pretty_pair(before, after)
        assert_same_values(
            before,
            after,
            lambda rng: {0: [0] * 3, 1: ints(rng, 3, -4, n + 4), 2: ints(rng, 3, -4, n + 4), 3: ints(rng, 3)},
            trials=10,
        )


def pretty_pair(before: UOp, after: UOp) -> str:
    return f"before:\n{before}\nafter:\n{after}"
