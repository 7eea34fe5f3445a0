"""A schedule cache: the kernels of a graph, reused for every graph of the same structure on other buffers.

Eager code repeats the same small graphs on new buffers ((a+b).realize() in a loop, one training step after
another). Scheduling one (fold, rangeify, symbolic index arithmetic, lowering) costs about a millisecond; looking
its template up costs microseconds. The key comes from one walk of the graph that builds no UOp (`walk`): per node
its op, dtype, arg and the positions of its sources, with every BUFFER's arg a placeholder numbered by first use of
its Buffer (so `a+a` and `a+b` differ) carrying its size, each ASSIGN's unique id replaced by its order in the
graph; plus the values of all the Context knobs. The same walk tells realize.py whether the graph holds a node
realized before (it is then substituted and walked again). A template stores the
ScheduleItems with their buffers as slots (an input of the graph or a new buffer to allocate), and what each
realized node becomes, with the same placeholders. `SCHEDULE_CACHE=0` turns it off.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from zeptograd.buffers import buffers, new_buffer_uop, reshape_uop
from zeptograd.device import Buffer
from zeptograd.helpers import ContextVar
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp, _arg_key
from zeptograd.uop.upat import graph_substitute

if TYPE_CHECKING:
    from zeptograd.schedule.kernel import ScheduleItem

SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1)
MAX_ENTRIES = 4096  # oldest dropped first: graphs with ever-new constants must not grow it without bound

Slot = tuple[int, int]  # (0, i): the graph's i-th input Buffer; (1, j): the j-th new Buffer of the schedule


@dataclasses.dataclass
class Template:
    items: list[tuple[ScheduleItem, list[Slot]]]  # (ScheduleItem with bufs=[], a slot per buffer)
    new_bufs: list[tuple[str, int, Any]]  # (device, size, dtype) of each new Buffer
    becomes: dict[int, UOp]  # position of a node in the graph's Walk -> its value, over placeholders


class Stats:
    hits = 0
    misses = 0
    uncacheable = 0


_cache: dict[Any, Template] = {}


def clear():
    _cache.clear()


def _placeholder(u: UOp, tag: tuple[str, int]) -> UOp:
    return UOp(Ops.BUFFER, u.dtype, u.src, (tag, u.arg[1]))


@dataclasses.dataclass
class Walk:
    """One walk of a graph: its key (no UOp is built for it), its nodes in order, and its input Buffers."""

    key: tuple  # per node (op, dtype, arg, positions of its sources); a BUFFER's arg is ("in", i, size)
    nodes: list[UOp]  # sources before users; a node's position is its place here
    position: dict[UOp, int]
    in_bufs: list[Buffer]  # by first use
    in_uops: list[UOp]  # a BUFFER uop of each
    symbolic: bool  # whether a node is a Variable or holds one in its arg (variable.has_symbols, in the same walk)


def walk(outs: list[UOp], realized: Any = None) -> Walk | None:
    """The graph of `outs` as a cache key, in one iterative walk; None if `realized` maps a node of it to another
    node (it must be replaced by its value first). A KeyError for a BUFFER without a Buffer."""
    position: dict[UOp, int] = {}
    nodes: list[UOp] = []
    key: list[tuple] = []
    in_bufs: list[Buffer] = []
    in_uops: list[UOp] = []
    index: dict[int, int] = {}
    n_assign = 0
    symbolic, look_for_symbols = False, variable.in_use  # until a Variable is bound, there is none to find
    held = _buffers_data  # a lookup without a Python-level call
    # (its own dict, as _own_dict gives, without the call)
    fast_realized = realized.data if type(realized) is weakref.WeakKeyDictionary else None  # type: ignore[attr-defined]
    if fast_realized is not None and not fast_realized:  # nothing realized is alive: no node to look up
        realized = fast_realized = None
    stack: list[tuple[UOp, bool]] = [(u, False) for u in reversed(outs)]
    while stack:
        u, expanded = stack.pop()
        if u in position:
            continue
        if expanded:
            src = tuple(map(position.__getitem__, u.src))
            if u.op is Ops.BUFFER:
                b = held[weakref.ref(u)]
                if (i := index.get(id(b))) is None:
                    i = index[id(b)] = len(in_bufs)
                    in_bufs.append(b)
                    in_uops.append(u)
                arg: Any = ("in", i, u.arg[1])
            elif u.op is Ops.ASSIGN:  # its arg is a fresh id (every assign is distinct): numbered by order instead
                arg, n_assign = ("assign", n_assign), n_assign + 1
            else:
                arg = u.arg
                if isinstance(arg, float):
                    arg = _arg_key(arg)  # as UOp interning tells args apart: -0.0 is not 0.0
            if look_for_symbols and not symbolic:
                symbolic = u.op in (Ops.BIND, Ops.DEFINE_VAR) or variable._arg_has_uop(u)
            position[u] = len(nodes)
            nodes.append(u)
            key.append((u.op, u.dtype, arg, src))
            continue
        if realized is not None:  # a node realized to another node (an input buffer may be noted as itself)
            if fast_realized is not None:
                if (value := fast_realized.get(weakref.ref(u))) is not None and value is not u:
                    return None
            elif u in realized and realized[u] is not u:
                return None
        stack.append((u, True))
        for s in reversed(u.src):
            if s not in position:
                stack.append((s, False))
    key.append((Ops.SINK, tuple([position[u] for u in outs])))
    return Walk(tuple(key), nodes, position, in_bufs, in_uops, symbolic)


K = TypeVar("K")
V = TypeVar("V")


def _own_dict(d: weakref.WeakKeyDictionary[K, V]) -> dict[weakref.ref[K], V]:
    """The WeakKeyDictionary's own dict of weak references (CPython's `data` attribute, used as walk's fast path)."""
    return d.data  # type: ignore[attr-defined]  # an implementation attribute typeshed does not declare


