"""mean/var/std (and var_mean, std_mean) of integer and bool tensors raise as torch 2.13's do (tinygrad returns a
float): `mean(dtype=...)` with a float dtype, or a cast, says what the result is."""

import numpy as np
import pytest
import torch

from zeptograd import Tensor, dtypes

INT_DTYPES = [(dtypes.int32, torch.int32), (dtypes.int64, torch.int64), (dtypes.uint8, torch.uint8),
              (dtypes.int8, torch.int8), (dtypes.bool, torch.bool)]  # fmt: skip

CALLS = {
    "mean": (lambda t: t.mean(), "mean\\(\\): could not infer output dtype"),
    "mean_axis": (lambda t: t.mean(0, keepdim=True), "mean\\(\\): could not infer output dtype"),
    "var": (lambda t: t.var(), "std and var only support floating point"),
    "std": (lambda t: t.std(), "std and var only support floating point"),
    "var_mean": (lambda t: Tensor.var_mean(t) if isinstance(t, Tensor) else torch.var_mean(t), "var_mean only support"),
    "std_mean": (lambda t: Tensor.std_mean(t) if isinstance(t, Tensor) else torch.std_mean(t), "std_mean only support"),
}


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("zdt,tdt", INT_DTYPES, ids=[str(t) for _, t in INT_DTYPES])
def test_int_and_bool_reductions_raise_as_torch(name, zdt, tdt):
    call, message = CALLS[name]
    values = [1, 0, 1, 1]
    with pytest.raises(RuntimeError, match=message):
        call(torch.tensor(values).to(tdt))
    with pytest.raises(RuntimeError, match=message):
        call(Tensor(values).cast(zdt))
    with pytest.raises(TypeError, match=f"{message}.*{zdt}"):  # zeptograd's error also is a TypeError naming the dtype
        call(Tensor(values).cast(zdt))


@pytest.mark.parametrize("zdt,tdt", INT_DTYPES, ids=[str(t) for _, t in INT_DTYPES])
def test_mean_with_a_float_dtype(zdt, tdt):
    values = np.array([[1, 0, 1], [1, 1, 0]])
    for dt, tdt_out in ((dtypes.float32, torch.float32), (dtypes.float64, torch.float64)):
        want = torch.tensor(values).to(tdt).mean(1, dtype=tdt_out)
        got = Tensor(values).cast(zdt).mean(1, dtype=dt)
        assert got.dtype == dt
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_mean_with_an_int_dtype_raises_as_torch():
    with pytest.raises(RuntimeError, match="Optional dtype must be either a floating point"):
        torch.tensor([1.0, 2.0]).mean(dtype=torch.int64)
    with pytest.raises(RuntimeError, match=f"Optional dtype must be either a floating point.*{dtypes.int64}"):
        Tensor([1.0, 2.0]).mean(dtype=dtypes.int64)


def test_float_reductions_unchanged():
    a = np.array([[1.0, 2.0, 4.0], [3.0, 5.0, 9.0]], np.float32)
    t, z = torch.tensor(a), Tensor(a)
    np.testing.assert_allclose(z.mean(1).numpy(), t.mean(1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(z.var(0).numpy(), t.var(0).numpy(), rtol=1e-6)
    np.testing.assert_allclose(z.std().numpy(), t.std().numpy(), rtol=1e-6)
    assert Tensor(a).half().mean().dtype == dtypes.float16
