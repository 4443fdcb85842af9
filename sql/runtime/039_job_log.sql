-- The job log: ready work that no statement ever updates or deletes (issue 18; PgQ's shape,
-- measured in bench/floor_shapes.py as "log": 36-40 us of server CPU a job against 78-100
-- for job_queue's insert, claim UPDATE, DELETE and history copy, and flat under a held
-- xmin horizon). A job's row is appended at enqueue; a claim appends one lease row for its
-- batch and one cursor row; every outcome appends one narrow done row. Nothing here makes a
-- dead tuple on the job path, so a pinned horizon or a long reader leaves nothing behind
-- for the claim to step over. Retention drops whole days (job_log_drop_before).
--
-- The storage layer: supervisor/broker/sql/joblog.py holds its statements (ARCHITECTURE.md,
-- "The job log"). job_queue keeps the work that waits: delays, retries, concurrency and
-- limit keys, dedupe keys.

CREATE SEQUENCE job_log_seq;

-- One row per attempt of a ready job. tx is the producer's transaction: claims read the
-- log in windows of transactions (job_log_claim), never by seq alone, since seqs are
-- taken at insert and a transaction that commits late would land behind a cursor.
-- day is the partition: a row's done row lives in the same day, so retention drops both.
-- attempts: the attempts before this row (a released job is appended again with its count).
CREATE TABLE job_log (
    seq               bigint      NOT NULL DEFAULT nextval('job_log_seq'),
    day               date        NOT NULL DEFAULT current_date,
    tx                xid8        NOT NULL DEFAULT pg_current_xact_id(),
    id                uuid        NOT NULL,
    queue             text        NOT NULL,
    actor             text        NOT NULL,
    args              jsonb       NOT NULL DEFAULT '[]',
    kwargs            jsonb       NOT NULL DEFAULT '{}',
    options           jsonb       NOT NULL DEFAULT '{}',
    payload           bytea,
    priority          integer     NOT NULL DEFAULT 0,
    attempts          integer     NOT NULL DEFAULT 0,
    max_attempts      integer,
    lease_losses      integer     NOT NULL DEFAULT 0,
    max_lease_losses  integer,
    message_timestamp bigint,
    created_at        timestamptz NOT NULL DEFAULT now()
) PARTITION BY RANGE (day);
ALTER SEQUENCE job_log_seq OWNED BY job_log.seq;
-- The claim's read: a level's rows in window order.
CREATE INDEX job_log_claim ON job_log (queue, priority, tx, seq);
-- A done row names its log row by (seq, day): the jobs view's join, the release's lookup.
CREATE UNIQUE INDEX job_log_seq_day ON job_log (seq, day);
CREATE INDEX job_log_id ON job_log (id);

-- One row per ended attempt: its outcome. The primary key is the fence: "finish this
-- attempt if it is still mine" is an INSERT ... ON CONFLICT DO NOTHING, so of an ack, a
-- release by the reaper and a cancel, exactly one writes the attempt's outcome.
-- Statuses: succeeded, failed, cancelled (final); retried, requeued, released (the job
-- went on as another row: in job_queue, or appended to the log again).
CREATE TABLE job_done (
    seq         bigint      NOT NULL,
    day         date        NOT NULL,
    id          uuid        NOT NULL,
    queue       text        NOT NULL,  -- the log row's, kept so the reads of finished jobs need no join
    actor       text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('succeeded', 'failed', 'cancelled', 'retried', 'requeued', 'released')),
    attempt     integer     NOT NULL,
    owner       text,
    created_at  timestamptz NOT NULL,  -- the log row's: the reads' start waits need no join
    claimed_at  timestamptz,
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT now(),
    last_error  text,
    result      jsonb,
    progress    jsonb,
    PRIMARY KEY (seq, day)
) PARTITION BY RANGE (day);
-- Windows of finished_at (the dashboard's last hour): rows arrive in finished_at order, so
-- a block range index serves them at almost no cost per row. A job page and the Errors
-- page find a finished job by its id; the jobs list pages through (created_at, id), as
-- job_history's indexes serve them (each a btree entry per job: the reads stay bounded).
CREATE INDEX job_done_finished ON job_done USING brin (finished_at);
CREATE INDEX job_done_id ON job_done (id);
CREATE INDEX job_done_created ON job_done (created_at, id);

-- Rows appended wake the consumers of their queues, as job_queue's inserts do (one NOTIFY
-- per queue and statement).
-- A level's first rows get it a cursor (its window: nothing seen yet), so every level has
-- one and the views find a level's pending rows from its cursor, never by scanning the log.
-- Two producers may both write one: the claims read the newest, and both mean the same.
CREATE FUNCTION job_log_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_cursor (queue, priority, lo, hi, at_tx, at_seq)
    SELECT n.queue, n.priority, '1:1:', '1:1:', '0', 0 FROM (SELECT DISTINCT queue, priority FROM new_rows) AS n
     WHERE NOT EXISTS (SELECT 1 FROM job_cursor c WHERE c.queue = n.queue AND c.priority = n.priority);
    PERFORM pg_notify('actor_supervisor_jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_rows) AS q;
    RETURN NULL;
END $$;
CREATE TRIGGER job_log_notify_insert AFTER INSERT ON job_log
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION job_log_notify_insert();

-- One row per claimed batch: whose it is, until when, which log rows. The owner's beat
-- renews all its rows in one statement; the batch's row goes with the finish of its last
-- job. Undone seqs of an expired or dead owner's rows are released (their done row
-- 'released', the job appended again).
CREATE TABLE job_lease (
    batch      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner      text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    renewed_at timestamptz NOT NULL DEFAULT now(),  -- the owner's last renewal (the jobs view's heartbeat_at)
    expires_at timestamptz NOT NULL,
    seqs       bigint[]    NOT NULL,
    days       date[]      NOT NULL
);
CREATE INDEX job_lease_owner ON job_lease (owner);
CREATE INDEX job_lease_expiry ON job_lease (expires_at);

