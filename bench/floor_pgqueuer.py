"""db_floor.py's measurement on pgqueuer's own statements: what a job (enqueue + claim +
finish) costs PostgreSQL there, on the same server, by the same procedure (bench/floor.py).

Runs in a venv of its own (this project need not be installed in it):

    python3 -m venv /tmp/pgq && /tmp/pgq/bin/pip install pgqueuer 'psycopg[binary]'
    /tmp/pgq/bin/python bench/floor_pgqueuer.py [--jobs 20000] [--batch 32,100] [--connections 1,2]
                                                [--repeat 3] [--database-url URL]

It creates a fresh database on the server (--database-url, else DATABASE_URL, else the
local one), installs pgqueuer's schema there (``build_install_query``) and drops the
database at the end. Nothing of pgqueuer's SQL is copied here: each statement comes from
pgqueuer's query builder at run time, its ``$n`` placeholders renamed to psycopg's
``%(pn)s``. The statements, and the arguments they get, are those pgqueuer's ``Queries``
sends:

- enqueue: ``build_enqueue_query()`` (a batch of entrypoint 'noop', no payload, priority
  0, no delay, no dedupe key, no headers), which also writes a 'queued' log row;
- claim: ``build_dequeue_query`` for entrypoint 'noop' with no concurrency limit, as a
  worker's queue manager (its own id) asks for up to ``batch`` jobs; it also writes a
  'picked' log row;
- finish: ``build_log_job_query()`` with status 'successful': the jobs leave the queue
  table for a 'successful' log row.

pgqueuer's drivers talk asyncpg or psycopg; this drives psycopg synchronously, like
db_floor.py, so both stores' statements reach the server the same way (psycopg prepares a
statement from its 5th run).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psycopg
from pgqueuer.adapters.persistence.qb import QueryBuilderEnvironment, QueryQueueBuilder
from pgqueuer.adapters.persistence.query_helpers import normalize_enqueue_params
from psycopg.conninfo import conninfo_to_dict
from pydantic_core import to_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.basics import code_state, say, scratch_database
from bench.floor import Conn, JobPath, main

ENTRYPOINT = "noop"
HEARTBEAT_TIMEOUT = timedelta(seconds=30)  # as our claim's 30 s lease
ENV = QueryBuilderEnvironment()
QUEUE = QueryQueueBuilder()
TABLES = (ENV.qualified.queue_table, ENV.qualified.queue_table_log)


@functools.lru_cache(maxsize=16)
def named(statement: str) -> str:
    """pgqueuer's ``$n`` placeholders as psycopg's ``%(pn)s`` (a literal % doubled)."""
    return re.sub(r"\$(\d+)", r"%(p\1)s", statement.replace("%", "%%"))


def params(*args: Any) -> dict[str, Any]:
    """Positional arguments ($1, $2, ...) as ``named``'s parameters."""
    return {f"p{i}": arg for i, arg in enumerate(args, start=1)}


def build_rows(n: int) -> dict[str, Any]:
    """The enqueue's arguments for n no-op jobs, normalised and encoded as Queries.enqueue does."""
    p = normalize_enqueue_params([ENTRYPOINT] * n, [None] * n, [0] * n)
    return params(p.priority, p.entrypoint, p.payload, p.execute_after, p.dedupe_key,
                  [to_json(h).decode() for h in p.headers])


def enqueue_rows(conn: Conn, args: dict[str, Any]) -> None:
    conn.execute(named(QUEUE.build_enqueue_query()), args).fetchall()


def claim_rows(conn: Conn, batch: int, owner: str) -> list[Any]:
    """A queue manager's dequeue of up to ``batch`` jobs (``owner``: its id)."""
    query = QUEUE.build_dequeue_query(batch_size=batch, entrypoints=[ENTRYPOINT], concurrency_limits=[0],
                                      queue_manager_id=uuid.UUID(owner), global_concurrency_limit=None,
                                      heartbeat_timeout=HEARTBEAT_TIMEOUT)
    return conn.execute(named(query.sql), params(*query.args)).fetchall()


def finish_rows(conn: Conn, owner: str, rows: list[Any]) -> None:
    """Queries.log_jobs for jobs that succeeded (``rows``: the claimed rows, id first)."""
    ids = [r[0] for r in rows]
    conn.execute(named(QUEUE.build_log_job_query()), params(ids, ["successful"] * len(ids), [None] * len(ids)))


def reset(conn: Conn) -> None:
    conn.execute(f"TRUNCATE {', '.join(TABLES)}")


def settle(conn: Conn) -> None:
    conn.execute(f"ANALYZE {ENV.qualified.queue_table}")  # as db_floor.py; autovacuum would, later


def unfinished(conn: Conn) -> int:
    return conn.execute(f"SELECT count(*) FROM {ENV.qualified.queue_table}").fetchone()[0]


@contextlib.contextmanager
def pgqueuer_database(server: str) -> Iterator[str]:
    """A fresh database with pgqueuer's schema; dropped on the way out."""
    with scratch_database(server, prefix="pgq_floor") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(ENV.build_install_query())
        say(f"bench database {conninfo_to_dict(url)['dbname']} created, pgqueuer's schema installed")
        yield url


PATH = JobPath(
    name=f"pgqueuer {version('pgqueuer')} (enqueue, dequeue, log_job 'successful'; built by its QueryQueueBuilder)",
    reset=reset,
    build=build_rows,
    enqueue=enqueue_rows,
    settle=settle,
    claim=claim_rows,
    finish=finish_rows,
    unfinished=unfinished,
)

if __name__ == "__main__":
    sys.exit(main(PATH, pgqueuer_database, doc=__doc__, preamble=(f"repository {code_state()}",)))
