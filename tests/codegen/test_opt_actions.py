"""Optimizer actions, the expander and vector accumulators: the code they make, and that values never change."""

import re

import numpy as np
import pytest

from zeptograd import Context, Tensor
from zeptograd.codegen import full_rewrite, kernel_name, ranges_simplified
from zeptograd.codegen.opt import Opt, OptError, OptOps, apply_opt, kernel_axes
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.uop.ops import AxisType, Ops

rng = np.random.default_rng(0)


def c_source(t: Tensor, opts=None) -> str:
    (item,) = t.schedule()
    uops, _ = full_rewrite(item.ast, CStyleRenderer(), opts)
    return CStyleRenderer().render(kernel_name(item.ast), uops).src


def test_upcast_splits_a_range():
    x = Tensor(np.ones(64, np.float32))
    (item,) = (x + 1).schedule()
    before = kernel_axes(item.ast)
    assert [r.src[0].arg for r in before] == [64]
    after = apply_opt(item.ast, Opt(OptOps.UPCAST, 0, 16))
    ranges = sorted((u for u in after.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg[0])
    assert [(r.src[0].arg, r.arg[1]) for r in ranges] == [(4, AxisType.LOOP), (16, AxisType.UPCAST)]
    store = next(u for u in after.toposort() if u.op is Ops.STORE)
    outer, inner = ranges
    assert store.src[0].src[1] is outer * 16 + inner  # RANGE(64) -> RANGE(4)*16 + RANGE(16, UPCAST)


def test_bad_actions_raise():
    x = Tensor(np.ones(12, np.float32))
    (item,) = (x + 1).schedule()
    with pytest.raises(OptError, match="does not fit"):
        apply_opt(item.ast, Opt(OptOps.UPCAST, 0, 13))
    with pytest.raises(OptError, match="does not divide"):  # UPCAST/UNROLL/THREAD make a tail (codegen/test_tails.py)
        apply_opt(item.ast, Opt(OptOps.LOCAL, 0, 5))
    with pytest.raises(OptError, match="UNROLL reduce axes"):
        apply_opt(item.ast, Opt(OptOps.UNROLL, 0, 4))
    with pytest.raises(OptError, match="axes"):
        apply_opt(item.ast, Opt(OptOps.UPCAST, 3, 2))


def test_seed000_vector_accumulator_in_the_c():
    x = Tensor.rand(1 << 16).realize()
    with Context(SPLIT_REDUCEOP=0):
        src = c_source(x.sum())
    loop = src[src.index("for (") : src.rindex("}\n  ")]
    after = src[src.rindex("}\n  ") :]
    assert re.search(r"zg_floatx16 alu\d+ = \(val\d+\+val\d+\);", loop)  # acc = acc + val, 16 lanes at once
    assert not re.search(r"\[\d+\]", loop)  # never a lane of a vector inside the loop
    # the lanes are summed once, after it, by halves: 16 -> 8 -> 4 -> 2 -> 1
    assert re.search(
        r"zg_floatx8 vec\d+ = __builtin_shufflevector\(alu\d+, alu\d+, 8, 9, 10, 11, 12, 13, 14, 15\)", after
    )
    assert re.search(r"float alu\d+ = \(alu\d+\[0\]\+alu\d+\[1\]\);", after)
    assert src.count("zg_floatx16 acc") == 4  # four accumulators hide the add latency


def test_matmul_register_tile():
    a, b = Tensor(rng.standard_normal((64, 32), dtype=np.float32)), Tensor(rng.standard_normal((32, 64), np.float32))
    (item,) = (a.reshape(64, 1, 32) * b.permute(1, 0).reshape(1, 64, 32)).sum(2).schedule()
    _, opts = hand_coded_optimizations(item.ast, 64, threads=1)
    upcasts = [o for o in opts if o.op is OptOps.UPCAST]
    assert len(upcasts) == 3  # 16-wide columns, two of them, and several rows
    src = c_source((a.reshape(64, 1, 32) * b.permute(1, 0).reshape(1, 64, 32)).sum(2))
    inner = src[src.rindex("for (") :]
    assert len(re.findall(r"zg_floatx16 alu\d+ = \(\(.*\*.*\)\+val\d+\);", inner)) >= 8  # FMAs into the tile


def test_debug3_prints_the_actions(capsys):
    x = Tensor(rng.standard_normal((64, 64), dtype=np.float32))
    with Context(DEBUG=3):
        (x * 3).sum(axis=1).realize()
    assert "Opt(UNROLL" in capsys.readouterr().out


CASES = {
    "add": lambda a, b: a + b,
    "fma_relu": lambda a, b: (a * b + a).relu(),
    "row_sum": lambda a, b: (a * b).sum(axis=-1),
    "col_max": lambda a, b: a.max(axis=0),
    "full_sum": lambda a, b: a.sum(),
    "softmax": lambda a, b: (
        (a - a.max(-1, keepdim=True)).exp() / (a - a.max(-1, keepdim=True)).exp().sum(-1, keepdim=True)
    ),
    "matmul": lambda a, b: (a.reshape(a.shape[0], 1, a.shape[1]) * b.permute(1, 0).reshape(1, *b.shape[::-1])).sum(2),
    "int_sum": lambda a, b: (a * 100).cast("int").sum(axis=0),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(32, 32), (17, 33), (48, 16), (1, 100)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_optimized_noopt_and_one_thread_agree(case, shape):
    an = rng.standard_normal(shape, dtype=np.float32)
    bn = rng.standard_normal(shape, dtype=np.float32)
    if case == "matmul":
        bn = rng.standard_normal(shape[::-1], dtype=np.float32)
    fn = CASES[case]
    outs = []
    for ctx in ({}, {"NOOPT": 1}, {"THREADS": 1}):
        with Context(**ctx):
            outs.append(fn(Tensor(an), Tensor(bn)).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[0], outs[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1 << 15, (1 << 15) + 16, 3 * 5 * 7 * 64])
def test_threaded_kernels_match_one_thread(n):
    x = rng.standard_normal(n, dtype=np.float32)
    with Context(THREADS=2):
        two = (Tensor(x) * 2 + 1).numpy()
    with Context(THREADS=1):
        one = (Tensor(x) * 2 + 1).numpy()
    np.testing.assert_array_equal(two, one)
    np.testing.assert_allclose(two, x * 2 + 1, rtol=1e-6)


def test_sibling_reduces_inside_an_unrolled_reduce():
    # cross entropy: a sum over rows of two reduces over the classes; unrolling the rows copies both reduce loops
    xn = rng.standard_normal((16, 10), dtype=np.float32)
    yn = rng.integers(0, 10, 16).astype(np.int32)
    loss = Tensor(xn).sparse_categorical_crossentropy(Tensor(yn))
    ref = -(xn - np.log(np.exp(xn).sum(1, keepdims=True)))[np.arange(16), yn].mean()
    for ctx in ({}, {"NOOPT": 1}):
        with Context(**ctx):
            np.testing.assert_allclose(loss.numpy(), ref, rtol=1e-5)


def test_vector_axis_is_the_one_per_element_accesses_walk():
    """batchnorm over (n, c, h, w): gamma, beta, mean and rsqrt(var) are four stride-1 loads along c, but each runs
    once per channel (hoisted out of h and w), while x, the residual and the store run per element along w: the
    vector axis is w (vectorizing c made the per-element accesses gathers across 16 channels)."""
    rng = np.random.default_rng(0)
    x, r = (Tensor(rng.random((2, 64, 4, 32), dtype=np.float32)).realize() for _ in range(2))
    g, b, mu, var = (Tensor(rng.random(64, dtype=np.float32)).realize() for _ in range(4))
    (item,) = (x.batchnorm(g, b, mu, (var + 1e-5).rsqrt()) + r).schedule()
    ast, opts = hand_coded_optimizations(item.ast, 64, threads=1)
    axes = kernel_axes(item.ast)
    upcast = [o for o in opts if o.op is OptOps.UPCAST]
    assert upcast and axes[upcast[0].axis].src[0].arg == 32, opts


def test_vector_axis_ignores_a_hoisted_reduce_loads():
    """The pooled gradient of a Linear head: where(relu_mask, 0, (g @ w)[b, c] / 1024) over (b, c, h, w). The reduce
    over the 10 classes does not vary along h and w, so it runs once per (b, c), before their loop (schedule/policy.py:
    hoisted_reduce_requests): its w[k, c] loads, stride 1 along c, run 32*64*10 times, the mask and the store 2M
    times along w. Weighed as if run at every output, the w loads took the vector axis (c) and every store was a
    scatter 1024 floats apart (resnet_block_train's backward: 12-17 ms, about 30x the contiguous kernel)."""
    g = Tensor(rng.standard_normal((32, 10), dtype=np.float32)).realize()
    w = Tensor(rng.standard_normal((10, 64), dtype=np.float32)).realize()
    mask = Tensor(rng.standard_normal((32, 64, 32, 32), dtype=np.float32) > 0).realize()
    out = mask.where(0.0, ((g @ w) / 1024).reshape(32, 64, 1, 1).expand(32, 64, 32, 32))
    (item,) = out.schedule()
    sink = ranges_simplified(item.ast)  # as codegen's optimize(): h and w merge into one loop of 1024
    _, opts = hand_coded_optimizations(sink, 32, threads=1)
    axes = kernel_axes(sink)
    assert [r.src[0].arg for r in axes] == [32, 64, 1024, 10]
    upcast = [o for o in opts if o.op is OptOps.UPCAST]
    assert upcast and axes[upcast[0].axis].src[0].arg == 1024, opts  # the vector goes along the stores
    # one vector: the column sums' block of 8 vectors per row (longer runs into more accumulators) is not for a reduce
    # hoisted out of the vector's loop, where a tail of the block would compute the reduce again
    assert len(upcast) == 1, opts
    src = c_source(out)
    assert "zg_floatx8" in src or "zg_floatx16" in src
    ref = np.where(mask.numpy(), 0, (g.numpy() @ w.numpy() / 1024)[:, :, None, None])
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-8)
