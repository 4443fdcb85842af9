-- Delayed plain jobs and delayed retries of log jobs wait in the log's world (issue 38, a
-- step toward one job store): a narrow table holds such a job until its run_at, and the
-- claim of its queue moves the due ones into job_log, where they are claimed as any plain
-- job. Before, both lived in job_queue, whose rows are updated on their path (claimed,
-- renewed, retried), each update a dead version under a pinned horizon. Here a row is
-- inserted once and deleted once (by its promotion, a cancel, a flush or an edit), and the
-- promoter reads the due index from a floor (how far the last promotion read, less a
-- slack: broker/consuming/timer_floors.py),
-- so the dead entries of the rows it already moved are passed over by a comparison in the
-- index, with no heap visit. Storage "table" writes none: its delayed jobs stay in job_queue.
--
-- The statements: supervisor/broker/sql/timers.py (ARCHITECTURE.md, 'Storage "log"').

-- A job's log row's columns (job_log's, LOG_COLUMNS), plus when it is due and its state
-- as the jobs view shows it (pending: sent with a delay; retryable: an attempt failed and
-- Retries set a backoff, last_error its error). One row per job: the id is the key, so a
-- producer's write made again inserts nothing.
CREATE TABLE job_timers (
    id                uuid        PRIMARY KEY,
    queue             text        NOT NULL,
    actor             text        NOT NULL,
    args              jsonb       NOT NULL DEFAULT '[]',
    kwargs            jsonb       NOT NULL DEFAULT '{}',
    options           jsonb       NOT NULL DEFAULT '{}',
    payload           bytea,
    priority          integer     NOT NULL DEFAULT 0,
    status            text        NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'retryable')),
    run_at            timestamptz NOT NULL,
    attempts          integer     NOT NULL DEFAULT 0,
    max_attempts      integer,
    lease_losses      integer     NOT NULL DEFAULT 0,
    max_lease_losses  integer,
    message_timestamp bigint,
    created_at        timestamptz NOT NULL DEFAULT now(),
    last_error        text
);
-- The promoter's read (a queue's due rows in run_at order, from its floor) and the due
-- timer's (a queue's earliest future run_at): both bound run_at in the index.
CREATE INDEX job_timers_due ON job_timers (queue, run_at);

-- A timer written wakes the due timers of its queue's consumers (NOTIFY '@queue', as a
-- delayed job_queue row's insert does: broker/consuming/timer.py reads NEXT_DUE again and
-- wakes the consumers at the earliest run_at), one NOTIFY per queue and statement.
CREATE FUNCTION job_timers_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('actor_supervisor_jobs', '@' || q.queue) FROM (SELECT DISTINCT queue FROM new_rows) AS q;
    RETURN NULL;
END $$;
CREATE TRIGGER job_timers_notify_insert AFTER INSERT ON job_timers
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION job_timers_notify_insert();

-- Move up to lim due timers of queue q into job_log (the caller holds the queue's claim
-- lock: job_log_claim_due), in run_at order, reading the index from tfloor (NULL: from the
-- start, the caller's periodic full read that finds a row committed late behind its floor).
-- SKIP LOCKED: a row a cancel or an edit is deleting is theirs. The log row is created at
-- its run_at (the log's created_at is what its views and waits read as a job's due time;
-- the send's time stays in message_timestamp) and keeps the attempts before it. Returns how
-- many rows moved and the latest run_at among them (the caller's next floor).
CREATE FUNCTION job_timers_promote(q text, tfloor timestamptz, lim integer, OUT promoted integer, OUT upto timestamptz)
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
                             lease_losses, max_lease_losses, message_timestamp, created_at)
        SELECT id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts, lease_losses,
               max_lease_losses, message_timestamp, run_at
          FROM moved ORDER BY run_at, id
    )
    SELECT max(run_at) INTO upto FROM moved;
END $$;

-- The workers' claim of the log: the queue's due timers promoted first, then job_log_claim,
-- in one statement (one round trip), under the queue's claim lock (concurrent promoters
-- take turns: a row is never moved twice). A paused queue promotes nothing. The rows a
-- claim promotes are its own transaction's: visible to its own snapshot, so job_log_claim
-- may take them at once, and to the next claims' windows once it commits. Every row carries
-- how many were promoted and how far the due index was read (upto: now() when every due
-- row from the floor was moved, the latest run_at moved when the limit stopped it, NULL
-- when paused): the caller's next floor, less its slack. A claim that took nothing
-- returns one row with batch NULL saying so (one that promoted then claims again at once).
CREATE FUNCTION job_log_claim_due(q text, n integer, who text, lease_s double precision, relaxed boolean,
                                  tfloor timestamptz, tlimit integer)
