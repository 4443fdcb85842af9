"""A failover under a stream of jobs and a producer, as issue 42 measured it.

    python bench/failover.py [--jobs 3000] [--rate 200] [--sleep 0.02] [--at 5] [--mode immediate|fast]
                             [--runs 1] [--processes 2] [--threads 8] [--commit-cost]

Builds a primary and a synchronous streaming standby on loopback (tests/replication.py:
initdb, pg_basebackup; as `postgres` when root), starts `supervisor run` and a producer
on their multi-host URL (``target_session_attrs=read-write``), sends --jobs `record`
jobs of --sleep seconds at --rate per second, and --at seconds in stops the primary
(--mode immediate: a crash; fast: a switchover) and promotes the standby. Prints per
run: jobs run, run twice by the runtime (a lease lost) and again by their actor's own retry
(its INSERT committed as the connection died: the actor saw an error), sends failed, the slowest send and its p99, how long
after the promote the first job was written on the new primary, and how many children
the master restarted. ``--commit-cost``: what the synchronous standby costs a send
instead (no failover). Asserts nothing.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, percentile, say, wait_until  # noqa: E402
from supervisor import control  # noqa: E402
from supervisor.testing import ThrowawayDatabase  # noqa: E402
from tests.conftest import TEST_TABLES  # noqa: E402
from tests.replication import Pair  # noqa: E402
from tests.supervisor_helpers import log_producer  # noqa: E402


def one_run(args: argparse.Namespace) -> dict[str, float | int | str]:
    pair = Pair()
    try:
        url = ThrowawayDatabase(pair.url(), "as_bench_failover").create(owners=())
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(TEST_TABLES)
        with tempfile.TemporaryDirectory() as tmp:
            socket = Path(tmp) / "ctl.sock"
            config = Path(tmp) / "s.yaml"
            config.write_text(yaml.safe_dump({
                "database": {"url": url},
                "supervisor": {"control_socket": str(socket), "log_level": "WARNING"},
                "roles": {"work": {"processes": args.processes, "threads": args.threads, "queues": ["tests"],
                                   "actors": ["tests.sample_actors"]}},
            }))
            with (Path(tmp) / "master.log").open("w") as log:
                master = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "run", "-c", str(config)],
                                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                                          stderr=subprocess.STDOUT)
                try:
                    return _measure(args, pair, url, socket)
                except TimeoutError:
                    say((Path(tmp) / "master.log").read_text()[-3000:])
                    raise
                finally:
                    master.terminate()
                    master.wait(60)
    finally:
        pair.close()


def _measure(args: argparse.Namespace, pair: Pair, url: str, socket: Path) -> dict[str, float | int | str]:
    with psycopg.connect(url, autocommit=True) as conn:
        wait_until(lambda: conn.execute("SELECT count(*) FROM workers WHERE state = 'running' AND stopped_at IS NULL")
                   .fetchone()[0] >= args.processes, 120, interval=0.05, what="workers ready")
    waits: list[float] = []
    failed: list[str] = []
    promoted: list[float] = []  # wall-clock time of the promote's return
    failover = threading.Timer(args.at, lambda: (pair.fail_over(args.mode), promoted.append(time.time())))
    with log_producer(url, "tests", {"record": {}}) as producer:
        actor = producer.actors["record"]
        interval = 1.0 / args.rate
        next_at = time.monotonic()
        failover.start()
        for n in range(args.jobs):
            started = time.monotonic()
            try:
                actor.send(n=n, sleep_s=args.sleep)
            except Exception as exc:  # noqa: BLE001  (counted: what this measures)
                failed.append(" ".join(repr(exc).split())[:200])
            waits.append(time.monotonic() - started)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    failover.join()
    sent = args.jobs - len(failed)
    with psycopg.connect(url, autocommit=True) as conn:
        done = lambda: conn.execute("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetchone()[0]  # noqa: E731
        wait_until(lambda: done() >= sent, 120, interval=0.2, what=f"{sent} jobs succeeded")
        ran, _, first_after = conn.execute(
            "SELECT count(*), count(DISTINCT job_id), extract(epoch FROM min(at) FILTER (WHERE at > to_timestamp(%s)))"
            "  FROM test_results", (promoted[0],)).fetchone()
        # A job that ran twice: by the runtime (a lease lost, or more runs than attempts
        # claimed), or by its actor's own retry (its INSERT committed as the connection died,
        # the actor saw an error: at-least-once for an actor's own writes, as everywhere).
        twice = conn.execute(
            "SELECT j.lease_losses > 0 OR r.runs > j.attempts, j.attempts, j.lease_losses,"
            "       (regexp_match(j.last_error, '([^\\n]+)\\n*$'))[1]"
            "  FROM (SELECT job_id, count(*) AS runs FROM test_results GROUP BY 1 HAVING count(*) > 1) r"
            "  JOIN jobs j ON j.id = r.job_id").fetchall()
    for by_runtime, attempts, losses, error in twice:
        say(f"  ran twice ({'runtime' if by_runtime else 'actor retried'}): attempts {attempts}, lease losses"
            f" {losses}, last error {(error or '')[:120]!r}")
    status = control.request(socket, {"cmd": "status"}, timeout=10)
    restarts = sum(r["restarts"] for r in status["roles"])
    for line in failed[:3]:
        say(f"  failed send: {line}")
    runtime_twice = sum(1 for t in twice if t[0])
    return {"ran": ran, "twice": runtime_twice, "retried": len(twice) - runtime_twice, "failed": len(failed), "slowest": max(waits),
            "p99": percentile(waits, 99), "first_after": float(first_after) - promoted[0], "restarts": restarts}


def commit_cost(sends: int, rounds: int) -> None:
    """What synchronous replication costs a send: ``sends`` single sends with the
    database's synchronous_commit at ``on`` (wait for the standby) and ``local`` (do not),
    alternated ``rounds`` times on one pair; the median send of each."""
    pair = Pair()
    try:
        url = ThrowawayDatabase(pair.url(), "as_bench_failover").create(owners=())
        name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        for _ in range(rounds):
            for setting in ("on", "local"):
                with psycopg.connect(url, autocommit=True) as c:
                    c.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = {setting}'.encode())
                with log_producer(url, "tests", {"record": {}}) as producer:  # new sessions: the new setting
                    actor = producer.actors["record"]
                    waits = []
                    for n in range(sends):
                        started = time.monotonic()
                        actor.send(n=n)
                        waits.append(time.monotonic() - started)
                say(f"synchronous_commit = {setting:<5}: {sends} sends, median {percentile(waits, 50) * 1000:.2f} ms,"
                    f" p99 {percentile(waits, 99) * 1000:.2f} ms")
    finally:
        pair.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--at", type=float, default=5.0)
    ap.add_argument("--mode", choices=("immediate", "fast"), default="immediate")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--commit-cost", action="store_true",
                    help="instead: single sends with synchronous_commit on vs local, alternated (--jobs each, --runs)")
    args = ap.parse_args()
    if args.commit_cost:
        commit_cost(args.jobs, args.runs)
        return
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # each failed attempt's lines: the figures say it
    say(f"{args.jobs} jobs of {args.sleep * 1000:.0f} ms at {args.rate:.0f}/s, {args.processes} x {args.threads}"
        f" threads; primary stopped ({args.mode}) and standby promoted {args.at:.0f} s in")
    say(f"{'run':>3} {'ran':>6} {'twice':>5} {'actor retried':>13} {'failed':>6} {'slowest send':>12} {'p99 send':>8}"
        f" {'first job after promote':>23} {'restarts':>8}")
    for i in range(args.runs):
        r = one_run(args)
        say(f"{i + 1:>3} {r['ran']:>6} {r['twice']:>5} {r['retried']:>13} {r['failed']:>6} {r['slowest']:>11.2f}s {r['p99']:>7.3f}s"
            f" {r['first_after']:>22.2f}s {r['restarts']:>8}")


if __name__ == "__main__":
    main()
