"""The benchmark harness runs (tiny sizes, --quick) and reports the structure it promises. No timing is checked."""

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.run import CASES, IMPLS, format_report, main, run_bench, select  # noqa: E402


def test_quick_case_structure():
    report = run_bench(only=["add"], quick=True, progress=False)
    assert set(report) >= {"machine", "limits", "cases", "quick"}
    assert report["machine"]["threads"] >= 1
    assert report["limits"]["bandwidth_limit_GBps"] > 0 and report["limits"]["fma_peak_GFLOPS"] > 0
    (case,) = report["cases"]
    assert case["name"] == "add" and case["kind"] == "bw" and case["unit"] == "GB/s"
    assert set(case["seconds"]) == set(IMPLS)
    assert case["errors"] == {}
    assert case["seconds"]["zeptograd"] > 0 and case["seconds"]["numpy"] > 0
    assert case["metric"]["zeptograd"] > 0
    assert case["ratio_to_best_peer"] > 0 and case["fraction_of_limit"] > 0
    text = format_report(report)
    assert "add" in text and "limits: bandwidth" in text


def test_latency_case_and_jit_overhead_without_probes():
    report = run_bench(only=["overhead", "overhead_jit"], quick=True, progress=False, with_probes=False)
    assert [c["name"] for c in report["cases"]] == ["overhead", "overhead_jit"]
    for c in report["cases"]:
        assert c["unit"] == "us" and c["seconds"]["zeptograd"] > 0, c


def test_select():
    assert select(None) == list(CASES)
    assert select(["matmul"]) == ["matmul_512", "matmul_1024", "matmul_2048"]
    assert select(["softmax,sum"]) == ["sum", "softmax"]  # an exact name is not a prefix too
    assert select(["overhead"]) == ["overhead"]
    with pytest.raises(SystemExit):
        select(["nope"])


def test_main_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    main(["--quick", "--only", "sum", "--no-probes", "--json", str(out)])
    data = json.loads(out.read_text())
    assert [c["name"] for c in data["cases"]] == ["sum"]
    assert "sum" in capsys.readouterr().out


def test_cliffs_generator_is_fixed_distinct_and_large():
    from bench import cliffs

    assert cliffs.total_programs() >= 500
    first = cliffs.generate(40, ("small", "medium"))
    assert len({(p.zg, p.inputs) for p in first}) == 40  # distinct programs
    assert [p.id for p in cliffs.generate(10, ("small", "medium"))] == [p.id for p in first[:10]]  # a prefix
    assert {p.family for p in first[: len(cliffs.FAMILIES)]} == set(cliffs.FAMILY_BY_NAME)  # families interleaved
    assert {p.size for p in first} == {"small", "medium"}
    again = cliffs.program_by_id(first[5].id)
    assert (again.zg, again.torch, again.inputs) == (first[5].zg, first[5].torch, first[5].inputs)
    only = cliffs.generate(5, ("large",), ["attention"])
    assert all(p.family == "attention" and p.size == "large" for p in only)


def test_cliffs_quick_runs_three_programs(capsys):
    from bench import cliffs

    cliffs.main(["--quick", "--count", "3"])
    out = capsys.readouterr().out
    lines = out.splitlines()
    ids = [p.id for p in cliffs.generate(3, ("tiny",))]
    assert lines[0].startswith("zeptograd cliffs: ") and "THREADS=" in lines[0]
    assert any(ln.startswith("3 programs of ") for ln in lines[1:3])  # after a line on the load, if busy
    for title in ("worst a/b (default / no fusion):", "worst a/c (default / torch):"):
        rows = lines[lines.index(title) + 2 : lines.index(title) + 5]  # after the column header: one row each
        assert sorted(r.split(": ", 1)[0].split()[-1] for r in rows) == sorted(ids), rows
        for r in rows:  # ratios, times and kernel counts, then the program as it runs, with its inputs
            assert r.split()[0].endswith("x") and "k)" in r and " with " in r
    assert any(ln.startswith("a/b over 3 programs: p10 ") for ln in lines)
    assert any(ln.startswith("a/c over 3 programs: p10 ") for ln in lines)
    assert "errors (" not in out and "values differ" not in out  # every program ran, same values as torch


