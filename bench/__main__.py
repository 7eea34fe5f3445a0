"""`python -m bench`: OpenBLAS reads OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE once, when numpy loads it, and a
CORETYPE of Haswell makes it run AVX2 kernels on an AVX-512 machine (half its sgemm speed). So the bench runs in a
process started without them, before numpy is imported (BENCH_KEEP_BLAS_ENV=1 keeps them, to measure that)."""

import os
import sys

BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

if any(k in os.environ for k in BLAS_ENV) and not os.environ.get("BENCH_KEEP_BLAS_ENV"):
    env = {k: v for k, v in os.environ.items() if k not in BLAS_ENV}
    print(
        f"bench: running without {', '.join(k for k in BLAS_ENV if k in os.environ)} (numpy's BLAS reads them at load)"
    )
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "bench", *sys.argv[1:]], env)

from bench.run import main  # noqa: E402

main()
