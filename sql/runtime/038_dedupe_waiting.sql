-- A job waiting for its limit key (status 'waiting', migration 036) holds its dedupe key as
-- every other live job does. jobs_dedupe_live covered pending, retryable and running only:
-- a second job with the key of a waiting one was written, and the claim that made the
-- second 'running' while its twin ran met the unique index inside the claim statement,
-- which failed the whole claim (the queue stalled while the twin ran).
--
-- job_queue holds live rows only (its constraint, migration 035), so the index covers
-- every row with a key. Twins written before this migration keep running: the later of
-- each (by created_at, id) lets go of its key, so no job is lost.
UPDATE job_queue j
   SET dedupe_key = NULL
 WHERE j.dedupe_key IS NOT NULL
   AND EXISTS (SELECT 1 FROM job_queue o
                WHERE o.dedupe_key = j.dedupe_key AND (o.created_at, o.id) < (j.created_at, j.id));

DROP INDEX jobs_dedupe_live;
CREATE UNIQUE INDEX jobs_dedupe_live ON job_queue (dedupe_key) WHERE dedupe_key IS NOT NULL;
