"""A loop of lazy setitems on one tensor: values equal numpy's doing the same writes, the loop stays one kernel, and
the Python work is linear in the number of setitems (each assign walks what was built since the previous one, never
the whole chain). Work is counted in graph nodes visited, never timed."""

import contextlib

import numpy as np
import pytest

from tests.slow import fast_first
from zeptograd import GlobalCounters, Tensor
from zeptograd.engine.realize import schedule_tensors
from zeptograd.helpers import Context
from zeptograd.uop import upat
from zeptograd.uop.ops import UOp


def _random_program(rng, shape, steps):
    """[(kind, index, value)]: the writes of one random setitem program on a tensor of `shape`."""
    rows, cols = shape
    prog = []
    for _ in range(steps):
        kind = rng.choice(["scalar", "neg", "row", "col", "slice", "step", "read", "iadd", "numpy", "whole"])
        i, j = int(rng.integers(0, rows)), int(rng.integers(0, cols))
        if kind == "scalar":
            prog.append((kind, (i, j), float(rng.integers(-8, 8))))
        elif kind == "neg":
            prog.append((kind, (-1 - i, -1 - j), float(rng.integers(-8, 8)) / 2))
        elif kind == "row":
            prog.append((kind, i, rng.integers(-8, 8, cols).astype(np.float32)))
        elif kind == "col":
            prog.append((kind, (slice(None), -1 - j), rng.integers(-8, 8, rows).astype(np.float32)))
        elif kind == "slice":
            lo = int(rng.integers(0, cols))
            prog.append((kind, (i, slice(lo, None)), float(rng.integers(-8, 8))))
        elif kind == "step":
            idx = (slice(None, None, -2), slice(1, None, 3))
            prog.append((kind, idx, rng.integers(-8, 8, np.zeros(shape)[idx].shape).astype(np.float32)))
        else:
            prog.append((kind, (i, j), None))
    return prog


def _run(prog, shape):
    t = Tensor.zeros(*shape).contiguous().realize()
    ref = np.zeros(shape, np.float32)
    realized = True
    for kind, idx, val in prog:
        if kind == "read":  # reads the target at another element: t[i] = t[i-1] + 1
            i = idx[0]
            t[i] = t[i - 1] + 1
            ref[i] = ref[i - 1] + 1
        elif kind == "iadd" and not realized:  # reads and writes the same element
            t[idx] += 2
            ref[idx] += 2
        elif kind == "iadd":  # `+=` on a view of a realized tensor: test_in_place_op_on_an_element_of_a_realized_tensor
            t[idx] = t[idx] + 2
            ref[idx] += 2
        elif kind == "numpy":  # a read mid-loop realizes the chain so far
            np.testing.assert_array_equal(t.numpy(), ref)
        elif kind == "whole":  # every element, read elsewhere: flipped
            t[...] = t.flip(0) * 0.5
            ref[...] = ref[::-1] * 0.5
        else:
            t[idx] = Tensor(val) if isinstance(val, np.ndarray) else val
            ref[idx] = val
        realized = kind == "numpy"
    return t, ref


@pytest.mark.parametrize("program", fast_first(range(6), 2))
def test_random_setitem_programs_match_numpy(program):
    rng = np.random.default_rng(program)
    prog = _random_program(rng, (5, 7), 40)
    t, ref = _run(prog, (5, 7))
    np.testing.assert_array_equal(t.numpy(), ref)


def test_negative_indices_slices_and_tensor_values_in_one_kernel():
    t = Tensor.zeros(12).contiguous().realize()
    ref = np.zeros(12, np.float32)
    GlobalCounters.reset()
    writes = [(-1, 5.0), (slice(2, 5), Tensor([1.0, 2.0, 3.0])), (slice(None, None, -3), 7.0), (3, Tensor(4.0))]
    writes += [(slice(-4, -1), Tensor([8.0, 9.0, 10.0])), (-12, 6.0)]
    for idx, val in writes:
        t[idx] = val
        ref[idx] = val.numpy() if isinstance(val, Tensor) else val
    t.realize()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_array_equal(t.numpy(), ref)


def test_reads_of_the_target_at_other_elements():
    """t[i] = t[i-1] + 1 reads an element an earlier write in the same kernel would have overwritten: it is copied
    first, so the values are numpy's."""
    n = 9
    t = Tensor.zeros(n).contiguous().realize()
    ref = np.zeros(n, np.float32)
    t[0], ref[0] = 3.0, 3.0
    for i in range(1, n):
        t[i] = t[i - 1] + 1
        ref[i] = ref[i - 1] + 1
        if i == 4:
            np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(t.numpy(), ref)


