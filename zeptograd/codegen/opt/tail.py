"""Tails: an action whose amount does not divide its axis runs on the largest part it divides, plus a tail.

    RANGE(n), amount c, n % c = T != 0, M = n - T:
    main:  RANGE(n) -> RANGE(M)                       (then split by the action as usual: vector lanes, cores)
    tail:  RANGE(n) -> M + t                          (the T remaining iterations, written to the same output)

The tail is a copy of the range's binder (the END or REDUCE that lists it), and where it goes depends on the binder:

    REDUCE(x, ..., r)  ->  REDUCE(x[r := main], ..., main) op REDUCE(x[r := M + t], ..., t)   (op: ADD, MUL, MAX)
    SINK(END(st, ..., r), ...)  ->  SINK(END(st[r := main], ..., main), END(st[r := M + t], ..., t), ...)

Loops the binder itself binds (its other ranges, and those of the reduces inside it) get fresh copies in the tail: a
loop opens and closes once. Loops around it and expanded ranges (vector lanes, unrolled copies) are shared, so a
tail of an outer axis keeps the vector lanes of the inner one. Fresh ids are larger than every id so far, and a
tail's nest follows the main one in the SINK: the linearizer runs the nests in that order, one after another.

What t is depends on the action:
- UPCAST/UNROLL (`vector_tail`): T < c positions as unrolled copies (`RANGE(T, UPCAST|UNROLL)`, a constant for
  T = 1): no loop, and scalar unless the tail shares the kernel's vector lanes;
- UPCAST of a T that is no power of two and more than 2 (`masked_tail`, `apply_opt`'s choice: `masks_tail`): one
  more vector of the next power of two, `M + RANGE(2**k, UPCAST)`, every access along it gated by `M + lane < n`
  (a masked vector load/store where the renderer has them, else a gated access per lane): matmul 1001's 9 columns
  left over are one masked vector of 16, not 9 scalar copies of each row (register tiles of 8 rows x 9 scalars
  would not fit the registers); lanes past n compute on loads of 0 and are never stored (integer division is made
  total by codegen/lower.py); not where the nest reads a row buffer (a masked lane would index past it);
- THREAD (`thread_tail`): T < cores iterations, one per core: t = min(core_id, T-1), the tail's stores gated by
  core_id < T (every core runs the kernel; the clamp keeps the other cores' loads in bounds).

A symbolic size n (uop/variable.py) splits the same way where the algebra holds for every value: M = (n//c)*c, and
the tail's T = n%c (0 to c-1, unknown until run time) iterations are a scalar loop `M + RANGE(n%c)` of the axis's own
kind (a loop, or a reduce), not unrolled copies. THREAD of a symbolic axis takes no tail (codegen/opt/__init__.py).

`gate_single_core`: in a kernel that runs once per core, a loop nest that does not depend on core_id (a tail made
before the THREAD, or one nothing threaded) stores from core 0 only.
"""

from __future__ import annotations

from typing import Callable

from zeptograd.dtype import dtypes
from zeptograd.uop.ops import AxisType, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat, graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

_EXPANDED = (AxisType.UPCAST, AxisType.UNROLL)

# (M, T, next free axis id) -> (the value of the split range in the tail, a gate for the tail's stores or None);
# M and T are index expressions (UOps) where the range's size is symbolic
TailFn = Callable[[int | UOp, int | UOp, int], tuple[UOp, UOp | None]]


def bound_ranges(b: UOp, split: UOp | None = None) -> list[UOp]:
    """The loops b binds: its own range list and those of the ENDs/REDUCEs inside it (not the loops around it).
    With `split`: only the inner ones whose value changes where split and b's own loops do (a reduce kept before the
    loops it does not vary along, softmax's row max inside the sum split into main and tail, stays one reduce)."""
    own = [s for s in b.src[1:] if s.op is Ops.RANGE and s.arg[1] not in _EXPANDED]
    out: dict[UOp, None] = dict.fromkeys(own)
    changes: dict[UOp, bool] = {}
    moved = set(own) | ({split} if split is not None else set())
    for u in b.toposort():
        changes[u] = split is None or u in moved or any(changes[s] for s in u.src)
        if u.op in (Ops.END, Ops.REDUCE) and changes[u]:
            out.update((s, None) for s in u.src[1:] if s.op is Ops.RANGE and s.arg[1] not in _EXPANDED)
    return sorted(out, key=lambda r: r.arg[0])


