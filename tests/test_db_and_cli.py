"""Migrations, `supervisor check`, the embedded default and the job commands."""

from __future__ import annotations

import json
import threading

import psycopg

from supervisor import apps, db
from supervisor.migrate import load_migrations, migrate
from tests.conftest import run_cli, scalar


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
    pending = run_cli("check", "--json", url=fresh_database)
    assert pending.returncode == 1
    report = json.loads(pending.stdout)
    assert report["reachable"] and report["pending"][0] == "001_jobs"
    migrated = run_cli("migrate", url=fresh_database)
    assert migrated.returncode == 0, migrated.stderr
    assert run_cli("check", url=fresh_database).returncode == 0


def test_check_unreachable_database_exits_4():
    result = run_cli("check", url="postgresql://nobody@127.0.0.1:1/none")
    assert result.returncode == 4
    assert "unreachable" in result.stdout and "cannot connect" in result.stdout


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
    sent = run_cli("enqueue", "record", "--queue", "tests", "--args", "[1]", "--dedupe-key", "k1",
                   url=database_url)
    assert sent.returncode == 0, sent.stderr
    job_id = sent.stdout.strip()
    again = run_cli("enqueue", "record", "--queue", "tests", "--dedupe-key", "k1", url=database_url)
    assert again.stdout.strip() == job_id  # deduplicated

    listed = json.loads(run_cli("jobs", "list", "--json", url=database_url).stdout)
    assert [j["id"] for j in listed] == [job_id]
    queues = json.loads(run_cli("queues", "--json", url=database_url).stdout)
    assert queues[0]["queue"] == "tests" and queues[0]["ready"] == 1

    assert run_cli("jobs", "cancel", job_id, url=database_url).returncode == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,)) == "cancelled"
    assert run_cli("jobs", "cancel", job_id, url=database_url).returncode == 0  # twice is harmless
    assert run_cli("jobs", "cancel", "00000000-0000-0000-0000-000000000000", url=database_url).returncode == 1
    assert run_cli("jobs", "retry", job_id, url=database_url).returncode == 0
    assert scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,)) == "pending"

    shown = run_cli("jobs", "show", job_id, url=database_url)
    assert "cancelled by operator" in shown.stdout and "retried by operator" in shown.stdout


def test_enqueue_rejects_bad_json(database_url):
    result = run_cli("enqueue", "record", "--args", "{not json", url=database_url)
    assert result.returncode == 2
    assert "must be JSON" in result.stderr


def test_runs_shows_the_latest_run_per_schedule(conn, database_url):
    conn.execute(
        "INSERT INTO job_runs (job_name, started_at, status, error_text) VALUES"
        " ('poll', now() - interval '10 minutes', 'failed', 'boom'), ('poll', now(), 'succeeded', NULL),"
        " ('forecast', now(), 'crashed', 'lost')"
    )
    rows = json.loads(run_cli("runs", "--json", url=database_url).stdout)
    assert {(r["job_name"], r["status"]) for r in rows} == {("poll", "succeeded"), ("forecast", "crashed")}


def test_alerts_resend_enqueues_a_forced_delivery(conn, database_url):
    result = run_cli("alerts", "resend", "42", url=database_url)
    assert result.returncode == 0, result.stderr
    row = conn.execute("SELECT queue, actor, args, kwargs FROM jobs WHERE id = %s",
                       (result.stdout.strip(),)).fetchone()
    assert row == ("notification", "deliver_alert", [42], {"resend_unknown": True})
