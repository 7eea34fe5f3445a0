"""Kernel boundaries in the IR: the rangeified graph of BUFFERIZE nodes, its foldings, and the cut into kernels.

After index propagation (`schedule/indexing.py`) every materialized tensor node x becomes
`BUFFERIZE(value, *ranges)`: its value written in terms of the loop ranges it is stored at (one per dimension; a
dimension of size 1 is the constant 0). A read of x elsewhere is `INDEX(BUFFERIZE_x, *index[, valid])`, one index
per range, with the validity of a padded read; a read of an input buffer (or of a COPY's result) is
`INDEX(node, flat index[, valid])`. The graph is the whole schedule: kernels are what the cut (`split_kernels`)
makes of the BUFFERIZEs that remain after `bufferize_folds`, so a folding that removes a BUFFERIZE removes a kernel
and its buffer, and a folding that shrinks one shrinks the buffer.

A BUFFERIZE marked `keep` is visible outside the kernel graph (an output, an ASSIGN, a CONTIGUOUS the user asked
for): the foldings never remove or reshape it.

A BUFFERIZE marked `row` is a partial materialization (`row_buffer`): stored at the one range of a row (the loop of
the reduce that fills it), it lives inside its consumer's kernel as a stack array, not in memory. Its value varies
along the kernel's outer loops too; each iteration of those overwrites it. `schedule/kernel.py` lowers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zeptograd.dtype import dtypes
from zeptograd.helpers import prod
from zeptograd.schedule.fold import uniform_const
from zeptograd.schedule.indexing import Rangeify, Request, flat_index, pad_validity
from zeptograd.uop.ops import GroupOp, Ops, UOp, trip_count
from zeptograd.uop.symbolic import and_terms
from zeptograd.uop.upat import PatternMatcher, UPat, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace


@dataclass(frozen=True)
class Stored:
    """A BUFFERIZE's arg: the tensor node it materializes and whether it is visible outside the kernel graph."""

    node: UOp
    keep: bool
    row: bool = False  # a row buffer inside the consumer's kernel (`row_buffer`), not a buffer in memory


@named_pass("bufferize", "the kept nodes -> BUFFERIZE over their loops, the others inlined into their readers")
def bufferize(rf: Rangeify, keep: set[UOp], aliases: dict[UOp, UOp] | None = None) -> UOp:
    """SINK of the kept BUFFERIZEs; the others are reached through the INDEX reads of their consumers. A node of
    `aliases` (a CONTIGUOUS of a value stored anyway: `contiguous_aliases`) is its value's BUFFERIZE."""
    made: dict[UOp, UOp] = {}
    for x in rf.nodes:  # producers first: every BUFFERIZE a value reads is built before it
        if aliases and x in aliases:
            made[x] = made[aliases[x]]
        elif x in rf.realize and x.op is not Ops.COPY:
            rngs = rf.kernel_ranges[x]
            made[x] = UOp(Ops.BUFFERIZE, x.dtype, (lower_value(rf, x, made), *rngs), Stored(x, x in keep))
        elif x in rf.row_buffered:
            made[x] = row_buffer(rf, x, made)
    return UOp(Ops.SINK, dtypes.void, tuple(dict.fromkeys(b for b in made.values() if b.arg.keep)))


def contiguous_aliases(rf: Rangeify, outputs: set[UOp]) -> dict[UOp, UOp]:
    """# CONTIGUOUS(x) where x is stored in this schedule anyway -> x's buffer, not a copy of it
    A CONTIGUOUS inside the graph (not an output: nothing outside can write into it) asks for x computed once into
    memory, so that every reader sees the same bits (a max's gradient compares x with its max: tensor/reduce.py);
    x's own buffer, which the walk kept for its other readers, already is that. x may be under reshapes that add or
    drop dimensions of size 1 (a matmul's keepdim reduce). x is kept too (no folding inlines or shrinks it) and the
    CONTIGUOUS's node is remembered as x's buffer (schedule/rangeify.py)."""
    aliases = {}
    for c in rf.realize:
        if c.op is not Ops.CONTIGUOUS or c in outputs:
            continue
        x = c.src[0]
        while x.op is Ops.RESHAPE and x not in rf.realize:
            x = x.src[0]
        if (
            x in rf.realize
            and x.op not in (Ops.COPY, Ops.ASSIGN, Ops.BUFFER)
            and x not in rf.row_buffered
            and all(isinstance(s, int) for s in (*x.tensor_shape, *c.tensor_shape))
            and [s for s in x.tensor_shape if s != 1] == [s for s in c.tensor_shape if s != 1]
        ):
            aliases[c] = x
    return aliases


