"""Variable: symbolic sizes in shapes; one schedule and one compiled kernel for every value (uop/variable.py)."""

import os

import numpy as np
import pytest

from zeptograd import Device, Tensor, TinyJit, Variable
from zeptograd.engine import kernels, realize
from zeptograd.engine.jit import JitError
from zeptograd.uop.ops import Ops

DEVICES = ["CPU", "CPU:C", "PYTHON", "CL"]  # CPU is LLVM; PYTHON is the reference; CL where pyopencl finds one


@pytest.fixture(
    params=[d for d in DEVICES if not os.getenv("ZG_TEST_DEVICES") or d in os.environ["ZG_TEST_DEVICES"].split(",")]
)
def device(request) -> str:
    try:
        Device[request.param]
    except Exception as e:  # no compiler, no llvmlite
        pytest.skip(f"{request.param} is not available: {e}")
    return request.param


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def data(*shape, device=None, seed=0):
    x = np.random.default_rng(seed).random(shape, dtype=np.float32)
    return Tensor(x, device=device), x


# ***** the Variable itself *****


def test_variable_bind_unbind():
    n = Variable("n", 1, 1024)
    assert n.op is Ops.DEFINE_VAR and n.arg == ("n", 1, 1024)
    vn = n.bind(10)
    assert vn.op is Ops.BIND and vn.src[0] is n
    assert vn.unbind() == (n, 10)
    assert Variable("n", 1, 1024).bind(10) is vn  # interned: equal bindings are one UOp
    assert (vn.vmin, vn.vmax) == (1, 1024)  # a kernel is valid for every value, not just the bound one
    assert repr(vn) == "n=10" and repr(n) == "n"


def test_shape_holds_the_bound_variable():
    a, _ = data(3, 10)
    vi = Variable("i", 1, 10).bind(4)
    x = a.shrink(((0, 3), (0, vi)))
    assert x.shape == (3, vi) and x.shape[1] is vi
    assert repr(x.shape) == "(3, i=4)" and "(3, i=4)" in repr(x)
    assert a.shrink(((0, 3), (vi, vi + 2))).shape == (3, 2)  # (i+2) - i simplifies to an int
    assert x.sum(1).shape == (3,)
    v2 = Variable("i", 1, 10).bind(4)
    assert a.shrink(((0, 3), (0, v2))).shape == x.shape  # equal shapes compare equal


# ***** values against numpy, on each device *****


def test_shrink_sum(device):
    a, an = data(3, 10, device=device)
    for i in (4, 7):
        vi = Variable("i", 1, 10).bind(i)
        close(a.shrink(((0, 3), (0, vi))).sum(1).numpy(), an[:, :i].sum(1))
        close(a.shrink(((0, 3), (vi, vi + 2))).numpy(), an[:, i : i + 2])


def test_reduces_over_a_symbolic_axis(device):
    a, an = data(3, 10, device=device)
    for i in (3, 8):
        vi = Variable("i", 1, 10).bind(i)
        x = a.shrink(((0, 3), (0, vi)))
        close(x.mean(1).numpy(), an[:, :i].mean(1))
        close(x.max(1).numpy(), an[:, :i].max(1))
        close(x.sum().numpy(), an[:, :i].sum())
        close(x.mean().numpy(), an[:, :i].mean())
        close(x.var(1).numpy(), an[:, :i].var(1, ddof=1))


def test_reshape_to_and_from_symbolic(device):
    for i in (2, 5):
        vi = Variable("i", 1, 10).bind(i)
        a, an = data(3, i, device=device, seed=i)
        s = (a.reshape(3, vi) + 1).realize()
        assert s.shape == (3, vi)
        close(s.numpy(), an + 1)  # a symbolic shape reads at its values
        close(s.reshape(3, i).numpy(), an + 1)
        close(a.reshape(vi, 3).reshape(-1).numpy(), an.reshape(-1))
        t = Tensor.ones(i, device=device)
        assert t.reshape(vi).sum().item() == i


def test_elementwise(device):
    a, an = data(3, 10, device=device)
    b, bn = data(3, 10, device=device, seed=1)
    for i in (2, 9):
        vi = Variable("i", 1, 10).bind(i)
        x, y = a.shrink(((0, 3), (0, vi))), b.shrink(((0, 3), (0, vi)))
        close((x * y + 1).numpy(), an[:, :i] * bn[:, :i] + 1)
        close((x + vi).numpy(), an[:, :i] + i)  # a bound Variable as a scalar operand
        close((x / (vi * 2)).numpy(), an[:, :i] / (2 * i))
        assert Tensor(vi, device=device).item() == i
        assert Tensor.zeros(vi, 3, device=device).numpy().shape == (i, 3)
        z = (x.exp() - y).realize()
        close((z + x).numpy(), np.exp(an[:, :i]) - bn[:, :i] + an[:, :i])  # a realized symbolic tensor keeps its shape


