"""The package's layers import downwards only, and the layers above the engine use its narrow API.

Bottom to top: uop (the IR) -> codegen, renderer, runtime, device, buffers -> schedule -> engine -> tensor, nn,
models. The engine's state (what was realized, TinyJit's captures) is private to engine/: tensor/ and nn/ ask
through `engine/realize.py`'s public functions."""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "zeptograd")
LOWER = ["uop", "codegen", "renderer", "runtime", "schedule"]
FORBIDDEN = {  # a layer -> the packages above it that it must not import
    "uop": ("zeptograd.codegen", "zeptograd.renderer", "zeptograd.runtime", "zeptograd.schedule", "zeptograd.engine")
    + ("zeptograd.tensor", "zeptograd.nn"),
    "codegen": ("zeptograd.schedule", "zeptograd.engine", "zeptograd.tensor", "zeptograd.nn"),
    "renderer": ("zeptograd.schedule", "zeptograd.engine", "zeptograd.tensor", "zeptograd.nn"),
    "runtime": ("zeptograd.schedule", "zeptograd.engine", "zeptograd.tensor", "zeptograd.nn"),
    "schedule": ("zeptograd.engine", "zeptograd.tensor", "zeptograd.nn"),
}
ENGINE_API = {
    "realize_tensors",
    "schedule_tensors",
    "tensor_to_numpy",
    "run_schedule",
    "is_capturing",
    "current_capture",
    "realized_value",
    "realized_or_none",
    "with_realized_values",
    "note_built",  # a node just built over with_realized_values output: later walks stop there (setitem loops)
    "note_superseded",  # an ASSIGN folded into a later one: never run (engine/realize.py, writes and eager semantics)
    "current_view",  # a view of such an ASSIGN, moved to the last of its chain
    "is_memory_view",  # a tensor that aliases a buffer: numpy() reads it without keeping a copy
    "note_pending_write",  # a new ASSIGN into a memory: a view of it read before it runs runs it first
    "forget_realized",
}


def imports(path: str) -> list[tuple[str, list[str], int]]:
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
    return out


def modules(folder: str) -> list[str]:
    return sorted(
        os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, folder)) for f in fs if f.endswith(".py")
    )


@pytest.mark.slow
@pytest.mark.parametrize("layer", LOWER)
def test_lower_layers_import_nothing_above_them(layer):
    bad = [
        f"{os.path.relpath(p, ROOT)}:{line}: {mod}"
        for p in modules(layer)
        for mod, _, line in imports(p)
        if mod.startswith(FORBIDDEN[layer])
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["tensor", "nn", "models"])
def test_layers_above_the_engine_use_its_public_functions(layer):
    bad = []
    for p in modules(layer):
        for mod, names, line in imports(p):
            if mod == "zeptograd.engine.realize" and (extra := set(names) - ENGINE_API):
                bad.append(f"{os.path.relpath(p, ROOT)}:{line}: {sorted(extra)} from the engine's internals")
            if mod.startswith("zeptograd.engine") and any(n.startswith("_") for n in names):
                bad.append(f"{os.path.relpath(p, ROOT)}:{line}: private {names} of {mod}")
    assert not bad, "\n".join(bad)
