"""`FUSE=0`: the no-fusion baseline. Every elementwise op and every reduce of the tensor graph is its own kernel and
writes its result to memory, as in an eager library that runs one op at a time; movement ops stay views.

One exception keeps the baseline an eager library's and not a caricature of one: an elementwise node computed only
from smaller tensors broadcast up to its shape (the product inside a matmul, a conv window, a one-hot gather, a
causal mask) is fused into its consumer, as torch's matmul, conv or embedding is one op that never writes the
broadcast product. Materialized, a 512^3 matmul's product alone would be 512 MiB.

`bench/cliffs.py` times every program both ways: the default schedule should never be slower than this baseline.
"""

from __future__ import annotations

from zeptograd.helpers import FUSE, prod
from zeptograd.uop.ops import GroupOp, Ops, UOp


def _numel(u: UOp) -> int:
    n = prod(u.tensor_shape)
    return n.vmax if isinstance(n, UOp) else n  # a symbolic size (uop/variable.py): at its largest


def nofuse_realize(nodes: list[UOp]) -> set[UOp]:
    """What rangeify must materialize besides its own choices: nothing by default, unfused_nodes under FUSE=0.
    Read at schedule time; the schedule cache keys on every Context knob, FUSE included."""
    return set() if FUSE else unfused_nodes(nodes)


def unfused_nodes(nodes: list[UOp]) -> set[UOp]:
    """The nodes (in topological order, the SINK last) that FUSE=0 materializes: every elementwise op and reduce,
    except constants and index expressions (arange masks), broadcast products (computed only from tensors smaller
    than the node, through its elementwise and movement sources), and a node an output only reshapes, permutes,
    shrinks or pads: the output's own kernel computes it (materialized, its output would be a copy of it)."""
    read: dict[UOp, int] = {}  # the size of the largest tensor a node's elements are computed from
    consumers: dict[UOp, list[UOp]] = {}
    found: list[UOp] = []
    for u in nodes:
        for s in u.src:
            consumers.setdefault(s, []).append(u)
        if u.op in GroupOp.Elementwise:
            read[u] = max((read[s] for s in u.src), default=0)
            if read[u] >= _numel(u) > 0:
                found.append(u)
        elif u.op in GroupOp.Movement:  # an EXPAND reads no more than its source: the broadcast doesn't count
            read[u] = read[u.src[0]]
        elif u.op in (Ops.BUFFER, Ops.REDUCE_AXIS, Ops.CONTIGUOUS, Ops.ASSIGN):  # data, at its own size
            read[u] = _numel(u)
            if u.op is Ops.REDUCE_AXIS:
                found.append(u)
        else:  # constants, IOTA (index expressions), DETACH, devices
            read[u] = max((read[s] for s in u.src), default=0) if u.op is Ops.DETACH else 0
    return {u for u in found if not _only_viewed_by_output(u, consumers)}


def _only_viewed_by_output(u: UOp, consumers: dict[UOp, list[UOp]]) -> bool:
    """u's one use is an output that is u through reshapes, permutes, shrinks and pads (read once per element)."""
    while len(cons := consumers.get(u, [])) == 1:
        if cons[0].op is Ops.SINK:
            return True
        if cons[0].op not in (Ops.RESHAPE, Ops.PERMUTE, Ops.SHRINK, Ops.PAD):
            return False
        u = cons[0]
    return False
