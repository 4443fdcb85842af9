"""The dashboard's pages and the API's reads at scale: --rows finished jobs (default
10,000,000) over --days days of history (7), --live live ones (100,000).

    python bench/dashboard_scale.py [--rows N] [--live N] [--days N] [--runs 30]
                                    [--keep] [--reuse DBNAME] [--database-url URL]

Fills a fresh database (``dashboard_fill.py`` says with what), then times each page and
API read of ``dashboard_reads.READS`` through the real app, served in process
(rendering included): p50 and p95 of --runs rounds (each round requests every one in
turn, after one round to warm up), with the machine's load average. Then each
statement those requests ran, on its own connection (the HTTP child's session settings)
with the same parameters, in rounds likewise: p50 and p95, the slowest first. ``--keep`` leaves the filled database (its name is printed);
``--reuse NAME`` times a database a run kept, with no fill. Prints only; asserts nothing.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from starlette.testclient import TestClient

from bench import dashboard_fill, dashboard_reads
from bench.basics import with_dbname
from bench.common import code_state, say, server_url
from supervisor import apps, error_groups, jobsearch, registry
from supervisor.broker import reads
from supervisor.broker.reads import actor_reads
from supervisor.http import state
from supervisor.http.dashboard import recorder
from supervisor.migrate import migrate
from supervisor.worker import scheduler_sql


def percentiles(times: list[float]) -> tuple[float, float]:
    """(p50, p95) in ms, p95 by the nearest rank."""
    ordered = sorted(times)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * len(ordered)) - 1)]


def statement_names() -> dict[str, str]:
    """A constant statement's text -> its module and name (others are named by their text)."""
    out = {}
    for module in (reads, actor_reads, recorder, registry, scheduler_sql):
        for name, value in inspect.getmembers(module, lambda v: isinstance(v, str)):
            if name.isupper():
                out[value] = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    return out


def label(text: str, names: dict[str, str]) -> str:
    """A constant's name, else the statement's start and its conditions, on one line."""
    if text in names:
        return names[text]
    flat = " ".join(text.split())
    cut = flat.find(" WHERE ")
    return flat[:30] + (" ..." + flat[cut:cut + 60] if cut > 0 else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--live", type=int, default=100_000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--log-share", type=float, default=0.0,
                    help="share of the finished jobs kept in the job log's tables (the default storage's)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--keep", action="store_true", help="leave the filled database")
    ap.add_argument("--reuse", metavar="DBNAME", help="time a database a run kept (no fill)")
    ap.add_argument("--database-url")
    args = ap.parse_args()
    say(code_state())
    server = server_url(args.database_url)
    if args.reuse:
        url = with_dbname(server, args.reuse)
    else:
        name = f"as_dash_{args.rows}_{int(time.time())}"
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        url = with_dbname(server, name)
    try:
        if not args.reuse:
            migrate(url, apps.installed())
            with psycopg.connect(url, autocommit=True) as conn:
                dashboard_fill.fill(conn, rows=args.rows, live=args.live, days=args.days, log_share=args.log_share)
        run(url, args)
    finally:
        if not args.reuse and not args.keep:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        elif not args.reuse:
            say(f"kept: --reuse {conninfo_to_dict(url)['dbname']}")


def rounds(runs: int, calls: list[Callable[[], Any]]) -> list[tuple[float, float]]:
    """(p50, p95) ms of each call over ``runs`` rounds, each round calling each once in
    turn: a burst of load from elsewhere on the machine falls on every call alike."""
    times: list[list[float]] = [[] for _ in calls]
    for _ in range(runs):
        for i, fn in enumerate(calls):
            t0 = time.perf_counter()
            fn()
            times[i].append((time.perf_counter() - t0) * 1000)
    return [percentiles(t) for t in times]


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(url: str, args: argparse.Namespace) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        live, finished = conn.execute(
            "SELECT (SELECT reltuples::bigint FROM pg_class WHERE relname = 'job_queue'),"
            " (SELECT sum(reltuples)::bigint FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid"
            "   WHERE c.relkind = 'r' AND c.relname LIKE 'job_history_%')").fetchone() or (0, 0)
        say(f"about {finished:,} finished and {live:,} live jobs")
        filled = dashboard_reads.values(conn, args.rows)
    recorded = dashboard_reads.Recorded()
    client = TestClient(dashboard_reads.app(url, recorded))
    paths = [(name, template.format(**filled)) for name, template in dashboard_reads.READS]
    by_route: list[tuple[str, list[tuple[str, Any]]]] = []
    statuses = []
    for name, path in paths:  # once each to warm up; what each runs is recorded
        statuses.append(client.get(path).status_code)
        by_route.append((name, recorded.taken()))
    say(f"timing {len(paths)} pages and routes, {args.runs} rounds ({load()})")
    timings = rounds(args.runs, [lambda p=path: client.get(p) for _, path in paths])  # type: ignore[misc]
    recorded.taken()
    client.app.state.supervisor.close()  # type: ignore[attr-defined]
    print(f"\n{'page or route':<30} {'p50 ms':>8} {'p95 ms':>8}  status")
    for (name, _), (p50, p95), status in zip(paths, timings, statuses, strict=True):
        print(f"{name:<30} {p50:>8.1f} {p95:>8.1f}  {status}")
    say(f"({load()})")

    names = statement_names()
    seen: dict[tuple[str, str], tuple[str, str, Any]] = {}
    for route, statements in by_route:
        for text, params in statements:
            if "job" in text and not text.lstrip().upper().startswith("EXPLAIN"):
                seen.setdefault((text, repr(params)), (route, text, params))
    with psycopg.connect(url, autocommit=True, options=state.SESSION_OPTIONS) as conn:
        timed_statements = rounds(args.runs, [lambda t=text, p=params: conn.execute(t, p).fetchall()  # type: ignore[misc]
                                              for _, text, params in seen.values()])
    results = [(p95, p50, label(text, names), route)
               for (route, text, _), (p50, p95) in zip(seen.values(), timed_statements, strict=True)]
    print(f"\n{'statement':<96} {'first route that runs it':<26} {'p50 ms':>7} {'p95 ms':>7}")
    for p95, p50, name, route in sorted(results, reverse=True):
        print(f"{name[:96]:<96} {route[:26]:<26} {p50:>7.1f} {p95:>7.1f}")
    say(f"({load()})")
    print(f"\ncaps: error_groups.SCAN_CAP={error_groups.SCAN_CAP:,}, jobsearch.SCAN_ROWS={jobsearch.SCAN_ROWS:,}")


if __name__ == "__main__":
    main()
