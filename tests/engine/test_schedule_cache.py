"""The schedule cache: a graph of the same structure on other buffers reuses the kernels of the first, correctly."""

import numpy as np
import pytest

from zeptograd import Context, GlobalCounters, Tensor
from zeptograd.engine import schedule_cache as sc
from zeptograd.uop.ops import Ops


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Count:
    """Schedule cache hits and misses while realizing one lazy result."""

    def __init__(self):
        self.hits = self.misses = 0

    def realize(self, t: Tensor) -> np.ndarray:
        h, m = sc.Stats.hits, sc.Stats.misses
        t.realize()
        self.hits += sc.Stats.hits - h
        self.misses += sc.Stats.misses - m
        return t.numpy()


@pytest.fixture
def count():
    sc.clear()
    return Count()


def realized(x):
    return Tensor(x).realize()


def test_repeated_op_on_new_buffers_hits_and_is_correct(count):
    for i in range(4):
        a, b = rnd(16, seed=i), rnd(16, seed=10 + i)
        np.testing.assert_allclose(count.realize(realized(a) + realized(b)), a + b, rtol=1e-6)
    assert (count.misses, count.hits) == (1, 3)


def test_same_buffer_twice_is_another_graph(count):
    a, b = realized(rnd(8, seed=1)), realized(rnd(8, seed=2))
    an, bn = a.numpy(), b.numpy()
    np.testing.assert_allclose(count.realize(a + a), an + an, rtol=1e-6)
    np.testing.assert_allclose(count.realize(a + b), an + bn, rtol=1e-6)  # must not reuse a+a's one-input kernel
    np.testing.assert_allclose(count.realize(b + a), bn + an, rtol=1e-6)
    np.testing.assert_allclose(count.realize(b + b), bn + bn, rtol=1e-6)
    assert (count.misses, count.hits) == (2, 2)


def test_constants_shapes_and_dtypes_are_part_of_the_key(count):
    x = rnd(6, seed=3)
    for k in (2.0, 3.0, 2.0):
        np.testing.assert_allclose(count.realize(realized(x) * k), x * k, rtol=1e-6)
    assert count.realize(realized(rnd(3, 2)) * 2.0).shape == (3, 2)
    np.testing.assert_allclose(count.realize(realized(x.astype(np.float64)) * 2.0), x.astype(np.float64) * 2)
    assert (count.misses, count.hits) == (4, 1)


def test_multi_kernel_softmax_and_intermediates(count):
    def softmax(t):
        e = (t - t.max(axis=1, keepdim=True)).exp()
        return e / e.sum(axis=1, keepdim=True)

    for i in range(3):
        x = rnd(5, 7, seed=i)
        e = np.exp(x - x.max(1, keepdims=True))
        np.testing.assert_allclose(
            count.realize(softmax(realized(x))), e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-6
        )
    assert (count.misses, count.hits) == (1, 2)


def test_several_outputs_views_and_constants():
    for i in range(3):
        x = rnd(4, 3, seed=i)
        t = Tensor(x).realize()
        outs = [t * 2, t.reshape(12), t.sum(axis=0), Tensor.ones(3) * 5, t]
        Tensor.realize(*outs)
        np.testing.assert_allclose(outs[0].numpy(), x * 2, rtol=1e-6)
        np.testing.assert_allclose(outs[1].numpy(), x.reshape(12), rtol=1e-6)
        np.testing.assert_allclose(outs[2].numpy(), x.sum(0), rtol=1e-5)
        np.testing.assert_allclose(outs[3].numpy(), np.full(3, 5.0))
        np.testing.assert_allclose(outs[4].numpy(), x)


def test_a_hit_runs_the_same_kernels_as_a_miss():
    x = Tensor(rnd(32, 32)).realize()
    with Context(SCHEDULE_CACHE=0):
        GlobalCounters.reset()
        (x.sum(axis=1) + x.max(axis=1)).realize()
        cold = GlobalCounters.kernel_count
    sc.clear()
    for _ in range(2):
        GlobalCounters.reset()
        (x.sum(axis=1) + x.max(axis=1)).realize()
        assert GlobalCounters.kernel_count == cold


def test_knobs_are_part_of_the_key(count):
    x = rnd(8)
    count.realize(realized(x) + 1)
    with Context(SCHEDULE_CACHE=1, DEBUG=0, NOOPT=1):
        np.testing.assert_allclose(count.realize(realized(x) + 1), x + 1, rtol=1e-6)
    assert (count.misses, count.hits) == (2, 0)


