"""A reduce kept in its consumer's kernel, computed before the output loops it does not vary along
(schedule/policy.py: `hoisted_reduce_requests`): softmax, log_softmax and layernorm are one kernel that runs, per row,
the row's reduces and then its outputs, reading the row from memory once (on a GPU a work-group per row:
codegen/gpudims.py, split_rows). A reduce broadcast along an outer loop (column statistics subtracted from each row)
or one over a row longer than a core's cache is stored as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, GlobalCounters, Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.schedule.policy import MAX_HOISTED_ROW
from zeptograd.uop.ops import AxisType, Ops

rng = np.random.default_rng(0)


def kernels(t: Tensor) -> list:
    return [item for item in t.schedule() if item.ast.op is Ops.SINK]


def _layernorm(t):
    return torch.nn.functional.layer_norm(t, t.shape[-1:], eps=1e-5)


ROW_OPS = {
    "softmax": (lambda x: x.softmax(-1), lambda t: t.softmax(-1)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda t: t.log_softmax(-1)),
    "layernorm": (lambda x: x.layernorm(), _layernorm),
    "layernorm_affine": (
        lambda x: x.layernorm() * Tensor(np.linspace(0.5, 2, x.shape[-1], dtype=np.float32), device=x.device) + 1,
        lambda t: _layernorm(t) * torch.linspace(0.5, 2, t.shape[-1]) + 1,
    ),
    "logsumexp": (lambda x: x.logsumexp(-1), lambda t: t.logsumexp(-1)),
}


@pytest.mark.parametrize("name", sorted(ROW_OPS))
def test_row_statistics_and_outputs_are_one_kernel(name):
    x = Tensor(rng.standard_normal((64, 1000)).astype(np.float32)).realize()
    assert len(kernels(ROW_OPS[name][0](x))) == 1  # softmax's exp: in a row buffer (tests/schedule/test_row_buffer.py)
    assert len(kernels(ROW_OPS[name][0](Tensor.empty(4096, 4096)))) == 1


def test_a_reduce_broadcast_along_an_outer_loop_is_stored():
    """x - x.mean(0): the column means do not vary along the rows, which are the OUTER loop: kept in the kernel they
    would be computed again for every row."""
    xn = rng.standard_normal((64, 100)).astype(np.float32)
    x = Tensor(xn).realize()
    assert len(kernels(x - x.mean(0))) == 2
    assert len(kernels(x - x.mean(1, keepdim=True))) == 1  # the row means: before the row's outputs
    np.testing.assert_allclose((x - x.mean(0)).numpy(), xn - xn.mean(0), rtol=1e-5, atol=1e-6)


def test_a_reduce_read_inside_a_reduce_it_varies_along_is_stored():
    """sum_k (x[i, k] - max_j x[k, j]): the max is read at k, a reduce loop, which every output loop is outside of."""
    xn = rng.standard_normal((32, 32)).astype(np.float32)
    x = Tensor(xn).realize()
    t = (x - x.max(1).reshape(1, 32)).sum(1)
    assert len(kernels(t)) == 2
    np.testing.assert_allclose(t.numpy(), (xn - xn.max(1)[None, :]).sum(1), rtol=1e-5, atol=1e-4)


def test_rows_too_long_for_the_cache_are_stored():
    from zeptograd.schedule import policy

    x = Tensor(rng.standard_normal((4, 200)).astype(np.float32)).realize()
    old = policy.MAX_HOISTED_ROW
    try:
        policy.MAX_HOISTED_ROW = 100
        # the max and the sum of exp stored (one kernel with two stores: schedule/row_group.py), then the output
        items = kernels(x.softmax(-1))
        assert len(items) == 2 and len(items[0].outputs) == 2
    finally:
        policy.MAX_HOISTED_ROW = old
    assert MAX_HOISTED_ROW >= 4096  # a (4096, 4096) softmax is one kernel


def test_the_code_runs_the_reduce_loops_before_the_output_loop():
    """for row { for k: max; for k: sum; for col: out } -- each loop nest inside the row's, the reduces closed
    before the output loop opens, each loop a vector of its own (codegen/expander.py: choose_vector_ranges)."""
    (item,) = kernels(Tensor(rng.standard_normal((64, 256)).astype(np.float32)).log_softmax(-1))
    uops, _ = full_rewrite(item.ast, Device["CPU"].renderer)
    nesting = ""  # L( / R( a loop or reduce loop opens, ) one closes
    for u in uops:
        if u.op is Ops.RANGE and u.arg[1] in (AxisType.LOOP, AxisType.REDUCE):
            nesting += "L(" if u.arg[1] is AxisType.LOOP else "R("
        elif u.op is Ops.END:
            nesting += ")" * sum(r.op is Ops.RANGE and r.arg[1] in (AxisType.LOOP, AxisType.REDUCE) for r in u.src[1:])
    assert nesting == "L(R()R()L())"
    memory = [u for u in uops if u.op in (Ops.LOAD, Ops.STORE) and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
    stores = [u for u in memory if u.op is Ops.STORE]
    loads = [u for u in memory if u.op is Ops.LOAD]
    lanes = Device["CPU"].renderer.simd_bytes // 4  # this host's float vector (16 with AVX-512, 8 with AVX2)
    assert len(stores) == 1 and stores[0].src[1].dtype.count == lanes  # the output row: a whole vector
    assert {u.dtype.count for u in loads} == {lanes}  # every read of the row: whole vectors (max, sum and output)


CPU_DEVICES = ["CPU", "CPU:C", "PYTHON"]


@pytest.mark.parametrize("device", CPU_DEVICES + ["CL"])
@pytest.mark.parametrize("name", sorted(ROW_OPS))
def test_values_match_torch(device, name):
    if device == "CL":
        pytest.importorskip("pyopencl")
    shapes = [(3, 7), (33, 70), (5, 100)] + ([(64, 1000)] if device in ("CPU", "CPU:C") else [])
    ours, theirs = ROW_OPS[name]
    for shape in shapes:
        xn = rng.standard_normal(shape).astype(np.float32) * 3
        GlobalCounters.reset()
        got = ours(Tensor(xn, device=device)).numpy()
        np.testing.assert_allclose(got, theirs(torch.from_numpy(xn)).numpy(), rtol=2e-5, atol=2e-5)
        assert GlobalCounters.kernel_count == 1, (name, shape)


@pytest.mark.parametrize("knob", [{"NOOPT": 1}, {"BEAM": 1}])
def test_values_under_noopt_and_beam(knob):
    xn = rng.standard_normal((6, 40)).astype(np.float32)
    with Context(**knob):
        for name, (ours, theirs) in ROW_OPS.items():
            GlobalCounters.reset()
            got = ours(Tensor(xn)).numpy()
            assert GlobalCounters.kernel_count == 1, name
            np.testing.assert_allclose(got, theirs(torch.from_numpy(xn)).numpy(), rtol=2e-5, atol=2e-5, err_msg=name)
