"""The dashboard over plain HTTP: its history outlives the HTTP child, and its actions
take only JSON with the token."""

from __future__ import annotations

import html
import re
from urllib.parse import parse_qs, urlsplit

from supervisor import admin
from tests.conftest import scalar, upstream_failure, wait_for
from tests.supervisor_helpers import log_producer


def test_chart_history_survives_a_restart_of_the_http_child(http_server, conn):
    conn.execute("INSERT INTO jobs (queue, actor) SELECT 'unserved', 'noop' FROM generate_series(1, 7)")
    first = http_server()
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM queue_samples WHERE queue = 'unserved' AND ready = 7"), 15,
             message="a queue sample")
    first.stop()
    second = http_server()
    page = second.client.get("/").text
    # The queue-depth chart draws the sample the first process wrote: one point at 7 (the top).
    assert re.search(r'<text x="\d+" y="26" text-anchor="end">7</text>', page)
    assert '<polyline points="' in page
    queues = second.client.get("/queues").text
    assert re.search(r'<td class="n ready">7</td>', queues)


def test_actions_take_json_with_the_token(http_server, conn):
    job = scalar(conn, "INSERT INTO jobs (queue, actor, status, finished_at) VALUES ('q', 'noop', 'failed', now()) "
                       "RETURNING id::text")
    s = http_server("--token", "t0ken")
    body = {"ids": [job]}
    assert s.client.post("/ui/jobs/retry", json=body).status_code == 401
    assert s.client.post("/ui/jobs/retry", json=body, headers={"X-Supervisor-Token": "nope"}).status_code == 401
    form = s.client.post("/ui/jobs/retry", content=f'{{"ids": ["{job}"]}}',
                         headers={"X-Supervisor-Token": "t0ken", "Content-Type": "text/plain"})
    assert form.status_code == 415
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "failed"
    ok = s.client.post("/ui/jobs/retry", json=body, headers={"X-Supervisor-Token": "t0ken"})
    assert ok.status_code == 200 and ok.json()["changed"] == [job]
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "pending"


