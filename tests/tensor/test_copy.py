"""`Tensor.to(device)`: a lazy COPY node in the graph, scheduled as a copy item between kernels (schedule/copy.py),
differentiable, on every pair of the host devices and CL (skipped where no OpenCL platform opens)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.backend.conftest import unavailable
from zeptograd import Device, GlobalCounters, Tensor, TinyJit, Variable, dtypes
from zeptograd.device import Buffer
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.uop.ops import Ops

DEVICES = ["CPU", "CPU:C", "PYTHON", "CL"]
PAIRS = [(a, b) for a in DEVICES for b in DEVICES if a != b]
rng = np.random.default_rng(0)


def _need(*devices: str):
    for d in devices:
        if (why := unavailable(d)) is not None:
            pytest.skip(why)


def _ops(items) -> list[tuple[str, str]]:
    return [("copy" if it.ast.op is Ops.COPY else "kernel", it.device) for it in items]


@pytest.mark.parametrize("src,dst", PAIRS)
def test_values_between_devices(src, dst):
    _need(src, dst)
    for arr in (
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.integers(-(2**40), 2**40, (7,), dtype=np.int64),
        np.array([True, False, True]),
    ):
        t = Tensor(arr, device=src).to(dst)
        assert t.device == dst and t.uop.op is Ops.COPY
        got = t.numpy()
        assert got.dtype == arr.dtype
        np.testing.assert_array_equal(got, arr)
        np.testing.assert_array_equal((t.to(src) + t.to(src)).numpy(), arr + arr)  # and back, into a kernel


@pytest.mark.parametrize("src,dst", [("CPU", "CL"), ("CL", "PYTHON"), ("CL", "CPU:C")])
def test_computed_value_between_devices(src, dst):
    _need(src, dst)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    got = ((Tensor(x, device=src) * 2).T.to(dst) + 1).sum(1).numpy()
    np.testing.assert_allclose(got, (x * 2).T.sum(1) + 4, rtol=1e-5)


def test_bfloat16_bits_move_unchanged():
    x = Tensor([1.5, -2.25, 3e38], dtype=dtypes.bfloat16)
    np.testing.assert_array_equal(x.to("PYTHON").numpy(), x.numpy())


def test_copy_fused_into_graph():
    a = rng.standard_normal(16).astype(np.float32)
    out = (Tensor(a).to("PYTHON") * 2).sum()
    items = out.schedule()
    assert _ops(items) == [("copy", "PYTHON"), ("kernel", "PYTHON")]  # the buffer is copied as it is: no kernel
    assert items[1].bufs[1] is items[0].bufs[0]  # the kernel reads the copy's buffer
    np.testing.assert_allclose(out.item(), (a * 2).sum(), rtol=1e-5)


def test_to_is_lazy(monkeypatch):
    x = Tensor(rng.standard_normal(8).astype(np.float32))
    lazy = (x + 1).exp()
    monkeypatch.setattr(Buffer, "numpy", lambda self: pytest.fail("to() read a buffer back to the host"))
    monkeypatch.setattr(Buffer, "copyin", lambda self, data: pytest.fail("to() wrote a buffer from the host"))
    before = GlobalCounters.kernel_count
    y = lazy.to("CPU:C")
    assert GlobalCounters.kernel_count == before  # nothing ran
    assert y.uop.op is Ops.COPY and y.uop.src[0] is lazy.uop and y.uop.src[1].arg == "CPU:C"
    monkeypatch.undo()
    np.testing.assert_allclose(y.numpy(), np.exp(x.numpy() + 1), rtol=1e-6)


def test_cross_device_schedule_is_kernel_copy_kernel():
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    y = ((x + 1).to("CPU:C") * 2).realize()
    items = ((x + 1).to("CPU:C") * 2).schedule()
    assert _ops(items) == [("kernel", "CPU"), ("copy", "CPU:C"), ("kernel", "CPU:C")]
    first, copy, last = items
    assert copy.ast.src[0].arg == "CPU" and copy.ast.src[1].arg == "CPU:C" and copy.ast.arg == 12 * 4
    assert copy.bufs[1] is first.bufs[0] and copy.bufs[0].device == "CPU:C" and last.bufs[1] is copy.bufs[0]
    np.testing.assert_allclose(y.numpy(), (x.numpy() + 1) * 2, rtol=1e-6)


def test_non_contiguous_source_is_materialized_first():
    a = rng.standard_normal((3, 5)).astype(np.float32)
    x = Tensor(a)
    for view, ref in ((x.T, a.T), (x[1:, ::2], a[1:, ::2]), (x.flip(0), a[::-1])):
        t = view.to("PYTHON")
        assert _ops(t.schedule()) == [("kernel", "CPU"), ("copy", "PYTHON")]
        np.testing.assert_array_equal(t.numpy(), ref)


def test_to_of_unrealized_graph():
    a, w = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    got = (Tensor(a) @ Tensor(w)).relu().to("PYTHON").softmax(-1).numpy()
    ref = torch.softmax(torch.relu(torch.tensor(a) @ torch.tensor(w)), -1).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_chained_copies_and_to_in_place():
    a = rng.standard_normal(6).astype(np.float32)
    t = Tensor(a).to("PYTHON").to("CPU:C").to("CPU")
    np.testing.assert_array_equal(t.numpy(), a)
    u = Tensor(a)
    assert u.to_("PYTHON") is u and u.device == "PYTHON"
    np.testing.assert_array_equal(u.numpy(), a)


def test_constants_move_without_memory():
    t = Tensor.full((2, 3), 7.0).to("PYTHON")
    assert t.device == "PYTHON" and t.schedule() == []
    np.testing.assert_array_equal(t.numpy(), np.full((2, 3), 7.0, np.float32))
    assert Tensor.zeros(2, 0).to("PYTHON").sum(1).schedule() == []  # an empty reduce folds on the copy's device


def test_empty_and_symbolic_shapes():
    assert Tensor(np.zeros((0, 3), np.float32)).to("PYTHON").numpy().shape == (0, 3)
    a = np.arange(10, dtype=np.float32)
    n = Variable("n", 1, 10)
    for v in (4, 7):
        t = Tensor(a)[: n.bind(v)].to("CPU:C") * 2
        np.testing.assert_array_equal(t.numpy(), a[:v] * 2)


def test_same_device_returns_self():
    t = Tensor([1.0, 2.0])
    assert t.to("CPU") is t and t.to("cpu:0") is t and t.to(None) is t
    p = t.to("PYTHON")
    assert p.to("PYTHON") is p


def test_errors_at_the_call():
    t = Tensor([1.0, 2.0])
    with pytest.raises(ArgumentError, match="unknown device 'FOO'"):
        t.to("FOO")
    with pytest.raises(ArgumentTypeError, match="got int"):
        t.to(3)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="'PYTHON:1'"):
        t.to("PYTHON:1")
    with pytest.raises(ArgumentError, match="different devices: PYTHON and CPU"):
        t.to("PYTHON") + t  # a copy does not make mixing devices legal


def test_unavailable_device_fails_at_the_call(monkeypatch):
    def refuse(device):
        raise RuntimeError(f"{device}: no such device here")

    t = Tensor([1.0, 2.0])
    monkeypatch.setattr(type(Device), "__getitem__", lambda self, device: refuse(device))
    with pytest.raises(RuntimeError, match="PYTHON: no such device here"):
        t.to("PYTHON")


def test_gradient_flows_through_copies_as_torch():
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4,)).astype(np.float32)
    w, v = Tensor(a, requires_grad=True), Tensor(b, requires_grad=True, device="PYTHON")
    loss = (w.to("PYTHON").exp() * v).sum() + ((w * 3).to("CPU:C").sin() * v.to("CPU:C")).mean().to("PYTHON")
    loss.backward()
    tw, tv = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    tloss = (tw.exp() * tv).sum() + ((tw * 3).sin() * tv).mean()
    tloss.backward()
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
    assert w.grad.device == "CPU" and v.grad.device == "PYTHON"  # each gradient on its leaf's device
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy(), rtol=1e-5, atol=1e-6)
    (gw,) = ((w.to("PYTHON") * 2).to("CPU:C").sum()).gradient(w)
    np.testing.assert_array_equal(gw.numpy(), np.full((3, 4), 2, np.float32))


def test_no_grad_copy_is_detached():
    w = Tensor([1.0, 2.0], requires_grad=True)
    with Tensor.no_grad():
        p = w.to("PYTHON")
    assert not p.requires_grad
    assert w.to("PYTHON").requires_grad


def test_repeated_graphs_reuse_the_schedule_with_their_own_buffers():
    for i in range(3):
        a = np.arange(5, dtype=np.float32) + i
        np.testing.assert_array_equal((Tensor(a).to("PYTHON") * 2).numpy(), a * 2)


@pytest.mark.parametrize("prune", [False, True])
def test_tinyjit_replays_copies(prune):
    def fn(x, w):
        return ((x.to("CPU:C") @ w).relu().to("CPU") + 1).sum(0)

    step = TinyJit(fn, prune=prune)
    w = Tensor(rng.standard_normal((3, 2)).astype(np.float32), device="CPU:C")
    for i in range(4):
        x = rng.standard_normal((5, 3)).astype(np.float32)
        got = step(Tensor(x), w)
        assert got.device == "CPU"
        np.testing.assert_allclose(got.numpy(), (np.maximum(x @ w.numpy(), 0) + 1).sum(0), rtol=1e-5)
    assert step.captured is not None and sum(n.startswith("copy") for n in step.captured.names) == 2


def test_null_device_copies_bytes():
    a = np.arange(6, dtype=np.int32)
    t = Tensor(a).to("NULL")
    assert _ops(t.schedule()) == [("copy", "NULL")]
    np.testing.assert_array_equal(t.numpy(), a)


def test_to_of_assign_into_a_view():
    """The assign's value is elements 1..2 of t's buffer: gathered by a kernel, then copied (it copied from 0)."""
    t = Tensor(np.zeros(4, np.float32))
    v = t[1:3].assign(Tensor([5.0, 6.0]))
    np.testing.assert_array_equal(v.to("PYTHON").numpy(), [5.0, 6.0])
    np.testing.assert_array_equal(t.numpy(), [0.0, 5.0, 6.0, 0.0])


def test_copy_reads_old_contents_before_an_assign_and_shares_a_source_output():
    a = Tensor(np.arange(4, dtype=np.float32))
    p, s = a.to("PYTHON"), a.assign(a + 1)
    Tensor.realize(p, s)
    np.testing.assert_array_equal(p.numpy(), [0, 1, 2, 3])  # the copy ran before the write
    np.testing.assert_array_equal(a.to("PYTHON").numpy(), [1, 2, 3, 4])
    y = a + 1
    z = y.to("CPU:C")
    assert _ops(Tensor.schedule(y, z)) == [("kernel", "CPU"), ("copy", "CPU:C")]  # y computed once, copied
    Tensor.realize(y, z)
    np.testing.assert_array_equal(z.numpy(), y.numpy())


def test_gradient_through_cl():
    _need("CL")
    a = rng.standard_normal(5).astype(np.float32)
    w = Tensor(a, requires_grad=True)
    (w.to("CL") * w.to("CL")).sum().backward()
    assert w.grad.device == "CPU"
    np.testing.assert_allclose(w.grad.numpy(), 2 * a, rtol=1e-6)


def test_spec_of_copy():
    from zeptograd.schedule.copy import tensor_device
    from zeptograd.uop.ops import UOp
    from zeptograd.uop.spec import SpecError, check_tensor_graph, spec_kernel

    x = Tensor([1.0, 2.0]).uop
    dev = UOp(Ops.DEVICE, arg="PYTHON")
    good = UOp(Ops.COPY, x.dtype, (x, dev))
    assert good.shape == (2,) and tensor_device(good) == "PYTHON" and tensor_device(x) == "CPU"
    check_tensor_graph(good.sink())
    with pytest.raises(SpecError, match="COPY of dtype dtypes.int moves a dtypes.float value"):
        check_tensor_graph(UOp(Ops.COPY, dtypes.int32, (x, dev)).sink())
    with pytest.raises(SpecError, match=r"COPY's sources are \(value, DEVICE\)"):
        check_tensor_graph(UOp(Ops.COPY, x.dtype, (x,)).sink())
    assert spec_kernel.rewrite(good) == "COPY is a tensor-graph op, left in a kernel"
