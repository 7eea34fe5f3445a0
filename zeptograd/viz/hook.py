"""The compiler's calls into VIZ: each returns what it is given, and with VIZ off does nothing else (no import of the
recorder, no object made). `schedule/policy.py` passes each of its keep-or-inline decisions through one of these;
with VIZ on the recorder notes the node, the decision, the rule and the cost model's estimates (viz/decisions.py).
The passes that are not one graph_rewrite (codegen's expand, lower_reduces, the optimizer's actions, ...; the
scheduler's split_reduces and bufferize) are wrapped in `named_pass`, so that each is a named step of the trace.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar, cast

from zeptograd.helpers import VIZ

F = TypeVar("F", bound=Callable[..., Any])


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


def named_pass(name: str, about: str, nest: bool = False) -> Callable[[F], F]:
    """A pass that is not one graph_rewrite (`@named_pass("expand", "UPCAST/UNROLL ranges -> vector lanes")`), a named
    step of the kernel's (or schedule's) steps with VIZ on: its name (`{0}` is its second argument: an action), what
    it does, its graphs before and after, its time. The whole-graph rewrites it runs fold into that one step (their
    rules listed with it), or with nest=True are steps of their own under it (a pass made of named passes: optimize).
    With VIZ off the wrapper reads the ContextVar and calls the pass."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            if VIZ.value:
                from zeptograd.viz import record

                return record.named_pass(name, about, nest, fn, args, kwargs)
            return fn(*args, **kwargs)

        return cast(F, run)

    return wrap
