"""conv2d's input gradient is a transposed conv (its own gradient rule), and pooling windows that don't overlap are a
reshape: before, both went through the gradient of `_pool`'s repeat, which sums every window position over a
repeated copy of the input (the im2col space, 16x to 25x the input on the digits convnet: its training step ran
kernels of 64x16x24x24x32 and 64x16x40x40 iterations for 8x8 images). Values against torch, and the work of the
kernels the gradients schedule."""

from __future__ import annotations

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import Tensor
from zeptograd.helpers import prod
from zeptograd.uop.ops import Ops

rng = np.random.default_rng(0)


def iterations(item) -> int:
    """A kernel's loop iterations: its output loops times, for each reduce, its loops and those of the reduces it is
    inside, those whose loops its value varies along (two reduces one after the other, a max and the count of its
    maxima, add up; nested ones multiply)."""

    def trips(ranges) -> int:
        return prod(r.src[0].arg for r in ranges if r.op is Ops.RANGE and r.src[0].op is Ops.CONST)

    nodes = item.ast.toposort()
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    inside = {
        r: [o for o in reduces if o is not r and r in o.src[0].toposort() and set(o.src[1:]) & set(r.ranges)]
        for r in reduces
    }
    outer = trips(r for u in nodes if u.op is Ops.END for r in u.src[1:])
    return outer * max(1, sum(trips(r.src[1:]) * prod(trips(o.src[1:]) for o in inside[r]) for r in reduces))


# the inner loop runs the first four (~1 s each: a backward's kernels), the full run all
CONVS = [
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(padding=1)),
    ((2, 4, 9, 11), (6, 2, 3, 3), dict(padding=1, groups=2, stride=2)),
    ((1, 2, 13, 13), (3, 2, 3, 3), dict(padding=2, dilation=2)),
    ((1, 2, 6, 6), (2, 2, 3, 3), dict(padding=3)),  # a pad past the kernel's reach: the primitives' gradient
    ((1, 2, 10, 12), (3, 2, 3, 2), dict(padding=(1, 0), stride=(2, 3))),
    ((2, 2, 7), (3, 2, 3), dict(padding=1)),
    ((1, 2, 6, 6), (2, 2, 5, 5), dict(padding=3)),
    ((1, 2, 9, 9), (2, 2, 3, 3), dict(stride=3)),
]


