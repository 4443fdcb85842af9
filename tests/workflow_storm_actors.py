"""Actors of the workflow SIGKILL storm (tests/test_workflow_storm.py): each run recorded in
test_results (tag: step or join; n: the step; pid: the process), after its work."""

import os
import time

import dramatiq
from dramatiq.middleware import CurrentMessage


def _record(tag: str, n: int) -> None:
    with dramatiq.get_broker().actor_pool.connection() as c:
        c.execute("INSERT INTO test_results (job_id, n, pid, tag, started) VALUES (%s, %s, %s, %s, clock_timestamp())",
                  (CurrentMessage.get_current_message().message_id, n, os.getpid(), tag))


# A budget of lease losses the storm cannot spend: a step killed twice runs a third time.
@dramatiq.actor(queue_name="tests", max_retries=3, min_backoff=100, max_lease_losses=50)
def storm_step(n: int, sleep_s: float = 0.02, parents: list[int] | None = None) -> int:
    time.sleep(sleep_s)
    _record("step", n)
    return n


@dramatiq.actor(queue_name="tests", max_retries=3, min_backoff=100, max_lease_losses=50)
def storm_join(parents: list[int]) -> int:
    _record("join", len(parents))
    with dramatiq.get_broker().actor_pool.connection() as c:
        c.execute("INSERT INTO test_results (job_id, n, tag) VALUES (%s, %s, 'join-sum')",
                  (CurrentMessage.get_current_message().message_id, sum(parents)))
    return sum(parents)
