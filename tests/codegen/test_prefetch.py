"""codegen/prefetch.py: the first loop that reads a row again from the cache (softmax's exp, log_softmax's sum of exp,
layernorm's sum of squares) asks for the next row's elements, one hint per cache line; nothing else does."""

from __future__ import annotations

import re

import numpy as np
import torch

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.runtime.ops_python import PythonRenderer
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import simplify


def linear(t: Tensor, renderer) -> list[UOp]:
    (item,) = schedule_tensors([t])
    return full_rewrite(item.ast, renderer)[0]


def loops_of(uops: list[UOp]) -> dict[UOp, list[UOp]]:
    """Each RANGE -> the uops placed directly inside it (not in a loop nested in it)."""
    out: dict[UOp, list[UOp]] = {}
    stack: list[UOp] = []
    for u in uops:
        if stack:
            out[stack[-1]].append(u)
        if u.op is Ops.RANGE:
            stack.append(u)
            out[u] = []
        elif u.op is Ops.END:
            del stack[-len([s for s in u.src[1:] if s.op is Ops.RANGE]) :]
    return out


def rows(shape=(64, 4096)) -> Tensor:
    return Tensor(np.random.default_rng(0).standard_normal(shape, dtype=np.float32), device="CPU")


def test_softmax_prefetches_the_next_row_in_its_exp_loop_one_hint_per_line():
    uops = linear(rows().softmax(-1), LLVMRenderer(simd_bytes=32))
    prefetches = [u for u in uops if u.op is Ops.PREFETCH and not u.arg]  # the reads (writes: the next test)
    loops = loops_of(uops)
    reduce_loops = [r for r in loops if r.arg[1] is AxisType.REDUCE]
    assert len(reduce_loops) == 2  # the max, then the sum of exp(x - max)
    max_loop, exp_loop = reduce_loops
    assert not any(u.op is Ops.PREFETCH for u in loops[max_loop])  # the first read of the row streams from memory
    inside = [u for u in loops[exp_loop] if u.op is Ops.PREFETCH and not u.arg]
    assert inside == prefetches and prefetches
    assert all(u in loops[exp_loop] for u in uops if u.op is Ops.PREFETCH)
    loads = [u for u in loops[exp_loop] if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
    # the loads of x in that loop cover 4 lanes each of 8 floats = 2 cache lines: one hint each
    per_iteration = sum(u.dtype.count for u in loads)
    assert len(prefetches) == per_iteration // 16
    for p in prefetches:  # each hint is a load's element one row (4096 floats) on
        diffs = {simplify(p.src[0].src[1] - ld.src[0].src[1]) for ld in loads}
        assert UOp.const(p.src[0].src[1].dtype, 4096) in diffs


def test_softmax_asks_for_its_output_row_for_writing_in_the_exp_loop():
    uops = linear(rows().softmax(-1), LLVMRenderer(simd_bytes=32))
    reads = [u for u in uops if u.op is Ops.PREFETCH and not u.arg]
    writes = [u for u in uops if u.op is Ops.PREFETCH and u.arg]
    assert len(writes) == len(reads) and {u.src[0].src[0].arg for u in writes} == {0}  # the output buffer
    # at the elements the loop reads, in the output: the read hints' indices one row (4096) back
    assert {u.src[0].src[1] for u in writes} == {simplify(u.src[0].src[1] - 4096) for u in reads}
    # layernorm's second loop is light (no transcendental): read hints only
    assert not any(u.op is Ops.PREFETCH and u.arg for u in linear(rows().layernorm(), LLVMRenderer(simd_bytes=32)))


def test_layernorm_and_log_softmax_prefetch_in_their_second_reduce():
    for t in (rows().layernorm(), rows().log_softmax(-1)):
        uops = linear(t, LLVMRenderer(simd_bytes=32))
        loops = loops_of(uops)
        reduce_loops = [r for r in loops if r.arg[1] is AxisType.REDUCE]
        with_hints = [r for r in loops if any(u.op is Ops.PREFETCH for u in loops[r])]
        assert with_hints == reduce_loops[1:2]


def test_no_hints_without_a_row_read_again_or_for_short_rows():
    for t in (rows().exp(), rows().sum(-1), rows((64, 128)).softmax(-1), rows().max(-1) + rows().sum(-1)):
        assert not any(u.op is Ops.PREFETCH for u in linear(t, LLVMRenderer(simd_bytes=32)))


def test_renderers_with_and_without_hints():
    t = rows().softmax(-1)
    (item,) = schedule_tensors([t])
    name = kernel_name(item.ast)
    ir = LLVMRenderer(simd_bytes=32).render(name, linear(t, LLVMRenderer(simd_bytes=32))).src
    # no `inbounds`: the last row's next row is past the buffer
    assert "call void @llvm.prefetch.p0(ptr" in ir and "getelementptr float, ptr %data1" in ir
    assert re.search(r"call void @llvm.prefetch.p0\(ptr %v\d+, i32 1, i32 3, i32 1\)", ir)  # for writing
    c = CStyleRenderer().render(name, linear(t, CStyleRenderer())).src
    assert re.search(r"__builtin_prefetch\(\(?data1\+[^;]*, 0\);", c)  # a read of the next row
    assert re.search(r"__builtin_prefetch\(\(?data0\+[^;]*, 1\);", c)  # a write of the output row
    assert not any(u.op is Ops.PREFETCH for u in linear(t, PythonRenderer()))


def test_values_with_hints_match_torch():
    x = np.random.default_rng(1).standard_normal((16, 2048), dtype=np.float32) * 4
    tx = torch.from_numpy(x)
    for dev in ("CPU", "CPU:C"):
        np.testing.assert_allclose(
            Tensor(x, device=dev).softmax(-1).numpy(), torch.softmax(tx, -1).numpy(), rtol=1e-5, atol=1e-7
        )
        np.testing.assert_allclose(
            Tensor(x, device=dev).layernorm().numpy(),
            torch.nn.functional.layer_norm(tx, (2048,)).numpy(),
            rtol=1e-4,
            atol=1e-5,
        )
