"""FUSE=0 (schedule/nofuse.py): every elementwise op and reduce its own kernel, the same values as the default
schedule; broadcast products (a matmul's, a conv's) stay inside their reduce."""

import os
import subprocess
import sys

import numpy as np
import pytest

from zeptograd import Context, Tensor
from zeptograd.engine import schedule_cache

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
rng = np.random.default_rng(0)
X = rng.standard_normal((32, 48)).astype(np.float32)
W = rng.standard_normal((48, 40)).astype(np.float32)
B = rng.standard_normal(40).astype(np.float32)
IMG = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
CW = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_layernorm(x):
    y = x - x.mean(-1, keepdims=True)
    return y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-5)


# (program, numpy reference, kernels under FUSE=0: the ops each kernel runs)
PROGRAMS = {
    # max, x - max, * log2(e), exp2, sum, / sum
    "softmax": (lambda t: t["x"].softmax(-1), lambda: np_softmax(X), 6),
    # the matmul's reduce (its product fused), + bias, relu as x < 0, where
    "matmul_bias_relu": (lambda t: (t["x"] @ t["w"] + t["b"]).relu(), lambda: np.maximum(X @ W + B, 0), 4),
    # sum, * 1/n, x - mean, y * y, sum, * 1/n, + eps, sqrt, reciprocal, y * rsqrt
    "layernorm": (lambda t: t["x"].layernorm(), lambda: np_layernorm(X), 10),
    # the reduce (its broadcast product fused) is computed by the output's kernel: one kernel, as by default
    "matmul": (lambda t: t["x"] @ t["w"], lambda: X @ W, 1),
    "conv2d": (lambda t: t["img"].conv2d(t["cw"], padding=1), lambda: _conv(IMG, CW), 1),
}


def _conv(x, w):
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))
    return np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)


def inputs() -> dict[str, Tensor]:
    """New buffers each call: a graph realized before would be reused, not scheduled again."""
    return {k: Tensor(v).realize() for k, v in {"x": X, "w": W, "b": B, "img": IMG, "cw": CW}.items()}


def kernels_and_value(program, fuse: int) -> tuple[int, np.ndarray]:
    with Context(FUSE=fuse):
        n = len(program(inputs()).schedule())
        return n, program(inputs()).numpy()


@pytest.mark.parametrize("name", PROGRAMS)
def test_nofuse_same_values_more_kernels(name):
    program, reference, unfused_kernels = PROGRAMS[name]
    n_default, default = kernels_and_value(program, 1)
    n_unfused, unfused = kernels_and_value(program, 0)
    assert n_unfused == unfused_kernels
    assert n_default <= n_unfused
    np.testing.assert_allclose(unfused, default, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(unfused, reference(), rtol=1e-4, atol=1e-4)


def test_nofuse_index_expressions_and_masks_stay_fused():
    """cumsum's shifted copies of a block (pads: gated loads, index expressions) and attention's causal mask are no
    kernels of their own."""
    n, out = kernels_and_value(lambda t: (t["x"][:, :16] * 2).cumsum(1), 0)
    assert n == 16  # x * 2, then each of the 15 adds of the block's 16 shifted copies; no pad
    np.testing.assert_allclose(out, np.cumsum(X[:, :16] * 2, 1), rtol=1e-4, atol=1e-4)
    q = Tensor(X.reshape(1, 2, 16, 48)).realize()
    with Context(FUSE=0):
        causal = len(q.scaled_dot_product_attention(q, q, is_causal=True).schedule())
        plain = len(q.scaled_dot_product_attention(q, q).schedule())
    assert causal == plain + 1  # the one extra kernel: qk + mask.where(0, -inf); the mask itself is fused


def test_schedule_cache_keys_on_fuse():
    """A FUSE=0 schedule of a graph equal to one scheduled with fusion (other buffers) is not the cached one, and
    the default schedule is not replaced by it."""
    program = PROGRAMS["softmax"][0]
    before = schedule_cache.Stats.hits
    with Context(SCHEDULE_CACHE=1):
        fused = [len(program(inputs()).schedule()) for _ in range(2)]
        with Context(FUSE=0):
            unfused = [len(program(inputs()).schedule()) for _ in range(2)]
        again = len(program(inputs()).schedule())
    assert fused[0] == fused[1] == again < unfused[0] == unfused[1] == 6
    assert schedule_cache.Stats.hits >= before + 3  # the second of each, and the last: templates were used


@pytest.mark.slow  # a fresh interpreter imports zeptograd: about a second
def test_fuse_from_the_environment():
    code = (
        "import numpy as np; from zeptograd import Tensor; "
        "x = Tensor(np.ones((8, 8), np.float32)).realize(); print(len(x.softmax(-1).schedule()))"
    )
    env = {**os.environ, "FUSE": "0", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "6"