RETURNS TABLE (batch bigint, seq bigint, day date, id uuid, queue text, actor text, body text,
               attempt integer, max_attempts integer, lease_losses integer, max_lease_losses integer,
               message_timestamp bigint, payload bytea, priority integer, created_at timestamptz,
               promoted integer, upto timestamptz)
LANGUAGE plpgsql SET enable_sort = off SET jit = off AS $$
DECLARE
    p integer := 0;
    u timestamptz;
BEGIN
    IF n >= 1 AND NOT EXISTS (SELECT 1 FROM queue_pauses x WHERE x.queue = q) THEN
        u := now();  -- read up to now: nothing due from the floor, or all of it moved
        IF EXISTS (SELECT 1 FROM job_timers t
                    WHERE t.queue = q AND t.run_at >= coalesce(tfloor, '-infinity') AND t.run_at <= now()) THEN
            PERFORM pg_advisory_xact_lock(hashtext('job_log_claim'), hashtext(q));
            SELECT r.promoted, r.upto INTO p, u FROM job_timers_promote(q, tfloor, tlimit) r;
            IF p < tlimit THEN
                u := now();
            END IF;
        END IF;
    END IF;
    RETURN QUERY SELECT c.*, p, u FROM job_log_claim(q, n, who, lease_s, relaxed) c;
    IF NOT FOUND THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::date, NULL::uuid, q, NULL::text, NULL::text,
                            NULL::integer, NULL::integer, NULL::integer, NULL::integer, NULL::bigint, NULL::bytea,
                            NULL::integer, NULL::timestamptz, p, u;
    END IF;
END $$;

-- Whether a job with this id is live (041's), and which of a batch's are (044's): a job
-- waiting in job_timers is, so a message sent again while it waits is not written twice.
CREATE OR REPLACE FUNCTION job_id_live(i uuid) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM job_queue q WHERE q.id = i)
        OR EXISTS (SELECT 1 FROM job_timers t WHERE t.id = i)
        OR EXISTS (SELECT 1 FROM job_log l
                    WHERE l.id = i AND l.day BETWEEN job_log_today() - 1 AND job_log_today() + 1
                      AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day));
END $$;

CREATE OR REPLACE FUNCTION job_ids_live(ids uuid[]) RETURNS SETOF uuid LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
        SELECT q.id FROM job_queue q WHERE q.id = ANY(ids)
        UNION ALL
        SELECT t.id FROM job_timers t WHERE t.id = ANY(ids)
        UNION ALL
        SELECT l.id FROM job_log l
         WHERE l.id = ANY(ids) AND l.day BETWEEN job_log_today() - 1 AND job_log_today() + 1
           AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day);
END $$;

-- The views show a waiting timer as job_queue showed the same job: pending or retryable,
-- due at its run_at, with its attempts so far (043's jobs_log_live, and so the jobs view
-- built on it, and 039's jobs_live, each with one arm more).
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
  FROM job_log_pending() l
UNION ALL
SELECT t.id, t.queue, t.actor, t.args, t.kwargs, t.options, t.status, t.priority, t.run_at, t.attempts, t.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, t.last_error,
       NULL::jsonb, NULL::jsonb, t.created_at, NULL::timestamptz, NULL::timestamptz, t.lease_losses, t.max_lease_losses,
       t.message_timestamp, t.payload, NULL::text, NULL::jsonb
  FROM job_timers t;

CREATE OR REPLACE VIEW jobs_live AS
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM job_queue WHERE status IN ('pending', 'retryable')
UNION ALL
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM job_queue WHERE status = 'running' AND claimed_at IS NOT NULL
UNION ALL
SELECT id, queue, actor, status, priority, run_at, created_at, started_at, lease_owner
  FROM job_queue WHERE status = 'waiting'
UNION ALL
SELECT l.id, l.queue, l.actor, 'running', l.priority, l.created_at, l.created_at, NULL::timestamptz, x.owner
  FROM (SELECT * FROM job_lease ORDER BY batch) x CROSS JOIN LATERAL unnest(x.seqs, x.days) AS u(seq, day)
  JOIN job_log l ON l.seq = u.seq AND l.day = u.day
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
UNION ALL
SELECT l.id, l.queue, l.actor, 'pending', l.priority, l.created_at, l.created_at, NULL::timestamptz, NULL::text
  FROM job_log_pending() l
UNION ALL
SELECT t.id, t.queue, t.actor, t.status, t.priority, t.run_at, t.created_at, NULL::timestamptz, NULL::text
  FROM job_timers t;

-- A write through the jobs view to a waiting timer moves it into job_queue as it is (its
-- status, run_at, attempts and error), under its queue's claim lock (no promoter moves it
-- meanwhile), and jobs_view_write then applies the write there: 040's jobs_log_write, with
-- the timers first (a job waits in at most one of job_timers and the log).
CREATE OR REPLACE FUNCTION jobs_log_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l job_log;
    x job_lease;
    t job_timers;
