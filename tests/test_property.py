"""Property-based tests: hypothesis draws small tensor programs and dtype x op cases and runs them on every
backend, unoptimized (NOOPT=1) too, against numpy in float64; gradients against torch in float64.

Two strategies share one harness (`Program`: a list of steps, each a numpy, a torch and a zeptograd form of the
same op, chosen from the current shape so every step is valid):
- `programs`: float32 programs of elementwise ops (unary, binary with broadcasting, where), reductions along an
  axis, movement ops (reshape, permute, flip, expand, pad, slices with negative steps), matmul, cumsum, cat and
  integer-tensor indexing;
- `dtype_cases`: one op (binary arithmetic, comparisons, where, casts, reductions) on a random dtype, with values
  over the dtype's whole range (integer wrap-around included).

CI runs a small derandomized budget. The long profile (its output goes in the closing note of a change that
touches codegen or a renderer):

    ZG_PROPERTY_EXAMPLES=10000 python -m pytest -q -p no:cacheprovider tests/test_property.py
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.backend.conftest import unavailable
from zeptograd import Context, Device, Tensor, dtypes

EXAMPLES = int(os.getenv("ZG_PROPERTY_EXAMPLES", "25"))
PROFILE = dict(
    max_examples=EXAMPLES,
    derandomize=EXAMPLES <= 100,  # CI: the same examples every run; a long profile explores
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
BACKENDS = [d for d in ("CPU", "CPU:C", "PYTHON", "CL", "CUDA") if unavailable(d) is None]


@dataclass(frozen=True)
class Step:
    """One op: its name and parameters (shown when a case fails), and the op in each library."""

    name: str
    np: Callable
    torch: Callable
    zg: Callable
    extra: tuple = ()  # extra float32 inputs this step reads (matmul's right operand, a binary op's other side)


@dataclass
class Program:
    inputs: list[np.ndarray]
    steps: list[Step] = field(default_factory=list)

    def __repr__(self):
        shapes = [x.shape for x in self.inputs]
        return f"Program(inputs={shapes}, steps={[s.name for s in self.steps]})"

    def run_numpy(self) -> np.ndarray:
        x = self.inputs[0].astype(np.float64)
        for s in self.steps:
            x = s.np(x, *[e.astype(np.float64) for e in s.extra])
        return np.asarray(x)

    def run_torch(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        leaves = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in self._all_inputs()]
        x, k = leaves[0], 1
        for s in self.steps:
            x = s.torch(x, *leaves[k : k + len(s.extra)])
            k += len(s.extra)
        return x, leaves

    def run_zeptograd(self, device: str, requires_grad: bool = False) -> tuple[Tensor, list[Tensor]]:
        leaves = [Tensor(x, device=device, requires_grad=requires_grad) for x in self._all_inputs()]
        x, k = leaves[0], 1
        for s in self.steps:
            x = s.zg(x, *leaves[k : k + len(s.extra)])
            k += len(s.extra)
        return x, leaves

    def _all_inputs(self) -> list[np.ndarray]:
        return [self.inputs[0]] + [e for s in self.steps for e in s.extra]


def floats(draw, shape) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    return np.random.default_rng(seed).uniform(-2, 2, size=shape).astype(np.float32)


# ----------------------------------------------------------------------------- the steps, by the current shape
UNARY = {
    "neg": (np.negative, lambda x: -x, lambda x: -x),
    "abs": (np.abs, torch.abs, lambda x: x.abs()),
    "relu": (lambda x: np.maximum(x, 0), torch.relu, lambda x: x.relu()),
    "exp_bounded": (
        lambda x: np.exp(np.tanh(x) * 3),
        lambda x: torch.exp(torch.tanh(x) * 3),
        lambda x: (x.tanh() * 3).exp(),
    ),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), torch.sigmoid, lambda x: x.sigmoid()),
    "sqrt_soft": (lambda x: np.sqrt(x * x + 1), lambda x: torch.sqrt(x * x + 1), lambda x: (x * x + 1).sqrt()),
    "recip_soft": (lambda x: 1 / (x * x + 0.5), lambda x: 1 / (x * x + 0.5), lambda x: (x * x + 0.5).reciprocal()),
    "sin": (np.sin, torch.sin, lambda x: x.sin()),
    "log_soft": (lambda x: np.log(x * x + 1), lambda x: torch.log(x * x + 1), lambda x: (x * x + 1).log()),
}
BINARY = {
    "add": (np.add, torch.add, lambda a, b: a + b),
    "sub": (np.subtract, torch.sub, lambda a, b: a - b),
    "mul": (np.multiply, torch.mul, lambda a, b: a * b),
    "maximum": (np.maximum, torch.maximum, lambda a, b: a.maximum(b)),
    "div_soft": (lambda a, b: a / (b * b + 1), lambda a, b: a / (b * b + 1), lambda a, b: a / (b * b + 1)),
    "where": (
        lambda a, b: np.where(a > b, a, b * 2),
        lambda a, b: torch.where(a > b, a, b * 2),
        lambda a, b: (a > b).where(a, b * 2),
    ),
}


def broadcast_partner(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against `shape` to `shape`: some dims set to 1, maybe fewer leading dims."""
    drop = draw(st.integers(0, len(shape)))
    return tuple(1 if draw(st.booleans()) else d for d in shape[drop:])


