-- 055: the rest of the jobs the log can hold go to it (issue 38, "one store"): a workflow's
-- keyed step, a job inserted by SQL through the jobs view, a job sent by actor name from a
-- process that does not know the actor. Each lived in job_queue, whose claims step over the
-- dead versions of its rows under a pinned horizon. What stays in job_queue: the rows that
-- keep job_queue's own columns (a row written by hand as running, waiting or finished; one
-- with a concurrency key and no limits).
--
-- Here: the release of a workflow's steps and the jobs view's insert, which are SQL. The
-- rest is the broker's: a send by name (producing/producer.py, logstore.loggable), its
-- budget filled in and its late keys at the claim (logstore.decode, consuming/late_keys.py,
-- sql/slots.py LOG_KEY_LATE). ARCHITECTURE.md, 'Storage "log"', "The rest of the jobs".

-- Whether the log's claim applies every limit of a row's flow: a concurrency limit (053), a
-- rate, its burst, a daily quota (054), a weight (056; none at all: a weight-1 fairness
-- key). As logstore.log_limits (and 057's job_log_takes, made after this).
CREATE FUNCTION flow_log_takes(flow jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_typeof(flow) = 'object'
           AND NOT EXISTS (SELECT 1 FROM jsonb_object_keys(flow) k WHERE k NOT IN ('c', 'r', 'b', 'q', 'w'))
$$;

-- 049's workflow_release, all of it kept, with a keyed step the producer would have put in
-- the log (to_log: since 055 a step with a dedupe key or a limit key the log takes too)
-- appended to job_log with its keys: its dedupe key taken in job_keys as a producer's send
-- takes it (052's job_keys_take, in key order, a key repeated among the released steps taken
-- by the first of them by position), written only if it got the key (a key a live job holds
-- refuses the step's job, as job_queue's trigger did: job_queue_take_key), its limit key and
-- limits in flow_key and flow (053-054, 056: the claim gates, paces or parks it). A release
-- with no keyed log step calls nothing more (the keys' part runs only when one has a key).
-- Steps written before 055 keep their to_log, so an old keyed step still goes to job_queue.
CREATE OR REPLACE FUNCTION workflow_release(ids uuid[]) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    st record;
    arr jsonb[];
    par uuid[];
    slot integer;
    res jsonb;
    pre_ids uuid[] := '{}';
    pre_results jsonb[] := '{}';
BEGIN
    -- steps gathered near their release: only the parents missing then are read
    FOR st IN SELECT s.id, s.parents, s.gathered, s.gathered_missing FROM workflow_steps s
               WHERE s.id = ANY(ids) AND s.state = 'blocked' AND s.remaining <= 0 AND s.gathered IS NOT NULL LOOP
        arr := st.gathered;  -- a variable: each slot set in place
        par := st.parents;
        FOR slot, res IN SELECT m.i, p.result FROM unnest(st.gathered_missing) AS m(i)
                                JOIN workflow_steps p ON p.id = par[m.i] LOOP
            arr[slot] := res;
        END LOOP;
        pre_ids := array_append(pre_ids, st.id);
        pre_results := array_append(pre_results, to_jsonb(arr));
    END LOOP;
    WITH ready AS (
        UPDATE workflow_steps s SET state = 'enqueued', enqueued_at = now(), result = NULL, reason = NULL,
                                    finished_at = NULL, gathered = NULL, gathered_missing = NULL
         WHERE s.id = ANY(ids) AND s.state = 'blocked' AND s.remaining <= 0
        RETURNING s.*
    ), r AS (
        -- the parents' results, in order (unnest WITH ORDINALITY: a join, not a search per parent)
        SELECT ready.*, CASE WHEN ready.id = ANY(pre_ids)  -- first: no read of its parents' array
                             THEN ready.args || jsonb_build_array(pre_results[array_position(pre_ids, ready.id)])
                             WHEN cardinality(ready.parents) = 0 THEN ready.args
                             ELSE ready.args || jsonb_build_array(
                                 (SELECT coalesce(jsonb_agg(p.result ORDER BY u.i), '[]'::jsonb)
                                    FROM unnest(ready.parents) WITH ORDINALITY AS u(id, i)
                                    JOIN workflow_steps p ON p.id = u.id)) END AS piped
          FROM ready
    ), wanted AS (
        -- each dedupe key of the log steps once (its first step by position), in key order
        SELECT array_agg(w.dedupe_key ORDER BY w.dedupe_key) AS keys, array_agg(w.id ORDER BY w.dedupe_key) AS ids
          FROM (SELECT DISTINCT ON (r.dedupe_key) r.dedupe_key, r.id FROM r
                 WHERE r.to_log AND r.dedupe_key IS NOT NULL ORDER BY r.dedupe_key, r.position) AS w
    ), took AS (
        -- (no keyed step: wanted's one row has NULL arrays, and job_keys_take is not called)
        SELECT t.key, t.job_id FROM wanted CROSS JOIN LATERAL job_keys_take(wanted.keys, wanted.ids) AS t
         WHERE wanted.keys IS NOT NULL
    ), logged AS (
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, priority, max_attempts, max_lease_losses,
                             message_timestamp, dedupe_key, flow_key, flow)
        SELECT r.id, r.queue, r.actor, r.piped, r.kwargs, r.options, r.priority, r.max_attempts, r.max_lease_losses,
               r.message_timestamp, r.dedupe_key, r.flow_key, r.flow
          FROM r
         WHERE r.to_log AND (r.dedupe_key IS NULL OR EXISTS (SELECT 1 FROM took WHERE took.key = r.dedupe_key
                                                                                 AND took.job_id = r.id))
    ), queued AS (
        INSERT INTO job_queue (id, queue, actor, args, kwargs, options, priority, max_attempts, max_lease_losses,
                               dedupe_key, concurrency_key, message_timestamp, flow_key, flow, status)
        SELECT id, queue, actor, piped, kwargs, options, priority, max_attempts, max_lease_losses, dedupe_key,
               concurrency_key, message_timestamp, flow_key, flow,
               CASE WHEN flow_key IS NULL THEN 'pending' ELSE 'waiting' END
          FROM r WHERE NOT to_log
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) INTO n FROM r;
    RETURN n;
END $$;

-- A job inserted through the jobs view (by SQL: psql, another language) that the log can
-- hold goes to it, as a producer's send would: due now, appended to job_log; with a run_at
-- to come, into job_timers until then (051); its dedupe key taken in job_keys first (052: a
-- key a live job holds refuses the row: nothing is written and the INSERT counts no row);
-- a limit key the log takes in flow_key and flow (053-054, 056). The row keeps its fields (id,
-- queue, actor, body, priority, attempts, max_attempts, lease losses and budget, stamp;
-- created_at is the log's due time: the earlier of its run_at and created_at). A row left
-- without max_attempts is run with its options', else its actor's budget, and keyed late if
-- its actor has limits (logstore.decode, consuming/late_keys.py), as job_queue's claim does.
-- The log holds a 'pending' row with none of job_queue's own columns (an owner, a lease,
-- an error, a result, progress, a start or an end), and limits the log takes (a
-- concurrency_key with no flow_key keeps job_queue's one slot): every other row
-- goes to job_queue or job_history as before. An id a live job has is refused, as
-- job_queue's key refused it. Edits (UPDATE, DELETE) are 036's, all of it kept
-- (jobs_log_write moves a log job into job_queue for the write, 057 moves it back).
CREATE OR REPLACE FUNCTION jobs_view_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h uuid;
BEGIN
    IF TG_OP = 'INSERT' AND NEW.status = 'pending'
       AND num_nonnulls(NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.last_error,
                        NEW.result, NEW.progress, NEW.started_at, NEW.finished_at) = 0
       AND (CASE WHEN NEW.flow_key IS NULL THEN NEW.concurrency_key IS NULL  -- (in parentheses: plpgsql's IF
                 ELSE flow_log_takes(NEW.flow)                               -- would end at the CASE's THEN)
                      AND coalesce(NEW.concurrency_key = NEW.flow_key, true) END) THEN
        IF job_id_live(NEW.id) THEN
            RAISE unique_violation USING MESSAGE = format('a live job has the id %s', NEW.id);
        END IF;
        IF NEW.dedupe_key IS NOT NULL THEN
            SELECT t.job_id INTO h FROM job_keys_take(ARRAY[NEW.dedupe_key], ARRAY[NEW.id]) t;
            IF h IS DISTINCT FROM NEW.id THEN
                RETURN NULL;  -- the key's live holder is the job
            END IF;
        END IF;
        IF NEW.run_at > now() THEN
            INSERT INTO job_timers (id, queue, actor, args, kwargs, options, payload, priority, status, run_at, attempts,
                                    max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at,
                                    dedupe_key, flow_key, flow)
            VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.payload, NEW.priority,
                    'pending', NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_losses, NEW.max_lease_losses,
                    NEW.message_timestamp, NEW.created_at, NEW.dedupe_key, NEW.flow_key, NEW.flow);
        ELSE
            INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                                 lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key,
                                 flow)
            VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.payload, NEW.priority,
                    NEW.attempts, NEW.max_attempts, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp,
                    coalesce(least(NEW.run_at, NEW.created_at), now()), NEW.dedupe_key, NEW.flow_key, NEW.flow);
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.status IN ('pending', 'retryable', 'running', 'waiting') THEN
            IF TG_OP = 'UPDATE' AND NEW.status IN ('pending', 'retryable', 'running', 'waiting') THEN
                UPDATE job_queue SET (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) = (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow) WHERE id = OLD.id;
                RETURN NEW;
            END IF;
            DELETE FROM job_queue WHERE id = OLD.id;
            IF OLD.status = 'running' AND TG_OP = 'UPDATE' AND NEW.status = 'cancelled' THEN
                PERFORM pg_notify('actor_supervisor_cancel', OLD.id::text);  -- its process interrupts it
            END IF;
        ELSE
            IF TG_OP = 'UPDATE' AND NEW.status NOT IN ('pending', 'retryable', 'running', 'waiting') THEN
                UPDATE job_history SET (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) = (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow) WHERE id = OLD.id AND status = OLD.status;
                RETURN NEW;
            END IF;
            DELETE FROM job_history WHERE id = OLD.id AND status = OLD.status;
        END IF;
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    -- A row written by hand with a limit key waits for its key, as the producer's do.
    IF TG_OP = 'INSERT' AND NEW.flow_key IS NOT NULL AND NEW.status = 'pending' THEN
        NEW.status := 'waiting';
    END IF;
    IF NEW.status IN ('pending', 'retryable', 'running', 'waiting') THEN
        INSERT INTO job_queue (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow);
    ELSE
        NEW.finished_at := coalesce(NEW.finished_at, now());
        INSERT INTO job_history (id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow) VALUES (NEW.id, NEW.queue, NEW.actor, NEW.args, NEW.kwargs, NEW.options, NEW.status, NEW.priority, NEW.run_at, NEW.attempts, NEW.max_attempts, NEW.lease_owner, NEW.claimed_at, NEW.heartbeat_at, NEW.lease_expires_at, NEW.dedupe_key, NEW.concurrency_key, NEW.last_error, NEW.result, NEW.progress, NEW.created_at, NEW.started_at, NEW.finished_at, NEW.lease_losses, NEW.max_lease_losses, NEW.message_timestamp, NEW.payload, NEW.flow_key, NEW.flow);
    END IF;
    RETURN NEW;
END $$;