BEGIN
    IF OLD.status IN ('pending', 'retryable', 'running') AND NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.id = OLD.id) THEN
        PERFORM pg_advisory_xact_lock(hashtext('job_log_claim'), hashtext(OLD.queue));
        DELETE FROM job_timers j WHERE j.id = OLD.id RETURNING * INTO t;
        IF t.id IS NOT NULL THEN
            INSERT INTO job_queue (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                                   max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, last_error)
            VALUES (t.id, t.queue, t.actor, t.args, t.kwargs, t.options, t.payload, t.status, t.priority, t.run_at,
                    t.attempts, t.max_attempts, t.lease_losses, t.max_lease_losses, t.message_timestamp, t.created_at,
                    t.last_error);
        ELSE
            FOR l IN SELECT * FROM job_log j WHERE j.id = OLD.id
                        AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = j.seq AND d.day = j.day) LOOP
                x := NULL;
                SELECT * INTO x FROM job_lease k WHERE l.seq = ANY(k.seqs) AND l.day = ANY(k.days) LIMIT 1;
                INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, claimed_at, last_error)
                VALUES (l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'retried',
                        l.attempts + CASE WHEN x.batch IS NULL THEN 0 ELSE 1 END, x.owner, x.claimed_at,
                        'moved into job_queue by a write through the jobs view')
                ON CONFLICT (seq, day) DO NOTHING;
                CONTINUE WHEN NOT FOUND;
                IF x.batch IS NULL THEN
                    INSERT INTO job_log_cancel (seq, day) VALUES (l.seq, l.day);
                END IF;
                INSERT INTO job_queue (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                                       max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, lease_losses,
                                       max_lease_losses, message_timestamp, created_at)
                VALUES (l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload,
                        CASE WHEN x.batch IS NULL THEN 'pending' ELSE 'running' END, l.priority, l.created_at,
                        l.attempts + CASE WHEN x.batch IS NULL THEN 0 ELSE 1 END, l.max_attempts, x.owner, x.claimed_at,
                        x.renewed_at, x.expires_at, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.created_at);
                EXIT;  -- a job has one live row
            END LOOP;
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

-- A workflow's cancel (049's workflow_cancel_steps, all of it kept) cancels a step whose job
-- waits in job_timers (sent with a delay, or a retry waiting for its backoff) as it does one
-- waiting in job_queue: into job_history 'cancelled', with its event. Else it was left as if
-- running and its job, promoted at its run_at, ran after the workflow was cancelled.
CREATE OR REPLACE FUNCTION workflow_cancel_steps(ids uuid[], why text, who text) RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    queued uuid[];
    logged uuid[];
    busy uuid[];
    timed uuid[];
    running uuid[];
    j record;
    was text;
    waits text := current_setting('lock_timeout');
