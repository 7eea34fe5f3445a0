"""A scatter's lane offsets (codegen/expander.py, affine_lanes): where an index is rest + s*r + c in the vector's range
r, each lane's offset is built directly — the node simplify would make, without substituting and simplifying the
whole index once per lane (a 3x3 convolution's tile written lane by lane: 16 lanes per stored vector)."""

from __future__ import annotations

import numpy as np

import zeptograd.codegen.expander as expander
from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.codegen.expander import affine_lanes
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.dtype import dtypes
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.uop.ops import AxisType, UOp
from zeptograd.uop.symbolic import simplify


def _range(n: int, axis: int, kind: AxisType = AxisType.LOOP) -> UOp:
    return UOp.range(n, axis, kind)


def _per_lane(idx: UOp, r: UOp, lanes: int) -> list[UOp]:
    return [simplify(idx.substitute({r: UOp.const(dtypes.index, k)})) for k in range(lanes)]


def test_lanes_are_the_nodes_simplify_makes():
    v, a, b = _range(16, 0, AxisType.UPCAST), _range(7, 1), _range(9, 2)
    for idx in (
        simplify(a * 12544 + v * 784 + b + 3),
        simplify(v * 9 + a),
        simplify((a // 3) * 100 + v * 12 + b % 4 - 12),  # the constant crosses 0 at a lane: no constant term there
        simplify(v * 5),
    ):
        assert affine_lanes(idx, v, 16) == _per_lane(idx, v, 16)


def test_not_affine_in_the_lanes():
    v, a = _range(16, 0, AxisType.UPCAST), _range(7, 1)
    assert affine_lanes(simplify((v // 4) * 100 + a), v, 16) is None
    assert affine_lanes(simplify(a * 3 + 1), v, 16) is None  # no lane term: not a scatter


def test_scatter_stores_simplify_two_lanes(monkeypatch):
    """out = x.T + 1 with 16 lanes along out's rows and 4 copies of them (given opts: the heuristic plays no part):
    the lanes read x contiguously and write out 64 elements apart, 16 scalar stores per vector (no copies along
    out's columns, which `store_transposed` would store as one vector per lane). Each vector's 16 lane offsets cost
    two simplifications (the first and the last lane, checked against the built ones), not 16."""
    calls = {"lane_indices": 0, "simplify": 0}
    lane_indices, simplify_fn = expander.Expander.lane_indices, expander.simplify

    def counting_lanes(self, *args):
        calls["lane_indices"] += 1
        return lane_indices(self, *args)

    def counting_simplify(u):
        calls["simplify"] += 1
        return simplify_fn(u)

    x = Tensor(np.arange(64 * 64, dtype=np.float32).reshape(64, 64))
    (item,) = schedule_tensors([x.T + 1])
    renderer = LLVMRenderer(simd_bytes=64)
    monkeypatch.setattr(expander.Expander, "lane_indices", counting_lanes)
    monkeypatch.setattr(expander, "simplify", counting_simplify)
    uops, _ = full_rewrite(item.ast, renderer, [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 4)])
    src = renderer.render(kernel_name(item.ast), uops).src
    assert calls["lane_indices"] == 4 and src.count("\n  store float ") == 64  # 4 vectors of 16 lanes, scattered
    assert calls["simplify"] <= 6 * calls["lane_indices"]  # one per lane: 19 per vector
    np.testing.assert_array_equal((x.T + 1).numpy(), np.arange(64 * 64, dtype=np.float32).reshape(64, 64).T + 1)
