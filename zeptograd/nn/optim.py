"""Optimizers, as tinygrad's `tinygrad.nn.optim`: SGD (momentum, nesterov, weight decay), Adam, AdamW, LAMB, LARS,
and Muon (as torch.optim.Muon).

    opt = nn.optim.AdamW(nn.state.get_parameters(model), lr=1e-3)
    with Tensor.train():
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()          # one schedule: every parameter and every optimizer state updated in place

Every update is a lazy `Tensor.assign` into the existing buffers (parameters, momenta, the step counters), and
`step()` realizes them all together, so a TinyJit around a training step replays the whole update.

fused (the default when every parameter has one dtype and device): each optimizer state (momentum, m, v) is one
flat buffer for all the parameters, and the gradients enter as one concatenation, so the state updates are one
kernel each whatever the number of parameters; then one kernel per parameter writes its new value. Adam on N
parameters: the two step counters (b1**t and b2**t), m and v (each reading the concatenated gradients), and N
parameter kernels: N + 4 instead of 3N + 2. (SGD with momentum and weight decay keeps per-parameter momenta: see
LARS.__init__.)

A parameter without a gradient at step() is an error (as tinygrad; PyTorch skips it).
"""

from __future__ import annotations

import numpy as np

from zeptograd.dtype import dtypes, least_upper_dtype
from zeptograd.helpers import ArgumentError, ArgumentTypeError, getenv
from zeptograd.tensor import Tensor, multi
from zeptograd.uop.ops import Ops

from .state import _fresh_buffer_uop, _realize_leaves

FUSE_OPTIM = getenv("FUSE_OPTIM", 1)


def _value(p: Tensor) -> Tensor:
    """The parameter's value for the update, outside autograd: p.detach() without the DETACH node."""
    return Tensor(p.uop, device=p.device)


def _is_buffer(t: Tensor) -> bool:
    """Whether t is a whole realized buffer (its contiguous() would be a copy kernel today)."""
    u = t.uop.src[0] if t.uop.op is Ops.RESHAPE else t.uop
    return u.op is Ops.BUFFER and u.arg[1] == t.numel()


def _zeros_like_param(p: Tensor) -> Tensor:
    """Zeros for an optimizer state of p from numpy (a fresh buffer), sharded as p is."""
    if p.uop.op is Ops.MULTI:
        devices = tuple(p.device)
        zeros = Tensor(np.zeros(p.shape, np.float32), dtype=p.dtype, device=devices[0])
        return zeros.shard(devices, p.uop.arg).realize()
    return Tensor(np.zeros(p.shape, np.float32), dtype=p.dtype, device=p.device)


def _dedup(xs: list[Tensor]) -> list[Tensor]:
    return list({id(x): x for x in xs}.values())  # each once, in first-seen order


