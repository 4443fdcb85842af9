-- Capacity planning, one row per queue (every queue with live or recent jobs, or
-- served by a live worker). Read by `supervisor queues`, /api/v1/queues and /metrics.
--
-- Only indexed slices of jobs are read: live rows (the partial claim and running
-- indexes) and rows finished in the last hour (jobs_finished); old finished rows,
-- however many, are never scanned.
--
-- throughput_per_worker_hour is measured: jobs finished (succeeded or failed) in the
-- last hour per process that finished any. backlog is every live job (pending, due
-- or not, retryable and running); drain_seconds divides it by the throughput of the
-- active workers, and workers_needed_Nh by what one worker does in N hours.

-- How many rows each process may hold (its threads, or its prefetch): in flight / capacity.
ALTER TABLE workers ADD COLUMN IF NOT EXISTS capacity integer;

CREATE OR REPLACE VIEW v_queue_capacity AS
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending')                                    AS pending,
           count(*) FILTER (WHERE status IN ('pending', 'retryable') AND run_at <= now()) AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable') AND run_at > now())  AS scheduled,
           count(*) FILTER (WHERE status = 'running')                                    AS running,
           count(*) FILTER (WHERE status = 'retryable')                                  AS retryable
      FROM jobs
     WHERE status IN ('pending', 'retryable', 'running')
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