@pytest.mark.parametrize("xshape,wshape,kw", fast_first(CONVS, 4, unpack=True))
def test_conv_gradients_match_torch(xshape, wshape, kw):
    import torch

    xn, wn = rng.standard_normal(xshape, dtype=np.float32), rng.standard_normal(wshape, dtype=np.float32)
    x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
    out = x.conv2d(w, **kw)
    g = rng.standard_normal(out.shape, dtype=np.float32)
    (out * Tensor(g)).sum().backward()
    tx, tw = torch.tensor(xn, requires_grad=True), torch.tensor(wn, requires_grad=True)
    conv = torch.nn.functional.conv1d if len(xshape) == 3 else torch.nn.functional.conv2d
    (conv(tx, tw, **kw) * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_conv_input_gradient_works_on_the_input_not_on_windows():
    """The input gradient of a 3x3 conv over 4x4 (the digits convnet's second conv): before, the windows' gradient
    was scattered into a 64x16x24x24 copy (36x the input) and summed back; now a conv whose kernels write at most
    the padded output gradient (it is stored, padded for the windows, then the flipped weight, then the conv)."""
    x = Tensor(rng.standard_normal((64, 16, 4, 4), dtype=np.float32), requires_grad=True)
    w = Tensor(rng.standard_normal((32, 16, 3, 3), dtype=np.float32), requires_grad=True)
    g = Tensor(rng.standard_normal((64, 32, 4, 4), dtype=np.float32)).realize()
    (x.conv2d(w, padding=1) * g).sum().backward()
    items = x.grad.schedule()
    assert max(item.bufs[0].size for item in items) <= 64 * 32 * 6 * 6
    assert max(iterations(item) for item in items) <= 64 * 16 * 4 * 4 * 32 * 9


@pytest.mark.parametrize("pool", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize(
    "shape,kw", fast_first([((2, 3, 9, 7), {}), ((2, 3, 8, 8), {}), ((1, 2, 10, 11), dict(stride=3))], unpack=True)
)
def test_non_overlapping_pool_values_and_gradient(pool, shape, kw):
    import torch

    xn = rng.standard_normal(shape, dtype=np.float32)
    x = Tensor(xn, requires_grad=True)
    out = getattr(x, pool)(kernel_size=2, **kw)
    g = rng.standard_normal(out.shape, dtype=np.float32)
    (out * Tensor(g)).sum().backward()
    tx = torch.tensor(xn, requires_grad=True)
    tout = getattr(torch.nn.functional, pool)(tx, kernel_size=2, **kw)
    (tout * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_non_overlapping_pool_gradient_works_on_the_input():
    """max_pool2d(2) of (64,16,8,8): before, its gradient ran kernels over a 40x40 repeated copy per 8x8 image."""
    x = Tensor(rng.standard_normal((64, 16, 8, 8), dtype=np.float32), requires_grad=True)
    x.max_pool2d(2).sum().backward()
    items = x.grad.schedule()
    assert max(item.bufs[0].size for item in items) <= 64 * 16 * 8 * 8
    # (the windows' max and the count of their maxima are one kernel: schedule/row_group.py; two passes over x)
    assert max(iterations(item) for item in items) <= 2 * 64 * 16 * 8 * 8


def test_a_large_conv_weight_gradient_reads_a_padded_copy_of_the_input():
    """The weight gradient of a padded conv large enough (CHANNELS_LAST_MIN_MACS) reads its input from a padded
    copy: its reduce runs over the output positions, so each pad gate would be a vector mask built in the inner loop
    (tensor/conv_layout.py: _padded_input_for_weight_gradient). The copy is one kernel writing the padded input; the
    weight gradient's kernel reads nothing through a gate; values against torch."""
    import torch

    xn = rng.standard_normal((2, 64, 32, 32), dtype=np.float32)  # 2*64*32*32 outputs x 64*9: 75M multiply-adds
    wn = rng.standard_normal((64, 64, 3, 3), dtype=np.float32) * 0.1
    gn = rng.standard_normal((2, 64, 32, 32), dtype=np.float32)
    x, w = Tensor(xn), Tensor(wn, requires_grad=True)
    (gw,) = x.conv2d(w, padding=1).gradient(w, gradient=Tensor(gn))
    items = [it for it in gw.schedule() if it.ast.op is Ops.SINK]
    # the padded copy, dw summed per image (one 32x32 image per part: _weight_gradient_batch_parts), dw
    assert [it.bufs[0].size for it in items] == [2 * 64 * 34 * 34, 2 * 64 * 64 * 3 * 3, 64 * 64 * 3 * 3]
    gated = [u for u in items[1].ast.toposort() if u.op is Ops.INDEX and len(u.src) > 2]
    assert not gated
    tx, tw = torch.from_numpy(xn), torch.from_numpy(wn).requires_grad_()
    torch.nn.functional.conv2d(tx, tw, padding=1).backward(torch.from_numpy(gn))
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "xshape, wshape, kw, parts",
    [
        ((32, 64, 32, 32), (64, 64, 3, 3), dict(padding=1), 32),  # ResNet's block: a part per 32x32 image
        ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), 8),
        ((256, 32, 8, 8), (32, 32, 3, 3), dict(padding=1), 16),  # 16 8x8 images make a part's 1024 positions
        ((8, 64, 57, 57), (128, 64, 3, 3), dict(padding=1, stride=2), 4),  # odd input, stride 2: 29x29, 2 a part
        ((256, 64, 32, 32), (64, 64, 3, 3), dict(padding=1), 64),  # at most 64 parts: 4 images each
        ((16, 256, 16, 16), (256, 256, 3, 3), dict(padding=1), 4),  # at most 4M elements of parts' sums: 4 x 589824
    ],
)
def test_a_large_conv_weight_gradient_is_summed_in_parts_of_the_batch(xshape, wshape, kw, parts):
    """A large conv's weight gradient (a small output over a reduce of the whole batch's positions) is summed per
    part of the batch first, each part's sums stored, so a part's images stay in cache while every weight tile
    passes them (tensor/conv_layout.py: _weight_gradient_batch_parts): the kernel writing the parts' sums, then their
    sum. Only the schedule: the values are checked against torch below."""
    x, w = Tensor.empty(*xshape), Tensor.empty(*wshape, requires_grad=True)
    out = x.conv2d(w, **kw)
    (gw,) = out.gradient(w, gradient=Tensor.empty(*out.shape))
    sizes = [it.bufs[0].size for it in gw.schedule() if it.ast.op is Ops.SINK]
    assert sizes[-2:] == [parts * prod(wshape), prod(wshape)]


