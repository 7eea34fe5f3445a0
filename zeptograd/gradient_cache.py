"""A cache of gradient graphs: compute_gradient's result for a forward graph of a structure met before, rebuilt from
the nodes of the new graph without running the gradient rules again.

An eager training loop builds the same forward graph on new buffers every step, and each step's backward applies
every rule through Tensor ops (a Tensor per op, broadcasting, dtype checks) to make the same gradient graph over the
new nodes. The rules read only the graph's structure, so the gradient graph is a function of it: the key holds per
forward node its op, dtype, arg (a BUFFER's size, not its identity; an ASSIGN's order, not its unique id) and the
positions of its sources, plus which nodes are targets, which require grad (Tensor._new marks the nodes built on
them), whether `no_grad` is on, and the value of every knob. A template stores the nodes the rules built, with their
sources as positions among the forward graph's nodes and the earlier built ones; a hit builds them with UOp (interned:
the very nodes the rules would build) and marks as requiring grad those that were. Graphs with a sharded leaf, a
Variable, or whose gradient builds a BUFFER or ASSIGN of its own are not cached (the last noted under their key:
a later graph of it runs the rules without looking for a template again).

A node with a rule of its own (gradient.py's `with_gradient`) is keyed by the rule's identity: its code, the values it
closes over (and its defaults) and the module-level values it reads (plain values by value; modules, classes,
functions and knobs by identity), which with the structure of its inputs are all the graph it builds can depend on.
A rule that reads anything else (a Tensor, a list, an object) leaves its graph uncached. Not keyed: what the functions
a rule calls read from their own modules. A built node
that has a rule of its own (the gradient of a matmul is a matmul) gets it again on a hit, for a gradient of the
gradient. `GRADIENT_CACHE=0` turns it off.
"""

from __future__ import annotations

import dataclasses
import dis
import enum
import functools
import itertools
import types
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zeptograd.dtype import DType, dtypes
from zeptograd.helpers import ContextVar
from zeptograd.uop import variable
from zeptograd.uop.ops import Ops, UOp, _arg_key, interned_uop

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor

GRADIENT_CACHE = ContextVar("GRADIENT_CACHE", 1)
MAX_ENTRIES = 32  # oldest dropped first (a key holds a tuple per node: a few hundred KiB for a large model's graph)


@dataclasses.dataclass
class Template:
    # per built node: op, dtype, arg, the arg as UOps are interned by it (_arg_key), its sources' positions, its shape
    nodes: list[tuple[Ops, DType, Any, Any, tuple[int, ...], tuple | None]]
    marked: list[int]  # the positions of the built nodes that require grad
    rules: list[tuple[int, tuple[int, ...], Callable]]  # per built node with a rule of its own: its position, its
    # inputs' and the rule (closing over plain values only: the same function serves every hit)
    outs: list[tuple[int, int, Any, Any]]  # per target: its position, its gradient's, the gradient Tensor's device
    # and requires_grad


class Stats:
    hits = 0
    misses = 0


_cache: dict[tuple, Template] = {}
REFUSED = Template([], [], [], [])  # the entry of a graph whose gradient graph is not rebuilt from a template
_BUFFER, _ASSIGN, _MULTI = Ops.BUFFER, Ops.ASSIGN, Ops.MULTI  # (globals: Ops.X is a metaclass hook on 3.11)
_UNCACHED_OPS = frozenset((Ops.BUFFER, Ops.ASSIGN, Ops.BIND, Ops.DEFINE_VAR, Ops.MULTI))
_VARIABLE_OPS = frozenset((Ops.BIND, Ops.DEFINE_VAR))


_seen: dict[int, None] = {}  # the hashes of keys met once (a template is built at the second)
MAX_SEEN = 256
TEMPLATE_AT_SECOND_SIGHT = True  # (tests of the templates themselves build one at the first)


