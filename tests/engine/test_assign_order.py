"""Lazy tensors and in-place writes, against torch's eager semantics.

A tensor that computes from a buffer (any op other than a view) holds the values the buffer had when the tensor was
built, even when an assign or setitem into the buffer is realized before the tensor is read: the engine computes the
live readers first, in the write's schedule. A view (reshape, permute, expand, shrink, flip, detach) aliases the
buffer as a torch view does and shows later writes. Every case runs the same program in torch (eagerly) and compares
every value read."""

import numpy as np
import pytest
import torch

from zeptograd import GlobalCounters, Tensor, TinyJit, nn
from zeptograd.engine import realize as engine

W0 = [1.0, 2.0, 3.0, 4.0]


def _zt(values=W0):
    return Tensor(values).realize(), torch.tensor(values)


def _eq(z, t):
    np.testing.assert_allclose(z.numpy(), t.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_reader_built_before_an_assign_realized_first():
    w, tw = _zt()
    y, ty = w + 1, tw + 1
    w.assign(w * 10).realize()
    tw.copy_(tw * 10)
    _eq(y, ty)
    _eq(w, tw)


@pytest.mark.parametrize("w_first", [True, False])
def test_reduce_reader_either_read_order(w_first):
    w, tw = _zt()
    y, ty = w.sum(), tw.sum()
    w.assign(w * 10)
    tw.copy_(tw * 10)
    for z, t in [(w, tw), (y, ty)] if w_first else [(y, ty), (w, tw)]:
        _eq(z, t)


@pytest.mark.parametrize("old_first", [True, False])
def test_readers_of_old_and_new_contents_realized_together(old_first):
    # two outputs of one shape realized in one schedule share a kernel unless one reads a buffer before its write
    # and the other after it (that kernel ran after the write, or before it, whatever the realize order)
    w, tw = _zt()
    old, t_old = w * 1, tw * 1
    w.assign(w + 2)
    tw.copy_(tw + 2)
    new, t_new = w * 3, tw * 3
    Tensor.realize(old, new) if old_first else Tensor.realize(new, old)
    _eq(old, t_old)
    _eq(new, t_new)
    _eq(w, tw)


def test_reader_of_a_setitem_chain_read_by_a_later_setitem():
    # setitems into one pending write, one of them reading the target: a reader made before them all keeps zeros
    w, tw = _zt([0.0] * 4)
    s0, t_s0 = w * 1, tw * 1
    w[1], tw[1] = 5, 5
    w[0], tw[0] = w[1] + 1, tw[1] + 1
    s1, t_s1 = w * 1, tw * 1
    w[2], tw[2] = 6, 6
    _eq(w, tw)
    _eq(s0, t_s0)
    _eq(s1, t_s1)


def test_setitem_after_reader():
    w, tw = _zt()
    y, ty = w * 2, tw * 2
    w[1] = 5
    tw[1] = 5
    _eq(w, tw)
    _eq(y, ty)


def test_assign_into_a_slice_view():
    w, tw = _zt()
    y, ty = w + 1, tw + 1
    w[1:3].assign(Tensor([7.0, 8.0])).realize()
    tw[1:3].copy_(torch.tensor([7.0, 8.0]))
    _eq(y, ty)
    _eq(w, tw)


def test_reader_of_a_reader_and_a_dropped_intermediate():
    w, tw = _zt()
    y, ty = w + 1, tw + 1
    z, tz = y * 2, ty * 2
    u = (w * 3).exp2().sum()  # its intermediate tensors are gone: only u is alive
    tu = (tw * 3).exp2().sum()
    w[0] = -1
    tw[0] = -1
    w.realize()
    _eq(z, tz)
    _eq(y, ty)
    _eq(u, tu)


@pytest.mark.parametrize("read_reader_first", [True, False])
def test_two_assigns_with_a_reader_between(read_reader_first):
    w, tw = _zt()
    w.assign(w * 10)
    tw.copy_(tw * 10)
    y, ty = w + 1, tw + 1
    w.assign(w * 100)
    tw.copy_(tw * 100)
    pairs = [(y, ty), (w, tw)] if read_reader_first else [(w, tw), (y, ty)]
    for z, t in pairs:
        _eq(z, t)
    _eq(y, ty)  # read again: nothing was written twice
    _eq(w, tw)


@pytest.mark.parametrize("read_view_first", [True, False])
def test_view_between_two_assigns_shows_the_last_write(read_view_first):
    w, tw = _zt()
    w.assign(w * 10)
    tw.copy_(tw * 10)
    v, tv = w[0:2], tw[0:2]
    w.assign(w * 100)
    tw.copy_(tw * 100)
    for z, t in [(v, tv), (w, tw)] if read_view_first else [(w, tw), (v, tv)]:
        _eq(z, t)


def test_views_alias_across_writes():
    w, tw = _zt()
    views = [(w[1:3], tw[1:3]), (w.reshape(2, 2).permute(1, 0), tw.reshape(2, 2).permute(1, 0))]
    views += [(w.detach(), tw.detach()), (w.reshape(1, 4).expand(3, 4), tw.reshape(1, 4).expand(3, 4))]
    for k in range(3):
        w.assign(w + k).realize()
        tw.copy_(tw + k)
        for z, t in views:
            _eq(z, t)  # reading a view does not detach it from the buffer
    z, tz = views[0][0] * 2, views[0][1] * 2  # a computation on a view reads the values then
    w.assign(w - 100).realize()
    tw.copy_(tw - 100)
    _eq(z, tz)


@pytest.mark.parametrize("write", ["setitem", "assign", "iadd"])
def test_view_made_before_a_write_that_has_not_run_shows_it(write):
    """The write is still lazy when the view is read: reading the view runs it first (a torch view aliases)."""
    w, tw = _zt()
    views = [(w[1:3], tw[1:3]), (w.reshape(2, 2).permute(1, 0), tw.reshape(2, 2).permute(1, 0)), (w, tw)]
    if write == "setitem":
        w[1], tw[1] = 7.0, 7.0
    elif write == "assign":
        w.assign(w * 3), tw.copy_(tw * 3)
    else:
        w += 1
        tw += 1
    for z, t in views:
        _eq(z, t)


def test_write_through_a_view_tensor_is_seen_by_its_base():
    """t = w.T; t[0] = 9: w read before t shows the write, as in torch (t holds the only write into w's memory)."""
    w, tw = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize(), torch.arange(6.0).reshape(2, 3)
    t, tt = w.T, tw.T
    t[0], tt[0] = 9.0, 9.0
    _eq(w, tw)
    _eq(w.reshape(6), tw.reshape(6))
    _eq(t, tt)


def test_setitem_through_temporary_and_overlapping_views():
    """A setitem into a view of part of a buffer runs at the call: a temporary view's write is not lost, and writes
    through two views whose regions overlap land in the order they were made."""
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    w, tw = Tensor(a).realize(), torch.tensor(a)
    w[:, 1:3][0] = 5.0
    tw[:, 1:3][0] = 5.0
    v1, v2, tv1, tv2 = w[:, 1:3], w[0:2, 0:2], tw[:, 1:3], tw[0:2, 0:2]
    v1[1] = -1.0
    tv1[1] = -1.0
    v2[1] = 6.0  # its region holds v1's write at (1, 1): written after it
    tv2[1] = 6.0
    for z, t in [(v2, tv2), (v1, tv1), (w, tw)]:
        _eq(z, t)


def test_clone_keeps_the_values_at_the_call():
    w, tw = _zt()
    c, tc = w.clone(), tw.clone()
    w.assign(w * 10).realize()
    tw.copy_(tw * 10)
    _eq(c, tc)
    _eq(w, tw)


def test_the_assigned_value_itself_stays_independent():
    w, tw = _zt()
    n, tn = w * 10, tw * 10
    k0 = GlobalCounters.kernel_count
    w.assign(n).realize()
    assert GlobalCounters.kernel_count - k0 == 1  # n is what the write stored: no kernel of its own
    tw.copy_(tn)
    w.assign(w * 2).realize()
    tw.copy_(tw * 2)
    _eq(n, tn)
    _eq(w, tw)


def test_copy_in_of_numpy_dtype_cast_and_broadcast():
    w, tw = _zt()
    y, ty = w * 1, tw * 1
    w.assign(np.array([9, 8, 7, 6], np.float64)).realize()
    tw.copy_(torch.from_numpy(np.array([9, 8, 7, 6], np.float64)))
    _eq(y, ty)
    _eq(w, tw)
    y2, ty2 = w - 1, tw - 1
    w.assign(Tensor([5], dtype="int32")).realize()  # a broadcast int value into a float buffer
    tw.copy_(torch.tensor([5], dtype=torch.int32))
    _eq(y2, ty2)
    _eq(w, tw)


def test_replace_rebinds_and_readers_keep_their_values():
    w, _ = _zt()
    v = w[0:2]
    y = w + 1
    w.replace(Tensor([0.0, 0.0, 0.0, 0.0]))  # a new value for this tensor object, no write into the old buffer
    np.testing.assert_equal(y.numpy(), np.array(W0, np.float32) + 1)
    np.testing.assert_equal(v.numpy(), np.array(W0[:2], np.float32))
    np.testing.assert_equal(w.numpy(), np.zeros(4, np.float32))


def test_reader_that_requires_grad_keeps_its_graph():
    w, tw = _zt()
    a = Tensor([1.0, 1.0, 1.0, 1.0], requires_grad=True)
    ta = torch.ones(4, requires_grad=True)
    y, ty = (a + w).sum(), (ta + tw).sum()  # its gradient does not read w
    w.assign(w * 10).realize()
    tw.copy_(tw * 10)
    _eq(y, ty)
    assert y.requires_grad
    y.backward()
    ty.backward()
    _eq(a.grad, ta.grad)


def test_reader_created_inside_a_tinyjit_function():
    w, tw = _zt()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        y = (w * x).sum()  # reads w before the write below: the replay keeps that order
        w.assign(w + x).realize()
        return y

    for i in range(5):
        x = np.full(4, i + 1, np.float32)
        ty = (tw * torch.from_numpy(x)).sum()
        tw.copy_(tw + torch.from_numpy(x))
        np.testing.assert_allclose(f(Tensor(x)).numpy(), ty.numpy(), rtol=1e-6)
        _eq(w, tw)


class _PlainSGD:
    """torch's SGD without momentum or weight decay, p -= lr * grad: the reference of the inner loop, where
    torch.optim's first optimizer would import torch._dynamo (seconds) for the same numbers"""

    def __init__(self, params, lr: float):
        self.params, self.lr = list(params), lr

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.params:
            p.sub_(self.lr * p.grad)


@pytest.mark.parametrize(
    "opt_name, torch_opt",
    [
        ("SGD", _PlainSGD),
        pytest.param("SGD", torch.optim.SGD, marks=pytest.mark.slow),
        pytest.param("Adam", torch.optim.Adam, marks=pytest.mark.slow),
    ],
    ids=["SGD", "SGD-torch.optim", "Adam"],
)
def test_optimizer_step_leaves_loss_activations_and_grads_at_their_values(opt_name, torch_opt):
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((5, 3)).astype(np.float32)
    model = nn.Linear(3, 2)
    tmodel = torch.nn.Linear(3, 2)
    with torch.no_grad():
        tmodel.weight.copy_(torch.from_numpy(model.weight.numpy()))
        tmodel.bias.copy_(torch.from_numpy(model.bias.numpy()))
    params = nn.state.get_parameters(model)
    opt = getattr(nn.optim, opt_name)(params, lr=0.1)
    topt = torch_opt(tmodel.parameters(), lr=0.1)
    x, tx = Tensor(x_np), torch.from_numpy(x_np)
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            topt.zero_grad()
            h, th = model(x), tmodel(tx)
            loss, tloss = h.square().mean(), th.square().mean()
            loss.backward()
            tloss.backward()
            opt.step()
            topt.step()
            _eq(loss, tloss)  # computed from the parameters before the step
            _eq(h, th)
            _eq(model.weight.grad, tmodel.weight.grad)
            _eq(model.weight, tmodel.weight)
            _eq(model.bias, tmodel.bias)


def test_setitem_loop_with_a_live_reader_of_each_version():
    # two realizes of 8 pending writes each, every write with its own reader (a kernel per index: 16 is enough)
    w, tw = _zt(np.zeros(16, np.float32).tolist())
    sums, tsums = [], []
    for i in range(16):
        sums.append(w.sum())
        tsums.append(tw.sum())
        w[i] = i
        tw[i] = i
        if i % 8 == 7:
            w.realize()
    for z, t in zip(sums, tsums):
        _eq(z, t)
    _eq(w, tw)


def test_a_folded_assign_is_never_run():
    w, _ = _zt()
    w.assign(w * 10)
    y = w + 1
    w.assign(w * 100)
    assert engine._superseded  # the first ASSIGN, read by y
    y.realize()
    w.realize()
    np.testing.assert_equal(w.numpy(), np.array(W0, np.float32) * 1000)
    np.testing.assert_equal(y.numpy(), np.array(W0, np.float32) * 10 + 1)


def test_tinyjit_replay_writing_a_weight_keeps_readers_and_views_right():
    w, tw = _zt()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        w.assign(w + x).realize()
        return (w * 1).realize()

    for _ in range(5):  # calls 3+ replay the kernels without running the function
        y, ty = w * 2, tw * 2  # built before the call: the values before its write
        v, tv = w[0:2], tw[0:2]  # a view: the values after
        step(Tensor([1.0, 1.0, 1.0, 1.0]))
        tw.copy_(tw + 1)
        _eq(y, ty)
        _eq(v, tv)
        _eq(w, tw)


def test_reader_made_before_a_tinyjit_capture_is_not_replayed():
    w, tw = _zt()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        w.assign(w + x).realize()
        return (w * 1).realize()

    one = np.ones(4, np.float32)
    step(Tensor(one))
    tw.copy_(tw + 1)
    y, ty = w * 2, tw * 2  # lazy when the capture (call 2) overwrites w: computed before it, outside the capture
    for _ in range(3):
        step(Tensor(one))
        tw.copy_(tw + 1)
        _eq(y, ty)  # the replays do not compute y again
        _eq(w, tw)


def test_tinyjit_does_not_replay_kernels_only_for_the_functions_own_readers():
    def make(keep_local: bool):
        w = Tensor([1.0, 2.0, 3.0, 4.0]).realize()

        @TinyJit
        def step(x: Tensor) -> Tensor:
            h = (w * x).exp()  # alive at the realize below when keep_local: computed before the write at the capture
            loss = (w * x).sum()
            if not keep_local:
                del h
            w.assign(w - loss * 0.001)
            Tensor.realize(loss, w)
            return loss

        losses = [step(Tensor([1.0, 1.0, 1.0, 1.0])).item() for _ in range(4)]
        return len(step.captured.calls), losses, w.numpy()

    n_kept, losses_kept, w_kept = make(True)
    n_plain, losses_plain, w_plain = make(False)
    assert n_kept == n_plain  # h's kernel ran at the capture only: no replay reads it
    np.testing.assert_allclose(losses_kept, losses_plain, rtol=1e-6)
    np.testing.assert_allclose(w_kept, w_plain, rtol=1e-6)


@pytest.mark.parametrize("axis", [0, None])
def test_sharded_reader_keeps_old_values(axis):
    """A sharded tensor reads through its parts: each part that computes from an overwritten part is computed first."""
    w = Tensor(W0).shard(("CPU:0", "CPU:1"), axis=axis).realize()
    tw = torch.tensor(W0)
    y, s = w + 1, w.sum()
    ty, ts = tw + 1, tw.sum()
    w.assign(w * 10).realize()
    tw.copy_(tw * 10)
    _eq(y, ty)
    _eq(s, ts)
    _eq(w, tw)
    y = w * 2
    ty = tw * 2
    w[1] = 7
    tw[1] = 7
    _eq(w, tw)
    _eq(y, ty)


def test_views_realized_in_a_loop_keep_the_readers_list_bounded():
    """Each node realized to a view of a buffer is noted as a reader of it (an assign into the buffer forgets what they
    were realized to); dead ones are dropped as the list grows."""
    from zeptograd.buffers import buffers

    x = Tensor(np.arange(16, dtype=np.float32)).realize()
    base = x.uop
    kept = []
    for i in range(300):
        v = x.detach()[: i % 16 + 1]  # a node not alive before: noted as a reader of x's buffer
        v.realize()
        if i % 100 == 0:
            kept.append(v)
    assert len(buffers[base].readers) <= 32  # (300 without dropping the dead)
    x.assign(x * 2).realize()
    np.testing.assert_array_equal(x.detach()[:5].numpy(), np.arange(5, dtype=np.float32) * 2)


def test_realizing_a_realized_tensor_again_keeps_no_reference_to_it():
    """A buffer realized again is its own value: noting it so would hold its weak key alive (and its memory) forever."""
    from zeptograd import GlobalCounters
    from zeptograd.engine import realize

    before = GlobalCounters.mem_used
    for _ in range(20):
        x = Tensor(np.ones(1 << 14, np.float32)).realize()
        x.realize()
        Tensor.realize(x, x + 1)
        del x
    assert GlobalCounters.mem_used == before
    assert not [u for u in list(realize._realized.keys()) if realize._realized.get(u) is u]


def test_readers_of_an_update_found_before_its_one_schedule():
    """an SGD-like step whose live intermediate tensors read the weights it overwrites: they are found from the
    tensors' own ASSIGNs before scheduling, so the realize schedules once (not once without them and again with
    them), and each reader still holds the values from before the write"""
    from zeptograd.engine import schedule_cache as sc

    w, tw = _zt()
    x, tx = _zt([0.5, -1.0, 2.0, 0.25])
    h, th = (w * x).relu(), (tw * tx).relu()
    loss, tloss = h.sum(), th.sum()
    w.assign(w * 0.5 - x)
    with torch.no_grad():
        tw.copy_(tw * 0.5 - tx)
    before = sc.Stats.hits + sc.Stats.misses + sc.Stats.uncacheable
    Tensor.realize(loss, w)
    assert sc.Stats.hits + sc.Stats.misses + sc.Stats.uncacheable == before + 1  # one schedule
    _eq(h, th)
    _eq(loss, tloss)
    _eq(w, tw)


def test_an_update_through_detach_is_one_kernel_and_a_flipped_one_still_copies():
    """p.assign(p.detach() - lr * g) reads p only at the element it writes (detach is p's value): one kernel, no copy
    of the value first; a value that reads p elsewhere (flipped) is still computed before the write."""
    p, pt = _zt()
    g = Tensor([0.5, 1.0, 1.5, 2.0]).realize()
    p.requires_grad_(True)
    update = p.assign(p.detach() - 0.1 * g)
    assert sum(item.ast.op.name == "SINK" for item in update.schedule()) == 1
    p.realize()
    pt = pt - 0.1 * torch.tensor([0.5, 1.0, 1.5, 2.0])
    np.testing.assert_allclose(p.numpy(), pt.numpy(), rtol=1e-6)
    flipped = p.assign(p.detach().flip(0) + 1.0)
    assert sum(item.ast.op.name == "SINK" for item in flipped.schedule()) == 2
    p.realize()
    np.testing.assert_allclose(p.numpy(), (pt.flip(0) + 1.0).numpy(), rtol=1e-6)


def test_a_live_update_value_is_the_assigns_source_not_copied_again():
    """A hand-written SGD step whose gradient reads the parameter through the forward (so Tensor.assign stores the
    value before the write) while the update's value is a live tensor too: the write reads the gradient's buffer
    (an output of the schedule, stored first) and the live value becomes what the write stored (forward, loss,
    gradient, the write: 4 kernels; before, the value was stored and copied in, and a .grad that required grad kept
    the value from being the write's)."""
    rng = np.random.default_rng(0)
    wn, xn = rng.standard_normal((4, 3), dtype=np.float32), rng.standard_normal((2, 4), dtype=np.float32)
    w, x = Tensor(wn, requires_grad=True).realize(), Tensor(xn).realize()
    loss = (x @ w).relu().sum()
    loss.backward()
    new = w.detach() - 0.1 * w.grad
    w.assign(new)
    k0 = GlobalCounters.kernel_count
    Tensor.realize(loss, w)
    assert GlobalCounters.kernel_count - k0 == 4
    wt = torch.tensor(wn, requires_grad=True)
    (torch.tensor(xn) @ wt).relu().sum().backward()
    want = (wt - 0.1 * wt.grad).detach().numpy()
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(new.numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-6)


def test_a_hand_written_sgd_step_is_one_kernel_per_parameter_and_its_live_values_keep_their_step():
    """mlp_step's update `new = [p.detach() - lr * p.grad]`, the gradients reading the parameters through the
    forward: each parameter's write reads its gradient's buffer, one kernel per parameter; the live values are what
    the writes stored, copied out only when the next step writes the parameters again (so they hold their own
    step's numbers, as torch's)."""
    rng = np.random.default_rng(1)
    xn, yn = rng.standard_normal((8, 6), dtype=np.float32), rng.standard_normal((8, 3), dtype=np.float32)
    wns = [rng.standard_normal(s, dtype=np.float32) for s in ((6, 5), (5,), (5, 3))]
    ws = [Tensor(w, requires_grad=True).realize() for w in wns]
    wts = [torch.tensor(w, requires_grad=True) for w in wns]
    x, y = Tensor(xn).realize(), Tensor(yn).realize()
    kept, kernels = [], []
    for _ in range(3):
        loss = (((x @ ws[0] + ws[1]).relu() @ ws[2] - y) ** 2).mean()
        loss.backward()
        new = [p.detach() - 0.1 * p.grad for p in ws]
        for p, n in zip(ws, new):
            p.assign(n)
        k0 = GlobalCounters.kernel_count
        Tensor.realize(loss, *ws)
        kernels.append(GlobalCounters.kernel_count - k0)
        for p in ws:
            p.grad = None
        lt = (((torch.tensor(xn) @ wts[0] + wts[1]).relu() @ wts[2] - torch.tensor(yn)) ** 2).mean()
        lt.backward()
        with torch.no_grad():
            for wt in wts:
                wt -= 0.1 * wt.grad
                wt.grad = None
        kept.append((new, [wt.detach().clone().numpy() for wt in wts]))
        np.testing.assert_allclose(loss.item(), lt.item(), rtol=1e-5)
    for p in ws:
        p.grad = None
    loss = (((x @ ws[0] + ws[1]).relu() @ ws[2] - y) ** 2).mean()
    loss.backward()
    forward_backward = len(Tensor.schedule(loss, *[p.grad for p in ws]))
    # one write per parameter; from the second step on, one copy each of the last step's live values too
    assert kernels == [forward_backward + len(ws)] + [forward_backward + 2 * len(ws)] * 2, (kernels, forward_backward)
    for new, want in kept:
        for n, w in zip(new, want):
            np.testing.assert_allclose(n.numpy(), w, rtol=1e-5, atol=1e-6)
