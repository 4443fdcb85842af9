"""The JSON API against a real database, over real HTTP on loopback (`supervisor http`).

Each test runs twice (``matrix``): on the bundled tracker's config and database, and on a
runtime-only config (a role of the tests' own actors) over a database without the
tracker's tables."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import emptied, scalar, wait_for
from tests.http_helpers import Matrix, matrix_setup
from tests.tcp_proxy import TcpProxy

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _job(conn, *, queue="q1", actor="a", status="pending", args=(), created_min=0, finished_min=None,
         last_error=None) -> str:
    created = T0 + timedelta(minutes=created_min)
    finished = T0 + timedelta(minutes=finished_min) if finished_min is not None else None
    return str(scalar(conn, """
        INSERT INTO jobs (queue, actor, status, args, created_at, finished_at, last_error)
        VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id""",
        (queue, actor, status, json.dumps(list(args)), created, finished, last_error)))


@pytest.fixture(params=["tracker", "runtime"])
def matrix(request, tmp_path) -> Matrix:
    return matrix_setup(request, tmp_path)


@pytest.fixture
def conn(matrix):
    with emptied(matrix.url) as c:
        yield c


@pytest.fixture
def api(conn, http_server, matrix):
    return http_server(*matrix.args, url=matrix.url, env={"SUPERVISOR_HTTP_TOKEN": TOKEN})


def test_reads_health_and_the_guard(conn, api, matrix):
    conn.execute("INSERT INTO jobs (queue, actor) VALUES ('q1', 'a'), ('q1', 'a'), ('q2', 'b')")
    queues = {q["queue"]: q for q in api.client.get("/api/v1/queues").json()["queues"]}
    assert queues["q1"]["ready"] == 2 and queues["q2"]["ready"] == 1 and queues["q1"]["backlog"] == 2
    # No master runs: healthz says so, naming the reason.
    r = api.client.get("/healthz")
    assert r.status_code == 503 and "no master" in r.json()["problem"]
    # The config names roles, and no worker runs them.
    r = api.client.get("/readyz")
    assert r.status_code == 503 and any(f"role {matrix.role}: 0 of" in p for p in r.json()["problems"]), r.json()
    # Actions need the token: none, a wrong one, the right one by header (as a browser sends it).
    r = api.client.post("/api/v1/queues/q1/pause")
    assert r.status_code == 401 and "token" in r.json()["error"]
    assert api.client.post("/api/v1/queues/q1/pause", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert scalar(conn, "SELECT count(*) FROM queue_pauses") == 0
    r = api.client.post("/api/v1/queues/q1/pause", headers={"X-Supervisor-Token": TOKEN}, json={"reason": "deploy"})
    assert r.status_code == 200 and r.json()["paused"]["reason"] == "deploy"
    schema = api.client.get("/api/v1/openapi.json").json()
    assert {"/api/v1/queues", "/api/v1/jobs", "/api/v1/jobs/{job_id}", "/api/v1/jobs/{job_id}/retry",
            "/api/v1/queues/{queue}/pause", "/api/v1/workers", "/api/v1/schedules",
            "/api/v1/system/state"} <= set(schema["paths"])


def test_jobs_filters_and_cursor_paging(conn, api):
    ids = [_job(conn, created_min=i, args=[f"item-{i}"]) for i in range(7)]
    _job(conn, queue="q2", actor="b", status="failed", created_min=10, finished_min=20, args=["needle"])
    done = _job(conn, queue="q2", actor="b", status="succeeded", created_min=11, finished_min=30)

    def listed(**params) -> list[str]:
        r = api.client.get("/api/v1/jobs", params=params)
        assert r.status_code == 200, r.text
        return [j["id"] for j in r.json()["jobs"]]

    assert listed(queue="q1") == ids[::-1]
    assert listed(status="succeeded") == [done]
    assert len(listed(actor="b")) == 2
    assert len(listed(text="needle")) == 1 and listed(text="item-3") == [ids[3]]
    assert listed(created_after=(T0 + timedelta(minutes=5)).isoformat(), queue="q1") == [ids[6], ids[5]]
    assert listed(created_before=(T0 + timedelta(minutes=2)).isoformat()) == [ids[1], ids[0]]
    assert listed(finished_after=(T0 + timedelta(minutes=25)).isoformat()) == [done]
    assert len(listed(finished_before=(T0 + timedelta(minutes=25)).isoformat())) == 1
    # Pages of 3 over 9 jobs: 3 + 3 + 3, no repeats, newest first, then no cursor.
    seen, cursor, pages = [], None, 0
    while True:
        body = api.client.get("/api/v1/jobs", params={"limit": 3, **({"cursor": cursor} if cursor else {})}).json()
        seen += [j["id"] for j in body["jobs"]]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and len(seen) == len(set(seen)) == 9
    created = [scalar(conn, "SELECT created_at FROM jobs WHERE id = %s", (i,)) for i in seen]
    assert created == sorted(created, reverse=True)
    # Bad input is a 400 with a JSON error, never a 500.
    for bad in ({"status": "nope"}, {"created_after": "yesterday"}, {"limit": "0"}, {"cursor": "xyz"},
                {"colour": "red"}, {"created_after": "2026-01-01T00:00:00"}):
        r = api.client.get("/api/v1/jobs", params=bad)
        assert r.status_code == 400 and r.json()["error"], (bad, r.text)


def test_find_a_job_by_id_prefix_keys_and_a_value_inside_its_arguments(conn, api):
    def job(**cols) -> str:
        names = ", ".join(cols)
        marks = ", ".join(["%s"] * len(cols))
        return str(scalar(conn, f"INSERT INTO jobs (actor, {names}) VALUES ('a', {marks}) RETURNING id",
                          tuple(json.dumps(v) if isinstance(v, list | dict) else v for v in cols.values())))

    order = job(args=[42, "x"], kwargs={"user_id": 7, "order": {"lines": [{"sku": "A-1"}]}}, dedupe_key="order-9",
                concurrency_key="user-7")
    other = job(args=[7, 42], kwargs={"user_id": "7", "order": {"lines": [{"sku": "B-2"}]}}, dedupe_key="order-10")
    third = job(kwargs={"user id": 8}, concurrency_key="user-7", status="succeeded")

    def found(**params) -> list[str]:
        r = api.client.get("/api/v1/jobs", params=params)
        assert r.status_code == 200, (params, r.text)
        return sorted(j["id"] for j in r.json()["jobs"])

    # An id, the start of one (dashes or not, any case), and a prefix no job has.
    assert found(id=order) == [order]
    assert found(id=order[:8].upper()) == [order]
    assert found(id=order[:13]) == [order] and found(id=order[:13].replace("-", "")) == [order]
    assert found(id=next(p for p in ("0000", "ffff") if not order.startswith(p) and not other.startswith(p)
                         and not third.startswith(p))) == []
    assert found(dedupe_key="order-9") == [order]
    assert found(concurrency_key="user-7") == sorted([order, third])
    assert found(concurrency_key="user-7", status="succeeded") == [third]
    # A value at a path: positions count in arrays, and JSON types in values (7 is not "7").
    assert found(match="args[0] = 42") == [order]
    assert found(match="args[1] = 42") == [other]
    assert found(match="args[-1] = 42") == [other]
    assert found(match="kwargs.user_id = 7") == [order]
    assert found(match='kwargs.user_id = "7"') == [other]
    assert found(match="kwargs.user_id == 7.0") == [order]
    assert found(match='kwargs.order.lines[0].sku = "B-2"') == [other]
    assert found(match="kwargs.order.lines[0].sku = A-1") == [order]  # a bare word is a string
    assert found(match='kwargs["user id"] = 8') == [third]
    assert found(match="kwargs.order.lines = [{\"sku\": \"A-1\"}]") == [order]
    assert found(match="kwargs.missing = 1") == []
    assert found(match="args[0] = 42", dedupe_key="order-10") == []
    # A search no index serves says how far back it read; none that an index serves does.
    searched = api.client.get("/api/v1/jobs", params={"match": "args[0] = 42"}).json()
    assert searched["scan"] == {"rows": 100_000, "scanned_to": None} and searched["next_cursor"] is None
    assert "scan" not in api.client.get("/api/v1/jobs", params={"id": order[:6]}).json()
    # The same filters choose what a bulk action changes.
    r = api.client.post("/api/v1/jobs/cancel", headers=AUTH, json={"match": "kwargs.user_id = 7"})
    assert r.status_code == 200 and r.json()["ids"] == [order], r.text
    # A bad expression or id: one 400 naming it, with an example.
    for params, says in (({"match": "user_id = 7"}, "match: expected args or kwargs at the start"),
                         ({"match": "kwargs.user_id"}, "match: expected '= value'"),
                         ({"match": "kwargs.user_id = "}, "match: expected a value after '='"),
                         ({"match": "args[x] = 1"}, "match: expected [integer]"),
                         ({"match": "kwargs.a = hello world"}, "match: 'hello world' is neither JSON"),
                         ({"match": "kwargs. = 1"}, "match: expected a key name after '.'"),
                         ({"id": "not-hex"}, "id: 'not-hex' is not a job id or the start of one"),
                         ({"id": "0" * 33}, "id: ")):
        r = api.client.get("/api/v1/jobs", params=params)
        assert r.status_code == 400, (params, r.text)
        error = r.json()["error"]
        assert error.startswith(says) and "example" in error, (params, error)
    assert "kwargs.user_id = 7" in api.client.get("/api/v1/jobs", params={"match": "x"}).json()["error"]


def test_job_detail_and_actions(conn, api):
    failed = _job(conn, status="failed", args=[1, "x"], finished_min=1, last_error="Traceback ...\nValueError: boom")
    conn.execute("UPDATE jobs SET attempts = 3, result = '{\"ok\": 1}', progress = '{\"pct\": 50}' WHERE id = %s",
                 (failed,))
    conn.execute("INSERT INTO job_events (job_id, who, from_status, to_status, reason) "
                 "VALUES (%s, 'w1', 'running', 'failed', 'boom')", (failed,))
    job = api.client.get(f"/api/v1/jobs/{failed}").json()
    assert job["args"] == [1, "x"] and job["attempts"] == 3 and job["result"] == {"ok": 1}
    assert job["progress"] == {"pct": 50} and "ValueError: boom" in job["last_error"]
    assert [e["reason"] for e in job["timeline"]] == ["boom"]
    assert api.client.get(f"/api/v1/jobs/{uuid.uuid4()}").status_code == 404
    assert api.client.get("/api/v1/jobs/not-a-uuid").status_code == 400

    assert api.client.post(f"/api/v1/jobs/{failed}/retry").status_code == 401
    r = api.client.post(f"/api/v1/jobs/{failed}/retry", headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "pending"
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (failed,)) == "pending"
    assert api.client.post(f"/api/v1/jobs/{failed}/retry", headers=AUTH).status_code == 409  # not failed now
    assert api.client.post(f"/api/v1/jobs/{failed}/cancel", headers=AUTH).status_code == 200
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (failed,)) == "cancelled"
    assert api.client.post(f"/api/v1/jobs/{uuid.uuid4()}/cancel", headers=AUTH).status_code == 404


def test_bulk_actions_by_filter(conn, api):
    mine = [_job(conn, queue="bulk", actor="x", args=[i]) for i in range(4)]
    other = _job(conn, queue="other", actor="x")
    r = api.client.post("/api/v1/jobs/cancel", headers=AUTH, json={})
    assert r.status_code == 400  # no filter: refuse rather than cancel everything
    r = api.client.post("/api/v1/jobs/cancel", headers=AUTH, json={"queue": "bulk"})
    assert r.status_code == 200 and r.json()["changed"] == 4 and sorted(r.json()["ids"]) == sorted(mine)
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (other,)) == "pending"
    r = api.client.post("/api/v1/jobs/retry", headers=AUTH, json={"queue": "bulk", "text": "3"})
    assert r.json()["changed"] == 1
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE queue = 'bulk' AND status = 'pending'") == 1


def test_pause_resume_workers_schedules_and_state(conn, api, matrix):
    r = api.client.post("/api/v1/queues/emails/pause", headers=AUTH, json={"reason": "smtp down"})
    assert r.status_code == 200
    queues = {q["queue"]: q for q in api.client.get("/api/v1/queues").json()["queues"]}
    assert queues["emails"]["paused"] is True and queues["emails"]["paused_reason"] == "smtp down"
    state = api.client.get("/api/v1/system/state").json()
    assert [p["queue"] for p in state["paused_queues"]] == ["emails"] and state["database"]["reachable"]
    assert api.client.post("/api/v1/queues/emails/resume", headers=AUTH).json()["resumed"] is True
    assert api.client.post("/api/v1/queues/emails/resume", headers=AUTH).json()["resumed"] is False
    assert scalar(conn, "SELECT count(*) FROM queue_pauses") == 0

    conn.execute("INSERT INTO workers (id, host, pid, role, queues, state, rss_bytes, cpu_percent, jobs_in_flight, "
                 "capacity) VALUES ('h:1:t', 'h', 1, 'w', '{q1}', 'paused', 1000, 12.5, 2, 8)")
    workers = api.client.get("/api/v1/workers").json()["workers"]
    assert [(w["id"], w["jobs_in_flight"], w["capacity"], w["state"]) for w in workers] == [("h:1:t", 2, 8, "paused")]

    conn.execute("INSERT INTO job_runs (job_name, scheduled_for, status) VALUES (%s, now(), 'succeeded')",
                 (matrix.schedule,))
    schedules = {s["name"]: s for s in api.client.get("/api/v1/schedules").json()["schedules"]}
    # The config names the schedule with its cron: next fire is computed, runs come from the DB.
    assert schedules[matrix.schedule]["cron"] and schedules[matrix.schedule]["next_fire"]
    assert [r["status"] for r in schedules[matrix.schedule]["recent_runs"]] == ["succeeded"]


ROLE_TOKENS = {"vic": ("viewer", "VIC_TOKEN", "v-secret"), "olga": ("operator", "OLGA_TOKEN", "o-secret"),
               "ada": ("admin", "ADA_TOKEN", "a-secret")}


def _with_tokens(matrix: Matrix, tmp_path) -> tuple[str, ...]:
    """The matrix's config with `http.tokens` (one token per role, secrets from the environment)."""
    import yaml

    from tests.conftest import ROOT

    source = matrix.args[1] if matrix.args else ROOT / "config" / "supervisor.yaml"
    data = yaml.safe_load(Path(source).read_text())
    data["http"] = {"tokens": {name: {"role": role, "secret_env": env} for name, (role, env, _) in ROLE_TOKENS.items()}}
    path = tmp_path / "with-tokens.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return ("-c", str(path))


