"""A gated read's index simplified where its gate holds (`codegen/simplify.py: pm_index_given_valid`).

A conv whose output is padded before a max pool (a ResNet or ShuffleNet stem: conv, batchnorm, relu, then
max_pool2d(3, 2, padding=1)) reads the conv's input at `c*S + (h-1)*W + (w-1)` written flat, and its view chain
splits that back with // and %: with 1 <= h, w <= H only (the pad's gate), `(.. // W) % H` is h - 1. Without the
gate's bounds the simplifier cannot tell, and every load computed eight divisions: the kernel ran at 0.09 GFLOPS.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Tensor
from zeptograd.codegen import ranges_simplified
from zeptograd.codegen.simplify import count_divmod, index_given_valid
from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp

rng = np.random.default_rng(0)


def _padded_read(lo: int = 1, hi: int = 113) -> tuple[UOp, UOp, UOp, UOp]:
    """INDEX(buf, ((c*12544 + h*112 + w - 113) // 112) % 112 * 112 + (..) % 112, lo <= h < hi and 1 <= w < 113)"""
    c, h, w = (UOp.range(n, k) for k, n in enumerate((24, 114, 114)))
    flat = c * 12544 + h * 112 + w + (-113)
    idx = c * 12544 + (flat // 112) % 112 * 112 + flat % 112
    valid = (h < lo).logical_not() & (h < hi) & (w < 1).logical_not() & (w < 113)
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float.ptr(24 * 112 * 112), (), 0)
    return UOp(Ops.INDEX, buf.dtype, (buf, idx, valid)), c, h, w


def test_padded_read_index_loses_its_divisions():
    x, c, h, w = _padded_read()
    assert count_divmod(x.src[1]) == 3
    new = index_given_valid(x)
    assert new is not None and count_divmod(new.src[1]) == 0
    assert new.src[2] is x.src[2]  # the gate stays: where it is false, nothing is read
    # where the gate holds the two indexes agree
    for hv, wv in ((1, 1), (1, 112), (57, 3), (112, 112)):
        for cv in (0, 23):
            env = {c: cv, h: hv, w: wv}
            assert _eval(new.src[1], env) == _eval(x.src[1], env)


def test_a_gate_that_does_not_narrow_the_divided_terms_changes_nothing():
    x, _, _, _ = _padded_read(lo=0, hi=114)  # h unbounded by the gate: (h-1) may be -1 or 112
    y = index_given_valid(x)
    assert y is None or count_divmod(y.src[1]) >= 1


def _eval(u: UOp, env: dict[UOp, int]) -> int:
    vals: dict[UOp, int] = {}
    for n in u.toposort():
        if n in env:
            vals[n] = env[n]
        elif n.op is Ops.CONST:
            vals[n] = n.arg
        elif n.op is Ops.ADD:
            vals[n] = vals[n.src[0]] + vals[n.src[1]]
        elif n.op is Ops.MUL:
            vals[n] = vals[n.src[0]] * vals[n.src[1]]
        elif n.op is Ops.IDIV:  # C's division: toward zero
            a, b = vals[n.src[0]], vals[n.src[1]]
            vals[n] = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
        elif n.op is Ops.MOD:
            a, b = vals[n.src[0]], vals[n.src[1]]
            vals[n] = a - b * (abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1))
        else:
            raise AssertionError(f"unexpected {n.op}")
    return vals[u]


def _stem(x: Tensor, w: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    y = x.conv2d(w, stride=2, padding=1)
    y = y * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)
    return y.relu().max_pool2d(3, stride=2, padding=1)


def _stem_data(size: int):
    return (
        rng.standard_normal((1, 3, size, size), dtype=np.float32),
        rng.standard_normal((8, 3, 3, 3), dtype=np.float32),
        rng.random(8, dtype=np.float32) + 0.5,
        rng.standard_normal(8, dtype=np.float32),
    )


def test_conv_bn_relu_maxpool_stem_has_no_divisions():
    arrays = _stem_data(32)
    items = _stem(*(Tensor(a) for a in arrays)).schedule()
    kernels = [ranges_simplified(i.ast) for i in items if i.ast.op is Ops.SINK]
    assert any(u.op is Ops.REDUCE and len(u.src) == 4 for k in kernels for u in k.toposort()), "the 3x3x3 conv"
    assert [count_divmod(k) for k in kernels] == [0] * len(kernels)  # was 5 in the kernel storing the padded output


@pytest.mark.parametrize("dev", ["CPU", "CPU:C", "PYTHON", "CL"])
def test_conv_bn_relu_maxpool_stem_matches_torch(dev):
    if dev == "CL":
        pytest.importorskip("pyopencl")
    arrays = _stem_data(16 if dev == "PYTHON" else 32)
    out = _stem(*(Tensor(a, device=dev) for a in arrays)).numpy()
    x, w, scale, shift = (torch.from_numpy(a) for a in arrays)
    y = torch.nn.functional.conv2d(x, w, stride=2, padding=1) * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)
    ref = torch.nn.functional.max_pool2d(y.relu(), 3, stride=2, padding=1).numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
