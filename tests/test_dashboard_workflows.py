"""The dashboard's Workflows pages (issue 41, item 4): the list, a workflow's graph drawn as
SVG (bounded for a large one), live in a real browser while its steps run, and its cancel
and retry buttons behind the token."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from starlette.testclient import TestClient

import supervisor
from supervisor.broker import PostgresBroker
from supervisor.config import HttpConfig
from supervisor.http.app import create_app
from supervisor.http.dashboard import workflow_graph
from tests.browser_helpers import Browser
from tests.conftest import scalar, wait_for
from tests.http_helpers import Dash, dashboard
from tests.supervisor_helpers import role

pytestmark = pytest.mark.xdist_group("dashboard-browser")

TOKEN = "wf-secret"


def _steps(n_parallel: int) -> list[dict[str, Any]]:
    """One root, ``n_parallel`` children of it, one join of them all (as the graph reads them)."""
    root = {"id": "root", "actor": "a", "state": "succeeded", "parents": [], "linked": True}
    mid = [{"id": f"m{i}", "actor": "b", "state": "enqueued" if i % 3 else "succeeded", "parents": ["root"],
            "linked": True} for i in range(n_parallel)]
    join = {"id": "join", "actor": "c", "state": "blocked", "parents": [m["id"] for m in mid], "linked": False}
    return [root, *mid, join]


def test_the_layout_of_10000_steps_is_bounded_and_counts_what_it_folds() -> None:
    t0 = time.perf_counter()
    graph = workflow_graph.layout(_steps(9_998))
    drawn = workflow_graph.svg(graph, "big")
    took = time.perf_counter() - t0
    assert took < 1.0, took
    steps = [n for n in graph.nodes if not n.counts]
    (summary,) = [n for n in graph.nodes if n.counts]
    assert len(steps) == 1 + workflow_graph.LAYER_CAP + 1 and graph.layers == 3 and graph.steps == 10_000
    folded = 9_998 - workflow_graph.LAYER_CAP
    assert sum(summary.counts.values()) == folded and summary.label == f"+{folded} more in layer 2"
    assert summary.counts == {"enqueued": sum(1 for i in range(workflow_graph.LAYER_CAP, 9_998) if i % 3),
                              "succeeded": sum(1 for i in range(workflow_graph.LAYER_CAP, 9_998) if not i % 3)}
    # each drawn middle step has its two edges; the box one each way
    assert len(graph.edges) == 2 * workflow_graph.LAYER_CAP + 2
    assert drawn.count("<a ") == 1 + workflow_graph.LAYER_CAP and len(drawn) < 100_000


def test_a_long_chain_draws_its_first_layers_and_one_box_for_the_rest() -> None:
    chain = [{"id": f"s{i}", "actor": "x", "state": "blocked", "parents": [f"s{i - 1}"] if i else [], "linked": False}
             for i in range(2_000)]
    graph = workflow_graph.layout(chain)
    assert graph.layers == 2_000 and len(graph.nodes) == workflow_graph.MAX_LAYERS + 1
    assert graph.nodes[-1].counts == {"blocked": 2_000 - workflow_graph.MAX_LAYERS}
    assert graph.nodes[-1].label == f"{2_000 - workflow_graph.MAX_LAYERS} steps in layers 31–2000"


def test_a_diamonds_layers() -> None:
    diamond = [{"id": "a", "parents": []}, {"id": "b", "parents": ["a"]}, {"id": "c", "parents": ["a"]},
               {"id": "d", "parents": ["b", "c"]}, {"id": "e", "parents": ["a", "d"]}]
    assert workflow_graph.depths(diamond) == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 3}


def _unserved(broker: PostgresBroker, name: str, n_parallel: int) -> tuple[supervisor.Workflow, list[str]]:
    """A workflow no worker runs (its queue is served by none): the root enqueued, the rest blocked."""
    act = dramatiq.actor(broker=broker, queue_name="wfpage-nobody", actor_name="wfpage_idle")(lambda *a: None)
    wf = supervisor.workflow(name, broker=broker)
    root = wf.add(act.message(0))
    mid = [wf.add(act.message(i), after=[root]) for i in range(n_parallel)]
    join = wf.add(act.message(), after=mid)
    wf.send()
    return wf, [root, *mid, join]


def test_a_large_workflows_page_is_bounded_and_fast(conn, broker, database_url) -> None:
    """1 root, 9,998 parallel, 1 join: 52 boxes and a summary with its counts, in well under a second."""
    wf, ids = _unserved(broker, "wide", 9_998)
    app = create_app(url=database_url, http=HttpConfig(), listen_url="")
    client = TestClient(app)
    try:
        client.get(f"/workflows/{wf.id}")  # the pool opened, the templates compiled
        t0 = time.perf_counter()
        page = client.get(f"/workflows/{wf.id}")
        took = time.perf_counter() - t0
        listed = client.get("/workflows").text
        running = client.get("/workflows?state=running").text
        failed = client.get("/workflows?state=failed").text
        assert client.get("/workflows?state=sideways").status_code == 400
        assert client.get("/workflows/nope").status_code == 404
        assert client.get(f"/workflows/{uuid.uuid4()}").status_code == 404
    finally:
        app.state.supervisor.close()
    assert page.status_code == 200 and took < 1.0, took
    html = page.text
    assert len(re.findall(r'class="wf-step ', html)) == 1 + workflow_graph.LAYER_CAP + 1
    assert html.count('class="wf-summary"') == 1
    assert f'data-state="blocked">blocked {9_998 - workflow_graph.LAYER_CAP}<' in html
    assert 'class="wf-edge"' in html and html.count('class="wf-edge"') == 2 * workflow_graph.LAYER_CAP + 2
    # the root's job exists: linked; the blocked steps have none yet
    assert f'href="/jobs/{ids[0]}"' in html and f'href="/jobs/{ids[-1]}"' not in html
    assert len(re.findall(r'<tr data-step=', html)) == 50  # the steps not succeeded, bounded
    assert f'href="/workflows/{wf.id}"' in listed and f'href="/workflows/{wf.id}"' in running
    assert f'href="/workflows/{wf.id}"' not in failed and "No workflows failed." in failed


def test_the_list_pages_by_its_older_link(conn, database_url) -> None:
    conn.execute("INSERT INTO workflows (id, name, policy, steps, created_at) SELECT gen_random_uuid(), 'w' || g,"
                 " 'continue', 1, now() - g * interval '1 minute' FROM generate_series(1, 60) g")
    app = create_app(url=database_url, http=HttpConfig(), listen_url="")
    client = TestClient(app)
    try:
        first = client.get("/workflows").text
        older = re.search(r'<a id="next" href="([^"]+)"', first)
        assert older and len(re.findall(r"<tr data-workflow=", first)) == 50
        rest = client.get(older[1].replace("&amp;", "&")).text
        assert client.get("/workflows?cursor=nonsense").status_code == 400
    finally:
        app.state.supervisor.close()
    names = re.findall(r'<a href="/workflows/[^"]+">(w\d+)</a>', first + rest)
    assert names == [f"w{g}" for g in range(1, 61)] and 'id="next"' not in rest


# --- in a real browser, with real workers ------------------------------------------------


@pytest.fixture(scope="module")
def dash(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    roles = {"w": role(processes=1, threads=4, queues=("wfpage",), actors=("tests.workflow_page_actors",))}
    with dashboard(database_url, tmp_path_factory.mktemp("wfpage"), roles, http={"token": TOKEN}) as found:
        yield found


@pytest.fixture(scope="module")
def sender(dash: Dash) -> Iterator[tuple[PostgresBroker, Any]]:
    """A broker of the test's own and the gated actor as the workers know it (same name and queue)."""
    b = PostgresBroker(dash.url)
    gated = dramatiq.actor(broker=b, queue_name="wfpage", actor_name="gated", max_retries=0)(lambda *a: None)
    yield b, gated
    b.close()