def unit_dims_index(idx: tuple[UOp, ...], shape: tuple, stored: tuple) -> tuple[UOp, ...]:
    """An index into `shape` as an index into `stored`, the same dimensions but for those of size 1 (read at 0)."""
    big = iter(i for i, s in zip(idx, shape) if s != 1)
    return tuple(UOp.const(dtypes.index, 0) if s == 1 else next(big) for s in stored)


def row_buffer(rf: Rangeify, x: UOp, made: dict[UOp, UOp]) -> UOp:
    """# x read across one row at its fill (a reduce over the row, r) and at other loops j over the row
    #   -> BUFFERIZE(x[..., r], r) (row), read as INDEX(BUFFERIZE, r) in the reduce and INDEX(BUFFERIZE, j) elsewhere
    x's value at its fill request, stored at the fill's row range only (schedule/policy.py: row_buffer_request)."""
    fill = rf.row_buffered[x]
    return UOp(Ops.BUFFERIZE, x.dtype, (lower_value(rf, x, made, fill), fill[0][-1]), Stored(x, False, row=True))


def lower_value(rf: Rangeify, root: UOp, made: dict[UOp, UOp], start: Request | None = None) -> UOp:
    """root's value at its kernel ranges (or at `start`): the tensor ops between it and the materialized nodes it
    reads, lowered."""
    start = (rf.kernel_ranges[root], None) if start is None else start
    memo: dict[tuple[UOp, Request], UOp] = {}
    stack: list[tuple[UOp, Request, bool]] = [(root, start, False)]
    while stack:
        x, req, srcs_done = stack.pop()
        if (x, req) in memo:
            continue
        if (leaf := lower_leaf(rf, x, req, made)) is not None:
            memo[(x, req)] = leaf
            continue
        subs = rf.src_requests(x, req)
        if not srcs_done:
            stack.append((x, req, True))
            stack.extend((s, sreq, False) for s, sreq, _ in subs if (s, sreq) not in memo)
            continue
        memo[(x, req)] = lower_node(rf, x, req, [memo[(s, sreq)] for s, sreq, _ in subs])
    return memo[(root, start)]


def lower_leaf(rf: Rangeify, x: UOp, req: Request, made: dict[UOp, UOp]) -> UOp | None:
    idx, valid = req
    if (c := uniform_const(x)) is not None:  # a symbolic constant (a Variable's value) is its cast expression
        return c.arg.cast(x.dtype) if isinstance(c.arg, UOp) else UOp.const(x.dtype, c.arg)
    if x in made and made[x].arg.row:  # a row buffer: read along the row, in the row its reader is in
        return UOp(Ops.INDEX, x.dtype, (made[x], idx[-1]))
    if x in made:
        if (node := made[x].arg.node) is not x and node.tensor_shape != x.tensor_shape:  # a CONTIGUOUS's alias
            idx = unit_dims_index(idx, x.tensor_shape, node.tensor_shape)
        return UOp(Ops.INDEX, x.dtype, (made[x], *idx) + ((valid,) if valid is not None else ()))
    if x.op is Ops.BUFFER or x.op is Ops.COPY:  # memory the schedule does not compute in a kernel
        return UOp(Ops.INDEX, x.dtype, (x, flat_index(idx, x.tensor_shape)) + ((valid,) if valid is not None else ()))
    if x.op is Ops.IOTA:
        return idx[0].cast(x.dtype)
    return None


