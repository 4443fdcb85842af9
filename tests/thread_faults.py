"""A test-only actor module: imported by a worker process, it makes one of that process's
background threads fail once, as ``THREAD_FAULT`` says: ``<thread>:<bug|outage>:<marker>``.

``bug`` raises a RuntimeError (a programming error), ``outage`` a psycopg
OperationalError (the database away), in the step the named thread runs: the first
process to create the marker file fails, once; every other one, like the process that
replaces it, runs as usual. Without ``THREAD_FAULT`` it changes nothing.
"""

import os
import threading
import time

import dramatiq
import psycopg
from dramatiq.middleware import CurrentMessage

import supervisor
from supervisor.broker.consuming.completer import Completer
from supervisor.broker.consuming.progress import ProgressBuffer
from supervisor.broker.consuming.timer import DueTimer
from supervisor.worker.upkeep import Upkeep

# thread name -> (class, the method that thread calls each round)
TARGETS = {
    "ack-batcher": (Completer, "write_acks"),
    "due-timer": (DueTimer, "next_due"),
    "progress-writer": (ProgressBuffer, "write"),
    "upkeep": (Upkeep, "beat"),
}
ERRORS = {"bug": RuntimeError, "outage": psycopg.OperationalError}


def _inject(spec: str) -> None:
    thread, kind, marker = spec.split(":", 2)
    cls, name = TARGETS[thread]
    error = ERRORS[kind]
    original = getattr(cls, name)

    def faulty(*args, **kwargs):
        if threading.current_thread().name == thread:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # fired already (here or in another process)
            else:
                raise error(f"injected {kind} in {thread}")
        return original(*args, **kwargs)

    setattr(cls, name, faulty)


if os.environ.get("THREAD_FAULT"):
    _inject(os.environ["THREAD_FAULT"])


@dramatiq.actor(queue_name="tests", max_retries=0)
def reporting_record(n: int = 0) -> None:
    """Reports progress (so the progress writer has work), then records its run."""
    supervisor.progress(50, "half way")
    with dramatiq.get_broker().actor_pool.connection() as c:
        c.execute("INSERT INTO test_results (job_id, n, pid, started) VALUES (%s, %s, %s, to_timestamp(%s))",
                  (CurrentMessage.get_current_message().message_id, n, os.getpid(), time.time()))