def clear():
    """Forget every template, and the rule code and module objects their keys hold by identity."""
    _cache.clear()
    _seen.clear()
    _codes.clear()
    _global_names.clear()
    _kept.clear()


_codes: dict[int, types.CodeType] = {}  # the code of every rule keyed (kept: a key holds its id, not its hash)
MAX_CODES = 4096
_FunctionType = types.FunctionType
_PLAIN = frozenset((int, str, bool, type(None)))
MAX_RULE_DEPTH = 4  # functions inside a rule's closure, keyed in turn (a closure over itself is refused)


_global_names: dict[int, tuple[str, ...]] = {}  # per rule's code: the names it (and functions defined in it) reads
_kept: dict[int, Any] = {}  # the module-level objects keyed by identity
_MISSING = object()
_FIXED_TYPES = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    functools.partial,
    functools._lru_cache_wrapper,  # (a cached module function)
    ContextVar,
    enum.Enum,
)


_GLOBAL_LOADS = frozenset(("LOAD_GLOBAL", "LOAD_NAME"))


def _names_read(code: types.CodeType) -> tuple[str, ...]:
    """The global names code and the code objects defined in it load (not its attribute names: `x.shape` does not
    read a module's `shape`). Once per code object."""
    names: dict[str, None] = {}
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(dict.fromkeys(i.argval for i in dis.get_instructions(c) if i.opname in _GLOBAL_LOADS))
        stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
    return tuple(names)


def _value_key(v: Any, depth: int) -> Any:
    """A value a rule closes over as a key (its type too: 1, 1.0 and True build different graphs), or None where it
    is no plain value (a Tensor, an object: what the rule builds from it is not known from the value)."""
    if (t := type(v)) in _PLAIN:
        return (t, v)
    if t is float:
        return (t, _arg_key(v))
    if t is tuple or t is list:
        if all(type(x) is int for x in v):
            return (t, tuple(v))
        items = [_value_key(x, depth) for x in v]
        return None if None in items else (t, tuple(items))
    if t is _FunctionType or t is functools.partial:
        return rule_key(v, depth + 1)
    if isinstance(v, DType):  # (unique instances)
        return v
    return None


def rule_key(rule: Callable, depth: int = 0) -> Any:
    """A custom gradient rule's identity: equal for rules that build the same graph from the same inputs (the code,
    the values it closes over, its defaults; a functools.partial's function and arguments), None where that is not
    known (see _value_key)."""
    if depth > MAX_RULE_DEPTH:
        return None
    if type(rule) is functools.partial:
        if (f := rule_key(rule.func, depth + 1)) is None or (args := _value_key(rule.args, depth)) is None:
            return None
        kw = _value_key(tuple(sorted(rule.keywords.items())), depth)
        return None if kw is None else ("partial", f, args, kw)
    if type(rule) is not _FunctionType:
        return None
    code = rule.__code__
    if (cid := id(code)) not in _codes:
        if len(_codes) >= MAX_CODES:  # rules made anew each step (exec): start over rather than keep them all alive
            clear()
        _codes[cid] = code
        _global_names[cid] = _names_read(code)
    values: list[Any] = []
    module = rule.__globals__
    for name in _global_names[cid]:  # the module-level values it reads (a name not there is a builtin)
        if (v := module.get(name, _MISSING)) is _MISSING:
            continue
        if isinstance(v, _FIXED_TYPES):  # a module, class, function, knob: by identity (kept alive: ids not reused)
            _kept.setdefault(id(v), v)
            values.append((name, id(v)))
        elif (k := _value_key(v, depth)) is not None:
            values.append((name, k))
        else:  # a mutable object (a list, an array, a Tensor): what the rule builds from it is not known
            return None
    cells, defaults, kwdefaults = rule.__closure__, rule.__defaults__, rule.__kwdefaults__
    if cells is None and defaults is None and kwdefaults is None:
        return (cid, tuple(values))
    for cell in cells or ():
        try:
            v = cell.cell_contents
        except ValueError:  # (a name not bound yet)
            return None
        if (k := _value_key(v, depth)) is None:
            return None
        values.append(k)
    if defaults is not None and (k := _value_key(defaults, depth)) is None:
        return None
    values.append(None if defaults is None else k)
    if kwdefaults is not None and (k := _value_key(tuple(sorted(kwdefaults.items())), depth)) is None:
        return None
    values.append(None if kwdefaults is None else k)
    return (cid, tuple(values))


