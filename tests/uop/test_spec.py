"""SPEC=1: each stage's invariants (uop/spec.py). Valid programs pass every check on every pass (the whole suite
runs with SPEC=1: tests/conftest.py); a graph that breaks one raises SpecError naming the node and the stage."""

import numpy as np
import pytest

from zeptograd import Context, Tensor, dtypes
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.spec import SpecError, check, check_linear, spec_kernel, spec_tensor


def test_the_suite_runs_with_spec_on():
    from zeptograd.helpers import SPEC

    assert SPEC.value >= 1


@pytest.mark.slow
def test_valid_programs_pass_every_stage():
    with Context(SPEC=1):
        a, b = Tensor.rand(5, 17), Tensor.rand(17, 3)
        x = Tensor.rand(2, 3, 9, 9)
        outs = [(a @ b).relu().sum(0), a.softmax(1), x.conv2d(Tensor.rand(4, 3, 3, 3), padding=1).max_pool2d()]
        outs.append(Tensor.arange(10)[Tensor([1, 7])])
        for t in outs:
            assert np.isfinite(t.numpy()).all()


def const(v, dt=dtypes.float32):
    return UOp.const(dt, v)


def test_kernel_spec_refuses_a_tensor_op_left_in_a_kernel():
    bad = UOp(Ops.SINK, dtypes.void, (UOp(Ops.RESHAPE, dtypes.float32, (const(1.0),), (1,)),))
    with pytest.raises(SpecError, match="after rangeify: RESHAPE is a tensor-graph op, left in a kernel"):
        check(bad, spec_kernel, "rangeify")


def test_kernel_spec_refuses_mixed_dtypes_and_non_bool_conditions():
    add = UOp(Ops.ADD, dtypes.float32, (const(1.0), const(2, dtypes.int32)))
    with pytest.raises(SpecError, match=r"ADD of dtype dtypes.float has sources of dtype \[dtypes.int\]"):
        check(UOp(Ops.SINK, dtypes.void, (add,)), spec_kernel, "lower")
    where = UOp(Ops.WHERE, dtypes.float32, (const(1, dtypes.int32), const(1.0), const(2.0)))
    with pytest.raises(SpecError, match="WHERE chooses by dtypes.int"):
        check(UOp(Ops.SINK, dtypes.void, (where,)), spec_kernel, "expand")
    lt = UOp(Ops.CMPLT, dtypes.float32, (const(1.0), const(2.0)))
    with pytest.raises(SpecError, match="CMPLT must give bool"):
        check(UOp(Ops.SINK, dtypes.void, (lt,)), spec_kernel, "expand")


def test_kernel_spec_refuses_an_index_into_a_value():
    idx = UOp(Ops.INDEX, dtypes.float32, (const(1.0), const(0, dtypes.int32)))
    with pytest.raises(SpecError, match="INDEX into CONST of dtype dtypes.float, not a pointer"):
        check(UOp(Ops.SINK, dtypes.void, (idx,)), spec_kernel, "devectorize")


def test_tensor_spec_refuses_elementwise_ops_on_unequal_shapes():
    a, b = Tensor.rand(3, 1).uop, Tensor.rand(3, 4).uop
    with pytest.raises(SpecError, match=r"ADD of sources with shapes .*\(3, 1\).*\(3, 4\)"):
        check(UOp(Ops.SINK, dtypes.void, (UOp(Ops.ADD, dtypes.float32, (a, b)),)), spec_tensor, "tensor graph")


def test_linear_spec_refuses_a_use_before_its_definition():
    a, b = const(1.0), const(2.0)
    add = UOp(Ops.ADD, dtypes.float32, (a, b))
    check_linear([a, b, add])  # fine
    with Context(SPEC=1), pytest.raises(SpecError, match=r"UOp 1 \(ADD\) uses \['CONST'\] before"):
        check_linear([a, add, b])


def _bufferize(value: UOp, *ranges: UOp) -> UOp:
    from zeptograd.schedule.bufferize import Stored

    return UOp(Ops.BUFFERIZE, value.dtype, (value, *ranges), Stored(value, True))


def test_rangeified_graph_reads_a_bufferize_with_one_index_per_range():
    from zeptograd.uop.spec import spec_rangeified

    r0, r1 = UOp.range(4, 0), UOp.range(8, 1)
    b = _bufferize(const(1.0) + const(2.0), r0, r1)
    check(UOp(Ops.INDEX, dtypes.float32, (b, r0, r1)).sink(), spec_rangeified, "test")  # valid
    with pytest.raises(SpecError, match="INDEX of a BUFFERIZE of 2 ranges by 1 sources"):
        check(UOp(Ops.INDEX, dtypes.float32, (b, r0)).sink(), spec_rangeified, "test")
    with pytest.raises(SpecError, match="gated by dtypes.int, not bool"):
        check(UOp(Ops.INDEX, dtypes.float32, (b, r0, r1, r0)).sink(), spec_rangeified, "test")
    with pytest.raises(SpecError, match="BUFFERIZE stored at \\['ADD'\\]"):
        check(_bufferize(const(1.0), r0 + 1).sink(), spec_rangeified, "test")