def test_a_conv_weight_gradient_too_large_to_split_is_one_reduce():
    """(32, 512, 8, 8) x (512, 512, 3, 3): 16 images make a part's 1024 positions, but 2 parts' sums (2 x 2.4M
    elements) are over the 4M cap: one reduce, the weight gradient written once (after the input's padded copy and,
    where the vector lanes do not divide its 8 columns, the output gradient's channels-last copy)."""
    x, w = Tensor.empty(32, 512, 8, 8), Tensor.empty(512, 512, 3, 3, requires_grad=True)
    (gw,) = x.conv2d(w, padding=1).gradient(w, gradient=Tensor.empty(32, 512, 8, 8))
    sizes = [it.bufs[0].size for it in gw.schedule() if it.ast.op is Ops.SINK]
    assert sizes[0] == 32 * 512 * 10 * 10 and sizes[-1] == 512 * 512 * 9
    assert set(sizes[1:-1]) <= {32 * 512 * 8 * 8}


@pytest.mark.parametrize("lanes, simd_bytes", [(8, 32), (16, 64)])
def test_a_conv_weight_gradient_reads_the_output_gradient_channels_last(monkeypatch, lanes, simd_bytes):
    """A large conv's weight gradient whose output columns the vector lanes do not divide (28 = 16 + 12, 3 x 8 + 4)
    reads the output's gradient from a copy stored channels-last (tensor/conv_layout.py:
    _output_gradient_channels_last): codegen's vector goes along the output channels, loaded whole from the copy,
    the input one broadcast value per input channel of the tile. Before, a tile of dot products along the 28
    columns, a tail of every row (on 1 AVX-512 core (8,128,28,28)x(128,128,3,3)'s weight gradient 54 -> 9.3 ms,
    torch 8.4). With stride 1 that copy takes the pad (_weight_gradient_from_padded_output_gradient): it writes the
    gradient padded, and the input is read in place with no gate, where before the input had a padded copy of its
    own (one kernel and a pass over the input less)."""
    from zeptograd.codegen.opt import OptOps
    from zeptograd.codegen.opt.access import stride
    from zeptograd.codegen.opt.heuristic import hand_coded_optimizations, kernel_axes
    from zeptograd.codegen.simplify import simplify_ranges
    from zeptograd.tensor import nn_ops

    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: lanes)
    x, w = Tensor.empty(8, 128, 28, 28), Tensor.empty(128, 128, 3, 3, requires_grad=True)
    g = Tensor.empty(8, 128, 28, 28)
    (gw,) = x.conv2d(w, padding=1).gradient(w, gradient=g)
    items = [it for it in gw.schedule() if it.ast.op is Ops.SINK]
    # the gradient's padded channels-last copy, dw summed per part (2 images), dw: no padded copy of the input
    assert [it.bufs[0].size for it in items] == [8 * 128 * 30 * 30, 4 * w.numel(), w.numel()]
    ast = simplify_ranges(items[1].ast)
    (g_read,) = [u for u in ast.toposort() if u.op is Ops.INDEX and u.src[0].dtype.size == 8 * 128 * 30 * 30]
    (x_read,) = [u for u in ast.toposort() if u.op is Ops.INDEX and u.src[0].dtype.size == x.numel()]
    assert len(g_read.src) == len(x_read.src) == 2  # neither read through a gate: the input in place
    _, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts[0].op is OptOps.UPCAST and opts[0].arg == lanes  # an output loop, not the reduce's columns
    assert stride(g_read.src[1], kernel_axes(ast)[opts[0].axis]) == 1  # the output channels, contiguous in the copy


