"""Training-step cases: a whole step (forward, backward, optimizer update) per call, zeptograd (zeptograd.nn, the
step under TinyJit) against torch (torch.nn, the same model and optimizer). Rates are steps per second.

    mlp_train     an MLP 784-256-10 with Adam, batch 128 (quick: 32-16-10, batch 8)
    digits_train  examples/train_digits.py's convnet (conv-BN-relu-pool twice, linear) with Adam, batch 64
    mlp_train_shard2  mlp_train with each batch split over CPU:0 and CPU:1 (Tensor.shard), against one device

Registered in bench/run.py's CASES (`**TRAIN_CASES`). The case functions return an object with Spec's fields, so
this module does not import bench.run (it can be imported from it).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bench.spec import Spec, torch_or_none


def _zg_step(
    model: Callable, params: list, x: np.ndarray, y: np.ndarray, devices: tuple[str, ...] = ()
) -> Callable[[], Any]:
    """devices: data parallel over them (Tensor.shard): the weights replicated, the batch split."""
    from zeptograd import Tensor, TinyJit, nn

    for p in params if devices else ():
        p.shard_(devices).realize()
    opt = nn.optim.Adam(params, lr=1e-3)

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
            step(zx, zy)

    return run


def _torch_step(t, model, x: np.ndarray, y: np.ndarray) -> Callable[[], Any]:
    opt = t.optim.Adam(model.parameters(), lr=1e-3)
    tx, ty = t.from_numpy(x), t.from_numpy(y.astype(np.int64))
    model.train()

    def run():
        opt.zero_grad()
        loss = t.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()

    return run


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
        note=f"mlp_train's step, batch {bs} split over CPU:0,CPU:1 (Tensor.shard); '1 device': the same on CPU",
    )


TRAIN_CASES: dict[str, Callable[[bool], Spec]] = {
    "mlp_train": case_mlp_train,
    "digits_train": case_digits_train,
    "mlp_train_shard2": case_mlp_train_shard2,
}
