"""Padded window reads in one kernel: rangeify inlines the PAD of a conv's or a pool's input (its validity gates the
load), the expander makes a lane-dependent gate a masked vector load, and codegen/peel.py splits a pooling kernel's
output loops into border and interior parts where the interior's gates fold away. The schedules, the graphs and the
code before and after; values against torch on every CPU backend, NOOPT, other core counts and OpenCL."""

from __future__ import annotations

import os
import random
import tempfile

import numpy as np
import pytest

os.environ.setdefault("POCL_CACHE_DIR", os.path.join(tempfile.gettempdir(), "zeptograd-pocl-cache"))

import zeptograd.codegen as codegen  # noqa: E402
from zeptograd import Context, Device, Tensor  # noqa: E402
from zeptograd.codegen import full_rewrite, kernel_name  # noqa: E402
from zeptograd.codegen.expander import vector_ranges  # noqa: E402
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations  # noqa: E402
from zeptograd.codegen.peel import MAX_LANES, lanes, peel_borders, true_interval  # noqa: E402
from zeptograd.renderer.cstyle import CStyleRenderer  # noqa: E402
from zeptograd.uop.ops import AxisType, Ops, UOp  # noqa: E402
from zeptograd.uop.symbolic import symbolic  # noqa: E402
from zeptograd.uop.upat import graph_rewrite  # noqa: E402

torch = pytest.importorskip("torch")
F = torch.nn.functional
rng = np.random.default_rng(0)


def randn(*shape) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def gated_loads(u: UOp) -> list[UOp]:
    return [x for x in u.toposort() if x.op is Ops.LOAD and len(x.src[0].src) > 2]


def loop_sizes(nest: UOp) -> list[int]:
    return [r.src[0].arg for r in nest.src[1:] if r.op is Ops.RANGE]


def c_source(ast: UOp, peel: bool = True) -> str:
    old = codegen.peel_borders
    codegen.peel_borders = peel_borders if peel else (lambda s, *_: s)
    try:
        uops, _ = full_rewrite(ast, CStyleRenderer(), [])
    finally:
        codegen.peel_borders = old
    return CStyleRenderer().render(kernel_name(ast), uops).src


# ***** the schedule: the padded input is read in place *****


@pytest.mark.slow
def test_padded_conv_is_one_kernel_reading_the_input_through_a_gate():
    x, w = Tensor(randn(2, 3, 6, 6)), Tensor(randn(4, 3, 3, 3))
    # before: E_2_3_8_8 (a padded copy, (2,3,6,6) -> (2,3,8,8)) and r_2_4_6_6_3_3_3 reading it unconditionally
    (item,) = x.conv2d(w, padding=1).schedule()  # after: one kernel
    (ld,) = [u for u in gated_loads(item.ast)]
    assert ld.src[0].src[0].dtype.size == 2 * 3 * 6 * 6  # the input buffer itself, not a padded copy
    # the gate is the pad's validity in h and w: 0 <= h+kh-1 < 6 and 0 <= w+kw-1 < 6, and no WHERE repeats it
    kinds = {r.arg[1] for r in ld.src[0].src[2].ranges}
    assert kinds == {AxisType.LOOP, AxisType.REDUCE}
    assert not any(u.op is Ops.WHERE for u in item.ast.toposort())


def test_a_prologue_is_computed_once_into_the_padded_copy():
    """bn + relu before a conv: inlined, it would run for every window position and output channel (and its
    per-channel loads would draw the vector axis); the padded copy computes it once, as before."""
    x, w = Tensor(randn(2, 4, 8, 8)), Tensor(randn(4, 4, 3, 3))
    a, b = Tensor(randn(1, 4, 1, 1)), Tensor(randn(1, 4, 1, 1))
    first, conv = (x * a + b).relu().conv2d(w, padding=1).schedule()
    assert not any(u.op is Ops.REDUCE for u in first.ast.toposort())  # (2,4,8,8) -> relu(x*a+b) padded (2,4,10,10)
    assert gated_loads(conv.ast) == []


