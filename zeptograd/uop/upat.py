"""Patterns over UOps, matchers made of `(UPat, fn)` rules, and the rewrite engine."""

from __future__ import annotations

import atexit
import functools
import inspect
import itertools
import linecache
import time
import weakref
from collections import defaultdict
from typing import Any, Callable

from zeptograd.dtype import DType
from zeptograd.helpers import TRACK_MATCH_STATS, VIZ
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
        """Every binding under which `u` matches this pattern, in the order a rule sees them (for a commutative op,
        the sources' order, then the swapped order), each merged with `store` (a name in it must bind its node).
        PatternMatcher does not call this: its compiled matchers bind lazily (_compile_rules)."""
        collect = _collector(self)
        found = collect(u, [])
        if store:
            found = [{**store, **b} for b in found if all(store.get(k, v) is v for k, v in b.items())]
        return found


# ***** compiling patterns to straight-line Python *****
# A rule's pattern becomes nested `if`s over the UOp's fields, in the order the pattern lists them (the op, dtype,
# arg, custom check and name of a node, then its sources left to right): the first failing check falls through to
# the next rule, and nothing is allocated before the rule's function runs. A commutative node with two source
# patterns is a loop over the two orders; a name seen before is an `is` check against the node it bound. Bindings are
# tried in the order UPat.match lists them: where both sources of a commutative node can bind in several ways (each
# holds a commutative node), the two orders are two branches that visit the sources in each order's sequence.


class _Source:
    """The text of one generated function: lines, and the objects it names (as module-level constants)."""

    def __init__(self):
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self._names: dict[int, str] = {}  # id(object) -> its constant name (the object is held in consts)
        self.n_tmp = 0

    def const(self, obj: Any) -> str:
        if (name := self._names.get(id(obj))) is None:
            name = self._names[id(obj)] = f"_k{len(self.consts)}"
            self.consts[name] = obj
        return name

    def tmp(self) -> str:
        self.n_tmp += 1
        return f"_t{self.n_tmp}"

    def emit(self, depth: int, line: str):
        self.lines.append("    " * depth + line)


def _commutative(p: UPat) -> bool:
    return p.src is not None and len(p.src) == 2 and p.op is not None and p.op <= GroupOp.Commutative


def _several_bindings(p: UPat) -> bool:
    """Whether p can match one UOp in more than one way (it holds a commutative node)."""
    stack = [p]
    while stack:
        q = stack.pop()
        if _commutative(q):
            return True
        stack.extend(q.src or ())
    return False


def _checks_nothing(p: UPat) -> bool:
    return p.op is None and p.dtype is None and p.arg is None and p.custom is None and p.name is None and p.src is None


Leaf = Callable[[_Source, int, dict[str, str]], None]


