-- A running job of the log shows its progress and its start as a job_queue row does.
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
