-- 053: jobs whose limit key carries only a concurrency limit live in the log (issue 38).
--
-- Before, every keyed job lived in job_queue as a 'waiting' row, and the keyed claim read
-- every key's gate at each claim (O(keys) a claim; under a pinned horizon each gate's slot
-- rows grew a HOT chain: 19-26 s start p99 at 800 jobs/s over 50 keys). Now a job whose key
-- has a concurrency limit and nothing else (no rate, quota or weight; no dedupe key) is
-- appended to job_log with its key and limit (flow_key, flow: nullable, NULL for a plain
-- job), and the work is O(1) a job, on its own key only (Solid Queue's blocked executions):
--
--   claim    job_log_claim takes a keyed row as any; job_log_gate then gives it a free slot
--            of its key (046's job_concurrency rows, locked FOR UPDATE SKIP LOCKED, never
--            waited on), or parks it in job_blocked (the cursor passes on: no claim reads
--            it again). A row handed a slot (flow_held) is not gated again.
--   end      every end of a hold (a done row with the key, any status but 'released':
--            the ack, a failure, a retry waiting for its backoff, a requeue, a cancel, the
--            lease-loss budget) fires job_done_slot_end: the slot goes to the key's oldest
--            parked job (job_slot_hand: its parked attempt ends 'requeued', the job is
--            appended to the log again holding the slot), else it is freed. A release
--            (lease lost) appends the job again holding its slot.
--   sweep    job_blocked_sweep (the workers' upkeep, every second) hands the free slots of
--            keys with parked jobs, and the slots of jobs that ended without saying so.
--
-- The statements and the invariants: supervisor/broker/sql/joblog.py, slots.py;
-- ARCHITECTURE.md, 'Storage "log"' and 'Flow control'.

-- flow_held: the row holds a slot of its key (handed one, or released holding it): its claim
-- does not gate it. flow_slot: where that slot's row is (its ctid, a hint: see job_done).
ALTER TABLE job_log ADD COLUMN flow_key text, ADD COLUMN flow jsonb, ADD COLUMN flow_held boolean,
                    ADD COLUMN flow_slot tid;
ALTER TABLE job_timers ADD COLUMN flow_key text, ADD COLUMN flow jsonb;
-- The key of a job that may hold a slot, on each of its done rows: the trigger's WHEN
-- reads it, so a plain job's outcome pays nothing.
-- flow_slot: the ctid of the slot row it holds, as its claim or hand-off left it (nothing
-- else updates a held slot row, and a lock does not move it): its end finds the row by it,
-- where a lookup by key walks every version a pinned horizon keeps of the key's slot rows.
-- A hint only: the row's key and holder are checked, and a miss looks the slot up by key.
ALTER TABLE job_done ADD COLUMN flow_key text, ADD COLUMN flow_slot tid;
-- Each row's key, where the batch has a keyed row (NULL else): LOG_FINISH and LOG_ACK
-- write it on the done rows from the lease they read already.
ALTER TABLE job_lease ADD COLUMN keys text[], ADD COLUMN slots tid[];
-- The position (job_blocked.pos) of the last job this slot was handed to: the key's floor
-- (the hand-off reads parked rows after the highest of its slots', so the dead entries a
-- pinned horizon keeps of the rows handed since are passed over inside the index).
ALTER TABLE job_concurrency ADD COLUMN handed bigint;

-- A parked job: its log row (seq, day), which has no outcome and no lease while here. A
-- row is inserted once (the claim that parks it) and deleted once (its hand-off, its end).
CREATE TABLE job_blocked (
    seq       bigint      NOT NULL,
    day       date        NOT NULL,
    key       text        NOT NULL,
    pos       bigint      NOT NULL GENERATED ALWAYS AS IDENTITY,
    id        uuid        NOT NULL,
    queue     text        NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (seq, day)
);
-- A key's parked jobs in the order they were parked (first in, first out).
CREATE INDEX job_blocked_key ON job_blocked (key, pos);
CREATE INDEX job_blocked_id ON job_blocked (id);

-- Whether the job holding a slot still runs or may: a live row in job_queue, or a row of the
-- log with no outcome (the sweep frees a slot whose job ended without freeing it: an edit
-- through the jobs view, a workflow's cancel, whose done rows carry no key).
CREATE FUNCTION job_slot_live(i uuid) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM job_queue q WHERE q.id = i)
        OR EXISTS (SELECT 1 FROM job_log l WHERE l.id = i
                      AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day))
$$;

-- The claim's gate for keyed rows (its caller holds the queue's claim lock): each key in key
-- order; its slot rows below its limit (the row's flow 'c', or the operator's override of it)
-- locked FOR UPDATE SKIP LOCKED, every one of them (a free one is taken for the key's next
-- row; locking the taken ones too means a job's end that frees one waits for this claim's
-- commit and then sees the rows it parked: no parked row is left behind a free slot); a
-- slot with no row yet inserted, under a try lock per key (two claims never wait on each
-- other's insert). The key's rows that got no slot are parked in job_blocked. Returns the
-- rows that may run, in their order. Reads one key's few slot rows per key in the batch.
CREATE FUNCTION job_log_gate(cand job_log[]) RETURNS job_log[] LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    k text;
    lim integer;
    ids uuid[];
    ov jsonb;
    s record;
    i integer;
    got uuid[] := '{}';
    tids tid[] := '{}';  -- the slot row each of got took (its ctid after the take)
    t tid;
BEGIN
    FOR k IN SELECT DISTINCT (cand[j]).flow_key FROM generate_subscripts(cand, 1) AS j
              WHERE (cand[j]).flow_key IS NOT NULL AND (cand[j]).flow_held IS NOT TRUE ORDER BY 1 LOOP
        ids := ARRAY(SELECT (cand[j]).id FROM generate_subscripts(cand, 1) AS j
                      WHERE (cand[j]).flow_key = k AND (cand[j]).flow_held IS NOT TRUE ORDER BY j);
        lim := (SELECT ((cand[j]).flow->>'c')::int FROM generate_subscripts(cand, 1) AS j
                 WHERE (cand[j]).flow_key = k AND (cand[j]).flow_held IS NOT TRUE ORDER BY j LIMIT 1);
        ov := (SELECT b.override FROM rate_limiter_state b WHERE b.key = k);
        IF ov ? 'c' THEN
            lim := (ov->>'c')::int;  -- a JSON null lifts the limit
        END IF;
        IF lim IS NULL THEN
            got := got || ids;
            CONTINUE;
        END IF;
        i := 1;
        -- (each taken by its ctid: under a pinned horizon a slot row's versions form a chain
        -- that a lookup by key walks from its first; the row is locked, so its ctid holds)
        FOR s IN SELECT c.ctid AS tid, c.slot, c.job_id FROM job_concurrency c WHERE c.key = k AND c.slot < lim
                  ORDER BY c.slot FOR UPDATE SKIP LOCKED LOOP
            IF s.job_id IS NULL AND i <= cardinality(ids) THEN
                UPDATE job_concurrency c SET job_id = ids[i], freed_at = NULL WHERE c.ctid = s.tid RETURNING c.ctid INTO t;
                got := got || ids[i];
                tids := tids || t;
                i := i + 1;
            END IF;
        END LOOP;
        IF i <= cardinality(ids) AND pg_try_advisory_xact_lock(hashtext('job_concurrency'), hashtext(k)) THEN
            -- slots with no row yet (a key's first jobs, or rows the upkeep pruned)
            WITH m AS (
                SELECT g, row_number() OVER (ORDER BY g) AS r FROM generate_series(0, lim - 1) AS g
                 WHERE NOT EXISTS (SELECT 1 FROM job_concurrency c WHERE c.key = k AND c.slot = g)
            ), ins AS (
                INSERT INTO job_concurrency (key, slot, job_id)
                SELECT k, m.g, ids[i - 1 + m.r] FROM m WHERE i - 1 + m.r <= cardinality(ids) ORDER BY m.g
                ON CONFLICT DO NOTHING
                RETURNING job_id, ctid
            )
            SELECT got || coalesce(array_agg(ins.job_id), '{}'), tids || coalesce(array_agg(ins.ctid), '{}')
              INTO got, tids FROM ins;
        END IF;
    END LOOP;
    -- the rest wait for a slot: parked, in their order (first in, first out)
    WITH parked AS (
        INSERT INTO job_blocked (seq, day, key, id, queue)
        SELECT (cand[j]).seq, (cand[j]).day, (cand[j]).flow_key, (cand[j]).id, (cand[j]).queue
          FROM generate_subscripts(cand, 1) AS j
         WHERE (cand[j]).flow_key IS NOT NULL AND (cand[j]).flow_held IS NOT TRUE AND NOT ((cand[j]).id = ANY(got))
         ORDER BY j
        RETURNING id, key
    )
    -- the move written as every move is (job_events): why the job waits
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, 'claim', 'pending', 'waiting', 'concurrency key ' || key || ' full: parked until a job of it ends'
      FROM parked;
    -- (a row that took a slot carries its ctid in flow_slot, for its lease: not written to the log)
    FOR i IN 1 .. cardinality(cand) LOOP
        IF cand[i].flow_key IS NOT NULL AND cand[i].flow_held IS NOT TRUE AND cand[i].id = ANY(got) THEN
            cand[i].flow_slot := tids[array_position(got, cand[i].id)];
        END IF;
    END LOOP;
    RETURN ARRAY(SELECT cand[j] FROM generate_subscripts(cand, 1) AS j
                  WHERE (cand[j]).flow_key IS NULL OR (cand[j]).flow_held OR (cand[j]).id = ANY(got)
                  ORDER BY j);
END $$;

-- A slot goes to its key k's oldest parked job after position fl (NULL: from the first), the
-- caller holding the slot's row lock (slot_tid: the row's ctid, which the lock keeps). A
-- parked row another hand-off holds is passed over (SKIP LOCKED: never waited on); one that
-- ended meanwhile (a cancel's done row: the parked attempt's fence) is dropped and the next
-- taken. The parked attempt ends 'requeued' (no key on that done row: it held nothing) and
-- the job is appended to the log again as it was, holding the slot (flow_held: its claim
-- does not gate it again; its created_at kept). Returns the job handed the slot, NULL if
-- none waits.
-- (Index reads only, whatever the statistics say: job_blocked and job_concurrency hold a few
-- live rows and, under a pinned horizon, thousands of dead versions, which an ANALYZE can
-- make look cheap to scan whole; a scan here would read every row parked since the pin at
-- every job's end.)
CREATE FUNCTION job_slot_hand(k text, slot_tid tid, fl bigint) RETURNS uuid LANGUAGE plpgsql
SET enable_seqscan = off SET enable_sort = off AS $$
DECLARE
    b job_blocked;
    l job_log;
    t tid;
    sn integer := (SELECT c.slot FROM job_concurrency c WHERE c.ctid = slot_tid);
    ov jsonb := (SELECT r.override FROM rate_limiter_state r WHERE r.key = k);
    lim integer;
BEGIN
    LOOP
        SELECT * INTO b FROM job_blocked x WHERE x.key = k AND x.pos > coalesce(fl, 0)
         ORDER BY x.pos LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        fl := b.pos;
        SELECT * INTO l FROM job_log j WHERE j.seq = b.seq AND j.day = b.day;
        -- a slot at or past the key's limit (an operator lowered it: the override's c) goes
        -- free, and its parked job waits for a slot under the limit
        lim := CASE WHEN ov ? 'c' THEN (ov->>'c')::int ELSE (l.flow->>'c')::int END;
        IF l.id IS NOT NULL AND sn >= lim THEN
            RETURN NULL;
        END IF;
        DELETE FROM job_blocked x WHERE x.seq = b.seq AND x.day = b.day;
        CONTINUE WHEN l.id IS NULL;  -- its day was dropped (retention appended it again)
        INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt)
        VALUES (l.seq, l.day, l.id, l.queue, l.actor, l.created_at, 'requeued', l.attempts + 1)
        ON CONFLICT (seq, day) DO NOTHING;
        CONTINUE WHEN NOT FOUND;
        UPDATE job_concurrency c SET job_id = l.id, freed_at = NULL, handed = b.pos WHERE c.ctid = slot_tid
        RETURNING c.ctid INTO t;
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                             lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
                             flow_held, flow_slot)
        VALUES (l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, l.priority, l.attempts, l.max_attempts,
                l.lease_losses, l.max_lease_losses, l.message_timestamp, l.created_at, l.dedupe_key, l.flow_key, l.flow,
                true, t);
        INSERT INTO job_events (job_id, who, from_status, to_status, reason)
        VALUES (l.id, 'hand-off', 'waiting', 'pending', 'handed a slot of concurrency key ' || k);
        RETURN l.id;
    END LOOP;
