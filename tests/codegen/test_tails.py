"""Tails (codegen/opt/tail.py): an axis the vector width or the core count does not divide gets a vectorized,
threaded main part plus a tail for the rest, instead of a scalar single-core loop. The graphs and the code before and
after; values against numpy for odd sizes on every CPU backend; NOOPT and other core counts agree."""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np
import pytest

os.environ.setdefault("POCL_CACHE_DIR", os.path.join(tempfile.gettempdir(), "zeptograd-pocl-cache"))

from tests.slow import fast_first
from zeptograd import Context, Device, Tensor, dtypes  # noqa: E402
from zeptograd.codegen import full_rewrite, kernel_name  # noqa: E402
from zeptograd.codegen.linearize import linearize  # noqa: E402
from zeptograd.codegen.opt import Opt, OptError, OptOps, apply_opt, kernel_axes  # noqa: E402
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations  # noqa: E402
from zeptograd.engine.realize import schedule_tensors  # noqa: E402
from zeptograd.renderer.cstyle import CStyleRenderer  # noqa: E402
from zeptograd.uop.ops import AxisType, Ops, UOp  # noqa: E402

rng = np.random.default_rng(0)


@pytest.fixture
def avx2_thread_threshold(monkeypatch):
    """The threading threshold these sizes were chosen at (1 << 15 loop iterations, set on an AVX2 host): the tests
    using it are about the split's code, not the threshold's value (renderer.MIN_THREAD_WORK)."""
    from zeptograd import device
    from zeptograd.codegen.opt import heuristic

    monkeypatch.setattr(heuristic, "MIN_THREAD_WORK", 1 << 15)
    monkeypatch.setattr(device, "MIN_THREAD_WORK", 1 << 15)


def kernel(t: Tensor) -> UOp:
    (item,) = t.schedule()
    return item.ast


def c_source(ast: UOp, opts: list[Opt] | None = None) -> str:
    uops, _ = full_rewrite(ast, CStyleRenderer(), opts)
    return CStyleRenderer().render(kernel_name(ast), uops).src


def ranges(u: UOp) -> list[tuple[int, AxisType]]:
    return [(r.src[0].arg, r.arg[1]) for r in sorted(u.ranges, key=lambda r: r.arg[0])]


def store_index(u: UOp) -> UOp:
    return next(x for x in u.toposort() if x.op is Ops.STORE).src[0]


# ***** the graph before and after each kind of tail *****


def test_upcast_tail_is_a_second_loop_nest():
    ast = kernel(Tensor(np.ones(37, np.float32)) + 1)
    assert len(ast.src) == 1 and ranges(ast) == [(37, AxisType.LOOP)]  # before: one loop of 37
    after = apply_opt(ast, Opt(OptOps.UPCAST, 0, 16))
    main, tail = after.src  # SINK(END(main), END(tail)): both store into the same buffer
    assert ranges(main) == [(2, AxisType.LOOP), (16, AxisType.UPCAST)]  # RANGE(37) -> RANGE(2)*16 + RANGE(16)
    assert ranges(tail) == [(5, AxisType.UPCAST)]  # the 5 left: 32 + RANGE(5), unrolled copies
    (t,) = tail.ranges
    assert store_index(tail).src[1] is UOp.const(t.dtype, 32) + t
    assert store_index(main).src[0] is store_index(tail).src[0]
    assert [r.src[0].arg for r in kernel_axes(after)] == [2]  # tails are never split again


def test_masked_upcast_tail_is_one_gated_vector():
    a = Tensor(np.ones(37, np.float32))
    ast = kernel(a * a + 1)
    after = apply_opt(ast, Opt(OptOps.MASKED_UPCAST, 0, 16))
    main, tail = after.src
    assert ranges(main) == [(2, AxisType.LOOP), (16, AxisType.UPCAST)]
    assert ranges(tail) == [(8, AxisType.UPCAST)]  # the 5 left: 32 + RANGE(8), not 5 copies
    (t,) = tail.ranges
    lane = UOp.const(t.dtype, 32) + t
    gate = lane < UOp.const(t.dtype, 37)
    accesses = [u for u in tail.toposort() if u.op is Ops.INDEX]
    assert len(accesses) == 2 and all(u.src[1] is lane and u.src[2] is gate for u in accesses)  # the load too
    # an amount that divides, or a tail that is a power of two (a narrower vector), or 2: UPCAST's own
    assert apply_opt(ast, Opt(OptOps.MASKED_UPCAST, 0, 4)) is apply_opt(ast, Opt(OptOps.UPCAST, 0, 4))
    ast36 = kernel(Tensor(np.ones(36, np.float32)) + 1)
    assert apply_opt(ast36, Opt(OptOps.MASKED_UPCAST, 0, 16)) is apply_opt(ast36, Opt(OptOps.UPCAST, 0, 16))