def _gate_store(ctx: UOp, st: UOp) -> UOp | None:
    """# STORE(INDEX(global, i[, v]), x) -> STORE(INDEX(global, i, v & gate), x)"""
    idx = st.src[0]
    if idx.op is not Ops.INDEX or idx.src[0].op is not Ops.DEFINE_GLOBAL:
        return None
    if len(idx.src) > 2 and (idx.src[2] is ctx or (idx.src[2].op is Ops.AND and ctx in idx.src[2].src)):
        return None
    valid = ctx if len(idx.src) < 3 else idx.src[2] & ctx
    return st.replace(src=(idx.replace(src=(idx.src[0], idx.src[1], valid)), *st.src[1:]))


pm_gate_store = PatternMatcher([(UPat(Ops.STORE, name="st"), _gate_store)])


def _drop_empty(b: UOp) -> UOp:
    """an END/REDUCE whose ranges all became constants is its body (a reduce over one element is that element)"""
    return b.src[0] if len(b.src) == 1 else b


def _gate_access(ctx: tuple[UOp, UOp], idx: UOp) -> UOp | None:
    """# INDEX(global, i[, v]) -> INDEX(global, i, v & gate) where i walks the masked tail's range"""
    lanes, gate = ctx
    if idx.src[0].op is not Ops.DEFINE_GLOBAL or lanes not in idx.src[1].toposort():
        return None
    if len(idx.src) > 2 and (idx.src[2] is gate or (idx.src[2].op is Ops.AND and gate in idx.src[2].src)):
        return None
    return idx.replace(src=(idx.src[0], idx.src[1], gate if len(idx.src) < 3 else idx.src[2] & gate))


pm_gate_access = PatternMatcher([(UPat(Ops.INDEX, name="idx"), _gate_access)])


