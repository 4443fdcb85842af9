"""The database's own ceiling for W1, and what a job costs it: PostgreSQL running the
product's enqueue, claim and ack statements with no producer or worker code at all, so no
worker design can drain faster, or cost the server less per job, on this machine.

    python bench/db_floor.py [--storage log|table] [--jobs 20000] [--batch 32,100]
                             [--connections 1,2] [--repeat 3]

For each batch size and connection count (bench/floor.py holds the procedure, shared with
floor_pgqueuer.py): N no-op rows are enqueued on one connection in batches of the claim
size, as ``enqueue_many`` sends a batch below COPY's threshold; then each connection loops a
claim of up to BATCH rows and the ack of those rows, each in its own autocommitted, durable
statement, as a worker process does, until no row is left. Prints enqueue and drain rows/s,
the backends' CPU per row of each (from /proc, as profile_worker.py) and their sum per job.

``--storage`` (default ``log``, the product's; ``table``, job_queue's statements, for comparison): ``log`` sends joblog.LOG_INSERT,
LOG_CLAIM and the worker's ack through completer.write_log_outcomes; ``table`` sends
sql.INSERT_MANY, sql.claim(BATCH) and sql.FINISH.

Compare with W1 (bench_broker.py): W1's jobs/s over the drain figure is the share of the
database's ceiling the workers reach; the rest is the workers' own CPU on shared cores.
And with floor_pgqueuer.py: the same procedure on pgqueuer's statements.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_database, code_state, reset
from bench.floor import Conn, JobPath, main
from supervisor.broker import sql
from supervisor.broker.consuming.completer import ack_params, log_columns, write_log_outcomes
from supervisor.broker.consuming.floors import SWEEP
from supervisor.broker.consuming.gates import first_turn
from supervisor.broker.logstore import Batches, LogRow
from supervisor.broker.middleware import claim_budgets
from supervisor.broker.sql import joblog

QUEUE = "floor"
NO_BUDGETS = claim_budgets({}, None)  # no actors known: the rows carry their own budget


def build_rows(n: int) -> list[Any]:
    """INSERT_MANY's parameters for n no-op messages, as bulk.py sends them: the delay,
    then one list per column in sql.BULK_COLUMNS order, rows sorted by id, and no limit
    keys (sql.FLOW_COLUMNS' arrays NULL)."""
    now_ms = int(time.time() * 1000)
    rows = sorted((str(uuid.uuid4()), QUEUE, "noop", "[]", "{}", "{}", None, 0, 1, None, None, now_ms)
                  for _ in range(n))
    return [0, *map(list, zip(*rows, strict=True)), None, None]


def enqueue_rows(conn: Conn, params: list[Any]) -> None:
    conn.execute(sql.INSERT_MANY, params).fetchall()


def claim_params(batch: int, owner: str, floors: dict[str, Any] = SWEEP) -> dict[str, Any]:
    """sql.claim's parameters for up to ``batch`` rows of the queue (``floors``: none, a sweep,
    unless a ClaimFloors' are given)."""
    return {"queue": QUEUE, "n": batch, "owner": owner, "lease_s": 30.0, "relaxed": False, **floors, **NO_BUDGETS,
            **first_turn(batch)}


def claim_rows(conn: Conn, batch: int, owner: str) -> list[Any]:
    """The worker's claim of up to ``batch`` rows of the queue."""
    return conn.execute(sql.claim(batch), claim_params(batch, owner)).fetchall()


def finish_rows(conn: Conn, owner: str, rows: list[Any]) -> None:
    """The worker's ack of claimed rows (their id and attempt fence), with the parameters
    its ack batcher sends (outcomes.ack_params: no Finish per job)."""
    now = time.monotonic()  # as a worker sends them: each attempt ran 1 ms and ended 0.5 ms ago
    n = len(rows)
    conn.execute(sql.FINISH, ack_params(owner, [str(r[0]) for r in rows], [r[4] for r in rows], [now - 0.0015] * n,
                                        [now - 0.0005] * n))


def settle(conn: Conn) -> None:
    conn.execute("ANALYZE job_queue")  # what the upkeep does once the statistics are stale


def unfinished(conn: Conn) -> int:
    return conn.execute("SELECT count(*) FROM job_queue").fetchone()[0]


TABLE_PATH = JobPath(
    name="actor-supervisor, storage table (sql.INSERT_MANY, sql.claim, sql.FINISH)",
    reset=reset,
    build=build_rows,
    enqueue=enqueue_rows,
    settle=settle,
    claim=claim_rows,
    finish=finish_rows,
    unfinished=unfinished,
)


def log_enqueue(conn: Conn, params: list[Any]) -> None:
    """build_rows' as joblog.LOG_INSERT's arrays (the product's log enqueue)."""
    ids, queues, actors, args, kwargs, options, payload, priority, max_attempts, _dk, _ck, stamps = params[1:13]
    conn.execute(joblog.LOG_INSERT, {"id": ids, "queue": queues, "actor": actors, "args": args, "kwargs": kwargs,
                                     "options": options, "payload": payload, "priority": priority,
                                     "max_attempts": max_attempts, "max_lease_losses": [None] * len(ids),
                                     "message_timestamp": stamps})


def log_claim(conn: Conn, batch: int, owner: str) -> list[Any]:
    """The worker's claim of up to ``batch`` rows of the queue's log (a busy one: durable)."""
    params = {"queue": QUEUE, "n": batch, "owner": owner, "lease_s": 30.0, "relaxed": False}
    return conn.execute(joblog.LOG_CLAIM, params).fetchall()


def log_finish(conn: Conn, owner: str, rows: list[Any]) -> None:
    """Each row's outcome (succeeded), as a worker's ack batcher writes it (outcomes.ack_params
    and log_columns: Outcomes._ack_log), the batch's lease with it."""
    now = time.monotonic()  # each attempt ran 1 ms and ended 0.5 ms ago, as finish_rows'
    n = len(rows)
    where = [LogRow(r[1], r[2], r[0], r[4], r[5], r[14]) for r in rows]
    ids = [str(r[3]) for r in rows]
    # the worker's write (its first try without the fence, then the fenced one), the batch
    # ended with it (the worker sends an ended batch with its next write)
    write_log_outcomes(conn, Batches(), ids, lambda _: {
        **ack_params(owner, ids, [r[7] for r in rows], [now - 0.0015] * n, [now - 0.0005] * n),
        **log_columns(where, [rows[0][0]])})


def log_left(conn: Conn) -> int:
    return int(conn.execute("SELECT (SELECT count(*) FROM job_log) - (SELECT count(*) FROM job_done)"
                            " + (SELECT count(*) FROM job_lease)").fetchone()[0])


LOG_PATH = JobPath("actor-supervisor, storage log (joblog.LOG_INSERT, LOG_CLAIM, LOG_ACK)", reset,
                   build_rows, log_enqueue, settle, log_claim, log_finish, log_left)
PATHS = {"log": LOG_PATH, "table": TABLE_PATH}


def run(argv: list[str] | None = None) -> int:
    """``--storage`` picks the statements (the product's default, unless told); floor.main
    parses the rest."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--storage", choices=list(PATHS), default="log")
    known, rest = p.parse_known_args(argv)
    return main(PATHS[known.storage], bench_database, doc=__doc__, argv=rest, preamble=(code_state(),))


if __name__ == "__main__":
    sys.exit(run())