def test_roles_refuse_what_a_token_may_not_do_and_the_audit_log_keeps_every_action(conn, http_server, matrix,
                                                                                   tmp_path):
    env = {e: secret for _, e, secret in ROLE_TOKENS.values()}
    s = http_server(*_with_tokens(matrix, tmp_path), url=matrix.url, env={**env, "SUPERVISOR_HTTP_TOKEN": TOKEN})
    as_ = {name: {"Authorization": f"Bearer {secret}"} for name, (_, _, secret) in ROLE_TOKENS.items()}
    failed = [_job(conn, status="failed", finished_min=i) for i in range(3)]

    # Which token is this? Each one's name and role, what it may do; an unknown one is a 401.
    me = s.client.get("/api/v1/whoami", headers=as_["olga"]).json()
    assert (me["name"], me["role"], me["auth_required"]) == ("olga", "operator", True)
    assert me["actions"]["jobs.retry"] == {"needs": "operator", "allowed": True}
    assert me["actions"]["roles.scale"] == {"needs": "admin", "allowed": False}
    assert s.client.get("/api/v1/whoami", headers=AUTH).json()["role"] == "admin"  # the single token: an admin
    assert s.client.get("/api/v1/whoami", headers=AUTH).json()["name"] == "token"
    assert s.client.get("/api/v1/whoami").json()["role"] is None
    assert s.client.get("/api/v1/whoami", headers={"X-Supervisor-Token": "nope"}).status_code == 401

    # No token, or one no one has: 401 naming the role the action needs.
    retry = f"/api/v1/jobs/{failed[0]}/retry"
    for headers, why in (({}, "no token was sent"), ({"Authorization": "Bearer nope"}, "not one of the configured")):
        r = s.client.post(retry, headers=headers)
        assert r.status_code == 401 and r.json()["needs"] == "operator" and r.json()["action"] == "jobs.retry"
        assert "jobs.retry needs a token of role operator or admin" in r.json()["error"] and why in r.json()["error"]
        assert r.headers["www-authenticate"] == "Bearer"
    # A role below the action's: 403, naming the token, its role and the role needed.
    r = s.client.post(retry, headers=as_["vic"])
    assert r.status_code == 403 and r.json()["error"] == "token vic is a viewer: jobs.retry needs role operator or admin"
    assert (r.json()["needs"], r.json()["role"], r.json()["token"]) == ("operator", "viewer", "vic")
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (failed[0],)) == "failed"
    # An operator retries, cancels and pauses; scaling, schedules and sending jobs need an admin.
    assert s.client.post(retry, headers=as_["olga"]).status_code == 200
    r = s.client.post("/api/v1/jobs/retry", headers=as_["olga"], json={"status": "failed", "queue": "q1"})
    assert r.status_code == 200 and sorted(r.json()["ids"]) == sorted(failed[1:])
    assert s.client.post("/api/v1/queues/q9/pause", headers=as_["olga"], json={"reason": "deploy"}).status_code == 200
    for path, body in (("/ui/roles/w/scale", {"processes": 2}), ("/ui/schedules/nightly/run", {}),
                       ("/api/v1/jobs", {"actor": "noop"})):
        r = s.client.post(path, headers=as_["olga"], json=body)
        assert r.status_code == 403 and r.json()["needs"] == "admin", (path, r.text)
    r = s.client.post("/api/v1/jobs", headers=as_["ada"], json={"actor": "noop", "queue": "q1"})
    assert r.status_code == 201
    sent = r.json()["id"]
    r = s.client.post("/ui/roles/w/scale", headers=as_["ada"], json={"processes": 2})
    assert r.status_code == 409 and "no local master" in r.json()["message"]  # past the guard, no master here

    # The audit log: every action, done or refused, newest first, as SQL holds it.
    entries = s.client.get("/api/v1/audit").json()["entries"]
    seen = [(e["token_name"], e["action"], e["status"]) for e in entries]
    assert seen == [
        ("ada", "roles.scale", 409), ("ada", "jobs.send", 201), ("olga", "jobs.send", 403),
        ("olga", "schedules.run", 403), ("olga", "roles.scale", 403), ("olga", "queues.pause", 200),
        ("olga", "jobs.retry", 200), ("olga", "jobs.retry", 200), ("vic", "jobs.retry", 403),
        (None, "jobs.retry", 401), (None, "jobs.retry", 401)], seen
    assert seen == [tuple(r) for r in conn.execute("SELECT token_name, action, status FROM audit_log ORDER BY id DESC")]
    by = {(e["token_name"], e["action"], e["status"]): e for e in reversed(entries)}  # the newest of each
    bulk = by[("olga", "jobs.retry", 200)]  # the bulk one
    assert bulk["filter"] == {"status": "failed", "queue": "q1"} and bulk["affected"] == 2
    assert sorted(bulk["job_ids"]) == sorted(failed[1:]) and bulk["role"] == "operator"
    one = entries[7]
    assert (one["target"], one["affected"], one["job_ids"], one["filter"]) == (f"job {failed[0]}", 1, [failed[0]], None)
    assert by[("olga", "queues.pause", 200)]["target"] == "queue q9"
    assert by[("olga", "queues.pause", 200)]["detail"] == {"reason": "deploy"}
    assert by[("ada", "jobs.send", 201)]["job_ids"] == [sent]
    assert by[("ada", "roles.scale", 409)]["detail"] == {"processes": 2}
    assert "needs role admin" in by[("olga", "roles.scale", 403)]["outcome"]
    assert by[("vic", "jobs.retry", 403)]["client"] == "127.0.0.1"
    # Filtered by token and by action, and paged.
    assert {e["token_name"] for e in s.client.get("/api/v1/audit", params={"token": "ada"}).json()["entries"]} == {"ada"}
    assert len(s.client.get("/api/v1/audit", params={"action": "jobs.retry"}).json()["entries"]) == 5
    page = s.client.get("/api/v1/audit", params={"limit": 4}).json()
    rest = s.client.get("/api/v1/audit", params={"limit": 20, "cursor": page["next_cursor"]}).json()
    assert [e["id"] for e in page["entries"] + rest["entries"]] == [e["id"] for e in entries]
    assert rest["next_cursor"] is None
    assert s.client.get("/api/v1/audit", params={"limit": 0}).status_code == 400
    # The Audit page shows the same rows.
    html = s.client.get("/audit", params={"token": "olga"}).text
    assert html.count("<tr data-audit=") == 6 and '<td class="token">olga</td>' in html
    paths = s.client.get("/api/v1/openapi.json").json()["paths"]
    assert {"/api/v1/whoami", "/api/v1/audit"} <= set(paths)


