"""The scheduler's calls into VIZ: each returns what it is given, and with VIZ off does nothing else (no import of the
recorder, no object made). `schedule/policy.py` passes each of its keep-or-inline decisions through one of these;
with VIZ on the recorder notes the node, the decision, the rule and the cost model's estimates (viz/decisions.py).
"""

from __future__ import annotations

from typing import Any

from zeptograd.helpers import VIZ


def decided(policy: Any, x: Any, reqs: dict, keep: bool, rule: str) -> bool:
    """must_realize's answer for x read at reqs: keep (a buffer) or not (inlined), and the rule that gave it"""
    if VIZ.value:
        from zeptograd.viz import record

        record.schedule_decision(policy, x, reqs, keep, rule)
    return keep


def decided_all(nodes: set, rule: str) -> set:
    """a set of nodes realized_up_front keeps, all by one rule"""
    if VIZ.value and nodes:
        from zeptograd.viz import record

        record.schedule_kept_all(nodes, rule)
    return nodes


def decided_after_walk(policy: Any, b: Any, value: dict, inline: bool) -> bool:
    """cheaper_inlined's answer for BUFFERIZE b (value: its kernel's nodes): inlined again at each read, or kept"""
    if VIZ.value:
        from zeptograd.viz import record

        record.schedule_inline_again(policy, b, value, inline)
    return inline