def test_a_conv_weight_gradient_from_the_channels_last_output_gradient_matches_torch(monkeypatch):
    """The weight gradient read from the output gradient's channels-last copy (thresholds lowered so small convs
    take it), summed in parts of the batch or in one reduce: groups, stride 2, dilation, 1-d and 3-d; against torch."""
    import torch

    from zeptograd.tensor import conv_layout

    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_MIN_MACS", 1)
    monkeypatch.setattr(conv_layout, "WEIGHT_GRADIENT_PART_MIN_POSITIONS", 40)
    cases = [
        ((4, 6, 9, 9), (64, 3, 3, 3), dict(groups=2, stride=2, padding=1)),  # 5x5 outputs: 2 images a part
        ((2, 4, 7, 7), (32, 4, 3, 3), dict(padding=1)),  # 49 positions an image: 2 parts
        ((1, 4, 11, 11), (32, 4, 3, 3), dict(dilation=2, padding=2)),  # 1 image: one reduce
        ((4, 3, 40), (32, 3, 3), dict(padding=1, stride=2)),
        ((2, 2, 5, 6, 7), (32, 2, 3, 3, 3), dict(padding=1, stride=2)),
        # stride 1: the pad written by the gradient's channels-last copy, the input read in place
        ((2, 6, 9, 9), (64, 3, 3, 3), dict(groups=2, padding=1)),
        ((2, 4, 9, 8), (32, 4, 3, 2), dict(padding=(2, 1))),  # a pad of the kernel's reach: no pad before the taps
        ((2, 3, 13), (32, 3, 5), dict(padding=3, dilation=2)),
        ((2, 2, 5, 6, 7), (32, 2, 3, 3, 3), dict(padding=1)),
    ]
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}
    for xshape, wshape, kw in cases:
        xn, wn = rng.standard_normal(xshape, dtype=np.float32), rng.standard_normal(wshape, dtype=np.float32)
        x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
        out = x.conv2d(w, **kw)
        gn = rng.standard_normal(out.shape, dtype=np.float32)
        lanes = nn_ops_lanes(x)
        strides = (kw.get("stride", 1),) * (len(xshape) - 2)
        assert conv_layout._output_gradient_channels_last(Tensor(gn), w, kw.get("groups", 1), strides, lanes)
        gx, gw = out.gradient(x, w, gradient=Tensor(gn))
        tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
        conv[len(xshape)](tx, tw, **kw).backward(torch.from_numpy(gn))
        np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_computed_output_gradient_is_stored_once_for_both_gradients_with_its_padded_channels_last_copy(monkeypatch):
    """(8,64,56,56)x(64,64,3,3) pad 1 with a batchnorm's gradient as the output gradient: its 56 columns take the
    channels-last copy (_output_gradient_channels_last), padded, which both gradients read: the gradient stored once
    unpadded (computed into the padded channels-last copy, its operands read transposed and through the gates, that
    kernel takes 1.5 ms, the store and the copy 0.4), the copy, and neither the input's padded copy nor a padded
    store of the gradient for the input gradient (before: four stores of 56x56 or 58x58 planes, now two). Only the
    schedule: the values are checked against torch above. 16 vector lanes, as on an AVX-512 host (with 8, 56
    columns need no channels-last copy)."""
    from zeptograd.tensor import nn_ops

    monkeypatch.setattr(nn_ops, "_vector_lanes", lambda device, itemsize: 16)
    x, w = Tensor.empty(8, 64, 56, 56), Tensor.empty(64, 64, 3, 3)
    a, dy, m = Tensor.empty(8, 64, 56, 56), Tensor.empty(8, 64, 56, 56), Tensor.empty(1, 64, 1, 1)
    xhat = a - a.mean(axis=(0, 2, 3), keepdim=True)
    g = (dy - dy.mean(axis=(0, 2, 3), keepdim=True) - xhat * (dy * xhat).mean(axis=(0, 2, 3), keepdim=True)) * m
    gx, gw = x.conv2d(w, padding=1).gradient(x, w, gradient=g)
    items = [it for it in Tensor.schedule(gx, gw) if it.ast.op is Ops.SINK]
    planes = [it.bufs[0].size for it in items if it.bufs[0].size in (8 * 64 * 56 * 56, 8 * 64 * 58 * 58)]
    assert planes == [8 * 64 * 56 * 56, 8 * 64 * 58 * 58, 8 * 64 * 56 * 56]  # g, its padded copy, dx
    dx = next(it for it in items if it.bufs[0].size == x.numel() and any(b.size == w.numel() for b in it.bufs))
    reads = [u for u in dx.ast.toposort() if u.op is Ops.INDEX and u.src[0].dtype.size == 8 * 64 * 58 * 58]
    assert reads and all(len(u.src) == 2 for u in reads)  # dx reads the padded copy, with no gate


