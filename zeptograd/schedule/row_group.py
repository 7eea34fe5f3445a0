"""A stored row max computed in the kernel of the stored reduce that reads it: one kernel with two stores.

# m[i] = max_j x[i, j];  s[i] = sum_j f(x[i, j], m[i]);  both stored (read inside another kernel's reduce)
#   -> for i: { m = max_j x[i, j]; s = sum_j f(x[i, j], m); store m[i]; store s[i] }   (not a kernel for m first)
A hand-written log-softmax, `x - m - log(sum(exp(x - m)))` summed over the rows of a loss, reads both row statistics
inside the loss's reduce over the rows, so neither can be computed in that kernel and both are stored; the sum's
kernel reads the max at its own row. When the walk stores the sum, the max below it (if the walk stores it too) is
given the sum's loops: the sum's read of it then folds to its value (bufferize.py, fold_read_at_own_ranges) and the
two are one kernel (`groups`). Only a max: exact, so the value the sum's kernel computes is the one stored. Only on a
CPU: a GPU does not run a reduce inside another reduce's kernel (schedule/policy.py, hoistable).
"""

from __future__ import annotations

from typing import Callable

from zeptograd.device import Device
from zeptograd.schedule.bufferize import kernel_value_nodes
from zeptograd.schedule.indexing import Rangeify, Requests
from zeptograd.uop.ops import AxisType, GroupOp, Ops, UOp


class RowGroups:
    def __init__(self, rf: Rangeify):
        self.rf = rf
        self.sum_of: dict[UOp, list[UOp]] = {}  # a max given stored reduces' loops -> those reduces

    def realizing(self, must_realize: Callable[[UOp, Requests], bool]) -> Callable[[UOp, Requests], bool]:
        """must_realize, sharing a stored reduce's loops with the max it reads (`share_loops`)."""

        def decide(x: UOp, reqs: Requests) -> bool:
            if not must_realize(x, reqs):
                return False
            if x.op is Ops.REDUCE_AXIS:
                self.share_loops(x)
            return True

        return decide

    def share_loops(self, s: UOp):
        """s, a reduce the walk stores, gets its loops now (before its sources are walked); each max of s's shape that
        s's value reads (through elementwise and movement ops only) gets the same loops, if the walk stores it."""
        rf = self.rf
        if s in rf.group_ranges or ((dev := rf.device.get(s)) and Device[dev].renderer.has_local):
            return
        maxes: list[UOp] = []
        stack, seen = [s.src[0]], set()
        while stack:
            if (u := stack.pop()) in seen or u in rf.realize and u.op is not Ops.REDUCE_AXIS:
                continue
            seen.add(u)
            if u.op is Ops.REDUCE_AXIS:
                if u.arg[0] is Ops.MAX and u.tensor_shape == s.tensor_shape and u not in rf.kernel_ranges:
                    maxes.append(u)
            elif u.op in GroupOp.Elementwise or u.op in GroupOp.Movement:
                stack.extend(u.src)
        if not maxes:
            return
        # the loops of a reduce that reads one of them already (a gradient's count of the maxima): any may be its kernel
        shared = next((rf.group_ranges[m] for m in maxes if m in self.sum_of), None)
        rf.group_ranges[s] = shared = shared or rf.fresh_ranges(s.tensor_shape, AxisType.LOOP)
        for m in maxes:
            if rf.group_ranges.setdefault(m, shared) is shared:
                self.sum_of.setdefault(m, []).append(s)

    def groups(self, stored: dict[UOp, UOp], order: list[UOp], taken: dict[UOp, list[UOp]]) -> dict[UOp, list[UOp]]:
        """The members of each kernel of a max stored at its reduce's loops whose value that reduce's kernel computes,
        the member the kernel runs in place of last: the reduce's place, where no kernel between them reads the max,
        else the max's, where the reduce's kernel reads nothing stored between them; neither where a kernel between
        them writes memory (an ASSIGN, a COPY)."""
        where = {k: i for i, k in enumerate(order)}
        out: dict[UOp, list[UOp]] = {}
        for m, sums in self.sum_of.items():
            for s in sums:
                if (members := self.members(m, s, stored, order, where, taken | out)) is not None:
                    out[m] = out[s] = members
                    break
        return out

    def members(
        self, m: UOp, s: UOp, stored: dict[UOp, UOp], order: list[UOp], where: dict[UOp, int], taken: dict
    ) -> list[UOp] | None:
        """[max, reduce] or [reduce, max] (`groups`), or None where they can't be one kernel."""
        if m not in stored or s not in stored or m in taken or s in taken:
            return None
        bm, bs = stored[m], stored[s]
        if bm.src[1:] != bs.src[1:] or bm.src[0] not in kernel_value_nodes(bs.src[0]) or where[m] > where[s]:
            return None
        between = order[where[m] + 1 : where[s]]
        if any(k.op in (Ops.ASSIGN, Ops.COPY) or k not in stored for k in between):
            return None
        if not any(_reads(stored[k], bm) for k in between):
            return [m, s]
        return None if any(_reads(bs, stored[k]) for k in between) else [s, m]


def _reads(b: UOp, target: UOp) -> bool:
    """Whether BUFFERIZE b's kernel reads BUFFERIZE target."""
    return any(u.op is Ops.INDEX and u.src[0] is target for u in kernel_value_nodes(b.src[0]))
