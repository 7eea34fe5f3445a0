"""Patterns over UOps, matchers made of `(UPat, fn)` rules, and the rewrite engine."""

from __future__ import annotations

import atexit
import functools
import inspect
import time
from collections import defaultdict
from typing import Any, Callable

from zeptograd.dtype import DType
from zeptograd.helpers import TRACK_MATCH_STATS
from zeptograd.uop.ops import GroupOp, MathMixin, Ops, UOp


class UPat(MathMixin):
    """A pattern: which op(s), dtype(s), sources and arg a UOp must have; `name` binds the match.

    `src` as a tuple matches the sources in order (for a commutative op, every order is tried);
    `allow_any_len=True` lets the UOp have more sources than the pattern lists.
    """

    __slots__ = ("op", "dtype", "src", "arg", "name", "allow_any_len", "custom")

    def __init__(
        self,
        op: Ops | set[Ops] | tuple[Ops, ...] | None = None,
        dtype: DType | set | tuple | None = None,
        src: UPat | tuple[UPat, ...] | None = None,
        arg: Any = None,
        name: str | None = None,
        allow_any_len: bool = False,
        custom: Callable[[UOp], bool] | None = None,
    ):
        self.op = None if op is None else frozenset((op,) if isinstance(op, Ops) else op)
        self.dtype = None if dtype is None else frozenset((dtype,) if isinstance(dtype, DType) else dtype)
        self.src = (src,) if isinstance(src, UPat) else src
        self.arg, self.name, self.allow_any_len, self.custom = arg, name, allow_any_len, custom

    @staticmethod
    def var(name: str | None = None, dtype: DType | set | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | set | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, name=name)

    @staticmethod
    def const(dtype: DType | None, value: Any) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, arg=value)

    def alu(self, op: Ops, *src: UPat) -> UPat:
        return UPat(op, src=(self, *src))

    def const_like(self, b: Any) -> UPat:
        return UPat.const(None, b)

    def named(self, name: str) -> UPat:
        p = UPat(None, None, self.src, self.arg, name, self.allow_any_len, self.custom)
        p.op, p.dtype = self.op, self.dtype
        return p

    def __repr__(self):
        ops = "*" if self.op is None else "|".join(sorted(o.name for o in self.op))
        return f"UPat({ops}, name={self.name!r}, src={self.src!r}, arg={self.arg!r})"

    def match(self, u: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
        """Every binding under which `u` matches this pattern (several when commutative orders both match)."""
        if self.op is not None and u.op not in self.op:
            return []
        if self.dtype is not None and u.dtype not in self.dtype and u.dtype.scalar not in self.dtype:
            return []
        if self.arg is not None and u.arg != self.arg:
            return []
        if self.arg is not None and type(u.arg) is not type(self.arg) and not isinstance(self.arg, Ops):
            return []  # 0 == False == 0.0, but a pattern's arg names one constant exactly
        if self.custom is not None and not self.custom(u):
            return []
        if self.name is not None:
            if self.name in store and store[self.name] is not u:
                return []
            store = {**store, self.name: u}
        if self.src is None:
            return [store]
        if len(u.src) < len(self.src) or (len(u.src) != len(self.src) and not self.allow_any_len):
            return []
        orders: Any = [self.src]
        if len(self.src) == 2 and self.op is not None and self.op <= GroupOp.Commutative:
            orders = [self.src, self.src[::-1]]
        out: list[dict[str, UOp]] = []
        for order in orders:
            stores = [store]
            for p, s in zip(order, u.src):
                stores = [m for st in stores for m in p.match(s, st)]
                if not stores:
                    break
            out.extend(stores)
        return out


class PatternMatcher:
    """A flat list of `(UPat, fn)` rules, indexed by op. `fn` gets the bound names (and `ctx` if it asks)."""

    def __init__(self, rules: list[tuple[UPat, Callable]]):
        self.rules = rules
        self.pdict: dict[Ops, list[tuple[UPat, Callable, bool]]] = defaultdict(list)
        for pat, fn in rules:  # rule order is kept within each op's list
            entry = (pat, fn, _takes_ctx(fn))
            for op in pat.op if pat.op is not None else Ops:
                self.pdict[op].append(entry)
        self.pdict = dict(self.pdict)

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        for pat, fn, takes_ctx in self.pdict.get(u.op, ()):
            t0 = time.perf_counter() if TRACK_MATCH_STATS else 0.0
            for store in pat.match(u, {}):
                ret = fn(ctx=ctx, **store) if takes_ctx else fn(**store)
                if ret is not None and ret is not u:
                    if TRACK_MATCH_STATS:
                        _record(_rule_name(pat, fn), True, time.perf_counter() - t0)
                    return ret
            if TRACK_MATCH_STATS:
                _record(_rule_name(pat, fn), False, time.perf_counter() - t0)
        return None


def _takes_ctx(fn: Callable) -> bool:
    """Whether fn has a `ctx` parameter: from its code object when it has one (inspect.signature is ~50x slower,
    and every matcher built at import asks it for each rule)."""
    code = getattr(fn, "__code__", None)
    if code is None:  # a partial or another callable
        return "ctx" in inspect.signature(fn).parameters
    return "ctx" in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]