-- Where the claims of a queue's priority level are: the window of transactions (visible in
-- hi, not in lo) and the last row taken in it. Appended, never updated: under a held
-- horizon one row updated by every claim keeps every version (24,000 of them doubled a
-- claim's time), while the newest of appended rows is one step of a backward index read.
CREATE TABLE job_cursor (
    at       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue    text        NOT NULL,
    priority integer     NOT NULL,
    lo       pg_snapshot NOT NULL,
    hi       pg_snapshot NOT NULL,
    at_tx    xid8        NOT NULL,
    at_seq   bigint      NOT NULL,
    drained  boolean     NOT NULL DEFAULT false,  -- the claim that wrote it read its window to the end
    made_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_cursor_newest ON job_cursor (queue, priority, at DESC);
-- A claim reads only the newest row of its level; the upkeep deletes the older ones
-- (LOG_PRUNE_CURSORS), a few narrow rows a second, none of which a claim walks: the
-- index is read from its newest entry down.

-- One day of the log and of its done rows, created ahead by the upkeep. Plain tables
-- attached after (CREATE ... PARTITION OF would lock the parent against every reader).
CREATE FUNCTION job_log_add_day(d date) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['job_log', 'job_done'] LOOP
        IF to_regclass(format('%s_d%s', t, to_char(d, 'YYYYMMDD'))) IS NULL THEN
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS, CHECK (day >= %L AND day < %L))',
                           format('%s_d%s', t, to_char(d, 'YYYYMMDD')), t, d, d + 1);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                           t, format('%s_d%s', t, to_char(d, 'YYYYMMDD')), d, d + 1);
        END IF;
    END LOOP;
END $$;

-- A row of a day with no partition yet (the upkeep fell behind) lands here; retention
-- moves what is left of it into a day.
CREATE TABLE job_log_default PARTITION OF job_log DEFAULT;
CREATE TABLE job_done_default PARTITION OF job_done DEFAULT;

DO $$
BEGIN
    FOR i IN -1..2 LOOP
        PERFORM job_log_add_day(current_date + i);
    END LOOP;
END $$;

-- A pending job of the log that was cancelled: its done row is written, and its (seq, day)
-- here, so the claims pass it over. A small table (cancels of pending jobs are few, and
-- retention deletes them with their day): a claim's check is a probe of nearly nothing.
CREATE TABLE job_log_cancel (
    seq bigint NOT NULL,
    day date   NOT NULL,
    PRIMARY KEY (seq, day)
);

