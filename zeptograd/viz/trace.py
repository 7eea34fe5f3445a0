"""The trace VIZ=1 writes: one JSON object, versioned (`FORMAT`, `VERSION`; a reader refuses other versions).

Top level: `format`, `version`, `program` (argv), `kernels`, `schedules`, `runs`, `rules`.
- A graph is a node table `nodes` (each `[op, dtype, arg, [source ids], shape]`, ids are table positions, sources
  before users) shared by every step of one kernel or schedule: a step names its graphs by their sink's id, and
  the nodes a rewrite kept are stored once.
- kernel: `id name kind device src opts n_ops nodes steps runs time_s bytes` (kind: kernel or copy); a step: `name`
  (the pass: the function that called graph_rewrite and its matcher), `where`, `before`/`after` sink ids, `rules`
  ([rule, matches, ms], most first), `made` ({node id: rule} for each node a rule returned), `kind` (input,
  rewrite, pass: a named pass that is not one graph_rewrite, with `about`; code: a change no named step made),
  `depth` (1 for the steps under a pass that nests them: optimize's, listed after it), `ms`. `runs`, `time_s`,
  `bytes`: how often it ran, and the seconds and the bytes of its buffers summed over those runs.
- schedule: `id nodes sink steps realized decisions`; `realized` is [{node, kernel (kernel id or null), why}]: the
  node's value was stored by that kernel. The page draws each kernel's fused group: the nodes below a realized node
  down to the next realized ones. `decisions`: the scheduler's, in order, [{node, keep, stage, rule, cost?}] (cost:
  the cost model's estimate both ways, viz/decisions.py).
- a kernel compiled after a BEAM search has `beam`: {width, cached, chosen, candidates ([round, [actions], seconds
  or null, why dropped or ""]), won (index), heuristic, baseline_s, heuristic_s, best_s}.
- `runs`: the program's timeline, `[kernel id, start s, seconds, bytes]` in order (the first MAX_RUNS).
- `rules`: {rule: its source line}.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from zeptograd.helpers import ArgumentError
from zeptograd.uop.ops import UOp

FORMAT, VERSION = "zeptograd-viz", 1
MAX_ARG = 80  # characters of an arg's text (a symbolic CONST's expression can be long)


def dtype_text(dtype: Any) -> str:
    return str(dtype).removeprefix("dtypes.")


def arg_text(arg: Any) -> str:
    if arg is None:
        return ""
    if isinstance(arg, Enum):
        return arg.name
    if isinstance(arg, tuple):
        text = "(" + ", ".join(arg_text(a) for a in arg) + ("," if len(arg) == 1 else "") + ")"
    elif isinstance(arg, UOp):
        text = f"<{arg.op.name}>"
    else:
        text = repr(arg)
    return text if len(text) <= MAX_ARG else text[: MAX_ARG - 3] + "..."


def shape_text(u: UOp) -> str | None:
    shape = u.shape
    if shape is None:
        return None
    return "(" + ", ".join(str(s) if isinstance(s, int) else arg_text(s) for s in shape) + ")"


class NodeTable:
    """The nodes of every graph one kernel (or schedule) went through, each once; a graph is its sink's id."""

    def __init__(self):
        self.ids: dict[UOp, int] = {}
        self.nodes: list[list] = []

    def add(self, sink: UOp) -> int:
        ids = self.ids
        for u in sink.toposort(gate=lambda u: u not in ids):  # only the nodes new since the last graph
            if u not in ids:
                ids[u] = len(self.nodes)
                self.nodes.append(
                    [u.op.name, dtype_text(u.dtype), arg_text(u.arg), [ids[s] for s in u.src], shape_text(u)]
                )
        return ids[sink]


def new_trace(program: list[str]) -> dict:
    return {"format": FORMAT, "version": VERSION, "program": program, "kernels": [], "schedules": [], "runs": []}


def check_trace(trace: Any, where: str = "trace") -> dict:
    """The trace if it is one this version reads, else an ArgumentError saying what it is."""
    if not isinstance(trace, dict) or trace.get("format") != FORMAT:
        got = trace.get("format") if isinstance(trace, dict) else type(trace).__name__
        raise ArgumentError(f"{where} is not a zeptograd VIZ trace (format {got!r}, expected {FORMAT!r})")
    if trace.get("version") != VERSION:
        got = trace.get("version")
        raise ArgumentError(f"{where} is trace version {got!r}; this zeptograd reads version {VERSION}")
    for key in ("kernels", "schedules", "runs"):
        if not isinstance(trace.get(key), list):
            raise ArgumentError(f"{where} has no list {key!r}")
    return trace


def write_trace(trace: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))


def read_trace(path: str) -> dict:
    try:
        with open(path) as f:
            trace = json.load(f)
    except json.JSONDecodeError as e:
        raise ArgumentError(f"{path} is not a zeptograd VIZ trace: not JSON ({e})") from None
    return check_trace(trace, path)
