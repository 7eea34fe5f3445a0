"""Export a small torch image classifier to ONNX, run it with zeptograd's OnnxRunner, compare with torch.

    PYTHONPATH=. python examples/onnx_classify.py [--batch 8] [--runs 10]

Needs torch and onnx (`pip install 'zeptograd[onnx]' torch`). The export uses torch.onnx.export(..., dynamo=False):
the default dynamo exporter needs onnxscript. The batch dimension is exported as symbolic (dim_param "batch"), so
one runner serves every batch size.
"""

import argparse
import io
import time
import warnings

import numpy as np


def build_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(32, 10), nn.Softmax(-1),
    ).eval()  # fmt: skip


def export(model, x) -> bytes:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():  # dynamo=False is the TorchScript exporter, deprecated but needs no onnxscript
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, (x,), buf, input_names=["image"], output_names=["probs"], dynamo=False,
            dynamic_axes={"image": {0: "batch"}, "probs": {0: "batch"}},
        )  # fmt: skip
    return buf.getvalue()


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(argv=None) -> dict:
    import torch

    from zeptograd.nn.onnx import OnnxRunner

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args(argv)
    model = build_model()
    x = torch.randn(args.batch, 3, 32, 32)
    runner = OnnxRunner(export(model, torch.randn(1, 3, 32, 32)))  # exported at batch 1, run at args.batch
    with torch.no_grad():
        ref = model(x).numpy()
    xn = x.numpy()
    t = time.perf_counter()
    out = runner({"image": xn})["probs"].numpy()
    first = time.perf_counter() - t
    diff = float(np.abs(out - ref).max())
    zg = median_time(lambda: runner({"image": xn})["probs"].numpy(), args.runs)
    with torch.no_grad():
        tt = median_time(lambda: model(x), args.runs)
    print(f"max |zeptograd - torch| = {diff:.2e} (batch {args.batch}, top-1 agrees: "
          f"{bool((out.argmax(1) == ref.argmax(1)).all())})")  # fmt: skip
    print(f"zeptograd: first call {first * 1e3:.0f} ms (build + schedule + compile), then {zg * 1e3:.2f} ms median")
    print(f"torch eager: {tt * 1e3:.2f} ms median ({zg / tt:.2f}x)")
    return {"max_diff": diff, "zeptograd_s": zg, "torch_s": tt}


if __name__ == "__main__":
    main()
