"""v_queue_capacity through `supervisor queues`: counts, throughput and workers needed,
from rows whose numbers are known."""

from __future__ import annotations

import json
import math

from tests.conftest import cli


def test_capacity_plan_from_known_rows(conn, database_url):
    # Queue "cap": 30 pending now, 5 scheduled later, 2 running, 3 retryable (due), and in the
    # last hour 100 succeeded (2 s each) and 20 failed, finished by two processes; one more
    # succeeded two hours ago (outside the window).
    conn.execute("""
        INSERT INTO jobs (queue, actor, status, run_at)
        SELECT 'cap', 'a', 'pending', now() - interval '1 minute' FROM generate_series(1, 30);
        INSERT INTO jobs (queue, actor, status, run_at)
        SELECT 'cap', 'a', 'pending', now() + interval '1 hour' FROM generate_series(1, 5);
        INSERT INTO jobs (queue, actor, status, lease_owner, claimed_at) SELECT 'cap', 'a', 'running', 'h:1:a', now()
          FROM generate_series(1, 2);
        INSERT INTO jobs (queue, actor, status, run_at) SELECT 'cap', 'a', 'retryable', now() FROM generate_series(1, 3);
        INSERT INTO jobs (queue, actor, status, lease_owner, started_at, finished_at)
        SELECT 'cap', 'a', 'succeeded', CASE WHEN i % 2 = 0 THEN 'h:1:a' ELSE 'h:2:b' END,
               now() - interval '10 minutes' - interval '2 seconds', now() - interval '10 minutes'
          FROM generate_series(1, 100) AS i;
        INSERT INTO jobs (queue, actor, status, lease_owner, started_at, finished_at)
        SELECT 'cap', 'a', 'failed', 'h:1:a', now() - interval '5 minutes', now() - interval '5 minutes'
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
    assert (cap["pending"], cap["ready"], cap["scheduled"], cap["running"], cap["retryable"]) == (35, 33, 5, 2, 3)
    assert (cap["succeeded_1h"], cap["failed_1h"]) == (100, 20)
    assert cap["avg_duration_s"] == 2.0
    assert cap["active_workers"] == 2 and cap["capacity"] == 8  # the stopped one does not count
    throughput = 120 / 2  # jobs finished in the hour per process that finished any
    backlog = 35 + 3 + 2
    assert cap["throughput_per_worker_hour"] == throughput and cap["backlog"] == backlog
    assert cap["drain_seconds"] == round(backlog * 3600 / (throughput * 2), 1)
    assert (cap["workers_needed_1h"], cap["workers_needed_4h"], cap["workers_needed_8h"]) == (
        math.ceil(backlog / throughput), math.ceil(backlog / (4 * throughput)), math.ceil(backlog / (8 * throughput)))
    # A queue only a worker serves is listed, with nothing to drain.
    assert rows["other"]["backlog"] == 0 and rows["other"]["workers_needed_1h"] == 0
    human = cli("queues", url=database_url)
    assert human.returncode == 0 and "WORKERS_NEEDED_1H" in human.stdout and "cap" in human.stdout
