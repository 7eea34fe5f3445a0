"""The hand-coded optimizer for GPUs (renderers with `has_local`): which loops become work-group threads.

- a reduce with few outputs (a full sum, a row sum of few rows: up to 256 threads) or a moderate number (up to
  2048, e.g. a small matmul: 16 threads) and enough inputs -> GROUP: the threads of a work-group share the
  reduce and combine their partials through shared memory. Not a reduce that runs inside another reduce's loop
  (a matmul inside a pooling sum): its shared memory would be written again while slower threads still read it;
- the output axis the stores walk with stride 1 -> LOCAL (up to 32 threads, neighbours take neighbouring
  elements), and a second output axis -> LOCAL up to 8 (a 2-D tile, for matmul-like kernels), within 256
  threads per work-group in all; an elementwise kernel with one output axis takes up to 256 threads on it (32-thread
  groups cap an H100 at half its resident threads: `a + b` on 2^24 floats ran at 0.57 TB/s, torch at 2.4). Not a
  kernel with a reduce: 4096 row sums in groups of 256 ran on 16 of the GPU's 132 multiprocessors (3.4x slower).

Every other output loop becomes a group id (codegen/gpudims.py). No UPCAST: vectors come only from explicit opts.
A row kernel (a reduce hoisted out of the output loop along its row: softmax) takes no action: codegen/gpudims.py
makes each row a work-group (split_rows).
"""

from __future__ import annotations

from zeptograd.codegen.accumulator import range_scopes
from zeptograd.codegen.gpudims import is_row_kernel
from zeptograd.codegen.opt import Opt, OptOps, OptPlan, kernel_axes
from zeptograd.codegen.opt.access import accesses, largest_divisor, stride
from zeptograd.helpers import prod
from zeptograd.renderer import Renderer
from zeptograd.uop.ops import AxisType, Ops, UOp, max_trip_count

GROUP_MAX_OUTPUTS = 2048  # at most this many outputs: a reduce is shared by the threads of a group
GROUP_WIDE_OUTPUTS = 64  # at most this many: up to 256 threads share each reduce, else 16
GROUP_MIN_REDUCE = 64  # at least this many inputs per output
MAX_LOCAL = 256  # threads per work-group the heuristic makes


def gpu_optimizations(ast: UOp, renderer: Renderer) -> tuple[UOp, list[Opt]]:
    plan = OptPlan(ast)
    max_threads = min(MAX_LOCAL, renderer.local_threads_max)
    take = plan.take

    axes = kernel_axes(plan.ast)
    if not axes or any(
        max_trip_count(r) == 0 or r.src[0].op is not Ops.CONST for r in axes
    ):  # LOCAL/GROUP need divisors
        return plan.ast, plan.opts
    if is_row_kernel(plan.ast):  # a row kernel: a work-group per row, its threads along it (gpudims: split_rows)
        return plan.ast, plan.opts
    loops = [r for r in axes if r.arg[1] is AxisType.LOOP]
    reduces = [r for r in axes if r.arg[1] is AxisType.REDUCE]
    n_out = prod(max_trip_count(r) for r in loops)

    threads = 1
    # the ranges of reduces that sit in output loops only (which become thread ids)
    groupable = {
        r for rs, scope in range_scopes(plan.ast).items() if all(s.arg[1] is AxisType.LOOP for s in scope) for r in rs
    }
    reduces_to_group = [r for r in reduces if r in groupable]
    if reduces_to_group and n_out <= GROUP_MAX_OUTPUTS:
        red = max(reduces_to_group, key=lambda r: (max_trip_count(r), r.arg[0]))  # the longest reduce axis
        # few outputs: a whole work-group per output; more: 16 threads per output, and LOCAL outputs below
        amts = (256, 128, 64, 32, 16) if n_out <= GROUP_WIDE_OUTPUTS else (16,)
        amt = largest_divisor(max_trip_count(red), tuple(a for a in amts if a <= max_threads))
        if max_trip_count(red) >= GROUP_MIN_REDUCE and amt >= 16 and take(Opt(OptOps.GROUP, axes.index(red), amt)):
            threads = amt

    stores = [u for u in accesses(plan.ast) if any(v.op is Ops.STORE and v.src[0] is u for v in plan.ast.toposort())]
    # the output axis with stride 1 in the stores first, then the others innermost first
    order = sorted(loops, key=lambda r: (any(stride(u.src[1], r) == 1 for u in stores), r.arg[0]), reverse=True)
    caps = (MAX_LOCAL,) if len(order) == 1 and not reduces else (32, 8)
    for r, cap in zip(order, caps):
        i = next(i for i, a in enumerate(kernel_axes(plan.ast)) if a.arg[0] == r.arg[0] and a.arg[1] is AxisType.LOOP)
        fits = tuple(a for a in (256, 128, 64, 32, 16, 8, 4, 2) if a <= cap and threads * a <= max_threads)
        amt = largest_divisor(max_trip_count(r), fits)
        if amt > 1 and take(Opt(OptOps.LOCAL, i, amt)):
            threads *= amt
    return plan.ast, plan.opts
