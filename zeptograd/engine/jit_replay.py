"""The written replay of a TinyJit capture whose arguments are all positional Tensors: one straight-line function
generated and compiled per capture (_build_fast_replay), with the helpers it calls (engine/jit.py)."""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable

from zeptograd.buffers import buffers, reshape_uop
from zeptograd.device import Buffer, GlobalCounters
from zeptograd.engine.jit_args import _buffer_tensor, _copy_buffer, _regroup, _whole_buffer, _wrap
from zeptograd.engine.schedule_cache import _own_dict
from zeptograd.helpers import DEBUG
from zeptograd.tensor.live import (
    _grad_data,
    _live_remove,
    _LiveRef,
    _tensor_ids,
    live_tensors,
)
from zeptograd.tensor.tensor import _tensor_new, _tensor_of
from zeptograd.uop.ops import Ops, UOp
from zeptograd.uop.variable import rebind

if TYPE_CHECKING:
    from zeptograd.engine.jit import CapturedJit


def _input_of(cap: CapturedJit, i: int, t: Any, u: UOp) -> Buffer | None:
    """The Buffer of fast-replay input `i` that is not the last call's one (its signature checked), else None; it is
    remembered in cap.last_inputs where it is a BUFFER node (whose Buffer never changes)."""
    assert cap.fast_sig is not None
    shape, dtype, device = cap.fast_sig[i]
    if u.shape != shape or u.dtype is not dtype or t.device != device:
        return None
    if u.op is Ops.BUFFER:
        if (b := _buffers_data.get(weakref.ref(u))) is None:
            return None
        cap.last_inputs[i] = (weakref.ref(u), b)
        return b
    cap.last_inputs[i] = None  # (its pointer is not the one last_inputs names)
    return _whole_buffer(u)


def _copy_aliased(cap: CapturedJit, bufs: list[Buffer]) -> bool:
    """Replace each input Buffer aliasing memory the replay writes (a returned tensor passed back in) by a copy;
    whether any was."""
    copied = False
    for i, b in enumerate(bufs):
        if id(b) in cap.written or any(out.buf is b for out in cap.fresh):
            bufs[i] = _copy_buffer(b)
            copied = True
    return copied


def _fast_outputs(cap: CapturedJit, args: tuple) -> Any:
    """The outputs of a fast replay, in the structure the function returned them (the general case)."""
    outs = []
    handed = [out.hand_out() for out in cap.fresh]
    for spec in cap.outputs:
        if spec[0] == "fresh":
            u = handed[spec[1]]
            outs.append(_tensor_of(u if u.shape == spec[2] else reshape_uop(u, spec[2]), spec[3]))
        elif spec[0] == "buf":
            outs.append(_buffer_tensor(spec[1], spec[2], spec[3]))
        elif spec[0] == "in":
            outs.append(args[spec[1][1]])
        else:
            outs.append(cap.tensor_type(rebind(spec[1], {}), device=spec[2]))
    if cap.single_output:
        return outs[0]
    return _wrap(cap.ret, _regroup(outs, cap.out_groups) if cap.out_groups and any(cap.out_groups) else outs)


