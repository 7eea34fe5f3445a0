"""LLVM renders a float max as the reference's max(a, b) — NaN b wins, else b where b > a, else a — with two compares
and selects (x86: a compare, a NaN test, an or and one blend), not llvm.maximum (two blends more for ordering -0 below
+0, which the PYTHON reference does not: max(-0., 0.) is -0.), so LLVM's results equal the reference's bit for bit."""

from __future__ import annotations

import re

import numpy as np
import torch

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer.llvmir import LLVMRenderer


def llvm_source(t: Tensor) -> str:
    (item,) = schedule_tensors([t])
    renderer = LLVMRenderer(simd_bytes=32)
    return renderer.render(kernel_name(item.ast), full_rewrite(item.ast, renderer)[0]).src


def test_max_reduce_loop_is_compare_and_select():
    src = llvm_source(Tensor(np.ones((64, 1024), np.float32), device="CPU").max(axis=1))
    assert "llvm.maximum" not in src
    # acc = max(acc, x): x > acc ? x : acc, then x where x is NaN
    assert re.search(
        r"(%v\d+) = fcmp ogt <8 x float> (%v\d+), (%v\d+)\n  (%v\d+) = select <8 x i1> \1, <8 x float> \2, "
        r"<8 x float> \3\n  (%v\d+) = fcmp uno <8 x float> \2, \2\n  %v\d+ = select <8 x i1> \5, <8 x float> \2, "
        r"<8 x float> \4",
        src,
    )


def test_max_matches_the_reference_on_nan_and_signed_zeros():
    a = np.float32([-0.0, 0.0, np.nan, 1.0, 0.0, -0.0, 3.0, np.nan] * 4)
    b = np.float32([0.0, -0.0, 1.0, np.nan, 0.0, -0.0, np.nan, np.nan] * 4)
    out = Tensor(a, device="CPU").maximum(Tensor(b, device="CPU")).numpy()
    ref = Tensor(a, device="PYTHON").maximum(Tensor(b, device="PYTHON")).numpy()
    np.testing.assert_array_equal(out, torch.maximum(torch.from_numpy(a), torch.from_numpy(b)).numpy())  # NaN, values
    assert np.array_equal(out, ref, equal_nan=True) and (np.signbit(out) == np.signbit(ref))[~np.isnan(ref)].all()
    assert np.signbit(out[0]) and not np.signbit(out[1])  # the first of two equal zeros, as the reference
    rows = np.float32([[-0.0, 0.0] * 16, [0.0, -0.0] * 16, [1.0, np.nan] * 16])
    out, ref = Tensor(rows).max(-1).numpy(), Tensor(rows, device="PYTHON").max(-1).numpy()
    assert np.array_equal(out, ref, equal_nan=True) and (np.signbit(out) == np.signbit(ref))[~np.isnan(ref)].all()
