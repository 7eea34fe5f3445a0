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

from zeptograd import Tensor
from zeptograd.helpers import ArgumentError
from zeptograd.viz import record, trace
from zeptograd.viz.server import make_server, url_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def reachable_ops(nodes: list, sink: int) -> set[str]:
    seen, stack = {sink}, [sink]
    while stack:
        for s in nodes[stack.pop()][3]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return {nodes[i][0] for i in seen}


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
    assert [k["name"] for k in kernels] == ["r_6_23", "r_6_23", "E_6_23"]  # max, sum of exp, the division
    for k in kernels:
        assert k["runs"] == 1 and k["time_s"] > 0 and k["device"] == "CPU"
        assert "E_6_23" in k["src"] or "r_6_23" in k["src"]
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
    assert {tr["kernels"][r["kernel"]]["name"] for r in sched["realized"]} == {"r_6_23", "E_6_23"}
    assert "REDUCE_AXIS" in reachable_ops(sched["nodes"], sched["sink"])
    assert {r["why"] for r in sched["realized"] if tr["kernels"][r["kernel"]]["name"] == "E_6_23"} == {"an output"}
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
    assert len(kernels) == 1 and kernels[0]["runs"] == 2  # compiled once; the plain call and the capture ran it
    (jit,) = [k for k in rec.trace["kernels"] if k["kind"] == "jit"]
    assert jit["runs"] == 3 and jit["name"] == "TinyJit replay: 1 kernel" and "r_2_41" in jit["src"]
    assert [r[0] for r in rec.trace["runs"]].count(jit["id"]) == 3


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
print("imported", "zeptograd.viz.record" in sys.modules)
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
    assert [k["name"] for k in trace.read_trace(str(tmp_path / "trace.json"))["kernels"]] == [
        "r_5_12",
        "r_5_12",
        "E_5_12",
    ]


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
