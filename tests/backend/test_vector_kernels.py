"""Hand-built linear UOp lists with vectors, run on LLVM and on PYTHON, checked against numpy.

They exercise the renderer paths the optimizer uses (vector loads and stores, vector ALU, a vector accumulator with
a horizontal reduce through GEP, lane shuffles, gated vector loads and stores, bool/half/bf16 vectors, bitcasts,
DEFINE_VAR and core_id parameters) independently of whether the optimizer emits them today.
"""

from __future__ import annotations

import numpy as np
import pytest

from zeptograd import Device
from zeptograd.codegen.devectorizer import pm_devectorize
from zeptograd.codegen.linearize import linearize
from zeptograd.codegen.lower import pm_lower
from zeptograd.device import Buffer
from zeptograd.dtype import DType, dtypes
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.upat import graph_rewrite

f4 = dtypes.float32.vec(4)


def const(v, dt: DType = dtypes.int32) -> UOp:
    return UOp.const(dt, v)


def glob(slot: int, dt: DType, size: int) -> UOp:
    return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), slot)


def run(device: str, name: str, uops: list[UOp], arrays: list[np.ndarray], dts: list[DType], vals=()) -> list:
    dev = Device[device]
    spec = dev.renderer.render(name, uops)  # type: ignore[attr-defined]
    program = dev.build(spec)  # type: ignore[attr-defined]
    bufs = [Buffer(device, a.size, dt).copyin(a) for a, dt in zip(arrays, dts)]
    program(*[b.ptr for b in bufs], vals=tuple(vals))
    return [b.numpy() for b in bufs]


DEVICES = ["CPU", "PYTHON"]  # the LLVM renderer and the reference


@pytest.mark.parametrize("device", DEVICES)
def test_vector_add_in_a_loop(device):
    out, a, b = glob(0, dtypes.float32, 16), glob(1, dtypes.float32, 16), glob(2, dtypes.float32, 16)
    r = UOp.range(4, 0)
    i = r * const(4)
    x, y = a.index(i).load(dtype=f4), b.index(i).load(dtype=f4)
    s = UOp(Ops.ADD, f4, (x, y))
    st = out.index(i).store(s)
    uops = [out, a, b, const(4), r, i, a.index(i), x, b.index(i), y, s, out.index(i), st, st.end(r)]
    A, B = np.arange(16, dtype=np.float32), np.linspace(-1, 1, 16, dtype=np.float32)
    got = run(device, "vec_add", uops, [np.zeros(16, np.float32), A, B], [dtypes.float32] * 3)
    np.testing.assert_array_equal(got[0], A + B)


@pytest.mark.parametrize("device", DEVICES)
def test_vector_accumulator_horizontal_reduce_and_swizzle(device):
    out, a = glob(0, dtypes.float32, 8), glob(1, dtypes.float32, 16)
    zero, c0, c4 = const(0.0, dtypes.float32), const(0), const(4)
    acc = UOp(Ops.DEFINE_REG, f4.ptr(1), (), 0)
    zeros = UOp(Ops.VECTORIZE, f4, (zero,) * 4)
    init = acc.index(c0).store(zeros)
    r = UOp.range(4, 1, AxisType.REDUCE)
    acc_in = acc.after(init, r)
    cur = acc_in.index(c0).load()
    i = r * c4
    x = a.index(i).load(dtype=f4)
    upd = UOp(Ops.MULACC, f4, (x, x, cur))  # acc += x*x, a vector fma
    st = acc.index(c0).store(upd)
    end = st.end(r)
    acc_out = acc.after(end)
    fin = acc_out.index(c0).load()
    lanes = [UOp(Ops.GEP, dtypes.float32, (fin,), (k,)) for k in range(4)]
    h1 = UOp(Ops.ADD, dtypes.float32, (lanes[0], lanes[1]))
    h2 = UOp(Ops.ADD, dtypes.float32, (h1, lanes[2]))
    h3 = UOp(Ops.ADD, dtypes.float32, (h2, lanes[3]))
    st_h = out.index(c0).store(h3)
    sw = UOp(Ops.GEP, f4, (fin,), (3, 2, 1, 0))
    st_sw = out.index(c4).store(sw)
    uops = [out, a, zero, c0, c4, acc, zeros, acc.index(c0), init, r, acc_in, acc_in.index(c0), cur, i, a.index(i), x,
            upd, st, end, acc_out, acc_out.index(c0), fin, *lanes, h1, h2, h3, out.index(c0), st_h, sw,
            out.index(c4), st_sw]  # fmt: skip
    A = np.linspace(-2, 3, 16, dtype=np.float32)
    got = run(device, "vec_acc", uops, [np.full(8, -1, np.float32), A], [dtypes.float32] * 2)[0]
    cols = (A.reshape(4, 4).astype(np.float64) ** 2).sum(axis=0)
    np.testing.assert_allclose(got[0], cols.sum(), rtol=1e-6)
    np.testing.assert_allclose(got[4:], cols[::-1], rtol=1e-6)
    assert (got[1:4] == -1).all()  # untouched


