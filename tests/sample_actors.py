"""Actors used by the tests. Plain Dramatiq: no broker code in here."""

import os
import threading
import time

import dramatiq
from dramatiq.middleware import CurrentMessage


def _pool():
    return dramatiq.get_broker().actor_pool


def _job_id() -> str:
    return CurrentMessage.get_current_message().message_id


@dramatiq.actor(queue_name="tests", max_retries=0)
def noop() -> None:
    pass


@dramatiq.actor(queue_name="tests", max_retries=0)
def nap(n: int = 0, sleep_s: float = 0.0) -> None:
    """Sleeps and touches no database: only the broker's own connections are in use."""
    if sleep_s:
        time.sleep(sleep_s)


@dramatiq.actor(queue_name="tests", max_retries=3, min_backoff=200)
def record(n: int = 0, sleep_s: float = 0.0) -> None:
    """Insert one row per run into test_results: how many times each job ran."""
    started = time.time()
    if sleep_s:
        time.sleep(sleep_s)
    with _pool().connection() as c:
        c.execute(
            "INSERT INTO test_results (job_id, n, pid, thread, started) VALUES (%s, %s, %s, %s, to_timestamp(%s))",
            (_job_id(), n, os.getpid(), threading.get_ident(), started),
        )


@dramatiq.actor(queue_name="tests", max_retries=2, min_backoff=100, max_backoff=100_000)
def flaky(fail_times: int) -> None:
    """Fails its first `fail_times` attempts, then records success."""
    with _pool().connection() as c:
        c.execute("INSERT INTO test_results (job_id, n, pid) VALUES (%s, -1, %s)", (_job_id(), os.getpid()))
        runs = c.execute("SELECT count(*) FROM test_results WHERE job_id = %s", (_job_id(),)).fetchone()[0]
    if runs <= fail_times:
        raise RuntimeError(f"planned failure {runs} of {fail_times}")


@dramatiq.actor(queue_name="tests", max_retries=0, time_limit=300)
def slow(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # a busy loop so TimeLimit's async exception lands promptly
        time.sleep(0.01)


@dramatiq.actor(queue_name="tests", max_retries=0)
def hold(key: str, seconds: float) -> None:
    """Records start/end so tests can check that keyed jobs never overlap."""
    started = time.time()
    time.sleep(seconds)
    with _pool().connection() as c:
        c.execute(
            "INSERT INTO test_results (job_id, n, pid, started, finished, tag)"
            " VALUES (%s, 0, %s, to_timestamp(%s), clock_timestamp(), %s)",
            (_job_id(), os.getpid(), started, key),
        )


@dramatiq.actor(queue_name="tests", max_retries=1)
def suicide() -> None:
    """Kills its own process: a poison pill."""
    os.kill(os.getpid(), 9)


@dramatiq.actor(queue_name="tests", max_retries=0)
def on_done(message_data, result) -> None:
    with _pool().connection() as c:
        c.execute("INSERT INTO test_results (job_id, n, pid, tag) VALUES (%s, 0, %s, 'callback')",
                  (message_data["message_id"], os.getpid()))


@dramatiq.actor(queue_name="tests", max_retries=0)
def record_once(n: int = 0, sleep_s: float = 0.0) -> None:
    """`record` with no retries: only a lost lease may deliver it again."""
    record.fn(n, sleep_s)


@dramatiq.actor(queue_name="tests", max_retries=0)
def ticking(seconds: float, tag: str = "", announce: bool = False) -> None:
    """Works in 20 ms steps; records when it started and its last step, also when
    interrupted, so tests can check that two runs of one job never overlap. With
    ``announce``, a 'started' row first: a test can wait until a run is under way."""
    started = last = time.time()
    if announce:
        with _pool().connection() as c:
            c.execute("INSERT INTO test_results (job_id, n, pid, started, tag) VALUES (%s, 0, %s, to_timestamp(%s),"
                      " 'started')", (_job_id(), os.getpid(), started))
    outcome = "interrupted"
    try:
        for _ in range(int(seconds / 0.02)):  # steps, not wall time: a frozen run does not get ahead
            time.sleep(0.02)
            last = time.time()
        outcome = "done"
    finally:
        with _pool().connection() as c:
            c.execute(
                "INSERT INTO test_results (job_id, n, pid, started, finished, tag)"
                " VALUES (%s, 0, %s, to_timestamp(%s), to_timestamp(%s), %s)",
                (_job_id(), os.getpid(), started, last, f"{tag}{outcome}"),
            )


@dramatiq.actor(queue_name="tests", max_retries=3, min_backoff=100, retry_when=lambda retries, exc: 1 / 0)
def broken_retry_policy() -> None:
    """Fails, and its retry policy fails too (inside Retries.after_process_message)."""
    raise RuntimeError("the job failed")
