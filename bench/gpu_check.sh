#!/usr/bin/env bash
# What a session runs on a machine with an NVIDIA GPU (CI has none), in one go: the GPU's facts; CUDA's tests (each
# test parametrized over devices, and the GPU value tests); the example trained on CUDA; bench.gpu against torch on
# the same GPU; the property test on every backend there. Logs and JSON go under $OUT (default ./gpu_out).
# Usage, from the repository root: bash bench/gpu_check.sh [seconds for the tests, default 240]
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$OUT/gpu.txt"
$PY -c "import sys, numpy, llvmlite, torch; print(sys.version.split()[0], 'numpy', numpy.__version__, 'llvmlite', llvmlite.__version__, 'torch', torch.__version__)"
$PY -c "from zeptograd import Device, Tensor; print('arch', Device['CUDA'].renderer.arch, 'sum', Tensor([1.0, 2.0], device='CUDA').sum().item())" 2>&1 | tail -5
echo "== tests on CUDA"
ZG_TEST_DEVICES=CUDA,PYTHON timeout "${1:-240}" $PY -m pytest -q -n 12 -p no:cacheprovider -p no:benchmark --timeout 120 -k "CUDA or cuda" \
  tests/backend tests/runtime/test_gpu.py tests/codegen tests/tensor tests/uop --junitxml="$OUT/junit.xml" -rfE 2>&1 |
  tail -60 | tee "$OUT/tests.txt"
echo "== train_digits on CUDA"
DEV=CUDA timeout 60 $PY examples/train_digits.py --short 2>&1 | tail -8
echo "== bench.gpu"
timeout 150 $PY -m bench.gpu --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench.txt"
echo "== property test on every backend here (CUDA included)"
ZG_PROPERTY_EXAMPLES=60 timeout 100 $PY -m pytest -q -p no:cacheprovider -p no:benchmark -x tests/test_property.py 2>&1 | tail -30
