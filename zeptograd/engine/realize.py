"""Running a schedule: each kernel compiled once (engine/kernels.py, cached by its graph), its buffers allocated,
the kernel called."""

from __future__ import annotations

import os
import threading
import time
import weakref
from sys import getrefcount
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from zeptograd.buffers import buffer_under, buffers, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import Buffer, Device, GlobalCounters, allocated_buffer, check_capacity
from zeptograd.dtype import dtypes
from zeptograd.engine import schedule_cache
from zeptograd.engine.kernels import _kernel_cache, _plan_kernels, get_kernel, kernel_key
from zeptograd.engine.live_readers import _live_readers
from zeptograd.engine.schedule_cache import cached_schedule
from zeptograd.helpers import DEBUG, VIZ, ArgumentError, gc_paused, prod
from zeptograd.schedule.fold import uniform_const
from zeptograd.schedule.rangeify import ScheduleItem, create_schedule, substitute_realized
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.upat import graph_substitute

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor

# a lazy node that was realized -> the buffer view (or constant) holding its value, while the node lives
_realized: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# Each Buffer's `readers` lists weak references to the nodes in `_realized` whose value is a view of its memory: an
# ASSIGN into the memory changes it under them, so they are forgotten (a later equal graph is computed again, not
# read from the changed buffer). Plain references without callbacks, on the Buffer (a weak map keyed by the BUFFER
# node cost a callback per buffer): the dead ones are dropped when the list reaches a power of two, so it stays
# within twice the live ones.
# A node whose graph holds no node of `_realized` (substituting realized values leaves it as it is) is marked clean:
# its UOp._clean slot holds the count of nodes realized then (`_realized_count`), so realizing any node, which may sit
# under it, unmarks every node at once. The walks below stop at clean nodes, so an assign walks only what was built
# since the last one (a loop of N setitems on one tensor is O(N) in all, not a walk of the whole growing chain per
# setitem). (A slot, not a weak set: no weak reference made per node looked up or marked.)
# the WeakKeyDictionaries' own dicts of weak references, for lookups and stores on every realize without a Python
# frame (schedule_cache._own_dict)
_realized_data = schedule_cache._own_dict(_realized)
# the callback its references carry: the dict's own pop, which drops a dead node's entry without WeakKeyDictionary's
# Python frame (nothing iterates _realized, so its iteration guard is moot)
_realized_remove = _realized_data.pop
_epoch = schedule_cache.epoch
_fast_key = schedule_cache.fast_key
_plans = schedule_cache._plans
_cache_on = schedule_cache.SCHEDULE_CACHE
_buffers_data = schedule_cache._own_dict(buffers)
_realized_count = [0]  # nodes realized so far: a walk that raced a realize in another thread marks nothing
# a pending ASSIGN that a later assign to the same target folded into (Tensor.assign) -> that later ASSIGN. It never
# runs: a graph that reads it computes its value instead (`_without_superseded`), a view of it follows the chain.
_superseded: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
_superseded_data = schedule_cache._own_dict(_superseded)  # (its own dict: WeakKeyDictionary's len is a Python call)
# ops that give a view of their source's memory, as torch's views: a tensor made of these over a buffer (or over an
# ASSIGN into one) shows later writes into the buffer; any other op reads the values the buffer holds then
_VIEW_OPS = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.FLIP, Ops.DETACH)
_ASSIGN, _BUFFER = Ops.ASSIGN, Ops.BUFFER  # (a global read is cheaper than Ops.X's attribute lookup)
_NAMING_VIEW_OPS = frozenset((Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP))  # buffer_under's: each element once


class _ThreadCaptures(threading.local):
    """A stack of captures per thread (list-like: truthy while this thread captures, [-1] the innermost): a kernel
    another thread runs during a capture is not this thread's jit's, and its host reads are not refused."""

    def __init__(self):
        self.stack: list = []

    def __bool__(self) -> bool:
        return bool(self.stack)

    def __len__(self) -> int:
        return len(self.stack)

    def __getitem__(self, i):
        return self.stack[i]

    def append(self, capture):
        _captures_running.append(None)
        self.stack.append(capture)

    def pop(self):
        _captures_running.pop()
        return self.stack.pop()


