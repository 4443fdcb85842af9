"""Actors used by the benchmarks. Plain Dramatiq: no broker code in here.

All of them live on the ``bench`` queue and never retry, so a failure shows up
as a ``failed`` row instead of hiding inside a backoff.
"""

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import time

import dramatiq
from dramatiq.middleware import CurrentMessage

import supervisor

QUEUE = "bench"


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop() -> None:
    pass


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def sleeper(seconds: float = 0.05) -> None:
    time.sleep(seconds)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def latency(sent: float) -> None:
    """Record when this job started next to when its producer called send().

    The clock is read first thing; the row goes to an UNLOGGED table, whose
    commit waits for no WAL flush, so recording does not slow the next claim.
    """
    started = time.time()
    job_id = CurrentMessage.get_current_message().message_id
    with dramatiq.get_broker().actor_pool.connection() as c:
        c.execute(
            "INSERT INTO bench_latency (job_id, sent, started) VALUES (%s, %s, %s)",
            (job_id, sent, started),
        )


def _record_start() -> None:
    started = time.time()
    job_id = CurrentMessage.get_current_message().message_id
    with dramatiq.get_broker().actor_pool.connection() as c:
        c.execute("INSERT INTO bench_latency (job_id, sent, started) VALUES (%s, 0, %s)", (job_id, started))


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def delayed() -> None:
    """Sent with a delay: records when it started (its due time is the row's run_at)."""
    _record_start()


@dramatiq.actor(queue_name=QUEUE, max_retries=1)
def retried(delay_ms: int) -> None:
    """Asks for one retry in ``delay_ms``, then records when the retry started."""
    if CurrentMessage.get_current_message().options.get("retries", 0) == 0:
        raise dramatiq.Retry(delay=delay_ms)
    _record_start()


def _report_ten() -> None:
    for step in range(1, 11):
        supervisor.progress(10 * step, f"step {step} of 10")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def noop_progress() -> None:
    """``noop`` that reports progress ten times (bench_progress.py)."""
    _report_ten()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def latency_progress(sent: float) -> None:
    """``latency`` that then reports progress ten times (bench_progress.py)."""
    latency.fn(sent)
    _report_ten()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def timed(sent: float, seconds: float) -> None:
    """Records when it started next to when it was sent (``latency``), then runs until
    ``seconds`` have passed since it started (bench_mixed.py)."""
    started = time.monotonic()
    latency.fn(sent)
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
