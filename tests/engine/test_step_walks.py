"""The Python work of an eager training step (bench case mlp_step: forward, backward, a hand-written SGD update
written with assign, one realize), pinned by what it walks and what it keeps per node, never by a timing."""

import gc
import sys
import weakref

import numpy as np

from zeptograd import Tensor
from zeptograd.engine import live_readers
from zeptograd.engine import realize as engine
from zeptograd.tensor import assign_helpers
from zeptograd.tensor.live import _grad_uops
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp


def _mlp():
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, 6), dtype=np.float32)).realize()
    y = Tensor(rng.standard_normal((8, 3), dtype=np.float32)).realize()
    ws = [Tensor(rng.standard_normal(s, dtype=np.float32), requires_grad=True).realize() for s in ((6, 5), (5, 3))]
    return x, y, ws


def _loss(x, y, ws):
    return (((x @ ws[0]).relu() @ ws[1] - y) ** 2).mean()


def _sgd_assigned(x, y, ws):
    """The loss of one step, its backward, and each weight assigned its SGD update (nothing realized yet):
    (loss, the updates)."""
    loss = _loss(x, y, ws)
    loss.backward()
    new = [p.detach() - 0.1 * p.grad for p in ws]
    for p, n in zip(ws, new):
        p.assign(n)
    return loss, new


def test_a_writing_realize_keeps_no_weak_reference_per_node():
    """The memos the engine keeps per node while it lives (the memories its graph reads, whether it holds a
    realized node) are slots of the node, not weak maps: a realize that writes makes no weak reference, and no
    callback at its death, per node of the step's graph; the only one is the intern table's."""
    x, y, ws = _mlp()
    loss, new = _sgd_assigned(x, y, ws)
    Tensor.realize(loss, *ws)  # the gradients, live readers of the old weights, are walked and computed first
    walked = {u: None for g in (p.grad for p in ws) for u in g.uop.toposort()}
    walked.update(loss.uop.toposort())  # (its graph, kept for backward)
    # (but the nodes that other weak maps name: Buffers' nodes, what was realized, what requires grad)
    nodes = [u for u in walked if u.op is not Ops.BUFFER and u not in engine._realized and u not in _grad_uops]
    assert len(nodes) >= 8
    counts = {weakref.getweakrefcount(u) for u in nodes}
    assert counts == {1}, f"weak references per node: {sorted(counts)}"


def test_the_assign_of_an_sgd_update_stops_at_the_first_read_elsewhere():
    """`p.assign(p.detach() - lr * p.grad)`: the gradient reads p through the forward (not elementwise), so the value
    is stored before the write; the search for such a read ends at the first one it meets instead of walking the
    whole step's graph (once per parameter, each step)."""
    x, y, ws = _mlp()
    loss = _loss(x, y, ws)
    loss.backward()
    sizes = []
    for p in ws:
        value = p.detach() - 0.1 * p.grad
        sizes.append(len(value.uop.toposort()))
        p.assign(value)
        assert p.uop.src[1].op.name == "CONTIGUOUS"  # (read elsewhere: stored before the write)
        assert assign_helpers.reads_target_elsewhere_seen[0] < sizes[-1]
    Tensor.realize(loss, *ws)


def test_the_search_for_a_read_elsewhere_ends_at_the_first_one():
    """The first read elsewhere the search meets decides: a long elementwise graph of another buffer beside it is not
    walked."""
    p = Tensor(np.arange(4, dtype=np.float32)).realize()
    chain = Tensor(np.ones(4, dtype=np.float32)).realize()
    for _ in range(100):
        chain = chain * 1.5 - 0.5
    value = p.detach() - 0.1 * (chain + p.sum())
    assert len(value.uop.toposort()) > 200
    p.assign(value)
    assert p.uop.src[1].op is Ops.CONTIGUOUS
    assert assign_helpers.reads_target_elsewhere_seen[0] <= 12, assign_helpers.reads_target_elsewhere_seen[0]
    np.testing.assert_allclose(p.numpy(), np.arange(4) - 0.1 * (1 + 6), rtol=1e-6)


