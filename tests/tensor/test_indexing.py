"""Indexing against torch 2.13 (CPU): __getitem__ (ints, slices with any step, None, Ellipsis, int and bool tensor
indices), gather, scatter, scatter_reduce, masked ops, nonzero; __setitem__ and assign stay lazy."""

import numpy as np
import pytest
import torch

from tests.slow import fast_first
from tests.tensor.api_helpers import V, check, data
from zeptograd import GlobalCounters, Tensor, dtypes

X = lambda: V(data((4, 5, 6), seed=1))  # noqa: E731


def tindex(t, idx):
    """torch's t[idx] with numpy's negative slice steps (torch has none): flip those dims, then slice forward"""
    idx = idx if isinstance(idx, tuple) else (idx,)
    consumed = sum(1 for i in idx if i is not None and i is not Ellipsis)
    items = [j for i in idx for j in ([slice(None)] * (t.ndim - consumed) if i is Ellipsis else [i])]
    out, dim = [], 0
    for i in items:
        if isinstance(i, slice) and i.step is not None and i.step < 0:
            start, stop, step = i.indices(t.shape[dim])
            n, t = len(range(start, stop, step)), t.flip(dim)
            first = t.shape[dim] - 1 - start
            i = slice(first, first + n * -step, -step) if n else slice(0, 0)
        out.append(i)
        dim += i is not None
    return t[tuple(out)]


BASIC = [
    (1,),
    (-1,),
    (slice(1, 3),),
    (slice(None, None, 2),),
    (slice(None, None, -1),),
    (slice(4, 0, -2),),
    (slice(-2, None),),
    (slice(5, 1),),
    (1, 2, 3),
    (-1, slice(None), 0),
    (Ellipsis, 1),
    (None,),
    (1, None, 2),
    (Ellipsis, None),
    (slice(None), None, slice(1, 4, 2), Ellipsis),
    (slice(None, None, -3), 2, slice(6, None, -4)),
    (Ellipsis,),
    (0, Ellipsis, 0),
    (slice(10, 20),),
]


@pytest.mark.parametrize("idx", fast_first(BASIC), ids=[str(i) for i in range(len(BASIC))])
def test_getitem_basic(idx):
    check(lambda t: t[idx], lambda t: tindex(t, idx), X())


def test_getitem_views_and_0d():
    check(
        lambda t: t[1:, ::-1],
        lambda t: tindex(t, (slice(1, None), slice(None, None, -1))),
        V(data((4, 3), seed=2), lambda t: t.permute(1, 0)),
    )
    check(lambda t: t[..., None], lambda t: t[..., None], V(data((), seed=3)))
    check(lambda t: t[None, None], lambda t: t[None, None], V(data((), seed=3)))
    check(lambda t: t[1:1], lambda t: t[1:1], V(data((0, 3), seed=4)))


def _ti(*a):
    return np.array(a, np.int64)


ADV = [  # index made of tensors (given as numpy, turned into a Tensor per library) and basic items
    (_ti(0, 3, 1),),
    (_ti(-1, 0),),
    (_ti(1, 2), _ti(0, 4)),
    (slice(None), _ti(4, 0, 4)),
    (Ellipsis, _ti(5, 0)),
    (_ti(1), slice(1, 3), _ti(2)),
    (0, _ti(1, 3)),
    (_ti([0, 1], [2, 3]),),
    (_ti([0], [3]), _ti(1, 2)),
    (slice(None, None, -1), _ti(2, 2, 0), 1),
    (_ti(1, 0), None, _ti(0, 1)),
]


def _lift(idx, lib):
    return tuple((Tensor(i) if lib == "z" else torch.tensor(i)) if isinstance(i, np.ndarray) else i for i in idx)


@pytest.mark.parametrize("idx", fast_first(ADV), ids=[str(i) for i in range(len(ADV))])
def test_getitem_tensor(idx):
    check(lambda t: t[_lift(idx, "z")], lambda t: tindex(t, _lift(idx, "t")), X())


