"""Attention with one query row.

A kernel that reads a row buffer whose fill (the reduce over its row) went to another kernel computes the row's
value at each read (schedule/kernel.py: `lower_row_buffers`). With one query row, softmax's exp row is filled in its
sum's loop in a second kernel, while the first (e @ v) reads it in its own loop: there exp is recomputed from the
scores row, whose fill (the max's loop) and loads the recomputation brings in. Before, those reads of the scores row
were left unloaded (a pointer where a float is expected): invalid LLVM IR, C that does not compile.

Causal, the scores' max is a reduce gated by the key index (codegen/gated_reduce.py: `end_gated_reduces`); where the
output loop has a tail (codegen/opt/tail.py), each loop nest holds its own copy of that max over the same range, and
every copy ends at the bound: before, only the first did (two loops of one axis id: the linearizer found no order)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)

# (device, knobs): the LLVM and C renderers, no optimizer actions, the UOp interpreter
DEVICES = [("CPU", {}), ("CPU:C", {}), ("CPU-NOOPT", {"NOOPT": 1}), ("PYTHON", {})]


def arrays(*shapes) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def test_the_exp_row_is_recomputed_where_its_fill_is_in_another_kernel():
    """((e @ v) * g).sum(-1) / e.sum(-1), e = exp(s - max(s)), s = q @ k.T / 8, one query row: two kernels, each with
    the scores as a row buffer; the first (e @ v) holds no exp row (its fill, the sum, is the second kernel's) and loads
    every read of the scores row after the max's reduce that fills it."""
    qn, kn, vn, gn = arrays((1, 64), (64, 64), (64, 64), (1, 64))
    q, k, v, g = (Tensor(a) for a in (qn, kn, vn, gn))
    s = (q @ k.T) * 0.125
    e = (s - s.max(-1, keepdim=True)).exp()
    with Context(**{SCHEDULE_CACHE.key: 0}):
        items = [i for i in ((e @ v) * g).sum(-1).div(e.sum(-1)).schedule() if i.ast.op is Ops.SINK]
    assert len(items) == 2
    for item in items:
        nodes = item.ast.toposort()
        regs = [u for u in nodes if u.op is Ops.DEFINE_REG]
        assert regs, "the scores row is a row buffer in each kernel"
        for u in nodes:  # a row buffer is read through a LOAD (or written through a STORE), never as a value
            if u.op is Ops.INDEX and (u.src[0] in regs or (u.src[0].op is Ops.AFTER and u.src[0].src[0] in regs)):
                assert any(p.op in (Ops.LOAD, Ops.STORE) and p.src[0] is u for p in nodes), u


@pytest.mark.parametrize("device,knobs", DEVICES)
def test_the_smallest_program_matches_torch(device, knobs):
    qn, kn, vn, gn = arrays((1, 64), (64, 64), (64, 64), (1, 64))
    with Context(**knobs):
        q, k, v, g = (Tensor(a, device=device.split("-")[0]) for a in (qn, kn, vn, gn))
        s = (q @ k.T) * 0.125
        e = (s - s.max(-1, keepdim=True)).exp()
        got = ((e @ v) * g).sum(-1).div(e.sum(-1)).numpy()
    tq, tk, tv, tg = map(torch.from_numpy, (qn, kn, vn, gn))
    ts = (tq @ tk.T) * 0.125
    te = (ts - ts.max(-1, keepdim=True).values).exp()
    np.testing.assert_allclose(got, (((te @ tv) * tg).sum(-1) / te.sum(-1)).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device,knobs", DEVICES)
@pytest.mark.parametrize("d,keys", [(16, 64), (16, 128), (64, 64), (64, 128)])
def test_one_query_row_sdpa_backward_matches_torch(device, knobs, d, keys):
    """The output and the gradients of q, k and v of scaled_dot_product_attention with one query row, causal and
    not (with one query row, causal masks all keys but the first)."""
    for causal in (False, True):
        qn, kn, vn, gn = arrays((1, 1, 1, d), (1, 1, keys, d), (1, 1, keys, d), (1, 1, 1, d))
        with Context(**knobs):
            q, k, v = (Tensor(a, device=device.split("-")[0], requires_grad=True) for a in (qn, kn, vn))
            out = q.scaled_dot_product_attention(k, v, is_causal=causal)
            (out * Tensor(gn, device=device.split("-")[0])).sum().backward()
            got = [t.numpy() for t in (out, q.grad, k.grad, v.grad)]
        tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (qn, kn, vn))
        tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
        (tout * torch.from_numpy(gn)).sum().backward()
        want = [t.detach().numpy() for t in (tout, tq.grad, tk.grad, tv.grad)]
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{name} causal={causal}")


@pytest.mark.parametrize("d", [48, 96])
def test_causal_one_query_row_with_an_output_tail(d):
    """d = 96 on a host of 64-byte vectors, 48 on one of 32 (an output loop of 3 vectors: a main nest and a tail),
    on two cores: the forward's kernel compiles and matches torch."""
    qn, kn, vn = arrays((1, 1, 1, d), (1, 1, 64, d), (1, 1, 64, d))
    with Context(THREADS=2):
        got = Tensor(qn).scaled_dot_product_attention(Tensor(kn), Tensor(vn), is_causal=True).numpy()
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (qn, kn, vn)), is_causal=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
def test_rows_filled_in_one_loop_recomputed_together(device):
    """An Adam step of Linear -> train-mode BatchNorm -> relu -> Linear on 4 rows: a kernel recomputes the variance
    row at its reads, and its value holds the fill of the mean row (filled in the same loop), whose store the
    recomputation moves to the read's index. That store's target stays an INDEX (it was taken for a read of the mean
    row and replaced by its value: a STORE through an FDIV, which did not render). The weights after the step match
    torch's."""
    from zeptograd import nn

    rng = np.random.default_rng(0)
    xn, yn = rng.standard_normal((4, 6)).astype(np.float32), np.array([0, 2, 1, 0], np.int32)
    w1, w2, b2 = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((8, 6), (3, 8), (3,)))
    l1, bn, l2 = nn.Linear(6, 8, bias=False), nn.BatchNorm(8), nn.Linear(8, 3)
    l1.weight, l2.weight, l2.bias = (Tensor(a, device=device, requires_grad=True) for a in (w1, w2, b2))
    bn.weight, bn.bias = (
        Tensor.ones(8, device=device, requires_grad=True),
        Tensor.zeros(8, device=device, requires_grad=True),
    )
    bn.running_mean, bn.running_var = Tensor.zeros(8, device=device), Tensor.ones(8, device=device)
    params = [l1.weight, bn.weight, bn.bias, l2.weight, l2.bias]
    opt = nn.optim.Adam(params, lr=0.05)
    with Tensor.train():
        opt.zero_grad()
        l2(bn(l1(Tensor(xn, device=device))).relu()).sparse_categorical_crossentropy(
            Tensor(yn, device=device)
        ).backward()
        opt.step()
    t1, tb, t2 = torch.nn.Linear(6, 8, bias=False), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)
    with torch.no_grad():
        (
            t1.weight.copy_(torch.from_numpy(w1)),
            t2.weight.copy_(torch.from_numpy(w2)),
            t2.bias.copy_(torch.from_numpy(b2)),
        )
    topt = torch.optim.Adam([*t1.parameters(), *tb.parameters(), *t2.parameters()], lr=0.05)
    tout = t2(tb(t1(torch.from_numpy(xn))).relu())
    torch.nn.functional.cross_entropy(tout, torch.from_numpy(yn).long()).backward()
    topt.step()
    np.testing.assert_allclose(l1.weight.numpy(), t1.weight.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), tb.running_var.numpy(), rtol=1e-4, atol=1e-5)