def test_cache_off_schedules_every_time(count):
    with Context(SCHEDULE_CACHE=0):
        for i in range(3):
            x = rnd(4, seed=i)
            np.testing.assert_allclose(count.realize(realized(x) - 1), x - 1, rtol=1e-6)
    assert (count.misses, count.hits) == (0, 0)


def test_results_of_a_hit_are_independent_buffers():
    a = Tensor(rnd(4, seed=1)).realize()
    r1 = (a * 3).realize()
    r2 = (Tensor(rnd(4, seed=2)) * 3).realize()
    np.testing.assert_allclose(r1.numpy(), a.numpy() * 3, rtol=1e-6)  # r2 did not write into r1's buffer
    assert r1.uop is not r2.uop


def test_random_expressions_match_the_uncached_schedule():
    rng = np.random.default_rng(0)
    ops = [
        lambda a, b: a + b,
        lambda a, b: a * b - a,
        lambda a, b: (a - b).relu(),
        lambda a, b: a.sum(axis=0) + b[0],
        lambda a, b: a.max(axis=1, keepdim=True) * b,
        lambda a, b: a + b.T if hasattr(b, "T") else a + b,
    ]
    for trial in range(12):
        op = ops[trial % len(ops)]
        x, y = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
        with Context(SCHEDULE_CACHE=0):
            ref = op(Tensor(x), Tensor(y)).numpy()
        got = op(Tensor(x), Tensor(y)).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_negative_zero_is_another_constant(count):
    """The key tells args apart as UOp interning does: -0.0 and 0.0 are equal in Python but not in a product."""
    x = np.array([-1.0, 2.0], dtype=np.float32)
    pos = count.realize(realized(x) * 0.0)
    neg = count.realize(realized(x) * -0.0)
    np.testing.assert_array_equal(np.signbit(pos), np.signbit(x * np.float32(0.0)))
    np.testing.assert_array_equal(np.signbit(neg), np.signbit(x * np.float32(-0.0)))
    assert count.misses == 2


def test_a_hit_builds_no_uop_for_its_key(count, monkeypatch):
    """The key comes from one walk of the graph (which also looks for Variables): a hit builds no placeholder UOps,
    no substituted graph and no SINK to walk again."""
    from zeptograd.uop import ops

    a, b = realized(rnd(16, seed=5)), realized(rnd(16, seed=6))
    count.realize(a + b)
    lazy = a * b - a  # no constant: another test may have realized the same constant node to a buffer
    c, d = realized(rnd(16, seed=7)), realized(rnd(16, seed=8))
    count.realize(c * d - c)  # the template
    made = []
    real_call = ops.UOpMeta.__call__
    monkeypatch.setattr(ops.UOpMeta, "__call__", lambda cls, *args, **kw: made.append(args[0]) or real_call(cls, *args))
    from zeptograd import buffers

    real_fresh = buffers.fresh_uop  # (a new BUFFER's node: built without UOpMeta's lookup)
    monkeypatch.setattr(buffers, "fresh_uop", lambda *args: made.append(args[0]) or real_fresh(*args))
    hits = sc.Stats.hits
    lazy.realize()
    monkeypatch.undo()
    assert sc.Stats.hits == hits + 1
    assert made.count(ops.Ops.BUFFER) == 1 and set(made) <= {ops.Ops.BUFFER, ops.Ops.DEVICE}  # the new output only
    np.testing.assert_allclose(lazy.numpy(), a.numpy() * b.numpy() - a.numpy(), rtol=1e-6)


def test_inputs_a_jit_noted_as_realized_still_hit(count):
    """TinyJit realizes its inputs (an input buffer is noted as realized to itself): eager calls after it still hit."""
    from zeptograd import TinyJit

    a, b = realized(rnd(16, seed=1)), realized(rnd(16, seed=2))
    f = TinyJit(lambda x, y: x * y)
    for _ in range(3):
        f(a, b)
    for _ in range(3):
        np.testing.assert_allclose(count.realize(a - b), a.numpy() - b.numpy(), rtol=1e-6)
    assert (count.misses, count.hits) == (1, 2)