@pytest.mark.parametrize("device", ["CPU", "CPU:C", "PYTHON"])
def test_masked_upcast_tail_values(device):
    x = rng.standard_normal((5, 37)).astype(np.float32)
    t = Tensor(x, device=device)
    for out, want, opts in [
        (t * 2 + 1, x * 2 + 1, [Opt(OptOps.MASKED_UPCAST, 0, 16)]),  # 185 = 11 x 16 + 9
        (t.sum(0), x.sum(0), [Opt(OptOps.MASKED_UPCAST, 0, 16)]),  # 37 = 2 x 16 + 5
        ((t * 3).T.contiguous(), (x * 3).T, [Opt(OptOps.MASKED_UPCAST, 0, 16), Opt(OptOps.UPCAST, 1, 5)]),
    ]:
        (item,) = schedule_tensors([out])
        dev = Device[item.device]
        uops, _ = full_rewrite(item.ast, dev.renderer, opts)
        dev.build(dev.renderer.render(kernel_name(item.ast), uops))(*[b.ptr for b in item.bufs])
        np.testing.assert_allclose(item.bufs[0].numpy().reshape(want.shape), want, rtol=1e-6)


def test_unroll_tail_adds_a_second_reduce():
    ast = kernel(Tensor(np.ones(37, np.float32)).sum())
    after = apply_opt(ast, Opt(OptOps.UNROLL, 0, 16))
    value = next(u for u in after.toposort() if u.op is Ops.STORE).src[1]
    assert value.op is Ops.ADD and all(s.op is Ops.REDUCE for s in value.src)  # sum(main) + sum(tail)
    main, tail = value.src
    assert ranges(main) == [(2, AxisType.REDUCE), (16, AxisType.UNROLL)] and ranges(tail) == [(5, AxisType.UNROLL)]
    # a tail of one element is that element: max(main, x[32])
    after = apply_opt(kernel(Tensor(np.ones(33, np.float32)).max()), Opt(OptOps.UNROLL, 0, 16))
    value = next(u for u in after.toposort() if u.op is Ops.STORE).src[1]
    assert value.op is Ops.MAX and value.src[1].op is Ops.LOAD and value.src[1].src[0].src[1].arg == 32


def test_thread_tail_one_iteration_per_core():
    ast = kernel(Tensor(np.ones(39, np.float32)) + 1)
    after = apply_opt(ast, Opt(OptOps.THREAD, 0, 4))  # 39 = 4*9 + 3: cores 0..2 take one more each
    main, tail = after.src
    core = next(u for u in after.toposort() if u.op is Ops.SPECIAL)
    assert store_index(main).src[1] is core * 9 + UOp.range(9, 0)
    idx = store_index(tail)
    two = UOp.const(core.dtype, 2)
    assert idx.src[1] is UOp.const(core.dtype, 36) + (core < two).where(core, two)  # 36 + min(core, 2): in bounds
    assert idx.src[2] is (core < UOp.const(core.dtype, 3))  # and stored by cores 0, 1, 2 only
    assert not tail.ranges


def test_actions_that_still_refuse():
    ast = kernel(Tensor(np.ones(37, np.float32)) + 1)
    with pytest.raises(OptError, match="does not fit"):
        apply_opt(ast, Opt(OptOps.UPCAST, 0, 38))
    with pytest.raises(OptError, match="does not divide"):
        apply_opt(ast, Opt(OptOps.LOCAL, 0, 16))  # GPU work-groups still need a divisor
    threaded = apply_opt(ast, Opt(OptOps.THREAD, 0, 2))
    with pytest.raises(OptError, match="already runs"):
        apply_opt(threaded, Opt(OptOps.THREAD, 0, 2))