def lower_node(rf: Rangeify, x: UOp, req: Request, srcs: list[UOp]) -> UOp:
    if x.op in GroupOp.Movement:
        if x.op is Ops.PAD and (valid := pad_validity(x, req[0])) is not None and not gated_by(srcs[0], valid):
            return valid.where(srcs[0], UOp.const(x.dtype, 0))
        return srcs[0]
    if x.op is Ops.REDUCE_AXIS:
        ranges = tuple(r for r in rf.red_ranges[(x, req)] if r.op is Ops.RANGE)
        return UOp(Ops.REDUCE, x.dtype, (srcs[0], *ranges), x.arg[0]) if ranges else srcs[0]
    if x.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN):
        return srcs[0]
    if x.op in GroupOp.Elementwise:
        return UOp(x.op, x.dtype, tuple(srcs))
    raise NotImplementedError(f"rangeify can't lower {x.op} yet")


def gated_by(x: UOp, valid: UOp) -> bool:
    """x is a read whose validity already implies valid (a PAD of a buffer: it reads 0 outside, no WHERE needed)."""
    if x.op is not Ops.INDEX or (parts := index_parts(x))[2] is None:
        return False
    return set(and_terms(valid)) <= set(and_terms(parts[2]))


# --- the rangeified graph's vocabulary ---
def index_parts(ix: UOp) -> tuple[UOp, tuple[UOp, ...], UOp | None]:
    """(what it reads, the index per dimension, validity or None) of an INDEX in the rangeified graph."""
    target = ix.src[0]
    n = len(target.src) - 1 if target.op is Ops.BUFFERIZE else 1
    return target, ix.src[1 : 1 + n], ix.src[1 + n] if len(ix.src) > 1 + n else None


def stored_shape(b: UOp) -> tuple:
    """The shape a BUFFERIZE's buffer holds: the trip count of each range (1 where the range is the constant 0)."""
    return tuple(trip_count(r) if r.op is Ops.RANGE else 1 for r in b.src[1:])


def kernel_value_nodes(value: UOp) -> dict[UOp, None]:
    """The nodes of one kernel's value: not through the BUFFERIZEs it reads (those are other kernels), but through
    its row buffers (computed in the kernel)."""
    return value.toposort(gate=lambda u: u.op is not Ops.BUFFERIZE or u.arg.row)


# --- foldings: each removes or shrinks a materialization without changing a value ---
def fold_const_bufferize(b: UOp) -> UOp | None:
    """# BUFFERIZE(CONST, *r) -> CONST: a constant needs no memory"""
    return b.src[0] if not b.arg.keep else None


def fold_read_at_own_ranges(ix: UOp, b: UOp) -> UOp | None:
    """# INDEX(BUFFERIZE(x, *r), *r) -> x: read at the loops it is stored at, so inside them: the value itself (a read
    at no loop at all says nothing about where its reader runs)"""
    _, idx, valid = index_parts(ix)
    if b.arg.row:  # a row buffer's fill: kept, the kernel stores the row there (schedule/kernel.py)
        return None
    return b.src[0] if valid is None and idx == b.src[1:] and any(r.op is Ops.RANGE for r in idx) else None


def fold_copy_of_buffer(ix: UOp, b: UOp, inner: UOp) -> UOp | None:
    """# INDEX(BUFFERIZE(INDEX(BUFFERIZE(x, *s), *r), *r), *i) -> INDEX(BUFFERIZE(x, *s), *i): a second buffer that
    holds a copy of a first one of the same shape is read from the first"""
    if b.arg.keep or inner.arg.row or index_parts(b.src[0])[1:] != (b.src[1:], None):
        return None
    if stored_shape(inner) != stored_shape(b):
        return None
    return ix.replace(src=(inner, *ix.src[1:]))