@pytest.mark.parametrize("device", DEVICES)
def test_gated_vectors_bool_half_var_and_cores(device):
    """Per core, 2 blocks of 4: blocks >= n read 0 (gated load) and don't store their half output (gated store)."""
    N = 16
    of, oi = glob(0, dtypes.float32, N), glob(1, dtypes.int32, N)
    ob, oh = glob(2, dtypes.bool, N), glob(3, dtypes.half, N)
    inp, mask = glob(4, dtypes.float32, N), glob(5, dtypes.bool, N)
    n = UOp.variable("n", 0, 4)
    core = UOp(Ops.SPECIAL, dtypes.int32, (const(2),), "core_id")
    r = UOp.range(2, 0)
    blk = core * const(2) + r
    i = blk * const(4)
    valid = UOp(Ops.CMPLT, dtypes.bool, (blk, n))
    gidx = inp.index(i, valid)
    x = gidx.load(dtype=f4)
    m = mask.index(i).load(dtype=dtypes.bool.vec(4))
    zero4, one4 = UOp.const(f4, 0.0), UOp.const(f4, 1.0)
    neg = UOp(Ops.CMPLT, dtypes.bool.vec(4), (x, zero4))
    neg_m = UOp(Ops.AND, dtypes.bool.vec(4), (neg, m))
    y = UOp(Ops.WHERE, f4, (neg_m, UOp(Ops.NEG, f4, (x,)), UOp(Ops.MAX, f4, (x, one4))))
    z = UOp(Ops.MULACC, f4, (y, UOp.const(f4, 2.0), UOp.const(f4, 0.5)))
    zi = UOp(Ops.CAST, dtypes.int32.vec(4), (z,))
    zh = UOp(Ops.CAST, dtypes.half.vec(4), (z,))
    stores = [of.index(i).store(z), oi.index(i).store(zi), ob.index(i).store(neg_m), oh.index(i, valid).store(zh)]
    group = UOp(Ops.GROUP, dtypes.void, tuple(stores))
    nodes = list(group.end(r).toposort())  # sources first: a valid linear order for one loop
    consts = [u for u in nodes if u.op in (Ops.CONST, Ops.VECTORIZE, Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR, Ops.SPECIAL)]
    rest = [u for u in nodes if u not in consts and u.op is not Ops.RANGE]
    before = [u for u in rest if r not in u.toposort()]  # loop-invariant
    uops = consts + before + [r] + [u for u in rest if u not in before]
    X = np.linspace(-3, 3, N, dtype=np.float32)
    M = np.arange(N) % 3 != 0
    arrays = [np.zeros(N, np.float32), np.zeros(N, np.int32), np.zeros(N, bool), np.full(N, -7, np.float16), X, M]
    dts = [dtypes.float32, dtypes.int32, dtypes.bool, dtypes.half, dtypes.float32, dtypes.bool]
    got = run(device, "vec_gated", uops, arrays, dts, vals=(3,))
    xv = np.where(np.arange(N) < 12, X, 0)  # block 3 is not valid
    negm = (xv < 0) & M
    zz = np.where(negm, -xv, np.maximum(xv, 1)) * 2 + 0.5
    np.testing.assert_array_equal(got[0], zz)
    np.testing.assert_array_equal(got[1], zz.astype(np.int32))
    np.testing.assert_array_equal(got[2], negm)
    np.testing.assert_array_equal(got[3], np.where(np.arange(N) < 12, zz.astype(np.float16), np.float16(-7)))


