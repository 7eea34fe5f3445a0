"""The cliff finder: small programs of the kinds users write, each timed three ways, the worst ratios printed.

    python -m bench.cliffs                          # 100 programs, small and medium sizes (about 10 minutes on 2 cores)
    python -m bench.cliffs --count 500 --sizes small,medium,large --family attention --family norm
    python -m bench.cliffs --id prologue_matmul/medium/17     # one program again, by the id the table prints
    python -m bench.cliffs --quick --count 3        # tiny sizes, one run: checks the harness, times mean nothing

Every program is a Python expression over named random inputs (printed as it runs, with the inputs' shapes, so a
row of the table can be pasted into a test). The families: elementwise prologues with broadcast vectors before
`x @ w` and `x @ w.T`, matmul epilogues (bias, relu, gelu, residual), cat/pad/shrink of reduce results, reductions
along every axis after broadcasts, norms (layernorm, rmsnorm, batchnorm, softmax), attention, conv + batchnorm +
relu, gathers and embeddings, cumsum; each at small, medium and large sizes. A family enumerates all combinations of
its choices; each family's list is shuffled with a fixed seed and the families are interleaved, so `--count N` runs
the same N distinct programs on every run (and a smaller N runs a prefix of them).

Each program is timed as (a) the default schedule, (b) FUSE=0 (schedule/nofuse.py: every op its own kernel, the
no-fusion baseline) and (c) torch on the CPU with the same thread count. (a) and (b) are kernel time: the sum of the
schedule's kernels (GlobalCounters.time_sum_s), the median of runs after a first run that compiles, (a) and (b)
taking turns (interleaved_medians: a moment of load from another process lands on both); inputs are realized
before. (c) is the call's time (torch runs eagerly: its dispatch is part of it). Each system's measurement starts
after a pause (PEER_PAUSE_S): torch's worker threads spin for about 0.1 s after a call. The outputs of (a),
(b) and (c) are compared too: a program whose values differ is listed. Benchmarks are never tests: nothing asserts
a time; tests/test_bench.py runs the harness in --quick mode.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import statistics
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

if __package__ in (None, ""):  # `python bench/cliffs.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

SEED = 0
PEER_PAUSE_S = 0.25  # idle time before a system's measurement that follows another system's
MIN_ROUNDS, MAX_ROUNDS = 5, 40  # (a) and (b) take turns this many times (interleaved_medians)
SIZES = ("small", "medium", "large")
GOAL_VS_NOFUSE, GOAL_VS_TORCH = 1.05, 1.25  # issue 15's goals for a/b and a/c
MISMATCH_TOL = 2e-3  # max |difference| / max(1, max |torch's value|) above which a program is listed as wrong


# ***** programs *****


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[int, ...]
    kind: str = "randn"  # "randn": N(0, 1) float32; "pos": uniform [0.5, 1.5) float32; "idx": ints in [0, high)
    high: int = 0

    def describe(self) -> str:
        dims = ", ".join(map(str, self.shape)) + ("," if len(self.shape) == 1 else "")
        return (
            f"{self.name} ({dims})"
            + {"randn": "", "pos": " in [0.5, 1.5)", "idx": f" ints in [0, {self.high})"}[self.kind]
        )

    def data(self, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "idx":
            return rng.integers(0, self.high, self.shape, dtype=np.int32)
        if self.kind == "pos":
            return rng.uniform(0.5, 1.5, self.shape).astype(np.float32)
        return rng.standard_normal(self.shape, dtype=np.float32)


@dataclass(frozen=True)
class Program:
    id: str  # family/size/index: `--id` runs it again
    zg: str  # the zeptograd expression (Tensor methods on the inputs)
    torch: str  # the same program in torch (F is torch.nn.functional)
    inputs: tuple[Input, ...]

    @property
    def family(self) -> str:
        return self.id.split("/")[0]

    @property
    def size(self) -> str:
        return self.id.split("/")[1]

    def describe(self) -> str:
        return f"{self.zg}  with {', '.join(i.describe() for i in self.inputs)}"


class Ex:
    """An expression in zeptograd and in torch, built together."""

    def __init__(self, zg: str, th: str | None = None):
        self.zg, self.th = zg, zg if th is None else th

    def op(self, zg: str, th: str | None = None) -> Ex:
        """Apply a template: {} is this expression, parenthesized where the template's use of it needs that."""
        return Ex(_fill(zg, self.zg), _fill(zg if th is None else th, self.th))

    def bin(self, sym: str, other: Ex | str) -> Ex:
        o = other if isinstance(other, Ex) else Ex(other)
        return Ex(_binary(self.zg, sym, o.zg), _binary(self.th, sym, o.th))


PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "@": 2}


def _top_ops(s: str) -> list[str]:
    """The binary operators of s outside any bracket (written with a space either side)."""
    depth, ops = 0, []
    for i, ch in enumerate(s):
        depth += (ch in "([{") - (ch in ")]}")
        if depth == 0 and ch in PRECEDENCE and s[i - 1 : i] == " " and s[i + 1 : i + 2] == " ":
            ops.append(ch)
    return ops


