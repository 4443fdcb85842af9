"""What actor modules of the tests share: each run noted in test_results, when it started
and ended on the server's clock, by which process (tests/flow_actors.py, tests/keyed_actors.py);
and how many such runs were open at once (a limit's tests)."""

import os
import time

import dramatiq
from dramatiq.middleware import CurrentMessage


def note(tag: str, n: int, sleep_s: float = 0.0, fail: bool = False) -> None:
    """One test_results row per run: when it started and finished (server clock), by whom;
    ``fail``: the run then raises, after noting its end."""
    job_id = CurrentMessage.get_current_message().message_id
    pool = dramatiq.get_broker().actor_pool
    with pool.connection() as c:
        row = c.execute("INSERT INTO test_results (job_id, n, pid, started, tag) VALUES (%s, %s, %s, clock_timestamp(), %s)"
                        " RETURNING id", (job_id, n, os.getpid(), tag)).fetchone()
    if sleep_s:
        time.sleep(sleep_s)
    with pool.connection() as c:
        c.execute("UPDATE test_results SET finished = clock_timestamp() WHERE id = %s", (row[0],))
    if fail:
        raise ValueError(f"run {n} of {tag} fails")


def most_at_once(spans: list[tuple]) -> int:
    """The most spans (start, end) open at one instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda e: (e[0], e[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most
