"""The benchmark harness runs (tiny sizes, --quick) and reports the structure it promises. No timing is checked."""

import json
import os
import sys

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
