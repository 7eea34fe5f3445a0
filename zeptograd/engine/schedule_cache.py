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
    fresh_inputs: list[int]  # per ("fresh", k) placeholder: the input whose memory its new BUFFER node is over
    # (_instantiate) per item, its buffers' places among the inputs then the new buffers, made at the first hit
    item_index: list[tuple[ScheduleItem, list[int]]] | None = None
    # (_instantiate) per entry of `becomes`: (position, its BUFFER placeholder, the int shape of a reshape of it or
    # None), or (position, the value, True for a reshape of a BUFFER to a symbolic shape, False for any other value);
    # made at the first hit
    becomes_index: list[tuple[int, UOp, tuple | None | bool]] | None = None


class Stats:
    hits = 0
    misses = 0
    uncacheable = 0


_cache: dict[Any, Template] = {}


def clear():
    _cache.clear()
    _plans.clear()
    _forget_structures()


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


def walk(outs: list[UOp], realized: Any = None, clean: int = -2) -> Walk | None:
    """The graph of `outs` as a cache key, in one iterative walk; None if `realized` maps a node of it to another
    node (it must be replaced by its value first). A KeyError for a BUFFER without a Buffer. `clean`: a node whose
    UOp._clean holds it maps to nothing in `realized` (engine/realize.py: with_realized_values), not looked up."""
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
    # a depth-first walk as UOp.toposort's (first source first), each stack entry a node and the iterator over its
    # sources still to visit; a node is looked up in `realized` as it is entered, keyed as it is left
    stack: list[tuple[UOp, Any]] = []
    push, pop = stack.append, stack.pop
    for root in outs:
        if root in position:
            continue
        if realized is not None and root._clean != clean and _realized_to_other(root, realized, fast_realized):
            return None
        push((root, iter(root.src)))
        while stack:
            u, it = stack[-1]
            for s in it:
                if s not in position:
                    if realized is not None and s._clean != clean and _realized_to_other(s, realized, fast_realized):
                        return None
                    push((s, iter(s.src)))
                    break
            else:
                pop()
                if len(u_src := u.src) == 2:  # (the common cases without a map and its calls)
                    src: tuple[int, ...] = (position[u_src[0]], position[u_src[1]])
                elif len(u_src) == 1:
                    src = (position[u_src[0]],)
                else:
                    src = tuple(map(position.__getitem__, u_src))
                if (op := u.op) is _BUFFER:
                    b = held[weakref.ref(u)]
                    if (i := index.get(id(b))) is None:
                        i = index[id(b)] = len(in_bufs)
                        in_bufs.append(b)
                        in_uops.append(u)
                    arg: Any = ("in", i, u.arg[1])
                elif op is _ASSIGN:  # its arg is a fresh id (every assign is distinct): numbered by order instead
                    arg, n_assign = ("assign", n_assign), n_assign + 1
                else:
                    arg = u.arg
                    if isinstance(arg, float):
                        arg = _arg_key(arg)  # as UOp interning tells args apart: -0.0 is not 0.0
                if look_for_symbols and not symbolic:
                    symbolic = op in _VARIABLE_OPS or variable._arg_has_uop(u)
                position[u] = len(nodes)
                nodes.append(u)
                key.append((op, u.dtype, arg, src))
    key.append((Ops.SINK, tuple([position[u] for u in outs])))
    return Walk(tuple(key), nodes, position, in_bufs, in_uops, symbolic)


_VARIABLE_OPS = frozenset((Ops.BIND, Ops.DEFINE_VAR))


def _realized_to_other(u: UOp, realized: Any, fast_realized: dict | None) -> bool:
    """Whether walk's `realized` maps u to another node (an input buffer may be noted as itself)."""
    if fast_realized is not None:
        return (value := fast_realized.get(weakref.ref(u))) is not None and value is not u
    return u in realized and realized[u] is not u


K = TypeVar("K")
V = TypeVar("V")


def _own_dict(d: weakref.WeakKeyDictionary[K, V]) -> dict[weakref.ref[K], V]:
    """The WeakKeyDictionary's own dict of weak references (CPython's `data` attribute, used as walk's fast path)."""
    return d.data  # type: ignore[attr-defined]  # an implementation attribute typeshed does not declare