-- The claim: up to n rows of queue q for owner who, highest priority level first, each
-- level in the order of its windows of transactions, none while the queue is paused.
-- Claims of a queue take turns (an advisory lock until commit): a window is read by one
-- claim at a time, a few index entries each, never a row locked by another. The lease row
-- is written in the same statement, so a claim that commits holds what it returned.
--
-- A level's window: the rows of transactions visible in hi and not in lo, read as a range
-- from lo's xmax plus lookups of lo's running transactions, never from lo's xmin, which a
-- transaction held open would hold back (the range would then cover every row since). A
-- transaction that commits after hi falls in a later window, never behind the cursor.
-- The rows are read whole once (into an array): no second lookup of each by its key.
-- enable_sort off: a window's rows come in index order, up to what the claim takes; the
-- planner, whose statistics cannot know how many rows one transaction wrote (20,000 in one
-- COPY are a range of 3 xids), would otherwise sort the whole window at every claim.
-- jit off: a plan with a sort left in it (a few running transactions' rows) is then priced
-- above jit_above_cost, and compiling it took 300 ms a claim.
CREATE FUNCTION job_log_claim(q text, n integer, who text, lease_s double precision, relaxed boolean DEFAULT false)
RETURNS TABLE (batch bigint, seq bigint, day date, id uuid, queue text, actor text, body text,
               attempt integer, max_attempts integer, lease_losses integer, max_lease_losses integer,
               message_timestamp bigint, payload bytea, priority integer, created_at timestamptz)
LANGUAGE plpgsql SET enable_sort = off SET jit = off AS $$
DECLARE
    c job_cursor;
    level integer;
    want integer := n;
    moved boolean;
    advanced boolean;
    running xid8[];
    picked job_log[];
    k integer;
    b bigint;
    taken job_log[] := '{}';
    cancels boolean := EXISTS (SELECT 1 FROM job_log_cancel);
BEGIN
    IF n < 1 OR EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = q) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('job_log_claim'), hashtext(q));
    IF relaxed THEN
        -- an idle claim's commit does not wait for its WAL flush (as sql.CLAIM's): a claim
        -- lost in a server crash only leaves its rows leased until the lease expires
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    -- the queue's levels, highest first: one index descent each (a loose index scan)
    -- (every level has a cursor from its first rows: the trigger below)
    level := (SELECT max(k.priority) FROM job_cursor k WHERE k.queue = q);
    WHILE level IS NOT NULL AND want > 0 LOOP
        SELECT * INTO c FROM job_cursor k WHERE k.queue = q AND k.priority = level ORDER BY k.at DESC LIMIT 1;
        IF NOT FOUND THEN
            c.queue := q; c.priority := level; c.lo := '1:1:'; c.hi := pg_current_snapshot();
            c.at_tx := '0'; c.at_seq := 0;
        END IF;
        moved := false;
        advanced := false;
        IF c.drained THEN  -- the last claim read this window to its end: on to the next at once
            c.lo := c.hi; c.hi := pg_current_snapshot(); c.at_tx := '0'; c.at_seq := 0;
            advanced := true;
        END IF;
        LOOP
            running := ARRAY(SELECT pg_snapshot_xip(c.lo));
            SELECT array_agg(w.r ORDER BY w.tx, w.seq) INTO picked
              -- three index ranges, none read from before the cursor's place (a row comparison
              -- beside another bound on tx made the index read from the level's first row,
              -- every claim): the rest of the cursor's own transaction, the later ones, and
              -- (below) those lo saw running
              FROM ((SELECT l AS r, l.tx, l.seq FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND l.tx = c.at_tx AND l.seq > c.at_seq
                        AND c.at_tx >= pg_snapshot_xmax(c.lo) AND pg_visible_in_snapshot(l.tx, c.hi)
                      ORDER BY l.seq LIMIT want)
                    UNION ALL
                    (SELECT l AS r, l.tx, l.seq FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND l.tx >= pg_snapshot_xmax(c.lo) AND l.tx > c.at_tx
                        AND l.tx < pg_snapshot_xmax(c.hi) AND pg_visible_in_snapshot(l.tx, c.hi)
                      ORDER BY l.tx, l.seq LIMIT want)
                    UNION ALL
                    (SELECT x.* FROM unnest(running) AS t(tx) CROSS JOIN LATERAL (
                         SELECT l AS r, l.tx, l.seq FROM job_log l
                          WHERE l.queue = q AND l.priority = level AND l.tx = t.tx
                            AND l.seq > CASE WHEN t.tx = c.at_tx THEN c.at_seq ELSE 0 END
                            AND pg_visible_in_snapshot(l.tx, c.hi)
                          ORDER BY l.seq LIMIT want) x
                      WHERE t.tx >= c.at_tx
                      ORDER BY 2, 3 LIMIT want)
                    ORDER BY 2, 3 LIMIT want) w;
            IF picked IS NOT NULL THEN
                k := cardinality(picked);
                c.at_tx := picked[k].tx; c.at_seq := picked[k].seq;
                moved := true;
                IF cancels THEN  -- a pending job cancelled is passed over
                    picked := ARRAY(SELECT picked[i] FROM generate_subscripts(picked, 1) AS i
                                     WHERE NOT EXISTS (SELECT 1 FROM job_log_cancel x
                                                        WHERE x.seq = (picked[i]).seq AND x.day = (picked[i]).day)
                                     ORDER BY i);
                END IF;
                taken := taken || picked;
                want := n - cardinality(taken);
                EXIT WHEN want = 0;
                CONTINUE;  -- the same window again: it may hold more
            END IF;
            EXIT WHEN advanced;
            -- the window is exhausted: on to the transactions committed since
            c.lo := c.hi; c.hi := pg_current_snapshot(); c.at_tx := '0'; c.at_seq := 0;
            advanced := true;
        END LOOP;
        -- written only when the claim took rows of the level: an idle queue's claims
        -- append nothing (the next one moves on from the last written window)
        IF moved THEN  -- drained: the claim still wanted rows when it left the level
            INSERT INTO job_cursor (queue, priority, lo, hi, at_tx, at_seq, drained)
            VALUES (q, level, c.lo, c.hi, c.at_tx, c.at_seq, want > 0);
        END IF;
        level := (SELECT max(k.priority) FROM job_cursor k WHERE k.queue = q AND k.priority < level);
    END LOOP;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO job_lease (owner, expires_at, seqs, days)
    SELECT who, now() + lease_s * interval '1 second', array_agg(t.seq ORDER BY t.ordinality), array_agg(t.day ORDER BY t.ordinality)
      FROM unnest(taken) WITH ORDINALITY AS t
    RETURNING job_lease.batch INTO b;
    RETURN QUERY
    SELECT b, l.seq, l.day, l.id, l.queue, l.actor, jsonb_build_array(l.args, l.kwargs, l.options)::text,
           l.attempts + 1, l.max_attempts, l.lease_losses, l.max_lease_losses,
           coalesce(l.message_timestamp, (extract(epoch FROM l.created_at) * 1000)::bigint), l.payload,
           l.priority, l.created_at
      FROM unnest(taken) WITH ORDINALITY AS l
     ORDER BY l.ordinality;
