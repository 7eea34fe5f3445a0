"""What is valid at each stage of the pipeline, checked when `SPEC=1`.

A pass that breaks an invariant shows up at that pass, naming the UOp, instead of as a C compiler error or a wrong
number several passes later. Each stage's spec is a flat list of `(UPat, fn)` rules: `fn` returns a sentence saying
what is wrong, or None when the node is fine; a node no rule matches is fine. The test suite runs with SPEC=1.

- the tensor graph, as the scheduler receives it: elementwise ops see sources of one shape (broadcasting is done
  by movement ops), comparisons give bools, WHERE chooses by a bool, a COPY is (value, DEVICE) of the value's dtype;
- a kernel graph, from the scheduler's output through every codegen pass until linearize: no tensor-level op is
  left, memory is reached through INDEX of a pointer, loops are RANGEs of an integer count, ALU dtypes agree;
- the rangeified graph (the scheduler's BUFFERIZE IR): a BUFFERIZE is stored at RANGEs (or the constant 0 for a
  dimension of size 1), a read of it gives one index per range and an optional bool validity, no tensor-level view
  or reduce op is left;
- the linear program: every UOp comes after its sources.
"""

from __future__ import annotations

from zeptograd.dtype import PtrDType, dtypes
from zeptograd.helpers import SPEC
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.upat import PatternMatcher, UPat


class SpecError(RuntimeError):
    """An internal invariant broken by a compiler pass: a bug in zeptograd, not in the user's program."""


TENSOR_ONLY = GroupOp.Movement | {
    Ops.BUFFER,
    Ops.DEVICE,
    Ops.IOTA,
    Ops.REDUCE_AXIS,
    Ops.CONTIGUOUS,
    Ops.DETACH,
    Ops.ASSIGN,
    Ops.COPY,
    Ops.BUFFERIZE,
}
ARITHMETIC = GroupOp.Binary - GroupOp.Comparison - {Ops.SHL, Ops.SHR}


def _widens(src, dst) -> bool:
    """Integer index math may mix widths: an op over an int32 and an int64 index is int64 (codegen/lower.py)."""
    return dtypes.is_int(src) and dtypes.is_int(dst) and src.count == dst.count and src.itemsize <= dst.itemsize


def _same_dtype(u: UOp, srcs: tuple[UOp, ...]) -> str | None:
    bad = [s.dtype for s in srcs if s.dtype != u.dtype and not _widens(s.dtype, u.dtype)]
    return f"{u.op.name} of dtype {u.dtype} has sources of dtype {bad}" if bad else None


def _comparison(u: UOp) -> str | None:
    if u.dtype.scalar != dtypes.bool:
        return f"{u.op.name} must give bool, gives {u.dtype}"
    a, b = u.src[0].dtype, u.src[1].dtype
    if a != b and not (_widens(a, b) or _widens(b, a)):
        return f"{u.op.name} compares {a} with {b}"
    return None


def _where(u: UOp) -> str | None:
    if u.src[0].dtype.scalar != dtypes.bool:
        return f"WHERE chooses by {u.src[0].dtype}, not bool"
    return _same_dtype(u, u.src[1:])


def _same_shape(u: UOp) -> str | None:
    shapes = {s.shape for s in u.src}
    return (
        f"{u.op.name} of sources with shapes {sorted(shapes, key=str)}: broadcast with movement ops"
        if len(shapes) > 1
        else None
    )


def _copy(u: UOp) -> str | None:
    if len(u.src) != 2 or u.src[1].op is not Ops.DEVICE:
        return f"COPY's sources are (value, DEVICE), got {[s.op.name for s in u.src]}"
    return None if u.dtype == u.src[0].dtype else f"COPY of dtype {u.dtype} moves a {u.src[0].dtype} value"


def _index(u: UOp) -> str | None:
    if not isinstance(u.src[0].dtype, PtrDType):
        return f"INDEX into {u.src[0].op.name} of dtype {u.src[0].dtype}, not a pointer"
    if not dtypes.is_int(u.src[1].dtype.scalar):
        return f"INDEX by {u.src[1].dtype}, not an integer"
    if len(u.src) > 2 and u.src[2].dtype.scalar != dtypes.bool:
        return f"INDEX gated by {u.src[2].dtype}, not bool"
    return None


def _memory_access(u: UOp) -> str | None:
    reach = u.src[0]
    while reach.op is Ops.CAST:  # a vector access casts the pointer its INDEX gives
        reach = reach.src[0]
    return None if reach.op is Ops.INDEX else f"{u.op.name} through {reach.op.name}, not INDEX"


def _loop_sources(u: UOp) -> str | None:
    bad = [s.op.name for s in u.src[1:] if s.op is not Ops.RANGE]
    return f"{u.op.name} closes over {bad}, not RANGEs" if bad else None


spec_tensor = PatternMatcher(
    [
        # elementwise ops on equal shapes: a + b of (3,1) and (3,4) needs an EXPAND first
        (UPat(GroupOp.ALU, name="u"), _same_shape),
        (UPat(GroupOp.Comparison, name="u"), _comparison),
        (UPat(Ops.WHERE, name="u"), _where),
        (UPat(ARITHMETIC, name="u"), lambda u: _same_dtype(u, u.src)),
        # a copy moves one value, unchanged, to the device its DEVICE source names
        (UPat(Ops.COPY, name="u"), _copy),
    ]
)


