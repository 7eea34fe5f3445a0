"""What the CPU heuristic reads off a kernel: its memory accesses and their strides along a loop, symbolic sizes,
the amounts a loop can be split by (codegen/opt/heuristic.py, codegen/opt/tiles.py)."""

from __future__ import annotations

from collections.abc import Callable

from zeptograd.codegen.opt import kernel_axes
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp, max_trip_count, trip_count
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


# multiply-adds of a reduce whose loads each miss one of the output loops it uses (a matmul's, attention's) per unit of
# work: their operands stay in registers and L1 (a register tile) and 16 lanes go to one fused multiply-add, so on one
# AVX-512 core 512x64 @ 64x256 (8.4M multiply-adds) takes about as long as x*2+1 over 1M floats (~120 us each)
REUSED_OPERAND_ITERATIONS = 8
_REDUCE_SIDE = (AxisType.REDUCE, AxisType.UNROLL, AxisType.GROUP)


def work_estimate(root: UOp, size: Callable[[UOp], int | UOp] = max_trip_count) -> int | UOp:
    """The iterations that do work in the kernel (or loop nest) `root`, in units of an elementwise iteration (a load or
    two, some math, a store), for the choice to split it over cores (renderer.MIN_THREAD_WORK): each store once per
    iteration of the output loops its index uses and of those around them; each reduce once per iteration of the
    loops its body uses (its own, inner reduces') and of the output loops around them, since a reduce that misses an
    inner output loop is computed before that loop opens (schedule/policy.py: hoisted_reduce_requests); a matmul-like
    reduce (each load misses an output loop its body uses) at 1/REUSED_OPERAND_ITERATIONS. Not the product of every
    loop: the loops of separate reduces run one after another (a LayerNorm backward over (512, 64) with two row sums
    is 3 * 512*64 iterations, not 512*64*64*64). size: a RANGE's trip count (max_trip_count, or trip_count for an
    expression of the Variables)."""
    nodes = root.toposort()
    outputs = [u for u in nodes if u.op is Ops.RANGE and u.arg[1] not in _REDUCE_SIDE]

    def runs_in(used: set[UOp]) -> list[UOp]:  # the output loops used, and the plain loops outside the innermost one
        inner = max((r.arg[0] for r in used if r.arg[1] is AxisType.LOOP), default=-1)
        return [r for r in outputs if r in used or (r.arg[1] is AxisType.LOOP and r.arg[0] < inner)]

    def product(loops: list[UOp]) -> int | UOp:
        n: int | UOp = 1
        for r in loops:
            n = n * size(r)
        return n

    def cost(body: dict[UOp, None]) -> int:  # an exp2/log2/sin/... costs about an elementwise iteration of its own
        return 1 + sum(u.op in GroupOp.Approximated for u in body)

    def outside_reduces(u: UOp) -> dict[UOp, None]:  # u's computation, each reduce inside it counted on its own
        return u.toposort(gate=lambda x: x is u or x.op is not Ops.REDUCE)

    work: int | UOp = 0
    for st in (u for u in nodes if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL):
        n = product(runs_in({u for u in st.src[0].toposort() if u.op is Ops.RANGE}))
        work = work + n * cost(outside_reduces(st))
    for red in (u for u in nodes if u.op is Ops.REDUCE):
        # an inner reduce counts on its own: as nested as the ranges it uses (one that misses this reduce's loop is
        # computed before it opens)
        body = outside_reduces(red)
        used = {u for u in body if u.op is Ops.RANGE}
        out = runs_in(used)
        loads = [u for u in body if u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL]
        own_outputs = [r for r in out if r in used]
        ranges_of = [set(u.toposort()) for u in loads]
        reused = bool(loads) and all(any(r not in rs for r in own_outputs) for rs in ranges_of)
        n = product(out + [r for r in used if r.arg[1] in _REDUCE_SIDE]) * cost(body)
        work = work + (n // REUSED_OPERAND_ITERATIONS if reused else n)
    return work


def symbolic_work(ast: UOp) -> str | None:
    """The kernel's work_estimate as a Python expression of its Variables; None without a symbolic loop. A kernel
    threaded for its largest size runs on one core where a call's values make it small (runtime: run_on_cores)."""
    if all(r.src[0].op is Ops.CONST for r in kernel_axes(ast)):
        return None
    from zeptograd.uop.variable import render_sint

    work = work_estimate(ast, trip_count)
    return render_sint(work.simplify(), names_only=True) if isinstance(work, UOp) else str(work)


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
