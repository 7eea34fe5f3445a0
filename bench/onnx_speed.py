"""ONNX models with random weights: zeptograd's OnnxRunner against onnxruntime (CPU provider) and torch eager.

    PYTHONPATH=. python -m bench.onnx_speed [--models resnet50,squeezenet] [--batches 1,16] [--runs 5] [--threads 2]

The architectures are written here in torch (torchvision's ResNet-50, SqueezeNet 1.1 and DenseNet-121, seeded random
initialization, eval mode) and exported with torch.onnx.export(dynamo=False) with a symbolic batch, so all three
run the same weights. Per model and batch: zeptograd's first call (parse + graph build + schedule + compile; the
kernel cache is whatever the process has, so run it in a fresh process for an empty cache), then the median of
`--runs` calls of each runtime, measured in the same process one after the other. onnxruntime and torch get the same
thread count. The machine's load moves absolute numbers: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import io
import time
import warnings

import numpy as np


def torch_models():
    """{name: a function building the architecture in torch}: torchvision's ResNet-50, SqueezeNet 1.1 and
    DenseNet-121, written out here (torchvision is not a dependency); seed torch before building for fixed weights."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout),
            )  # fmt: skip
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    def resnet50():
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]  # fmt: skip
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
        return nn.Sequential(*layers)

    class Fire(nn.Module):
        def __init__(self, cin, s, e):
            super().__init__()
            self.squeeze = nn.Sequential(nn.Conv2d(cin, s, 1), nn.ReLU())
            self.e1 = nn.Sequential(nn.Conv2d(s, e, 1), nn.ReLU())
            self.e3 = nn.Sequential(nn.Conv2d(s, e, 3, padding=1), nn.ReLU())

        def forward(self, x):
            x = self.squeeze(x)
            return torch.cat([self.e1(x), self.e3(x)], 1)

    def squeezenet():
        return nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
            nn.Dropout(0.5), nn.Conv2d(512, 1000, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip

    class DenseLayer(nn.Module):
        def __init__(self, cin, growth):
            super().__init__()
            self.body = nn.Sequential(
                nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, 4 * growth, 1, bias=False),
                nn.BatchNorm2d(4 * growth), nn.ReLU(), nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False),
            )  # fmt: skip

        def forward(self, x):
            return torch.cat([x, self.body(x)], 1)

    def densenet121():
        layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]  # fmt: skip
        c, growth = 64, 32
        for i, n in enumerate((6, 12, 24, 16)):
            for _ in range(n):
                layers.append(DenseLayer(c, growth))
                c += growth
            if i < 3:  # a transition halves the channels and the resolution
                layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
                c //= 2
        layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000)]
        return nn.Sequential(*layers)

    return {"resnet50": resnet50, "squeezenet": squeezenet, "densenet121": densenet121}


def export(model, x) -> bytes:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model, (x,), buf, input_names=["x"], output_names=["y"], dynamo=False,
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )  # fmt: skip
    return buf.getvalue()


def _median(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def main(argv=None) -> list[dict]:
    import onnxruntime as ort
    import torch

    from zeptograd.nn.onnx import OnnxRunner

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,squeezenet")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        model = torch_models()[name]().eval()
        data = export(model, torch.randn(1, 3, 224, 224))
        t = time.perf_counter()
        runner = OnnxRunner(data)
        load_s = time.perf_counter() - t
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        for bs in (int(b) for b in args.batches.split(",")):
            x = np.random.default_rng(bs).standard_normal((bs, 3, 224, 224)).astype(np.float32)
            t = time.perf_counter()
            out = runner({"x": x})["y"].numpy()
            first_s = time.perf_counter() - t
            ref = sess.run(None, {"x": x})[0]
            diff = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-12))
            zg = _median(lambda: runner({"x": x})["y"].numpy(), args.runs)
            ort_s = _median(lambda: sess.run(None, {"x": x}), args.runs)
            xt = torch.from_numpy(x)
            with torch.no_grad():
                th = _median(lambda: model(xt), args.runs)
            row = {"model": name, "batch": bs, "load_s": load_s, "first_s": first_s, "zeptograd_ms": zg * 1e3,
                   "onnxruntime_ms": ort_s * 1e3, "torch_ms": th * 1e3, "rel_diff_vs_ort": diff}  # fmt: skip
            rows.append(row)
            print(f"{name:10s} batch {bs:2d}: zeptograd {zg * 1e3:8.1f} ms  onnxruntime {ort_s * 1e3:8.1f} ms "
                  f"({zg / ort_s:5.2f}x)  torch {th * 1e3:8.1f} ms ({zg / th:5.2f}x)  first call {first_s:6.1f} s "
                  f"(load {load_s:.2f} s)  max rel diff vs ort {diff:.1e}", flush=True)  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
