"""Vector compares, selects and max against torch on every device: NaN, +-inf and -0/+0 in every lane position and
both operand orders. CPU:C renders these as gcc vector compares (masks of -1/0 lanes) and blends by mask, so each
lane of a vector must give what the scalar rule gives."""

import numpy as np
import pytest

from zeptograd import Tensor, dtypes

torch = pytest.importorskip("torch")

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 3.5], np.float32)


def pairs(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """every pair of the special values, each at several lane positions of a row"""
    a, b = np.meshgrid(SPECIALS, SPECIALS, indexing="ij")
    a, b = a.ravel(), b.ravel()  # 64 pairs
    rows = [np.roll(a, k) for k in range(0, n, 16)], [np.roll(b, k) for k in range(0, n, 16)]
    return np.stack(rows[0])[:, :n].copy(), np.stack(rows[1])[:, :n].copy()


def same_bits(got: np.ndarray, want: np.ndarray):
    """equal values, NaN where NaN, and the sign of each zero"""
    np.testing.assert_array_equal(got, want)
    zero = want == 0
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]))


def reference_max(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """the reference's max: a NaN wins, else the larger, a tie is a: max(-0, +0) is -0. torch's own zero sign on a
    tie depends on the lane (its vector loop's maxps gives b, its scalar tail a), so zero signs are checked
    against this rule and the values against torch"""
    return np.where(np.isnan(b) | (b > a), b, a)


def test_maximum_minimum_of_specials_match_torch(device):
    a, b = pairs()
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    wa, wb = torch.from_numpy(a), torch.from_numpy(b)
    np.testing.assert_array_equal(ta.maximum(tb).numpy(), torch.maximum(wa, wb).numpy())
    np.testing.assert_array_equal(ta.minimum(tb).numpy(), torch.minimum(wa, wb).numpy())
    same_bits(ta.maximum(tb).numpy(), reference_max(a, b))
    same_bits(ta.minimum(tb).numpy(), -reference_max(-a, -b))  # min(a, b) is -max(-a, -b)
    np.testing.assert_array_equal(ta.relu().numpy(), torch.relu(wa).numpy())  # values: torch's relu(-0) is -0


def test_compares_and_where_of_specials_match_torch(device):
    a, b = pairs()
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    wa, wb = torch.from_numpy(a), torch.from_numpy(b)
    for got, want in [(ta < tb, wa < wb), (ta != tb, wa != wb), (ta == tb, wa == wb), (ta >= tb, wa >= wb)]:
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    same_bits((ta < tb).where(ta, tb).numpy(), torch.where(wa < wb, wa, wb).numpy())
    same_bits((ta != ta).where(tb, ta * 2).numpy(), torch.where(wa != wa, wb, wa * 2).numpy())
    np.testing.assert_array_equal((ta < tb).float().numpy(), (wa < wb).float().numpy())
    # a condition wider than the values (f32 compare, int64 select) and one read from memory (bytes)
    idx = Tensor(np.arange(64, dtype=np.int64).reshape(1, 64).repeat(4, 0), device=device)
    np.testing.assert_array_equal((ta < tb).where(idx, -idx).numpy(), np.where(a < b, idx.numpy(), -idx.numpy()))
    cond = (ta < tb).realize()
    same_bits(cond.where(ta, tb).numpy(), torch.where(wa < wb, wa, wb).numpy())
    # masks of two widths combined (f32 and int64 compares), and a select of bools
    both = (ta < tb) & (idx < 20)
    np.testing.assert_array_equal(both.numpy(), (a < b) & (np.arange(64) < 20))
    np.testing.assert_array_equal((ta == tb).where(ta < tb, ta > tb).numpy(), np.where(a == b, a < b, a > b))


def test_bits_and_shifts_match_numpy(device):
    a = np.random.default_rng(4).integers(-(2**20), 2**20, (8, 64)).astype(np.int32)
    t = Tensor(a, device=device)
    np.testing.assert_array_equal((t << 3).numpy(), a << 3)
    np.testing.assert_array_equal((t >> 2).numpy(), a >> 2)
    np.testing.assert_array_equal((t ^ (t >> 1)).numpy(), a ^ (a >> 1))
    f = np.random.default_rng(5).standard_normal((8, 64)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(f, device=device).bitcast(dtypes.int32).numpy(), f.view(np.int32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_argmax_and_softmax_with_specials_match_torch(device, dtype):
    if device == "PYTHON":
        pytest.skip("the reference interpreter is slow; the elementwise cases above cover it")
    x = np.random.default_rng(6).standard_normal((24, 256)).astype(dtype)
    x[1, 37] = np.nan
    x[2, :] = np.nan
    x[3, 5], x[3, 200] = np.inf, np.inf  # a tie: the first index
    x[4, 9] = -np.inf
    x[5, :] = -np.inf
    x[6, :] = -0.0
    x[6, 100] = 0.0
    x[7, 50], x[7, 51] = 4.0, np.nan  # the NaN after the max wins
    t, w = Tensor(x, device=device), torch.from_numpy(x)
    np.testing.assert_array_equal(t.argmax(1).numpy(), w.argmax(1).numpy())
    np.testing.assert_array_equal(t.max(1).numpy(), w.amax(1).numpy())
    np.testing.assert_allclose(t.softmax(1).numpy(), w.softmax(1).numpy(), rtol=1e-5, atol=1e-7, equal_nan=True)
