"""Which kernels split over the cores (renderer.MIN_THREAD_WORK): a split costs a pool handoff of tens of
microseconds, so the small kernels of a training step (a batchnorm's elementwise pieces over (64, 16, 8, 8), a
matmul of 256 rows) run on one core, and a kernel of a million iterations or more takes THREAD."""

from __future__ import annotations

from zeptograd import Tensor
from zeptograd.codegen.opt import OptOps
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.renderer import MIN_THREAD_WORK


def opts_of(t: Tensor, threads: int = 2) -> list:
    item = [it for it in t.schedule() if it.ast.op.name == "SINK"][-1]  # the product, after an operand's copy
    return hand_coded_optimizations(item.ast, 64, threads=threads)[1]


def threaded(opts: list) -> bool:
    return any(o.op in (OptOps.THREAD, OptOps.THREAD_INTERLEAVED) for o in opts)


def test_a_training_steps_small_kernels_run_on_one_core():
    assert MIN_THREAD_WORK >= 1 << 20
    assert not threaded(opts_of(Tensor.empty(64, 16, 8, 8).relu() * 2 + 1))  # 65,536 iterations (1 << 15 split it)
    assert not threaded(opts_of(Tensor.empty(64, 16, 8, 8).sum((0, 2, 3))))
    assert not threaded(opts_of(Tensor.empty(128, 256) @ Tensor.empty(256, 10)))  # 327,680 multiply-adds


def test_large_kernels_still_split():
    assert threaded(opts_of(Tensor.empty(2048, 1024) * 2 + 1))  # 2M iterations
    assert threaded(opts_of(Tensor.empty(512, 512) @ Tensor.empty(512, 512)))


def test_work_counts_each_reduce_in_its_own_loops():
    """A LayerNorm over (512, 64) (its mean and variance are row reduces, each 512*64 iterations, before the row's
    outputs) is ~100K iterations of work, not the product of all its loops, 512*64*64*64; its backward, with two
    row sums of the gradient, too."""
    x = Tensor.empty(512, 64)
    assert not threaded(opts_of(x.layernorm()))
    w = Tensor.empty(512, 64, requires_grad=True)
    w.layernorm().mul(Tensor.empty(512, 64)).sum().backward()
    assert w.grad is not None and not threaded(opts_of(w.grad))


def test_matmul_iterations_count_less_than_elementwise_ones():
    """a multiply-add on a register tile's operands is a vector lane of an FMA: 512x64 @ 64x64 (2M of them, ~25 us on
    one core) stays on one core, which 2M elementwise iterations do not (~200 us)"""
    assert not threaded(opts_of(Tensor.empty(512, 64) @ Tensor.empty(64, 64)))
    assert threaded(opts_of(Tensor.empty(2048, 1024) + 1))
    assert threaded(opts_of(Tensor.empty(1024, 1024) @ Tensor.empty(1024, 64)))  # 64M multiply-adds


def test_transcendentals_count_as_work():
    """exp over 512K floats (an exp2 per element) costs about as much as 1M elementwise iterations of x*2+1"""
    assert threaded(opts_of(Tensor.empty(1024, 512).exp()))
    assert not threaded(opts_of(Tensor.empty(1024, 512) * 2 + 1))
