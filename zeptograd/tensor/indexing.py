"""Indexing. Basic indices (ints, slices with any step, None, Ellipsis) are movement ops; tensor indices select by a
one-hot mask and a sum; __setitem__ writes through a mask with `where`, so it stays lazy and elementwise.

A bound Variable (uop/variable.py), or an index expression of bound Variables, may stand for an int index or a
slice's start/stop (`x[v]`, `x[:v]`, `x[v:v+2]`, step 1): a symbolic shrink, so one kernel serves every value. It is
never wrapped or clamped (a value outside [0, size] is an IndexError at its bound value; under TinyJit's capture,
the shrink checks every value of the Variable's range).

An out-of-range tensor index would select nothing (a silent 0), so the values of every index tensor a user passes
(t[idx], t[idx] = v, gather, scatter, nn.Embedding) are checked at the call: `check_index_bounds`. Class labels
(cross_entropy, nll_loss, sparse_categorical_crossentropy, one_hot in tensor/nn_ops.py) are checked the same way, with
torch's messages and ignore_index allowed: `check_label_bounds`, `check_one_hot_bounds`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import numpy as np

from zeptograd.dtype import dtypes, to_numpy_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.schedule.fold import const_broadcast, uniform_const
from zeptograd.tensor.helpers import broadcast_shape, iota_uop, normalize_axis
from zeptograd.uop import variable
from zeptograd.uop.ops import GroupOp, Ops, UOp

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


class _DimSel(NamedTuple):
    """What a basic index does to one input dim: keep [lo, hi), flip it, take every `step`-th (n in all). (A
    NamedTuple: built in one call, for each dim of each index.)"""

    lo: int | UOp  # symbolic (an expression of bound Variables) for a Variable index or slice bound
    hi: int | UOp
    flip: bool
    step: int
    n: int | UOp
    drop: bool  # an int index: the dim disappears


def _is_sym(x) -> bool:
    """a bound Variable or an index expression of them, used as an index"""
    return isinstance(x, UOp) and variable.is_sint(x)


def _sym_slice(it: slice, size, dim: int) -> _DimSel:
    """a slice with a symbolic start or stop (step 1): [start, stop), never clamped or wrapped"""
    if it.step not in (None, 1):
        raise IndexError(f"a slice with a symbolic bound or of a symbolic dimension takes step 1, got {it.step!r}")
    lo: int | UOp = 0 if it.start is None else it.start
    hi: int | UOp = size if it.stop is None else it.stop
    lo, hi = (variable.sint_simplify(size + b if isinstance(b, int) and b < 0 else b) for b in (lo, hi))
    lo_v, hi_v, size_v = (variable.sint_value(b) for b in (lo, hi, size))
    if not 0 <= lo_v <= hi_v <= size_v:
        raise IndexError(
            f"slice [{_show(lo)}:{_show(hi)}] with symbolic bounds is out of bounds for dimension {dim} "
            f"with size {_show(size)} (it is neither clamped nor wrapped)"
        )
    return _DimSel(lo, hi, False, 1, variable.sint_simplify(hi - lo), False)


def _positions(size: int, d: int, shape: tuple[int, ...], device: str | tuple[str, ...]) -> UOp:
    """Each element's position along dim d of `shape` (of size `size`): Tensor._iota(size) reshaped to lie along d
    and expanded to `shape`, as the UOps those Tensor ops build."""
    pos = iota_uop(size, device)
    along = tuple(size if i == d else 1 for i in range(len(shape)))
    pos = pos if along == pos.shape else UOp(Ops.RESHAPE, pos.dtype, (pos,), along)
    return pos if shape == along else UOp(Ops.EXPAND, pos.dtype, (pos,), shape)


def _broadcast_uop(c: UOp, shape: tuple[int, ...]) -> UOp:
    """The 0-d c broadcast to `shape` in const_broadcast's form: RESHAPE to all ones, then EXPAND."""
    ones = (1,) * len(shape)
    c = c if not ones else UOp(Ops.RESHAPE, c.dtype, (c,), ones)
    return c if shape == ones else UOp(Ops.EXPAND, c.dtype, (c,), shape)


def _show(x) -> str:
    return (variable.render_sint(x) or str(x)) if isinstance(x, UOp) else str(x)


class _PointRun:
    """The constant writes `t[box] = c` a pending write's value holds over `base`, its value before them: `top` is
    that value; the writes are those in `hit` and `vals` (numpy arrays of t's shape: where and what; None before
    the first compaction) and then `boxes` ((numpy index, constant), in order: a later write wins)."""

    __slots__ = ("base", "top", "boxes", "hit", "vals")

    def __init__(self, base: UOp):
        self.base, self.top = base, base
        self.boxes: list[tuple[tuple[slice, ...], object]] = []
        self.hit: np.ndarray | None = None
        self.vals: np.ndarray | None = None

    def compact(self, shape: tuple[int, ...], dtype) -> tuple[np.ndarray, np.ndarray]:
        """every write of the run as (where, what) arrays; the boxes are emptied into them"""
        if self.hit is None or self.vals is None:
            self.hit, self.vals = np.zeros(shape, np.bool_), np.zeros(shape, to_numpy_dtype(dtype))
        for index, c in self.boxes:
            self.hit[index], self.vals[index] = True, c
        self.boxes = []
        return self.hit, self.vals


