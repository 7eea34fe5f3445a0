"""Valid input at the edges (negative padding, 0-d tensors, windows wider apart than the input, empty dims, empty
negative-step slices, tuples inside an index): each result is compared with torch's or numpy's in the same test."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.slow import fast_first
from zeptograd import Tensor, dtypes


def arange(*shape):
    """Distinct values, so a wrong element (not only a wrong shape) shows."""
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) * 1.5 - 7


# ----------------------------------------------------------------------------- pad with mixed-sign amounts


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, padding, mode",
    [
        ((3, 3, 3, 3), (-1, 2, 2, -1), "reflect"),
        ((1, 1, 5, 5), (3, -5, 1, -5), "replicate"),
        ((1, 2, 5, 6), (-3, 3, 4, -3), "reflect"),
        ((1, 2, 5, 6), (2, -4, -1, 3), "replicate"),
        ((1, 2, 5, 6), (-1, 2, 2, -1), "circular"),
        ((1, 2, 5, 6), (2, -1, -2, -1), "circular"),
        ((1, 2, 5, 6), (-2, 3, 1, -4), "constant"),
        ((2, 7), (-3, -2), "reflect"),
        ((2, 7), (4, -3), "reflect"),
    ],
)
def test_pad_mixed_negative_and_positive(shape, padding, mode):
    x = arange(*shape)
    want = F.pad(torch.tensor(x), padding, mode=mode).numpy()
    got = Tensor(x).pad(padding, mode=mode).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_pad_negative_reflect_gradient_matches_torch():
    x, tx = Tensor(arange(1, 2, 4, 5), requires_grad=True), torch.tensor(arange(1, 2, 4, 5), requires_grad=True)
    w = arange(1, 2, 5, 6)
    (Tensor(w) * x.pad((-1, 2, 2, -1), mode="reflect")).sum().backward()
    (torch.tensor(w) * F.pad(tx, (-1, 2, 2, -1), mode="reflect")).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


def test_pad_circular_wrapping_past_what_the_crop_leaves_is_an_error():
    # torch fails here too (a 1-d input) or returns uninitialized memory (the (1, 1, 5, 5) case): no value
    # to match, so a clear error instead of a made-up one
    with pytest.raises(RuntimeError):
        F.pad(torch.tensor(arange(1, 5)), (3, -3), mode="circular")
    with pytest.raises(ValueError, match=r"circular padding \(3, -3\) of dimension 1 \(size 5\) wraps around"):
        Tensor(arange(1, 5)).pad((3, -3), mode="circular")
    with pytest.raises(ValueError, match=r"wraps around more than once"):
        Tensor.ones(1, 1, 5, 5).pad((3, -5, 1, -5), mode="circular")


def test_pad_negative_past_the_size_is_an_error_as_torch():
    for mode in ("reflect", "replicate"):
        with pytest.raises(RuntimeError):
            F.pad(torch.tensor(arange(1, 5)), (-5, 0), mode=mode)
        with pytest.raises(RuntimeError, match=r"padding \(-5, 0\) leaves dimension 1 of size 5 with size 0"):
            Tensor(arange(1, 5)).pad((-5, 0), mode=mode)
    assert F.pad(torch.tensor(arange(1, 5)), (-5, 0)).shape == Tensor(arange(1, 5)).pad((-5, 0)).shape == (1, 0)


# ----------------------------------------------------------------------------- squeeze of a 0-d tensor


@pytest.mark.parametrize("dim", fast_first([0, -1, (0,), None]))
def test_squeeze_0d(dim):
    want = torch.tensor(3.0).squeeze(dim) if dim is not None else torch.tensor(3.0).squeeze()
    got = Tensor(3.0).squeeze(dim)
    assert got.shape == tuple(want.shape) == () and got.item() == want.item()
    with pytest.raises(IndexError):
        torch.tensor(3.0).squeeze(1)
    with pytest.raises(IndexError):
        Tensor(3.0).squeeze(1)


# ----------------------------------------------------------------------------- unfold and pools with big strides


@pytest.mark.parametrize(
    "shape, dim, size, step",
    fast_first(
        [
            ((3,), 0, 2, 8),
            ((3,), 0, 0, 1),
            ((3,), 0, 0, 2),
            ((2, 7, 5), 1, 2, 8),
            ((2, 7, 5), 2, 1, 9),
            ((2, 7, 5), 1, 7, 100),
        ]
        + [((2, 7, 5), 1, 3, 5), ((2, 7, 5), 2, 0, 1), ((4, 9), 1, 4, 4)],
        unpack=True,
    ),
)
def test_unfold_step_larger_than_size_and_empty_windows(shape, dim, size, step):
    x = arange(*shape)
    want = torch.tensor(x).unfold(dim, size, step).numpy()
    got = Tensor(x).unfold(dim, size, step).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "shape, kernel, stride, dilation",
    fast_first(
        [
            ((1, 1, 1, 3), (1, 2), (1, 8), 1),
            ((1, 2, 5, 6), (2, 3), (7, 9), 1),
            ((1, 2, 5, 6), (2, 2), (5, 6), 2),
            ((1, 2, 5, 6), (3, 3), (10, 1), 1),
            ((2, 1, 9, 9), (3, 2), (4, 11), (2, 1)),
        ],
        unpack=True,
    ),
)
def test_pool_stride_larger_than_input(shape, kernel, stride, dilation):
    x = arange(*shape)
    want = F.max_pool2d(torch.tensor(x), kernel, stride, dilation=dilation).numpy()
    got = Tensor(x).max_pool2d(kernel, stride, dilation=dilation).numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if dilation == 1:
        np.testing.assert_allclose(
            Tensor(x).avg_pool2d(kernel, stride).numpy(), F.avg_pool2d(torch.tensor(x), kernel, stride).numpy()
        )


def test_conv_stride_larger_than_input():
    x, w = arange(1, 2, 4, 5), arange(3, 2, 2, 2) / 10
    want = F.conv2d(torch.tensor(x), torch.tensor(w), stride=(9, 3)).numpy()
    np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w), stride=(9, 3)).numpy(), want, rtol=1e-5)


# ----------------------------------------------------------------------------- scans over an empty dim


@pytest.mark.parametrize(
    "shape, dim", fast_first([((0, 3), 0), ((3, 0), 1), ((0, 3), 1), ((3, 0), 0), ((2, 0, 4), -1)], unpack=True)
)
def test_scans_over_a_tensor_with_an_empty_dim(shape, dim):
    x, tx = Tensor(arange(*shape)), torch.tensor(arange(*shape))
    for name in ("cummax", "cummin"):
        values, idx = getattr(x, name)(dim)
        want = getattr(tx, name)(dim)
        assert values.shape == tuple(want.values.shape) and idx.shape == tuple(want.indices.shape)
        assert values.numpy().size == 0 and idx.dtype == dtypes.int64
    for name in ("logcumsumexp", "cumsum", "cumprod"):
        got, want = getattr(x, name)(dim), getattr(tx, name)(dim)
        assert got.shape == tuple(want.shape) and got.numpy().size == 0


@pytest.mark.parametrize("name", fast_first(["cumsum", "cumprod", "logcumsumexp", "cummax", "cummin"]))
def test_scans_of_a_0d_tensor(name):
    got, want = getattr(Tensor(2.5), name)(-1), getattr(torch.tensor(2.5), name)(-1)
    if name in ("cummax", "cummin"):
        got, want = got[0], want.values
    assert got.shape == () and got.item() == pytest.approx(want.item())
    with pytest.raises(IndexError):
        getattr(torch.tensor(2.5), name)(1)
    with pytest.raises(IndexError, match="1"):
        getattr(Tensor(2.5), name)(1)


# ----------------------------------------------------------------------------- indexing


@pytest.mark.parametrize(
    "sl",
    fast_first(
        [slice(2, 5, -1), slice(5, 2, -1), slice(0, 0, -1), slice(0, 9, -2), slice(None, None, -3), slice(-1, -11, -2)]
        + [slice(20, -20, -1), slice(-20, 20, -1), slice(3, None, -1), slice(None, 3, -4)]
    ),
)
def test_negative_step_slices_follow_numpy(sl):
    # torch rejects negative steps altogether; zeptograd follows numpy (README: deliberate differences)
    x = np.arange(10.0, dtype=np.float32)
    got = Tensor(x)[sl].numpy()
    assert got.shape == x[sl].shape
    np.testing.assert_array_equal(got, x[sl])


def test_negative_step_empty_slice_in_setitem_writes_nothing():
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    t = Tensor(x).contiguous().realize()
    t[2:0:1, 1:3:-1] = 5.0
    want = x.copy()
    want[2:0:1, 1:3:-1] = 5.0
    np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize(
    "index", fast_first([((1, 0), 0), ((1, 0),), (0, (2, 0, 1)), ((1, 1), (0, 2)), ((-1, 0), slice(1, None))])
)
def test_tuple_as_an_index_element(index):
    x = np.arange(6).reshape(2, 3)
    got = Tensor(x)[index].numpy()
    np.testing.assert_array_equal(got, torch.tensor(x)[index].numpy())
    np.testing.assert_array_equal(got, x[index])


@pytest.mark.slow
def test_bool_masks_of_matching_shape_still_index():
    x = arange(2, 3, 4)
    m, m2 = np.array([True, False, True, True]), arange(3, 4) > 0
    for index in [(Ellipsis, m), (slice(None), m2), (np.array([[1], [0]]), slice(1, None), m)]:
        tindex = tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in index)
        np.testing.assert_array_equal(Tensor(x)[tindex].numpy(), x[index])


# ----------------------------------------------------------------------------- dtype limits as properties


@pytest.mark.parametrize(
    "name", fast_first(["int8", "uint8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "bool"])
)
def test_dtype_min_max_properties(name):
    d = getattr(dtypes, name)
    if name == "bool":
        assert (d.min, d.max) == (False, True)
    else:
        info = np.iinfo(getattr(np, name))
        assert (d.min, d.max) == (int(info.min), int(info.max))
    assert (d.min, d.max) == (dtypes.min(d), dtypes.max(d))  # the functions stay


def test_float_dtype_limits_are_infinities():
    assert dtypes.float32.max == dtypes.float16.max == np.inf and dtypes.float64.min == -np.inf


# ----------------------------------------------------------------------------- Python ints past the default int


@pytest.mark.parametrize("data", fast_first([2**40, -(2**40), [2**40, 1], [[1, 2], [3, 2**33]]]))
def test_ints_past_int32_become_int64_as_torch(data):
    got, want = Tensor(data), torch.tensor(data)
    assert got.dtype == dtypes.int64 and want.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), want.numpy())  # was a silent wraparound to 0


@pytest.mark.parametrize("data", [2**70, [2**70]])
def test_ints_past_int64_are_an_error(data):
    with pytest.raises(ValueError):
        torch.tensor(data)
    with pytest.raises(RuntimeError, match="out of the range of dtypes.long"):
        Tensor(data)