def test_onnx_cases_compare_with_onnxruntime():
    pytest.importorskip("onnx")
    pytest.importorskip("torch")
    report = run_bench(
        only=["onnx_squeezenet_b1", "onnx_resnet50_first"], quick=True, progress=False, with_probes=False
    )
    case, first = report["cases"]
    assert case["kind"] == "rate" and "tiny conv" in case["note"], case
    assert case["errors"] == {} and case["seconds"]["zeptograd"] > 0
    assert "onnxruntime" in case["seconds"]
    assert first["kind"] == "latency" and first["errors"] == {} and first["seconds"]["zeptograd"] > 0, first
    if importlib.util.find_spec("onnxruntime") is not None:
        assert case["seconds"]["onnxruntime"] > 0 and case["ratio_to_best_peer"] > 0
        assert first["seconds"]["onnxruntime"] > 0
    header = next(ln for ln in format_report(report).splitlines() if ln.startswith("case "))
    assert "onnxruntime" in header and "torch" in header  # a column per peer a case names


def test_onnx_cases_skip_with_a_note(monkeypatch):
    pytest.importorskip("onnx")
    from bench import cases_onnx

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    spec = cases_onnx.ONNX_CASES["onnx_squeezenet_b1"](True)
    assert spec.runners["zeptograd"] is not None and spec.runners["onnxruntime"] is None
    assert "onnxruntime: n/a" in spec.note
    monkeypatch.setitem(sys.modules, "torch", None)
    assert "n/a: torch builds them" in cases_onnx.ONNX_CASES["onnx_resnet50_b16"](False).note
    monkeypatch.setitem(sys.modules, "onnx", None)
    for name in ("onnx_squeezenet_b1", "onnx_resnet50_first"):
        spec = cases_onnx.ONNX_CASES[name](True)
        assert "n/a: pip install" in spec.note and all(fn is None for fn in spec.runners.values())


def test_sharding_case_compares_with_one_device():
    report = run_bench(only=["mlp_train_shard2"], quick=True, progress=False, with_probes=False)
    (case,) = report["cases"]
    assert case["kind"] == "rate" and "CPU:0,CPU:1" in case["note"], case
    assert case["errors"] == {} and case["seconds"]["zeptograd"] > 0 and case["seconds"]["1 device"] > 0
    header = next(ln for ln in format_report(report).splitlines() if ln.startswith("case "))
    assert "1 device" in header


@pytest.mark.parametrize("name", ["resnet_block_train", "gpt_tiny_train"])
def test_training_cases_compute_what_torch_computes(name):
    """Both sides start from the same weights: the losses of three steps (the eager one, the TinyJit capture, a
    replay) agree, so each step's update agrees too."""
    pytest.importorskip("torch")
    spec = CASES[name](True)
    assert spec.kind == "rate" and spec.runners["numpy"] is None
    zg_losses = [spec.runners["zeptograd"]().item() for _ in range(3)]
    torch_losses = [spec.runners["torch"]().item() for _ in range(3)]
    assert zg_losses[2] < zg_losses[0]  # the steps train
    np.testing.assert_allclose(zg_losses, torch_losses, rtol=1e-4)


def test_conv2d_backward_case_computes_torchs_gradients():
    pytest.importorskip("torch")
    spec = CASES["conv2d_backward"](True)
    assert spec.kind == "flops" and "no forward" in spec.note
    zg_dx, zg_dw = spec.runners["zeptograd"]()
    torch_dx, torch_dw = spec.runners["torch"]()
    assert zg_dx.shape == tuple(torch_dx.shape) and zg_dw.shape == tuple(torch_dw.shape)
    np.testing.assert_allclose(zg_dx.numpy(), torch_dx.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(zg_dw.numpy(), torch_dw.numpy(), rtol=1e-4, atol=1e-4)


def test_new_cases_run_in_the_harness():
    report = run_bench(
        only=["resnet_block_train", "gpt_tiny_train", "conv2d_backward"], quick=True, progress=False, with_probes=False
    )
    for case in report["cases"]:
        assert case["errors"] == {} and case["seconds"]["zeptograd"] > 0, case


def test_a_jit_step_is_timed_after_its_capture_even_when_its_first_call_is_slow(monkeypatch):
    """A TinyJit step compiles on its first call and captures on its second: with `warmups=2` neither is timed,
    also where the first took over 10 s (a loaded machine compiling a model)."""
    from bench import run

    durations = iter([11.0, 5.0] + [0.001] * 20)  # compile, capture, then replays
    clock = [0.0]
    monkeypatch.setattr(run.time, "perf_counter", lambda: clock[0])

    def step():
        clock[0] += next(durations)

    assert run.measure(step, quick=True, warmups=2).median_s == pytest.approx(0.001)
    durations = iter([11.0, 5.0] + [0.001] * 20)
    assert run.measure(step, quick=True).median_s == pytest.approx(5.0)  # without: the capture is what it times