# each pending write (ASSIGN) made by a constant setitem -> the run of constant writes its value holds. Weak: a run
# lives while its write is pending; a write made another way starts no run, so a run's claim about its key is true
_point_runs: weakref.WeakKeyDictionary[UOp, _PointRun] = weakref.WeakKeyDictionary()


def _run_length(t: Tensor) -> int:
    """constant writes folded as selects before a run is compacted: at least 32, and one per 1024 elements, so a
    compaction's O(numel) numpy work and copy cost O(1024) element writes per setitem"""
    return max(32, t.numel() // 1024)


class IndexMixin:
    __slots__ = ()

    def _index_items(self: Tensor, indices) -> list:
        """The index as a list of one item per input dim (plus Nones), with Ellipsis expanded and lists and bool
        masks turned into int tensors. Every int tensor the caller gave is checked against its dim's size."""
        items = list(indices) if isinstance(indices, tuple) else [indices]
        if len(items) <= self.ndim and all(type(it) is int for it in items):  # plain ints: nothing to convert or check
            return items + [slice(None)] * (self.ndim - len(items))  # here (_basic_plan checks their bounds)
        T = type(self)
        for i, it in enumerate(items):
            if isinstance(it, (list, tuple, np.ndarray)):  # a tuple inside the index is a list, as numpy and torch
                items[i] = T(np.asarray(it), device=self.device)
            elif isinstance(it, bool):
                raise ArgumentTypeError("indexing with a Python bool is not supported")
            elif isinstance(it, UOp) and _is_sym(it):
                items[i] = variable.sint_arg(it, "index")  # bound, one value per Variable: simplified
            elif isinstance(it, slice) and any(isinstance(b, UOp) for b in (it.start, it.stop, it.step)):
                items[i] = slice(
                    *(variable.sint_arg(b, "slice") if isinstance(b, UOp) else b for b in (it.start, it.stop, it.step))
                )
            elif not isinstance(it, (int, np.integer, slice, T)) and it is not None and it is not Ellipsis:
                raise ArgumentTypeError(f"can't index a tensor with {type(it).__name__} {it!r}")
        from_masks: set[int] = set()  # ids of the coordinates of bool masks: in range by construction
        self._check_mask_shapes(items)
        for i in range(len(items) - 1, -1, -1):  # a bool mask indexes as many dims as it has: its nonzero coords
            it = items[i]
            if isinstance(it, T) and it.dtype == dtypes.bool:
                coords = it.nonzero() if it.ndim else None
                items[i : i + 1] = [coords[:, j] for j in range(it.ndim)] if coords is not None else [None]
                from_masks.update(id(x) for x in items[i : i + it.ndim] if coords is not None)
            elif isinstance(it, T) and not dtypes.is_int(it.dtype):
                raise IndexError(f"tensors used as indices must be integer or bool tensors, got {it.dtype}")
        consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
        if sum(1 for it in items if it is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis")
        if consumed > self.ndim:
            raise IndexError(f"too many indices ({consumed}) for a tensor of shape {self.shape}")
        e = next((i for i, it in enumerate(items) if it is Ellipsis), None)  # `is`: Tensor's == is elementwise
        if e is not None:
            items = items[:e] + [slice(None)] * (self.ndim - consumed) + items[e + 1 :]
        else:
            items = items + [slice(None)] * (self.ndim - consumed)
        dim = 0
        for it in items:
            if isinstance(it, T) and id(it) not in from_masks:
                check_index_bounds(it, self.shape[dim], dim, wrap=True)
            dim += it is not None
        return items

    def _check_mask_shapes(self: Tensor, items: list) -> None:
        """A bool mask must match the dims it indexes (as torch): a shorter one would select from their start."""
        T = type(self)
        consumed = [
            0 if it is None or it is Ellipsis else it.ndim if isinstance(it, T) and it.dtype == dtypes.bool else 1
            for it in items
        ]
        e = next((i for i, it in enumerate(items) if it is Ellipsis), None)
        for i, it in enumerate(items):
            if not (isinstance(it, T) and it.dtype == dtypes.bool and it.ndim):
                continue
            dim = sum(consumed[:i]) if e is None or i < e else self.ndim - sum(consumed[i:])
            for j, s in enumerate(it.shape):
                if 0 <= dim + j < self.ndim and s != self.shape[dim + j]:
                    raise IndexError(
                        f"The shape of the mask {list(it.shape)} at index {j} does not match the shape of the "
                        f"indexed tensor {list(self.shape)} at index {dim + j}"
                    )

    def _basic_plan(self: Tensor, items: list) -> tuple[list[_DimSel], tuple[int, ...]]:
        """One _DimSel per input dim (tensor indices keep their dim whole), and the shape after basic indexing."""
        sels: list[_DimSel] = []
        out_shape: list = []  # typed as Tensor.shape is (tuple[int, ...]), a symbolic slice's dim holds its UOp size
        dim = 0
        for it in items:
            if it is None:
                out_shape.append(1)
                continue
            size = self.shape[dim]
            if isinstance(it, UOp) or (isinstance(it, (int, np.integer)) and isinstance(size, UOp)):
                # a symbolic int index, or an int into a symbolic dim: shrink to [i, i+1) and drop the dim
                if isinstance(it, (int, np.integer)):
                    it = variable.sint_simplify(size + int(it)) if it < 0 else int(it)
                if not 0 <= variable.sint_value(it) < variable.sint_value(size):
                    raise IndexError(
                        f"index {_show(it)} is out of bounds for dimension {dim} with size {_show(size)}"
                        f" (a symbolic index is not wrapped)"
                    )
                sels.append(_DimSel(it, variable.sint_simplify(it + 1), False, 1, 1, True))
            elif isinstance(it, slice) and any(isinstance(b, UOp) for b in (it.start, it.stop, it.step, size)):
                sels.append(_sym_slice(it, size, dim))
                out_shape.append(sels[-1].n)
            elif isinstance(it, (int, np.integer)):
                i = int(it)
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
                i += size if i < 0 else 0
                sels.append(_DimSel(i, i + 1, False, 1, 1, True))
            elif isinstance(it, slice):
                if any(b is not None and not isinstance(b, (int, np.integer)) for b in (it.start, it.stop, it.step)):
                    raise ArgumentTypeError(f"slice indices must be ints or None, got {it}")
                if it.step == 0:
                    raise ArgumentError(f"slice step cannot be zero, got {it} for dimension {dim}")
                start, stop, step = it.indices(size)
                n = len(range(start, stop, step))
                first, last = (start, start + (n - 1) * step) if n else (0, -1)
                lo, hi = (first, last + 1) if step > 0 or not n else (last, first + 1)  # empty: [0, 0), as numpy
                sels.append(_DimSel(lo, max(lo, hi), step < 0, abs(step), n, False))
                out_shape.append(n)
            else:  # a tensor index: basic indexing keeps the dim whole
                sels.append(_DimSel(0, size, False, 1, size, False))
                out_shape.append(size)
            dim += 1
        return sels, tuple(out_shape)

    def _apply_basic(self: Tensor, sels: list[_DimSel], out_shape: tuple[int, ...]) -> Tensor:
        x = self.shrink(tuple((s.lo, s.hi) for s in sels))
        x = x.flip([d for d, s in enumerate(sels) if s.flip]) if any(s.flip for s in sels) else x
        for d, s in enumerate(sels):  # every step-th: pad to n*step, split into (n, step), keep column 0
            if s.step > 1 and s.n > 0:
                x = x.pad(tuple((0, s.n * s.step - x.shape[d]) if i == d else None for i in range(x.ndim)))
                x = x.reshape(x.shape[:d] + (s.n, s.step) + x.shape[d + 1 :])
                x = x.shrink(tuple((0, 1) if i == d + 1 else None for i in range(x.ndim)))
                x = x.reshape(x.shape[: d + 1] + x.shape[d + 2 :])
        return x.reshape(out_shape)

    def _unapply_basic(self: Tensor, v: Tensor, sels: list[_DimSel], spread: bool = False) -> Tensor:
        """The inverse of _apply_basic for a value v of the indexed shape: v placed into self's shape, zeros around.
        With `spread` (int bounds only), a dim that selects one element takes v broadcast along it instead of padded
        (a mask picks the element), so `t[i] = v` and `x[i] = row` place v with no PAD."""
        v = v.reshape(tuple(1 if s.drop else s.n for s in sels))
        for d, s in enumerate(sels):
            if s.step > 1 and s.n > 1:  # put step-1 zeros after each element
                v = v.reshape(v.shape[: d + 1] + (1,) + v.shape[d + 1 :])
                v = v.pad(tuple((0, s.step - 1) if i == d + 1 else None for i in range(v.ndim)))
                v = v.reshape(v.shape[:d] + (s.n * s.step,) + v.shape[d + 2 :])
                v = v.shrink(tuple((0, s.hi - s.lo) if i == d else None for i in range(v.ndim)))
        v = v.flip([d for d, s in enumerate(sels) if s.flip]) if any(s.flip for s in sels) else v
        pads = tuple(None if spread and s.n == 1 else (s.lo, size - s.hi) for s, size in zip(sels, self.shape))
        v = v.pad(pads) if any(p is not None for p in pads) else v
        return v.expand(self.shape) if spread else v

    def _selection_mask(self: Tensor, sels: list[_DimSel]) -> UOp | None:
        """Where a basic index with int bounds selects, as comparisons of each element's position along a dim with
        the bounds (None: everywhere). A position is one graph node per dim and size, shared by every setitem, so a
        chain of N setitems adds O(1) nodes each and the scheduler lowers them without index algebra. Built as UOps
        (the Tensor ops it stands for: `pos == lo`, `(pos > lo - 1) & (pos < hi) & (pos % step == lo % step)`), all
        of one shape, dtype and device: the Tensor ops' checks and broadcasts would cost more than the nodes."""
        shape, device = self.shape, self.device
        mask = None
        for d, (s, size) in enumerate(zip(sels, shape)):
            if (s.lo, s.hi, s.step) == (0, size, 1):
                continue
            pos = _positions(size, d, shape, device)
            if s.n == 1:
                sel = UOp(Ops.CMPEQ, dtypes.bool, (pos, const_broadcast(s.lo, pos.dtype, device, shape)))
            else:
                terms = [UOp(Ops.CMPLT, dtypes.bool, (const_broadcast(s.lo - 1, pos.dtype, device, shape), pos))]
                terms = terms if s.lo > 0 else []
                if s.hi < size:
                    terms.append(UOp(Ops.CMPLT, dtypes.bool, (pos, const_broadcast(s.hi, pos.dtype, device, shape))))
                if s.step > 1:
                    step = const_broadcast(s.step, pos.dtype, device, shape)
                    phase = const_broadcast(s.lo % s.step, pos.dtype, device, shape)
                    terms.append(UOp(Ops.CMPEQ, dtypes.bool, (UOp(Ops.MOD, pos.dtype, (pos, step)), phase)))
                sel = terms[0]
                for term in terms[1:]:
                    sel = UOp(Ops.AND, dtypes.bool, (sel, term))
            mask = sel if mask is None else UOp(Ops.AND, dtypes.bool, (mask, sel))
        return mask

    def _place_reading_self(self: Tensor, v: Tensor, sels: list[_DimSel], out_shape: tuple) -> Tensor:
        """v (of the indexed shape) placed into self's shape by _unapply_basic(spread=True). `t[indices] op= x` reads
        t[indices] and writes it back: the elementwise ops of v over that view are rebuilt over self itself (at each
        selected position the view's element is self's element there), so the write reads its target at the element
        it writes (no copy of the target first, and the scheduler reads the target at one index), and only the other
        operands of those ops are placed."""
        if self.uop not in v.uop.toposort(gate=lambda u: u is not self.uop):  # v does not read self (a constant)
            return self._unapply_basic(v, sels, spread=True)
        read = self._apply_basic(sels, out_shape).uop
        region = v.uop.toposort(gate=lambda u: u is not read and u is not self.uop and u.op in GroupOp.Elementwise)
        if read not in region:
            return self._unapply_basic(v, sels, spread=True)
        uses = v.uop.toposort(gate=lambda u: u is not read and u is not self.uop)
        reaches = {read}  # the elementwise nodes over the view, each reached from v through elementwise ops alone
        for u in region:
            if u.op in GroupOp.Elementwise and not reaches.isdisjoint(u.src):
                reaches.add(u)
        if any(read in u.src and u not in reaches for u in uses):  # the view is also read otherwise (a sum of it)
            return self._unapply_basic(v, sels, spread=True)
        T = type(self)
        rebuilt: dict[UOp, Tensor] = {read: self}
        for u in region:
            if u in reaches and u is not read:
                srcs = [rebuilt[s] if s in reaches else self._unapply_basic(T(s), sels, spread=True) for s in u.src]
                rebuilt[u] = self._new(UOp(u.op, u.dtype, tuple(s.uop for s in srcs), u.arg))
        return rebuilt[v.uop]

    def __getitem__(self: Tensor, indices) -> Tensor:
        return self._getitem(self._index_items(indices))

    def _getitem(self: Tensor, items: list) -> Tensor:
        """Indexing by items as _index_items returns them (already checked)."""
        sels, out_shape = self._basic_plan(items)
        x = self._apply_basic(sels, out_shape)
        adv = [
            (pos, it)
            for pos, it in enumerate(i for i in items if not isinstance(i, (int, np.integer, UOp)))
            if isinstance(it, type(self))
        ]
        return x._advanced(adv) if adv else x

    def _advanced(self: Tensor, adv: list) -> Tensor:
        """Select with integer tensors at dims adv=[(dim, index)]: their broadcast shape replaces those dims (in
        place if they are adjacent, else in front), as numpy and torch."""
        dims = [d for d, _ in adv]
        shapes = [t.shape for _, t in adv]
        try:
            bshape = broadcast_shape(*shapes)
        except ArgumentError:  # torch's and numpy's type for index tensors that don't broadcast
            raise IndexError(
                f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}"
            ) from None
        rest = [d for d in range(self.ndim) if d not in dims]
        sizes = [self.shape[d] for d in dims]
        x = self.permute(*rest, *dims).reshape(*[self.shape[d] for d in rest], *[1] * len(bshape), *sizes)
        mask = None
        for k, (d, idx) in enumerate(adv):
            idx = (idx < 0).where(idx + sizes[k], idx)._broadcast_to(bshape)
            hot = idx.reshape(*bshape, *[1] * len(sizes))._one_hot_along(sizes[k], len(bshape) + k)
            mask = hot if mask is None else mask & hot
        assert mask is not None, "called with at least one tensor index"
        out = x._select_sum(mask, tuple(range(-len(sizes), 0)))
        at = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
        nr, nb = len(rest), len(bshape)
        return out.permute(*range(at), *range(nr, nr + nb), *range(at, nr))

    def _select_sum(self: Tensor, mask: Tensor, axes) -> Tensor:
        """Sum of self where mask (at most one hit per output): exact for every dtype, as a `where` and one reduce."""
        return mask.where(self, 0).sum(axes).cast(self.dtype)

    def __setitem__(self: Tensor, indices, v) -> None:
        """t[indices] = v, lazily: t.assign(mask.where(v placed, t)). No kernel runs here, unless t is a view of part
        of a buffer (`w[:, 1:3][0] = v`, `w.T[0] = v`): then the write runs now, as torch's does, so that it reaches
        the memory even when t is a temporary, and writes through several views run in the order they were made."""
        from zeptograd.engine.realize import is_memory_view

        if is_memory_view(self.uop):
            self._setitem(indices, v)
            self.realize()
        else:
            self._setitem(indices, v)

    def _setitem(self: Tensor, indices, v) -> None:
        T = type(self)
        const = None  # a Python number into a one-device tensor: the CONST T(v, dtype=self.dtype) holds, no Tensor
        if type(v) in (int, float, bool) and isinstance(self.device, str):
            const = const_broadcast(v, self.dtype, self.device, ())
        elif not isinstance(v, T):
            v = T(v, device=self.device, dtype=self.dtype)
        items = self._index_items(indices)
        sels, out_shape = self._basic_plan(items)
        if any(isinstance(i, T) for i in items):  # which flat position each selected element writes; the last wins
            v = T(const, device=self.device) if const is not None else v
            pos = T.arange(self.numel(), device=self.device).reshape(self.shape)._getitem(items)
            vals = v.cast(self.dtype)._broadcast_to(pos.shape).flatten()
            hit = pos.flatten().unsqueeze(0) == T.arange(self.numel(), device=self.device).unsqueeze(1)
            self.assign(hit.any(1).reshape(self.shape).where(last_hit(hit, vals).reshape(self.shape), self))
            return
        int_bounds = all(isinstance(b, int) for s in sels for b in (s.lo, s.hi)) and all(
            isinstance(n, int) for n in self.shape
        )
        if const is not None and int_bounds and all(s.n for s in sels):  # t[i] = c: no Tensor op, no assign walk
            if (mask := self._selection_mask(sels)) is not None:
                self._write_constant(mask, const, sels)
                return
        v = T(const, device=self.device) if const is not None else v
        v = v.cast(self.dtype)._broadcast_to(out_shape)
        if not int_bounds:  # a symbolic bound or size: the value and a mask of ones placed by the inverse movement
            ones = T.ones(*out_shape, dtype=dtypes.bool, device=self.device)
            self.assign(self._unapply_basic(ones, sels).where(self._unapply_basic(v, sels), self))
        elif any(s.n == 0 for s in sels):
            return  # nothing selected: nothing written
        elif (mask_uop := self._selection_mask(sels)) is None:  # every element is written
            self.assign(self._place_reading_self(v, sels, out_shape))
        else:
            self._write_where(mask_uop, v, sels, out_shape)

    def _write_constant(self: Tensor, mask: UOp, const: UOp, sels: list[_DimSel]) -> None:
        """t[box] = c folded into the pending write as a select over its value. A run of these on one pending write
        is compacted every `_run_length(t)` writes: the run's boxes and constants become two buffers made here (where
        it wrote, what), and the pending value one select of them over the value before the run (`_PointRun.base`).
        So a loop of N constant writes leaves a kernel of fewer than `_run_length` selects, not N: the scheduler and
        codegen walk a graph of bounded size, and the kernel is compiled once for every N (the buffers are inputs)."""
        run = _point_runs.pop(self.uop, None)
        box = (tuple(slice(s.lo, s.hi, s.step) for s in sels), const.arg)
        if run is not None and len(run.boxes) + 1 >= _run_length(self) and self.dtype != dtypes.bfloat16:
            run.boxes.append(box)
            hit, vals = run.compact(self.shape, self.dtype)
            T = type(self)
            hit_uop, vals_uop = T(hit, device=self.device).uop, T(vals, device=self.device, dtype=self.dtype).uop
            self._assign_select(hit_uop, vals_uop, under=run.base)
            value = self.uop.src[1] if self.uop.op is Ops.ASSIGN else None
            if value is not None and value.src == (hit_uop, vals_uop, run.base):  # (else the run ends here)
                run.top, _point_runs[self.uop] = value, run
            return
        placed = _broadcast_uop(const, self.shape)
        self._assign_select(mask, placed)
        value = self.uop.src[1] if self.uop.op is Ops.ASSIGN else None
        if value is None or value.op is not Ops.WHERE or value.src[:2] != (mask, placed):
            return  # not a select over the value before it (a write that needs a copy first): no run
        if run is None or value.src[2] is not run.top:  # a run starts: the value before it is what this selects over
            run = _PointRun(value.src[2])
        run.boxes.append(box)
        run.top, _point_runs[self.uop] = value, run

    def _write_where(self: Tensor, mask: UOp, v: Tensor, sels: list[_DimSel], out_shape: tuple) -> None:
        """self.assign(where(mask, v placed, self)) for a basic index with int bounds, v of the indexed shape and
        self's dtype: one WHERE over UOps, since the operands are already of one shape and dtype. A constant v is
        placed broadcast to the whole shape (the mask picks where it lands), without the inverse movement ops."""
        c = uniform_const(v.uop)
        placed = _broadcast_uop(c, self.shape) if c is not None else self._place_reading_self(v, sels, out_shape).uop
        if v.device != self.device:  # the check and message of Tensor.where (cond._alu)
            raise ArgumentError(f"tensors on different devices: {self.device} and {v.device}")
        if c is not None:  # positions and a constant: no memory read
            self._assign_select(mask, placed)
        else:
            self.assign(self._new(UOp(Ops.WHERE, self.dtype, (mask, placed, self.uop))))

    # ***** gather / scatter *****
    def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
        """out[i][j][k] = self[i][index[i][j][k]][k] (dim=1). Indices must be in [0, size) (as torch: no wrapping),
        checked at this call (`check_index_bounds`)."""
        return self._gather(dim, index, check=True)

    def _gather(self: Tensor, dim: int, index: Tensor, check: bool = False) -> Tensor:
        """gather; without `check` for indices that are in range by construction (interpolate) or checked by the
        caller with their own rule (nll_loss's labels, where ignore_index is allowed and masked after)."""
        d = normalize_axis(dim, self.ndim, "dim")
        if index.ndim != self.ndim:
            raise ArgumentError(f"gather: index of shape {index.shape} needs as many dims as the input {self.shape}")
        if any(i > s for k, (s, i) in enumerate(zip(self.shape, index.shape)) if k != d):
            raise ArgumentError(
                f"gather: index shape {index.shape} is larger than the input {self.shape} outside dim {d}"
            )
        if not dtypes.is_int(index.dtype):
            raise IndexError(f"gather needs an integer index tensor, got {index.dtype}")
        if check:
            check_index_bounds(index, self.shape[d], d, wrap=False, what="gather: ")
        x = self.shrink(tuple((0, i) if k != d else None for k, i in enumerate(index.shape)))
        x = x.unsqueeze(-1).transpose(-1, d)  # the gathered dim moves to the end
        return x._select_sum(index.unsqueeze(-1)._one_hot_along(self.shape[d], -1), -1)

    def _pre_scatter(self: Tensor, dim: int, index: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
        """src and a one-hot mask laid out as (*self.shape, n): [..., j] is what index sends to position j of dim."""
        d = normalize_axis(dim, self.ndim, "dim")
        if not index.ndim == self.ndim == src.ndim:
            raise ArgumentError(f"scatter: self {self.shape}, index {index.shape} and src {src.shape} need equal ndim")
        if any((k != d and s < i) or sr < i for k, (s, i, sr) in enumerate(zip(self.shape, index.shape, src.shape))):
            raise ArgumentError(f"scatter: index shape {index.shape} must fit src {src.shape} and self {self.shape}")
        if not dtypes.is_int(index.dtype):
            raise IndexError(f"scatter needs an integer index tensor, got {index.dtype}")
        if src.dtype != self.dtype:  # as torch: a float source silently rounded into a half tensor hides a mistake
            raise ArgumentError(f"scatter(): Expected self.dtype {self.dtype} to be equal to src.dtype {src.dtype}")
        check_index_bounds(index, self.shape[d], d, wrap=False, what="scatter: ")
        src = src.cast(self.dtype).shrink(tuple((0, s) for s in index.shape))
        src = src.unsqueeze(-1).expand(*src.shape, self.shape[d]).transpose(-1, d)
        mask = index.unsqueeze(-1)._one_hot_along(self.shape[d], -1).transpose(-1, d)
        pad = tuple((0, self.shape[i] - src.shape[i]) if i != d else None for i in range(self.ndim)) + (None,)
        return src.pad(pad), mask.pad(pad)

    def scatter(self: Tensor, dim: int, index: Tensor, src, reduce: str | None = None) -> Tensor:
        if reduce not in (None, "add", "multiply"):
            raise ArgumentError(f"scatter reduce must be None, 'add' or 'multiply', got {reduce!r}")
        if not isinstance(src, type(self)):
            src = index.full_like(src, dtype=self.dtype)
        if reduce is not None:
            return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
        src, mask = self._pre_scatter(dim, index, src)
        return mask.any(-1).where(last_hit(mask, src), self)

    def scatter_reduce(
        self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True
    ) -> Tensor:
        if reduce not in ("sum", "prod", "mean", "amax", "amin"):
            raise ArgumentError(f"scatter_reduce reduce must be sum, prod, mean, amax or amin, got {reduce!r}")
        src, mask = self._pre_scatter(dim, index, src)
        hit = mask.any(-1)

        def base(identity):
            return self if include_self else hit.where(identity, self)

        if reduce == "sum":
            return mask.where(src, 0).sum(-1).cast(self.dtype) + base(0)
        if reduce == "prod":
            return mask.where(src, 1).prod(-1).cast(self.dtype) * base(1)
        if reduce == "amax":
            return mask.where(src, dtypes.min(self.dtype)).max(-1).maximum(base(dtypes.min(self.dtype)))
        if reduce == "amin":
            return mask.where(src, dtypes.max(self.dtype)).min(-1).minimum(base(dtypes.max(self.dtype)))
        count = mask.sum(-1) + (1 if include_self else hit.logical_not())  # mean
        total = mask.where(src, 0).sum(-1) + base(0)
        if dtypes.is_float(self.dtype):
            return (total / count).cast(self.dtype)
        return total.div(count, rounding_mode="floor").cast(self.dtype)

    # ***** masks *****
    def masked_fill(self: Tensor, mask: Tensor, value) -> Tensor:
        return mask.where(value, self).cast(self.dtype)

    def _compact(self: Tensor, mask: Tensor, size: int | None, fill_value) -> Tensor:
        """The elements of self (same shape as mask) where mask is true, in order, as a 1-D tensor of `size`."""
        m = mask.flatten().bool()
        if size is None:
            size = int(m.sum().item())  # the result's shape depends on the data: this one number is read back
        rank = m.cumsum(0) - 1  # where each selected element lands
        hit = m.unsqueeze(0) & (rank.unsqueeze(0) == type(self).arange(size, device=self.device).unsqueeze(1))
        out = self.flatten()._broadcast_to((size, m.shape[0]))._select_sum(hit, 1)
        return hit.any(1).where(out, fill_value).cast(self.dtype)

    def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value=0) -> Tensor:
        shape = broadcast_shape(self.shape, mask.shape)
        return self._broadcast_to(shape)._compact(mask._broadcast_to(shape), size, fill_value)

    def nonzero(self: Tensor, size: int | None = None, fill_value=0) -> Tensor:
        """The coordinates of the nonzero elements, one row each: shape (count, ndim), int64."""
        m = self != 0
        if size is None:
            size = int(m.sum().item())
        coords = [
            type(self)
            .arange(s, dtype=dtypes.int64, device=self.device)
            .reshape(tuple(s if i == d else 1 for i in range(self.ndim)))
            ._broadcast_to(self.shape)
            for d, s in enumerate(self.shape)
        ]
        if not coords:
            return type(self).zeros(size, 0, dtype=dtypes.int64, device=self.device)
        return type(self).stack(*[c._compact(m, size, fill_value) for c in coords], dim=1)


def last_hit(hit: Tensor, values: Tensor) -> Tensor:
    """Along the last axis of hit: the value at the last true position (0 if none)."""
    n = hit.shape[-1]
    pos = type(hit).arange(n, device=hit.device)
    last = hit.where(pos, -1)._max(-1, keepdim=True)
    return values._broadcast_to(hit.shape)._select_sum(pos == last, -1)


# ***** the bounds of index tensors *****


def _bounds_error(what: str, values, dim: int, size: int) -> IndexError:
    """values: the offending ones (the first is named; a few more are listed)."""
    vals = list(dict.fromkeys(int(v) for v in values))
    more = (
        f" (out-of-bounds values: {', '.join(map(str, vals[:8]))}{', ...' if len(vals) > 8 else ''})"
        if len(vals) > 1
        else ""
    )
    return IndexError(f"{what}index {vals[0]} is out of bounds for dimension {dim} with size {size}{more}")


def check_index_bounds(idx: Tensor, size, dim: int, wrap: bool, what: str = "") -> None:
    """An IndexError now, at the user's call, if an element of idx is outside [-size, size) (wrap=True: t[idx],
    where negatives count from the end as in numpy and torch) or outside [0, size) (gather, scatter, Embedding,
    which do not wrap in torch either). The error names the offending value(s), the dim and its size.

    The index is lazy and its values are needed now, so this realizes it and reads it back to check its min and max
    with numpy: what torch does eagerly. It is cheap (an index is usually small, often already a buffer), and the
    realized index is then read by the kernel that uses it rather than computed again. An index that is a buffer,
    a constant, or a reshape/expand/permute/flip of one (gather's expanded indices) is read where it lies: those
    views keep the set of values, so nothing is realized (~20 us for 256 indices).

    Under TinyJit's capture, where reading values on the host is refused (a replay would not read them again), the
    min and max are computed by a captured kernel instead: checked now from its output, and registered with the
    capture (`_Capture.checks` in engine/jit.py), so that every replay checks them right after that kernel and
    raises before the kernels after it run. A replay never skips the check.
    """
    _check_values(idx, size, wrap, None, lambda vals, size_v: _bounds_error(what, vals, dim, size_v))


def check_label_bounds(labels: Tensor, num_classes, ignore_index: int | None, what: str) -> bool:
    """Class labels (cross_entropy, nll_loss, sparse_categorical_crossentropy) must be in [0, num_classes) or equal
    ignore_index, else an IndexError at the call with torch's text ("Target 7 is out of bounds.") and the class
    count: a label out of range would select no class (a silent loss of 0 for it). Checked as index tensors are
    (`check_index_bounds`: read where they lie, else realized; under TinyJit a captured min/max checked on every
    replay), with the labels equal to ignore_index left out.

    Returns whether a label may equal ignore_index: False when the values read show none (the loss then needs no
    mask: a smaller graph), True when one does or the values are not known now (a TinyJit capture)."""
    if not dtypes.is_int(labels.dtype):
        raise ArgumentTypeError(
            f"{what}: class index labels must be an integer tensor, got {labels.dtype} (class "
            f"probabilities need the input's shape)"
        )

    def error(vals, size_v: int) -> IndexError:
        vals = list(dict.fromkeys(int(v) for v in vals))
        allowed = f"[0, {size_v})" + (f" or ignore_index={ignore_index}" if ignore_index is not None else "")
        more = (
            f"; out-of-bounds values: {', '.join(map(str, vals[:8]))}{', ...' if len(vals) > 8 else ''}"
            if len(vals) > 1
            else ""
        )
        return IndexError(
            f"Target {vals[0]} is out of bounds. ({what}: {size_v} classes, labels must be in {allowed}{more})"
        )

    return _check_values(labels, num_classes, False, ignore_index, error)


def check_one_hot_bounds(labels: Tensor, num_classes: int) -> None:
    """one_hot's class values must be in [0, num_classes): torch's RuntimeError texts, with the value and the count."""

    def error(vals, size_v: int) -> RuntimeError:
        v = int(vals[0])
        rule = "non-negative" if v < 0 else "smaller than num_classes"
        return RuntimeError(f"Class values must be {rule}. (one_hot: class value {v} with num_classes={size_v})")

    _check_values(labels, num_classes, False, None, error)


def _check_values(
    idx: Tensor, size, wrap: bool, ignore: int | None, error: Callable[[Sequence[int] | np.ndarray, int], Exception]
) -> bool:
    """Raise error(offending values, size) if an element of idx other than `ignore` is outside [-size, size) (wrap)
    or [0, size); offending values in order (eager) or the max or min out of range (a TinyJit capture or replay).
    Returns whether an element may equal `ignore` (True if the values are not read now)."""
    from zeptograd.engine.realize import is_capturing
    from zeptograd.uop.variable import sint_value

    if any(d.split(":")[0] == "NULL" for d in (idx.device if isinstance(idx.device, tuple) else (idx.device,))):
        return ignore is not None  # the NULL device runs nothing: its tensors hold no values to check
    if ignore is not None and not dtypes.min(idx.dtype) <= ignore <= dtypes.max(idx.dtype):
        ignore = None  # no element can equal it
    if not is_capturing():
        vals = _index_values(idx)
        ignored = False
        if ignore is not None:
            kept = vals[vals != ignore]
            vals, ignored = kept, kept.size < vals.size
        size_v = sint_value(size)
        lo = -size_v if wrap else 0
        if vals.size and (vals.min() < lo or vals.max() >= size_v):
            raise error(vals[(vals < lo) | (vals >= size_v)].flatten(), size_v)
        return ignored
    _capture_bounds_check(idx, size, wrap, ignore, error)
    return ignore is not None


def _index_values(idx: Tensor) -> np.ndarray:
    """idx's values, or the same set of values: those of the buffer or constant under a chain of views that keep
    the set (RESHAPE, EXPAND, PERMUTE, FLIP), read without realizing anything; else idx realized and read back."""
    from zeptograd.buffers import buffers
    from zeptograd.engine.realize import realized_value
    from zeptograd.schedule.fold import uniform_const
    from zeptograd.uop.ops import Ops, UOp

    u = realized_value(idx.uop)
    if all(isinstance(s, int) for s in idx.shape) and 0 not in idx.shape:
        if (c := uniform_const(u)) is not None and not isinstance(c.arg, UOp):
            return np.array([c.arg])
        while u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.FLIP):
            u = u.src[0]
        if u.op is Ops.BUFFER and all(isinstance(s, int) for s in u.tensor_shape) and u in buffers:
            buf = buffers[u]
            if buf.is_allocated:  # holds its values (a buffer that is only planned has none yet)
                return buf.numpy()
    return idx.numpy()


