"""BEAM=n: search the optimizer actions of a kernel by timing candidates on the device.

Each round extends every kernel in the beam by one more action (UPCAST, UNROLL, THREAD, SWAP), renders and
compiles the new candidates in a process pool, runs each on the kernel's real inputs (the output goes to a
scratch buffer), drops any whose output differs from the unoptimized kernel's, and keeps the n fastest. The
search stops when a round finds nothing faster or the per-kernel budget (BEAM_BUDGET seconds) is spent. The
choice is cached on disk, keyed by the kernel graph and the target (`_target`), so a second run pays nothing.
With VIZ=1 every candidate (its actions, round, time or why it was dropped) goes to the kernel's trace entry
(viz/record.py).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import functools
import hashlib
import json
import multiprocessing
import os
import pathlib
import time

import numpy as np

from zeptograd.codegen import actions_kernel, full_rewrite, kernel_name, optimize
from zeptograd.codegen.gated_reduce import ends_along
from zeptograd.codegen.opt import Opt, OptError, OptOps, apply_opts, kernel_axes
from zeptograd.device import Buffer, Device, Program
from zeptograd.helpers import BEAM_BUDGET, THREADS, VIZ, ArgumentError, cache_dir, prod
from zeptograd.renderer import ProgramSpec
from zeptograd.runtime import diskcache
from zeptograd.uop.ops import AxisType, Ops, UOp, pretty

MAX_EXPANDED = 256  # the most vector lanes x unrolled copies a candidate may have
AMOUNTS = (2, 3, 4, 5, 7, 8, 16)

_pool: concurrent.futures.ProcessPoolExecutor | None = None


def _get_pool() -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ProcessPoolExecutor(
            max(1, THREADS.value), mp_context=multiprocessing.get_context("fork")
        )
        atexit.register(_pool.shutdown, wait=True)
    return _pool


def _render(device: str, ast: UOp, opts: list[Opt]) -> ProgramSpec | None:
    """In a worker: codegen with these actions, render, and compile to the on-disk cache (C); None if invalid."""
    dev = Device[device]
    try:
        uops, _ = full_rewrite(ast, dev.renderer, opts)
        spec = dev.renderer.render(kernel_name(ast), uops)
        if dev.compiler.disk_cached:  # the parent's build finds it there
            dev.compiler.compile_to_file(spec.src)
        return spec
    except (OptError, RuntimeError):
        return None


def actions(ast: UOp, threads: int) -> list[Opt]:
    axes = kernel_axes(ast)
    out: list[Opt] = []
    threaded = any(u.op is Ops.SPECIAL for u in ast.toposort())
    for i, r in enumerate(axes):
        n = r.src[0].arg if r.src[0].op is Ops.CONST else 0
        loop = r.arg[1] is AxisType.LOOP
        out += [Opt(OptOps.UPCAST if loop else OptOps.UNROLL, i, a) for a in AMOUNTS if n % a == 0 and a <= n]
        if loop and not threaded and threads > 1 and n % threads == 0:
            out.append(Opt(OptOps.THREAD, i, threads))
            if ends_along(ast, r):  # its iterations grow in work along it: every threads-th one per core
                out.append(Opt(OptOps.THREAD_INTERLEAVED, i, threads))
        out += [Opt(OptOps.SWAP, i, j) for j in range(i + 1, len(axes)) if axes[j].arg[1] is r.arg[1] and loop]
        out += [Opt(OptOps.TILE, i, a) for a in (16, 64, 128) if loop and n % a == 0 and a < n]  # cache blocks
    return out


def _expanded(ast: UOp) -> int:
    return prod(
        u.src[0].arg for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] in (AxisType.UPCAST, AxisType.UNROLL)
    )


@functools.cache
def codegen_fingerprint() -> str:
    """A hash of the code generator's sources: the actions of a choice are applied by codegen's passes, so a choice
    made by another version of them (a pass added before the actions, an action's meaning changed) may not be the
    kernel it was timed as. Read once per process, and only when BEAM looks up a choice."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted((root / "codegen").rglob("*.py")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _target(device: str) -> str:
    """What a BEAM choice depends on besides the kernel: the backend, its compiler (name, version, flags; for LLVM
    the host CPU and its features), the renderer's vector width and the code generator's version. Not the device's
    index: CPU:0 and CPU:1 share a choice, while the same cache directory on a host with other vector registers
    searches again."""
    dev = Device[device]
    return f"{type(dev).__name__}\0{dev.compiler.key}\0{dev.renderer.simd_bytes}\0{codegen_fingerprint()}"


def _cache_name(device: str, ast: UOp, width: int) -> str:
    key = hashlib.sha256(f"{_target(device)}\0{width}\0{pretty(ast, max_nodes=1 << 30)}".encode()).hexdigest()[:32]
    return f"{key}.json"


def cache_path(device: str, ast: UOp, width: int) -> str:
    return os.path.join(cache_dir(), "beam", _cache_name(device, ast, width))


def _cached_choice(device: str, ast: UOp, width: int) -> list[Opt] | None:
    """The choice cached on disk, if there is one that applies to this kernel; a bad one is removed (with a warning
    naming its file) and searched again."""
    name = _cache_name(device, ast, width)
    text = diskcache.read_text("beam", name)
    if text is None:
        return None
    try:
        entries = json.loads(text)
        if not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[1], int) and isinstance(e[2], int) for e in entries
        ):
            raise ValueError("not a list of [action, axis, amount]")
        opts = [Opt(OptOps[o], a, n) for o, a, n in entries]
        apply_opts(actions_kernel(ast, Device[device].renderer), opts)
    except (ValueError, KeyError, TypeError, IndexError, OptError) as e:  # JSONDecodeError is a ValueError
        diskcache.remove_text(
            "beam", name, f"{text[:60]!r} is not a valid BEAM choice ({type(e).__name__}: {e}); searching again"
        )
        return None
    return opts


