"""Codegen: a kernel graph -> an ordered list of UOps a renderer turns into source. The passes, in order."""

from __future__ import annotations

from zeptograd.codegen.accumulator import lower_reduces
from zeptograd.codegen.devectorizer import pm_devectorize
from zeptograd.codegen.expander import expand
from zeptograd.codegen.gated_reduce import end_gated_reduces
from zeptograd.codegen.linearize import linearize
from zeptograd.codegen.lower import lower_index_dtypes, pm_lower
from zeptograd.codegen.opt import Opt, apply_opts
from zeptograd.codegen.opt.align import align_reduced_loads
from zeptograd.codegen.opt.heuristic import hand_coded_optimizations
from zeptograd.codegen.peel import peel_borders
from zeptograd.codegen.simplify import pm_index_given_valid, simplify_ranges
from zeptograd.helpers import NOOPT
from zeptograd.renderer import Renderer
from zeptograd.uop.ops import GroupOp, Ops, UOp
from zeptograd.uop.spec import check_kernel, check_linear
from zeptograd.uop.symbolic import symbolic
from zeptograd.uop.upat import graph_rewrite
from zeptograd.viz.hook import named_pass  # VIZ=1: this pass is a named step of the trace


def ranges_simplified(ast: UOp) -> UOp:
    """The kernel the optimizer's actions apply to (their axis numbers are its loops)."""
    sink = graph_rewrite(ast, symbolic)  # index arithmetic as small as the value ranges allow
    sink = graph_rewrite(sink, pm_index_given_valid)  # and as small as a gated read's gate allows
    return simplify_ranges(sink)  # range rewrites: reduce/load collapse, split, merge, flatten


def actions_kernel(ast: UOp, renderer: Renderer) -> UOp:
    """The kernel the optimizer's actions apply to; on CPUs a reduce's loads on whole vectors (a sliced output's loop
    shifted to their boundary, codegen/opt/align.py)."""
    sink = ranges_simplified(ast)
    return sink if renderer.has_local else align_reduced_loads(sink, renderer.simd_bytes)


@named_pass("optimize", "range rewrites, then the optimizer's actions (given, the heuristic's, or none)", nest=True)
def optimize(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> tuple[UOp, list[Opt]]:
    """Range rewrites, then optimizer actions: given, chosen by the heuristic, or none with NOOPT=1."""
    if opts == [] or (opts is None and NOOPT):  # no vectors: nothing to align
        return ranges_simplified(ast), []
    sink = actions_kernel(ast, renderer)
    if opts is not None:
        return apply_opts(sink, opts), opts
    if renderer.has_local:  # a GPU: work-group threads (codegen/opt/heuristic_gpu.py)
        from zeptograd.codegen.opt.heuristic_gpu import gpu_optimizations  # imported for GPUs only (startup time)

        return gpu_optimizations(sink, renderer)
    return hand_coded_optimizations(
        sink, renderer.simd_bytes, None if renderer.has_threads else 1, renderer.masked_vectors
    )


def full_rewrite(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> tuple[list[UOp], list[Opt]]:
    check_kernel(ast, "rangeify")
    sink, opts = optimize(ast, renderer, opts)
    check_kernel(sink, "the optimizer")
    sink = graph_rewrite(sink, symbolic)  # the split ranges' index arithmetic, simplified again
    sink = end_gated_reduces(sink)  # a reduce gated by a bound on its range (causal attention) ends its loop there
    if not renderer.has_local:  # GPU threads take a pad's border for free; CPU loops don't
        # window reads gated by a pad: border and interior parts, the interior ungated
        sink = peel_borders(sink, renderer.simd_bytes)
    sink = expand(sink, renderer.simd_bytes)  # UPCAST/UNROLL ranges -> vector lanes and unrolled copies
    check_kernel(sink, "expand")
    if renderer.prefetches:
        from zeptograd.codegen.prefetch import prefetch_next_rows  # imported where a renderer takes hints

        sink = prefetch_next_rows(sink)  # a loop re-reading a row from the cache prefetches the next row
    if renderer.has_local:
        from zeptograd.codegen.gpudims import add_gpudims  # imported for GPUs only (startup time)

        sink = add_gpudims(sink, renderer)  # loops -> GPU thread ids, GROUP reduces through shared memory
    if (renderer.alu_transcendentals or renderer.alu_trig) and any(
        u.op in GroupOp.Approximated for u in sink.toposort()
    ):
        from zeptograd.codegen.transcendental import rewrite_transcendentals  # imported when a kernel needs it

        # vector exp2/log2/sin/cos/tan (and scalar sin/cos/tan where alu_trig) -> range reductions and polynomials
        sink = rewrite_transcendentals(sink, renderer)
    sink = lower_reduces(sink)  # REDUCE -> accumulators; reduces over the same loops share them
    sink = graph_rewrite(sink, pm_lower)  # bf16 math (the accumulators' too) in float32, int division made total
    check_kernel(sink, "lower")
    sink = lower_index_dtypes(sink)  # index math in int64 where its value range leaves int32
    sink = graph_rewrite(sink, pm_devectorize, ctx=renderer)  # vector ops the target lacks -> lanes
    check_kernel(sink, "devectorize")
    uops = linearize(sink)  # loops explicit, invariant work hoisted before them
    check_linear(uops)
    # a buffer whose loads were simplified away stays a parameter: the runtime passes every buffer by position
    have = {u.arg for u in uops if u.op is Ops.DEFINE_GLOBAL}
    lost = sorted((u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL and u.arg not in have), key=lambda u: u.arg)
    return lost + uops, opts


def kernel_name(ast: UOp) -> str:
    """E_ for elementwise, r_ for kernels with a reduce; then the loop sizes, outputs' first."""
    nodes = ast.toposort()
    reduce = any(u.op is Ops.REDUCE for u in nodes)
    ends = [u for u in nodes if u.op is Ops.END]
    out_ranges = list(ends[-1].src[1:]) if ends else []
    red_ranges = [r for u in nodes if u.op is Ops.REDUCE for r in u.src[1:]]
    sizes = [str(r.src[0].arg) for r in out_ranges + red_ranges if r.src[0].op is Ops.CONST]
    return ("r_" if reduce else "E_") + ("_".join(sizes) if sizes else "1")
