"""What VIZ=1 records of the scheduler's keep-or-inline decisions (schedule/policy.py, through viz/hook.py): the cost
model's estimates both ways, in its units (rough cycles, schedule/cost.py) and in bytes of memory traffic.

`estimate` shows `CostModel.inline_estimate`'s sums: inlined, x is evaluated at every read (its work, plus the
strided-load penalty where a read moves across rows); kept, it is evaluated once per element, stored, and loaded at
every read, plus a kernel's fixed cost. The comparison stops at the first read after which inlining costs more;
`reads` says how many were summed. Bytes are the memory traffic of the same two plans: inlined, the buffers one
evaluation reads, at every read; kept, those once per element, the store, and a load of the stored element at every
read.
"""

from __future__ import annotations

from typing import Any

from zeptograd.helpers import prod
from zeptograd.schedule import cost as cm
from zeptograd.uop.ops import Ops, UOp


def _itemsize(u: UOp) -> int:
    return getattr(u.dtype, "itemsize", 4)


def evaluation_bytes(cost: cm.CostModel, x: UOp) -> int:
    """Bytes of buffers one inlined evaluation of x reads, counted as the cost model counts loads (`loads`: a source
    read twice counts twice; a reduce or a materialized node below is one element)."""

    def stops(s: UOp) -> bool:
        return s.op in (Ops.BUFFER, Ops.REDUCE_AXIS) or s in cost.realized

    per: dict[UOp, int] = {}
    for u in x.toposort(gate=lambda u: u is x or not stops(u)):
        if u is not x and stops(u):
            continue
        n = sum(_itemsize(s) if stops(s) else per.get(s, 0) for s in u.src)
        if u.op is Ops.REDUCE_AXIS and cost.static(u.src[0]):  # the body runs once per reduced element
            n *= prod(u.src[0].tensor_shape) // max(prod(u.tensor_shape), 1)
        per[u] = min(n, cm.MAX_COST)
    return per[x]


def estimate(cost: cm.CostModel, x: UOp, reqs: dict) -> dict[str, Any]:
    """The cost model's comparison for x read at reqs: `verdict` (text), `costlier` (inlined costs more: True/False,
    None where it gives no estimate) and, with an estimate, the sums both ways and the bytes of the two plans."""
    e = cost.inline_estimate(x, reqs)
    if e.why_none:
        return {"verdict": e.why_none, "costlier": False}
    size, each, item = prod(x.tensor_shape), evaluation_bytes(cost, x), _itemsize(x)
    return {
        "verdict": "inlined costs more than a buffer" if e.costlier else "inlined costs no more than a buffer",
        "costlier": e.costlier,
        "work": cost.work[x],
        "elements": size,
        "reads": e.reads,
        "of": len(reqs),
        "inline": e.inline,
        "keep": e.keep,
        "inline_bytes": each * e.evaluations,
        "keep_bytes": (each + item) * size + item * e.evaluations,
    }


def inline_again_facts(policy: Any, b: UOp, value: dict) -> tuple[str, dict[str, Any]]:
    """Why cheaper_inlined answered as it did for BUFFERIZE b: the size of its value, what it reads, the estimate."""
    from zeptograd.schedule.policy import MAX_INLINED_VALUE_NODES

    x = b.arg.node
    est = estimate(policy.cost, x, policy.rf.reqs[x])
    reads = [u.op.name for u in value if u.op is Ops.REDUCE or (u.op is Ops.INDEX and u.src[0].op is Ops.BUFFERIZE)]
    facts = f"its value: {len(value)} nodes (at most {MAX_INLINED_VALUE_NODES} are copied to each read)"
    if reads:
        facts += f"; it holds {'a reduce' if 'REDUCE' in reads else 'a read of another kernel'}"
    return facts, est
