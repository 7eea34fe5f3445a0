"""The gradient cache (zeptograd/gradient_cache.py): a backward over a graph of a structure met before rebuilds the
gradient graph from a template instead of running the gradient rules, and builds the very nodes they would build."""

import functools

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Tensor, gradient_cache
from zeptograd.engine.realize import tensor_clock
from zeptograd.helpers import Context
from zeptograd.tensor.live import _grad_uops


@pytest.fixture(autouse=True)
def template_at_first_sight(monkeypatch):
    """The templates of these tests are built at a key's first backward (by default at its second)."""
    monkeypatch.setattr(gradient_cache, "TEMPLATE_AT_SECOND_SIGHT", False)


def test_a_template_is_built_at_a_keys_second_sight(monkeypatch):
    """A graph whose key is new at every step (dropout's seed is a constant in it) builds no template it would never
    use; a repeated one hits from its third backward."""
    monkeypatch.setattr(gradient_cache, "TEMPLATE_AT_SECOND_SIGHT", True)
    gradient_cache.clear()
    w = Tensor(np.ones((4, 3), np.float32), requires_grad=True).realize()
    for step in range(5):  # a constant that differs per step, as dropout's seed
        ((w * float(step + 2)).relu().sum()).backward()
        w.grad = None
    assert len(gradient_cache._cache) == 0
    hits = gradient_cache.Stats.hits
    for step in range(3):
        ((w * 7.0).relu().sum()).backward()
        np.testing.assert_allclose(w.grad.numpy(), np.full((4, 3), 7.0))
        w.grad = None
    assert len(gradient_cache._cache) == 1 and gradient_cache.Stats.hits == hits + 1


def _params(seed=0):
    rng = np.random.default_rng(seed)
    x = Tensor(rng.standard_normal((8, 6), dtype=np.float32)).realize()
    y = Tensor(rng.standard_normal((8, 3), dtype=np.float32)).realize()
    ws = [
        Tensor(rng.standard_normal(s, dtype=np.float32), requires_grad=True).realize() for s in ((6, 5), (5,), (5, 3))
    ]
    return x, y, ws


def _loss(x, y, ws):
    logits = ((x @ ws[0]) + ws[1]).relu() @ ws[2]
    return -(logits.log_softmax(1) * y).sum(1).mean()


def _grads(x, y, ws):
    loss = _loss(x, y, ws)
    loss.backward()
    grads = [p.grad for p in ws]
    for p in ws:
        p.grad = None
    return loss, grads


def test_a_repeated_step_runs_no_gradient_rule_and_builds_the_same_nodes():
    """Each SGD step builds the same forward graph over the parameters' new buffers: from the second step, backward
    makes no Tensor per gradient rule (the rules build ~60 for this graph), and its gradients are the nodes the
    rules build (GRADIENT_CACHE=0), requiring grad as they would."""
    x, y, ws = _params()
    for step in range(3):
        loss = _loss(x, y, ws)
        before = tensor_clock()
        loss.backward()
        made = tensor_clock() - before - 1  # (tensor_clock's own number)
        cached = [(p.grad.uop, p.grad.requires_grad) for p in ws]
        if step > 0:  # root gradient, one per gradient and its detached copy
            assert made <= 1 + 2 * len(ws), made
        for p in ws:
            p.grad = None
        with Context(GRADIENT_CACHE=0):
            loss.backward()
        assert [(p.grad.uop, p.grad.requires_grad) for p in ws] == cached
        for p in ws:
            p.assign(p.detach() - 0.1 * p.grad)
            p.grad = None
        Tensor.realize(loss, *ws)


def test_same_structure_other_targets_or_no_grad_is_another_entry():
    """Which leaves require grad is part of the key: a parameter frozen between two equal graphs gets no gradient,
    and the gradients of the others are what the rules give."""
    x, y, ws = _params(1)
    _grads(x, y, ws)
    ws[1].requires_grad = False
    _grad_uops.discard(ws[1].uop)
    loss = _loss(x, y, ws)
    loss.backward()
    assert ws[1].grad is None
    got = [ws[0].grad.uop, ws[2].grad.uop]
    ws[0].grad = ws[2].grad = None
    with Context(GRADIENT_CACHE=0):
        loss.backward()
    assert [ws[0].grad.uop, ws[2].grad.uop] == got