def unary_step(draw, shape):
    name = draw(st.sampled_from(sorted(UNARY)))
    return Step(name, *UNARY[name]), shape


def binary_step(draw, shape):
    name = draw(st.sampled_from(sorted(BINARY)))
    other = floats(draw, broadcast_partner(draw, shape))
    return Step(f"{name}{other.shape}", *BINARY[name], extra=(other,)), shape


def scalar_step(draw, shape):
    c = draw(st.sampled_from([-1.5, -0.0, 0.5, 2.0, 3.25]))
    op = draw(st.sampled_from(["add", "mul", "rsub"]))
    fn = {"add": lambda x: x + c, "mul": lambda x: x * c, "rsub": lambda x: c - x}[op]
    return Step(f"{op}_const({c})", fn, fn, fn), shape


def reduce_step(draw, shape):
    if not shape or 0 in shape:
        return None
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    keep = draw(st.booleans())
    op = draw(st.sampled_from(["sum", "max", "mean", "min"]))
    np_fn = {"sum": np.sum, "max": np.max, "mean": np.mean, "min": np.min}[op]

    def torch_fn(x):
        if op in ("max", "min"):
            return getattr(torch, "amax" if op == "max" else "amin")(x, dim=axis, keepdim=keep)
        return getattr(torch, op)(x, dim=axis, keepdim=keep)

    out = list(shape)
    out[axis] = 1
    new = tuple(out) if keep else tuple(d for i, d in enumerate(shape) if i != axis % len(shape))
    return Step(
        f"{op}(axis={axis}, keepdim={keep})",
        lambda x: np_fn(x, axis=axis, keepdims=keep),
        torch_fn,
        lambda x: getattr(x, op)(axis=axis, keepdim=keep),
    ), new


def permute_step(draw, shape):
    if len(shape) < 2:
        return None
    order = tuple(draw(st.permutations(range(len(shape)))))
    return Step(
        f"permute{order}", lambda x: np.transpose(x, order), lambda x: x.permute(order), lambda x: x.permute(order)
    ), tuple(shape[i] for i in order)


def flip_step(draw, shape):
    if not shape:
        return None
    axis = draw(st.integers(0, len(shape) - 1))
    return Step(f"flip({axis})", lambda x: np.flip(x, axis), lambda x: x.flip(axis), lambda x: x.flip(axis)), shape