def test_an_elementwise_update_is_still_one_kernel_with_no_copy():
    """The search's other answer: a value that reads its target only elementwise (x += 1 on a chain of
    elementwise ops of other buffers) is written in place, not stored first."""
    a = Tensor(np.arange(6, dtype=np.float32)).realize()
    b = Tensor(np.ones(6, dtype=np.float32)).realize()
    value = a.detach() * 2 + (b * 3 + 1).exp()
    a.assign(value)
    assert isinstance(a.uop, UOp) and a.uop.src[1].op.name != "CONTIGUOUS"
    np.testing.assert_allclose(a.numpy(), np.arange(6) * 2 + np.exp(4.0), rtol=1e-6)


class _CountingDict(dict):
    lookups = 0

    def get(self, key, default=None):
        _CountingDict.lookups += 1
        return super().get(key, default)


def test_a_writing_realize_looks_up_no_realized_value_of_a_clean_node(monkeypatch):
    """The assigns found the step's graph free of realized nodes and marked it clean; the realize's walks (the
    memories its graph reads, its live readers, the schedule cache's key) do not look each node up in the realized
    map again (a weak reference made per node and look-up)."""
    x, y, ws = _mlp()
    loss, new = _sgd_assigned(x, y, ws)
    n_nodes = len(UOp(Ops.SINK, src=tuple(t.uop for t in [loss, *ws])).toposort())
    # the realized map, counting its look-ups (realize's walks read its dict, the schedule cache's walk the map's)
    counting = _CountingDict(engine._realized_data)
    realized = weakref.WeakKeyDictionary()
    realized.data = counting  # type: ignore[attr-defined]
    monkeypatch.setattr(engine, "_realized", realized)
    monkeypatch.setattr(engine, "_realized_data", counting)
    monkeypatch.setattr(engine, "_realized_remove", counting.pop)
    _CountingDict.lookups = 0
    Tensor.realize(loss, *ws)
    assert n_nodes > 60 and _CountingDict.lookups <= 10, (_CountingDict.lookups, n_nodes)


def test_the_live_readers_of_a_step_are_found_in_one_pass_over_their_graphs():
    """The realize of an SGD step finds the live tensors that read the old weights (the gradients) in one walk over
    their new nodes: the memories each node reads are noted in the same walk that decides whether it reads the old
    contents, not in a pass of their own before it (each node visited once, not twice); and the walk ends at the
    first read of a weight it meets (every node it was looked into on the way reads it too), not finishing the rest
    of each gradient's graph."""
    x, y, ws = _mlp()
    loss = _loss(x, y, ws)
    loss.backward()
    grads = [p.grad for p in ws]
    new = [p.detach() - 0.1 * p.grad for p in ws]
    for p, n in zip(ws, new):
        p.assign(n)
    under_readers = UOp(Ops.SINK, src=tuple(t.uop for t in [*grads, *new, loss])).toposort()
    Tensor.realize(loss, *ws)
    visits = live_readers.live_reader_visits[0]
    assert 0 < visits <= len(under_readers) // 4, (visits, len(under_readers))


def test_a_live_graph_that_reads_no_written_memory_is_walked_once():
    """A live lazy graph over another buffer is walked once to note the memories it reads; a later write stops at its
    root."""
    a = Tensor(np.arange(4, dtype=np.float32)).realize()
    other = Tensor(np.ones(4, dtype=np.float32)).realize()
    chain = other
    for _ in range(40):
        chain = chain * 1.5 + 1
    a.assign(a + 1).realize()
    assert 80 <= live_readers.live_reader_visits[0] <= 100, live_readers.live_reader_visits[0]
    a.assign(a + 1).realize()
    assert live_readers.live_reader_visits[0] <= 2, live_readers.live_reader_visits[0]
    np.testing.assert_allclose(a.numpy(), np.arange(4) + 2)


def test_the_assigns_and_realize_of_a_step_run_no_python_level_weak_map_code():
    """The engine's weak maps (what was realized, the Buffers of BUFFER nodes, the pending writes, what requires
    grad) are read and written through their own dicts, with the dicts' own methods as callbacks: an SGD step's
    assigns and realize run no Python frame of the weakref module (a WeakValueDictionary made per parameter, a
    WeakKeyDictionary's get or store per look-up: a few frames per parameter and step)."""
    x, y, ws = _mlp()
    frames: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            frames.append(frame.f_code.co_name)

    for step in range(3):  # (the first compiles its kernels; the later ones drop what the one before left)
        d = (x @ ws[0]).relu() @ ws[1] - y
        loss = (d * d).mean()  # (not `** 2`: pow's gradient rule is noted in a weak map of its own)
        loss.backward()
        new = [p.detach() - 0.1 * p.grad for p in ws]
        frames.clear()
        sys.setprofile(profile)
        try:
            for p, n in zip(ws, new):
                p.assign(n)
            Tensor.realize(loss, *ws)
            for p in ws:
                p.grad = None
        finally:
            sys.setprofile(None)
        assert step == 0 or frames == [], frames