def _emit_pattern(
    g: _Source, work: list[tuple[UPat, str]], depth: int, bound: dict[str, str], leaf: Leaf, root_op: bool
):
    """Emit the checks of each (pattern, expression) in `work` in turn, nested, then `leaf` with the bound names
    (name -> expression). The pattern's recursion here is over its own small depth, never the graph's."""
    while work:
        (p, expr), work = work[0], work[1:]
        conds: list[str] = []
        v = expr
        if not _checks_nothing(p) and not expr.isidentifier():
            v = g.tmp()
            g.emit(depth, f"{v} = {expr}")
        if p.op is not None and (root_op or expr != "u"):
            conds.append(f"{v}.op is {g.const(next(iter(p.op)))}" if len(p.op) == 1 else f"{v}.op in {g.const(p.op)}")
        if p.dtype is not None:
            if len(p.dtype) == 1:
                k = g.const(next(iter(p.dtype)))
                conds.append(f"({v}.dtype is {k} or {v}.dtype.scalar is {k})")
            else:
                k = g.const(p.dtype)
                conds.append(f"({v}.dtype in {k} or {v}.dtype.scalar in {k})")
        if p.arg is not None:
            conds.append(f"not ({v}.arg != {g.const(p.arg)})")
            if not isinstance(p.arg, Ops):  # 0 == False == 0.0, but a pattern's arg names one constant exactly
                conds.append(f"type({v}.arg) is {g.const(type(p.arg))}")
        if p.custom is not None:
            conds.append(f"{g.const(p.custom)}({v})")
        if p.name is not None:
            if p.name in bound:
                conds.append(f"{v} is {bound[p.name]}")
            else:
                bound = {**bound, p.name: v}
        if conds:
            g.emit(depth, f"if {' and '.join(conds)}:")
            depth += 1
        if p.src is None:
            continue
        s = g.tmp()
        g.emit(depth, f"{s} = {v}.src")
        g.emit(depth, f"if len({s}) {'>=' if p.allow_any_len else '=='} {len(p.src)}:")
        depth += 1
        if _commutative(p):
            first, second = p.src
            if _several_bindings(first) and _several_bindings(second):  # each order visits its sources in sequence
                o = g.tmp()
                g.emit(depth, f"for {o} in (0, 1):")
                g.emit(depth + 1, f"if {o} == 0:")
                _emit_pattern(g, [(first, f"{s}[0]"), (second, f"{s}[1]"), *work], depth + 2, bound, leaf, root_op)
                g.emit(depth + 1, "else:")
                _emit_pattern(g, [(second, f"{s}[0]"), (first, f"{s}[1]"), *work], depth + 2, bound, leaf, root_op)
                return
            a, b = g.tmp(), g.tmp()
            orders = f"({s}, ({s}[1], {s}[0]))" if not p.allow_any_len else f"(({s}[0], {s}[1]), ({s}[1], {s}[0]))"
            g.emit(depth, f"for {a}, {b} in {orders}:")
            depth += 1
            work = [(first, a), (second, b), *work]
        else:
            work = [(q, f"{s}[{i}]") for i, q in enumerate(p.src) if not _checks_nothing(q)] + work
    leaf(g, depth, bound)


def _rule_leaf(fn: Callable, takes_ctx: bool) -> Leaf:
    """Call the rule's function with the bound names; a result other than None or the node itself is the rewrite."""

    def leaf(g: _Source, depth: int, bound: dict[str, str]):
        args = [f"{name}={expr}" for name, expr in bound.items()]
        g.emit(depth, f"_r = {g.const(fn)}({', '.join((['ctx=ctx'] if takes_ctx else []) + args)})")
        g.emit(depth, "if _r is not None and _r is not u:")
        g.emit(depth + 1, "return _r")

    return leaf


def _collect_leaf(g: _Source, depth: int, bound: dict[str, str]):
    g.emit(depth, f"_out.append({{{', '.join(f'{name!r}: {expr}' for name, expr in bound.items())}}})")


_n_built = itertools.count()


def _build(g: _Source, name: str, params: str, ret: str) -> Callable | None:
    """The function the lines of g are the body of, or None where Python refuses it (too deeply nested)."""
    text = "\n".join([f"def {name}({params}):", *g.lines, f"    return {ret}"])
    filename = f"<upat {name} {next(_n_built)}>"
    try:
        code = compile(text, filename, "exec")
    except (SyntaxError, RecursionError, MemoryError):
        return None
    namespace = dict(g.consts)
    exec(code, namespace)
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)  # tracebacks show the lines
    return namespace[name]


def _compile_rules(rules: list[tuple[UPat, Callable, bool]]) -> Callable[[UOp, Any], Any]:
    """One function (u, ctx) -> the first rewrite the rules give, tried in order; u's op is one the rules accept
    (PatternMatcher dispatches on it), so the root's op is not checked again."""
    g = _Source()
    for pat, fn, takes_ctx in rules:
        _emit_pattern(g, [(pat, "u")], 1, {}, _rule_leaf(fn, takes_ctx), root_op=False)
    if (compiled := _build(g, "rewrite", "u, ctx", "None")) is not None:
        return compiled
    return functools.partial(_interpret_rules, rules)  # a pattern too deep to compile


