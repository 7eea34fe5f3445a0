"""VIZ=1's recording (zeptograd/viz/record.py) and its trace (viz/trace.py): what a known program records, that a
kernel is recorded once, that nothing is recorded (or exists) with VIZ off, that results do not change, and that a
script never waits for the page."""

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from zeptograd import Device, Tensor
from zeptograd.helpers import ArgumentError
from zeptograd.viz import record, trace
from zeptograd.viz.server import make_server, url_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reachable(nodes: list, sink: int) -> set[int]:
    """the ids of the nodes of the graph below sink (a trace's node table: sources at index 3)"""
    seen, stack = {sink}, [sink]
    while stack:
        for s in nodes[stack.pop()][3]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return seen


def reachable_ops(nodes: list, sink: int) -> set[str]:
    return {nodes[i][0] for i in reachable(nodes, sink)}


def softmax_trace(rows: int, cols: int) -> tuple[dict, np.ndarray]:
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    with record.recording() as rec:
        out = Tensor(x).softmax(-1).numpy()
    return rec.trace, out


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[dict, str]:
    """A softmax's trace, and the file it was written to."""
    tr, _ = softmax_trace(4, 19)
    path = str(tmp_path_factory.mktemp("viz") / "t.json")
    trace.write_trace(tr, path)
    return tr, path


def test_softmax_records_its_kernels_passes_and_rules():
    tr, out = softmax_trace(6, 23)  # a shape no other test compiles: its kernels are compiled (and recorded) here
    ref = np.exp(np.random.default_rng(0).standard_normal((6, 23)).astype(np.float32))
    np.testing.assert_allclose(out, ref / ref.sum(-1, keepdims=True), rtol=1e-5)
    kernels = [k for k in tr["kernels"] if k["kind"] == "kernel"]
    assert [k["name"] for k in kernels] == ["r_6_23_23_23"]  # one kernel: per row, max, sum of exp, the division
    for k in kernels:
        assert k["runs"] == 1 and k["time_s"] > 0 and k["device"] == "CPU"
        assert "r_6_23_23_23" in k["src"]
        names = [s["name"] for s in k["steps"]]
        assert names[0].startswith("input") and "simplify_ranges: pm_load_collapse" in names
        assert "full_rewrite: pm_lower" in names and "full_rewrite: pm_devectorize" in names
        first, last = k["steps"][0], k["steps"][-1]
        assert "STORE" in reachable_ops(k["nodes"], first["after"])
        assert "RANGE" in reachable_ops(k["nodes"], last["after"])
        for node in k["nodes"]:  # sources come before their users: the page lays out in one pass
            assert all(s < k["nodes"].index(node) for s in node[3])
    reduces = [k for k in kernels if k["name"].startswith("r_")]
    assert all("REDUCE" in reachable_ops(k["nodes"], k["steps"][0]["after"]) for k in reduces)
    fired = {r[0] for k in kernels for s in k["steps"] for r in s["rules"]}
    assert fired and all(rule in tr["rules"] and ":" in rule for rule in fired)
    (sched,) = [s for s in tr["schedules"] if s["realized"] and s["realized"][0]["kernel"] is not None]
    assert {tr["kernels"][r["kernel"]]["name"] for r in sched["realized"]} == {"r_6_23_23_23"}
    assert "REDUCE_AXIS" in reachable_ops(sched["nodes"], sched["sink"])
    assert {r["why"] for r in sched["realized"]} == {"an output"}
    assert [run[0] for run in tr["runs"]] == [k["id"] for k in kernels]