def nn_ops_lanes(x: Tensor) -> int:
    from zeptograd.tensor.matmul_layout import _vector_lanes

    return _vector_lanes(x.device, x.dtype.itemsize)


def test_a_conv_weight_gradient_summed_in_parts_matches_torch(monkeypatch):
    """The weight gradient summed per part of the batch (thresholds lowered so small convs take that path): groups,
    stride 2 with odd input sizes, dilation, 1-d and 3-d, and a part of several images; values against torch."""
    import torch

    from zeptograd.tensor import conv_layout

    monkeypatch.setattr(conv_layout, "CHANNELS_LAST_MIN_MACS", 1)
    monkeypatch.setattr(conv_layout, "WEIGHT_GRADIENT_PART_MIN_POSITIONS", 40)
    cases = [
        ((4, 6, 9, 9), (8, 3, 3, 3), dict(groups=2, stride=2, padding=1), 2),  # 5x5 outputs: 2 images a part
        ((6, 4, 7, 5), (4, 4, 3, 2), dict(stride=(2, 1), padding=(1, 0)), 2),  # 4x4 outputs: 3 images a part
        ((4, 4, 11, 11), (6, 4, 3, 3), dict(dilation=2, padding=2), 4),
        ((4, 3, 40), (5, 3, 3), dict(padding=1), 4),
        ((4, 2, 5, 6, 7), (3, 2, 3, 3, 3), dict(padding=1, stride=2), 2),
    ]
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}
    for xshape, wshape, kw, parts in cases:
        xn, wn = rng.standard_normal(xshape, dtype=np.float32), rng.standard_normal(wshape, dtype=np.float32)
        x, w = Tensor(xn, requires_grad=True), Tensor(wn, requires_grad=True)
        out = x.conv2d(w, **kw)
        gn = rng.standard_normal(out.shape, dtype=np.float32)
        assert conv_layout._weight_gradient_batch_parts(x, Tensor(gn), w, out.shape) == parts
        gx, gw = out.gradient(x, w, gradient=Tensor(gn))
        tx, tw = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(wn).requires_grad_()
        conv[len(xshape)](tx, tw, **kw).backward(torch.from_numpy(gn))
        np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_small_conv_weight_gradient_reads_the_input_through_its_gates():
    """Below CHANNELS_LAST_MIN_MACS the copy's kernel would cost more than the gates: one kernel."""
    x = Tensor(rng.standard_normal((2, 8, 16, 16), dtype=np.float32))
    w = Tensor(rng.standard_normal((8, 8, 3, 3), dtype=np.float32), requires_grad=True)
    (gw,) = x.conv2d(w, padding=1).gradient(w, gradient=Tensor(rng.standard_normal((2, 8, 16, 16), dtype=np.float32)))
    assert len([it for it in gw.schedule() if it.ast.op is Ops.SINK]) == 1


