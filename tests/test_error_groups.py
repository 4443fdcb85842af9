"""Failed attempts grouped by actor, exception type and the innermost frame of the
actor's own code: the parser (broker/error_key.py), the group each failed attempt
writes on its job_events row through real worker processes, `supervisor errors`, and
the actions on a group. Real PostgreSQL, real tracebacks."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest

from supervisor import error_groups
from supervisor.broker import error_key
from supervisor.broker.error_key import ErrorKey, OwnCode
from supervisor.broker.message import error_text
from tests.conftest import cli, scalar, wait_for

APP = '''
import json

def helper(text):
    return json.loads(text)

def actor(n):
    return helper('{"id": ' + str(n) + ' broken}')

def chained(n):
    try:
        {}[n]
    except KeyError as exc:
        raise RuntimeError(f"lookup {n} failed") from exc

def grouped(n):
    raise ExceptionGroup("several", [ValueError(n), KeyError(n)])
'''


def _app(tmp_path: Path, blank_lines: int = 0) -> tuple[dict, OwnCode]:
    """The functions of a module ``shop/feeds.py`` under ``tmp_path/app`` (its source
    moved down by ``blank_lines``), and the own code of an actor in package ``shop``."""
    package = tmp_path / "app" / "shop"
    package.mkdir(parents=True, exist_ok=True)
    path = package / "feeds.py"
    path.write_text("\n" * blank_lines + APP)
    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # frames name the file, as an import would
    return namespace, OwnCode(str(package) + os.sep, error_key.own_code().libraries)


def _failure(fn, *args) -> str:
    try:
        fn(*args)
    except BaseException as exc:  # noqa: BLE001 - any exception is the test's subject
        return error_text(exc)
    raise AssertionError("it did not fail")


def test_a_library_error_is_grouped_where_the_actors_code_called_it_whatever_the_message(tmp_path):
    app, own = _app(tmp_path)
    first, second = _failure(app["actor"], 1), _failure(app["actor"], 22222)
    assert "json/decoder.py" in first and first != second  # raised in the standard library, messages differ
    assert error_key.parse(first, own) == error_key.parse(second, own) == ErrorKey(
        "json.decoder.JSONDecodeError", "shop/feeds.py:helper")


def test_the_group_names_no_line_so_a_deploy_that_moves_code_keeps_it(tmp_path):
    app, own = _app(tmp_path)
    before = error_key.parse(_failure(app["actor"], 1), own)
    moved, own_moved = _app(tmp_path, blank_lines=40)
    text = _failure(moved["actor"], 1)
    assert "line 45, in helper" in text
    assert error_key.parse(text, own_moved) == before


def test_chained_exception_groups_and_text_without_a_traceback(tmp_path):
    app, own = _app(tmp_path)
    assert error_key.parse(_failure(app["chained"], 3), own) == ErrorKey("RuntimeError", "shop/feeds.py:chained")
    assert error_key.parse(_failure(app["grouped"], 3), own) == ErrorKey("ExceptionGroup", "shop/feeds.py:grouped")
    # a stored tail without its header still names the exception and the frame
    tail = _failure(app["actor"], 1)
    assert error_key.parse(tail[tail.index('  File "'):], own).type == "json.decoder.JSONDecodeError"
    assert error_key.parse("ActorNotFound: no actor 'x'", own) == ErrorKey("ActorNotFound", "")
    assert error_key.parse("failed without an exception", own) == ErrorKey("failed without an exception", "")


def test_own_code_is_the_actors_package_even_in_site_packages_and_else_the_innermost_frame(tmp_path):
    app, own = _app(tmp_path)
    text = _failure(app["actor"], 1)
    # the app installed where libraries live: its package still counts as its own code
    installed = OwnCode(own.package, (str(tmp_path / "app") + os.sep, *own.libraries))
    assert error_key.parse(text, installed).where == "shop/feeds.py:helper"
    # no frame is the actor's (its package unknown, everything a library): the innermost frame
    nothing = OwnCode("", (str(tmp_path) + os.sep, str(Path(__file__).parent) + os.sep, *own.libraries))
    assert error_key.parse(text, nothing).where.endswith("json/decoder.py:raw_decode")
    # the runtime's and Dramatiq's files are libraries; a test module is own code
    default = error_key.own_code("tests.error_actors")
    import dramatiq

    import supervisor
    assert not default(dramatiq.__file__) and not default(supervisor.__file__) and not default(json.__file__)
    assert default(__file__) and not default("<frozen importlib._bootstrap>")


def test_the_real_traceback_format_parses_as_python_prints_it():
    def inner():
        raise ValueError("x")

    try:
        inner()
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    key = error_key.parse(text, error_key.own_code("tests.test_error_groups"))
    assert key == ErrorKey("ValueError", "tests/test_error_groups.py:inner")


# --- through real workers --------------------------------------------------------------------

def _enqueue(conn, actor: str, n: int) -> None:
    conn.execute("INSERT INTO jobs (queue, actor, args) SELECT 'errors', %s, jsonb_build_array(g)"
                 " FROM generate_series(1, %s) g", (actor, n))


def run_failing_workload(conn, workers) -> None:
    """Three parse_feed jobs (3 attempts each, all failing), four refuse jobs (one
    attempt, failed), two call_later jobs (failed once, retry due in ten minutes)."""
    w = workers(queues="errors", actors="tests.error_actors", threads=4)
    w.wait_ready(conn)
    for actor, n in (("parse_feed", 3), ("refuse", 4), ("call_later", 2), ("fine", 2)):
        _enqueue(conn, actor, n)
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'failed'") == 7
             and scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'retryable'") == 2
             and scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 2, 60,
             message="the failing workload settled")
    w.terminate()


EXPECTED = {  # (actor, type, where) -> (attempts, retried, failed)
    ("parse_feed", "json.decoder.JSONDecodeError", "tests/error_actors.py:parse_body"): (9, 6, 3),
    ("refuse", "PermissionError", "tests/error_actors.py:refuse"): (4, 0, 4),
    ("call_later", "TimeoutError", "tests/error_actors.py:call_later"): (2, 2, 0),
}


def test_every_failed_attempt_records_its_group_and_supervisor_errors_shows_them(conn, workers):
    run_failing_workload(conn, workers)
    recorded = {(a, t, w): (n, r, f) for a, t, w, n, r, f in conn.execute(
        "SELECT actor, error_type, error_where, count(*), count(*) FILTER (WHERE to_status = 'retryable'),"
        " count(*) FILTER (WHERE to_status = 'failed') FROM job_events WHERE error_type IS NOT NULL"
        " GROUP BY 1, 2, 3").fetchall()}
    assert recorded == EXPECTED
    # each attempt's traceback was its job's last_error when written: the failed ones' still are
    assert "PermissionError: user" in scalar(conn, "SELECT last_error FROM jobs WHERE actor = 'refuse' LIMIT 1")

    done = cli("errors", "--since", "1h", "--json")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["complete"] and found["attempts"] == 15 and found["groups_total"] == 3
    assert [g["actor"] for g in found["groups"]] == ["parse_feed", "refuse", "call_later"]  # most attempts first
    for g in found["groups"]:
        assert EXPECTED[(g["actor"], g["error_type"], g["where"])] == (g["attempts"], g["retried"], g["failed"])
        assert sum(n for _, n in g["buckets"]) == g["attempts"]
        first, last = conn.execute("SELECT min(at), max(at) FROM job_events WHERE actor = %s AND error_type = %s",
                                   (g["actor"], g["error_type"])).fetchone()
        assert (g["first_seen"], g["last_seen"]) == (first.isoformat(), last.isoformat())
        assert g["sample"]["traceback"].startswith("Traceback") and g["error_type"].split(".")[-1] in g["sample"]["message"]
        sample_status = scalar(conn, "SELECT status FROM jobs WHERE id = %s", (g["sample"]["job_id"],))
        assert sample_status == ("retryable" if g["actor"] == "call_later" else "failed")

    table = cli("errors", "--since", "1h", "--actor", "refuse")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith("4 failed attempt(s) since") and "in 1 group(s)" in lines[0]
    assert lines[2].split()[:6] == ["4", "0", "4", "refuse", "PermissionError", "tests/error_actors.py:refuse"]
    assert "PermissionError: user" in lines[2]

    bad = cli("errors", "--since", "a while")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: since: expected a duration like 1h, 24h or 7d, got 'a while'")
    assert cli("errors", "--since", "90d").stderr.startswith("error: since: must be more than 0 and at most 30d")


# --- actions on a group ----------------------------------------------------------------------

def _job(conn, status: str) -> str:
    return str(scalar(conn, "INSERT INTO jobs (queue, actor, status, finished_at, lease_owner, claimed_at)"
                            " VALUES ('q', 'a', %s, now(), 'h:1:t', now()) RETURNING id", (status,)))


def _failed_attempt(conn, job: str, group: tuple[str, str], to: str, ago_s: float) -> None:
    conn.execute("INSERT INTO job_events (job_id, at, who, from_status, to_status, actor, error_type, error_where)"
                 " VALUES (%s, now() - %s * interval '1 second', 'w', 'running', %s, 'a', %s, %s)",
                 (job, ago_s, to, *group))


def test_an_action_on_a_group_changes_the_jobs_whose_latest_failure_is_of_it(conn):
    g, h = ("ValueError", "app.py:f"), ("KeyError", "app.py:g")
    failed = _job(conn, "failed")
    _failed_attempt(conn, failed, g, "failed", 60)
    moved_on = _job(conn, "failed")  # failed in g, then again in h: h's now
    _failed_attempt(conn, moved_on, g, "retryable", 120)
    _failed_attempt(conn, moved_on, h, "failed", 60)
    waiting = _job(conn, "retryable")
    _failed_attempt(conn, waiting, g, "retryable", 30)
    old = _job(conn, "failed")  # g's, before the window
    _failed_attempt(conn, old, g, "failed", 7200)
    key = error_groups.GroupKey("a", *g)

    retried = error_groups.change_group(conn, "retry", key, window_s=3600)
    assert (retried["matched"], retried["changed"], retried["ids"]) == (1, 1, [failed])
    statuses = dict(conn.execute("SELECT id::text, status FROM jobs").fetchall())
    assert statuses == {failed: "pending", moved_on: "failed", waiting: "retryable", old: "failed"}
    # every job of the group waiting for another attempt, the one just retried too
    cancelled = error_groups.change_group(conn, "cancel", key, window_s=3600)
    assert cancelled["ids"] == [failed, waiting]
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'cancelled'") == 2
    # the page's figures: four attempts of g in the window's day, one of h
    found = error_groups.error_groups(conn, window_s=86400)
    assert [(x["error_type"], x["attempts"], x["retried"], x["failed"]) for x in found["groups"]] == [
        ("ValueError", 4, 2, 2), ("KeyError", 1, 0, 1)]


@pytest.mark.parametrize("value", ["0", "-1h", "31d", "soon", ""])
def test_a_window_is_a_duration_up_to_30_days(value):
    if value == "":
        assert error_groups.parse_window(value) == 86400  # the default, 24h
        return
    with pytest.raises(ValueError, match="^since: "):
        error_groups.parse_window(value)


def test_the_runtimes_own_failures_are_grouped_too(conn):
    """A lost lease (the job runs again), a poison pill and a row that cannot become a
    message have no exception of the actor's: named by the runtime, with no frame."""
    from supervisor.broker import sql
    from supervisor.broker.consuming.completer import Finish, finish_params
    from supervisor.broker.consuming.leases import reap_params

    def running(actor: str, losses: int = 0) -> str:
        return str(scalar(conn, "INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at, attempts,"
                                " lease_expires_at, lease_losses, max_lease_losses)"
                                " VALUES ('q', %s, 'running', 'h:1:a', now(), 1, now() - interval '1 minute', %s, 3)"
                                " RETURNING id", (actor, losses)))

    lost, poison, unreadable = running("crashy"), running("crashy", losses=2), running("garbled")
    why = "args must be a JSON array"
    conn.execute(sql.FINISH, finish_params("h:1:a", [Finish(unreadable, 1, "failed", error=why, error_type="Unreadable",
                                                            error_where="", reason=why)]))
    conn.execute(sql.REAP_EXPIRED, reap_params("t", margin_s=0, limit=10))
    events = {str(j): (a, t, w, s) for j, a, t, w, s in conn.execute(
        "SELECT job_id, actor, error_type, error_where, to_status FROM job_events")}
    assert events == {lost: ("crashy", "LeaseLost", "", "pending"), poison: ("crashy", "PoisonPill", "", "failed"),
                      unreadable: ("garbled", "Unreadable", "", "failed")}
    found = error_groups.error_groups(conn, window_s=3600)
    sample = {g["error_type"]: g["sample"] for g in found["groups"]}
    # a lost lease has no traceback of its own: its event's reason stands for it
    assert sample["LeaseLost"]["traceback"] is None and "lease expired" in sample["LeaseLost"]["reason"]
    assert sample["Unreadable"]["message"] == "args must be a JSON array"
