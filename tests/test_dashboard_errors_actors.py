"""The Errors and Actors pages in a real browser, against a real supervisor whose
workers fail in known places (tests/error_actors.py): what a person sees matches SQL,
and the buttons on a group change the database."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from tests.browser_helpers import Browser
from tests.conftest import scalar, wait_for
from tests.http_helpers import Dash, HttpServer, dashboard
from tests.supervisor_helpers import role

pytestmark = pytest.mark.xdist_group("dashboard-browser")

TOKEN = "errors-secret"


@pytest.fixture(scope="module")
def dash(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dash]:
    """A supervisor running the failing actors, its HTTP child, and their workload settled:
    three parse_feed jobs (three failed attempts each), four refuse jobs (one), two
    call_later jobs (one failed attempt, the retry ten minutes away), two fine ones."""
    roles = {"w": role(processes=1, threads=4, queues=("errors",), actors=("tests.error_actors",))}
    with dashboard(database_url, tmp_path_factory.mktemp("errors-dash"), roles, http={"token": TOKEN}) as found:
        for actor, n in (("parse_feed", 3), ("refuse", 4), ("call_later", 2), ("fine", 2)):
            found.db.execute("INSERT INTO jobs (queue, actor, args) SELECT 'errors', %s, jsonb_build_array(g)"
                             " FROM generate_series(1, %s) g", (actor, n))
        wait_for(lambda: scalar(found.db, "SELECT count(*) FROM jobs WHERE status = 'failed'") == 7
                 and scalar(found.db, "SELECT count(*) FROM jobs WHERE status IN ('retryable', 'succeeded')") == 4,
                 60, message="the failing workload settled")
        yield found


def _use_token(b: Browser) -> None:
    b.css("#token")[0].send_keys(TOKEN)
    b.click("#token-form button")
    b.wait_text("#flash", lambda t: "token kept" in t)


def _confirm(b: Browser) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    def alert():
        try:
            return b.driver.switch_to.alert
        except NoAlertPresentException:
            return None
    wait_for(alert, 5, message="confirm dialog").accept()


def _seconds(text: str) -> float | None:
    """A duration as the page prints it (render.duration): '—', '12 ms', '3.4 s', '5 min'."""
    if text == "—":
        return None
    number, unit = text.split()
    return float(number) * {"ms": 0.001, "s": 1, "min": 60, "h": 3600}[unit]


def _groups_in_sql(db: psycopg.Connection) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    return {(a, t, w): (n, n - f, f) for a, t, w, n, f in db.execute(
        "SELECT actor, error_type, error_where, count(*), count(*) FILTER (WHERE to_status = 'failed')"
        " FROM job_events WHERE error_type IS NOT NULL AND at > now() - interval '1 hour' GROUP BY 1, 2, 3")}


def test_errors_page_groups_failures_as_sql_counts_them_and_acts_on_a_group(dash: Dash, browser: Browser) -> None:
    db = dash.db
    browser.open(dash.base + "/errors?window=1h")
    want = _groups_in_sql(db)
    assert len(want) == 3
    rows = browser.driver.execute_script("""return Array.from(document.querySelectorAll('#errors tr.group')).map(r =>
        ['actor', 'type', 'where', 'attempts', 'retried', 'failed'].map(c => r.querySelector('td.' + c).innerText.trim()))""")
    got = {(a, t, w): (int(n), int(r), int(f)) for a, t, w, n, r, f in rows}
    assert got == want
    assert ("parse_feed", "json.decoder.JSONDecodeError", "tests/error_actors.py:parse_body") in got
    assert browser.text("#attempts-total") == str(sum(n for n, _, _ in want.values())) == "15"
    assert len(browser.css("#errors tr.group svg.spark polyline")) == 3  # attempts per bucket
    # the sample: the exception line, its traceback behind it
    refuse = browser.css('#errors tr.group')[[r[0] for r in rows].index("refuse")].get_attribute("data-group")
    sample = f'tr.sample[data-group="{refuse}"]'
    assert browser.text(f"{sample} summary").startswith("PermissionError: user ")
    browser.click(f"{sample} summary")
    assert "tests/error_actors.py" in browser.text(f"{sample} pre.traceback")
    browser.screenshot("errors")

    # Without the token the group's actions do not show (an operator's); with it, the
    # group's failed jobs are retried.
    [retry] = browser.css(f'tr.sample[data-group="{refuse}"] button[data-post="/ui/errors/retry"]')
    assert not retry.is_displayed()
    assert scalar(db, "SELECT count(*) FROM jobs WHERE actor = 'refuse' AND status = 'failed'") == 4
    _use_token(browser)
    browser.click(f'tr.sample[data-group="{refuse}"] button[data-post="/ui/errors/retry"]')
    _confirm(browser)
    browser.wait_text("#flash", lambda t: "4 job(s) retried" in t)
    assert scalar(db, "SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id WHERE j.actor = 'refuse'"
                      " AND e.reason = 'retried by operator'") == 4
    assert db.execute("SELECT affected, status, filter->>'actor' FROM audit_log WHERE action = 'errors.retry'"
                      ).fetchall() == [(4, 200, "refuse")]
    # ...and they fail again: the page follows (server-sent events), counting their second attempts
    wait_for(lambda: scalar(db, "SELECT count(*) FROM job_events WHERE actor = 'refuse' AND error_type IS NOT NULL") == 8,
             30, message="the retried jobs failed again")
    browser.wait_text(f'tr.group[data-group="{refuse}"] td.attempts', lambda t: t == "8", what="attempts after retry")

    # The call_later jobs wait ten minutes for their retry: cancel them all.
    later = next(g for g in browser.css("#errors tr.group") if "call_later" in g.text).get_attribute("data-group")
    browser.click(f'tr.sample[data-group="{later}"] button[data-post="/ui/errors/cancel"]')
    _confirm(browser)
    browser.wait_text("#flash", lambda t: "2 job(s) cancelled" in t)
    assert scalar(db, "SELECT count(*) FROM jobs WHERE actor = 'call_later' AND status = 'cancelled'") == 2

    # One actor's errors, over a day
    browser.open(dash.base + "/errors?window=24h&actor=parse_feed")
    assert browser.text("#actor-filter") == "parse_feed"
    assert browser.texts("#errors tr.group td.actor") == ["parse_feed"]
    assert browser.text("#errors tr.group td.attempts") == "9"


def test_actors_page_shows_what_sql_computes_and_links_to_jobs_and_errors(dash: Dash, browser: Browser) -> None:
    db = dash.db
    browser.open(dash.base + "/actors")
    want = {a: row for a, *row in db.execute("""
        SELECT actor, count(*) FILTER (WHERE status IN ('succeeded', 'failed')),
               count(*) FILTER (WHERE status = 'failed'),
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)),
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM started_at - greatest(created_at, run_at))),
               sum(extract(epoch FROM finished_at - started_at))
          FROM jobs WHERE status IN ('succeeded', 'failed') AND finished_at > now() - interval '1 hour'
         GROUP BY actor""")}
    retries = dict(db.execute("SELECT actor, count(*) FROM job_events WHERE to_status IN ('retryable', 'pending')"
                              " AND error_type IS NOT NULL AND at > now() - interval '1 hour' GROUP BY actor").fetchall())
    shown = browser.texts("#actors tr[data-actor] td.actor")
    assert set(shown) == set(want) | set(retries)
    # most time spent first
    busy = [float(want[a][4]) if a in want else 0.0 for a in shown]
    assert busy == sorted(busy, reverse=True)
    for actor, (finished, failed, run, wait, _) in want.items():
        row = f'#actors tr[data-actor="{actor}"]'
        assert int(browser.text(f"{row} td.finished")) == finished, actor
        assert browser.text(f"{row} td.failure-rate") == f"{100 * failed / finished:.1f} %", actor
        assert int(browser.text(f"{row} td.retries")) == retries.get(actor, 0), actor
        assert int(browser.text(f"{row} td.in-flight")) == 0
        for cell, pct in (("run", run), ("wait", wait)):
            shown_pct = [_seconds(t) for t in browser.text(f"{row} td.{cell}").split(" / ")]
            for s, w in zip(shown_pct, pct, strict=True):  # as printed: to the ms under a second
                assert s == pytest.approx(w, abs=0.0006 if w < 1 else 0.06), (actor, cell, shown_pct, pct)
    browser.screenshot("actors")

    href = browser.css('#actors tr[data-actor="refuse"] a.jobs')[0].get_attribute("href")
    assert href.endswith("/jobs?actor=refuse")
    browser.click('#actors tr[data-actor="refuse"] a.errors')
    wait_for(lambda: "/errors" in browser.driver.current_url, 10, message="the errors link followed")
    assert re.search(r"actor=refuse", browser.driver.current_url)
    assert browser.texts("#errors tr.group td.actor") == ["refuse"]


def test_read_only_hides_the_group_actions(dash: Dash, browser: Browser, tmp_path) -> None:
    server = HttpServer(dash.url, "--read-only", log_dir=tmp_path)
    try:
        for page in ("/errors?window=1h", "/actors"):
            browser.open(server.base + page)
            assert browser.css("main h1") and browser.text(".badge.readonly") == "read-only"
            assert browser.css("#errors tr.group, #actors tr[data-actor]"), page
            assert not browser.css("main button, #token"), page
        body = {"actor": "refuse", "error_type": "PermissionError", "where": "tests/error_actors.py:refuse"}
        assert server.client.post("/ui/errors/retry", json=body).status_code == 403
        assert server.client.post("/api/v1/errors/retry", json=body).status_code == 403
    finally:
        server.stop()