def test_load_collapse_step_replaces_the_reduce():
    """A gather (`table[idx]`) is a REDUCE over the table's rows; pm_load_collapse's reduce_collapse makes it one
    load: the recorded step shows the REDUCE before and not after, the rule that fired and the node it made."""
    idx = Tensor(np.array([3, 1, 4], dtype=np.int32))
    table = Tensor(np.arange(70, dtype=np.float32).reshape(14, 5))
    with record.recording() as rec:
        out = (table[idx] * 2).numpy()
    np.testing.assert_equal(out, np.arange(70, dtype=np.float32).reshape(14, 5)[[3, 1, 4]] * 2)
    (k,) = [k for k in rec.trace["kernels"] if k["name"] == "r_3_5_14"]
    (step,) = [s for s in k["steps"] if s["name"] == "simplify_ranges: pm_load_collapse"]
    assert "REDUCE" in reachable_ops(k["nodes"], step["before"])
    assert "REDUCE" not in reachable_ops(k["nodes"], step["after"])
    assert [r[0].split(" ")[-1] for r in step["rules"]] == ["reduce_collapse"]  # "simplify.py:<line> reduce_collapse"
    assert step["rules"][0][0].startswith("simplify.py:") and step["rules"][0][1] == 1
    assert "reduce_collapse" in rec.trace["rules"][step["rules"][0][0]]
    assert step["made"] and all("reduce_collapse" in rule for rule in step["made"].values())


def new_nodes(nodes: list, step: dict) -> set[int]:
    """the nodes of a step's graph after that its graph before lacks: what the page highlights"""
    return reachable(nodes, step["after"]) - reachable(nodes, step["before"])


def assert_steps_chain(k: dict) -> None:
    """Every change is a named step: each step at the top level starts from the graph the one before it left, the
    steps under a pass (optimize's) chain from the pass's input to its output, and no step is an unnamed gap."""
    steps = k["steps"]
    assert not [s["name"] for s in steps if s["kind"] == "code" or "changed outside" in s["name"]]
    last = {0: steps[0]["after"]}  # depth -> the graph the last step at that depth left
    for i, s in enumerate(steps[1:], 1):
        d = s["depth"]
        start = steps[i - 1]["before"] if d > steps[i - 1]["depth"] else last[d]  # a pass's first child: its input
        assert s["before"] == start, (k["name"], s["name"])
        last[d] = s["after"]
        if d > 0 and (i + 1 == len(steps) or steps[i + 1]["depth"] < d):  # the pass's last child: its output
            (parent,) = [p for p in steps[:i][::-1] if p["depth"] == d - 1][:1]
            assert parent["kind"] == "pass" and parent["after"] == s["after"], (parent["name"], s["name"])