def _left_needs_paren(left: str, sym: str) -> bool:
    """Python would read it right, but a reader should not need to: `(x * g) @ w`, `(x @ w) * 0.5`, `x @ w + c`."""
    return any(o != sym and PRECEDENCE[o] <= PRECEDENCE[sym] for o in _top_ops(left))


def _binary(left: str, sym: str, right: str) -> str:
    p = PRECEDENCE[sym]
    if _left_needs_paren(left, sym):
        left = f"({left})"
    if any(PRECEDENCE[o] <= p for o in _top_ops(right)) or right.startswith("-"):
        right = f"({right})"
    return f"{left} {sym} {right}"


def _fill(template: str, e: str) -> str:
    """template with e at each {}: in parentheses before a method call or an index if it has an operator outside
    brackets, on the left of a binary operator if that binds tighter, as it is inside a call's arguments."""
    parts = template.split("{}")
    if len(parts) > 2 and not e.isidentifier():  # used more than once: computed once, bound to a name
        name = next(n for n in ("y", "y2", "y3", "y4") if n not in e)
        return parts[0] + f"({name} := {e})" + parts[1] + "".join(name + after for after in parts[2:])
    out = parts[0]
    for after in parts[1:]:
        if after[:1] in (".", "["):
            out += f"({e})" if _top_ops(e) or e.startswith("-") else e
        elif after[:1] == " " and after[1:2] in PRECEDENCE:
            out += f"({e})" if _left_needs_paren(e, after[1]) else e
        else:
            out += e
        out += after
    return out


# elementwise ops appended to an expression: (zeptograd, torch)
RELU, GELU = ("{}.relu()", None), ("{}.gelu()", "F.gelu({}, approximate='tanh')")
LAYERNORM = ("{}.layernorm()", "F.layer_norm({}, {}.shape[-1:])")


def _ap(e: Ex, op: tuple[str, str | None]) -> Ex:
    return e.op(*op)


@dataclass
class Family:
    """Programs from every combination of `choices`; `build(dims, *choice)` makes one (None: not a valid mix)."""

    name: str
    sizes: dict[str, dict[str, int]]  # size name ("tiny" for --quick) -> dimension names -> values
    choices: list[list[Any]]
    build: Callable[..., tuple[Ex, list[Input]] | None]
    combos: list[tuple] = field(default_factory=list)

    def __post_init__(self):
        self.combos = [c for c in itertools.product(*self.choices) if self.build(self.sizes["tiny"], *c) is not None]

    def program(self, size: str, index: int) -> Program:
        ex, inputs = self.build(self.sizes[size], *self.combos[index])  # type: ignore[misc]
        return Program(f"{self.name}/{size}/{index}", ex.zg, ex.th, tuple(inputs))


def _vec(name: str, along: str, d: dict[str, int], kind: str = "randn") -> Input:
    """A broadcast vector: along K (the matmul's reduce axis, shape (K,)) or along M (a column, shape (M, 1))."""
    return Input(name, (d["K"],) if along == "K" else (d["M"], 1), kind)


PROLOGUES = {  # template over x and vectors g, b, mu, s; the vectors it uses
    "x*g": ("x * g", "g"),
    "x*g+b": ("x * g + b", "gb"),
    "x-mu": ("x - mu", "m"),
    "relu((x-mu)*2)": ("((x - mu) * 2).relu()", "m"),
    "(x-mu)*s": ("(x - mu) * s", "ms"),
    "relu(x*g+b)": ("(x * g + b).relu()", "gb"),
    "abs": ("x.abs()", ""),
    "exp": ("x.exp()", ""),
    "sigmoid": ("x.sigmoid()", ""),
}
VEC_NAMES = {"g": "g", "b": "b", "m": "mu", "s": "s"}


def build_prologue_matmul(d, prologue, along, transposed, epilogue):
    expr, vecs = PROLOGUES[prologue]
    if not vecs and along == "M":
        return None  # no vector: one variant
    inputs = [Input("x", (d["M"], d["K"]))]
    inputs += [_vec(VEC_NAMES[v], along, d, "pos" if v == "s" else "randn") for v in vecs]
    w = Input("w", (d["N"], d["K"]) if transposed else (d["K"], d["N"]))
    e = Ex(expr).bin("@", "w.T" if transposed else "w")
    inputs.append(w)
    if epilogue == "bias":
        e, inputs = e.bin("+", "c"), [*inputs, Input("c", (d["N"],))]
    elif epilogue == "relu":
        e = _ap(e, RELU)
    return e, inputs


MATMUL_SIZES = {
    "tiny": {"M": 8, "K": 16, "N": 8},
    "small": {"M": 128, "K": 128, "N": 128},
    "medium": {"M": 512, "K": 512, "N": 512},
    "large": {"M": 1024, "K": 1024, "N": 1024},
}