def _interpret_rules(rules: list[tuple[UPat, Callable, bool]], u: UOp, ctx: Any) -> Any:
    for pat, fn, takes_ctx in rules:
        for store in _match_all(pat, u, {}):
            ret = fn(ctx=ctx, **store) if takes_ctx else fn(**store)
            if ret is not None and ret is not u:
                return ret
    return None


_collectors: dict[int, tuple[UPat, Callable]] = {}  # id(pattern) -> (the pattern, kept alive; its collector)


def _collector(p: UPat) -> Callable[[UOp, list], list]:
    """(u, out) -> out with every binding of p on u appended (UPat.match), compiled once per pattern."""
    if (hit := _collectors.get(id(p))) is None:
        g = _Source()
        _emit_pattern(g, [(p, "u")], 1, {}, _collect_leaf, root_op=True)
        fn = _build(g, "match", "u, _out", "_out")
        hit = _collectors[id(p)] = (p, fn if fn is not None else (lambda u, out: out + _match_all(p, u, {})))
    return hit[1]


def _match_all(p: UPat, u: UOp, store: dict[str, UOp]) -> list[dict[str, UOp]]:
    """The bindings of p on u, built eagerly and recursively: for an op's first rewrites (_Warmup) and a pattern
    Python refuses to compile."""
    if p.op is not None and u.op not in p.op:
        return []
    if p.dtype is not None and u.dtype not in p.dtype and u.dtype.scalar not in p.dtype:
        return []
    if p.arg is not None and (u.arg != p.arg or (type(u.arg) is not type(p.arg) and not isinstance(p.arg, Ops))):
        return []
    if p.custom is not None and not p.custom(u):
        return []
    if p.name is not None:
        if p.name in store and store[p.name] is not u:
            return []
        store = {**store, p.name: u}
    if p.src is None:
        return [store]
    if len(u.src) < len(p.src) or (len(u.src) != len(p.src) and not p.allow_any_len):
        return []
    orders = [p.src, p.src[::-1]] if _commutative(p) else [p.src]
    out: list[dict[str, UOp]] = []
    for order in orders:
        stores = [store]
        for q, s in zip(order, u.src):
            stores = [m for st in stores for m in _match_all(q, s, st)]
        out.extend(stores)
    return out


class PatternMatcher:
    """A flat list of `(UPat, fn)` rules, indexed by op. `fn` gets the bound names (and `ctx` if it asks).

    Each op's rules are compiled into one Python function (_compile_rules) once COMPILE_AFTER nodes of that op were
    rewritten (before, they are interpreted: compiling costs what ~100 interpreted matches do, and a short process
    meets most ops only a few times); with TRACK_MATCH_STATS each rule is compiled alone, to be counted and timed."""

    def __init__(self, rules: list[tuple[UPat, Callable]]):
        self.rules = rules
        self.pdict: dict[Ops, list[tuple[UPat, Callable, bool]]] = defaultdict(list)
        for pat, fn in rules:  # rule order is kept within each op's list
            entry = (pat, fn, _takes_ctx(fn))
            for op in pat.op if pat.op is not None else Ops:
                self.pdict[op].append(entry)
        self.pdict = dict(self.pdict)
        self._by_op: dict[Ops, Callable[[UOp, Any], Any]] = {}  # op -> its rules, compiled (filled on first use)
        self._by_rule: dict[tuple[int, int], Callable[[UOp, Any], Any]] = {}  # TRACK_MATCH_STATS: one rule each
        # the nodes known to be fixed points (no rule matches them nor anything below them), for a matcher whose rules
        # are pure functions of the node (no ctx, no knob, no state): graph_rewrite skips them without a walk. None:
        # not known to be pure (the default); a module that vouches for its rules sets a WeakSet (uop/symbolic.py).
        self.fixed_points: weakref.WeakSet[UOp] | None = None

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        if TRACK_MATCH_STATS.value:
            return self._rewrite_tracked(u, ctx)
        return self._rules_for(u, ctx)

    def _rules_for(self, u: UOp, ctx: Any) -> UOp | None:
        """rewrite without TRACK_MATCH_STATS (graph_rewrite reads the knob once per pass)."""
        if (fn := self._by_op.get(u.op)) is None:
            rules = self.pdict.get(u.op)
            fn = self._by_op[u.op] = _Warmup(self, u.op, rules) if rules else _no_rules
        return fn(u, ctx)

    def _rewrite_tracked(self, u: UOp, ctx: Any) -> UOp | None:
        for entry in self.pdict.get(u.op, ()):
            key = (id(entry[0]), id(entry[1]))
            if (fn := self._by_rule.get(key)) is None:
                fn = self._by_rule[key] = _compile_rules([entry])
            t0 = time.perf_counter()
            ret = fn(u, ctx)
            _record(_rule_name(entry[0], entry[1]), ret is not None, time.perf_counter() - t0)
            if ret is not None:
                return ret
        return None


