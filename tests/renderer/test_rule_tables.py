"""The C-family renderers are rule tables on one statement loop: a dialect overrides rules, never the loop."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer.cstyle import CFamilyRenderer, CStyleRenderer, RenderContext, cfamily_rules
from zeptograd.renderer.gpu import CUDARenderer, GPURenderer, OpenCLRenderer, gpu_rules
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat


def render(t: Tensor, renderer: CFamilyRenderer) -> str:
    (item,) = schedule_tensors([t])
    uops, _ = full_rewrite(item.ast, renderer)
    return renderer.render(kernel_name(item.ast), uops).src


def relu_like() -> Tensor:
    x = Tensor(np.linspace(-2, 2, 12, dtype=np.float32), device="CPU")
    return (x > 0).where(x, x * 0.5)


def test_dialects_have_no_loop_of_their_own():
    for cls in (CStyleRenderer, GPURenderer, OpenCLRenderer, CUDARenderer):
        assert "render" not in vars(cls), cls.__name__
        assert cls.render is CFamilyRenderer.render


def test_opencl_overrides_where_with_select():
    # the same WHERE node: OpenCL's rule (select, ahead of the GPU ALU rule) vs CUDA's inherited `c ? a : b`
    cl, cuda = render(relu_like(), OpenCLRenderer()), render(relu_like(), CUDARenderer())
    assert "float alu4 = select(alu3,val0,(int)(alu2));" in cl
    assert "float alu4 = (alu2?val0:alu3);" in cuda and "select(" not in cuda
    # the rule itself, on a bare WHERE: only the dialect table differs
    f32 = relu_like().dtype
    c, a, b = (UOp(Ops.DEFINE_VAR, f32, arg=(n, 0, 1)) for n in "cab")
    where = UOp(Ops.WHERE, f32, (c, a, b))
    strings = {}
    for ren in (OpenCLRenderer(), CUDARenderer()):
        ctx = RenderContext(ren, [])
        ctx.r.update({c: "c", a: "a", b: "b"})
        strings[ren.device] = ren.string_rewrite.rewrite(where, ctx)
    assert strings == {"CL": "select(b,a,(int)(c))", "CUDA": "(c?a:b)"}


def test_a_dialect_is_a_rule_list():
    """A new dialect: one rule before OpenCL's table (MAX through the fmax builtin), and the loop is reused."""

    class FmaxOpenCL(OpenCLRenderer):
        string_rewrite = (
            PatternMatcher([(UPat(Ops.MAX, name="x"), lambda ctx, x: f"fmax({ctx[x.src[0]]},{ctx[x.src[1]]})")])
            + OpenCLRenderer.string_rewrite
        )

    x = Tensor(np.arange(8, dtype=np.float32), device="CPU")
    src = render(x.maximum(3.0), FmaxOpenCL())
    assert "fmax(" in src and "fmax(" not in render(x.maximum(3.0), OpenCLRenderer())


def test_shared_and_gpu_tables_are_reused_not_copied():
    for ren, dialect_rules in ((OpenCLRenderer, 3), (CUDARenderer, 1)):
        rules = ren.string_rewrite.rules
        assert rules[-len(cfamily_rules) :] == cfamily_rules
        assert rules[dialect_rules : dialect_rules + len(gpu_rules)] == gpu_rules


def test_an_op_without_a_rule_names_it():
    ren = CStyleRenderer()
    smem = UOp(Ops.DEFINE_LOCAL, relu_like().dtype.ptr(4), arg="smem")  # C has no work-group memory
    with pytest.raises(NotImplementedError, match="no rule for Ops.DEFINE_LOCAL"):
        ren.render("k", [smem])
