-- Deduped jobs in the log (issue 38, "one job store"): a job whose only extra is a dedupe key
-- (no concurrency or limit key) is appended to job_log (or waits in job_timers) like a plain
-- job; before, it lived in job_queue, whose claims step over every dead version of its rows
-- while a session holds the xmin horizon back.
--
-- The invariant: at most one live job per dedupe key, across job_queue, job_timers and the
-- log. job_keys holds, per key, the job that took it last (its holder); a key is held while
-- its holder is live (job_key_live: a job_queue row with the id, a timer, or a log row of
-- the id since the day it took the key with no done row), and free once it has ended for
-- good. A send takes a key with one INSERT ... ON CONFLICT DO UPDATE (job_keys_take): a new
-- key is inserted, a key whose holder ended is taken over (the row lock serialises takers:
-- a second taker waits for the first's transaction and then finds its holder live), a key
-- whose holder is live is left locked and its holder returned, which the producer gives the
-- caller instead of writing. The release is lazy: no outcome statement (ack, retry, release,
-- cancel, retention) writes job_keys; the upkeep deletes keys whose holder ended, in
-- bounded batches (job_keys_prune). A retry, a release, a delay keep the key: the job stays
-- live under the same id through each of them (one statement writes its outcome and its
-- next row). job_queue's rows with a key (jobs inserted by SQL, keyed jobs with a
-- concurrency or limit key, storage "table") take their key here too, by a trigger, so a
-- key held in one store dedupes a send to the other. No claim reads job_keys.
--
-- The statements: supervisor/broker/sql/jobkeys.py (ARCHITECTURE.md, 'Storage "log"').

-- The key on the rows themselves (NULL for a plain job: no byte more than the null bitmap
-- the row has), so the views show it.
ALTER TABLE job_log ADD COLUMN dedupe_key text;
ALTER TABLE job_timers ADD COLUMN dedupe_key text;

-- One row per key: its holder and the UTC day it took the key (job_log_today(): every log
-- row of the holder is of that day or later, so job_key_live reads only those days). A
-- take-over updates job_id and day, neither indexed: a HOT update, room left for it.
CREATE TABLE job_keys (
    key    text PRIMARY KEY,
    job_id uuid NOT NULL,
    day    date NOT NULL
) WITH (fillfactor = 70);

-- Whether the holder h (a key taken on day since) is live: in job_queue, waiting in
-- job_timers, or in the log since that day with no outcome. VOLATILE: each query takes a
-- fresh snapshot (READ COMMITTED), so a taker that waited for another's insert of the key
-- sees that holder's rows, committed with it. A plpgsql function: its plans are cached.
CREATE FUNCTION job_key_live(h uuid, since date) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM job_queue q WHERE q.id = h)
        OR EXISTS (SELECT 1 FROM job_timers t WHERE t.id = h)
        OR EXISTS (SELECT 1 FROM job_log l
                    WHERE l.id = h AND l.day BETWEEN since AND job_log_today() + 1
                      AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day));
END $$;

-- Take keys for jobs (keys[i] for ids[i]; each key once, the caller's job): returns every
-- key with its holder, which is the given id when this call took it (a new key, one whose
-- holder ended, or one it already holds: a write made again), else the live job that holds
-- it. Keys are taken in key order (two batches of the same keys wait for each other, never
-- deadlock), and every one is left locked by this transaction, so the holders returned stay
-- so until it ends. The holders are read by a second query, with its own snapshot: it sees
-- a holder committed by a transaction the first one waited for.
CREATE FUNCTION job_keys_take(keys text[], ids uuid[]) RETURNS TABLE (key text, job_id uuid)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_keys AS k (key, job_id, day)
    SELECT u.key, u.id, job_log_today() FROM unnest(keys, ids) AS u(key, id) ORDER BY u.key
    ON CONFLICT ON CONSTRAINT job_keys_pkey DO UPDATE SET job_id = EXCLUDED.job_id, day = EXCLUDED.day
     WHERE k.job_id <> EXCLUDED.job_id AND NOT job_key_live(k.job_id, k.day);
    RETURN QUERY SELECT k.key, k.job_id FROM job_keys k WHERE k.key = ANY(keys);
END $$;

-- The live holders of keys (no lock taken): a batch's look-up, sql.LIVE_BY_DEDUPE_KEYS.
CREATE FUNCTION job_keys_live(keys text[]) RETURNS TABLE (key text, job_id uuid) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT k.key, k.job_id FROM job_keys k WHERE k.key = ANY(keys) AND job_key_live(k.job_id, k.day);
END $$;

-- A job_queue row with a key takes it (every insert: the producers', a workflow's release,
-- one by SQL through the jobs view). A key a live job of job_queue holds is left to
-- jobs_dedupe_live, as before (ON CONFLICT DO NOTHING, or the unique violation); one a live
-- log job holds skips the row, as a conflict would.
CREATE FUNCTION job_queue_take_key() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h uuid;
BEGIN
    SELECT t.job_id INTO h FROM job_keys_take(ARRAY[NEW.dedupe_key], ARRAY[NEW.id]) t;
    IF h = NEW.id OR EXISTS (SELECT 1 FROM job_queue q WHERE q.id = h) THEN
        RETURN NEW;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_queue_take_key BEFORE INSERT ON job_queue
    FOR EACH ROW WHEN (NEW.dedupe_key IS NOT NULL) EXECUTE FUNCTION job_queue_take_key();

-- The keys job_queue's live jobs hold today.
INSERT INTO job_keys (key, job_id, day)
SELECT dedupe_key, id, job_log_today() FROM job_queue WHERE dedupe_key IS NOT NULL
ON CONFLICT DO NOTHING;

-- The upkeep's prune: of up to lim keys after ``after`` in key order (NULL: from the
-- first), those whose holder ended are deleted (a key a taker holds locked is skipped; the
-- DELETE checks the holder again on the row it locks). Returns how many went and the last
-- key read (NULL: the end was reached; the next call starts again from the first).
CREATE FUNCTION job_keys_prune(after text, lim integer, OUT pruned integer, OUT upto text)
LANGUAGE plpgsql AS $$
DECLARE
    read text[];