def test_read_only_refuses_every_action(conn, http_server, matrix):
    s = http_server("--read-only", *matrix.args, url=matrix.url)
    job = _job(conn, status="failed")
    for path in (f"/api/v1/jobs/{job}/retry", f"/api/v1/jobs/{job}/cancel", "/api/v1/queues/q/pause",
                 "/api/v1/queues/q/resume", "/api/v1/jobs/retry", "/api/v1/jobs/cancel"):
        r = s.client.post(path, json={"queue": "q1"})
        assert r.status_code == 403 and "read-only" in r.json()["error"], path
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job,)) == "failed"
    assert s.client.get("/api/v1/jobs").status_code == 200  # reads still work


def test_readyz_and_metrics_when_the_database_is_down(database_url, http_server):
    with TcpProxy(database_url) as proxy:
        s = http_server(url=proxy.url)
        assert not any("database" in p for p in s.client.get("/readyz").json()["problems"])
        proxy.go_down()
        r = s.client.get("/readyz")
        assert r.status_code == 503 and any(p.startswith("database unreachable") for p in r.json()["problems"])
        r = s.client.get("/metrics")  # still answers, saying the database is down
        assert r.status_code == 200 and "actor_supervisor_database_up 0.0" in r.text
        r = s.client.get("/api/v1/jobs")
        assert r.status_code == 503 and "database unavailable" in r.json()["error"]
        proxy.come_back()  # the pool reconnects on its own
        wait_for(lambda: s.client.get("/api/v1/jobs").status_code == 200, 20, interval=0.2, message="API back")