def drop_dead_axes(b: UOp) -> UOp | None:
    """# BUFFERIZE(x, ..., r_d, ...) where x does not vary along r_d -> BUFFERIZE(x, ..., 0, ...): stored once, not
    once per iteration of a loop it does not depend on"""
    if b.arg.keep or b.arg.row:
        return None
    used = {u for u in kernel_value_nodes(b.src[0]) if u.op is Ops.RANGE}
    dead = [r for r in b.src[1:] if r.op is Ops.RANGE and r not in used]
    if not dead:
        return None
    zero = UOp.const(dtypes.index, 0)
    return b.replace(src=(b.src[0], *(zero if r in dead else r for r in b.src[1:])))


def read_dead_axis_at_zero(ix: UOp, b: UOp) -> UOp | None:
    """# INDEX(BUFFERIZE(x, ..., 0@d, ...), ..., i_d, ...) -> INDEX(..., 0@d, ...): a dimension of size 1 reads 0"""
    target, idx, valid = index_parts(ix)
    new = tuple(i if r.op is Ops.RANGE else r for i, r in zip(idx, b.src[1:]))
    return None if new == idx else ix.replace(src=(target, *new) + ((valid,) if valid is not None else ()))


def inline_read(ctx, ix: UOp, b: UOp) -> UOp | None:
    """# INDEX(BUFFERIZE(x, *r), *i[, valid]) -> valid ? x[r := i] : 0 where the policy (ctx) finds x cheaper
    evaluated at each read than stored; x's own reads are gated by valid too (outside it their index may leave
    the buffer)"""
    if not ctx.cheaper_inlined(b):
        return None
    _, idx, valid = index_parts(ix)
    mapping = {r: i for r, i in zip(b.src[1:], idx) if r.op is Ops.RANGE}
    if valid is not None:
        for u in kernel_value_nodes(b.src[0]):
            if u.op is Ops.INDEX:  # an input read (the policy inlines nothing that reads another BUFFERIZE)
                target, (i,), v = index_parts(u)
                gate = valid if v is None else v.substitute(mapping) & valid
                mapping[u] = UOp(Ops.INDEX, u.dtype, (target, i.substitute(mapping), gate))
    value = graph_substitute(b.src[0], mapping)
    return value if valid is None else valid.where(value, UOp.const(value.dtype, 0))


bufferize_folds = PatternMatcher(
    [
        (UPat(Ops.INDEX, name="ix", src=(UPat(Ops.BUFFERIZE, name="b"),), allow_any_len=True), inline_read),
        (UPat(Ops.BUFFERIZE, name="b", src=(UPat(Ops.CONST),), allow_any_len=True), fold_const_bufferize),
        # INDEX(CONST, ...) -> CONST: every element of a constant is the constant
        (UPat(Ops.INDEX, src=(UPat(Ops.CONST, name="c"),), allow_any_len=True), lambda c: c),
        (UPat(Ops.INDEX, name="ix", src=(UPat(Ops.BUFFERIZE, name="b"),), allow_any_len=True), fold_read_at_own_ranges),
        (
            UPat(
                Ops.INDEX,
                name="ix",
                src=(
                    UPat(
                        Ops.BUFFERIZE,
                        name="b",
                        src=(UPat(Ops.INDEX, src=(UPat(Ops.BUFFERIZE, name="inner"),), allow_any_len=True),),
                        allow_any_len=True,
                    ),
                ),
                allow_any_len=True,
            ),
            fold_copy_of_buffer,
        ),
        (UPat(Ops.BUFFERIZE, name="b"), drop_dead_axes),
        (UPat(Ops.INDEX, name="ix", src=(UPat(Ops.BUFFERIZE, name="b"),), allow_any_len=True), read_dead_axis_at_zero),
    ]
)


def stored_size(b: UOp) -> int:
    """Elements of a BUFFERIZE's buffer (for a symbolic size, at its largest)."""
    n = prod(stored_shape(b))
    return n.vmax if isinstance(n, UOp) else n