def test_a_repeated_eager_op_keys_only_its_new_node(count, monkeypatch):
    """The fast key: each node keyed keeps a memo of its structure, so a new node over keyed sources is the only node
    keyed, no walk of the graph is made, and the plan runs the cached kernel."""
    a, b = realized(rnd(16, seed=1)), realized(rnd(16, seed=2))
    count.realize(a + b)  # the template and its plan
    keyed = []
    real_key_node = sc._key_node
    monkeypatch.setattr(sc, "_key_node", lambda u: keyed.append(u.op) or real_key_node(u))
    monkeypatch.setattr(sc, "walk", lambda *args: pytest.fail("a hit walked the graph"))
    hits = sc.Stats.hits
    results = [(a + b).realize() for _ in range(3)]
    assert keyed == [Ops.ADD] * 3 and sc.Stats.hits == hits + 3
    monkeypatch.undo()
    for r in results:
        np.testing.assert_allclose(r.numpy(), a.numpy() + b.numpy(), rtol=1e-6)


def test_a_node_realized_after_it_was_keyed_is_read_from_its_buffer(count):
    """A node keyed as the source of another, then realized: the graphs above it are keyed again (the epoch moved on),
    and one holding it takes the general path, which reads its buffer."""
    from zeptograd.engine import realize

    a, b = realized(rnd(16, seed=3)), realized(rnd(16, seed=4))
    c = a + b
    d = c * 2
    count.realize(d * 3)  # keys c's node as a source
    node = c.uop
    assert sc.fast_key([d.uop], realize._realized_data) is not None
    c.realize()
    assert realize.realized_or_none(node) is c.uop
    assert sc.fast_key([d.uop], realize._realized_data) is None  # d's graph holds a realized node
    GlobalCounters.reset()
    np.testing.assert_allclose(count.realize(d), (a.numpy() + b.numpy()) * 2, rtol=1e-6)
    assert GlobalCounters.kernel_count == 1


def test_a_realized_node_nothing_else_holds_is_not_noted(count):
    """A plan's output whose node nothing but the tensor held dies with the tensor's move to its buffer: no entry is
    made for it (only to be dropped at once); one another graph holds is noted, and that graph reads the buffer."""
    from zeptograd.engine import realize

    a, b = realized(rnd(16, seed=5)), realized(rnd(16, seed=6))
    count.realize(a + b)
    entries = len(realize._realized_data)
    for _ in range(3):
        count.realize(a + b)
    assert len(realize._realized_data) == entries
    c = a + b
    d = c * 2
    node = c.uop
    count.realize(c)
    assert count.hits == 4 and realize.realized_or_none(node) is c.uop
    np.testing.assert_allclose(d.numpy(), (a.numpy() + b.numpy()) * 2, rtol=1e-6)


def test_memos_keep_no_node_alive():
    """A BUFFER node's memo does not hold the node (a cycle would keep its memory until a garbage collection)."""
    import gc
    import weakref

    gc.disable()
    try:
        x = realized(rnd(64, seed=7))
        (x + 1).realize()
        (x + 1).realize()
        node = weakref.ref(x.uop)
        del x
        assert node() is None
    finally:
        gc.enable()


def test_a_pending_write_into_another_buffer_keeps_the_plan(count, monkeypatch):
    """A write not yet run into memory the graph does not view leaves the plan in use (only a view of written memory
    must run the write first)."""
    from zeptograd.engine import realize

    a, b = realized(rnd(16, seed=8)), realized(rnd(16, seed=9))
    w = realized(rnd(16, seed=10))
    w[0] = 5.0  # pending until w is read or realized
    count.realize(a + b)
    assert realize._pending_writes
    monkeypatch.setattr(sc, "walk", lambda *args: pytest.fail("a hit walked the graph"))
    r = (a + b).realize()
    monkeypatch.undo()
    np.testing.assert_allclose(r.numpy(), a.numpy() + b.numpy(), rtol=1e-6)
    assert w.numpy()[0] == 5.0


def test_structure_ids_started_again_drop_their_plans(count, monkeypatch):
    """Past MAX_STRUCTURES the ids start again: a plan keyed by an old id must not serve the graph that gets it next."""
    monkeypatch.setattr(sc, "MAX_STRUCTURES", 4)
    x, y = realized(rnd(8, seed=11)), realized(rnd(8, seed=12))
    for _ in range(2):
        for op in (lambda: x + y, lambda: x * y, lambda: (x - y).exp(), lambda: x.sum() + y.max()):
            r = op()
            want = op().numpy()
            np.testing.assert_allclose(count.realize(r), want, rtol=1e-5)


