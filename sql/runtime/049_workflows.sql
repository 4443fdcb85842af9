-- 049: durable workflows (issue 41, item 3): a graph of messages with dependencies, written in
-- one transaction at send (supervisor/workflows.py, broker/producing/workflow.py). A step's
-- message id is its id. Root steps are enqueued at send through the producer; every other step
-- lives only here, 'blocked', until its last parent succeeds: it costs the claims nothing.
--
-- A step is released where its parents' outcomes are written, in the transaction of that write
-- (the fence decides which write is the outcome, so a crash never loses or doubles a release):
-- a row trigger on the rows every end leaves (job_done for the log's jobs, job_history's three
-- partitions for job_queue's) notes a step's end in workflow_ends, and a statement trigger on
-- those tables handles the statement's ends together (workflow_steps_ended): its workflows
-- locked in id order (every path that changes a workflow's steps takes its row first, so two
-- ack batches that end steps of the same workflows queue, never deadlock), each child's count
-- lowered once per statement by the number of its parents that ended there, the children at 0
-- written into job_log or job_queue with their parents' results. A 10,000-step fan-in is one
-- UPDATE of the join per ack batch, not per parent.
--
-- What a plain job pays: job_done's row trigger fires only for a failed or cancelled row or a
-- succeeded one with a result (a workflow step's done row always carries its result: the
-- worker's WorkflowSteps middleware puts it there), and then one primary-key probe of
-- workflow_steps; job_history's only for a row whose own options name a workflow. The
-- statement triggers read one transaction-local setting, set only when a step ended.

CREATE TABLE workflows (
    id          uuid        PRIMARY KEY,
    name        text        NOT NULL,
    policy      text        NOT NULL CHECK (policy IN ('cancel_rest', 'continue')),
    state       text        NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
    steps       integer     NOT NULL,
    succeeded   integer     NOT NULL DEFAULT 0,
    failed      integer     NOT NULL DEFAULT 0,
    cancelled   integer     NOT NULL DEFAULT 0,
    reason      text,       -- the first failure, or the operator's cancel
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX workflows_created ON workflows (created_at DESC, id);
CREATE INDEX workflows_state ON workflows (state, created_at DESC, id);

-- One row per step: its message as the producer would have written it (the columns of
-- job_queue's row; to_log: the producer would have put it in the log), its edges both ways
-- (parents in the order of add(after=[...]): the order of the results its message receives),
-- how many parents have yet to succeed, and its state.
CREATE TABLE workflow_steps (
    id                uuid        PRIMARY KEY,
    workflow          uuid        NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    position          integer     NOT NULL,
    parents           uuid[]      NOT NULL DEFAULT '{}',
    children          uuid[]      NOT NULL DEFAULT '{}',
    remaining         integer     NOT NULL,
    state             text        NOT NULL CHECK (state IN ('blocked', 'enqueued', 'succeeded', 'failed', 'cancelled')),
    to_log            boolean     NOT NULL,
    queue             text        NOT NULL,
    actor             text        NOT NULL,
    args              jsonb       NOT NULL,
    kwargs            jsonb       NOT NULL,
    options           jsonb       NOT NULL,
    priority          integer     NOT NULL DEFAULT 0,
    max_attempts      integer,
    max_lease_losses  integer,
    dedupe_key        text,
    concurrency_key   text,
    message_timestamp bigint,
    flow_key          text,
    flow              jsonb,
    result            jsonb,
    reason            text,
    enqueued_at       timestamptz,
    finished_at       timestamptz
);
CREATE INDEX workflow_steps_workflow ON workflow_steps (workflow, position);

-- The ends of steps noted by the row triggers, read and deleted by the statement trigger of
-- the same statement: only the transaction's own rows are ever visible here (others' are
-- uncommitted, then deleted before they commit). Unlogged: nothing in it outlives a transaction.
CREATE UNLOGGED TABLE workflow_ends (
    step   uuid NOT NULL,
    status text NOT NULL,
    result jsonb,
    why    text
);

-- A workflow's counts and state follow its steps' states (one statement's changes at once).
CREATE FUNCTION workflow_counts() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended bigint;
BEGIN
    WITH d AS (
        SELECT workflow, sum(sign * (state = 'succeeded')::int) AS s, sum(sign * (state = 'failed')::int) AS f,
               sum(sign * (state = 'cancelled')::int) AS c
          FROM (SELECT workflow, state, 1 AS sign FROM new_rows UNION ALL SELECT workflow, state, -1 FROM old_rows) AS x
         GROUP BY workflow
    ), changed AS (
    UPDATE workflows w
       SET succeeded = w.succeeded + d.s, failed = w.failed + d.f, cancelled = w.cancelled + d.c,
           state = CASE WHEN w.succeeded + d.s + w.failed + d.f + w.cancelled + d.c < w.steps THEN 'running'
                        WHEN w.failed + d.f > 0 THEN 'failed'
                        WHEN w.cancelled + d.c > 0 THEN 'cancelled'
                        ELSE 'succeeded' END,
           finished_at = CASE WHEN w.succeeded + d.s + w.failed + d.f + w.cancelled + d.c < w.steps THEN NULL
                              ELSE coalesce(w.finished_at, now()) END
      FROM d
     WHERE w.id = d.workflow AND (d.s <> 0 OR d.f <> 0 OR d.c <> 0)
    RETURNING w.id, w.state
    )  -- a workflow that ended wakes its waiters (Workflow.wait)
    SELECT count(pg_notify('actor_supervisor_workflows', id::text)) INTO ended FROM changed WHERE state <> 'running';
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_counts AFTER UPDATE ON workflow_steps
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION workflow_counts();

-- Write the blocked steps among ``ids`` whose parents have all succeeded as jobs: into the log
-- (the producer would have, at send) or job_queue, each given its parents' results as its last
-- argument (a list in the order of its parents). The caller holds their workflows' rows.
CREATE FUNCTION workflow_release(ids uuid[]) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH ready AS (
        UPDATE workflow_steps s SET state = 'enqueued', enqueued_at = now(), result = NULL, reason = NULL,
                                    finished_at = NULL
         WHERE s.id = ANY(ids) AND s.state = 'blocked' AND s.remaining <= 0
        RETURNING s.*
    ), r AS (
        -- the parents' results, in order (unnest WITH ORDINALITY: a join, not a search per parent)
        SELECT ready.*, CASE WHEN cardinality(ready.parents) = 0 THEN ready.args
                             ELSE ready.args || jsonb_build_array(
                                 (SELECT coalesce(jsonb_agg(p.result ORDER BY u.i), '[]'::jsonb)
                                    FROM unnest(ready.parents) WITH ORDINALITY AS u(id, i)
                                    JOIN workflow_steps p ON p.id = u.id)) END AS piped
          FROM ready
    ), logged AS (
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, priority, max_attempts, max_lease_losses,
                             message_timestamp)
        SELECT id, queue, actor, piped, kwargs, options, priority, max_attempts, max_lease_losses, message_timestamp
          FROM r WHERE to_log
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

-- Cancel the steps among ``ids`` that have not started: blocked ones, and enqueued ones whose
-- job waits (a pending or retryable row of job_queue, a log row with no outcome and no lease),
-- whose jobs are cancelled as an operator's cancel would. Running ones are left to end (their
-- results kept, their children not released once cancelled); their ids are returned. The
-- steps are marked first, so the cancelled jobs' own ends (these triggers again) find them ended.
CREATE FUNCTION workflow_cancel_steps(ids uuid[], why text, who text) RETURNS uuid[] LANGUAGE plpgsql AS $$
DECLARE
    queued uuid[];
    logged uuid[];
    running uuid[];
BEGIN
    SELECT coalesce(array_agg(q.id), '{}') INTO queued FROM (
        SELECT q.id FROM job_queue q JOIN workflow_steps s ON s.id = q.id
         WHERE s.id = ANY(ids) AND s.state = 'enqueued' AND q.status <> 'running'
         ORDER BY q.id FOR UPDATE OF q SKIP LOCKED) AS q;
    SELECT coalesce(array_agg(l.id), '{}') INTO logged
      FROM workflow_steps s JOIN job_log l ON l.id = s.id
     WHERE s.id = ANY(ids) AND s.state = 'enqueued'
       AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
       AND NOT EXISTS (SELECT 1 FROM job_lease x WHERE l.seq = ANY(x.seqs));
    SELECT coalesce(array_agg(s.id), '{}') INTO running FROM workflow_steps s
     WHERE s.id = ANY(ids) AND s.state = 'enqueued' AND NOT s.id = ANY(queued) AND NOT s.id = ANY(logged);
    UPDATE workflow_steps s SET state = 'cancelled', reason = why, finished_at = now(), result = NULL
     WHERE s.id = ANY(ids) AND (s.state = 'blocked' OR s.id = ANY(queued) OR s.id = ANY(logged));
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
    )
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, who, status, 'cancelled', why FROM gone;
    WITH done AS (
        INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt, owner, last_error)
        SELECT l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'cancelled', l.attempts + 1, NULL, why
          FROM job_log l
         WHERE l.id = ANY(logged) AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
        ON CONFLICT (seq, day) DO NOTHING
        RETURNING seq, day, id
    ), passed AS (
        INSERT INTO job_log_cancel (seq, day) SELECT seq, day FROM done
    )
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, who, 'pending', 'cancelled', why FROM done;
    RETURN running;
END $$;

-- Every step reachable from ``ids`` by children (not the steps themselves).
CREATE FUNCTION workflow_descendants(ids uuid[]) RETURNS uuid[] LANGUAGE sql STABLE AS $$
WITH RECURSIVE d(id) AS (
    SELECT unnest(s.children) FROM workflow_steps s WHERE s.id = ANY(ids)
    UNION
    SELECT unnest(s.children) FROM workflow_steps s JOIN d ON s.id = d.id
)
SELECT coalesce(array_agg(id), '{}') FROM d
$$;

-- The ends of this statement's steps (workflow_ends): the first end of an enqueued step is its
-- outcome; a step that succeeded lowers its children's counts and releases those at 0; one
-- that failed or was cancelled cancels, by its workflow's policy, every step not yet started
-- (cancel_rest) or its descendants only (continue).
CREATE FUNCTION workflow_steps_ended() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    e_ids uuid[]; e_status text[]; e_result jsonb[]; e_why text[];
    ok uuid[];
    kids uuid[];
    counts integer[];
    bad record;
    released uuid[];
BEGIN
    PERFORM set_config('supervisor.workflow_ends', '', true);
    WITH e AS (DELETE FROM workflow_ends RETURNING *)
    SELECT array_agg(step), array_agg(status), array_agg(result), array_agg(why)
      INTO e_ids, e_status, e_result, e_why FROM e;
    IF e_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM workflows w
     WHERE w.id IN (SELECT s.workflow FROM workflow_steps s WHERE s.id = ANY(e_ids))
     ORDER BY w.id FOR NO KEY UPDATE;
    -- the first end of a step still enqueued is its outcome
    WITH e AS (
        SELECT DISTINCT ON (id) * FROM unnest(e_ids, e_status, e_result, e_why) AS e(id, status, result, why)
    ), ended AS (
        UPDATE workflow_steps s
           SET state = e.status, result = CASE WHEN e.status = 'succeeded' THEN e.result END, reason = e.why,
               finished_at = now()
          FROM e
         WHERE s.id = ANY(e_ids) AND s.id = e.id AND s.state = 'enqueued'  -- ANY: an index scan, never a walk
        RETURNING s.id, s.state
    )
    SELECT coalesce(array_agg(id) FILTER (WHERE state = 'succeeded'), '{}'),
           coalesce(array_agg(id) FILTER (WHERE state <> 'succeeded'), '{}')
      INTO ok, e_ids FROM ended;
    -- successes: each child's count lowered once, by how many of its parents ended here
    IF cardinality(ok) > 0 THEN
        SELECT array_agg(d.id), array_agg(d.n) INTO kids, counts FROM (
            SELECT c AS id, count(*)::int AS n FROM workflow_steps e, unnest(e.children) AS c
             WHERE e.id = ANY(ok) GROUP BY c) AS d;
        WITH lowered AS (
            UPDATE workflow_steps s SET remaining = s.remaining - d.n
              FROM unnest(kids, counts) AS d(id, n)
             WHERE s.id = ANY(kids) AND s.id = d.id AND s.state = 'blocked'
            RETURNING s.id, s.remaining
        )
        SELECT coalesce(array_agg(id), '{}') INTO released FROM lowered WHERE remaining <= 0;
        IF cardinality(released) > 0 THEN
            PERFORM workflow_release(released);
        END IF;
    END IF;
    -- failures for good and cancels, by their workflow's policy
    FOR bad IN
        SELECT s.workflow, w.policy, array_agg(s.id) AS ids,
               min(format('step %s (%s) %s', s.id, s.actor, coalesce(s.reason, s.state))) AS why
          FROM workflow_steps s JOIN workflows w ON w.id = s.workflow
         WHERE s.id = ANY(e_ids)
         GROUP BY s.workflow, w.policy ORDER BY s.workflow
    LOOP
        UPDATE workflows SET reason = coalesce(reason, bad.why) WHERE id = bad.workflow;
        IF bad.policy = 'cancel_rest' THEN
            PERFORM workflow_cancel_steps(
                (SELECT array_agg(s.id) FROM workflow_steps s
                  WHERE s.workflow = bad.workflow AND s.state IN ('blocked', 'enqueued')),
                'cancelled: ' || bad.why, 'workflow');
        ELSE
            PERFORM workflow_cancel_steps(workflow_descendants(bad.ids), 'cancelled: ' || bad.why, 'workflow');
        END IF;
    END LOOP;
END $$;

-- A job's end, from the row it leaves: noted when the job is a step.
CREATE FUNCTION workflow_step_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workflow_steps s WHERE s.id = NEW.id) THEN
        INSERT INTO workflow_ends (step, status, result, why)
        VALUES (NEW.id, NEW.status, NEW.result,
                CASE WHEN NEW.status <> 'succeeded' THEN pipeline_member_why(NEW.status, NEW.last_error) END);
        PERFORM set_config('supervisor.workflow_ends', 'on', true);
    END IF;
    RETURN NULL;