END $$;

-- Retention: drop every day of the log before the cutoff, with its done rows, as two
-- DROP TABLEs (no DELETE, no vacuum after). Before a day goes, its rows with no outcome
-- are appended to today (a job waits as long as it must), and its failed and cancelled
-- jobs are archived into job_history, where they are kept as long as that status's
-- retention says (the dead letters outlive the log's days). A day a lease still names is
-- left for a later round; a partition another session holds too (the caller's
-- lock_timeout). Returns how many log rows went (the planner's count, not a scan).
CREATE FUNCTION job_log_drop_before(cutoff date) RETURNS bigint LANGUAGE plpgsql AS $$
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
               x.result, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.payload
          FROM job_done x JOIN job_log l ON l.seq = x.seq AND l.day = x.day
         WHERE x.day = part.d AND x.status IN ('failed', 'cancelled');
        DELETE FROM job_log_cancel WHERE day = part.d;
        EXECUTE format('DROP TABLE %I, %I', part.relname, 'job_done_d' || to_char(part.d, 'YYYYMMDD'));
        dropped := dropped + part.rows;
    END LOOP;
    RETURN dropped;
END $$;

-- The views read the log's jobs too, with the old columns, each part from what bounds it:
--   running: the leases (a few rows), their rows looked up;
--   pending: per level, from its newest cursor, the rows no claim took yet (a range from its
--            window's lo xmax plus lo's running transactions: the backlog and one window,
--            never the whole log), less those cancelled;
--   finished: the done rows with a final status (queue, actor and times on them: counting
--            or grouping them reads no log row; the body is looked up per row, and only
--            where a read asks for it). Attempts that went on as another row (retried,
--            requeued, released) are not shown: their next row is.
-- A pending job is due at its creation.
CREATE FUNCTION job_log_pending() RETURNS SETOF job_log LANGUAGE sql STABLE AS $$
    SELECT l.*
      FROM (SELECT DISTINCT ON (k.queue, k.priority) k.* FROM job_cursor k ORDER BY k.queue, k.priority, k.at DESC) c
     CROSS JOIN LATERAL (
        SELECT l.* FROM job_log l
         WHERE l.queue = c.queue AND l.priority = c.priority AND l.tx >= pg_snapshot_xmax(c.lo)
        UNION ALL
        SELECT l.* FROM unnest(ARRAY(SELECT pg_snapshot_xip(c.lo))) AS x(tx)
          JOIN job_log l ON l.queue = c.queue AND l.priority = c.priority AND l.tx = x.tx) l
     WHERE NOT (pg_visible_in_snapshot(l.tx, c.hi) AND (l.tx, l.seq) <= (c.at_tx, c.at_seq))
       AND NOT EXISTS (SELECT 1 FROM job_log_cancel x WHERE x.seq = l.seq AND x.day = l.day)
$$;

CREATE OR REPLACE VIEW jobs AS
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow FROM job_queue
UNION ALL
SELECT id, queue, actor, args, kwargs, options, status, priority, run_at, attempts, max_attempts, lease_owner, claimed_at, heartbeat_at, lease_expires_at, dedupe_key, concurrency_key, last_error, result, progress, created_at, started_at, finished_at, lease_losses, max_lease_losses, message_timestamp, payload, flow_key, flow FROM job_history
UNION ALL
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'running', l.priority, l.created_at, l.attempts + 1, l.max_attempts,
       x.owner, x.claimed_at, x.renewed_at, x.expires_at, NULL::text, NULL::text, NULL::text, NULL::jsonb, NULL::jsonb,
       l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.payload,
       NULL::text, NULL::jsonb
  FROM (SELECT * FROM job_lease ORDER BY batch) x  -- in key order: readable by its index (a planner that
                                                   -- prices the table as large finds it so)
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
-- one part per final status, its status a constant: a read of live statuses (status IN
-- ('pending', ...)) reads no done row at all, as job_history's partitions by status do
SELECT d.id, d.queue, d.actor,
       (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       'succeeded'::text,
       (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       d.created_at, d.attempt,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       d.owner, d.claimed_at, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, d.last_error, d.result,
       d.progress, d.created_at, d.started_at, d.finished_at,
       (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       NULL::text, NULL::jsonb
  FROM job_done d
 WHERE d.status = 'succeeded'
UNION ALL
SELECT d.id, d.queue, d.actor,
       (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       'failed'::text,
       (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       d.created_at, d.attempt,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       d.owner, d.claimed_at, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, d.last_error, d.result,
       d.progress, d.created_at, d.started_at, d.finished_at,
       (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       NULL::text, NULL::jsonb
  FROM job_done d
 WHERE d.status = 'failed'
UNION ALL
SELECT d.id, d.queue, d.actor,
       (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       'cancelled'::text,
       (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       d.created_at, d.attempt,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       d.owner, d.claimed_at, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, d.last_error, d.result,
       d.progress, d.created_at, d.started_at, d.finished_at,
       (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day),
       NULL::text, NULL::jsonb
  FROM job_done d
 WHERE d.status = 'cancelled';

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
  FROM job_log_pending() l;

-- Finished jobs of both stores, with the columns the dashboard's windows read (reads.py,
-- actor_reads.py, the recorder): job_history's rows (its partitions pruned by a window of
-- finished_at) and the log's final done rows (a block range index of finished_at each).
CREATE VIEW jobs_finished AS
SELECT id, queue, actor, status, lease_owner, created_at, run_at, started_at, finished_at, last_error, attempts
  FROM job_history
UNION ALL
SELECT id, queue, actor, status, owner, created_at, created_at, started_at, finished_at, last_error, attempt
  FROM job_done
 WHERE status IN ('succeeded', 'failed', 'cancelled');

-- The capacity plan counts the log's finished jobs too (036's view, over jobs_finished).
CREATE OR REPLACE VIEW v_queue_capacity AS
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE status IN ('pending', 'waiting') AND run_at <= now())   AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable', 'waiting') AND run_at > now())
                                                                                         AS scheduled,
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
      FROM jobs_finished
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
