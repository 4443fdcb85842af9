-- The jobs list reads the log's finished jobs a page at a time (issue 18; the dashboard's
-- reads at 10 M, ARCHITECTURE.md). Through the jobs view a listing (newest first, a page)
-- sorted every done row of the log: the view's done arms (one per final status, each with
-- a WHERE) are subqueries the planner cannot read in order, and at 1 M finished jobs, half
-- in the log, the Jobs page ran past the HTTP child's 5 s statement timeout.
--
-- 1. jobs_log_finished: the log's finished jobs (a done row of a final status beside its
--    log row), one relation a listing reads in (status, created_at, id) order;
--    jobs_queue_history (job_queue and job_history) and jobs_log_live (the log's running
--    and pending jobs): the jobs view's other arms. A listing (reads.ordered) reads each
--    part in order, each final status apart, each up to its page, and merges them. A
--    count's estimate (reads.count_plan) asks the planner of the stored parts only: of the
--    log's live arms it guessed millions (a join of cursors it cannot see), which the
--    count reads instead, up to its limit.
-- 2. job_done_status_created replaces job_done_created: each status's done rows in
--    creation order, so one status's part (and a status filter) reads only its own rows;
--    the same one entry per done row.
-- 3. job_done_finished keeps 16 pages a range (was 128): rows arrive in finish order, so
--    an hour's window reads its own ranges, about 800 rows each, not 6,000.
-- 4. The jobs view reads the log's done rows once (jobs_log_finished), not once per final
--    status: a scan of the view (a count, the readers of bench/pressure.py) read job_done
--    three times.
-- 5. job_log_pending() prices its rows as a range of transactions and reads those of the
--    transactions its cursor's lo saw running one at a time (below).

DROP INDEX job_done_created;
CREATE INDEX job_done_status_created ON job_done (status, created_at, id);
DROP INDEX job_done_finished;
CREATE INDEX job_done_finished ON job_done USING brin (finished_at) WITH (pages_per_range = 16);

-- The log's body of a done row is looked up per row (scalar subqueries, not a join): a read
-- that needs none of it (a count, the readers' scans) reads job_done alone, once.
CREATE VIEW jobs_log_finished AS
SELECT d.id, d.queue, d.actor, (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS args,
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS kwargs,
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS options,
       d.status, (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS priority, d.created_at AS run_at, d.attempt AS attempts,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_attempts,
       d.owner AS lease_owner, d.claimed_at, NULL::timestamptz AS heartbeat_at, NULL::timestamptz AS lease_expires_at,
       NULL::text AS dedupe_key, NULL::text AS concurrency_key, d.last_error, d.result, d.progress, d.created_at,
       d.started_at, d.finished_at,
       (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS lease_losses,
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_lease_losses,
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS message_timestamp,
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS payload,
       NULL::text AS flow_key, NULL::jsonb AS flow
  FROM job_done d
 WHERE d.status IN ('succeeded', 'failed', 'cancelled');

CREATE VIEW jobs_queue_history AS
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow FROM job_queue
UNION ALL
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow FROM job_history;

-- The log's live jobs (its running and pending arms): as many as its backlog and leases.
CREATE VIEW jobs_log_live AS
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'running'::text AS status, l.priority, l.created_at AS run_at,
       l.attempts + 1 AS attempts, l.max_attempts, x.owner AS lease_owner, x.claimed_at, x.renewed_at AS heartbeat_at,
       x.expires_at AS lease_expires_at, NULL::text AS dedupe_key, NULL::text AS concurrency_key, NULL::text AS last_error,
       NULL::jsonb AS result, NULL::jsonb AS progress, l.created_at, NULL::timestamptz AS started_at,
       NULL::timestamptz AS finished_at, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.payload,
       NULL::text AS flow_key, NULL::jsonb AS flow
  FROM (SELECT * FROM job_lease ORDER BY batch) x
 CROSS JOIN LATERAL unnest(x.seqs, x.days) AS u(seq, day)
  JOIN job_log l ON l.seq = u.seq AND l.day = u.day
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
UNION ALL
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'pending', l.priority, l.created_at, l.attempts, l.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::jsonb,
       NULL::jsonb, l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses,
       l.message_timestamp, l.payload, NULL::text, NULL::jsonb
  FROM job_log_pending() l;

-- The jobs view's done rows: one arm (jobs_log_finished) where there were three, one per
-- final status with the status a constant. A count or a scan of the view read job_done
-- three times; a read of live statuses still reads no done row (the planner sees that
-- status IN the final ones and status = 'pending' cannot both hold).
-- (the same plans as its arms written out: the planner flattens the parts' unions)
CREATE OR REPLACE VIEW jobs AS
SELECT * FROM jobs_queue_history
UNION ALL
SELECT * FROM jobs_log_live
UNION ALL
SELECT * FROM jobs_log_finished;

-- The pending part (5.) reads the rows of the transactions its cursor's lo saw running one
-- transaction at a time, by the claim's index (a lateral read each, as job_log_claim's
-- third range): joined to the list of them, the planner read every row of the level (the
-- whole log) whenever lo had seen a transaction running, as on a busy server.
CREATE OR REPLACE FUNCTION job_log_pending() RETURNS SETOF job_log LANGUAGE sql STABLE AS $$
    SELECT l.*
      FROM (SELECT DISTINCT ON (k.queue, k.priority) k.* FROM job_cursor k ORDER BY k.queue, k.priority, k.at DESC) c
     CROSS JOIN LATERAL (
        SELECT l.* FROM job_log l
         WHERE l.queue = c.queue AND l.priority = c.priority AND l.tx >= pg_snapshot_xmax(c.lo)
           -- true of every row this statement can see (a snapshot's xmax passes every
           -- transaction that had ended; its own, still running, may be past it), but with
           -- it the planner prices a range (1/200 of the level's rows) where one bound alone
           -- made it a third: millions of pending rows guessed for none, a plan over JIT's
           -- thresholds, and every count of the jobs view compiled for ~2 s
           AND l.tx <= greatest(pg_snapshot_xmax(pg_current_snapshot()), pg_current_xact_id_if_assigned())
        UNION ALL
        SELECT r.* FROM unnest(ARRAY(SELECT pg_snapshot_xip(c.lo))) AS x(tx)
         CROSS JOIN LATERAL (SELECT l.* FROM job_log l
                              WHERE l.queue = c.queue AND l.priority = c.priority AND l.tx = x.tx
                             OFFSET 0) r) l
     WHERE NOT (pg_visible_in_snapshot(l.tx, c.hi) AND (l.tx, l.seq) <= (c.at_tx, c.at_seq))
       AND NOT EXISTS (SELECT 1 FROM job_log_cancel x WHERE x.seq = l.seq AND x.day = l.day)
$$;