BEGIN
    read := ARRAY(SELECT k.key FROM job_keys k WHERE after IS NULL OR k.key > after ORDER BY k.key LIMIT lim);
    upto := CASE WHEN cardinality(read) < lim THEN NULL ELSE read[cardinality(read)] END;
    WITH gone AS (
        DELETE FROM job_keys k
         WHERE k.key IN (SELECT c.key FROM job_keys c WHERE c.key = ANY(read) ORDER BY c.key FOR UPDATE SKIP LOCKED)
           AND NOT job_key_live(k.job_id, k.day)
        RETURNING 1
    )
    SELECT count(*) INTO pruned FROM gone;
END $$;

-- A timer promoted keeps its key on its log row (051's job_timers_promote, all of it kept).
CREATE OR REPLACE FUNCTION job_timers_promote(q text, tfloor timestamptz, lim integer, OUT promoted integer,
                                              OUT upto timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    due uuid[];
BEGIN
    due := ARRAY(SELECT t.id FROM job_timers t
                  WHERE t.queue = q AND t.run_at >= coalesce(tfloor, '-infinity') AND t.run_at <= now()
                  ORDER BY t.run_at LIMIT lim FOR UPDATE SKIP LOCKED);
    promoted := cardinality(due);
    IF promoted = 0 THEN  -- no statement on job_log: its insert trigger would fire for no row
        RETURN;
    END IF;
    WITH moved AS (
        DELETE FROM job_timers t WHERE t.id = ANY(due) RETURNING t.*
    ), put AS (
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                             lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key)
        SELECT id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts, lease_losses,
               max_lease_losses, message_timestamp, run_at, dedupe_key
          FROM moved ORDER BY run_at, id
    )
    SELECT max(run_at) INTO upto FROM moved;
END $$;

-- The views show a log job's key (051's jobs_log_live and 043's jobs_log_finished, with the
-- key read from the rows instead of NULL; a finished job's from its log row, per row read).
CREATE OR REPLACE VIEW jobs_log_live AS
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'running'::text AS status, l.priority, l.created_at AS run_at,
       l.attempts + 1 AS attempts, l.max_attempts, x.owner AS lease_owner, x.claimed_at, x.renewed_at AS heartbeat_at,
       x.expires_at AS lease_expires_at, l.dedupe_key, NULL::text AS concurrency_key, NULL::text AS last_error,
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
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, l.dedupe_key, NULL::text, NULL::text,
       NULL::jsonb, NULL::jsonb, l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses,
       l.message_timestamp, l.payload, NULL::text, NULL::jsonb
  FROM job_log_pending() l
UNION ALL
SELECT t.id, t.queue, t.actor, t.args, t.kwargs, t.options, t.status, t.priority, t.run_at, t.attempts, t.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, t.dedupe_key, NULL::text, t.last_error,
       NULL::jsonb, NULL::jsonb, t.created_at, NULL::timestamptz, NULL::timestamptz, t.lease_losses, t.max_lease_losses,
       t.message_timestamp, t.payload, NULL::text, NULL::jsonb
  FROM job_timers t;

CREATE OR REPLACE VIEW jobs_log_finished AS
SELECT d.id, d.queue, d.actor, (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS args,
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS kwargs,
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS options,
       d.status, (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS priority, d.created_at AS run_at, d.attempt AS attempts,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_attempts,
       d.owner AS lease_owner, d.claimed_at, NULL::timestamptz AS heartbeat_at, NULL::timestamptz AS lease_expires_at,
       (SELECT l.dedupe_key FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS dedupe_key,
       NULL::text AS concurrency_key, d.last_error, d.result, d.progress, d.created_at,
       d.started_at, d.finished_at,
       coalesce(d.lease_losses, (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day)) AS lease_losses,
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_lease_losses,
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS message_timestamp,
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS payload,
       NULL::text AS flow_key, NULL::jsonb AS flow
  FROM job_done d
 WHERE d.status IN ('succeeded', 'failed', 'cancelled');
