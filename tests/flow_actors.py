"""Actors with flow control (supervisor/flow.py), for the flow tests. Plain Dramatiq plus
the runtime's options; each run notes when it started and ended on the server's clock."""

import os
import time

import dramatiq
from dramatiq.middleware import CurrentMessage

from supervisor import RateLimited

QUEUE = "flow"


def _note(tag: str, n: int, sleep_s: float = 0.0) -> None:
    """One test_results row per run: when it started and finished (server clock), by whom."""
    job_id = CurrentMessage.get_current_message().message_id
    pool = dramatiq.get_broker().actor_pool
    with pool.connection() as c:
        row = c.execute("INSERT INTO test_results (job_id, n, pid, started, tag) VALUES (%s, %s, %s, clock_timestamp(), %s)"
                        " RETURNING id", (job_id, n, os.getpid(), tag)).fetchone()
    if sleep_s:
        time.sleep(sleep_s)
    with pool.connection() as c:
        c.execute("UPDATE test_results SET finished = clock_timestamp() WHERE id = %s", (row[0],))


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit="4/s burst 2")
def paced(n: int, hold_s: float = 0.0) -> None:
    _note("paced", n, hold_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit="1/s", rate_limit_key="one-a-second")
def token(n: int) -> None:
    _note("token", n)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit="100/s burst 100", rate_limit_key="shop:{kwargs[shop]}")
def upstream(shop: str, n: int, block_s: float = 0.0) -> None:
    """The first run of a job sent with ``block_s`` hears 'slow down' from upstream."""
    job_id = CurrentMessage.get_current_message().message_id
    if block_s:
        with dramatiq.get_broker().actor_pool.connection() as c:
            told = c.execute("SELECT count(*) FROM test_results WHERE job_id = %s AND tag = '429'",
                             (job_id,)).fetchone()[0]
            if not told:
                c.execute("INSERT INTO test_results (job_id, n, pid, started, tag)"
                          " VALUES (%s, %s, %s, clock_timestamp(), '429')", (job_id, n, os.getpid()))
                raise RateLimited(retry_after=block_s)
    _note(shop, n)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_limit=3, concurrency_key="pool")
def capped(n: int, sleep_s: float = 0.05) -> None:
    _note("capped", n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, fairness_key="tenant:{kwargs[tenant]}")
def tenant_job(tenant: str, n: int, sleep_s: float = 0.01) -> None:
    _note(tenant, n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def plain(n: int, sleep_s: float = 0.0) -> None:
    _note("plain", n, sleep_s)
