"""Variables: symbolic integers in shapes, so that one compiled kernel serves every size.

    n = Variable("n", 1, 1024)          # a DEFINE_VAR UOp, arg=(name, min, max)
    vn = n.bind(10)                     # a BIND UOp: (DEFINE_VAR, CONST 10)
    x = Tensor.rand(3, 1024)[...].shrink(((0, 3), (0, vn)))   # x.shape == (3, vn)

Tensor shapes hold bound variables (BIND) and small index expressions of them (`vn + 2`, `3*vn`). Before
scheduling, `strip_binds` replaces every BIND by its DEFINE_VAR (in sources and in the args of movement ops and
symbolic constants) and collects the values by name: the schedule cache and the compile cache are keyed by the
unbound graph, so every value of `n` reuses one schedule and one compiled program, and the values travel beside
it as the kernels' int arguments (`run_schedule(items, var_vals)`). `rebind` puts the values back into what the
scheduler returns (the buffer views that realized tensors become), so a realized tensor keeps its bound shape.

A buffer for a symbolic shape is allocated at the shape's largest size; its tensor is a view of the first
`prod(shape)` elements (`buffers.py: view_uop`).
"""

from __future__ import annotations

from typing import Any

from zeptograd.dtype import dtypes
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.uop.ops import Ops, UOp

in_use = False  # set by the first bind(): until then, scheduling skips looking for variables
_SINT_OPS = {Ops.CONST, Ops.DEFINE_VAR, Ops.BIND, Ops.ADD, Ops.SUB, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.NEG}
_ARG_OPS = (Ops.RESHAPE, Ops.EXPAND, Ops.SHRINK, Ops.PAD, Ops.CONST)  # tensor-graph ops whose arg may hold sints


