"""The dashboard in a real browser, against a real supervisor with real workers and
its HTTP child: what a person sees matches SQL, and the buttons change the database."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import psycopg
import pytest
import yaml

from supervisor import defaults
from tests.browser_helpers import Browser
from tests.conftest import cli, scalar, wait_for
from tests.http_helpers import Dash, HttpServer, answers, dashboard, free_port, runtime_config
from tests.supervisor_helpers import Supervisor, enqueue, log_producer, role

pytestmark = pytest.mark.xdist_group("dashboard-browser")

TOKEN = "dash-secret"
# Named tokens beside the single one (an admin): a viewer and an operator.
ROLE_TOKENS = {"vic": ("viewer", "DASH_VIC", "vic-secret"), "olga": ("operator", "DASH_OLGA", "olga-secret")}


@pytest.fixture(scope="module")
def dash(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    http = {"token": TOKEN, "tokens": {n: {"role": r, "secret_env": e} for n, (r, e, _) in ROLE_TOKENS.items()}}
    with dashboard(database_url, tmp_path_factory.mktemp("dash"), {"w": role(processes=2, threads=2,
                                                                              queues=("tests", "other"))},
                   http=http, env={e: secret for _, e, secret in ROLE_TOKENS.values()},
                   apps=["actors"],  # the bundled tracker in use: its page, breakers and alerts show
                   schedules={"nightly": {"cron": "0 3 * * *", "actor": "noop", "queue": "tests"}}) as found:
        yield found


def _cell(b: Browser, row: str, cls: str) -> int:
    return int(b.text(f"{row} td.{cls}"))


def _use_token(b: Browser, token: str) -> None:
    b.css("#token")[0].send_keys(token)
    b.click("#token-form button")
    b.wait_text("#flash", lambda t: "token kept" in t)


def _click(b: Browser, selector: str, *, confirm: bool = False) -> None:
    b.click(selector)
    if confirm:
        wait_for(lambda: _alert(b), 5, message="confirm dialog").accept()


def _cancel_on_its_page(b: Browser, db: psycopg.Connection, job_id: str) -> None:
    """Cancel the job whose page is open (its button, confirmed): the database and the page say so."""
    _click(b, "button.act", confirm=True)
    wait_for(lambda: scalar(db, "SELECT status FROM jobs WHERE id = %s", (job_id,)) == "cancelled", 10,
             message="the job cancelled from its page")
    b.wait_text("#job-status", lambda t: t == "cancelled")


def _alert(b: Browser):
    from selenium.common.exceptions import NoAlertPresentException

    try:
        return b.driver.switch_to.alert
    except NoAlertPresentException:
        return None


def test_overview_and_queues_show_what_sql_counts(dash: Dash, browser: Browser) -> None:
    db = dash.db
    enqueue(db, 20)
    db.execute("INSERT INTO jobs (queue, actor, kwargs, max_attempts) "
               "SELECT 'tests', 'flaky', '{\"fail_times\": 99}', 1 FROM generate_series(1, 3)")
    db.execute("INSERT INTO jobs (queue, actor, run_at) SELECT 'tests', 'noop', now() + interval '1 hour' "
               "FROM generate_series(1, 4)")
    wait_for(lambda: scalar(db, "SELECT count(*) FROM jobs WHERE status IN ('succeeded', 'failed')") == 23, 60,
             message="the workload finished")
    browser.open(dash.base + "/queues")
    row = 'tr[data-queue="tests"]'
    finished = scalar(db, "SELECT count(*) FROM jobs WHERE queue = 'tests' AND status IN ('succeeded', 'failed')"
                          " AND finished_at > now() - interval '1 hour'")
    assert _cell(browser, row, "scheduled") == scalar(
        db, "SELECT count(*) FROM jobs WHERE queue = 'tests' AND run_at > now() AND status = 'pending'") == 4
    assert _cell(browser, row, "failed") == scalar(db, "SELECT count(*) FROM jobs WHERE status = 'failed'") == 3
    assert _cell(browser, row, "throughput") == finished == 23
    assert _cell(browser, row, "workers") == 2
    browser.screenshot("queues")

    browser.open(dash.base + "/")
    assert int(browser.text("#total-scheduled")) == 4
    bars = browser.driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.chart rect.bar title')).map(t => t.textContent)")
    assert sum(int(t.split(": ")[1]) for t in bars if t.startswith("succeeded")) == scalar(
        db, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 20
    assert sum(int(t.split(": ")[1]) for t in bars if t.startswith("failed")) == 3
    assert browser.text('#roles tr[data-role="w"] td.count') == "2/2"
    assert "No alerts" in browser.text("#alerts")
    browser.screenshot("overview")


def test_jobs_retry_and_cancel_from_the_page_need_the_token(dash: Dash, browser: Browser) -> None:
    db = dash.db
    if not scalar(db, "SELECT count(*) FROM jobs WHERE status = 'failed'"):
        db.execute("INSERT INTO jobs (queue, actor, status, finished_at) VALUES ('tests', 'flaky', 'failed', now())")
    browser.open(dash.base + "/jobs?status=failed")
    failed = scalar(db, "SELECT count(*) FROM jobs WHERE status = 'failed'")
    assert browser.text("#count") == f"{failed} job(s) match"
    assert len(browser.css("#jobs tr[data-job]")) == failed
    first = browser.css("#jobs tr[data-job]")[0].get_attribute("data-job")

    # Without a token no action shows (and one sent without it is refused: tests/test_http_api.py).
    _wait_shown(browser, "button.bulk-act, input.pick", 0)

    _use_token(browser, TOKEN)
    browser.click(f'tr[data-job="{first}"] input.pick')
    browser.screenshot("jobs")
    _click(browser, 'button.bulk-act[data-action="retry"]')
    browser.wait_text("#flash", lambda t: "1 job(s) retried" in t)
    assert scalar(db, "SELECT count(*) FROM job_events WHERE job_id = %s AND reason = 'retried by operator'",
                  (first,)) == 1

    # One job's page: its arguments, attempts, timeline; cancel from there.
    later = scalar(db, "INSERT INTO jobs (queue, actor, kwargs, run_at) VALUES "
                       "('tests', 'record', '{\"n\": 4242}', now() + interval '1 hour') RETURNING id")
    browser.open(f"{dash.base}/jobs/{later}")
    assert '"n": 4242' in browser.text("#kwargs")
    # A row inserted by plain SQL takes its actor's budget at its first claim.
    assert browser.text("#attempts") == "0 of its actor's budget (set at the first claim)"
    _cancel_on_its_page(browser, db, later)
    browser.screenshot("job")

    # "All matching": every job whose args contain the text, on any page.
    db.execute("INSERT INTO jobs (queue, actor, kwargs, run_at) SELECT 'tests', 'record', "
               "jsonb_build_object('n', g, 'tag', 'bulk-me'), now() + interval '1 hour' FROM generate_series(1, 60) g")
    browser.open(dash.base + "/jobs?text=bulk-me&status=pending")
    assert browser.text("#count") == "60 job(s) match"
    assert len(browser.css("#jobs tr[data-job]")) == 50 and browser.css("#next")
    browser.click("#select-all-matching")
    # a live refresh (a job changed) keeps "all matching" ticked, as it keeps picked rows
    before = browser.driver.execute_script("return document.body.dataset.refreshed || ''")
    db.execute("INSERT INTO jobs (queue, actor, run_at) VALUES ('tests', 'record', now() + interval '1 hour')")
    wait_for(lambda: browser.driver.execute_script("return document.body.dataset.refreshed || ''") != before, 20,
             message="a live refresh")
    assert browser.css("#select-all-matching")[0].is_selected()
    _click(browser, 'button.bulk-act[data-action="cancel"]')
    browser.wait_text("#flash", lambda t: "60 job(s) cancelled" in t)
    assert scalar(db, "SELECT count(*) FROM jobs WHERE kwargs->>'tag' = 'bulk-me' AND status = 'cancelled'") == 60


def test_pause_from_the_page_stops_claims(dash: Dash, browser: Browser) -> None:
    db = dash.db
    browser.open(dash.base + "/queues")
    if browser.css("#token"):
        _use_token(browser, TOKEN)
    _click(browser, 'tr[data-queue="tests"] button.act', confirm=True)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM queue_pauses WHERE queue = 'tests'") == 1, 10,
             message="queue paused")
    browser.wait_text('tr[data-queue="tests"] td', lambda t: "paused" in t)
    enqueue(db, 5, actor="record", queue="tests")
    # The same workers keep serving another queue meanwhile: they are alive, just not claiming 'tests'.
    enqueue(db, 5, actor="record", queue="other")
    wait_for(lambda: scalar(db, "SELECT count(*) FROM jobs WHERE queue = 'other' AND status = 'succeeded'") == 5,
             30, message="the other queue drained")
    assert scalar(db, "SELECT count(*) FROM jobs WHERE queue = 'tests' AND status = 'pending' "
                      "AND run_at <= now() AND actor = 'record' AND started_at IS NULL") == 5
    _click(browser, 'tr[data-queue="tests"] button.act')
    browser.wait_text("#flash", lambda t: "resumed" in t)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM jobs WHERE queue = 'tests' AND status = 'pending' "
                                "AND run_at <= now()") == 0, 30, message="the resumed queue drained")


def test_workers_page_shows_a_killed_worker_restarted(dash: Dash, browser: Browser) -> None:
    browser.open(dash.base + "/workers")
    section = 'section[data-role="w"]'
    assert browser.text(f"{section} h2 .count") == "2/2"
    pids = {int(t) for t in browser.texts(f"{section} td.pid")}
    assert pids == dash.sup.pids("w")
    # in flight / the most rows a process of the role may hold (2 threads, paced prefetch)
    most = defaults.capacity(2, None)
    assert all(t.endswith(f"/{most}") for t in browser.texts(f"{section} td.flight"))
    assert browser.css(f"{section} .level.green")
    before = int(browser.text(f"{section} .restart-count"))
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    # No reload: the page refreshes itself (server-sent events) until it shows the new process.
    browser.wait_text(f"{section} .restart-count", lambda t: t == str(before + 1), timeout=30, what="restarts")
    wait_for(lambda: victim not in (now := {int(t) for t in browser.texts(f"{section} td.pid")})
             and len(now) == 2, 30, interval=0.2, message="new pid on the page")
    assert browser.css(f"{section} svg.spark polyline"), "an hour of memory and CPU samples"
    browser.screenshot("workers")

    # Scale through the master's control socket, as `supervisor scale w 3` would.
    if browser.css("#token"):
        _use_token(browser, TOKEN)
    browser.type('form.scale[data-role="w"] input', "3", clear=True)
    browser.click('form.scale[data-role="w"] button')
    browser.wait_text("#flash", lambda t: "scaled 2 -> 3" in t, timeout=30)
    assert len(dash.sup.pids("w")) == 3
    browser.wait_text(f"{section} h2 .count", lambda t: t == "3/3")


def test_schedules_limits_and_the_tracker_page(dash: Dash, browser: Browser) -> None:
    db = dash.db
    browser.open(dash.base + "/schedules")
    if browser.css("#token"):
        _use_token(browser, TOKEN)
    assert "0 3 * * *" in browser.text('tr[data-schedule="nightly"]')
    _click(browser, 'tr[data-schedule="nightly"] button.act')
    browser.wait_text("#flash", lambda t: "enqueued" in t)
    wait_for(lambda: scalar(db, "SELECT count(*) FROM job_runs r JOIN jobs j ON j.id = r.job_id "
                                "WHERE r.job_name = 'nightly' AND j.actor = 'noop'") == 1, 10, message="run recorded")
    wait_for(lambda: browser.css('tr[data-schedule="nightly"] svg.strip rect.run-running, '
                                 'tr[data-schedule="nightly"] svg.strip rect.run-succeeded'), 10,
             message="the run in the strip")
    browser.screenshot("schedules")

    db.execute("SELECT * FROM rate_limit_take('source:demo', 1, 5, 1, 100)")
    db.execute("SELECT * FROM rate_limit_take('source:demo', 1, 5, 1, 100)")
    src = scalar(db, "INSERT INTO sources (name, search_url, failure_streak, paused_until) "
                     "VALUES ('flaky-shop', 'http://127.0.0.1:9/s', 7, now() + interval '5 minutes') RETURNING id")
    db.execute("INSERT INTO watches (name, query, source_id, last_polled_at) VALUES ('gpu', 'rtx', %s, now())", (src,))
    browser.open(dash.base + "/limits")
    assert browser.text('tr[data-key="source:demo"] td.quota') == "2 / 100"
    tokens = float(browser.text('tr[data-key="source:demo"] td.tokens').split(" / ")[0])
    assert 3 <= tokens <= 5
    breakers = browser.text('table[data-title="Circuit breakers (sources)"]')
    assert "flaky-shop\topen\t7" in breakers
    browser.screenshot("limits")

    browser.open(dash.base + "/")
    assert "breaker of source flaky-shop is open" in browser.text("#alerts")
    browser.open(dash.base + "/apps/tracker")
    assert "gpu" in browser.text('table[data-title="Watches"]')
    assert "watches enabled\t1" in browser.text('table[data-title="State"]')
    browser.screenshot("tracker")


def test_a_keys_limits_are_seen_and_changed_from_the_limits_page(dash: Dash, browser: Browser) -> None:
    db = dash.db
    # waiting in job_queue (no worker serves the queue; through the jobs view they would be
    # pending in the log until a claim gates them, 055)
    db.execute("INSERT INTO job_queue (queue, actor, flow_key, flow, status) SELECT 'unserved', 'noop', 'tenant:b',"
               " '{\"c\": 1}', 'waiting' FROM generate_series(1, 2)")
    try:
        browser.open(dash.base + "/limits")
        if browser.css("#token"):
            _use_token(browser, TOKEN)
        row = 'tr[data-key="tenant:b"]'
        assert browser.text(f"{row} td.waiting") == "2" and browser.text(f"{row} td.running") == "0 / 1"
        # the jobs inserted above set off a live refresh, which may replace the form as the test types
        browser.type('form.limit input[name="key"]', "tenant:b")
        browser.type('form.limit input[name="concurrency"]', "3")
        browser.click("form.limit button")
        browser.wait_text("#flash", lambda t: "override set (concurrency 3)" in t)
        assert scalar(db, "SELECT override FROM rate_limiter_state WHERE key = 'tenant:b'") == {"c": 3}
        browser.wait_text(f"{row} td.running", lambda t: t == "0 / 3")
        _click(browser, f"{row} button.act", confirm=True)
        browser.wait_text("#flash", lambda t: "override cleared" in t)
        assert scalar(db, "SELECT override FROM rate_limiter_state WHERE key = 'tenant:b'") is None
        browser.screenshot("limits-override")
    finally:
        db.execute("DELETE FROM job_queue WHERE flow_key = 'tenant:b'")
        db.execute("DELETE FROM rate_limiter_state WHERE key = 'tenant:b'")


def _shown(b: Browser, selector: str) -> int:
    """How many elements match and are displayed (a hidden one has no offsetParent)."""
    return int(b.driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".filter(e => e.offsetParent !== null && getComputedStyle(e).visibility !== 'hidden').length",
        selector))


def _wait_shown(b: Browser, selector: str, n: int) -> None:
    """Wait until ``n`` matches are displayed: the page's script shows or hides each action
    by the token's role as it loads."""
    wait_for(lambda: _shown(b, selector) == n, 10, message=f"{n} of {selector} displayed")


