"""A stride-2 conv (or pool) on a CPU: its input is read every other column, so no load is contiguous along the output
columns (ow). Three codegen changes make its register tile wide:

- expander: a gather whose lanes step by 2 is two contiguous vector loads and a shuffle (`Expander.stride2_load`);
- expander: each loop nest picks its own vector range, so a tail nest (ow=28 with 8 lanes: 24 + 4) is a vector;
- heuristic: where full vectors leave a tail that is a vector, the tile's rows (output channels) are taken before the
  columns, so the tail nest shares them; ow=28 runs as 3 x 8 + 4 lanes instead of 7 x 4 lanes.
"""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite
from zeptograd.codegen.opt import Opt, OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.simplify import simplify_ranges
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.uop.ops import Ops, UOp

rng = np.random.default_rng(0)


def data(*shape):
    x = rng.standard_normal(shape, dtype=np.float32)
    return Tensor(x), x


def conv_kernel(x: Tensor, w: Tensor, **kw) -> UOp:
    (item,) = x.conv2d(w, **kw).schedule()
    return item.ast


def loads_of(uops: list[UOp], size: int) -> list[int]:
    """The lane counts of the loads from the buffer of `size` elements."""
    return [
        u.dtype.count
        for u in uops
        if u.op is Ops.LOAD and u.src[0].src[0].op is Ops.DEFINE_GLOBAL and u.src[0].src[0].dtype.size == size
    ]


def store_lanes(uops: list[UOp]) -> list[int]:
    return sorted(u.src[1].dtype.count for u in uops if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL)


def test_stride2_gather_is_two_vector_loads():
    (x, _), (w, _) = data(1, 4, 17, 17), data(8, 4, 3, 3)
    ast = conv_kernel(x, w, stride=2)  # no padding: the input is read ungated
    opts = [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8)]  # 8 output channels x 8 columns (ow=8)
    uops, _ = full_rewrite(ast, CStyleRenderer(), opts)
    # before: each of the 8 x 9 copies gathered its 8 lanes with 8 scalar loads; now 2 vector loads each
    lanes = loads_of(uops, 4 * 17 * 17)
    assert lanes and set(lanes) == {8}
    shuffles = [u for u in uops if u.op is Ops.VECTORIZE and u.src[0].op is Ops.GEP and u.dtype.count == 8]
    assert shuffles and all(
        [s.arg[0] for s in v.src] == [0, 2, 4, 6, 1, 3, 5, 7] for v in shuffles
    )  # lanes 0,2,4,6 of b..b+7 and 1,3,5,7 of b+7..b+14


def test_gated_stride2_gather_masks_only_what_it_must():
    """With padding 1 the first column's lane reads x[-1] where kw=0: a masked pair of loads where a gate varies
    across the lanes (an element is read where the lanes enclosing it are valid), plain or gated by one scalar
    where it does not. C has no masked loads: the masked ones become one gated scalar load per lane there."""
    from zeptograd.renderer.llvmir import LLVMRenderer

    (x, _), (w, _) = data(1, 4, 16, 16), data(8, 4, 3, 3)
    ast = conv_kernel(x, w, stride=2, padding=1)
    opts = [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8)]
    uops, _ = full_rewrite(ast, LLVMRenderer(), opts)
    assert set(loads_of(uops, 4 * 16 * 16)) == {8}
    gated = [u.src[0].src[2] for u in uops if u.op is Ops.LOAD and len(u.src[0].src) > 2]
    assert {g.dtype.count for g in gated} == {1, 8}  # the kh gate (one per row) and the kw=0 copies' masks
    uops, _ = full_rewrite(ast, CStyleRenderer(), opts)
    assert set(loads_of(uops, 4 * 16 * 16)) == {1, 8}


def test_tail_nest_is_a_vector_of_its_own():
    """(x + 1) over 28 with 8 lanes: 24 in the main nest and a tail nest of 4, which was 4 scalar copies (the kernel
    had one vector range: the main nest's) and is now a 4-lane vector."""
    x, _ = data(28)
    (item,) = (x + 1).schedule()
    uops, _ = full_rewrite(item.ast, CStyleRenderer(), [Opt(OptOps.UPCAST, 0, 8)])
    assert store_lanes(uops) == [4, 8]  # before: [1, 1, 1, 1, 8]


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_stride2_conv_takes_rows_before_full_vectors(simd_bytes):
    """ow=28: 16 lanes leave 12 (no vector), 8 leave 4 (a vector). Before: 7 x 4 lanes (the widest divisor) x 8
    output channels; now the 8 channels first, then 8 lanes with a 4-lane tail nest that shares them (conv
    (8,64,56,56)x(128,64,3,3) stride 2 on one core: 65 -> 45 ms, see the bench case conv2d_stride2)."""
    (x, _), (w, _) = data(1, 8, 56, 56), data(16, 8, 3, 3)
    ast = simplify_ranges(conv_kernel(x, w, stride=2, padding=1))
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts == [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 2, 8), Opt(OptOps.SWAP, 0, 2)]


def test_stride1_conv_keeps_its_dividing_vector():
    """ow=56 with 16 lanes: the tail (8) is a vector, but 8 rows x 16 lanes spill on an AVX2 host where LLVM splits
    16 lanes in two (1.12x slower than 8 x 8): the dividing 8 lanes stay."""
    (x, _), (w, _) = data(1, 8, 56, 56), data(16, 8, 3, 3)
    _, opts = hand_coded_optimizations(simplify_ranges(conv_kernel(x, w, padding=1)), 64, threads=1)
    assert opts[0] == Opt(OptOps.UPCAST, 2, 8)


CASES = [
    ("conv", dict(stride=2, padding=1), (2, 3, 56, 56), (16, 3, 3, 3)),
    ("conv", dict(stride=2, padding=1), (1, 3, 19, 27), (8, 3, 3, 3)),
    ("conv", dict(stride=2, padding=0), (1, 2, 17, 33), (5, 2, 3, 3)),
    ("conv", dict(stride=2, padding=2), (1, 2, 12, 40), (8, 2, 5, 5)),
    ("conv", dict(stride=(1, 2), padding=1), (1, 2, 9, 30), (8, 2, 3, 3)),
    ("max", dict(kernel_size=2, stride=2), (2, 3, 16, 36), None),
    ("max", dict(kernel_size=3, stride=2, padding=1), (2, 3, 16, 33), None),
    ("avg", dict(kernel_size=2, stride=2), (1, 4, 8, 64), None),
]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON"])
@pytest.mark.parametrize("kind,kw,xshape,wshape", CASES)
def test_stride2_values(device, kind, kw, xshape, wshape):
    import torch

    F = torch.nn.functional
    x, xn = data(*xshape)
    x = x.to(device)
    if kind == "conv":
        w, wn = data(*wshape)
        got = x.conv2d(w.to(device), **kw).numpy()
        want = F.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), **kw).numpy()
    elif kind == "max":
        got, want = x.max_pool2d(**kw).numpy(), F.max_pool2d(torch.from_numpy(xn), **kw).numpy()
    else:
        got, want = x.avg_pool2d(**kw).numpy(), F.avg_pool2d(torch.from_numpy(xn), **kw).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
