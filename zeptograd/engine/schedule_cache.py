"""A schedule cache: the kernels of a graph, reused for every graph of the same structure on other buffers.

Eager code repeats the same small graphs on new buffers ((a+b).realize() in a loop, one training step after
another). Scheduling one (fold, rangeify, symbolic index arithmetic, lowering) costs about a millisecond; looking
its template up costs microseconds. The key is the graph with every BUFFER replaced by a placeholder numbered by
first use of its Buffer (so `a+a` and `a+b` differ) and carrying its dtype and size, each ASSIGN's unique id
replaced by its order in the graph, plus the values of all the Context knobs. A template stores the
ScheduleItems with their buffers as slots (an input of the graph or a new buffer to allocate), and what each
realized node becomes, with the same placeholders. `SCHEDULE_CACHE=0` turns it off.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from zeptograd.buffers import buffers, new_buffer_uop, reshape_uop
from zeptograd.device import Buffer
from zeptograd.dtype import dtypes
from zeptograd.helpers import ContextVar
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import graph_substitute

SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1)
MAX_ENTRIES = 4096  # oldest dropped first: graphs with ever-new constants must not grow it without bound

Slot = tuple[int, int]  # (0, i): the graph's i-th input Buffer; (1, j): the j-th new Buffer of the schedule


@dataclasses.dataclass
class Template:
    items: list[tuple[Any, list[Slot]]]  # (ScheduleItem with bufs=[], a slot per buffer)
    new_bufs: list[tuple[str, int, Any]]  # (device, size, dtype) of each new Buffer
    becomes: dict[UOp, UOp]  # node of the key graph -> its value, over placeholders


class Stats:
    hits = 0
    misses = 0
    uncacheable = 0


_cache: dict[Any, Template] = {}


def clear():
    _cache.clear()


def _placeholder(u: UOp, tag: tuple[str, int]) -> UOp:
    return UOp(Ops.BUFFER, u.dtype, u.src, (tag, u.arg[1]))


def _abstract(outs: list[UOp]) -> tuple[UOp, list[Buffer], list[UOp], dict[UOp, UOp]]:
    """(the key graph, the input Buffers in order, a BUFFER uop of each, this graph's node -> key graph's node)."""
    sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
    done: dict[UOp, UOp] = {}
    in_bufs: list[Buffer] = []
    in_uops: list[UOp] = []
    index: dict[int, int] = {}
    n_assign = 0
    for n in sink.toposort():
        if n.op is Ops.BUFFER:
            b = buffers[n]
            if (i := index.get(id(b))) is None:
                i = index[id(b)] = len(in_bufs)
                in_bufs.append(b)
                in_uops.append(n)
            done[n] = _placeholder(n, ("in", i))
        elif n.op is Ops.ASSIGN:  # its arg is a fresh id (every assign is distinct): numbered by order instead
            done[n] = UOp(n.op, n.dtype, tuple(done[s] for s in n.src), ("assign", n_assign))
            n_assign += 1
        else:
            new_src = tuple(done[s] for s in n.src)
            done[n] = n if new_src == n.src else UOp(n.op, n.dtype, new_src, n.arg)
    return done[sink], in_bufs, in_uops, done


def _knobs() -> tuple:
    return tuple((k, v.value) for k, v in ContextVar._cache.items())


def _make_template(
    items: list, becomes: dict[UOp, UOp], in_bufs: list[Buffer], done: dict[UOp, UOp]
) -> Template | None:
    in_index = {id(b): i for i, b in enumerate(in_bufs)}
    new_index: dict[int, int] = {}
    new_bufs: list[tuple[str, int, Any]] = []

    def slot(b: Buffer) -> Slot:
        if (i := in_index.get(id(b))) is not None:
            return (0, i)
        if (j := new_index.get(id(b))) is None:
            j = new_index[id(b)] = len(new_bufs)
            new_bufs.append((b.device, b.size, b.dtype))
        return (1, j)

    titems = []
    for item in items:
        if not dataclasses.is_dataclass(item):
            return None
        for f in dataclasses.fields(item):  # a Buffer held anywhere but .bufs could not be swapped: don't cache
            v = getattr(item, f.name)
            if f.name != "bufs" and (
                isinstance(v, Buffer) or (isinstance(v, (list, tuple)) and any(isinstance(x, Buffer) for x in v))
            ):
                return None
        titems.append((dataclasses.replace(item, bufs=[]), [slot(b) for b in item.bufs]))
    tbecomes: dict[UOp, UOp] = {}
    for old, new in becomes.items():
        if old not in done:
            continue
        mapping: dict[UOp, UOp] = {}
        for n in new.toposort():
            if n.op is Ops.BUFFER:
                b = buffers[n]
                if id(b) in in_index:
                    mapping[n] = _placeholder(n, ("in", in_index[id(b)]))
                elif id(b) in new_index:
                    mapping[n] = _placeholder(n, ("new", new_index[id(b)]))
                else:
                    return None  # a buffer the schedule neither reads nor makes
        tbecomes[done[old]] = graph_substitute(new, mapping)
    return Template(titems, new_bufs, tbecomes)


def _copy_item(item: Any, bufs: list[Buffer]) -> Any:
    if hasattr(item, "__dict__"):  # cheaper than dataclasses.replace, which runs __init__ again
        new = object.__new__(type(item))
        new.__dict__.update(item.__dict__)
        new.bufs = bufs
        return new
    return dataclasses.replace(item, bufs=bufs)


def _instantiate(t: Template, in_bufs: list[Buffer], in_uops: list[UOp], done: dict[UOp, UOp]):
    new = [Buffer(dev, size, dtype) for dev, size, dtype in t.new_bufs]
    items = [_copy_item(item, [in_bufs[i] if kind == 0 else new[i] for kind, i in slots]) for item, slots in t.items]
    new_uops: dict[int, UOp] = {}

    def real(p: UOp) -> UOp:
        kind, i = p.arg[0]
        if kind == "in":
            return in_uops[i]
        if i not in new_uops:
            new_uops[i] = new_buffer_uop(new[i].device, new[i].size, new[i].dtype, new[i])
        return new_uops[i]

    becomes = {}
    back = {k: n for n, k in done.items()} if len(t.becomes) > 1 else None  # key graph node -> this graph's node
    for knode, value in t.becomes.items():
        node = back.get(knode) if back is not None else next((n for n, k in done.items() if k is knode), None)
        if node is None:
            continue
        if value.op is Ops.BUFFER:
            becomes[node] = real(value)
        elif value.op is Ops.RESHAPE and value.src[0].op is Ops.BUFFER:
            becomes[node] = reshape_uop(real(value.src[0]), value.shape)
        else:
            becomes[node] = graph_substitute(value, {p: real(p) for p in value.toposort() if p.op is Ops.BUFFER})
    return items, becomes


def cached_schedule(outs: list[UOp], create_schedule: Callable) -> tuple[list, dict[UOp, UOp]]:
    """create_schedule(outs), from the template of an equal-structure graph when one was scheduled before."""
    if not SCHEDULE_CACHE:
        return create_schedule(outs)
    try:
        key_graph, in_bufs, in_uops, done = _abstract(outs)
    except KeyError:  # a BUFFER without a Buffer: schedule it the slow way
        Stats.uncacheable += 1
        return create_schedule(outs)
    key = (key_graph, _knobs())
    if (t := _cache.get(key)) is not None:
        Stats.hits += 1
        return _instantiate(t, in_bufs, in_uops, done)
    Stats.misses += 1
    items, becomes = create_schedule(outs)
    t = _make_template(items, becomes, in_bufs, done)
    if t is None:
        Stats.uncacheable += 1
    else:
        if len(_cache) >= MAX_ENTRIES:
            del _cache[next(iter(_cache))]
        _cache[key] = t
    return items, becomes