def _forget_token(b: Browser, base: str) -> None:
    b.open(base + "/queues")
    b.driver.execute_script("sessionStorage.clear()")
    b.open(base + "/queues")


def test_a_tokens_role_decides_which_actions_show_and_the_audit_page_lists_them(dash: Dash, browser: Browser) -> None:
    db = dash.db
    db.execute("INSERT INTO jobs (queue, actor, status, finished_at) VALUES ('other', 'noop', 'succeeded', now())")
    _forget_token(browser, dash.base)
    pause = 'tr[data-queue="other"] button.act'
    _wait_shown(browser, pause, 0)
    assert browser.text("#who") == "no token: read only"
    browser.css("#token")[0].send_keys("not-a-token")
    browser.click("#token-form button")
    browser.wait_text("#flash", lambda t: "unknown token" in t)
    assert _shown(browser, pause) == 0
    # A viewer reads, and sees no action.
    browser.css("#token")[0].send_keys(ROLE_TOKENS["vic"][2])
    browser.click("#token-form button")
    browser.wait_text("#flash", lambda t: t == "token kept for this tab: vic (viewer)")
    _wait_shown(browser, pause, 0)
    assert browser.text("#who") == "vic · viewer"
    # An operator pauses and resumes; scaling and running a schedule need an admin: hidden.
    browser.css("#token")[0].send_keys(ROLE_TOKENS["olga"][2])
    browser.click("#token-form button")
    browser.wait_text("#flash", lambda t: "olga (operator)" in t)
    _wait_shown(browser, pause, 1)
    _click(browser, pause, confirm=True)
    browser.wait_text("#flash", lambda t: "queue other paused" in t)
    browser.wait_text(pause, lambda t: t == "Resume")  # the page refreshed after the action
    _click(browser, pause)
    browser.wait_text("#flash", lambda t: "queue other resumed" in t)
    browser.open(dash.base + "/workers")
    assert browser.css("form.scale")
    _wait_shown(browser, "form.scale", 0)
    browser.open(dash.base + "/schedules")
    assert browser.css("button.act")
    _wait_shown(browser, "button.act", 0)
    browser.open(dash.base + "/jobs")
    _wait_shown(browser, "button.bulk-act", 2)  # retry and cancel: an operator's
    # The Audit page: the same rows as SQL, newest first.
    browser.open(dash.base + "/audit?token=olga")
    rows = browser.texts("#audit tr[data-audit] td.action")
    expected = [r[0] for r in db.execute("SELECT action FROM audit_log WHERE token_name = 'olga' ORDER BY id DESC")]
    assert rows == expected == ["queues.resume", "queues.pause"]
    assert browser.texts("#audit tr[data-audit] td.target") == ["queue other", "queue other"]
    assert browser.texts("#audit tr[data-audit] td.outcome") == ["queue other resumed", "queue other paused"]
    browser.screenshot("audit")
    _use_token(browser, TOKEN)  # an admin again, for the tests after this one


