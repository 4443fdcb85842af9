-- Durations measure running, and the live states partition the live rows.
--
-- started_at is now the start of the latest attempt in a worker thread: a claim clears
-- it, and the attempt's outcome (ack, failure, retry) writes it, with finished_at, from
-- the worker's own measure of the attempt. Before, it was the first claim, so a
-- duration (finished_at - started_at) counted the wait in a prefetch buffer and every
-- retry's backoff as work. A row with no started_at never ran (skipped, fenced, failed
-- at claim, a poison pill): it has no duration.
--
-- The live columns were counted across each other (ready held the due retryable rows
-- that retryable held too, and pending those of ready and scheduled), so a sum over them
-- (/metrics' actor_supervisor_jobs by queue) counted jobs twice. Now, as on the
-- dashboard: ready (pending, due), scheduled (pending or retryable, not due yet),
-- retryable (retryable, due), running; together they are every live row (backlog).
-- The pending column is gone (it overlapped ready and scheduled).

DROP VIEW IF EXISTS v_queue_capacity;

CREATE VIEW v_queue_capacity AS
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending' AND run_at <= now())                AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable') AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running')                                    AS running,
           count(*) FILTER (WHERE status = 'retryable' AND run_at <= now())              AS retryable
      FROM jobs_live
     GROUP BY queue
), done AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'succeeded')                                  AS succeeded_1h,
           count(*) FILTER (WHERE status = 'failed')                                     AS failed_1h,
           avg(extract(epoch FROM finished_at - started_at)) FILTER (WHERE status = 'succeeded')
                                                                                         AS avg_duration_s,
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
           coalesce(l.ready, 0) AS ready, coalesce(l.scheduled, 0) AS scheduled,
           coalesce(l.running, 0) AS running, coalesce(l.retryable, 0) AS retryable,
           coalesce(d.succeeded_1h, 0) AS succeeded_1h, coalesce(d.failed_1h, 0) AS failed_1h,
           round(d.avg_duration_s::numeric, 3)::float8 AS avg_duration_s,
           coalesce(w.active_workers, 0) AS active_workers, coalesce(w.capacity, 0) AS capacity,
           coalesce(w.in_flight, 0) AS in_flight,
           (d.finished_1h::float8 / nullif(d.busy_workers_1h, 0)) AS throughput_per_worker_hour,
           coalesce(l.ready, 0) + coalesce(l.scheduled, 0) + coalesce(l.running, 0) + coalesce(l.retryable, 0)
               AS backlog,
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
