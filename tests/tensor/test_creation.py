"""Construction (from Python values and numpy arrays), creation ops (zeros, full, arange, eye, random) and reading
results out (numpy, tolist, item), against numpy (`check_numpy`) and torch 2.13 (`check`) where each applies."""

import math

import numpy as np
import pytest
import torch

from tests.slow import fast_first
from tests.tensor.api_helpers import NP_OF, TORCH_OF, ZEPTO_OF, check, check_numpy, data
from zeptograd import GlobalCounters, Tensor, dtypes

# ----------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "value,shape,dtype",
    fast_first(
        [
            (3, (), "int32"),
            (2.5, (), "float32"),
            (True, (), "bool"),
            ([1, 2, 3], (3,), "int32"),
            ([1.5, -2.0], (2,), "float32"),
            ([[1, 2], [3, 4], [5, 6]], (3, 2), "int32"),
            ([[True, False]], (1, 2), "bool"),
            ([1, 2.5], (2,), "float32"),
        ],
        unpack=True,
    ),
)
def test_construct_python(value, shape, dtype):
    t = Tensor(value)
    assert t.shape == shape
    check_numpy(t, np.array(value, dtype=NP_OF[dtype]), dtype)


def test_construct_empty_list():
    t = Tensor([])
    assert t.shape == (0,)
    assert t.numpy().shape == (0,)
    assert t.numel() == 0


@pytest.mark.parametrize("dtype", fast_first(["float64", "int64", "int8", "uint8", "uint16", "bool", "float16"]))
def test_construct_numpy_keeps_dtype(dtype):
    x = data((2, 3), dtype, lo=-5, hi=5, seed=1)
    t = Tensor(x)
    check_numpy(t, x, dtype)


@pytest.mark.parametrize("shape", fast_first([(), (0,), (0, 3), (2, 0, 4)]))
def test_construct_numpy_odd_shapes(shape):
    x = data(shape, "float32")
    check_numpy(Tensor(x), x)


@pytest.mark.parametrize(
    "value,dtype",
    fast_first(
        [
            ([1.25, -2.5, 3.0], "float16"),
            ([1, 2, 3], "float32"),
            ([1.7, -2.7, 0.2], "int32"),
            ([0, 1, 2], "bool"),
            ([1, 2, 300], "int64"),
            ([0.5, 1.5], "float64"),
        ],
        unpack=True,
    ),
)
def test_construct_with_dtype(value, dtype):
    t = Tensor(value, dtype=ZEPTO_OF[dtype])
    check_numpy(t, np.array(value).astype(NP_OF[dtype]), dtype)


def test_construct_numpy_with_dtype():
    x = np.array([[1.5, 2.25], [-3.75, 4.0]], dtype=np.float64)
    check_numpy(Tensor(x, dtype=dtypes.float32), x.astype(np.float32), "float32")


def test_dtype_aliases():
    assert dtypes.int == dtypes.int32
    assert dtypes.long == dtypes.int64
    assert dtypes.half == dtypes.float16
    assert dtypes.float == dtypes.float32
    assert dtypes.double == dtypes.float64
    assert dtypes.default_float == dtypes.float32
    assert dtypes.default_int == dtypes.int32
    assert dtypes.bfloat16 != dtypes.float16


# ----------------------------------------------------------------------------- creation


@pytest.mark.parametrize("shape", fast_first([(), (3,), (2, 3), (0, 3), (2, 0, 4)]))
def test_zeros_ones(shape):
    check_numpy(Tensor.zeros(*shape), np.zeros(shape, np.float32), "float32")
    check_numpy(Tensor.ones(*shape), np.ones(shape, np.float32), "float32")
    check(lambda: Tensor.zeros(*shape), lambda: torch.zeros(shape))
    check(lambda: Tensor.ones(*shape), lambda: torch.ones(shape))


def test_zeros_ones_shape_as_tuple():
    check_numpy(Tensor.ones((4,)), np.ones((4,), np.float32), "float32")
    check(lambda: Tensor.zeros((2, 3)), lambda: torch.zeros((2, 3)))


