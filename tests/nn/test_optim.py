"""zeptograd.nn.optim against torch.optim step by step on the same parameters and gradients (SGD, Adam, AdamW),
LAMB and LARS against a numpy transcription of their papers' updates; the fused update's kernel count; TinyJit
replaying a whole training step; errors."""

import numpy as np
import pytest
import torch

from zeptograd import GlobalCounters, Tensor, TinyJit, nn

SHAPES = [(4, 3), (3,), (2, 5), (5,)]


def data(steps=3, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(steps)]
    return init, grads


def run_zg(make, init, grads, **kw):
    ps = [Tensor(a.copy(), requires_grad=True) for a in init]
    opt = make(ps, **kw)
    out = []
    with Tensor.train():
        for gs in grads:
            for p, g in zip(ps, gs):
                p.grad = Tensor(g)
            opt.step()
            out.append([p.numpy() for p in ps])
    return out


TORCH_CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, weight_decay=0.1)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, b1=0.8, b2=0.9, eps=1e-6)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name, kw", TORCH_CASES)
def test_against_torch(name, kw, fused):
    init, grads = data()
    zout = run_zg(getattr(nn.optim, name), init, grads, fused=fused, **kw)
    tps = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    tkw = dict(kw)
    if "b1" in tkw:
        tkw["betas"] = (tkw.pop("b1"), tkw.pop("b2"))
    topt = getattr(torch.optim, name)(tps, **tkw)
    for step, gs in enumerate(grads):
        for p, g in zip(tps, gs):
            p.grad = torch.tensor(g)
        topt.step()
        for z, t in zip(zout[step], tps):
            np.testing.assert_allclose(z, t.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")


def np_lamb(init, grads, lr, b1, b2, eps, wd, adam=False):
    ps, m, v, out = [a.astype(np.float64) for a in init], [0.0] * len(init), [0.0] * len(init), []
    for t, gs in enumerate(grads, 1):
        for i, g in enumerate(gs):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            up = (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps) + wd * ps[i]
            r1, r2 = np.linalg.norm(ps[i]), np.linalg.norm(up)
            r = 1.0 if adam or r1 == 0 or r2 == 0 else r1 / r2
            ps[i] = ps[i] - lr * r * up
        out.append([p.copy() for p in ps])
    return out


def np_lars(init, grads, lr, momentum, wd, tcoef, nesterov=False):
    """LARS as in You et al. (classic: the learning rate and trust ratio applied before the momentum)."""
    ps, b, out = [a.astype(np.float64) for a in init], [0.0] * len(init), []
    for gs in grads:
        for i, g in enumerate(gs):
            r1, r2 = np.linalg.norm(ps[i]), np.linalg.norm(g)
            r = tcoef * r1 / (r2 + wd * r1) if r1 > 0 and r2 > 0 else 1.0
            g = (g + wd * ps[i]) * r * lr
            b[i] = momentum * b[i] + g
            ps[i] = ps[i] - ((g + momentum * b[i]) if nesterov else b[i])
        out.append([p.copy() for p in ps])
    return out


@pytest.mark.parametrize("fused", [True, False])
def test_lamb_and_lars_against_numpy(fused):
    init, grads = data(seed=1)
    kw = dict(lr=0.01, b1=0.9, b2=0.99, eps=1e-6, weight_decay=0.05)
    zout = run_zg(nn.optim.LAMB, init, grads, fused=fused, **kw)
    ref = np_lamb(init, grads, 0.01, 0.9, 0.99, 1e-6, 0.05)
    for z, r in zip(zout, ref):
        for a, b in zip(z, r):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for nesterov in (False, True):
        zout = run_zg(
            nn.optim.LARS,
            init,
            grads,
            fused=fused,
            lr=0.5,
            momentum=0.9,
            weight_decay=1e-3,
            tcoef=0.01,
            nesterov=nesterov,
        )
        ref = np_lars(init, grads, 0.5, 0.9, 1e-3, 0.01, nesterov)
        for z, r in zip(zout, ref):
            for a, b in zip(z, r):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fused_update_is_few_kernels():
    init, grads = data(steps=1)
    ps = [Tensor(a.copy(), requires_grad=True) for a in init]
    for p, g in zip(ps, grads[0]):
        p.grad = Tensor(g).realize()
    opt = nn.optim.Adam(ps, lr=0.01)
    with Tensor.train():
        GlobalCounters.reset()
        opt.step()
    # the step counters, m and v (one flat kernel each), one kernel per parameter
    assert GlobalCounters.kernel_count <= len(ps) + 3, GlobalCounters.kernel_count
    unfused = nn.optim.Adam(ps, lr=0.01, fused=False)
    assert len(opt.m) == 1 and len(unfused.m) == len(ps)


def test_lr_is_a_tensor_and_can_change():
    p = Tensor([1.0, 2.0], requires_grad=True)
    opt = nn.optim.SGD([p], lr=0.5)
    with Tensor.train():
        p.grad = Tensor([1.0, 1.0])
        opt.step()
        opt.lr.assign(Tensor([0.25])).realize()
        p.grad = Tensor([1.0, 1.0])
        opt.step()
    np.testing.assert_allclose(p.numpy(), [0.25, 1.25])


def test_buffers_realized_and_params_deduplicated():
    p = Tensor([1.0], requires_grad=True)
    buf = Tensor([0.0])
    buf.requires_grad = False
    opt = nn.optim.SGD([p, p, buf], lr=1.0)
    assert opt.params == [p] and opt.buffers == [buf]


def test_errors():
    p = Tensor([1.0, 2.0], requires_grad=True)
    opt = nn.optim.Adam([p])
    with pytest.raises(RuntimeError, match="training"):
        opt.step()
    with Tensor.train(), pytest.raises(RuntimeError, match="no gradient"):
        opt.step()
    q = Tensor([1.0])
    q.requires_grad = False
    with pytest.raises(ValueError, match="at least one"):
        nn.optim.SGD([q])


def _train(jit: bool, steps: int = 4):
    Tensor.manual_seed(3)
    rng = np.random.default_rng(0)
    l1, l2 = nn.Linear(6, 8), nn.Linear(8, 3)
    opt = nn.optim.Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.05)

    def step(x, y):
        opt.zero_grad()
        loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
        loss.backward()
        loss = loss.detach()
        opt.step(loss)
        return loss

    f = TinyJit(step) if jit else step
    losses = []
    with Tensor.train():
        for _ in range(steps):
            x = rng.standard_normal((5, 6)).astype(np.float32)
            y = rng.integers(0, 3, 5).astype(np.int32)
            losses.append(f(Tensor(x), Tensor(y)).item())
    return losses, l2.weight.numpy()


def test_tinyjit_replays_the_training_step():
    eager, w_eager = _train(jit=False)
    jitted, w_jit = _train(jit=True)
    np.testing.assert_allclose(jitted, eager, rtol=1e-5)
    np.testing.assert_allclose(w_jit, w_eager, rtol=1e-5, atol=1e-6)


def test_realize_with_schedule_step():
    """Tensor.realize(loss, *opt.schedule_step()), as in tinygrad: the loss sees the weights before the update."""
    w = Tensor([[1.0, -1.0]], requires_grad=True)
    x = Tensor([[2.0, 3.0]])
    opt = nn.optim.SGD([w], lr=0.1)
    with Tensor.train():
        for expect in (-1.0, -2.3):
            opt.zero_grad()
            loss = (x * w).sum()
            loss.backward()
            Tensor.realize(loss, *opt.schedule_step())
            assert abs(loss.item() - expect) < 1e-5
