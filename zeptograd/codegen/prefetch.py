"""Prefetch the next row where a loop re-reads a row from the cache (CPU renderers with `prefetches`).

A kernel that runs a row's reduces and then its outputs (softmax, log_softmax, layernorm: `schedule/policy.py`
hoists the reduces) reads each row from memory once, in its first loop, and again from the cache in the loops after
it. While those later loops compute (softmax's exp), the memory bus is idle, and the hardware prefetcher does not
start the next row: no access walks it until the next row's first loop, which then waits for memory alone. So the
first loop that reads the row again also asks for the next row's elements:

  REDUCE(v(LOAD(buf[idx(row, r)])), r), v after a REDUCE whose loop read buf
    -> REDUCE(AFTER(v, PREFETCH(buf[idx(row + 1, r)])), r)

`row` is the innermost output loop the index moves with (the next row is `stride` elements on, one iteration of it);
each prefetch is a hint of one cache line: a copy of the load that starts no line of its own (its index is a
constant number of elements past a line's start, within the line) gets none. Rows under `MIN_ROW_BYTES` apart stream
well without hints. Past the buffer's last row the hint points outside the buffer: a prefetch never faults
(the renderers compute its address without LLVM's `inbounds`).

The same loop, where it computes a transcendental per element (softmax's and log_softmax's exp), also asks for the
lines of the row's outputs, for writing (`PREFETCH(out[idx(row, r)], arg=True)`): the output loop after it stores
into lines that miss, and waited for each (write-allocate) in turn.
"""

from __future__ import annotations

from zeptograd.dtype import PtrDType, dtypes
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp
from zeptograd.uop.symbolic import split_sum
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

LINE_BYTES = 64  # a cache line
MIN_ROW_BYTES = 1024  # rows closer than this are one stream the hardware prefetcher follows


def _global_load(u: UOp) -> bool:
    """A LOAD of a kernel buffer, ungated (a gated one may read nothing of the next row)."""
    return u.op is Ops.LOAD and len(u.src[0].src) == 2 and u.src[0].src[0].op is Ops.DEFINE_GLOBAL


def _linear(idx: UOp, loops: set[UOp]) -> tuple[dict[UOp, int], int, frozenset] | None:
    """idx as (coefficient of each of `loops`, constant, the other terms), where those loops are plain terms of its sum
    (found in no other term: a divmod of them is not a row's walk); None otherwise."""
    terms, const = split_sum(idx)
    coefs = {b: c for b, c in terms if b in loops}
    rest = frozenset((b, c) for b, c in terms if b not in loops)
    if any(r in b.toposort() for b, _ in rest for r in loops):
        return None
    return coefs, const, rest


def next_row_prefetch(load: UOp, own: set[UOp]) -> tuple[UOp, UOp, int] | None:
    """(PREFETCH of `load`'s element one iteration of its innermost output loop on, that loop, its stride), or None
    where the load does not move with the reduce loops `own` and an output loop, or starts no cache line of its own."""
    buf, idx = load.src[0].src
    ranges = [r for r in idx.toposort() if r.op is Ops.RANGE]
    rows = [r for r in ranges if r not in own and r.arg[1] is AxisType.LOOP]
    if not own & set(ranges) or not rows:
        return None
    row = max(rows, key=lambda r: r.arg[0])  # loops nest in axis order: the innermost
    if (lin := _linear(idx, {row})) is None or row not in lin[0]:
        return None
    stride = lin[0][row]
    assert isinstance(buf.dtype, PtrDType)
    itemsize = buf.dtype.base.itemsize
    if stride * itemsize < MIN_ROW_BYTES:
        return None
    line = LINE_BYTES // itemsize
    # buffers are 64-byte aligned: a load at a constant offset into a line, ending within it (every other term a
    # multiple of a line), shares a line another copy of the load starts (an unrolled loop's copies step through it)
    offset = (lin[1] + stride) % line
    if all(c % line == 0 for _, c in lin[2]) and stride % line == 0 and offset and offset + load.dtype.count <= line:
        return None
    return UOp(Ops.PREFETCH, dtypes.void, (buf.index(idx + UOp.const(idx.dtype, stride)),)), row, stride