EPILOGUES = {  # (template, torch template or None, input it reads)
    "bias": ("{} + c", None, "c"),
    "relu": (*RELU, ""),
    "gelu": (*GELU, ""),
    "residual": ("{} + r", None, "r"),
    "scale": ("{} * 0.5", None, ""),
    "sigmoid": ("{}.sigmoid()", None, ""),
    "tanh": ("{}.tanh()", None, ""),
}


def build_matmul_epilogue(d, form, first, second):
    if first == second:
        return None
    m, k, n = d["M"], d["K"], d["N"]
    a = Input("x", (k, m) if form == "x.T@w" else (m, k))
    w = Input("w", (n, k) if form == "x@w.T" else (k, n))
    e = Ex({"x@w": "x @ w", "x@w.T": "x @ w.T", "x.T@w": "x.T @ w"}[form])
    inputs = [a, w]
    for ep in (first, second):
        if ep is None:
            continue
        zg, th, name = EPILOGUES[ep]
        e = e.op(zg, th)
        if name:
            inputs.append(Input(name, (n,) if name == "c" else (m, n)))
    return e, inputs


CAT_PARTS = {  # one reduce of input {i}: (template, its shape from (P, K, N))
    "sum": ("{i}.sum(1, keepdim=True)", None),
    "max": ("{i}.max(1, keepdim=True)", "{i}.amax(1, keepdim=True)"),
    "mean0": ("{i}.mean(0, keepdim=True)", None),
    "matmul": ("{i} @ w", None),
}


def build_cat_reduce(d, part, combine, parts, dim, relu):
    if combine != "cat" and (parts != 1 or dim != 0):
        return None  # pad and shrink: one reduce
    if combine == "cat" and parts == 1:
        return None
    rows = d["M"] // parts if (combine == "cat" and dim == 0 and part != "mean0") else d["M"]
    names = [f"a{i}" for i in range(parts)] if parts > 1 else ["x"]
    zg_t, th_t = CAT_PARTS[part]
    terms = [Ex(zg_t.format(i=n), (th_t or zg_t).format(i=n)) for n in names]
    inputs = [Input(n, (rows, d["K"])) for n in names] + ([Input("w", (d["K"], d["N"]))] if part == "matmul" else [])
    if combine == "cat":
        e = Ex(
            f"Tensor.cat({', '.join(t.zg for t in terms)}, dim={dim})",
            f"torch.cat([{', '.join(t.th for t in terms)}], dim={dim})",
        )
    elif combine == "pad":
        e = terms[0].op("{}.pad((1, 1, 2, 2)) + 1", "F.pad({}, (1, 1, 2, 2)) + 1")
    else:  # shrink: the middle of the reduce's result
        e = terms[0].op("{}[1:-1]" if part != "mean0" else "{}[:, 1:-1]")
    return (_ap(e, RELU) if relu else e), inputs


def build_reduce_bcast(d, rank, bcast, sym, unary, red, axis):
    shape = (d["A"], d["B"]) if rank == 2 else (d["A"], d["B"], d["C"])
    if bcast >= rank or (rank == 2 and axis not in (0, 1, None)) or (rank == 3 and axis in (None,)):
        return None
    if rank == 2 and bcast == -1:  # an outer product of two vectors
        inputs = [Input("u", (d["A"], 1)), Input("v", (d["B"],))]
        e = Ex("u").bin(sym, "v")
    elif bcast == -1:
        return None
    else:
        vshape = tuple(s if i == bcast else 1 for i, s in enumerate(shape))
        inputs = [Input("x", shape), Input("v", (shape[-1],) if bcast == rank - 1 else vshape)]
        e = Ex("x").bin(sym, "v")
    if unary:
        e = e.op(f"{{}}.{unary}()")
    ax = "" if axis is None else str(axis)
    if red == "max" and axis is not None:
        e = e.op(f"{{}}.max({ax})", f"{{}}.amax({ax})")
    else:
        e = e.op(f"{{}}.{red}({ax})")
    return e, inputs


NORMS = {  # (zeptograd, torch, the shape kind: "rows" (R, D) or "image" (N, C, H, W), extra inputs)
    "layernorm": (*LAYERNORM, "rows", ""),
    "layernorm_affine": ("{}.layernorm() * g + b", "F.layer_norm({}, {}.shape[-1:], g, b)", "rows", "gb"),
    "rmsnorm": ("{} * ({}.square().mean(-1, keepdim=True) + 1e-6).rsqrt() * g", None, "rows", "g"),
    "softmax": ("{}.softmax(-1)", None, "rows", ""),
    "log_softmax": ("{}.log_softmax(-1)", None, "rows", ""),
    "l2_normalize": ("{}.normalize(dim=-1)", "F.normalize({}, dim=-1)", "rows", ""),
    "batchnorm_train": (
        "({} - {}.mean((0, 2, 3), keepdim=True)) * ({}.var((0, 2, 3), keepdim=True, correction=0) + 1e-5).rsqrt()",
        "F.batch_norm({}, None, None, training=True)",
        "image",
        "",
    ),
    "batchnorm_eval": (
        "{}.batchnorm(g, b, mu, (var + 1e-5).rsqrt())",
        "F.batch_norm({}, mu, var, g, b)",
        "image",
        "gbmv",
    ),
}
NORM_AFTER = {"none": None, "relu": RELU, "gelu": GELU, "residual": ("{} + r", None), "matmul": ("{} @ w", None)}


