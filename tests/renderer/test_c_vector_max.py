"""The C renderer keeps vector compares, selects and max vector-wide (gcc's vector compare gives a mask of -1/0 lanes;
a select is a blend of the bits by the mask, NaN winning in max as in the scalar rule), so a max reduce's 16-lane
accumulator, argmax's compare-and-select and softmax's exp polynomial (clamps, NaN test, exponent bits) are never
split into scalar lanes inside their loops."""

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


def inner_loop_lines(src: str) -> list[str]:
    """the lines inside at least two nested loops (a reduce loop in a kernel's row loop)"""
    depth, inner = 0, []
    for line in src.splitlines():
        if line.strip() == "}":
            depth -= 1
        elif depth >= 2:
            inner.append(line)
        if line.lstrip().startswith("for ("):
            depth += 1
    return inner


def assert_no_lanes(lines: list[str]):
    body = "\n".join(lines)
    assert lines and not re.search(r"\w\[\d+\]", body), body  # never a lane of a vector
    assert "?" not in body and "_Bool " not in body, body  # no scalar select or scalar compare


def test_max_reduce_accumulates_whole_vectors():
    src = c_source(Tensor(np.ones((64, 1024), np.float32), device="CPU").max(axis=1))
    loop = src[src.index("for (int ridx1") : src.rindex("    }\n")]
    # acc = max(acc, val): one 16-lane compare (b > a, or b NaN: val1 != val1) and a select of the bits by its mask
    assert re.search(r"zg_intx16 (mask\d+) = \(zg_intx16\)\(\((val\d+)>(val\d+)\)\|\(\2!=\2\)\);", loop)
    assert re.search(r"zg_floatx16 alu\d+ = \(zg_floatx16\)\(\(mask\d+&\(zg_intx16\)val\d+\)\|", loop)
    assert_no_lanes(loop.splitlines())


def test_integer_vector_max_has_no_nan_test():
    src = c_source(Tensor(np.ones((64, 1024), np.int32), device="CPU").max(axis=1))
    loop = src[src.index("for (int ridx1") : src.rindex("    }\n")]
    assert re.search(r"mask\d+ = \(zg_intx16\)\((val\d+)>(val\d+)\);", loop) and "!=" not in loop


def test_argmax_compares_and_selects_whole_vectors():
    """argmax: x == max (or NaN) selects the index (an int64 vector) by a float compare's mask, sign-extended"""
    src = c_source(Tensor(np.ones((64, 1024), np.float32), device="CPU").argmax(axis=1))
    inner = inner_loop_lines(src)
    assert_no_lanes(inner)
    body = "\n".join(inner)
    assert re.search(r"zg_intx\d+ mask\d+ = \(zg_intx\d+\)\(val\d+==", body)
    assert re.search(r"zg_long_longx\d+ sel\d+ = __builtin_convertvector\(mask\d+, zg_long_longx\d+\);", body)


def test_softmax_exp_polynomial_stays_vectors():
    """softmax's exp2 as ALU ops: its range clamps (compare, select), NaN test and exponent bits (shift, bitcast)"""
    src = c_source(Tensor(np.ones((64, 1024), np.float32), device="CPU").softmax(axis=1))
    inner = inner_loop_lines(src)
    assert_no_lanes(inner)
    body = "\n".join(inner)
    assert "<<" in body and ">>" in body and "(zg_floatx" in body and "sel" in body


def test_cpu_c_vectors_are_as_wide_as_the_host_registers():
    """CPU:C renders vectors as wide as -march=native's registers (gcc splits a wider compare into lanes)"""
    import pytest

    from zeptograd import Device
    from zeptograd.renderer import cpu_simd_bytes
    from zeptograd.runtime.ops_cpu import widest_vector

    assert widest_vector("#define __AVX__ 1\n#define __AVX2__ 1\n#define __AVX512F__ 1\n") == "64"
    assert widest_vector("#define __SSE2__ 1\n#define __AVX__ 1\n#define __AVX2__ 1\n") == "32"
    assert widest_vector("#define __ARM_NEON 1\n#define __SSE2_MATH__ 1\n") == "16"
    try:
        dev = Device["CPU:C"]
    except Exception as e:
        pytest.skip(f"CPU:C: {e}")
    width = dev.compiler.vector_bytes
    assert width in (16, 32, 64) and dev.renderer.simd_bytes == cpu_simd_bytes(width)  # SIMD_BYTES may narrow it
    (item,) = schedule_tensors([Tensor(np.ones((64, 1024), np.float32), device="CPU:C").max(axis=1)])
    uops, _ = full_rewrite(item.ast, dev.renderer)
    src = dev.renderer.render(kernel_name(item.ast), uops).src
    lanes = dev.renderer.simd_bytes // 4  # the max accumulates whole vectors of this width, none wider
    assert re.search(rf"zg_floatx{lanes} alu\d+ = \(zg_floatx{lanes}\)", src) and f"zg_floatx{lanes * 2}" not in src
