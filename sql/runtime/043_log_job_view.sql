-- The jobs view shows a job of the log as it shows a job_queue row.
--
-- 1. A running job of the log shows its progress and its start as a job_queue row does.
-- The progress writer (sql.WRITE_PROGRESS) updates job_queue's progress column; a job of
-- the log has no such row while it runs, so the jobs view said NULL until the ack wrote
-- the done row: the Job page, `GET /api/v1/jobs/{id}` and `supervisor jobs show` showed
-- no progress for a running job of the default storage. Its progress is now its latest
-- report (job_progress, by its (job_id, at) index; built as WRITE_PROGRESS builds it),
-- and its started_at the claim's time, as the claim stamps a job_queue row's.
CREATE OR REPLACE VIEW jobs_log_live AS
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'running'::text AS status, l.priority, l.created_at AS run_at,
       l.attempts + 1 AS attempts, l.max_attempts, x.owner AS lease_owner, x.claimed_at, x.renewed_at AS heartbeat_at,
       x.expires_at AS lease_expires_at, NULL::text AS dedupe_key, NULL::text AS concurrency_key, NULL::text AS last_error,
       NULL::jsonb AS result,
       (SELECT jsonb_build_object('percent', p.percent, 'message', p.message, 'at', p.at)
               || CASE WHEN p.event IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('event', p.event) END
          FROM job_progress p WHERE p.job_id = l.id ORDER BY p.at DESC, p.id DESC LIMIT 1) AS progress,
       l.created_at, x.claimed_at AS started_at,
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

-- 2. A job of the log that lost its lease for the last time (a poison pill: LOG_RELEASE
--    writes its done row 'failed') showed one lease loss fewer than it had (its log row's,
--    which counts the losses before that run; the last is on no log row) in the jobs view
--    and in job_history once its day was archived: "lease_losses 2" beside "lease lost 3
--    times". A release's done row now keeps the attempt's count of losses, this one
--    included (NULL for every other outcome); the view and the archive read it first.
ALTER TABLE job_done ADD COLUMN lease_losses integer;

CREATE OR REPLACE VIEW jobs_log_finished AS
SELECT d.id, d.queue, d.actor, (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS args,
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS kwargs,
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS options,
       d.status, (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS priority, d.created_at AS run_at, d.attempt AS attempts,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_attempts,
       d.owner AS lease_owner, d.claimed_at, NULL::timestamptz AS heartbeat_at, NULL::timestamptz AS lease_expires_at,
       NULL::text AS dedupe_key, NULL::text AS concurrency_key, d.last_error, d.result, d.progress, d.created_at,
       d.started_at, d.finished_at,
       coalesce(d.lease_losses, (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day)) AS lease_losses,
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_lease_losses,
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS message_timestamp,
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS payload,
       NULL::text AS flow_key, NULL::jsonb AS flow
  FROM job_done d
 WHERE d.status IN ('succeeded', 'failed', 'cancelled');

CREATE OR REPLACE FUNCTION job_log_drop_before(cutoff date) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    part record;
    dropped bigint := 0;
BEGIN
    FOR part IN
        SELECT c.relname, to_date(right(c.relname, 8), 'YYYYMMDD') AS d, greatest(c.reltuples, 0)::bigint AS rows
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'job_log'::regclass AND c.relname ~ '_d[0-9]{8}$'
           AND to_date(right(c.relname, 8), 'YYYYMMDD') < cutoff
         ORDER BY 1
    LOOP
        -- A claim holds the day until it commits; its lease is then visible here.
        EXECUTE format('LOCK TABLE %I, %I IN ACCESS EXCLUSIVE MODE', part.relname,
                       'job_done_d' || to_char(part.d, 'YYYYMMDD'));
        CONTINUE WHEN EXISTS (SELECT 1 FROM job_lease WHERE part.d = ANY(days));
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                             lease_losses, max_lease_losses, message_timestamp, created_at)
        SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, l.priority, l.attempts, l.max_attempts,
               l.lease_losses, l.max_lease_losses, l.message_timestamp, l.created_at
          FROM job_log l
         WHERE l.day = part.d AND NOT EXISTS (SELECT 1 FROM job_done x WHERE x.seq = l.seq AND x.day = l.day);
        INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts,
                                 max_attempts, lease_owner, created_at, started_at, finished_at, last_error, result,
                                 lease_losses, max_lease_losses, message_timestamp, payload)
        SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, x.status, l.priority, l.created_at, x.attempt,
               coalesce(l.max_attempts, x.attempt), x.owner, l.created_at, x.started_at, x.finished_at, x.last_error,
               x.result, coalesce(x.lease_losses, l.lease_losses), l.max_lease_losses, l.message_timestamp, l.payload
          FROM job_done x JOIN job_log l ON l.seq = x.seq AND l.day = x.day
         WHERE x.day = part.d AND x.status IN ('failed', 'cancelled');
        DELETE FROM job_log_cancel WHERE day = part.d;
        EXECUTE format('DROP TABLE %I, %I', part.relname, 'job_done_d' || to_char(part.d, 'YYYYMMDD'));
        dropped := dropped + part.rows;
    END LOOP;
    RETURN dropped;
END
$$;
