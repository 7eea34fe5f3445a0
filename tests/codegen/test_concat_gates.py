"""A concatenation's gates hold for a whole vector or for none of its lanes (symbolic: `8*r + lane < 4096` is
`r < 512`): each piece is a branch around a plain vector load, not a masked load.

The fused optimizers (nn/optim.py) concatenate every gradient into one flat vector. Its kernel reads each piece
through a pad's gate; as masked loads (llvm.masked.load, vmaskmov on AVX2) every piece was fetched in every iteration,
its skipped lanes pointing far outside its buffer, and a masked-off lane on a page that is not mapped costs a
microcode assist (~300 ns on this AMD host): examples/gpt_tiny.py's 29 gradients, 110400 floats, took 2-12 ms in a
12 ms training step; with branches ~0.25 ms.
"""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name, ranges_simplified
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.renderer.llvmir import LLVMRenderer
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)
SIZES = (4096, 2048, 64, 192, 12288, 64, 16384)  # a GPT block's parameters: multiples of a vector


def rendered(t: Tensor, renderer, simd_bytes: int, threads: int) -> str:
    (item,) = t.schedule()
    _, opts = hand_coded_optimizations(item.ast, simd_bytes, threads=threads)
    uops, _ = full_rewrite(item.ast, renderer, opts)
    return renderer.render(kernel_name(item.ast), uops).src


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("simd_bytes, lanes", [(32, 8), (64, 16)])
def test_concatenation_of_vector_multiples_has_no_masked_load(threads, simd_bytes, lanes):
    xs = [Tensor(rng.standard_normal(n, dtype=np.float32)) for n in SIZES]
    src = rendered(Tensor.cat(*xs), LLVMRenderer(simd_bytes=simd_bytes), simd_bytes, threads)
    assert "masked.load" not in src
    assert src.count(f"load <{lanes} x float>") == len(SIZES)  # one plain vector load per piece, each behind a branch
    assert "icmp slt <" not in src  # no compare per lane: each gate is one scalar compare


def test_concatenation_with_a_piece_off_the_vector_keeps_lane_masks():
    # 4100 floats: the second piece starts mid-vector, so a vector there holds lanes of both pieces
    xs = [Tensor(rng.standard_normal(n, dtype=np.float32)) for n in (4100, 2048)]
    assert "masked.load" in rendered(Tensor.cat(*xs), LLVMRenderer(simd_bytes=32), 32, 1)


@pytest.mark.parametrize("sizes", [SIZES, (4100, 2048, 3, 64)])
def test_concatenation_values(sizes):
    arrays = [rng.standard_normal(n, dtype=np.float32) for n in sizes]
    out = Tensor.cat(*[Tensor(a) for a in arrays]).numpy()
    np.testing.assert_array_equal(out, np.concatenate(arrays))


def test_concatenation_c_source_branches_per_piece():
    xs = [Tensor(rng.standard_normal(n, dtype=np.float32)) for n in SIZES]
    src = rendered(Tensor.cat(*xs), CStyleRenderer(), 32, 1)
    assert src.count("if (") == len(SIZES)  # a piece's vector read under one scalar condition, not lane by lane


def test_fused_momentum_update_over_conv_weights_is_vectorized():
    # SGD's fused momentum update reads each gradient through a flat view: a conv weight's (64, 64, 3, 3) read as
    # ((i//9)%64)*9 + ((i//3)%3)*3 + i%3 + ... folds to i (uop/symbolic.py: fold_divmod_sum), so the kernel keeps one
    # loop of 74634 and gets vectors; unfolded, `i % 3` split the loop into 24878 x 3 and the 3 got no lanes (scalar)
    shapes = ((64, 64, 3, 3), (64,), (64,), (64, 64, 3, 3), (64,), (64,), (10, 64), (10,))
    grads = [Tensor(rng.standard_normal(s, dtype=np.float32)).contiguous() for s in shapes]
    momentum = Tensor(np.zeros(sum(g.numel() for g in grads), np.float32)).realize()
    new = momentum * 0.9 + Tensor.cat(*[g.flatten() for g in grads])
    Tensor.realize(*grads)
    (item,) = new.schedule()
    _, opts = hand_coded_optimizations(ranges_simplified(item.ast), 32, threads=1)  # as codegen's optimize()
    assert [(o.op, o.axis, o.arg) for o in opts] == [(OptOps.UPCAST, 0, 8)]  # 8 lanes (the tail of 2: scalar)
    src = rendered(new, LLVMRenderer(simd_bytes=32), 32, 1)
    assert "load <8 x float>" in src and "store <8 x float>" in src
    np.testing.assert_allclose(new.numpy(), np.concatenate([g.numpy().ravel() for g in grads]), rtol=1e-6)


def masked_load_indices(t: Tensor, simd_bytes: int) -> list:
    (item,) = t.schedule()
    _, opts = hand_coded_optimizations(item.ast, simd_bytes, threads=1)
    uops, _ = full_rewrite(item.ast, LLVMRenderer(simd_bytes=simd_bytes), opts)
    return [u.src[0] for u in uops if u.op is Ops.LOAD and len(u.src[0].src) > 2 and u.src[0].src[2].dtype.count > 1]


@pytest.mark.parametrize("simd_bytes", [32, 64])
def test_pooled_channel_cat_masks_at_an_address_in_the_buffer(simd_bytes):
    # SqueezeNet's fire modules: a max pool over the channel cat of two convs' outputs, one kernel. Each part is read
    # at every channel of the cat under its gate (c < 64 for the first, c >= 64 for the second), and the pool's
    # stride-2 columns are masked loads. At the other part's channels every lane is masked off, but the address
    # still points up to 775 KB outside the part's buffer, and a masked-off lane on an unmapped page costs a
    # microcode assist: 1.47 ms for this kernel on one AVX-512 core, 0.08 ms with the address moved to the buffer's
    # start there (the stored cat and a pool over it: 0.10 ms)
    a, b = (Tensor(rng.standard_normal((1, 64, 55, 55), dtype=np.float32)).realize() for _ in range(2))
    pooled = a.cat(b, dim=1).max_pool2d(3, 2, ceil_mode=True)
    indices = masked_load_indices(pooled, simd_bytes)
    assert indices  # the columns' tail is masked
    for index in indices:  # the channel gate, the same in every lane, selects the address: in the buffer when off
        assert index.src[1].op is Ops.WHERE
    expected = Tensor(np.concatenate([a.numpy(), b.numpy()], 1)).max_pool2d(3, 2, ceil_mode=True).numpy()
    np.testing.assert_array_equal(pooled.numpy(), expected)