# (bound by _bind at the first call: read from modules that import this one, without a function-level import per
# call, ~1 us each)
_schedule_cache: Any = None
_custom_data: Any = None  # gradient.py's _custom_rules' own dict
_custom_rules: Any = None
_tensor_of: Any = None
_grad_data: Any = None  # tensor/live.py's
_grad_remove: Any = None


def _bind() -> None:
    global _schedule_cache, _custom_data, _custom_rules, _tensor_of, _grad_data, _grad_remove
    from zeptograd import gradient
    from zeptograd.engine import schedule_cache
    from zeptograd.tensor import live

    _custom_data, _custom_rules, _tensor_of = gradient._custom_data, gradient._custom_rules, gradient._tensor_of
    _grad_data, _grad_remove = live._grad_data, live._grad_remove
    _schedule_cache = schedule_cache


def structure(topo: list[UOp], root_grad: Tensor, targets: set[UOp]) -> tuple[tuple, list[UOp], dict[UOp, int]] | None:
    """(the key of compute_gradient's inputs, the forward graph's nodes then root_grad's, each node's position), or
    None where the graph is not cached here."""
    if _schedule_cache is None:
        _bind()
    if type(root_grad.device) is not str or _tensor_of[0] is None:
        return None
    symbols, custom = variable.in_use, bool(_custom_data)  # (a lookup per node only once one can be found)
    position: dict[UOp, int] = {}
    key: list[tuple] = []
    n_assign = 0
    ref, grad_data = weakref.ref, _grad_data
    for u in itertools.chain(topo, root_grad.uop.toposort()):  # (root_grad's few: those met already are skipped)
        if u in position:
            continue
        if (op := u.op) is _BUFFER:
            arg: Any = u.arg[1]
        elif op is _ASSIGN:
            arg, n_assign = n_assign, n_assign + 1
        elif op is _MULTI or (symbols and (op in _VARIABLE_OPS or variable._arg_has_uop(u))):
            return None
        else:
            arg = u.arg
            if isinstance(arg, float):
                arg = _arg_key(arg)  # as UOp interning tells args apart: -0.0 is not 0.0
        r = ref(u)
        if custom and (rule := _custom_data.get(r)) is not None:  # a rule of its own: keyed by its identity
            if (rk := rule_key(rule[1])) is None or None in (ins := tuple([position.get(s) for s in rule[0]])):
                return None
        else:
            rk = None
        if len(src := u.src) == 1:  # (the common cases without a list)
            srcs: tuple[int, ...] = (position[src[0]],)
        elif len(src) == 2:
            srcs = (position[src[0]], position[src[1]])
        else:
            srcs = tuple([position[s] for s in src])
        position[u] = len(position)
        if rk is None:
            key.append((op, u.dtype, arg, srcs, r in grad_data))
        else:
            key.append((op, u.dtype, arg, srcs, r in grad_data, rk, ins))
    _schedule_cache.knob_values()
    extra = (
        tuple(sorted(position[t] for t in targets if t in position)),
        position.get(root_grad.uop),
        root_grad.device,
        type(root_grad)._grad_off,
        _schedule_cache._knobs[2],
    )
    if extra[1] is None:
        return None
    return (tuple(key), extra), list(position), position


