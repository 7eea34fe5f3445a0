"""The fast inner loop (`python -m pytest -q -n 2 -m "not slow" tests`, see tests/conftest.py) keeps a family's first
cases and marks the rest `slow`: `@pytest.mark.parametrize("op", fast_first(list(UNARY), 3))` runs UNARY's first
three ops in the inner loop and every op in the full run (CI)."""

from __future__ import annotations

import pytest


def fast_first(values, n: int = 1, unpack: bool = False) -> list:
    """`values` for a parametrize, all but the first `n` marked slow; unpack=True where each value is the tuple of
    several argument names ("op,shape")."""
    out = []
    for i, v in enumerate(values):
        if i < n:
            out.append(v)
        elif isinstance(v, type(pytest.param(None))):  # already a pytest.param: keep its id and marks, add slow
            out.append(pytest.param(*v.values, id=v.id, marks=[*v.marks, pytest.mark.slow]))
        else:
            out.append(pytest.param(*(v if unpack else (v,)), marks=pytest.mark.slow))
    return out
