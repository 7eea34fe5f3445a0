"""The `symbolic` rules: unit tests of each fold (the hypothesis tests that simplify() keeps integer values are in
test_symbolic_property.py)."""

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp, python_alu

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def var(name="a", lo=0, hi=10):
    return UOp.variable(name, lo, hi)


def c(v, dtype=dtypes.int):
    return UOp.const(dtype, v)


def is_const(u, v):
    return u.op is Ops.CONST and u.arg == v and type(u.arg) is type(v)


# ----------------------------------------------------------------------------- evaluation and printing


def evaluate(u: UOp, env: dict[str, int], check_ranges: bool = True) -> dict[UOp, object]:
    """Every node's value (no recursion: toposort puts sources first). Checks vmin <= value <= vmax on the way."""
    vals: dict[UOp, object] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            v = n.arg
        elif n.op is Ops.DEFINE_VAR:
            v = env[n.arg[0]]
        else:
            v = python_alu[n.op](*[vals[s] for s in n.src])
        if n.dtype == dtypes.int:
            assert INT32_MIN <= v <= INT32_MAX, f"int32 overflow at {fmt(n)} = {v}"
        if check_ranges:
            assert n.vmin <= v <= n.vmax, f"value {v} of {fmt(n)} outside its range [{n.vmin}, {n.vmax}] at {env}"
        vals[n] = v
    return vals


_INFIX = {
    Ops.ADD: "+",
    Ops.SUB: "-",
    Ops.MUL: "*",
    Ops.IDIV: "//",
    Ops.MOD: "%",
    Ops.CMPLT: "<",
    Ops.CMPNE: "!=",
    Ops.CMPEQ: "==",
    Ops.AND: "&",
    Ops.OR: "|",
}


def fmt(u: UOp) -> str:
    """A UOp as a readable expression (C semantics for // and %)."""
    s: dict[UOp, str] = {}
    for n in u.toposort():
        if n.op is Ops.CONST:
            s[n] = repr(n.arg)
        elif n.op is Ops.DEFINE_VAR:
            s[n] = n.arg[0]
        elif n.op in _INFIX:
            s[n] = f"({s[n.src[0]]} {_INFIX[n.op]} {s[n.src[1]]})"
        elif n.op is Ops.NEG:
            s[n] = f"(-{s[n.src[0]]})"
        elif n.op is Ops.MAX:
            s[n] = f"max({s[n.src[0]]}, {s[n.src[1]]})"
        elif n.op is Ops.WHERE:
            s[n] = f"({s[n.src[0]]} ? {s[n.src[1]]} : {s[n.src[2]]})"
        else:
            s[n] = f"{n.op.name}({', '.join(s[x] for x in n.src)})"
    return s[u]


# ----------------------------------------------------------------------------- unit tests of the rules


def test_constant_folding():
    assert is_const((c(3) + c(4)).simplify(), 7)
    assert is_const((c(3) * c(4)).simplify(), 12)
    assert is_const((c(3) - c(10)).simplify(), -7)
    assert is_const(((c(3) + c(4)) * c(2) - c(1)).simplify(), 13)
    assert is_const(c(3).maximum(c(-4)).simplify(), 3)
    assert is_const((c(3) < c(4)).simplify(), True)
    assert is_const(c(3).ne(c(3)).simplify(), False)
    assert is_const(c(3).eq(c(3)).simplify(), True)
    assert is_const((-c(5)).simplify(), -5)