class Optimizer:
    """The base: which tensors are parameters (requires_grad True, or None: set to True), which are buffers (state
    that a step realizes but never updates, like BatchNorm's running statistics), the learning rate as a Tensor
    (assign to `opt.lr` to change it, also under TinyJit), and the fused layout. Subclasses define `_step`."""

    def __init__(self, params: list[Tensor], lr: float, fused: bool | None = None):
        params = list(params)
        for x in params:
            if not isinstance(x, Tensor):
                raise ArgumentTypeError(f"an optimizer takes a list of Tensors, got a {type(x).__name__}")
            if x.requires_grad is None:
                x.requires_grad_(True)
        self.params: list[Tensor] = _dedup([x for x in params if x.requires_grad])
        if not self.params:
            raise ArgumentError("an optimizer needs at least one tensor that requires grad")
        self.buffers: list[Tensor] = _dedup([x for x in params if not x.requires_grad])
        self.device = self.params[0].device
        self.lr = Tensor([lr], device=self.device, dtype=least_upper_dtype(dtypes.default_float, dtypes.float32))
        _realize_leaves(self.lr, *self.params, *self.buffers)
        fused = bool(FUSE_OPTIM) if fused is None else fused
        self.fused = fused and len(self.params) > 1 and len({(p.dtype, p.device) for p in self.params}) == 1
        self.fused &= not any(p.uop.op is Ops.MULTI for p in self.params)  # sharded: each state sharded as its param
        self.offsets: list[tuple[int, int]] = []
        off = 0
        for p in self.params:
            self.offsets.append((off, off + p.numel()))
            off += p.numel()

    def _new_state(self) -> list[Tensor]:
        """Zeros for one optimizer state, realized (it is updated with assign): one flat tensor when fused, else one
        tensor per parameter."""
        # fresh buffers from numpy: realized Tensor.zeros(n).contiguous() of one shape share a buffer today
        if self.fused:
            p = self.params[0]
            return [Tensor(np.zeros(self.offsets[-1][1], np.float32), dtype=p.dtype, device=p.device)]
        return [_zeros_like_param(p) for p in self.params]

    def _part(self, x: Tensor | list[Tensor], i: int) -> Tensor:
        """Parameter i's part of a state (a list from _new_state) or of a flat tensor, in the parameter's shape."""
        if isinstance(x, list):
            x = x[0] if self.fused else x[i]
        if not self.fused:
            return x
        a, b = self.offsets[i]
        return x[a:b].reshape(self.params[i].shape)

    def _flat(self, xs: list[Tensor]) -> list[Tensor]:
        """Per-parameter tensors in the state's layout: one concatenation when fused, else the list itself."""
        return [Tensor.cat(*[x.flatten() for x in xs])] if self.fused else xs

    def zero_grad(self):
        self._settle()
        for p in self.params:
            p.grad = None

    def step(self, *also: Tensor) -> None:
        """Update every parameter (and state) from its .grad, realized as one schedule. Tensors in `also` (the
        loss, a metric) are realized in the same schedule: they see the parameters before the update."""
        _realize_leaves(*self.schedule_step(), others=also)

    def _settle(self):
        """A parameter realized by the caller (Tensor.realize(loss, *opt.schedule_step())) keeps its ASSIGN graph
        (Tensor.realize keeps the graph of tensors that require grad): point it at its buffer again, else the next
        step would build on that graph (and a TinyJit capture would run the old update again)."""
        from zeptograd.engine.realize import realized_or_none

        for p in self.params:
            if p.uop.op is Ops.MULTI:  # sharded (tensor/multi.py): each device's part
                parts = multi.parts(p)
                if any(q.uop.op is Ops.ASSIGN and realized_or_none(q.uop) is not None for q in parts):
                    for q in parts:
                        q.uop = realized_or_none(q.uop) or q.uop
                    p.uop = multi.multi([q.uop for q in parts], p.uop.arg)
                    _fresh_buffer_uop(p)
                    p.requires_grad_(True)
            elif p.uop.op is Ops.ASSIGN and (r := realized_or_none(p.uop)) is not None:
                p.uop = r
                _fresh_buffer_uop(p)
                p.requires_grad_(True)

    def schedule_step(self) -> list[Tensor]:
        """The step as lazy assigns; returns the tensors to realize (together) to run it."""
        self._settle()
        if not Tensor.training:
            raise RuntimeError(
                "Tensor.training is False: an optimizer steps only in training mode "
                "(use `with Tensor.train():` or set Tensor.training = True)"
            )
        for i, p in enumerate(self.params):
            if p.grad is None:
                raise RuntimeError(
                    f"parameter {i} (shape {p.shape}) has no gradient: call loss.backward() before "
                    f"step(), and pass the optimizer only tensors the loss depends on"
                )
        return self.schedule_step_with_grads([p.grad for p in self.params if p.grad is not None])  # all (checked above)

    def schedule_step_with_grads(self, grads: list[Tensor]) -> list[Tensor]:
        if len(grads) != len(self.params):
            raise ArgumentError(f"{len(grads)} gradients for {len(self.params)} parameters")
        for p, g in zip(self.params, grads):
            if g.shape != p.shape:
                raise ArgumentError(f"a gradient of shape {g.shape} for a parameter of shape {p.shape}")
        # each gradient is its own kernel (as in PyTorch): a lazy gradient read inside the concatenation of all of
        # them, or by two state updates, would be computed again in each reader
        grads = [
            g if _is_buffer(g) and g.dtype == p.dtype else g.detach().cast(p.dtype).contiguous()
            for p, g in zip(self.params, grads)
        ]
        new, extra = self._step(grads)
        for p, n in zip(self.params, new):
            p.assign(n.cast(p.dtype))
        return extra + self.params + self.buffers

    def _step(self, grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """(the new value of each parameter, the state tensors assigned), lazily."""
        raise NotImplementedError


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), with SGD as the special case tcoef=0.

    Each parameter's gradient is scaled by the trust ratio tcoef*|w| / (|g| + wd*|w|) (1 where a norm is 0).
    classic=True applies the learning rate before the momentum (as the paper), False after (as PyTorch's SGD);
    pre_wd adds weight decay to the gradient, otherwise it is applied to the weight directly."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        nesterov: bool = False,
        classic: bool = True,
        pre_wd: bool = True,
        tcoef: float = 0.001,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, fused)
        if nesterov and momentum <= 0:
            raise ArgumentError("nesterov momentum needs momentum > 0")
        self.momentum, self.wd, self.nesterov, self.classic = momentum, weight_decay, nesterov, classic
        self.pre_wd, self.tcoef = pre_wd, tcoef
        if self.fused and tcoef == 0 and pre_wd and weight_decay > 0:
            # the flat momentum update would read every parameter (for the weight decay), and an assign whose value
            # reads its target's buffer through another kernel is copied first today: per-parameter momenta are
            # fewer kernels here
            self.fused = False
        self.b = self._new_state() if self.momentum else []

    def _scaled(self, g: Tensor, t: Tensor, r: Tensor | float) -> Tensor:
        """The gradient with weight decay added (pre_wd) and, for classic LARS, scaled by the ratio and lr."""
        if self.pre_wd and self.wd > 0:
            g = g + self.wd * t
        return g * r * self.lr if self.classic else g

    def _step(self, grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        ts = [_value(p) for p in self.params]
        trust: list[Tensor] = []  # LARS's trust ratios, where tcoef is not 0
        if self.tcoef != 0:
            for t, g in zip(ts, grads):
                r1, r2 = t.square().sum().sqrt(), g.square().sum().sqrt()
                trust.append((r1 > 0).where((r2 > 0).where(self.tcoef * r1 / (r2 + self.wd * r1), 1.0), 1.0))
        rs: list[Tensor | float] = list(trust) if self.tcoef != 0 else [1.0] * len(ts)
        if self.momentum:
            if self.fused:
                r = Tensor.cat(*[r.reshape(1).expand(t.numel()) for r, t in zip(trust, ts)]) if self.tcoef else 1.0
                scaled = [self._scaled(self._flat(grads)[0], self._flat(ts)[0], r)]
            else:
                scaled = [self._scaled(g, t, r) for g, t, r in zip(grads, ts, rs)]
            for b, g in zip(self.b, scaled):
                b.assign(self.momentum * b + g)
        ret = []
        for i, (t, g, r) in enumerate(zip(ts, grads, rs)):
            g = self._scaled(g, t, r)
            if self.momentum:
                b = self._part(self.b, i)
                g = g + self.momentum * b if self.nesterov else b
            if not self.classic:
                g = g * r * self.lr
            if not self.pre_wd and self.wd > 0:
                t = t * (1.0 - self.wd * self.lr)
            ret.append(t - g)
        return ret, self.b


def SGD(
    params: list[Tensor],
    lr: float = 0.001,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    classic: bool = False,
    fused: bool | None = None,
) -> LARS:
    """Stochastic gradient descent as PyTorch's (dampening 0): g += wd*w; b = momentum*b + g;
    w -= lr * (g + momentum*b if nesterov else b)."""
    return LARS(params, lr, momentum, weight_decay, nesterov, classic, pre_wd=True, tcoef=0.0, fused=fused)


class LAMB(Optimizer):
    """LAMB (You et al. 2019): Adam moments with bias correction, decoupled weight decay, and a per-parameter trust
    ratio |w| / |update|; adam=True leaves the ratio out (that is AdamW)."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 0.001,
        b1: float = 0.9,
        b2: float = 0.999,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        adam: bool = False,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, fused)
        self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
        # b1**t and b2**t, shape (1,) and float32 whatever the parameters' dtype, as tinygrad's LAMB keeps them: they
        # are state (get_state_dict(opt) has "b1_t" and "b2_t", so a saved optimizer resumes its bias correction)
        self.b1_t = Tensor(np.ones(1, np.float32), dtype=dtypes.float32, device=self.device)
        self.b2_t = Tensor(np.ones(1, np.float32), dtype=dtypes.float32, device=self.device)
        self.m, self.v = self._new_state(), self._new_state()
        _realize_leaves(self.b1_t, self.b2_t)

    def _step(self, grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        # read b1**t back through the assign (the scheduler orders a reader of the assigned value after the write;
        # a kernel reading the old buffer through the lazy product is not ordered before it today)
        self.b1_t.assign(self.b1_t * self.b1)
        self.b2_t.assign(self.b2_t * self.b2)
        bc1, bc2 = 1.0 - self.b1_t, 1.0 - self.b2_t
        for m, v, g in zip(self.m, self.v, self._flat(grads)):
            m.assign(self.b1 * m + (1.0 - self.b1) * g)
            v.assign(self.b2 * v + (1.0 - self.b2) * (g * g))
        ret = []
        for i, p in enumerate(self.params):
            t = _value(p)
            up = (self._part(self.m, i) / bc1) / ((self._part(self.v, i) / bc2).sqrt() + self.eps)
            if self.wd:
                up = up + self.wd * t
            if not self.adam:
                r1, r2 = t.square().sum().sqrt(), up.square().sum().sqrt()
                up = up * (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)
            ret.append(t - self.lr * up)
        return ret, [self.b1_t, self.b2_t, *self.m, *self.v]


def AdamW(
    params: list[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    fused: bool | None = None,
) -> LAMB:
    """Adam with decoupled weight decay, as PyTorch's AdamW: w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)."""
    return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, fused=fused)