def _bufferize(u: UOp) -> str | None:
    bad = [r.op.name for r in u.src[1:] if r.op is not Ops.RANGE and not (r.op is Ops.CONST and r.arg == 0)]
    return f"BUFFERIZE stored at {bad}, not RANGEs (or 0 for a dimension of size 1)" if bad else None


def _bufferize_read(u: UOp) -> str | None:
    n = len(u.src[0].src) - 1
    if len(u.src) - 1 not in (n, n + 1):
        return f"INDEX of a BUFFERIZE of {n} ranges by {len(u.src) - 1} sources (one per range, then a validity)"
    if len(u.src) == n + 2 and u.src[-1].dtype != dtypes.bool:
        return f"INDEX of a BUFFERIZE gated by {u.src[-1].dtype}, not bool"
    return None


spec_rangeified = PatternMatcher(
    [
        # the index walk lowered every view and reduce: what is left is values, reads and stores at ranges
        (
            UPat(GroupOp.Movement | {Ops.REDUCE_AXIS, Ops.CONTIGUOUS, Ops.DETACH}, name="u"),
            lambda u: f"{u.op.name} is a tensor-graph op, left in the rangeified graph",
        ),
        (UPat(Ops.BUFFERIZE, name="u"), _bufferize),
        (UPat(Ops.INDEX, name="u", src=(UPat(Ops.BUFFERIZE),), allow_any_len=True), _bufferize_read),
        (UPat(GroupOp.Comparison, name="u"), _comparison),
        (UPat(Ops.WHERE, name="u"), _where),
    ]
)

spec_kernel = PatternMatcher(
    [
        # the scheduler turns every tensor-level op into index arithmetic, loads and stores
        (UPat(TENSOR_ONLY, name="u"), lambda u: f"{u.op.name} is a tensor-graph op, left in a kernel"),
        (UPat(Ops.INDEX, name="u"), _index),
        (UPat((Ops.LOAD, Ops.STORE), name="u"), _memory_access),
        (
            UPat(Ops.PREFETCH, name="u"),
            lambda u: None if len(u.src) == 1 and u.src[0].op is Ops.INDEX else "PREFETCH of anything but one INDEX",
        ),
        (
            UPat(Ops.RANGE, name="u"),
            lambda u: None if dtypes.is_int(u.src[0].dtype) else f"RANGE of a {u.src[0].dtype} count",
        ),
        (UPat((Ops.REDUCE, Ops.END), name="u"), _loop_sources),
        (UPat(GroupOp.Comparison, name="u"), _comparison),
        (UPat(Ops.WHERE, name="u"), _where),
        (UPat(ARITHMETIC, name="u"), lambda u: _same_dtype(u, u.src)),
        (UPat(GroupOp.Unary, name="u"), lambda u: _same_dtype(u, u.src)),
    ]
)


def check(sink: UOp, spec: PatternMatcher, stage: str, gate=None) -> None:
    """Raise SpecError naming the first node of `sink` that breaks `spec` (not below nodes `gate` refuses)."""
    for u in sink.toposort(gate):
        if (why := spec.rewrite(u)) is not None:
            raise SpecError(f"after {stage}: {why}\n  at {u.op.name} {u.dtype} arg={u.arg!r}")


def check_tensor_graph(sink: UOp) -> None:
    if SPEC:
        check(sink, spec_tensor, "building the tensor graph")


def check_rangeified(sink: UOp, stage: str) -> None:
    if SPEC:
        # a COPY's result is read like a buffer: the tensor graph it copies is not part of this one
        check(sink, spec_rangeified, stage, gate=lambda u: u.op is not Ops.COPY)


def check_kernel(sink: UOp, stage: str) -> None:
    if SPEC:
        check(sink, spec_kernel, stage)


def check_linear(uops: list[UOp]) -> None:
    """Every UOp after its sources, and inside the loops they were computed in: a renderer emits the list in order, so
    a later source is a use before def, and a value computed inside a loop is gone (its last iteration's, or none)
    once the loop's END closes it."""
    if not SPEC:
        return
    seen: set[UOp] = set()
    closed: set[UOp] = set()  # values of loops that have ended
    scopes: list[list[UOp]] = [[]]  # the values placed in each open loop, outermost first
    for i, u in enumerate(uops):
        if late := [s for s in u.src if s not in seen]:
            why = "after the loop that computes them" if any(s in closed for s in late) else "before they are defined"
            raise SpecError(f"after linearize: UOp {i} ({u.op.name}) uses {[s.op.name for s in late]} {why}")
        if u.op is Ops.END:
            for _ in (s for s in u.src[1:] if s.op is Ops.RANGE):
                closed.update(done := scopes.pop())
                seen.difference_update(done)
        if u.op is Ops.RANGE:
            scopes.append([])
        seen.add(u)
        scopes[-1].append(u)