def test_every_page_and_read_answers_and_an_app_shows_only_where_in_use(conn, api, matrix):
    """Every dashboard page, every GET of the API and /metrics answer on both configs; the
    tracker's page, link, alerts and gauges are there only where its tables are (`supervisor
    http` standalone reads the apps in use from the database)."""
    job = _job(conn, status="failed", finished_min=1, last_error="Traceback ...\nValueError: boom")
    tracker = "actors" in matrix.apps
    for page in ("/", "/?window=6h", "/?window=24h", "/queues", "/jobs", f"/jobs/{job}", "/workers", "/schedules",
                 "/limits"):
        r = api.client.get(page)
        assert r.status_code == 200, (page, r.text[-2000:])
        assert ('href="/apps/tracker"' in r.text) == tracker, page
    assert ("Circuit breakers" in api.client.get("/limits").text) == tracker
    assert api.client.get("/apps/tracker").status_code == (200 if tracker else 404)
    for path in ("/api/v1/queues", "/api/v1/jobs", f"/api/v1/jobs/{job}", "/api/v1/workers", "/api/v1/schedules",
                 "/api/v1/system/state", "/api/v1/openapi.json"):
        r = api.client.get(path)
        assert r.status_code == 200, (path, r.text)
    assert api.client.get("/api/v1/system/state").json()["apps"] == matrix.apps
    metrics = api.client.get("/metrics")
    assert metrics.status_code == 200 and "actor_supervisor_database_up 1.0" in metrics.text
    assert ("# HELP actor_supervisor_breaker_open" in metrics.text) == tracker


