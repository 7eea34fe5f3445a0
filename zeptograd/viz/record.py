"""The recorder behind VIZ=1. The core calls in at these places, each behind `if VIZ.value`:

- `uop/upat.py: graph_rewrite` -> `rewrite`: while a kernel compiles or a schedule is made (in that thread), a
  rewrite of a whole graph (a SINK) runs with its rules tried one at a time, counted and timed, and the graphs
  before and after it are kept. Rewrites of fragments (a rule's own small rewrite) run as usual.
- `engine/realize.py: _schedule` wraps `create_schedule` in `recorded_schedule`: the tensor graph, its rewrites,
  and the realized nodes with the kernel that stores each.
- `engine/kernels.py: get_kernel` -> `kernel_begin` / `kernel_end` around codegen, only when a kernel is compiled
  (a cache hit compiles nothing, so each distinct kernel is recorded once; TinyJit replays compile nothing either).
- `engine/search.py: beam_search` -> `beam_searched`: BEAM's candidates and times, attached to the kernel compiled
  next from that graph.
- `schedule/policy.py`, through `viz/hook.py` -> `schedule_decision`, `schedule_kept_all`, `schedule_inline_again`:
  each keep-or-inline decision of the schedule being made, with its rule and the cost model's estimates.
- each pass that is not one graph_rewrite (codegen's expand, lower_reduces, optimize and its actions, ...; the
  scheduler's split_reduces, bufferize), through `viz/hook.py: named_pass` -> `named_pass`: a named step with its
  graphs and time; the whole-graph rewrites it runs fold into it (their rules listed there), or with nest (optimize)
  are steps of their own under it.
- `engine/realize.py: _run_schedule` -> `kernel_ran`: the timeline.
- `engine/jit.py: TinyJit.__call__` -> `jit_replay`: a replay (its kernels called directly) as one timeline entry.

With VIZ off none of these run and no Recorder exists. At exit the trace is written (`VIZ_FILE`, default a new
temporary directory) and, when stdout is a terminal, served until Ctrl-C; otherwise the command that serves it is
printed, so VIZ=1 never holds a script or a CI job.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import linecache
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from zeptograd.helpers import Context, getenv
from zeptograd.uop.ops import Ops, UOp
from zeptograd.viz.trace import NodeTable, new_trace, write_trace

MAX_RUNS = 100_000  # timeline entries kept; a long training loop keeps its first runs (totals stay exact)


class OpenPass:
    """A named pass running (viz/hook.py: named_pass): where its step goes, and the rules of the rewrites it folds."""

    def __init__(self, name: str, about: str, nest: bool, where: str, at: int, before: int, depth: int):
        self.name, self.about, self.nest, self.where = name, about, nest, where
        self.at, self.before, self.depth = at, before, depth  # its step's index, its input graph, its indent
        self.counts: dict[str, list] = {}  # the rules of the whole-graph rewrites it folds: rule -> [matches, secs]
        self.made: dict[UOp, str] = {}
        self.t0 = time.perf_counter()


class GraphRecord:
    """A kernel or a schedule being recorded: its node table and steps, open in one thread."""

    def __init__(self, entry: dict, first: UOp, first_name: str):
        self.entry, self.table, self.thread = entry, NodeTable(), threading.get_ident()
        self.inside = False  # a tracked rewrite runs: rewrites its rules start are fragments, not steps
        self.passes: list[OpenPass] = []  # the named passes running, outermost first
        entry["nodes"], entry["steps"] = self.table.nodes, []
        self.last = self.table.add(first)
        entry["steps"].append(
            {
                "name": first_name,
                "kind": "input",
                "where": "",
                "before": None,
                "after": self.last,
                "rules": [],
                "depth": 0,
            }
        )

    def folding(self) -> OpenPass | None:
        """The named pass that takes this rewrite's rules into its own step (nothing inside it is a step)."""
        return next((p for p in self.passes if not p.nest), None)

    def _step(self, name: str, kind: str, where: str, before: int, after: int, ms: float, depth: int) -> dict:
        return {"name": name, "kind": kind, "where": where, "before": before, "after": after, "ms": ms, "depth": depth}

    def _catch_up(self, graph: int, next_name: str) -> None:
        """A change between the last step and `graph` that no named pass or rewrite made: the enclosing pass's own
        code (optimize between its actions), or, outside any, a step saying where it happened."""
        if graph == self.last:
            return
        steps, depth = self.entry["steps"], len(self.passes)
        if self.passes:
            name, where = f"{self.passes[-1].name}: its own code", f"in {self.passes[-1].name}, before {next_name}"
        else:
            name, where = "(changed outside graph_rewrite)", f"between {steps[-1]['name']} and {next_name}"
        steps.append(self._step(name, "code", where, self.last, graph, 0.0, depth) | {"rules": []})
        self.last = graph

    def add_step(self, name: str, where: str, before: UOp, after: UOp, tracked: _TrackedMatcher, ms: float) -> None:
        table = self.table
        b = table.add(before)
        self._catch_up(b, name)
        a = table.add(after)
        step = self._step(name, "rewrite", where, b, a, round(ms, 3), len(self.passes))
        step["rules"] = _rules(tracked.counts)
        step["made"] = {str(table.ids[u]): rule for u, rule in tracked.made.items() if u in table.ids}
        self.entry["steps"].append(step)
        self.last = a

    def pass_begin(self, name: str, about: str, nest: bool, where: str, before: UOp | None) -> OpenPass:
        if before is not None:  # a pass of a graph (else its input is what the last step made: bufferize's Rangeify)
            self._catch_up(self.table.add(before), name)
        p = OpenPass(name, about, nest, where, len(self.entry["steps"]), self.last, len(self.passes))
        self.passes.append(p)
        return p

    def pass_end(self, p: OpenPass, after: UOp) -> None:
        """The pass's step: before its children where it has some (nest), the net change of the whole pass."""
        ms = round((time.perf_counter() - p.t0) * 1e3, 3)
        a = self.table.add(after)
        if p.nest:
            self._catch_up(a, "its end")  # its own code after its last named step
        self.passes.pop()
        step = self._step(p.name, "pass", p.where, p.before, a, ms, p.depth) | {"about": p.about}
        step["rules"] = _rules(p.counts)
        step["made"] = {str(self.table.ids[u]): rule for u, rule in p.made.items() if u in self.table.ids}
        self.entry["steps"].insert(p.at, step)
        self.last = a


