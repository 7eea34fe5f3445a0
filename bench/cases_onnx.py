"""ONNX models: zeptograd's OnnxRunner against onnxruntime (CPU provider, the same thread count), one inference per
call with the input already in memory and the outputs read back as numpy. Rates are inferences per second.

    onnx_squeezenet   the onnx package's light SqueezeNet 1.0 (batch 1, 3x224x224), a file of its backend tests
    onnx_shufflenet   the onnx package's light ShuffleNet (batch 1, 3x224x224)

The light models take their weights from ConstantOfShape (that is why the files are small): they measure the
runner's per-call overhead and its kernels on constant weights, not a trained network (bench/onnx_speed.py runs
random-weight ResNet-50 and SqueezeNet). Quick mode (--quick) runs a tiny conv-relu-pool-gemm model built in
memory instead of the file, so the harness test stays fast. Without the onnx package, onnxruntime or the model
file the case reports n/a and says why. Registered in bench/run.py's CASES (`**ONNX_CASES`); like the other case
modules, it returns Spec and does not import bench.run.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from bench.spec import Spec, threads

LIGHT_MODELS = {"onnx_squeezenet": "squeezenet", "onnx_shufflenet": "shufflenet"}


def light_model_path(name: str) -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


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


def _light(name: str) -> tuple[Any, dict[str, np.ndarray]]:
    import onnx
    from onnx.backend.test.runner import Runner

    model = onnx.load(light_model_path(name))
    init = {t.name for t in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in init)
    return model, {inp.name: Runner.generate_dummy_data(inp, seed=0, name=name, random=False)}


def _not_available(why: str) -> Spec:
    return Spec({"zeptograd": None, "onnxruntime": None}, "rate", note=f"n/a: {why}")


def _case_onnx(name: str) -> Callable[[bool], Spec]:
    def case(q: bool) -> Spec:
        try:
            import onnx  # noqa: F401
        except ImportError:
            return _not_available("pip install zeptograd[onnx] (the onnx package)")
        if not q and not os.path.exists(light_model_path(name)):
            return _not_available(f"{light_model_path(name)} is missing (the onnx wheel ships it)")
        from zeptograd import Tensor
        from zeptograd.nn.onnx import OnnxRunner

        model, feeds = tiny_model() if q else _light(name)
        runner = OnnxRunner(model)
        zfeeds = {k: Tensor(v).realize() for k, v in feeds.items()}

        def zg():
            return [v.numpy() for v in runner(zfeeds).values()]

        ort_run, why_not = None, ""
        try:
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads, opts.inter_op_num_threads = threads(), 1
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            ort_run = lambda: sess.run(None, feeds)  # noqa: E731
        except ImportError:
            why_not = "; onnxruntime: n/a (pip install onnxruntime)"
        shape = "x".join(str(d) for d in next(iter(feeds.values())).shape)
        what = "tiny conv-relu-pool-gemm (--quick)" if q else f"light_{name}.onnx"
        return Spec(
            {"zeptograd": zg, "onnxruntime": ort_run}, "rate", note=f"{what}, input {shape}, inferences/s{why_not}"
        )

    return case


ONNX_CASES: dict[str, Callable[[bool], Spec]] = {case: _case_onnx(model) for case, model in LIGHT_MODELS.items()}
