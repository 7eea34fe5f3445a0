"""ONNX models with random weights: zeptograd's OnnxRunner against onnxruntime (CPU provider) and torch eager, the
same thread count (THREADS) for all three, one inference per call with the input already in memory and the output
read back. Rates are inferences per second.

    onnx_resnet50_b1       ResNet-50, input 1x3x224x224
    onnx_resnet50_b16      ResNet-50, batch 16
    onnx_squeezenet_b1     SqueezeNet 1.1, batch 1
    onnx_squeezenet_b16    SqueezeNet 1.1, batch 16
    onnx_densenet121_b1    DenseNet-121, batch 1
    onnx_resnet50_first    a fresh process with an empty kernel cache: load the file, parse, build, schedule, compile
                           and run one batch-1 inference (onnxruntime: load the session and run once)

The architectures are bench/onnx_speed.py's torch modules (seeded random initialization, eval mode), exported once
per process with torch.onnx.export(dynamo=False) and a symbolic batch, so the three runtimes run the same weights.
The onnx wheel's light models are not rows: their weights come from ConstantOfShape, so they are conformance cases
(tests/nn/test_onnx.py), not benchmarks. Quick mode (--quick) runs a tiny conv-relu-pool-gemm model built in memory
instead, so the harness test stays fast. Without the onnx package or torch a row reports n/a and says why; without
onnxruntime its column is n/a. Registered in bench/run.py's CASES (`**ONNX_CASES`); like the other case modules, it
returns Spec and does not import bench.run.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable

import numpy as np

from bench.spec import Spec, threads, torch_or_none

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = {  # case: (architecture, batch)
    "onnx_resnet50_b1": ("resnet50", 1),
    "onnx_resnet50_b16": ("resnet50", 16),
    "onnx_squeezenet_b1": ("squeezenet", 1),
    "onnx_squeezenet_b16": ("squeezenet", 16),
    "onnx_densenet121_b1": ("densenet121", 1),
}
_exported: dict[str, tuple[bytes, Any]] = {}  # architecture: (the ONNX file's bytes, the torch module), per process


def tiny_model() -> tuple[Any, dict[str, np.ndarray]]:
    """A conv(3->4, 3x3)-relu-global-pool-gemm model on a (1, 3, 8, 8) input, built with onnx.helper."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3), dtype=np.float32) * 0.2, "w")
    fc = numpy_helper.from_array(rng.standard_normal((4, 5), dtype=np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [w, fc],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # onnxruntime 1.2x reads IR versions up to 10
    return model, {"x": rng.standard_normal((1, 3, 8, 8), dtype=np.float32)}


def exported(arch: str) -> tuple[bytes, Any]:
    """The architecture's ONNX file (random weights, torch seeded with 0) and the torch module it came from."""
    if arch not in _exported:
        import torch

        from bench.onnx_speed import export, torch_models

        torch.manual_seed(0)
        module = torch_models()[arch]().eval()
        _exported[arch] = (export(module, torch.randn(1, 3, 224, 224)), module)
    return _exported[arch]


def _not_available(why: str, peers: tuple[str, ...] = ("onnxruntime", "torch")) -> Spec:
    return Spec({"zeptograd": None, **dict.fromkeys(peers)}, "rate", note=f"n/a: {why}")


def _missing() -> str:
    """Why the rows can't run here ("" when they can): the onnx package and torch (it builds the models)."""
    for module, why in (("onnx", "pip install zeptograd[onnx] (the onnx package)"), ("torch", "torch builds them")):
        try:
            __import__(module)
        except ImportError:
            return why
    return ""


def _ort_session(data: bytes) -> tuple[Any, str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "; onnxruntime: n/a (pip install onnxruntime)"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads(), 1
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]), ""


def _case_model(arch: str, batch: int) -> Callable[[bool], Spec]:
    def case(q: bool) -> Spec:
        why = _missing()
        if why:
            return _not_available(why)
        from zeptograd import Tensor
        from zeptograd.nn.onnx import OnnxRunner

        if q:
            proto, feeds = tiny_model()
            data, module = proto.SerializeToString(), None
        else:
            data, module = exported(arch)
            feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)}
        runner = OnnxRunner(data)
        zfeeds = {k: Tensor(v).realize() for k, v in feeds.items()}

        def zg():
            return [v.numpy() for v in runner(zfeeds).values()]

        sess, why_not = _ort_session(data)
        torch_run = None
        if module is not None and (torch := torch_or_none()) is not None:
            xt = torch.from_numpy(feeds["x"])

            def torch_run():
                with torch.no_grad():
                    return module(xt).numpy()

        shape = "x".join(str(d) for d in next(iter(feeds.values())).shape)
        what = "tiny conv-relu-pool-gemm (--quick)" if q else f"{arch}, random weights"
        ort_run = None if sess is None else lambda: sess.run(None, feeds)
        return Spec(
            {"zeptograd": zg, "onnxruntime": ort_run, "torch": torch_run},
            "rate",
            note=f"{what}, input {shape}, inferences/s{why_not}",
            warmups=3,  # the runner builds its template at the second call and captures its kernels at the third
        )

    return case


ZEPTOGRAD_FIRST = """
import sys, numpy as np
from zeptograd.nn.onnx import OnnxRunner
runner = OnnxRunner(sys.argv[1])
shape = [d if isinstance(d, int) and d > 0 else 1 for d in next(iter(runner.inputs.values())).shape]
print(next(iter(runner({next(iter(runner.inputs)): np.ones(shape, np.float32)}).values())).numpy().sum())
"""
ORT_FIRST = """
import sys, numpy as np, onnxruntime as ort
opts = ort.SessionOptions()
opts.intra_op_num_threads, opts.inter_op_num_threads = int(sys.argv[2]), 1
sess = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
print(sess.run(None, {inp.name: np.ones([d if isinstance(d, int) else 1 for d in inp.shape], np.float32)})[0].sum())
"""


def _first_process(code: str, path: str, empty_cache: bool) -> Callable[[], None]:
    """A runner: one fresh process running `code` on the model file (an empty kernel cache per run if asked)."""

    def run():
        env = dict(os.environ)
        env.pop("DEV", None)
        if empty_cache:
            env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="zg_onnx_first_")
            atexit.register(shutil.rmtree, env["XDG_CACHE_HOME"], True)
        cmd = [sys.executable, "-c", code, path, str(threads())]
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)

    return run


def case_first(q: bool) -> Spec:
    why = _missing()
    if why:
        return _not_available(why, ("onnxruntime",))
    data = tiny_model()[0].SerializeToString() if q else exported("resnet50")[0]
    tmp = tempfile.mkdtemp(prefix="zg_onnx_model_")
    atexit.register(shutil.rmtree, tmp, True)
    path = os.path.join(tmp, "model.onnx")
    with open(path, "wb") as f:
        f.write(data)
    has_ort = _ort_session(data)[0] is not None
    what = "tiny conv-relu-pool-gemm (--quick)" if q else "resnet50 batch 1"
    return Spec(
        {
            "zeptograd": _first_process(ZEPTOGRAD_FIRST, path, empty_cache=True),
            "onnxruntime": _first_process(ORT_FIRST, path, empty_cache=False) if has_ort else None,
        },
        "latency",
        note=f"{what}: a fresh process loads the file and runs once, empty kernel cache (python start included)",
        runs=3,
    )


ONNX_CASES: dict[str, Callable[[bool], Spec]] = {
    **{case: _case_model(arch, batch) for case, (arch, batch) in ROWS.items()},
    "onnx_resnet50_first": case_first,
}