def build_norm(d, norm, after):
    zg, th, kind, extra = NORMS[norm]
    shape = (d["R"], d["D"]) if kind == "rows" else (d["N"], d["C"], d["H"], d["H"])
    vec = (shape[-1],) if kind == "rows" else (shape[1],)
    inputs = [Input("x", shape)]
    inputs += [
        Input({"g": "g", "b": "b", "m": "mu", "v": "var"}[c], vec, "pos" if c == "v" else "randn") for c in extra
    ]
    e = Ex("x").op(zg, th)
    if after != "none":
        e = _ap(e, NORM_AFTER[after])
        if after == "residual":
            inputs.append(Input("r", shape))
        elif after == "matmul":
            inputs.append(Input("w", (shape[-1], shape[-1])))
    return e, inputs


def build_attention(d, impl, causal, cross, after):
    if impl == "explicit" and causal:
        return None
    b, h, n, hd = d["B"], d["H"], d["N"], d["d"]
    nk = n // 4 if cross else n
    inputs = [Input("q", (b, h, n, hd)), Input("k", (b, h, nk, hd)), Input("v", (b, h, nk, hd))]
    if impl == "sdpa":
        flag = ", is_causal=True" if causal else ""
        e = Ex(f"q.scaled_dot_product_attention(k, v{flag})", f"F.scaled_dot_product_attention(q, k, v{flag})")
    else:
        e = Ex(f"(q @ k.transpose(-2, -1) * {1 / math.sqrt(hd):.6g}).softmax(-1) @ v")
    if after == "residual":
        e = e.bin("+", "q")
    elif after == "proj":
        e = e.op(f"{{}}.transpose(1, 2).reshape({b}, {n}, {h * hd}) @ wo")
        inputs.append(Input("wo", (h * hd, h * hd)))
    return e, inputs


def build_conv_bn_relu(d, conv, bn, act, position):
    n, c, hw = d["N"], d["C"], d["H"]
    kk, pad, stride = {"3x3": (3, 1, 1), "1x1": (1, 0, 1), "3x3/2": (3, 1, 2)}[conv]
    if act == "residual" and (stride != 1 or position == "pre"):
        return None
    if act == "pool" and position == "pre":  # the pool ends a stem: no pre-activation form
        return None
    if position == "pre" and bn == "none" and act == "none":
        return None  # nothing before the conv: the "post" program
    s = f", stride={stride}" if stride != 1 else ""
    inputs = [Input("x", (n, c, hw, hw)), Input("w", (c, c, kk, kk))]
    conv_t = (f"{{}}.conv2d(w, padding={pad}{s})", f"F.conv2d({{}}, w, padding={pad}{s})")
    vec = (c,)
    if bn == "eval":
        bn_t: tuple[str, str | None] | None = (
            "{}.batchnorm(g, b, mu, (var + 1e-5).rsqrt())",
            "F.batch_norm({}, mu, var, g, b)",
        )
        inputs += [Input("g", vec), Input("b", vec), Input("mu", vec), Input("var", vec, "pos")]
    elif bn == "train":
        bn_t = NORMS["batchnorm_train"][:2]
    else:
        bn_t = None
    e = Ex("x")
    steps = [conv_t] + ([bn_t] if bn_t else []) + ([RELU] if act in ("relu", "residual", "pool") else [])
    if act == "pool":  # a ResNet stem: conv, batchnorm, relu, then a padded 3x3 max pool of stride 2
        steps.append(("{}.max_pool2d(3, stride=2, padding=1)", "F.max_pool2d({}, 3, stride=2, padding=1)"))
    if position == "pre":  # pre-activation: bn and relu, then the conv
        steps = steps[1:] + steps[:1]
    for st in steps:
        e = _ap(e, st)
    if act == "residual":
        e = e.bin("+", "x")
    return e, inputs


def build_gather(d, op, after):
    v, dm, b, t = d["V"], d["D"], d["B"], d["T"]
    idx = Input("idx", (b, t), "idx", v)
    w = Input("emb", (v, dm))
    if op == "embedding":
        e, inputs = Ex("emb[idx]"), [w, idx]
    elif op == "embedding+pos":
        e, inputs = Ex("emb[idx] + pos"), [w, idx, Input("pos", (t, dm))]
    elif op == "embedding_bag":
        e, inputs = Ex("emb[idx].sum(1)"), [w, idx]
    elif op == "embedding@w":
        e, inputs = Ex("emb[idx] @ w"), [w, idx, Input("w", (dm, dm))]
    elif op == "gather1":
        e, inputs = Ex("x.gather(1, idx)"), [Input("x", (b, v)), idx]
    elif op == "rows":
        e, inputs = Ex("emb[sel]"), [w, Input("sel", (b * t,), "idx", v)]
    else:  # gather0: along the first axis
        e, inputs = Ex("x.gather(0, idx)"), [Input("x", (v, t)), idx]
    if after == "relu":
        e = _ap(e, RELU)
    elif after == "layernorm":
        e = _ap(e, LAYERNORM)
    return e, inputs