@pytest.mark.slow
def test_getitem_bool_and_lists():
    x = data((4, 5), seed=5)
    m = data((4, 5), "bool", seed=6)
    check(lambda t: t[Tensor(m)], lambda t: t[torch.tensor(m)], V(x))
    check(lambda t: t[Tensor(m[:, 0])], lambda t: t[torch.tensor(m[:, 0])], V(x))
    check(lambda t: t[[0, 2]], lambda t: t[[0, 2]], V(x))
    check(lambda t: t[:, [True, False, True, True, False]], lambda t: t[:, [True, False, True, True, False]], V(x))
    check(lambda t: t[Tensor(np.zeros((4, 5), bool))], lambda t: t[torch.zeros(4, 5, dtype=torch.bool)], V(x))


def test_getitem_int_dtypes():
    x = data((4, 5), "int32", -9, 9, seed=7)
    check(lambda t: t[Tensor(_ti(3, 0))], lambda t: t[torch.tensor(_ti(3, 0))], V(x))
    b = data((6,), "bool", seed=8)
    check(lambda t: t[Tensor(_ti(5, 0, 1))], lambda t: t[torch.tensor(_ti(5, 0, 1))], V(b))
    check(
        lambda t: t[Tensor(np.array([1, 0], np.int32))],
        lambda t: t[torch.tensor([1, 0], dtype=torch.int32)],
        V(data((3, 2), seed=9)),
    )


def test_getitem_errors():
    t = Tensor.ones(3, 4)
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[0, -5]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(IndexError):
        t[..., 0, ...]
    with pytest.raises(IndexError, match="integer or bool"):
        t[Tensor([0.0, 1.0])]
    with pytest.raises(TypeError):
        t["a"]


# ----------------------------------------------------------------------------- gather / scatter


@pytest.mark.parametrize("dim", fast_first([0, 1, -1]))
def test_gather(dim):
    x = data((3, 4), seed=10)
    idx = data((2, 3), "int64", 0, 2, seed=11)
    check(lambda t, i: t.gather(dim, i), lambda t, i: t.gather(dim, i), V(x), V(idx))
    check(lambda t, i: t.gather(dim, i), lambda t, i: t.gather(dim, i), V(data((4, 3), seed=12), lambda t: t.T), V(idx))


def test_gather_errors():
    with pytest.raises(ValueError):
        Tensor.ones(3, 4).gather(0, Tensor([0, 1]))
    with pytest.raises(IndexError):
        Tensor.ones(3, 4).gather(0, Tensor([[0.5]]))


@pytest.mark.slow
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter(dim):
    x, src = data((3, 5), seed=13), data((2, 4), seed=14)
    idx = np.array([[0, 1, 2, 0], [2, 0, 1, 1]], np.int64) if dim == 0 else np.array([[0, 4, 2, 1], [3, 1, 0, 2]])
    check(lambda t, i, s: t.scatter(dim, i, s), lambda t, i, s: t.scatter(dim, i, s), V(x), V(idx), V(src))
    check(lambda t, i: t.scatter(dim, i, 2.5), lambda t, i: t.scatter(dim, i, 2.5), V(x), V(idx))


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", fast_first(["sum", "prod", "mean", "amax", "amin"]))
def test_scatter_reduce(reduce, include_self):
    x, src = data((3, 4), seed=15), data((3, 4), seed=16, distinct=True)
    idx = np.array([[0, 1, 2, 0], [2, 0, 0, 1], [0, 0, 1, 1]], np.int64)  # repeated targets
    check(
        lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
        lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
        V(x),
        V(idx),
        V(src),
    )


