"""Actors whose key carries a concurrency limit alone (they live in the log: migration 053),
for tests/test_log_concurrency.py. Each run notes when it started and ended on the server's
clock (test_results), as tests/flow_actors.py's do."""

import dramatiq
from dramatiq.middleware import CurrentMessage

from tests.run_notes import note

QUEUE = "keyed"


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_key="acct:{kwargs[account]}")
def one_at_a_time(account: str, n: int, sleep_s: float = 0.02, fail: bool = False) -> None:
    """One job per account at a time."""
    note(account, n, sleep_s, fail)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_limit=3, concurrency_key="three")
def three_at_a_time(n: int, sleep_s: float = 0.02) -> None:
    note("three", n, sleep_s)


@dramatiq.actor(queue_name=QUEUE, max_retries=1, min_backoff=300, max_backoff=300,
                concurrency_key="acct:{kwargs[account]}")
def retried_once(account: str, n: int) -> None:
    """Its first run takes 1 s, fails and waits 0.3 s for its retry; the second succeeds."""
    job_id = CurrentMessage.get_current_message().message_id
    with dramatiq.get_broker().actor_pool.connection() as c:
        first = c.execute("SELECT count(*) FROM test_results WHERE job_id = %s", (job_id,)).fetchone()[0] == 0
    note(account, n, 1.0 if first else 0.0, fail=first)