def build_cumsum(d, prologue, axis, epilogue):
    inputs = [Input("x", (d["R"], d["L"]))]
    e = Ex("x") if prologue == "none" else Ex({"scale": "x * 2", "exp": "x.exp()", "abs": "x.abs()"}[prologue])
    e = e.op(f"{{}}.cumsum({axis})")
    if epilogue == "normalize":
        e = e.bin("/", f"x.abs().sum({axis}, keepdim=True)")
    elif epilogue == "relu":
        e = _ap(e, RELU)
    elif epilogue == "minus_x":
        e = e.bin("-", "x")
    return e, inputs


FAMILIES = [
    Family(
        "prologue_matmul",
        MATMUL_SIZES,
        [list(PROLOGUES), ["K", "M"], [False, True], ["none", "bias", "relu"]],
        build_prologue_matmul,
    ),
    Family(
        "matmul_epilogue",
        MATMUL_SIZES,
        [["x@w", "x@w.T", "x.T@w"], list(EPILOGUES), [None, *EPILOGUES]],
        build_matmul_epilogue,
    ),
    Family(
        "cat_reduce",
        {
            "tiny": {"M": 16, "K": 8, "N": 8},
            "small": {"M": 256, "K": 128, "N": 64},
            "medium": {"M": 512, "K": 512, "N": 64},
            "large": {"M": 2048, "K": 1024, "N": 256},
        },
        [list(CAT_PARTS), ["cat", "pad", "shrink"], [1, 2, 4, 8], [0, 1], [False, True]],
        build_cat_reduce,
    ),
    Family(
        "reduce_bcast",
        {
            "tiny": {"A": 8, "B": 12, "C": 4},
            "small": {"A": 256, "B": 256, "C": 16},
            "medium": {"A": 2048, "B": 1024, "C": 64},
            "large": {"A": 4096, "B": 4096, "C": 64},
        },
        [[2, 3], [-1, 0, 1, 2], ["+", "*"], [None, "exp", "abs"], ["sum", "max", "mean"], [0, 1, 2, None, (0, 2)]],
        build_reduce_bcast,
    ),
    Family(
        "norm",
        {
            "tiny": {"R": 8, "D": 16, "N": 2, "C": 4, "H": 4},
            "small": {"R": 256, "D": 256, "N": 4, "C": 16, "H": 16},
            "medium": {"R": 2048, "D": 1024, "N": 8, "C": 64, "H": 32},
            "large": {"R": 4096, "D": 4096, "N": 16, "C": 128, "H": 64},
        },
        [list(NORMS), list(NORM_AFTER)],
        build_norm,
    ),
    Family(
        "attention",
        {
            "tiny": {"B": 1, "H": 2, "N": 16, "d": 8},
            "small": {"B": 1, "H": 2, "N": 128, "d": 32},
            "medium": {"B": 1, "H": 4, "N": 512, "d": 64},
            "large": {"B": 1, "H": 8, "N": 1024, "d": 64},
        },
        [["sdpa", "explicit"], [False, True], [False, True], ["none", "residual", "proj"]],
        build_attention,
    ),
    Family(
        "conv_bn_relu",
        {
            "tiny": {"N": 1, "C": 4, "H": 6},
            "small": {"N": 2, "C": 16, "H": 16},
            "medium": {"N": 8, "C": 32, "H": 32},
            "large": {"N": 8, "C": 64, "H": 56},
        },
        [["3x3", "1x1", "3x3/2"], ["none", "eval", "train"], ["none", "relu", "residual", "pool"], ["post", "pre"]],
        build_conv_bn_relu,
    ),
    Family(
        "gather",
        {
            "tiny": {"V": 10, "D": 8, "B": 2, "T": 4},
            "small": {"V": 512, "D": 64, "B": 4, "T": 32},
            "medium": {"V": 4096, "D": 256, "B": 8, "T": 128},
            "large": {"V": 32768, "D": 512, "B": 16, "T": 256},
        },
        [
            ["embedding", "embedding+pos", "embedding_bag", "embedding@w", "gather1", "gather0", "rows"],
            ["none", "relu", "layernorm"],
        ],
        build_gather,
    ),
    Family(
        "cumsum",
        {
            "tiny": {"R": 4, "L": 16},
            "small": {"R": 64, "L": 256},
            "medium": {"R": 256, "L": 1024},
            "large": {"R": 1024, "L": 4096},
        },
        [["none", "scale", "exp", "abs"], [0, 1], ["none", "normalize", "relu", "minus_x"]],
        build_cumsum,
    ),
]
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


def total_programs(sizes=SIZES) -> int:
    return sum(len(f.combos) for f in FAMILIES) * len(sizes)