def test_scatter_add_multiply_and_int():
    x, idx = data((3, 4), seed=17), np.array([[0, 1, 2, 0]], np.int64)
    check(
        lambda t, i: t.scatter(0, i, 2.0, reduce="add"),
        lambda t, i: t.scatter(0, i, 2.0, reduce="add"),
        V(x),
        V(idx),
        grad=False,
    )  # torch: no derivative for scatter with reduce
    check(
        lambda t, i: t.scatter(0, i, 2.0, reduce="multiply"),
        lambda t, i: t.scatter(0, i, 2.0, reduce="multiply"),
        V(x),
        V(idx),
        grad=False,
    )
    xi, si = data((3, 4), "int32", -5, 5, seed=18), data((1, 4), "int32", -5, 5, seed=19)
    check(
        lambda t, i, s: t.scatter_reduce(0, i, s, "sum"),
        lambda t, i, s: t.scatter_reduce(0, i, s, "sum"),
        V(xi),
        V(idx),
        V(si),
    )


@pytest.mark.slow
def test_masked_fill_select_nonzero():
    x, m = data((3, 4), seed=20), data((3, 4), "bool", seed=21)
    check(lambda t, m: t.masked_fill(m, -1.5), lambda t, m: t.masked_fill(m, -1.5), V(x), V(m))
    check(
        lambda t, m: t.masked_fill(m, 7),
        lambda t, m: t.masked_fill(m, 7),
        V(data((3, 4), "int32", 0, 5, seed=22)),
        V(m),
    )
    check(lambda t, m: t.masked_select(m), lambda t, m: t.masked_select(m), V(x), V(m))
    check(lambda t, m: t.masked_select(m), lambda t, m: t.masked_select(m), V(x), V(m[0]))  # broadcast mask
    check(lambda t: t.nonzero(), lambda t: t.nonzero(), V(data((3, 4), "int32", 0, 1, seed=23)))
    check(lambda t: t.nonzero(), lambda t: t.nonzero(), V(data((5,), "int32", 0, 1, seed=24)))
    check(lambda t: t.nonzero(), lambda t: t.nonzero(), V(np.zeros((2, 2), np.float32)))
    out = Tensor([0, 3, 0, 4]).nonzero(size=3, fill_value=-1).numpy()
    np.testing.assert_array_equal(out, [[1], [3], [-1]])


# ----------------------------------------------------------------------------- setitem and assign

SET = [
    (1,),
    (slice(1, 3),),
    (slice(None, None, 2), 1),
    (slice(None, None, -1),),
    (Ellipsis, 2),
    (-1, slice(4, 0, -2)),
    (1, 2, 3),
    (None, 0),
    (slice(0, 4, 3), slice(None), slice(5, None, -5)),
]


@pytest.mark.parametrize("idx", fast_first(SET), ids=[str(i) for i in range(len(SET))])
@pytest.mark.parametrize("value", ["scalar", "tensor"])
def test_setitem_basic(idx, value):
    x = data((4, 5, 6), seed=25)  # numpy is the oracle: torch has no negative steps
    zt, expected = Tensor(x), x.copy()
    v = 7.5 if value == "scalar" else data(expected[idx].shape[1:], seed=26)  # broadcast over the first indexed dim
    zt[idx] = v if value == "scalar" else Tensor(v)
    expected[idx] = v
    np.testing.assert_array_equal(zt.numpy(), expected)


@pytest.mark.slow
@pytest.mark.parametrize("idx", [(_ti(0, 2),), (slice(None), _ti(4, 1)), (_ti(1, 3), _ti(0, 0)), (_ti(-1),)])
def test_setitem_tensor_index(idx):
    x = data((4, 5), seed=27)
    zt, tt = Tensor(x), torch.tensor(x)
    v = data(tt[_lift(idx, "t")].shape, seed=28)
    zt[_lift(idx, "z")] = Tensor(v)
    tt[_lift(idx, "t")] = torch.tensor(v)
    np.testing.assert_array_equal(zt.numpy(), tt.numpy())
    zm, tm = Tensor(x), torch.tensor(x)
    zm[Tensor(x > 0)] = 0.0
    tm[torch.tensor(x > 0)] = 0.0
    np.testing.assert_array_equal(zm.numpy(), tm.numpy())


