"""Creation and movement ops against torch 2.13 (CPU), forward and backward."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.tensor.api_helpers import V, check, data
from zeptograd import Tensor, dtypes

# ----------------------------------------------------------------------------- creation


def test_full_zeros_ones_empty():
    for z, t in [
        (Tensor.zeros(2, 3), torch.zeros(2, 3)),
        (Tensor.ones((4,)), torch.ones(4)),
        (Tensor.full((2, 2), 7), torch.full((2, 2), 7, dtype=torch.int32)),
        (Tensor.full((3,), 2.5), torch.full((3,), 2.5)),
        (Tensor.full((2,), True), torch.full((2,), True)),
        (Tensor.zeros(2, dtype=dtypes.int64), torch.zeros(2, dtype=torch.int64)),
        (Tensor.ones(0, 3), torch.ones(0, 3)),
        (Tensor.zeros(()), torch.zeros(())),
    ]:
        check(lambda: z, lambda: t)
    e = Tensor.empty(2, 3, dtype=dtypes.int16)
    assert e.shape == (2, 3) and e.dtype == dtypes.int16 and e.numpy().shape == (2, 3)


def test_like():
    x = Tensor(data((2, 3), "int32", seed=1))
    for z, t in [
        (x.zeros_like(), torch.zeros(2, 3, dtype=torch.int32)),
        (x.ones_like(), torch.ones(2, 3, dtype=torch.int32)),
        (x.full_like(5), torch.full((2, 3), 5, dtype=torch.int32)),
        (x.full_like(0.5, dtype=dtypes.float32), torch.full((2, 3), 0.5)),
        (x.ones_like(dtype=dtypes.float16), torch.ones(2, 3, dtype=torch.float16)),
    ]:
        check(lambda: z, lambda: t)
    assert x.empty_like().shape == (2, 3) and x.empty_like().dtype == dtypes.int32
    assert x.rand_like(dtype=dtypes.float32).shape == (2, 3) and x.float().randn_like().dtype == dtypes.float32


@pytest.mark.parametrize(
    "args,kw",
    [
        ((5,), {}),
        ((2, 9), {}),
        ((10, 0, -3), {}),
        ((0.0, 1.0, 0.25), {}),
        ((-2.5, 2.0, 0.5), {}),
        ((5,), {"dtype": dtypes.float32}),
        ((3, 3), {}),
        ((1, 10, 4), {"dtype": dtypes.int64}),
    ],
)
def test_arange(args, kw):
    tk = {"dtype": {dtypes.float32: torch.float32, dtypes.int64: torch.int64}[kw["dtype"]]} if kw else {}
    z = Tensor.arange(*args, **kw)
    t = torch.arange(*args, **tk)
    if not kw and all(isinstance(a, int) for a in args):
        t = t.int()  # tinygrad's default int is int32
    check(lambda: z, lambda: t)


@pytest.mark.parametrize("start,stop,steps", [(0, 1, 5), (-3.5, 2, 8), (2, 2, 3), (1, 0, 1), (0, 10, 0)])
def test_linspace(start, stop, steps):
    check(lambda: Tensor.linspace(start, stop, steps), lambda: torch.linspace(start, stop, steps))


@pytest.mark.parametrize("n,m", [(3, None), (2, 4), (4, 2), (0, None)])
def test_eye(n, m):
    check(lambda: Tensor.eye(n, m), lambda: torch.eye(n, m if m is not None else n))
    check(lambda: Tensor.eye(n, m, dtype=dtypes.int32), lambda: torch.eye(n, m if m is not None else n).int())


def test_random_distributions():
    Tensor.manual_seed(0)
    u = Tensor.rand(20000).numpy()
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    n = Tensor.randn(20000).numpy()
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    r = Tensor.randint(20000, low=3, high=7).numpy()
    assert r.dtype == np.int32 and set(np.unique(r)) == {3, 4, 5, 6}
    g = Tensor.normal(20000, mean=2.0, std=0.5).numpy()
    assert abs(g.mean() - 2) < 0.02 and abs(g.std() - 0.5) < 0.02
    v = Tensor.uniform(20000, low=-3, high=-1).numpy()
    assert v.min() >= -3 and v.max() < -1
    s = Tensor.scaled_uniform(100, 50).numpy()
    assert np.abs(s).max() <= (100 * 50) ** -0.5
    b = (6 / (100 + 50)) ** 0.5
    assert np.abs(Tensor.glorot_uniform(100, 50).numpy()).max() <= b
    ku = Tensor.kaiming_uniform(200, 50, a=0.0).numpy()
    assert np.abs(ku).max() <= np.sqrt(6 / 50) and abs(ku.std() - np.sqrt(2 / 50)) < 0.01
    kn = Tensor.kaiming_normal(400, 50, a=0.0).numpy()
    assert abs(kn.std() - np.sqrt(2 / 50)) < 0.01
    assert Tensor.rand(2, 3, dtype=dtypes.float16).dtype == dtypes.float16


def test_manual_seed_reproducible():
    Tensor.manual_seed(42)
    a = Tensor.rand(5).numpy()
    b = Tensor.rand(5).numpy()
    Tensor.manual_seed(42)
    np.testing.assert_array_equal(Tensor.rand(5).numpy(), a)
    assert not np.array_equal(a, b)


def test_randperm_multinomial():
    Tensor.manual_seed(1)
    p = Tensor.randperm(10).numpy()
    assert sorted(p.tolist()) == list(range(10))
    w = Tensor([0.0, 1.0, 3.0, 0.0])
    s = w.multinomial(4000, replacement=True).numpy()
    assert s.dtype == np.int64 and set(np.unique(s)) == {1, 2} and 0.7 < (s == 2).mean() < 0.8
    s2 = Tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 5.0, 1.0]]).multinomial(2).numpy()
    assert s2.shape == (2, 2) and s2[0, 0] != s2[0, 1] and set(s2[1].tolist()) == {2, 3}
    with pytest.raises(ValueError):
        Tensor([1.0, 1.0]).multinomial(3)


# ----------------------------------------------------------------------------- movement

X3 = lambda: V(data((2, 3, 4), seed=2))  # noqa: E731
PERM = lambda: V(data((4, 3, 2), seed=3), lambda t: t.permute(2, 1, 0))  # noqa: E731

MOVE = {  # zeptograd fn, torch fn
    "reshape": (lambda t: t.reshape(4, -1), lambda t: t.reshape(4, -1)),
    "view": (lambda t: t.view(-1), lambda t: t.reshape(-1)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda t: t.permute(2, 0, 1)),
    "expand": (lambda t: t[:, :1].expand(2, 5, 4), lambda t: t[:, :1].expand(2, 5, 4)),
    "expand_new": (lambda t: t.expand(3, 2, 3, 4), lambda t: t.expand(3, 2, 3, 4)),
    "flip": (lambda t: t.flip(0, 2), lambda t: t.flip(0, 2)),
    "flatten": (lambda t: t.flatten(1), lambda t: t.flatten(1)),
    "unflatten": (lambda t: t.unflatten(2, (2, 2)), lambda t: t.unflatten(2, (2, 2))),
    "squeeze": (lambda t: t[:, :1].squeeze(), lambda t: t[:, :1].squeeze()),
    "squeeze_dim": (lambda t: t[:1].squeeze(0), lambda t: t[:1].squeeze(0)),
    "unsqueeze": (lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(-1)),
    "transpose": (lambda t: t.transpose(0, 2), lambda t: t.transpose(0, 2)),
    "T": (lambda t: t[0].T, lambda t: t[0].T),
    "shrink": (lambda t: t.shrink(((0, 1), None, (1, 3))), lambda t: t[0:1, :, 1:3]),
    "repeat": (lambda t: t.repeat(2, 1, 2), lambda t: t.repeat(2, 1, 2)),
    "repeat_more": (lambda t: t.repeat(2, 1, 1, 3), lambda t: t.repeat(2, 1, 1, 3)),
    "repeat_interleave": (lambda t: t.repeat_interleave(2, 1), lambda t: t.repeat_interleave(2, 1)),
    "repeat_interleave_flat": (lambda t: t.repeat_interleave(3), lambda t: t.repeat_interleave(3)),
    "roll": (lambda t: t.roll(1, 2), lambda t: t.roll(1, 2)),
    "roll_multi": (lambda t: t.roll((-1, 5), (0, 2)), lambda t: t.roll((-1, 5), (0, 2))),
    "roll_flat": (lambda t: t.roll(3), lambda t: t.roll(3)),
    "chunk": (lambda t: t.chunk(3, 2), lambda t: t.chunk(3, 2)),
    "split": (lambda t: t.split(2, 1), lambda t: t.split(2, 1)),
    "split_sizes": (lambda t: t.split([1, 3], -1), lambda t: t.split([1, 3], -1)),
    "unfold": (lambda t: t.unfold(2, 2, 1), lambda t: t.unfold(2, 2, 1)),
    "unfold_step": (lambda t: t.unfold(1, 2, 2), lambda t: t.unfold(1, 2, 2)),
    "diagonal": (lambda t: t.diagonal(), lambda t: t.diagonal()),
    "diagonal_off": (lambda t: t.diagonal(1, 1, 2), lambda t: t.diagonal(1, 1, 2)),
    "diagonal_neg": (lambda t: t.diagonal(-1, 2, 1), lambda t: t.diagonal(-1, 2, 1)),
    "tril": (lambda t: t.tril(), lambda t: t.tril()),
    "triu": (lambda t: t.triu(1), lambda t: t.triu(1)),
    "tril_neg": (lambda t: t.tril(-1), lambda t: t.tril(-1)),
    "cat": (lambda t: t.cat(t * 2, dim=1), lambda t: torch.cat([t, t * 2], 1)),
    "cat3": (lambda t: Tensor.cat(t, t[:, :1], t[:, 1:], dim=1), lambda t: torch.cat([t, t[:, :1], t[:, 1:]], 1)),
    "stack": (lambda t: Tensor.stack(t, t + 1, dim=1), lambda t: torch.stack([t, t + 1], 1)),
    "stack_last": (lambda t: t.stack(t, dim=-1), lambda t: torch.stack([t, t], -1)),
    "pad": (lambda t: t.pad((1, 2, 0, 1)), lambda t: F.pad(t, (1, 2, 0, 1))),
    "pad_value": (
        lambda t: t.pad(((1, 0), None, (2, 2)), value=-1.5),
        lambda t: F.pad(t, (2, 2, 0, 0, 1, 0), value=-1.5),
    ),
    "pad_neg": (lambda t: t.pad((-1, 2)), lambda t: F.pad(t, (-1, 2))),
    "pad_reflect": (lambda t: t.pad((2, 1, 1, 2), mode="reflect"), lambda t: F.pad(t, (2, 1, 1, 2), mode="reflect")),
    "pad_replicate": (
        lambda t: t.pad((3, 1, 0, 2), mode="replicate"),
        lambda t: F.pad(t, (3, 1, 0, 2), mode="replicate"),
    ),
    "pad_circular": (lambda t: t.pad((2, 3, 1, 0), mode="circular"), lambda t: F.pad(t, (2, 3, 1, 0), mode="circular")),
    "pad_to": (lambda t: t.pad_to(3, 4, 6), lambda t: F.pad(t, (0, 2, 0, 1, 0, 1))),
    "shrink_to": (lambda t: t.shrink_to(1, 2, None), lambda t: t[:1, :2]),
    "rearrange": (lambda t: t.rearrange("a b c -> c (a b)"), lambda t: t.permute(2, 0, 1).reshape(4, 6)),
    "rearrange_split": (
        lambda t: t.rearrange("a b (c d) -> (a c) b d", c=2),
        lambda t: t.reshape(2, 3, 2, 2).permute(0, 2, 1, 3).reshape(4, 3, 2),
    ),
    "rearrange_ellipsis": (lambda t: t.rearrange("a ... c -> c ... a 1"), lambda t: t.permute(2, 1, 0)[..., None]),
}


@pytest.mark.parametrize("op", list(MOVE))
def test_movement(op):
    zf, tf = MOVE[op]
    check(zf, tf, X3())


@pytest.mark.parametrize(
    "op",
    [
        "reshape",
        "permute",
        "flip",
        "cat",
        "pad_reflect",
        "repeat",
        "roll",
        "unfold",
        "diagonal",
        "tril",
        "stack",
        "chunk",
        "pad_circular",
    ],
)
def test_movement_noncontiguous(op):
    zf, tf = MOVE[op]
    check(zf, tf, PERM())


@pytest.mark.parametrize(
    "zf,tf",
    [
        (lambda t: t.reshape(1, 1), lambda t: t.reshape(1, 1)),
        (lambda t: t.unsqueeze(0), lambda t: t.unsqueeze(0)),
        (lambda t: t.expand(3), lambda t: t.expand(3)),
        (lambda t: t.flatten(), lambda t: t.flatten()),
        (lambda t: t.reshape(()).squeeze(), lambda t: t.squeeze()),
        (lambda t: t.pad(((0, 0),)) if False else t.repeat(2), lambda t: t.repeat(2)),
    ],
)
def test_movement_0d(zf, tf):
    check(zf, tf, V(data((), seed=4)))


@pytest.mark.parametrize(
    "zf,tf",
    [
        (lambda t: t.reshape(3, 0), lambda t: t.reshape(3, 0)),
        (lambda t: t.permute(1, 0), lambda t: t.permute(1, 0)),
        (lambda t: t.cat(t, dim=0), lambda t: torch.cat([t, t], 0)),
        (lambda t: t.pad((1, 1)), lambda t: F.pad(t, (1, 1))),
        (lambda t: t.flip(1), lambda t: t.flip(1)),
        (lambda t: t.expand(2, 0, 3), lambda t: t.expand(2, 0, 3)),
        (lambda t: t.repeat(2, 2), lambda t: t.repeat(2, 2)),
        (lambda t: t.tril(), lambda t: t.tril()),
    ],
)
def test_movement_zero_size(zf, tf):
    check(zf, tf, V(data((0, 3), seed=5)))


def test_cat_promotes_and_ints():
    a, b = data((2, 2), "int32", seed=6), data((1, 2), "float32", seed=7)
    check(lambda x, y: x.cat(y), lambda x, y: torch.cat([x, y]), V(a), V(b))
    check(lambda x, y: Tensor.cat([x, y]), lambda x, y: torch.cat([x, y]), V(a), V(a[:1]))
    check(lambda x: x.cat(x, dim=1), lambda x: torch.cat([x, x], 1), V(data((2, 2), "bool", seed=8)))


def test_diag():
    check(lambda t: t.diag(), torch.diag, V(data((4,), seed=9)))
    check(lambda t: t.diag(1), lambda t: torch.diag(t, 1), V(data((3,), seed=10)))
    check(lambda t: t.diag(-2), lambda t: torch.diag(t, -2), V(data((3,), seed=10)))
    check(lambda t: t.diag(), torch.diag, V(data((3, 4), seed=11)))


def test_meshgrid():
    a, b, c = V(data((3,), seed=12)), V(data((4,), seed=13)), V(data((2,), seed=14))
    check(lambda x, y: x.meshgrid(y), lambda x, y: torch.meshgrid(x, y, indexing="ij"), a, b)
    check(lambda x, y: x.meshgrid(y, indexing="xy"), lambda x, y: torch.meshgrid(x, y, indexing="xy"), a, b)
    check(
        lambda x, y, z: x.meshgrid(y, z, indexing="xy"), lambda x, y, z: torch.meshgrid(x, y, z, indexing="xy"), a, b, c
    )


def test_movement_errors():
    t = Tensor.ones(2, 3)
    with pytest.raises(ValueError):
        t.reshape(4, -1)
    with pytest.raises(ValueError):
        t.expand(3, 3)
    with pytest.raises(ValueError):
        t.split([1, 1], 1)
    with pytest.raises(ValueError):
        t.cat(Tensor.ones(2, 2))
    with pytest.raises(ValueError):
        t.pad((3, 3), mode="reflect")
    with pytest.raises(ValueError):
        t.pad((1, 1), mode="wrap")
    with pytest.raises(ValueError):
        t.rearrange("a b -> a c")
    with pytest.raises(IndexError):
        t.unsqueeze(3)
    with pytest.raises(ValueError):
        t.unfold(1, 4, 1)


def test_broadcast_mismatch_raises():
    for a, b in [((3, 4), (2, 4)), ((2, 3), (3, 2)), ((0, 3), (2, 3))]:
        with pytest.raises(ValueError, match="broadcast"):
            Tensor.ones(*a) + Tensor.ones(*b)
        with pytest.raises(ValueError, match="broadcast"):
            Tensor.ones(*a).where(Tensor.ones(*b), 0)