def _capture_bounds_check(
    idx: Tensor, size, wrap: bool, ignore: int | None, error: Callable[[Sequence[int] | np.ndarray, int], Exception]
):
    from zeptograd.buffers import buffers, view_base
    from zeptograd.engine.realize import current_capture
    from zeptograd.schedule.fold import uniform_const
    from zeptograd.uop.variable import rebind_shape, sint_value, strip_sint

    T = type(idx)
    if 0 in idx.shape:
        return  # no index (a symbolic size that is 0 at a replay: its min > max, below)
    cap = current_capture()
    n_before = len(cap)
    inv, top = idx._inverse(), idx
    if ignore is not None:  # an ignored element counts as dtypes.min for the max and dtypes.max for the min
        skip = idx == ignore
        inv, top = skip.where(dtypes.min(idx.dtype), inv), skip.where(dtypes.min(idx.dtype), top)
    stats = T.stack(inv._max()._inverse(), top._max()).realize()  # min > max: empty or all ignored
    value = stats.uop.src[0] if stats.uop.op is Ops.MULTI else stats.uop  # sharded: all-reduced, read on one device
    if (c := uniform_const(value)) is not None:  # a constant index: checked once, it cannot change
        read = lambda: (c.arg, c.arg)  # noqa: E731
    else:
        base = view_base(value)
        assert base is not None, f"realize left {value.op}, not a buffer"
        buf = buffers[base]
        read = lambda: tuple(buf.numpy()[:2].tolist())  # noqa: E731
    unbound = strip_sint(size)

    def check(var_vals: dict[str, int] | None = None):
        mn, mx = read()
        size_v = sint_value(size if var_vals is None else rebind_shape((unbound,), var_vals)[0])
        lo = -size_v if wrap else 0
        if mn <= mx and (mn < lo or mx >= size_v):
            raise error([mx if mx >= size_v else mn], size_v)

    check()
    if len(cap) > n_before:
        cap.checks.append((len(cap) - 1, check))  # replays run it after the kernel that computed stats