def _rules(counts: dict[str, list]) -> list[list]:
    """[rule, matches, ms] of the rules that fired, most matches first"""
    return [
        [rule, n, round(secs * 1e3, 3)] for rule, (n, secs) in sorted(counts.items(), key=lambda kv: -kv[1][0]) if n
    ]


class _TrackedMatcher:
    """A PatternMatcher whose rules are tried one at a time, each match counted and timed and its result noted."""

    def __init__(self, pm: Any, rules: dict[str, str], into: OpenPass | None = None):
        self.pm, self.rule_source = pm, rules
        # rule -> [matches, seconds of its tries]; node a rule returned -> that rule (a folding pass's: summed there)
        self.counts: dict[str, list] = into.counts if into is not None else {}
        self.made: dict[UOp, str] = into.made if into is not None else {}

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        from zeptograd.uop.upat import _compile_rules

        pm = self.pm
        for entry in pm.pdict.get(u.op, ()):
            key = (id(entry[0]), id(entry[1]))
            if (fn := pm._by_rule.get(key)) is None:
                fn = pm._by_rule[key] = _compile_rules([entry])
            t0 = time.perf_counter()
            ret = fn(u, ctx)
            dt = time.perf_counter() - t0
            name, source = _rule_name(entry[1])
            if (count := self.counts.get(name)) is None:
                count = self.counts[name] = [0, 0.0]
                self.rule_source.setdefault(name, source)
            count[1] += dt
            if ret is not None:
                count[0] += 1
                self.made[ret] = name
                return ret
        return None


@functools.cache
def _rule_name(fn: Callable) -> tuple[str, str]:
    """(file:line and the function's name (a lambda has none), the rule's source line) — inspect reads the file once"""
    try:
        path = inspect.getsourcefile(fn) or "?"
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return getattr(fn, "__name__", repr(fn)), ""
    fname = getattr(fn, "__name__", "<lambda>")
    name = f"{os.path.basename(path)}:{line}" + ("" if fname == "<lambda>" else f" {fname}")
    return name, linecache.getline(path, line).strip()[:200]


def _code_where(fn: Callable) -> str:
    """file:line of a function, from the package's root"""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    path = code.co_filename
    where = path[path.rfind("zeptograd/") + len("zeptograd/") :] if "zeptograd/" in path else os.path.basename(path)
    return f"{where}:{code.co_firstlineno}"


