"""Migrations, `supervisor check`, the embedded default and the job commands."""

from __future__ import annotations

import json
import threading

import psycopg

from supervisor import apps, db
from supervisor.migrate import load_migrations, migrate
from tests.conftest import cli, scalar, upstream_failure


def test_migrate_applies_each_file_once(fresh_database):
    first = migrate(fresh_database, apps.installed())
    assert [m.version for m in first] == [m.version for m in load_migrations(apps.installed())]
    assert migrate(fresh_database, apps.installed()) == []  # running it again changes nothing
    with psycopg.connect(fresh_database) as c:
        assert scalar(c, "SELECT count(*) FROM schema_migrations") == len(first)


def test_two_hosts_migrating_at_once(fresh_database):
    results: list[list] = []
    errors: list[BaseException] = []

    def run():
        try:
            results.append(migrate(fresh_database, apps.installed()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    applied = sorted(m.version for r in results for m in r)
    assert applied == [m.version for m in load_migrations(apps.installed())]  # each exactly once overall


def test_check_reports_pending_then_ok(fresh_database):
    pending = cli("check", "--json", url=fresh_database)
    assert pending.returncode == 1
    report = json.loads(pending.stdout)
    assert report["reachable"] and report["pending"][0] == "001_jobs"
    migrated = cli("migrate", url=fresh_database)
    assert migrated.returncode == 0, migrated.stderr
    assert cli("check", url=fresh_database).returncode == 0


def test_check_unreachable_database_exits_4():
    result = cli("check", url="postgresql://nobody@127.0.0.1:1/none")
    assert result.returncode == 4
    assert "unreachable" in result.stdout and "cannot connect" in result.stdout


def test_an_unreachable_database_is_one_line_without_the_password():
    result = cli("queues", url="postgresql://nobody:s3cret@127.0.0.1:1/none")
    assert result.returncode == 4
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot connect to PostgreSQL"), result.stderr
    assert "s3cret" not in result.stderr and "check that the server is running" in lines[0]


def test_embedded_default_survives_and_is_reused(tmp_path, monkeypatch):
    from tests.conftest import ROOT

    state = ROOT / ".state" / "test"  # the test session's embedded server (initdb once)
    monkeypatch.setenv("SUPERVISOR_STATE_DIR", str(state))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    url = db.resolve_url(None)
    assert "host=" in url or url.startswith("postgresql://")
    with psycopg.connect(url) as c:
        assert scalar(c, "SELECT 1") == 1
    assert db.resolve_url("embedded") == url  # same server, same data directory
    assert (state / "pgdata" / "PG_VERSION").exists()


def test_job_commands(conn, database_url):
    sent = cli("enqueue", "record", "--queue", "tests", "--args", "[1]", "--dedupe-key", "k1",
                   url=database_url)
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip()
    again = cli("enqueue", "record", "--queue", "tests", "--dedupe-key", "k1", url=database_url)
    assert again.stdout.strip() == job_id  # deduplicated

    listed = json.loads(cli("jobs", "list", "--json", url=database_url).stdout)
    assert [j["id"] for j in listed] == [job_id]
    queues = json.loads(cli("queues", "--json", url=database_url).stdout)
    assert queues[0]["queue"] == "tests" and queues[0]["ready"] == 1

    assert cli("jobs", "cancel", job_id, url=database_url).returncode == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,)) == "cancelled"
    assert cli("jobs", "cancel", job_id, url=database_url).returncode == 0  # twice is harmless
    assert cli("jobs", "cancel", "00000000-0000-0000-0000-000000000000", url=database_url).returncode == 1
    assert cli("jobs", "retry", job_id, url=database_url).returncode == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,)) == "pending"

    shown = cli("jobs", "show", job_id, url=database_url)
    assert "cancelled by operator" in shown.stdout and "retried by operator" in shown.stdout


def test_a_failed_jobs_list_line_is_its_exception_and_show_keeps_the_traceback(conn, database_url):
    error = upstream_failure()
    assert error.startswith("Traceback (most recent call last):")
    job_id = str(scalar(conn, "INSERT INTO jobs (queue, actor, status, attempts, finished_at, last_error)"
                              " VALUES ('q', 'fetch', 'failed', 3, now(), %s) RETURNING id", (error,)))
    listed = cli("jobs", "list", url=database_url)
    assert listed.returncode == 0 and "RuntimeError: upstream said no" in listed.stdout, listed.stdout
    assert "Traceback" not in listed.stdout
    [row] = json.loads(cli("jobs", "list", "--json", url=database_url).stdout)
    assert row["id"] == job_id and row["last_error"] == "RuntimeError: upstream said no"
    shown = json.loads(cli("jobs", "show", job_id, "--json", url=database_url).stdout)
    assert shown["last_error"] == error  # the whole traceback


