-- Lanes: claims of one queue no longer take turns (issue 18). Up to 041 every claim of a
-- queue held one lock until its commit, and a commit waits for its WAL flush: two claimers
-- of a queue waited for each other with the CPU idle (db_floor, claims of 100 on 2
-- connections: the same claims on two queues drained 1.12-1.34x faster; bench/README,
-- "Tenth session").
--
-- A level's rows are dealt among job_log_lanes() lanes by their producer's transaction
-- (job_log_lane(tx)): all the rows one transaction wrote are in one lane, so they are
-- claimed in the order they were written, as before. Each lane has its own cursor (its own
-- windows of transactions: 039's reading, unchanged, within the lane) and its own lock: a
-- claim takes the lanes it can (pg_try_advisory_xact_lock), starting from a lane that turns
-- with every claim (job_log_lane_turn), so concurrent claims of a queue read different
-- lanes, and one claimer alone reads the lanes in turn (a backlog's lanes stay within a
-- claim of each other). A claim waits for a lane only while it holds none, so two claims
-- never wait for each other in a cycle. Priority still comes first: a claim reads the
-- highest level of every lane it can hold before a lower level of any.
--
-- Whole-queue writes (jobs_log_write, 040, which moves a pending row under the claims'
-- lock) keep 039's lock key: a claim now holds it shared for its transaction, so such a
-- write still waits for the claims running and keeps new ones out (its code is unchanged).
--
-- Order: a claim returns its rows by priority, then by their transactions' start (xid) and
-- insert, as before. Between claims, a backlog's claim reads one lane, so it may take a
-- later transaction's rows while an earlier one's wait in another lane for the next claim
-- (a claim of each lane at most: the lanes are read in turn).
--
-- The claim's index becomes (queue, priority, lane, tx, seq): the old one is dropped (an
-- insert writes as many entries as before). Each level's newest cursor is copied to every
-- lane: its window and place hold for each lane's rows alike (a lane's rows are a subset of
-- the level's, read in the same order). ALTER TABLE job_cursor comes first: it waits for
-- the claims running and keeps new ones out until this migration commits, so the copies
-- are of the last cursors.

-- 2: two claimers of a queue drained a backlog as fast with 2 lanes as with 4 (db_floor,
-- claims of 100 on 2 connections, 6 alternations: medians 19,0xx and 19,2xx rows/s), and
-- every lane costs a claim of a queue with few rows waiting one more cursor and window
-- read: such a claim took 1.3-1.9x 041's time with 2 lanes, 1.6-3x with 4. More claimers
-- than lanes take turns in a lane, as all of them did before.
CREATE FUNCTION job_log_lanes() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS 'SELECT 2';
-- A row's lane: its transaction's (the index below is on it: it states the same 2).
CREATE FUNCTION job_log_lane(tx xid8) RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT ((tx::text)::bigint % 2)::integer $$;
-- The lane each claim starts from: every claim the next (not transactional, never reset).
CREATE SEQUENCE job_log_lane_turn;

ALTER TABLE job_cursor ADD COLUMN lane integer NOT NULL DEFAULT 0;
DROP INDEX job_cursor_newest;
CREATE INDEX job_cursor_newest ON job_cursor (queue, priority, lane, at DESC);
INSERT INTO job_cursor (queue, priority, lane, lo, hi, at_tx, at_seq, drained, lo_at, hi_at)
SELECT c.queue, c.priority, g.lane, c.lo, c.hi, c.at_tx, c.at_seq, c.drained, c.lo_at, c.hi_at
  FROM (SELECT DISTINCT ON (k.queue, k.priority) k.* FROM job_cursor k ORDER BY k.queue, k.priority, k.at DESC) c
 CROSS JOIN generate_series(0, job_log_lanes() - 1) AS g(lane);

DROP INDEX job_log_claim;
CREATE INDEX job_log_claim ON job_log (queue, priority, job_log_lane(tx), tx, seq);