def _pass_name(pm: Any) -> tuple[str, str]:
    """(the function that called graph_rewrite: the matcher's name where a module or the caller names it, file:line)"""
    frame = sys._getframe(4)  # graph_rewrite's caller: _pass_name <- Recorder.rewrite <- rewrite <- graph_rewrite <- it
    code = frame.f_code
    pm_name = next((k for k, v in frame.f_globals.items() if v is pm), None)
    pm_name = pm_name or next((k for k, v in frame.f_locals.items() if v is pm), None) or "a matcher"
    path = code.co_filename
    where = path[path.rfind("zeptograd/") + len("zeptograd/") :] if "zeptograd/" in path else os.path.basename(path)
    return f"{code.co_name}: {pm_name}", f"{where}:{frame.f_lineno}"


class Recorder:
    """Everything recorded in this process (one trace)."""

    def __init__(self):
        self.trace = new_trace(list(sys.argv))
        self.trace["rules"] = {}
        self.t0, self.pid = time.perf_counter(), os.getpid()  # a forked child inherits this: it writes nothing
        self.open: GraphRecord | None = None
        # (device, kernel graph) -> its kernel's id; ("TinyJit", kernel names) -> a replay's entry
        self.kernel_ids: dict[tuple[str, Any], int] = {}
        self.waiting: dict[tuple[str, UOp], list[dict]] = {}  # realized entries whose kernel is not compiled yet
        self.beams: dict[tuple[str, UOp], dict] = {}  # BEAM's search of a kernel graph, until that kernel compiles
        # id(compiled program) -> (it, its kernel's entry): a TinyJit replay calls programs, not kernel graphs (the
        # program is held so that its id is not reused)
        self.programs: dict[int, tuple[Any, dict]] = {}

    def _kernel_entry(self, key: tuple[str, Any], name: str, kind: str) -> dict:
        entry: dict[str, Any] = {"id": len(self.trace["kernels"]), "name": name, "kind": kind, "device": key[0]}
        entry |= {"src": "", "opts": [], "n_ops": 0, "nodes": [], "steps": [], "runs": 0, "time_s": 0.0, "bytes": 0}
        self.trace["kernels"].append(entry)
        self.kernel_ids[key] = entry["id"]
        for waiting in self.waiting.pop(key, ()):
            waiting["kernel"] = entry["id"]
        return entry

    def kernel_begin(self, device: str, ast: UOp) -> None:
        entry = self._kernel_entry((device, ast), "", "kernel")
        if (beam := self.beams.pop((device, ast), None)) is not None:
            entry["beam"] = beam
        self.open = GraphRecord(entry, ast, "input: the scheduler's kernel graph")

    def beam_searched(self, device: str, ast: UOp, width: int, tried: list | None, heuristic: list, chosen: list):
        """BEAM's search (tried: (round, actions, seconds or None, why dropped) per candidate; None: the choice came
        from the disk cache) for the kernel compiled next from this graph."""
        text = [str(o) for o in chosen]
        beam: dict[str, Any] = {"width": width, "cached": tried is None, "chosen": text, "candidates": [], "won": None}
        beam |= {"heuristic": None, "baseline_s": None, "heuristic_s": None, "best_s": None}
        if tried is not None:
            cands = [[r, [str(o) for o in opts], None if t is None else round(t, 9), why] for r, opts, t, why in tried]
            timed = [c for c in cands if c[2] is not None and not c[3]]
            best = min((c for c in timed if c[1] == text), key=lambda c: c[2], default=None)
            heur = [str(o) for o in heuristic]
            base = next((c[2] for c in cands if c[0] == 0 and c[1] == [] and c[2] is not None), None)
            beam |= {"candidates": cands, "won": cands.index(best) if best is not None else None, "heuristic": heur}
            beam["baseline_s"] = base  # the unoptimized kernel
            beam["heuristic_s"] = next((c[2] for c in cands if c[0] == 0 and c[1] == heur and c[2] is not None), None)
            beam["best_s"] = best[2] if best is not None else None
        self.beams[(device, ast)] = beam

    def kernel_end(self, name: str, src: str, opts: list, n_ops: int, program: Any = None) -> None:
        if self.open is not None:
            self.open.entry |= {"name": name, "src": src, "opts": [str(o) for o in opts], "n_ops": n_ops}
            if program is not None:
                self.programs[id(program)] = (program, self.open.entry)
        self.open = None

    def kernel_ran(self, device: str, ast: UOp, name: str, seconds: float, nbytes: int) -> None:
        kid = self.kernel_ids.get((device, ast))
        entry = (
            self.trace["kernels"][kid]
            if kid is not None
            else self._kernel_entry((device, ast), name, "copy" if ast.op is Ops.COPY else "kernel")
        )
        self._ran(entry, seconds, nbytes)

    def _ran(self, entry: dict, seconds: float, nbytes: int, t: float | None = None, own: float | None = None) -> None:
        """A run: `seconds` from perf_counter's `t` (default: it ended now) on the timeline, `own` of them (default:
        all) the entry's time in the list"""
        entry["runs"] += 1
        entry["time_s"] += seconds if own is None else max(0.0, own)
        entry["bytes"] += nbytes
        if len(runs := self.trace["runs"]) < MAX_RUNS:
            start = (time.perf_counter() - seconds if t is None else t) - self.t0
            runs.append([entry["id"], round(start, 7), round(seconds, 9), nbytes])

    def jit_replay(self, captured: Any, replay: Callable) -> Any:
        """A TinyJit replay runs its captured kernels directly (none is compiled or scheduled): each call is timed and
        counted with its kernel (a run, its seconds and bytes, a timeline entry) where this recorder saw the kernel
        compiled; the replay is an entry of its own, its span on the timeline and, in the list, its own time (the
        replay's less its kernels': pointers patched, checks) plus that of the kernels compiled before recording."""
        entries = [self.programs.get(id(program), (None, None))[1] for program, _, _ in captured.calls]
        spans: list[list[tuple[float, float]]] = [[] for _ in entries]

        def timed(i: int, fn: Callable) -> Callable:
            def call(*args: Any, **kwargs: Any) -> Any:
                t = time.perf_counter()
                ret = fn(*args, **kwargs)
                spans[i].append((t, time.perf_counter() - t))
                return ret

            return call

        # the replay calls `direct` (its plain loop) or `calls`: timed wrappers over the same argument lists (the
        # pointers the replay writes into them are the ones the wrapped calls read), put back after the replay
        direct, calls = captured.direct, captured.calls
        captured.direct = [(timed(i, fn), args) for i, (fn, args) in enumerate(direct)]
        captured.calls = [(timed(i, program), ptrs, names) for i, (program, ptrs, names) in enumerate(calls)]
        t0 = time.perf_counter()
        try:
            ret = replay()
        finally:
            captured.direct, captured.calls = direct, calls
        seconds = time.perf_counter() - t0
        key = ("TinyJit", tuple(captured.names))  # an entry per captured kernel list
        kid = self.kernel_ids.get(key)
        entry = self.trace["kernels"][kid] if kid is not None else None
        if entry is None:
            n = len(captured.names)
            entry = self._kernel_entry(key, f"TinyJit replay: {n} kernel{'s' if n != 1 else ''}", "jit")
            entry["src"] = "\n".join(captured.names)
        counted, counted_bytes = 0.0, 0
        for kernel, ran in zip(entries, spans):
            if kernel is None:
                continue
            per_run = kernel["bytes"] // kernel["runs"] if kernel["runs"] else 0  # the capture ran each kernel
            for start, secs in ran:
                self._ran(kernel, secs, per_run, start)
                counted, counted_bytes = counted + secs, counted_bytes + per_run
        self._ran(entry, seconds, max(0, captured.mem - counted_bytes), t0, own=seconds - counted)
        return ret

    def schedule(self, create_schedule: Callable, outs: list) -> tuple[list, dict]:
        from zeptograd.dtype import dtypes

        entry: dict = {"id": len(self.trace["schedules"])}
        self.trace["schedules"].append(entry)
        sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
        g = self.open = GraphRecord(entry, sink, "input: the tensor graph")
        entry["sink"], entry["decisions"] = g.last, []
        try:
            items, becomes = create_schedule(outs)
        finally:
            self.open = None
        if not items:  # nothing to compute (outputs that are buffers or constants already): not worth a view
            self.trace["schedules"].pop()
            return items, becomes
        entry["realized"] = self._realized(g, outs, items, becomes)
        return items, becomes

    def _realized(self, g: GraphRecord, outs: list, items: list, becomes: dict) -> list[dict]:
        """Each realized node of the tensor graph, the kernel that stores it and why it was stored."""
        from zeptograd.buffers import buffer_under, buffers

        writer: dict[int, tuple[str, UOp]] = {}  # id(Buffer) -> (device, kernel graph) of the item storing it
        for item in items:
            for i in getattr(item, "outputs", [0]):
                writer.setdefault(id(item.bufs[i]), (item.device, item.ast))
        # the outputs, and what each rewrite of the schedule's graph (tensor_fold) made of them
        out_set, realized = set(outs), []
        kept_by = {d["node"]: d["rule"] if d["keep"] else "" for d in g.entry["decisions"]}  # the last decision's
        for u, i in g.table.ids.items():
            if u.op is Ops.SINK and any(st["after"] == i for st in g.entry["steps"]):
                out_set.update(u.src)
        for node, value in becomes.items():
            if (nid := g.table.ids.get(node)) is None or node.op is Ops.BUFFER:
                continue  # a node the scheduler's own passes made, or an input
            buf = buffer_under(value)
            key = writer.get(id(buffers[buf])) if buf is not None and buf in buffers else None
            why = (
                "an output"
                if node in out_set
                else {Ops.CONTIGUOUS: "contiguous()", Ops.ASSIGN: "an assign", Ops.COPY: "a copy"}.get(
                    node.op, kept_by.get(nid) or "the scheduler"
                )
            )
            rec = {"node": nid, "kernel": self.kernel_ids.get(key) if key else None, "why": why}
            if key is not None and rec["kernel"] is None:
                self.waiting.setdefault(key, []).append(rec)
            realized.append(rec)
        return realized

    def _schedule_open(self) -> GraphRecord | None:
        """The schedule being recorded, when the caller is its thread."""
        g = self.open
        return g if g is not None and "decisions" in g.entry and g.thread == threading.get_ident() else None

    def schedule_decision(self, policy: Any, x: UOp, reqs: dict, keep: bool, rule: str) -> None:
        from zeptograd.uop.ops import GroupOp
        from zeptograd.viz.decisions import estimate

        if (g := self._schedule_open()) is None:
            return
        asked = x.op in GroupOp.Elementwise or x.op is Ops.REDUCE_AXIS  # the nodes the cost model is asked about
        if not keep and not asked:
            return  # a view or a pad inlined: no rule was weighed
        dec: dict[str, Any] = {"node": g.table.add(x), "keep": keep, "stage": "the walk", "rule": rule}
        if asked:
            dec["cost"] = estimate(policy.cost, x, reqs)
            if not keep:
                dec["rule"] = "the cost model: " + dec["cost"]["verdict"]
        g.entry["decisions"].append(dec)

    def schedule_kept_all(self, nodes: set, rule: str) -> None:
        if (g := self._schedule_open()) is None:
            return
        ids = sorted(g.table.add(x) for x in nodes)
        g.entry["decisions"] += [{"node": i, "keep": True, "stage": "up front", "rule": rule} for i in ids]

    def schedule_inline_again(self, policy: Any, b: UOp, value: dict, inline: bool) -> None:
        from zeptograd.viz.decisions import inline_again_facts

        if (g := self._schedule_open()) is None:
            return
        facts, est = inline_again_facts(policy, b, value)
        rule = ("inlined again at each read: " if inline else "kept after all: ") + facts + "; " + est["verdict"]
        dec = {"node": g.table.add(b.arg.node), "keep": not inline, "stage": "after the walk", "rule": rule}
        g.entry["decisions"].append(dec | {"cost": est})

    def rewrite(self, sink: UOp, pm: Any, ctx: Any, bottom_up: bool) -> UOp | None:
        g = self.open
        if g is None or g.inside or sink.op is not Ops.SINK or g.thread != threading.get_ident():
            return None
        from zeptograd.uop.upat import graph_rewrite

        folding = g.folding()
        tracked = _TrackedMatcher(pm, self.trace["rules"], folding)
        name, where = _pass_name(pm) if folding is None else ("", "")
        g.inside, t0 = True, time.perf_counter()
        try:
            out = graph_rewrite(sink, tracked, ctx, bottom_up)  # type: ignore[arg-type]  # duck-typed: its rewrite()
        finally:
            g.inside = False
        if folding is None:  # else its rules are the folding pass's
            g.add_step(name, where, sink, out, tracked, (time.perf_counter() - t0) * 1e3)
        return out

    def named_pass(self, name: str, about: str, nest: bool, fn: Callable, args: tuple, kwargs: dict) -> Any:
        g = self.open
        if g is None or g.inside or g.thread != threading.get_ident() or g.folding() is not None:
            return fn(*args, **kwargs)  # not recording here, or inside a pass that is one step
        first = args[0] if args else None
        before = first if isinstance(first, UOp) and first.op is Ops.SINK else None
        if "{" in name:  # the action of apply_opt, ...: its arguments after the graph
            name = name.format(*args[1:])
        p = g.pass_begin(name, about, nest, _code_where(fn), before)
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            g.passes.remove(p)  # an action the optimizer tried and refused: no step, its graph is not kept
            raise
        after = out[0] if isinstance(out, tuple) else out  # optimize: (kernel, actions)
        if isinstance(after, UOp) and after.op is Ops.SINK:
            g.pass_end(p, after)
        else:
            g.passes.remove(p)
        return out


