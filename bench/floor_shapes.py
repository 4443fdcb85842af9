"""Storage shapes measured before any is built (issue 18 item 1): db_floor.py's procedure
(bench/floor.py) on today's statements and on prototypes of other shapes, in one run,
round by round, so the machine's drift hits each alike.

    python bench/floor_shapes.py [--jobs 20000] [--batch 128] [--connections 2] [--rounds 3]
                                 [--shapes today,narrow,slim,log,joblog,bound] [--pin]

- today: the product's own statements (db_floor.py's PATH): one wide row in ``job_queue``,
  the claim UPDATEs it (status, lease), FINISH deletes it and appends it to
  ``job_history``.
- narrow: Solid Queue's shape. The wide row is written once at enqueue and never updated;
  a narrow ``ready`` row (id, queue, priority, run_at) is what the claim takes, and it moves
  to a narrow ``claimed`` row (id, owner, attempt, lease); FINISH deletes the claimed row
  and the wide row and appends the wide row to history, as today.
- slim: the live row made narrow. The wide body is written once at enqueue into an
  append-only ``fs_body`` (history by day, never updated); ``fs_slim`` holds a narrow live
  row (id, queue, priority, run_at, status, attempts, lease) that the claim UPDATEs as
  today (per-job row locks, leases, keys, priorities and delays as they are), and FINISH
  deletes it and appends a narrow ``fs_slim_done`` row.
- log: PgQ's shape, append-only. Enqueue appends a wide row to ``fs_log`` stamped with its
  transaction id; the claim takes the next rows of the queue's current window of
  transactions (committed after the cursor's last snapshot and before its next, PgQ's
  batches: a transaction that commits late falls in a later window, never behind a
  cursor) and writes one lease row per batch (its rows' seqs); FINISH appends a narrow
  ``fs_done`` row per job and deletes the batch's lease row. The cursor is a log too (a
  row per claim, the newest read). No job row is ever updated or deleted: retention and
  rotation are TRUNCATE or partition drops. What it does not have yet (per-job leases
  inside a batch, retries, priorities, delays, keys) is not measured here.
- joblog: the log as built in the product (migration 039, ``supervisor/broker/sql/joblog.py``):
  the log's shape with priority levels, days, cancels passed over and a done row per job
  through LOG_FINISH, the one statement every outcome takes.
- bound: no lease at all (at-most-once): the claim DELETEs the wide rows and returns them,
  FINISH only appends a narrow history row (id, queue, actor, status, times). No shape
  whose claim takes each job's own row (an UPDATE or a DELETE of it) can cost the server
  less per job; the log, whose claim writes a row per batch, does (2026-11-29). Its rows/s
  is about the ceiling of this procedure on this machine (one client process).

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

from bench.basics import Figure, print_table
from bench.common import bench_database, code_state, say, server_url
from bench.db_floor import LOG_PATH
from bench.db_floor import TABLE_PATH as TODAY
from bench.floor import Conn, JobPath, Run, run_once

SCHEMA = """
DROP TABLE IF EXISTS fs_jobs, fs_live, fs_ready, fs_claimed, fs_history, fs_log, fs_cursor, fs_lease, fs_done,
                     fs_body, fs_slim, fs_slim_done;
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
CREATE TABLE fs_log (LIKE job_queue INCLUDING DEFAULTS,
                     seq bigint GENERATED ALWAYS AS IDENTITY, tx xid8 NOT NULL DEFAULT pg_current_xact_id());
