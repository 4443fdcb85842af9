"""Rows each dashboard and API read takes from each jobs table, on a fill with a share of
the finished jobs in the job log's tables (the default storage's), as
tests/test_dashboard_reads_bounded.py checks them (``dashboard_reads.JOB_TABLES``):

    python bench/dashboard_bounds.py [--rows 120000] [--live 500] [--days 7] [--log-share 0.5]
                                     [--budget 5000] [--database-url URL]

Fills a fresh database (``dashboard_fill.fill``), serves every read of
``dashboard_reads.READS`` once, then runs each statement they ran under EXPLAIN ANALYZE
with sequential scans priced out and jit off (as the test: what a plan reads at millions
of rows, not at this fill's size), its caps set to 300, and prints the rows each table
gave it; a read over ``--budget`` in any table is flagged.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
from starlette.testclient import TestClient

from bench import dashboard_fill, dashboard_reads
from bench.basics import say, server_url
from bench.common import bench_database


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=120_000)
    ap.add_argument("--live", type=int, default=500)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--log-share", type=float, default=0.5)
    ap.add_argument("--budget", type=int, default=5_000)
    ap.add_argument("--database-url")
    args = ap.parse_args(argv)
    with bench_database(server_url(args.database_url)) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            dashboard_fill.fill(conn, rows=args.rows, live=args.live, days=args.days, log_share=args.log_share)
            values = dashboard_reads.values(conn, args.rows)
        recorded = dashboard_reads.Recorded()
        app = dashboard_reads.app(url, recorded)
        statements: dict[tuple[str, str], tuple[str, str, object]] = {}
        try:
            client = TestClient(app)
            for _, template in dashboard_reads.READS:
                page = template.format(**values)
                client.get(page)
                for text, params in dashboard_reads.reads_of_jobs(recorded.taken()):
                    statements.setdefault((text, repr(params)), (page, text, params))
        finally:
            app.state.supervisor.close()
        over = 0
        with psycopg.connect(url, autocommit=True) as conn:
            for page, text, params in statements.values():
                capped = dashboard_reads.capped(params, dashboard_reads.CAP)
                read = dashboard_reads.rows_read_at_scale(conn, text, capped, dashboard_reads.JOB_TABLES)
                flag = "OVER" if max(read.values()) > args.budget else "ok"
                over += flag == "OVER"
                say(f"{flag:4} {page[:60]:60} " + " ".join(f"{t}={n}" for t, n in read.items() if n)
                    + f"  | {' '.join(text.split())[:80]}")
        say(f"{over} of {len(statements)} statements read more than {args.budget:,} rows of a table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
