"""docs/architecture.md stays true: every pass of the scheduler's and codegen's pass lists is named there with
the file that owns it, and every `file.py: function` the doc cites exists."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8").read()

# the pass lists: (module, function) whose body runs the passes in order
PASS_LISTS = [
    ("zeptograd.schedule.rangeify", "create_schedule"),
    ("zeptograd.codegen", "optimize"),
    ("zeptograd.codegen", "full_rewrite"),
]
NOT_PASSES = {"UOp", "dict", "zip", "set", "list", "sorted", "any", "len", "isinstance", "getattr", "prod"}
# helpers a pass list calls that transform nothing (a predicate, a buffer's UOp, a size)
NOT_PASSES |= {"needs_kernel", "buffer_under", "new_buffer_uop", "reshape_uop", "max_size"}


def passes_of(module_name: str, function: str) -> list[tuple[str, str]]:
    """(name, owning file) of each function a pass list calls and each matcher it hands to graph_rewrite."""
    module = importlib.import_module(module_name)
    tree = ast.parse(inspect.getsource(getattr(module, function)))
    names: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "graph_rewrite" and len(node.args) > 1 and isinstance(node.args[1], ast.Name):
            names.append(node.args[1].id)  # the matcher is the pass
        elif node.func.id not in NOT_PASSES and not node.func.id.startswith("check_"):
            names.append(node.func.id)
    out = []
    for name in dict.fromkeys(names):
        if name == "graph_rewrite" or name not in vars(module) and not hasattr(module, name):
            continue  # a local or a function imported inside the body: found below by its import
        obj = getattr(module, name)
        owner = inspect.getmodule(obj) or module
        out.append((name, os.path.relpath(inspect.getfile(owner), os.path.join(ROOT, "zeptograd"))))
    for node in ast.walk(tree):  # passes imported inside the pass list (GPU-only, imported on first use)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zeptograd."):
            path = node.module.removeprefix("zeptograd.").replace(".", "/") + ".py"
            out += [(a.name, path) for a in node.names]
    return out


CASES = [(m, f, name, path) for m, f in PASS_LISTS for name, path in passes_of(m, f)]


@pytest.mark.parametrize("module,function,name,path", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_every_pass_is_named_in_the_doc_with_its_file(module, function, name, path):
    assert f"`{name}`" in DOC or f"{name}`" in DOC or f": {name}" in DOC, f"{function} runs {name}: not in the doc"
    assert path in DOC, f"{name} lives in {path}: the doc does not name that file"


CITED = sorted(set(re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py): ([A-Za-z_][A-Za-z_0-9]*)", DOC)))


@pytest.mark.parametrize("path,name", CITED, ids=[f"{p}:{n}" for p, n in CITED])
def test_every_cited_function_exists(path, name):
    full = os.path.join(ROOT, "zeptograd", path)
    if not os.path.exists(full):
        full = os.path.join(ROOT, path)  # bench/ and tests/ paths
    assert os.path.exists(full), f"the doc cites {path}, which does not exist"
    src = open(full, encoding="utf-8").read()
    assert re.search(rf"^\s*(def|class) {name}\b|^\s*{name}\s*[:=]", src, re.M), f"{path} has no {name}"