def generate(count: int, sizes=("small", "medium"), families: list[str] | None = None) -> list[Program]:
    """`count` distinct programs: each family's (combination, size) list shuffled with a fixed seed, the families
    interleaved (one program of each in turn), so every family is sampled and a smaller count is a prefix."""
    chosen = [FAMILY_BY_NAME[n] for n in families] if families else FAMILIES
    queues = []
    for fam in chosen:
        pairs = [(size, i) for i in range(len(fam.combos)) for size in sizes]
        random.Random(f"{SEED}:{fam.name}").shuffle(pairs)
        queues.append((fam, iter(pairs)))
    out: list[Program] = []
    while len(out) < count and queues:
        for fam, q in list(queues):
            pair = next(q, None)
            if pair is None:
                queues.remove((fam, q))
            elif len(out) < count:
                out.append(fam.program(*pair))
    return out


def program_by_id(pid: str) -> Program:
    try:
        fam, size, index = pid.split("/")
        return FAMILY_BY_NAME[fam].program(size, int(index))
    except (ValueError, KeyError, IndexError):
        raise SystemExit(f"unknown program id {pid!r}: family/size/index, e.g. prologue_matmul/medium/17") from None


# ***** timing *****


@dataclass
class Result:
    program: Program
    seconds: dict[str, float | None] = field(default_factory=dict)  # "default", "nofuse", "torch"
    kernels: dict[str, int] = field(default_factory=dict)  # "default", "nofuse"
    errors: dict[str, str] = field(default_factory=dict)
    mismatch: dict[str, float] = field(default_factory=dict)  # system -> max |difference| relative to torch's

    def ratio(self, a: str, b: str) -> float | None:
        x, y = self.seconds.get(a), self.seconds.get(b)
        return x / y if x and y else None


def median_of_runs(run: Callable[[], float], quick: bool, budget_s: float = 0.6, max_runs: int = 5) -> float:
    """The median of several runs' seconds (run returns them) after one run that is not counted (compiles)."""
    first = run()
    runs = 1 if quick else (1 if first > 2.0 else 3)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < (1 if quick else max_runs) and (len(times) < runs or time.perf_counter() - start < budget_s):
        times.append(run())
    return statistics.median(times)


def zeptograd_schedule(prog: Program, data: dict[str, np.ndarray], fuse: int) -> tuple[Callable[[], float], int, Any]:
    """(a call running the program's schedule under FUSE=fuse and returning its kernel seconds, its kernels, the
    program's value)."""
    from zeptograd import Context, GlobalCounters, Tensor
    from zeptograd.engine.realize import run_schedule

    def realized_inputs() -> dict[str, Any]:  # new buffers: a graph realized before would not be scheduled again
        return {k: Tensor(v).realize() for k, v in data.items()}

    with Context(FUSE=fuse):
        items = _eval(prog.zg, {"Tensor": Tensor, **realized_inputs()}).schedule()
        value = _eval(prog.zg, {"Tensor": Tensor, **realized_inputs()}).numpy()

    def run() -> float:
        t0 = GlobalCounters.time_sum_s
        run_schedule(items)
        return GlobalCounters.time_sum_s - t0

    return run, len(items), value


def interleaved_medians(runs: dict[str, Callable[[], float]], quick: bool, budget_s: float = 0.5) -> dict[str, float]:
    """The median of each system's run seconds, the systems taking turns: one round runs each system twice and
    keeps the second (its inputs warm in the cache, as when it runs alone), after one run each that compiles. Load
    from other processes comes and goes on a scale of the whole measurement: a system measured in its own window
    took it alone (at microsecond sizes one busy window made a/b 1.5x for the same kernels); taking turns, a busy
    moment lands on both systems alike. At least MIN_ROUNDS rounds, more while within the budget, at most
    MAX_ROUNDS; one round if a first run took over 2 s."""
    first = {name: run() for name, run in runs.items()}
    rounds = 1 if quick or max(first.values(), default=0.0) > 2.0 else MIN_ROUNDS
    times: dict[str, list[float]] = {name: [] for name in runs}
    start, done = time.perf_counter(), 0
    while done < (1 if quick else MAX_ROUNDS) and (done < rounds or time.perf_counter() - start < budget_s):
        for name, run in runs.items():
            if not quick:
                run()
            times[name].append(run())
        done += 1
    return {name: statistics.median(ts) for name, ts in times.items()}


def torch_run(prog: Program, data: dict[str, np.ndarray], quick: bool) -> tuple[float, Any]:
    import torch

    ns = {"torch": torch, "F": torch.nn.functional}
    ns.update({k: torch.from_numpy(v.astype(np.int64) if v.dtype == np.int32 else v) for k, v in data.items()})
    code = compile(prog.torch, prog.id, "eval")

    def run() -> float:
        t = time.perf_counter()
        eval(code, ns)  # noqa: S307 - the program's own expression
        return time.perf_counter() - t

    with torch.inference_mode():
        seconds = median_of_runs(run, quick)
        return seconds, eval(code, ns).numpy()  # noqa: S307