def test_shifted_copy_after_a_pending_write():
    """t[1:] = t[:-1] after a write not run yet: the shifted read sees the values before this write (it used to read
    elements the one kernel had already overwritten: [1, 1, 1, 1, 1])."""
    t = Tensor.zeros(5).contiguous().realize()
    t[0] = 1
    t[1:] = t[:-1]
    np.testing.assert_array_equal(t.numpy(), [1, 1, 0, 0, 0])


def test_in_place_ops_on_elements_stay_one_kernel():
    t = Tensor.zeros(6, 6).contiguous().realize()
    ref = np.zeros((6, 6), np.float32)
    t[0, 0], ref[0, 0] = 1.0, 1.0
    GlobalCounters.reset()
    for i in range(6):
        t[i, -1 - i] += i
        t[i] *= 2
        ref[i, -1 - i] += i
        ref[i] *= 2
    t.realize()
    assert GlobalCounters.kernel_count == 1
    np.testing.assert_array_equal(t.numpy(), ref)


def test_a_loop_of_scalar_setitems_is_one_kernel_of_bounded_size():
    """n constant writes: runs of 32 are compacted into two buffers (where, what) under one select, so the kernel
    holds one compare and one select per write since the last compaction, and one select of the buffers"""
    n = 100
    t = Tensor.zeros(n).contiguous().realize()
    for i in range(n):
        t[i] = i
    (item,) = schedule_tensors([t])
    alu = [u for u in item.ast.toposort() if u.op.name in ("CMPEQ", "WHERE")]
    assert len(alu) == 2 * (n % 32) + 1  # no pad validity algebra, and not 2 * n
    GlobalCounters.reset()
    np.testing.assert_array_equal(t.numpy(), np.arange(n))
    assert GlobalCounters.kernel_count == 1


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
def test_compacted_runs_of_constant_writes_match_numpy(dtype):
    """Runs of constant writes long enough to be compacted (boxes with steps and negative indices, later writes
    winning), with other writes between them (a row from a tensor, a read of the target, a read mid-loop that
    realizes) and a tensor built on the pending write mid-run: each sees the writes made before it."""
    rng = np.random.default_rng(7)
    shape = (9, 11)
    t = Tensor(np.zeros(shape, dtype)).contiguous().realize()
    ref = np.zeros(shape, dtype)
    snapshots = []
    for step in range(300):
        i, j = int(rng.integers(0, 9)), int(rng.integers(-11, 11))
        if step % 97 == 50:
            t[i] = Tensor(np.arange(11).astype(dtype))
            ref[i] = np.arange(11).astype(dtype)
        elif step % 89 == 40:
            t[i, 0] = t[i, 1] + 1 if dtype != "bool" else t[i, 1]
            ref[i, 0] = ref[i, 1] + 1 if dtype != "bool" else ref[i, 1]
        elif step == 150:
            np.testing.assert_array_equal(t.numpy(), ref)
        elif step in (0, 183, 244):
            snapshots.append((t * 1, ref.copy()))  # built on the pending write, realized at the end
        elif step % 7 == 0:
            t[i : i + 3 : 2, ::-3] = step % 5
            ref[i : i + 3 : 2, ::-3] = step % 5
        else:
            t[i, j] = step % 13
            ref[i, j] = step % 13
    np.testing.assert_array_equal(t.numpy(), ref)
    for snap, want in snapshots:
        np.testing.assert_array_equal(snap.numpy(), want)


@contextlib.contextmanager
def counting_toposort():
    """Counts the nodes every graph walk (UOp.toposort) visits inside the block: yields a one-item list."""
    visited = [0]
    toposort = UOp.toposort

    def counting(self, gate=None, stops=None):
        out = toposort(self, gate, stops)
        visited[0] += len(out)
        return out

    UOp.toposort = counting
    try:
        yield visited
    finally:
        UOp.toposort = toposort


def _setitem_loop_work(n: int) -> tuple[int, int, int]:
    """(nodes the loop's graph walks visit, the graph's size, the scheduler's rewrite steps) for n setitems."""
    t = Tensor.zeros(n).contiguous().realize()
    with counting_toposort() as visited:
        for i in range(n):
            t[i] = i
    steps = upat.rewrite_steps[0]
    with Context(SCHEDULE_CACHE=0):  # the scheduler's own steps, also where an equal loop was scheduled before
        schedule_tensors([t])
    return visited[0], len(t.uop.toposort()), upat.rewrite_steps[0] - steps