def test_find_a_job_by_a_value_inside_its_arguments_and_share_the_link(dash: Dash, browser: Browser) -> None:
    db = dash.db
    wanted = scalar(db, "INSERT INTO jobs (queue, actor, kwargs, run_at, dedupe_key) VALUES ('tests', 'record',"
                        " '{\"user_id\": 4711, \"n\": 1}', now() + interval '1 hour', 'find-me') RETURNING id::text")
    db.execute("INSERT INTO jobs (queue, actor, kwargs, run_at) VALUES ('tests', 'record', '{\"user_id\": \"4711\"}',"
               " now() + interval '1 hour')")
    browser.open(dash.base + "/jobs")
    browser.type('#filter input[name="match"]', "kwargs.user_id = 4711")
    browser.click("#filter button")
    wait_for(lambda: "match=" in browser.driver.current_url, 10, message="the search in the URL")
    link = browser.driver.current_url
    assert browser.texts("#jobs tr[data-job] td a") == [wanted[:8]]
    matching = scalar(db, "SELECT count(*) FROM jobs WHERE kwargs->'user_id' = '4711'")
    assert browser.text("#count") == f"{matching} job(s) match" and matching == 1
    assert "reads the newest 100,000 jobs" in browser.text("#scan-note")
    # A colleague opening the link sees the same page, the search filled in.
    browser.open(dash.base + "/")
    browser.open(link)
    assert browser.texts("#jobs tr[data-job] td a") == [wanted[:8]]
    assert browser.css('#filter input[name="match"]')[0].get_attribute("value") == "kwargs.user_id = 4711"
    browser.screenshot("jobs-search")
    # By the start of its id, and by its dedupe key.
    browser.open(dash.base + "/jobs?id=" + wanted[:8])
    assert browser.texts("#jobs tr[data-job] td a") == [wanted[:8]] and not browser.css("#scan-note")
    browser.open(dash.base + "/jobs?dedupe_key=find-me")
    assert browser.texts("#jobs tr[data-job] td a") == [wanted[:8]]


