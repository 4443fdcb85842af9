-- Live rows are read through indexes again.
--
-- Migration 006 dropped jobs_running_owner (ack batches read every running row of the
-- owner through it) and 026 dropped jobs_running_expiry (heartbeats could not be HOT
-- updates), which left no index on running rows: every reap (each worker, every
-- lease / 2), every release of a stopped or dead process's jobs, and every read of the
-- live rows per queue (/metrics at each scrape, the dashboard's recorder every 10 s,
-- `supervisor queues`) read the whole table: 0.4 s each at 2 M finished rows.
--
-- jobs_running's condition includes claimed_at IS NOT NULL, which holds for every
-- running row (only the claim makes a row running, and it sets claimed_at; the check
-- below keeps it so). The ack and the heartbeat never state it, so the planner cannot
-- use this index for them: they look their rows up by id, not by reading every running
-- row of the owner with the dead entries between vacuums. The reaper, the release and
-- jobs_live state it. No column a heartbeat changes is in the index or its condition:
-- heartbeats stay HOT.

-- Rows made running by hand before this check existed count as claimed when they started.
UPDATE jobs SET claimed_at = coalesce(started_at, now()) WHERE status = 'running' AND claimed_at IS NULL;
ALTER TABLE jobs ADD CONSTRAINT jobs_running_claimed CHECK (status <> 'running' OR claimed_at IS NOT NULL);

CREATE INDEX IF NOT EXISTS jobs_running ON jobs (lease_owner) WHERE status = 'running' AND claimed_at IS NOT NULL;

-- Failed rows by queue: the dashboard's count per queue, join()'s first failure since a
-- time, dead_letters(). Retention keeps failed rows for days beside millions of
-- succeeded ones; a failure is rare, so this index costs next to nothing to keep.
CREATE INDEX IF NOT EXISTS jobs_failed ON jobs (queue, finished_at) WHERE status = 'failed';

-- Every live row (pending, retryable, running), each arm served by its partial index
-- (jobs_claim, jobs_running); a filter on status prunes the other arm.
CREATE VIEW jobs_live AS
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM jobs WHERE status IN ('pending', 'retryable')
UNION ALL
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM jobs WHERE status = 'running' AND claimed_at IS NOT NULL;

-- As in 021, reading the live rows through jobs_live.
CREATE OR REPLACE VIEW v_queue_capacity AS
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending')                                    AS pending,
           count(*) FILTER (WHERE status IN ('pending', 'retryable') AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable') AND run_at > now())  AS scheduled,
           count(*) FILTER (WHERE status = 'running')                                    AS running,
           count(*) FILTER (WHERE status = 'retryable')                                  AS retryable
      FROM jobs_live
     GROUP BY queue
), done AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'succeeded')                                  AS succeeded_1h,
           count(*) FILTER (WHERE status = 'failed')                                     AS failed_1h,
           avg(extract(epoch FROM finished_at - coalesce(started_at, finished_at)))
               FILTER (WHERE status = 'succeeded')                                       AS avg_duration_s,
           count(*) FILTER (WHERE status IN ('succeeded', 'failed'))                     AS finished_1h,
           count(DISTINCT lease_owner) FILTER (WHERE status IN ('succeeded', 'failed'))  AS busy_workers_1h
      FROM jobs
     WHERE status IN ('succeeded', 'failed', 'cancelled') AND finished_at > now() - interval '1 hour'
     GROUP BY queue
), w AS (
    SELECT q AS queue, count(*) AS active_workers, coalesce(sum(capacity), 0) AS capacity,
           coalesce(sum(jobs_in_flight), 0) AS in_flight
      FROM workers CROSS JOIN LATERAL unnest(queues) AS q
     WHERE stopped_at IS NULL AND role <> 'master' AND heartbeat_at > now() - interval '1 minute'
     GROUP BY q
), names AS (
    SELECT queue FROM live UNION SELECT queue FROM done UNION SELECT queue FROM w
    UNION SELECT queue FROM queue_pauses
), rates AS (
    SELECT n.queue,
           coalesce(l.pending, 0) AS pending, coalesce(l.ready, 0) AS ready,
           coalesce(l.scheduled, 0) AS scheduled, coalesce(l.running, 0) AS running,
           coalesce(l.retryable, 0) AS retryable,
           coalesce(d.succeeded_1h, 0) AS succeeded_1h, coalesce(d.failed_1h, 0) AS failed_1h,
           round(d.avg_duration_s::numeric, 3)::float8 AS avg_duration_s,
           coalesce(w.active_workers, 0) AS active_workers, coalesce(w.capacity, 0) AS capacity,
           coalesce(w.in_flight, 0) AS in_flight,
           (d.finished_1h::float8 / nullif(d.busy_workers_1h, 0)) AS throughput_per_worker_hour,
           coalesce(l.pending, 0) + coalesce(l.retryable, 0) + coalesce(l.running, 0) AS backlog,
           p.queue IS NOT NULL AS paused, p.reason AS paused_reason
      FROM names n
      LEFT JOIN live l ON l.queue = n.queue
      LEFT JOIN done d ON d.queue = n.queue
      LEFT JOIN w ON w.queue = n.queue
      LEFT JOIN queue_pauses p ON p.queue = n.queue
)
SELECT rates.*,
       CASE WHEN backlog = 0 THEN 0
            ELSE round((backlog * 3600.0 / nullif(throughput_per_worker_hour * active_workers, 0))::numeric, 1)::float8
       END AS drain_seconds,
       CASE WHEN backlog = 0 THEN 0 ELSE ceil(backlog / throughput_per_worker_hour)::int END AS workers_needed_1h,
       CASE WHEN backlog = 0 THEN 0 ELSE ceil(backlog / (4 * throughput_per_worker_hour))::int END AS workers_needed_4h,
       CASE WHEN backlog = 0 THEN 0 ELSE ceil(backlog / (8 * throughput_per_worker_hour))::int END AS workers_needed_8h
  FROM rates;