def reshape_step(draw, shape):
    n = int(np.prod(shape))
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    a = draw(st.sampled_from(divisors))
    new = draw(st.sampled_from([(n,), (a, n // a), (n // a, 1, a)]))
    return Step(f"reshape{new}", lambda x: x.reshape(new), lambda x: x.reshape(new), lambda x: x.reshape(new)), new


def expand_step(draw, shape):
    if len(shape) >= 4:
        return None
    k = draw(st.integers(1, 3))
    new = (k, *shape)
    return Step(
        f"expand{new}",
        lambda x: np.broadcast_to(x[None], new),
        lambda x: x[None].expand(new),
        lambda x: x.reshape((1, *shape)).expand(new),
    ), new


def pad_step(draw, shape):
    if not shape:
        return None
    pads = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape]
    flat = tuple(p for pair in reversed(pads) for p in pair)  # torch's order: last dim first
    return Step(
        f"pad({pads})",
        lambda x: np.pad(x, pads),
        lambda x: torch.nn.functional.pad(x, flat),
        lambda x: x.pad(tuple(pads)),
    ), tuple(d + a + b for d, (a, b) in zip(shape, pads))


def slice_step(draw, shape):
    """Basic slices, negative steps included (torch has none: its form flips, then slices with a positive step)."""
    if not shape:
        return None
    slices, torch_forms, out = [], [], []
    for d in shape:
        step = draw(st.sampled_from([1, 2, -1, -2]))
        idx = list(range(d))[slice(draw(st.integers(-d, d)), draw(st.integers(-d, d)), step)] or None
        if idx is None:  # keep the program non-empty: the whole axis
            step, idx = 1, list(range(d))
        start, stop = idx[0], idx[-1] + (1 if step > 0 else -1)
        sl = slice(start, stop if stop >= 0 else None, step)
        slices.append(sl)
        torch_forms.append(idx)
        out.append(len(idx))
    sl_t = tuple(slices)

    def torch_fn(x):
        for axis, idx in enumerate(torch_forms):
            x = x.index_select(axis, torch.tensor(idx))
        return x

    return Step(f"slice{sl_t}", lambda x: x[sl_t], torch_fn, lambda x: x[sl_t]), tuple(out)


def matmul_step(draw, shape):
    if not shape or len(shape) > 3 or 0 in shape:
        return None
    k = draw(st.integers(1, 4))
    w = floats(draw, (shape[-1], k))
    return Step(f"matmul({w.shape})", np.matmul, torch.matmul, lambda a, b: a @ b, extra=(w,)), (*shape[:-1], k)


def cumsum_step(draw, shape):
    if not shape:
        return None
    axis = draw(st.integers(0, len(shape) - 1))
    return Step(
        f"cumsum({axis})", lambda x: np.cumsum(x, axis), lambda x: torch.cumsum(x, axis), lambda x: x.cumsum(axis)
    ), shape


def cat_step(draw, shape):
    if not shape:
        return None
    axis = draw(st.integers(0, len(shape) - 1))
    new = tuple(d * 2 if i == axis else d for i, d in enumerate(shape))
    return Step(
        f"cat(x, 2x, {axis})",
        lambda x: np.concatenate([x, 2 * x], axis),
        lambda x: torch.cat([x, 2 * x], axis),
        lambda x: x.cat(2 * x, dim=axis),
    ), new


def index_step(draw, shape):
    """x[idx] with an integer index array (repeats and negatives allowed) along the first axis."""
    if not shape or shape[0] == 0:
        return None
    n = draw(st.integers(1, 4))
    idx = np.array([draw(st.integers(-shape[0], shape[0] - 1)) for _ in range(n)], dtype=np.int32)
    return Step(
        f"index({idx.tolist()})",
        lambda x: x[idx],
        lambda x: x[torch.tensor(idx, dtype=torch.long)],
        lambda x: x[Tensor(idx, device=x.device)],
    ), (n, *shape[1:])


STEPS = [unary_step, binary_step, scalar_step, reduce_step, permute_step, flip_step, reshape_step, expand_step]
STEPS += [pad_step, slice_step, matmul_step, cumsum_step, cat_step, index_step]


@st.composite
def programs(draw) -> Program:
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    prog = Program([floats(draw, shape)])
    for _ in range(draw(st.integers(1, 6))):
        made = draw(st.sampled_from(STEPS))(draw, shape)
        if made is None or int(np.prod(made[1])) > 400:
            continue
        step, shape = made
        prog.steps.append(step)
    return prog


def close(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 3e-4):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * scale, err_msg=what)


@pytest.mark.skipif(not BACKENDS, reason="no backend")
@settings(**PROFILE)
@given(programs())
def test_programs_on_every_backend_match_numpy(prog: Program):
    want = prog.run_numpy()
    for device in BACKENDS:
        for noopt in (0, 1):
            with Context(NOOPT=noopt):
                got = prog.run_zeptograd(device)[0].numpy()
            close(got, want, f"{prog} on {device} NOOPT={noopt}")


@settings(**PROFILE)
@given(programs(), st.integers(0, 2**32 - 1))
def test_program_gradients_match_torch(prog: Program, seed: int):
    out_t, leaves_t = prog.run_torch()
    weights = np.random.default_rng(seed).uniform(-1, 1, size=tuple(out_t.shape)).astype(np.float32)
    (out_t * torch.tensor(weights, dtype=torch.float64)).sum().backward()
    out, leaves = prog.run_zeptograd(Device.DEFAULT, requires_grad=True)  # DEV=CUDA checks a GPU's gradients
    (out * Tensor(weights)).sum().backward()
    for i, (lz, lt) in enumerate(zip(leaves, leaves_t)):
        want = lt.grad.numpy() if lt.grad is not None else np.zeros(lt.shape)
        got = lz.grad.numpy() if lz.grad is not None else np.zeros(lz.shape)
        close(got, want, f"{prog}: d/d input {i}", rtol=1e-3)


# ----------------------------------------------------------------------------- dtype x op x backend
DTYPES = {
    "bool": (dtypes.bool, np.bool_),
    "int8": (dtypes.int8, np.int8),
    "uint8": (dtypes.uint8, np.uint8),
    "int16": (dtypes.int16, np.int16),
    "int32": (dtypes.int32, np.int32),
    "int64": (dtypes.int64, np.int64),
    "float16": (dtypes.float16, np.float16),
    "float32": (dtypes.float32, np.float32),
    "float64": (dtypes.float64, np.float64),
}
INT_OPS = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "maximum": (np.maximum, lambda a, b: a.maximum(b)),
    "minimum": (np.minimum, lambda a, b: a.minimum(b)),
    "lt": (lambda a, b: a < b, lambda a, b: a < b),
    "eq": (lambda a, b: a == b, lambda a, b: a == b),
    "where": (lambda a, b: np.where(a > b, a, b), lambda a, b: (a > b).where(a, b)),
    "xor": (lambda a, b: a ^ b, lambda a, b: a ^ b),
}
FLOAT_OPS = {k: v for k, v in INT_OPS.items() if k != "xor"} | {
    "div": (lambda a, b: a / b, lambda a, b: a / b),
}
BOOL_OPS = {k: INT_OPS[k] for k in ("maximum", "minimum", "eq", "where", "xor")}


def dtype_values(draw, np_dt, n: int) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if np_dt == np.bool_:
        return rng.random(n) > 0.5
    if np.issubdtype(np_dt, np.integer):
        info = np.iinfo(np_dt)
        edges = np.array([info.min, info.max, 0, -1 if info.min < 0 else 1, 1], dtype=np_dt)
        vals = rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np_dt)
        return np.concatenate([edges, vals])[:n] if draw(st.booleans()) else vals
    specials = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 65504.0, 1e-8], dtype=np_dt)
    vals = (rng.standard_normal(n) * 10 ** rng.uniform(-3, 3, n)).astype(np_dt)
    return np.concatenate([specials, vals])[:n] if draw(st.booleans()) else vals