def test_the_pages_find_show_and_act_on_jobs_sent_through_the_log(dash: Dash, browser: Browser) -> None:
    """Every other test here inserts its jobs by SQL, which puts them in job_queue; an app's
    producer at the default storage sends its plain jobs to the job log. The same pages
    list, search, show, retry and cancel those."""
    db = dash.db
    with log_producer(dash.url, "tests", {"flaky": {"max_retries": 0}}) as producer, \
            log_producer(dash.url, "parked", {"record": {}}) as parked:  # a queue no worker reads
        failed = [producer.actors["flaky"].send(fail_times=99).message_id for _ in range(2)]
        shown = parked.actors["record"].send(n=4343, user_id=4812).message_id
        bulk = [parked.actors["record"].send(n=g, tag="log-bulk").message_id for g in range(30)]
    wait_for(lambda: scalar(db, "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'failed'", (failed,)) == 2,
             60, message="the log's flaky jobs to fail")
    # They went through the log: their outcomes are done rows, the parked ones log rows.
    assert scalar(db, "SELECT count(*) FROM job_done WHERE id = ANY(%s) AND status = 'failed'", (failed,)) == 2
    assert scalar(db, "SELECT count(*) FROM job_log WHERE id = ANY(%s)", ([shown, *bulk],)) == 31
    assert scalar(db, "SELECT count(*) FROM job_queue WHERE id = ANY(%s)", ([*failed, shown, *bulk],)) == 0

    browser.open(dash.base + "/jobs?status=failed")
    if browser.css("#token"):
        _use_token(browser, TOKEN)
    assert browser.text("#count") == f"{scalar(db, 'SELECT count(*) FROM jobs WHERE status = %s', ('failed',))} job(s) match"
    listed = [r.get_attribute("data-job") for r in browser.css("#jobs tr[data-job]")]
    assert set(failed) <= set(listed), (failed, listed)
    browser.click(f'tr[data-job="{failed[0]}"] input.pick')
    _click(browser, 'button.bulk-act[data-action="retry"]')
    browser.wait_text("#flash", lambda t: "1 job(s) retried" in t)
    assert scalar(db, "SELECT count(*) FROM job_events WHERE job_id = %s AND reason = 'retried by operator'",
                  (failed[0],)) == 1
    assert scalar(db, "SELECT status FROM job_done WHERE id = %s", (failed[0],)) == "retried"
    wait_for(lambda: db.execute("SELECT status, attempts FROM jobs WHERE id = %s", (failed[0],)).fetchall()
             == [("failed", 2)], 60, message="the retried job to run (and fail) again, shown once")

    # Found by a value inside its arguments; its page shows them; cancelled from there.
    browser.open(dash.base + "/jobs")
    browser.type('#filter input[name="match"]', "kwargs.user_id = 4812")
    browser.click("#filter button")
    wait_for(lambda: "match=" in browser.driver.current_url, 10, message="the search in the URL")
    assert browser.texts("#jobs tr[data-job] td a") == [shown[:8]]
    browser.open(f"{dash.base}/jobs/{shown}")
    assert '"n": 4343' in browser.text("#kwargs")
    assert browser.text("#job-status") == "pending"
    _cancel_on_its_page(browser, db, shown)

    # "All matching" reaches every pending job of the log the filter names.
    browser.open(dash.base + "/jobs?text=log-bulk&status=pending")
    assert browser.text("#count") == "30 job(s) match"
    browser.click("#select-all-matching")
    _click(browser, 'button.bulk-act[data-action="cancel"]')
    browser.wait_text("#flash", lambda t: "30 job(s) cancelled" in t)
    assert conn_statuses(db, bulk) == {"cancelled": 30}