def Variable(name: str, min_val: int, max_val: int) -> UOp:  # noqa: N802  (tinygrad's name)
    """A symbolic integer in [min_val, max_val] (a DEFINE_VAR UOp); `.bind(value)` makes it usable in shapes."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"Variable name must be an identifier (it names a kernel argument), got {name!r}")
    for what, v in (("min", min_val), ("max", max_val)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ArgumentTypeError(f"Variable {name!r}: {what} must be an int, got {v!r}")
    if not 0 <= min_val <= max_val <= dtypes.max(dtypes.index):
        raise ArgumentError(
            f"Variable {name!r}: need 0 <= min <= max <= {dtypes.max(dtypes.index)}, got min={min_val}, max={max_val}"
        )
    return UOp.variable(name, min_val, max_val)


def bind(var: UOp, val: int) -> UOp:
    if var.op is not Ops.DEFINE_VAR:
        raise ArgumentError(f"bind() needs a Variable (DEFINE_VAR), not {var.op}")
    name, lo, hi = var.arg
    if hasattr(val, "__index__") and not isinstance(val, bool):
        val = val.__index__()
    if not isinstance(val, int) or isinstance(val, bool):
        raise ArgumentTypeError(f"Variable {name!r} can only be bound to an int, got {val!r}")
    if not lo <= val <= hi:
        raise ArgumentError(f"can't bind Variable {name!r} to {val}: outside its range [{lo}, {hi}]")
    global in_use
    in_use = True
    return UOp(Ops.BIND, var.dtype, (var, UOp.const(var.dtype, val)))


# ***** symbolic ints (sint): an int, or an index UOp over bound variables *****


def is_sint(x: Any) -> bool:
    """An index expression over variables: made of CONST, DEFINE_VAR, BIND and integer arithmetic only."""
    if not isinstance(x, UOp) or x.dtype != dtypes.index:
        return False
    return all(u.op in _SINT_OPS and (u.op is not Ops.CONST or isinstance(u.arg, int)) for u in x.toposort())


def sint_simplify(x: int | UOp) -> int | UOp:
    """x simplified by the symbolic rules, its terms in a canonical order (so that i+j and j+i are one UOp and
    shapes compare by identity); an int when it folds to a constant."""
    if not isinstance(x, UOp):
        return x
    from zeptograd.uop.symbolic import build_sum, split_sum, symbolic
    from zeptograd.uop.upat import graph_rewrite

    x = graph_rewrite(x, symbolic)
    if x.op is Ops.CONST:
        return x.arg
    done: dict[UOp, UOp] = {}
    for n in x.toposort():  # a*b with a after b -> b*a, by the variables' names
        src = tuple(done[s] for s in n.src)
        if (
            n.op is Ops.MUL
            and src[0].op is not Ops.CONST
            and src[1].op is not Ops.CONST
            and _key(src[1]) < _key(src[0])
        ):
            src = (src[1], src[0])
        done[n] = n if src == n.src else UOp(n.op, n.dtype, src, n.arg)
    x = done[x]
    if x.op is Ops.ADD and x.dtype.count == 1:
        terms, const = split_sum(x)
        x = build_sum(sorted(terms, key=lambda t: _key(t[0])), const, x)
    return x


def _key(u: UOp) -> str:
    return render_sint(u, names_only=True) or ""


def sint_arg(x: Any, what: str) -> int | UOp:
    """A size or bound given by the user: an int, or an index expression of bound variables (simplified)."""
    if isinstance(x, UOp):
        if not is_sint(x):
            raise ArgumentError(f"{what}: a symbolic size must be an expression of bound Variables, got {x.op}")
        free = [n.arg[0] for n in x.toposort() if n.op is Ops.DEFINE_VAR and not _is_bound_in(n, x)]
        if free:
            raise ArgumentError(f"{what}: Variable(s) {free} are not bound; use Variable(...).bind(value) in shapes")
        bound_vars(x)  # one value per variable
        return sint_simplify(x)
    if hasattr(x, "__index__") and not isinstance(x, bool):
        return x.__index__()
    raise ArgumentError(f"{what}: sizes must be ints or bound Variables, got {x!r}")


def _is_bound_in(var: UOp, x: UOp) -> bool:
    return any(n.op is Ops.BIND and n.src[0] is var for n in x.toposort())


def sint_prod(shape: tuple) -> int | UOp:
    ret: int | UOp = 1
    for s in shape:
        ret = ret * s
    return sint_simplify(ret)


def bound_vars(x: Any) -> dict[UOp, int]:
    """{variable: value} of every BIND in x (an int, a UOp, or tuples of them)."""
    out: dict[UOp, int] = {}
    for u in _uops_in(x):
        for n in u.toposort():
            if n.op is Ops.BIND:
                _record(out, n.src[0], n.src[1].arg)
    return out


def _record(out: dict[UOp, int], var: UOp, val: int):
    if out.get(var, val) != val:
        raise ArgumentError(f"Variable {var.arg[0]!r} is bound to both {out[var]} and {val} in one graph")
    out[var] = val


def sint_value(x: int | UOp) -> int:
    """The value of x with every bound variable at its value; a ValueError if x holds an unbound variable."""
    if not isinstance(x, UOp):
        return x
    vals = bound_vars(x)
    free = [n.arg[0] for n in x.toposort() if n.op is Ops.DEFINE_VAR and n not in vals]
    if free:
        raise ArgumentError(f"{render_sint(x) or x} holds the unbound Variable(s) {free}: bind a value first")
    mapping = {n: n.src[1] for n in x.toposort() if n.op is Ops.BIND}
    ret = sint_simplify(x.substitute(mapping))
    if not isinstance(ret, int):
        raise ArgumentError(f"can't evaluate {render_sint(x) or x} to an int")
    return ret


def concrete(shape: tuple) -> tuple[int, ...]:
    """The shape at the bound values of its variables."""
    return tuple(sint_value(s) for s in shape)


def strip_sint(x: int | UOp) -> int | UOp:
    """x with each BIND replaced by its variable (the form kernels and caches are keyed by)."""
    if not isinstance(x, UOp):
        return x
    mapping = {n: n.src[0] for n in x.toposort() if n.op is Ops.BIND}
    return sint_simplify(x.substitute(mapping)) if mapping else x


def unbound_shape(shape: tuple) -> tuple:
    return tuple(strip_sint(s) for s in shape)


def _uops_in(x: Any) -> list[UOp]:
    if isinstance(x, UOp):
        return [x]
    if isinstance(x, tuple):
        return [u for a in x for u in ([a] if isinstance(a, UOp) else _uops_in(a) if isinstance(a, tuple) else [])]
    return []


def _map_arg(arg: Any, fn) -> Any:
    """arg with fn applied to each UOp in it (args nest tuples at most two deep: ((b, e), ...))."""
    if isinstance(arg, UOp):
        return fn(arg)
    if isinstance(arg, tuple):
        return tuple(_map_arg(a, fn) if isinstance(a, (UOp, tuple)) else a for a in arg)
    return arg


def _arg_has_uop(u: UOp) -> bool:
    return u.op in _ARG_OPS and bool(_uops_in(u.arg))


def _rebuild(outs: list[UOp], fn) -> tuple[list[UOp], dict[UOp, UOp]]:
    """outs with fn applied to every UOp inside the args of shape-carrying nodes, sources first (no recursion)."""
    sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
    done: dict[UOp, UOp] = {}
    for n in sink.toposort():
        arg = _map_arg(n.arg, fn) if _arg_has_uop(n) else n.arg
        if n.op is Ops.BIND:
            done[n] = fn(n)
            continue
        src = tuple(done[s] for s in n.src)
        done[n] = n if src == n.src and arg is n.arg else UOp(n.op, n.dtype, src, arg)
    return list(done[sink].src), done


def has_symbols(outs: list[UOp]) -> bool:
    """Whether a graph holds a variable anywhere (in a source or in a shape argument)."""
    for n in UOp(Ops.SINK, dtypes.void, tuple(outs)).toposort():
        if n.op in (Ops.BIND, Ops.DEFINE_VAR) or _arg_has_uop(n):
            return True
    return False


def strip_binds(outs: list[UOp]) -> tuple[list[UOp], dict[str, int], dict[UOp, UOp]]:
    """(outs with every BIND replaced by its variable, {variable name: value}, each node -> its unbound node)."""
    vals: dict[UOp, int] = {}

    def unbind_expr(x: UOp) -> UOp:
        mapping = {}
        for n in x.toposort():
            if n.op is Ops.BIND:
                _record(vals, n.src[0], n.src[1].arg)
                mapping[n] = n.src[0]
        return x.substitute(mapping) if mapping else x

    new, done = _rebuild(outs, unbind_expr)
    by_name: dict[str, int] = {}
    seen: dict[str, UOp] = {}
    for var, val in vals.items():
        if (other := seen.get(var.arg[0])) is not None and other is not var:
            raise ArgumentError(
                f"two different Variables are named {var.arg[0]!r} ({other.arg} and {var.arg}): "
                f"give them different names"
            )
        seen[var.arg[0]], by_name[var.arg[0]] = var, val
    free = [n.arg for n in _defined_vars(new) if n.arg[0] not in by_name]
    if free:
        raise ArgumentError(f"unbound Variable(s) {[f[0] for f in free]} in a graph to run: use Variable.bind(value)")
    return new, by_name, done


def _defined_vars(outs: list[UOp]) -> list[UOp]:
    found: dict[UOp, None] = {}
    for n in UOp(Ops.SINK, dtypes.void, tuple(outs)).toposort():
        for u in ([n] if n.op is Ops.DEFINE_VAR else []) + (_uops_in(n.arg) if _arg_has_uop(n) else []):
            for x in u.toposort():
                if x.op is Ops.DEFINE_VAR:
                    found[x] = None
    return list(found)


def rebind(u: UOp, var_vals: dict[str, int]) -> UOp:
    """u (an unbound graph) with each variable bound to its value again."""
    if not var_vals:
        return u

    def bind_expr(x: UOp) -> int | UOp:  # an int where a bound shape expression folds to a constant
        mapping = {
            n: n.bind(var_vals[n.arg[0]]) for n in x.toposort() if n.op is Ops.DEFINE_VAR and n.arg[0] in var_vals
        }
        return sint_simplify(x.substitute(mapping)) if mapping else x

    return _rebuild([u], bind_expr)[0][0]


def rebind_shape(shape: tuple, var_vals: dict[str, int]) -> tuple:
    out = []
    for s in shape:
        if isinstance(s, UOp):
            mapping = {n: n.bind(var_vals[n.arg[0]]) for n in s.toposort() if n.op is Ops.DEFINE_VAR}
            s = sint_simplify(s.substitute(mapping))
        out.append(s)
    return tuple(out)


# ***** printing *****

_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%"}


def render_sint(x: UOp, names_only: bool = False) -> str | None:
    """A symbolic int as text: `i=4` for a bound variable, `i` for an unbound one, `(i=4)*3+2`; None otherwise.
    names_only: bound variables as their names (the order of sums does not depend on the values)."""
    if not is_sint(x) or not any(n.op in (Ops.DEFINE_VAR, Ops.BIND) for n in x.toposort()):
        return None
    text: dict[UOp, str] = {}
    for n in x.toposort():
        if n.op is Ops.CONST:
            text[n] = str(n.arg)
        elif n.op is Ops.DEFINE_VAR:
            text[n] = n.arg[0]
        elif n.op is Ops.BIND:
            text[n] = n.src[0].arg[0] if names_only else f"{n.src[0].arg[0]}={n.src[1].arg}"
        elif n.op in _INFIX:
            a, b = (
                text[s] if s.op in (Ops.CONST, Ops.DEFINE_VAR) or (names_only and s.op is Ops.BIND) else f"({text[s]})"
                for s in n.src
            )
            text[n] = f"{a}{_INFIX[n.op]}{b}"
        elif n.op is Ops.NEG:
            text[n] = f"-({text[n.src[0]]})"
        else:
            text[n] = f"max({text[n.src[0]]}, {text[n.src[1]]})"
    return text[x]
