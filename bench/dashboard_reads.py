"""Every read of the dashboard's pages and of the API's GET routes, as URLs, and the
statements they run, recorded.

``READS`` names each page and route with the queries that reach its distinct reads (each
window, each kind of jobs filter). ``dashboard_scale.py`` times them at 10 M jobs;
``tests/test_dashboard_reads_bounded.py`` EXPLAINs every statement they run and checks
that ``READS`` covers every GET route the app has.

The app is the real one (``create_app``), served in process; only its pool is ours: its
connections record each statement and its parameters (``Recorded``).
"""

from __future__ import annotations

if __name__ == "__main__":  # imported by the scripts as bench.<name>; nothing to run
    raise SystemExit(f"{__file__}: a module the scripts in bench/ import, not a script (bench/README.md lists them)")

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.routing import Mount, Route, compile_path

from supervisor.config import HttpConfig
from supervisor.http import data, state
from supervisor.http.app import create_app

# Path templates; {job} (a failed job with events), {workflow} (the fill's workflow), {prefix} (its first 6 hex digits),
# {cursor} (the Jobs page's 100th page), {match} (a value inside one job's args), {since}
# and {since_z} (10 minutes ago, as the page's form and the API take it) are filled by
# ``values``. Names are what the bench prints.
READS: tuple[tuple[str, str], ...] = (
    ("page /", "/"),
    ("page / 6h", "/?window=6h"),
    ("page / 24h", "/?window=24h"),
    ("page /queues", "/queues"),
    ("page /jobs", "/jobs"),
    ("page /jobs 100th page", "/jobs?cursor={cursor}"),
    ("page /jobs status=failed", "/jobs?status=failed"),
    ("page /jobs status=pending", "/jobs?status=pending"),
    ("page /jobs queue=rare", "/jobs?queue=rare"),
    ("page /jobs actor", "/jobs?actor=actor_7"),
    ("page /jobs failed, actor", "/jobs?status=failed&actor=actor_7"),
    ("page /jobs text", "/jobs?text=item-4242"),
    ("page /jobs created since", "/jobs?since={since}"),
    ("page /jobs id prefix", "/jobs?id={prefix}"),
    ("page /jobs dedupe key", "/jobs?dedupe_key=order-50"),
    ("page /jobs match", "/jobs?match={match}"),
    ("page /jobs/{id}", "/jobs/{job}"),
    ("page /workers", "/workers"),
    ("page /schedules", "/schedules"),
    ("page /limits", "/limits"),
    ("page /errors 1h", "/errors?window=1h"),
    ("page /errors 24h", "/errors"),
    ("page /errors 7d", "/errors?window=7d"),
    ("page /actors 15m", "/actors?window=15m"),
    ("page /actors 1h", "/actors"),
    ("page /actors 6h", "/actors?window=6h"),
    ("page /audit", "/audit"),
    ("page /apps/tracker", "/apps/tracker"),
    ("page /workflows", "/workflows"),
    ("page /workflows state=running", "/workflows?state=running"),
    ("page /workflows/{id}", "/workflows/{workflow}"),
    ("api queues", "/api/v1/queues"),
    ("api jobs", "/api/v1/jobs"),
    ("api jobs next page", "/api/v1/jobs?cursor={cursor}"),
    ("api jobs status=failed", "/api/v1/jobs?status=failed"),
    ("api jobs queue=rare", "/api/v1/jobs?queue=rare"),
    ("api jobs finished after", "/api/v1/jobs?finished_after={since_z}"),
    ("api jobs id prefix", "/api/v1/jobs?id={prefix}"),
    ("api jobs match", "/api/v1/jobs?match={match}"),
    ("api jobs/{id}", "/api/v1/jobs/{job}"),
    ("api workers", "/api/v1/workers"),
    ("api schedules", "/api/v1/schedules"),
    ("api system/state", "/api/v1/system/state"),
    ("api watches", "/api/v1/watches"),
    ("api errors 24h", "/api/v1/errors"),
    ("api errors 7d", "/api/v1/errors?since=7d"),
    ("api actors 1h", "/api/v1/actors"),
    ("api actors 6h", "/api/v1/actors?since=6h"),
    ("api audit", "/api/v1/audit"),
    ("api limits", "/api/v1/limits"),
    ("api workflows", "/api/v1/workflows"),
    ("api workflows/{id}", "/api/v1/workflows/{workflow}"),
    ("api whoami", "/api/v1/whoami"),
    ("api openapi", "/api/v1/openapi.json"),
    ("/metrics", "/metrics"),
    ("/healthz", "/healthz"),
    ("/readyz", "/readyz"),
)

# GET routes that are no read of the jobs: the event stream (it only watches a counter)
# and the static files.
NOT_READS = ("/events", "/static")