def conn_statuses(db: psycopg.Connection, ids: list[str]) -> dict[str, int]:
    return dict(db.execute("SELECT status, count(*) FROM jobs WHERE id = ANY(%s) GROUP BY 1", (ids,)).fetchall())


def test_read_only_hides_every_action(dash: Dash, browser: Browser, tmp_path) -> None:
    server = HttpServer(dash.url, "--read-only", log_dir=tmp_path)
    try:
        job = scalar(dash.db, "INSERT INTO jobs (queue, actor, status, finished_at) "
                              "VALUES ('tests', 'flaky', 'failed', now()) RETURNING id")
        for page in ("/", "/queues", "/jobs", f"/jobs/{job}", "/workers", "/schedules", "/limits", "/apps/tracker"):
            browser.open(server.base + page)
            assert browser.css("main h1"), page
            assert browser.text(".badge.readonly") == "read-only"
            assert not browser.css("button:not(#filter button), form.scale, #token, input.pick, .bulk"), page
        assert server.client.post("/ui/queues/tests/pause").status_code == 403
    finally:
        server.stop()


def test_live_updates_pause_while_the_tab_is_hidden(dash: Dash, browser: Browser) -> None:
    browser.open(dash.base + "/")
    browser.wait_text("#live", lambda t: True)  # the indicator exists
    wait_for(lambda: browser.driver.execute_script("return document.getElementById('live').className") == "on",
             10, message="the event stream open")
    # Headless Chromium has no real background tab: the page is told it is hidden the
    # way a browser tells it (document.hidden and a visibilitychange event).
    browser.driver.execute_script(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});"
        "document.dispatchEvent(new Event('visibilitychange'));")
    assert browser.driver.execute_script("return document.getElementById('live').className") == "paused"
    browser.driver.execute_script(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
        "document.dispatchEvent(new Event('visibilitychange'));")
    wait_for(lambda: browser.driver.execute_script("return document.getElementById('live').className") == "on",
             10, message="the event stream open again")


