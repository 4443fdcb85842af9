"""Connections a host holds: peak per process and per host while a supervisor drains jobs.

    python bench/connections.py [--database-url URL] [--jobs 20000] [--processes 2] [--threads 8]

Starts a real `supervisor run` (one role of --processes x --threads on the bench
queue) on a throw-away database, bulk-enqueues --jobs no-op jobs, and samples
pg_stat_activity every few milliseconds until they are drained. Each server
session is attributed to its client process by its TCP port (psutil), so the
figures mean the same for any version of the code. Prints the peak number of
connections of each process (master, workers), the peak for the host, and how
many of them were LISTENing. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import psutil
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_database, say, server_url, wait_until

SESSIONS = """
SELECT client_port, query LIKE 'LISTEN %%' FROM pg_stat_activity
 WHERE datname = current_database() AND client_port IS NOT NULL AND pid <> pg_backend_pid()
"""


def ports_of(pids: list[int]) -> dict[int, int]:
    """Local TCP port -> pid, for the given processes. A forked child shares the
    sockets its master had open; those count for the first pid listed (the master)."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            for c in psutil.Process(pid).net_connections(kind="tcp"):
                if c.laddr:
                    out.setdefault(c.laddr.port, pid)
        except psutil.Error:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--database-url")
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    with bench_database(server_url(args.database_url)) as url, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "s.yaml"
        config.write_text(yaml.safe_dump({
            "database": {"url": url},
            "supervisor": {"control_socket": str(Path(tmp) / "ctl.sock"), "log_level": "WARNING", "job_log": False},
            "roles": {"bench": {"processes": args.processes, "threads": args.threads, "queues": ["bench"],
                                "actors": ["bench.bench_actors"]}},
        }))
        log = (Path(tmp) / "master.log").open("w")
        master = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config)], cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                wait_until(lambda: conn.execute("SELECT count(*) FROM workers WHERE role = 'bench' AND state = 'running'"
                                                " AND stopped_at IS NULL").fetchone()[0] == args.processes, 60,
                           interval=0.05, what="workers ready")
                children = [c.pid for c in psutil.Process(master.pid).children()]
                roles = {master.pid: "master", **{pid: f"worker {i + 1}" for i, pid in enumerate(children)}}
                from supervisor.broker import setup_broker  # noqa: PLC0415

                broker = setup_broker(url)
                from bench.bench_actors import noop  # noqa: PLC0415  (binds to the broker set up above)

                started = time.monotonic()
                broker.enqueue_many([noop.message() for _ in range(args.jobs)])
                peak: Counter[int] = Counter()
                host_peak = listen_peak = samples = 0
                while conn.execute("SELECT count(*) FROM jobs WHERE status <> 'succeeded'").fetchone()[0]:
                    ports = ports_of(list(roles))
                    per: Counter[int] = Counter()
                    listening = 0
                    for port, listen in conn.execute(SESSIONS).fetchall():
                        pid = ports.get(port)
                        if pid is not None:
                            per[pid] += 1
                            listening += bool(listen)
                    for pid, n in per.items():
                        peak[pid] = max(peak[pid], n)
                    host_peak = max(host_peak, sum(per.values()))
                    listen_peak = max(listen_peak, listening)
                    samples += 1
                took = time.monotonic() - started
                broker.close()
        finally:
            master.terminate()
            master.wait(60)
    say(f"drained {args.jobs:,} jobs in {took:.2f}s ({samples} samples of pg_stat_activity)")
    say(f"{'process':<10} {'pid':>7}  peak connections")
    for pid, name in roles.items():
        say(f"{name:<10} {pid:>7}  {peak[pid]}")
    say(f"host: peak {host_peak} connections, of which LISTEN {listen_peak}; "
        f"largest worker {max((peak[p] for p in children), default=0)}")


if __name__ == "__main__":
    main()
