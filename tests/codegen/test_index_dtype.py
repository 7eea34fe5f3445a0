"""Index dtypes (codegen/lower.py: pm_index_dtype): index arithmetic is int32 unless its value range leaves int32,
then int64 — in the rendered source of every renderer, and only where the value ranges say so."""

import re

import numpy as np
import pytest

from zeptograd import Tensor, dtypes
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.renderer.gpu import CUDARenderer, OpenCLRenderer
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.uop.ops import GroupOp, Ops, _alu_range

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
# how each renderer spells a 64-bit integer: LLVM i64, C long long, OpenCL long
WIDE = {
    "C": re.compile(r"\blong long\b"),
    "LLVM": re.compile(r"\bi64\b"),
    "CL": re.compile(r"\blong\b"),
    "CUDA": re.compile(r"\blong long\b"),
}
RENDERERS = {"C": CStyleRenderer, "LLVM": LLVMRenderer, "CL": OpenCLRenderer, "CUDA": CUDARenderer}


def kernels(t: Tensor):
    return [item.ast for item in t.schedule()]


def render(ast, name: str, opts=None) -> tuple[str, list]:
    """the source and the linear uops: optimized by the heuristic, or with `opts=[]` as scheduled"""
    renderer = RENDERERS[name]()
    uops, _ = full_rewrite(ast, renderer, opts)
    return renderer.render(kernel_name(ast), uops).src, uops


def fits(u) -> bool:
    return I32_MIN <= u.vmin and u.vmax <= I32_MAX


def avg_pool_181():
    return Tensor(np.ones((1, 1, 181, 181), np.float32)).avg_pool2d(181)


def max_pool_64():
    return Tensor(np.ones((1, 1, 512, 512), np.float32)).max_pool2d(64)


def window_65536():
    return Tensor(np.ones((1, 1, 1, 65536), np.float32)).avg_pool2d((1, 65536))


def expanded_view_shrink():
    x = Tensor(np.arange(10, dtype=np.float32))
    return x.reshape(10, 1).expand(10, 3 * 10**9).reshape(3 * 10**10)[2 * 10**10 + 5 :: 3 * 10**9]


def big_view_slice():
    x = Tensor(np.arange(10, dtype=np.float32))
    return x.reshape(1, 10).expand(3 * 10**8, 10).reshape(3 * 10**9)[2**31 + 3 : 2**31 + 23]


def huge_elementwise():
    return Tensor.empty(10**12) + 1  # never realized: scheduling and rendering allocate nothing


WIDE_CASES = [
    avg_pool_181,
    max_pool_64,
    window_65536,
    expanded_view_shrink,
    big_view_slice,
    huge_elementwise,
]
# unoptimized: some index value leaves int32 (window_65536 no longer does: a window that does not overlap is a reshape,
# not a repeated copy whose index reached 65536**2)
NEEDS_INT64 = {huge_elementwise}


@pytest.mark.slow
@pytest.mark.parametrize("name", RENDERERS)
def test_small_kernels_stay_int32(name):
    x = Tensor(np.ones((4, 32, 32), np.float32))
    for t in (x.sum(1), x.permute(2, 0, 1) + 1, x.reshape(1, 4, 32, 32).max_pool2d(2), x @ x):
        for ast in kernels(t):
            src, uops = render(ast, name)
            assert not WIDE[name].search(src), src
            assert all(u.dtype.scalar != dtypes.int64 for u in uops)


@pytest.mark.slow
@pytest.mark.parametrize("opts", [[], None], ids=["unoptimized", "heuristic"])
@pytest.mark.parametrize("name", RENDERERS)
@pytest.mark.parametrize("case", WIDE_CASES, ids=lambda f: f.__name__)
def test_int64_where_ranges_leave_int32(case, name, opts):
    """Every 64-bit op has a source or a result whose value range leaves int32 (no wider than needed); no int32 op
    reads a 64-bit value or can wrap (its exact range, from its sources', fits: the issue's `mul i32 %ridx2,
    23850189`); unoptimized, the cases whose index values leave int32 compute them in 64 bits."""
    wide_ops = 0
    for ast in kernels(case()):
        src, uops = render(ast, name, opts)
        wide_before = wide_ops
        for u in uops:
            if u.dtype.scalar == dtypes.int64 and (u.op in GroupOp.ALU or u.op is Ops.RANGE):
                assert not fits(u) or any(not fits(s) for s in u.src), f"{u.op} in int64 needlessly"
                wide_ops += 1
            if u.dtype.scalar == dtypes.int32 and u.op in GroupOp.ALU:
                assert all(s.dtype.scalar != dtypes.int64 for s in u.src)
                if all(dtypes.is_int(s.dtype) for s in u.src) and (r := _alu_range(u.op, [s.vrange for s in u.src])):
                    assert I32_MIN <= r[0] and r[1] <= I32_MAX, f"int32 {u.op} can wrap: {r}"
        if wide_ops > wide_before:
            assert WIDE[name].search(src)
    assert wide_ops or opts is None or case not in NEEDS_INT64, "no 64-bit index math where values leave int32"


@pytest.mark.parametrize("name", ["C", "LLVM"])
def test_loop_past_int32_is_int64(name):
    """(Tensor.empty(10**12) + 1): the loop bound 10**12 was an int32 (negative: no iterations, and the kernel did not
    link). Now the loop variable, its bound and the address are 64-bit."""
    (ast,) = kernels(huge_elementwise())
    src, uops = render(ast, name)
    ranges = [u for u in uops if u.op is Ops.RANGE]
    assert any(r.dtype == dtypes.int64 for r in ranges)
    assert all(r.src[0].arg > 0 for r in ranges if r.src[0].op is Ops.CONST)
    assert re.search(r"for \(long long ridx\d+ = 0" if name == "C" else r"phi i64", src)


def test_avg_pool_181_index_is_exact():
    """the issue's `mul i32 %ridx2, 23850189` wrapped; with index constants exact past int32 the value ranges let
    symbolic fold the window's index to the plain loop over 181*181 inputs: int32, no multiply left"""
    (ast,) = kernels(avg_pool_181())
    src, _ = render(ast, "LLVM", [])
    assert "23850189" not in src and not WIDE["LLVM"].search(src.split("define")[1])


def test_arange_past_int32_is_int64():
    """arange(2**31 + 8): its IOTA is int64 (0..n-1 must not wrap) and no loop bound wrapped negative"""
    t = Tensor.arange(2**31 + 8, dtype=dtypes.int64)
    assert [u.dtype for u in t.uop.toposort() if u.op is Ops.IOTA] == [dtypes.int64]
    for ast in kernels(t.max()):
        _, uops = render(ast, "C")
        assert all(r.src[0].arg > 0 for r in uops if r.op is Ops.RANGE and r.src[0].op is Ops.CONST)
        assert any(u.op is Ops.RANGE and u.dtype == dtypes.int64 for u in uops) or all(
            u.vmax <= 2**31 - 1 for u in uops if u.op is Ops.RANGE
        )