@pytest.mark.parametrize("dtype", fast_first(["int32", "float16", "bool", "int64", "uint8"]))
def test_zeros_ones_dtype(dtype):
    check_numpy(Tensor.zeros(2, 3, dtype=ZEPTO_OF[dtype]), np.zeros((2, 3), NP_OF[dtype]), dtype)
    check_numpy(Tensor.ones(4, dtype=ZEPTO_OF[dtype]), np.ones((4,), NP_OF[dtype]), dtype)
    check(lambda: Tensor.zeros(2, dtype=ZEPTO_OF[dtype]), lambda: torch.zeros(2, dtype=TORCH_OF[dtype]))


@pytest.mark.parametrize(
    "shape,value,dtype,expected_dtype",
    fast_first(
        [
            ((2, 3), 1.5, None, "float32"),
            ((2, 3), 7, None, "int32"),  # tinygrad's default int is int32 (torch's int64)
            ((4,), True, None, "bool"),
            ((), -2.5, None, "float32"),
            ((3, 2), 3, dtypes.float32, "float32"),
            ((2, 2), 2.0, dtypes.float16, "float16"),
            ((0, 2), 1.0, None, "float32"),
        ],
        unpack=True,
    ),
)
def test_full(shape, value, dtype, expected_dtype):
    t = Tensor.full(shape, value) if dtype is None else Tensor.full(shape, value, dtype=dtype)
    check_numpy(t, np.full(shape, value, dtype=NP_OF[expected_dtype]), expected_dtype)
    check(lambda: t, lambda: torch.full(shape, value, dtype=TORCH_OF[expected_dtype]))


@pytest.mark.parametrize(
    "shape,dtype",
    fast_first(
        [((2, 3), None), ((4,), dtypes.int32), ((0, 5), None), ((), dtypes.float16), ((2, 3), dtypes.int16)],
        unpack=True,
    ),
)
def test_empty(shape, dtype):
    t = Tensor.empty(*shape) if dtype is None else Tensor.empty(*shape, dtype=dtype)
    assert t.shape == shape
    assert t.dtype == (dtypes.float32 if dtype is None else dtype)
    assert t.numpy().shape == shape


LIKE = {  # zeptograd on an int32 (2, 3) tensor, torch's result
    "zeros_like": (lambda x: x.zeros_like(), lambda: torch.zeros(2, 3, dtype=torch.int32)),
    "ones_like": (lambda x: x.ones_like(), lambda: torch.ones(2, 3, dtype=torch.int32)),
    "full_like": (lambda x: x.full_like(5), lambda: torch.full((2, 3), 5, dtype=torch.int32)),
    "full_like_dtype": (lambda x: x.full_like(0.5, dtype=dtypes.float32), lambda: torch.full((2, 3), 0.5)),
    "ones_like_dtype": (lambda x: x.ones_like(dtype=dtypes.float16), lambda: torch.ones(2, 3, dtype=torch.float16)),
}


@pytest.mark.parametrize("op", fast_first(list(LIKE)))
def test_like(op):
    x = Tensor(data((2, 3), "int32", seed=1))
    check(lambda: LIKE[op][0](x), LIKE[op][1])


def test_like_random_and_empty():
    x = Tensor(data((2, 3), "int32", seed=1))
    assert x.empty_like().shape == (2, 3) and x.empty_like().dtype == dtypes.int32
    assert x.rand_like(dtype=dtypes.float32).shape == (2, 3) and x.float().randn_like().dtype == dtypes.float32


ARANGE = [  # args, dtype keyword
    ((5,), None),
    ((2, 9), None),
    ((2, 11, 3), None),
    ((10, 0, -3), None),
    ((0, 1, 0.25), None),
    ((0.0, 1.0, 0.25), None),
    ((-1.5, 2.0), None),
    ((-2.5, 2.0, 0.5), None),
    ((6,), "float32"),
    ((1, 10, 4), "int64"),
    ((5, 2), None),  # numpy: empty; torch raises (bounds inconsistent with the step), so numpy only
    ((3, 3), None),
    ((0,), None),
]


@pytest.mark.parametrize("args,dtype", fast_first(ARANGE, unpack=True))
def test_arange(args, dtype):
    # int arguments give tinygrad's default int, int32 (torch: int64); a float one gives float32
    name = dtype or ("int32" if all(isinstance(a, int) for a in args) else "float32")
    z = Tensor.arange(*args) if dtype is None else Tensor.arange(*args, dtype=ZEPTO_OF[dtype])
    check_numpy(z, np.arange(*args, dtype=NP_OF[name]), name)
    if not (len(args) == 2 and args[0] > args[1]):
        check(lambda: z, lambda: torch.arange(*args, dtype=TORCH_OF[name]))


