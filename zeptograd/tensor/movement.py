"""Composite movement ops, built from the six movement primitives (reshape permute expand pad shrink flip)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from zeptograd.helpers import ArgumentError, ArgumentTypeError
from zeptograd.tensor.helpers import argfix, ceildiv, flatten, make_tuple, normalize_axis, prod

if TYPE_CHECKING:
    from zeptograd.tensor import Tensor


def _tensor_list(first, args, dim: int, what: str) -> tuple[list, int]:
    """`Tensor.cat(a, b)`, `a.cat(b)` and `Tensor.cat([a, b])` all mean [a, b]; after a sequence, one more positional
    argument is the dim (`Tensor.cat([a, b], 1)`, as torch), and a tensor there is an error, not a third tensor."""
    if not isinstance(first, (list, tuple)):
        ts = [first, *args]
    elif not args:
        ts = list(first)
    elif len(args) > 1 or not isinstance(args[0], (int, np.integer)) or isinstance(args[0], bool):
        raise ArgumentTypeError(
            f"{what}(tensors, dim): after the sequence of tensors only the dim may follow, an int; got "
            f"{', '.join(type(a).__name__ for a in args)}"
        )
    else:
        ts, dim = list(first), int(args[0])
    if not ts:
        raise ArgumentError(f"{what} needs a non-empty list of tensors")
    if not all(isinstance(t, type(ts[0])) and hasattr(t, "uop") for t in ts):
        raise ArgumentTypeError(f"{what} takes tensors (and dim as a keyword), got {[type(t).__name__ for t in ts]}")
    return ts, dim


class MovementMixin:
    __slots__ = ()

    def _dim(self: Tensor, dim: int, extra: int = 0) -> int:
        return normalize_axis(dim, self.ndim + extra, "dim")

    def squeeze(self: Tensor, dim: int | Sequence[int] | None = None) -> Tensor:
        dims = range(self.ndim) if dim is None else [self._dim(d) for d in argfix(dim)]
        drop = {d for d in dims if self.ndim and self.shape[d] == 1}  # a 0-d tensor takes dim 0 or -1 and stays
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in drop))

    def unsqueeze(self: Tensor, dim: int) -> Tensor:
        d = self._dim(dim, 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = self._dim(start_dim), self._dim(end_dim)
        if s > e:
            raise ArgumentError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} in shape {self.shape}")
        return self.reshape(self.shape[:s] + (prod(self.shape[s : e + 1]),) + self.shape[e + 1 :])

    def unflatten(self: Tensor, dim: int, sizes: tuple[int, ...]) -> Tensor:
        d = self._dim(dim)
        return self.reshape(self.shape[:d] + _fill_minus_one(sizes, self.shape[d]) + self.shape[d + 1 :])

    def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = self._dim(dim0), self._dim(dim1)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self: Tensor) -> Tensor:
        return self.permute(tuple(range(self.ndim))[::-1])

    def pad_to(self: Tensor, shape, *args, value=0) -> Tensor:
        shape = argfix(shape, *args)
        return self.pad(tuple((0, 0 if n is None else n - s) for s, n in zip(self.shape, shape)), value=value)

    def shrink_to(self: Tensor, shape, *args) -> Tensor:
        shape = argfix(shape, *args)
        return self.shrink(tuple(None if n is None else (0, n) for n in shape))

    def _slice_dim(self: Tensor, dim: int, lo: int, hi: int) -> Tensor:
        return self.shrink(tuple((lo, hi) if i == dim else None for i in range(self.ndim)))

    # ***** joining and splitting *****
    def cat(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
        ts, dim = _tensor_list(self, args, dim, "cat")
        if any(t.ndim == 0 for t in ts):
            raise ArgumentError("zero-dimensional tensors cannot be concatenated")
        d = normalize_axis(dim, ts[0].ndim, "dim")
        for t in ts[1:]:
            if t.ndim != ts[0].ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape)) if i != d):
                raise ArgumentError(f"cat: shapes {ts[0].shape} and {t.shape} differ outside dimension {d}")
        dt = ts[0].dtype
        for t in ts[1:]:
            dt = ts[0]._operands(t)[0].dtype if t.dtype != dt else dt
        total, off, parts = sum(t.shape[d] for t in ts), 0, []
        for t in ts:
            n = t.shape[d]
            parts.append(t.cast(dt).pad(tuple((off, total - off - n) if i == d else None for i in range(t.ndim))))
            off += n
        ret = parts[0]
        for p in parts[1:]:
            ret = ret + p
        return ret

    def stack(self: Tensor, *args: Tensor, dim: int = 0) -> Tensor:
        ts, dim = _tensor_list(self, args, dim, "stack")
        d = normalize_axis(dim, ts[0].ndim + 1, "dim")
        return ts[0].unsqueeze(d).cat(*[t.unsqueeze(d) for t in ts[1:]], dim=d)

    def split(self: Tensor, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        d, n = self._dim(dim), self.shape[self._dim(dim)]
        sizes = sizes if isinstance(sizes, (int, np.integer)) else make_tuple(sizes, 1)
        if not isinstance(sizes, (int, np.integer)) and any(s < 0 for s in sizes):
            raise ArgumentError(f"split sizes {list(sizes)} must be non-negative")
        if isinstance(sizes, (int, np.integer)):
            if sizes <= 0:
                raise ArgumentError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
        if sum(sizes) != n:
            raise ArgumentError(f"split sizes {list(sizes)} must sum to the size {n} of dimension {d}")
        offs = [sum(sizes[:i]) for i in range(len(sizes))]
        return tuple(self._slice_dim(d, o, o + s) for o, s in zip(offs, sizes))

    def chunk(self: Tensor, chunks: int, dim: int = 0) -> list[Tensor]:
        if not isinstance(chunks, (int, np.integer)) or isinstance(chunks, bool):
            raise ArgumentTypeError(f"chunk needs an int number of chunks, got {type(chunks).__name__} {chunks!r}")
        if chunks <= 0:
            raise ArgumentError(f"chunk needs a positive number of chunks, got {chunks}")
        n = self.shape[self._dim(dim)]
        return list(self.split(max(ceildiv(n, chunks), 1), dim)) if n else [self]

    def meshgrid(self: Tensor, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        if indexing not in ("ij", "xy"):
            raise ArgumentError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        ts = [t.flatten() for t in _tensor_list(self, args, 0, "meshgrid")[0]]
        shape = tuple(t.numel() for t in ts)
        grids = [t.reshape(tuple(-1 if i == j else 1 for j in range(len(ts)))).expand(shape) for i, t in enumerate(ts)]
        if indexing == "xy" and len(ts) >= 2:  # the first two dims swap places
            grids = [g.transpose(0, 1) for g in grids]
        return tuple(grids)

    # ***** repeating and rolling *****
    def repeat(self: Tensor, repeats, *args) -> Tensor:
        repeats = argfix(repeats, *args)
        if any(not isinstance(r, (int, np.integer)) or r < 0 for r in repeats):
            raise ArgumentError(f"repeat: repeats must be non-negative ints, got {repeats}")
        if len(repeats) < self.ndim:
            raise ArgumentError(f"repeat needs at least {self.ndim} repeats for shape {self.shape}, got {repeats}")
        base = (1,) * (len(repeats) - self.ndim) + self.shape
        x = self.reshape(flatten((1, s) for s in base))
        x = x.expand(flatten((r, s) for r, s in zip(repeats, base)))
        return x.reshape(tuple(r * s for r, s in zip(repeats, base)))

    def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
        if not isinstance(repeats, (int, np.integer)) or repeats < 0:
            raise ArgumentError(f"repeat_interleave: repeats must be a non-negative int, got {repeats!r}")
        x = self.flatten() if dim is None else self
        d = 0 if dim is None else x._dim(dim)
        x = x.unsqueeze(d + 1)
        return x.expand(x.shape[: d + 1] + (repeats,) + x.shape[d + 2 :]).flatten(d, d + 1)

    def roll(self: Tensor, shifts: int | tuple[int, ...], dims: int | tuple[int, ...] | None = None) -> Tensor:
        if dims is None:
            if len(make_tuple(shifts, 1)) != 1:
                raise ArgumentError(f"roll: without dims, shifts must be one int, got {shifts}")
            return self.flatten().roll(make_tuple(shifts, 1)[0], 0).reshape(self.shape)
        if len(make_tuple(shifts, 1)) != len(make_tuple(dims, 1)):
            raise ArgumentError(f"roll: shifts {shifts} and dims {dims} must have the same length")
        x = self
        for shift, dim in zip(make_tuple(shifts, 1), make_tuple(dims, 1)):
            d = x._dim(dim)
            n = x.shape[d]
            if n and (s := shift % n):
                x = x._slice_dim(d, n - s, n).cat(x._slice_dim(d, 0, n - s), dim=d)
        return x

    # ***** windows, diagonals, triangles *****
    def _pool(
        self: Tensor, k_: tuple[int, ...], stride: int | tuple[int, ...] = 1, dilation: int | tuple[int, ...] = 1
    ) -> Tensor:
        """Sliding windows over the last len(k_) dims: (..., *in) -> (..., *out, *k_), with movement ops only."""
        s_, d_ = make_tuple(stride, len(k_)), make_tuple(dilation, len(k_))
        noop, i_ = [None] * (self.ndim - len(k_)), self.shape[-len(k_) :]
        for k, d, i in zip(k_, d_, i_):
            if d * (k - 1) + 1 > i:
                raise ArgumentError(f"window {k_} with dilation {d_} is larger than the input's size {i_}")
        o_ = [ceildiv(i - d * (k - 1), s) for i, d, k, s in zip(i_, d_, k_, s_)]
        if all(k <= s for k, s in zip(k_, s_)) and all(d == 1 for d in d_):
            # windows that don't overlap (2x2 pooling with stride 2): rows of a reshape to (o, s), each cut to k. No
            # repeat, whose gradient sums every window position over a repeated copy of the input
            x = self.pad(tuple(noop + [(0, max(o * s - i, 0)) for o, s, i in zip(o_, s_, i_)]))
            x = x.shrink(tuple(noop + [(0, o * s) for o, s in zip(o_, s_)]))
            x = x.reshape(noop + flatten((o, s) for o, s in zip(o_, s_)))
            x = x.shrink(tuple(noop + flatten(((0, o), (0, k)) for o, k in zip(o_, k_))))
            n = len(noop)
            return x.permute(*range(n), *[n + i * 2 for i in range(len(k_))], *[n + i * 2 + 1 for i in range(len(k_))])
        # repeat each dim enough that a window is a row of a reshape: window j starts at j*(i+d) in the repeated dim;
        # a row (i*f+d long) holds the o*s positions the stride walks, however far the stride exceeds the input
        f_ = [max(1 + int(o * s > i - d * (k - 1)), ceildiv(o * s - d, i)) for o, s, i, d, k in zip(o_, s_, i_, d_, k_)]
        x = self.repeat([1] * len(noop) + [ceildiv(k * (i * f + d), i) for k, i, d, f in zip(k_, i_, d_, f_)])
        x = x.shrink(tuple(noop + [(0, k * (i * f + d)) for k, i, d, f in zip(k_, i_, d_, f_)]))
        x = x.reshape(noop + flatten((k, i * f + d) for k, i, d, f in zip(k_, i_, d_, f_)))
        x = x.shrink(tuple(noop + flatten(((0, k), (0, o * s)) for k, o, s in zip(k_, o_, s_))))
        x = x.reshape(noop + flatten((k, o, s) for k, o, s in zip(k_, o_, s_)))
        x = x.shrink(tuple(noop + flatten(((0, k), (0, o), (0, 1)) for k, o in zip(k_, o_))))
        x = x.reshape(noop + flatten((k, o) for k, o in zip(k_, o_)))
        n = len(noop)
        return x.permute(*range(n), *[n + i * 2 + 1 for i in range(len(k_))], *[n + i * 2 for i in range(len(k_))])

    def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
        """torch.Tensor.unfold: windows of `size` every `step` along dim; the window is a new last dimension."""
        d = self._dim(dim)
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in (size, step)):
            raise ArgumentTypeError(f"unfold: size and step must be ints, got {size!r} and {step!r}")
        if size > self.shape[d] or size < 0 or step <= 0:
            raise ArgumentError(f"unfold: size {size} and step {step} don't fit dimension {d} of size {self.shape[d]}")
        if size == 0:  # (n - 0) // step + 1 empty windows, as torch
            return self._slice_dim(d, 0, 0).reshape(*self.shape[:d], self.shape[d] // step + 1, *self.shape[d + 1 :], 0)
        others = [i for i in range(self.ndim) if i != d]
        x = self.permute(*others, d)._pool((size,), step)  # (*others, windows, size)
        order = list(range(len(others)))
        return x.permute(*order[:d], len(others), *order[d:], len(others) + 1)

    def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        d1, d2 = self._dim(dim1), self._dim(dim2)
        if d1 == d2:
            raise ArgumentError(f"diagonal needs two different dims, got {dim1} and {dim2}")
        x = self.permute(*[i for i in range(self.ndim) if i not in (d1, d2)], d1, d2)
        n, m = x.shape[-2:]
        length = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
        start = offset if offset >= 0 else -offset * m
        flat = x.flatten(-2)
        if length == 0:
            return flat._slice_dim(flat.ndim - 1, 0, 0)
        flat = flat._slice_dim(flat.ndim - 1, start, min(start + length * (m + 1), n * m))
        flat = flat.pad_to(*flat.shape[:-1], length * (m + 1))
        return flat.reshape(*flat.shape[:-1], length, m + 1)._slice_dim(flat.ndim, 0, 1).squeeze(-1)

    def diag(self: Tensor, diagonal: int = 0) -> Tensor:
        """1-D: the square matrix with self on its diagonal; 2-D: the diagonal (as torch.diag)."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise ArgumentError(f"diag needs a 1-D or 2-D tensor, got shape {self.shape}")
        n = self.shape[0] + abs(diagonal)
        x = self.pad(((0, abs(diagonal)),))  # row i holds x[i] (diagonal >= 0), column j holds x[j] (below it)
        x = x.reshape(n, 1) if diagonal >= 0 else x.reshape(1, n)
        rows = type(self).arange(n, device=self.device).reshape(n, 1)
        cols = type(self).arange(n, device=self.device).reshape(1, n)
        return (cols - rows == diagonal).where(x.expand(n, n), 0).cast(self.dtype)

    def _tri_mask(self: Tensor, diagonal: int, upper: bool) -> Tensor:
        r, c = self.shape[-2:]
        rows = type(self).arange(r, device=self.device).reshape(r, 1)
        cols = type(self).arange(c, device=self.device).reshape(1, c)
        return (cols - rows >= diagonal) if upper else (cols - rows <= diagonal)

    def tril(self: Tensor, diagonal: int = 0) -> Tensor:
        if self.ndim < 2:
            raise ArgumentError(f"tril needs at least 2 dimensions, got shape {self.shape}")
        return self._tri_mask(diagonal, False).where(self, self.zeros_like())

    def triu(self: Tensor, diagonal: int = 0) -> Tensor:
        if self.ndim < 2:
            raise ArgumentError(f"triu needs at least 2 dimensions, got shape {self.shape}")
        return self._tri_mask(diagonal, True).where(self, self.zeros_like())

    # ***** einops-style rearrange *****
    def rearrange(self: Tensor, formula: str, **sizes) -> Tensor:
        """`x.rearrange("b (h w) c -> b c h w", h=4)`: groups in parentheses, `...`, and `1` / `()` for unit dims."""
        if formula.count("->") != 1:
            raise ArgumentError(f'rearrange needs exactly one "->" in {formula!r}')
        lhs, rhs = (_parse_axes(side) for side in formula.split("->"))
        names_l, names_r = flatten(lhs), flatten(rhs)
        if sorted(names_l) != sorted(names_r) or len(set(names_l)) != len(names_l):
            raise ArgumentError(f"rearrange: the axis names on both sides of {formula!r} must be the same, once each")
        if "..." in names_l:  # the ellipsis stands for the dims no other group names
            ell = [f"...{i}" for i in range(self.ndim - (len(lhs) - 1))]
            lhs, rhs = (_expand_ellipsis(side, ell) for side in (lhs, rhs))
        if len(lhs) != self.ndim:
            raise ArgumentError(f"rearrange: {formula!r} names {len(lhs)} dims, the tensor has shape {self.shape}")
        known: dict[str, int] = {}
        for group, size in zip(lhs, self.shape):  # split each group
            unknown = [n for n in group if n not in sizes]
            if len(unknown) > 1:
                raise ArgumentError(f"rearrange: can't infer the sizes of {unknown} in {formula!r}")
            rest = size // max(1, prod(sizes[n] for n in group if n in sizes))
            known.update({n: sizes.get(n, rest) for n in group})
            if prod(known[n] for n in group) != size:
                raise ArgumentError(f"rearrange: sizes {[known[n] for n in group]} don't multiply to {size}")
        x = self.reshape([known[n] for g in lhs for n in g])
        order = [n for g in lhs for n in g]
        x = x.permute([order.index(n) for g in rhs for n in g])
        return x.reshape([prod(known[n] for n in g) for g in rhs])