@functools.cache
def _rule_name(pat: UPat, fn: Callable) -> str:
    """file:line of the rule (read from the source only when TRACK_MATCH_STATS is on: it is slow)"""
    try:
        src_file = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
        return f"{src_file.rsplit('/', 1)[-1]}:{line}"
    except (OSError, TypeError):
        return repr(pat)[:60]


# ***** TRACK_MATCH_STATS: per-rule match counts and time, printed at exit *****

match_stats: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])  # name -> [tries, matches, seconds]
rewrite_steps = [0]  # every node visited by graph_rewrite; tests use it to check linear scaling


def _record(name: str, matched: bool, dt: float):
    s = match_stats[name]
    s[0] += 1
    s[1] += int(matched)
    s[2] += dt


@atexit.register
def _print_match_stats():
    if TRACK_MATCH_STATS and match_stats:
        print(f"{'rule':<40} {'tries':>9} {'matches':>9} {'ms':>9}")
        for name, (tries, matches, secs) in sorted(match_stats.items(), key=lambda kv: -kv[1][2]):
            print(f"{name:<40} {tries:>9} {matches:>9} {secs * 1e3:>9.2f}")


# ***** the rewrite engine *****


def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None, bottom_up: bool = False) -> UOp:
    """Rewrite every node of the graph with `pm` until no rule matches anywhere (a fixed point).

    Default (top-down in tinygrad's words): a node's sources are rewritten first, then the node.
    `bottom_up=True`: a node is matched before its sources are visited, so rules see the original graph.
    Iterative: an explicit stack, never Python recursion, so graph depth is unbounded.
    """
    done: dict[UOp, UOp] = {}
    # stack entries: (node, stage, aux). stage 0: visit; 1: sources done, rebuild and match; 2: link to result of aux
    stack: list[tuple[UOp, int, UOp | None]] = [(sink, 0, None)]
    while stack:
        n, stage, aux = stack.pop()
        if n in done:
            continue
        if stage == 0:
            rewrite_steps[0] += 1
            if bottom_up and (r := pm.rewrite(n, ctx)) is not None:
                stack.append((n, 2, r))
                stack.append((r, 0, None))
                continue
            stack.append((n, 1, None))
            stack.extend((s, 0, None) for s in reversed(n.src) if s not in done)
        elif stage == 1:
            new_src = tuple(done[s] for s in n.src)
            if new_src != n.src:
                nn = UOp(n.op, n.dtype, new_src, n.arg)
                stack.append((n, 2, nn))
                stack.append((nn, 0, None))
            elif not bottom_up and (r := pm.rewrite(n, ctx)) is not None:
                stack.append((n, 2, r))
                stack.append((r, 0, None))
            else:
                done[n] = n
        else:
            assert aux is not None
            done[n] = done[aux]
    return done[sink]


def graph_substitute(sink: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """Replace nodes by the mapping (not recursively into replacements), rebuilding what depends on them."""
    if not mapping:
        return sink
    done: dict[UOp, UOp] = {}
    for n in sink.toposort(gate=lambda u: u not in mapping):
        if n in mapping:
            done[n] = mapping[n]
        else:
            new_src = tuple(done[s] for s in n.src)
            done[n] = n if new_src == n.src else UOp(n.op, n.dtype, new_src, n.arg)
    return done[sink]