def test_overview_alerts_on_a_crash_looping_role(dash: Dash, browser: Browser) -> None:
    config = dash.sup.config_path
    good = config.read_text()
    data = yaml.safe_load(good)
    data["roles"]["broken"] = role(processes=1, threads=1, queues=("nowhere",), actors=("no_such_module",))
    config.write_text(yaml.safe_dump(data))
    try:
        assert cli("reload", "--timeout", "60", config=config).returncode == 0  # settles crash-looping
        wait_for(lambda: any(r["name"] == "broken" and r["state"] == "crash-looping"
                             for r in dash.sup.status()["roles"]), 30, message="the role crash-looping")
        browser.open(dash.base + "/")
        assert "role broken is crash-looping" in browser.text("body")
    finally:
        config.write_text(good)
        assert cli("reload", "--timeout", "60", config=config).returncode == 0


PAGES = ("/", "/?window=24h", "/queues", "/jobs", "/jobs?status=failed", "/workers", "/schedules", "/limits")
API_READS = ("/api/v1/queues", "/api/v1/jobs", "/api/v1/workers", "/api/v1/schedules", "/api/v1/system/state",
             "/api/v1/openapi.json")


def test_the_runtime_without_the_app(browser: Browser, fresh_database: str, tmp_path) -> None:
    """A config whose role runs only the tests' own actors, on the database `supervisor run`
    migrated for it (no tracker table): every page loads with no trace of the tracker, every
    API read and /metrics answer. Once the tracker's tables exist, the HTTP child still hides
    it (its config decides) while `supervisor http` shows it (the database decides)."""
    import httpx

    port = free_port()
    cfg = runtime_config(tmp_path / "sup.yaml", fresh_database)
    data = yaml.safe_load(cfg.read_text())
    data["http"] = {"listen": f"127.0.0.1:{port}"}
    cfg.write_text(yaml.safe_dump(data))
    sup = Supervisor(cfg)
    base = f"http://127.0.0.1:{port}"
    try:
        sup.wait_state({"w": 1, "http": 1}, timeout=60)
        wait_for(lambda: answers(base, "/api/v1/openapi.json"), 20, message="the HTTP child answers")
        with psycopg.connect(fresh_database, autocommit=True) as db:
            assert scalar(db, "SELECT to_regclass('sources') IS NULL")  # no tracker table
            enqueue(db, 3, actor="nap")
            db.execute("INSERT INTO jobs (queue, actor, status, finished_at, last_error) VALUES "
                       "('tests', 'flaky', 'failed', now(), 'RuntimeError: upstream said no')")
            wait_for(lambda: scalar(db, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 3, 30,
                     message="the role ran its jobs")
            job = scalar(db, "SELECT id FROM jobs WHERE status = 'failed'")
            for page in (*PAGES, f"/jobs/{job}"):
                browser.open(base + page)
                assert browser.css("main h1"), (page, browser.text("body")[:500])
                assert not browser.css('a[href^="/apps/"]'), page
            browser.open(base + "/")
            assert "No alerts" in browser.text("#alerts")
            assert browser.text('#roles tr[data-role="w"] td.count') == "1/1"
            browser.open(base + "/apps/tracker")
            assert "no such page" in browser.text("body")
            for path in API_READS + (f"/api/v1/jobs/{job}",):
                assert httpx.get(base + path, timeout=10).status_code == 200, path
            assert httpx.get(base + "/api/v1/system/state", timeout=10).json()["apps"] == []
            metrics = httpx.get(base + "/metrics", timeout=10)
            assert metrics.status_code == 200 and "actor_supervisor_database_up 1.0" in metrics.text
            assert "breaker" not in metrics.text
            for command in (("status",), ("reload", "--dry-run")):  # the commands that ask the master
                done = cli(*command, config=cfg)
                assert done.returncode == 0, (command, done.stderr)

            # The tracker's tables now exist, and the config still does not use it.
            assert cli("migrate", "--app", "actors", config=cfg).returncode == 0
            assert scalar(db, "SELECT to_regclass('sources') IS NOT NULL")
            browser.open(base + "/limits")
            assert browser.css("main h1") and not browser.css('a[href^="/apps/"]')
            assert "Circuit breakers" not in browser.text("main")
            standalone = HttpServer(fresh_database, log_dir=tmp_path)
            try:
                browser.open(standalone.base + "/")
                assert browser.css('a[href="/apps/tracker"]')
                assert standalone.client.get("/api/v1/system/state").json()["apps"] == ["actors"]
            finally:
                standalone.stop()
    finally:
        sup.cleanup()