def test_loop_nests_run_one_after_another():
    # a tail's nest whose loops have smaller axis ids (a TILE block loop, say) must not open around the main nest
    buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float.ptr(64), (), 0)
    r0, blocks, inner = UOp.range(8, 0), UOp.range(4, -1), UOp.range(4, 5)
    main = buf.index(r0).store(UOp.const(dtypes.float, 1.0)).end(r0)
    tail = buf.index(blocks * 4 + inner + 8).store(UOp.const(dtypes.float, 2.0)).end(blocks, inner)
    order = linearize(UOp(Ops.SINK, dtypes.void, (main, tail)))
    assert order.index(main) < order.index(blocks)  # main's END before the tail's first loop opens


# ***** the code before (a scalar loop on one core) and after *****


def test_elementwise_code_before_and_after(avx2_thread_threshold):
    a, b = Tensor(np.ones(1_000_003, np.float32)), Tensor(np.ones(1_000_003, np.float32))
    ast = kernel(a + b)
    before = c_source(ast, [])  # what the heuristic did before tails: no divisor of 1_000_003, so nothing
    assert "for (int ridx0 = 0; ridx0 < 1000003; ridx0++)" in before and "zg_floatx16" not in before
    _, opts = hand_coded_optimizations(ast, 64, threads=2)
    assert opts == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.THREAD, 0, 2)]
    after = c_source(ast, opts)
    loop = after[after.index("for (") :]
    assert "ridx0 < 31250" in loop and re.search(r"zg_floatx16 alu\d+ = \(val\d+\+val\d+\);", loop)  # 16 lanes
    assert "int alu0 = (core_id*500000);" in after  # each core a half of the main part
    tail = after[: after.index("for (")]
    assert all(f"*(data0+{i}) = " in tail for i in (1_000_000, 1_000_001, 1_000_002))  # the tail: 3 scalars
    assert "(core_id==0)" in tail and "if (alu" in tail  # stored by core 0 only


def test_row_reduce_code_before_and_after():
    ast = kernel(Tensor(np.ones((64, 1000), np.float32)).sum(axis=1))
    _, opts = hand_coded_optimizations(ast, 64, threads=1)
    assert opts[0] == Opt(OptOps.UNROLL, 1, 16)  # before: UNROLL 8, the largest divisor of 1000
    after = c_source(ast, opts)
    loop = after[after.index("for (int ridx1") :]
    assert "ridx1 < 31" in loop and re.search(r"zg_floatx16 alu\d+ = \(val\d+\+val\d+\);", loop)
    tail = after[: after.index("for (int ridx1")]  # the tail, outside the loop: its own 8-lane vector load
    assert "+992);" in tail and "__builtin_memcpy(&val0, (data1+alu1), 32);" in tail