recorder: Recorder | None = None  # created by the first hook that runs with VIZ on


def _get() -> Recorder:
    global recorder
    if recorder is None:
        recorder = Recorder()
        atexit.register(_write_at_exit)
    return recorder


# ***** the hooks (called only with VIZ on) *****


def rewrite(sink: UOp, pm: Any, ctx: Any, bottom_up: bool) -> UOp | None:
    """graph_rewrite's result when this rewrite is recorded, None to let graph_rewrite run it as usual."""
    return _get().rewrite(sink, pm, ctx, bottom_up)


def named_pass(name: str, about: str, nest: bool, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """The pass's result; with a kernel or a schedule being recorded in this thread, also its step."""
    return _get().named_pass(name, about, nest, fn, args, kwargs)


def jit_replay(captured: Any, replay: Callable) -> Any:
    return _get().jit_replay(captured, replay)


def recorded_schedule(create_schedule: Callable) -> Callable:
    return lambda outs: _get().schedule(create_schedule, outs)


def kernel_begin(device: str, ast: UOp) -> None:
    _get().kernel_begin(device, ast)


def kernel_end(name: str, src: str, opts: list, n_ops: int, program: Any = None) -> None:
    _get().kernel_end(name, src, opts, n_ops, program)


def kernel_ran(device: str, ast: UOp, name: str, seconds: float, nbytes: int) -> None:
    _get().kernel_ran(device, ast, name, seconds, nbytes)


def beam_searched(device: str, ast: UOp, width: int, tried: list | None, heuristic: list, chosen: list) -> None:
    _get().beam_searched(device, ast, width, tried, heuristic, chosen)


def schedule_decision(policy: Any, x: UOp, reqs: dict, keep: bool, rule: str) -> None:
    _get().schedule_decision(policy, x, reqs, keep, rule)


def schedule_kept_all(nodes: set, rule: str) -> None:
    _get().schedule_kept_all(nodes, rule)


def schedule_inline_again(policy: Any, b: UOp, value: dict, inline: bool) -> None:
    _get().schedule_inline_again(policy, b, value, inline)


@contextlib.contextmanager
def recording() -> Iterator[Recorder]:
    """VIZ on for a block, into a fresh Recorder that is not written at exit (tests, notebooks: `rec.trace`)."""
    global recorder
    old, recorder = recorder, Recorder()
    try:
        with Context(VIZ=1):
            yield recorder
    finally:
        recorder = old


def _write_at_exit() -> None:
    if recorder is None or recorder.pid != os.getpid():
        return
    path = getenv("VIZ_FILE", "") or os.path.join(tempfile.mkdtemp(prefix="zeptograd-viz-"), "trace.json")
    trace = recorder.trace
    write_trace(trace, path)
    # on stderr: a program's stdout may be its data (piped on), which VIZ must not change
    counts = f"{len(trace['kernels'])} kernels, {len(trace['schedules'])} schedules"
    print(f"VIZ: {counts} written to {path}", file=sys.stderr)
    if sys.stdout.isatty():
        from zeptograd.viz.server import serve

        with contextlib.suppress(KeyboardInterrupt):
            serve(path)
    else:  # not a terminal (a pipe, CI): never wait for a Ctrl-C nobody will press
        print(f"VIZ: to see it: python -m zeptograd.viz {path}", file=sys.stderr)