def cast_safe(a: np.ndarray, to: str) -> np.ndarray:
    """Float values a float -> integer cast is defined for (C, numpy and torch leave the others undefined):
    truncated into the target's range and below 2**24 in magnitude, NaN as 0, checked again after rounding to
    a's own dtype (float16 rounds int16's 32767 up to 32768, out of range)."""
    to_np = DTYPES[to][1]
    if a.dtype.kind != "f" or not np.issubdtype(to_np, np.integer):
        return a
    info = np.iinfo(to_np)
    with np.errstate(all="ignore"):
        wide = np.nan_to_num(np.clip(np.trunc(a.astype(np.float64)), info.min, info.max), nan=0.0)
        back = wide.astype(a.dtype).astype(np.float64)
    return np.where((np.abs(back) < 2**24) & (back >= info.min) & (back <= info.max), back, 0).astype(a.dtype)


@st.composite
def dtype_cases(draw):
    name = draw(st.sampled_from(sorted(DTYPES)))
    np_dt = DTYPES[name][1]
    ops = BOOL_OPS if name == "bool" else FLOAT_OPS if name.startswith("float") else INT_OPS
    op = draw(st.sampled_from(sorted(ops) + ["sum", "max", "cast"]))
    a, b = dtype_values(draw, np_dt, 12), dtype_values(draw, np_dt, 12)
    to = draw(st.sampled_from(sorted(DTYPES))) if op == "cast" else None
    if to is not None:
        a = cast_safe(a, to).astype(np_dt)
    return name, op, a, b, to


def dtype_reference(name: str, op: str, a: np.ndarray, b: np.ndarray, to: str | None) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op == "sum":  # torch's accumulation: ints and bools to int64, floats in float32 or wider
            if a.dtype.kind == "f":
                return np.array(a.astype(np.float64).sum()).astype(a.dtype)
            return np.array(a.astype(np.int64).sum(dtype=np.int64))
        if op == "max":
            return np.array(a.max())
        if op == "cast":
            return a.astype(DTYPES[to][1])
        return np.asarray((INT_OPS.get(op) or FLOAT_OPS[op])[0](a, b))


def dtype_zeptograd(op: str, a: np.ndarray, b: np.ndarray, to: str | None, device: str) -> Tensor:
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    if op in ("sum", "max"):
        return getattr(ta, op)()
    if op == "cast":
        return ta.cast(DTYPES[to][0])
    return (INT_OPS.get(op) or FLOAT_OPS[op])[1](ta, tb)


@pytest.mark.skipif(not BACKENDS, reason="no backend")
@settings(**(PROFILE | dict(max_examples=EXAMPLES * 4)))
@given(dtype_cases())
def test_dtypes_ops_backends_match_numpy(case):
    name, op, a, b, to = case
    want = dtype_reference(name, op, a, b, to)
    for device in BACKENDS:
        got = dtype_zeptograd(op, a, b, to, device).numpy()
        what = f"{name} {op}{'->' + to if to else ''} on {device}: a={a.tolist()} b={b.tolist()}"
        assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.dtype} != {want.dtype}"
        if want.dtype.kind != "f":
            np.testing.assert_array_equal(got, want, err_msg=what)
            continue
        rtol = 2e-3 if want.dtype == np.float16 else 1e-6
        atol = rtol * float(np.nansum(np.abs(a.astype(np.float64)))) if op == "sum" else 0.0
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, err_msg=what)
