"""Index arithmetic past int32 on every device: small real buffers read through index expressions whose values
exceed 2**31 (pooling windows, shrinks of huge expanded views, an arange longer than 2**31), each kernel at most
~10**6 iterations so PYTHON runs them too; and a buffer no device can hold is a MemoryError at realize()."""

import os

import numpy as np
import pytest
import torch

from zeptograd import Tensor, dtypes
from zeptograd.device import GlobalCounters
from zeptograd.engine import realize

SLOW = pytest.mark.skipif(not os.getenv("ZG_SLOW"), reason="2**31 loop iterations (seconds on CPU): set ZG_SLOW=1")


def rand(*shape) -> np.ndarray:
    return np.random.default_rng(0).random(shape, dtype=np.float32)


def test_avg_pool_181(device):
    """the issue's case: a 181x181 window over a 181x181 image (was NaN: `mul i32 %ridx2, 23850189`)"""
    x = rand(1, 1, 181, 181)
    assert Tensor(np.ones_like(x)).to(device).avg_pool2d(181).item() == 1.0
    want = torch.nn.functional.avg_pool2d(torch.from_numpy(x), 181).numpy()
    np.testing.assert_allclose(Tensor(x).to(device).avg_pool2d(181).numpy(), want, rtol=1e-5)


def test_max_pool_64_on_512x512(device):
    x = rand(1, 1, 512, 512)
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), 64).numpy()
    np.testing.assert_equal(Tensor(x).to(device).max_pool2d(64).numpy(), want)


@pytest.mark.slow
def test_window_of_65536(device):
    """a 1-D window of 65536 (segfaulted): the sliding-window view has 65536**2 elements"""
    x = rand(1, 1, 1, 65536)
    want = torch.nn.functional.avg_pool2d(torch.from_numpy(x), (1, 65536)).numpy()
    np.testing.assert_allclose(Tensor(x).to(device).avg_pool2d((1, 65536)).numpy(), want, rtol=1e-5)
    np.testing.assert_equal(Tensor(x).to(device).max_pool2d((1, 65536)).numpy(), x.max().reshape(1, 1, 1, 1))


@pytest.mark.slow
def test_avg_pool_7_large_batch(device):
    """avg_pool2d(7) over a (256, 1024, 7, 7) batch was wrong from batch index 190 on, while mean((2, 3)) was right
    (the window view's index passes 2**31 there); batches 186..193 of the last channels only"""
    x = rand(256, 1024, 7, 7)
    t = Tensor(x).to(device)
    want = x.mean((2, 3), keepdims=True)[186:194, 1016:]
    np.testing.assert_allclose(t.avg_pool2d(7)[186:194, 1016:].numpy(), want, rtol=1e-5)
    np.testing.assert_allclose(t.mean((2, 3), keepdim=True)[186:194, 1016:].numpy(), want, rtol=1e-5)


def test_shrinks_of_huge_expanded_views(device):
    """a 10-element buffer viewed as 3*10**10 (or 3*10**9) elements: only the shrunk elements are read"""
    x = np.arange(10, dtype=np.float32)
    t = Tensor(x).to(device)
    rows = t.reshape(10, 1).expand(10, 3 * 10**9).reshape(3 * 10**10)[2 * 10**10 + 5 :: 3 * 10**9]
    np.testing.assert_equal(rows.numpy(), [6.0, 7.0, 8.0, 9.0])
    cols = t.reshape(1, 10).expand(3 * 10**8, 10).reshape(3 * 10**9)[2**31 + 3 : 2**31 + 23]
    np.testing.assert_equal(cols.numpy(), np.arange(2**31 + 3, 2**31 + 23) % 10)
    grid = t.reshape(10, 1, 1).expand(10, 50000, 50000)[7:9, 49990:, 3:5].sum((1, 2))
    np.testing.assert_equal(grid.numpy(), [7.0 * 20, 8.0 * 20])


def test_arange_past_int32(device):
    """arange(2**31 + 8) as int64 is lazy (16 GiB if realized): its last elements and a reshape of it"""
    a = Tensor.arange(2**31 + 8, dtype=dtypes.int64, device=device)
    np.testing.assert_equal(a[-3:].numpy(), np.arange(2**31 + 5, 2**31 + 8))
    assert a[2**31 + 1].item() == 2**31 + 1
    half = (2**31 + 8) // 2
    np.testing.assert_equal(a.reshape(2, -1)[:, -2:].numpy(), [[half - 2, half - 1], [2 * half - 2, 2 * half - 1]])
    np.testing.assert_equal((a[2**31 - 2 : 2**31 + 2] * 3).numpy(), np.arange(2**31 - 2, 2**31 + 2) * 3)
    np.testing.assert_equal((a[:4] * 3).numpy(), [0, 3, 6, 9])  # int64 data over an index that fits int32
    ones = Tensor([1, 2, 3], dtype=dtypes.int64, device=device)
    np.testing.assert_equal((a[2**31 : 2**31 + 3] + ones).numpy(), np.arange(2**31, 2**31 + 3) + [1, 2, 3])
    default = Tensor.arange(2**31 + 8, device=device)  # a stop past int32 makes it int64, as torch's arange is
    assert default.dtype == dtypes.int64
    np.testing.assert_equal(default[-2:].numpy(), [2**31 + 6, 2**31 + 7])
    wrapped = a[2**31 : 2**31 + 3].cast(dtypes.int32) + ones.cast(dtypes.int32)  # int32 data wraps, as torch's
    want = (torch.arange(2**31, 2**31 + 3).to(torch.int32) + torch.tensor([1, 2, 3], dtype=torch.int32)).numpy()
    np.testing.assert_equal(wrapped.numpy(), want)


@SLOW
@pytest.mark.parametrize("dev", ["CPU", "CPU:C"])
def test_reduce_arange_past_int32(dev):
    """max was 2147483647 (the loop variable wrapped); the sum is exact in int64"""
    n = 2**31 + 8
    assert Tensor.arange(n, dtype=dtypes.int64, device=dev).max().item() == n - 1
    assert Tensor.arange(n, dtype=dtypes.int64, device=dev).sum().item() == n * (n - 1) // 2
    assert Tensor.arange(n, device=dev).sum().item() == n * (n - 1) // 2


def test_too_large_is_a_memory_error_before_compiling(device, monkeypatch):
    """(Tensor.empty(10**12) + 1).realize(): 4 TB is a MemoryError naming the bytes and the device, raised before
    any kernel is compiled (it raised 'kernel_... not found in its compiled object': the loop bound had wrapped)"""
    t = Tensor.empty(10**12, device=device)  # stays lazy
    y = t + 1

    def no_compile(*args, **kwargs):
        raise AssertionError("a kernel was compiled")

    monkeypatch.setattr(realize, "get_kernel", no_compile)
    kernels_before = GlobalCounters.kernel_count
    with pytest.raises(MemoryError, match=rf"4000000000000 bytes .*on {device}"):
        y.realize()
    assert GlobalCounters.kernel_count == kernels_before
    assert y.shape == (10**12,)