def rebuild(t: Template, nodes: list[UOp], root_grad: Tensor) -> dict[UOp, Tensor]:
    """compute_gradient's result from the template of an equal-structure graph, over this graph's `nodes`."""
    tensor_of = _tensor_of[0]
    Stats.hits += 1
    at = list(nodes)
    for op, dtype, arg, key_arg, src, shape in t.nodes:  # (UOp(op, dtype, sources, arg), its shape known)
        if len(src) == 1:
            srcs: tuple[UOp, ...] = (at[src[0]],)
        elif len(src) == 2:
            srcs = (at[src[0]], at[src[1]])
        else:
            srcs = tuple([at[i] for i in src])
        at.append(interned_uop(op, dtype, srcs, arg, key_arg, shape))
    for i in t.marked:
        _grad_data.add(weakref.ref(at[i], _grad_remove))
    for i, ins, rule in t.rules:
        _custom_rules[at[i]] = (tuple([at[j] for j in ins]), rule)
    out = {}
    for target, grad, device, requires_grad in t.outs:
        g = tensor_of(at[grad], device)
        g.requires_grad = requires_grad
        out[at[target]] = g
    return out


def remember(key: tuple, nodes: list[UOp], position: dict[UOp, int], grads: dict[UOp, Tensor]) -> None:
    """Store the template of compute_gradient's result `grads` for a graph of `key` (nodes, position: structure's),
    or REFUSED where it has none: the next graph of that key runs the rules without trying again. Only at a key's
    second sight: a graph whose key is new each step (dropout's seed is a constant in it) builds no template to drop."""
    Stats.misses += 1
    if TEMPLATE_AT_SECOND_SIGHT and (h := hash(key)) not in _seen:
        if len(_seen) >= MAX_SEEN:
            del _seen[next(iter(_seen))]
        _seen[h] = None
        return
    if len(_cache) >= MAX_ENTRIES:
        del _cache[next(iter(_cache))]
    _cache[key] = REFUSED if (t := _template(nodes, position, grads)) is None else t


def _template(nodes: list[UOp], position: dict[UOp, int], grads: dict[UOp, Tensor]) -> Template | None:
    built: dict[UOp, int] = {}
    entries: list[tuple[Ops, DType, Any, Any, tuple[int, ...], tuple | None]] = []
    n_old = len(nodes)
    # one walk over every gradient's graph (they share most of their nodes), down to the forward graph's nodes
    if (sink := UOp(Ops.SINK, dtypes.void, tuple([g.uop for g in grads.values()]))) in position:
        return None
    for u in sink.toposort(stops=position):
        if u is sink or u in position:
            continue
        if u.op in _UNCACHED_OPS or isinstance(u.arg, UOp) or (variable.in_use and variable._arg_has_uop(u)):
            return None  # a node whose identity is more than its structure (a BUFFER the rules made: the all-reduce
            # of distributed.py's sum_over_ranks, which must run at every backward)
        src = []
        for s in u.src:
            if (i := position.get(s)) is None:
                i = built[s]
            src.append(i)
        built[u] = n_old + len(entries)
        arg = u.arg
        entries.append((u.op, u.dtype, arg, _arg_key(arg) if isinstance(arg, float) else arg, tuple(src), u.shape))
    marked = [i for u, i in built.items() if weakref.ref(u) in _grad_data]
    rules: list[tuple[int, tuple[int, ...], Callable]] = []
    for u, i in built.items():
        if (rule := _custom_data.get(weakref.ref(u))) is not None:
            ins = []
            for s in rule[0]:
                if (j := position.get(s, built.get(s))) is None:
                    return None  # (an input outside the graphs: not rebuilt)
                ins.append(j)
            if rule_key(rule[1]) is None:
                return None
            rules.append((i, tuple(ins), rule[1]))
    outs = []
    for target, g in grads.items():
        i = position.get(g.uop)
        outs.append((position[target], built[g.uop] if i is None else i, g.device, g.requires_grad))
    return Template(entries, marked, rules, outs)