@pytest.mark.slow
def test_cat_and_matmul_two_variables(device):
    for i, j in ((1, 3), (4, 2)):
        vi, vj = Variable("i", 1, 10).bind(i), Variable("j", 1, 10).bind(j)
        a, an = data(i, 3, device=device)
        b, bn = data(3, j, device=device, seed=1)
        close((a.reshape(vi, 3) @ b.reshape(3, vj) + 1).reshape(i, j).numpy(), an @ bn + 1)
        c, cn = data(j, 3, device=device, seed=2)
        close(a.reshape(vi, 3).cat(c.reshape(vj, 3)).reshape(i + j, 3).numpy(), np.concatenate([an, cn]))


def test_closed_form_reduce_over_a_symbolic_range(device):
    """a reduce whose gated body collapses to a count: the count uses the variable, not its largest value"""
    for i in (3, 7):
        vi = Variable("i", 1, 10).bind(i)
        assert Tensor.ones(5, device=device).pad(((0, 5),)).shrink(((0, vi),)).sum().item() == min(i, 5)
        x = Tensor.arange(10, device=device).float().contiguous().realize().shrink(((0, vi),))
        assert (Tensor.arange(10, device=device).shrink(((0, vi),)) == 5).where(x, 0).sum().item() == (
            5 if i > 5 else 0
        )


def test_zero_size(device):
    a, _ = data(3, 8, device=device)
    x = a.shrink(((0, 3), (0, Variable("n", 0, 8).bind(0))))
    assert x.numpy().shape == (3, 0)
    close(x.sum(1).numpy(), np.zeros(3))


def test_assign_into_a_symbolic_slice(device):
    """a KV cache: one row written at a bound position"""
    cache = Tensor.zeros(6, 4, device=device).contiguous().realize()
    for pos in range(3):
        vp = Variable("p", 0, 5).bind(pos)
        cache.shrink(((vp, vp + 1), None)).assign(Tensor.full((1, 4), pos + 1.0, device=device)).realize()
    want = np.zeros((6, 4), np.float32)
    want[:3] = np.arange(1, 4)[:, None]
    close(cache.numpy(), want)


def test_gradient_through_a_symbolic_shrink():
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    vi = Variable("i", 1, 4).bind(2)
    (a.shrink(((0, 3), (0, vi))) * 3).sum().backward()
    close(a.grad.numpy(), np.array([[3, 3, 0, 0]] * 3, np.float32))


# ***** one schedule, one compiled program for every value *****


def test_one_compile_for_two_values(device):
    a, an = data(3, 10, device=device)
    asts, programs = [], []
    for i in (3, 7):
        vi = Variable("i", 1, 10).bind(i)
        out = a.shrink(((0, 3), (0, vi))).sum(1)
        (item,) = out.schedule()
        asts.append(item.ast)
        before = set(kernels._kernel_cache)
        close(out.numpy(), an[:, :i].sum(1))
        programs.append(realize.get_kernel(item.device, item.ast))
        if i == 7:
            assert set(kernels._kernel_cache) == before  # nothing compiled for the second value
    assert asts[0] is asts[1]  # the kernel is keyed by the unbound variable
    assert programs[0] is programs[1] and programs[0].vars == ("i",)  # the value is the kernel's int argument
    assert any(u.op is Ops.DEFINE_VAR for u in asts[0].toposort())


def test_jit_replays_with_new_values(device):
    a, an = data(3, 10, device=device)
    runs = []

    @TinyJit
    def f(x):
        runs.append(1)
        return (x * 2).sum(1)

    for i in (2, 5, 9):
        vi = Variable("i", 1, 10).bind(i)
        compiled = set(kernels._kernel_cache)
        close(f(a.shrink(((0, 3), (0, vi)))).numpy(), an[:, :i].sum(1) * 2)
        if i != 2:
            assert set(kernels._kernel_cache) == compiled  # no compile for a new value
    assert len(runs) == 2  # the body runs twice (run, capture); the third call replays with i=9