def Adam(
    params: list[Tensor],
    lr: float = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    fused: bool | None = None,
) -> LAMB:
    """Adam as PyTorch's (no weight decay): w -= lr * m_hat / (sqrt(v_hat) + eps)."""
    return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, fused=fused)


def newton_schulz(g: Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float) -> Tensor:
    """The quintic Newton-Schulz iteration of Muon (torch's `_zeropower_via_newtonschulz`): an approximate
    orthogonalization U S' V^T of a 2-D g = U S V^T. g is scaled to Frobenius norm 1 (divided by max(|g|, eps)), then
    ns_steps times X = a*X + (b*X X^T + c*(X X^T)^2) X, on the wide orientation (a tall g is transposed).
    Computed in float32 at least (torch computes it in bfloat16: the results agree to bfloat16's precision)."""
    a, b, c = ns_coefficients
    x = g.cast(least_upper_dtype(g.dtype, dtypes.float32))
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.square().sum().sqrt().maximum(eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return (x.T if tall else x).cast(g.dtype)


class Muon(Optimizer):
    """Muon (Jordan et al. 2024), as torch.optim.Muon (same arguments and defaults, 2-D parameters only):

        B = momentum*B + (1-momentum)*g                  (torch's buf.lerp_(g, 1 - momentum))
        u = (1-momentum)*g + momentum*B if nesterov else B
        w = w*(1 - lr*weight_decay) - lr*ratio * newton_schulz(u)

    ratio: sqrt(max(1, rows/cols)) ("original", the default) or 0.2*sqrt(max(rows, cols)) ("match_rms_adamw").
    The momenta are one flat state when fused, as the other optimizers; the orthogonalization is per parameter."""

    def __init__(
        self,
        params: list[Tensor],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = (3.4445, -4.7750, 2.0315),
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        fused: bool | None = None,
    ):
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            if not value >= 0.0:
                raise ArgumentError(f"Muon: {name} must be >= 0, got {value}")
        if adjust_lr_fn not in (None, "original", "match_rms_adamw"):
            raise ArgumentError(
                f"Muon: adjust_lr_fn must be None, 'original' or 'match_rms_adamw', got {adjust_lr_fn!r}"
            )
        if not (isinstance(ns_steps, int) and 0 <= ns_steps < 100):
            raise ArgumentError(f"Muon: ns_steps must be an int in [0, 100), got {ns_steps!r}")
        if len(ns_coefficients) != 3:
            raise ArgumentError(f"Muon: ns_coefficients must be 3 values (a, b, c), got {ns_coefficients!r}")
        super().__init__(params, lr, fused)
        if bad := [(i, p.shape) for i, p in enumerate(self.params) if p.ndim != 2]:
            raise ArgumentError(
                f"Muon only supports 2-D parameters, got parameter(s) (index, shape) {bad}: optimize biases, "
                f"embeddings and other parameters with another optimizer (AdamW)"
            )
        self.wd, self.momentum, self.nesterov, self.eps = weight_decay, momentum, nesterov, eps
        a, b, c = ns_coefficients
        self.ns_coefficients, self.ns_steps, self.adjust_lr_fn = (a, b, c), ns_steps, adjust_lr_fn
        self.b = self._new_state()

    def _ratio(self, shape: tuple[int, ...]) -> float:
        rows, cols = shape[:2]
        if self.adjust_lr_fn == "match_rms_adamw":
            return 0.2 * max(rows, cols) ** 0.5
        return max(1.0, rows / cols) ** 0.5

    def _step(self, grads: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        for b, g in zip(self.b, self._flat(grads)):
            b.assign(self.momentum * b + (1.0 - self.momentum) * g)
        ret = []
        for i, (p, g) in enumerate(zip(self.params, grads)):
            b = self._part(self.b, i)
            u = (1.0 - self.momentum) * g + self.momentum * b if self.nesterov else b
            o = newton_schulz(u, self.ns_coefficients, self.ns_steps, self.eps)
            t = _value(p)
            if self.wd:
                t = t * (1.0 - self.lr * self.wd)
            ret.append(t - (self.lr * self._ratio(p.shape)) * o)
        return ret, self.b


__all__ = ["Optimizer", "SGD", "LARS", "LAMB", "Adam", "AdamW", "Muon", "newton_schulz"]