def test_constant_folding_c_division():
    # truncation toward zero; the remainder has the sign of the dividend
    assert is_const((c(7) // c(2)).simplify(), 3)
    assert is_const((c(-7) // c(2)).simplify(), -3)
    assert is_const((c(7) // c(-2)).simplify(), -3)
    assert is_const((c(-7) // c(-2)).simplify(), 3)
    assert is_const((c(7) % c(2)).simplify(), 1)
    assert is_const((c(-7) % c(2)).simplify(), -1)
    assert is_const((c(7) % c(-2)).simplify(), 1)
    assert is_const((c(-7) % c(-2)).simplify(), -1)


def test_constant_folding_wraps_int32():
    assert is_const((c(INT32_MAX) + c(1)).simplify(), INT32_MIN)


def test_identities():
    a = var("a", -5, 5)
    assert (a + 0).simplify() is a
    assert (c(0) + a).simplify() is a
    assert (a * 1).simplify() is a
    assert (c(1) * a).simplify() is a
    assert (a - 0).simplify() is a
    assert (a // 1).simplify() is a
    assert is_const((a % 1).simplify(), 0)
    assert is_const((a * 0).simplify(), 0)
    assert is_const((c(0) * a).simplify(), 0)
    assert is_const((a - a).simplify(), 0)
    assert a.maximum(a).simplify() is a


def test_mul_by_zero_float_not_folded():
    f = UOp(Ops.DEFINE_VAR, dtypes.float, (), ("f", 0, 1))
    out = (f * 0.0).simplify()
    assert out.op is not Ops.CONST  # inf * 0 is nan


def test_like_terms():
    a, b = var("a"), var("b")
    assert (a * 2 + a * 3).simplify() is a * 5
    assert (a * 2 + b + a * 3).simplify() in (a * 5 + b, b + a * 5)
    assert (a + a).simplify() is a * 2
    assert is_const((a * 3 - a * 3).simplify(), 0)
    assert (a * 3 - a * 2).simplify() is a
    assert (a + 1 + 2).simplify() is a + 3
    assert (a + 1 - 1).simplify() is a
    assert ((a * 2) * 3).simplify() is a * 6
    assert ((a + 1) * 2).simplify() is a * 2 + 2


def test_div_mod_of_multiple_plus_small():
    a, b = var("a", 0, 10), var("b", 0, 3)
    assert ((a * 4 + b) // 4).simplify() is a
    assert ((a * 4 + b) % 4).simplify() is b
    assert ((b + a * 4) // 4).simplify() is a
    assert ((b + a * 4) % 4).simplify() is b
    assert ((a * 8 + 4) // 4).simplify() is a * 2 + 1
    assert is_const(((a * 8 + 4) % 4).simplify(), 0)
    # b may reach 4 here: not folded to a
    b5 = var("b5", 0, 4)
    assert ((a * 4 + b5) // 4).simplify() is not a


def test_div_mod_by_value_range():
    a = var("a", 0, 3)
    assert is_const((a // 4).simplify(), 0)
    assert (a % 4).simplify() is a
    n = var("n", -3, 3)
    assert is_const((n // 4).simplify(), 0)  # C division: |n| < 4 truncates to 0
    m = (n % 4).simplify()
    for v in range(-3, 4):  # C remainder: n % 4 == n for |n| < 4
        assert evaluate(m, {"n": v})[m] == v


def test_nested_div():
    a = var("a", 0, 100)
    assert ((a // 2) // 3).simplify() is a // 6


def test_flattened_reshape_index_folds_to_its_position():
    # a (64, 64, 3, 3) buffer read through a flat view: (a//576)*576 + ((a//9)%64)*9 + ((a//3)%3)*3 + a%3 is a,
    # at any sign (C's truncating division: a concatenation's piece reads it at a position offset below 0)
    for lo, hi in ((0, 36863), (-36992, 37641)):
        a = var("a", lo, hi)
        index = (a // 576) * 576 + ((a // 9) % 64) * 9 + ((a // 3) % 3) * 3 + a % 3
        assert index.simplify() is a
        for v in (lo, -577, -10, -1, 0, 1, 575, 576, hi):
            if lo <= v <= hi:
                assert evaluate(index, {"a": v}, check_ranges=False)[index] == v
    b = var("b", -1000, 1000)
    assert (((b // 4) % 5) * 8 + (b % 4) * 2).simplify() is (b % 20) * 2  # with a common coefficient
    assert (((b // 4) % 5) * 4 + (b % 3)).simplify().op is Ops.ADD  # different divisors: no fold


def test_comparisons_by_range():
    a, b = var("a", 0, 3), var("b", 5, 9)
    assert is_const((a < 4).simplify(), True)
    assert is_const((a < 0).simplify(), False)
    assert is_const((a < b).simplify(), True)
    assert is_const((b < a).simplify(), False)
    assert is_const(a.ne(b).simplify(), True)
    assert is_const(a.eq(b).simplify(), False)
    assert is_const((a >= 0).simplify(), True)
    assert is_const((a <= 3).simplify(), True)
    assert is_const((a < 2).simplify(), False) is False  # undecided by the range


def test_cmplt_lift():
    a = var("a", -10, 10)
    assert (a + 3 < 5).simplify() is (a < 2)
    assert (a * 3 < 7).simplify() is (a < 3)  # a*3 < 7 <=> a <= 2
    assert (a * 3 < -7).simplify() is (a < -2)  # a*3 < -7 <=> a <= -3


def test_cmplt_drops_terms_smaller_than_the_gcd():
    r, lane, k = var("r", 0, 1000), var("lane", 0, 7), var("k", 0, 1)
    assert (r * 8 + lane < 4096).simplify() is (r < 512)  # a vector's lanes leave its row's gate
    assert (k * 800 + r * 8 + lane < 4096).simplify() is (k * 800 + r * 8 < 4096).simplify()  # gcd(800, 8, 4096)
    for x in (r * 8 + var("wide", 0, 8), r * 8 + lane, r * 8 + lane - 1, r * 6 + lane):
        for bound in (4096, 4092, 40):
            for vals in (
                {"r": rv, "lane": min(lv, 7), "wide": lv} for rv in (0, 4, 510, 511, 512, 682) for lv in (0, 7, 8)
            ):
                lt, simple = x < bound, (x < bound).simplify()
                env = {n.arg[0]: vals[n.arg[0]] for n in lt.toposort() if n.op is Ops.DEFINE_VAR}
                assert evaluate(simple, env, False)[simple] == evaluate(lt, env, False)[lt], (fmt(x), bound, vals)
    assert (r * 8 + var("wide", 0, 8) < 4096).simplify() is not (r < 512)  # a lane past 7 may cross the bound
    assert (r * 6 + lane < 4096).simplify() is not (r < 683)  # gcd(6, 4096) = 2 <= lane's 7


def test_where_with_constant_condition():
    a, b = var("a"), var("b")
    assert c(True, dtypes.bool).where(a, b).simplify() is a
    assert c(False, dtypes.bool).where(a, b).simplify() is b
    assert (var("a", 0, 3) < 4).where(a, b).simplify() is a  # the condition folds first
    assert (var("x", 0, 3) < 2).where(a, a).simplify() is a


def test_max_by_range():
    a, b = var("a", 0, 3), var("b", 5, 9)
    assert a.maximum(b).simplify() is b
    assert b.maximum(a).simplify() is b
    assert is_const(a.maximum(c(-1)).simplify(), 0) is False
    assert a.maximum(c(-1)).simplify() is a


def test_bool_and_or():
    b = var("a", 0, 10) < 5
    assert (b & c(True, dtypes.bool)).simplify() is b
    assert is_const((b & c(False, dtypes.bool)).simplify(), False)
    assert (b | c(False, dtypes.bool)).simplify() is b
    assert is_const((b | c(True, dtypes.bool)).simplify(), True)


def test_simplify_is_idempotent_on_examples():
    a, b = var("a", 0, 10), var("b", -4, 4)
    for e in [(a * 4 + b) // 4, (a * 3 + b * 2 + 7) % 5, (a - b) * 3 + b * 3, (a + b).maximum(a * 2)]:
        s = e.simplify()
        assert s.simplify() is s


def test_a_sum_is_rebuilt_once_while_it_lives(monkeypatch):
    """Every stage simplifies again: a sum met before is not rebuilt again (its canonical form is known). No // or %
    here, so only the like-terms rule builds sums."""
    import zeptograd.uop.symbolic as symbolic_module

    a, b = UOp.variable("a", 0, 7), UOp.variable("b", 0, 7)
    messy = (a * 2 + b) + (a * 3 + 5)
    splits = []
    real_build = symbolic_module.build_sum
    monkeypatch.setattr(symbolic_module, "build_sum", lambda *args: splits.append(args[2]) or real_build(*args))
    first = messy.simplify()
    n_first = len(splits)
    assert first is a * 5 + b + 5 and n_first > 0
    assert messy.simplify() is first and len(splits) == n_first  # nothing rebuilt the second time
    assert first.simplify() is first and len(splits) == n_first