# one entry per capture running in any thread (list.append/pop are atomic): while it is empty, no thread captures,
# and a TinyJit replay need not read its own thread's stack (a thread-local attribute read is slow)
_captures_running: list[None] = []


# TinyJit (engine/jit.py) capturing in this thread: run_schedule appends each ScheduleItem it runs to
# _capturing[-1], and _schedule reuses only the realized values in _capturing[-1].realized (those that don't read
# the jit's inputs)
_capturing = _ThreadCaptures()

# Threads: one process-wide lock serializes realize, schedule, numpy and TinyJit replays (graph building runs
# unlocked). It is reentrant (a jitted function realizes; a nested TinyJit). A forked child gets a new one: a
# thread that held it in the parent does not exist there. (Not acquired before the fork: a realizing thread may
# wait for a lock another library takes in its own before-fork hook, concurrent.futures' shutdown lock, say.)
engine_lock = threading.RLock()


def _new_engine_lock_in_child():
    global engine_lock
    engine_lock = threading.RLock()  # a `with` the forking thread is in releases the old lock object it holds


os.register_at_fork(after_in_child=_new_engine_lock_in_child)


# ***** what the layers above the engine (tensor/, nn/) may ask; the state above stays private to engine/ *****


def is_capturing() -> bool:
    """Whether a TinyJit is capturing in this thread (host reads of tensor values can't be replayed then)."""
    return bool(_capturing)


def current_capture():
    """This thread's innermost TinyJit capture: checks that must run again on every replay append to it."""
    return _capturing[-1]


def realized_value(u: UOp) -> UOp:
    """What the lazy node u was realized to (a buffer view or a constant), or u itself if it was not."""
    return _realized_data.get(weakref.ref(u), u)  # (its own dict: no frame)


def realized_or_none(u: UOp) -> UOp | None:
    return _realized_data.get(weakref.ref(u))


def with_realized_values(uops: list[UOp]) -> list[UOp]:
    """uops with every node realized before replaced by what it was realized to. The walk stops at nodes known to
    hold none (clean); where it finds none, the nodes it walked are marked so."""
    if not _realized_data:  # nothing realized is alive: nothing to replace (nor to mark: every lookup finds nothing)
        return uops
    count = _realized_count[0]
    ref, realized = weakref.ref, _realized_data  # (_realized's own dict: no frame per node)
    seen: set[UOp] = set()
    mapping: dict[UOp, UOp] = {}
    stack = [u for u in uops if u._clean != count]
    while stack:
        u = stack.pop()
        if u in seen:
            continue
        seen.add(u)
        if (v := realized.get(ref(u))) is not None:  # (not walked below: its value stands for its graph)
            if v is not u:
                mapping[u] = v
            continue
        for s in u.src:
            if s._clean != count and s not in seen:
                stack.append(s)
    if mapping:
        return list(graph_substitute(UOp(Ops.SINK, dtypes.void, tuple(uops)), mapping).src)
    if count == _realized_count[0]:
        for u in seen:
            u._clean = count
    return uops


def view_root(u: UOp) -> UOp:
    """The node under u's chain of view ops (_VIEW_OPS): a BUFFER or an ASSIGN if u is a view of memory."""
    while u.op in _VIEW_OPS:
        u = u.src[0]
    return u


def is_memory_view(u: UOp) -> bool:
    """Whether u is a view (at least one view op) of a buffer's memory that is not the whole buffer as it is."""
    return u.op in _VIEW_OPS and view_root(u).op in (_BUFFER, _ASSIGN) and view_base(u) is None


def tensor_clock() -> int:
    """A number above that of every Tensor made so far (TinyJit notes it when a capture begins)."""
    from zeptograd.tensor.live import _tensor_ids

    return next(_tensor_ids)


def forget_realized(u: UOp) -> None:
    """Drop what u was realized to (a copy of a view read once: the view's buffer may be written in place later)."""
    _realized.pop(u, None)