CREATE INDEX fs_log_id ON fs_log (id);
CREATE INDEX fs_log_claim ON fs_log (queue, tx, seq);
CREATE UNIQUE INDEX fs_log_seq ON fs_log (seq);  -- the jobs view's finished part, driven by fs_done
-- The cursor is appended to, never updated: under a held horizon a row updated by every
-- claim keeps every version (24,000 of them doubled a claim's time here), while the newest
-- of an append-only log is one step of an index read backwards.
CREATE TABLE fs_cursor (queue text NOT NULL, at bigint GENERATED ALWAYS AS IDENTITY,
                        lo pg_snapshot NOT NULL, hi pg_snapshot NOT NULL,
                        at_tx xid8 NOT NULL DEFAULT '0', at_seq bigint NOT NULL DEFAULT 0);
CREATE INDEX fs_cursor_newest ON fs_cursor (queue, at DESC);
CREATE TABLE fs_lease (batch bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, owner text NOT NULL,
                       expires_at timestamptz NOT NULL, seqs bigint[] NOT NULL);
CREATE TABLE fs_done (seq bigint NOT NULL, id uuid NOT NULL, status text NOT NULL, attempt int NOT NULL,
                      owner text NOT NULL, started_at timestamptz, finished_at timestamptz NOT NULL);
CREATE INDEX fs_done_id ON fs_done (id);
CREATE INDEX fs_done_finished ON fs_done (finished_at);
CREATE TABLE fs_body (LIKE job_queue INCLUDING DEFAULTS);
CREATE INDEX fs_body_id ON fs_body (id);
CREATE TABLE fs_slim (id uuid PRIMARY KEY, queue text NOT NULL, priority int NOT NULL, run_at timestamptz NOT NULL,
                      status text NOT NULL DEFAULT 'pending', attempts int NOT NULL DEFAULT 0, lease_owner text,
                      lease_expires_at timestamptz);
CREATE INDEX fs_slim_claim ON fs_slim (queue, priority DESC, run_at, id) WHERE status = 'pending';
CREATE INDEX fs_slim_running ON fs_slim (lease_owner) WHERE status = 'running';
CREATE TABLE fs_slim_done (id uuid NOT NULL, status text NOT NULL, attempt int NOT NULL, owner text NOT NULL,
                           started_at timestamptz, finished_at timestamptz NOT NULL);
CREATE INDEX fs_slim_done_id ON fs_slim_done (id);
CREATE INDEX fs_slim_done_finished ON fs_slim_done (finished_at);
-- The claim: up to n rows of the cursor's window (transactions visible in hi, not in lo),
-- in (tx, seq) order after the cursor's place; an exhausted window moves on to the
-- transactions committed since (hi becomes lo, the current snapshot hi). Claims of one
-- queue take turns (an advisory lock for the statement), each a few rows of index.
CREATE FUNCTION fs_log_claim(q text, n int, who text)
RETURNS TABLE (batch bigint, seq bigint, id uuid, actor text, args jsonb, kwargs jsonb, options jsonb,
               message_timestamp bigint)
LANGUAGE plpgsql AS $$
DECLARE
    c fs_cursor;
    got bigint;
    running xid8[];
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('fs_cursor'), hashtext(q));  -- claims of a queue take turns
    SELECT * INTO c FROM fs_cursor WHERE fs_cursor.queue = q ORDER BY fs_cursor.at DESC LIMIT 1;
    IF NOT FOUND THEN
        c.queue := q; c.lo := pg_snapshot '1:1:'; c.hi := pg_current_snapshot(); c.at_tx := '0'; c.at_seq := 0;
    END IF;
    FOR round IN 1..2 LOOP
        running := ARRAY(SELECT pg_snapshot_xip(c.lo));
        RETURN QUERY
        WITH picked AS (
            -- The window's rows: those of transactions that were running at lo (its xip:
            -- a few lookups, whatever their age) and those of later ones up to hi. Not a
            -- range from lo's xmin: a transaction held open holds that xmin back, and the
            -- range would then cover every row written since.
            SELECT * FROM (
                (SELECT l.seq, l.tx, l.id, l.actor, l.args, l.kwargs, l.options, l.message_timestamp FROM fs_log l
                  WHERE l.queue = q AND l.tx >= greatest(pg_snapshot_xmax(c.lo), c.at_tx)
                    AND l.tx < pg_snapshot_xmax(c.hi)
                    AND (l.tx, l.seq) > (c.at_tx, c.at_seq) AND pg_visible_in_snapshot(l.tx, c.hi)
                  ORDER BY l.tx, l.seq LIMIT n)
                UNION ALL
                (SELECT l.* FROM unnest(running) AS r(tx) CROSS JOIN LATERAL (
                     SELECT l.seq, l.tx, l.id, l.actor, l.args, l.kwargs, l.options, l.message_timestamp
                       FROM fs_log l
                      WHERE l.queue = q AND l.tx = r.tx AND (l.tx, l.seq) > (c.at_tx, c.at_seq)
                        AND pg_visible_in_snapshot(l.tx, c.hi)
                      ORDER BY l.seq LIMIT n) l
                  ORDER BY l.tx, l.seq LIMIT n)
            ) w ORDER BY w.tx, w.seq LIMIT n
        ), lease AS (
            INSERT INTO fs_lease (owner, expires_at, seqs)
            SELECT who, now() + interval '30 seconds', array_agg(p.seq) FROM picked p HAVING count(*) > 0
            RETURNING fs_lease.batch
        ), moved AS (
            INSERT INTO fs_cursor (queue, lo, hi, at_tx, at_seq)
            SELECT q, c.lo, c.hi, p.tx, p.seq FROM picked p ORDER BY p.tx DESC, p.seq DESC LIMIT 1
        )
        SELECT lease.batch, p.seq, p.id, p.actor, p.args, p.kwargs, p.options, p.message_timestamp
          FROM picked p, lease;
        GET DIAGNOSTICS got = ROW_COUNT;
        EXIT WHEN got > 0;
        IF round = 1 THEN  -- the window is exhausted: the transactions committed since
            c.lo := c.hi; c.hi := pg_current_snapshot(); c.at_tx := '0'; c.at_seq := 0;
        ELSE  -- nothing new: the window moved on all the same
            INSERT INTO fs_cursor (queue, lo, hi, at_tx, at_seq) VALUES (q, c.lo, c.hi, c.at_tx, c.at_seq);
        END IF;
    END LOOP;
