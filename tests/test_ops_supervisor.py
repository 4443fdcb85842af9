"""Operator commands against a real `supervisor run`: reload --dry-run, history,
and paused queues in status."""

from __future__ import annotations

import json

from tests.supervisor_helpers import (
    cli,
    role,
    write_config,
)


def test_reload_dry_run_prints_the_diff_and_changes_nothing(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=1, threads=2), "beta": role(processes=1, threads=2)})
    s = supervisor(path)
    s.wait_state({"alpha": 1, "beta": 1})
    before = s.pids()

    unchanged = cli("reload", "--dry-run", config=path)
    assert unchanged.returncode == 0 and "no changes" in unchanged.stdout, unchanged.stderr

    write_config(path, database_url, {"alpha": role(processes=2, threads=3), "gamma": role(processes=1)})
    out = cli("reload", "--dry-run", "--json", config=path)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["dry_run"] is True
    assert reply["roles"] == {"gamma": ["start"], "beta": ["drain"],
                              "alpha": ["roll (threads 2 -> 3)", "resize 1 -> 2"]}
    text = cli("reload", "--dry-run", config=path).stdout
    assert "alpha: roll (threads 2 -> 3); resize 1 -> 2" in text and "beta: drain" in text and "gamma: start" in text

    # Nothing was applied: same roles, same processes, no reload counted.
    status = s.status()
    assert {r["name"]: r["wanted"] for r in status["roles"]} == {"alpha": 1, "beta": 1}
    assert s.pids() == before and status["reloads"] == 0

    (tmp_path / "s.yaml").write_text(path.read_text().replace("threads: 3", "threads: lots"))
    bad = cli("reload", "--dry-run", config=path)
    assert bad.returncode == 2 and "threads" in bad.stderr and "Traceback" not in bad.stderr


def test_history_and_paused_queues_in_status(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {"alpha": role(processes=1, threads=2)})
    s = supervisor(path)
    s.wait_state({"alpha": 1})
    conn.execute(
        "INSERT INTO job_runs (job_name, scheduled_for, started_at, status, holder) VALUES"
        " ('nightly', now() - interval '2 days', now() - interval '2 days', 'succeeded', 'h1'),"
        " ('nightly', now() - interval '1 day', now() - interval '1 day', 'failed', 'h2'),"
        " ('nightly', now(), now(), 'running', 'h1'),"
        " ('hourly', now(), now(), 'succeeded', 'h1')"
    )
    out = cli("history", "nightly", "--json", config=path)
    assert out.returncode == 0, out.stderr
    assert [r["status"] for r in json.loads(out.stdout)] == ["running", "failed", "succeeded"]
    limited = cli("history", "nightly", "--limit", "1", config=path).stdout.splitlines()
    assert len(limited) == 2 and "running" in limited[1]  # header and the newest run

    paused = cli("queues", "pause", "tests", "--reason", "db maintenance", config=path)
    assert paused.returncode == 0, paused.stderr
    text = cli("status", config=path).stdout
    assert "queues tests (paused)" in text and "paused by" in text and "db maintenance" in text
    reply = json.loads(cli("status", "--json", config=path).stdout)
    assert [p["queue"] for p in reply["paused_queues"]] == ["tests"]
    assert cli("queues", "resume", "tests", config=path).returncode == 0
    assert json.loads(cli("status", "--json", config=path).stdout)["paused_queues"] == []