@pytest.mark.slow
def test_conv_transpose_keeps_its_padded_copy():
    """A zero-inserted input (stride 2) would be read through divmods in every iteration: a padded copy first."""
    x, w = Tensor(randn(1, 4, 9, 9)), Tensor(randn(4, 3, 3, 3))
    items = x.conv_transpose2d(w, stride=2, padding=1, output_padding=1).schedule()
    assert len(items) == 2
    first, conv = items
    assert not any(u.op is Ops.REDUCE for u in first.ast.toposort())  # the copy: elementwise
    assert any(u.op is Ops.REDUCE for u in conv.ast.toposort())


# ***** peeling: the graph and the code before and after *****


def pool_kernel(t: Tensor) -> UOp:
    (item,) = t.schedule()
    return item.ast


def test_pool_is_peeled_into_border_and_interior_parts():
    ast = graph_rewrite(
        pool_kernel(Tensor(randn(1, 2, 10, 12)).max_pool2d(kernel_size=3, stride=1, padding=1)), symbolic
    )
    assert len(ast.src) == 1 and len(gated_loads(ast)) == 1  # before: one nest, its load gated
    after = peel_borders(ast)
    # h: row 0, rows 1..8, row 9; the interior rows again in w: column 0, columns 1..10, column 11
    assert [loop_sizes(n) for n in after.src] == [[2, 12], [2, 8], [2, 8, 10], [2, 8], [2, 12]]
    interior = after.src[2]
    assert gated_loads(interior) == [] and not any(u.op is Ops.WHERE for u in interior.toposort())
    assert all(len(gated_loads(n)) == 1 for n in after.src if n is not interior)


def test_pool_code_before_and_after():
    ast = pool_kernel(Tensor(randn(1, 2, 10, 12)).avg_pool2d(kernel_size=3, stride=1, padding=1))
    before, after = c_source(ast, peel=False), c_source(ast)
    assert before.count("for (") < after.count("for (")  # more loop nests
    # before: every load of the input is gated (`valid?load:0`); after: the interior's are plain loads
    assert "?(*(data1+" in before and "= (*(data1+" not in before
    assert "= (*(data1+" in after


@pytest.mark.slow
def test_a_conv_is_not_peeled_where_masks_are_registers():
    """With AVX-512's mask registers each gated input load meets an ungated weight load: the multiply-adds hide the
    gate (measured), so the border copies would only cost compile time."""
    x, w = Tensor(randn(1, 4, 20, 20)), Tensor(randn(8, 4, 3, 3))
    (item,) = x.conv2d(w, padding=1).schedule()
    sink, _ = hand_coded_optimizations(graph_rewrite(item.ast, symbolic), 64)
    assert peel_borders(sink, 64) is sink


@pytest.mark.slow
def test_a_conv_is_peeled_where_masks_are_built():
    """With AVX2 (no mask registers) each masked input load costs a mask built in the inner loop: the conv's loop of
    output column vectors is split into border and interior parts at the register tile's width, and the interior's
    loads have no mask (its rows' gates, one compare per row, stay)."""
    x, w = Tensor(randn(1, 4, 20, 40)), Tensor(randn(8, 4, 3, 3))
    (item,) = x.conv2d(w, padding=1).schedule()
    sink, _ = hand_coded_optimizations(graph_rewrite(item.ast, symbolic), 32)
    assert lanes(sink) > MAX_LANES  # (the window tile: wider than a pool's nest may be)
    peeled = peel_borders(sink, 32)
    assert len(peeled.src) == 3  # the output columns: border, interior, border
    lanes_ = vector_ranges(peeled, 32)  # the ranges the expander makes vector lanes (the 8 output columns)
    lane_gated = [[u for u in gated_loads(nest) if lanes_ & set(u.src[0].src[2].toposort())] for nest in peeled.src]
    assert [bool(g) for g in lane_gated] == [True, False, True]  # the interior's loads: no mask across the lanes


