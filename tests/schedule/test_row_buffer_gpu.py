"""Row kernels on a GPU (codegen/gpudims.py: `split_rows`): softmax, log_softmax and layernorm are one kernel that runs
a work-group per row. Its threads share the row's reduces (each a strided part, combined through local memory after a
barrier) and the output loop along the row; softmax's exp is stored once per element in a `__local` row buffer during
the sum's loop and read back after the sum's barrier. A row longer than the local memory holds gets no row buffer.
On CL (PoCL runs OpenCL on the CPU here); CUDA is rendered only."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from zeptograd import Context, Device, GlobalCounters, Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.schedule_cache import SCHEDULE_CACHE
from zeptograd.renderer.gpu import CUDARenderer
from zeptograd.schedule import policy
from zeptograd.uop.ops import Ops

pytest.importorskip("pyopencl")
rng = np.random.default_rng(0)

ROW_OPS = {
    "softmax": (lambda x: x.softmax(-1), lambda t: t.softmax(-1)),
    "log_softmax": (lambda x: x.log_softmax(-1), lambda t: t.log_softmax(-1)),
    "layernorm": (lambda x: x.layernorm(), lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:], eps=1e-5)),
}
# rows of 1, odd lengths, fewer than the work-group's 256 threads, not a multiple of them, and a 3-d tensor
SHAPES = [(4, 1), (3, 7), (5, 100), (2, 1000), (2, 3, 257)]


@pytest.fixture
def cl():
    try:
        return Device["CL"]
    except Exception as e:
        pytest.skip(f"no OpenCL here: {e}")


def specs(t: Tensor, renderer=None) -> list:
    """The rendered program of each kernel that would realize t (scheduled for t's device)."""
    with Context(**{SCHEDULE_CACHE.key: 0}):  # a patched policy: schedule again
        items = [i for i in t.schedule() if i.ast.op is Ops.SINK]
    renderer = renderer or Device[t.device].renderer
    return [renderer.render(kernel_name(i.ast), full_rewrite(i.ast, renderer)[0]) for i in items]


def sources(t: Tensor, renderer=None) -> list[str]:
    return [spec.src for spec in specs(t, renderer)]


def check_values(ours, theirs, shapes) -> None:
    for shape in shapes:
        xn = rng.standard_normal(shape).astype(np.float32) * 3
        GlobalCounters.reset()
        got = ours(Tensor(xn, device="CL")).numpy()
        assert GlobalCounters.kernel_count == 1, shape
        np.testing.assert_allclose(got, theirs(torch.from_numpy(xn)).numpy(), rtol=2e-5, atol=2e-5, err_msg=str(shape))


@pytest.mark.parametrize("name", sorted(ROW_OPS))
def test_row_ops_are_one_kernel_on_cl(cl, name):
    """Before: softmax took 4 kernels on CL (max, exp stored, sum, division), log_softmax and layernorm 3."""
    check_values(*ROW_OPS[name], SHAPES)


def test_softmax_keeps_its_exp_row_in_local_memory(cl):
    """One kernel: the row's max and sum each a work-group reduce (a barrier each), exp computed once per element
    and stored to `__local float row0[1000]` in the sum's loop, the output loop reading it back after the sum's
    barrier; each thread stores its own (ungated). The same kernel rendered for CUDA: `__shared__` and
    `__syncthreads()`. On the CPU the row buffer is still a stack array (no local memory, no barrier)."""
    x = Tensor.empty(8, 1000, device="CL")
    (src,) = sources(x.softmax(-1))
    assert "__local float row0[1000];" in src and src.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2
    assert src.count("exp2(") == 1 and "if (" not in src
    (cuda,) = sources(x.softmax(-1), CUDARenderer())
    assert "__shared__ float row0[1000];" in cuda and cuda.count("__syncthreads();") == 2
    # a work-group per row, of about sqrt(n) threads (each combines every partial): 32 threads for 1024, each
    # looping over its 32 elements of the row (the loop is no group id)
    (spec,) = specs(Tensor.empty(8, 1024, device="CL").softmax(-1))
    assert spec.global_size == (8, 1, 1) and spec.local_size == (32, 1, 1) and "< 32; " in spec.src
    (c,) = sources(Tensor.empty(8, 1000, device="CPU:C").softmax(-1))
    assert "row0" not in c and "barrier" not in c and "[1000];" in c


def test_log_softmax_and_logsumexp_share_the_row(cl):
    """log_softmax's x - max is recomputed from the row (cheap: schedule/cost.py), so no row buffer, but its two
    reduces are the work-group's; logsumexp's max, read inside the sum's loop, too (only thread 0 stores)."""
    (src,) = sources(Tensor.empty(8, 1000, device="CL").log_softmax(-1))
    assert "row0" not in src and src.count("barrier(") == 2
    (src,) = sources(Tensor.empty(8, 1000, device="CL").logsumexp(-1))
    assert src.count("barrier(") == 2 and "(lidx0==0)" in src and src.count("if (") == 1
    # an int scatter's kernel: three row reduces, one read inside another's loop, whose partial then starts after
    # the first's combine (codegen/gpudims.py: _group_reduce)
    xn, idx = np.arange(60, dtype=np.int32).reshape(3, 20), rng.integers(0, 20, (3, 16)).astype(np.int32)
    srcn = np.arange(48, dtype=np.int32).reshape(3, 16) + 100
    want = xn.copy()
    np.put_along_axis(want, idx, srcn, 1)  # a repeated index: the last one wins, as ours
    got = Tensor(xn, device="CL").scatter(1, Tensor(idx, device="CL"), Tensor(srcn, device="CL")).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("knob", [{"NOOPT": 1}, {"BEAM": 2, "BEAM_BUDGET": 20}])
def test_under_noopt_and_beam(cl, knob):
    """NOOPT: the same local row buffer (the work-group is codegen's, not an optimizer action). BEAM: one kernel,
    torch's values (it may choose a form without the work-group, a thread per row, where that times faster)."""
    with Context(**knob):
        check_values(*ROW_OPS["softmax"], [(3, 7), (4, 40)] if "BEAM" in knob else SHAPES)
        if "NOOPT" in knob:
            (src,) = sources(Tensor.empty(8, 1000, device="CL").softmax(-1))
            assert "__local float row0[1000];" in src and src.count("barrier(") == 2


def test_a_row_past_local_memory_has_no_row_buffer(cl, monkeypatch):
    """A row longer than local memory less the reduces' reserve (policy.row_buffer_bytes) gets no row buffer: the
    exp is recomputed or stored, the values stay torch's."""
    monkeypatch.setattr(policy, "GPU_ROW_BUFFER_RESERVE", cl.renderer.local_memory_bytes - 999 * 4)
    assert all("row0" not in s for s in sources(Tensor.empty(2, 1000, device="CL").softmax(-1)))
    xn = rng.standard_normal((2, 1000)).astype(np.float32)
    with Context(**{SCHEDULE_CACHE.key: 0}):
        got = Tensor(xn, device="CL").softmax(-1).numpy()
    np.testing.assert_allclose(got, torch.from_numpy(xn).softmax(-1).numpy(), rtol=2e-5, atol=2e-6)
    monkeypatch.setattr(policy, "GPU_ROW_BUFFER_RESERVE", cl.renderer.local_memory_bytes - 1000 * 4)
    (src,) = sources(Tensor.empty(2, 1000, device="CL").softmax(-1))
    assert "__local float row0[1000];" in src


def test_row_buffers_of_one_kernel_share_local_memory(cl, monkeypatch):
    """Attention's scores and exp rows fill one kernel's row buffers: together within local memory, or the second
    is not buffered (here each of 300 floats fits alone, not both; the scores are then stored): one `__local` row
    and no per-thread array (a kernel whose rows overflow local memory would run a thread per output, each with a
    private copy of the rows)."""
    from zeptograd.schedule import cost

    monkeypatch.setattr(cost, "EXPANDED_BUFFER_BYTES", 0)  # the scores in the attention kernel (no stored scores)
    monkeypatch.setattr(policy, "GPU_ROW_BUFFER_RESERVE", cl.renderer.local_memory_bytes - 400 * 4)
    arrs = [rng.standard_normal((1, 2, 300, 16)).astype(np.float32) for _ in range(3)]
    q, k, v = (Tensor(a, device="CL") for a in arrs)
    srcs = sources(q.scaled_dot_product_attention(k, v, is_causal=True))
    assert sum(s.count("__local float row") for s in srcs) == 1 and not any(
        re.search(r"float acc\d+\[", s) for s in srcs
    )
    with Context(**{SCHEDULE_CACHE.key: 0}):
        got = q.scaled_dot_product_attention(k, v, is_causal=True).numpy()
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, arrs), is_causal=True).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("action", ["GROUP", "LOCAL"])
def test_a_row_buffer_kernel_refuses_threads_given_by_hand(cl, action):
    """Explicit LOCAL/GROUP actions on a kernel with a row buffer are refused (split_rows would not run, and each
    thread would read the slots of a private row buffer other threads filled: nan)."""
    from zeptograd.codegen.opt import Opt, OptError, OptOps

    x = Tensor(rng.standard_normal((8, 300)).astype(np.float32), device="CL")
    with Context(**{SCHEDULE_CACHE.key: 0}):
        (item,) = x.softmax(-1).schedule()
    assert any(u.op is Ops.DEFINE_REG for u in item.ast.toposort())  # the exp row
    axis = 2 if action == "GROUP" else 0
    with pytest.raises(OptError, match="row buffer"):
        full_rewrite(item.ast, cl.renderer, [Opt(OptOps[action], axis, 4)])


def test_a_reduce_over_two_axes_keeps_its_own_kernel(cl):
    """A reduce over two axes that do not merge (a slice of the last) is stored by a kernel of its own: split_rows
    shares one reduce loop among a row's threads, and the other axis's loop would be work-groups that each computed
    the whole reduce again."""
    xn = rng.standard_normal((3, 20, 50)).astype(np.float32)
    y = Tensor(xn, device="CL")[:, :, :49]
    GlobalCounters.reset()
    got = (y / y.sum((1, 2), keepdim=True)).numpy()
    assert GlobalCounters.kernel_count == 2
    yn = xn[:, :, :49].astype(np.float64)
    np.testing.assert_allclose(got, yn / yn.sum((1, 2), keepdims=True), rtol=1e-4, atol=1e-5)