@pytest.mark.parametrize("device", DEVICES)
def test_vector_bitcast_and_bfloat16(device):
    out_i, out_b, inp = glob(0, dtypes.int32, 8), glob(1, dtypes.bfloat16, 8), glob(2, dtypes.float32, 8)
    r = UOp.range(2, 0)
    i = r * const(4)
    x = inp.index(i).load(dtype=f4)
    bits = UOp(Ops.BITCAST, dtypes.int32.vec(4), (x,))
    bf = UOp(Ops.CAST, dtypes.bfloat16.vec(4), (x,))
    stores = UOp(Ops.GROUP, dtypes.void, (out_i.index(i).store(bits), out_b.index(i).store(bf)))
    # a renderer sees bf16 as its raw bits: the float32 -> bf16 rounding is codegen's (lower.py), as in full_rewrite
    lowered = graph_rewrite(UOp(Ops.SINK, dtypes.void, (stores.end(r),)), pm_lower)
    uops = linearize(graph_rewrite(lowered, pm_devectorize, ctx=Device[device].renderer))
    X = np.array([1.0, -2.5, 3.14159, 1e-3, 65504.0, -0.0, 7.00390625, 1 / 3], np.float32)
    got = run(device, "vec_bits", uops, [np.zeros(8, np.int32), np.zeros(8, np.uint16), X],
              [dtypes.int32, dtypes.bfloat16, dtypes.float32])  # fmt: skip
    np.testing.assert_array_equal(got[0], X.view(np.int32))
    u = X.view(np.uint32).astype(np.uint64)
    want = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(got[1], want)


def test_llvm_ir_of_a_vector_kernel():
    out, a, c0 = glob(0, dtypes.float32, 4), glob(1, dtypes.float32, 4), const(0)
    x = a.index(c0).load(dtype=f4)
    s = UOp(Ops.SQRT, f4, (x,))
    st = out.index(c0).store(s)
    uops = [out, a, c0, a.index(c0), x, s, out.index(c0), st]
    src = Device["CPU"].renderer.render("vec_sqrt", uops).src  # type: ignore[attr-defined]
    assert "load <4 x float>" in src and "@llvm.sqrt.v4f32" in src and "store <4 x float>" in src


@pytest.mark.parametrize("device", DEVICES)
def test_lane_masked_load_and_store(device):
    """A vector valid: each lane of the load reads 0 where it is false, each lane of the store is skipped."""
    out, a, c0 = glob(0, dtypes.float32, 8), glob(1, dtypes.float32, 8), const(0)
    lanes = UOp(Ops.VECTORIZE, dtypes.int32.vec(4), tuple(const(k) for k in (0, 1, 2, 3)))
    valid = UOp(Ops.CMPNE, dtypes.bool.vec(4), (lanes, UOp.const(dtypes.int32.vec(4), 2)))  # all lanes but 2
    ia, io = a.index(const(4), valid), out.index(const(4), valid)
    x = ia.load(dtype=f4)
    y = UOp(Ops.ADD, f4, (x, UOp.const(f4, 10.0)))
    st = io.store(y)
    uops = [out, a, c0, const(4), *lanes.src, lanes, const(2), UOp.const(dtypes.int32.vec(4), 2), valid, ia, x,
            const(10.0, dtypes.float32), UOp.const(f4, 10.0), y, io, st]  # fmt: skip
    A = np.arange(8, dtype=np.float32)
    got = run(device, "vec_masked", uops, [np.full(8, -1, np.float32), A], [dtypes.float32] * 2)[0]
    np.testing.assert_array_equal(got, [-1, -1, -1, -1, 14, 15, -1, 17])