def test_the_collector_does_not_run_inside_the_realize_of_a_step():
    """Tensor.realize of a step keeps the cycle collector paused until the graph it lets go (the parameters' writes:
    the whole step's graph) is freed by reference count: a collection triggered by the realize's allocations would
    scan that graph, alive just before, find nothing and promote it (one per eager step; every few steps a full
    collection of the process). Here the threshold is set low enough for the realize's allocations to cross it."""
    x, y, ws = _mlp()
    threshold = gc.get_threshold()
    for _ in range(3):
        loss, new = _sgd_assigned(x, y, ws)
        started: list[int] = []

        def note(phase, info):
            if phase == "start":
                started.append(info["generation"])

        gc.callbacks.append(note)
        gc.set_threshold(gc.get_count()[0] + 100, *threshold[1:])
        try:
            Tensor.realize(loss, *ws)
        finally:
            gc.set_threshold(*threshold)
            gc.callbacks.remove(note)
        assert started == []
        for p in ws:
            p.grad = None


def test_an_sgd_step_reads_few_enum_members_by_name(monkeypatch):
    """On Python 3.11 every `Ops.X` read goes through the enum metaclass's getattr hook (a few hundred instructions
    each): the paths every node of a step goes through (a new node's shape, buffer_under, const_broadcast, the
    engine's walks, the gradient's movements) compare with members held in module globals."""
    x, y, ws = _mlp()
    reads = [0]

    def counting(cls, name):
        if cls is Ops:
            reads[0] += 1
        return type.__getattribute__(cls, name)

    def step():
        loss = _loss(x, y, ws)
        loss.backward()
        new = [p.detach() - 0.1 * p.grad for p in ws]
        for p, n in zip(ws, new):
            p.assign(n)
            p.grad = None
        Tensor.realize(loss, *ws)

    step()  # (scheduled and compiled: the next steps' schedule comes from the cache)
    step()  # (the template's first hit indexes it)
    monkeypatch.setattr(variable, "in_use", False)  # (as in a process that bound no Variable: none is in this graph)
    monkeypatch.setattr(type(Ops), "__getattribute__", counting)
    step()
    monkeypatch.undo()
    assert reads[0] <= 200, reads[0]  # (73; 889 when each compared with Ops.X)


def test_the_assigns_walk_no_node_while_nothing_realized_is_alive(monkeypatch):
    """An SGD step's graph holds no realized node when none is alive at all (the last step's died with it): assign's
    look for realized nodes in the update's value returns at once instead of walking the step's graph."""
    x, y, ws = _mlp()
    loss = _loss(x, y, ws)
    loss.backward()
    monkeypatch.setattr(engine, "_realized_data", {})  # (nothing realized alive)
    values = [(p.detach() - 0.1 * p.grad).uop for p in ws]
    nodes = {u: u._clean for v in values for u in v.toposort()}  # (a walk marks the nodes it found clean)
    for v in values:
        assert engine.with_realized_values([v]) == [v]
    walked = [u for u, mark in nodes.items() if u._clean != mark]
    assert walked == [], len(walked)


def test_a_schedule_cache_hit_makes_its_values_without_reshape_checks(monkeypatch):
    """A template's values (per tensor realized, a reshape of its buffer) are made from an index of them built at the
    first hit: a later hit of a schedule that writes (no plan of the fast key: the template is instantiated) builds
    each RESHAPE node directly, not through reshape_uop's checks."""
    from zeptograd.engine import schedule_cache

    a = Tensor(np.ones((4, 3), dtype=np.float32)).realize()
    t = Tensor(np.zeros((4, 3), dtype=np.float32)).realize()

    def step():
        s = a + 1
        t.assign(a * 2)
        Tensor.realize(s, t)
        return s

    for _ in range(2):  # (scheduled, then a first hit)
        step()

    def refused(*args):
        raise AssertionError("reshape_uop on a cache hit")

    monkeypatch.setattr(schedule_cache, "reshape_uop", refused)
    s = step()
    np.testing.assert_allclose(s.numpy(), np.full((4, 3), 2.0))
    np.testing.assert_allclose(t.numpy(), np.full((4, 3), 2.0))
