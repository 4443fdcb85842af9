-- A claim reads only the days its window can hold (issue 18): a day's partitions that no
-- row of the window's later transactions can be in are pruned as the claim's plan starts
-- (each day kept had cost every claim two more index scans: with 8 days more, a claim of
-- 100 took 17 % more CPU; in a stream 041 took 13 % off such a claim, bench/README).
--
-- 1. A row's day is the UTC date of its insert (the clock's, per row), no longer the
--    inserting session's current_date (its time zone's date of its transaction's start,
--    which a transaction open since yesterday would have set to yesterday).
-- 2. Each cursor keeps when its snapshots were taken (lo_at, hi_at: the clock just before
--    each). A window's rows of transactions that began after lo (the two ranges read from
--    the index by tx) were inserted between lo_at and hi_at, so their days lie between
--    those dates; the rows of transactions lo saw running (the third range) may be of any
--    day, and are read in every day. Windows taken before this migration have no times,
--    and are read in every day.
-- 3. The partitions made ahead, and the check that a sent id is not live, follow the UTC
--    date (job_id_live: yesterday to tomorrow, which also covers a day written before 1.
--    by a session east of UTC).

ALTER TABLE job_log ALTER COLUMN day SET DEFAULT ((clock_timestamp() AT TIME ZONE 'UTC')::date);
ALTER TABLE job_cursor ADD COLUMN lo_at timestamptz, ADD COLUMN hi_at timestamptz;

-- Today as the log's days count (UTC), at the transaction's start: the day the column's
-- default gives a row, but for a transaction that crosses midnight (STABLE, so a statement
-- that compares days with it prunes partitions; the default reads the clock per row).
CREATE FUNCTION job_log_today() RETURNS date LANGUAGE sql STABLE AS $$
    SELECT (now() AT TIME ZONE 'UTC')::date
$$;

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
            SELECT array_agg(w.r ORDER BY w.tx, w.seq) INTO picked
              -- three index ranges, none read from before the cursor's place (a row comparison
              -- beside another bound on tx made the index read from the level's first row,
              -- every claim): the rest of the cursor's own transaction, the later ones, and
              -- (below) those lo saw running
              FROM ((SELECT l AS r, l.tx, l.seq FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND l.tx = c.at_tx AND l.seq > c.at_seq
                        AND c.at_tx >= pg_snapshot_xmax(c.lo) AND pg_visible_in_snapshot(l.tx, c.hi)
                        AND l.day BETWEEN d_lo AND d_hi
                      ORDER BY l.seq LIMIT want)
                    UNION ALL
                    (SELECT l AS r, l.tx, l.seq FROM job_log l
                      WHERE l.queue = q AND l.priority = level AND l.tx >= pg_snapshot_xmax(c.lo) AND l.tx > c.at_tx
                        AND l.tx < pg_snapshot_xmax(c.hi) AND pg_visible_in_snapshot(l.tx, c.hi)
                        AND l.day BETWEEN d_lo AND d_hi
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


-- Whether a job with this id is live (040's, on UTC days: see 3. above).
CREATE OR REPLACE FUNCTION job_id_live(i uuid) RETURNS boolean LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM job_queue q WHERE q.id = i)
        OR EXISTS (SELECT 1 FROM job_log l
                    WHERE l.id = i AND l.day BETWEEN job_log_today() - 1 AND job_log_today() + 1
                      AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day));
END $$;
