"""Actors whose key carries a concurrency limit alone (they live in the log: migration 053),
for tests/test_log_concurrency.py. Each run notes when it started and ended on the server's
clock (test_results), as tests/flow_actors.py's do."""

import os
import time

import dramatiq
from dramatiq.middleware import CurrentMessage

QUEUE = "keyed"


def _note(tag: str, n: int, sleep_s: float = 0.0, fail: bool = False) -> None:
    job_id = CurrentMessage.get_current_message().message_id
    pool = dramatiq.get_broker().actor_pool
    with pool.connection() as c:
        row = c.execute("INSERT INTO test_results (job_id, n, pid, started, tag) VALUES (%s, %s, %s, clock_timestamp(), %s)"
                        " RETURNING id", (job_id, n, os.getpid(), tag)).fetchone()
    if sleep_s:
        time.sleep(sleep_s)
    with pool.connection() as c:
        c.execute("UPDATE test_results SET finished = clock_timestamp() WHERE id = %s", (row[0],))
    if fail:
        raise ValueError(f"run {n} of {tag} fails")


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_key="acct:{kwargs[account]}")
def one_at_a_time(account: str, n: int, sleep_s: float = 0.02, fail: bool = False) -> None:
    """One job per account at a time."""
    _note(account, n, sleep_s, fail)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_limit=3, concurrency_key="three")
def three_at_a_time(n: int, sleep_s: float = 0.02) -> None:
    _note("three", n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=1, min_backoff=300, max_backoff=300,
                concurrency_key="acct:{kwargs[account]}")
def retried_once(account: str, n: int) -> None:
    """Its first run takes 1 s, fails and waits 0.3 s for its retry; the second succeeds."""
    job_id = CurrentMessage.get_current_message().message_id
    with dramatiq.get_broker().actor_pool.connection() as c:
        first = c.execute("SELECT count(*) FROM test_results WHERE job_id = %s", (job_id,)).fetchone()[0] == 0
    _note(account, n, 1.0 if first else 0.0, fail=first)
