"""Which live tensors read memory a schedule is about to overwrite: one walk over the live lazy graphs together,
each node's memories noted in its UOp._mems slot so that a later walk looks only at what was built since. The engine
(engine/realize.py) computes those readers first, or keeps their old values, before the writes run."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Mapping

from zeptograd.buffers import buffer_under, buffers, view_base
from zeptograd.engine.schedule_cache import _own_dict
from zeptograd.uop.ops import Ops, UOp

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor

_ASSIGN, _BUFFER = Ops.ASSIGN, Ops.BUFFER  # (a global read is cheaper than Ops.X's attribute lookup)
_buffers_data = _own_dict(buffers)  # (buffers' own dict: lookups without WeakKeyDictionary's Python frame)

# Per node, the ids of the Buffers its graph reads (a realized node: the one holding its value), in its UOp._mems
# slot, kept while the node lives: a realize that writes walks only the nodes built since the last one (a live lazy
# graph that grows by a node per iteration of a loop that also writes a buffer costs O(1) per iteration, not its whole
# size). A node realized since it was noted still lists what its graph reads: more, never less, so at worst a reader is
# checked exactly for nothing. (A slot, not a weak map: no weak reference made per node looked up or noted.)
_NO_MEMORY: frozenset[int] = frozenset()


def _memory_of(b: UOp | None) -> frozenset[int]:
    """The memory (id of its Buffer) of a BUFFER node, as a set; none for no node or a node without a Buffer."""
    if b is None or (buf := _buffers_data.get(weakref.ref(b))) is None:
        return _NO_MEMORY
    return frozenset((id(buf),))


def _union_of_sources(src: tuple[UOp, ...]) -> frozenset[int] | None:
    """The memories read by a node with sources `src`, from their UOp._mems; None where one is not known."""
    srcs = [s._mems for s in src]
    if None in srcs:
        return None
    mems = max(srcs, key=len, default=_NO_MEMORY)  # type: ignore[arg-type]  # (the common case: every source reads a
    for m in srcs:  # subset of one)
        if not m <= mems:  # type: ignore[operator]
            mems = mems | m  # type: ignore[operator]
    return mems


live_reader_visits = [0]  # the nodes the last _live_readers walked (a count for tests)


def _live_readers(
    written: Mapping[int, UOp | None],
    becomes: Mapping[UOp, UOp | None],
    realizing: list[Tensor],
    made_before: int | None = None,
) -> tuple[list[Tensor], list[Tensor], list[tuple[Tensor, Tensor]]]:
    """(the live lazy tensors, other than `realizing`, whose graph computes from the contents of a memory in
    `written` before this schedule's writes, the live views of those memories, the readers that are the very value
    a tensor of `realizing` assigns to its whole buffer, with that tensor: they need no kernel of their own). One
    walk over the live tensors' graphs together: a node is visited once whatever the number of tensors above it.
    With `made_before` (a `tensor_clock()` value), only the tensors made before then are looked at."""
    from zeptograd.engine.realize import _realized, _realized_count, _realized_data, view_root, with_realized_values
    from zeptograd.tensor import multi
    from zeptograd.tensor.live import live_tensors

    skip = {id(t) for t in realizing}
    realizing_uops = {t.uop for t in realizing}  # (a sharded reader's parts are new Tensors at every scan)
    reads: dict[UOp, bool] = {}  # node -> whether its value is computed from an overwritten memory's old contents

    def memory_written(b: UOp | None) -> bool:
        return b is not None and (buf := _buffers_data.get(weakref.ref(b))) is not None and id(buf) in written

    def reads_old(root: UOp) -> bool:
        """Whether root's value is computed from an overwritten memory's old contents. The same walk notes the
        memories each node it finishes reads (UOp._mems, kept across calls), so a later call stops at once where a
        graph reads no written memory: one pass over the nodes built since, not one for the memories and one here."""
        stack = [root]
        visits = 0
        expanded: set[UOp] = set()  # the nodes on the stack whose sources were pushed above them: their ancestors
        while stack:
            u = stack[-1]
            if u in reads:
                stack.pop()
                continue
            if any_realized and u._clean != count and (value := _realized_data.get(weakref.ref(u))) is not None:  # a
                # node realized to a buffer view (or a constant): the old contents if that memory is written (a clean
                # node is not realized; none is where nothing realized is alive, and the walk adds none)
                mems = _memory_of(buffer_under(view_root(value)) if value.op is not Ops.CONST else None)
                if u._mems is None:  # (one noted before it was realized lists its graph's: more, kept)
                    u._mems = mems
                if reads.setdefault(u, not written_keys.isdisjoint(mems)):
                    break
            elif (op := u.op) is _BUFFER:
                if (known := u._mems) is None:
                    known = u._mems = _memory_of(u)
                if reads.setdefault(u, not written_keys.isdisjoint(known)):
                    break
            elif op is _ASSIGN and u in becomes:  # the new contents, computed in this schedule (its memories
                reads[u] = False  # are left unknown: its graph is not walked)
            else:
                waiting = hit = False
                for s in u.src:
                    if (r := reads.get(s)) is None:
                        if (known := s._mems) is not None and written_keys.isdisjoint(known):
                            reads[s] = False  # (its graph reads no written memory at all)
                            continue
                        if not any_realized and s.op is _BUFFER:  # (a leaf, decided here rather than pushed)
                            if known is None:
                                known = s._mems = _memory_of(s)
                            r = reads[s] = not written_keys.isdisjoint(known)
                        else:
                            stack.append(s)
                            waiting = True
                            continue
                    if r:  # a source reads old contents: so does u (the other sources need not be looked into)
                        hit = True
                        break
                if hit:
                    reads[u] = True
                    break
                if waiting:
                    expanded.add(u)
                    continue
                src = u.src
                if len(src) == 2:  # (the common case inline: no frame, no generator)
                    s0, s1 = src
                    if u._mems is None and (m0 := s0._mems) is not None and (m1 := s1._mems) is not None:
                        u._mems = m0 if m1 <= m0 else m1 if m0 <= m1 else m0 | m1
                    reads[u] = reads[s0] or reads[s1]
                elif len(src) == 1:
                    if u._mems is None:
                        u._mems = src[0]._mems
                    reads[u] = reads[src[0]]
                else:
                    if u._mems is None:
                        u._mems = _union_of_sources(src)
                    reads[u] = any(reads[s] for s in src)
                if reads[u]:
                    break
            visits += 1
            stack.pop()
        else:
            live_reader_visits[0] += visits
            return reads[root]
        # the walk ended at a node that reads old contents (the top of the stack): so does every node whose sources
        # were pushed and that is not finished (it is on the stack below them: the root among them); the nodes pushed
        # but not looked into are left unknown
        for u in expanded:
            reads.setdefault(u, True)
        live_reader_visits[0] += visits
        return True

    written_keys = written.keys()
    count = _realized_count[0]
    any_realized = bool(_realized_data)
    live_reader_visits[0] = 0

    def may_read_written(root: UOp) -> bool:  # the memories of the graph (kept across calls) meet `written`, or are
        return (mems := root._mems) is None or not written_keys.isdisjoint(mems)  # not known yet (reads_old notes them)

    readers, aliases, stored = [], [], []
    assigned = {t.uop.src[1]: t for t in realizing if t.uop.op is _ASSIGN and view_base(t.uop.src[0]) is not None}
    for value, writer in list(assigned.items()):  # (Tensor.assign wraps a value that reads its target elsewhere)
        if value.op is Ops.CONTIGUOUS:
            assigned.setdefault(value.src[0], writer)
    # a copy of the weak references by dict.copy, which runs no Python code and no weakref callback while it copies
    # (list(d.values()) iterates: a garbage collection on its allocation ran a dead tensor's removal callback and
    # changed the dict mid-iteration); other threads may add tensors meanwhile, and one still being made has no uop
    for ref in list(live_tensors.copy()):
        if made_before is not None and ref.key >= made_before:
            break  # (the dict is in the order the tensors were made)
        if (t := ref()) is None or id(t) in skip or (u := getattr(t, "uop", None)) is None:
            continue
        if u.op is Ops.MULTI:  # a sharded tensor reads through its parts: those that read old contents are computed
            todo = [
                s
                for s in u.src
                if s not in _realized and s not in realizing_uops and may_read_written(s) and reads_old(s)
            ]
            readers += [p for p in multi.parts(t) if p.uop in todo]
            continue
        root = view_root(u)
        if root.op in (_BUFFER, _ASSIGN):
            target = root if root.op is _BUFFER else buffer_under(root.src[0])
            if memory_written(target):
                aliases.append(t)
                continue
            if root.op is _BUFFER:
                continue
        # (an ASSIGN into another buffer reads)
        if weakref.ref(u) in _realized_data or not may_read_written(u) or not reads_old(u):
            continue
        # (Tensor.assign took the value with realized nodes replaced; one that requires grad keeps its graph)
        if assigned and not t.requires_grad and (v := with_realized_values([u])[0]) in assigned:
            stored.append((t, assigned[v]))
        else:
            readers.append(t)
    return readers, aliases, stored