def note_superseded(old: UOp, new: UOp) -> None:
    """Tensor.assign folded the pending ASSIGN `old` into `new` (same target): `old` is never run."""
    _superseded[old] = new


def current_view(u: UOp) -> UOp:
    """u, or, if u is a view of an ASSIGN folded into later ones, the same view of the last of them: a view shows the
    tensor's latest contents, as a torch view does."""
    root = view_root(u)
    if not _superseded_data or weakref.ref(root) not in _superseded_data:  # (its own dict: no frame)
        return u
    head = root
    while head in _superseded:
        head = _superseded[head]
    return u.substitute({root: head})


def _without_superseded(uops: list[UOp], realized) -> list[UOp]:
    """uops with every superseded ASSIGN replaced by its value (what the buffer held after it, computed from the
    contents before the chain of folded assigns: the buffer is written only by the chain's last ASSIGN)."""
    while True:
        sink = UOp(Ops.SINK, dtypes.void, tuple(uops))
        mapping = {u: u.src[1] for u in sink.toposort(gate=lambda u: u not in realized) if u in _superseded}
        if not mapping:
            return uops
        uops = list(graph_substitute(sink, mapping).src)


# memory (id of its Buffer) -> the live tensors holding a write into it that has not run (an ASSIGN, from
# Tensor.assign): a view of that memory read before the write runs runs it first and shows it, as a torch view does.
# Per memory, id of the tensor -> a weak reference to it (keyed by id: a Tensor's == is an op); plain references
# without callbacks, not a WeakValueDictionary (its Python-level construction, stores and iteration cost every
# parameter of an optimizer step a few frames): a dead tensor's entry is dropped by the next `_writes_into` of its
# memory, as one whose write ran.
_pending_writes: dict[int, dict[int, weakref.ref[Tensor]]] = {}


def note_pending_write(t: Tensor) -> None:
    """t.uop is a new ASSIGN into a buffer's memory."""
    target = buffer_under(t.uop.src[0])
    if target is not None and (buf := _buffers_data.get(weakref.ref(target))) is not None:
        if (writers := _pending_writes.get(id(buf))) is None:
            writers = _pending_writes[id(buf)] = {}
        writers[id(t)] = weakref.ref(t)


def _writes_into(mem: int) -> list[Tensor]:
    """The live tensors whose write into memory `mem` has not run (the set is pruned of the others)."""
    writers = _pending_writes.get(mem)
    if writers is None:
        return []
    live = []
    for key, ref in list(writers.items()):
        if (w := ref()) is not None:
            root = view_root(w.uop)
            target = (
                buffer_under(root.src[0]) if root.op is _ASSIGN and weakref.ref(root) not in _realized_data else None
            )
            if target is not None and (buf := _buffers_data.get(weakref.ref(target))) is not None and id(buf) == mem:
                live.append(w)
                continue
        del writers[key]
    if not live:
        del _pending_writes[mem]
    return live


def _writes_seen_by_views(tensors: list[Tensor]) -> list[Tensor]:
    """The tensors holding writes that have not run into the memory a tensor of `tensors` is a view of (the whole
    buffer or part of it): made after the view, they are what the view shows."""
    if not _pending_writes:
        return []
    found: dict[int, Tensor] = {}
    for t in tensors:
        root = view_root(t.uop)
        # one writer only: writes by several view tensors into one memory were each built on its old contents, and
        # run together they can't be ordered (README: deliberate differences)
        if (
            root.op is _BUFFER
            and (buf := _buffers_data.get(weakref.ref(root))) is not None
            and len(writers := _writes_into(id(buf))) == 1
        ):
            found |= {id(w): w for w in writers if w is not t}
    return list(found.values())


def note_built(u: UOp) -> None:
    """Mark u, just built from parts that went through with_realized_values, as holding no realized node (checked:
    a rebuilt node may be one realized before), so the next with_realized_values over a graph above it stops there."""
    with_realized_values([u])


def run_schedule(items: list[ScheduleItem], var_vals: dict[str, int] | None = None):
    """Run each kernel; `var_vals` gives the value of each Variable (uop/variable.py) the kernels take."""
    with engine_lock:
        _run_schedule(items, var_vals)