@dataclass
class Recorded:
    """Statements run on the app's pool, in order: (text, parameters)."""

    statements: list[tuple[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def taken(self) -> list[tuple[str, Any]]:
        """What was recorded since the last call."""
        with self.lock:
            out, self.statements = self.statements, []
        return out


def recording_pool(url: str, recorded: Recorded) -> ConnectionPool:
    """A pool for the app whose connections record what they run (the HTTP child's own
    settings otherwise: autocommit, its statement timeout)."""

    class Recording(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else query.as_string(self)
            with recorded.lock:
                recorded.statements.append((text, params))
            return super().execute(query, params, **kwargs)

    pool: ConnectionPool = ConnectionPool(url, min_size=1, max_size=4, open=True,
                                          kwargs={"autocommit": True, "cursor_factory": Recording,
                                                  "options": state.SESSION_OPTIONS})
    return pool


def app(url: str, recorded: Recorded) -> Starlette:
    """The dashboard and the API on ``url``, every installed app in use (as `supervisor
    http`), its statements recorded. Serve it with ``TestClient(app(...))``: no lifespan,
    so no recorder thread writes samples between the reads."""
    made = create_app(url=url, http=HttpConfig(), apps_from="database", listen_url="")
    made.state.supervisor.pool = recording_pool(url, recorded)
    return made


def values(conn: psycopg.Connection, rows: int) -> dict[str, str]:
    """What the READS templates need, from a database ``dashboard_fill`` filled with ``rows``."""
    job = conn.execute("SELECT id::text FROM job_history WHERE status = 'failed'"
                       " AND finished_at < now() - interval '1 day' LIMIT 1").fetchone()
    at, last = conn.execute("SELECT created_at, id::text FROM jobs ORDER BY created_at DESC, id DESC"
                            " OFFSET 99 * 50 - 1 LIMIT 1").fetchone() or (None, None)
    since = datetime.now(UTC) - timedelta(minutes=10)
    workflow = conn.execute("SELECT id::text FROM workflows ORDER BY created_at LIMIT 1").fetchone()
    return {"workflow": workflow[0] if workflow else "00000000-0000-0000-0000-000000000000",
            "job": job[0] if job else "00000000-0000-0000-0000-000000000000",
            "prefix": job[0][:6] if job else "000000",
            "cursor": data.encode_cursor(at, last) if at else "",
            "match": f"args[0] = {max(rows - 7, 1)}",
            "since": since.replace(tzinfo=None).isoformat(timespec="minutes"),
            "since_z": since.isoformat().replace("+00:00", "Z")}


def get_routes(made: Starlette) -> Iterator[tuple[str, Any]]:
    """(path template, compiled regex) of every GET route, Mounts flattened."""
    def walk(routes: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for r in routes:
            if isinstance(r, Mount) and r.routes:
                yield from walk(r.routes, prefix + r.path)
            elif isinstance(r, Route) and "GET" in (r.methods or ()):
                path = prefix + r.path
                yield path, compile_path(path)[0]
    yield from walk(made.routes, "")


def uncovered(made: Starlette, urls: list[str]) -> list[str]:
    """The GET routes (reads) no URL of ``urls`` reaches."""
    paths = [u.split("?")[0] for u in urls]
    return [p for p, regex in get_routes(made)
            if not p.startswith(NOT_READS) and not any(regex.match(u) for u in paths)]



def reads_of_jobs(taken: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The recorded statements that read the jobs tables (not an EXPLAIN a page runs itself)."""
    return [(t, p) for t, p in taken
            if any(table in t for table in ("jobs", "job_")) and not t.lstrip().startswith("EXPLAIN")]


# The tables a read of the jobs is counted against (their partitions with them), and the
# cap each read's windows, searches and exact counts get when it is run again at scale.
JOB_TABLES = ("job_history", "job_events", "job_queue", "job_log", "job_done")
CAP = 300


def capped(params: Any, cap: int) -> Any:
    """A statement's parameters with its caps (a window's ``cap``, a search's ``scan_rows``,
    an exact count's ``upto``) set to ``cap``."""
    if not isinstance(params, dict):
        return params
    return {**params, **{k: cap for k in ("cap", "scan_rows") if k in params},
            **({"upto": cap + 1} if "upto" in params else {})}


def rows_read_at_scale(conn: psycopg.Connection, text: str, params: Any, tables: tuple[str, ...]) -> dict[str, int]:
    """Rows each of ``tables`` (a name, and its partitions') gives ``text`` run under EXPLAIN
    ANALYZE, rolled back: those kept and those a filter removed, over every loop of every
    scan node.

    Sequential scans are priced out, as the planner reads tables of millions (a small table
    is read whole whatever its indexes): a scan that still reads past a budget has no bounded
    way. jit is off, as the app's sessions run (http/state.SESSION_OPTIONS): the priced-out
    scans put every plan over jit_above_cost, and compiling one over every day's partitions
    took 5-14 s a statement."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL jit = off")
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, params).fetchone()
    assert row is not None
    out = dict.fromkeys(tables, 0)

    def walk(node: dict[str, Any]) -> None:
        relation = node.get("Relation Name", "")
        table = next((t for t in tables if relation.startswith(t)), None)
        if table is not None:
            per_loop = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                        + node.get("Rows Removed by Index Recheck", 0))
            out[table] += per_loop * node.get("Actual Loops", 1)
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return out
