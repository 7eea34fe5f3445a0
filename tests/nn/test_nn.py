"""zeptograd.nn layers against torch.nn: the same weights and inputs give the same outputs and gradients; the
initializations have PyTorch's shapes and bounds; BatchNorm's running statistics and train/eval behaviour."""

import math

import numpy as np
import pytest
import torch

from tests.slow import fast_first
from zeptograd import GlobalCounters, Tensor, dtypes, nn
from zeptograd.nn.state import get_state_dict


def rnd(*shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def copy_weights(zmod, tmod):
    """torch module's parameters and buffers into the zeptograd layer, by PyTorch's state_dict names."""
    zsd = get_state_dict(zmod)
    for k, v in tmod.state_dict().items():
        zsd[k].assign(Tensor(v.detach().numpy().copy(), dtype=zsd[k].dtype)).realize()
    return zsd


def check(zmod, tmod, x: np.ndarray, grad: bool = True, rtol=1e-4, atol=1e-5, train=False):
    """Forward (and backward of sum(out * r)) of both on x; compares outputs, input and parameter gradients."""
    zsd = copy_weights(zmod, tmod)
    zx, tx = Tensor(x, requires_grad=grad), torch.tensor(x, requires_grad=grad)
    params = {k: v for k, v in zsd.items() if dtypes.is_float(v.dtype) and "running" not in k}
    if grad:
        for v in params.values():
            v.requires_grad_(True)
    with Tensor.train(train):
        zout = zmod(zx)
    tmod.train(train)
    tout = tmod(tx)
    np.testing.assert_allclose(zout.numpy(), tout.detach().numpy(), rtol=rtol, atol=atol)
    if not grad:
        return zout
    r = rnd(*tout.shape, seed=7)
    (zout * Tensor(r)).sum().backward()
    (tout * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(zx.grad.numpy(), tx.grad.numpy(), rtol=rtol * 10, atol=atol * 10)
    tparams = dict(tmod.named_parameters())
    for k, v in params.items():
        np.testing.assert_allclose(v.grad.numpy(), tparams[k].grad.numpy(), rtol=rtol * 10, atol=atol * 10, err_msg=k)
    return zout


@pytest.mark.slow
def test_linear():
    check(nn.Linear(5, 3), torch.nn.Linear(5, 3), rnd(4, 5))
    check(nn.Linear(5, 3, bias=False), torch.nn.Linear(5, 3, bias=False), rnd(2, 3, 5), grad=False)


@pytest.mark.slow
def test_conv2d_padding_stride_groups():
    check(
        nn.Conv2d(4, 6, 3, padding=1, stride=2, groups=2),
        torch.nn.Conv2d(4, 6, 3, padding=1, stride=2, groups=2),
        rnd(2, 4, 7, 7),
    )
    check(
        nn.Conv2d(2, 3, (3, 2), padding="same", dilation=(2, 1)),
        torch.nn.Conv2d(2, 3, (3, 2), padding="same", dilation=(2, 1)),
        rnd(1, 2, 6, 5),
        grad=False,
    )


@pytest.mark.slow
def test_conv1d():
    check(nn.Conv1d(3, 4, 3, padding=1), torch.nn.Conv1d(3, 4, 3, padding=1), rnd(2, 3, 9))


@pytest.mark.slow
def test_conv_transpose():
    check(
        nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
        torch.nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=1),
        rnd(2, 4, 4, 4),
        grad=False,
    )
    check(nn.ConvTranspose1d(2, 3, 3, stride=2), torch.nn.ConvTranspose1d(2, 3, 3, stride=2), rnd(2, 2, 5))


@pytest.mark.slow
def test_batchnorm_train_eval_and_running_stats():
    z, t = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    copy_weights(z, t)
    for i in range(2):
        x = rnd(4, 3, 2, 2, seed=i, scale=2.0) + i
        with Tensor.train():
            zout = z(Tensor(x)).realize(z.running_mean, z.running_var, z.num_batches_tracked)
        t.train()
        np.testing.assert_allclose(zout.numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(z.running_mean.numpy(), t.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z.running_var.numpy(), t.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert z.num_batches_tracked.numpy() == 2 and z.num_batches_tracked.dtype == dtypes.int64
    x = rnd(2, 3, 2, 2, seed=5)
    t.eval()  # eval: the running statistics, which stay as they are
    np.testing.assert_allclose(z(Tensor(x)).numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(z.running_mean.numpy(), t.running_mean.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_batchnorm_gradients_and_separate_buffers():
    check(nn.BatchNorm(3), torch.nn.BatchNorm1d(3), rnd(5, 3), train=True)
    a, b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)  # each layer owns its running statistics
    with Tensor.train():
        a(Tensor(rnd(2, 4, 3, 3) + 5)).realize(a.running_mean)
    assert np.all(b.running_mean.numpy() == 0) and np.all(a.running_mean.numpy() != 0)


@pytest.mark.slow
def test_sync_batchnorm_outside_a_job_is_batchnorm():
    """torch's nn.SyncBatchNorm without a process group (here: no distributed job of several ranks) is BatchNorm;
    over 2 ranks, tests/distributed/test_data_parallel.py compares it with the whole batch."""
    check(nn.SyncBatchNorm(3), torch.nn.BatchNorm1d(3), rnd(5, 3), train=True)
    z, t = nn.SyncBatchNorm(3), torch.nn.BatchNorm2d(3)
    with Tensor.train():
        z(Tensor(rnd(4, 3, 2, 2, scale=2.0))).realize(z.running_mean, z.running_var)
    t.train()
    t(torch.tensor(rnd(4, 3, 2, 2, scale=2.0)))
    np.testing.assert_allclose(z.running_var.numpy(), t.running_var.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_layernorms():
    check(nn.LayerNorm(6), torch.nn.LayerNorm(6), rnd(2, 3, 6))
    check(
        nn.LayerNorm((3, 4), elementwise_affine=False),
        torch.nn.LayerNorm((3, 4), elementwise_affine=False),
        rnd(2, 3, 4),
        grad=False,
    )
    z = nn.LayerNorm2d(3)
    x = rnd(2, 3, 4, 4)
    ref = torch.nn.functional.layer_norm(torch.tensor(x).permute(0, 2, 3, 1), (3,)).permute(0, 3, 1, 2)
    np.testing.assert_allclose(z(Tensor(x)).numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="last dimensions"):
        nn.LayerNorm(5)(Tensor(rnd(2, 4)))


@pytest.mark.slow
def test_group_instance_rms_norm():
    check(nn.GroupNorm(2, 4), torch.nn.GroupNorm(2, 4), rnd(3, 4, 5))
    check(nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True), rnd(2, 3, 4, 4), grad=False)
    check(nn.RMSNorm(6, eps=1e-6), torch.nn.RMSNorm(6, eps=1e-6), rnd(2, 6))


def test_embedding():
    z, t = nn.Embedding(7, 3), torch.nn.Embedding(7, 3)
    copy_weights(z, t)
    z.weight.requires_grad_(True)
    idx = np.array([[0, 6, 2], [2, 2, 5]], dtype=np.int32)
    zout, tout = z(Tensor(idx)), t(torch.tensor(idx, dtype=torch.long))
    np.testing.assert_allclose(zout.numpy(), tout.detach().numpy(), rtol=1e-6)
    r = rnd(2, 3, 3, seed=3)
    (zout * Tensor(r)).sum().backward()
    (tout * torch.tensor(r)).sum().backward()
    np.testing.assert_allclose(z.weight.grad.numpy(), t.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="integer"):
        z(Tensor([1.0]))


@pytest.mark.slow
def test_lstm_cell():
    z, t = nn.LSTMCell(3, 4), torch.nn.LSTMCell(3, 4)
    copy_weights(z, t)
    x, h, c = rnd(2, 3), rnd(2, 4, seed=1), rnd(2, 4, seed=2)
    zh, zc = z(Tensor(x), (Tensor(h), Tensor(c)))
    th, tc = t(torch.tensor(x), (torch.tensor(h), torch.tensor(c)))
    np.testing.assert_allclose(zh.numpy(), th.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(zc.numpy(), tc.detach().numpy(), rtol=1e-5, atol=1e-6)
    zh0, _ = z(Tensor(x))
    np.testing.assert_allclose(zh0.numpy(), t(torch.tensor(x))[0].detach().numpy(), rtol=1e-5, atol=1e-6)


def test_state_dict_names_match_torch():
    pairs = [
        (nn.Linear(2, 3), torch.nn.Linear(2, 3)),
        (nn.Conv2d(2, 4, 3), torch.nn.Conv2d(2, 4, 3)),
        (nn.ConvTranspose2d(2, 4, 3), torch.nn.ConvTranspose2d(2, 4, 3)),
        (nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)),
        (nn.LayerNorm(3), torch.nn.LayerNorm(3)),
        (nn.GroupNorm(1, 2), torch.nn.GroupNorm(1, 2)),
        (nn.Embedding(5, 2), torch.nn.Embedding(5, 2)),
        (nn.LSTMCell(2, 3), torch.nn.LSTMCell(2, 3)),
    ]
    for z, t in pairs:
        zsd = get_state_dict(z)
        assert set(zsd) == set(t.state_dict()), type(z).__name__
        for k, v in t.state_dict().items():
            assert zsd[k].shape == tuple(v.shape), (type(z).__name__, k)


@pytest.mark.parametrize(
    "make, bound",
    fast_first(
        [
            (lambda: nn.Linear(50, 40).weight, 1 / math.sqrt(50)),
            (lambda: nn.Conv2d(6, 8, 3, groups=2).weight, 1 / math.sqrt(3 * 9)),
            (lambda: nn.ConvTranspose2d(6, 8, 3).weight, 1 / math.sqrt(8 * 9)),
            (lambda: nn.LSTMCell(5, 16).weight_hh, 1 / math.sqrt(16)),
        ],
        unpack=True,
    ),
)
def test_uniform_init_bounds(make, bound):
    Tensor.manual_seed(1)
    w = make().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert abs(w.mean()) < 0.1 * bound


@pytest.mark.slow
def test_norm_and_embedding_init():
    assert np.all(nn.LayerNorm(4).weight.numpy() == 1) and np.all(nn.GroupNorm(2, 4).bias.numpy() == 0)
    bn = nn.BatchNorm2d(3)
    assert np.all(bn.running_var.numpy() == 1) and not bn.running_mean.requires_grad
    w = nn.Embedding(100, 50).weight.numpy()  # N(0, 1), as PyTorch
    assert abs(w.std() - 1) < 0.05 and abs(w.mean()) < 0.05


def test_batchnorm_loads_a_torch_era_num_batches_tracked(tmp_path):
    from zeptograd.nn.state import load_state_dict, torch_load

    t = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        t.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0]))
    sd = t.state_dict()
    sd["num_batches_tracked"] = torch.tensor([7])  # saved with shape (1,), as older torch versions did
    torch.save(sd, tmp_path / "bn.pt")
    t2 = torch.nn.BatchNorm2d(3)
    t2.load_state_dict(torch.load(tmp_path / "bn.pt"))  # torch takes it
    z = nn.BatchNorm2d(3)
    load_state_dict(z, torch_load(tmp_path / "bn.pt"))
    assert z.num_batches_tracked.shape == () and z.num_batches_tracked.item() == t2.num_batches_tracked.item() == 7
    np.testing.assert_array_equal(z.running_mean.numpy(), [1.0, 2.0, 3.0])
    load_state_dict(z, {**get_state_dict(z), "num_batches_tracked": np.array([9], np.int64)})  # numpy too
    assert z.num_batches_tracked.item() == 9
    # as torch, only a one-element vector: (2,) and (1, 1) into () are still shape mismatches
    for bad in (np.array([1, 2]), np.array([[1]])):
        with pytest.raises(ValueError, match="num_batches_tracked"):
            load_state_dict(z, {**get_state_dict(z), "num_batches_tracked": bad})
        with pytest.raises(RuntimeError, match="num_batches_tracked"):
            t2.load_state_dict({**t2.state_dict(), "num_batches_tracked": torch.tensor(bad)})


@pytest.mark.slow
def test_layer_parameters_require_grad_without_an_optimizer():
    layers = [
        (nn.Linear(3, 2), torch.nn.Linear(3, 2)),
        (nn.Conv2d(2, 2, 3), torch.nn.Conv2d(2, 2, 3)),
        (nn.ConvTranspose2d(2, 2, 3), torch.nn.ConvTranspose2d(2, 2, 3)),
        (nn.BatchNorm2d(2), torch.nn.BatchNorm2d(2)),
        (nn.LayerNorm(3), torch.nn.LayerNorm(3)),
        (nn.GroupNorm(1, 2), torch.nn.GroupNorm(1, 2)),
        (nn.InstanceNorm(2), torch.nn.InstanceNorm2d(2, affine=True)),
        (nn.RMSNorm(3), torch.nn.RMSNorm(3)),
        (nn.Embedding(4, 3), torch.nn.Embedding(4, 3)),
        (nn.LSTMCell(2, 3), torch.nn.LSTMCell(2, 3)),
    ]
    for z, t in layers:
        tsd = dict(t.named_parameters())
        for k, v in get_state_dict(z).items():
            assert v.requires_grad is (k in tsd), (type(z).__name__, k, v.requires_grad)
    # loss.backward() fills every parameter's .grad, equal to torch's, with no optimizer created
    z, t = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    copy_weights(z, t)
    x = rnd(4, 3)
    z(Tensor(x)).square().sum().backward()
    t(torch.tensor(x)).square().sum().backward()
    np.testing.assert_allclose(z.weight.grad.numpy(), t.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z.bias.grad.numpy(), t.bias.grad.numpy(), rtol=1e-5, atol=1e-6)
    # plain Tensors keep requires_grad None: nothing to differentiate (tinygrad 0.12+ would fill .grad)
    a = Tensor(x)
    assert a.requires_grad is None
    with pytest.raises(RuntimeError, match="requires grad"):
        (a * 2).sum().backward()


def test_parameters_stay_lazy_and_seeded():
    Tensor.manual_seed(3)
    a = nn.Linear(4, 5).weight.numpy()
    Tensor.manual_seed(3)
    GlobalCounters.reset()
    b = nn.Linear(4, 5)
    assert b.weight.requires_grad and GlobalCounters.kernel_count == 0  # nothing drawn yet
    np.testing.assert_array_equal(b.weight.numpy(), a)