def test_cached_gradients_have_the_values_of_computed_ones():
    x, y, ws = _params(2)
    gradient_cache.clear()
    _, first = _grads(x, y, ws)
    misses = gradient_cache.Stats.misses
    x2, y2, ws2 = _params(3)
    _, second = _grads(x2, y2, ws2)
    assert gradient_cache.Stats.misses == misses  # a hit
    with Context(GRADIENT_CACHE=0):
        _, expected = _grads(x2, y2, ws2)
    for g, e in zip(second, expected):
        np.testing.assert_array_equal(g.numpy(), e.numpy())


# ***** graphs with rules of their own (gradient.py's with_gradient) *****


def _leaves(shapes, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _relu_mlp(x, w, b):
    return ((x @ w) + b).relu().sum()


def _gelu(x, w, b):
    return ((x @ w) + b).gelu().square().mean()


def _log_softmax(x, w, b):
    return -((x @ w).log_softmax(1) * b).sum()


def _cross_entropy(x, w, b):
    return ((x @ w) + b).cross_entropy(b.softmax(-1).expand(x.shape[0], -1))


def _conv(x, w, b):
    return x.conv2d(w, b, stride=2, padding=1).relu().sum()


def _attention(x, w, b):
    q = (x @ w).reshape(1, 1, 40, 5).expand(1, 2, 40, 5)
    return q.scaled_dot_product_attention(q * 0.5, q + b, is_causal=True).sum()


_GRAPHS = {  # the loss, its leaves' shapes (x, w, b)
    "relu": (_relu_mlp, ((8, 6), (6, 5), (5,))),
    "gelu": (_gelu, ((8, 6), (6, 5), (5,))),
    "log_softmax": (_log_softmax, ((8, 6), (6, 5), (8, 5))),
    "cross_entropy": (_cross_entropy, ((8, 6), (6, 5), (5,))),
    "matmul": (lambda x, w, b: (x @ w).square().sum() + b.sum(), ((300, 70), (70, 7), (7,))),
    "conv": (_conv, ((2, 2, 6, 6), (5, 2, 3, 3), (5,))),
    "attention": (_attention, ((40, 6), (6, 5), (5,))),
}


def _torch_grads(loss, arrays):
    import torch

    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    ops = {  # the zeptograd loss's ops, spelled in torch
        "relu": lambda x, w, b: torch.relu(x @ w + b).sum(),
        "gelu": lambda x, w, b: torch.nn.functional.gelu(x @ w + b, approximate="tanh").square().mean(),
        "log_softmax": lambda x, w, b: -(torch.log_softmax(x @ w, 1) * b).sum(),
        "cross_entropy": lambda x, w, b: torch.nn.functional.cross_entropy(
            x @ w + b, b.softmax(-1).expand(x.shape[0], -1)
        ),
        "matmul": lambda x, w, b: (x @ w).square().sum() + b.sum(),
        "conv": lambda x, w, b: torch.relu(torch.nn.functional.conv2d(x, w, b, stride=2, padding=1)).sum(),
        "attention": lambda x, w, b: torch.nn.functional.scaled_dot_product_attention(
            (x @ w).reshape(1, 1, 40, 5).expand(1, 2, 40, 5),
            (x @ w).reshape(1, 1, 40, 5).expand(1, 2, 40, 5) * 0.5,
            (x @ w).reshape(1, 1, 40, 5).expand(1, 2, 40, 5) + b,
            is_causal=True,
        ).sum(),
    }
    ops[loss](*ts).backward()
    return [t.grad.numpy() for t in ts]


def _backward(loss_fn, arrays, requires=(True, True, True)):
    ts = [Tensor(a, requires_grad=r).realize() for a, r in zip(arrays, requires)]
    loss = loss_fn(*ts)
    before = tensor_clock()
    loss.backward()
    _backward.made = tensor_clock() - before - 1  # (tensor_clock's own number)
    return loss, ts


def _rules_in(grads):
    """The nodes of the gradients' graphs that carry a rule of their own (a gradient of the gradient reads them)."""
    from zeptograd.gradient import _custom_rules
    from zeptograd.uop.ops import Ops, UOp

    sink = UOp(Ops.SINK, src=tuple(g.uop for g in grads))
    return {u: _custom_rules[u][0] for u in sink.toposort() if u in _custom_rules}


@pytest.mark.parametrize("name", fast_first(list(_GRAPHS), 2))
def test_rules_of_their_own_hit_and_build_the_nodes_the_rules_build(name):
    """A graph with relu's, GELU's, log_softmax's, a matmul's, a conv's or causal attention's own rule, built again
    over new buffers, hits the cache: its gradients are the very nodes the rules build (GRADIENT_CACHE=0), require
    grad as they do, carry the same rules of their own, and have torch's values."""
    loss_fn, shapes = _GRAPHS[name]
    _backward(loss_fn, _leaves(shapes, 0))  # (a miss: its template stored)
    arrays = _leaves(shapes, 1)
    hits = gradient_cache.Stats.hits
    loss, ts = _backward(loss_fn, arrays)
    assert gradient_cache.Stats.hits > hits
    assert _backward.made <= 1 + 2 * len(ts), _backward.made  # root gradient, one per gradient and its detached copy
    assert name == "log_softmax" or _rules_in([loss]), "the graph has a rule of its own"  # (log_softmax: primitives)
    cached = [(t.grad.uop, t.grad.requires_grad) for t in ts]
    rules = _rules_in([t.grad for t in ts])
    for t in ts:
        t.grad = None
    with Context(GRADIENT_CACHE=0):
        loss.backward()
    assert [(t.grad.uop, t.grad.requires_grad) for t in ts] == cached
    assert _rules_in([t.grad for t in ts]) == rules
    for t, e in zip(ts, _torch_grads(name, arrays)):
        np.testing.assert_allclose(t.grad.numpy(), e, rtol=2e-4, atol=2e-5)


def _misses(loss_fn, arrays, **kw):
    misses = gradient_cache.Stats.misses
    _backward(loss_fn, arrays, **kw)
    return gradient_cache.Stats.misses - misses


def test_what_shapes_the_gradient_graph_is_in_the_key():
    """Another requires_grad, dtype, shape, constant or rule is another graph: a miss, then a hit."""
    from zeptograd.gradient import with_gradient

    shapes = ((8, 6), (6, 5), (5,))
    gradient_cache.clear()
    assert _misses(_gelu, _leaves(shapes, 0)) == 1
    assert _misses(_gelu, _leaves(shapes, 1)) == 0
    assert _misses(_gelu, _leaves(shapes, 1), requires=(False, True, True)) == 1
    assert _misses(_gelu, _leaves(shapes, 1, np.float16)) == 1
    assert _misses(_gelu, _leaves(((9, 6), (6, 5), (5,)), 1)) == 1
    assert _misses(lambda x, w, b: _gelu(x * 2, w, b), _leaves(shapes, 1)) == 1
    assert _misses(lambda x, w, b: _gelu(x * 3, w, b), _leaves(shapes, 1)) == 1
    assert _misses(lambda x, w, b: _gelu(x * 3, w, b), _leaves(shapes, 2)) == 0

    def loss_of(c):  # the same forward graph, a rule of another constant
        return lambda x, w, b: with_gradient(x * 1.0, (x,), lambda g, out, x: (g * c,)).sum() + w.sum() + b.sum()

    assert _misses(loss_of(2.0), _leaves(shapes, 1)) == 1
    assert _misses(loss_of(3.0), _leaves(shapes, 1)) == 1
    assert _misses(loss_of(3.0), _leaves(shapes, 2)) == 0
    _, ts = _backward(loss_of(2.0), _leaves(shapes, 3))
    np.testing.assert_array_equal(ts[0].grad.numpy(), np.full(shapes[0], 2.0, np.float32))
    _, ts = _backward(loss_of(3.0), _leaves(shapes, 3))
    np.testing.assert_array_equal(ts[0].grad.numpy(), np.full(shapes[0], 3.0, np.float32))


def _scaled(g, out, x, c):
    return (g * c,)


def test_a_partial_rule_is_keyed_by_its_function_and_arguments():
    """functools.partial(rule, c=...) (causal attention's gradient takes its scale so): the same function with
    another argument is another key, with the same one the same."""
    from zeptograd.gradient import with_gradient

    def loss_of(c):
        rule = functools.partial(_scaled, c=c)
        return lambda x, w, b: with_gradient(x * 1.0, (x,), rule).sum() + w.sum() + b.sum()

    shapes = ((8, 6), (6, 5), (5,))
    gradient_cache.clear()
    assert _misses(loss_of(2.0), _leaves(shapes, 1)) == 1
    assert _misses(loss_of(3.0), _leaves(shapes, 1)) == 1
    hits = gradient_cache.Stats.hits
    _, ts = _backward(loss_of(3.0), _leaves(shapes, 2))
    assert gradient_cache.Stats.hits == hits + 1
    np.testing.assert_array_equal(ts[0].grad.numpy(), np.full(shapes[0], 3.0, np.float32))


def test_a_rule_closing_over_a_tensor_is_not_cached():
    """What a rule builds from a Tensor it closes over is not known from its key: such a graph is not cached (each
    backward runs the rules), and its gradient reads the tensor of its own step."""
    from zeptograd.gradient import with_gradient

    shapes = ((8, 6), (6, 5), (5,))
    for seed in (0, 1):
        scale = Tensor(np.full(shapes[0], seed + 2.0, np.float32))

        def loss(x, w, b, s=scale):
            return with_gradient(x * 1.0, (x,), lambda g, out, x: (g * s,)).sum() + w.sum() + b.sum()

        hits, misses = gradient_cache.Stats.hits, gradient_cache.Stats.misses
        _, ts = _backward(loss, _leaves(shapes, seed))
        assert (gradient_cache.Stats.hits, gradient_cache.Stats.misses) == (hits, misses)
        np.testing.assert_array_equal(ts[0].grad.numpy(), np.full(shapes[0], seed + 2.0, np.float32))


def test_a_gradient_of_a_cached_gradient_is_the_one_of_the_computed_gradient():
    """The gradient of a conv's input gradient goes through the rules the first backward registered on the nodes it
    built (a conv's gradient is a conv): a hit registers them again on its nodes, so the second-order gradient is
    the same graph as without the cache."""
    shapes = ((2, 2, 6, 6), (5, 2, 3, 3), (5,))

    def second_order(x, w, b):
        (gx,) = _conv(x, w, b).gradient(x)
        return gx.square().sum().gradient(w)[0]

    second_order(*[Tensor(a, requires_grad=True).realize() for a in _leaves(shapes, 0)])
    leaves = [Tensor(a, requires_grad=True).realize() for a in _leaves(shapes, 1)]
    hits = gradient_cache.Stats.hits
    cached = second_order(*leaves)
    assert gradient_cache.Stats.hits > hits
    with Context(GRADIENT_CACHE=0):
        expected = second_order(*leaves)
    assert cached.uop is expected.uop


def test_a_graph_whose_rules_make_a_buffer_is_refused_once():
    """A rule that makes a buffer (data, or an all-reduce's result: distributed.py's sum_over_ranks) must run at
    every backward: the graph's entry says so, and a later graph of its key runs the rules without walking their
    gradient graph again for a template."""
    from zeptograd.gradient import with_gradient

    shapes = ((8, 6), (6, 5), (5,))
    for seed in range(3):
        value = float(seed + 2)

        def loss(x, w, b):  # (the rule closes over nothing: the same key every time)
            return with_gradient(x * 1.0, (x,), _times_new_buffer).sum() + w.sum() + b.sum()

        _times_new_buffer.value = value
        hits, misses = gradient_cache.Stats.hits, gradient_cache.Stats.misses
        _, ts = _backward(loss, _leaves(shapes, seed))
        assert gradient_cache.Stats.hits == hits
        assert gradient_cache.Stats.misses == misses + (seed == 0)
        np.testing.assert_array_equal(ts[0].grad.numpy(), np.full(shapes[0], value, np.float32))


def _times_new_buffer(g, out, x):
    return (g * Tensor(np.full(g.shape, _times_new_buffer.value, np.float32)),)


RULE_SCALE = 2.0  # read by _scaled_rule: a module-level value a rule reads is part of its key
RULE_SCALES = [2.0]  # a mutable one: the rule's graph is not cached


def _scaled_rule(g, out, x):
    return (g * RULE_SCALE,)


def _listed_rule(g, out, x):
    return (g * RULE_SCALES[0],)


@pytest.mark.parametrize("listed", [False, True])
def test_a_module_level_value_a_rule_reads_is_in_its_key(monkeypatch, listed):
    """A rule reading a module constant changed between two backwards gets the new value's gradient (the cache hit the
    old template when only the rule's code and closure were keyed); one reading a list is not cached."""
    from zeptograd.gradient import with_gradient

    def grad():
        x = Tensor(np.ones(3, np.float32), requires_grad=True)
        y = with_gradient(x * 1.0, (x,), _listed_rule if listed else _scaled_rule)
        return y.sum().gradient(x)[0].numpy()

    assert grad().tolist() == grad().tolist() == [2.0] * 3
    if listed:
        RULE_SCALES[0] = 3.0  # (restored below)
    else:
        monkeypatch.setattr(f"{__name__}.RULE_SCALE", 3.0)
    try:
        assert grad().tolist() == [3.0] * 3
    finally:
        RULE_SCALES[0] = 2.0
