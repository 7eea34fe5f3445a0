"""The epilogue after a register tile of a matmul (bias, relu, residual add, gelu) runs on the tile's vectors.

x @ w is vectorized along its output columns: its accumulators are vectors of outputs and the epilogue was always
vector. x @ w.T (nn.Linear) is vectorized along the reduce: each accumulator is one output's partial sums, whose lanes
are folded after the loop; the expander (codegen/expander.py: `_fold_lanes_packed`) folds the tile's accumulators
together, so the tile's outputs are one vector, a lane per output, and the epilogue's ALU ops, its reads (gathered
into those lanes) and its stores (rows of the tile's contiguous columns) are vector-wide. Before, each output was
folded on its own and the epilogue ran on scalars (gelu's polynomial once per output: 3x the kernel's time).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from zeptograd import Context, Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.renderer.cstyle import CStyleRenderer
from zeptograd.renderer.llvmir import LLVMRenderer

rng = np.random.default_rng(0)
N = 128  # a tile's rows and columns divide it: no tail loop


def inputs(n: int = N, m: int | None = None) -> dict[str, np.ndarray]:
    """x (m, n), w (n, n), r (m, n), b (n,)"""
    m = n if m is None else m
    return {
        "x": rng.standard_normal((m, n), dtype=np.float32),
        "w": rng.standard_normal((n, n), dtype=np.float32),
        "r": rng.standard_normal((m, n), dtype=np.float32),
        "b": rng.standard_normal((n,), dtype=np.float32),
    }


PROGRAMS = {  # the zeptograd expression, and torch's
    "x @ w + b": (lambda x, w, r, b: x @ w + b, lambda x, w, r, b: x @ w + b),
    "x @ w + r": (lambda x, w, r, b: x @ w + r, lambda x, w, r, b: x @ w + r),
    "(x @ w + b).relu()": (lambda x, w, r, b: (x @ w + b).relu(), lambda x, w, r, b: (x @ w + b).relu()),
    "x @ w.T + b": (lambda x, w, r, b: x @ w.T + b, lambda x, w, r, b: x @ w.T + b),
    "x @ w.T + r": (lambda x, w, r, b: x @ w.T + r, lambda x, w, r, b: x @ w.T + r),
    "(x @ w.T + b).relu()": (lambda x, w, r, b: (x @ w.T + b).relu(), lambda x, w, r, b: (x @ w.T + b).relu()),
    "(x @ w.T + r).gelu()": (
        lambda x, w, r, b: (x @ w.T + r).gelu(),
        lambda x, w, r, b: torch.nn.functional.gelu(x @ w.T + r, approximate="tanh"),
    ),
    "(x @ w.T).max(1)": (lambda x, w, r, b: (x @ w.T).max(1), lambda x, w, r, b: (x @ w.T).max(1).values),
    # a residual read through a pad: gated along the tile's rows (a vector load per row, its gate the row's) and
    # along its columns (a load per output)
    "x @ w.T + r[1:] padded rows": (
        lambda x, w, r, b: x @ w.T + r[1:].pad(((0, 1), (0, 0))),
        lambda x, w, r, b: x @ w.T + torch.nn.functional.pad(r[1:], (0, 0, 0, 1)),
    ),
    "x @ w.T + r[:, 1:] padded columns": (
        lambda x, w, r, b: x @ w.T + r[:, 1:].pad(((0, 0), (1, 0))),
        lambda x, w, r, b: x @ w.T + torch.nn.functional.pad(r[:, 1:], (1, 0)),
    ),
}


def rendered(expr: str, renderer, simd_bytes: int, shape: tuple[int, int] = (N, N)) -> str:
    """The one kernel of expr (x of shape `shape`), optimized by the CPU heuristic for simd_bytes-wide vectors on one
    core, rendered."""
    t = {k: Tensor(v) for k, v in inputs(shape[1], shape[0]).items()}
    (item,) = PROGRAMS[expr][0](**t).schedule()
    _, opts = hand_coded_optimizations(item.ast, simd_bytes, threads=1)
    uops, _ = full_rewrite(item.ast, renderer, opts)
    return renderer.render(kernel_name(item.ast), uops).src


def llvm_epilogue(expr: str, simd_bytes: int, shape: tuple[int, int] = (N, N)) -> str:
    """The LLVM IR after the reduce loop's last multiply-add: the fold of the accumulators and the epilogue."""
    src = rendered(expr, LLVMRenderer(simd_bytes=simd_bytes), simd_bytes, shape)
    return src[src.rindex("@llvm.fma") :]