def test_enqueue_rejects_bad_json(database_url):
    result = cli("enqueue", "record", "--args", "{not json", url=database_url)
    assert result.returncode == 2
    assert "must be JSON" in result.stderr


def test_runs_shows_the_latest_run_per_schedule(conn, database_url):
    conn.execute(
        "INSERT INTO job_runs (job_name, started_at, status, error_text) VALUES"
        " ('poll', now() - interval '10 minutes', 'failed', 'boom'), ('poll', now(), 'succeeded', NULL),"
        " ('forecast', now(), 'crashed', 'lost')"
    )
    rows = json.loads(cli("runs", "--json", url=database_url).stdout)
    assert {(r["job_name"], r["status"]) for r in rows} == {("poll", "succeeded"), ("forecast", "crashed")}


def test_alerts_resend_enqueues_a_forced_delivery(conn, database_url):
    result = cli("alerts", "resend", "42", url=database_url)
    assert result.returncode == 0, result.stderr
    row = conn.execute("SELECT queue, actor, args, kwargs FROM jobs WHERE id = %s",
                       (result.stdout.strip(),)).fetchone()
    assert row == ("notification", "deliver_alert", [42], {"resend_unknown": True})


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        return {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_migrate_creates_only_the_tables_of_the_apps_in_use(tmp_path, fresh_database):
    own = tmp_path / "own.yaml"
    own.write_text("roles:\n  mine: {queues: [tests], actors: [tests.sample_actors]}\n")
    out = cli("migrate", config=own, url=fresh_database)
    assert out.returncode == 0, out.stderr
    tables = _tables(fresh_database)
    assert {"job_queue", "job_history", "job_events", "workers", "scheduler_locks", "rate_limiter_state"} <= tables
    assert not tables & {"sources", "watches", "listings", "alerts", "predictions_daily"}  # no tracker tables

    tracker = tmp_path / "tracker.yaml"
    tracker.write_text("roles:\n  scraping: {queues: [scraping], actors: [actors.scraping]}\n")
    out = cli("migrate", config=tracker, url=fresh_database)
    assert out.returncode == 0 and "002_pipeline" in out.stderr, out.stderr
    assert {"sources", "watches", "alerts", "predictions_daily"} <= _tables(fresh_database)
    # Existing version numbers are kept: a database migrated before the split sees no change.
    with psycopg.connect(fresh_database) as c:
        versions = [r[0] for r in c.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert versions[:6] == [1, 2, 3, 4, 5, 6]


def test_an_unknown_app_is_a_one_line_error(tmp_path, fresh_database):
    path = tmp_path / "s.yaml"
    path.write_text("apps: [nosuchapp]\nroles:\n  a: {queues: [q], actors: [m]}\n")
    out = cli("migrate", config=path, url=fresh_database)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{path}:1: apps: no app named 'nosuchapp' is installed" in out.stderr, out.stderr


def test_array_text_round_trips_any_value(conn):
    # The claim and the ack send arrays as one literal (db.array_text): whatever a
    # string holds, PostgreSQL must read back exactly the values sent.
    texts = ['plain', 'with "quotes"', 'back\\slash', 'a,b', '{braces}', 'NULL', '', ' spaced ', 'ünï', "it's"]
    assert conn.execute("SELECT %s::text[]", (db.array_text(texts),)).fetchone()[0] == texts
    assert conn.execute("SELECT %s::text[]", (db.array_text(["x", None]),)).fetchone()[0] == ["x", None]
    ints = [0, -3, 2_147_483_647, None]
    assert conn.execute("SELECT %s::int[]", (db.array_text(ints),)).fetchone()[0] == ints
    assert conn.execute("SELECT %s::bool[]", (db.array_text([True, False]),)).fetchone()[0] == [True, False]
    assert conn.execute("SELECT %s::float8[]", (db.array_text([1.5, -0.25]),)).fetchone()[0] == [1.5, -0.25]
    assert conn.execute("SELECT cardinality(%s::uuid[])", (db.array_text([]),)).fetchone()[0] == 0
    # strings with nothing to escape take the joined path; one quote among them, the loop
    plain = ["2026-12-01", "floor", "a b", "{x}", ","]
    assert conn.execute("SELECT %s::text[]", (db.array_text(plain),)).fetchone()[0] == plain
    assert conn.execute("SELECT %s::text[]", (db.array_text(iter(plain + ['"'])),)).fetchone()[0] == plain + ['"']
    for whole in ([], [1, 2, 3], [7, None, -1], [None]):
        assert conn.execute("SELECT %s::bigint[]", (db.array_ints(whole),)).fetchone()[0] == whole