@pytest.mark.slow  # two programs compiled with every rule tracked
def test_passes_that_are_not_a_graph_rewrite_are_named_steps():
    """The expander, the accumulators, the optimizer's actions: each a step of its own name with what it does, its
    graphs (the nodes it made differ), its time and the rules of the rewrites it runs; none is left unnamed."""
    x = np.random.default_rng(1).standard_normal((3, 296)).astype(np.float32)
    a = np.random.default_rng(2).standard_normal((24, 44)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((44, 32)).astype(np.float32)
    with record.recording() as rec:
        soft = Tensor(x).softmax(-1).numpy()
        mm = (Tensor(a) @ Tensor(b)).numpy()
    ref = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(soft, ref / ref.sum(-1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(mm, a @ b, rtol=1e-4, atol=1e-4)
    kernels = {k["name"]: k for k in rec.trace["kernels"] if k["kind"] == "kernel"}
    assert set(kernels) == {"r_3_296_296_296", "r_24_32_44"}
    matmul = kernels["r_24_32_44"]
    assert any(o.startswith("Opt(UPCAST") for o in matmul["opts"])  # a kernel the optimizer made vector lanes in
    for k in kernels.values():
        assert_steps_chain(k)
        steps = {s["name"]: s for s in k["steps"]}
        for name in ("optimize", "expand", "lower_reduces"):
            s = steps[name]
            assert s["kind"] == "pass" and s["depth"] == 0 and s["about"] and s["ms"] > 0
            assert new_nodes(k["nodes"], s), (k["name"], name)  # the pass changed the graph: the page highlights
        assert steps["expand"]["where"].startswith("codegen/expander.py:")
        assert "REDUCE" in reachable_ops(k["nodes"], steps["lower_reduces"]["before"])
        assert "REDUCE" not in reachable_ops(k["nodes"], steps["lower_reduces"]["after"])
        # the optimizer's actions, one step each under optimize, in the order they were taken
        actions = [s for s in k["steps"] if s["name"].startswith("apply_opt ")]
        assert [s["name"].removeprefix("apply_opt ") for s in actions] == k["opts"]
        assert all(s["depth"] == 1 and new_nodes(k["nodes"], s) for s in actions)
        assert any(s["rules"] for s in actions)  # the rules of pm_fix_range_lists's rewrite, folded into the action
        ranges = [s for s in k["steps"] if s["name"].startswith("simplify_ranges: ")]
        assert ranges and all(s["depth"] == 1 for s in ranges)  # optimize's rewrites: steps of their own under it
        assert steps["full_rewrite: pm_lower"]["depth"] == 0
    # the vector lanes the expander made of the matmul's UPCAST ranges
    expand = next(s for s in matmul["steps"] if s["name"] == "expand")
    lanes = {matmul["nodes"][i][1] for i in new_nodes(matmul["nodes"], expand)}
    assert f"float{Device['CPU'].renderer.simd_bytes // 4}" in lanes, lanes  # Opt(UPCAST, _, the host's width)


@pytest.mark.slow  # two programs compiled with every rule tracked
def test_scheduler_passes_are_named_steps():
    """create_schedule's split_reduces and bufferize are steps of the schedule, after tensor_fold."""
    x = np.random.default_rng(4).standard_normal(2**18 + 64).astype(np.float32)
    with record.recording() as rec:
        total = Tensor(x).sum().numpy()
    np.testing.assert_allclose(total, x.sum(dtype=np.float64), rtol=1e-4)
    (sched,) = rec.trace["schedules"]
    names = [s["name"] for s in sched["steps"]]
    assert names == ["input: the tensor graph", "tensor_fold", "split_reduces", "bufferize"]
    split, buf = sched["steps"][2], sched["steps"][3]
    assert split["kind"] == "pass" and "two reduces" in split["about"]
    assert reachable_ops(sched["nodes"], split["before"]) >= {"REDUCE_AXIS"}
    made = [sched["nodes"][i][0] for i in new_nodes(sched["nodes"], split)]
    assert made.count("REDUCE_AXIS") == 2  # one big reduce -> a parallel one and the one that sums its parts
    assert buf["before"] == split["after"] and "BUFFERIZE" in reachable_ops(sched["nodes"], buf["after"])
    # a contiguous() inside the graph is folded alongside the outputs (tensor_fold's own sink): still one step, from
    # the tensor graph handed to the scheduler to the folded outputs, with the rules that fired
    y = np.random.default_rng(5).standard_normal((5, 7)).astype(np.float32)
    with record.recording() as rec:
        mid = (Tensor(y) * 3).contiguous()
        out = ((mid + 1).exp() * mid.detach().reshape(7, 5).T.sum(0)).numpy()  # detach: a fold
    np.testing.assert_allclose(out, np.exp(y * 3 + 1) * (y * 3).reshape(7, 5).T.sum(0), rtol=1e-5)
    for sched in rec.trace["schedules"]:
        steps = sched["steps"]
        names = [s["name"] for s in steps]
        assert names[:4] == ["input: the tensor graph", "tensor_fold", "split_reduces", "bufferize"]
        assert names[4:] in ([], ["create_schedule: bufferize_folds"])  # a rewrite: the buffers no kernel needs
        assert steps[1]["kind"] == "pass" and steps[1]["before"] == steps[0]["after"]
        assert all(b["before"] == a["after"] for a, b in zip(steps[1:], steps[2:]))
    assert any(s["steps"][1]["rules"] for s in rec.trace["schedules"])


def test_a_kernel_is_recorded_once():
    x = np.ones((3, 29), np.float32)
    with record.recording() as rec:
        for _ in range(3):
            (Tensor(x) + 1).sum(-1).numpy()
    named = [k for k in rec.trace["kernels"] if k["name"] == "r_3_29"]
    assert len(named) == 1 and named[0]["runs"] == 3
    assert len(rec.trace["schedules"]) == 1  # the schedule cache answers the other two


def test_tinyjit_replays_are_timeline_entries_not_new_kernels():
    from zeptograd import TinyJit

    @TinyJit
    def step(x: Tensor) -> Tensor:
        return (x * 3 + 1).sum(-1)

    with record.recording() as rec:
        outs = [step(Tensor(np.full((2, 41), i, np.float32))).numpy() for i in range(5)]
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out, np.full(2, (3 * i + 1) * 41, np.float32))
    kernels = [k for k in rec.trace["kernels"] if k["kind"] == "kernel" and k["name"] == "r_2_41"]
    # compiled (and recorded) once; the plain call, the capture and the three replays ran it
    assert len(kernels) == 1 and kernels[0]["runs"] == 5
    (jit,) = [k for k in rec.trace["kernels"] if k["kind"] == "jit"]
    assert jit["runs"] == 3 and jit["name"] == "TinyJit replay: 1 kernel" and "r_2_41" in jit["src"]
    runs = rec.trace["runs"]
    replays = [r for r in runs if r[0] == jit["id"]]
    assert len(replays) == 3
    # each replay's kernel run lies inside the replay's span, with the bytes of the kernel's other runs
    in_replays = [r for r in runs if r[0] == kernels[0]["id"]][2:]
    assert len(in_replays) == 3 and len({r[3] for r in runs if r[0] == kernels[0]["id"]}) == 1
    for rep, run in zip(replays, in_replays):
        assert rep[1] <= run[1] and run[1] + run[2] <= rep[1] + rep[2] + 1e-6
    # the list's time of the replay is its own (its kernel's counted with the kernel): less than its spans
    assert 0 <= jit["time_s"] < sum(r[2] for r in replays) and jit["bytes"] == 0


def test_trace_round_trip_and_version_check(saved, tmp_path):
    tr, saved_path = saved
    back = trace.read_trace(saved_path)
    assert back["version"] == trace.VERSION and back["kernels"] == json.loads(json.dumps(tr["kernels"]))
    path = str(tmp_path / "t.json")
    with open(path, "w") as f:
        json.dump(dict(tr, version=trace.VERSION + 1), f)
    with pytest.raises(ArgumentError, match=f"trace version {trace.VERSION + 1}.*reads version {trace.VERSION}"):
        trace.read_trace(path)
    with open(path, "w") as f:
        f.write("not json")
    with pytest.raises(ArgumentError, match="not JSON"):
        trace.read_trace(path)
    with pytest.raises(ArgumentError, match="not a zeptograd VIZ trace"):
        trace.check_trace({"format": "other"})


def test_server_serves_the_trace_and_the_page_only(saved):
    tr, path = saved
    server = make_server(path, 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = url_of(server)
        assert url.startswith("http://127.0.0.1:")
        assert json.loads(urllib.request.urlopen(url + "trace.json").read())["kernels"] == tr["kernels"]
        assert b"viz.js" in urllib.request.urlopen(url).read()
        assert b"d3" in urllib.request.urlopen(url + "static/vendor/d3.min.js").read(200)
        for bad in ("static/../record.py", "static/%2e%2e/record.py", "etc/passwd"):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(url + bad)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ArgumentError, match="not a zeptograd VIZ trace"):
        make_server(__file__, 0)


def test_taken_port_moves_to_the_next(saved):
    _, path = saved
    first = make_server(path, 0)
    try:
        second = make_server(path, first.server_address[1])
        assert second.server_address[1] > first.server_address[1]
        second.server_close()
    finally:
        first.server_close()


SCRIPT = """
import gc, sys
import numpy as np
from zeptograd import Tensor
x = np.linspace(-3, 3, 60, dtype=np.float32).reshape(5, 12)
print(repr(Tensor(x).softmax(-1).numpy().tolist()))
print("imported", any(m in sys.modules for m in ("zeptograd.viz.record", "zeptograd.viz.decisions")))
from zeptograd.viz import record
alive = [o for o in gc.get_objects() if isinstance(o, (record.Recorder, record.GraphRecord, record._TrackedMatcher))]
print("recorder", record.recorder is not None, len(alive))
"""


def run_script(viz: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, VIZ=viz, VIZ_FILE=str(tmp_path / "trace.json"), PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow  # two processes
def test_viz_off_records_nothing_and_on_changes_no_result(tmp_path):
    off, on = run_script("0", tmp_path), run_script("1", tmp_path)
    assert off.returncode == 0 and on.returncode == 0, off.stderr + on.stderr
    off_lines, on_lines = off.stdout.splitlines(), on.stdout.splitlines()
    assert off_lines[1:3] == ["imported False", "recorder False 0"]  # without VIZ: not even imported
    assert on_lines[1:3] == ["imported True", "recorder True 1"]  # the Recorder; no kernel or rewrite left open
    assert off_lines[0] == on_lines[0]  # the same numbers, bit for bit
    # stdout is a pipe here: the trace is written and the command to see it printed, nothing is served
    assert f"python -m zeptograd.viz {tmp_path / 'trace.json'}" in on.stderr  # stderr: stdout stays the program's
    assert "zeptograd.viz" not in off.stderr + off.stdout and "serving" not in on.stderr + on.stdout
    assert len(on.stdout.splitlines()) == 3
    assert [k["name"] for k in trace.read_trace(str(tmp_path / "trace.json"))["kernels"]] == ["r_5_12_12_12"]


@pytest.mark.slow  # two processes
def test_cli_usage_and_bad_file(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    usage = subprocess.run([sys.executable, "-m", "zeptograd.viz"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2 and "usage: python -m zeptograd.viz TRACE_FILE" in usage.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "zeptograd.viz", str(tmp_path / "none.json")], capture_output=True, text=True, env=env
    )
    assert missing.returncode == 1 and "none.json" in missing.stderr


@pytest.mark.slow  # a process
def test_on_a_terminal_the_trace_is_served_until_ctrl_c(tmp_path):
    """stdout a terminal (a pty here): after the program the page is served on 127.0.0.1 at VIZ_PORT or the next
    free port, and Ctrl-C (SIGINT) ends the process cleanly."""
    import pty
    import re
    import select
    import signal
    import time

    main_fd, child_fd = pty.openpty()
    env = dict(os.environ, VIZ="1", VIZ_FILE=str(tmp_path / "trace.json"), VIZ_PORT="0", PYTHONPATH=ROOT)
    code = (
        "import numpy as np; "
        "from zeptograd import Tensor; print((Tensor(np.ones((3, 37), np.float32)) * 2).sum().item())"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=child_fd, stderr=subprocess.PIPE, env=env)
    os.close(child_fd)
    out, url, deadline = b"", None, time.monotonic() + 120
    try:
        while url is None and time.monotonic() < deadline:
            if select.select([main_fd], [], [], 1)[0]:
                out += os.read(main_fd, 4096)
                if m := re.search(rb"serving .* at (http://127\.0\.0\.1:\d+/)", out):
                    url = m.group(1).decode()
        assert url is not None, out
        assert b"222" in out  # the program ran first
        served = json.loads(urllib.request.urlopen(url + "trace.json").read())
        assert served == trace.read_trace(str(tmp_path / "trace.json")) and len(served["kernels"]) == 1
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main_fd)


def schedule_decisions(tr: dict) -> list[tuple[dict, dict]]:
    """(schedule, decision) for every decision recorded, in order."""
    return [(s, d) for s in tr["schedules"] for d in s["decisions"]]


def test_scheduler_decisions_carry_the_rule_and_the_cost_estimates(monkeypatch):
    """`exp(x*g + 1) @ w`: the cost model keeps the prologue's exp (recomputed for each of w's 40 columns costs more
    than a buffer) and inlines the multiply-adds; a column mean subtracted from each row is kept (read in the row
    loop, outside the loop it varies along: not hoistable). Each recorded estimate agrees with the cost model's own
    answer, and the realized node says which rule kept it."""
    from zeptograd.schedule.cost import CostModel

    answers: dict = {}  # (node, its requests) -> inline_is_costlier's answer, as the scheduler got it
    real = CostModel.inline_is_costlier

    def spy(self, x, reqs):
        answers[x] = real(self, x, reqs)
        return answers[x]

    monkeypatch.setattr(CostModel, "inline_is_costlier", spy)
    rng = np.random.default_rng(2)
    xn, gn, wn = (rng.standard_normal(s).astype(np.float32) for s in ((64, 47), (47,), (47, 40)))
    with record.recording() as rec:
        out = (Tensor(xn) * Tensor(gn) + 1).exp().matmul(Tensor(wn)).numpy()
        (Tensor(xn[:5, :13]) - Tensor(xn[:5, :13]).mean(0)).numpy()
    np.testing.assert_allclose(out, np.exp(xn * gn + 1) @ wn, rtol=1e-4, atol=1e-4)
    found = schedule_decisions(rec.trace)
    assert found and all(d["stage"] == "the walk" for _, d in found)
    kept_exp = [(s, d) for s, d in found if d["keep"] and s["nodes"][d["node"]][0] == "EXP2"]
    ((sched, exp),) = kept_exp
    assert exp["rule"].startswith("the cost model: recomputed") and exp["cost"]["costlier"]
    assert exp["cost"]["inline"] > exp["cost"]["keep"] > 0 and exp["cost"]["inline_bytes"] > 0
    assert exp["cost"]["elements"] == 64 * 47 and sched["nodes"][exp["node"]][4] == "(64, 47)"
    (why,) = [r["why"] for r in sched["realized"] if r["node"] == exp["node"]]
    assert why == exp["rule"]
    inlined = [d for _, d in found if not d["keep"]]
    assert {sched["nodes"][d["node"]][0] for s, d in found if not d["keep"] and s is sched} >= {"MUL", "ADD"}
    for d in inlined:
        assert d["rule"].startswith("the cost model: ") and d["cost"]["costlier"] is False
        assert "inline" not in d["cost"] or d["cost"]["inline"] <= d["cost"]["keep"]
    # the recorded verdicts are the cost model's, node for node (op and shape), where it decided
    asked = [(s["nodes"][d["node"]][0], s["nodes"][d["node"]][4], d["cost"]["costlier"]) for s, d in found]
    asked = [a for a, (_, d) in zip(asked, found) if d["rule"].startswith("the cost model")]
    assert sorted(asked) == sorted((x.op.name, trace.shape_text(x), ans) for x, ans in answers.items())
    reduces = [d for s, d in found if s["nodes"][d["node"]][0] == "REDUCE_AXIS" and d["keep"]]
    assert [d["rule"] for d in reduces] == ["a reduce read in a loop it does not vary along (not hoistable)"]


def test_scheduler_decisions_up_front_and_after_the_walk():
    """FUSE=0 keeps every op up front; a 3x3 stencil stores its prologue at the walk (read at 9 index sets) and
    the cost model inlines it again after the walk (one kernel), while an exp of a broadcast is kept after all."""
    from zeptograd import Context

    rng = np.random.default_rng(3)
    a = rng.standard_normal((61, 61)).astype(np.float32)
    col = rng.standard_normal((61, 1)).astype(np.float32)
    with record.recording() as rec:
        with Context(FUSE=0):
            (Tensor(a[:7, :11]) * 2 + 1).sum().numpy()
        p = (Tensor(a) * 2 + 1).pad(((1, 1), (1, 1)))
        box = sum(p[i : i + 61, j : j + 61] for i in range(3) for j in range(3)).numpy()
        q = Tensor(col).expand(61, 61).exp().pad(((1, 1), (1, 1)))
        sum(q[i : i + 61, j : j + 61] for i in range(3) for j in range(3)).numpy()
    want = np.pad(a * 2 + 1, 1)
    np.testing.assert_allclose(box, sum(want[i : i + 61, j : j + 61] for i in range(3) for j in range(3)), rtol=1e-5)
    nofuse, stencil, broadcast = rec.trace["schedules"]
    up_front = [d for d in nofuse["decisions"] if d["stage"] == "up front"]
    assert {nofuse["nodes"][d["node"]][0] for d in up_front} == {"MUL", "ADD"}
    assert all(d["keep"] and d["rule"].startswith("FUSE=0") and "cost" not in d for d in up_front)
    for sched, inline in ((stencil, True), (broadcast, False)):
        walk = [d for d in sched["decisions"] if d["rule"].startswith("read at over MAX_REQUESTS")]
        (after,) = [d for d in sched["decisions"] if d["stage"] == "after the walk"]
        assert [d["node"] for d in walk] == [after["node"]] and walk[0]["keep"]
        assert after["keep"] is not inline and after["cost"]["costlier"] is not inline
        assert after["rule"].startswith("inlined again" if inline else "kept after all")
        assert "its value: " in after["rule"] and after["cost"]["of"] == 9
    assert len([k for k in rec.trace["kernels"] if k["name"] == "r_61_61"]) <= 1  # the stencil: one kernel


@pytest.mark.slow  # BEAM times some dozens of candidates
def test_beam_records_its_candidates_and_the_winner(monkeypatch, tmp_path):
    from zeptograd import Context
    from zeptograd.engine import kernels, realize

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rng = np.random.default_rng(4)
    an, bn = rng.standard_normal((24, 20)).astype(np.float32), rng.standard_normal((20, 16)).astype(np.float32)
    a, b = Tensor(an).realize(), Tensor(bn).realize()
    with record.recording() as rec, Context(BEAM=2, BEAM_BUDGET=3):
        out = (a @ b).numpy()
    np.testing.assert_allclose(out, an @ bn, rtol=1e-4, atol=1e-4)
    (k,) = [k for k in rec.trace["kernels"] if k.get("beam")]
    beam = k["beam"]
    assert beam["width"] == 2 and beam["cached"] is False and beam["chosen"] == k["opts"]
    cands = beam["candidates"]
    assert [c[0] for c in cands[:2]] == [0, 0] and cands[0][1] == [] and cands[1][1] == beam["heuristic"]
    assert beam["baseline_s"] == cands[0][2] > 0 and beam["heuristic_s"] == cands[1][2] > 0
    assert max(c[0] for c in cands) >= 1 and len(cands) > 2  # a round of extensions was tried
    timed = [c[2] for c in cands if c[2] is not None and not c[3]]
    won = cands[beam["won"]]
    assert won[1] == beam["chosen"] and won[2] == beam["best_s"] == min(timed)
    assert all(c[3] in ("", "invalid", "wrong output", "over BEAM_BUDGET") for c in cands)
    assert all((c[2] is None) == (c[3] in ("invalid", "over BEAM_BUDGET")) for c in cands)
    # a second run reads the choice from the disk cache: recorded as such, nothing timed
    cache: dict = {}
    monkeypatch.setattr(kernels, "_kernel_cache", cache)  # (get_kernel's, and _run_plan's in realize)
    monkeypatch.setattr(realize, "_kernel_cache", cache)
    with record.recording() as rec2, Context(BEAM=2):
        (a @ b).numpy()
    (k2,) = [k for k in rec2.trace["kernels"] if k.get("beam")]
    assert k2["beam"]["cached"] is True and k2["beam"]["chosen"] == beam["chosen"] and k2["beam"]["candidates"] == []
