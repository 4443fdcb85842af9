"""Memory of the processes of bench/: RSS and USS (memory no other process shares)
of the bench worker and of a `supervisor run` with two roles, when ready and after
draining jobs.

    python bench/rss.py                  # the figures
    python bench/rss.py --modules        # also: the modules a bench worker has imported

1. The bench worker, as bench/common.py WorkerPool starts it:
   `python -m supervisor.cli worker --queues bench --actors bench.bench_actors --threads 8`;
   measured once ready, then after draining --jobs no-op jobs.
2. `supervisor run` with two roles ("bench": bench actors, 8 threads; "side": queue
   side, 2 threads), one process each: the master and each forked worker, when every
   role is ready and after the bench role drained --jobs jobs.

Target (issue 9 item 7): the largest worker at or under 36 MB RSS (Dramatiq's own
Redis worker measured 36 MB). USS shows what a forked role worker does not share
with its master (copy-on-write pages it touched, its own imports and heap).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    Figure,
    WorkerPool,
    bench_database,
    code_state,
    print_table,
    reset,
    say,
    server_url,
    wait_until,
)
from supervisor import control

TARGET_MB = 36.0
MB = 2**20

# An actor module written next to the run (not part of bench/): on the bench queue,
# it writes the names in sys.modules of the process that runs it to a file.
MODULES_ACTOR = '''
import sys
import dramatiq

@dramatiq.actor(queue_name="bench", max_retries=0)
def dump_modules(path: str) -> None:
    with open(path, "w") as f:
        f.write("\\n".join(sorted(sys.modules)))
'''


def memory(pid: int) -> tuple[float, float]:
    """(RSS, USS) in MB."""
    info = psutil.Process(pid).memory_full_info()
    return info.rss / MB, info.uss / MB


def drain(url: str, jobs: int, queue: str = "bench") -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO jobs (queue, actor, max_attempts) SELECT %s, 'noop', 1 "
                     "FROM generate_series(1, %s)", (queue, jobs))
        wait_until(lambda: conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0] >= jobs,
                   120, interval=0.05, what=f"{jobs} no-op jobs")
        conn.execute("TRUNCATE job_queue, job_history, job_events")


def bench_worker(url: str, jobs: int, show_modules: bool) -> list[Figure]:
    figures: list[Figure] = []
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
    with tempfile.TemporaryDirectory(prefix="as-bench-rss-") as extra:
        actors = "bench.bench_actors"
        env: dict[str, str] = {}
        if show_modules:
            Path(extra, "rss_modules_actor.py").write_text(MODULES_ACTOR)
            actors += ",rss_modules_actor"
            env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{extra}"
        with WorkerPool(url, count=1, threads=8, actors=actors, env=env) as pool:
            pid = pool.procs[0].pid
            ready = memory(pid)
            drain(url, jobs)
            after = memory(pid)
            say(f"bench worker (8 threads): ready rss {ready[0]:.1f} MB uss {ready[1]:.1f} MB; "
                f"after {jobs:,} jobs rss {after[0]:.1f} MB uss {after[1]:.1f} MB")
            if show_modules:
                out = Path(extra, "modules.txt")
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("INSERT INTO jobs (queue, actor, max_attempts, args) VALUES "
                                 "('bench', 'dump_modules', 1, jsonb_build_array(%s::text))", (str(out),))
                    wait_until(lambda: out.exists() and out.stat().st_size > 0, 30, what="the modules list")
                names = out.read_text().split()
                tops = sorted({n.split(".")[0] for n in names})
                say(f"bench worker: {len(names)} modules; top-level packages: {' '.join(tops)}")
                own = [n for n in names if n.split(".")[0] in ("supervisor", "actors")]
                say(f"bench worker: runtime and app modules: {' '.join(own)}")
    figures.append(Figure("bench worker RSS, ready", "MB", (ready[0],), higher_is_better=False))
    figures.append(Figure("bench worker RSS, after jobs", "MB", (after[0],), higher_is_better=False,
                          target=TARGET_MB, config="8 threads"))
    figures.append(Figure("bench worker USS, after jobs", "MB", (after[1],), higher_is_better=False))
    return figures


def write_config(path: Path, url: str, socket: Path) -> None:
    common = {"processes": 1, "actors": ["bench.bench_actors"], "lease": "30s", "heartbeat": "5s",
              "shutdown_timeout": "5s"}
    data = {
        "database": {"url": url},
        "supervisor": {"control_socket": str(socket), "shutdown_timeout": "10s", "log_level": "WARNING"},
        "roles": {"bench": {**common, "threads": 8, "queues": ["bench"]},
                  "side": {**common, "threads": 2, "queues": ["side"]}},
    }
    path.write_text(yaml.safe_dump(data))


def bench_supervisor(url: str, jobs: int) -> list[Figure]:
    with psycopg.connect(url, autocommit=True) as conn:
        reset(conn)
    with tempfile.TemporaryDirectory(prefix="as-bench-rss-") as tmp:
        config, socket = Path(tmp, "supervisor.yaml"), Path(tmp, "ctl.sock")
        write_config(config, url, socket)
        with Path(tmp, "master.log").open("w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config)], cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log, stderr=subprocess.STDOUT)
            try:
                def roles() -> dict[str, list[int]]:
                    try:
                        reply = control.request(socket, {"cmd": "status"}, timeout=10)
                    except control.ControlError:
                        return {}
                    return {r["name"]: [p["pid"] for p in r["processes"] if p["ready"]] for r in reply["roles"]}

                wait_until(lambda: all(len(roles().get(r, [])) == 1 for r in ("bench", "side")), 60,
                           interval=0.05, what="both roles ready")
                pids = {name: found[0] for name, found in roles().items()}
                ready = {"master": memory(proc.pid), **{name: memory(pid) for name, pid in pids.items()}}
                drain(url, jobs)
                after = {"master": memory(proc.pid), **{name: memory(pid) for name, pid in pids.items()}}
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    figures: list[Figure] = []
    for name in ready:
        label = name if name == "master" else f"role {name} worker"
        say(f"supervisor {label}: ready rss {ready[name][0]:.1f} MB uss {ready[name][1]:.1f} MB; "
            f"after jobs rss {after[name][0]:.1f} MB uss {after[name][1]:.1f} MB")
        target = None if name == "master" else TARGET_MB
        figures.append(Figure(f"supervisor {label} RSS, after jobs", "MB", (after[name][0],),
                              higher_is_better=False, target=target))
        figures.append(Figure(f"supervisor {label} USS, after jobs", "MB", (after[name][1],),
                              higher_is_better=False))
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=5_000, help="no-op jobs drained before the second reading")
    p.add_argument("--modules", action="store_true", help="print the modules the bench worker imported")
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    with bench_database(server_url(args.database_url)) as url:
        say(code_state())
        figures = bench_worker(url, args.jobs, args.modules) + bench_supervisor(url, args.jobs)
    say("")
    print_table(figures)
    say(f"({time.monotonic() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
