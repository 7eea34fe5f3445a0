"""The layouts a convolution reads its operands in (a channels-last weight, in blocks of a register tile's output
channels; a strided 1x1 conv's subsampled input; a padded input, or a padded channels-last output gradient, for the
weight gradient), its weight gradient summed in parts of the batch, and conv_transpose2d as a conv2d:
tensor/nn_ops.py's conv2d and conv_transpose2d use these."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

from zeptograd.dtype import dtypes
from zeptograd.tensor.helpers import ceildiv, flat_to_grouped, make_tuple, resolve_pool_pads
from zeptograd.uop.ops import Ops

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


CHANNELS_LAST_MIN_MACS = 1 << 26  # a conv this large runs for milliseconds: the weight's copy and its kernel are noise
# With stride 1 and columns the vector lanes do not divide, the conv read in place has no vector at all (scalar code,
# ~2 GFLOPS) or a narrow one: the weight's copy (1/positions of the multiply-adds) pays from small convs on (DenseNet's
# (1,128,7,7)x(32,128,3,3) pad 1, on 1 AVX-512 core: the kernel 1632 -> 21 us; the call with the copy and its
# dispatch 1.88 -> 0.25 ms).
UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS = 1 << 20


def _output_channels_contiguous(strides: tuple, bs, oyx: tuple, wshape: tuple, rcout: int, lanes: int) -> bool:
    """Whether a conv's weight is stored with its output channels contiguous first: where the last window axis steps
    the input by more than 1 (stride 2), no operand is contiguous along the output's last axis, and codegen's vector
    goes along the output channels instead (codegen/opt/heuristic.py), where the weight, so stored, is read with
    stride 1 and the input is one broadcast value per lane row ((8,64,56,56)x(128,64,3,3) stride 2: 2.2x -> 1.2x
    torch's time, the kernel on 1 core of an AVX2 host). With stride 1 too where the CPU's vector lanes do not divide
    the output's last axis while they divide the output channels: a vector along the columns would be narrower than
    the register, or none (on 1 core of an AVX-512 host, pad 1: (8,64,56,56)x(64,64,3,3) 8-lane columns 19 ms, 16
    output channels per vector 9 ms, torch 14; (8,512,7,7)x(512,512,3,3) no vector at all 850 ms, 17 ms, torch 9;
    AVX2's 8 lanes, measured as 8-lane code on that host: 7x7 850 -> 48 ms, (8,256,14,14)x(256,256,3,3) 82 -> 43,
    56 columns keep theirs); not a 1x1 conv, a matmul whose vector goes along its output positions ((8,1024,14,14)
    x(256,1024,1,1): 5.6 ms as it is, 7.0 along the channels), though a window of one column and more rows is (a
    strided conv's input-gradient phase of taps (2, 1): `_transposed_conv_in_phases`). Only for convs large enough
    that the copy's kernel costs nothing beside them (strided: CHANNELS_LAST_MIN_MACS; stride 1, whose kernel read in
    place would take no vector or a narrow one: UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS), with 16+ output channels
    per group (two vectors)."""
    sizes = (bs, *oyx, *wshape)
    if not all(isinstance(v, int) for v in sizes):
        return False
    macs = bs * math.prod(oyx) * math.prod(wshape)
    if strides[-1] > 1:
        return macs >= CHANNELS_LAST_MIN_MACS
    if not (any(k > 1 for k in wshape[2:]) and lanes >= 8 and oyx[-1] % lanes and rcout % (2 * lanes) == 0):
        return False
    return macs >= UNALIGNED_COLUMNS_CHANNELS_LAST_MIN_MACS


SUBSAMPLED_MIN_MACS = 1 << 20  # the copy is 1/cout of the conv's work: only a kernel's launch to pay for


def _subsampled_pointwise_input(strides: tuple, bs, oyx: tuple, wshape: tuple, lanes: int) -> bool:
    """Whether a strided 1x1 conv (ResNet's downsample) reads a stored copy of its subsampled input: a matmul along
    its output positions then, as a stride-1 1x1 conv, where the input read in place steps by the stride along every
    output position and no operand is contiguous there: with a channels-last weight the vector went along the output
    channels, the whole weight streamed once per few output positions; without, the reduce was unrolled along the
    input channels. On 1 core of an AVX-512 host, batch 1, ms before -> after (torch): (1,1024,14,14)x(2048,1024,1,1)
    stride 2 15.9 -> 3.5 (1.7), (1,512,28,28)x(1024,512,1,1) 5.8 -> 1.6 (1.1), (1,256,56,56)x(512,256,1,1) 2.2 -> 1.1
    (1.4), (1,1024,14,14)x(256,1024,1,1) 6.7 -> 0.5 (0.75). The copy's elements are 1/cout of the multiply-adds. On
    the CPU backends, for convs of at least SUBSAMPLED_MIN_MACS multiply-adds."""
    if lanes == 0 or any(k != 1 for k in wshape[2:]) or all(s == 1 for s in strides):
        return False
    sizes = (bs, *oyx, *wshape)
    return all(isinstance(v, int) for v in sizes) and bs * math.prod(oyx) * math.prod(wshape) >= SUBSAMPLED_MIN_MACS


def _padded_input_for_weight_gradient(x: Tensor, pads: list, wshape: tuple, out_shape: tuple) -> bool:
    """Whether a conv's weight gradient reads its input from a padded copy rather than through the pad's gates: its
    reduce runs over the output positions, so each gate is a mask built in the inner loop (the expander's vector
    lanes walk the output columns, and no border of an output loop can be peeled off: codegen/peel.py), and its
    register tile's masks spill. The copy costs one pass over the input; on the CPU backends, for convs large enough
    that it is noise ((8,64,56,56)x(64,64,3,3) pad 1 on one core of an AVX2 host: the weight gradient's kernel
    75 -> 41 ms, the copy ~2 ms). At stride 1 with the output gradient copied channels-last, that copy takes the pad
    instead and the input needs none (`_weight_gradient_from_padded_output_gradient`)."""
    if not any(pads) or not isinstance(x.device, str) or x.device.split(":")[0] != "CPU":
        return False
    sizes = (*out_shape, *wshape[1:])
    return all(isinstance(v, int) for v in sizes) and math.prod(sizes) >= CHANNELS_LAST_MIN_MACS


WEIGHT_GRADIENT_PART_MIN_POSITIONS = 1024  # output positions per part: a 32x32 image
WEIGHT_GRADIENT_MAX_PARTS = 64
WEIGHT_GRADIENT_MAX_PART_ELEMENTS = 1 << 22  # the parts' sums, all together: 16 MiB of float32


def _weight_gradient_batch_parts(x: Tensor, g: Tensor, weight: Tensor, out_shape: tuple) -> int:
    """Into how many parts of the batch a conv's weight gradient is summed first, each part's sum stored and the
    parts then summed (1: one reduce over every output position). The weight gradient is a small output (cout x cin x
    window) over a long reduce (batch x output positions); as one reduce, each register tile of it streams the whole
    batch's output gradient and input from memory, which no cache holds (ResNet's (32,64,32,32) block: 5 MiB per tile,
    3072 tiles). Summed per part of the batch, a part's images stay in L2 while every weight tile passes them
    ((32,64,32,32) x (64,64,3,3), one image per part: 85 -> 55 ms; (8,64,56,56): 42 -> 29 ms, on 1 core of an AVX2
    host). A part holds the fewest images with WEIGHT_GRADIENT_PART_MIN_POSITIONS output positions (so each tile's
    accumulators are folded rarely), at most WEIGHT_GRADIENT_MAX_PARTS parts and WEIGHT_GRADIENT_MAX_PART_ELEMENTS
    elements of the parts' sums (a 512 x 512 x 3 x 3 weight: at most 1 part, no split). On the CPU backends, float32,
    for convs of at least CHANNELS_LAST_MIN_MACS multiply-adds."""
    if not isinstance(x.device, str) or x.device.split(":")[0] != "CPU":
        return 1
    if any(t.dtype != dtypes.float32 for t in (x, g, weight)):
        return 1
    bs, positions = out_shape[0], out_shape[2:]
    sizes = (*out_shape, *weight.shape[1:])
    if not all(isinstance(v, int) for v in sizes) or math.prod(sizes) < CHANNELS_LAST_MIN_MACS:
        return 1
    per_image, weight_elements = math.prod(positions), math.prod(weight.shape)
    for images in range(1, bs + 1):
        parts = bs // images
        if bs % images or images * per_image < WEIGHT_GRADIENT_PART_MIN_POSITIONS:
            continue
        if parts <= WEIGHT_GRADIENT_MAX_PARTS and parts * weight_elements <= WEIGHT_GRADIENT_MAX_PART_ELEMENTS:
            return parts
    return 1


def _output_gradient_channels_last(g: Tensor, weight: Tensor, groups: int, strides: tuple, lanes: int) -> bool:
    """Whether a conv's weight gradient reads the output's gradient from a copy stored with its channels last, so that
    codegen's vector goes along the output channels (a register tile of output-channel vectors x input channels, each
    input value one broadcast load), as the forward's does with its channels-last weight. Read as stored, both
    operands are contiguous along the output columns, and the kernel is a tile of dot products along them: a row
    that 16 lanes do not divide leaves a tail of every row to narrower accumulators, and a strided input is gathered.
    On 1 AVX-512 core, the weight gradient with the copy, ms before -> after (torch): (8,64,56,56)x(64,64,3,3) pad 1
    12.5 -> 9.8 (9.3); (8,128,28,28)x(128,128,3,3) 54 -> 9.3 (8.4); (8,256,14,14)x(256,256,3,3) 58 -> 10.3 (8.6);
    (8,512,7,7)x(512,512,3,3) 745 -> 9.8 (11.4); (8,64,56,56)x(128,64,3,3) stride 2 66 -> 6.8 (5.3); with 8-lane
    vectors (SIMD_BYTES=32) 28x28 18.3 -> 16.6, 14x14 58 -> 19. Where lanes divide the columns and the stride is 1,
    the dot tile has no tail ((32,64,32,32): 13.4 either way) and the copy is not made. On the CPU backends, float32,
    output channels per group a multiple of two vectors, convs of at least CHANNELS_LAST_MIN_MACS multiply-adds."""
    if lanes == 0 or any(t.dtype != dtypes.float32 for t in (g, weight)) or (weight.shape[0] // groups) % (2 * lanes):
        return False
    sizes = (*g.shape, *weight.shape[1:])
    if not all(isinstance(v, int) for v in sizes) or math.prod(sizes) < CHANNELS_LAST_MIN_MACS:
        return False
    return g.shape[-1] % lanes != 0 or strides[-1] > 1


def _stored_channels_last(g: Tensor) -> Tensor:
    """The same tensor, (bs, c, *positions), read from a copy laid out as (bs, *positions, c)."""
    nd = g.ndim
    return g.permute(0, *range(2, nd), 1).contiguous().permute(0, nd - 1, *range(1, nd - 1))


def _weight_gradient_in_batch_parts(
    x: Tensor, g: Tensor, weight: Tensor, pads: list, groups: int, stride, dilation, parts: int
) -> Tensor:
    """conv2d's weight gradient, sum over (batch, output positions) of the output's gradient times the input's
    windows, as `parts` sums over the batch's parts (each stored), then their sum (`_weight_gradient_batch_parts`; 1:
    one sum)."""
    bs, hw = x.shape[0], weight.shape[2:]
    cout, cin = weight.shape[:2]
    win = x.pad(pads)._pool(hw, stride, dilation)  # (bs, groups * cin, *out, *hw)
    out = win.shape[2 : 2 + len(hw)]
    win = win.reshape(parts, bs // parts, groups, 1, cin, *out, *hw)
    og = g.reshape(parts, bs // parts, groups, cout // groups, 1, *out, *[1] * len(hw))
    part_sums = (win * og).sum((1, *range(5, 5 + len(out))))  # (parts, groups, cout / groups, cin, *hw)
    return (part_sums.sum(0) if parts > 1 else part_sums).reshape(weight.shape)


def _output_gradient_pads(weight: Tensor, pads: list, dilation) -> list:
    """The pads of a stride-1 conv's output gradient as its transposed conv reads it: d * (K - 1) - pad before and
    after each dimension (flat, last dimension first, as `pads`)."""
    hw = weight.shape[2:]
    dil = make_tuple(dilation, len(hw))
    grouped = flat_to_grouped(pads)
    return [p for k, d, (pb, pa) in reversed(list(zip(hw, dil, grouped))) for p in (d * (k - 1) - pb, d * (k - 1) - pa)]


def _stored_padded_output_gradient(g: Tensor, weight: Tensor, pads: list, dilation) -> Tensor:
    """A stride-1 conv's output gradient padded by `_output_gradient_pads` and stored channels-last, where the weight
    gradient reads it so (`_output_gradient_channels_last`): that copy takes the pad the input would otherwise get
    for its weight gradient (`_weight_gradient_from_padded_output_gradient`), and the input gradient's transposed
    conv reads it too, with no pad of its own (as fast as the gradient read in place through the pad's gates:
    (8,64,56,56)x(64,64,3,3) on 1 AVX-512 core 7.4-7.6 ms either way). A computed gradient is stored first, unpadded:
    the copy computing it reads its operands transposed and through the gates, no vector (a batchnorm's gradient
    at (8,64,56,56): that kernel 1.5 ms, the store and the copy 0.4)."""
    stored = g if _a_stored_buffer(g) else g.contiguous()
    return _stored_channels_last(stored.pad(_output_gradient_pads(weight, pads, dilation)))


def _weight_gradient_from_padded_output_gradient(
    x: Tensor, g_pad: Tensor, weight: Tensor, groups: int, dilation, parts: int
) -> Tensor:
    """A stride-1 conv's weight gradient as a sum over the input's positions (not the output's): dw[o, c, k] =
    sum_{b, i} x[b, c, i] * g_pad[b, o, i + d * (K - 1 - k)], g_pad the output gradient padded as its transposed conv
    reads it, in its channels-last copy (`_stored_padded_output_gradient`), so the input is read in place, with no
    gate and no padded copy of its own (`_padded_input_for_weight_gradient`): one kernel and a pass over the input
    less ((8,64,56,56)x(64,64,3,3) pad 1 on 1 AVX-512 core: the weight gradient's kernel 7.4-7.9 ms either way; both
    gradients, CPU time of the whole call, 17.8 -> 16.9 ms). Summed in `parts` parts of the batch as
    `_weight_gradient_in_batch_parts`."""
    hw = weight.shape[2:]
    bs, (cout, cin), nd = x.shape[0], weight.shape[:2], len(hw)
    win = g_pad._pool(hw, 1, dilation).flip(*range(2 + nd, 2 + 2 * nd))
    positions = win.shape[2 : 2 + nd]  # (bs, cout, *in, *hw): tap k reads g at i + d * (K - 1 - k), the flip
    win = win.reshape(parts, bs // parts, groups, cout // groups, 1, *positions, *hw)
    xi = x.reshape(parts, bs // parts, groups, 1, cin, *positions, *[1] * nd)
    part_sums = (win * xi).sum((1, *range(5, 5 + nd)))  # (parts, groups, cout / groups, cin, *hw)
    return (part_sums.sum(0) if parts > 1 else part_sums).reshape(weight.shape)


OUTPUT_CHANNEL_BLOCK_VECTORS = 4  # a conv's register tile takes up to 4 vectors of output channels
WEIGHT_BLOCK_MAX_BYTES = 1 << 19  # a block's weight: half of a 1 MiB L2 per core


def _output_channel_block(rcout: int, lanes: int, per_channel_bytes: int = 0) -> int:
    """The output channels of a block of the channels-last weight (`_stored_output_channels_last`): 4 vectors, the
    most a conv's register tile takes (codegen/opt/tiles.py: sliding_window_tile, AVX-512's and AVX2's), where they
    divide the channels, so a tile's weight is one contiguous stream (0: no blocks). 2 vectors where a block of 4
    would hold more than WEIGHT_BLOCK_MAX_BYTES of weight (per_channel_bytes: an output channel's, cin x window):
    every output tile streams its block's weight, which then stays in L2 across the tiles (on 1 AVX-512 core, pad 1:
    (8,512,7,7)x(512,512,3,3) 1.18 MB blocks 13.6 ms, 590 KB 9.3 (torch 9.1); (8,256,14,14)x(256,256,3,3) 590 KB 8.4,
    295 KB 7.8; (8,128,28,28)x(128,128,3,3) keeps its 295 KB: 147 KB 9.3 ms, 295 KB 8.9)."""
    vectors = OUTPUT_CHANNEL_BLOCK_VECTORS
    if lanes >= 16 and per_channel_bytes * vectors * lanes > WEIGHT_BLOCK_MAX_BYTES:
        vectors //= 2
    block = vectors * lanes
    return block if lanes and rcout > block and rcout % block == 0 else 0


def _stored_output_channels_last(weight: Tensor, groups: int, block: int = 0) -> Tensor:
    """The same weight, (cout, cin, *hw), read from a copy laid out as (groups, cin, *hw, cout per group), or with
    block, as (groups, cout per group / block, cin, *hw, block): blocks of `block` output channels, each block's
    weight contiguous. A register tile of 4 vectors of output channels then reads its weight as one stream, not 256
    bytes of every cout * 4 (on 1 AVX-512 core, kernel only: (1,256,14,14)x(256,256,3,3) pad 1 2.1 -> 1.2 ms, torch
    1.1; (8,64,56,56)x(128,64,3,3) stride 2 4.7 -> 4.2; 512 channels at 7x7 1.9 -> 1.8)."""
    cout, nd = weight.shape[0], weight.ndim
    if block:
        w = weight.reshape(groups, cout // groups // block, block, *weight.shape[1:])  # (g, nb, block, cin, *hw)
        last = w.permute(0, 1, *range(3, nd + 2), 2).contiguous()  # (g, nb, cin, *hw, block)
        return last.permute(0, 1, nd + 1, *range(2, nd + 1)).reshape(weight.shape)
    w = weight.reshape(groups, cout // groups, *weight.shape[1:])  # (g, rcout, cin, *hw)
    last = w.permute(0, *range(2, nd + 1), 1).contiguous()  # (g, cin, *hw, rcout)
    return last.permute(0, nd, *range(1, nd)).reshape(weight.shape)


def _a_stored_buffer(x: Tensor) -> bool:
    """Whether x is a buffer seen through reshapes only (not a computed value)."""
    u = x.uop
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u.op is Ops.BUFFER


def _stored_on_cpu(x: Tensor) -> bool:
    """Whether x is a buffer on a CPU device seen through reshapes only (a conv's output gradient that a kernel
    stored: the next layer's input gradient, or a given one)."""
    return _a_stored_buffer(x) and isinstance(x.device, str) and x.device.split(":")[0] == "CPU"


def _output_gradient_read_in_place(x: Tensor, w: Tensor, groups: int, dilation: tuple, pads: list) -> bool:
    """Whether the transposed conv of a conv's input gradient, x.conv2d(w, groups, dilation, padding=pads) with x
    the output's gradient, reads a stored x (`_stored_on_cpu`) in place through its pad's gates rather than from a
    padded copy. Where its weight is stored channels-last (`_conv_stores_weight_channels_last`), codegen's vector
    goes along the output channels, each input value one broadcast load: codegen/peel.py peels the borders off the
    output loops and the inner loops have no gate (on 1 AVX-512 core, (8,64,56,56)x(64,64,3,3) pad 1 read in place
    7.8 ms, from the 58x58 copy 8.5 ms and the copy's own kernel). Where the vector goes along the columns, the
    register tile takes whole rows (or most of one), no border is peeled off them, and every load of a column
    vector is masked in the inner loop: the copy pays at 32 columns and is even (within noise) at 16 and 56 (on 1
    core, all the input gradient's kernels, read in place -> from the copy, ms, 16 lanes / 8 lanes:
    (32,64,32,32)x(64,64,3,3) 12.1 -> 10.7 / 21.5 -> 20.5; (8,128,32,32)x(128,128,3,3) 10.5 -> 9.9 / 21.0 -> 20.0;
    (16,64,16,16) 1.37 -> 1.41 / 2.80 -> 2.79; (8,64,56,56) 8 lanes 17.6 -> 17.6). Below
    CHANNELS_LAST_MIN_MACS multiply-adds the two take the same time and the copy would be one more kernel."""
    if not _stored_on_cpu(x):
        return False
    grouped = flat_to_grouped(pads)
    oyx = [i + pb + pa - d * (k - 1) for i, (pb, pa), d, k in zip(x.shape[2:], grouped, dilation, w.shape[2:])]
    sizes = (x.shape[0], *oyx, *w.shape)
    if not all(isinstance(v, int) for v in sizes) or math.prod(sizes) < CHANNELS_LAST_MIN_MACS:
        return True
    return _conv_stores_weight_channels_last(x, w, groups, dilation, pads)


def _transposed_conv(
    x: Tensor,
    weight: Tensor,
    bias,
    groups,
    stride,
    dilation,
    padding,
    output_padding,
    weight_copy: bool = False,
    padded_store: bool = False,
) -> Tensor:
    """conv_transpose2d as a conv2d; weight_copy: conv2d's gradient, the flipped weight stored first, since its
    index through the flip and the group transpose is divmods the simplifier keeps in the reduce's inner loop, and
    x (the output's gradient) stored, padded already where the stride is 1, unless a stored buffer on the CPU that
    pays to read in place (`_output_gradient_read_in_place`), or `padded_store` (the weight gradient's padded store
    of it, with the transposed conv's pads in it: `_stored_padded_output_gradient`)."""
    hw = weight.shape[2:]
    w = weight.unflatten(0, (groups, -1)).transpose(1, 2).flip(*range(3, weight.ndim + 1)).flatten(end_dim=1)
    dil, out_pad = make_tuple(dilation, len(hw)), make_tuple(output_padding, len(hw))
    grouped = flat_to_grouped(resolve_pool_pads(padding, len(hw)))
    pads = [
        p
        for k, d, (pb, pa), op in reversed(list(zip(hw, dil, grouped, out_pad)))
        for p in ((k - 1) * d - pb, (k - 1) * d - pa + op)
    ]
    strides = make_tuple(stride, len(hw))
    unit_strides = all(s == 1 for s in strides)
    padded_copy = weight_copy and unit_strides and not padded_store
    if padded_copy and not _output_gradient_read_in_place(x, w, groups, dil, pads):
        x, pads = x.pad(pads).contiguous(), [0] * len(pads)
    elif weight_copy and not unit_strides:
        x = x.contiguous()
    if any(s > 1 for s in strides):  # insert s-1 zeros after each input element
        x = x.reshape(*x.shape[:2], *[v for k in x.shape[2:] for v in (k, 1)])
        x = x.pad((None, None, *[p for s in strides for p in (None, (0, s - 1))]))
        x = x.reshape(*x.shape[:2], *[k * s for k, s in zip(x.shape[2::2], strides)])
        x = x.shrink((None, None, *[(0, k - (s - 1)) for k, s in zip(x.shape[2:], strides)]))
    if weight_copy and not _conv_stores_weight_channels_last(x, w, groups, dil, pads):
        w = w.contiguous()
    return x.conv2d(w, groups=groups, bias=bias, dilation=dilation, padding=pads)


def _conv_stores_weight_channels_last(x: Tensor, w: Tensor, groups: int, dilation: tuple, pads: list) -> bool:
    """Whether x.conv2d(w, groups, dilation, padding=pads) (stride 1) stores its weight channels-last
    (`_output_channels_contiguous`): a transposed conv's flipped weight then needs no copy of its own, the
    channels-last copy reads it through the flip (one pass over the weight, not two: (512,512,3,3) 9.4 MB)."""
    from zeptograd.tensor.matmul_layout import _vector_lanes

    hw, rcout = w.shape[2:], w.shape[0] // groups
    oyx = tuple(
        i + pb + pa - d * (k - 1) for i, (pb, pa), d, k in zip(x.shape[2:], flat_to_grouped(pads), dilation, hw)
    )
    lanes = _vector_lanes(x.device, x.dtype.itemsize)
    return rcout >= 16 and _output_channels_contiguous((1,) * len(hw), x.shape[0], oyx, w.shape, rcout, lanes)


def _transposed_conv_in_phases(g: Tensor, weight: Tensor, groups: int, strides: tuple, pads: list, in_shape) -> Tensor:
    """A strided conv's input gradient (its transposed conv) as one conv per phase of the input: the input positions
    y = s * i + r of phase r take only the taps k = k0 + s * m with k0 = (r + pad) % s, from g[i + (r + pad) // s - m],
    a conv of the stored output gradient with that phase's flipped sub-kernel; the phases' results are interleaved
    into the input's shape. The transposed conv as one conv reads g with s - 1 zeros inserted after each element
    (`_transposed_conv`): s^d times the multiply-adds, most of them by zero ((8,64,56,56)x(128,64,3,3) stride 2 on 1
    AVX-512 core: 21.5 -> 8.7 ms, torch 6.4; the phases' interleave ~1 ms of it). Dilation 1; pads as the
    forward's, grouped per dimension."""
    hw, bs = weight.shape[2:], g.shape[0]
    w_t = weight.unflatten(0, (groups, -1)).transpose(1, 2).flatten(end_dim=1)  # (groups * cin, cout / groups, *hw)
    g = g if _a_stored_buffer(g) else g.contiguous()  # stored once, read by every phase
    cin, out = w_t.shape[0], g.shape[2:]
    blocks = [ceildiv(i, s) for i, s in zip(in_shape, strides)]
    total = None
    for phase in itertools.product(*[range(s) for s in strides]):
        k0s = [(r + pb) % s for r, s, (pb, _) in zip(phase, strides, pads)]
        taps = [len(range(k0, k, s)) for k0, k, s in zip(k0s, hw, strides)]
        n = [ceildiv(i - r, s) for i, r, s in zip(in_shape, phase, strides)]
        if any(t == 0 for t in taps) or any(v <= 0 for v in n):
            continue  # no tap reaches these positions: their gradient is zero
        sub = w_t[(slice(None), slice(None), *[slice(k0, None, s) for k0, s in zip(k0s, strides)])]
        sub = sub.flip(*range(2, 2 + len(hw))).contiguous()
        # input positions i + q - (taps - 1) + m' for i < n: g padded (or cut) by `before` and `after` per dimension
        before = [t - 1 - (r + pb) // s for t, r, s, (pb, _) in zip(taps, phase, strides, pads)]
        after = [v + t - 1 - o - b for v, t, o, b in zip(n, taps, out, before)]
        gin = g.shrink((None, None, *[(max(-b, 0), o - max(-a, 0)) for b, a, o in zip(before, after, out)]))
        conv_pads = [p for b, a in reversed(list(zip(before, after))) for p in (max(b, 0), max(a, 0))]
        ph = gin.conv2d(sub, groups=groups, padding=conv_pads)  # (bs, cin, *n)
        ph = ph.pad((None, None, *[(0, m - v) for m, v in zip(blocks, n)]))  # (bs, cin, *blocks)
        ph = ph.reshape(bs, cin, *[v for m in blocks for v in (m, 1)])
        ph = ph.pad((None, None, *[p for r, s in zip(phase, strides) for p in (None, (r, s - 1 - r))]))
        total = ph if total is None else total + ph
    if total is None:
        from zeptograd.tensor import Tensor

        return Tensor.zeros(bs, cin, *in_shape, device=g.device, dtype=g.dtype)
    total = total.reshape(bs, cin, *[m * s for m, s in zip(blocks, strides)])
    return total.shrink((None, None, *[(0, i) for i in in_shape]))
