"""The training examples in their short mode (a few steps under TinyJit): they run, and the loss falls."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", name), "--short", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, f"{name} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_train_digits_short():
    pytest.importorskip("sklearn")
    out = run_example("train_digits.py")
    assert "loss fell" in out and "test accuracy: " in out


def test_gpt_tiny_short():
    out = run_example("gpt_tiny.py")
    assert "loss fell" in out and "sample:" in out
