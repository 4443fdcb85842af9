-- The job log as the default storage (issue 18): what a job of the log lacked beside one
-- of job_queue.
--
-- 1. The claim reads job_log_cancel after its lock (a session that moved or cancelled a
--    pending row under the same lock is then seen: jobs_log_write below), and reads a
--    window once when it holds fewer rows than asked (every range was read to its end;
--    039's claim read it a second time, finding nothing: a fifth of an idle claim's time),
--    and writes each body from its documents' text.
-- 2. A message id a live job has is not appended again (job_id_live, as job_queue's
--    primary key absorbs a repeated id).
-- 3. A write through the jobs view reaches a job of the log: jobs_log_write moves it into
--    job_queue first (its attempt's done row 'retried', the claims passing it over), then
--    jobs_view_write (035/036) changes, finishes or deletes it there as any job_queue row.

CREATE OR REPLACE FUNCTION job_log_claim(q text, n integer, who text, lease_s double precision, relaxed boolean DEFAULT false)
RETURNS TABLE (batch bigint, seq bigint, day date, id uuid, queue text, actor text, body text,
               attempt integer, max_attempts integer, lease_losses integer, max_lease_losses integer,
               message_timestamp bigint, payload bytea, priority integer, created_at timestamptz)
LANGUAGE plpgsql SET enable_sort = off SET jit = off AS $$
DECLARE
    c job_cursor;
    level integer;
    want integer := n;
    asked integer;
    moved boolean;
    advanced boolean;
    running xid8[];
    picked job_log[];
    k integer;
    b bigint;
    taken job_log[] := '{}';
    cancels boolean;
BEGIN
    IF n < 1 OR EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = q) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('job_log_claim'), hashtext(q));
    -- read after the lock: a job moved or cancelled by a session that held it is passed over
    cancels := EXISTS (SELECT 1 FROM job_log_cancel);
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
            asked := want;
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
                -- as many as asked: the same window again, it may hold more; fewer (counted
                -- before the cancels): every range was read to its end, on to the next window
                CONTINUE WHEN k = asked;
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
    -- the body as one JSON array, written from the three documents' text (a jsonb built of them
    -- first and then written out cost the claim 8 % more)
    SELECT b, l.seq, l.day, l.id, l.queue, l.actor, '[' || l.args::text || ',' || l.kwargs::text || ',' || l.options::text || ']',
           l.attempts + 1, l.max_attempts, l.lease_losses, l.max_lease_losses,
           coalesce(l.message_timestamp, (extract(epoch FROM l.created_at) * 1000)::bigint), l.payload,
           l.priority, l.created_at
      FROM unnest(taken) WITH ORDINALITY AS l
     ORDER BY l.ordinality;
END $$;

-- A write through the jobs view to a job of the log (pending or running, with no row in
-- job_queue): the job moves into job_queue as it is, and the write goes on there (the
-- INSTEAD OF triggers of a view fire in name order: this one before jobs_view_write).
-- Under the claims' lock of its queue, so no claim takes a pending row while it moves:
-- its attempt gets the done row 'retried' (the fence: an ack of a running one counts
-- nothing) and, pending, a job_log_cancel row the claims pass over. A running one keeps
-- its owner and lease in job_queue; a cancel through the view then reaches its process
-- as job_queue's cancels do (jobs_view_write's NOTIFY).
CREATE FUNCTION jobs_log_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    l job_log;
    x job_lease;
BEGIN
    IF OLD.status IN ('pending', 'running') AND NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.id = OLD.id) THEN
        PERFORM pg_advisory_xact_lock(hashtext('job_log_claim'), hashtext(OLD.queue));
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
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobs_log_write INSTEAD OF UPDATE OR DELETE ON jobs
    FOR EACH ROW EXECUTE FUNCTION jobs_log_write();


-- Whether a job with this id is live: in job_queue, or in the log of today or yesterday with
-- no outcome. Two days' partitions, not every day's: every send pays this probe, and a job
-- still waiting in the log after a day (a backlog that old) sent again would run twice.
-- A function so its plan is made once per session (LOG_INSERT_ONE: written out in the
-- statement, its planning over both tables' partitions cost a single send 0.3-0.5 ms).
CREATE FUNCTION job_id_live(i uuid) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM job_queue q WHERE q.id = i)
        OR EXISTS (SELECT 1 FROM job_log l
                    WHERE l.id = i AND l.day BETWEEN current_date - 1 AND current_date
                      AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day));
END $$;