def _run_schedule(items: list[ScheduleItem], var_vals: dict[str, int] | None):
    big = False  # (check_capacity's first test, inline: it asks only about a buffer of over 128 MiB not allocated)
    for item in items:
        for b in item.bufs:
            if b._allocator is None and b.size * b.dtype.itemsize > 1 << 27:
                big = True
    if big:
        check_capacity([b for item in items for b in item.bufs])
    viz, debug = VIZ.value, DEBUG.value
    capturing = _capturing.stack
    counters = GlobalCounters
    for item in items:
        if capturing:
            capturing[-1].append(item)
        bufs = item.bufs
        kernel = get_kernel(item.device, item.ast, bufs)
        ptrs = []
        mem = 0
        for b in bufs:
            if (p := b._ptr) is None:
                p = b.ptr  # (allocates it, before the clock starts)
            ptrs.append(p)
            mem += b.size * b.dtype.itemsize
        t0 = perf_counter()
        if kernel.vars:
            if var_vals is None or any(v not in var_vals for v in kernel.vars):
                raise ArgumentError(
                    f"kernel {kernel.name} takes the Variables {kernel.vars}: run_schedule needs their "
                    f"values (var_vals), got {var_vals}"
                )
            kernel.program(*ptrs, vals=tuple(var_vals[v] for v in kernel.vars))
        elif (direct := kernel.direct) is not None and direct[2] is kernel.program:
            fn, wrap, _ = direct
            if wrap is None:
                fn(*ptrs)
            else:
                fn(*map(wrap, ptrs))
        else:
            kernel.program(*ptrs)
        dt = perf_counter() - t0
        counters.kernel_count += 1
        counters.time_sum_s += dt
        counters.global_ops += kernel.n_ops
        counters.global_mem += mem
        if viz:
            from zeptograd.viz import record as viz_record

            viz_record.kernel_ran(item.device, item.ast, kernel.name, dt, mem)
        if debug >= 2:
            print(
                f"*** {item.device:<7} {GlobalCounters.kernel_count:5d} {kernel.name:<28} "
                f"{dt * 1e6:9.1f} us  {kernel.n_ops / dt * 1e-9 if dt else 0:8.2f} GFLOPS "
                f"{mem / dt * 1e-9 if dt else 0:8.2f} GB/s"
            )


def _schedule(
    tensors: list[Tensor], template_out: list | None = None
) -> tuple[list[ScheduleItem], list[UOp], dict[UOp, UOp], dict[str, int]]:
    """The schedule realizing `tensors`: its items, the graph's outputs, what each realized node becomes, the values
    of its Variables. `template_out`: the schedule cache's (Walk, Template) it used, if any, is appended to it."""
    uops = [t.uop for t in tensors]
    t0 = time.perf_counter() if DEBUG.value >= 1 else 0.0
    realized = _realized if not _capturing.stack else _capturing[-1].realized
    if _superseded_data:  # (the dict itself: WeakKeyDictionary's len is a Python call)
        uops = _without_superseded(uops, realized)
    try:  # one walk: the schedule cache's key, and whether a node was realized before
        clean = _realized_count[0] if realized is _realized else -2  # (clean: no node of _realized under it)
        w = schedule_cache.walk(uops, realized, clean) if schedule_cache.SCHEDULE_CACHE.value else None
    except KeyError:  # a BUFFER without a Buffer: cached_schedule says so
        w = None
    outs = uops if w is not None else substitute_realized(uops, realized)
    var_vals: dict[str, int] = {}
    symbolic = w.symbolic if w is not None else variable.in_use and variable.has_symbols(outs)
    schedule = create_schedule
    if VIZ.value:  # records the schedule (zeptograd/viz/record.py)
        from zeptograd.viz import record as viz_record

        schedule = viz_record.recorded_schedule(create_schedule)
    if symbolic:  # schedule the unbound graph: one schedule for all values
        unbound, var_vals, done = variable.strip_binds(outs)
        items, ubecomes = cached_schedule(unbound, schedule)
        back = {v: k for k, v in done.items()}
        becomes = {back[k]: variable.rebind(v, var_vals) for k, v in ubecomes.items() if k in back}
    else:
        items, becomes = cached_schedule(outs, schedule, w)  # create_schedule, or an equal graph's template
    template = schedule_cache.last_used[0]  # (taken at once: the walk holds the graph's Buffers)
    schedule_cache.last_used[0] = None
    if template_out is not None:
        template_out.append(template)
    if DEBUG.value >= 1:
        n, ms = len(items), (time.perf_counter() - t0) * 1e3
        print(f"scheduled {n} kernel{'s' if n != 1 else ''} in {ms:.2f} ms")
    return items, outs, becomes, var_vals