def _build_fast_replay(cap: CapturedJit) -> Callable[[tuple], Any]:
    """The replay of a capture of positional Tensor arguments (cap.fast_sig) as one straight-line function, written
    for this capture and compiled once: the input checks unrolled, the kernels' prepared direct calls (Program.
    direct_call) one line each, the output Tensor made inline. It returns NOT_FAST where an argument is not a
    realized Tensor of the captured signature or one buffer is passed twice (the general path then raises, or
    realizes the lazy input). Every bytecode here runs per replay, so the generated code is what the loops of a
    generic replay would do for this capture, with the constant tests decided at the build."""
    assert cap.fast_sig is not None
    n = len(cap.fast_sig)
    env: dict[str, Any] = {
        "cap": cap, "Tensor": cap.tensor_type, "NOT_FAST": NOT_FAST, "seen": cap.last_inputs, "input_of": _input_of,
        "refcount": sys.getrefcount, "copy_aliased": _copy_aliased, "DEBUG": DEBUG, "NO_VALUES": _NO_VALUES,
        "counters": GlobalCounters, "fast_outputs": _fast_outputs, "reshape_uop": reshape_uop,
        "tensor_new": _tensor_new, "LiveRef": _LiveRef, "live_remove": _live_remove, "tensor_ids": _tensor_ids,
        "live_tensors": live_tensors, "grad_data": _grad_data, "weak_ref": weakref.ref,
    }  # fmt: skip
    names = [f"b{i}" for i in range(n)]
    lines = ["def replay(args):", f"    if len(args) != {n}:", "        return NOT_FAST"]
    if n:
        lines.append(f"    {', '.join(f't{i}' for i in range(n))}, = args")
        lines.append(f"    if {' or '.join(f'type(t{i}) is not Tensor' for i in range(n))}:")
        lines.append("        return NOT_FAST")
    # every input is the one whose pointer the last replay left in its slots (cap.inputs_in_place): none to write
    lines.append("    same = cap.inputs_in_place")
    for i in range(n):  # the input of the last call: its Buffer (a weak map's lookup compares UOps: slow)
        lines += [
            f"    u = t{i}.uop",
            f"    last = seen[{i}]",
            "    if last is not None and last[0]() is u:",
            f"        b{i} = last[1]",
            "    else:",
            "        same = False",
            f"        b{i} = input_of(cap, {i}, t{i}, u)",
            f"        if b{i} is None:",
            "            return NOT_FAST",
        ]
    pairs = [f"{names[i]} is {names[j]}" for i in range(n) for j in range(i + 1, n)]
    if 0 < len(pairs) <= 6:
        lines += [f"    if {' or '.join(pairs)}:", "        return NOT_FAST"]
    elif pairs:
        lines += [f"    if len({{{', '.join(f'id({b})' for b in names)}}}) < {n}:", "        return NOT_FAST"]
    for k, out in enumerate(cap.fresh):  # prepare's check: the last call's one uop, referred to by the list alone
        env[f"fresh{k}"] = out
        lines += [
            f"    handed = fresh{k}.handed",
            "    if len(handed) != 1 or refcount(handed[0]) > 2:",
            # the last call's values are referred to, the spare's not (`out = step(x)` in a loop): prepare's swap
            f"        spare_handed = fresh{k}.spare_handed",
            "        if len(handed) == 1 and len(spare_handed) == 1 and refcount(spare_handed[0]) <= 2:",
            f"            buf = fresh{k}.spare",
            f"            fresh{k}.buf, fresh{k}.spare = buf, fresh{k}.buf",
            f"            fresh{k}.handed, fresh{k}.spare_handed = spare_handed, handed",
            "            p = buf._ptr",
            "            if p is None:",
            "                p = buf.ptr",
        ]
        for j, (ci, pos) in enumerate(out.slots):  # (set_ptr, inline)
            env[f"OP{k}_{j}"], env[f"OA{k}_{j}"], env[f"OW{k}_{j}"] = cap.calls[ci][1], cap.direct[ci][1], cap.wraps[ci]
            lines.append(f"            OP{k}_{j}[{pos}] = p")
            if cap.wraps[ci] is not None:
                lines.append(f"            OA{k}_{j}[{pos}] = OW{k}_{j}(p)")
            elif cap.direct[ci][1] is not cap.calls[ci][1]:
                lines.append(f"            OA{k}_{j}[{pos}] = p")
            if (in_table := cap.table_of[ci]) is not None:
                env[f"OT{k}_{j}"] = in_table[0].array
                lines.append(f"            OT{k}_{j}[{in_table[0].at[in_table[1]] + pos}] = p")
        lines += ["        else:", f"            fresh{k}.prepare(cap)"]
    # an input aliasing memory the replay writes (a returned tensor passed back in) is copied
    copy = [f"        bufs = [{', '.join(names)}]", "        copied = copy_aliased(cap, bufs)"]
    copy.append(f"        {', '.join(names)}, = bufs" if n else "        pass")
    # (copy_aliased's test, inline: a set lookup per input in `written`, an identity test per fresh output)
    env["written"] = cap.written
    aliased = [f"{b} is fresh{k}.buf" for b in names for k in range(len(cap.fresh))]
    aliased += [f"id({b}) in written" for b in names] if cap.written else []
    lines.append("    copied = False")
    if len(aliased) > 12:
        lines += ["    if True:", *copy]
    elif aliased:
        lines += [f"    if {' or '.join(aliased)}:", *copy]
    lines.append("    if not same or copied:")
    by_input: dict[int, list[int]] = {}
    for k, (ptrs, args_, wrap, pos, i) in enumerate(cap.fast_slots):
        by_input.setdefault(i, []).append(k)
        env[f"P{k}"], env[f"A{k}"], env[f"W{k}"] = ptrs, args_, wrap
    for i, slots in by_input.items():
        lines += [f"        p = b{i}._ptr", "        if p is None:", f"            p = b{i}.ptr"]
        for k in slots:
            ptrs, args_, wrap, pos, _ = cap.fast_slots[k]
            lines.append(f"        P{k}[{pos}] = p")
            if wrap is not None:
                lines.append(f"        A{k}[{pos}] = W{k}(p)")
            elif args_ is not ptrs:
                lines.append(f"        A{k}[{pos}] = p")
            if (in_table := cap.table_of[cap.input_slots[k][0]]) is not None:
                env[f"T{k}"] = in_table[0].array
                lines.append(f"        T{k}[{in_table[0].at[in_table[1]] + pos}] = p")
    lines.append("        pass")
    # the pointers stay in the slots after the call (no kernel runs on them before a replay writes them again or,
    # where every input is the same, finds them in place): the inputs' Buffers are held by `seen` meanwhile
    lines.append("    cap.inputs_in_place = False")
    if cap.plain:
        lines.append("    if DEBUG.value < 2:")
        for c, (table, ci) in enumerate(cap.steps):
            if table is not None:  # its calls in one foreign call
                env[f"R{c}"], env[f"RT{c}"] = table.runner, table.array
                lines.append(f"        R{c}(RT{c})")
            else:
                env[f"F{c}"], env[f"FA{c}"] = cap.direct[ci]
                lines.append(f"        F{c}(*FA{c})")
        lines += [
            f"        counters.kernel_count += {len(cap.calls)}",
            f"        counters.global_ops += {cap.n_ops}",
            f"        counters.global_mem += {cap.mem}",
            "    else:",
            "        cap.run(NO_VALUES)",
        ]
    else:
        lines.append("    cap.run(NO_VALUES)")
    in_place = " and ".join(["not copied", *(f"seen[{i}] is not None" for i in range(n))])
    lines.append(f"    cap.inputs_in_place = {in_place}")
    spec = cap.outputs[0] if cap.outputs else None
    if cap.single_output and spec is not None and spec[0] == "fresh":  # the common case: one fresh output
        k = spec[1]
        env["out_shape"], env["out_device"] = spec[2], spec[3]
        lines += [
            f"    handed = fresh{k}.handed",
            # (hand_out, inline where the last call's uop is handed out again)
            "    if len(handed) == 1 and (not grad_data or weak_ref(handed[0]) not in grad_data):",
            "        u = handed[0]",
            "    else:",
            f"        u = fresh{k}.hand_out()",
            *(["    u = reshape_uop(u, out_shape)"] if (cap.fresh[k].buf.size,) != tuple(spec[2]) else []),
            # (tensor.py's _tensor_of, inline)
            "    t = tensor_new(Tensor)",
            "    t.uop, t.device, t.requires_grad, t.grad = u, out_device, None, None",
            "    ref = LiveRef(t, live_remove)",
            "    ref.key = next(tensor_ids)",
            "    live_tensors[ref] = None",
            "    return t",
        ]
    else:
        lines.append("    return fast_outputs(cap, args)")
    exec(compile("\n".join(lines) + "\n", f"<TinyJit replay of {', '.join(cap.names) or 'nothing'}>", "exec"), env)
    return env["replay"]


NOT_FAST = object()  # CapturedJit.fast_replay: the general path must take this call
_NO_VALUES: dict[str, int] = {}  # the Variable values of a replay that takes none (never written)
_buffers_data = _own_dict(buffers)  # buffers' own dict of weak references: a lookup without a Python frame