def _eval(expr: str, ns: dict[str, Any]):
    return eval(expr, ns)  # noqa: S307 - the program's own expression


def measure(prog: Program, quick: bool) -> Result:
    res = Result(prog)
    rng = np.random.default_rng([SEED, zlib.crc32(prog.id.encode())])
    data = {i.name: i.data(rng) for i in prog.inputs}
    values: dict[str, Any] = {}
    runs: dict[str, Callable[[], float]] = {}
    for system, fuse in (("default", 1), ("nofuse", 0)):
        try:
            runs[system], res.kernels[system], values[system] = zeptograd_schedule(prog, data, fuse)
        except Exception as e:  # a program that fails is a row of the report, not the end of the run
            res.seconds[system] = None
            res.errors[system] = _error(e)
    if runs:
        if not quick:
            time.sleep(PEER_PAUSE_S)  # torch's threads may still spin from the last program
        try:
            res.seconds.update(interleaved_medians(runs, quick))
        except Exception as e:
            for system in runs:
                res.seconds[system], res.errors[system] = None, _error(e)
    if not quick:
        time.sleep(PEER_PAUSE_S)  # zeptograd's kernels ran last
    try:
        res.seconds["torch"], values["torch"] = torch_run(prog, data, quick)
    except Exception as e:
        res.seconds["torch"], res.errors["torch"] = None, _error(e)
    ref = values.get("torch")
    for system in ("default", "nofuse"):
        if ref is not None and system in values:
            v = np.asarray(values[system], np.float64)
            scale = max(1.0, float(np.nanmax(np.abs(ref))) if ref.size else 1.0)
            err = float(np.max(np.abs(v - ref))) / scale if v.shape == ref.shape and v.size else 0.0
            if v.shape != ref.shape or not err <= MISMATCH_TOL:  # nan compares false: a mismatch
                res.mismatch[system] = err if v.shape == ref.shape else math.inf
    return res


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def confirm_worst(results: list[Result], n: int):
    """Measure the n worst programs by each ratio again; each system's time becomes the lower of its two medians.
    Another process's work only ever makes a run slower: on a shared machine, a cliff must show twice."""
    worst = set()
    for a, b in (("default", "nofuse"), ("default", "torch")):
        ranked = sorted((r for r in results if r.ratio(a, b)), key=lambda r: -(r.ratio(a, b) or 0))
        worst |= {id(r) for r in ranked[:n]}
    for r in results:
        if id(r) in worst:
            print(f"\rre-measuring {r.program.id:<28}", end="", file=sys.stderr, flush=True)
            again = measure(r.program, quick=False)
            for system, s in again.seconds.items():
                if s is not None and r.seconds.get(system) is not None:
                    r.seconds[system] = min(s, r.seconds[system])  # type: ignore[type-var]


# ***** report *****


def _t(s: float | None) -> str:
    if s is None:
        return "n/a"
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


def _r(r: float | None) -> str:
    return "-" if r is None else f"{r:.3g}x" if r < 100 else f"{r:.0f}x"


def percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)

    def pct(p: float) -> float:  # linear interpolation between the closest ranks
        k = (len(xs) - 1) * p
        lo = math.floor(k)
        return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)

    return {f"p{int(p * 100)}": pct(p) for p in (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)} | {"max": xs[-1]}


def worst_table(results: list[Result], a: str, b: str, n: int) -> list[str]:
    ranked = sorted((r for r in results if r.ratio(a, b)), key=lambda r: -(r.ratio(a, b) or 0))[:n]
    lines = [
        f"  {'a/b':>6} {'a/c':>6} {'(a) default':>16} {'(b) no fusion':>16} {'(c) torch':>10}  "
        "program (id: expression, inputs)"
    ]
    for r in ranked:
        k = r.kernels
        lines.append(
            f"  {_r(r.ratio('default', 'nofuse')):>6} {_r(r.ratio('default', 'torch')):>6} "
            f"{_t(r.seconds.get('default')):>10} ({k.get('default', '?'):>2}k) "
            f"{_t(r.seconds.get('nofuse')):>10} ({k.get('nofuse', '?'):>2}k) {_t(r.seconds.get('torch')):>10}  "
            f"{r.program.id}: {r.program.describe()}"
        )
    return lines