def split_tail(ast: UOp, r: UOp, amt: int, tail: TailFn, gate_accesses: bool = False) -> UOp:
    """RANGE(n) -> RANGE(M) in the kernel, plus a tail for the n - M remaining iterations (see the module doc).
    gate_accesses: the tail's gate on every access along its lanes (masked_tail), not only on its stores."""
    from zeptograd.codegen.opt import pm_fix_range_lists

    if r.src[0].op is Ops.CONST:
        n = r.src[0].arg
        m, t = n - n % amt, n % amt
    else:  # a symbolic size: (n//amt)*amt, then n%amt
        m, t = ((r.src[0] // amt) * amt).simplify(), (r.src[0] % amt).simplify()
    binders = [u for u in ast.toposort() if u.op in (Ops.END, Ops.REDUCE) and r in u.src[1:]]
    if any(b.op is Ops.END and b not in ast.src for b in binders):
        from zeptograd.codegen.opt import OptError

        raise OptError(f"axis {r.arg[0]}: a tail needs the loop nest at the top of the kernel")
    next_id = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    regs = [u for u in ast.toposort() if u.op is Ops.DEFINE_REG]
    next_reg = max((u.arg for u in regs), default=-1) + 1
    tails: dict[UOp, UOp] = {}
    for b in binders:
        fresh: dict[UOp, UOp] = {}
        if b.op is Ops.END:  # a nest of its own: its row buffers (schedule/kernel.py) too, its fill may be hoisted
            for reg in (u for u in b.toposort() if u.op is Ops.DEFINE_REG):
                fresh[reg], next_reg = UOp(Ops.DEFINE_REG, reg.dtype, (), next_reg), next_reg + 1
        for s in bound_ranges(b, r):
            if s is not r:
                fresh[s] = UOp.range(s.src[0], next_id, s.arg[1])
                next_id += 1
        value, gate = tail(m, t, next_id)
        next_id += 1
        copy = graph_rewrite(graph_substitute(b, {**fresh, r: value}), pm_fix_range_lists)
        if gate is not None and gate_accesses:
            lanes = next(u for u in value.toposort() if u.op is Ops.RANGE)
            copy = graph_rewrite(copy, pm_gate_access, ctx=(lanes, gate))
        elif gate is not None:
            copy = graph_rewrite(copy, pm_gate_store, ctx=gate)
        tails[b] = _drop_empty(copy)
    main = graph_substitute(ast, {r: UOp.range(m, r.arg[0], r.arg[1])})
    mains = dict(zip(binders, [graph_substitute(b, {r: UOp.range(m, r.arg[0], r.arg[1])}) for b in binders]))
    subs = {mains[b]: UOp(b.arg, b.dtype, (mains[b], tails[b])) for b in binders if b.op is Ops.REDUCE}
    main = graph_substitute(main, subs) if subs else main
    extra = tuple(tails[b] for b in binders if b.op is Ops.END)
    return UOp(Ops.SINK, dtypes.void, (*main.src, *extra), main.arg) if extra else main


def vector_tail(kind: AxisType) -> TailFn:
    """the T remaining positions of an UPCAST/UNROLL as unrolled copies (a constant when T = 1)"""

    def fn(m: int | UOp, t: int | UOp, axis: int) -> tuple[UOp, UOp | None]:
        start = UOp.const(dtypes.index, m)
        if isinstance(t, UOp):  # 0 to amt-1 iterations, known at run time: a loop of the axis's kind
            return start + UOp.range(t, axis, AxisType.LOOP if kind is AxisType.UPCAST else AxisType.REDUCE), None
        return (start + UOp.range(t, axis, kind) if t > 1 else start), None

    return fn


def masked_tail(n: int) -> TailFn:
    """the T remaining positions of an UPCAST as one more whole vector, M + RANGE(amt, UPCAST), every access along it
    gated by M + lane < n: a masked vector load/store where the renderer has them (Renderer.masked_vectors), else a
    gated access per lane (codegen/devectorizer.py)"""

    def fn(m: int | UOp, t: int | UOp, axis: int) -> tuple[UOp, UOp | None]:
        assert isinstance(m, int) and isinstance(t, int)  # (apply_opt: a size known at compile time)
        amt = 1 << (t - 1).bit_length()
        value = UOp.const(dtypes.index, m) + UOp.range(amt, axis, AxisType.UPCAST)
        return value, value < UOp.const(dtypes.index, n)

    return fn


def thread_tail(core: UOp) -> TailFn:
    """the T remaining iterations of a THREAD, one per core: M + min(core_id, T-1), stored by cores below T"""

    def fn(m: int | UOp, t: int | UOp, axis: int) -> tuple[UOp, UOp | None]:
        last = UOp.const(dtypes.index, t - 1)
        return UOp.const(dtypes.index, m) + (core < last).where(core, last), core < UOp.const(dtypes.index, t)

    return fn


def core_id(ast: UOp) -> UOp | None:
    return next((u for u in ast.toposort() if u.op is Ops.SPECIAL and u.arg == "core_id"), None)


@named_pass("gate_single_core", "a loop nest no THREAD split divides stores from core 0 only")
def gate_single_core(ast: UOp) -> UOp:
    """# SINK(nest not using core_id, ...) -> SINK(nest with its stores gated by core_id == 0, ...)"""
    core = core_id(ast)
    if core is None or ast.op is not Ops.SINK:
        return ast
    first = core.eq(UOp.const(dtypes.index, 0))
    srcs = tuple(s if core in s.toposort() else graph_rewrite(s, pm_gate_store, ctx=first) for s in ast.src)
    return ast if srcs == ast.src else ast.replace(src=srcs)