_buffers_data = _own_dict(buffers)

# every knob, a live view of ContextVar._cache (knobs are only ever added to it, so their values name them)
_knob_vars = ContextVar._cache.values()
_knobs: list = [-1, (), -1]  # [ContextVar.version, the knobs' values then, their id in _knob_ids]
_knob_ids: dict[tuple, int] = {}  # each set of knob values met -> a number


def knob_values() -> tuple:
    """The value of every knob (part of each key: codegen reads them), read again only after one changed."""
    if _knobs[0] != ContextVar.version:
        _knobs[0], _knobs[1] = ContextVar.version, tuple([v.value for v in _knob_vars])
        # (a fast key holds this int, not the tuple: no hash of every knob's value per lookup)
        _knobs[2] = _knob_ids.setdefault(_knobs[1], len(_knob_ids))
    return _knobs[1]


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
    fresh: dict[UOp, int] = {}  # a BUFFER node the schedule made over an input's memory -> its number
    fresh_inputs: list[int] = []  # per number, the input whose Buffer it is
    for old, new in becomes.items():
        if old not in w.position:
            continue
        mapping: dict[UOp, UOp] = {}
        for n in new.toposort():
            if n.op is Ops.BUFFER:
                b = buffers[n]
                if id(b) in in_index:
                    i = in_index[id(b)]
                    if n is w.in_uops[i]:
                        mapping[n] = _placeholder(n, ("in", i))
                    elif n in w.position:  # another node of the graph over that memory
                        mapping[n] = _placeholder(n, ("node", w.position[n]))
                    else:  # an ASSIGN's new contents: a new node over the target's memory, as create_schedule makes,
                        # so that graphs realized from the old contents never answer for the new ones
                        if n not in fresh:
                            fresh[n] = len(fresh_inputs)
                            fresh_inputs.append(i)
                        mapping[n] = _placeholder(n, ("fresh", fresh[n]))
                elif id(b) in new_index:
                    mapping[n] = _placeholder(n, ("new", new_index[id(b)]))
                else:
                    return None  # a buffer the schedule neither reads nor makes
        tbecomes[w.position[old]] = graph_substitute(new, mapping)
    return Template(titems, new_bufs, tbecomes, fresh_inputs)


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
    if (item_index := t.item_index) is None:  # (every graph of the template has as many inputs: its key numbers them)
        n_in = len(in_bufs)
        item_index = [(item, [i if kind == 0 else n_in + i for kind, i in slots]) for item, slots in t.items]
        t.item_index = item_index
    at = (in_bufs + new).__getitem__
    items = []
    for item, index in item_index:  # (a loop, not a comprehension: that is a call before Python 3.12)
        items.append(_copy_item(item, list(map(at, index))))
    new_uops: dict[tuple[str, int], UOp] = {}

    def real(p: UOp) -> UOp:
        kind, i = tag = p.arg[0]
        if kind == "in":
            return in_uops[i]
        if kind == "node":
            return nodes[i]
        if (u := new_uops.get(tag)) is None:
            b = new[i] if kind == "new" else in_bufs[t.fresh_inputs[i]]
            u = new_uops[tag] = new_buffer_uop(b.device, b.size, b.dtype, b)
        return u

    if (becomes_index := t.becomes_index) is None:
        becomes_index = t.becomes_index = [_becomes_entry(pos, value) for pos, value in t.becomes.items()]
    becomes = {}
    for pos, value, shape in becomes_index:
        if shape is None:  # a BUFFER
            becomes[nodes[pos]] = real(value)
        elif shape is True:  # a reshape of a BUFFER to a symbolic shape
            becomes[nodes[pos]] = reshape_uop(real(value.src[0]), value.tensor_shape)
        elif shape is False:
            becomes[nodes[pos]] = graph_substitute(value, {p: real(p) for p in value.toposort() if p.op is Ops.BUFFER})
        else:  # (reshape_uop's UOp for a shape of ints, its checks made once by _becomes_entry)
            u = real(value)
            becomes[nodes[pos]] = u if shape == u.shape else UOp(_RESHAPE, u.dtype, (u,), shape)
    return items, becomes