def format_report(results: list[Result], header: dict[str, Any], worst: int = 10) -> str:
    h = header
    lines = [
        f"zeptograd cliffs: {h['cpu']}, THREADS={h['threads']} (torch.set_num_threads({h['threads']})), "
        f"torch {h['torch']}, load average {h['load']:.1f} at the start, {h['date']}"
        + (" [--quick: tiny sizes, times mean nothing]" if h["quick"] else ""),
        *(
            [
                f"the machine is busy (load {h['load']:.1f} on {os.cpu_count()} cpus): times are inflated, torch's "
                "thread pool's most of all (THREADS=1 suffers least)"
            ]
            if h["load"] > 0.5 * (os.cpu_count() or 1)
            else []
        ),
        f"{len(results)} programs of {h['possible']} (sizes {','.join(h['sizes'])}; families "
        f"{','.join(h['families'])}; fixed seed)",
        "(a) default schedule, (b) FUSE=0: every op its own kernel, (c) torch; (a), (b): kernel time "
        "(sum over the schedule's kernels, median of runs after a compiling run, (a) and (b) taking turns), "
        "(c): call time; (Nk): kernels"
        + (
            f"; the {h['confirmed']} worst by each ratio measured twice, the lower median kept"
            if h.get("confirmed")
            else ""
        ),
        "",
        "worst a/b (default / no fusion):",
        *worst_table(results, "default", "nofuse", worst),
        "",
        "worst a/c (default / torch):",
        *worst_table(results, "default", "torch", worst),
        "",
    ]
    for a, b, name, goal in (("default", "nofuse", "a/b", GOAL_VS_NOFUSE), ("default", "torch", "a/c", GOAL_VS_TORCH)):
        ratios = [x for r in results if (x := r.ratio(a, b))]
        if not ratios:
            lines.append(f"{name}: no program measured")
            continue
        p = percentiles(ratios)
        over = sum(x > goal for x in ratios)
        lines.append(
            f"{name} over {len(ratios)} programs: "
            + "  ".join(f"{k} {v:.2f}" for k, v in p.items())
            + f"  (over {goal}x: {over})"
        )
    by_family: dict[str, list[float]] = {}
    for r in results:
        if (x := r.ratio("default", "nofuse")) is not None:
            by_family.setdefault(r.program.family, []).append(x)
    if by_family:
        lines.append(
            "a/b median by family: "
            + ", ".join(f"{f} {statistics.median(v):.2f} (n={len(v)})" for f, v in by_family.items())
        )
    errors = [r for r in results if r.errors]
    if errors:
        lines += ["", f"errors ({len(errors)}):"]
        lines += [f"  {r.program.id}: {r.program.describe()}: {r.errors}" for r in errors]
    wrong = [r for r in results if r.mismatch]
    if wrong:
        lines += ["", f"values differ from torch's ({len(wrong)}; max |difference| / max(1, max |torch|)):"]
        lines += [
            f"  {r.program.id}: {r.program.describe()}: " + ", ".join(f"{s} {e:.2g}" for s, e in r.mismatch.items())
            for r in wrong
        ]
    return "\n".join(lines)


def header_info(quick: bool, sizes, families) -> dict[str, Any]:
    import torch

    from zeptograd.helpers import THREADS

    torch.set_num_threads(THREADS.value)
    cpu = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "threads": THREADS.value,
        "torch": torch.__version__,
        "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": quick,
        "sizes": sizes,
        "families": families,
        "possible": sum(len(FAMILY_BY_NAME[f].combos) for f in families) * len(sizes),
    }


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(prog="python -m bench.cliffs", description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=100, help="programs to run (default 100)")
    ap.add_argument("--sizes", default="small,medium", help=f"comma-separated, of {','.join(SIZES)}")
    ap.add_argument("--family", action="append", help=f"only these (repeatable): {', '.join(FAMILY_BY_NAME)}")
    ap.add_argument("--id", action="append", help="run these programs (ids as printed), nothing else")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run each: checks the harness")
    ap.add_argument("--worst", type=int, default=10, help="rows of each worst-ratio table")
    ap.add_argument("--list", action="store_true", help="print the programs, run nothing")
    ap.add_argument(
        "--confirm", type=int, default=15, help="measure the N worst by each ratio again, keep the lower times"
    )
    args = ap.parse_args(argv)
    sizes = [s for s in args.sizes.split(",") if s]
    if bad := [s for s in sizes if s not in SIZES]:
        raise SystemExit(f"unknown size(s) {bad}: {', '.join(SIZES)}")
    families = [f for a in args.family or [] for f in a.split(",") if f] or list(FAMILY_BY_NAME)
    if bad := [f for f in families if f not in FAMILY_BY_NAME]:
        raise SystemExit(f"unknown famil(ies) {bad}: {', '.join(FAMILY_BY_NAME)}")
    if args.id:
        programs = [program_by_id(i) for i in args.id]
    else:
        programs = generate(args.count, ("tiny",) if args.quick else tuple(sizes), families)
    if args.list:
        for p in programs:
            print(f"{p.id}: {p.describe()}")
        return
    header = header_info(args.quick, ["tiny"] if args.quick else sizes, families)
    t0 = time.perf_counter()
    results = []
    for i, prog in enumerate(programs):
        results.append(measure(prog, args.quick))
        print(f"\r{i + 1}/{len(programs)} {prog.id:<28}", end="", file=sys.stderr, flush=True)
    if not args.quick and args.confirm:
        confirm_worst(results, args.confirm)
        header["confirmed"] = args.confirm
    print("\r" + " " * 40 + "\r", end="", file=sys.stderr)
    print(format_report(results, header, args.worst))
    print(f"(whole run: {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
