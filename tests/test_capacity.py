"""v_queue_capacity through `supervisor queues`: counts, throughput and workers needed,
from rows whose numbers are known."""

from __future__ import annotations

import json
import math

from tests.conftest import cli


def percentile_cont(values: list[float], p: float) -> float:
    """PostgreSQL's percentile_cont: linear between the two nearest ranks."""
    ordered = sorted(values)
    at = p * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def test_capacity_plan_from_known_rows(conn, database_url):
    # Queue "cap": 30 pending now, 5 scheduled later, 2 running, 3 retryable (due), 4
    # retryable in their backoff, and in the last hour 100 succeeded (2 s each, having
    # waited i x 10 ms from due to start), one succeeded that never ran (skipped: no
    # start, no duration) and 20 failed, finished by two processes; one more succeeded
    # two hours ago (outside the window).
    conn.execute("""
        INSERT INTO jobs (queue, actor, status, run_at)
        SELECT 'cap', 'a', 'pending', now() - interval '1 minute' FROM generate_series(1, 30);
        INSERT INTO jobs (queue, actor, status, run_at)
        SELECT 'cap', 'a', 'pending', now() + interval '1 hour' FROM generate_series(1, 5);
        INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at) SELECT 'cap', 'a', 'running', 'h:1:a', now()
          FROM generate_series(1, 2);
        INSERT INTO jobs (queue, actor, status, run_at) SELECT 'cap', 'a', 'retryable', now() FROM generate_series(1, 3);
        INSERT INTO jobs (queue, actor, status, run_at)
        SELECT 'cap', 'a', 'retryable', now() + interval '1 minute' FROM generate_series(1, 4);
        INSERT INTO jobs (queue, actor, status, lease_owner, created_at, run_at, started_at, finished_at)
        SELECT 'cap', 'a', 'succeeded', CASE WHEN i % 2 = 0 THEN 'h:1:a' ELSE 'h:2:b' END,
               now() - interval '1 hour', now() - interval '10 minutes' - interval '2 seconds' - i * interval '10 ms',
               now() - interval '10 minutes' - interval '2 seconds', now() - interval '10 minutes'
          FROM generate_series(1, 100) AS i;
        INSERT INTO jobs (queue, actor, status, lease_owner, finished_at)
        VALUES ('cap', 'a', 'succeeded', 'h:1:a', now() - interval '1 minute');
        INSERT INTO jobs (queue, actor, status, lease_owner, created_at, run_at, started_at, finished_at)
        SELECT 'cap', 'a', 'failed', 'h:1:a', now() - interval '6 minutes', now() - interval '6 minutes',
               now() - interval '5 minutes', now() - interval '5 minutes'
          FROM generate_series(1, 20);
        INSERT INTO jobs (queue, actor, status, started_at, finished_at)
        VALUES ('cap', 'a', 'succeeded', now() - interval '2 hours', now() - interval '2 hours');
        INSERT INTO workers (id, host, pid, role, queues, capacity) VALUES
            ('h:1:a', 'h', 1, 'w', '{cap,other}', 4), ('h:2:b', 'h', 2, 'w', '{cap}', 4),
            ('h:3:c', 'h', 3, 'w', '{cap}', 4);
        UPDATE workers SET stopped_at = now() WHERE id = 'h:3:c';
    """)
    out = cli("queues", "--json", url=database_url)
    assert out.returncode == 0, out.stderr
    rows = {r["queue"]: r for r in json.loads(out.stdout)}
    cap = rows["cap"]
    # Each live job in one state: ready (pending, due), scheduled (not due), retryable (due), running.
    assert (cap["ready"], cap["scheduled"], cap["running"], cap["retryable"]) == (30, 9, 2, 3)
    assert (cap["succeeded_1h"], cap["failed_1h"]) == (101, 20)
    assert cap["avg_duration_s"] == 2.0  # the job that never ran has no duration, not 0 s
    # Start waits: the 100 that waited i x 10 ms and the 20 failed ones that waited 60 s.
    waits = [i / 100 for i in range(1, 101)] + [60.0] * 20
    assert (cap["wait_p50_s"], cap["wait_p95_s"], cap["wait_p99_s"]) == tuple(
        round(percentile_cont(waits, p), 3) for p in (0.5, 0.95, 0.99))
    assert cap["active_workers"] == 2 and cap["capacity"] == 8  # the stopped one does not count
    throughput = 121 / 2  # jobs finished in the hour per process that finished any
    backlog = 35 + 7 + 2
    assert cap["throughput_per_worker_hour"] == throughput and cap["backlog"] == backlog
    assert cap["ready"] + cap["scheduled"] + cap["running"] + cap["retryable"] == backlog
    assert cap["drain_seconds"] == round(backlog * 3600 / (throughput * 2), 1)
    assert (cap["workers_needed_1h"], cap["workers_needed_4h"], cap["workers_needed_8h"]) == (
        math.ceil(backlog / throughput), math.ceil(backlog / (4 * throughput)), math.ceil(backlog / (8 * throughput)))
    # A queue only a worker serves is listed, with nothing to drain and no waits known.
    assert rows["other"]["backlog"] == 0 and rows["other"]["workers_needed_1h"] == 0
    assert rows["other"]["wait_p99_s"] is None
    human = cli("queues", url=database_url)
    assert human.returncode == 0 and "WORKERS_NEEDED_1H" in human.stdout and "cap" in human.stdout
    assert "WAIT_P99_S" in human.stdout