def schedule_tensors(tensors: list[Tensor]) -> list[ScheduleItem]:
    """The kernels that would realize `tensors`, in order, without running them."""
    with engine_lock:
        return _schedule(tensors)[0]


def remember_realized(node: UOp, value: UOp):
    if value is node:  # (a buffer realized again): the entry would hold its own weak key alive, and say nothing
        return
    if (memo := node._cache_key) is not None:  # the schedule cache's fast key checks it (and above it) again
        memo[3] = -1
        if memo[4]:
            _epoch[0] += 1
    _realized_data[weakref.ref(node, _realized_remove)] = value  # _realized[node] = value, without its Python frame
    _realized_count[0] += 1  # (every node marked clean is unmarked)
    if _capturing.stack:  # this thread's capture may reuse it: a kernel it recorded computed it (engine/jit.py)
        _capturing[-1].realized.computed.add(node)
    buf = value
    while buf.op in _NAMING_VIEW_OPS:  # (buffer_under, inline)
        buf = buf.src[0]
    if buf.op is _BUFFER and (b := _buffers_data.get(weakref.ref(buf))) is not None:
        if (readers := b.readers) is None:
            b.readers = [weakref.ref(node)]
            return
        readers.append(weakref.ref(node))
        if len(readers) >= 8 and not len(readers) & (len(readers) - 1):
            readers[:] = [r for r in readers if r() is not None]


def forget_written(buf: UOp):
    """Buffer `buf` was written by an ASSIGN: the graphs realized into its memory no longer hold their value there."""
    if (b := _buffers_data.get(weakref.ref(buf))) is not None and (readers := b.readers) is not None:
        b.readers = None
        for ref in readers:
            if (node := ref()) is not None:
                _realized.pop(node, None)


def realize_tensors(tensors: list[Tensor]):
    with engine_lock:
        fast = None
        if (
            not (_superseded_data or _capturing.stack or VIZ.value or DEBUG.value)
            and _cache_on.value
            and not (_pending_writes and _writes_seen_by_views(tensors))
        ):
            # the schedule cache's plan for a graph keyed before (no walk, no ScheduleItem, no template instantiated);
            # not for a write (never keyed: fast_key would walk its graph, then refuse at the ASSIGN)
            # (no local holds an output node: _run_plan notes a node as realized only if something else holds it)
            if len(tensors) == 1:
                if tensors[0].uop.op is _ASSIGN:
                    return _realize_tensors(tensors)
                fast = _fast_key([tensors[0].uop], _realized_data)
            else:
                if any(t.uop.op is _ASSIGN for t in tensors):
                    return _realize_tensors(tensors)
                fast = _fast_key([t.uop for t in tensors], _realized_data)
            if fast is not None and (plan := _plans.get(fast[0])) is not None and _run_plan(plan, fast[1], tensors):
                schedule_cache.Stats.hits += 1
                return
        _realize_tensors(tensors, fast)