def _go(dash: Dash, name: str) -> None:
    dash.db.execute("INSERT INTO test_results (job_id, tag) VALUES (%s, %s)", (str(uuid.uuid4()), f"go:{name}"))


def _started(dash: Dash, name: str) -> bool:
    return bool(scalar(dash.db, "SELECT count(*) FROM test_results WHERE tag = %s", (f"started:{name}",)))


def _states(b: Browser) -> dict[str, str]:
    return dict(b.driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.wf-graph .wf-step'))"
        ".map(e => [e.dataset.step, e.dataset.state]);"))


def test_a_diamonds_graph_changes_live_as_its_steps_run(dash: Dash, sender: Any, browser: Browser) -> None:
    broker, gated = sender
    wf = supervisor.workflow("diamond", broker=broker)
    a = wf.add(gated.message("a"))
    b = wf.add(gated.message("b"), after=[a])
    c = wf.add(gated.message("c"), after=[a])
    d = wf.add(gated.message("d"), after=[b, c])
    wf.send()
    wait_for(lambda: _started(dash, "a"), 30, message="step a running")

    browser.open(f"{dash.base}/workflows/{wf.id}")
    browser.driver.execute_script("window.notReloaded = true;")
    wait_for(lambda: _states(browser).get(a) == "running", 30, message=f"a drawn running: {_states(browser)}")
    assert _states(browser) == {a: "running", b: "blocked", c: "blocked", d: "blocked"}
    edges = browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.wf-graph .wf-edge')).map(e => [e.dataset.from, e.dataset.to]);")
    assert sorted(map(tuple, edges)) == sorted([(a, b), (a, c), (b, d), (c, d)])
    legend = browser.texts(".wf-legend li")
    assert legend == list(workflow_graph.STATES)
    # each step's box opens its job's page (a blocked one has no job yet)
    assert browser.css(f'svg.wf-graph a[href="/jobs/{a}"]') and not browser.css(f'svg.wf-graph a[href="/jobs/{d}"]')
    browser.screenshot("workflow")

    _go(dash, "a")
    wait_for(lambda: _started(dash, "b") and _started(dash, "c"), 30, message="b and c running")
    wait_for(lambda: _states(browser) == {a: "succeeded", b: "running", c: "running", d: "blocked"}, 30,
             message=f"b and c drawn running: {_states(browser)}")
    _go(dash, "b")
    _go(dash, "c")
    _go(dash, "d")
    wait_for(lambda: _states(browser) == dict.fromkeys((a, b, c, d), "succeeded"), 40,
             message=f"every step drawn succeeded: {_states(browser)}")
    browser.wait_text("#wf-state", lambda t: t == "succeeded")
    assert browser.driver.execute_script("return window.notReloaded === true")  # live, not reloaded
    # the live refreshes logged no error (a favicon the first load asks for is no page's)
    assert [e for e in browser.console_errors() if "favicon.ico" not in e] == []

    # a step's job page links back to its workflow
    browser.open(f"{dash.base}/jobs/{d}")
    assert browser.css("#workflow")[0].get_attribute("href").endswith(f"/workflows/{wf.id}")

    browser.open(f"{dash.base}/workflows")
    row = f'tr[data-workflow="{wf.id}"]'
    assert browser.text(f"{row} .status") == "succeeded" and browser.text(f"{row} td.steps") == "4"
    assert browser.text(f"{row} td.succeeded") == "4"
    browser.screenshot("workflows")
    browser.open(f"{dash.base}/workflows?state=failed")
    assert not browser.css(row)


