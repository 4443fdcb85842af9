"""Actors with flow control (supervisor/flow.py), for the flow tests. Plain Dramatiq plus
the runtime's options; each run notes when it started and ended on the server's clock."""

import os

import dramatiq
from dramatiq.middleware import CurrentMessage

from supervisor import RateLimited
from tests.run_notes import note

QUEUE = "flow"


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit="4/s burst 2")
def paced(n: int, hold_s: float = 0.0) -> None:
    note("paced", n, hold_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit="1/s", rate_limit_key="one-a-second")
def token(n: int) -> None:
    note("token", n)


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
    note(shop, n)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_limit=3, concurrency_key="pool")
def capped(n: int, sleep_s: float = 0.05) -> None:
    note("capped", n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, fairness_key="tenant:{kwargs[tenant]}")
def tenant_job(tenant: str, n: int, sleep_s: float = 0.01) -> None:
    note(tenant, n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def plain(n: int, sleep_s: float = 0.0) -> None:
    note("plain", n, sleep_s)