def test_setitem_loop_work_is_linear():
    """Doubling the setitems doubles the work: each assign walks the nodes built since the previous one (the walks
    stop at nodes already seen), not the whole chain (which made a loop of N setitems O(N^2))."""
    # a walk of the whole chain per setitem would make the counts 4x at double the setitems already at 100
    small, big = _setitem_loop_work(100), _setitem_loop_work(200)
    for what, a, b in zip(("nodes walked in the loop", "graph nodes", "schedule rewrite steps"), small, big):
        assert b <= 2.2 * a, f"{what}: {a} for 100 setitems, {b} for 200"
    assert small[0] <= 60 * 100, f"{small[0]} nodes walked for 100 setitems: more than what each one builds"


def test_a_setitem_loop_schedules_a_graph_of_bounded_size():
    """The runs of constant writes are compacted, so the graph the scheduler and codegen walk does not grow with the
    loop: 320 and 640 writes (10 and 20 compacted runs, none left over) leave graphs of one size and schedule in
    the same number of rewrite steps, while the loop's own walking stays linear."""
    small, big = _setitem_loop_work(320), _setitem_loop_work(640)
    assert big[0] <= 2.2 * small[0], f"nodes walked in the loop: {small[0]} for 320 setitems, {big[0]} for 640"
    assert big[1] == small[1] and big[1] < 30, f"graph nodes: {small[1]} for 320 setitems, {big[1]} for 640"
    assert big[2] == small[2], f"schedule rewrite steps: {small[2]} for 320 setitems, {big[2]} for 640"


def test_in_place_op_on_an_element_of_a_realized_tensor():
    """t[3, 5] += 2 assigns into the view t[3, 5]: a kernel reading that ASSIGN loads through the view's offset
    (schedule/kernel.py: target_index; it loaded element 0)."""
    t = Tensor.arange(35).reshape(5, 7).float().contiguous().realize()
    t[3, 5] += 2
    ref = np.arange(35, dtype=np.float32).reshape(5, 7)
    ref[3, 5] += 2
    np.testing.assert_array_equal(t.numpy(), ref)


def test_setitems_after_another_tensor_realized_the_pending_write():
    """u = t * 2 realized runs t's pending write too: the setitems after it build on the realized buffer (the walks'
    marks are dropped when anything is realized)."""
    t = Tensor.zeros(6).contiguous().realize()
    ref = np.zeros(6, np.float32)
    t[1], ref[1] = 4.0, 4.0
    u = t * 2
    np.testing.assert_array_equal(u.numpy(), ref * 2)
    t[2] += 3
    t[1] *= 5
    ref[2] += 3
    ref[1] *= 5
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(u.numpy(), [0, 8, 0, 0, 0, 0])


def _built_by_one_setitem(t, idx, value) -> tuple[int, int, int]:
    """(graph nodes t gains, UOp constructor calls, Tensors made) by t[idx] = value"""
    from zeptograd.tensor import live
    from zeptograd.uop import ops

    calls = [0]
    construct = ops.UOpMeta.__call__

    def counting_construct(cls, *args, **kwargs):
        calls[0] += 1
        return construct(cls, *args, **kwargs)

    nodes, first_id = len(t.uop.toposort()), next(live._tensor_ids)
    ops.UOpMeta.__call__ = counting_construct
    try:
        t[idx] = value
    finally:
        ops.UOpMeta.__call__ = construct
    return len(t.uop.toposort()) - nodes, calls[0], next(live._tensor_ids) - first_id - 1


def test_a_scalar_setitem_builds_eight_nodes_and_no_tensor_ops():
    """t[i] = c on a pending write adds the constants c and i broadcast (3 nodes each), the position compare, the
    select and the ASSIGN that replaces the previous one: 8 nodes, built as UOps folded into the pending write. No
    Tensor is made and no Tensor op runs (their checks and broadcasts cost more than the nodes); the 13 constructions
    are the 8 nodes and the device and position nodes looked up."""
    t = Tensor.zeros(50).contiguous().realize()
    t[0] = -1.0
    for i in range(1, 6):
        nodes, constructed, tensors = _built_by_one_setitem(t, i, 100.0 + i)
        assert (nodes, tensors) == (8, 0), f"setitem {i}: {nodes} nodes, {tensors} tensors"
        assert constructed <= 13, f"setitem {i}: {constructed} UOps constructed for 8 new nodes"
    u = Tensor.zeros(5, 7).contiguous().realize()
    u[0, 0] = -1.0
    assert _built_by_one_setitem(u, (2, -3), 9.0)[0] == 13  # two compares and their AND: 5 more
    assert _built_by_one_setitem(u, 2, 9.0)[0] == 1  # row 2's compare and the 9 exist: the select and the ASSIGN


