"""Actors of the workflow tests (groups, rate limiters): plain Dramatiq, run by `supervisor`
worker processes. Each records its runs in test_results (tag: which actor)."""

import os
import time

import dramatiq
from dramatiq.middleware import CurrentMessage
from dramatiq.rate_limits import ConcurrentRateLimiter

from supervisor.rate_limits import PostgresBackend

# No argument: the worker's own broker's database, found at first use.
SLOTS = ConcurrentRateLimiter(PostgresBackend(), "workflow-test-slots", limit=2)


def _record(tag: str, n: int | None = None) -> int:
    with dramatiq.get_broker().actor_pool.connection() as c:
        return c.execute(
            "INSERT INTO test_results (job_id, n, pid, tag, started) VALUES (%s, %s, %s, %s, clock_timestamp())"
            " RETURNING id", (CurrentMessage.get_current_message().message_id, n, os.getpid(), tag)).fetchone()[0]


@dramatiq.actor(queue_name="tests", max_retries=3, min_backoff=100)
def member(n: int, sleep_s: float = 0.0, piped: int | None = None) -> int:
    """A group member: runs, then records its run (and what a pipeline piped to it)."""
    time.sleep(sleep_s)
    _record("member" if piped is None else f"member<-{piped}", n)
    return n


@dramatiq.actor(queue_name="tests", max_retries=0)
def group_done() -> None:
    """A group's completion callback."""
    _record("done")


@dramatiq.actor(queue_name="tests", max_retries=0)
def slotted(n: int, hold_s: float = 0.03) -> None:
    """Holds one of SLOTS's 2 slots for hold_s: its entry and exit recorded while inside."""
    while True:
        with SLOTS.acquire(raise_on_failure=False) as acquired:
            if acquired:
                row = _record("slot", n)
                time.sleep(hold_s)
                with dramatiq.get_broker().actor_pool.connection() as c:
                    c.execute("UPDATE test_results SET finished = clock_timestamp() WHERE id = %s", (row,))
                return
        time.sleep(0.005)  # the slots are busy: try again


@dramatiq.actor(queue_name="tests", max_retries=0)
def seed(n: int) -> int:
    """A pipeline's first step: its value goes to every member of the group after it."""
    return n


@dramatiq.actor(queue_name="tests", max_retries=0)
def collected(values: list[int]) -> None:
    """The step after a group: records the members' results it received, in order."""
    _record("collected:" + ",".join(str(v) for v in values), len(values))
