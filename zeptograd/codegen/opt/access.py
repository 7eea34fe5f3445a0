"""What the CPU heuristic reads off a kernel: its memory accesses and their strides along a loop, symbolic sizes,
the amounts a loop can be split by (codegen/opt/heuristic.py, codegen/opt/tiles.py)."""

from __future__ import annotations

from zeptograd.codegen.opt import kernel_axes
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.symbolic import split_sum


def accesses(ast: UOp) -> list[UOp]:
    """The INDEX nodes of loads and stores into buffers."""
    return [u for u in ast.toposort() if u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL]


def stride(idx: UOp, r: UOp) -> int | None:
    """The coefficient of r in idx when idx is linear in r, 0 if idx does not use r, None otherwise."""
    terms, _ = split_sum(idx)
    coef = [c for t, c in terms if t is r]
    if any(r in t.toposort() for t, _ in terms if t is not r):
        return None
    return coef[0] if coef else 0


def symbolic_size(r: UOp) -> bool:
    return r.src[0].op is not Ops.CONST


def symbolic_work(ast: UOp) -> str | None:
    """The kernel's loop iterations as a Python expression of its Variables; None without a symbolic loop. A kernel
    threaded for its largest size runs on one core where a call's values make it small (runtime: run_on_cores)."""
    sizes = [r.src[0] for r in kernel_axes(ast)]
    if all(s.op is Ops.CONST for s in sizes):
        return None
    from zeptograd.uop.variable import render_sint

    work = sizes[0]
    for s in sizes[1:]:
        work = work * s
    return render_sint(work.simplify(), names_only=True)


def largest_divisor(n: int, options: tuple[int, ...]) -> int:
    return next((o for o in options if n % o == 0), 1)


def amount_with_tail(n: int, options: tuple[int, ...], divisors_first: bool = False) -> int:
    """The largest option that fits n (options largest first); where it does not divide n, the rest of the axis
    runs as a tail (codegen/opt/tail.py). divisors_first: an option that divides n, if any, before that."""
    if divisors_first and (d := largest_divisor(n, options)) > 1:
        return d
    return next((o for o in options if o <= n), 1)


def amounts_largest_first(n: int) -> tuple[int, ...]:
    """n, n-1, ..., 2: the amounts to try, largest first."""
    return tuple(range(n, 1, -1))


def index_of(ast: UOp, r: UOp) -> int | None:
    """Where the loop with r's axis id is in the kernel's axes now (None: an action expanded all of it)."""
    return next((i for i, a in enumerate(kernel_axes(ast)) if a.arg[0] == r.arg[0]), None)


def has_hoisted_reduce(ast: UOp) -> bool:
    """Whether a reduce's value misses an output loop of its loop nest: it is kept before that loop (a row's mean
    before a matmul over the normalized rows: schedule/policy.py, hoisted_reduce_requests), and a loop moved outside
    the others (SWAP, a TILE's block loop) would compute it again once per iteration of the moved loop."""
    for nest in ast.src:
        loops = (
            {r for r in nest.src[1:] if r.op is Ops.RANGE and r.arg[1] is AxisType.LOOP}
            if nest.op is Ops.END
            else set()
        )
        for red in nest.toposort():
            if red.op is Ops.REDUCE and not loops <= set(red.src[0].ranges):
                return True
    return False
