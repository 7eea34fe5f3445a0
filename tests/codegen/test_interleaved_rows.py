"""Short reduced rows computed several at once (codegen/opt/heuristic.py: take_interleaved_rows). Where every reduce's
axis is taken whole in vectors (rows of 16-64 floats: softmax, layernorm, a max, gpt_tiny's exp(scores - max) over 32
keys), the rows' loop is UPCAST, so several rows' horizontal reductions are independent chains in one body; a lone row
sum, a longer row (its reduce loop left) and a matmul's rows (an operand shared along them) are not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Tensor
from zeptograd.codegen import actions_kernel
from zeptograd.codegen.opt import OptOps, heuristic, kernel_axes
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.device import Device
from zeptograd.helpers import Context
from zeptograd.uop.ops import AxisType, Ops

OPS = {
    "softmax": (lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1)),
    "log_softmax": (lambda t: t.log_softmax(-1), lambda t: torch.log_softmax(t, -1)),
    "layernorm": (lambda t: t.layernorm(), lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:])),
    "rmsnorm": (lambda t: t * (t.square().mean(-1, keepdim=True) + 1e-6).rsqrt(), None),
    "max": (lambda t: t.max(-1), lambda t: t.max(-1).values),
    "numerator": (lambda t: (t - t.max(-1, keepdim=True)).exp(), lambda t: (t - t.max(-1, keepdim=True).values).exp()),
}


def last_kernel(out: Tensor):
    items = [it for it in out.schedule() if it.ast.op is Ops.SINK]
    assert len(items) == 1
    return actions_kernel(items[0].ast, Device["CPU"].renderer)


def row_upcasts(ast, simd_bytes: int) -> list[int]:
    """The UPCAST amounts the heuristic takes on the kernel's rows (its first axis, the rows merged into one loop)."""
    rows = kernel_axes(ast)[0]
    assert rows.arg[1] is AxisType.LOOP
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    return [o.arg for o in opts if o.op is OptOps.UPCAST and o.axis == 0]


# (vector bytes, row length): rows of at most 4 vectors, whose reduces the heuristic takes whole (4 accumulators)
@pytest.mark.parametrize("simd_bytes, n", [(64, 16), (64, 32), (64, 64), (32, 16), (32, 32)])
@pytest.mark.parametrize("op", list(OPS))
def test_short_rows_are_interleaved(simd_bytes, n, op):
    rows = row_upcasts(last_kernel(OPS[op][0](Tensor.empty(8192 // n, n))), simd_bytes)
    assert len(rows) == 1 and rows[0] >= 2
    # each row copy's vectors within the registers (32 with AVX-512's 64-byte vectors, 16 with AVX2's 32)
    assert rows[0] * max(1, n // (simd_bytes // 4)) <= (32 if simd_bytes == 64 else 16)


def test_gpt_tiny_attention_numerator_is_interleaved():
    """exp(scores - max) over gpt_tiny's 32 keys, (16, 4, 32, 32): 8 rows (33 -> 20 us on one AVX-512 core)."""
    assert row_upcasts(last_kernel(OPS["numerator"][0](Tensor.empty(16, 4, 32, 32))), 64) == [8]


@pytest.mark.parametrize("simd_bytes", [64, 32])
def test_rows_times_a_vector_along_them_are_interleaved(simd_bytes):
    """(x * v).max(-1) with v (16,): v's load is every row's (no output loop moves it), the rows are still
    interleaved (218 -> 62 us at (256, 256, 16) on one AVX-512 core; the unfused max was faster than this kernel)."""
    x = Tensor.empty(256, 256, 16)
    rows = row_upcasts(last_kernel((x * Tensor.empty(16)).max(-1)), simd_bytes)
    assert len(rows) == 1 and rows[0] >= 2
    rng = np.random.default_rng(0)
    xn, vn = rng.standard_normal((64, 8, 16)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    np.testing.assert_array_equal((Tensor(xn) * Tensor(vn)).max(-1).numpy(), (xn * vn).max(-1))


@pytest.mark.parametrize("simd_bytes", [64, 32])
@pytest.mark.parametrize(
    "build",
    [
        lambda: Tensor.empty(256, 32).sum(-1),  # a row sum: its adds' chain is short, its rows stream from the cache
        lambda: Tensor.empty(256, 32).exp().sum(-1),
        lambda: (Tensor.empty(64, 64, 64) + Tensor.empty(1, 64, 1)).sum(2),
        lambda: Tensor.empty(64, 1024).softmax(-1),  # a long row: its reduce loop is the work
        lambda: Tensor.empty(64, 256).max(-1),
        lambda: Tensor.empty(64, 16) @ Tensor.empty(16, 64),  # a matmul's rows share w: its register tile is the rows
        lambda: Tensor.empty(16, 4, 32, 16) @ Tensor.empty(16, 4, 16, 32),  # ... and its heads none of them
        lambda: Tensor.empty(32, 256).softmax(0),  # along a strided axis: vectors of columns, a loop over the rows
    ],
)
def test_other_rows_are_not(build, simd_bytes, monkeypatch):
    kernels = [actions_kernel(it.ast, Device["CPU"].renderer) for it in build().schedule() if it.ast.op is Ops.SINK]
    chosen = [hand_coded_optimizations(ast, simd_bytes, threads=1)[1] for ast in kernels]
    monkeypatch.setattr(heuristic, "take_interleaved_rows", lambda plan, simd_bytes: None, raising=False)
    assert [hand_coded_optimizations(ast, simd_bytes, threads=1)[1] for ast in kernels] == chosen


def special_rows(rows: int, n: int) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((rows, n)).astype(np.float32) * 4
    x[1, 3] = np.nan
    x[2, :] = -np.inf
    x[3, 5] = np.inf
    x[4, 0], x[4, 7] = np.inf, -np.inf
    x[5, :] = np.inf
    x[6, 2] = np.nan
    x[6, 9] = np.inf
    return x


@pytest.mark.parametrize("rows, n", [(64, 16), (40, 32), (18, 64), (8192 // 32, 32)])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("noopt", [0, 1])
def test_values_match_torch(rows, n, op, noopt):
    x = special_rows(rows, n)
    t = torch.from_numpy(x)
    want = (OPS[op][1] or OPS[op][0])(t).numpy()
    with Context(NOOPT=noopt):
        got = OPS[op][0](Tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