def test_create_a_job_over_http_with_one_clear_error_per_bad_field(conn, api):
    body = {"actor": "noop", "queue": "tests", "args": [1, "two"], "kwargs": {"k": 3},
            "options": {"priority": 7, "delay": 60_000, "concurrency_key": "c1", "max_retries": 2}}
    assert api.client.post("/api/v1/jobs", json=body).status_code == 401  # an action: the token
    r = api.client.post("/api/v1/jobs", json=body, headers=AUTH)
    assert r.status_code == 201 and r.json()["deduplicated"] is False, r.text
    row = conn.execute("SELECT actor, queue, args, kwargs, priority, concurrency_key, max_attempts, status,"
                       " run_at > now() + interval '50 seconds' FROM jobs WHERE id = %s", (r.json()["id"],)).fetchone()
    # a concurrency-only key: the log's (055, sent by name), pending in job_timers until due
    # and gated by its claim (job_queue kept such a row 'waiting')
    assert row == ("noop", "tests", [1, "two"], {"k": 3}, 7, "c1", 3, "pending", True)

    # A dedupe hit answers with the live job's id.
    first = api.client.post("/api/v1/jobs", json={"actor": "noop", "options": {"dedupe_key": "d1"}}, headers=AUTH)
    again = api.client.post("/api/v1/jobs", json={"actor": "noop", "options": {"dedupe_key": "d1"}}, headers=AUTH)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == {**first.json(), "deduplicated": True}
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE dedupe_key = 'd1'") == 1

    for bad, field in (({"queue": "q"}, "actor: required"), ({"actor": "no spaces"}, "actor: must be a name"),
                       ({"actor": "a", "args": {"x": 1}}, "args: must be a JSON array"),
                       ({"actor": "a", "kwargs": [1]}, "kwargs: must be a JSON object"),
                       ({"actor": "a", "options": {"delay": -1}}, "options.delay: must be milliseconds"),
                       ({"actor": "a", "options": {"priority": "high"}}, "options.priority: must be an integer"),
                       ({"actor": "a", "options": {"eta": 5}}, "options.eta: unknown option"),
                       ({"actor": "a", "colour": "red"}, "colour: unknown field")):
        r = api.client.post("/api/v1/jobs", json=bad, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"].startswith(field), (bad, r.text)
    assert api.client.post("/api/v1/jobs", content=b"[1]", headers=AUTH).status_code == 400
    assert scalar(conn, "SELECT count(*) FROM jobs") == 2

    # A job's own limits, checked as at send: a bad one is one 400 naming the option.
    limited = {"actor": "noop", "kwargs": {"shop": "s1"},
               "options": {"rate_limit": "20/s burst 5", "rate_limit_key": "shop:{kwargs[shop]}", "daily_quota": 100}}
    r = api.client.post("/api/v1/jobs", json=limited, headers=AUTH)
    assert r.status_code == 201, r.text
    assert conn.execute("SELECT status, flow_key, flow FROM jobs WHERE id = %s", (r.json()["id"],)).fetchone() \
        == ("pending", "shop:s1", {"r": 20.0, "b": 5, "q": 100})  # the log's, sent by name (055), until paced
    for bad, field in (({"rate_limit": "ten per minute"}, "options.rate_limit: actor 'noop'"),
                       ({"rate_limit": "1/s", "rate_limit_key": "{kwargs[missing"}, "options.rate_limit_key:"),
                       ({"concurrency_limit": 0}, "options.concurrency_limit: actor 'noop': concurrency_limit=0")):
        r = api.client.post("/api/v1/jobs", json={"actor": "noop", "options": bad}, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"].startswith(field), (bad, r.text)
    assert scalar(conn, "SELECT count(*) FROM jobs") == 3
    assert "/api/v1/jobs" in api.client.get("/api/v1/openapi.json").json()["paths"]


def test_an_apps_state_routes_and_gauges_only_where_it_is_in_use(conn, api, matrix):
    state = api.client.get("/api/v1/system/state").json()
    metrics = api.client.get("/metrics").text
    r = api.client.post("/api/v1/reextract", json={"incomplete": True}, headers=AUTH)
    if "actors" not in matrix.apps:
        assert "app_state" not in state or state["app_state"] == {}
        assert "actor_supervisor_tracker_state" not in metrics
        assert r.status_code == 404 and "the app 'actors' is not in use here" in r.json()["error"]
        return
    tracker = state["app_state"]["actors"]
    assert tracker["watches_total"] == 0 and "listings_incomplete_extraction" in tracker
    assert 'actor_supervisor_tracker_state{column="listings_incomplete_extraction"} 0.0' in metrics
    assert r.status_code == 200 and r.json() == {"listings": 0, "deals": 0, "errors": 0, "watch_id": None}
    assert api.client.post("/api/v1/reextract", json={"incomplete": "yes"}, headers=AUTH).status_code == 400
    r = api.client.post("/api/v1/reextract", json={"watch": "nope"}, headers=AUTH)
    assert r.status_code == 400 and "unknown watch 'nope'" in r.json()["error"]
    assert api.client.post("/api/v1/reextract", json={}).status_code == 401
    # A listing whose extraction left no product key: extracted again, here and now.
    source = scalar(conn, "INSERT INTO sources (name, search_url) VALUES ('shop', 'http://127.0.0.1:9/?q={query}')"
                          " RETURNING id")
    conn.execute("INSERT INTO listings (source_id, external_id, title, price_cents, extracted_at)"
                 " VALUES (%s, 'x', 'Corsair Vengeance 32GB DDR4 3200', 9000, now())", (source,))
    assert api.client.get("/api/v1/system/state").json()["app_state"]["actors"]["listings_incomplete_extraction"] == 1
    r = api.client.post("/api/v1/reextract", json={"incomplete": True}, headers=AUTH)
    assert r.status_code == 200 and r.json()["listings"] == 1 and r.json()["errors"] == 0, r.text
    assert scalar(conn, "SELECT product_key FROM listings") == "ram:ddr4:32gb:3200"
    assert api.client.post("/api/v1/reextract", json={"enqueue": True}, headers=AUTH).json()["enqueued"] == 1
    # A failing watch shows its last error and when it is tried again.
    conn.execute("INSERT INTO watches (query, source_id, last_polled_at, last_error, failures, next_poll_at)"
                 " VALUES ('ddr4', %s, now(), 'PermanentScrapeError: HTTP 404', 2, now() + interval '2 hours')",
                 (source,))
    listed = api.client.get("/api/v1/watches").json()["watches"]
    assert [(w["query"], w["last_error"], w["failures"]) for w in listed] == [
        ("ddr4", "PermanentScrapeError: HTTP 404", 2)] and listed[0]["next_poll_at"] > listed[0]["last_polled_at"]
    assert "/api/v1/watches" in api.client.get("/api/v1/openapi.json").json()["paths"]
def test_the_live_job_states_in_metrics_partition_the_live_rows(conn, api):
    """actor_supervisor_jobs{queue,state}: each live job in exactly one state, so a sum
    by queue is the queue's live rows (pending, due or not, retryable and running)."""
    from prometheus_client.parser import text_string_to_metric_families

    conn.execute("""
        INSERT INTO jobs (queue, actor, status, run_at) VALUES
            ('q1', 'a', 'pending', now() - interval '1 minute'), ('q1', 'a', 'pending', now()),
            ('q1', 'a', 'pending', now() + interval '1 hour'),
            ('q1', 'a', 'retryable', now() - interval '1 second'), ('q1', 'a', 'retryable', now() + interval '1 minute'),
            ('q2', 'b', 'pending', now() + interval '1 day'), ('q2', 'b', 'retryable', now());
        INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at) VALUES
            ('q1', 'a', 'running', 'h:1:a', now()), ('q2', 'b', 'running', 'h:1:a', now());
        INSERT INTO jobs (queue, actor, status, finished_at) VALUES
            ('q1', 'a', 'succeeded', now()), ('q2', 'b', 'failed', now()), ('q2', 'b', 'cancelled', now());
    """)
    text = api.client.get("/metrics").text
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "actor_supervisor_jobs"]
    by_queue: dict[str, float] = {}
    for sample in family.samples:
        by_queue[sample.labels["queue"]] = by_queue.get(sample.labels["queue"], 0) + sample.value
    assert {s.labels["state"] for s in family.samples} == {"ready", "scheduled", "running", "retryable"}
    live = dict(conn.execute("SELECT queue, count(*) FROM jobs WHERE status IN ('pending', 'retryable', 'running')"
                             " GROUP BY queue").fetchall())
    assert by_queue == live and live == {"q1": 6, "q2": 3}


# --- errors and actors ----------------------------------------------------------------------

SEND = "app/mail.py:send"


def _attempts(conn, job: str, actor: str, error_type: str, where: str, to_status: str, *ago_s: float) -> None:
    """Failed attempts of ``job`` as a worker records them: its job_events rows with their group."""
    for ago in ago_s:
        conn.execute("INSERT INTO job_events (job_id, at, who, from_status, to_status, reason, actor, error_type,"
                     " error_where) VALUES (%s, now() - %s * interval '1 second', 'w', 'running', %s, 'attempt',"
                     " %s, %s, %s)", (job, ago, to_status, actor, error_type, where))


def test_errors_grouped_and_the_actions_on_a_group(conn, api):
    from tests.conftest import upstream_failure

    failed = [_job(conn, actor="mailer", status="failed", last_error=upstream_failure()) for _ in range(3)]
    for i, job in enumerate(failed):
        _attempts(conn, job, "mailer", "RuntimeError", SEND, "retryable", 600 + i, 400 + i)
        _attempts(conn, job, "mailer", "RuntimeError", SEND, "failed", 200 + i)
    waiting = _job(conn, actor="mailer", status="retryable", last_error=upstream_failure())
    _attempts(conn, waiting, "mailer", "RuntimeError", SEND, "retryable", 30)
    report = _job(conn, actor="report", status="failed", last_error="Traceback ...\nKeyError: 'x'")
    _attempts(conn, report, "report", "KeyError", "app/report.py:build", "failed", 7200)

    r = api.client.get("/api/v1/errors", params={"since": "1h"})
    assert r.status_code == 200, r.text
    body = r.json()
    [g] = body["groups"]
    in_sql = conn.execute("SELECT count(*), count(*) FILTER (WHERE to_status = 'failed'), min(at), max(at)"
                          " FROM job_events WHERE actor = 'mailer' AND error_type = 'RuntimeError'").fetchone()
    assert (g["actor"], g["error_type"], g["where"]) == ("mailer", "RuntimeError", SEND)
    assert (g["attempts"], g["failed"], g["retried"]) == (in_sql[0], in_sql[1], in_sql[0] - in_sql[1]) == (10, 3, 7)
    assert (g["first_seen"], g["last_seen"]) == (in_sql[2].isoformat(), in_sql[3].isoformat())
    assert sum(n for _, n in g["buckets"]) == 10 and body["complete"] is True and body["attempts"] == 10
    # the sample: the newest attempt whose traceback is still its job's
    assert g["sample"]["job_id"] == waiting and g["sample"]["message"] == "RuntimeError: upstream said no"
    assert g["sample"]["traceback"] == scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (waiting,))
    # the default window is a day: the report's failure two hours ago is in it
    groups = api.client.get("/api/v1/errors").json()["groups"]
    assert [(x["actor"], x["attempts"]) for x in groups] == [("mailer", 10), ("report", 1)]
    assert [x["actor"] for x in api.client.get("/api/v1/errors", params={"actor": "report"}).json()["groups"]] == [
        "report"]
    for bad in ({"since": "forever"}, {"since": "0"}, {"limit": "0"}, {"colour": "red"}):
        r = api.client.get("/api/v1/errors", params=bad)
        assert r.status_code == 400 and r.json()["error"], (bad, r.text)

    group = {"actor": "mailer", "error_type": "RuntimeError", "where": SEND, "since": "1h"}
    assert api.client.post("/api/v1/errors/cancel", json=group).status_code == 401  # an action: the token
    r = api.client.post("/api/v1/errors/cancel", json=group, headers=AUTH)
    assert r.status_code == 200 and (r.json()["changed"], r.json()["ids"]) == (1, [waiting]), r.text
    r = api.client.post("/api/v1/errors/retry", json=group, headers=AUTH)
    assert r.status_code == 200 and r.json()["changed"] == 3 and sorted(r.json()["ids"]) == sorted(failed)
    statuses = dict(conn.execute("SELECT id::text, status FROM jobs").fetchall())
    assert statuses == {**dict.fromkeys(failed, "pending"), waiting: "cancelled", report: "failed"}
    for bad in ({"actor": "mailer"}, {**group, "where": 3}, {**group, "since": "x"}, {**group, "colour": 1}):
        r = api.client.post("/api/v1/errors/retry", json=bad, headers=AUTH)
        assert r.status_code == 400 and r.json()["error"], (bad, r.text)
    paths = api.client.get("/api/v1/openapi.json").json()["paths"]
    assert {"/api/v1/errors", "/api/v1/errors/retry", "/api/v1/errors/cancel", "/api/v1/actors"} <= set(paths)
    for page in ("/errors", "/errors?window=1h&actor=mailer", "/errors?window=7d", "/actors", "/actors?window=6h"):
        r = api.client.get(page)
        assert r.status_code == 200 and 'href="/errors"' in r.text and 'href="/actors"' in r.text, page
    assert api.client.get("/errors?window=2d").status_code == 400