def _time(program: Program, bufs: list[Buffer], out_init: np.ndarray, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        bufs[0].copyin(out_init)
        t0 = time.perf_counter()
        program(*[b.ptr for b in bufs])
        best = min(best, time.perf_counter() - t0)
    return best


def beam_search(device: str, ast: UOp, bufs: list[Buffer], width: int) -> list[Opt]:
    dev = Device[device]
    if not dev.beam_timing:  # realize asks only devices that time kernels
        raise ArgumentError(f"BEAM times kernels, and {device}'s times mean nothing (its beam_timing is False)")
    cached = _cached_choice(device, ast, width)
    if cached is not None:
        if VIZ.value:  # the choice, and that nothing was timed (zeptograd/viz/record.py, imported only with VIZ)
            from zeptograd.viz import record as viz_record

            viz_record.beam_searched(device, ast, width, None, [], cached)
        return cached
    from tqdm import tqdm

    scratch = [Buffer(device, bufs[0].size, bufs[0].dtype).ensure_allocated()] + list(bufs[1:])
    out_init = bufs[0].ensure_allocated().numpy()
    for b in bufs:
        b.ensure_allocated()
    ref_spec = _render(device, ast, [])
    if ref_spec is None:
        return []
    _time(dev.build(ref_spec), scratch, out_init, runs=1)
    reference = scratch[0].numpy()
    threads = THREADS.value if dev.renderer.has_threads else 1
    start = time.perf_counter()
    tried: list[tuple] | None = [] if VIZ.value else None  # VIZ=1: (round, actions, seconds, why dropped) each

    def evaluate(cands: list[list[Opt]], bar) -> list[tuple[float, list[Opt]]]:
        specs = _get_pool().map(_render, [device] * len(cands), [ast] * len(cands), cands)
        out = []
        for opts, spec in zip(cands, specs):
            bar.update(1)
            if spec is None or time.perf_counter() - start > BEAM_BUDGET.value:
                if tried is not None:
                    tried.append((rounds, opts, None, "invalid" if spec is None else "over BEAM_BUDGET"))
                continue
            t = _time(dev.build(spec), scratch, out_init)
            if np.allclose(scratch[0].numpy(), reference, rtol=1e-3, atol=1e-3, equal_nan=True):
                out.append((t, opts))
            if tried is not None:
                tried.append((rounds, opts, t, "" if out and out[-1][1] is opts else "wrong output"))
        return out

    heuristic = optimize(ast, dev.renderer)[1]
    rounds = 0  # round 0 times the unoptimized kernel and the heuristic's actions: the baselines
    with tqdm(desc=f"BEAM {kernel_name(ast)}", unit="kernel", leave=False) as bar:
        bar.total = 2
        beam = sorted(evaluate([[], heuristic], bar), key=lambda x: x[0])[:width]
        simplified = actions_kernel(ast, dev.renderer)  # what the actions apply to (optimize's kernel): its loops
        seen = {apply_opts(simplified, opts) for _, opts in beam}
        while time.perf_counter() - start < BEAM_BUDGET.value:
            cands = []
            for _, opts in beam:
                base = apply_opts(simplified, opts)
                for a in actions(base, threads):
                    try:
                        new = apply_opts(base, [a])
                    except OptError:
                        continue
                    if new not in seen and _expanded(new) <= MAX_EXPANDED:
                        seen.add(new)
                        cands.append(opts + [a])
            if not cands:
                break
            rounds += 1
            bar.total += len(cands)
            new_beam = sorted(beam + evaluate(cands, bar), key=lambda x: x[0])[:width]
            if not beam or new_beam[0][0] >= beam[0][0] * 0.98:  # nothing faster this round
                beam = new_beam
                break
            beam = new_beam
    best = beam[0][1] if beam else []
    choice = json.dumps([[o.op.name, o.axis, o.arg] for o in best])
    diskcache.write_text("beam", _cache_name(device, ast, width), choice)
    if tried is not None:
        from zeptograd.viz import record as viz_record

        viz_record.beam_searched(device, ast, width, tried, heuristic, best)
    return best