_buffers_data = _own_dict(buffers)

# every knob, a live view of ContextVar._cache (knobs are only ever added to it, so their values name them)
_knob_vars = ContextVar._cache.values()


def _make_template(items: list[ScheduleItem], becomes: dict[UOp, UOp], w: Walk) -> Template | None:
    in_index = {id(b): i for i, b in enumerate(w.in_bufs)}
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
    tbecomes: dict[int, UOp] = {}
    for old, new in becomes.items():
        if old not in w.position:
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
        tbecomes[w.position[old]] = graph_substitute(new, mapping)
    return Template(titems, new_bufs, tbecomes)


def _copy_item(item: ScheduleItem, bufs: list[Buffer]) -> ScheduleItem:
    if hasattr(item, "__dict__"):  # cheaper than dataclasses.replace, which runs __init__ again
        new = object.__new__(type(item))
        new.__dict__.update(item.__dict__)
        new.bufs = bufs
        return new
    return dataclasses.replace(item, bufs=bufs)


def _instantiate(t: Template, w: Walk) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    new = []
    for dev, size, dtype in t.new_bufs:
        new.append(Buffer(dev, size, dtype))
    in_bufs, in_uops, nodes = w.in_bufs, w.in_uops, w.nodes
    items = []
    for item, slots in t.items:  # (loops, not comprehensions: each is a call before Python 3.12)
        bufs = []
        for kind, i in slots:
            bufs.append(in_bufs[i] if kind == 0 else new[i])
        items.append(_copy_item(item, bufs))
    new_uops: dict[int, UOp] = {}

    def real(p: UOp) -> UOp:
        kind, i = p.arg[0]
        if kind == "in":
            return in_uops[i]
        if (u := new_uops.get(i)) is None:
            b = new[i]
            u = new_uops[i] = new_buffer_uop(b.device, b.size, b.dtype, b)
        return u

    becomes = {}
    for pos, value in t.becomes.items():
        node = nodes[pos]
        if value.op is Ops.BUFFER:
            becomes[node] = real(value)
        elif value.op is Ops.RESHAPE and value.src[0].op is Ops.BUFFER:
            becomes[node] = reshape_uop(real(value.src[0]), value.tensor_shape)
        else:
            becomes[node] = graph_substitute(value, {p: real(p) for p in value.toposort() if p.op is Ops.BUFFER})
    return items, becomes


def cached_schedule(
    outs: list[UOp],
    create_schedule: Callable[[list[UOp]], tuple[list[ScheduleItem], dict[UOp, UOp]]],
    w: Walk | None = None,
) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """create_schedule(outs), from the template of an equal-structure graph when one was scheduled before. `w`: the
    walk of outs, where the caller made it already."""
    if not SCHEDULE_CACHE.value:
        return create_schedule(outs)
    if w is None:
        try:
            w = walk(outs)
        except KeyError:  # a BUFFER without a Buffer: schedule it the slow way
            Stats.uncacheable += 1
            return create_schedule(outs)
        assert w is not None
    key = (w.key, tuple([v.value for v in _knob_vars]))  # the graph and the value of every knob
    if (t := _cache.get(key)) is not None:
        Stats.hits += 1
        return _instantiate(t, w)
    Stats.misses += 1
    items, becomes = create_schedule(outs)
    t = _make_template(items, becomes, w)
    if t is None:
        Stats.uncacheable += 1
    else:
        if len(_cache) >= MAX_ENTRIES:
            del _cache[next(iter(_cache))]
        _cache[key] = t
    return items, becomes