def test_actors_figures_and_their_start_waits_in_metrics(conn, api):
    from prometheus_client.parser import text_string_to_metric_families

    # resize: 20 jobs finished ~10 minutes ago, waits 1..20 s, runs 0.1..2 s, every 4th failed;
    # thumbnail: 5 jobs finished 2 minutes ago (inside /metrics' 5 minutes), waits 0.5..2.5 s
    conn.execute("""
        INSERT INTO jobs (queue, actor, status, created_at, run_at, started_at, finished_at)
        SELECT 'q1', 'resize', CASE WHEN g % 4 = 0 THEN 'failed' ELSE 'succeeded' END,
               now() - interval '11 minutes', now() - interval '11 minutes',
               now() - interval '11 minutes' + g * interval '1 second',
               now() - interval '11 minutes' + g * interval '1 second' + g * interval '100 ms'
          FROM generate_series(1, 20) g;
        INSERT INTO jobs (queue, actor, status, created_at, run_at, started_at, finished_at)
        SELECT 'q1', 'thumbnail', 'succeeded', now() - interval '3 minutes',
               now() - interval '3 minutes' - interval '1 hour',
               now() - interval '3 minutes' + g * interval '500 ms', now() - interval '2 minutes'
          FROM generate_series(1, 5) g;
        INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at) VALUES
            ('q1', 'resize', 'running', 'h:1:a', now()), ('q1', 'resize', 'running', 'h:1:a', now());
        INSERT INTO jobs (queue, actor, status, finished_at) VALUES ('q1', 'old', 'succeeded', now() - interval '2 hours');
    """)
    retried = _job(conn, actor="resize", status="succeeded", finished_min=0)  # long ago: out of the window
    _attempts(conn, retried, "resize", "OSError", "app/img.py:resize", "retryable", 100, 90, 80)

    r = api.client.get("/api/v1/actors")
    assert r.status_code == 200, r.text
    body = r.json()
    by_actor = {a["actor"]: a for a in body["actors"]}
    # most time spent first: thumbnail's five ran about a minute each, resize's twenty 21 s in all
    assert body["complete"] and [a["actor"] for a in body["actors"]] == ["thumbnail", "resize"]
    sql = {a: dict(zip(("finished", "failed", "busy", "run", "wait"), row, strict=True)) for a, *row in conn.execute("""
        SELECT actor, count(*), count(*) FILTER (WHERE status = 'failed'),
               sum(extract(epoch FROM finished_at - started_at)),
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)),
               percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (
                   ORDER BY extract(epoch FROM started_at - greatest(created_at, run_at)))
          FROM jobs WHERE status IN ('succeeded', 'failed') AND finished_at > now() - interval '1 hour'
           AND started_at IS NOT NULL GROUP BY actor""").fetchall()}
    for name in ("resize", "thumbnail"):
        got, want = by_actor[name], sql[name]
        assert (got["finished"], got["failed"]) == (want["finished"], want["failed"]), name
        assert got["per_minute"] == round(want["finished"] / 60, 3)
        assert got["busy_s"] == pytest.approx(float(want["busy"]), abs=0.01)
        assert [got[f"run_{p}_s"] for p in ("p50", "p95", "p99")] == pytest.approx(want["run"], abs=0.001)
        assert [got[f"wait_{p}_s"] for p in ("p50", "p95", "p99")] == pytest.approx(want["wait"], abs=0.001)
    assert by_actor["resize"]["failure_rate"] == 5 / 20 and by_actor["thumbnail"]["failure_rate"] == 0
    assert (by_actor["resize"]["in_flight"], by_actor["resize"]["retries"]) == (2, 3)
    assert by_actor["resize"]["wait_p50_s"] == pytest.approx(10.5, abs=0.01)  # from due, whatever ran before
    assert by_actor["thumbnail"]["wait_p99_s"] == pytest.approx(2.48, abs=0.01)  # from enqueued (due earlier)
    assert "old" not in by_actor and api.client.get("/api/v1/actors", params={"since": "3h"}).json()["actors"][-1][
        "actor"] == "old"
    assert api.client.get("/api/v1/actors", params={"since": "x"}).status_code == 400

    # /metrics: the start waits Dramatiq's metrics lack, of the last 5 minutes' jobs (thumbnail's only)
    text = api.client.get("/metrics").text
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "actor_supervisor_actor_start_wait_seconds"]
    got = {(s.labels["actor"], s.labels["quantile"]): s.value for s in family.samples}
    want = sql["thumbnail"]["wait"]
    assert got == pytest.approx({("thumbnail", "0.5"): want[0], ("thumbnail", "0.95"): want[1],
                                 ("thumbnail", "0.99"): want[2]}, abs=0.001)