def test_the_input_gradient_stores_a_computed_output_gradient_padded_once():
    """A stride-1 conv's input gradient (a transposed conv) of a computed output gradient stores it once, already
    padded as the transposed conv reads it: one kernel, no unpadded copy padded again by the scheduler, and the conv
    reads it with no gate. Values against torch."""
    import torch

    xn, wn = rng.standard_normal((2, 4, 10, 10), dtype=np.float32), rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    gn = rng.standard_normal((2, 6, 10, 10), dtype=np.float32)
    x = Tensor(xn, requires_grad=True)
    (gx,) = x.conv2d(Tensor(wn), padding=1).gradient(x, gradient=Tensor(gn) * 2)
    items = [it for it in gx.schedule() if it.ast.op is Ops.SINK]
    sizes = sorted(it.bufs[0].size for it in items)
    assert sizes == [6 * 4 * 3 * 3, 2 * 4 * 10 * 10, 2 * 6 * 12 * 12]  # flipped weight, dx, the padded gradient
    conv = next(it for it in items if it.bufs[0].size == 2 * 4 * 10 * 10)
    assert not [u for u in conv.ast.toposort() if u.op is Ops.INDEX and len(u.src) > 2]
    tx = torch.from_numpy(xn).requires_grad_()
    torch.nn.functional.conv2d(tx, torch.from_numpy(wn), padding=1).backward(torch.from_numpy(gn) * 2)
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_the_input_gradient_reads_a_stored_output_gradient_in_place():
    """Given a stored output gradient (a buffer on the CPU), a small conv's input gradient reads it in place through
    its transposed conv's pad's gates, as the forward conv reads its input (tensor/conv_layout.py:
    _output_gradient_read_in_place): no padded copy, one kernel less.
    Values against torch."""
    import torch

    xn, wn = rng.standard_normal((2, 4, 10, 10), dtype=np.float32), rng.standard_normal((6, 4, 3, 3), dtype=np.float32)
    gn = rng.standard_normal((2, 6, 10, 10), dtype=np.float32)
    x, g = Tensor(xn, requires_grad=True), Tensor(gn).realize()
    (gx,) = x.conv2d(Tensor(wn), padding=1).gradient(x, gradient=g)
    items = [it for it in gx.schedule() if it.ast.op is Ops.SINK]
    assert sorted(it.bufs[0].size for it in items) == [6 * 4 * 3 * 3, 2 * 4 * 10 * 10]  # flipped weight, dx
    conv = next(it for it in items if it.bufs[0].size == 2 * 4 * 10 * 10)
    reads = [u for u in conv.ast.toposort() if u.op is Ops.INDEX and u.src[0].dtype.size == g.numel()]
    assert reads and all(len(u.src) > 2 for u in reads)  # g's own buffer, through the pad's gates
    tx = torch.from_numpy(xn).requires_grad_()
    torch.nn.functional.conv2d(tx, torch.from_numpy(wn), padding=1).backward(torch.from_numpy(gn))
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("simd_bytes", [32, 64])
@pytest.mark.parametrize(
    "bs, size, pad, padded_copy",
    [(32, 32, 1, True), (16, 16, 1, True), (16, 12, 0, False), (2, 16, 1, False)],
)
def test_the_input_gradient_reads_a_stored_output_gradient_in_place_where_it_pays(
    monkeypatch, simd_bytes, bs, size, pad, padded_copy
):
    """A large conv's input gradient whose transposed conv vectorizes its columns (the lanes divide them: its weight
    is not stored channels-last) reads a stored output gradient from a padded copy: its register tile takes whole
    rows, no border is peeled off them and each column vector's load is masked in the inner loop (on 1 AVX-512 core
    (32,64,32,32)x(64,64,3,3) pad 1, its kernels 12.1 -> 10.7 ms, the copy's included). Where the lanes do not
    divide the columns (12: the vector goes along the output channels), or below CHANNELS_LAST_MIN_MACS
    ((2,64,16,16)), it reads it in place (tensor/conv_layout.py: _output_gradient_read_in_place). The lanes of AVX2
    and AVX-512. Values against torch."""
    from zeptograd.tensor import matmul_layout, nn_ops

    lanes = simd_bytes // 4
    for module in (matmul_layout, nn_ops):
        monkeypatch.setattr(module, "_vector_lanes", lambda device, itemsize: lanes)
    import torch

    xn = rng.standard_normal((bs, 64, size, size), dtype=np.float32)
    wn = rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
    gn = rng.standard_normal((bs, 64, size + 2 * pad - 2, size + 2 * pad - 2), dtype=np.float32)
    x, w, g = Tensor(xn, requires_grad=True), Tensor(wn), Tensor(gn).realize()
    (gx,) = x.conv2d(w, padding=pad).gradient(x, gradient=g)
    sizes = [it.bufs[0].size for it in gx.schedule() if it.ast.op is Ops.SINK]
    # the flipped weight (or its channels-last copy), dx, and maybe g's copy padded as the transposed conv reads it
    assert sorted(sizes) == sorted([w.numel(), x.numel(), *([bs * 64 * (size + 2) ** 2] if padded_copy else [])])
    tx = torch.from_numpy(xn).requires_grad_()
    torch.nn.functional.conv2d(tx, torch.from_numpy(wn), padding=pad).backward(torch.from_numpy(gn))
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("stride, pad, size", [(2, 1, 56), (2, 1, 57), (3, 1, 20), ((2, 1), 1, 16)])
def test_a_strided_conv_input_gradient_runs_one_conv_per_phase(stride, pad, size):
    """A strided conv's input gradient runs one conv per phase of the input (tensor/conv_layout.py:
    _transposed_conv_in_phases), each over the output gradient with its taps of the weight, not one conv over the
    gradient with zeros inserted (stride 2: 4x the multiply-adds, 3 of 4 by zero; (8,64,56,56)x(128,64,3,3) on 1
    AVX-512 core 21.5 -> 8.7 ms). The kernels' loop iterations together are the forward's multiply-adds (each tap
    of each output once) plus the phases' interleave; values against torch."""
    import torch

    xn = rng.standard_normal((2, 8, size, size), dtype=np.float32)
    wn = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
    x = Tensor(xn, requires_grad=True)
    out = x.conv2d(Tensor(wn), stride=stride, padding=pad)
    gn = rng.standard_normal(out.shape, dtype=np.float32)
    (gx,) = out.gradient(x, gradient=Tensor(gn).realize())
    items = [it for it in gx.schedule() if it.ast.op is Ops.SINK]
    reduces = [it for it in items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]
    assert sum(iterations(it) for it in reduces) <= prod(out.shape) * 8 * 9  # each output's taps once, no zeros
    tx = torch.from_numpy(xn).requires_grad_()
    torch.nn.functional.conv2d(tx, torch.from_numpy(wn), stride=stride, padding=pad).backward(torch.from_numpy(gn))
    np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_the_input_gradient_copies_its_flipped_weight_once():
    """Where the input gradient's conv stores its weight channels-last ((8,512,7,7)x(512,512,3,3): 7 columns, which
    no vector width divides), that copy reads the weight through the flip and the groups' transpose: one pass over
    the 9.4 MB weight, not a flipped copy and then its channels-last copy (tensor/conv_layout.py:
    _conv_stores_weight_channels_last; on 1 AVX-512 core the input gradient 11.7 -> 11.2 ms)."""
    from zeptograd.tensor.matmul_layout import _vector_lanes

    x = Tensor.empty(8, 512, 7, 7, requires_grad=True)
    w = Tensor.empty(512, 512, 3, 3)
    (gx,) = x.conv2d(w, padding=1).gradient(x, gradient=Tensor.empty(8, 512, 7, 7))
    copies = [it for it in gx.schedule() if it.ast.op is Ops.SINK and it.bufs[0].size == w.numel()]
    assert len(copies) == (1 if _vector_lanes(x.device, 4) >= 8 else 2)