END $$;

-- After the statement's rows: its steps' ends handled together.
CREATE FUNCTION workflow_ends_flush() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('supervisor.workflow_ends', true) = 'on' THEN
        PERFORM workflow_steps_ended();
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER workflow_step_end AFTER INSERT ON job_done FOR EACH ROW
    WHEN (NEW.status IN ('failed', 'cancelled') OR (NEW.status = 'succeeded' AND NEW.result IS NOT NULL))
    EXECUTE FUNCTION workflow_step_end();
CREATE TRIGGER workflow_step_end AFTER INSERT ON job_history_succeeded
    FOR EACH ROW WHEN (NEW.options ? 'workflow') EXECUTE FUNCTION workflow_step_end();
CREATE TRIGGER workflow_step_end AFTER INSERT ON job_history_failed
    FOR EACH ROW WHEN (NEW.options ? 'workflow') EXECUTE FUNCTION workflow_step_end();
CREATE TRIGGER workflow_step_end AFTER INSERT ON job_history_cancelled
    FOR EACH ROW WHEN (NEW.options ? 'workflow') EXECUTE FUNCTION workflow_step_end();
CREATE TRIGGER workflow_ends_flush AFTER INSERT ON job_done
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_ends_flush();
CREATE TRIGGER workflow_ends_flush AFTER INSERT ON job_history
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_ends_flush();
