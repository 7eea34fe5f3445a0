"""Reductions over an axis of size 0: sum/prod/mean fold to their identity (no kernel, so no loop of 0 iterations
whose index arithmetic would render `% 0`), max/min/argmax/argmin are an IndexError at the call (as torch), and
any/all/softmax/logsumexp follow torch."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor, dtypes
from zeptograd.uop.ops import Ops


def _kernels(t: Tensor) -> list:
    return t.schedule()


@pytest.mark.parametrize(
    "shape,axis", [((0, 4), 0), ((4, 0), 1), ((0, 4), None), ((2, 0, 3), 1), ((0, 40000), 0), ((2, 0, 3), (0, 1))]
)
def test_sum_prod_mean_of_empty_axis_are_identities_without_kernels(shape, axis):
    x = Tensor.empty(*shape)
    ref = np.zeros(shape, np.float32)
    for t, want in (
        (x.sum(axis), ref.sum(axis)),
        (x.prod(axis), ref.prod(axis)),
        (Tensor.empty(*shape, dtype=dtypes.int32).sum(axis), ref.astype(np.int64).sum(axis)),
    ):
        assert _kernels(t) == []
        got = t.numpy()
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    out_shape = ref.sum(axis).shape
    np.testing.assert_array_equal(x.mean(axis).numpy(), np.full(out_shape, np.nan, np.float32))  # 0/0


def test_matmul_with_empty_inner_dim_is_zeros():
    t = Tensor.empty(3, 0) @ Tensor.empty(0, 5)
    assert _kernels(t) == []  # was one kernel with `srem i32 %ridx, 0` in a loop of 0 iterations
    np.testing.assert_array_equal(t.numpy(), np.zeros((3, 5), np.float32))
    t = Tensor.ones(2, 3) @ Tensor.ones(3, 4) + (Tensor.empty(2, 0) @ Tensor.empty(0, 4))
    np.testing.assert_array_equal(t.numpy(), np.full((2, 4), 3.0, np.float32))


def test_no_kernel_renders_a_zero_divisor():
    """What still runs next to an empty reduce renders no `% 0` / `/ 0` (the C renderer shows it as text)."""
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), device="NULL")
    t = (x + Tensor.empty(2, 0, device="NULL").sum(1, keepdim=True)) * (Tensor.empty(0, 3, device="NULL").sum(0))
    from zeptograd.engine.realize import get_kernel

    srcs = [get_kernel(item.device, item.ast).src for item in t.schedule()]
    assert srcs and not any("% 0" in s or "/ 0" in s for s in srcs)
    assert not any(
        u.op in (Ops.MOD, Ops.IDIV) and u.src[1].op is Ops.CONST and u.src[1].arg == 0
        for item in t.schedule()
        for u in item.ast.toposort()
    )


@pytest.mark.parametrize("name", ["max", "min", "argmax", "argmin"])
def test_max_over_empty_axis_is_an_error(name):
    x = Tensor.empty(0, 4)
    with pytest.raises(IndexError, match=rf"{name}\(\): Expected reduction dim 0 to have non-zero size"):
        getattr(x, name)(0)
    with pytest.raises(IndexError, match=rf"{name}\(\): Expected reduction dim 1 to have non-zero size"):
        getattr(Tensor.empty(3, 0), name)(-1)
    # over all axes torch raises a RuntimeError for max/min, an IndexError for argmax/argmin
    error = IndexError if name.startswith("arg") else RuntimeError
    with pytest.raises(error, match=rf"{name}\(\): the tensor of shape \(0, 4\) has no elements"):
        getattr(x, name)()
    assert getattr(x, name)(1).shape == (0,)  # over a non-empty axis: an empty result, no error


def test_any_all_softmax_logsumexp_of_empty_axis_follow_torch():
    x = Tensor.empty(0, 4)
    assert x.any(0).tolist() == [False] * 4 and x.all().item() is True
    assert x.softmax(0).shape == (0, 4) and x.log_softmax(0).numpy().shape == (0, 4)
    assert x.logsumexp(0).tolist() == [-np.inf] * 4
    b = Tensor.empty(3, 0, dtype=dtypes.bool)
    assert b.any(1).tolist() == [False] * 3 and b.all(1).tolist() == [True] * 3
