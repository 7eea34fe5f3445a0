"""Tensor.shard over several devices in one process (tensor/multi.py): every op family on sharded inputs equals the
unsharded result (numpy/torch), gradients, optimizers, the all-reduce's schedule, state_dict."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Tensor
from zeptograd.helpers import ArgumentError
from zeptograd.uop.ops import Ops

D2 = ("CPU:0", "CPU:1")
RNG = np.random.default_rng(0)


def rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def close(t: Tensor, ref, tol=1e-5):
    ref = ref.detach().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref)
    np.testing.assert_allclose(t.numpy(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_shard_roundtrip_and_device(axis):
    a = rand(5, 6)  # 5 rows over 2 devices: 3 + 2 (uneven)
    x = Tensor(a).shard(D2, axis=axis)
    assert x.device == ("CPU", "CPU:1") and x.shape == (5, 6)
    close(x, a)
    close(x.to("CPU:1"), a)
    assert x.to("CPU:1").device == "CPU:1"


def test_uneven_sizes_and_errors():
    x = Tensor(rand(5, 3)).shard(("CPU:0", "CPU:1", "CPU:2"), axis=0)
    assert [p.shape for p in x.uop.src] == [(2, 3), (2, 3), (1, 3)]
    with pytest.raises(ArgumentError, match="size 3"):
        Tensor(rand(3, 2)).shard(("CPU:0", "CPU:1", "CPU:2", "CPU:3"), axis=0)
    with pytest.raises(ArgumentError, match="more than once"):
        Tensor(rand(3, 2)).shard(("CPU:1", "CPU:1"))


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_elementwise(axis):
    a, b = rand(4, 6), rand(4, 6)
    x, y = Tensor(a).shard(D2, axis), Tensor(b).shard(D2, axis)
    close((x * y + 2).exp2() - x.maximum(y), np.exp2(a * b + 2) - np.maximum(a, b))
    close((x > 0).where(x, y), np.where(a > 0, a, b))
    close((x + Tensor(b).shard(D2)).relu(), np.maximum(a + b, 0))  # sharded + replicated


def test_sharded_meets_unsharded_is_an_error():
    x = Tensor(rand(4, 2)).shard(D2, 0)
    with pytest.raises(ArgumentError, match="different devices"):
        x + Tensor(rand(4, 2), device="CPU:1")


def test_different_axes_reshard():
    a, b = rand(4, 6), rand(4, 6)
    close(Tensor(a).shard(D2, 0) + Tensor(b).shard(D2, 1), a + b)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "mean", "var", "argmax", "logsumexp", "softmax"])
def test_reduces(axis, op):
    a = rand(4, 6)
    ta = torch.tensor(a)
    x = Tensor(a).shard(D2, axis)
    for dim in (0, 1, None):
        if op in ("logsumexp", "softmax") and dim is None:
            continue
        ours = getattr(x, op)(dim) if dim is not None else getattr(x, op)()
        ref = getattr(ta, op)(dim) if dim is not None else getattr(ta, op)()
        if op in ("max", "min") and dim is not None:
            ref = ref.values
        close(ours, ref, 1e-4)


@pytest.mark.parametrize("xa,wa", [(None, 0), (1, 0), (0, None), (None, 1), (1, None)])
def test_matmul(xa, wa):
    """(4,6) @ (6,5): x sharded on its rows or the contraction, w on the contraction or its columns (tensor
    parallel), or replicated."""
    a, w = rand(4, 6), rand(6, 5)
    close(Tensor(a).shard(D2, xa) @ Tensor(w).shard(D2, wa), a @ w, 1e-4)


@pytest.mark.parametrize("axis", [0, 2])
def test_movement(axis):
    a = rand(4, 2, 6)
    x = Tensor(a).shard(D2, axis)
    close(x.permute(2, 0, 1), a.transpose(2, 0, 1))
    shape = (8, 6) if axis == 0 else (4, 2, 3, 2)
    close(x.reshape(shape), a.reshape(shape))
    close(x.reshape(-1), a.reshape(-1))
    close(x[:, 1:], a[:, 1:])
    close(x.pad(((0, 0), (1, 2), (0, 0))), np.pad(a, ((0, 0), (1, 2), (0, 0))))
    close(x.flip(1), a[:, ::-1])
    close(x.unsqueeze(1).expand(4, 3, 2, 6), np.broadcast_to(a[:, None], (4, 3, 2, 6)))
    # on the sharded axis itself (gathered and sharded again)
    close(x.flip(axis), np.flip(a, axis))
    close(x[1:3] if axis == 0 else x[..., 1:4], a[1:3] if axis == 0 else a[..., 1:4])
    close(x.cat(x, dim=axis), np.concatenate([a, a], axis))


def test_reshape_keeps_sharded_axis_per_device():
    x = Tensor(rand(4, 6)).shard(D2, 0)
    y = x.reshape(2, 2, 6)
    assert y.uop.op is Ops.MULTI and y.uop.arg == 0 and [p.shape for p in y.uop.src] == [(1, 2, 6), (1, 2, 6)]
    z = x.reshape(24)
    assert z.uop.arg == 0 and [p.shape for p in z.uop.src] == [(12,), (12,)]


def test_indexing():
    a = rand(6, 4)
    idx = np.array([3, 0, 5, 1])
    x = Tensor(a).shard(D2, 0)
    close(x[:, 2], a[:, 2])
    close(x[Tensor(idx).shard(D2)], a[idx])
    cols = np.array([0, 1, 2, 3, 0, 1])
    close(x.gather(1, Tensor(cols[:, None]).shard(D2, 0)), a[np.arange(6), cols][:, None])


def test_conv_batch_sharded():
    a, w = rand(4, 3, 8, 8), rand(5, 3, 3, 3)
    x = Tensor(a).shard(D2, 0)
    out = x.conv2d(Tensor(w).shard(D2), padding=1)
    ref = torch.nn.functional.conv2d(torch.tensor(a), torch.tensor(w), padding=1)
    close(out, ref, 1e-4)
    close(out.max_pool2d(), torch.nn.functional.max_pool2d(ref, 2), 1e-4)


@pytest.mark.parametrize("xa,wa", [(0, None), (None, 0), (None, 1), (1, 0)])
def test_backward_matmul(xa, wa):
    a, w = rand(4, 6), rand(6, 5)
    x = Tensor(a, requires_grad=True)
    wt = Tensor(w, requires_grad=True)
    x.shard_(D2, xa)
    wt.shard_(D2, wa)
    loss = (x @ wt).relu().sum()
    loss.backward()
    tx, tw = torch.tensor(a, requires_grad=True), torch.tensor(w, requires_grad=True)
    (tx @ tw).relu().sum().backward()
    close(loss, (tx @ tw).relu().sum(), 1e-4)
    assert x.grad is not None and wt.grad is not None
    assert x.grad.device == D2 or x.grad.device == ("CPU", "CPU:1")
    close(x.grad, tx.grad, 1e-4)
    close(wt.grad, tw.grad, 1e-4)


def test_all_reduce_schedule_counts():
    """A sum over the sharded axis on two devices: a partial-sum kernel on each, each partial copied to the other
    device, and one add kernel on each."""
    x = Tensor(rand(8, 4)).shard(D2, 0).realize()
    items = x.sum(0).schedule()
    copies = [i for i in items if i.ast.op is Ops.COPY]
    kernels = [i for i in items if i.ast.op is not Ops.COPY]
    assert len(copies) == 2 and len(kernels) == 4
    items3 = Tensor(rand(9, 4)).shard(("CPU:0", "CPU:1", "CPU:2"), 0).realize().sum(0).schedule()
    assert sum(i.ast.op is Ops.COPY for i in items3) == 6 and sum(i.ast.op is not Ops.COPY for i in items3) == 6


def test_all_reduce_replicas_bitwise_equal():
    s = Tensor(rand(1000, 3) * 1000).shard(("CPU:0", "CPU:1", "CPU:2"), 0).sum(0).realize()
    parts = [Tensor(p, device=d).numpy() for p, d in zip(s.uop.src, s.device)]
    assert all((p == parts[0]).all() for p in parts)


def test_assign_and_realize():
    a = rand(4, 3)
    x = Tensor(a).shard(D2, 0).realize()
    x.assign(x * 2).realize()
    close(x, a * 2)
    x += 1
    close(x, a * 2 + 1)


def test_state_dict_and_safe_save(tmp_path):
    from zeptograd import nn

    layer = nn.Linear(3, 4)
    for p in nn.state.get_parameters(layer):
        p.shard_(D2)
    layer.weight.shard_(D2, 0)
    sd = nn.state.get_state_dict(layer)
    path = str(tmp_path / "m.safetensors")
    nn.state.safe_save(sd, path)
    back = nn.state.safe_load(path)
    np.testing.assert_array_equal(back["weight"].numpy(), layer.weight.numpy())
    np.testing.assert_array_equal(back["bias"].numpy(), layer.bias.numpy())


@pytest.mark.parametrize("devices", [("CPU", "CL"), ("CPU", "CPU:1:C")])
@pytest.mark.slow
def test_other_device_kinds(devices):
    from zeptograd.device import Device

    try:
        for d in devices:
            Device[d]
    except Exception as e:  # no OpenCL platform here
        pytest.skip(str(e))
    a, w = rand(4, 6), rand(6, 3)
    x = Tensor(a).shard(devices, 0)
    close((x @ Tensor(w).shard(devices)).sum(0), (a @ w).sum(0), 1e-4)
    close(Tensor(a).shard(devices, 1) @ Tensor(w).shard(devices, 0), a @ w, 1e-4)