def _row_start(idx: UOp, loops: set[UOp]) -> tuple | None:
    """idx at the first iteration of `loops` (a key: its other terms and constant), where they are plain terms."""
    return None if (lin := _linear(idx, loops)) is None else (lin[2], lin[1])


def output_rows(sink: UOp, red: UOp, row: UOp, stride: int) -> list[tuple[UOp, tuple]]:
    """(buffer, the row's first index) of each output a later loop of the same row stores: an ungated STORE of a value
    computed from `red`, at an index moving with `row` by `stride` and with one output loop of its own."""
    out = []
    for st in sink.toposort():
        if st.op is not Ops.STORE or len(st.src[0].src) != 2 or st.src[0].src[0].op is not Ops.DEFINE_GLOBAL:
            continue
        idx = st.src[0].src[1]
        loops = {r for r in idx.toposort() if r.op is Ops.RANGE} - {row}
        if len(loops) != 1 or red not in st.src[1].toposort() or (lin := _linear(idx, loops | {row})) is None:
            continue
        if lin[0].get(row) == stride and (start := _row_start(idx, loops)) is not None:
            out.append((st.src[0].src[0], start))
    return out


@named_pass("prefetch_next_rows", "a loop that re-reads a row from the cache also prefetches the next row")
def prefetch_next_rows(sink: UOp) -> UOp:
    replaced: dict[UOp, UOp] = {}
    for red in sink.toposort():
        if red.op is not Ops.REDUCE:
            continue
        body = list(red.src[0].toposort())
        own = set(red.src[1:])
        # a reduce nested inside this one's loop (attention's scores, a dot product per element of the row) varies
        # along it: not a loop that ran before, and its loads are in its own loop, not this one's body
        nested = [u for u in body if u.op is Ops.REDUCE and own & set(u.ranges)]
        earlier = [u for u in body if u.op is Ops.REDUCE and u not in nested]
        if not earlier:  # no loop of this row ran before this one
            continue
        read_before = {u.src[0].src[0] for e in earlier for u in e.src[0].toposort() if _global_load(u)}
        inner = {r for u in nested for r in u.src[1:]}
        hints: list[UOp] = []
        hinted: list[tuple[UOp, UOp, int]] = []  # (a hinted load's index, its row loop, the row stride)
        starts: set[tuple] = set()  # where the row's loads start, at the first iteration of this loop
        for u in body:
            if not _global_load(u) or u.src[0].src[0] not in read_before or not own & set(u.src[0].src[1].toposort()):
                continue
            if inner & set(u.src[0].src[1].toposort()):
                continue  # read in a nested reduce's loop
            idx = u.src[0].src[1]
            if (start := _row_start(idx, own)) is not None:
                starts.add(start)
            if (n := next_row_prefetch(u, own)) is not None:
                hints.append(n[0])
                hinted.append((idx, n[1], n[2]))
        # the row's outputs, stored by a later loop laid out as the row read (starting where one of its loads does):
        # their lines are asked for now, for writing, at the elements this loop reads (a store that misses waits too).
        # Only where this loop computes a transcendental per element: a light loop (layernorm's sum of squares) issues
        # the hints faster than memory takes them, and waits (measured 20% slower; softmax's exp loop 30% faster)
        varying = set(own)
        for u in body:
            if any(s in varying for s in u.src):
                varying.add(u)
        if hinted and any(u.op in GroupOp.Transcendental for u in varying):
            _, row, stride = hinted[0]
            for buf, start in output_rows(sink, red, row, stride):
                if start in starts:
                    hints.extend(UOp(Ops.PREFETCH, dtypes.void, (buf.index(idx),), True) for idx, _, _ in hinted)
        if hints:
            replaced[red] = red.replace(src=(red.src[0].after(*hints), *red.src[1:]))
    return sink.substitute(replaced) if replaced else sink
