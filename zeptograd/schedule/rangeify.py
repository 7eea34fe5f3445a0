"""The scheduler: from a tensor graph to kernels, its passes in order (`create_schedule`).

1. `schedule/fold.py: tensor_fold` — constants fold, reduces over empty axes become their identity.
2. `schedule/split_reduce.py: split_reduces` — a huge reduce to a small output becomes two kernels.
3. `schedule/policy.py: MaterializationPolicy.realized_up_front` — what is materialized before the walk.
4. `schedule/indexing.py: Rangeify.assign_ranges` — index propagation, consumers first, with the policy's
   `must_realize` deciding the nodes whose consumers need them at several places.
5. `schedule/bufferize.py: bufferize` — the rangeified graph: each materialized node becomes BUFFERIZE(value,
   *ranges), read through INDEX; `bufferize_folds` (rewrite rules) remove and shrink what needs no memory.
6. `schedule/kernel.py: split_kernel` — each remaining BUFFERIZE (or group of outputs) becomes a kernel.
7. `order_assigns` (here) orders the kernels; `schedule/memory.py: plan_memory` lets dead intermediates lend
   their memory.
"""

from __future__ import annotations

from zeptograd.buffers import buffer_under, buffers, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import Buffer
from zeptograd.dtype import dtypes
from zeptograd.helpers import prod
from zeptograd.schedule.bufferize import bufferize, bufferize_folds, contiguous_aliases, stored_size
from zeptograd.schedule.copy import copy_item
from zeptograd.schedule.fold import tensor_fold, uniform_const
from zeptograd.schedule.indexing import Rangeify
from zeptograd.schedule.kernel import ScheduleItem, split_kernel
from zeptograd.schedule.memory import plan_memory
from zeptograd.schedule.policy import MaterializationPolicy
from zeptograd.schedule.row_group import RowGroups
from zeptograd.schedule.split_reduce import split_reduces
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp
from zeptograd.uop.spec import check_rangeified, check_tensor_graph
from zeptograd.uop.upat import graph_rewrite, graph_substitute
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace

__all__ = ["ScheduleItem", "create_schedule", "substitute_realized"]


@named_pass("tensor_fold", "constants folded, reduces over empty axes -> their identity (and the contiguous() inside)")
def fold_tensor_graph(sink: UOp) -> tuple[UOp, dict[UOp, UOp]]:
    """SINK(outputs) folded, and what each CONTIGUOUS node inside the graph became: those are folded alongside the
    outputs, so that the buffer each is stored in is remembered for the node the caller's graph holds (a backward that
    reads it reads those very values)"""
    outs = sink.src
    inner = [u for u in sink.toposort() if u.op is Ops.CONTIGUOUS and u not in outs]
    folded = graph_rewrite(UOp(Ops.SINK, dtypes.void, (*outs, *inner)), tensor_fold)
    return UOp(Ops.SINK, dtypes.void, folded.src[: len(outs)]), dict(zip(inner, folded.src[len(outs) :]))


