"""TinyJit: run a function's kernels again without running the function.

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        return ((x @ w) - y).square().mean()

Call 1 runs the function normally (compiling its kernels). Call 2 runs it again while engine/realize.py's
`capturing` hook records every ScheduleItem that runs; in it, a value realized before the capture is computed
again if it reads an input (the replay must), and reused otherwise (an ASSIGN done before is never run twice).
Calls 3+ do not run the function: they replay the captured kernels, a pre-built list of (program, pointers)
calls in which only the pointers of the input buffers change (each call made once as the compiled function and its
prepared arguments, Program.direct_call, and consecutive CPU kernels as one table that one foreign call runs,
runtime/call_table.py; with positional Tensor arguments only, a replay is one straight-line function written and
compiled for the capture, _build_fast_replay). So the function body runs exactly twice,
whatever the number of calls.

What is an input: every positional or keyword argument that is a Tensor (inputs are realized before the call;
a constant tensor is given a buffer). Other arguments are part of the capture: on replay they must equal the
captured ones (lists, tuples and dicts compared by value, with the types of their elements, against a copy
taken at the capture, so one mutated in place is caught; other objects by identity or ==). A numpy array is
refused (JitArgumentTypeError, a TypeError): pass a Tensor. Tensors the function reaches otherwise (a model's
weights) are used by their captured buffers.

Nesting: a TinyJit called while another one captures (in the same thread) runs its function as a plain call, so
the outer capture records the inner function's kernels and the outer replay runs them (the inner jit's own call
count and capture are left as they were).

prune=True: the kernels whose results cannot change from call to call (they read no input, take no Variable,
read nothing a replayed kernel writes and do not update a buffer in place) run once, at the capture, and the
replay leaves them out; their outputs keep their values. A weight the function reaches but does not update
(it is not an input) is assumed to stay as it was at the capture: with prune=True, changing it outside the jit
is not seen by the replays.

Threads: a capture records only the kernels of its own thread (realize._capturing is per thread). A TinyJit
object takes one call at a time; a replay runs under realize.engine_lock like a realize.

Outputs keep their values, as an eager call's results do (tinygrad instead overwrites call N's outputs in call
N+1): the returned tensors are realized; on replay they are fresh Tensor objects on the output buffers the replay
wrote. A replay writes an output buffer the capture allocated again only once nothing refers to what the previous
call returned there (no tensor, no lazy graph: the reference count of its BUFFER uop tells); otherwise the replay is
pointed at a new buffer of the same size (the allocator's free cache makes `out = step(x)` in a loop alternate
between two). A buffer that existed before the capture (a weight the function assigns to) is state: every call
updates it in place and what was returned on it shows the update, as a returned parameter does in torch. Passing a
returned tensor back in (h = step(h, x)) is safe: an input that aliases a buffer the replay writes is copied first.

Variables (uop/variable.py): an input whose shape holds a bound Variable, or a bound Variable passed as an
argument, may take another value on each call: the capture is keyed by the unbound variable, and a replay passes
the new values to the kernels that take them (its outputs get shapes bound to them). While capturing, a shrink or
reshape that would be out of bounds (or mismatched) for some value in a Variable's range is an error, since a
replay does not run those checks; so is a kernel that needs a Variable no input or argument carries.

Never a silent wrong answer: a JitError when an input's shape, dtype or device changes from the capture, when a
captured Tensor argument is not a Tensor (or the reverse), when a non-Tensor argument changes, when one buffer
is passed as two inputs, when tensors are nested in a list/dict argument, when the function returns anything
but a Tensor or a tuple/list of Tensors (or None), when the capture draws random numbers (a replay would repeat
them) and (from realize.py) when the function reads tensor values on the host while capturing.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

from zeptograd.buffers import buffers, new_buffer_uop, reshape_uop, view_base
from zeptograd.device import Buffer, GlobalCounters
from zeptograd.engine import realize as _realize
from zeptograd.engine.jit_args import (
    ArgKey,
    JitError,
    _buffer_tensor,
    _copy_buffer,
    _flat_outputs,
    _name,
    _outputs,
    _regroup,
    _same_value,
    _snapshot,
    _split_args,
    _value,
    _var_vals,
    _whole_buffer,
    _wrap,
)
from zeptograd.engine.jit_replay import NOT_FAST, _buffers_data, _build_fast_replay
from zeptograd.helpers import DEBUG, VIZ
from zeptograd.runtime import call_table
from zeptograd.runtime.call_table import CallTable
from zeptograd.schedule.fold import uniform_const
from zeptograd.tensor.live import (
    _grad_data,
)
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.variable import rebind, rebind_shape, strip_binds, unbound_shape


class _ReusableRealized:
    """The view of realize.py's `realized` a capture schedules with. A value the capture realized is reused (a
    captured kernel computed it); one realized otherwise (before the capture, or by another thread meanwhile) is
    reused unless it reads an input of the jit (the replay must compute it again from the new inputs), and an ASSIGN
    realized otherwise is always reused (running it again would apply its write twice)."""

    def __init__(self, input_bufs: list[Buffer]):
        self.ids = {id(b) for b in input_bufs}
        self.reads_input: dict[UOp, bool] = {}
        self.computed: weakref.WeakSet[UOp] = weakref.WeakSet()  # what realize.remember_realized noted meanwhile

    def _reads_input(self, u: UOp) -> bool:
        memo = self.reads_input
        if u not in memo:
            for n in u.toposort(gate=lambda n: n not in memo):
                if n not in memo:
                    memo[n] = (n.op is Ops.BUFFER and id(buffers.get(n)) in self.ids) or any(memo[s] for s in n.src)
        return memo[u]

    def __contains__(self, u: UOp) -> bool:
        return u in _realize._realized and (u in self.computed or u.op is Ops.ASSIGN or not self._reads_input(u))

    def __getitem__(self, u: UOp) -> UOp:
        return _realize._realized[u]


class _Capture(list):
    """What run_schedule appends the ScheduleItems it runs to while capturing (realize.py's `capturing`).

    `checks`: (item index, check(var_vals)) pairs that code run during the capture registers for values it must
    check on every call (tensor/indexing.py: the bounds of index tensors); a replay calls each right after that item's
    kernel, so an error is raised before the kernels after it run."""

    def __init__(self, input_bufs: list[Buffer]):
        super().__init__()
        self.realized = _ReusableRealized(input_bufs)
        self.checks: list[tuple[int, Callable[[dict[str, int]], None]]] = []
        self.first_tensor = _realize.tensor_clock()  # tensors made before: not the function's (realize.py)
        # Buffers of tensors the function made that an assign's realize computed before its write (realize.py)
        self.reader_bufs: set[int] = set()


def _input_buffer(t) -> Buffer:
    """The Buffer holding a realized input tensor; a constant tensor is given one (the capture must read memory)."""
    from zeptograd.tensor import Tensor

    if (b := _whole_buffer(t.uop)) is not None:
        return b
    if uniform_const(_value(t.uop)) is not None:
        t.uop = Tensor(t.numpy(), device=t.device, dtype=t.dtype).uop
        if (b := _whole_buffer(t.uop)) is not None:
            return b
    raise JitError(f"TinyJit: an input realized to {_value(t.uop).op.name}, not a whole buffer")


def _realized_inputs(tensors: dict[ArgKey, Any]) -> dict[ArgKey, Buffer]:
    """Each input's Buffer, realizing lazy inputs first; one buffer passed as two inputs is an error."""
    bufs = {k: b for k, t in tensors.items() if (b := _whole_buffer(t.uop)) is not None}
    if len(bufs) < len(tensors):
        from zeptograd.tensor import Tensor

        lazy = [t for k, t in tensors.items() if k not in bufs]
        Tensor.realize(*lazy)
        bufs = {k: _input_buffer(t) for k, t in tensors.items()}
    if len({id(b) for b in bufs.values()}) < len(bufs):
        seen: dict[int, ArgKey] = {}
        for k, b in bufs.items():
            if id(b) in seen:
                raise JitError(
                    f"TinyJit: arguments {_name(seen[id(b)])} and {_name(k)} are the same buffer; pass "
                    f"distinct tensors (e.g. x.contiguous() for one of them)"
                )
            seen[id(b)] = k
    return bufs


def _rng_snapshot() -> dict:
    """The random number generator's state (seed, counter)."""
    from zeptograd.tensor.random import _rng_state

    return dict(_rng_state)


def _loaded_params(ast: UOp) -> set[int]:
    """The DEFINE_GLOBAL positions a kernel graph loads from (an output it also loads is read-modify-written)."""
    return {
        g.arg for ld in ast.toposort() if ld.op is Ops.LOAD for g in ld.src[0].toposort() if g.op is Ops.DEFINE_GLOBAL
    }


def _replayed(items: list, kernels: list, input_ids: set[int]) -> list[bool]:
    """Which captured kernels a prune=True replay must run again: a kernel whose result can change from call to call.
    That is one that takes a Variable, reads an input or a buffer a replayed kernel writes (before or after it: the
    next call reads the new value), writes such a buffer (its value would be overwritten between calls), or reads
    what it writes (an update in place, like w.assign(w + 1), applies once per call). The others ran at the capture
    and their output buffers keep their values. Repeated until no kernel is added (each pass only adds)."""
    reads, writes = [], []
    for item in items:
        outs = set(getattr(item, "outputs", [0]))
        loaded = _loaded_params(item.ast)
        reads.append({id(b) for pos, b in enumerate(item.bufs) if pos not in outs or pos in loaded})
        writes.append({id(item.bufs[o]) for o in outs})
    changing = set(input_ids)  # the inputs, and then every buffer a replayed kernel writes
    while True:
        seen, replayed = set(changing), []
        for kernel, r, w in zip(kernels, reads, writes):
            replay = bool(kernel.vars) or not seen.isdisjoint(r) or not seen.isdisjoint(w) or not w.isdisjoint(r)
            replayed.append(replay)
            if replay:
                seen |= w
        if seen == changing:
            return replayed
        changing = seen


def _skip_readers_only(items: _Capture, replayed: list[bool], outs: list) -> None:
    """A kernel that only stores tensors the function made, computed because an assign was realized while they were
    alive (realize.py: the readers of a buffer's old contents), is not replayed when nothing after it reads them and
    none is returned: a replay does not run the function, so no one can read them."""
    returned = set()
    for t in outs:
        base = view_base(_value(t.uop))
        if base is not None and base in buffers:
            returned.add(id(buffers[base]))
    read_later: set[int] = set()
    for i in range(len(items) - 1, -1, -1):
        item = items[i]
        out_pos = set(getattr(item, "outputs", [0]))
        out_ids = {id(item.bufs[o]) for o in out_pos}
        if out_ids <= items.reader_bufs and out_ids.isdisjoint(read_later | returned):
            replayed[i] = False
        loaded = _loaded_params(item.ast)
        read_later |= {id(b) for pos, b in enumerate(item.bufs) if pos not in out_pos or pos in loaded}


def _referred_to(uops: list[UOp]) -> bool:
    """Whether anything but the list refers to one of `uops` (CPython's reference count: a tensor, a lazy graph or a
    realized value that holds a uop holds a reference to it; the engine's weak maps do not)."""
    for u in uops:
        if sys.getrefcount(u) > 3:  # the list, this loop's variable and getrefcount's argument
            return True
    return False


@dataclass
class _FreshOutput:
    """An output buffer the capture allocated and a replayed kernel writes. What a call returned on it keeps its
    values: a replay writes `buf` again only once nothing but this object refers to the BUFFER uops handed out on it
    (then the next call hands out the same uop again: no new node, as nothing can tell it from a new one), else the
    spare (the buffer of the call before, once nothing refers to it) or a new buffer. So `out = step(x)` in a loop
    alternates two."""

    buf: Buffer  # what the next replay writes (unless what was handed out on it is still referred to)
    slots: list[tuple[int, int]]  # (call index, argument position) of every use of the buffer in the replay
    handed: list[UOp]  # the BUFFER uops the last call returned on `buf`
    spare: Buffer | None = None
    spare_handed: list[UOp] = field(default_factory=list)

    def prepare(self, cap: CapturedJit):
        """Point the replay at another buffer if the last call's values on this one are still referred to."""
        if not _referred_to(self.handed):
            return
        if self.spare is not None and not _referred_to(self.spare_handed):
            self.buf, self.spare = self.spare, self.buf
            self.handed, self.spare_handed = self.spare_handed, self.handed
        else:  # a spare still referred to stays with its readers
            self.spare, self.spare_handed = self.buf, self.handed
            self.buf, self.handed = Buffer(self.buf.device, self.buf.size, self.buf.dtype), []
        ptr = self.buf.ptr
        for ci, pos in self.slots:
            cap.set_ptr(ci, pos, ptr)

    def hand_out(self) -> UOp:
        """A BUFFER uop on this call's values (one per call: the tensors returned on the buffer share it). The last
        call's uop is handed out again unless it was marked as requiring grad (tensor.py's _grad_uops: a tensor
        made on it would require grad too, where torch's fresh output does not)."""
        if len(self.handed) != 1 or (_grad_data and weakref.ref(self.handed[0]) in _grad_data):
            self.handed = [new_buffer_uop(self.buf.device, self.buf.size, self.buf.dtype, self.buf)]
        return self.handed[0]


@dataclass
class CapturedJit:
    """The kernels of one capture, ready to replay."""

    calls: list[tuple[Callable, list[int], tuple[str, ...]]]  # (program, pointers, Variables); input slots patched
    input_slots: list[tuple[int, int, ArgKey]]  # (call index, argument position, the input that goes there)
    held: list[Buffer]  # intermediate and output buffers (and those the function reached), kept alive
    written: set[int]  # ids of the held buffers the kernels write
    signature: dict[ArgKey, tuple]  # input -> (shape with its Variables unbound, dtype, device)
    others: dict[ArgKey, Any]  # the non-Tensor arguments of the capture
    outputs: list[tuple]  # ("const", uop, device) | ("in", key, shape, device) | ("buf", Buffer, shape, device)
    # | ("fresh", index in fresh, shape, device), uops and shapes with their Variables unbound (bound on replay)
    ret: Any  # the capture's return value, for its structure
    names: list[str] = field(default_factory=list)
    n_ops: int = 0
    mem: int = 0
    checks: dict[int, list[Callable[[dict[str, int]], None]]] = field(default_factory=dict)  # after call i (-1: first)
    symbolic: bool = False  # whether the capture's inputs or arguments held Variables
    fresh: list[_FreshOutput] = field(default_factory=list)  # the output buffers each call's values stay with
    out_groups: list = field(default_factory=list)  # per output: (parts, axis) if sharded, else None (_regroup)
    # buffers that existed before the capture and that a replay writes in place (weights the function assigns to):
    # before a replay, lazy tensors that read them are computed and views of them moved on (realize.prepare_overwrite)
    state: list[Buffer] = field(default_factory=list)
    # per call, (fn, args): fn(*args) runs it as program(*pointers) does, args prepared once (Program.direct_call);
    # the pointers of inputs and of swapped fresh outputs are written into both lists (set_ptr)
    direct: list[tuple[Callable[..., None], list]] = field(init=False)
    wraps: list[Callable[[Any], Any] | None] = field(init=False)  # per call: what turns a pointer into its argument
    plain: bool = field(init=False)  # no call takes a Variable and no check runs between them: the direct loop
    # the inputs' signatures by position, where the capture's arguments were positional Tensors only (no other
    # argument, no Variable, no state): TinyJit's replay fast path; None otherwise
    fast_sig: list[tuple] | None = field(init=False)
    # per input slot: (the call's pointers, its direct arguments, their wrap, argument position, input position)
    fast_slots: list[tuple[list, list, Callable[[Any], Any] | None, int, Any]] = field(init=False)
    tensor_type: Any = field(init=False)  # the Tensor class (imported at the capture: no import per replay)
    # per input position, (a weak reference to the uop of the last fast replay's argument there, its Buffer), or None
    last_inputs: list[tuple[weakref.ref, Buffer] | None] = field(init=False)
    single_output: bool = field(init=False)  # the function returned one Tensor (not sharded): _wrap is outs[0]
    # the input slots hold the pointers of the Buffers in last_inputs (a fast replay left them there): the next fast
    # replay of the same inputs writes none
    inputs_in_place: bool = field(init=False, default=False)
    # where fast_sig is set, the replay written for this capture (_build_fast_replay): args -> outputs or NOT_FAST
    fast_replay: Callable[[tuple], Any] | None = field(init=False)
    # where no call takes a Variable, the calls in order as steps: (a CallTable of consecutive native calls, -1) or
    # (None, the call index of one called directly); the fast replay makes each table's calls in one foreign call,
    # and so does `run`. A table ends at a call with checks: they run between steps
    steps: list[tuple[CallTable | None, int]] = field(init=False)
    step_ends: list[int] = field(init=False)  # per step, the index of its last call (where its checks are keyed)
    table_of: list[tuple[CallTable, int] | None] = field(init=False)  # per call: (its table, its index there)

    def __post_init__(self):
        self.direct, self.wraps = [], []
        for program, ptrs, var_names in self.calls:
            shortcut = getattr(program, "direct_call", lambda: None)() if not var_names else None
            if shortcut is None:
                self.direct.append((program, ptrs))
                self.wraps.append(None)
            else:
                fn, wrap = shortcut
                self.direct.append((fn, ptrs if wrap is None else [wrap(p) for p in ptrs]))
                self.wraps.append(wrap)
        self.plain = not self.checks and not any(var_names for _, _, var_names in self.calls)
        self.steps, self.step_ends, self.table_of = [], [], [None] * len(self.calls)
        if not any(var_names for _, _, var_names in self.calls):
            self._build_tables()
        keys = list(self.signature)
        positional = keys == [("arg", i) for i in range(len(keys))]
        simple = positional and not self.others and not self.symbolic and not self.state
        self.fast_sig = [self.signature[k] for k in keys] if simple else None
        self.fast_slots = [
            (self.calls[ci][1], self.direct[ci][1], self.wraps[ci], pos, key[1]) for ci, pos, key in self.input_slots
        ]
        from zeptograd.tensor import Tensor

        self.tensor_type = Tensor
        self.last_inputs = [None] * len(self.signature)
        self.single_output = isinstance(self.ret, Tensor) and len(self.outputs) == 1 and not any(self.out_groups)
        self.fast_replay = _build_fast_replay(self) if self.fast_sig is not None else None

    def _build_tables(self):
        """steps and table_of: each run of consecutive calls of native kernels (Program.native) that share a runner
        as one CallTable."""
        run: list[tuple[int, int]] = []  # (call index, kernel address) of the table being gathered
        runner: Any = None

        def flush():
            if run:
                # kernels that touch little memory in all (a few microseconds) run without releasing the GIL
                small = self.mem < call_table.HOLD_GIL_BYTES
                table = CallTable(runner, [(addr, self.calls[ci][1]) for ci, addr in run], small)
                for j, (ci, _) in enumerate(run):
                    self.table_of[ci] = (table, j)
                self.steps.append((table, -1))
                self.step_ends.append(run[-1][0])
                run.clear()

        for ci, (program, _, _) in enumerate(self.calls):
            native = getattr(program, "native", lambda: None)()
            if native is None or native[1] is not runner:
                flush()
            if native is None:
                self.steps.append((None, ci))
                self.step_ends.append(ci)
            else:
                runner = native[1]
                run.append((ci, native[0]))
                if ci in self.checks:  # they run before the calls after it
                    flush()
        flush()

    def set_ptr(self, ci: int, pos: int, ptr: Any):
        """Point argument `pos` of call `ci` at `ptr` (a buffer's handle)."""
        self.calls[ci][1][pos] = ptr
        if (wrap := self.wraps[ci]) is not None:
            self.direct[ci][1][pos] = wrap(ptr)
        if (in_table := self.table_of[ci]) is not None:
            in_table[0].set_ptr(in_table[1], pos, ptr)

    def replay(self, in_bufs: dict[ArgKey, Buffer], var_vals: dict[str, int]):
        for ci, pos, key in self.input_slots:
            self.set_ptr(ci, pos, in_bufs[key].ptr)
        self.run(var_vals)

    def run(self, var_vals: dict[str, int]):
        """The captured kernels, with the input pointers in place."""
        calls = self.calls
        if DEBUG.value >= 2:
            print(f"*** JIT replay: {len(calls)} kernels ({', '.join(self.names)})")
        checks = self.checks
        if checks and -1 in checks:  # those after pruned kernels: their values are the capture's
            for check in checks[-1]:
                check(var_vals)
        if self.steps and DEBUG.value < 2 and not VIZ.value:  # (VIZ times each call: record.jit_replay)
            direct = self.direct
            for (table, ci), end in zip(self.steps, self.step_ends):
                if table is not None:
                    table.run()
                else:
                    fn, args = direct[ci]
                    fn(*args)
                if end in checks:
                    for check in checks[end]:
                        check(var_vals)  # raises (an IndexError) before the kernels after it run
            GlobalCounters.kernel_count += len(calls)
            GlobalCounters.global_ops += self.n_ops
            GlobalCounters.global_mem += self.mem
            return
        if self.plain:
            for fn, args in self.direct:
                fn(*args)
            GlobalCounters.kernel_count += len(calls)
            GlobalCounters.global_ops += self.n_ops
            GlobalCounters.global_mem += self.mem
            return
        for ci, (program, ptrs, var_names) in enumerate(calls):
            if var_names:
                program(*ptrs, vals=tuple(var_vals[v] for v in var_names))
            else:
                program(*ptrs)
            if checks and ci in checks:
                for check in checks[ci]:
                    check(var_vals)  # raises (an IndexError) before the kernels after it run
        GlobalCounters.kernel_count += len(calls)
        GlobalCounters.global_ops += self.n_ops
        GlobalCounters.global_mem += self.mem

    def drop_inputs(self):
        """Forget the input pointers between calls (the inputs' memory may be freed and reused)."""
        self.inputs_in_place = False
        for ci, pos, _ in self.input_slots:
            self.set_ptr(ci, pos, 0)


_all_jits: weakref.WeakSet[TinyJit] = weakref.WeakSet()
_capturing = _realize._capturing
_captures_running = _realize._captures_running


def _unlock_jits_in_child():
    """A forked child has only the forking thread: a TinyJit another thread was calling would stay locked forever.
    (The forking thread's own call, if any, releases the old lock object its `with` holds.)"""
    for jit in list(_all_jits):
        jit._lock = threading.RLock()


os.register_at_fork(after_in_child=_unlock_jits_in_child)


class TinyJit:
    """Decorator: call 1 runs the function, call 2 captures its kernels, calls 3+ replay them (see module doc)."""

    def __init__(self, fxn: Callable, prune: bool = False):
        self.fxn = fxn
        self._lock = threading.RLock()  # one call at a time (a replay patches the captured pointers in place)
        _all_jits.add(self)
        self.prune = prune  # replay only the kernels that depend on the inputs (the others ran once, at the capture)
        self.cnt = 0  # calls so far
        self.captured: CapturedJit | None = None
        functools.update_wrapper(self, fxn)

    def reset(self):
        """Forget the capture: the next call runs the function again (and the one after captures)."""
        self.cnt, self.captured = 0, None

    def __get__(self, obj, objtype=None):  # a jitted method: the instance is a (non-Tensor) argument
        return self if obj is None else functools.partial(self.__call__, obj)

    def __call__(self, *args, **kwargs):
        if not kwargs and (cap := self.captured) is not None and (fast_replay := cap.fast_replay) is not None:
            # a replay of positional Tensor arguments: no argument dicts, no checks of other values. Under the engine
            # lock alone: every other replay of this jit (the only code that patches its pointers) holds it too.
            # (acquire/release, not `with`: no lookup of __enter__ and __exit__ per call)
            lock = _realize.engine_lock
            lock.acquire()
            try:
                if (
                    self.captured is cap
                    and self.cnt >= 2
                    and (not _captures_running or not _capturing.stack)
                    and not VIZ.value
                    and (ret := fast_replay(args)) is not NOT_FAST
                ):
                    self.cnt += 1
                    return ret
            finally:
                lock.release()
        tensors, others = _split_args(args, kwargs)
        with self._lock:
            if self.cnt == 0 or _realize._capturing.stack:
                ret = self._run(args, kwargs, tensors)
                if not _realize._capturing.stack:  # inside another jit's capture: a plain call, not one of this jit's
                    self.cnt = 1
                return ret
            if self.cnt == 1:
                ret = self._capture(args, kwargs, tensors, others)
                self.cnt = 2
                return ret
            self.cnt += 1
            with _realize.engine_lock:  # its kernels run as one realize
                if VIZ.value:
                    return self._viz_replay(tensors, others)
                return self._replay(tensors, others)

    def _viz_replay(self, tensors, others):
        """_replay as one entry of VIZ's timeline (zeptograd/viz/record.py). (Its own method: a lambda in __call__
        would make __call__'s locals closure cells, built on every call.)"""
        from zeptograd.viz import record

        return record.jit_replay(self.captured, lambda: self._replay(tensors, others))

    # --- call 1, and any call while another TinyJit captures in this thread ---
    def _run(self, args, kwargs, tensors):
        """The function run as it is (the capture around it, if any, records its kernels: a nested jit's kernels
        are the outer jit's; a replay of this jit's own capture would run outside the outer one's)."""
        from zeptograd.tensor import Tensor

        _realized_inputs(tensors)
        ret = self.fxn(*args, **kwargs)
        outs = _outputs(ret)
        if outs or tensors:
            Tensor.realize(*outs, *tensors.values())
        return ret

    # --- call 2 ---
    def _capture(self, args, kwargs, tensors, others):
        from zeptograd.tensor import Tensor

        in_bufs = _realized_inputs(tensors)
        rng_before = _rng_snapshot()
        # state (weights) vs outputs allocated by the capture; held to keep ids (a copy of the dict: C code, during
        # which no weakref callback changes it)
        existing = list(_buffers_data.copy().values())
        items = _Capture(list(in_bufs.values()))
        _realize._capturing.append(items)
        try:
            ret = self.fxn(*args, **kwargs)
            outs = _outputs(ret)
            if outs or tensors:  # an assign to an input is realized (and captured) too
                Tensor.realize(*outs, *tensors.values())
            outs, out_groups = _flat_outputs(outs)
        finally:
            _realize._capturing.pop()
        if _rng_snapshot() != rng_before:
            raise JitError(
                "TinyJit: the function draws random numbers (Tensor.rand/randn/...); a replay would repeat "
                "the captured ones. Draw them outside and pass them in as inputs"
            )
        for k, t in tensors.items():
            if _input_buffer(t) is not in_bufs[k]:
                raise JitError(
                    f"TinyJit: input {_name(k)} was given a new buffer by the function (an assign that "
                    f"does not write in place); a replay could not update it"
                )
        slot_of = {id(b): k for k, b in in_bufs.items()}
        var_vals = _var_vals(tensors, others)
        calls, input_slots, held, written, names = [], [], {}, set(), []
        uses: dict[int, list[tuple[int, int]]] = {}  # held buffer -> its (call, position) slots
        n_ops = mem = 0
        kernels = [_realize.get_kernel(item.device, item.ast) for item in items]
        replayed = _replayed(items, kernels, set(slot_of)) if self.prune else [True] * len(items)
        _skip_readers_only(items, replayed, outs)
        call_of: dict[int, int] = {}  # captured item -> its call in the replay; a pruned one: -1 (before the first)
        for item, kernel, replay in zip(items, kernels, replayed):
            if not replay:  # it ran at the capture; its outputs keep its values
                call_of[len(call_of)] = -1
                for o in getattr(item, "outputs", [0]):
                    held[id(item.bufs[o])] = item.bufs[o]
                continue
            ci = call_of[len(call_of)] = len(calls)
            ptrs = []
            for pos, b in enumerate(item.bufs):
                if id(b) in slot_of:
                    input_slots.append((ci, pos, slot_of[id(b)]))
                    ptrs.append(0)
                else:
                    held[id(b)] = b
                    uses.setdefault(id(b), []).append((ci, len(ptrs)))
                    ptrs.append(b.ptr)
            for o in getattr(item, "outputs", [0]):
                if id(item.bufs[o]) not in slot_of:  # ids of held buffers only: they stay unique while held
                    written.add(id(item.bufs[o]))
            missing = [v for v in kernel.vars if v not in var_vals]
            if missing:
                raise JitError(
                    f"TinyJit: kernel {kernel.name} uses Variable(s) {missing}, which no input's shape "
                    f"and no argument carries; pass the bound Variable as an argument"
                )
            calls.append((kernel.program, ptrs, kernel.vars))
            names.append(kernel.name)
            n_ops += kernel.n_ops
            mem += sum(b.nbytes for b in item.bufs)
        out_specs: list[tuple] = []
        existing_ids = {id(b) for b in existing}
        fresh: dict[int, _FreshOutput] = {}
        for t in outs:
            u = _value(t.uop)
            if uniform_const(u) is not None:
                out_specs.append(("const", strip_binds([u])[0][0] if var_vals else u, t.device))
                continue
            base = view_base(u)
            if base is None:
                raise JitError(f"TinyJit: an output realized to {u.op.name}, not a buffer")
            b = buffers[base]
            if id(b) in slot_of:
                out_specs.append(("in", slot_of[id(b)], unbound_shape(t.shape), t.device))
            elif id(b) in fresh or (id(b) in written and id(b) not in existing_ids):  # values stay with the call
                if id(b) not in fresh:
                    fresh[id(b)] = _FreshOutput(b, uses[id(b)], [])
                    held.pop(id(b))
                    written.discard(id(b))
                fresh[id(b)].handed.append(base)
                out_specs.append(("fresh", list(fresh).index(id(b)), unbound_shape(t.shape), t.device))
            else:
                held[id(b)] = b
                out_specs.append(("buf", b, unbound_shape(t.shape), t.device))
        state = [b for i, b in held.items() if i in written and i in existing_ids]
        checks: dict[int, list[Callable[[dict[str, int]], None]]] = {}
        for item_index, check in items.checks:
            checks.setdefault(call_of[item_index], []).append(check)
        self.captured = CapturedJit(
            calls,
            input_slots,
            list(held.values()),
            written,
            {k: (unbound_shape(t.shape), t.dtype, t.device) for k, t in tensors.items()},
            {k: _snapshot(v) for k, v in others.items()},
            out_specs,
            ret,
            names,
            n_ops,
            mem,
            checks,
            bool(var_vals),
            list(fresh.values()),
            out_groups,
            state,
        )
        if DEBUG >= 1:
            pruned = f" ({len(items) - len(calls)} pruned: they do not depend on the inputs)" if self.prune else ""
            print(f"TinyJit: captured {len(calls)} kernels{pruned}")
        return ret

    # --- calls 3+ ---
    def _replay(self, tensors, others):
        cap = self.captured
        assert cap is not None
        self._check(cap, tensors, others)
        var_vals = _var_vals(tensors, others) if cap.symbolic else {}  # (_check: no Variable now if none then)
        in_bufs = _realized_inputs(tensors)
        for out in cap.fresh:
            out.prepare(cap)
        for k, b in in_bufs.items():  # an input aliasing memory the replay writes (a returned tensor) is copied
            if id(b) in cap.written or any(b is out.buf for out in cap.fresh):
                in_bufs[k] = _copy_buffer(b)
        if cap.state:
            _realize.prepare_overwrite(cap.state)
        try:
            cap.replay(in_bufs, var_vals)
        finally:
            cap.drop_inputs()
        from zeptograd.tensor import Tensor

        outs = []
        handed = [out.hand_out() for out in cap.fresh]
        for spec in cap.outputs:
            if spec[0] == "const":
                outs.append(Tensor(rebind(spec[1], var_vals), device=spec[2]))
            elif spec[0] == "in":  # the function returned an input: the caller's tensor, as an eager call would
                outs.append(tensors[spec[1]])
            else:  # a fresh BUFFER uop each call: what was realized from the last call's output is not reused
                shape = rebind_shape(spec[2], var_vals) if cap.symbolic else spec[2]
                if spec[0] == "fresh":
                    outs.append(Tensor(reshape_uop(handed[spec[1]], shape), device=spec[3]))
                else:
                    outs.append(_buffer_tensor(spec[1], shape, spec[3]))
        return _wrap(cap.ret, _regroup(outs, cap.out_groups))

    @staticmethod
    def _check(cap: CapturedJit, tensors: dict, others: dict):
        if tensors.keys() == cap.signature.keys() and others.keys() == cap.others.keys():  # the usual case, quicker
            signature = cap.signature
            for k, t in tensors.items():
                u = t.uop  # without Variables in the capture, a shape holding one differs bound or unbound
                if (u.shape if not cap.symbolic else unbound_shape(u.shape), u.dtype, t.device) != signature[k]:
                    break
            else:
                if all(_same_value(a, cap.others[k]) for k, a in others.items()):
                    return
        for k in cap.signature.keys() | tensors.keys() | cap.others.keys() | others.keys():
            if k in cap.signature and k not in tensors:
                got = type(others[k]).__name__ if k in others else "nothing"
                raise JitError(f"TinyJit: argument {_name(k)} was a Tensor when the function was captured, now {got}")
            if k in tensors and k not in cap.signature:
                raise JitError(f"TinyJit: argument {_name(k)} is a Tensor now but was not one when captured")
            if k in cap.signature:
                t = tensors[k]
                shape, dtype, device = cap.signature[k]
                if (unbound_shape(t.shape), t.dtype, t.device) != (shape, dtype, device):
                    raise JitError(
                        f"TinyJit: input {_name(k)} is {t.shape} {t.dtype} on {t.device}, but was captured "
                        f"as {shape} {dtype} on {device}; use a new TinyJit (or .reset()) for new shapes"
                    )
            elif k not in others or k not in cap.others or not _same_value(others[k], cap.others[k]):
                raise JitError(
                    f"TinyJit: non-Tensor argument {_name(k)} is {others.get(k, 'missing')!r}, but was "
                    f"{cap.others.get(k, 'missing')!r} when captured; the capture depends on it"
                )
