"""Memory planning: an intermediate buffer whose last reader has run lends its memory to a later one.

Only buffers the schedule itself made for intermediates take part: inputs and outputs are never shared, so a
realized input is never overwritten (except by an ASSIGN into it, which is its own kernel's output).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zeptograd.device import Buffer

if TYPE_CHECKING:
    from zeptograd.schedule.kernel import ScheduleItem


def plan_memory(items: list[ScheduleItem], intermediates: set[Buffer]) -> dict[Buffer, Buffer]:
    """Rewrites the items' buffer lists in place; returns which intermediate now uses which one's memory."""
    last_use: dict[Buffer, int] = {}
    for i, item in enumerate(items):
        for b in item.bufs:
            last_use[b] = i
    dying: dict[int, list[Buffer]] = {}
    for b, i in last_use.items():
        if b in intermediates:
            dying.setdefault(i, []).append(b)
    free: dict[tuple[str, int], list[Buffer]] = {}  # (device, nbytes) -> memory whose last reader has run
    replace: dict[Buffer, Buffer] = {}
    for i, item in enumerate(items):
        for o in item.outputs:
            out = item.bufs[o]
            if out in intermediates and out not in replace and (pool := free.get((out.device, out.nbytes))):
                replace[out] = pool.pop()
        item.bufs = [replace.get(b, b) for b in item.bufs]
        for b in dying.get(i, []):
            shared = replace.get(b, b)
            free.setdefault((shared.device, shared.nbytes), []).append(shared)
    return replace