def create_schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Kernels, in an order that respects their dependencies, and the buffer view that replaces each realized node."""
    sink, folded_inner = fold_tensor_graph(UOp(Ops.SINK, dtypes.void, tuple(outs)))
    sink = assign_outputs_in_place(sink)
    sink = split_reduces(sink)  # a big reduce to a small output: two kernels, the first parallel
    check_tensor_graph(sink)
    folded = dict(zip(outs, sink.src))
    outputs = {u for u in sink.src if needs_kernel(u)}
    rf = Rangeify(sink)
    groups = group_outputs(rf, outputs)
    policy = MaterializationPolicy(rf)
    row_groups = RowGroups(rf)  # a stored max computed in the kernel of the stored reduce that reads it
    rf.assign_ranges(policy.realized_up_front(outputs), row_groups.realizing(policy.must_realize))
    keep = outputs | {x for x in rf.realize if x.op in (Ops.CONTIGUOUS, Ops.ASSIGN)}
    keep |= {x.src[0] for x in rf.realize if x.op is Ops.COPY}  # a copy moves its source's whole buffer
    aliases = contiguous_aliases(rf, outputs)
    keep = (keep - aliases.keys()) | set(aliases.values())
    graph = bufferize(rf, keep, aliases)
    check_rangeified(graph, "bufferize")
    stored = {b.arg.node: b for b in graph.toposort() if b.op is Ops.BUFFERIZE and not b.arg.row}
    if not all(b.arg.keep for b in stored.values()):  # the foldings remove or shrink only what is not kept
        graph = graph_rewrite(graph, bufferize_folds, ctx=policy)
        check_rangeified(graph, "bufferize_folds")
        stored = {b.arg.node: b for b in graph.toposort() if b.op is Ops.BUFFERIZE and not b.arg.row}
    bufs: dict[UOp, Buffer] = {}
    becomes: dict[UOp, UOp] = {}
    for x in rf.nodes:  # every stored node gets a buffer; buffer views of inputs stay as they are
        if x.op is Ops.ASSIGN:  # writes into its target's existing buffer
            old = buffer_under(x.src[0])
            assert old is not None, "an ASSIGN's target is a view of a buffer (Tensor.assign makes it so)"
            bufs[x] = buffers[old]
            # the target's new contents get a new BUFFER UOp over the same memory: graphs realized from the old
            # contents (the `realized` map is keyed by graph) never answer for the new ones
            new = new_buffer_uop(rf.device[x], old.arg[1], old.dtype, buffers[old])
            becomes[x] = x.src[0].substitute({old: new})
        elif x in stored or x.op is Ops.COPY and x in rf.realize:
            size = stored_size(stored[x]) if x in stored else max_size(x.tensor_shape)
            buf_uop = new_buffer_uop(rf.device[x], size, x.dtype)
            bufs[x] = buffers[buf_uop]
            if size == max_size(x.tensor_shape):  # else an axis it does not vary along was dropped: not a view of x
                becomes[x] = reshape_uop(buf_uop, x.tensor_shape)
        elif x.op is Ops.BUFFER:
            bufs[x] = buffers[x]
    items = []
    kernels = [x for x in rf.nodes if x in stored or x.op is Ops.COPY and x in rf.realize]
    order = order_assigns(rf.nodes, kernels)
    groups |= row_groups.groups(stored, order, groups)
    for x in order:
        if prod(x.tensor_shape) == 0 or (x in groups and x is not groups[x][-1]):
            continue  # a group of outputs is one kernel, placed where its last member is
        if x.op is Ops.COPY:  # a copy item, not a kernel (schedule/copy.py)
            items.append(ScheduleItem(*copy_item(x, bufs), rf.device[x]))
            continue
        members = groups.get(x, [x])
        ast, kbufs = split_kernel(rf, [stored[m] for m in members], bufs)
        items.append(ScheduleItem(ast, kbufs, rf.device[x], outputs=list(range(len(members)))))
    intermediates = {bufs[x] for x in kernels if x not in outputs and x.op is not Ops.ASSIGN}
    shared = plan_memory(items, intermediates)  # dead intermediates lend their memory to later ones
    reused = set(shared) | set(shared.values())
    becomes = {x: v for x, v in becomes.items() if x not in bufs or bufs[x] not in reused}
    for c, x in aliases.items():  # a CONTIGUOUS stored in its value's buffer: remembered as that buffer
        if x in becomes and (base := buffer_under(becomes[x])) is not None:
            becomes[c] = reshape_uop(base, c.tensor_shape)
    result = {old: becomes.get(new, new) for old, new in folded.items()}
    for x, v in becomes.items():
        if not layout_copy(x):
            result.setdefault(x, v)
    for x, f in folded_inner.items():
        if f in becomes and not layout_copy(f):
            result.setdefault(x, becomes[f])
    return items, result


def layout_copy(x: UOp) -> bool:
    """A copy of a buffer's view (a matmul operand stored in column panels or transposed: tensor/matmul_layout.py), not
    noted as realized where it is not an output: computed again it gives the same bits, and a graph that notes no
    node but its outputs gets a plan of the schedule cache (engine/schedule_cache.py: make_plan; a 512^3 matmul took
    the schedule cache's walk on every call)."""
    return x.op is Ops.CONTIGUOUS and buffer_under(x.src[0]) is not None


def assign_outputs_in_place(sink: UOp) -> UOp:
    """An ASSIGN whose value is CONTIGUOUS(v) (Tensor.assign stores a value that reads its target elsewhere before
    the write) where v is itself an output computed here (a live tensor that reads the target's old contents: a
    hand-written SGD step's `new = p.detach() - lr * p.grad`, the gradient reading p through the forward): v's
    buffer, written before the ASSIGN (`order_assigns`), already holds the value, so the write reads it from there
    rather than from a copy of it made by a kernel of its own (mlp_step: 3 -> 2 kernels per parameter)."""
    computed = {u for u in sink.src if needs_kernel(u) and buffer_under(u) is None}
    values = {
        a.src[1]: a.src[1].src[0]
        for a in sink.toposort()
        if a.op is Ops.ASSIGN
        and a.src[1].op is Ops.CONTIGUOUS
        and (a.src[1].src[0] in computed or _reads_old_through(a.src[0], a.src[1].src[0], computed))
    }
    return graph_substitute(sink, values) if values else sink


def _reads_old_through(target: UOp, value: UOp, computed: set[UOp]) -> bool:
    """Whether value reads target's buffer only elementwise at the element written, or through outputs computed here
    (stored before the write, `order_assigns`): the update `p.detach() - lr * p.grad` with the gradient live (its
    .grad, which reads p through the forward, is an output). Then the write reads those buffers and needs no copy
    of its value stored first: one kernel per parameter."""
    buf = buffer_under(target)
    elementwise, stack = set(), [value]
    while stack:
        u = stack.pop()
        if u in elementwise or u in computed or u is target or u is buf:
            continue
        if u.op not in GroupOp.Elementwise and u.op is not Ops.DETACH:
            if buf in u.toposort(stops=computed):
                return False
            continue
        elementwise.add(u)
        stack.extend(u.src)
    return True


# a contraction of more multiply-adds than this keeps a kernel of its own rather than joining a group of outputs
GROUPED_CONTRACTION_MAX = 1 << 20


def group_outputs(rf: Rangeify, outputs: set[UOp]) -> dict[UOp, list[UOp]]:
    """Outputs of one shape on one device that nothing else reads: one kernel with a store for each. Where the
    schedule writes into a buffer (an ASSIGN), an output that reads that memory (old or new contents, directly or
    through a stored node) keeps a kernel of its own: a group runs where its last member would, and one member may
    have to run before a write that another must run after (`order_assigns`). So does a big contraction
    (`big_contraction`): a group's members share their output loops and so one register tile and loop order, which
    suits at most one of them (attention's dq = dS @ k, dk = dS.T @ q and dv = P.T @ dO, (1, 1, 2048, 64): 22 ms in
    one kernel, 13 in three, one core)."""
    read = {s for u in rf.nodes if u.op is not Ops.SINK for s in u.src}
    near_writes = touches_assigned_memory(rf.nodes)
    by_key: dict[tuple, list[UOp]] = {}
    for x in rf.nodes:
        if x in outputs and x not in read and x.op not in (Ops.ASSIGN, Ops.COPY) and prod(x.tensor_shape) > 0:
            if big_contraction(x):
                continue
            by_key.setdefault((x.shape, rf.device[x], x if x in near_writes else None), []).append(x)
    groups: dict[UOp, list[UOp]] = {}
    for members in by_key.values():
        if len(members) > 1:
            shared = rf.fresh_ranges(members[0].tensor_shape, AxisType.LOOP)
            for m in members:
                groups[m], rf.group_ranges[m] = members, shared
    return groups


def big_contraction(x: UOp) -> bool:
    """Whether x is, below its view and elementwise ops of one varying source (a scale, a cast), a sum of products
    (each maybe gated by a where) of more than GROUPED_CONTRACTION_MAX multiply-adds (a matmul, a convolution)"""
    while x.op is not Ops.REDUCE_AXIS:
        varying = [s for s in x.src if uniform_const(s) is None]
        if x.op not in (*GroupOp.Movement, *GroupOp.ALU, Ops.CAST) or x.op is Ops.WHERE or len(varying) != 1:
            return False
        x = varying[0]
    body = x.src[0].src[1] if x.src[0].op is Ops.WHERE else x.src[0]  # (a gated sum: causal attention's)
    return x.arg[0] is Ops.ADD and body.op is Ops.MUL and prod(x.src[0].tensor_shape) > GROUPED_CONTRACTION_MAX


def touches_assigned_memory(nodes: list[UOp]) -> set[UOp]:
    """The nodes whose value reads a memory that an ASSIGN of the graph writes, before or after the write (empty
    without an ASSIGN). Nodes are in topological order."""
    under = [buffer_under(u.src[0]) for u in nodes if u.op is Ops.ASSIGN]
    targets = {id(buffers[b]) for b in under if b is not None and b in buffers}
    found: set[UOp] = set()
    if targets:
        for u in nodes:
            if u.op is Ops.ASSIGN or (u.op is Ops.BUFFER and u in buffers and id(buffers[u]) in targets):
                found.add(u)
            elif any(s in found for s in u.src):
                found.add(u)
    return found


def order_assigns(nodes: list[UOp], kernels: list[UOp]) -> list[UOp]:
    """Kernels in an order that respects their data dependencies and, for each ASSIGN, reads before the write:
    a kernel that reads the assigned buffer's old contents (and does not depend on the ASSIGN) runs before it."""
    if not any(k.op is Ops.ASSIGN for k in kernels):
        return kernels
    kset = set(kernels)
    below: dict[UOp, frozenset[UOp]] = {}  # the kernels each node depends on, through any path
    for u in nodes:
        below[u] = frozenset().union(*(below[s] for s in u.src)) | ({u} if u in kset else frozenset())
    # the memory (id of the Buffer) each kernel reads directly (not through another kernel): by memory, not by BUFFER
    # node, since the contents before and after an earlier write are two nodes over one Buffer
    reads: dict[UOp, set[int]] = {}
    for k in kernels:
        srcs = k.src[1:] if k.op is Ops.ASSIGN else k.src
        reads[k] = {
            id(buffers[u]) for s in srcs for u in s.toposort(gate=lambda u: u not in kset) if u.op is Ops.BUFFER
        }
    after: dict[UOp, set[UOp]] = {k: {d for d in below[k] if d is not k} for k in kernels}
    for a in kernels:
        if a.op is Ops.ASSIGN:
            target_buf = buffer_under(a.src[0])
            assert target_buf is not None, "an ASSIGN's target is a view of a buffer"
            target = id(buffers[target_buf])
            for k in kernels:
                if k is not a and target in reads[k] and a not in below[k]:
                    after[a].add(k)  # k reads the old contents: it runs first
    order, done, pending = [], set[UOp](), list(kernels)
    while pending:
        ready = next((k for k in pending if after[k] <= done), None)
        if ready is None:
            raise RuntimeError("assigns that read each other's targets can't be ordered: realize them separately")
        order.append(ready)
        done.add(ready)
        pending.remove(ready)
    return order


def needs_kernel(u: UOp) -> bool:
    """An output needs a kernel unless it is a constant or already a whole buffer."""
    return uniform_const(u) is None and view_base(u) is None


def max_size(shape: tuple) -> int:
    """The elements a buffer of `shape` needs: for a symbolic shape (uop/variable.py), at its largest."""
    n = prod(shape)
    return n.vmax if isinstance(n, UOp) else n


def substitute_realized(outs: list[UOp], realized) -> list[UOp]:
    """Replace every node that was realized before by the buffer view holding its value."""
    sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
    mapping = {u: realized[u] for u in sink.toposort(gate=lambda u: u not in realized) if u in realized}
    return list(graph_substitute(sink, mapping).src) if mapping else outs
