"""Actors of bench/bench_limits.py, on the ``limits`` queue: flow control (supervisor/flow.py)
and a plain actor beside them. Each records when it started in bench_latency."""

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import time

import dramatiq
from dramatiq.middleware import CurrentMessage

QUEUE = "limits"
RATE = 20  # per second, the target's figure


def _started() -> None:
    started = time.time()
    job_id = CurrentMessage.get_current_message().message_id
    with dramatiq.get_broker().actor_pool.connection() as c:
        c.execute("INSERT INTO bench_latency (job_id, sent, started) VALUES (%s, 0, %s)", (job_id, started))


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit=f"{RATE}/s", rate_limit_key="bench-rate")
def paced() -> None:
    _started()


@dramatiq.actor(queue_name=QUEUE, max_retries=0, rate_limit="1/h", rate_limit_key="gated:{args[0]}")
def gated(key: int) -> None:
    pass


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def free() -> None:
    pass


@dramatiq.actor(queue_name=QUEUE, max_retries=0, fairness_key="tenant:{args[0]}")
def tenant(name: str, seconds: float = 0.01) -> None:
    if name != "a":
        _started()
    time.sleep(seconds)