def _becomes_entry(pos: int, value: UOp) -> tuple[int, UOp, tuple | None | bool]:
    """A Template.becomes_index entry: how _instantiate makes the value of the node at `pos`."""
    if value.op is Ops.BUFFER:
        return (pos, value, None)
    if value.op is Ops.RESHAPE and value.src[0].op is Ops.BUFFER:
        if any(isinstance(s, UOp) for s in value.tensor_shape):  # (reshape_uop: a SHRINK of the buffer too)
            return (pos, value, True)
        return (pos, value.src[0], tuple(value.tensor_shape))
    return (pos, value, False)


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
    key = (w.key, knob_values())  # the graph and the value of every knob
    if (t := _cache.get(key)) is not None:
        Stats.hits += 1
        last_used[0] = (w, t)
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
        last_used[0] = (w, t)
    return items, becomes


# the walk and the template of the last cached_schedule that hit or made one (realize.py takes it at once, and may
# build a Plan of it)
last_used: list[tuple[Walk, Template] | None] = [None]


# ***** the fast key: a key without a walk of the nodes keyed before *****
# Each node keyed keeps a memo in its UOp._cache_key slot: [generation, structure id, leaves, epoch, used] (a BUFFER
# node's also its Buffer: a lookup in `buffers` compares UOps through their rich comparison, slow), where
# - the structure id is an int naming (op, dtype, arg, the structure ids of its sources, where its sources' leaves fall
#   among its own): ids compose, so keying a graph built on keyed nodes costs only its new nodes, and two graphs of
#   one id have the same walk key (UOps are interned: equal structure over the same BUFFER nodes is the same node);
# - leaves: the BUFFER nodes under it in first-use order (the walk's order of input buffers); None for a BUFFER
#   node, whose leaves are itself (its memo must not hold it: a cycle would keep it and its memory until a collection);
# - epoch: the value of `epoch` when no node under it (itself included) was realized to another node. realize.py
#   advances `epoch` when it notes a node that is the source of a keyed node as realized (every memo is checked
#   again then), and marks the realized node itself unchecked (-1);
# - used: whether the node is the source of a keyed node.
# Graphs with an ASSIGN (its arg is unique: the walk numbers them), a Variable or a BUFFER without a Buffer are not
# keyed here: they take the walk.
# (global reads: Ops.X goes through the enum metaclass's getattr hook)
_BUFFER, _ASSIGN, _RESHAPE = Ops.BUFFER, Ops.ASSIGN, Ops.RESHAPE
_structures: dict[tuple, int] = {}
MAX_STRUCTURES = 1 << 16  # then the ids start again, in a new generation (graphs with ever-new constants)
_generation = [0]
epoch = [0]
_plans: dict[Any, Plan] = {}


def _forget_structures():
    """Start the structure ids again: the plans keyed by the old ids go too (an id may name another structure now)."""
    _structures.clear()
    _plans.clear()
    _generation[0] += 1


def _leaves(u: UOp, memo: list) -> tuple[UOp, ...]:
    return memo[2] if memo[2] is not None else (u,)


def _merge(parts: list[tuple[UOp, ...]]) -> tuple[tuple[UOp, ...], tuple[int, ...] | None]:
    """The leaves of a node whose sources have leaves `parts`, in first-use order, and where each source's fall among
    them: None for their concatenation (no leaf shared), else each one's index (canonical: one mapping, one value)."""
    index: dict[UOp, int] = {}
    where = []
    for part in parts:
        for leaf in part:
            if (i := index.get(leaf)) is None:
                i = index[leaf] = len(index)
            where.append(i)
    leaves = tuple(index)
    return leaves, (tuple(where) if len(leaves) < len(where) else None)


