"""Training-step cases: a whole step (forward, backward, optimizer update) per call, zeptograd (zeptograd.nn, the
step under TinyJit) against torch (torch.nn, the same model and optimizer). Rates are steps per second.

    mlp_train     an MLP 784-256-10 with Adam, batch 128 (quick: 32-16-10, batch 8)
    digits_train  examples/train_digits.py's convnet (conv-BN-relu-pool twice, linear) with Adam, batch 64
    mlp_train_shard2  mlp_train with each batch split over CPU:0 and CPU:1 (Tensor.shard), against one device
    resnet_block_train  a ResNet basic block (64 channels, batch 32, 32x32) + avg pool + Linear, SGD with momentum
    gpt_tiny_train    examples/gpt_tiny.py's step with its defaults (its GPT and AdamW; torch: the same in torch.nn)

resnet_block_train and gpt_tiny_train start torch from zeptograd's initial weights, so the two sides' losses can be
compared (tests/test_bench.py does, at --quick sizes).

Registered in bench/run.py's CASES (`**TRAIN_CASES`). The case functions return an object with Spec's fields, so
this module does not import bench.run (it can be imported from it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bench.spec import Spec, torch_or_none


def _zg_step(
    model: Callable,
    params: list,
    x: np.ndarray,
    y: np.ndarray,
    devices: tuple[str, ...] = (),
    optimizer: Callable[[list], Any] | None = None,
) -> Callable[[], Any]:
    """The step under TinyJit on a fixed batch; the runner returns the loss (before the update). devices: data
    parallel over them (Tensor.shard): the weights replicated, the batch split. optimizer: params -> an optimizer
    (default Adam, lr 1e-3)."""
    from zeptograd import Tensor, TinyJit, nn

    for p in params if devices else ():
        p.shard_(devices).realize()
    opt = optimizer(params) if optimizer else nn.optim.Adam(params, lr=1e-3)

    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(xb).sparse_categorical_crossentropy(yb)
        loss.backward()
        loss = loss.detach()
        opt.step(loss)
        return loss

    zx, zy = Tensor(x), Tensor(y)
    if devices:
        zx, zy = zx.shard(devices, axis=0), zy.shard(devices, axis=0)
    zx, zy = zx.realize(), zy.realize()

    def run():
        with Tensor.train():
            return step(zx, zy)

    return run


def _torch_step(t, model, x: np.ndarray, y: np.ndarray, optimizer: Callable | None = None) -> Callable[[], Any]:
    """torch's step on a fixed batch: cross-entropy over the last axis of the model's output (a (batch, t, vocab)
    output is flattened to (batch*t, vocab), as zeptograd's sparse_categorical_crossentropy reads it); the runner
    returns the loss. optimizer: parameters -> an optimizer (default Adam, lr 1e-3)."""
    opt = optimizer(model.parameters()) if optimizer else t.optim.Adam(model.parameters(), lr=1e-3)
    tx, ty = t.from_numpy(x), t.from_numpy(y.astype(np.int64))
    model.train()

    def run():
        opt.zero_grad()
        out = model(tx)
        loss = t.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), ty.reshape(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    return run


def _copy_weights(t, zg_model: Any, tmodel) -> None:
    """Give torch's model zeptograd's initial weights and buffers: the two models name theirs alike."""
    from zeptograd.nn.state import get_state_dict

    zsd = get_state_dict(zg_model)
    tsd = tmodel.state_dict()
    if set(zsd) != set(tsd):
        raise RuntimeError(f"the models' names differ: {sorted(set(zsd) ^ set(tsd))}")
    with t.no_grad():
        for name, v in tsd.items():
            v.copy_(t.from_numpy(zsd[name].numpy()).reshape(v.shape))


def _mlp_train_setup(q: bool):
    """mlp_train's sizes, batch and labels, and torch's step on them (None without torch)."""
    d_in, d_h, bs = (32, 16, 8) if q else (784, 256, 128)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((bs, d_in), dtype=np.float32)
    y = rng.integers(0, 10, bs).astype(np.int32)
    t = torch_or_none()
    tstep = None
    if t is not None:
        tmodel = t.nn.Sequential(t.nn.Linear(d_in, d_h), t.nn.ReLU(), t.nn.Linear(d_h, 10))
        tstep = _torch_step(t, tmodel, x, y)
    return d_in, d_h, bs, x, y, tstep


def case_mlp_train(q: bool) -> Spec:
    from zeptograd import nn
    from zeptograd.nn.state import get_parameters

    d_in, d_h, bs, x, y, tstep = _mlp_train_setup(q)
    layers = [nn.Linear(d_in, d_h), lambda v: v.relu(), nn.Linear(d_h, 10)]
    zg = _zg_step(lambda v: v.sequential(layers), get_parameters(layers), x, y)
    return Spec(
        {"zeptograd": zg, "numpy": None, "torch": tstep},
        "rate",
        warmups=2,  # the TinyJit step captures on its second call
        note=f"MLP {d_in}-{d_h}-10 batch {bs}, Adam, TinyJit step; numpy: n/a",
    )


def case_digits_train(q: bool) -> Spec:
    from zeptograd import Tensor, nn
    from zeptograd.nn.state import get_parameters

    bs = 8 if q else 64
    rng = np.random.default_rng(0)
    x = rng.random((bs, 1, 8, 8), dtype=np.float32)
    y = rng.integers(0, 10, bs).astype(np.int32)
    layers = [
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        Tensor.relu,
        Tensor.max_pool2d,
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        Tensor.relu,
        Tensor.max_pool2d,
        lambda v: v.flatten(1),
        nn.Linear(128, 10),
    ]
    zg = _zg_step(lambda v: v.sequential(layers), get_parameters(layers), x, y)
    t = torch_or_none()
    tstep = None
    if t is not None:
        m = t.nn
        tmodel = m.Sequential(
            m.Conv2d(1, 16, 3, padding=1),
            m.BatchNorm2d(16),
            m.ReLU(),
            m.MaxPool2d(2),
            m.Conv2d(16, 32, 3, padding=1),
            m.BatchNorm2d(32),
            m.ReLU(),
            m.MaxPool2d(2),
            m.Flatten(),
            m.Linear(128, 10),
        )
        tstep = _torch_step(t, tmodel, x, y)
    return Spec(
        {"zeptograd": zg, "numpy": None, "torch": tstep},
        "rate",
        warmups=2,  # the TinyJit step captures on its second call
        note=f"examples/train_digits.py's convnet, batch {bs}, Adam, TinyJit step; numpy: n/a",
    )


def case_mlp_train_shard2(q: bool) -> Spec:
    """mlp_train's step with every batch split over CPU:0 and CPU:1 (Tensor.shard: weights replicated, gradients
    all-reduced in the schedule), against the same step on one device in this process: what sharding costs where the
    devices share the cores (docs/distributed.md)."""
    from zeptograd import nn
    from zeptograd.nn.state import get_parameters

    d_in, d_h, bs, x, y, tstep = _mlp_train_setup(q)
    steps = {}
    for name, devices in (("zeptograd", ("CPU:0", "CPU:1")), ("1 device", ())):
        layers = [nn.Linear(d_in, d_h), lambda v: v.relu(), nn.Linear(d_h, 10)]
        steps[name] = _zg_step(lambda v, layers=layers: v.sequential(layers), get_parameters(layers), x, y, devices)
    return Spec(
        {"zeptograd": steps["zeptograd"], "numpy": None, "torch": tstep, "1 device": steps["1 device"]},
        "rate",
        warmups=2,  # the TinyJit step captures on its second call
        note=f"mlp_train's step, batch {bs} split over CPU:0,CPU:1 (Tensor.shard); '1 device': the same on CPU",
    )


class _ZgBasicBlock:
    """A ResNet basic block (conv3x3-BN-relu-conv3x3-BN, the input added back, relu; convolutions without bias, as
    torchvision's), then a global average pool and a Linear(c, 10) head for a loss."""

    def __init__(self, c: int):
        from zeptograd import nn

        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, 10)

    def __call__(self, x):
        h = self.bn1(self.conv1(x)).relu()
        h = (self.bn2(self.conv2(h)) + x).relu()
        return self.fc(h.mean(axis=(2, 3)))