BEGIN
    SELECT coalesce(array_agg(q.id), '{}') INTO queued FROM (
        SELECT q.id FROM job_queue q JOIN workflow_steps s ON s.id = q.id
         WHERE s.id = ANY(ids) AND s.state = 'enqueued'
         ORDER BY q.id FOR UPDATE OF q SKIP LOCKED) AS q;
    SELECT coalesce(array_agg(l.id), '{}'), coalesce(array_agg(l.id) FILTER (WHERE l.leased), '{}')
      INTO logged, busy FROM (
        SELECT l.id, EXISTS (SELECT 1 FROM job_lease x WHERE l.seq = ANY(x.seqs)) AS leased
          FROM workflow_steps s JOIN job_log l ON l.id = s.id
         WHERE s.id = ANY(ids) AND s.state = 'enqueued'
           AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)) AS l;
    SELECT coalesce(array_agg(t.id), '{}') INTO timed FROM (
        SELECT t.id FROM job_timers t JOIN workflow_steps s ON s.id = t.id
         WHERE s.id = ANY(ids) AND s.state = 'enqueued'
         ORDER BY t.id FOR UPDATE OF t SKIP LOCKED) AS t;
    SELECT coalesce(array_agg(s.id), '{}') INTO running FROM workflow_steps s
     WHERE s.id = ANY(ids) AND s.state = 'enqueued'
       AND (s.id = ANY(busy) OR EXISTS (SELECT 1 FROM job_queue q WHERE q.id = s.id AND q.status = 'running')
            OR NOT (s.id = ANY(queued) OR s.id = ANY(logged) OR s.id = ANY(timed)));
    UPDATE workflow_steps s SET state = 'cancelled', reason = why, finished_at = now(), result = NULL,
                                gathered = NULL, gathered_missing = NULL
     WHERE s.id = ANY(ids) AND (s.state = 'blocked' OR s.id = ANY(queued) OR s.id = ANY(logged)
                                OR s.id = ANY(timed));
    WITH gone AS (
        DELETE FROM job_timers t WHERE t.id = ANY(timed) RETURNING t.*
    ), kept AS (
        INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts,
                                 max_attempts, created_at, finished_at, last_error, lease_losses, max_lease_losses,
                                 message_timestamp, payload)
        SELECT id, queue, actor, args, kwargs, options, 'cancelled', priority, run_at, attempts, max_attempts,
               created_at, now(), why, lease_losses, max_lease_losses, message_timestamp, payload
          FROM gone
    )
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, who, status, 'cancelled', why FROM gone;
    WITH gone AS (
        DELETE FROM job_queue q WHERE q.id = ANY(queued) RETURNING q.*
    ), kept AS (
        INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts,
                                 max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key,
                                 concurrency_key, last_error, result, progress, created_at, started_at, finished_at,
                                 lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow)
        SELECT id, queue, actor, args, kwargs, options, 'cancelled', priority, run_at, attempts, max_attempts,
               lease_owner, claimed_at, heartbeat_at, NULL, dedupe_key, concurrency_key, why, result, progress,
               created_at, started_at, now(), lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow
          FROM gone
    ), told AS (
        SELECT pg_notify('actor_supervisor_cancel', id::text) FROM gone WHERE status = 'running'
    )
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, who, status, 'cancelled', why FROM gone, (SELECT count(*) FROM told) AS t;
    FOR j IN SELECT g.seq, g.day, g.id, g.queue, g.actor, g.created_at, g.attempts FROM job_log g
              WHERE g.id = ANY(logged) ORDER BY g.seq LOOP
        was := CASE WHEN j.id = ANY(busy) THEN 'running' ELSE 'pending' END;
        BEGIN
            PERFORM set_config('lock_timeout', '50ms', true);
            INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, last_error)
            VALUES (j.seq, j.day, j.id, j.queue, j.actor, j.created_at, 'cancelled', j.attempts + 1, NULL, why)
            ON CONFLICT (seq, day) DO NOTHING;
            IF FOUND THEN
                INSERT INTO job_log_cancel (seq, day) VALUES (j.seq, j.day);
                INSERT INTO job_events (job_id, who, from_status, to_status, reason)
                VALUES (j.id, who, was, 'cancelled', why);
                IF was = 'running' THEN
                    PERFORM pg_notify('actor_supervisor_cancel', j.id::text);
                END IF;
            END IF;
            PERFORM set_config('lock_timeout', waits, true);
        EXCEPTION WHEN lock_not_available THEN
            -- its outcome is being written by another transaction: it ends by itself (the
            -- subtransaction's rollback restored lock_timeout)
            UPDATE workflow_steps SET state = 'enqueued', reason = NULL, finished_at = NULL WHERE id = j.id;
        END;
    END LOOP;
    RETURN running;
END $$;
