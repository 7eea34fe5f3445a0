"""`//` and `%` of sums with negative coefficients (a flipped axis reshaped: (H*W-1 - h*W - w)//W), folded by the
value ranges. IDIV and MOD truncate toward zero (C); every fold is checked against Python's truncating division at
every value of small ranges."""

import itertools

import pytest

from tests.slow import fast_first
from tests.uop.test_symbolic import evaluate, fmt
from zeptograd.uop.ops import Ops, UOp


def trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def trunc_mod(a: int, b: int) -> int:
    return a - trunc_div(a, b) * b


def divides(u: UOp) -> bool:
    return any(n.op in (Ops.IDIV, Ops.MOD) for n in u.toposort())


def check_everywhere(expr: UOp, want, names_ranges):
    """simplified expr equals want(*values) at every point of the variables' ranges (and each node in its range)"""
    got = expr.simplify()
    for values in itertools.product(*[range(lo, hi + 1) for _, lo, hi in names_ranges]):
        env = {name: v for (name, _, _), v in zip(names_ranges, values)}
        assert evaluate(got, env)[got] == want(*values), f"{fmt(expr)} -> {fmt(got)} at {env}"
    return got


RANGES = [(0, 1), (0, 3), (1, 4), (-2, 2), (-3, 0)]
DIVISORS = [2, 3, 4, 5]
# the inner loop runs a diagonal first (each range and each divisor once), the full run every pair
DIAGONAL = [(r, DIVISORS[i % len(DIVISORS)]) for i, r in enumerate(RANGES)]
PAIRS = [
    pytest.param(r, d, id=f"a{r[0]}..{r[1]}-d{d}")
    for r, d in DIAGONAL + [(r, d) for r in RANGES for d in DIVISORS if (r, d) not in DIAGONAL]
]


@pytest.mark.parametrize("a_range, d", fast_first(PAIRS, len(DIAGONAL)))
def test_two_terms_every_sign(a_range, d):
    """(a*k1 + b*k2 + k) // d and % d for every sign of k1, k2, k and of a: each value is C's"""
    b_range = (0, 2)
    names = [("a", *a_range), ("b", *b_range)]
    for k1, k2, k in itertools.product(range(-6, 7, 2 if d % 2 else 1), (-d, -1, 0, 1, d + 1), (-7, -1, 0, 3, 8)):
        a, b = UOp.variable("a", *a_range), UOp.variable("b", *b_range)
        x = a * k1 + b * k2 + k
        check_everywhere(x // d, lambda av, bv: trunc_div(av * k1 + bv * k2 + k, d), names)
        check_everywhere(x % d, lambda av, bv: trunc_mod(av * k1 + bv * k2 + k, d), names)


@pytest.mark.parametrize("d", [3, 4])
def test_three_terms_with_a_large_negative_coefficient(d):
    names = [("a", 0, 2), ("b", 0, 3), ("c", -1, 1)]
    for ka, kb, kc, k in itertools.product((-2 * d - 1, -d, d - 1), (-1, 1, d), (-d, 2), (0, 2 * d + 1, 4 * d)):
        a, b, c = (UOp.variable(n, lo, hi) for n, lo, hi in names)
        x = a * ka + b * kb + c * kc + k
        check_everywhere(x // d, lambda av, bv, cv: trunc_div(av * ka + bv * kb + cv * kc + k, d), names)
        check_everywhere(x % d, lambda av, bv, cv: trunc_mod(av * ka + bv * kb + cv * kc + k, d), names)


def test_negative_coefficient_folds_away():
    """(x*-4 + 7)//4 with x in [0, 1] is 1 - x; % 4 is 3: no division left"""
    names = [("x", 0, 1)]
    x = UOp.variable("x", 0, 1)
    assert not divides(check_everywhere((x * -4 + 7) // 4, lambda v: trunc_div(-4 * v + 7, 4), names))
    assert not divides(check_everywhere((x * -4 + 7) % 4, lambda v: trunc_mod(-4 * v + 7, 4), names))


def test_flipped_axis_reshaped_has_no_division():
    """reverse(arange(H*W)).reshape(H, W): element (h, w) reads H*W-1 - (h*W + w), whose row and column are
    H-1-h and W-1-w"""
    H, W = 3, 5
    names = [("h", 0, H - 1), ("w", 0, W - 1)]
    h, w = UOp.variable("h", 0, H - 1), UOp.variable("w", 0, W - 1)
    flat = (h * W + w) * -1 + (H * W - 1)
    row = check_everywhere(flat // W, lambda hv, wv: trunc_div(H * W - 1 - hv * W - wv, W), names)
    col = check_everywhere(flat % W, lambda hv, wv: trunc_mod(H * W - 1 - hv * W - wv, W), names)
    assert not divides(row) and not divides(col)


def test_non_positive_sum_folds_by_symmetry():
    """x <= 0: C's division is odd, x//d == -((-x)//d): (a*-4 - 1)//4 is -a for a in [0, 3]"""
    names = [("a", 0, 3)]
    a = UOp.variable("a", 0, 3)
    assert not divides(check_everywhere((a * -4 - 1) // 4, lambda v: trunc_div(-4 * v - 1, 4), names))
    assert not divides(check_everywhere((a * -4 - 1) % 4, lambda v: trunc_mod(-4 * v - 1, 4), names))


def test_a_sum_of_both_signs_keeps_its_division():
    """(a*4 + b) // 4 with a*4 + b spanning 0: truncation is not floor there, so the terms are not split"""
    names = [("a", -2, 2), ("b", 0, 3)]
    a, b = UOp.variable("a", -2, 2), UOp.variable("b", 0, 3)
    assert divides(check_everywhere((a * 4 + b) // 4, lambda av, bv: trunc_div(4 * av + bv, 4), names))


def test_a_remainder_spanning_buckets_keeps_its_division():
    """(10 - x)//4 for x in [0, 10]: no split leaves the remainder within one multiple of 4; left as it is"""
    names = [("x", 0, 10)]
    x = UOp.variable("x", 0, 10)
    assert divides(check_everywhere((x * -1 + 10) // 4, lambda v: trunc_div(10 - v, 4), names))