@gc_paused  # (not the plan path above: it builds a handful of objects)
def _realize_tensors(tensors: list[Tensor], fast: tuple | None = None):
    """Realize `tensors` in one schedule. `fast`: their graph's fast key (realize_tensors found no plan for it)."""
    if _superseded_data:
        for t in tensors:
            t.uop = current_view(t.uop)
    # writes into memory a tensor is a view of run first; the views move to the memory's new contents
    if _pending_writes and (writes := _writes_seen_by_views(tensors)):
        _realize_tensors(writes)
    template: list = []
    readers: list[Tensor] = []
    aliases: list[Tensor] = []
    stored: list[tuple[Tensor, Tensor]] = []
    if (predicted := _predicted_writes(tensors)) is not None:
        # the live readers of what the tensors' own ASSIGNs overwrite, found before scheduling: one schedule, not two
        pred_written, pred_assigns = predicted
        readers, aliases, stored = _live_readers(pred_written, pred_assigns, tensors)
        items, outs, becomes, var_vals = _schedule(tensors + readers, template)
        written = _written(becomes)
        if (
            written.keys() != pred_written.keys()
            # (by their unique ids: create_schedule also notes what the ASSIGNs it folded became)
            or {u.arg for u in becomes if u.op is _ASSIGN} != {u.arg for u in pred_assigns}
            or any(r.uop.op is _ASSIGN for r in readers)
        ):  # the graph writes more than the tensors' own ASSIGNs: the general way below, from the start
            readers, aliases, stored, predicted = [], [], [], None
            template.clear()
    if predicted is None:
        items, outs, becomes, var_vals = _schedule(tensors, template)
        written = _written(becomes)
    if written and _capturing.stack and (made_before := getattr(_capturing[-1], "first_tensor", None)) is not None:
        # readers made before a TinyJit capture began are computed outside it: a replay must not compute them again
        # (into their buffers, changing tensors the caller holds); those the jitted function made are captured
        if outside := _live_readers(written, becomes, tensors, made_before)[0]:
            stack, _capturing.stack = _capturing.stack, []
            try:
                _realize_tensors(outside)
            finally:
                _capturing.stack = stack
            items, outs, becomes, var_vals = _schedule(tensors)
            written = _written(becomes)
    # live tensors that read what is overwritten are computed first, in the same schedule (found above, if predicted)
    while written and predicted is None:
        found, aliases, stored = _live_readers(written, becomes, tensors + readers)
        if not found:
            break
        readers += found
        items, outs, becomes, var_vals = _schedule(tensors + readers)
        written = _written(becomes)
    keep = [(t, t.uop) for t in readers if t.requires_grad]  # as Tensor.realize: their graph stays for backward
    tensors = tensors + readers
    _run_schedule(items, var_vals)
    if fast is not None and template[0] is not None and not readers:  # (a fast key: no ASSIGN, Variable, realized node)
        schedule_cache.make_plan(fast[0], fast[1], outs, template[0], lambda item: kernel_key(item.device, item.ast))
    for old in becomes:
        if old.op is _ASSIGN:
            target = buffer_under(old.src[0])
            assert target is not None, "an ASSIGN's target is a view of a buffer"
            forget_written(target)
    noted = {}  # node -> value remembered in the first loop, not noted twice
    capture_readers = getattr(_capturing[-1], "reader_bufs", None) if _capturing.stack and readers else None
    reader_ids = {id(r) for r in readers} if capture_readers is not None else ()
    for t, out in zip(tensors, outs):
        new = becomes.get(out, out)
        if capture_readers is not None and id(t) in reader_ids and (b := view_base(new)) is not None:
            capture_readers.add(id(buffers[b]))  # (TinyJit need not replay a kernel that only computes these)
        if new is not t.uop:
            remember_realized(t.uop, new)
            noted[t.uop] = new
            t.uop = new
    for old, new in becomes.items():
        if noted.get(old) is not new:
            remember_realized(old, new)
    for t, u in keep:
        t.uop = u
    if aliases:
        _move_views(aliases, written)
    if written and _pending_writes:
        for mem in written.keys() & _pending_writes.keys():  # the writes that ran leave the pending ones
            _writes_into(mem)
    for t, owner in stored:  # its value is what the owner's ASSIGN stored: a copy of that, made only if it is read
        t.uop = UOp(Ops.CONTIGUOUS, t.dtype, (owner.uop,))  # (or if that buffer is written again while t lives)