def _key_node(u: UOp) -> bool:
    """Memo u, whose sources have memos of this generation checked at this epoch; False if u is not keyed here."""
    op, src = u.op, u.src
    if op is _BUFFER:
        if (buf := _buffers_data.get(weakref.ref(u))) is None:
            return False
        structure: tuple = (op, u.dtype, u.arg[1], src[0]._cache_key[1])  # type: ignore[index]
        if (sid := _structures.get(structure)) is None:
            sid = _structures[structure] = len(_structures)
        # (itself: _leaves), and its Buffer (a BUFFER node's never changes): a plan reads it here, not in `buffers`
        u._cache_key = [_generation[0], sid, None, epoch[0], False, buf]
        return True
    elif op is _ASSIGN or (variable.in_use and (op is Ops.BIND or op is Ops.DEFINE_VAR or variable._arg_has_uop(u))):
        return False
    else:
        arg = u.arg
        if isinstance(arg, float):
            arg = _arg_key(arg)
        where: tuple | None = None  # (_merge)
        sids: tuple
        leaves: tuple
        if not src:
            leaves, sids = (), ()
        elif len(src) == 1:
            m = src[0]._cache_key
            leaves, sids = _leaves(src[0], m), (m[1],)  # type: ignore[arg-type, index]
        elif len(src) == 2:  # (the common case, without the general merge)
            m, m2 = src[0]._cache_key, src[1]._cache_key
            first = m[2] if m[2] is not None else (src[0],)  # type: ignore[index]  # (_leaves, inline)
            second = m2[2] if m2[2] is not None else (src[1],)  # type: ignore[index]
            sids = (m[1], m2[1])  # type: ignore[index]
            if not first or not second:
                leaves = first or second
            elif len(first) == 1 and len(second) == 1:
                if first[0] is second[0]:
                    leaves, where = first, (0, 0)
                else:
                    leaves = first + second
            else:
                leaves, where = _merge([first, second])
        else:
            sids = tuple([s._cache_key[1] for s in src])  # type: ignore[index]
            leaves, where = _merge([_leaves(s, s._cache_key) for s in src])  # type: ignore[arg-type]
        structure = (op, u.dtype, arg, sids, where)
    if (sid := _structures.get(structure)) is None:
        sid = _structures[structure] = len(_structures)
    u._cache_key = [_generation[0], sid, leaves, epoch[0], False]
    return True


def _check(root: UOp, realized: dict) -> bool:
    """Memo every node under root not memoed in this generation or not checked at this epoch, sources first (an
    explicit stack); False where a node is realized to another node or is not keyed here."""
    gen, ep = _generation[0], epoch[0]
    stack = [root]
    while stack:
        u = stack[-1]
        m = u._cache_key
        if m is not None and m[3] == ep and m[0] == gen:
            stack.pop()
            continue
        waiting = False
        for s in u.src:
            if (sm := s._cache_key) is None or sm[3] != ep or sm[0] != gen:
                stack.append(s)
                waiting = True
        if waiting:
            continue
        stack.pop()
        if not _memo_ready(u, m, realized, gen, ep):
            return False
    return True


def _memo_ready(u: UOp, m: list | None, realized: dict, gen: int, ep: int) -> bool:
    """Memo u, whose sources are memoed at this epoch (m: its memo of an older one, or None); False where u is realized
    to another node or is not keyed here. Its sources are marked as read by a memoed node."""
    if realized and (value := realized.get(weakref.ref(u))) is not None and value is not u:
        return False
    if m is not None and m[0] == gen:
        m[3] = ep
    elif not _key_node(u):
        return False
    for s in u.src:
        s._cache_key[4] = True  # type: ignore[index]
    return True