END $$;

-- A keyed job's hold ends where its done row is written (one place for every writer: the
-- worker's LOG_FINISH / LOG_ACK, the reaper's LOG_RELEASE at the lease-loss budget,
-- LOG_CANCEL, LOG_FLUSH). A parked row that ended (a cancel, a flush) leaves job_blocked
-- (SKIP LOCKED: one a hand-off holds is the hand-off's to drop). The slot the job holds is
-- locked (a claim holding it is waited for: a claim waits on nothing once it holds slots,
-- so this cannot deadlock; this statement then sees what that claim parked: a volatile
-- function's statements each take a fresh snapshot) and handed to the oldest parked job
-- after the slot's floor (the position it was last handed), else freed.
CREATE FUNCTION job_done_slot_end() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off SET enable_sort = off AS $$
DECLARE
    t tid;
    fl bigint;
BEGIN
    PERFORM 1 FROM job_blocked y WHERE y.seq = NEW.seq AND y.day = NEW.day FOR UPDATE SKIP LOCKED;
    IF FOUND THEN
        DELETE FROM job_blocked y WHERE y.seq = NEW.seq AND y.day = NEW.day;
    END IF;
    -- (the slot's own last hand-off is the floor: a lower bound of the key's, read with the lock)
    -- (by its ctid, the hint its claim or hand-off left; else by key)
    IF NEW.flow_slot IS NOT NULL THEN
        SELECT c.ctid, c.handed INTO t, fl FROM job_concurrency c
         WHERE c.ctid = NEW.flow_slot AND c.key = NEW.flow_key AND c.job_id = NEW.id FOR UPDATE;
    END IF;
    IF t IS NULL THEN
        SELECT c.ctid, c.handed INTO t, fl FROM job_concurrency c WHERE c.key = NEW.flow_key AND c.job_id = NEW.id
           FOR UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    END IF;
    IF job_slot_hand(NEW.flow_key, t, fl) IS NULL THEN
        UPDATE job_concurrency c SET job_id = NULL, freed_at = now() WHERE c.ctid = t;
    END IF;
    RETURN NULL;
END $$;
-- 'released': the job is appended again holding its slot (LOG_RELEASE).
CREATE TRIGGER job_done_slot_end AFTER INSERT ON job_done FOR EACH ROW
    WHEN (NEW.flow_key IS NOT NULL AND NEW.status <> 'released')
    EXECUTE FUNCTION job_done_slot_end();

-- The upkeep's sweep (every second, any worker): the free slots of keys with parked jobs,
-- and the slots whose job is no longer live (it ended by a path that writes no key: an edit
-- through the jobs view, a workflow's cancel; a job_queue row of the same key, whose end
-- frees its slot without a hand-off), each locked SKIP LOCKED, checked again, and handed
-- from the key's first parked row (no floor: a row parked late behind it is found here);
-- a key's missing slot rows below its oldest parked job's limit are made and handed. Closes
-- the one window the locks leave: a claim that met a slot row being freed (SKIP LOCKED) and
-- parked its row. Returns how many jobs it handed a slot.
CREATE FUNCTION job_blocked_sweep() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s record;
    k text;
    lim integer;
    g integer;
    made tid;
    handed integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_blocked) THEN
        RETURN 0;
    END IF;
    FOR s IN SELECT c.key, c.slot, c.job_id, NULL::tid AS tid FROM job_concurrency c
              WHERE EXISTS (SELECT 1 FROM job_blocked x WHERE x.key = c.key)
                AND (c.job_id IS NULL OR NOT job_slot_live(c.job_id))
              ORDER BY c.key, c.slot LOOP
        s.tid := NULL;
        SELECT c.ctid INTO s.tid FROM job_concurrency c WHERE c.key = s.key AND c.slot = s.slot
           AND c.job_id IS NOT DISTINCT FROM s.job_id AND (c.job_id IS NULL OR NOT job_slot_live(c.job_id))
           FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN s.tid IS NULL;
        IF job_slot_hand(s.key, s.tid, NULL) IS NULL THEN
            UPDATE job_concurrency c SET job_id = NULL, freed_at = coalesce(c.freed_at, now()) WHERE c.ctid = s.tid;
        ELSE
            handed := handed + 1;
        END IF;
    END LOOP;
    FOR k, lim IN SELECT DISTINCT ON (x.key) x.key, (l.flow->>'c')::int FROM job_blocked x
                   JOIN job_log l ON l.seq = x.seq AND l.day = x.day ORDER BY x.key, x.pos LOOP
        CONTINUE WHEN lim IS NULL OR NOT pg_try_advisory_xact_lock(hashtext('job_concurrency'), hashtext(k));
        FOR g IN SELECT t FROM generate_series(0, lim - 1) AS t
                  WHERE NOT EXISTS (SELECT 1 FROM job_concurrency c WHERE c.key = k AND c.slot = t) ORDER BY t LOOP
            INSERT INTO job_concurrency (key, slot, job_id, freed_at) VALUES (k, g, NULL, now()) ON CONFLICT DO NOTHING
            RETURNING ctid INTO made;
            CONTINUE WHEN NOT FOUND;
            EXIT WHEN job_slot_hand(k, made, NULL) IS NULL;
            handed := handed + 1;
        END LOOP;
    END LOOP;
    RETURN handed;
END $$;

-- The claim: 041's, with keyed rows gated (job_log_gate) and the batch's keys on its lease.
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
    gated boolean;
    d_lo date;  -- the days ranges 1 and 2 of the window can hold (see the header)
    d_hi date;
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
            c.queue := q; c.priority := level; c.lo := '1:1:'; c.lo_at := NULL;
            c.hi_at := clock_timestamp(); c.hi := pg_current_snapshot(); c.at_tx := '0'; c.at_seq := 0;
        END IF;
        moved := false;
        advanced := false;
        IF c.drained THEN  -- the last claim read this window to its end: on to the next at once
            c.lo := c.hi; c.lo_at := c.hi_at; c.hi_at := clock_timestamp(); c.hi := pg_current_snapshot();
            c.at_tx := '0'; c.at_seq := 0;
            advanced := true;
        END IF;
        LOOP
            running := ARRAY(SELECT pg_snapshot_xip(c.lo));
            -- a row of a transaction that began after lo was inserted after lo_at, one visible
            -- in hi before hi was taken (just after hi_at): its day (the UTC date of its
            -- insert) lies between them; an hour each side for a clock set back. Unknown
            -- (a window from before 041, a level's first): every day.
            d_lo := coalesce(((c.lo_at - interval '1 hour') AT TIME ZONE 'UTC')::date, '-infinity');
            d_hi := coalesce(((c.hi_at + interval '1 hour') AT TIME ZONE 'UTC')::date, 'infinity');
            asked := want;
            SELECT array_agg(w.r ORDER BY w.tx, w.seq), coalesce(bool_or(w.g), false) INTO picked, gated
              -- three index ranges, none read from before the cursor's place (a row comparison
              -- beside another bound on tx made the index read from the level's first row,
              -- every claim): the rest of the cursor's own transaction, the later ones, and
              -- (below) those lo saw running
              FROM ((SELECT l AS r, l.tx, l.seq, (l.flow_key IS NOT NULL AND l.flow_held IS NOT TRUE) AS g FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND l.tx = c.at_tx AND l.seq > c.at_seq
                        AND c.at_tx >= pg_snapshot_xmax(c.lo) AND pg_visible_in_snapshot(l.tx, c.hi)
                        AND l.day BETWEEN d_lo AND d_hi
                      ORDER BY l.seq LIMIT want)
                    UNION ALL
                    (SELECT l AS r, l.tx, l.seq, (l.flow_key IS NOT NULL AND l.flow_held IS NOT TRUE) AS g FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND l.tx >= pg_snapshot_xmax(c.lo) AND l.tx > c.at_tx
                        AND l.tx < pg_snapshot_xmax(c.hi) AND pg_visible_in_snapshot(l.tx, c.hi)
                        AND l.day BETWEEN d_lo AND d_hi
                      ORDER BY l.tx, l.seq LIMIT want)
                    UNION ALL
                    (SELECT x.* FROM unnest(running) AS t(tx) CROSS JOIN LATERAL (
                         SELECT l AS r, l.tx, l.seq, (l.flow_key IS NOT NULL AND l.flow_held IS NOT TRUE) AS g FROM job_log l
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
                IF gated THEN  -- keyed rows: each takes a slot of its key, or is parked (job_log_gate)
                    picked := job_log_gate(picked);
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
            c.lo := c.hi; c.lo_at := c.hi_at; c.hi_at := clock_timestamp(); c.hi := pg_current_snapshot();
            c.at_tx := '0'; c.at_seq := 0;
            advanced := true;
        END LOOP;
        -- written only when the claim took rows of the level: an idle queue's claims
        -- append nothing (the next one moves on from the last written window)
        IF moved THEN  -- drained: the claim still wanted rows when it left the level
            INSERT INTO job_cursor (queue, priority, lo, hi, at_tx, at_seq, drained, lo_at, hi_at)
            VALUES (q, level, c.lo, c.hi, c.at_tx, c.at_seq, want > 0, c.lo_at, c.hi_at);
        END IF;
        level := (SELECT max(k.priority) FROM job_cursor k WHERE k.queue = q AND k.priority < level);
    END LOOP;
    IF cardinality(taken) = 0 THEN
        RETURN;
    END IF;
    -- keys: each row's limit key where the batch has a keyed row (NULL else): the outcome
    -- statements write it on the done row, whose trigger then ends the job's hold of its slot
    -- and slots: where each row's slot row is (its flow_slot hint)
    INSERT INTO job_lease (owner, expires_at, seqs, days, keys, slots)
    SELECT who, now() + lease_s * interval '1 second', array_agg(t.seq ORDER BY t.ordinality),
           array_agg(t.day ORDER BY t.ordinality),
           CASE WHEN bool_or(t.flow_key IS NOT NULL) THEN array_agg(t.flow_key ORDER BY t.ordinality) END,
           CASE WHEN bool_or(t.flow_key IS NOT NULL) THEN array_agg(t.flow_slot ORDER BY t.ordinality) END
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

-- Promotion (051's, 052's) keeps a timer's keys: a keyed job's retry waits for its backoff
-- in job_timers without its slot and is gated again once promoted; a deduped one keeps its
-- dedupe key on its log row.
CREATE OR REPLACE FUNCTION job_timers_promote(q text, tfloor timestamptz, lim integer, OUT promoted integer, OUT upto timestamptz)
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
                             lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow)
        SELECT id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts, lease_losses,
               max_lease_losses, message_timestamp, run_at, dedupe_key, flow_key, flow
          FROM moved ORDER BY run_at, id
    )
    SELECT max(run_at) INTO upto FROM moved;
END $$;

-- Retention (043's): a dropped day's rows with no outcome are appended to today with their
-- key (and hold); its parked rows' entries go with the day.
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
        -- (a keyed row keeps its keys, and the slot it holds; a parked one is gated again)
        INSERT INTO job_log (id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts,
                             lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
                             flow_held, flow_slot)
        SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, l.payload, l.priority, l.attempts, l.max_attempts,
               l.lease_losses, l.max_lease_losses, l.message_timestamp, l.created_at, l.dedupe_key, l.flow_key, l.flow,
               l.flow_held, l.flow_slot
          FROM job_log l
         WHERE l.day = part.d AND NOT EXISTS (SELECT 1 FROM job_done x WHERE x.seq = l.seq AND x.day = l.day);
        DELETE FROM job_blocked WHERE day = part.d;
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


-- The views (051's, 052's) show the log's keys, and a parked job as job_queue shows a row waiting
-- for its key: 'waiting' (its parked row with no outcome; a dangling entry whose row ended
-- by a path that writes no key is not shown).
CREATE OR REPLACE VIEW jobs_log_live AS
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'running'::text AS status, l.priority, l.created_at AS run_at,
       l.attempts + 1 AS attempts, l.max_attempts, x.owner AS lease_owner, x.claimed_at, x.renewed_at AS heartbeat_at,
       x.expires_at AS lease_expires_at, l.dedupe_key, l.flow_key AS concurrency_key, NULL::text AS last_error,
       NULL::jsonb AS result,
       (SELECT jsonb_build_object('percent', p.percent, 'message', p.message, 'at', p.at)
               || CASE WHEN p.event IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('event', p.event) END
          FROM job_progress p WHERE p.job_id = l.id ORDER BY p.at DESC, p.id DESC LIMIT 1) AS progress,
       l.created_at, x.claimed_at AS started_at,
       NULL::timestamptz AS finished_at, l.lease_losses, l.max_lease_losses, l.message_timestamp, l.payload,
       l.flow_key, l.flow
  FROM (SELECT * FROM job_lease ORDER BY batch) x
 CROSS JOIN LATERAL unnest(x.seqs, x.days) AS u(seq, day)
  JOIN job_log l ON l.seq = u.seq AND l.day = u.day
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
UNION ALL
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'pending', l.priority, l.created_at, l.attempts, l.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, l.dedupe_key, l.flow_key, NULL::text, NULL::jsonb,
       NULL::jsonb, l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses,
       l.message_timestamp, l.payload, l.flow_key, l.flow
  FROM job_log_pending() l
UNION ALL
SELECT t.id, t.queue, t.actor, t.args, t.kwargs, t.options, t.status, t.priority, t.run_at, t.attempts, t.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, t.dedupe_key, t.flow_key, t.last_error,
       NULL::jsonb, NULL::jsonb, t.created_at, NULL::timestamptz, NULL::timestamptz, t.lease_losses, t.max_lease_losses,
       t.message_timestamp, t.payload, t.flow_key, t.flow
  FROM job_timers t
UNION ALL
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'waiting', l.priority, l.created_at, l.attempts, l.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, l.dedupe_key, l.flow_key, NULL::text, NULL::jsonb,
       NULL::jsonb, l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses,
       l.message_timestamp, l.payload, l.flow_key, l.flow
  -- each parked row's log row looked up by its (seq, day) (OFFSET 0: never a join the
  -- planner may run as a hash of the whole log, which every read of the view then paid)
  FROM job_blocked b CROSS JOIN LATERAL (SELECT x.* FROM job_log x WHERE x.seq = b.seq AND x.day = b.day OFFSET 0) l
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = b.seq AND d.day = b.day);

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
  FROM job_timers t
UNION ALL
SELECT b.id, b.queue, l.actor, 'waiting', l.priority, l.created_at, l.created_at, NULL::timestamptz, NULL::text
  -- each parked row's log row looked up by its (seq, day) (OFFSET 0: never a join the
  -- planner may run as a hash of the whole log, which every read of the view then paid)
  FROM job_blocked b CROSS JOIN LATERAL (SELECT x.* FROM job_log x WHERE x.seq = b.seq AND x.day = b.day OFFSET 0) l
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = b.seq AND d.day = b.day);

-- A finished keyed job of the log shows its key (its done row's), as job_history's rows do:
-- a search by key finds it (043's view, the key columns from the done row).
CREATE OR REPLACE VIEW jobs_log_finished AS
SELECT d.id, d.queue, d.actor, (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS args,
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS kwargs,
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS options,
       d.status, (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS priority, d.created_at AS run_at, d.attempt AS attempts,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_attempts,
       d.owner AS lease_owner, d.claimed_at, NULL::timestamptz AS heartbeat_at, NULL::timestamptz AS lease_expires_at,
       (SELECT l.dedupe_key FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS dedupe_key,
       d.flow_key AS concurrency_key, d.last_error, d.result, d.progress, d.created_at,
       d.started_at, d.finished_at,
       coalesce(d.lease_losses, (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day)) AS lease_losses,
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_lease_losses,
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS message_timestamp,
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS payload,
       d.flow_key, (SELECT l.flow FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS flow
  FROM job_done d
 WHERE d.status IN ('succeeded', 'failed', 'cancelled');