def _predicted_writes(tensors: list[Tensor]) -> tuple[dict[int, UOp | None], dict[UOp, None]] | None:
    """(the memories written, the ASSIGNs run) by realizing `tensors`, as `_written` and the schedule's `becomes` will
    say, where that is the tensors' own pending ASSIGNs (an optimizer step: each parameter's update); None where none
    is or a capture runs (_realize_tensors checks the prediction against the schedule)."""
    if not _pending_writes or _capturing.stack:
        return None
    written: dict[int, UOp | None] = {}
    assigns: dict[UOp, None] = {}
    for t in tensors:
        u = t.uop
        if u.op is _ASSIGN and weakref.ref(u) not in _realized_data:  # (the maps' own dicts: no frame)
            if (target := buffer_under(u.src[0])) is None or (b := _buffers_data.get(weakref.ref(target))) is None:
                return None
            written[id(b)] = None
            assigns[u] = None
    return (written, assigns) if assigns else None


def _run_plan(plan: schedule_cache.Plan, leaves: tuple[UOp, ...], tensors: list[Tensor]) -> bool:
    """Realize `tensors` by a Plan of the schedule cache (their graph's inputs: `leaves`): allocate, run the kernels,
    point each tensor at its value. False, having done nothing, where two inputs are one Buffer."""
    if len(leaves) == 2:  # (the common case: a binary op's two inputs)
        bufs = [leaves[0]._cache_key[5], leaves[1]._cache_key[5]]  # type: ignore[index]  # (their Buffers, in the
        if bufs[0] is bufs[1]:  # memos fast_key just checked); the walk numbers one Buffer once: another template
            return False
    else:
        bufs = []
        for leaf in leaves:
            bufs.append(leaf._cache_key[5])  # type: ignore[index]
        if len(bufs) > 2 and len({id(b) for b in bufs}) < len(bufs):
            return False
    if ((runs := plan.runs) is None or plan.runs_cache is not _kernel_cache or len(_kernel_cache) < plan.runs_len) and (
        runs := _plan_kernels(plan)
    ) is None:  # (its kernels, looked up again only where the cache changed)
        return False
    if plan.check_capacity:
        for device, size, dtype in plan.new_bufs:
            bufs.append(Buffer(device, size, dtype))
        check_capacity(bufs)
    else:  # each allocated now, with its handle (Buffer.ptr's work, in one frame), before the first kernel's clock
        opened = Device._opened
        for device, size, dtype in plan.new_bufs:
            bufs.append(allocated_buffer(device, size, dtype, (opened.get(device) or Device[device]).allocator))
    counters = GlobalCounters
    for kernel, index, mem in runs:
        ptrs = []
        for i in index:
            if (p := bufs[i]._ptr) is None:
                p = bufs[i].ptr  # (allocates it, before the clock starts)
            ptrs.append(p)
        direct = kernel.direct
        t0 = perf_counter()
        if direct is not None and direct[2] is kernel.program:
            if direct[1] is None:
                direct[0](*ptrs)
            else:
                direct[0](*map(direct[1], ptrs))
        else:
            kernel.program(*ptrs)
        counters.time_sum_s += perf_counter() - t0
        counters.kernel_count += 1
        counters.global_ops += kernel.n_ops
        counters.global_mem += mem
    n_in = len(leaves)
    if len(tensors) == 1:  # (the loop below for one tensor, without its zip and dict)
        if (spec := plan.outs[0]) is None:
            return True
        i, shape = spec
        t = tensors[0]
        node = t.uop
        if i < n_in:  # a view of an input
            t.uop = value = leaves[i] if shape is None else reshape_uop(leaves[i], shape)
            remember_realized(node, value)
            return True
        b = bufs[i]
        out_uop = new_buffer_uop(b.device, b.size, b.dtype, b)
        t.uop = value = out_uop if shape is None else reshape_uop(out_uop, shape)
        if getrefcount(node) > 2:  # (`node` and getrefcount's argument): something else holds the node, note it
            remember_realized(node, value)
        return True
    made: dict[int, UOp] = {}
    for t, spec in zip(tensors, plan.outs):
        if spec is None:
            continue
        i, shape = spec
        node = t.uop
        if i < n_in:  # a view of an input
            t.uop = value = leaves[i] if shape is None else reshape_uop(leaves[i], shape)
            remember_realized(node, value)
            continue
        if (buf_uop := made.get(i)) is None:
            b = bufs[i]
            buf_uop = made[i] = new_buffer_uop(b.device, b.size, b.dtype, b)
        t.uop = value = buf_uop if shape is None else reshape_uop(buf_uop, shape)
        if getrefcount(node) > 2:  # (`node` and getrefcount's argument): something else holds the node, note it
            remember_realized(node, value)
        # else it dies now, and what it was realized to with it: not noted (no entry made to be dropped at once)
    return True