@pytest.mark.parametrize("simd_bytes, n_cols", [(64, 128), (32, 64)])
def test_column_mean_of_a_slice_reads_the_rows_in_two_nests(simd_bytes, n_cols):
    """x.mean(0)[:, 1:-1]: the slice's columns are 7 vectors and a tail of no power of two (126 = 7 x 16 + 14 with
    AVX-512, 62 = 7 x 8 + 6 with AVX2). All 7 vectors accumulate in one pass over the rows (before: 4, and a tail nest
    of 3 reading every row again), the columns left one masked vector (before: that many scalar copies, each a chain
    of scalar loads over the rows): two loop nests, not three."""
    xn = rng.standard_normal((256, n_cols)).astype(np.float32)
    ast = kernel(Tensor(xn).mean(0, keepdim=True)[:, 1:-1])
    sink, opts = hand_coded_optimizations(ast, simd_bytes, threads=1)
    assert opts == [Opt(OptOps.MASKED_UPCAST, 0, simd_bytes // 4), Opt(OptOps.UPCAST, 0, 7)]
    assert len(sink.src) == 2
    got = Tensor(xn).mean(0, keepdim=True)[:, 1:-1].numpy()
    np.testing.assert_allclose(got, xn.mean(0, keepdims=True)[:, 1:-1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", fast_first([(4096, 1000), (512, 1000), (4096, 4096)]))
def test_softmax_reduces_vectorize_the_row(shape):
    # each kernel: its reduces (max, then sum of exp(x - max[row])) get 16-lane accumulators along the row and a tail,
    # the output row a vector that divides it (a tail nest would compute the row's reduces again). One kernel: exp
    # is computed in the sum's loop into a row buffer that the output row reads (schedule/bufferize.py: row_buffer)
    items = schedule_tensors([Tensor(np.ones(shape, np.float32)).softmax(-1)])
    assert len(items) == 1
    for item in items:
        ast, opts = hand_coded_optimizations(item.ast, 64, threads=2)
        unrolled = [o for o in opts if o.op is OptOps.UNROLL and o.arg == 16]
        upcast = [o for o in opts if o.op is OptOps.UPCAST]
        assert len(unrolled) == sum(u.op is Ops.REDUCE for u in item.ast.toposort())
        assert upcast == [Opt(OptOps.UPCAST, 1, 16 if shape[1] % 16 == 0 else 8)]
        assert len(ast.src) == 1  # one loop nest: no tail repeats the rows


def test_matmul_code_has_a_register_tile_and_tails():
    a, b = Tensor(np.ones((513, 257), np.float32)), Tensor(np.ones((257, 513), np.float32))
    ast = kernel(a @ b)
    _, opts = hand_coded_optimizations(ast, 64, threads=2)
    assert [o.op for o in opts[:3]] == [OptOps.UPCAST] * 3  # before: none (513 and 257 have no divisor)
    src = c_source(ast, opts)
    assert len(re.findall(r"zg_floatx16 alu\d+ = \(\(.*\*.*\)\+val\d+\);", src)) >= 16  # an 8x2 vector tile


# ***** values: odd sizes on every CPU backend *****

CPU_DEVICES = ["CPU", "CPU:C", "PYTHON"]
BIG = {"CPU", "CPU:C"}  # PYTHON interprets every op: small sizes only


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("device", CPU_DEVICES)
def test_elementwise_and_full_reduces(device):
    for n in (1, 2, 7, 15, 17, 31, 33, 100, 1003) + ((65537, 1_000_003) if device in BIG else ()):
        x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        tx, ty = Tensor(x, device=device), Tensor(y, device=device)
        np.testing.assert_array_equal((tx + ty).numpy(), x + y)
        _close((tx * ty + tx).relu().numpy(), np.maximum(x * y + x, 0), 1e-6)  # CPU:C contracts into an FMA
        _close(tx.sum().numpy(), x.sum(dtype=np.float64), 1e-4 * max(1, np.sqrt(n) / 100))
        np.testing.assert_array_equal(tx.max().numpy(), x.max())


@pytest.mark.slow
@pytest.mark.parametrize("device", CPU_DEVICES)
def test_reduces_over_last_and_other_axes(device):
    shapes = [(3, 7), (17, 17), (7, 33), (33, 40), (5, 100)] + ([(513, 257), (256, 1000)] if device in BIG else [])
    for shape in shapes:
        x = rng.standard_normal(shape, dtype=np.float32)
        t = Tensor(x, device=device)
        _close(t.sum(axis=1).numpy(), x.sum(1))
        _close(t.sum(axis=0).numpy(), x.sum(0))
        np.testing.assert_array_equal(t.max(axis=1).numpy(), x.max(1))
        _close(t.softmax(-1).numpy(), _softmax(x), 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("device", CPU_DEVICES)
def test_matmul(device):
    sizes = [(7, 7, 7), (17, 33, 19), (9, 5, 35)] + ([(513, 257, 513), (1000, 1000, 1000)] if device in BIG else [])
    for m, k, n in sizes:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        _close((Tensor(a, device=device) @ Tensor(b, device=device)).numpy(), a @ b, 1e-3)


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_in_place_update_runs_each_tail_once(device):
    # a tail run by every core (or twice) would add twice
    n = 65537 if device in BIG else 1003
    x = rng.standard_normal(n, dtype=np.float32)
    for threads in (2, 3):
        with Context(THREADS=threads):
            t = Tensor(x.copy(), device=device).realize()
            for _ in range(3):
                t.assign(t + 1).realize()
            _close(t.numpy(), x + 3, 1e-6)


@pytest.mark.parametrize("device", CPU_DEVICES)
def test_two_outputs_of_one_kernel(device):
    # one END over a GROUP of two stores: the tail's unrolled copies of both
    x = rng.standard_normal((37, 1001), dtype=np.float32)
    t = Tensor(x, device=device)
    a, b = t + 1, t * 2
    assert len(schedule_tensors([a, b])) == 1
    Tensor.realize(a, b)
    np.testing.assert_array_equal(a.numpy(), x + 1)
    np.testing.assert_array_equal(b.numpy(), x * 2)


# ***** NOOPT and other core counts agree with the optimized kernels *****

CASES = {
    "fma_relu": lambda a, b: (a * b + a).relu(),
    "row_sum": lambda a, b: (a * b).sum(axis=-1),
    "col_sum": lambda a, b: a.sum(axis=0),
    "col_max": lambda a, b: a.max(axis=0),
    "full_sum": lambda a, b: a.sum(),
    "softmax": lambda a, b: a.softmax(-1),
    "matmul": lambda a, b: a @ b.T,
}


SHAPES = [(7, 17), (17, 7), (33, 1000), (129, 257), (1, 1_000_003)]


@pytest.mark.parametrize(
    "case,shape", fast_first([(c, s) for c in sorted(CASES) for s in SHAPES if c != "matmul" or s[0] > 1], unpack=True)
)
def test_noopt_and_core_counts_agree(case, shape):
    an, bn = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32)
    outs = []
    for ctx in ({}, {"NOOPT": 1}, {"THREADS": 3}, {"THREADS": 1}):
        with Context(**ctx):
            outs.append(CASES[case](Tensor(an), Tensor(bn)).numpy())
    tol = 2e-6 * np.sqrt(shape[1]) * max(1.0, float(np.abs(outs[1]).max()))  # sums in another order round apart
    for other in outs[1:]:
        np.testing.assert_allclose(outs[0], other, rtol=1e-5, atol=tol)


# ***** GPU renderers: a tail's loop nest runs once *****


def _cl_unavailable() -> str | None:
    try:
        Device["CL"]
    except Exception as e:
        return f"no OpenCL here: {e}"
    return None


@pytest.mark.slow
def test_cl_tails_with_explicit_actions():
    if (why := _cl_unavailable()) is not None:  # asked here, not at import: opening PoCL costs every process
        pytest.skip(why)
    a = rng.standard_normal((13, 1003)).astype(np.float32)
    t = Tensor(a, device="CL")
    cases = [
        (t * 2 + 1, a * 2 + 1, [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.LOCAL, 0, 3)]),
        (t.sum(1), a.sum(1), [Opt(OptOps.UNROLL, 1, 16), Opt(OptOps.UNROLL, 1, 4), Opt(OptOps.LOCAL, 0, 13)]),
        (t.sum(1), a.sum(1), [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 1, 16)]),
        (t.sum(0), a.sum(0), [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.LOCAL, 0, 31)]),
    ]
    for out, want, opts in cases:
        (item,) = schedule_tensors([out])
        dev = Device[item.device]
        uops, _ = full_rewrite(item.ast, dev.renderer, opts)
        dev.build(dev.renderer.render(kernel_name(item.ast), uops))(*[b.ptr for b in item.bufs])
        _close(item.bufs[0].numpy().reshape(want.shape), want)
    # in place: the tail's stores come from one thread only
    x = rng.standard_normal(1003).astype(np.float32)
    tx = Tensor(x.copy(), device="CL").realize()
    (item,) = schedule_tensors([tx.assign(tx + 1)])
    dev = Device["CL"]
    uops, _ = full_rewrite(item.ast, dev.renderer, [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.LOCAL, 0, 2)])
    spec = dev.renderer.render(kernel_name(item.ast), uops)
    assert spec.global_size == (31, 1, 1) and "if (alu" in spec.src
    program = dev.build(spec)
    for _ in range(3):
        program(*[b.ptr for b in item.bufs])
    _close(item.bufs[0].numpy(), x + 3, 1e-6)
