"""Bad input gives a clear exception that names the offending values."""

import re

import numpy as np
import pytest

from zeptograd import Tensor, dtypes


def shape_re(shape):
    """regex for a shape tuple as Python prints it, tolerant to spacing: (3, 4) / (3,4) / (3,)"""
    if len(shape) == 1:
        return r"\(\s*%d\s*,\s*\)" % shape[0]
    return r"\(\s*" + r"\s*,\s*".join(str(s) for s in shape) + r"\s*\)"


def assert_mentions(excinfo, *patterns):
    msg = str(excinfo.value)
    for p in patterns:
        assert re.search(p, msg), f"{p!r} not found in error message {msg!r}"


# ----------------------------------------------------------------------------- broadcasting


@pytest.mark.parametrize("sa,sb", [((3, 4), (2, 5)), ((4,), (2, 3)), ((2, 3, 4), (3, 5)), ((0, 3), (2, 3))])
@pytest.mark.parametrize("op", ["add", "mul", "lt", "maximum"])
def test_broadcast_mismatch(op, sa, sb):
    a, b = Tensor.ones(*sa), Tensor.ones(*sb)
    fn = {"add": lambda: a + b, "mul": lambda: a * b, "lt": lambda: a < b, "maximum": lambda: a.maximum(b)}[op]
    with pytest.raises(ValueError) as ei:
        fn().realize()
    assert_mentions(ei, shape_re(sa), shape_re(sb))


def test_broadcast_mismatch_where():
    c, a, b = Tensor.ones(3, 4).bool(), Tensor.ones(3, 4), Tensor.ones(5)
    with pytest.raises(ValueError) as ei:
        c.where(a, b).realize()
    assert_mentions(ei, r"\(\s*5\s*,\s*\)")


# ----------------------------------------------------------------------------- axis out of range


@pytest.mark.parametrize(
    "call,axis",
    [
        (lambda t: t.sum(axis=2), 2),
        (lambda t: t.sum(axis=-3), -3),
        (lambda t: t.max(axis=5), 5),
        (lambda t: t.min(axis=(0, 7)), 7),
        (lambda t: t.mean(axis=3), 3),
        (lambda t: t.sum(axis=2, keepdim=True), 2),
        (lambda t: t.permute(0, 5), 5),
        (lambda t: t.flip(3), 3),
        (lambda t: t.transpose(0, 4), 4),
        (lambda t: t.squeeze(6), 6),
        (lambda t: t.unsqueeze(4), 4),
        (lambda t: t.unsqueeze(-5), -5),
        (lambda t: t.flatten(3), 3),
    ],
    ids=[
        "sum",
        "sum_neg",
        "max",
        "min_tuple",
        "mean",
        "sum_keepdim",
        "permute",
        "flip",
        "transpose",
        "squeeze",
        "unsqueeze",
        "unsqueeze_neg",
        "flatten",
    ],
)
def test_axis_out_of_range(call, axis):
    t = Tensor.ones(2, 3)
    with pytest.raises(IndexError, match=re.escape(str(axis))):
        call(t)


def test_axis_out_of_range_0d():
    with pytest.raises(IndexError, match="2"):
        Tensor(1.0).sum(axis=2)


# ----------------------------------------------------------------------------- reshape


@pytest.mark.parametrize("src,dst", [((2, 3), (4, 2)), ((6,), (7,)), ((2, 3), (2, 3, 2)), ((0, 3), (1, 3)), ((), (2,))])
def test_reshape_numel_mismatch(src, dst):
    with pytest.raises(ValueError) as ei:
        Tensor.ones(*src).reshape(dst)
    assert_mentions(ei, shape_re(dst) if len(dst) else r"\(\)", shape_re(src) if len(src) else r"\(\)")


def test_reshape_infer_impossible():
    with pytest.raises(ValueError):
        Tensor.ones(2, 3).reshape(4, -1)


# ----------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(
    "arr,name",
    [
        (np.zeros(3, dtype=np.complex64), "complex64"),
        (np.zeros((2, 2), dtype=np.complex128), "complex128"),
        (np.array([1, "a", None], dtype=object), "object"),
        (np.array(["ab", "cd"]), r"<U2|str|U2|unicode"),
    ],
)
def test_unsupported_numpy_dtype(arr, name):
    with pytest.raises(TypeError, match=name):
        Tensor(arr)


# ----------------------------------------------------------------------------- item


@pytest.mark.parametrize("shape", [(2, 3), (5,), (0,), (1, 0, 2)])
def test_item_not_one_element(shape):
    with pytest.raises(ValueError) as ei:
        Tensor.ones(*shape).item()
    assert_mentions(ei, shape_re(shape))


# ----------------------------------------------------------------------------- permute


@pytest.mark.parametrize(
    "shape,order",
    [((2, 3), (0, 0)), ((2, 3), (1,)), ((2, 3, 4), (2, 1, 1)), ((2, 3, 4), (0, -3))],
    ids=["dup", "short", "dup3", "dup_neg"],
)
def test_permute_wrong_order(shape, order):
    with pytest.raises(ValueError) as ei:
        Tensor.ones(*shape).permute(order)
    if all(o >= 0 for o in order):
        assert_mentions(ei, shape_re(order))  # negative dims may be printed resolved


# ----------------------------------------------------------------------------- pad / shrink


@pytest.mark.parametrize("arg", [((1, 1),), ((1, 1), (1, 1), (1, 1))], ids=["short", "long"])
def test_pad_wrong_length(arg):
    with pytest.raises(ValueError):
        Tensor.ones(2, 3).pad(arg)


@pytest.mark.parametrize("arg", [((0, 1),), ((0, 1), (0, 1), (0, 1))], ids=["short", "long"])
def test_shrink_wrong_length(arg):
    with pytest.raises(ValueError):
        Tensor.ones(2, 3).shrink(arg)


# ----------------------------------------------------------------------------- expand


@pytest.mark.parametrize("src,dst", [((3, 2), (3, 4)), ((2, 3), (3,)), ((4,), (4, 3)), ((2, 3), (2, 3, 3))])
def test_expand_incompatible(src, dst):
    with pytest.raises(ValueError) as ei:
        Tensor.ones(*src).expand(dst)
    assert_mentions(ei, shape_re(dst))


def test_error_does_not_poison_later_ops():
    t = Tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError):
        (t + Tensor.ones(2)).realize()
    np.testing.assert_allclose((t * 2).numpy(), [2.0, 4.0, 6.0])
    assert t.dtype == dtypes.float32