def prepare_overwrite(bufs: list) -> None:
    """A TinyJit replay is about to write the Buffers `bufs` in place, with no schedule: the live lazy tensors that
    read their old contents are computed now, and the views of them move to new BUFFER nodes (what was realized
    from the old nodes is not taken for the new contents)."""
    with engine_lock:
        written = {id(b): new_buffer_uop(b.device, b.size, b.dtype, b) for b in bufs}
        readers, views, _ = _live_readers(written, {}, [])
        if readers:
            keep = [(t, t.uop) for t in readers if t.requires_grad]  # as Tensor.realize
            _realize_tensors(readers)
            for t, u in keep:
                t.uop = u
            views = _live_readers(written, {}, [])[1]  # (with none computed, the views are the walk's above)
        _move_views(views, written)


def _move_views(aliases: list[Tensor], written: dict[int, UOp]):
    """Views of an overwritten buffer read its new contents, through the new BUFFER node."""
    from zeptograd.tensor.live import _grad_uops as grad_uops

    for t in aliases:
        root = view_root(t.uop)
        root_buf = buffer_under(root.src[0]) if root.op is _ASSIGN else root
        assert root_buf is not None
        new_buf = written[id(buffers[root_buf])]
        new_root = new_buf if root.op is _BUFFER else root.src[0].substitute({root_buf: new_buf})
        old_uop = t.uop
        if old_uop is root:  # a weight's tensor: its BUFFER node itself, or one view of it (its shape's RESHAPE)
            t.uop = new_root
        elif old_uop.src == (root,):
            t.uop = old_uop.replace(src=(new_root,))
        else:
            t.uop = old_uop.substitute({root: new_root})
        if old_uop in grad_uops:  # a view that requires grad still does
            grad_uops.add(t.uop)


def _written(becomes: dict[UOp, UOp]) -> dict[int, UOp]:
    """The memory (id of its Buffer) each ASSIGN in a schedule writes -> the new BUFFER node of its contents."""
    written = {}
    for old, new in becomes.items():
        if old.op is _ASSIGN and (target := buffer_under(old.src[0])) is not None:
            new_buf = buffer_under(new)
            assert new_buf is not None, "an ASSIGN becomes a view of its target's buffer"
            written[id(_buffers_data[weakref.ref(target)])] = new_buf  # (buffers[target], without a frame)
    return written


def tensor_to_numpy(t: Tensor) -> np.ndarray:
    if _capturing:
        raise RuntimeError(
            "TinyJit: reading a tensor's values on the host (numpy/item/tolist) inside a jitted "
            "function is not supported: replays would not refresh them"
        )
    with engine_lock:
        return _tensor_to_numpy(t)


def _tensor_to_numpy(t: Tensor) -> np.ndarray:
    from zeptograd.dtype import to_numpy_dtype

    t.realize()
    u = t.uop
    np_dtype = np.float32 if t.dtype.name == "bfloat16" else to_numpy_dtype(t.dtype)
    shape = variable.concrete(t.shape)  # a symbolic shape at its variables' values
    if (c := uniform_const(u)) is not None:
        return np.full(shape, c.arg if not isinstance(c.arg, UOp) else variable.sint_value(c.arg), dtype=np_dtype)
    base = view_base(u)
    assert base is not None, f"realize left {u.op}, not a buffer"
    return buffers[base].numpy()[: prod(shape)].reshape(shape)