def _torch_basic_block(t, c: int):
    m = t.nn

    class BasicBlock(m.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = m.Conv2d(c, c, 3, padding=1, bias=False), m.BatchNorm2d(c)
            self.conv2, self.bn2 = m.Conv2d(c, c, 3, padding=1, bias=False), m.BatchNorm2d(c)
            self.fc = m.Linear(c, 10)

        def forward(self, x):
            h = t.relu(self.bn1(self.conv1(x)))
            h = t.relu(self.bn2(self.conv2(h)) + x)
            return self.fc(h.mean((2, 3)))

    return BasicBlock()


def case_resnet_block_train(q: bool) -> Spec:
    """A ResNet basic block's training step with SGD (lr 0.01, momentum 0.9), torch starting from zeptograd's
    initial weights (tests/test_bench.py compares the two sides' losses)."""
    from zeptograd import nn
    from zeptograd.nn.state import get_parameters

    bs, c, hw = (4, 8, 8) if q else (32, 64, 32)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((bs, c, hw, hw), dtype=np.float32)
    y = rng.integers(0, 10, bs).astype(np.int32)
    model = _ZgBasicBlock(c)
    t = torch_or_none()
    tstep = None
    if t is not None:
        tmodel = _torch_basic_block(t, c)
        _copy_weights(t, model, tmodel)
        tstep = _torch_step(t, tmodel, x, y, lambda ps: t.optim.SGD(ps, lr=0.01, momentum=0.9))
    zg = _zg_step(model, get_parameters(model), x, y, optimizer=lambda ps: nn.optim.SGD(ps, lr=0.01, momentum=0.9))
    return Spec(
        {"zeptograd": zg, "numpy": None, "torch": tstep},
        "rate",
        warmups=2,  # the TinyJit step captures on its second call
        note=f"ResNet basic block {c} ch, batch {bs}, {hw}x{hw}, + avg pool, Linear({c},10); SGD momentum, TinyJit",
    )


def _gpt_tiny_module():
    """examples/gpt_tiny.py as a module (examples/ is not a package)."""
    import importlib.util
    import os
    import sys

    if "gpt_tiny" in sys.modules:
        return sys.modules["gpt_tiny"]
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "gpt_tiny.py")
    spec = importlib.util.spec_from_file_location("gpt_tiny", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpt_tiny"] = mod
    spec.loader.exec_module(mod)
    return mod


def _torch_gpt(t, vocab: int, ctx: int, dim: int, heads: int, layers: int):
    """examples/gpt_tiny.py's GPT in torch.nn, its parameters named as the example's (tanh GELU, as Tensor.gelu)."""
    m, f = t.nn, t.nn.functional

    class Block(m.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = m.LayerNorm(dim), m.LayerNorm(dim)
            self.qkv, self.proj = m.Linear(dim, 3 * dim), m.Linear(dim, dim)
            self.fc1, self.fc2 = m.Linear(dim, 4 * dim), m.Linear(4 * dim, dim)

        def forward(self, x):
            b, n, c = x.shape
            qkv = self.qkv(self.ln1(x)).reshape(b, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
            att = f.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, n, c))
            return x + self.fc2(f.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(m.Module):
        def __init__(self):
            super().__init__()
            self.tok_emb, self.pos_emb = m.Embedding(vocab, dim), m.Embedding(ctx, dim)
            self.blocks = m.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.head = m.LayerNorm(dim), m.Linear(dim, vocab)

        def forward(self, idx):
            x = self.tok_emb(idx) + self.pos_emb(t.arange(idx.shape[1]).reshape(1, -1))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))

    return GPT()