END $$;
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
INSERT_LOG = f"INSERT INTO fs_log {WIDE_COLUMNS} SELECT m.*, now() + %s * interval '1 millisecond' {ENQUEUE_COLUMNS}"
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

INSERT_BODY = f"INSERT INTO fs_body {WIDE_COLUMNS} SELECT m.*, now() + %s * interval '1 millisecond' {ENQUEUE_COLUMNS}"
SLIM_ENQUEUE = f"""
WITH b AS ({INSERT_BODY} RETURNING id, queue, priority, run_at)
INSERT INTO fs_slim (id, queue, priority, run_at) SELECT id, queue, priority, run_at FROM b
"""
SLIM_CLAIM = """
WITH c AS (
    UPDATE fs_slim SET status = 'running', lease_owner = %(owner)s, attempts = attempts + 1,
                       lease_expires_at = now() + interval '30 seconds'
     WHERE id IN (SELECT id FROM fs_slim WHERE queue = %(queue)s AND status = 'pending' AND run_at <= now()
                   ORDER BY priority DESC, run_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED)
    RETURNING id, attempts
)
SELECT b.id, b.actor, b.args, b.kwargs, c.attempts, b.options, b.message_timestamp FROM c JOIN fs_body b USING (id)
"""
SLIM_FINISH = """
WITH d AS (
    DELETE FROM fs_slim WHERE id = ANY(%(ids)s::uuid[]) AND lease_owner = %(owner)s RETURNING id, attempts
)
INSERT INTO fs_slim_done (id, status, attempt, owner, started_at, finished_at)
SELECT id, 'succeeded', attempts, %(owner)s, now(), now() FROM d
"""