def test_metrics_report_each_breaker(http_server, conn):
    """The app's gauges reach /metrics: an open breaker reads 1, a closed one 0."""
    from prometheus_client.parser import text_string_to_metric_families

    conn.execute("INSERT INTO sources (name, search_url, failure_streak, paused_until) VALUES"
                 " ('down', 'http://127.0.0.1:9/s?q={query}', 5, now() + interval '5 minutes'),"
                 " ('fine', 'http://127.0.0.1:9/s?q={query}', 0, NULL)")
    text = http_server().client.get("/metrics").text
    samples = {(s.name, s.labels.get("source")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("actor_supervisor_breaker_open", "down")] == 1
    assert samples[("actor_supervisor_breaker_open", "fine")] == 0
    assert samples[("actor_supervisor_breaker_failure_streak", "down")] == 5


def test_the_api_shows_a_jobs_progress_history(http_server, conn):
    job = scalar(conn, "INSERT INTO jobs (queue, actor, status, claimed_at, progress) VALUES ('q', 'noop',"
                       " 'running', now(), '{\"percent\": 60}') RETURNING id::text")
    conn.execute("INSERT INTO job_progress (job_id, at, percent, message, event) VALUES"
                 " (%s, now() - interval '2 seconds', 30, 'fetched', 'page'), (%s, now(), 60, 'parsed', 'rows')",
                 (job, job))
    server = http_server()
    found = server.client.get(f"/api/v1/jobs/{job}").json()
    assert [(p["percent"], p["message"], p["event"]) for p in found["progress_history"]] == [
        (30, "fetched", "page"), (60, "parsed", "rows")]
    page = server.client.get(f"/jobs/{job}").text
    assert 'id="progress-history"' in page and "<td>rows</td><td>parsed</td>" in page


def test_an_app_in_use_that_fails_costs_its_own_lines_only(http_server, conn):
    """The tracker is in use (its migrations are applied) but its table is not readable:
    the runtime's pages, their alerts and /metrics still answer, each saying what failed."""
    s = http_server()
    conn.execute("ALTER TABLE sources RENAME TO sources_away")
    try:
        overview = s.client.get("/")
        assert overview.status_code == 200
        assert "Price tracker: its alerts could not be read (relation &#34;sources&#34; does not exist" in overview.text
        limits = s.client.get("/limits")
        assert limits.status_code == 200 and "Price tracker: its limits could not be read" in limits.text
        metrics = s.client.get("/metrics")
        assert metrics.status_code == 200 and "actor_supervisor_database_up 1.0" in metrics.text
        assert "actor_supervisor_breaker_open" not in metrics.text
    finally:
        conn.execute("ALTER TABLE sources_away RENAME TO sources")


def test_the_jobs_page_shows_a_failures_exception_and_the_job_page_its_traceback(http_server, conn):
    error = upstream_failure()
    job = scalar(conn, "INSERT INTO jobs (queue, actor, status, attempts, finished_at, last_error)"
                       " VALUES ('q', 'fetch', 'failed', 3, now(), %s) RETURNING id::text", (error,))
    s = http_server()
    listing = s.client.get("/jobs").text
    assert '<td class="err">RuntimeError: upstream said no</td>' in listing, listing
    assert "Traceback" not in listing
    [api_row] = s.client.get("/api/v1/jobs").json()["jobs"]
    assert api_row["last_error"] == "RuntimeError: upstream said no"
    page = s.client.get(f"/jobs/{job}").text
    shown = re.search(r'<pre id="error" class="traceback">(.*?)</pre>', page, re.S)
    assert shown and html.unescape(shown.group(1)) == error  # the whole traceback


def test_the_queues_page_and_api_show_the_start_wait_apart_from_the_run_time(http_server, conn):
    # Due 3 s ago, started 1 s ago, finished now: it waited 2 s and ran 1 s.
    conn.execute("INSERT INTO jobs (queue, actor, status, created_at, run_at, started_at, finished_at) VALUES"
                 " ('q', 'fetch', 'succeeded', now() - interval '3 seconds', now() - interval '3 seconds',"
                 "  now() - interval '1 second', now())")
    s = http_server()
    row = re.search(r'<tr data-queue="q">(.*?)</tr>', s.client.get("/queues").text, re.S)
    assert row and '<td class="wait">2.0 s / 2.0 s / 2.0 s</td>' in row.group(1), row
    assert "<td>1.0 s / 1.0 s</td>" in row.group(1)  # run avg / p95
    [q] = s.client.get("/api/v1/queues").json()["queues"]
    assert (q["avg_duration_s"], q["wait_p50_s"], q["wait_p95_s"], q["wait_p99_s"]) == (1.0, 2.0, 2.0, 2.0)


def test_the_jobs_page_and_the_api_share_one_filter_and_one_cursor(http_server, conn):
    """The page's "Older" link carries the API's next cursor and the form's fields; the
    page it leads to holds the rest; a status that is none, or a cursor that is not one,
    is a 400 on both."""
    conn.execute("INSERT INTO jobs (queue, actor, created_at) SELECT 'paged', 'noop', now() - g * interval '1 minute'"
                 " FROM generate_series(1, 60) AS g")
    s = http_server()
    since = "2000-01-01T00:00"
    first = s.client.get("/jobs", params={"queue": "paged", "since": since})
    api = s.client.get("/api/v1/jobs", params={"queue": "paged", "created_after": f"{since}:00+00:00",
                                               "limit": 50}).json()
    found = re.search(r'<a id="next" href="([^"]+)"', first.text)
    assert first.status_code == 200 and found and api["next_cursor"]
    older = html.unescape(found.group(1))
    assert parse_qs(urlsplit(older).query) == {"queue": ["paged"], "since": [since], "cursor": [api["next_cursor"]]}
    rest = s.client.get(older).text
    shown = re.findall(r'<tr data-job="([^"]+)">', first.text) + re.findall(r'<tr data-job="([^"]+)">', rest)
    assert len(shown) == len(set(shown)) == 60 and 'id="next"' not in rest
    assert shown[:50] == [j["id"] for j in api["jobs"]]
    for bad in ({"status": "nope"}, {"cursor": "xyz"}):
        assert s.client.get("/jobs", params=bad).status_code == 400
        assert s.client.get("/api/v1/jobs", params=bad).status_code == 400


def test_one_cursor_pages_through_both_stores_in_order(http_server, conn, database_url):
    """Jobs of one queue in every part of the jobs view, sent in turn: by SQL to job_queue
    and by a producer at the default storage to the log, every third one cancelled (to
    job_history, and a done row of the log). Paged seven at a time, the API and the page
    show each once, newest first, as SQL orders them."""
    sent = []
    with log_producer(database_url, "paged2", {"noop": {}}) as producer:
        for i in range(40):
            if i % 2:
                sent.append(producer.actors["noop"].send().message_id)
            else:
                # (job_queue itself: through the jobs view an SQL insert goes to the log, 055)
                sent.append(str(scalar(conn, "INSERT INTO job_queue (queue, actor) VALUES ('paged2', 'noop')"
                                             " RETURNING id")))
    for job_id in sent[::3]:
        assert admin.cancel_job(conn, job_id)
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = ANY(%s)", (sent,)) == 20
    assert scalar(conn, "SELECT count(*) FROM job_done WHERE id = ANY(%s) AND status = 'cancelled'", (sent,)) > 0
    assert scalar(conn, "SELECT count(*) FROM job_history WHERE id = ANY(%s)", (sent,)) > 0
    s = http_server()
    for status in (None, "cancelled", "pending"):
        expected = [str(r[0]) for r in conn.execute(
            "SELECT id FROM jobs WHERE queue = 'paged2' AND (%(s)s::text IS NULL OR status = %(s)s)"
            " ORDER BY created_at DESC, id DESC", {"s": status}).fetchall()]
        assert len(expected) == {None: 40, "cancelled": 14, "pending": 26}[status]
        query = {"queue": "paged2", **({"status": status} if status else {})}
        seen, cursor = [], None
        while True:
            page = s.client.get("/api/v1/jobs", params={**query, "limit": 7, **({"cursor": cursor} if cursor else {})}
                                ).json()
            seen += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if not cursor:
                break
        assert seen == expected, status
        shown, url = [], "/jobs?" + "&".join(f"{k}={v}" for k, v in query.items())
        while url:
            text = s.client.get(url).text
            shown += re.findall(r'<tr data-job="([^"]+)">', text)
            found = re.search(r'<a id="next" href="([^"]+)"', text)
            url = html.unescape(found.group(1)) if found else ""
        assert shown == expected, status
