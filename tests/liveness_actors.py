"""Actors of the liveness tests (test_liveness.py). Plain Dramatiq.

Each run records its start and, when it ends, its last 20 ms step in test_results,
over a connection of its own to LIVENESS_RESULTS_URL: a run on a process cut off from
the database still records when it stopped, and the connection carries no name of the
process's (a process is found dead when the server holds no session of its name)."""

import os
import time

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage

RECORD = ("INSERT INTO test_results (job_id, n, pid, started, finished, tag)"
          " VALUES (%s, 0, %s, to_timestamp(%s), to_timestamp(%s), %s)")


@dramatiq.actor(queue_name="liveness", max_retries=0)
def steps(seconds: float) -> None:
    """``seconds`` of 20 ms steps (a frozen run does not get ahead)."""
    job = CurrentMessage.get_current_message().message_id
    with psycopg.connect(os.environ["LIVENESS_RESULTS_URL"], autocommit=True) as c:
        started = last = time.time()
        c.execute(RECORD, (job, os.getpid(), started, None, "started"))
        outcome = "interrupted"
        try:
            for _ in range(int(seconds / 0.02)):
                time.sleep(0.02)
                last = time.time()
            outcome = "done"
        finally:
            c.execute(RECORD, (job, os.getpid(), started, last, outcome))
