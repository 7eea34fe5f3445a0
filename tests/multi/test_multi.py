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


@pytest.mark.slow
@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod", "mean", "var", "argmax", "logsumexp", "softmax"])
def test_reduces(axis, op):
    a = rand(5, 7)  # uneven on both axes: 3 + 2 rows, 4 + 3 columns
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


@pytest.mark.slow
@pytest.mark.parametrize("xa,wa", [(None, 0), (1, 0), (0, None), (None, 1), (1, None)])
def test_matmul(xa, wa):
    """(5,7) @ (7,3): x sharded on its rows or the contraction, w on the contraction or its columns (tensor
    parallel), or replicated; every split uneven."""
    a, w = rand(5, 7), rand(7, 3)
    close(Tensor(a).shard(D2, xa) @ Tensor(w).shard(D2, wa), a @ w, 1e-4)


@pytest.mark.slow
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


@pytest.mark.slow
def test_conv_batch_sharded():
    a, w = rand(4, 3, 8, 8), rand(5, 3, 3, 3)
    x = Tensor(a).shard(D2, 0)
    out = x.conv2d(Tensor(w).shard(D2), padding=1)
    ref = torch.nn.functional.conv2d(torch.tensor(a), torch.tensor(w), padding=1)
    close(out, ref, 1e-4)
    close(out.max_pool2d(), torch.nn.functional.max_pool2d(ref, 2), 1e-4)
    # backward: conv's own gradient rule on each device (the weight is used whole by each), the weight's summed
    xt, wt = Tensor(a, requires_grad=True), Tensor(w, requires_grad=True)
    xt.shard_(D2, 0)
    wt.shard_(D2)
    xt.conv2d(wt, padding=1).relu().sum().backward()
    tx, tw = torch.tensor(a, requires_grad=True), torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, padding=1).relu().sum().backward()
    assert xt.grad is not None and wt.grad is not None
    close(xt.grad, tx.grad, 1e-4)
    close(wt.grad, tw.grad, 1e-3)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("devices", [("CPU", "CL"), ("CPU", "CPU:1:C")])
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


class _ConvNet:
    def __init__(self):
        from zeptograd import nn

        self.c1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)  # (a bias before BatchNorm has a zero gradient,
        self.bn, self.l1 = nn.BatchNorm2d(4), nn.Linear(4 * 4 * 4, 10)  # which Adam would scale up from rounding noise)

    def __call__(self, x: Tensor) -> Tensor:
        return self.l1(self.bn(self.c1(x)).relu().max_pool2d().flatten(1))


def _train(devices: tuple[str, ...] | None, opt_name: str) -> dict[str, np.ndarray]:
    """Three steps of a small convnet with BatchNorm on fixed digit-sized batches; with `devices` the batch is
    sharded over them and the weights replicated (data parallel)."""
    from zeptograd import nn

    Tensor.manual_seed(3)
    net = _ConvNet()
    params = nn.state.get_parameters(net)
    if devices is not None:
        for p in nn.state.get_state_dict(net).values():
            p.shard_(devices).realize()
    opt = getattr(nn.optim, opt_name)(params, lr=0.05)
    rng = np.random.default_rng(5)
    with Tensor.train():
        for _ in range(3):
            xb = Tensor(rng.random((8, 1, 8, 8), dtype=np.float32))
            yb = Tensor(rng.integers(0, 10, 8).astype(np.int32))
            if devices is not None:
                xb, yb = xb.shard(devices, 0), yb.shard(devices, 0)
            opt.zero_grad()
            loss = net(xb).sparse_categorical_crossentropy(yb)
            loss.backward()
            opt.step()
    return {k: v.numpy() for k, v in nn.state.get_state_dict(net).items()}


@pytest.mark.slow
@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_data_parallel_training_equals_one_device(opt_name):
    """Batch sharded over two devices, weights replicated, gradients all-reduced: the same parameters (and BatchNorm
    statistics: its batch mean is an all-reduce, so it normalizes over the global batch) as on one device."""
    one = _train(None, opt_name)
    two = _train(D2, opt_name)
    assert one.keys() == two.keys()
    for k in one:
        np.testing.assert_allclose(two[k], one[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.slow
def test_tensor_parallel_linear_training():
    """A Linear's weight sharded along its output axis and another's along its input axis (tensor parallel), SGD:
    the same parameters as on one device."""
    from zeptograd import nn

    def run(shard: bool) -> list[np.ndarray]:
        Tensor.manual_seed(1)
        l1, l2 = nn.Linear(6, 8), nn.Linear(8, 3)
        if shard:
            l1.weight.shard_(D2, 0).realize()
            l1.bias.shard_(D2, 0).realize()
            l2.weight.shard_(D2, 1).realize()
            l2.bias.shard_(D2).realize()
        opt = nn.optim.SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1, momentum=0.9)
        rng = np.random.default_rng(2)
        with Tensor.train():
            for _ in range(3):
                x = Tensor(rng.standard_normal((5, 6)).astype(np.float32))
                if shard:
                    x = x.shard(D2)
                opt.zero_grad()
                l2(l1(x).relu()).square().mean().backward()
                opt.step()
        return [t.numpy() for t in (l1.weight, l1.bias, l2.weight, l2.bias)]

    for a, b in zip(run(False), run(True)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_null_devices_schedule_only():
    """NULL:0 and NULL:1 run nothing: the schedule of a matmul over the sharded contraction axis is the per-device
    products, the all-reduce's 2 copies and 2 add kernels."""
    nd = ("NULL", "NULL:1")
    x = Tensor.empty(4, 6, device="NULL").shard(nd, 1).realize()
    w = Tensor.empty(6, 5, device="NULL").shard(nd, 0).realize()
    items = (x @ w).schedule()
    assert [i.device for i in items if i.ast.op is Ops.COPY] == ["NULL", "NULL:1"]
    assert [i.device for i in items if i.ast.op is not Ops.COPY] == ["NULL", "NULL:1", "NULL", "NULL:1"]


@pytest.mark.slow
def test_tinyjit_data_parallel_step():
    """A jitted training step on a batch sharded over two devices (sharded inputs and outputs are taken part by part):
    replays give the parameters of an unjitted one-device run."""
    from zeptograd import TinyJit, nn

    def run(devices: tuple[str, ...] | None) -> list[np.ndarray]:
        Tensor.manual_seed(4)
        l1, l2 = nn.Linear(6, 8), nn.Linear(8, 3)
        params = [l1.weight, l1.bias, l2.weight, l2.bias]
        if devices is not None:
            for p in params:
                p.shard_(devices).realize()
        opt = nn.optim.Adam(params, lr=0.05)

        def step(x: Tensor, y: Tensor) -> Tensor:
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
            return loss.realize()

        jitted = TinyJit(step) if devices is not None else step
        rng = np.random.default_rng(6)
        with Tensor.train():
            for _ in range(5):
                x = Tensor(rng.standard_normal((6, 6)).astype(np.float32))
                y = Tensor(rng.integers(0, 3, 6).astype(np.int32))
                if devices is not None:
                    x, y = x.shard(devices, 0).realize(), y.shard(devices, 0).realize()
                jitted(x, y)
        return [p.numpy() for p in params]

    for a, b in zip(run(None), run(D2)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