def test_a_narrow_window_is_not_peeled():
    """Interior shorter than half the range: rows 1..1 of 3. The copies would not pay."""
    ast = graph_rewrite(pool_kernel(Tensor(randn(1, 1, 3, 3)).max_pool2d(kernel_size=3, stride=1, padding=1)), symbolic)
    assert peel_borders(ast) is ast


def test_a_register_tile_is_not_peeled():
    """Up to two vectors of lanes a nest is copied; a wider tile would triple a large body (compile time)."""
    from zeptograd.codegen.opt import Opt, OptOps, apply_opts

    ast = graph_rewrite(
        pool_kernel(Tensor(randn(1, 4, 10, 64)).max_pool2d(kernel_size=3, stride=1, padding=1)), symbolic
    )
    vec = [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 2, 2)]  # w: 2 vectors of 16 lanes
    two_vectors = graph_rewrite(apply_opts(ast, vec), symbolic)
    assert len(peel_borders(two_vectors).src) == 3  # rows 0, 1..8, 9 (w has no loop left)
    tile = graph_rewrite(apply_opts(ast, vec + [Opt(OptOps.UPCAST, 0, 2)]), symbolic)  # and 2 channels: 64 lanes
    assert peel_borders(tile) is tile


def test_gpu_kernels_are_not_peeled():
    from zeptograd.renderer.gpu import OpenCLRenderer

    ast = pool_kernel(Tensor(randn(1, 2, 10, 12)).max_pool2d(kernel_size=3, stride=1, padding=1))
    uops, _ = full_rewrite(ast, OpenCLRenderer())
    assert sum(u.op is Ops.RANGE for u in uops) <= 3  # one nest (threads, and the 3x3 window loops at most)


@pytest.mark.slow
def test_true_interval_is_sound_and_tight():
    """`coef*r + rest cmp c`, checked against every value of r and of the other ranges."""
    random.seed(0)
    for _ in range(300):
        n, k = random.randint(1, 9), random.randint(1, 4)
        r, kr = UOp.range(n, 0), UOp.range(k, 1, AxisType.REDUCE)
        coef, kc, c = random.choice([-3, -2, -1, 1, 2, 3]), random.choice([-2, -1, 0, 1, 2]), random.randint(-6, 12)
        lhs = graph_rewrite(r * coef + kr * kc + random.randint(-3, 3), symbolic)
        neg = random.random() < 0.5
        term = graph_rewrite((lhs < c).logical_not() if neg else lhs < c, symbolic)
        if r not in term.toposort():  # folded by the value ranges (a range of one value is a constant)
            continue
        iv = true_interval(term, r, n)
        assert iv is not None
        off = lhs.substitute({r: UOp.const(r.dtype, 0), kr: UOp.const(r.dtype, 0)})
        base = graph_rewrite(off, symbolic).arg

        def holds(rv, kv):
            v = coef * rv + kc * kv + base
            return (v >= c) if neg else (v < c)

        lo, hi = max(iv[0], 0), min(iv[1], n)
        for rv in range(n):
            always = all(holds(rv, kv) for kv in range(k))
            assert always == (lo <= rv < hi), (term, n, k, iv, rv)


# ***** values: every CPU backend, NOOPT, core counts, OpenCL *****

