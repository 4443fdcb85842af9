"""Connection economy: a worker process under full load holds at most
defaults.WORKER_CONNECTIONS connections, and a host holds one LISTEN connection
(the master's relay), whatever its number of processes."""

from __future__ import annotations

import time
from collections import Counter

from supervisor import db, defaults
from tests.conftest import scalar
from tests.supervisor_helpers import enqueue, role, write_config

# Sessions of our processes; application_name is "actor-supervisor NODE:PID" on the job
# path and "actor-supervisor-upkeep NODE:PID" on the upkeep's vacuum and prune.
SESSIONS = """
SELECT split_part(application_name, ':', 2)::int AS pid, query LIKE 'LISTEN actor_supervisor%%' AS listen,
       application_name LIKE %(upkeep)s AS upkeep
  FROM pg_stat_activity
 WHERE datname = current_database() AND application_name LIKE 'actor-supervisor%%'
"""


def test_workers_hold_two_connections_and_the_host_one_listen(tmp_path, conn, database_url, supervisor):
    path = write_config(tmp_path / "s.yaml", database_url, {
        "alpha": role(processes=2, threads=8),
        "beta": role(processes=2, threads=8, queues=("other",)),
    })
    s = supervisor(path)
    s.wait_state({"alpha": 2, "beta": 2})
    workers = s.pids()
    enqueue(conn, 4000, actor="nap", sleep_s=0.002)
    enqueue(conn, 4000, actor="nap", sleep_s=0.002, queue="other")
    peak: Counter[int] = Counter()
    upkeep_peak: Counter[int] = Counter()
    listens: set[int] = set()
    samples = 0
    deadline = time.monotonic() + 120
    # Sample every session of ours until both queues are drained (each sample is one query).
    while scalar(conn, "SELECT count(*) FROM jobs WHERE status <> 'succeeded'"):
        assert time.monotonic() < deadline, "the two queues were not drained within 120 s"
        per_pid: Counter[int] = Counter()
        upkeep: Counter[int] = Counter()
        for pid, listen, maintenance in conn.execute(SESSIONS, {"upkeep": db.MAINTENANCE_NAME + " %"}).fetchall():
            (upkeep if maintenance else per_pid)[pid] += 1
            if listen:
                listens.add(pid)
        for pid, n in per_pid.items():
            peak[pid] = max(peak[pid], n)
        for pid, n in upkeep.items():
            upkeep_peak[pid] = max(upkeep_peak[pid], n)
        samples += 1
    assert samples >= 5, "the drain was too short to sample"
    assert scalar(conn, "SELECT count(*) FROM jobs WHERE status = 'succeeded'") == 8000
    busy = {pid: peak[pid] for pid in workers}
    assert all(n >= 1 for n in busy.values()), busy  # every worker was seen working
    assert max(busy.values()) <= defaults.WORKER_CONNECTIONS, busy
    # Beside them, a process's vacuum and prune threads hold a short-lived session each
    # while they run (ARCHITECTURE, "Connections"), one of each at a time.
    assert max(upkeep_peak.values(), default=0) <= 2, upkeep_peak
    # The one LISTEN connection of the host is the master's; no worker listens. (A process
    # of an earlier test on this database may still be on its way out: only ours count.)
    assert listens & ({s.pid} | workers) == {s.pid}, (listens, s.pid, workers)
    assert s.status()["wakeups"] == "relayed"
