"""The gradient cache (zeptograd/gradient_cache.py): a backward over a graph of a structure met before rebuilds the
gradient graph from a template instead of running the gradient rules, and builds the very nodes they would build."""

import numpy as np

from zeptograd import Tensor, gradient_cache
from zeptograd.engine.realize import tensor_clock
from zeptograd.helpers import Context
from zeptograd.tensor.live import _grad_uops


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