def test_a_write_is_not_fast_keyed(count, monkeypatch):
    """A graph with an ASSIGN takes the walk: realizing an assign keys none of its nodes first (fast_key would walk
    the whole graph, then refuse at the ASSIGN)."""
    w = realized(rnd(16, seed=9))
    x = realized(rnd(16, seed=10))
    monkeypatch.setattr(sc, "_key_node", lambda u: pytest.fail("a write's graph was fast-keyed"))
    expected = w.numpy() * 2 + x.numpy()
    w.assign(w * 2 + x).realize()
    monkeypatch.undo()
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_a_cached_write_gives_its_target_a_new_node(count):
    """An ASSIGN's new contents are a new BUFFER node over the target's memory also when its schedule comes from the
    cache: a graph realized from the old contents (kept alive, as a tensor that requires grad keeps its graph) never
    answers for the same graph built on the new contents (it did: the second write's hit gave back the old node)."""
    w = Tensor(np.array([1.0, 2.0, 3.0], np.float32)).realize()
    g = Tensor(np.ones(3, np.float32), requires_grad=True)
    expected = np.array([1.0, 2.0, 3.0])
    hits = sc.Stats.hits
    for _ in range(4):
        y = (w * 2 + g).sum()
        assert y.item() == pytest.approx(float((expected * 2 + 1).sum()), rel=1e-6)
        before = w.uop
        w.assign(w * 3).realize()
        expected = expected * 3
        assert w.uop is not before
    assert sc.Stats.hits >= hits + 4  # the writes and sums after the first of each came from the cache


def test_a_plan_notes_an_output_node_only_if_something_else_holds_it(count, monkeypatch):
    """A plan's output node that nothing but its tensor held dies at the realize: it is not noted as realized (no
    entry made to be dropped at once); one that something else holds is, and reads its buffer."""
    from zeptograd.engine import realize

    a, b = realized(rnd(16, seed=11)), realized(rnd(16, seed=12))
    count.realize(a + b)  # the template and its plan
    noted = []
    real_remember = realize.remember_realized
    monkeypatch.setattr(
        realize, "remember_realized", lambda node, value: noted.append(node) or real_remember(node, value)
    )
    hits = sc.Stats.hits
    (a + b).realize()
    assert noted == [] and sc.Stats.hits == hits + 1
    c = a + b
    held = c.uop
    c.realize()
    assert noted == [held] and realize.realized_value(held) is c.uop
    monkeypatch.undo()
    np.testing.assert_allclose(c.numpy(), a.numpy() + b.numpy(), rtol=1e-6)


def test_a_matmul_read_from_a_copy_of_its_operand_runs_from_a_plan(count, monkeypatch):
    """x @ w that reads w from a copy in column panels (tensor/matmul_layout.py; w's rows a page apart) or transposed
    (10 columns): two kernels, the copy not noted as realized (computed again it gives the same bits), so a repeat of
    the call runs from the schedule cache's plan, with no walk of the graph (before, the copy's note made every call
    walk)."""
    for shape_a, shape_b in (((256, 512), (512, 1024)), ((64, 128), (128, 10))):
        a, b = realized(rnd(*shape_a, seed=5)), realized(rnd(*shape_b, seed=6))
        assert len((a @ b).schedule()) == 2
        count.realize(a @ b)  # the template and its plan
        monkeypatch.setattr(sc, "walk", lambda *args: pytest.fail("a hit walked the graph"))
        hits = sc.Stats.hits
        results = [(a @ b).realize() for _ in range(2)]
        assert sc.Stats.hits == hits + 2
        monkeypatch.undo()
        for r in results:
            np.testing.assert_allclose(r.numpy(), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-3)


def test_a_hit_places_each_kernels_buffers_by_an_index_made_once(count):
    """A hit's kernels take their buffers by each one's place among the graph's inputs then the new buffers, an index
    the template makes at its first hit (not derived from the template's slots again at every hit)."""
    made = []
    for i in range(4):
        w = realized(rnd(4, 3, seed=i))
        w.assign(w.detach() * 2 + 1)
        w.realize()
        np.testing.assert_allclose(w.numpy(), rnd(4, 3, seed=i) * 2 + 1, rtol=1e-6)
        made.append({id(t): t.item_index for t in sc._cache.values() if t.item_index is not None})
    assert made[0] == {} and made[1] and made[1].keys() == made[2].keys() == made[3].keys()
    assert all(made[3][k] is index for k, index in made[1].items())  # (the same lists: made at the first hit)
    for t in sc._cache.values():
        if t.item_index is not None:
            assert [item for item, _ in t.item_index] == [item for item, _ in t.items]
