-- 058: an upgraded database's live jobs in job_queue move into the log (issue 38: one store).
--
-- Every producer now sends what the log takes to the log, but the jobs an earlier version
-- left in job_queue would wait there, claimed only at job_queue's turn. Each one that is
-- waiting to run (pending, retryable, or waiting for its key) and whose key the log takes
-- (057's job_log_takes) moves now, as an operator's edit moves one (057's
-- job_queue_to_log): due now into job_log, in run_at order (so the log's claim keeps their
-- order within a priority), later into job_timers, each with its dedupe key (still held in
-- job_keys by its id) and its limit key. What stays: a running job (its process's ack
-- finds it; its retry or release stays in job_queue), and a key the log does not take.
-- One DELETE and one INSERT a job, in the migration's transaction: about a minute for a
-- million waiting jobs on a 2-core machine.
SELECT count(*) FILTER (WHERE job_queue_to_log(q.id))
  FROM (SELECT id FROM job_queue WHERE status IN ('pending', 'retryable', 'waiting') ORDER BY run_at, id) AS q;
