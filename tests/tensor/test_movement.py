"""Movement ops (reshape, permute, expand, pad, shrink, flip, cat, repeat, roll, unfold, rearrange, ...) against torch
2.13 (`check`: values and gradients) and numpy (`check_numpy`), on plain, 0-d, zero-size and non-contiguous inputs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.slow import fast_first
from tests.tensor.api_helpers import V, check, check_numpy, data
from zeptograd import Tensor

# ----------------------------------------------------------------------------- one table, numpy and torch

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


# zeptograd's own spellings (tuples of pairs, None for a whole axis) against numpy; the entries above also run with
# numpy where a numpy fn is given in NP_MOVE
NUMPY_MOVE = {  # zeptograd fn, numpy fn
    "reshape_args": (lambda t: t.reshape(6, 4), lambda x: x.reshape(6, 4)),
    "reshape_tuple": (lambda t: t.reshape((4, 6)), lambda x: x.reshape(4, 6)),
    "reshape_flat": (lambda t: t.reshape(-1), lambda x: x.reshape(-1)),
    "reshape_infer_mid": (lambda t: t.reshape(2, -1, 2), lambda x: x.reshape(2, -1, 2)),
    "permute_tuple": (lambda t: t.permute((1, 2, 0)), lambda x: x.transpose(1, 2, 0)),
    "transpose_default": (lambda t: t.transpose(), lambda x: x.swapaxes(1, 0)),
    "transpose_neg": (lambda t: t.transpose(-1, -2), lambda x: x.swapaxes(-1, -2)),
    "flip_one": (lambda t: t.flip(0), lambda x: x[::-1]),
    "flip_tuple": (lambda t: t.flip((0, 2)), lambda x: x[::-1, :, ::-1]),
    "shrink_all": (lambda t: t.shrink(((0, 1), (1, 3), (0, 4))), lambda x: x[0:1, 1:3, 0:4]),
    "shrink_none": (lambda t: t.shrink((None, (2, 3), None)), lambda x: x[:, 2:3, :]),
    "shrink_empty": (lambda t: t.shrink(((1, 1), None, None)), lambda x: x[1:1]),
    "pad_pairs": (lambda t: t.pad(((1, 0), (0, 2), (1, 1))), lambda x: np.pad(x, ((1, 0), (0, 2), (1, 1)))),
    "pad_none": (lambda t: t.pad((None, (1, 1), None)), lambda x: np.pad(x, ((0, 0), (1, 1), (0, 0)))),
    "pad_pairs_value": (
        lambda t: t.pad(((0, 0), (2, 0), (0, 1)), value=-1.5),
        lambda x: np.pad(x, ((0, 0), (2, 0), (0, 1)), constant_values=-1.5),
    ),
    "unsqueeze_front": (lambda t: t.unsqueeze(0), lambda x: x[None]),
    "flatten_all": (lambda t: t.flatten(), lambda x: x.reshape(-1)),
    "flatten_range": (lambda t: t.flatten(0, 1), lambda x: x.reshape(6, 4)),
    "getitem_int": (lambda t: t[1], lambda x: x[1]),
    "getitem_neg_ints": (lambda t: t[-1, 2], lambda x: x[-1, 2]),
    "getitem_slice": (lambda t: t[:, 1:3], lambda x: x[:, 1:3]),
    "getitem_step": (lambda t: t[:, :, ::2], lambda x: x[:, :, ::2]),
    "getitem_mixed": (lambda t: t[0, 1:, -3:-1], lambda x: x[0, 1:, -3:-1]),
    "getitem_past_end": (lambda t: t[:, 5:], lambda x: x[:, 5:]),
}
# MOVE entries that numpy also checks (the same call on the same input)
NP_MOVE = {
    "permute": lambda x: x.transpose(2, 0, 1),
    "transpose": lambda x: x.swapaxes(0, 2),
    "unsqueeze": lambda x: x[..., None],
    "flatten": lambda x: x.reshape(2, 12),
}


@pytest.mark.parametrize("op", fast_first(list(MOVE)))
def test_movement(op):
    zf, tf = MOVE[op]
    x = X3()
    check(zf, tf, x)
    if op in NP_MOVE:
        check_numpy(zf(Tensor(x.arr)), NP_MOVE[op](x.arr))


@pytest.mark.parametrize("op", fast_first(list(NUMPY_MOVE)))
def test_movement_numpy(op):
    zf, npf = NUMPY_MOVE[op]
    x = X3().arr
    check_numpy(zf(Tensor(x)), npf(x))


@pytest.mark.parametrize(
    "shape,new",
    fast_first(
        [
            ((3, 1), (3, 4)),
            ((1, 4), (5, 4)),
            ((4,), (2, 3, 4)),
            ((), (2, 3)),
            ((2, 1, 1), (2, 3, 0)),
        ],
        unpack=True,
    ),
)
def test_expand(shape, new):
    x = data(shape, seed=4)
    check_numpy(Tensor(x).expand(new), np.broadcast_to(x, new))
    check_numpy(Tensor(x).expand(*new), np.broadcast_to(x, new))


def test_expand_minus_one_keeps_dim():
    x = data((3, 1), seed=4)
    check_numpy(Tensor(x).expand(-1, 5), np.broadcast_to(x, (3, 5)))


@pytest.mark.parametrize(
    "shape,dim",
    fast_first(
        [((1, 3, 1), None), ((1, 3, 1), 0), ((1, 3, 1), -1), ((1, 3, 1), 1), ((1,), None), ((), None)], unpack=True
    ),
)
def test_squeeze(shape, dim):
    x = data(shape, seed=5)
    t = Tensor(x).squeeze() if dim is None else Tensor(x).squeeze(dim)
    if dim is None:
        expected = np.squeeze(x)
    elif shape[dim] == 1:
        expected = np.squeeze(x, dim)
    else:
        expected = x  # squeezing a non-1 dim is a no-op (torch semantics)
    check_numpy(t, expected)


def test_T_and_0d_movement():
    x = data((3, 5), seed=6)
    check_numpy(Tensor(x).T, x.T)
    s = Tensor(2.5)
    check_numpy(s.reshape(()), np.array(2.5, np.float32))
    check_numpy(s.expand(2, 2), np.full((2, 2), 2.5, np.float32))
    check_numpy(Tensor([7.0]).reshape(()), np.array(7.0, np.float32))


def test_movement_empty():
    x = data((2, 0, 4), seed=7)
    t = Tensor(x)
    check_numpy(t.permute(2, 0, 1), x.transpose(2, 0, 1))
    check_numpy(t.reshape(0, 8), x.reshape(0, 8))
    check_numpy(t.pad(((0, 0), (1, 1), (0, 0)), value=3.0), np.pad(x, ((0, 0), (1, 1), (0, 0)), constant_values=3.0))
    check_numpy(t.flip(2), x[:, :, ::-1])
    check_numpy(t[1], x[1])


def test_movement_chain_int_dtype():
    x = data((4, 6), "int32", lo=-100, hi=100, seed=8)
    t = (
        Tensor(x)
        .reshape(2, 2, 6)
        .permute(2, 0, 1)
        .flip(0)
        .shrink(((1, 5), None, (0, 1)))
        .pad(((0, 1), (1, 0), None), value=9)
    )
    e = np.pad(x.reshape(2, 2, 6).transpose(2, 0, 1)[::-1][1:5, :, 0:1], ((0, 1), (1, 0), (0, 0)), constant_values=9)
    check_numpy(t, e, "int32")


@pytest.mark.parametrize(
    "op",
    fast_first(
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
        ]
    ),
)
def test_movement_noncontiguous(op):
    zf, tf = MOVE[op]
    check(zf, tf, PERM())


@pytest.mark.parametrize(
    "zf,tf",
    fast_first(
        [
            (lambda t: t.reshape(1, 1), lambda t: t.reshape(1, 1)),
            (lambda t: t.unsqueeze(0), lambda t: t.unsqueeze(0)),
            (lambda t: t.expand(3), lambda t: t.expand(3)),
            (lambda t: t.flatten(), lambda t: t.flatten()),
            (lambda t: t.reshape(()).squeeze(), lambda t: t.squeeze()),
            (lambda t: t.repeat(2), lambda t: t.repeat(2)),
        ],
        unpack=True,
    ),
)
def test_movement_0d(zf, tf):
    check(zf, tf, V(data((), seed=4)))


@pytest.mark.parametrize(
    "zf,tf",
    fast_first(
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
        unpack=True,
    ),
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


@pytest.mark.slow
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
