"""The C renderer keeps a vector max vector-wide (gcc's vector compare and a select by mask, NaN winning as in the
scalar rule), so a max reduce's 16-lane accumulator is never split into 16 scalar selects inside its loop."""

from __future__ import annotations

import re

import numpy as np

from zeptograd import Tensor
from zeptograd.codegen import full_rewrite, kernel_name
from zeptograd.engine.realize import schedule_tensors
from zeptograd.renderer.cstyle import CStyleRenderer


def c_source(t: Tensor) -> str:
    (item,) = schedule_tensors([t])
    uops, _ = full_rewrite(item.ast, CStyleRenderer())
    return CStyleRenderer().render(kernel_name(item.ast), uops).src


def test_max_reduce_accumulates_whole_vectors():
    src = c_source(Tensor(np.ones((64, 1024), np.float32), device="CPU").max(axis=1))
    loop = src[src.index("for (int ridx1") : src.rindex("    }\n")]
    # acc = max(acc, val): one 16-lane compare (NaN in acc wins: val0 != val0) and a select of the bits by its mask
    assert re.search(r"__typeof__\((val\d+)>(val\d+)\) (mask\d+) = \(\1>\2\)\|\(\1!=\1\);", loop)
    assert re.search(r"zg_floatx16 alu\d+ = \(zg_floatx16\)\(\(mask\d+&\(__typeof__\(mask\d+\)\)val\d+\)\|", loop)
    assert not re.search(r"\[\d+\]", loop)  # never a lane of a vector inside the loop
    assert "?" not in loop  # no scalar select


def test_integer_vector_max_has_no_nan_test():
    src = c_source(Tensor(np.ones((64, 1024), np.int32), device="CPU").max(axis=1))
    loop = src[src.index("for (int ridx1") : src.rindex("    }\n")]
    assert re.search(r"__typeof__\((val\d+)>(val\d+)\) mask\d+ = \1>\2;", loop) and "!=" not in loop


def test_cpu_c_vectors_are_as_wide_as_the_host_registers():
    """CPU:C renders vectors as wide as -march=native's registers (gcc splits a wider compare into lanes)"""
    import pytest

    from zeptograd import Device
    from zeptograd.runtime.ops_cpu import widest_vector

    assert widest_vector("#define __AVX__ 1\n#define __AVX2__ 1\n#define __AVX512F__ 1\n") == "64"
    assert widest_vector("#define __SSE2__ 1\n#define __AVX__ 1\n#define __AVX2__ 1\n") == "32"
    assert widest_vector("#define __ARM_NEON 1\n#define __SSE2_MATH__ 1\n") == "16"
    try:
        dev = Device["CPU:C"]
    except Exception as e:
        pytest.skip(f"CPU:C: {e}")
    width = dev.compiler.vector_bytes
    assert dev.renderer.simd_bytes == width and width in (16, 32, 64)
    (item,) = schedule_tensors([Tensor(np.ones((64, 1024), np.float32), device="CPU:C").max(axis=1)])
    uops, _ = full_rewrite(item.ast, dev.renderer)
    src = dev.renderer.render(kernel_name(item.ast), uops).src
    lanes = width // 4  # the max accumulates whole vectors of this width, none wider
    assert re.search(rf"zg_floatx{lanes} alu\d+ = \(zg_floatx{lanes}\)", src) and f"zg_floatx{lanes * 2}" not in src
