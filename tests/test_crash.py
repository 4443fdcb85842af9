"""Nothing lost, nothing run twice, whatever the input (issue 8): crash semantics,
self-fencing, poison rows and cancel, with real worker processes and signals."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

from supervisor.testsignals import Interrupted
from tests.conftest import cli, scalar, wait_for
from tests.supervisor_helpers import dead, log_producer, role, write_config
from tests.tcp_proxy import TcpProxy


def status(conn, job_id) -> str:
    return scalar(conn, "SELECT status FROM jobs WHERE id = %s", (job_id,))


@pytest.mark.parametrize("storage", ["table", "log"])
def test_job_that_kills_its_process_ends_failed_after_its_budget(conn, workers, database_url, storage):
    """Each worker reaps the lease its predecessor lost, then takes the job and dies
    of it; the fourth finds the budget (3 lease losses) used up and survives. Sent by SQL
    into job_queue (a session of storage "table"), or by a producer that knows the actor
    (the job log)."""
    if storage == "log":
        with log_producer(database_url, "tests", {"suicide": {"max_retries": 1}}) as producer:
            job = producer.actors["suicide"].send().message_id
        assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (job,)) == 1
    else:
        # (a row of job_queue: through the jobs view an SQL insert goes to the log, 055)
        job = scalar(conn, "INSERT INTO job_queue (queue, actor) VALUES ('tests', 'suicide') RETURNING id")
    deaths = 0
    for _ in range(4):
        w = workers(threads=1, lease=1, heartbeat=0.3)
        wait_for(lambda w=w: w.proc.poll() is not None or status(conn, job) == "failed", 90,
                 message="the job to kill its process, or to fail")
        if status(conn, job) == "failed":
            break
        deaths += 1
    row = conn.execute("SELECT attempts, lease_losses, max_attempts, last_error FROM jobs WHERE id = %s",
                       (job,)).fetchone()
    assert deaths == 3 and row[:3] == (3, 3, 2)  # suicide has max_retries=1, which lost leases never spend
    assert row[3].startswith("poison pill: lease lost 3 times") and "max_lease_losses=3" in row[3]
    assert w.proc.poll() is None  # the last worker reaped it and lives on


BAD_ROWS = {
    # (actor, args, kwargs, options): the words last_error must contain
    ("record", "5", "{}", "{}"): "args must be a JSON array, got a number",
    ("record", "null", "{}", "{}"): "args must be a JSON array, got null",
    ("record", "[]", "[1]", "{}"): "kwargs must be a JSON object, got an array",
    ("record", "[]", "{}", '"x"'): "options must be a JSON object, got a string",
    ("no_such_actor", "[]", "{}", "{}"): "no actor named no_such_actor",
    ("record", "[]", "{}", '{"eta": "soon"}'): "options.eta must be a number >= 0, got a string",
    ("record", "[]", "{}", '{"max_retries": "lots"}'): "options.max_retries must be a number >= 0, got a string",
    ("record", "[]", "{}", '{"min_backoff": -5}'): "options.min_backoff must be a number >= 0, got a number",
}


def test_bad_rows_fail_alone_at_once_among_good_rows(conn, workers):
    w = workers(threads=8, lease=30)
    w.wait_ready(conn, timeout=90)
    with conn.transaction():  # one statement per row, one commit: claimed together
        good = [scalar(conn, "INSERT INTO jobs (queue, actor, args, max_attempts) VALUES ('tests', 'record',"
                             " jsonb_build_array(%s), 1) RETURNING id", (i,)) for i in range(8)]
        bad = {scalar(conn, "INSERT INTO jobs (queue, actor, args, kwargs, options) VALUES ('tests', %s, %s, %s, %s)"
                            " RETURNING id", key): words for key, words in BAD_ROWS.items()}
    started = time.monotonic()
    wait_for(lambda: scalar(conn, "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')") == 0, 10,
             message="every row to finish")
    assert time.monotonic() - started < 5  # at once: no lease had to expire
    for job_id, words in bad.items():
        state, error, attempts = conn.execute("SELECT status, last_error, attempts FROM jobs WHERE id = %s",
                                              (job_id,)).fetchone()
        assert (state, attempts) == ("failed", 1) and words in error, (error, words)
        assert error.startswith("cannot become a message: ")
    assert conn.execute("SELECT DISTINCT status, attempts FROM jobs WHERE id = ANY(%s)", (good,)).fetchall() == [
        ("succeeded", 1)]
    assert scalar(conn, "SELECT count(*) FROM test_results") == len(good)  # each good job ran once
    assert scalar(conn, "SELECT count(*) FROM job_events WHERE reason LIKE 'lease expired%%'") == 0
    assert w.proc.poll() is None
    assert "Traceback" not in w.stderr()  # no thread died


def test_eta_option_never_marks_an_unrun_job_succeeded(conn, workers):
    w = workers(threads=2)
    w.wait_ready(conn, timeout=90)
    soon = int(time.time() * 1000) + 200
    job = scalar(conn, "INSERT INTO jobs (queue, actor, args, options) VALUES ('tests', 'record', '[7]',"
                       " jsonb_build_object('eta', %s::bigint)) RETURNING id", (soon,))
    wait_for(lambda: status(conn, job) in ("succeeded", "failed"), 10, message="the eta job to finish")
    assert status(conn, job) == "succeeded"
    assert scalar(conn, "SELECT count(*) FROM test_results WHERE job_id = %s AND n = 7", (job,)) == 1  # it ran


def test_failing_after_process_message_never_marks_succeeded(conn, workers):
    w = workers(threads=2)
    w.wait_ready(conn, timeout=90)
    job = scalar(conn, "INSERT INTO jobs (queue, actor) VALUES ('tests', 'broken_retry_policy') RETURNING id")
    wait_for(lambda: status(conn, job) in ("succeeded", "failed"), 10, message="the job to finish")
    assert status(conn, job) == "failed"
    assert "the job failed" in scalar(conn, "SELECT last_error FROM jobs WHERE id = %s", (job,))


def owner_pid(conn, job) -> int | None:
    row = conn.execute("SELECT w.pid FROM jobs j JOIN workers w ON w.id = j.lease_owner"
                       " WHERE j.id = %s AND j.status = 'running'", (job,)).fetchone()
    return row[0] if row else None


def runs(conn, job) -> list[tuple]:
    return conn.execute("SELECT pid, started, finished, tag FROM test_results WHERE job_id = %s"
                        " AND tag IS DISTINCT FROM 'started' ORDER BY started", (job,)).fetchall()


def announced(conn, job) -> list[int]:
    """The processes whose run of an announcing `ticking` job got under way, in order."""
    return [r[0] for r in conn.execute("SELECT pid FROM test_results WHERE job_id = %s AND tag = 'started'"
                                       " ORDER BY id", (job,))]


def test_frozen_process_stops_its_job_on_waking_and_never_writes_an_outcome(conn, workers):
    """SIGSTOP past the lease, then SIGCONT while the new owner runs the job.

    While frozen the first process runs nothing; on waking, its fence sees the
    overdue lease and interrupts the job at the thread's first bytecode check,
    which may come one 20 ms step of the actor after waking (a Python thread
    cannot be stopped before it runs again): the two runs share at most that step.
    """
    procs = {w.pid: w for w in (workers(threads=1, lease=2, heartbeat=0.3) for _ in range(2))}
    for w in procs.values():
        w.wait_ready(conn, timeout=90)
    job = scalar(conn, "INSERT INTO jobs (queue, actor, args, kwargs) VALUES ('tests', 'ticking', '[4]',"
                       " '{\"announce\": true}') RETURNING id")
    first = wait_for(lambda: owner_pid(conn, job), 10, message="the job to start")
    # Frozen inside the actor, not before it (a run that had not begun would just be skipped).
    wait_for(lambda: announced(conn, job) == [first], 10, message="the first run to be under way")
    os.kill(first, signal.SIGSTOP)
    try:
        second = wait_for(lambda: (pid := owner_pid(conn, job)) not in (None, first) and pid, 15,
                          message="another process to take the job over")
        # The new owner is mid-run when the frozen one wakes up.
        wait_for(lambda: announced(conn, job) == [first, second], 10, message="the second run to be under way")
    finally:
        woken = time.time()
        os.kill(first, signal.SIGCONT)
    wait_for(lambda: status(conn, job) == "succeeded", 15, message="the job to succeed")
    wait_for(lambda: len(runs(conn, job)) == 2, 10, message="both runs to be recorded")
    (pid_a, start_a, end_a, tag_a), (pid_b, start_b, end_b, tag_b) = runs(conn, job)
    assert (pid_a, tag_a, pid_b, tag_b) == (first, "interrupted", second, "done")
    assert start_a < start_b and start_b.timestamp() < woken < end_b.timestamp()  # b was mid-run at the wake
    # the first run did no work after waking beyond one step (and none while frozen)
    # (one 20 ms step, plus what a loaded machine adds before the woken threads run)
    assert end_a.timestamp() - woken < 0.5, f"first run went on {end_a.timestamp() - woken:.3f}s after waking"
    row = conn.execute("SELECT attempts, lease_losses FROM jobs WHERE id = %s", (job,)).fetchone()
    assert row == (2, 1)  # the frozen run wrote no outcome; its lost lease was counted once
    assert procs[first].proc.poll() is None  # fenced, not dead
    assert procs[first].signals.of(Interrupted) == [Interrupted(str(job), 1, "lease lost")]


def test_process_cut_off_from_the_database_stops_its_job_before_the_lease_expires(conn, workers, database_url):
    with TcpProxy(database_url) as proxy:
        w = workers(threads=1, lease=3, heartbeat=0.5, url=proxy.url)
        w.wait_ready(conn, timeout=90)
        job = scalar(conn, "INSERT INTO jobs (queue, actor, args, kwargs) VALUES ('tests', 'ticking', '[30]',"
                           " '{\"announce\": true}') RETURNING id")
        # Running, not only claimed: a claimed job that had not started when the database
        # went away is never started (the fence dooms it) rather than interrupted.
        wait_for(lambda: announced(conn, job) == [w.pid], 10, message="the run to be under way")
        proxy.go_down()
        expires = scalar(conn, "SELECT lease_expires_at FROM jobs WHERE id = %s", (job,))
        try:
            w.signals.wait(Interrupted, lambda s: s.job_id == str(job))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the worker's log ends:\n{w.stderr()[-2000:]}") from None
        assert scalar(conn, "SELECT clock_timestamp() < %s", (expires,))  # before the lease could expire
        proxy.come_back()
        # never acked: the row is reclaimed when its lease expires and runs again
        wait_for(lambda: scalar(conn, "SELECT attempts FROM jobs WHERE id = %s", (job,)) == 2, 20,
                 message="the job to be delivered again")
        assert scalar(conn, "SELECT lease_losses FROM jobs WHERE id = %s", (job,)) == 1


def test_cancel_interrupts_a_running_job_on_another_process(conn, workers):
    w = workers(threads=1)
    w.wait_ready(conn, timeout=90)
    job = scalar(conn, "INSERT INTO jobs (queue, actor, args, concurrency_key) VALUES"
                       " ('tests', 'ticking', '[30]', 'only-one') RETURNING id")
    wait_for(lambda: owner_pid(conn, job), 10, message="the job to start")
    nxt = scalar(conn, "INSERT INTO jobs (queue, actor, args) VALUES ('tests', 'record', '[1]') RETURNING id")
    done = cli("jobs", "cancel", str(job))
    assert done.returncode == 0, done.stderr
    assert scalar(conn, "SELECT count(*) FROM job_concurrency WHERE job_id IS NOT NULL") == 0  # the key's slot is free
    wait_for(lambda: status(conn, nxt) == "succeeded", 10, message="the freed thread to run the next job")
    wait_for(lambda: runs(conn, job), 5, message="the cancelled run to stop")
    # measured on the database clock from the cancel (not the CLI's start-up): the
    # run stopped and the process's one thread took the next job within 2 s
    stopped, next_started = conn.execute(
        "SELECT extract(epoch FROM r.finished - e.at), extract(epoch FROM n.started_at - e.at)"
        "  FROM job_events e, test_results r, jobs n"
        " WHERE e.job_id = %s AND e.to_status = 'cancelled' AND r.job_id = e.job_id AND n.id = %s",
        (job, nxt)).fetchone()
    assert stopped < 2.0 and next_started < 2.0, (stopped, next_started)
    assert runs(conn, job)[0][3] == "interrupted"
    assert status(conn, job) == "cancelled"
    again = cli("jobs", "cancel", str(job))
    assert again.returncode == 0 and status(conn, job) == "cancelled"  # cancelling twice is harmless
    pending = scalar(conn, "INSERT INTO jobs (queue, actor, run_at) VALUES ('tests', 'noop', now() + interval '1h')"
                           " RETURNING id")
    assert cli("jobs", "cancel", str(pending)).returncode == 0 and status(conn, pending) == "cancelled"
    events = conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s", (job,)).fetchall()
    assert events == [("running", "cancelled")]


def test_cancel_interrupts_a_running_job_of_the_log_on_another_process(conn, workers, database_url):
    """The same for a plain job sent by a producer that knows the actor (the job log): the
    cancel's done row fences the run's ack, and its process interrupts it."""
    w = workers(threads=1)
    w.wait_ready(conn, timeout=90)
    with log_producer(database_url, "tests", {"ticking": {"max_retries": 0}}) as producer:
        job = producer.actors["ticking"].send(30).message_id
    assert scalar(conn, "SELECT count(*) FROM job_log WHERE id = %s", (job,)) == 1
    wait_for(lambda: owner_pid(conn, job) == w.pid, 10, message="the job to start")
    cancelled_at = scalar(conn, "SELECT clock_timestamp()")
    done = cli("jobs", "cancel", job)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: runs(conn, job), 5, message="the cancelled run to stop")
    stopped = scalar(conn, "SELECT extract(epoch FROM finished - %s) FROM test_results WHERE job_id = %s"
                           " AND tag IS DISTINCT FROM 'started'", (cancelled_at, job))
    assert stopped < 3.0, stopped  # the CLI's start-up, then the interrupt
    assert runs(conn, job)[0][3] == "interrupted"
    assert status(conn, job) == "cancelled"
    assert cli("jobs", "cancel", job).returncode == 0 and status(conn, job) == "cancelled"  # twice is harmless
    assert conn.execute("SELECT from_status, to_status FROM job_events WHERE job_id = %s", (job,)).fetchall() == [
        ("running", "cancelled")]
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE id = %s", (job,)) == 1


def test_a_frozen_worker_under_the_supervisor_is_killed_before_its_lease_expires(tmp_path, conn, database_url,
                                                                                 supervisor):
    """Under the supervisor, a frozen (SIGSTOP) worker never overlaps with the job's next
    run: the master kills a silent child before any of its leases can expire, and
    releases its jobs only then, so the next run starts after the first has ended."""
    lease, heartbeat = 4.0, 0.5
    path = write_config(tmp_path / "s.yaml", database_url,
                        {"alpha": role(processes=2, threads=1, lease=f"{lease:g}s", heartbeat=f"{heartbeat:g}s")},
                        kill_grace="30s")  # capped by the lease: a frozen child cannot wait that long
    s = supervisor(path)
    s.wait_state({"alpha": 2})
    job = scalar(conn, "INSERT INTO jobs (queue, actor, args) VALUES ('tests', 'ticking', '[2]') RETURNING id")
    first = wait_for(lambda: owner_pid(conn, job), 10, message="the job to start")
    owner = scalar(conn, "SELECT lease_owner FROM jobs WHERE id = %s", (job,))
    os.kill(first, signal.SIGSTOP)
    renewals = set()

    def killed() -> bool:
        # the frozen process's last lease renewal, read while it still holds the job
        row = conn.execute("SELECT heartbeat_at FROM jobs WHERE id = %s AND lease_owner = %s",
                           (job, owner)).fetchone()
        if row:
            renewals.add(row[0])
        return dead(first)

    try:
        wait_for(killed, lease * 2, message="the frozen worker to be killed")
    finally:
        if not dead(first):
            os.kill(first, signal.SIGCONT)
    wait_for(lambda: status(conn, job) == "succeeded", 15, message="the job to succeed")
    released = scalar(conn, "SELECT at FROM job_events WHERE job_id = %s AND reason LIKE %s",
                      (job, f"%prior owner {owner}%"))
    # released by the master on reaping the killed process, before its lease could expire
    assert renewals and released < max(renewals) + timedelta(seconds=lease)
    assert "hung: no beat" in s.log()
    ((pid, started, _end, tag),) = runs(conn, job)  # the killed run never finished, so left no row
    assert (pid, tag) != (first, "done") and started > released  # the next run began after the first had ended
