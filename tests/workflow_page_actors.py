"""Actors of the Workflows page's tests: a step the test lets go of. Plain Dramatiq, run by
`supervisor` worker processes."""

import time

import dramatiq
from dramatiq.middleware import CurrentMessage


@dramatiq.actor(queue_name="wfpage", max_retries=0)
def gated(name: str, parents: list | None = None) -> str:
    """Records that it started, then runs until the test lets it go: a row of test_results
    tagged go:NAME (a look every 20 ms: a worker's thread, not the test, waits here)."""
    pool = dramatiq.get_broker().actor_pool
    job = CurrentMessage.get_current_message().message_id
    with pool.connection() as c:
        c.execute("INSERT INTO test_results (job_id, tag) VALUES (%s, %s)", (job, f"started:{name}"))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with pool.connection() as c:
            if c.execute("SELECT 1 FROM test_results WHERE tag = %s", (f"go:{name}",)).fetchone():
                return name
        time.sleep(0.02)
    raise TimeoutError(f"step {name} was never let go")
