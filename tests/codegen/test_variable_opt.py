"""Kernels with a symbolic loop (a RANGE whose size is a Variable expression) are optimized: UPCAST/UNROLL split
the loop into RANGE(n//c)*c + RANGE(c) and a tail loop over n%c (codegen/opt/tail.py), THREAD gives each core a
chunk cut at n (codegen/opt/__init__.py). The graphs and code before and after; values for many bound values on
every CPU backend, NOOPT and other core counts agreeing; one compiled program for every value. And basic indexing
with a bound Variable (`x[:v]`, `x[v]`: tensor/indexing.py)."""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Context, Device, Tensor, TinyJit, Variable
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.codegen.opt import Opt, OptError, OptOps, apply_opt, kernel_axes
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.engine import kernels, realize
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.uop.ops import AxisType, Ops, UOp

rng = np.random.default_rng(0)
CPU_DEVICES = ["CPU", "CPU:C", "PYTHON"]


@pytest.fixture
def avx2_thread_threshold(monkeypatch):
    """The threading threshold these sizes were chosen at (1 << 15 loop iterations, set on an AVX2 host): the tests
    using it are about the split's code, not the threshold's value (renderer.MIN_THREAD_WORK)."""
    from zeptograd import device
    from zeptograd.codegen.opt import heuristic

    monkeypatch.setattr(heuristic, "MIN_THREAD_WORK", 1 << 15)
    monkeypatch.setattr(device, "MIN_THREAD_WORK", 1 << 15)


@pytest.fixture(params=CPU_DEVICES)
def device(request) -> str:
    try:
        Device[request.param]
    except Exception as e:  # no compiler, no llvmlite
        pytest.skip(f"{request.param} is not available: {e}")
    return request.param


def kernel(t: Tensor) -> UOp:
    items, _, _, _ = realize._schedule([t])
    (item,) = items
    return item.ast


def c_source(ast: UOp, opts: list[Opt] | None = None) -> str:
    uops, _ = full_rewrite(ast, CStyleRenderer(), opts)
    return CStyleRenderer().render(kernel_name(ast), uops).src


def store_index(u: UOp) -> UOp:
    return next(x for x in u.toposort() if x.op is Ops.STORE).src[0]


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


N = Variable("n", 1, 1 << 16)
X = Tensor(rng.random(1 << 16, dtype=np.float32)).realize()


# ***** the graph before and after each action on a symbolic loop *****


