"""Storage shapes measured before any is built (issue 18 item 1): db_floor.py's procedure
(bench/floor.py) on today's statements and on prototypes of other shapes, in one run,
round by round, so the machine's drift hits each alike.

    python bench/floor_shapes.py [--jobs 20000] [--batch 128] [--connections 2] [--rounds 3]
                                 [--shapes today,narrow,bound]

- today: the product's own statements (db_floor.py's PATH): one wide row in ``job_queue``,
  the claim UPDATEs it (status, lease), FINISH deletes it and appends it to
  ``job_history``.
- narrow: Solid Queue's shape. The wide row is written once at enqueue and never updated;
  a narrow ``ready`` row (id, queue, priority, run_at) is what the claim takes, and it moves
  to a narrow ``claimed`` row (id, owner, attempt, lease); FINISH deletes the claimed row
  and the wide row and appends the wide row to history, as today.
- bound: no lease at all (at-most-once): the claim DELETEs the wide rows and returns them,
  FINISH only appends a narrow history row (id, queue, actor, status, times). No shape that
  keeps a job through a crash and a history row per job can cost the server less per job;
  its rows/s is the ceiling of this procedure on this machine.

The prototypes' tables live in the bench database beside the product's schema, with the
indexes each shape needs (history: the three of ``job_history``). Nothing here is product
code: a shape that wins is then built in ``supervisor/broker/sql``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.basics import Figure, print_table  # noqa: E402
from bench.common import bench_database, code_state, say, server_url  # noqa: E402
from bench.db_floor import PATH as TODAY  # noqa: E402
from bench.floor import Conn, JobPath, Run, run_once  # noqa: E402

SCHEMA = """
DROP TABLE IF EXISTS fs_jobs, fs_live, fs_ready, fs_claimed, fs_history;
CREATE TABLE fs_jobs (LIKE job_queue INCLUDING DEFAULTS, PRIMARY KEY (id));
CREATE TABLE fs_live (LIKE job_queue INCLUDING DEFAULTS, PRIMARY KEY (id));
CREATE INDEX fs_live_claim ON fs_live (queue, priority DESC, run_at, id);
CREATE TABLE fs_ready (id uuid PRIMARY KEY, queue text NOT NULL, priority int NOT NULL,
                       run_at timestamptz NOT NULL);
CREATE INDEX fs_ready_claim ON fs_ready (queue, priority DESC, run_at, id);
CREATE TABLE fs_claimed (id uuid PRIMARY KEY, owner text NOT NULL, attempt int NOT NULL,
                         lease_expires_at timestamptz NOT NULL);
CREATE TABLE fs_history (LIKE job_queue INCLUDING DEFAULTS);
CREATE INDEX fs_history_id ON fs_history (id);
CREATE INDEX fs_history_created ON fs_history (created_at, id);
CREATE INDEX fs_history_finished ON fs_history (finished_at);
"""

# Both prototypes enqueue the same columns as today's INSERT_MANY (bench/db_floor.py's rows).
ENQUEUE_COLUMNS = """
  FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::jsonb[], %s::jsonb[], %s::jsonb[], %s::bytea[],
              %s::int[], %s::int[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::jsonb[])
       AS m(id, queue, actor, args, kwargs, options, payload, priority, max_attempts, dedupe_key,
            concurrency_key, message_timestamp, flow_key, flow)
"""
WIDE_COLUMNS = """(id, queue, actor, args, kwargs, options, payload, priority, max_attempts, dedupe_key,
                     concurrency_key, message_timestamp, flow_key, flow, run_at)
"""
INSERT_WIDE = f"INSERT INTO fs_jobs {WIDE_COLUMNS} SELECT m.*, now() + %s * interval '1 millisecond' {ENQUEUE_COLUMNS}"
INSERT_LIVE = f"INSERT INTO fs_live {WIDE_COLUMNS} SELECT m.*, now() + %s * interval '1 millisecond' {ENQUEUE_COLUMNS}"


NARROW_ENQUEUE = f"""
WITH j AS ({INSERT_WIDE} RETURNING id, queue, priority, run_at)
INSERT INTO fs_ready SELECT id, queue, priority, run_at FROM j
"""
NARROW_CLAIM = """
WITH r AS (
    DELETE FROM fs_ready WHERE id IN (
        SELECT id FROM fs_ready WHERE queue = %(queue)s AND run_at <= now()
         ORDER BY priority DESC, run_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
    RETURNING id
), c AS (
    INSERT INTO fs_claimed SELECT id, %(owner)s, 1, now() + interval '30 seconds' FROM r RETURNING id, attempt
)
SELECT j.id, j.actor, j.args, j.kwargs, c.attempt, j.options, j.message_timestamp
  FROM c JOIN fs_jobs j USING (id)
"""
NARROW_FINISH = """
WITH c AS (
    DELETE FROM fs_claimed WHERE id = ANY(%(ids)s::uuid[]) AND owner = %(owner)s RETURNING id
), j AS (
    DELETE FROM fs_jobs WHERE id IN (SELECT id FROM c) RETURNING *
)
INSERT INTO fs_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts,
                        max_attempts, lease_owner, created_at, started_at, finished_at, message_timestamp, payload)
