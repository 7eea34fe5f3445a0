"""Codegen: the REDUCE -> accumulator graph, linearized loops, and the rendered C."""

import numpy as np

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.codegen.accumulator import lower_reduces
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.uop.ops import Ops


def kernel_of(t: Tensor):
    (item,) = t.schedule()
    return item


def test_sum_axis1_graph_before_and_after_reduce_to_acc():
    a = Tensor(np.ones((2, 3), np.float32))
    ast = kernel_of(a.sum(axis=1)).ast
    ops_before = {u.op for u in ast.toposort()}
    assert Ops.REDUCE in ops_before and Ops.DEFINE_REG not in ops_before
    after = lower_reduces(ast)
    nodes = list(after.toposort())
    ops_after = [u.op for u in nodes]
    assert Ops.REDUCE not in ops_after
    assert ops_after.count(Ops.DEFINE_REG) == 1
    r0, r1 = sorted((u for u in nodes if u.op is Ops.RANGE), key=lambda r: r.arg[0])
    afters = [u for u in nodes if u.op is Ops.AFTER]
    # init: acc.after(r0).index(0).store(0) -- once per outer iteration
    init_after = next(u for u in afters if u.src[1:] == (r0,))
    init_store = next(u for u in nodes if u.op is Ops.STORE and u.src[0].src[0] is init_after)
    assert init_store.src[1].op is Ops.CONST and init_store.src[1].arg == 0.0
    # inside the loop: acc.after(init, r1) is read, added to, stored; END closes r1; the result is read after it
    loop_after = next(u for u in afters if r1 in u.src[1:])
    assert init_store in loop_after.src
    end = next(u for u in nodes if u.op is Ops.END and u.src[1:] == (r1,))
    assert end.src[0].op is Ops.STORE and end.src[0].src[1].op is Ops.ADD
    assert any(u.src[1:] == (end,) for u in afters)


def test_linearized_loops_nest_and_hoist():
    x = Tensor(np.ones((4, 8), np.float32))
    uops, _ = full_rewrite(kernel_of((x * 2).sum(axis=1)).ast, CStyleRenderer(), opts=[])
    ops = [u.op for u in uops]
    assert ops.count(Ops.RANGE) == 2
    first_range, second_range = [i for i, o in enumerate(ops) if o is Ops.RANGE]
    init = next(i for i, u in enumerate(uops) if u.op is Ops.STORE and u.src[1].op is Ops.CONST)
    assert first_range < init < second_range  # the accumulator is reset inside the outer loop, before the inner


def test_rendered_c_for_a_row_sum():
    x = Tensor(np.ones((4, 8), np.float32))
    item = kernel_of(x.sum(axis=1))
    uops, _ = full_rewrite(item.ast, CStyleRenderer(), opts=[])
    src = CStyleRenderer().render(kernel_name(item.ast), uops).src
    assert kernel_name(item.ast) == "r_4_8"
    assert "void r_4_8(float* restrict data0, float* restrict data1)" in src
    assert src.count("for (int ridx") == 2
    assert "float acc0;" in src
    assert "*(&acc0) = 0.0f;" in src


def test_elementwise_kernel_name():
    x = Tensor(np.ones((3, 5), np.float32))
    assert kernel_name(kernel_of(x + 1).ast) == "E_3_5"


def test_identical_kernels_share_one_compile():
    a, b = Tensor(np.ones(16, np.float32)), Tensor(np.ones(16, np.float32))
    ka, kb = kernel_of(a * 3 + 1), kernel_of(b * 3 + 1)
    assert ka.ast is kb.ast  # same graph over different buffers: one compiled program


def test_bf16_reaches_the_renderers_as_raw_bits():
    """bf16 math and its conversions are lowered in codegen (lower.py): every renderer gets bf16 values only loaded,
    stored, moved between lanes and bitcast, never cast, computed with or as a constant, so no renderer rounds"""
    from zeptograd import dtypes
    from zeptograd.renderer.gpu import OpenCLRenderer
    from zeptograd.renderer.llvmir import LLVMRenderer

    x = Tensor(np.linspace(-3, 3, 37, dtype=np.float32)).cast(dtypes.bfloat16).realize()
    moves = {Ops.LOAD, Ops.STORE, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP, Ops.INDEX, Ops.AFTER}
    items = [it for t in ((x * 1.5 + x).exp(), x.sum(), x.max()) for it in t.schedule()]
    for ren in (CStyleRenderer(), LLVMRenderer(), OpenCLRenderer()):
        for item in items:
            uops, _ = full_rewrite(item.ast, ren)
            values = [u for u in uops if u.dtype == dtypes.bfloat16 or u.dtype.scalar == dtypes.bfloat16]
            assert values, "the kernel should hold bf16 values"
            assert {u.op for u in values} <= moves, (type(ren).__name__, sorted({u.op.name for u in values}))
            assert "bf16" not in ren.render(kernel_name(item.ast), uops).src


def test_a_bf16_cast_that_reaches_a_renderer_is_refused():
    """A bf16 cast left for a renderer would be rendered as an integer conversion of the bits: it is an error instead"""
    import pytest

    from zeptograd import dtypes
    from zeptograd.renderer.gpu import OpenCLRenderer
    from zeptograd.renderer.llvmir import LLVMRenderer
    from zeptograd.uop.ops import UOp

    out, inp, zero = (
        UOp(Ops.DEFINE_GLOBAL, dtypes.bfloat16.ptr(1), (), 0),
        UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(1), (), 1),
        UOp.const(dtypes.int32, 0),
    )
    x = inp.index(zero).load()
    cast = UOp(Ops.CAST, dtypes.bfloat16, (x,))
    uops = [out, inp, zero, inp.index(zero), x, cast, out.index(zero), out.index(zero).store(cast)]
    for ren in (CStyleRenderer(), LLVMRenderer(), OpenCLRenderer()):
        with pytest.raises(NotImplementedError, match="lower.py"):
            ren.render("bf16_cast", uops)