def test_cancel_and_retry_from_the_page_need_the_token(dash: Dash, sender: Any, browser: Browser) -> None:
    broker, gated = sender
    wf = supervisor.workflow("steered", broker=broker)
    first = wf.add(gated.message("held"))
    then = wf.add(gated.message("after-held"), after=[first])
    wf.send()
    wait_for(lambda: _started(dash, "held"), 30, message="the first step running")
    browser.open(f"{dash.base}/workflows/{wf.id}")
    # without a token no button shows
    wait_for(lambda: browser.driver.execute_script("return document.body.dataset.roles") == "applied", 10)
    assert not [e for e in browser.css("button.act") if e.is_displayed()]
    browser.css("#token")[0].send_keys(TOKEN)
    browser.click("#token-form button")
    browser.wait_text("#flash", lambda t: "token kept" in t)

    browser.click(f'#wf-steps tr[data-step="{then}"] button.act')  # cancel the blocked step (and none below it)
    wait_for(lambda: browser.driver.switch_to.alert, 5, message="confirm").accept()
    browser.wait_text("#flash", lambda t: "1 step(s) cancelled" in t)
    assert scalar(dash.db, "SELECT state FROM workflow_steps WHERE id = %s", (then,)) == "cancelled"
    wait_for(lambda: _states(browser).get(then) == "cancelled", 10, message=f"drawn cancelled: {_states(browser)}")

    _go(dash, "held")  # the first step ends; the workflow ends cancelled (one step was)
    wait_for(lambda: scalar(dash.db, "SELECT state FROM workflows WHERE id = %s", (wf.id,)) == "cancelled", 30,
             message="the workflow ended cancelled")
    browser.open(f"{dash.base}/workflows/{wf.id}")
    _go(dash, "after-held")  # let it run through when retried
    browser.click("#wf-retry")
    browser.wait_text("#flash", lambda t: "1 step(s) retried" in t)
    wait_for(lambda: scalar(dash.db, "SELECT state FROM workflows WHERE id = %s", (wf.id,)) == "succeeded", 30,
             message="the retried step ran and the workflow succeeded")
    browser.wait_text("#wf-state", lambda t: t == "succeeded", timeout=30)
    assert scalar(dash.db, "SELECT count(*) FROM audit_log WHERE action = 'workflows.retry'") == 1


def test_a_large_workflow_in_the_browser_is_a_few_dozen_boxes(dash: Dash, sender: Any, browser: Browser) -> None:
    broker, _ = sender
    wf, ids = _unserved(broker, "wide-in-browser", 500)
    t0 = time.perf_counter()
    browser.open(f"{dash.base}/workflows/{wf.id}")
    took = time.perf_counter() - t0
    assert took < 3.0, took
    count = browser.driver.execute_script(
        "return document.querySelectorAll('svg.wf-graph .wf-step, svg.wf-graph .wf-summary').length;")
    assert count == 1 + workflow_graph.LAYER_CAP + 1 + 1
    counted = browser.driver.execute_script(  # (SVG text has no innerText)
        "return Array.from(document.querySelectorAll('svg.wf-graph .wf-summary .wf-count')).map(t => t.textContent);")
    assert counted == [f"blocked {500 - workflow_graph.LAYER_CAP}"]
    # the graph scrolls inside its box: the page never scrolls sideways
    assert browser.driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth") <= 0