SETS = [  # (index, value): every form of basic index, values broadcast over the selection
    (2, 5.0),
    (-1, Tensor.arange(6).float()),
    ((1, -2), 7),
    ((slice(1, 3),), 2.5),
    ((slice(None, None, 2), 1), -3.0),
    ((slice(-3, None), slice(1, 5, 3)), Tensor([[1.0, 2.0]])),
    ((Ellipsis, 4), Tensor([1.0, 2.0, 3.0, 4.0, 5.0])),
    ((None, 3, slice(2, None)), 8),
    ((slice(4, 0, -2), slice(None, None, -1)), Tensor(np.arange(12, dtype=np.float32).reshape(2, 6))),
    ((0, slice(2, 2)), 1.0),  # selects nothing
    ((Tensor([0, 3]),), 4.0),  # tensor indices: the one-hot path, in the same chain
]


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool", "float16"])
def test_a_chain_of_every_index_form_matches_torch(dtype):
    """One chain of lazy writes of every basic index form (and a tensor index) into a (5, 6) tensor of each dtype,
    values cast to it as torch casts them: the values equal torch's."""
    import torch

    tt = torch.zeros(5, 6, dtype=getattr(torch, dtype))
    zt = Tensor(tt.numpy()).contiguous().realize()

    for idx, value in SETS:
        zt[idx] = value
        tv = torch.from_numpy(value.numpy()) if isinstance(value, Tensor) else value
        items = idx if isinstance(idx, tuple) else (idx,)
        if any(isinstance(i, slice) and (i.step or 1) < 0 for i in items):  # torch has no negative steps: numpy
            tt.numpy()[idx] = tv.numpy() if isinstance(tv, torch.Tensor) else tv  # writes through tt's memory
        else:
            tt[tuple(torch.from_numpy(i.numpy()) if isinstance(i, Tensor) else i for i in items)] = tv
    np.testing.assert_array_equal(zt.numpy(), tt.numpy())


@pytest.mark.parametrize("pending", [False, True], ids=["realized", "pending_write"])
def test_errors_at_the_call_on_a_pending_write_as_on_a_realized_tensor(pending):
    """The folded path of `t[i] = c` checks what the general one does, with torch's exception types."""
    t = Tensor.zeros(4).contiguous().realize()
    if pending:
        t[3] = 1.0
    with pytest.raises(IndexError, match="index 10 is out of bounds for dimension 0 with size 4"):
        t[10] = 1
    with pytest.raises(IndexError, match="too many indices"):
        t[0, 0] = 1.0
    with pytest.raises(TypeError, match="can't make a Tensor from str"):
        t[0] = "a"
    with pytest.raises(TypeError, match="indexing with a Python bool"):
        t[True] = 0
    with pytest.raises(ValueError, match="tensors on different devices: CPU and PYTHON"):
        t[0] = Tensor(2.0, device="PYTHON")
    np.testing.assert_array_equal(t.numpy(), [0, 0, 0, 1 if pending else 0])


def _mixed_loop_walked(n: int) -> int:
    """Nodes the graph walks visit in a loop of n steps, each a constant write (folded without a walk, its nodes left
    unmarked) then a write that reads the target (assign's walks, which meet the unmarked nodes)."""
    t = Tensor.zeros(n + 1).contiguous().realize()
    with counting_toposort() as visited:
        for i in range(n):
            t[i + 1] = i
            t[i] += 1
    ref = np.arange(-1, n, dtype=np.float32)
    ref[:n] += 1
    ref[0] = 1
    np.testing.assert_array_equal(t.numpy(), ref)
    return visited[0]


def test_constant_writes_between_assigns_keep_the_loop_linear():
    """The nodes a constant write leaves unmarked are walked once, by the next assign: doubling the steps doubles
    the walking (each assign walking back to the start would make it 4x)."""
    small, big = _mixed_loop_walked(100), _mixed_loop_walked(200)
    assert big <= 2.2 * small, f"nodes walked: {small} for 100 steps, {big} for 200"
    assert small <= 150 * 100, f"{small} nodes walked for 100 steps: more than each step builds"