def case_gpt_tiny_train(q: bool) -> Spec:
    """examples/gpt_tiny.py's training step (its GPT and its make_train_step: AdamW, lr 3e-3, weight decay 0.01)
    with the example's defaults, on one fixed batch of windows of its text; torch: the same architecture in
    torch.nn with zeptograd's initial weights and torch's AdamW."""
    from zeptograd import Tensor, TinyJit

    gpt = _gpt_tiny_module()
    bs, ctx, dim, heads, layers, lr = (2, 8, 16, 2, 1, 3e-3) if q else (16, 32, 64, 4, 2, 3e-3)  # the defaults
    _, chars, data = gpt.load_corpus()
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(data) - ctx - 1, bs)
    x = np.stack([data[s : s + ctx] for s in starts])
    y = np.stack([data[s + 1 : s + ctx + 1] for s in starts])
    model = gpt.GPT(len(chars), ctx, dim, heads, layers)
    _, train_step = gpt.make_train_step(model, lr)
    step = TinyJit(train_step)
    zx, zy = Tensor(x).realize(), Tensor(y).realize()

    def zg():
        with Tensor.train():
            return step(zx, zy)

    t = torch_or_none()
    tstep = None
    if t is not None:
        tmodel = _torch_gpt(t, len(chars), ctx, dim, heads, layers)
        _copy_weights(t, model, tmodel)
        tstep = _torch_step(t, tmodel, x, y, lambda ps: t.optim.AdamW(ps, lr=lr, weight_decay=0.01))
    return Spec(
        {"zeptograd": zg, "numpy": None, "torch": tstep},
        "rate",
        warmups=2,  # the TinyJit step captures on its second call
        note=f"examples/gpt_tiny.py: batch {bs}, ctx {ctx}, dim {dim}, {heads} heads, {layers} layers, AdamW; TinyJit",
    )


TRAIN_CASES: dict[str, Callable[[bool], Spec]] = {
    "mlp_train": case_mlp_train,
    "digits_train": case_digits_train,
    "mlp_train_shard2": case_mlp_train_shard2,
    "resnet_block_train": case_resnet_block_train,
    "gpt_tiny_train": case_gpt_tiny_train,
}