LOG_CLAIM = "SELECT * FROM fs_log_claim(%(queue)s, %(n)s, %(owner)s)"
# One narrow row a job, and the batch's lease row goes (the floor finishes whole batches).
LOG_FINISH = """
WITH done AS (
    INSERT INTO fs_done (seq, id, status, attempt, owner, started_at, finished_at)
    SELECT seq, id, 'succeeded', 1, %(owner)s, now(), now() FROM unnest(%(seqs)s::bigint[], %(ids)s::uuid[]) AS d(seq, id)
)
DELETE FROM fs_lease WHERE batch = %(batch)s AND owner = %(owner)s
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
    conn.execute("TRUNCATE fs_jobs, fs_live, fs_ready, fs_claimed, fs_history, fs_log, fs_cursor, fs_lease, fs_done,"
                 " fs_body, fs_slim, fs_slim_done")


def settle(conn: Conn) -> None:
    conn.execute("ANALYZE fs_jobs")
    conn.execute("ANALYZE fs_ready")
    conn.execute("ANALYZE fs_live")
    conn.execute("ANALYZE fs_log")
    conn.execute("ANALYZE fs_slim")
    conn.execute("ANALYZE fs_body")


def narrow_claim(conn: Conn, batch: int, owner: str) -> list[Any]:
    return conn.execute(NARROW_CLAIM, {"queue": "floor", "n": batch, "owner": owner}).fetchall()


def narrow_finish(conn: Conn, owner: str, rows: list[Any]) -> None:
    conn.execute(NARROW_FINISH, {"ids": [r[0] for r in rows], "owner": owner})


def narrow_left(conn: Conn) -> int:
    return int(conn.execute("SELECT (SELECT count(*) FROM fs_jobs) + (SELECT count(*) FROM fs_ready)"
                            " + (SELECT count(*) FROM fs_claimed)").fetchone()[0])


def slim_claim(conn: Conn, batch: int, owner: str) -> list[Any]:
    return conn.execute(SLIM_CLAIM, {"queue": "floor", "n": batch, "owner": owner}).fetchall()


def slim_finish(conn: Conn, owner: str, rows: list[Any]) -> None:
    conn.execute(SLIM_FINISH, {"ids": [r[0] for r in rows], "owner": owner})


def slim_left(conn: Conn) -> int:
    return int(conn.execute("SELECT (SELECT count(*) FROM fs_slim) + (SELECT count(*) FROM fs_body)"
                            " - (SELECT count(DISTINCT id) FROM fs_slim_done)").fetchone()[0])


def log_claim(conn: Conn, batch: int, owner: str) -> list[Any]:
    return conn.execute(LOG_CLAIM, {"queue": "floor", "n": batch, "owner": owner}).fetchall()


def log_finish(conn: Conn, owner: str, rows: list[Any]) -> None:
    conn.execute(LOG_FINISH, {"owner": owner, "batch": rows[0][0], "seqs": [r[1] for r in rows],
                              "ids": [r[2] for r in rows]})


def log_left(conn: Conn) -> int:
    return int(conn.execute("SELECT (SELECT count(*) FROM fs_log) - (SELECT count(DISTINCT seq) FROM fs_done)"
                            " + (SELECT count(*) FROM fs_done) - (SELECT count(DISTINCT seq) FROM fs_done)"
                            " + (SELECT count(*) FROM fs_lease)").fetchone()[0])


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
    "slim": JobPath("a narrow live row beside a wide body written once; finish appends a narrow done row", reset,
                    TODAY.build, enqueue_with(SLIM_ENQUEUE), settle, slim_claim, slim_finish, slim_left),
    "log": JobPath("append-only log, claims by transaction windows (PgQ), a lease row per batch", reset,
                   TODAY.build, enqueue_with(INSERT_LOG), settle, log_claim, log_finish, log_left),
    "joblog": LOG_PATH,
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
    p.add_argument("--pin", action="store_true",
                   help="hold the xmin horizon (BEGIN; SELECT txid_current()) through every round")
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
        pin = psycopg.connect(url) if args.pin else None
        if pin is not None:  # vacuum and pruning remove no row version from here on
            say(f"pin: transaction {pin.execute('SELECT txid_current()').fetchone()[0]} open")
        for n in range(args.rounds):
            for shape in shapes:
                run = run_once(url, SHAPES[shape], args.jobs, args.batch, args.connections)
                runs[shape].append(run)
                say(f"round {n + 1} {shape:>6}: enqueue {run.enqueue_cpu:.0f} us/row; drain "
                    f"{run.drain_rate:,.0f} rows/s, {run.drain_cpu:.0f} us/row; {run.total_cpu:.0f} us/job")
        if pin is not None:
            pin.close()
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
