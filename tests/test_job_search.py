"""Finding a job: the id prefix is a range of the primary key, a search no index serves
reads a bounded window of the newest jobs and says where it stopped, and the CLI takes
the same filters."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from supervisor import admin, jobsearch
from supervisor.broker import reads
from tests.conftest import cli, scalar

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _jobs(conn: psycopg.Connection, n: int, *, every: int = 1) -> list[str]:
    """``n`` jobs a minute apart (oldest first); every ``every``-th has kwargs.user_id = 7."""
    return [str(r[0]) for r in conn.execute(
        "INSERT INTO jobs (actor, kwargs, created_at) SELECT 'a', jsonb_build_object('user_id', CASE WHEN g %% %s = 0"
        " THEN 7 ELSE g + 100 END), %s + g * interval '1 minute' FROM generate_series(1, %s) AS g ORDER BY g RETURNING id",
        (every, T0, n)).fetchall()]


def _plan(conn: psycopg.Connection, statement: str, params: dict) -> str:
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))


def test_an_id_prefix_is_a_range_of_the_primary_key(conn):
    _jobs(conn, 200)
    conn.execute("ANALYZE jobs")
    where = admin.JobFilter(search=jobsearch.Search(id="0b6c3f"))
    lo, hi = jobsearch.id_range("0b6c3f")
    assert (lo, hi) == ("0b6c3f00-0000-0000-0000-000000000000", "0b6c3fff-ffff-ffff-ffff-ffffffffffff")
    plan = _plan(conn, reads.count_upto(where.names()), {**where.params(), "upto": 10})
    assert "jobs_pkey" in plan and "Index Cond: ((id >= " in plan, plan
    assert jobsearch.id_range("0B6C3F9E-1234")[0] == "0b6c3f9e-1234-0000-0000-000000000000"
    with pytest.raises(jobsearch.SearchError, match="example"):
        jobsearch.id_range("0b6c3g")


def test_a_search_reads_a_window_of_the_newest_jobs_and_goes_on_from_where_it_stopped(conn):
    ids = _jobs(conn, 30, every=10)  # user 7 at jobs 10, 20 and 30 (the newest)
    where = admin.JobFilter(search=jobsearch.Search.parse({"match": "kwargs.user_id = 7"}))
    # A window of 12 jobs: the newest 12 hold two matches; the page is short, so it says
    # where the window ended and the next page starts there.
    page = admin.jobs_page(conn, where, limit=5, scan_rows=12)
    assert [str(r["id"]) for r in page.rows] == [ids[29], ids[19]]
    assert page.scan_rows == 12 and page.scanned_to == T0 + timedelta(minutes=19)
    assert page.after == (T0 + timedelta(minutes=19), ids[18])
    # The next window (jobs 18 down to 7) holds the third; the one after that reaches the oldest.
    page = admin.jobs_page(conn, where, limit=5, after=page.after, scan_rows=12)
    assert [str(r["id"]) for r in page.rows] == [ids[9]] and page.after == (T0 + timedelta(minutes=7), ids[6])
    page = admin.jobs_page(conn, where, limit=5, after=page.after, scan_rows=12)
    assert page.rows == [] and page.after is None and page.scanned_to is None
    # A page that fills before its window ends goes on after its last row, as any page does.
    page = admin.jobs_page(conn, where, limit=1, scan_rows=12)
    assert [str(r["id"]) for r in page.rows] == [ids[29]] and page.after == (T0 + timedelta(minutes=30), ids[29])
    assert page.scanned_to is None
    # The count and a bulk action cover the first window: at least 2 (of the newest 12).
    assert admin.count_jobs(conn, where, scan_rows=12) == admin.Count(2, admin.BY_WINDOW, T0 + timedelta(minutes=19))
    assert admin.count_jobs(conn, where, scan_rows=30) == admin.Count(3)
    assert sorted(admin.matching_ids(conn, where, limit=100, scan_rows=12)) == sorted([ids[19], ids[29]])


def test_a_search_never_reads_more_than_its_window(conn):
    # However rare the match (here none), a page reads at most scan_rows jobs: the window
    # is a LIMIT over the created_at index, and the match is checked on its rows only.
    _jobs(conn, 500)
    # finished (the millions are in history; live rows are as many as the backlog)
    conn.execute("UPDATE jobs SET status = 'succeeded', finished_at = created_at")
    conn.execute("ANALYZE job_history")
    where = admin.JobFilter(status="succeeded", search=jobsearch.Search.parse({"match": "args[0] = 42"}))
    params = {**where.params(), "after_at": None, "after_id": None, "limit": 51, "scan_rows": 40}
    with conn.transaction(force_rollback=True):
        # 500 rows a day make a scan and sort of a day about as cheap as its index, and the
        # planner's choice then turned on whether autovacuum had been by (twice in a loaded
        # run): the millions this read is for never are; the plan's shape is what is checked
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL jit = off")  # priced-out scans pass jit_above_cost; compiling is not checked
        plan = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + reads.window_page(reads.PAGE_COLUMNS, where.names(),
                                                                                  False), params).fetchone()[0]

    def scans(node: dict) -> list[dict]:
        found = [node] if node.get("Relation Name", "").startswith("job_history") else []
        return found + [s for child in node.get("Plans", []) for s in scans(child)]

    # finished jobs: each day's (created_at, id) index, newest first, merged and cut at the
    # window (each day's scan reads at most one row past its share)
    found = scans(plan[0]["Plan"])
    assert found and all(s["Node Type"] in ("Index Scan", "Index Scan Backward")
                         and s["Index Name"].endswith("created_at_id_idx") for s in found), found
    assert sum(s["Actual Rows"] for s in found) <= 40 + len(found), found


def test_the_match_grammar():
    m = jobsearch.Match.parse('kwargs.order["line items"][2].sku == "A-1"')
    assert (m.column, m.path, m.value) == ("kwargs", ("order", "line items", "2", "sku"), "A-1")
    assert jobsearch.Match.parse("args = [1, 2]").path == ()
    assert jobsearch.Match.parse("args[0]=null").value is None
    assert jobsearch.Match.parse("kwargs.at = 2026-01-01T00:00:00Z").value == "2026-01-01T00:00:00Z"
    for bad in ("", "args", "args[0] ~ 1", "kwargs..a = 1", "kwargs.a = {", "argsx = 1", "args[0 = 1"):
        with pytest.raises(jobsearch.SearchError) as caught:
            jobsearch.Match.parse(bad)
        assert str(caught.value).startswith("match: ") and "kwargs.user_id = 7" in str(caught.value), bad


def test_jobs_list_finds_by_id_prefix_key_and_match(conn, database_url):
    ids = _jobs(conn, 30, every=10)
    conn.execute("UPDATE jobs SET dedupe_key = 'order-9' WHERE id = %s", (ids[3],))

    def listed(*args: str) -> list[str]:
        done = cli("jobs", "list", "--json", *args, url=database_url)
        assert done.returncode == 0, done.stderr
        return [j["id"] for j in json.loads(done.stdout)]

    assert listed("--id", ids[5][:8]) == [ids[5]]
    assert listed("--dedupe-key", "order-9") == [ids[3]]
    assert listed("--match", "kwargs.user_id = 7") == [ids[29], ids[19], ids[9]]
    # --scan-rows bounds the search, and stderr says where it stopped.
    done = cli("jobs", "list", "--match", "kwargs.user_id = 7", "--scan-rows", "15", url=database_url)
    assert done.returncode == 0 and done.stdout.count("\n") >= 2
    assert re.search(r"searched the newest 15 jobs \(created since 2026-01-01 00:16:00\); older ones were not "
                     r"searched: give --scan-rows", done.stderr), done.stderr
    assert ids[9] not in done.stdout and ids[19] in done.stdout
    # A bad expression: one line naming it, with an example, exit 2.
    bad = cli("jobs", "list", "--match", "user_id = 7", url=database_url)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("error: --match: expected args or kwargs at the start") and "args[0] = 42" in bad.stderr
    bad = cli("jobs", "list", "--id", "xyz", url=database_url)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --id: 'xyz' is not a job id"), bad.stderr
    assert scalar(conn, "SELECT count(*) FROM jobs") == 30


def test_the_jobs_page_keeps_every_search_in_its_url(conn, http_server):
    ids = _jobs(conn, 30, every=10)
    conn.execute("UPDATE jobs SET dedupe_key = 'order-9', concurrency_key = 'user-7' WHERE id = %s", (ids[9],))
    s = http_server()
    query = {"match": "kwargs.user_id = 7", "dedupe_key": "order-9", "concurrency_key": "user-7", "id": ids[9][:4]}
    page = s.client.get("/jobs", params=query)
    assert page.status_code == 200, page.text
    assert re.findall(r'<tr data-job="([^"]+)"', page.text) == [ids[9]]
    assert '<p id="count">1 job(s) match</p>' in page.text
    assert "has no index: it reads the\nnewest 100,000 jobs per page" in page.text
    # The form shows each filter back, so a copied link opens the same page.
    for name, value in query.items():
        assert re.search(rf'<input name="{name}"[^>]* value="{re.escape(html_escape(value))}"', page.text), name
    assert json.loads(re.search(r"data-filter='([^']*)'", page.text).group(1).replace("&#34;", '"')) == query
    # Only by id prefix: index-served, no note about scanning.
    page = s.client.get("/jobs", params={"id": ids[9][:6]})
    assert re.findall(r'<tr data-job="([^"]+)"', page.text) == [ids[9]] and "scan-note" not in page.text
    bad = s.client.get("/jobs", params={"match": "user_id = 7"})
    assert bad.status_code == 400 and "match: expected args or kwargs" in bad.text and "kwargs.user_id = 7" in bad.text


def html_escape(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_a_search_past_its_window_says_at_least_and_links_to_older_jobs(conn, http_server):
    # A window and a bit more: user 7 at the second newest job and at the oldest, past the window.
    n = jobsearch.SCAN_ROWS + 20
    ids = _jobs(conn, n, every=n - 1)
    conn.execute("UPDATE jobs SET kwargs = '{\"user_id\": 7}' WHERE id = %s", (ids[0],))
    conn.execute("ANALYZE jobs")
    s = http_server()
    page = s.client.get("/jobs", params={"match": "kwargs.user_id = 7"})
    assert re.findall(r'<tr data-job="([^"]+)"', page.text) == [ids[n - 2]]
    assert '<p id="count">at least 1 job(s) match</p>' in page.text, page.text
    assert "older jobs are not counted" in page.text
    older = re.search(r'<a href="(/jobs\?[^"]+)">search older jobs →</a>', page.text)
    assert older, page.text
    page = s.client.get(older.group(1).replace("&amp;", "&"))
    assert re.findall(r'<tr data-job="([^"]+)"', page.text) == [ids[0]]
    assert "search older jobs" not in page.text  # this window reached the oldest job
    api = s.client.get("/api/v1/jobs", params={"match": "kwargs.user_id = 7"}).json()
    assert [j["id"] for j in api["jobs"]] == [ids[n - 2]] and api["scan"]["scanned_to"] and api["next_cursor"]
    rest = s.client.get("/api/v1/jobs", params={"match": "kwargs.user_id = 7", "cursor": api["next_cursor"]}).json()
    assert [j["id"] for j in rest["jobs"]] == [ids[0]] and rest["next_cursor"] is None


def test_a_workflows_steps_are_found_by_its_id(conn, database_url, http_server):
    """``workflow``: the jobs of a workflow's enqueued steps (a plain step and a keyed one,
    both in the log), by the CLI, the API and the Jobs page; not
    its blocked steps (no job yet), nor another workflow's or a plain job."""
    import dramatiq

    import supervisor
    from supervisor.broker import PostgresBroker

    broker = PostgresBroker(database_url)
    try:
        step = dramatiq.actor(broker=broker, queue_name="wfsearch", actor_name="wfsearch_step")(lambda *a: None)
        wf = supervisor.workflow("searched", broker=broker)
        plain = wf.add(step.message(1))
        keyed = wf.add(step.message_with_options(args=(2,), concurrency_key="k", fairness_weight=2))
        wf.add(step.message(3), after=[plain, keyed])  # blocked: no job to find
        wf.send()
        other = supervisor.workflow("other", broker=broker)
        other.add(step.message(4))
        other.send()
        step.send(5)
    finally:
        broker.close()
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (plain,)) == 1
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (keyed,)) == 1  # (every kind: 054-056)

    done = cli("jobs", "list", "--json", "--workflow", wf.id, url=database_url)
    assert done.returncode == 0, done.stderr
    assert sorted(j["id"] for j in json.loads(done.stdout)) == sorted([plain, keyed])
    bad = cli("jobs", "list", "--workflow", "nightly", url=database_url)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --workflow: 'nightly' is not a workflow id"), bad.stderr

    s = http_server()
    body = s.client.get("/api/v1/jobs", params={"workflow": wf.id}).json()
    assert sorted(j["id"] for j in body["jobs"]) == sorted([plain, keyed]), body
    page = s.client.get("/jobs", params={"workflow": wf.id})
    assert page.status_code == 200, page.text
    assert sorted(re.findall(r'<tr data-job="([^"]+)"', page.text)) == sorted([plain, keyed])
    assert re.search(rf'<input name="workflow"[^>]* value="{wf.id}"', page.text)
    assert s.client.get("/api/v1/jobs", params={"workflow": "x"}).status_code == 400