def test_setitem_dtypes_and_grad():
    zt = Tensor(np.zeros((2, 3), np.int32))
    zt[0, 1:] = 7
    zt[1] = Tensor([1.9, -2.9, 3.0])  # cast to the target's dtype, as torch
    np.testing.assert_array_equal(zt.numpy(), [[0, 7, 7], [1, -2, 3]])
    assert zt.dtype == dtypes.int32
    w = Tensor(data((3, 4), seed=29), requires_grad=True)
    v = Tensor(data((4,), seed=30), requires_grad=True)
    y = w * 2
    y[1] = v * 3
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [[2] * 4, [0] * 4, [2] * 4])
    np.testing.assert_allclose(v.grad.numpy(), [3] * 4)


@pytest.mark.slow
def test_setitem_loop_is_one_kernel():
    """ten t[i] = i into Tensor.empty(10), then one realize, is one kernel; setitem runs nothing"""
    GlobalCounters.reset()
    t = Tensor.empty(10)
    for i in range(10):
        t[i] = i
    assert GlobalCounters.kernel_count == 0
    t.realize()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_array_equal(t.numpy(), np.arange(10))


@pytest.mark.slow
def test_setitem_2d_loop_is_one_kernel():
    t = Tensor.zeros(4, 4).contiguous().realize()
    GlobalCounters.reset()
    for i in range(4):
        t[i, i] = i + 1
        t[i, 3 - i] -= 1
    t.realize()
    assert GlobalCounters.kernel_count == 1
    exp = np.diag([1.0, 2, 3, 4])
    for i in range(4):
        exp[i, 3 - i] -= 1
    np.testing.assert_array_equal(t.numpy(), exp)


def test_assign():
    t = Tensor.empty(2, 3)
    t.assign(Tensor.ones(2, 3) * 3)
    np.testing.assert_array_equal(t.numpy(), np.full((2, 3), 3.0))
    from zeptograd.buffers import buffers

    def memory(u):  # the Buffer under a buffer view
        return buffers[next(x for x in u.toposort() if x.op.name == "BUFFER")]

    buf = memory(t.uop)
    t.assign([[1, 2, 3], [4, 5, 6]])
    t.realize()
    assert memory(t.uop) is buf  # the same memory, written again (under a new BUFFER UOp: new contents)
    np.testing.assert_array_equal(t.numpy(), [[1, 2, 3], [4, 5, 6]])
    t.assign(t.flip(1))  # reads the buffer it writes at other positions: computed before the write
    np.testing.assert_array_equal(t.numpy(), [[3, 2, 1], [6, 5, 4]])
    with pytest.raises(ValueError):
        t.assign(Tensor.ones(3, 3))


def test_assign_readers_see_old_value():
    t = Tensor([1.0, 2.0, 3.0])
    old = t * 10  # lazy, reads t before the assign
    t.assign(Tensor([5.0, 5.0, 5.0]))
    Tensor.realize(t, old)
    np.testing.assert_array_equal(old.numpy(), [10, 20, 30])
    np.testing.assert_array_equal(t.numpy(), [5, 5, 5])


def test_assign_to_view():
    base = Tensor.zeros(3, 4).contiguous().realize()
    base[1:, 2:].assign(Tensor.ones(2, 2) * 9).realize()
    np.testing.assert_array_equal(base.numpy(), [[0, 0, 0, 0], [0, 0, 9, 9], [0, 0, 9, 9]])


def test_realize_several_in_one_schedule():
    a = Tensor(data((4,), seed=31))
    x, y, z = a + 1, a * 2, (a + 1).sum()
    GlobalCounters.reset()
    ret = Tensor.realize(x, y, z)
    assert ret is x
    assert GlobalCounters.kernel_count <= 3
    np.testing.assert_allclose(z.numpy(), (data((4,), seed=31) + 1).sum(), rtol=1e-6)
