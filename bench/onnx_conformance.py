"""The onnx package's backend node cases through OnnxRunner: pass / fail / unsupported counts and a summary line.

    PYTHONPATH=. python -m bench.onnx_conformance [-k substring] [-v] [--timeout 60] [--json out.json]

A case passes when every data set's outputs match the reference: same shapes and dtypes, values within the case's
rtol/atol (np.testing.assert_allclose, as onnx's own backend runner; bfloat16 with two ulps). "unsupported" is a
case the runner refuses with UnsupportedOpError (an op, attribute value or type it has no implementation for);
anything else that goes wrong is a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import sys
import time
import warnings
from collections import Counter

import numpy as np


def collect_cases():
    """The node cases (generating them takes ~15 s of CPU: they are cached, per onnx version, as a pickle)."""
    import onnx

    cache = os.path.join(os.path.expanduser("~"), ".cache", "zeptograd", f"onnx_node_cases_{onnx.__version__}.pkl")
    if os.path.exists(cache):
        with open(cache, "rb") as f:
            return pickle.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases(None)
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache + ".tmp", "wb") as f:
        pickle.dump(cases, f)
    os.replace(cache + ".tmp", cache)
    return cases


def _as_numpy(v):
    from zeptograd import Tensor

    if isinstance(v, Tensor):
        return v.numpy()
    if isinstance(v, list):
        return [_as_numpy(x) for x in v]
    return v


def assert_similar(ref, out, rtol: float, atol: float) -> None:
    """onnx's backend comparison: shapes, dtypes, then values (strings exactly)."""
    if isinstance(ref, (list, tuple)):
        if not isinstance(out, (list, tuple)) or len(out) != len(ref):
            raise AssertionError(f"expected a sequence of {len(ref)}, got {type(out).__name__}")
        for r, o in zip(ref, out):
            assert_similar(r, o, rtol, atol)
        return
    if type(ref).__name__ == "TensorProto":
        from onnx import numpy_helper

        ref = numpy_helper.to_array(ref)
    if ref is None:
        if out is not None:
            raise AssertionError("expected an empty optional")
        return
    out = np.asarray(out)
    ref = np.asarray(ref)
    if out.shape != ref.shape:
        raise AssertionError(f"shape {out.shape} != expected {ref.shape}")
    if ref.dtype == object:
        np.testing.assert_array_equal(out, ref)
        return
    if out.dtype != ref.dtype:
        raise AssertionError(f"dtype {out.dtype} != expected {ref.dtype}")
    if out.dtype.kind == "V" or out.dtype.name not in np.sctypeDict:  # ml_dtypes types: compare as float32
        if out.dtype.name == "bfloat16":
            rtol = max(rtol, 2**-6)
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


def _tensors(vals) -> list:
    from zeptograd import Tensor

    out = []
    for v in vals:
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, list):
            out += _tensors(v)
    return out


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame):
    raise _Timeout()


def run_case(case, timeout: float = 0) -> tuple[str, str]:
    """('pass' | 'fail' | 'unsupported', detail) for one node case."""
    from zeptograd import Tensor
    from zeptograd.nn.onnx import OnnxRunner, UnsupportedOpError

    if timeout:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        runner = OnnxRunner(case.model)
        names = [vi.name for vi in case.model.graph.input]
        out_names = [vi.name for vi in case.model.graph.output]
        for inputs, refs in case.data_sets:
            outs = runner(dict(zip(names, inputs)))
            lazy = _tensors(outs.values())
            if lazy:
                Tensor.realize(*lazy)  # one schedule for all outputs
            got = [_as_numpy(outs[n]) for n in out_names]
            if len(got) != len(refs):
                return "fail", f"{len(got)} outputs, expected {len(refs)}"
            for i, (g, r) in enumerate(zip(got, refs)):
                try:
                    assert_similar(r, g, case.rtol, case.atol)
                except AssertionError as e:
                    return "fail", f"output {i}: {str(e).strip().splitlines()[0:6]}"
        return "pass", ""
    except UnsupportedOpError as e:
        return "unsupported", str(e)
    except _Timeout:
        return "fail", f"timeout after {timeout} s"
    except Exception as e:  # noqa: BLE001 -- any error is a failed case, reported by name
        return "fail", f"{type(e).__name__}: {str(e)[:300]}"
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    ap.add_argument("-v", action="store_true", help="print every non-passing case with its reason")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it counts as failed")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th case starting at i (parallel runs)")
    ap.add_argument("--json", default="", help="write {case: [status, detail]} here")
    args = ap.parse_args(argv)
    i, n = (int(v) for v in args.shard.split("/"))
    cases = [c for c in collect_cases() if args.k in c.name][i::n]
    results: dict[str, tuple[str, str]] = {}
    t0 = time.perf_counter()
    for c in cases:
        status, detail = run_case(c, args.timeout)
        results[c.name] = (status, detail)
        if args.v and status != "pass":
            print(f"{status:11s} {c.name}: {detail}", flush=True)
    counts = Counter(s for s, _ in results.values())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    import onnx

    print(
        f"onnx {onnx.__version__} node cases: {counts['pass']} / {len(cases)} pass "
        f"({100 * counts['pass'] / max(len(cases), 1):.1f}%), {counts['fail']} fail, "
        f"{counts['unsupported']} unsupported ({time.perf_counter() - t0:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