SELECT id, queue, actor, args, kwargs, options, 'succeeded', priority, run_at, 1, max_attempts, %(owner)s,
       created_at, now(), now(), message_timestamp, payload FROM j
"""

BOUND_CLAIM = """
DELETE FROM fs_live WHERE id IN (
    SELECT id FROM fs_live WHERE queue = %(queue)s AND run_at <= now()
     ORDER BY priority DESC, run_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
RETURNING id, queue, actor, created_at
"""
BOUND_FINISH = """
INSERT INTO fs_history (id, queue, actor, status, created_at, started_at, finished_at)
SELECT id, queue, actor, 'succeeded', created_at, now(), now()
  FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::timestamptz[]) AS f(id, queue, actor, created_at)
"""


def reset(conn: Conn) -> None:
    TODAY.reset(conn)
    conn.execute("TRUNCATE fs_jobs, fs_live, fs_ready, fs_claimed, fs_history")


def settle(conn: Conn) -> None:
    conn.execute("ANALYZE fs_jobs")
    conn.execute("ANALYZE fs_ready")
    conn.execute("ANALYZE fs_live")


def narrow_claim(conn: Conn, batch: int, owner: str) -> list[Any]:
    return conn.execute(NARROW_CLAIM, {"queue": "floor", "n": batch, "owner": owner}).fetchall()


def narrow_finish(conn: Conn, owner: str, rows: list[Any]) -> None:
    conn.execute(NARROW_FINISH, {"ids": [r[0] for r in rows], "owner": owner})


def narrow_left(conn: Conn) -> int:
    return int(conn.execute("SELECT (SELECT count(*) FROM fs_jobs) + (SELECT count(*) FROM fs_ready)"
                            " + (SELECT count(*) FROM fs_claimed)").fetchone()[0])


def bound_claim(conn: Conn, batch: int, owner: str) -> list[Any]:
    return conn.execute(BOUND_CLAIM, {"queue": "floor", "n": batch}).fetchall()


def bound_finish(conn: Conn, owner: str, rows: list[Any]) -> None:
    conn.execute(BOUND_FINISH, [list(column) for column in zip(*rows, strict=True)])


def bound_left(conn: Conn) -> int:
    return int(conn.execute("SELECT count(*) FROM fs_live").fetchone()[0])


def enqueue_with(statement: str) -> Any:
    def enqueue(conn: Conn, params: list[Any]) -> None:
        conn.execute(statement, params[:15])  # the delay and the 14 columns; no limit keys
    return enqueue


SHAPES = {
    "today": TODAY,
    "narrow": JobPath("narrow ready/claimed rows beside a static wide row (Solid Queue)", reset, TODAY.build,
                      enqueue_with(NARROW_ENQUEUE), settle, narrow_claim, narrow_finish, narrow_left),
    "bound": JobPath("claim deletes the row, finish appends a narrow history row (no lease)", reset,
                     TODAY.build, enqueue_with(INSERT_LIVE), settle, bound_claim, bound_finish, bound_left),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--connections", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--database-url", default=None)
    args = p.parse_args(argv)
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown shape(s) {', '.join(unknown)}; known: {', '.join(SHAPES)}")
    runs: dict[str, list[Run]] = {s: [] for s in shapes}
    say(code_state())
    with bench_database(server_url(args.database_url)) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA)
        for n in range(args.rounds):
            for shape in shapes:
                run = run_once(url, SHAPES[shape], args.jobs, args.batch, args.connections)
                runs[shape].append(run)
                say(f"round {n + 1} {shape:>6}: enqueue {run.enqueue_cpu:.0f} us/row; drain "
                    f"{run.drain_rate:,.0f} rows/s, {run.drain_cpu:.0f} us/row; {run.total_cpu:.0f} us/job")
    config = f"batch {args.batch} x {args.connections} conn"
    table = []
    for shape in shapes:
        rs = runs[shape]
        table += [Figure(f"{shape}: claim + finish", "rows/s", tuple(r.drain_rate for r in rs), config=config),
                  Figure(f"{shape}: backend CPU per job", "us", tuple(r.total_cpu for r in rs),
                         higher_is_better=False, config=config)]
    say("")
    print_table(table)
    base = statistics.median(r.drain_rate for r in runs[shapes[0]])
    for shape in shapes[1:]:
        say(f"{shape}: drain {statistics.median(r.drain_rate for r in runs[shape]) / base:.2f}x {shapes[0]}'s (medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