def _parse_axes(side: str) -> list[list[str]]:
    """'b (h w) 1 () ...' -> [['b'], ['h', 'w'], [], [], ['...']]"""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for tok in side.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            if current is not None:
                raise ArgumentError(f"rearrange: nested parentheses in {side!r}")
            current = []
        elif tok == ")":
            if current is None:
                raise ArgumentError(f"rearrange: unbalanced parentheses in {side!r}")
            groups.append(current)
            current = None
        elif current is not None:
            current += [] if tok == "1" else [tok]
        else:
            groups.append([] if tok == "1" else [tok])
    if current is not None:
        raise ArgumentError(f"rearrange: unbalanced parentheses in {side!r}")
    return groups


def _expand_ellipsis(groups: list[list[str]], ell: list[str]) -> list[list[str]]:
    """A lone `...` becomes one group per dim it covers; inside parentheses, its names join the group."""
    out: list[list[str]] = []
    for g in groups:
        out += [[e] for e in ell] if g == ["..."] else [flatten(ell if n == "..." else [n] for n in g)]
    return out


def _fill_minus_one(sizes: tuple[int, ...], total: int) -> tuple[int, ...]:
    sizes = tuple(sizes)
    if sizes.count(-1) > 1:
        raise ArgumentError(f"unflatten sizes {sizes} can have at most one -1")
    known = prod(s for s in sizes if s != -1)
    if -1 in sizes:
        sizes = tuple(total // known if s == -1 and known else s for s in sizes)
    if prod(sizes) != total:
        raise ArgumentError(f"unflatten sizes {sizes} don't multiply to {total}")
    return sizes