def test_jit_bound_variable_argument_and_symbolic_output(device):
    a, an = data(3, 10, device=device)
    runs = []

    @TinyJit
    def f(x, v):
        runs.append(1)
        return x.shrink(((0, 3), (0, v))) + 1

    for i in (4, 6, 3, 10):
        vi = Variable("i", 1, 10).bind(i)
        out = f(a, vi)
        assert out.shape == (3, vi)  # bound to this call's value
        close(out.numpy(), an[:, :i] + 1)
    assert len(runs) == 2


def test_jit_kv_cache(device):
    cache = Tensor.zeros(6, 4, device=device).contiguous().realize()

    @TinyJit
    def step(row, p):
        cache.shrink(((p, p + 1), None)).assign(row).realize()
        return cache.shrink(((0, p + 1), None)).sum(0)

    for pos in range(4):
        out = step(Tensor.full((1, 4), pos + 1.0, device=device).contiguous(), Variable("p", 0, 5).bind(pos))
        close(out.numpy(), np.full(4, sum(range(1, pos + 2)), np.float32))


# ***** errors *****


def test_bind_errors():
    v = Variable("n", 1, 10)
    with pytest.raises(ValueError, match=r"'n' to 11: outside its range \[1, 10\]"):
        v.bind(11)
    with pytest.raises(ValueError, match=r"'n' to 0: outside its range \[1, 10\]"):
        v.bind(0)
    with pytest.raises(TypeError, match="only be bound to an int"):
        v.bind(2.5)
    with pytest.raises(ValueError, match="identifier"):
        Variable("not a name", 1, 10)
    with pytest.raises(ValueError, match="min=5, max=1"):
        Variable("n", 5, 1)
    with pytest.raises(ValueError, match="unbind"):
        v.unbind()


def test_shape_errors():
    a, _ = data(3, 10)
    vi = Variable("i", 1, 10).bind(4)
    with pytest.raises(ValueError, match=r"\(3, 5\) \(15 elements\) to \(3, i=4\) \(12 elements\)"):
        Tensor.rand(3, 5).reshape(3, vi)
    with pytest.raises(ValueError, match=r"do not broadcast.*symbolic size"):
        a.shrink(((0, 3), (0, vi))) + Tensor.rand(3, 4)
    with pytest.raises(ValueError, match=r"out of bounds .* is \(4, 12\) in a dimension of size 10"):
        a.shrink(((0, 3), (vi, vi + 8)))
    with pytest.raises(ValueError, match=r"\['j'\] are not bound"):
        a.reshape(3, Variable("j", 1, 10))
    with pytest.raises(ValueError, match="needs int sizes"):
        Tensor.rand(vi)
    with pytest.raises(ValueError, match="constant and non-negative"):
        a.shrink(((0, 3), (0, vi))).pad(((0, 0), (1, 1)), mode="reflect")


def test_conflicting_bindings():
    a, _ = data(3, 10)
    x4 = a.shrink(((0, 3), (0, Variable("i", 1, 10).bind(4)))).sum()
    x5 = a.shrink(((0, 3), (0, Variable("i", 1, 10).bind(5)))).sum()
    with pytest.raises(ValueError, match="'i' is bound to both 4 and 5"):
        (x4 + x5).realize()
    other = a.shrink(((0, 3), (0, Variable("i", 1, 20).bind(4)))).sum()
    with pytest.raises(ValueError, match="two different Variables are named 'i'"):
        (x4 + other).realize()


def test_jit_refuses_what_a_replay_could_not_check():
    a, _ = data(3, 10)

    @TinyJit
    def f(x, v):
        return x.shrink(((0, 3), (0, v))).sum(1)

    f(a, Variable("wide", 1, 20).bind(3))  # call 1 runs the body with its own value: in bounds
    with pytest.raises(ValueError, match="while TinyJit captures"):
        f(a, Variable("wide", 1, 20).bind(4))  # 20 > 10 columns: a replay could read past the buffer

    @TinyJit
    def g(x):
        return x.reshape(12) * 2

    b = Tensor.rand(3, 4).realize()
    vi = Variable("i", 1, 10).bind(4)
    g(b.reshape(3, vi).contiguous())
    with pytest.raises(ValueError, match="while TinyJit captures"):
        g(b.reshape(3, vi).contiguous())  # 3*i == 12 only for i=4

    @TinyJit
    def h(x):
        return x + 1

    h(a.shrink(((0, 3), (0, vi))))
    h(a.shrink(((0, 3), (0, vi))))
    with pytest.raises(JitError, match="captured"):
        h(a.shrink(((0, 2), (0, vi))))  # another structure, not just another value