-- A level's first rows get a cursor in every lane (039's trigger, per lane), its empty first
-- window read to its end (drained): a lane no row has reached yet costs a claim one read,
-- not a read of that window and then one of the next.
CREATE OR REPLACE FUNCTION job_log_notify_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_cursor (queue, priority, lane, lo, hi, at_tx, at_seq, drained)
    SELECT n.queue, n.priority, g.lane, '1:1:', '1:1:', '0', 0, true
      FROM (SELECT DISTINCT queue, priority FROM new_rows) AS n
     CROSS JOIN generate_series(0, job_log_lanes() - 1) AS g(lane)
     WHERE NOT EXISTS (SELECT 1 FROM job_cursor c WHERE c.queue = n.queue AND c.priority = n.priority);
    PERFORM pg_notify('actor_supervisor_jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_rows) AS q;
    RETURN NULL;
END $$;

-- 041's claim, read per lane (see the header); the reading of a lane's windows is 041's.
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
    d_lo date;
    d_hi date;
    lanes integer := job_log_lanes();
    start integer;
    ln integer;
    qkey integer := hashtext(q);
    keys integer[];  -- each lane's lock key (with qkey)
    held boolean[];  -- the lanes this claim holds
BEGIN
    IF n < 1 OR EXISTS (SELECT 1 FROM queue_pauses p WHERE p.queue = q) THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('job_log_claim'), qkey);
    keys := ARRAY(SELECT hashtext('job_log_lane ' || i) FROM generate_series(0, lanes - 1) AS i ORDER BY i);
    held := array_fill(false, ARRAY[lanes]);
    start := (nextval('job_log_lane_turn') % lanes)::integer;
    -- a lane first: the first free from start, else wait for start's (holding none)
    FOR j IN 0 .. lanes - 1 LOOP
        ln := (start + j) % lanes;
        IF pg_try_advisory_xact_lock(keys[ln + 1], qkey) THEN
            held[ln + 1] := true;
            EXIT;
        END IF;
    END LOOP;
    IF NOT (true = ANY(held)) THEN
        PERFORM pg_advisory_xact_lock(keys[start + 1], qkey);
        held[start + 1] := true;
    END IF;
    -- read after the locks: a job moved or cancelled by a session that held them is passed over
    cancels := EXISTS (SELECT 1 FROM job_log_cancel);
    IF relaxed THEN
        -- an idle claim's commit does not wait for its WAL flush (as sql.CLAIM's): a claim
        -- lost in a server crash only leaves its rows leased until the lease expires
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    level := (SELECT max(k.priority) FROM job_cursor k WHERE k.queue = q);
    WHILE level IS NOT NULL AND want > 0 LOOP
      FOR j IN 0 .. lanes - 1 LOOP
        EXIT WHEN want = 0;
        ln := (start + j) % lanes;
        IF NOT held[ln + 1] THEN
            -- held by another claim: its rows are that claim's to read now
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(keys[ln + 1], qkey);
            held[ln + 1] := true;
        END IF;
        SELECT * INTO c FROM job_cursor k WHERE k.queue = q AND k.priority = level AND k.lane = ln
         ORDER BY k.at DESC LIMIT 1;
        IF NOT FOUND THEN
            c.queue := q; c.priority := level; c.lane := ln; c.lo := '1:1:'; c.lo_at := NULL;
            c.hi_at := clock_timestamp(); c.hi := pg_current_snapshot(); c.at_tx := '0'; c.at_seq := 0;
        END IF;
        moved := false;
        advanced := false;
        IF c.drained THEN
            c.lo := c.hi; c.lo_at := c.hi_at; c.hi_at := clock_timestamp(); c.hi := pg_current_snapshot();
            c.at_tx := '0'; c.at_seq := 0;
            advanced := true;
        END IF;
        LOOP
            -- the transactions lo saw running that can have rows of this lane after the place
            running := ARRAY(SELECT t.tx FROM pg_snapshot_xip(c.lo) AS t(tx)
                              WHERE t.tx >= c.at_tx AND job_log_lane(t.tx) = ln);
            d_lo := coalesce(((c.lo_at - interval '1 hour') AT TIME ZONE 'UTC')::date, '-infinity');
            d_hi := coalesce(((c.hi_at + interval '1 hour') AT TIME ZONE 'UTC')::date, 'infinity');
            asked := want;
            SELECT array_agg(w.r ORDER BY w.tx, w.seq) INTO picked
              FROM ((SELECT l AS r, l.tx, l.seq FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND job_log_lane(l.tx) = ln
                        AND l.tx = c.at_tx AND l.seq > c.at_seq
                        AND c.at_tx >= pg_snapshot_xmax(c.lo) AND pg_visible_in_snapshot(l.tx, c.hi)
                        AND l.day BETWEEN d_lo AND d_hi
                      ORDER BY l.seq LIMIT want)
                    UNION ALL
                    (SELECT l AS r, l.tx, l.seq FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND job_log_lane(l.tx) = ln
                        AND l.tx >= pg_snapshot_xmax(c.lo) AND l.tx > c.at_tx
                        AND l.tx < pg_snapshot_xmax(c.hi) AND pg_visible_in_snapshot(l.tx, c.hi)
                        AND l.day BETWEEN d_lo AND d_hi
                      ORDER BY l.tx, l.seq LIMIT want)
                    ORDER BY 2, 3 LIMIT want) w;
            IF cardinality(running) > 0 THEN
                -- the third range, in a statement of its own (every day's partition: those
                -- transactions may have written before lo_at), merged in window order; only
                -- when lo saw one of the lane's running, so the usual claim's plan starts on
                -- the first two ranges' days alone
                SELECT array_agg(w.r ORDER BY w.tx, w.seq) INTO picked
                  FROM ((SELECT p AS r, p.tx, p.seq FROM unnest(picked) AS p)
                        UNION ALL
                        (SELECT x.* FROM unnest(running) AS t(tx) CROSS JOIN LATERAL (
                             SELECT l AS r, l.tx, l.seq FROM job_log l
                              WHERE l.queue = q AND l.priority = level AND job_log_lane(l.tx) = ln AND l.tx = t.tx
                                AND l.seq > CASE WHEN t.tx = c.at_tx THEN c.at_seq ELSE 0 END
                                AND pg_visible_in_snapshot(l.tx, c.hi)
                              ORDER BY l.seq LIMIT want) x
                          ORDER BY 2, 3 LIMIT want)
                        ORDER BY 2, 3 LIMIT want) w;
            END IF;
            IF picked IS NOT NULL THEN
                k := cardinality(picked);
                c.at_tx := picked[k].tx; c.at_seq := picked[k].seq;
                moved := true;
                IF cancels THEN
                    picked := ARRAY(SELECT picked[i] FROM generate_subscripts(picked, 1) AS i
                                     WHERE NOT EXISTS (SELECT 1 FROM job_log_cancel x
                                                        WHERE x.seq = (picked[i]).seq AND x.day = (picked[i]).day)
                                     ORDER BY i);
                END IF;
                taken := taken || picked;
                want := n - cardinality(taken);
                EXIT WHEN want = 0;
                CONTINUE WHEN k = asked;
            END IF;
            EXIT WHEN advanced;
            c.lo := c.hi; c.lo_at := c.hi_at; c.hi_at := clock_timestamp(); c.hi := pg_current_snapshot();
            c.at_tx := '0'; c.at_seq := 0;
            advanced := true;
        END LOOP;
        IF moved THEN
            INSERT INTO job_cursor (queue, priority, lane, lo, hi, at_tx, at_seq, drained, lo_at, hi_at)
            VALUES (q, level, ln, c.lo, c.hi, c.at_tx, c.at_seq, want > 0, c.lo_at, c.hi_at);
        END IF;
      END LOOP;
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
    -- by priority, then in the order the producers' transactions began: a claim that took
    -- rows of several lanes returns them as one lane would (one producer's sends in order)
    SELECT b, l.seq, l.day, l.id, l.queue, l.actor, '[' || l.args::text || ',' || l.kwargs::text || ',' || l.options::text || ']',
           l.attempts + 1, l.max_attempts, l.lease_losses, l.max_lease_losses,
           coalesce(l.message_timestamp, (extract(epoch FROM l.created_at) * 1000)::bigint), l.payload,
           l.priority, l.created_at
      FROM unnest(taken) AS l
     ORDER BY l.priority DESC, l.tx, l.seq;
END $$;

-- The views' pending rows (039's), per lane: each lane's newest cursor bounds its rows.
CREATE OR REPLACE FUNCTION job_log_pending() RETURNS SETOF job_log LANGUAGE sql STABLE AS $$
    SELECT l.*
      FROM (SELECT DISTINCT ON (k.queue, k.priority, k.lane) k.* FROM job_cursor k
             ORDER BY k.queue, k.priority, k.lane, k.at DESC) c
     CROSS JOIN LATERAL (
        SELECT l.* FROM job_log l
         WHERE l.queue = c.queue AND l.priority = c.priority AND job_log_lane(l.tx) = c.lane
           AND l.tx >= pg_snapshot_xmax(c.lo)
        UNION ALL
        SELECT l.* FROM unnest(ARRAY(SELECT pg_snapshot_xip(c.lo))) AS x(tx)
          JOIN job_log l ON l.queue = c.queue AND l.priority = c.priority AND job_log_lane(l.tx) = c.lane
                        AND l.tx = x.tx
         WHERE job_log_lane(x.tx) = c.lane) l
     WHERE NOT (pg_visible_in_snapshot(l.tx, c.hi) AND (l.tx, l.seq) <= (c.at_tx, c.at_seq))
       AND NOT EXISTS (SELECT 1 FROM job_log_cancel x WHERE x.seq = l.seq AND x.day = l.day)
$$;
