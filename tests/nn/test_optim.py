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


@pytest.mark.slow
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


@pytest.mark.slow
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
    # the two step counters (b1**t, b2**t), m and v (one flat kernel each), one kernel per parameter
    assert GlobalCounters.kernel_count <= len(ps) + 4, GlobalCounters.kernel_count
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


@pytest.mark.slow
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


# ***** Muon, against torch.optim.Muon *****

MUON_SHAPES = [(4, 6), (7, 3), (5, 5)]
MUON_CASES = [
    dict(lr=0.02, momentum=0.95, nesterov=True),
    dict(lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.0),
    dict(lr=0.01, momentum=0.8, ns_steps=3, ns_coefficients=(2.0, -1.5, 0.5), weight_decay=0.05),
    dict(lr=0.01, adjust_lr_fn="match_rms_adamw"),
]


def _muon_runs(kw, fused, steps=10):
    rng = np.random.default_rng(4)
    init = [rng.standard_normal(s).astype(np.float32) for s in MUON_SHAPES]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in MUON_SHAPES] for _ in range(steps)]
    zout = run_zg(nn.optim.Muon, init, grads, fused=fused, **kw)
    tp = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    topt = torch.optim.Muon(tp, **kw)
    tout = []
    for gs in grads:
        for t, g in zip(tp, gs):
            t.grad = torch.tensor(g)
        topt.step()
        tout.append([t.detach().numpy().copy() for t in tp])
    return zout, tout


def _float32_newton_schulz(grad, ns_coefficients, ns_steps, eps):
    """torch's _zeropower_via_newtonschulz with its bfloat16 cast left out (zeptograd iterates in float32)."""
    a, b, c = ns_coefficients
    x = grad.float().T if grad.size(0) > grad.size(1) else grad.float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if grad.size(0) > grad.size(1) else x


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kw", MUON_CASES)
def test_muon_against_torch_in_float32(kw, fused, monkeypatch):
    import torch.optim._muon

    monkeypatch.setattr(torch.optim._muon, "_zeropower_via_newtonschulz", _float32_newton_schulz)
    zout, tout = _muon_runs(kw, fused)
    for step, (z, t) in enumerate(zip(zout, tout)):
        for a, b in zip(z, t):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6, err_msg=f"step {step}")


@pytest.mark.slow
@pytest.mark.parametrize("kw", MUON_CASES[:2])
def test_muon_against_torch(kw):
    # torch runs the Newton-Schulz iteration in bfloat16: after 10 steps the weights agree to its precision
    zout, tout = _muon_runs(kw, fused=True)
    for a, b in zip(zout[-1], tout[-1]):
        np.testing.assert_allclose(a, b, rtol=0, atol=5e-3)
    assert max(np.abs(a - b).max() for a, b in zip(zout[-1], tout[-1])) > 0  # (not compared with itself)


@pytest.mark.slow
def test_muon_errors():
    w, b = Tensor(np.ones((2, 3), np.float32), requires_grad=True), Tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ValueError, match=r"2-D parameters.*\(1, \(2,\)\)"):
        nn.optim.Muon([w, b])
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        nn.optim.Muon([w], adjust_lr_fn="bogus")
    with pytest.raises(ValueError, match="ns_steps"):
        nn.optim.Muon([w], ns_steps=100)
    with pytest.raises(ValueError, match="momentum"):
        nn.optim.Muon([w], momentum=-0.1)
    for bad in (dict(params=[torch.ones(2, requires_grad=True)]), dict(adjust_lr_fn="bogus")):
        with pytest.raises(ValueError):
            torch.optim.Muon(**{"params": [torch.ones(2, 3, requires_grad=True)], **bad})


# ***** LAMB's b1_t / b2_t state *****


def test_lamb_state_dict_carries_b1_t_b2_t():
    from zeptograd.nn.state import get_state_dict, load_state_dict

    init, grads = data(steps=5)
    full = run_zg(nn.optim.Adam, init, grads, lr=0.01)  # 5 steps in one go
    ps = [Tensor(a.copy(), requires_grad=True) for a in init]
    opt = nn.optim.Adam(ps, lr=0.01)
    with Tensor.train():
        for gs in grads[:3]:
            for p, g in zip(ps, gs):
                p.grad = Tensor(g)
            opt.step()
    sd = get_state_dict(opt)
    assert sd["b1_t"].shape == sd["b2_t"].shape == (1,)
    np.testing.assert_allclose(sd["b1_t"].numpy(), [0.9**3], rtol=1e-6)
    np.testing.assert_allclose(sd["b2_t"].numpy(), [0.999**3], rtol=1e-6)
    saved = {k: v.numpy().copy() for k, v in sd.items()}
    # a new optimizer (and parameters) loaded from that state dict resumes the bias correction where it was
    ps2 = [Tensor(np.zeros_like(a), requires_grad=True) for a in init]
    opt2 = nn.optim.Adam(ps2, lr=0.01)
    load_state_dict(opt2, saved)
    np.testing.assert_allclose(opt2.b1_t.numpy(), [0.9**3], rtol=1e-6)
    with Tensor.train():
        for gs in grads[3:]:
            for p, g in zip(ps2, gs):
                p.grad = Tensor(g)
            opt2.step()
    for a, b in zip([p.numpy() for p in ps2], full[-1]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