CASES = [
    ("conv", dict(stride=1, padding=1), (2, 3, 9, 11), (4, 3, 3, 3)),
    ("conv", dict(stride=1, padding=1), (1, 4, 17, 35), (5, 4, 3, 3)),
    ("conv", dict(stride=1, padding=2, groups=2), (2, 4, 12, 12), (4, 2, 5, 5)),
    ("conv", dict(stride=2, padding=1), (1, 2, 10, 19), (3, 2, 3, 3)),
    ("conv", dict(stride=1, padding=2, dilation=2), (1, 2, 13, 13), (2, 2, 3, 3)),
    ("conv", dict(stride=1, padding=(0, 1)), (1, 2, 7, 40), (3, 2, 3, 3)),
    ("conv_t", dict(stride=2, padding=1, output_padding=1), (1, 4, 9, 9), (4, 3, 3, 3)),
    ("max", dict(kernel_size=3, stride=1, padding=1), (2, 3, 21, 37), None),
    ("max", dict(kernel_size=3, stride=2, padding=1), (2, 3, 21, 37), None),
    ("max", dict(kernel_size=2, stride=2, padding=1), (2, 3, 21, 37), None),
    ("avg", dict(kernel_size=3, stride=1, padding=1), (2, 3, 21, 37), None),
    ("avg", dict(kernel_size=5, stride=1, padding=2), (2, 3, 21, 37), None),
    ("avg", dict(kernel_size=3, stride=2, padding=1, count_include_pad=False), (2, 3, 21, 37), None),
    # the window tile (codegen/opt/heuristic.py: 4 output rows x 2 channels, the window's rows unrolled), peeled
    ("conv", dict(stride=1, padding=1), (2, 6, 14, 24), (6, 6, 3, 3)),
    ("conv", dict(stride=1, padding=1), (1, 3, 12, 56), (5, 3, 3, 3)),
]


def run_case(kind, kw, xs, ws, device=None):
    x = randn(*xs)
    w = randn(*ws) if ws else None
    tx, tw = torch.from_numpy(x), torch.from_numpy(w) if ws else None
    zx = Tensor(x, device=device)
    zw = Tensor(w, device=device) if ws else None
    if kind == "conv":
        got, want = zx.conv2d(zw, **kw), F.conv2d(tx, tw, **kw)
    elif kind == "conv_t":
        got, want = zx.conv_transpose2d(zw, **kw), F.conv_transpose2d(tx, tw, **kw)
    elif kind == "max":
        got, want = zx.max_pool2d(**kw), F.max_pool2d(tx, **kw)
    else:
        got, want = zx.avg_pool2d(**kw), F.avg_pool2d(tx, **kw)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"{kind} {kw} {xs}")


def case_id(case) -> str:
    kind, kw, xs, _ = case
    return f"{kind}-{'x'.join(map(str, xs))}-" + "-".join(f"{k}={v}" for k, v in kw.items())


PYTHON_CASES = CASES[:2] + CASES[7:9] + CASES[10:11]  # the PYTHON interpreter is slow: a few of each kind
CL_CASES = CASES[:3] + CASES[6:8] + CASES[10:11]
BACKEND_CASES = [(d, c) for d in ("CPU", "CPU:C") for c in CASES] + [("PYTHON", c) for c in PYTHON_CASES]


@pytest.mark.slow
@pytest.mark.parametrize("device,case", BACKEND_CASES, ids=[f"{d}-{case_id(c)}" for d, c in BACKEND_CASES])
def test_values_on_every_cpu_backend(device, case):
    run_case(*case, device=device)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("ctx", [{"NOOPT": 1}, {"THREADS": 3}, {"THREADS": 1}], ids=str)
def test_noopt_and_core_counts_agree(ctx, case):
    with Context(**ctx):
        run_case(*case)


@pytest.mark.slow
def test_conv_bn_relu_and_its_gradient():
    x, w = randn(2, 3, 10, 10), randn(4, 3, 3, 3)
    g, b, m, v = randn(4), randn(4), randn(4), np.abs(randn(4)) + 0.5
    X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    out = X.conv2d(W, padding=1).batchnorm(Tensor(g), Tensor(b), Tensor(m), Tensor(v).rsqrt()).relu()
    ref = F.batch_norm(
        F.conv2d(tx, tw, padding=1),
        torch.from_numpy(m),
        torch.from_numpy(v),
        torch.from_numpy(g),
        torch.from_numpy(b),
        eps=0.0,
    ).relu()
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-3, atol=1e-3)


def _cl_unavailable() -> str | None:
    try:
        Device["CL"]
    except Exception as e:  # noqa: BLE001
        return f"no OpenCL here: {e}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("case", CL_CASES, ids=case_id)
def test_values_on_opencl(case):
    if (why := _cl_unavailable()) is not None:  # asked here, not at import: opening PoCL costs every process
        pytest.skip(why)
    run_case(*case, device="CL")