def fast_key(outs: list[UOp], realized: dict) -> tuple[Any, tuple[UOp, ...]] | None:
    """(the key of the graph of `outs` with every knob's value, its input BUFFER nodes in first-use order), or None
    where the graph holds a node realized to another node (`realized`: _realized's own dict) or a node not keyed
    here. Only the nodes not keyed before, or under a node realized since, are visited."""
    if len(_structures) > MAX_STRUCTURES:
        _forget_structures()
    gen, ep = _generation[0], epoch[0]
    for u in outs:
        if (m := u._cache_key) is not None and m[3] == ep and m[0] == gen:
            continue
        for s in u.src:  # (the common case inline: a new node on checked ones, (a+b).realize())
            if (sm := s._cache_key) is None or sm[3] != ep or sm[0] != gen:
                if not _check(u, realized):
                    return None
                break
        else:  # (_memo_ready, inline)
            if realized and (value := realized.get(weakref.ref(u))) is not None and value is not u:
                return None
            if m is not None and m[0] == gen:
                m[3] = ep
            elif not _key_node(u):
                return None
            for s in u.src:
                s._cache_key[4] = True  # type: ignore[index]
    if _knobs[0] != ContextVar.version:
        knob_values()
    if len(outs) == 1:
        m = outs[0]._cache_key
        return (m[1], _knobs[2]), (m[2] if m[2] is not None else (outs[0],))  # type: ignore[index]  # (_leaves)
    sids = tuple([u._cache_key[1] for u in outs])  # type: ignore[index]
    leaves, where = _merge([_leaves(u, u._cache_key) for u in outs])  # type: ignore[arg-type]
    return (sids, where, _knobs[2]), leaves


@dataclasses.dataclass
class Plan:
    """A template made ready to run for the graphs of one fast key: no ScheduleItem, Walk or UOp is built for a run.
    Buffers by index: the graph's input Buffers (its leaves' in order), then the new ones."""

    n_in: int
    new_bufs: list[tuple[str, int, Any]]  # (device, size, dtype) of each new Buffer
    calls: list[tuple]  # per kernel: (its compiled-kernel cache key, the index of each of its buffers, bytes it moves)
    outs: list[tuple[int, tuple | None] | None]  # per output: (buffer index, shape of a reshape or None) of its value,
    # or None: it stays what it is
    check_capacity: bool  # a buffer of over 128 MiB: its device's capacity is checked before the first kernel
    # (kernels._plan_kernels) per call: (its compiled kernel, index, bytes), found in the compiled-kernel cache
    # `runs_cache` when it held `runs_len` kernels; None until a run looked them up
    runs: list[tuple] | None = None
    runs_cache: dict | None = None
    runs_len: int = 0


def make_plan(
    key: Any,
    leaves: tuple[UOp, ...],
    outs: list[UOp],
    template: tuple[Walk, Template],
    kernel_key: Callable[[Any], Any],
) -> Plan | None:
    """The Plan of the template `cached_schedule` used for `outs` (whose fast key is `key`; `template`: that walk and
    template), remembered under the key; None where the template does not fit one (a value that is not a view of one
    buffer, a value noted for a node other than an output). `kernel_key`: ScheduleItem -> its compiled-kernel cache
    key (realize.py)."""
    w, t = template
    if (
        any(u not in w.position for u in outs)
        or w.key[-1] != (Ops.SINK, tuple([w.position[u] for u in outs]))
        or len(w.in_uops) != len(leaves)
        or any(a is not b for a, b in zip(w.in_uops, leaves))
    ):  # (the template of another graph; or two BUFFER nodes of one Buffer, which the walk numbers once)
        return None
    n_in = len(leaves)
    sizes = [b.size * b.dtype.itemsize for b in w.in_bufs] + [size * dt.itemsize for _, size, dt in t.new_bufs]
    calls = []
    for item, slots in t.items:
        index = [i if kind == 0 else n_in + i for kind, i in slots]
        calls.append((kernel_key(item), index, sum(sizes[i] for i in index)))
    positions = {w.position[u] for u in outs}
    if any(pos not in positions for pos in t.becomes):
        return None
    out_specs: list[tuple[int, tuple | None] | None] = []
    for u in outs:
        if (value := t.becomes.get(w.position[u])) is None:
            out_specs.append(None)
            continue
        shape = None
        if value.op is Ops.RESHAPE:
            shape, value = value.tensor_shape, value.src[0]
        if value.op is not Ops.BUFFER:
            return None
        kind, i = value.arg[0]
        if kind not in ("in", "new"):  # (a node of the graph, an ASSIGN's new contents: none in a fast-keyed graph)
            return None
        out_specs.append((i if kind == "in" else n_in + i, shape))
    plan = Plan(n_in, t.new_bufs, calls, out_specs, any(n > 1 << 27 for n in sizes))
    if len(_plans) >= MAX_ENTRIES:
        del _plans[next(iter(_plans))]
    _plans[key] = plan
    return plan