def test_upcast_symbolic_is_a_vector_loop_and_a_tail_loop():
    ast = kernel(X.shrink(((0, N.bind(100)),)) + 1)
    (r,) = kernel_axes(ast)
    assert r.src[0] is N  # before: one scalar loop of n
    after = apply_opt(ast, Opt(OptOps.UPCAST, 0, 16))
    main, tail = after.src  # SINK(END(main), END(tail)), both storing into the same buffer
    outer, lanes = sorted(main.ranges, key=lambda r: r.arg[0])
    assert outer.src[0] is (N // 16).simplify() and (lanes.src[0].arg, lanes.arg[1]) == (16, AxisType.UPCAST)
    assert store_index(main).src[1] is outer * 16 + lanes  # RANGE(n) -> RANGE(n//16)*16 + RANGE(16)
    (t,) = tail.ranges
    assert t.src[0] is (N % 16).simplify() and t.arg[1] is AxisType.LOOP  # the n%16 left: a scalar loop
    assert store_index(tail).src[1] is (N // 16).simplify() * 16 + t
    assert [r.src[0] for r in kernel_axes(after)] == [(N // 16).simplify(), (N % 16).simplify()]


def test_unroll_symbolic_adds_a_tail_reduce():
    ast = kernel(X.shrink(((0, N.bind(100)),)).sum())
    after = apply_opt(ast, Opt(OptOps.UNROLL, 0, 16))
    value = next(u for u in after.toposort() if u.op is Ops.STORE).src[1]
    assert value.op is Ops.ADD and all(s.op is Ops.REDUCE for s in value.src)  # sum(main) + sum(tail)
    main, tail = value.src
    assert sorted((r.src[0], r.arg[1]) for r in main.src[1:]) == sorted(
        [((N // 16).simplify(), AxisType.REDUCE), (UOp.const(N.dtype, 16), AxisType.UNROLL)], key=str
    )
    assert [(r.src[0], r.arg[1]) for r in tail.src[1:]] == [((N % 16).simplify(), AxisType.REDUCE)]


def test_thread_symbolic_is_chunks_cut_at_n():
    ast = kernel(X.shrink(((0, N.bind(100)),)) + 1)
    after = apply_opt(ast, Opt(OptOps.THREAD, 0, 2))
    assert len(after.src) == 1  # no tail nest: the last core's chunk is shorter
    core = next(u for u in after.toposort() if u.op is Ops.SPECIAL)
    (r,) = after.ranges
    idx = store_index(after)
    assert len(idx.src) == 2  # no gate on the store
    c = ((N + 1) // 2).simplify()  # ceil(n/2) per core
    assert idx.src[1] is core * c + r
    over = ((core + 1) * c - N).maximum(UOp.const(N.dtype, 0))
    assert r.src[0] is (c - over).simplify()  # the loop ends at n: c - max((core+1)*c - n, 0)


def test_divisible_symbolic_size_needs_no_tail():
    v = Variable("v", 1, 1 << 12)
    ast = kernel(X.shrink(((0, v.bind(7) * 16),)) * 2)  # 16*v: every value is a multiple of 16
    after = apply_opt(ast, Opt(OptOps.UPCAST, 0, 16))
    assert len(after.src) == 1 and sorted(r.src[0] for r in kernel_axes(after)) == [v]
    tiled = apply_opt(ast, Opt(OptOps.TILE, 0, 16))  # TILE needs a divisor, which 16 is for every value
    assert len(kernel_axes(tiled)) == 2


def test_actions_that_refuse_a_symbolic_size():
    ast = kernel(X.shrink(((0, Variable("m", 1, 20).bind(5)),)) + 1)
    with pytest.raises(OptError, match="does not fit"):
        apply_opt(ast, Opt(OptOps.UPCAST, 0, 32))  # more than the largest value
    with pytest.raises(OptError, match="TILE splits an output loop evenly"):
        apply_opt(ast, Opt(OptOps.TILE, 0, 4))
    with pytest.raises(OptError, match="does not divide"):
        apply_opt(ast, Opt(OptOps.LOCAL, 0, 4))  # GPU work-groups need a divisor


def test_a_loop_that_may_run_once_keeps_its_body():
    # the main part of UPCAST 8 on n <= 15 runs 0 or 1 times: its index may not fold to 0 (the body would be hoisted
    # out of the loop and run for n < 8 too); a tail over n%2 neither
    m = Variable("m", 0, 15)
    for opt in (Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 0, 2)):
        for val in (0, 1, 2, 7, 8, 9, 15):
            x = Tensor(np.arange(15, dtype=np.float32), device="PYTHON")  # PYTHON: an access out of bounds raises
            out = x.shrink(((0, m.bind(val)),)) + 1
            items, _, _, var_vals = realize._schedule([out])
            (item,) = items
            dev = Device["PYTHON"]
            uops, _ = full_rewrite(item.ast, dev.renderer, [opt])
            prog = dev.build(dev.renderer.render(kernel_name(item.ast), uops))
            for b in item.bufs:
                b.ensure_allocated()
            item.bufs[0].copyin(np.full(item.bufs[0].size, -7, np.float32))
            prog(*[b.ptr for b in item.bufs], vals=(val,))
            got = item.bufs[0].numpy()
            close(got[:val], np.arange(val) + 1)
            assert (got[val:] == -7).all()  # nothing stored past n


# ***** what the heuristic chooses, and the code before and after *****


def test_heuristic_elementwise_and_reduce_over_a_symbolic_axis(avx2_thread_threshold):
    ast = kernel(X.shrink(((0, N.bind(1000)),)) * 2 + 1)
    assert hand_coded_optimizations(ast, 64, threads=2)[1] == [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.THREAD, 0, 2)]
    before = c_source(ast, [])  # what the heuristic did before: nothing
    assert "for (int ridx0 = 0; ridx0 < var_n; ridx0++)" in before and "zg_floatx16" not in before
    after = c_source(ast, [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.THREAD, 0, 2)])
    assert "zg_floatx16" in after and "(var_n/16)" in after and "(var_n%16)" in after and "core_id" in after
    ast = kernel(X.shrink(((0, N.bind(1000)),)).sum())
    opts = hand_coded_optimizations(ast, 64, threads=2)[1]
    assert opts == [Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.UNROLL, 0, 4)]  # 4 vector accumulators, as for a constant


def test_heuristic_matmul_with_symbolic_rows_matches_the_constant_one():
    a, w = Tensor(rng.random((1024, 384), dtype=np.float32)).realize(), Tensor(np.ones((384, 384), np.float32))
    vi = Variable("i", 1, 1024).bind(256)
    for rhs in (w, w.T):
        sym = hand_coded_optimizations(kernel(a.shrink(((0, vi), None)) @ rhs), 64, threads=2)[1]
        const = hand_coded_optimizations(kernel(a.shrink(((0, 256), None)) @ rhs), 64, threads=2)[1]
        assert sym[: len(const)] == const  # the same register tile; plus a THREAD for the rows' tail nest
        assert any(o.op is OptOps.UPCAST and o.axis == 0 and o.arg == 8 for o in sym)  # 8 symbolic rows per tile


def test_a_concrete_axis_beside_a_symbolic_one_is_vectorized_as_usual():
    a = Tensor(rng.random((64, 384), dtype=np.float32)).realize()
    vi = Variable("i", 1, 64).bind(10)
    opts = hand_coded_optimizations(kernel(a.shrink(((0, vi), None)) + 1), 64, threads=1)[1]
    assert opts == [Opt(OptOps.UPCAST, 1, 16)]  # 384 = 24*16: no tail
    opts = hand_coded_optimizations(kernel(a.shrink(((0, vi), None)).sum(1)), 64, threads=1)[1]
    assert opts[0] == Opt(OptOps.UNROLL, 1, 16)


# ***** values: many bound values, every CPU backend; one program for all *****

VALUES = (1, 2, 15, 16, 17, 100, 1000)


def _check_values(device, vmax, build, want, values, tol=1e-5):
    """build(bound variable) for each value against want(value); the program compiled for the first value serves all"""
    var = Variable("n", 1, vmax)
    compiled = None
    for val in (*values, vmax):
        out = build(var.bind(val))
        close(out.numpy(), want(val), tol)
        if compiled is None:
            compiled = set(kernels._kernel_cache)
        else:
            assert set(kernels._kernel_cache) == compiled, f"compiled again for n={val}"


def test_elementwise_values(device):
    vmax = 70_000 if device != "PYTHON" else 1024
    xn, yn = rng.standard_normal(vmax, dtype=np.float32), rng.standard_normal(vmax, dtype=np.float32)
    x, y = Tensor(xn, device=device).realize(), Tensor(yn, device=device).realize()
    _check_values(
        device,
        vmax,
        lambda v: x[:v] * y[:v] + 1,
        lambda n: xn[:n] * yn[:n] + 1,
        VALUES + ((65_537,) if device != "PYTHON" else ()),
    )


def test_full_reduce_values(device):
    vmax = 70_000 if device != "PYTHON" else 1024
    xn = rng.standard_normal(vmax, dtype=np.float32)
    x = Tensor(xn, device=device).realize()
    _check_values(device, vmax, lambda v: x[:v].sum(), lambda n: xn[:n].sum(dtype=np.float64), VALUES, 1e-3)
    _check_values(device, vmax, lambda v: x[:v].max(), lambda n: xn[:n].max(), VALUES)


@pytest.mark.slow
def test_row_and_column_reduces_values(device):
    vmax = 300
    xn = rng.standard_normal((vmax, 70), dtype=np.float32)
    x = Tensor(xn, device=device).realize()
    vals = (1, 2, 15, 16, 17, 100)
    _check_values(device, vmax, lambda v: x[:v].sum(1), lambda n: xn[:n].sum(1), vals, 1e-4)  # symbolic rows
    _check_values(device, vmax, lambda v: x[:v].sum(0), lambda n: xn[:n].sum(0), vals, 1e-4)  # over symbolic rows
    xt = Tensor(xn.T.copy(), device=device).realize()  # (70, vmax): reduces along a symbolic row
    _check_values(device, vmax, lambda v: xt[:, :v].sum(1), lambda n: xn.T[:, :n].sum(1), vals, 1e-4)
    _check_values(
        device,
        vmax,
        lambda v: xt[:, :v].softmax(-1).sum(0),
        lambda n: (np.exp(xn.T[:, :n]) / np.exp(xn.T[:, :n]).sum(1, keepdims=True)).sum(0),
        vals,
        1e-4,
    )


@pytest.mark.slow
def test_matmul_values(device):
    vmax, k = (300, 100) if device != "PYTHON" else (40, 20)
    an, wn = rng.standard_normal((vmax, k), dtype=np.float32), rng.standard_normal((k, 70), dtype=np.float32)
    a, w = Tensor(an, device=device).realize(), Tensor(wn, device=device).realize()
    vals = (1, 2, 15, 16, 17) + ((100,) if device != "PYTHON" else ())
    _check_values(device, vmax, lambda v: a[:v] @ w, lambda n: an[:n] @ wn, vals, 1e-3)  # symbolic rows
    _check_values(device, vmax, lambda v: a[:v].T @ a[:v], lambda n: an[:n].T @ an[:n], vals, 1e-3)  # a symbolic K


@pytest.mark.slow
@pytest.mark.parametrize("ctx", [{"NOOPT": 1}, {"THREADS": 3}, {"THREADS": 1}])
def test_noopt_and_core_counts_agree(ctx):
    an = rng.standard_normal((300, 100), dtype=np.float32)
    cases = [
        lambda a, v: (a[:v] * 2 + 1).exp(),
        lambda a, v: a[:v].sum(1),
        lambda a, v: a[:v].sum(0),
        lambda a, v: a[:v] @ a[:v].T,
        lambda a, v: a[:v].T @ a[:v],
        lambda a, v: a.T[:, :v].max(1),
    ]
    var = Variable("n", 1, 300)
    for n in (1, 17, 100, 299):
        for case in cases:
            a = Tensor(an)
            want = case(a, var.bind(n)).numpy()
            with Context(**ctx):
                got = case(Tensor(an), var.bind(n)).numpy()
            close(got, want, 1e-4)


def test_jit_replays_an_optimized_symbolic_kernel():
    xn = rng.standard_normal(70_000, dtype=np.float32)
    x = Tensor(xn).realize()

    @TinyJit
    def f(t, v):
        return (t[:v] * 3).sum(), t[:v] + 1

    var = Variable("n", 1, 70_000)
    for n in (5, 40_000, 17, 70_000, 1):
        s, e = f(x, var.bind(n))
        close(s.numpy(), xn[:n].sum(dtype=np.float64) * 3, 1e-2)
        close(e.numpy(), xn[:n] + 1)


# ***** indexing with a bound Variable *****


@pytest.mark.slow
def test_slice_and_index_with_a_variable(device):
    xn = np.arange(40, dtype=np.float32).reshape(4, 10)
    x = Tensor(xn, device=device)
    for i in (1, 4, 9):
        v = Variable("i", 1, 9).bind(i)
        assert x[:, :v].shape == (4, v)
        close(x[:, :v].numpy(), xn[:, :i])
        close(x[:, v].numpy(), xn[:, i])  # an int index: the dim is dropped
        close(x[1, v - 1].numpy(), xn[1, i - 1])
        close(x[:, v:].numpy(), xn[:, i:])
        close(x[:, v - 1 : v + 1].numpy(), xn[:, i - 1 : i + 1])
        assert x[:, v - 1 : v + 1].shape == (4, 2)
        close(x[:, :v][:, -1].numpy(), xn[:, i - 1])  # an int into a symbolic dim
        close(x[:, :v][1:3, 1:].numpy(), xn[1:3, 1:i])
        close(x[None, 2:, :v, None].sum((0, 2, 3)).numpy(), xn[2:, :i].sum(1))


def test_variable_index_compiles_once():
    x = Tensor(rng.random((8, 64), dtype=np.float32)).realize()
    var = Variable("p", 0, 7)
    compiled = None
    for p in (0, 3, 7):
        close(x[var.bind(p)].numpy(), x.numpy()[p])
        close(x[: var.bind(p) + 1].sum(0).numpy(), x.numpy()[: p + 1].sum(0), 1e-5)
        if compiled is None:
            compiled = set(kernels._kernel_cache)
        assert set(kernels._kernel_cache) == compiled


def test_setitem_with_a_variable():
    cache = Tensor(np.zeros((6, 4), np.float32)).realize()  # not zeros().contiguous(): see the note below
    for pos in range(3):
        vp = Variable("p", 0, 5).bind(pos)
        cache[vp] = Tensor.full((4,), pos + 1.0)
        cache[vp : vp + 1, :2] = 9
        cache.realize()
    want = np.zeros((6, 4), np.float32)
    want[:3] = np.arange(1, 4)[:, None]
    want[:3, :2] = 9
    close(cache.numpy(), want)
    # note: a second `Tensor.zeros(6, 4).contiguous().realize()` in one process is served the first one's buffer, with
    # whatever was assigned into it since (test_variable.py's KV cache tests): a bug of its own, not of Variables


def test_variable_index_errors():
    x = Tensor(np.arange(10, dtype=np.float32))
    v = Variable("i", 1, 10).bind(4)
    with pytest.raises(IndexError, match=r"index \(i=4\)\+6 is out of bounds for dimension 0 with size 10"):
        x[v + 6]
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 0 with size i=4"):
        x[:v][4]
    with pytest.raises(IndexError, match="neither clamped nor wrapped"):
        x[v : v + 7]
    with pytest.raises(IndexError, match="takes step 1"):
        x[::v]
    with pytest.raises(IndexError, match="takes step 1"):
        x[:v][::-1]
    with pytest.raises(ValueError, match="not bound"):
        x[: Variable("j", 1, 10)]


def test_small_values_run_on_one_core(avx2_thread_threshold):
    # the kernel is threaded for the largest n; at a call whose n makes it small the cores run in the caller, one
    # after another (a pool handoff costs ~50 us, more than the work): ProgramSpec.work, device.run_on_cores
    x = Tensor(rng.random(1 << 16, dtype=np.float32), device="CPU").realize()
    with Context(THREADS=2):
        (item,) = realize._schedule([x[: N.bind(5)] * 2])[0]
        ck = realize.get_kernel(item.device, item.ast)
        assert ck.program.spec.global_size[0] == 2 and ck.program.spec.work == "n"
        assert ck.program.small((5,)) and not ck.program.small((60_000,))
        for n in (5, 60_000):
            close((x[: N.bind(n)] * 2).numpy(), x.numpy()[:n] * 2)