def _no_rules(u: UOp, ctx: Any) -> None:
    return None


COMPILE_AFTER = 32  # rewrites of one op (in one PatternMatcher) interpreted before its rules are compiled


class _Warmup:
    """An op's rules before they are compiled: interpreted (UPat.match's bindings, in the same order), counted."""

    __slots__ = ("pm", "op", "rules", "calls")

    def __init__(self, pm: PatternMatcher, op: Ops, rules: list[tuple[UPat, Callable, bool]]):
        self.pm, self.op, self.rules, self.calls = pm, op, rules, 0

    def __call__(self, u: UOp, ctx: Any) -> Any:
        self.calls += 1
        if self.calls >= COMPILE_AFTER:
            compiled = self.pm._by_op[self.op] = _compile_rules(self.rules)
            return compiled(u, ctx)
        return _interpret_rules(self.rules, u, ctx)


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
    if VIZ.value:  # VIZ=1 records this pass (zeptograd/viz/record.py, imported only then)
        from zeptograd.viz import record

        if (recorded := record.rewrite(sink, pm, ctx, bottom_up)) is not None:
            return recorded
    done: dict[UOp, UOp] = {}
    steps = 0
    # a plain PatternMatcher's compiled rules are called directly (its rewrite's dispatch, one call less per node); a
    # matcher-like wrapper (VIZ records rules through one) is asked through its own rewrite
    plain = type(pm) is PatternMatcher
    rewrite = pm._rules_for if plain and not TRACK_MATCH_STATS.value else pm.rewrite
    # a pure matcher's known fixed points (top-down, no ctx): such a node rewrites to itself, below it nothing changes
    fixed = pm.fixed_points if plain and ctx is None and not bottom_up else None
    # stack entries: (node, stage, aux). stage 0: visit; 1: sources done, rebuild and match; 2: link to result of aux.
    # A node whose sources are all done at its visit goes on to stage 1 at once (what popping it again would do).
    stack: list[tuple[UOp, int, UOp | None]] = [(sink, 0, None)]
    push, pop = stack.append, stack.pop
    while stack:
        n, stage, aux = pop()
        if n in done:
            continue
        if stage == 2:
            assert aux is not None
            done[n] = done[aux]
            continue
        if stage == 0:
            if fixed is not None and n in fixed:
                done[n] = n
                continue
            steps += 1
            if bottom_up and (r := rewrite(n, ctx)) is not None:
                push((n, 2, r))
                push((r, 0, None))
                continue
            pending = [s for s in n.src if s not in done]
            if pending:
                push((n, 1, None))
                stack.extend([(s, 0, None) for s in reversed(pending)])
                continue
        new_src = tuple(map(done.__getitem__, n.src))
        if new_src != n.src:
            nn = UOp(n.op, n.dtype, new_src, n.arg)
            push((n, 2, nn))
            push((nn, 0, None))
        elif not bottom_up and (r := rewrite(n, ctx)) is not None:
            push((n, 2, r))
            push((r, 0, None))
        else:
            done[n] = n  # its sources are their own results, and no rule matches it: a fixed point
            if fixed is not None:
                fixed.add(n)
    rewrite_steps[0] += steps
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