@pytest.mark.parametrize(
    "start,stop,steps", fast_first([(0, 1, 5), (-3.5, 2, 8), (2, 2, 3), (1, 0, 1), (0, 10, 0)], unpack=True)
)
def test_linspace(start, stop, steps):
    check(lambda: Tensor.linspace(start, stop, steps), lambda: torch.linspace(start, stop, steps))


@pytest.mark.parametrize("n,m", fast_first([(3, None), (2, 4), (4, 2), (0, None)], unpack=True))
def test_eye(n, m):
    check(lambda: Tensor.eye(n, m), lambda: torch.eye(n, m if m is not None else n))
    check(lambda: Tensor.eye(n, m, dtype=dtypes.int32), lambda: torch.eye(n, m if m is not None else n).int())


@pytest.mark.slow
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


def test_rand():
    Tensor.manual_seed(1234)
    a = Tensor.rand(64, 64)
    assert a.shape == (64, 64) and a.dtype == dtypes.float32
    x = a.numpy()
    assert x.dtype == np.float32
    assert x.min() >= 0.0 and x.max() < 1.0
    assert abs(x.mean() - 0.5) < 0.05
    assert abs(x.std() - math.sqrt(1 / 12)) < 0.05
    assert len(np.unique(x)) > 4000  # not constant / not heavily repeating
    b = Tensor.rand(64, 64).numpy()
    assert not np.array_equal(x, b)  # a second draw differs


def test_randn():
    Tensor.manual_seed(42)
    x = Tensor.randn(100, 100).numpy()
    assert x.shape == (100, 100) and x.dtype == np.float32
    assert np.all(np.isfinite(x))
    assert abs(x.mean()) < 0.05
    assert abs(x.std() - 1.0) < 0.05


def test_manual_seed_reproducible():
    Tensor.manual_seed(7)
    a = Tensor.rand(3, 5).numpy()
    b = Tensor.randn(4).numpy()
    Tensor.manual_seed(7)
    a2 = Tensor.rand(3, 5).numpy()
    b2 = Tensor.randn(4).numpy()
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    Tensor.manual_seed(8)
    assert not np.array_equal(a, Tensor.rand(3, 5).numpy())


def test_rand_empty_and_scalar():
    assert Tensor.rand(0, 3).numpy().shape == (0, 3)
    r = Tensor.rand().numpy()
    assert r.shape == () and 0.0 <= float(r) < 1.0


@pytest.mark.slow
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


# ----------------------------------------------------------------------------- output


def test_output_methods():
    x = data((2, 3), seed=60)
    t = Tensor(x)
    assert t.realize() is t
    assert t.shape == (2, 3) and isinstance(t.shape, tuple)
    assert t.ndim == 2
    assert t.numel() == 6
    assert len(t) == 2
    tl = t.tolist()
    assert isinstance(tl, list) and len(tl) == 2 and len(tl[0]) == 3
    np.testing.assert_allclose(np.array(tl, np.float32), x, rtol=1e-6)
    assert Tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert Tensor([True, False]).tolist() == [True, False]


def test_item():
    v = Tensor(2.5).item()
    assert v == 2.5 and isinstance(v, float)
    v = Tensor([7]).item()
    assert v == 7 and isinstance(v, int)
    v = Tensor([[True]]).item()
    assert v is True
    assert Tensor([1.0, 2.0, 3.0]).sum().item() == 6.0
    assert Tensor.ones(3, 4)[1, 2].item() == 1.0


def test_output_0d_and_empty():
    s = Tensor(3.0)
    assert s.shape == () and s.ndim == 0 and s.numel() == 1
    assert s.numpy().shape == ()
    assert s.tolist() == 3.0
    e = Tensor.zeros(2, 0, 4)
    assert e.ndim == 3 and e.numel() == 0 and len(e) == 2
    assert Tensor.zeros(0, 3).tolist() == []


def test_kernel_count():
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0
    a = Tensor(data((3, 3), seed=61))
    b = (a + 1).exp()
    assert GlobalCounters.kernel_count == 0  # lazy: nothing ran yet
    b.realize()
    n = GlobalCounters.kernel_count
    assert isinstance(n, int) and n >= 1
    b.numpy()  # already realized: no new compute kernel
    assert GlobalCounters.kernel_count == n
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0