@pytest.mark.parametrize("expr", ["x @ w.T + b", "x @ w.T + r", "(x @ w.T + b).relu()"])
@pytest.mark.parametrize("simd_bytes, lanes", [(32, 8), (64, 16)])
def test_dot_product_tile_epilogue_is_vector_llvm(expr, simd_bytes, lanes):
    # AVX2: a 4 x 2 tile of 8-lane dot products -> one 8-lane vector; AVX-512: 8 x 2 of 16 lanes -> one of 16
    epilogue = llvm_epilogue(expr, simd_bytes)
    assert f"fadd <{lanes} x float>" in epilogue  # the bias / residual add, on the tile's outputs at once
    assert "fadd float" not in epilogue and "store float" not in epilogue  # no lane's math or store on its own
    assert epilogue.count("store <2 x float>") == lanes // 2  # each row's 2 columns stored as one vector
    if "relu" in expr:
        assert f"select <{lanes} x i1>" in epilogue
    # the bias and the residual read as a vector per row of the tile (b: one, every row reads the same columns)
    src = rendered(expr, LLVMRenderer(simd_bytes=simd_bytes), simd_bytes)
    assert "load float" not in src and src.count("load <2 x float>") == (lanes // 2 if "+ r" in expr else 1)


@pytest.mark.parametrize("expr", ["x @ w + b", "x @ w + r", "(x @ w + b).relu()"])
def test_output_vectorized_matmul_epilogue_is_vector_llvm(expr):
    # x @ w's accumulators are vectors of outputs already: the epilogue on them, 8-lane stores (AVX2)
    epilogue = llvm_epilogue(expr, 32)
    assert "fadd <8 x float>" in epilogue and "store <8 x float>" in epilogue
    assert "fadd float" not in epilogue and "store float" not in epilogue


@pytest.mark.parametrize("expr", ["x @ w.T + b", "x @ w.T + r"])
def test_dot_product_tile_epilogue_is_vector_c(expr):
    src = rendered(expr, CStyleRenderer(), 32)
    epilogue = src[src.rindex("for (") :]
    epilogue = epilogue[epilogue.index("\n      }") :]  # after the reduce loop
    assert re.search(r"zg_floatx8 alu\d+ = \(alu\d+\+(vec|val)\d+\);", epilogue)  # the add on the 8 outputs at once
    assert epilogue.count("zg_floatx2 t_ = ") == 4 and "float alu" not in epilogue


def test_gelu_epilogue_transcendental_is_vector():
    # gelu's tanh (an exp2 polynomial) on the tile's 8 outputs at once, not once per output. (With 8 x 16 outputs the
    # scheduler's cost model keeps gelu in the matmul's kernel; at 128 x 128 it is a kernel of its own:
    # schedule/cost.py, split_epilogue_is_cheaper)
    epilogue = llvm_epilogue("(x @ w.T + r).gelu()", 32, (8, 16))
    assert "fmul <8 x float>" in epilogue and "fmul float" not in epilogue and "fadd float" not in epilogue


@pytest.mark.parametrize("expr", list(PROGRAMS))
@pytest.mark.parametrize("device", ["CPU", "CPU:C"])
@pytest.mark.parametrize("n", [N, 37])
def test_epilogue_values(expr, device, n):
    data = inputs(n)
    ref = PROGRAMS[expr][1](**{k: torch.from_numpy(v) for k, v in data.items()}).numpy()
    for noopt in (0, 1):
        with Context(NOOPT=noopt):
            got = PROGRAMS[expr][0](**{k: Tensor(v, device=device) for k, v in data.items()}).numpy()
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4, err_msg=f"NOOPT={noopt}")


def _evaluate(u):
    """A vector graph of CONST, VECTORIZE, GEP and ADD evaluated to Python lists (a lane-exact check of the fold)."""
    from zeptograd.uop.ops import Ops

    done: dict = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            done[n] = n.arg
        elif n.op is Ops.VECTORIZE:
            done[n] = [done[s] for s in n.src]
        elif n.op is Ops.GEP:
            v = done[n.src[0]]
            done[n] = v[n.arg[0]] if len(n.arg) == 1 else [v[i] for i in n.arg]
        elif n.op is Ops.ADD:
            a, b = (done[s] for s in n.src)
            done[n] = [x + y for x, y in zip(a, b)] if isinstance(a, list) else a + b
        else:
            raise AssertionError(f"unexpected {n.op}")
    return done[u]


@pytest.mark.parametrize("width, n", [(w, n) for w in (2, 4, 8, 16) for n in (2, 4, 8, 16) if n <= w])
@pytest.mark.parametrize("block", [1, 2, 4, 8])
def test_packed_fold_gives_each_accumulator_its_lane(width, n, block):
    from zeptograd.codegen.expander import _fold_lanes_packed
    from zeptograd.dtype import dtypes
    from zeptograd.uop.ops import Ops, UOp

    values = [[float(100 * src + lane) for lane in range(width)] for src in range(n)]
    xs = [UOp(Ops.VECTORIZE, dtypes.float32.vec(width), tuple(UOp.const(dtypes.float32, x) for x in v)) for v in values]
    folded = _fold_lanes_packed(xs, width, Ops.ADD, block)
    assert folded.dtype.count == n and _evaluate(folded) == [sum(v) for v in values]
