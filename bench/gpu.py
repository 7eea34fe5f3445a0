"""zeptograd on a GPU against torch on the same GPU, in one process: `python -m bench.gpu [--device CUDA] [--quick]`.

Each case first checks zeptograd's values against torch's (float32 everywhere: torch's TF32 paths are switched off, so
both sides compute the same thing), then times both: the median of several calls, each one finished before the clock
stops (zeptograd's CUDA runtime waits for every kernel; torch is synchronized after each call). `kernel` is the
median time zeptograd spent inside kernels. With `--device CPU` the same cases run against torch on the CPU: that is
how the harness is tested on machines without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import numpy as np

CASES = [
    "add",
    "sum",
    "sum_last_axis",
    "sum_first_axis",
    "softmax",
    "layernorm",
    "matmul_1024",
    "matmul_2048",
    "matmul_4096",
    "conv2d",
]


def _inputs(name: str, quick: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    n = 64 if quick else 4096
    shapes = {
        "add": [(n * n,), (n * n,)],
        "sum": [(n * n,)],
        "sum_last_axis": [(n, n)],
        "sum_first_axis": [(n, n)],
        "softmax": [(n, n)],
        "layernorm": [(n, n)],
        "conv2d": [(2, 8, 16, 16), (16, 8, 3, 3)] if quick else [(8, 64, 56, 56), (128, 64, 3, 3)],
    }
    if name.startswith("matmul_"):
        m = 32 if quick else int(name.split("_")[1])
        shapes[name] = [(m, m), (m, m)]
    return [rng.standard_normal(s, dtype=np.float32) for s in shapes[name]]


def _ops(name: str, F) -> Callable:
    """The case as a function of its inputs, written once for both libraries (F: torch.nn.functional or None)."""
    if name == "add":
        return lambda a, b: a + b
    if name == "sum":
        return lambda a: a.sum()
    if name == "sum_last_axis":
        return lambda a: a.sum(1)
    if name == "sum_first_axis":
        return lambda a: a.sum(0)
    if name == "softmax":
        return lambda a: a.softmax(-1)
    if name == "layernorm":
        return (lambda a: F.layer_norm(a, a.shape[-1:])) if F else (lambda a: a.layernorm())
    if name == "conv2d":
        return (lambda x, w: F.conv2d(x, w, padding=1)) if F else (lambda x, w: x.conv2d(w, padding=1))
    return lambda a, b: a @ b


def _median_time(fn: Callable[[], object], sync: Callable[[], None], budget_s: float, max_runs: int) -> float:
    fn()
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (len(times) < max_runs and time.perf_counter() - start < budget_s):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run_case(name: str, device: str, quick: bool) -> dict:
    import torch
    import torch.nn.functional as F

    from zeptograd import GlobalCounters, Tensor

    arrays = _inputs(name, quick)
    tdev = "cuda" if device.startswith("CUDA") else "cpu"
    sync = torch.cuda.synchronize if tdev == "cuda" else (lambda: None)
    zin = [Tensor(a, device=device).realize() for a in arrays]
    tin = [torch.from_numpy(a).to(tdev) for a in arrays]
    zfn, tfn = _ops(name, None), _ops(name, F)
    out: dict = {"name": name, "shapes": [list(a.shape) for a in arrays]}
    t0 = time.perf_counter()
    got = zfn(*zin).numpy()
    out["first_call_s"] = time.perf_counter() - t0
    want = tfn(*tin).cpu().numpy()
    scale = max(float(np.abs(want).max()), 1.0)
    out["max_abs_err_over_scale"] = float(np.abs(got - want).max() / scale) if got.size else 0.0
    out["values_ok"] = bool(np.allclose(got, want, rtol=2e-3, atol=2e-3 * scale))
    budget, runs = (0.05, 3) if quick else (1.0, 10)
    k0, n0 = GlobalCounters.time_sum_s, [0]

    def zrun():
        n0[0] += 1
        zfn(*zin).realize()

    out["zeptograd_s"] = _median_time(zrun, lambda: None, budget, runs)
    out["zeptograd_kernel_s"] = (GlobalCounters.time_sum_s - k0) / n0[0]
    out["torch_s"] = _median_time(lambda: tfn(*tin), sync, budget, runs)
    out["ratio"] = out["zeptograd_s"] / out["torch_s"]
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="CUDA")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, few runs (a smoke test of the harness)")
    ap.add_argument("--only", action="append", help=f"a case name: {', '.join(CASES)}")
    ap.add_argument("--json", help="also write the results as JSON")
    args = ap.parse_args(argv)
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 on both sides
    torch.backends.cudnn.allow_tf32 = False
    results = []
    print(f"{'case':16} {'values':>7} {'first call':>11} {'zeptograd':>11} {'kernels':>11} {'torch':>11} {'ratio':>7}")
    for name in args.only or CASES:
        try:
            r = run_case(name, args.device, args.quick)
        except Exception as e:  # one failing case must not hide the others' numbers
            r = {"name": name, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
            print(f"{name:16} ERROR {r['error'][:300]}", flush=True)
        else:
            ms = {k: r[k] * 1e3 for k in ("first_call_s", "zeptograd_s", "zeptograd_kernel_s", "torch_s")}
            print(
                f"{name:16} {'ok' if r['values_ok'] else 'WRONG':>7} {ms['first_call_s']:9.1f}ms "
                f"{ms['zeptograd_s']:9.3f}ms {ms['zeptograd_kernel_s']:9.3f}ms {ms['torch_s']:9.3f}ms "
                f"{r['ratio']:6.2f}x",
                flush=True,
            )
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
