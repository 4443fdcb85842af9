-- 054: jobs whose limit key carries a rate limit and/or a daily quota live in the log too
-- (issue 38, after 053's concurrency-keyed ones). Only fairness weights (and a workflow's
-- keyed step, an actor the producer does not know) still wait in job_queue.
--
-- Before, such a job waited in job_queue as a 'waiting' row and every keyed claim read its
-- key's gate and walked the key's backlog (each row updated on its way out: a dead version
-- a pinned horizon keeps in the claim's path). Now it is appended to job_log with its key and
-- limits as 053's are, and its start is reserved once, at its first claim (GCRA: the key's
-- bucket keeps a debt of the tokens reserved ahead, so its next free start is known):
--
--   claim    job_log_claim's gate (job_log_gate, now job_log_pace then 053's slot gate,
--            renamed job_log_slots) locks the key's bucket (rate_limiter_state, FOR UPDATE
--            SKIP LOCKED: a claim never waits on a bucket), and each of the key's rows takes
--            the key's next start: now if a token is there (it runs, and takes a slot if its
--            key has a concurrency limit), else the time its token falls due (the bucket
--            goes below 0 by one token: the reservation), a quota's next UTC day once the
--            day's quota is reserved, a block's end. A row reserved for later ends its
--            attempt 'requeued' (not counted) and waits in job_timers, 'waiting', holding its
--            reservation (flow_paced): inserted once, promoted once at its time by the
--            queue's claim, and no token taken for it again: only the key's pace of starts
--            (start_tat, below) spaces reserved rows whose promotions came late and
--            together, and a RateLimited block of its key makes it wait again, for the
--            block's end, and take a new reservation then.
--   block    RateLimited (LOG_FINISH 'limited' with a key): the job waits in job_timers,
--            'waiting', until the block's end (BLOCK_JOB_KEY blocks the key as before, its
--            reserved debt kept); every keyed row a claim meets while the block holds
--            waits for its end too.
--
-- The backlog of a rate-limited key lives in job_timers, never walked by a claim: each job
-- costs its key O(1) (one bucket update, one timer insert and delete), and a plain row's
-- claim is as before (the gate runs only for a window that held a keyed row).
-- The statements: supervisor/broker/sql/joblog.py, timers.py, limits.py, flow.py;
-- ARCHITECTURE.md, 'Storage "log"' ("Rate- and quota-limited jobs in the log").

-- flow_paced: the row holds its reservation of its key's rate and quota (a timer reserved by
-- a claim, and the log row it is promoted into): the gate does not take a token for it again.
ALTER TABLE job_log ADD COLUMN flow_paced boolean;
ALTER TABLE job_timers ADD COLUMN flow_paced boolean;
-- start_tat: when the key's next start is due, by the starts the log's claims let through
-- (a GCRA of starts, beside the reservations' debt in tokens): a claim that meets several
-- reserved rows of a key at once (their promotion came late: a busy machine, a worker that
-- claimed late) lets through what the burst allows and spaces the rest, so the starts, not
-- only the reservations, keep burst + rate x W in any window of W seconds.
ALTER TABLE rate_limiter_state ADD COLUMN start_tat timestamptz;
-- 'waiting': a keyed job waiting for its key (its reserved start, a block's end), as
-- job_queue's waiting rows are shown.
ALTER TABLE job_timers DROP CONSTRAINT job_timers_status_check;
ALTER TABLE job_timers ADD CONSTRAINT job_timers_status_check CHECK (status IN ('pending', 'retryable', 'waiting'));
-- The Limits read's count of a key's waiting timers (a partial index: a plain timer's insert
-- adds no entry).
CREATE INDEX job_timers_key ON job_timers (flow_key) WHERE flow_key IS NOT NULL;

-- 053's gate keeps its work (slots, parking) under a name that says so; job_log_gate, which
-- the claim calls, now paces first.
ALTER FUNCTION job_log_gate(job_log[]) RENAME TO job_log_slots;

-- The rate, quota and block step of the claim's gate (the caller holds the queue's claim
-- lock): each key of cand in key order, its limits the first row's flow under the operator's
-- override (037: its letters win, a JSON null lifts that limit). A key blocked by RateLimited
-- sends every row of it to wait for the block's end (a reserved one gives its reservation
-- up: it takes a new one then). Otherwise each row not holding a reservation takes the key's
-- next start from its bucket, locked FOR UPDATE SKIP LOCKED (a bucket another transaction
-- holds is not waited for: the key's rows try again BUSY_S later):
--   tokens  refilled by the time since updated_at up to burst plus the carry (flow.py's
--           CARRY_SECONDS, at most half a token), as the job_queue claim's; below 1, the row's
--           start is when it reaches 1, and one token is taken either way (a debt: the
--           tokens of the starts reserved ahead), so no window of W seconds holds more
--           reserved starts than burst + rate x W;
--   quota   counted per UTC day of the reserved start (quota_day, quota_used: the latest
--           day reservations reached); a row past the day's quota is reserved into the next
--           day's first moment (and the rate's debt follows it);
--   block   a start is never before blocked_until.
-- A row whose start is now runs (053's slot gate follows); the others end their attempt
-- 'requeued' (not counted, the fence of job_done) and wait in job_timers, 'waiting', at their
-- start, reserved (flow_paced), with their move in job_events. Returns the rows that run now.
CREATE FUNCTION job_log_pace(cand job_log[]) RETURNS job_log[] LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    busy_s CONSTANT float8 := 0.05;
    carry_s CONSTANT float8 := 0.025;  -- flow.CARRY_SECONDS
    k text;
    f0 jsonb;  -- the key's limits as its first row carries them
    f jsonb;   -- under the operator's override
    b rate_limiter_state;
    blocked boolean;
    locked boolean;
    got record;
    bt tid;
    rate float8;
    bsize float8;
    quota integer;
    rows_k integer[];
    j integer;
    ts timestamptz;  -- the bucket's time: now(), or a later update another claim made
    t float8;        -- tokens at ts
    at timestamptz;  -- a row's start
    el float8;
    qd date;
    used integer;
    tat timestamptz;    -- the key's pace of starts (start_tat)
    tau float8;
    spaced integer;
    reserved_n integer;
    later_i integer[] := '{}';
    later_at timestamptz[] := '{}';
    later_paced boolean[] := '{}';
    later_why text[] := '{}';
BEGIN
    FOR k IN SELECT DISTINCT (cand[x]).flow_key FROM generate_subscripts(cand, 1) AS x
              WHERE (cand[x]).flow_key IS NOT NULL AND (cand[x]).flow_held IS NOT TRUE ORDER BY 1 LOOP
        f0 := (SELECT (cand[x]).flow FROM generate_subscripts(cand, 1) AS x
               WHERE (cand[x]).flow_key = k AND (cand[x]).flow_held IS NOT TRUE ORDER BY x LIMIT 1);
        -- The key's bucket, read once: locked at once for a key whose rows carry a rate or
        -- quota and need a start (SKIP LOCKED: missing, or held by another, it is read
        -- unlocked below), else read unlocked (a concurrency-only key takes no lock). Under a
        -- pinned horizon each read walks the versions the pin keeps of the key's bucket.
        locked := false;
        IF f0->>'r' IS NOT NULL
           OR f0->>'q' IS NOT NULL AND EXISTS (SELECT 1 FROM generate_subscripts(cand, 1) AS x
                                                WHERE (cand[x]).flow_key = k AND (cand[x]).flow_held IS NOT TRUE
                                                  AND (cand[x]).flow_paced IS NOT TRUE) THEN
            SELECT r AS s, r.ctid AS t INTO got FROM rate_limiter_state r WHERE r.key = k FOR UPDATE SKIP LOCKED;
            locked := FOUND;
        END IF;
        IF locked THEN
            b := got.s; bt := got.t;
        ELSE
            SELECT * INTO b FROM rate_limiter_state r WHERE r.key = k;
        END IF;
        f := CASE WHEN b.override IS NULL THEN f0 ELSE coalesce(f0, '{}') || b.override END;
        blocked := coalesce(b.blocked_until > now(), false);
        -- (a reserved row is here for a block, or for its key's pace of starts)
        rows_k := ARRAY(SELECT x FROM generate_subscripts(cand, 1) AS x
                         WHERE (cand[x]).flow_key = k AND (cand[x]).flow_held IS NOT TRUE
                           AND (blocked OR (cand[x]).flow_paced IS NOT TRUE OR f->>'r' IS NOT NULL) ORDER BY x);
        IF f->>'c' IS NULL THEN
            -- no slot to take (the key's limits, its override read here, have none): marked
            -- so (in this array only) 053's slot gate passes the rows without reading the
            -- key's bucket again (under a pin each read of it walks the versions kept of it)
            FOR j IN SELECT x FROM generate_subscripts(cand, 1) AS x
                      WHERE (cand[x]).flow_key = k AND (cand[x]).flow_held IS NOT TRUE LOOP
                cand[j].flow_held := true;
            END LOOP;
        END IF;
        -- (a JSON null lifts a limit: ->> reads it as NULL)
        CONTINUE WHEN cardinality(rows_k) = 0 OR NOT (blocked OR f->>'r' IS NOT NULL OR f->>'q' IS NOT NULL);
        IF blocked THEN
            FOREACH j IN ARRAY rows_k LOOP
                later_i := later_i || j; later_at := later_at || b.blocked_until; later_paced := later_paced || false;
                later_why := later_why || ('key ' || k || ' blocked (RateLimited) until ' || b.blocked_until::text);
            END LOOP;
            CONTINUE;
        END IF;
        IF NOT locked THEN
            IF b.key IS NULL THEN  -- the key's first bucket: full (tokens NULL), as the job_queue claim's
                INSERT INTO rate_limiter_state (key, tokens, burst, rate_per_second, updated_at, daily_quota)
                VALUES (k, NULL, coalesce((f->>'b')::float8, 1), coalesce((f->>'r')::float8, 1), now(), (f->>'q')::int)
                ON CONFLICT DO NOTHING;
            END IF;
            SELECT r AS s, r.ctid AS t INTO got FROM rate_limiter_state r WHERE r.key = k FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                FOREACH j IN ARRAY rows_k LOOP
                    later_i := later_i || j; later_at := later_at || (now() + busy_s * interval '1 second');
                    later_paced := later_paced || coalesce((cand[j]).flow_paced, false);  -- (a reservation kept)
                    later_why := later_why || ('key ' || k || ': its bucket was busy');
                END LOOP;
                CONTINUE;
            END IF;
            b := got.s; bt := got.t;
        END IF;
        -- (read again under the lock: an override or a block set meanwhile counts)
        f := CASE WHEN b.override IS NULL THEN f0 ELSE coalesce(f0, '{}') || b.override END;
        rate := (f->>'r')::float8;
        bsize := coalesce((f->>'b')::float8, CASE WHEN rate IS NOT NULL THEN 1 END);
        quota := (f->>'q')::int;
        ts := greatest(now(), b.updated_at);
        t := CASE WHEN rate IS NULL THEN NULL WHEN b.tokens IS NULL THEN bsize
                  ELSE least(bsize + least(0.5, rate * carry_s),
                             b.tokens + rate * greatest(0, extract(epoch FROM ts - b.updated_at))) END;
        qd := greatest(b.quota_day, (ts AT TIME ZONE 'UTC')::date);
        used := CASE WHEN b.quota_day = qd THEN b.quota_used ELSE 0 END;
        tat := coalesce(b.start_tat, '-infinity');
        tau := (bsize + least(0.5, rate * carry_s) - 1) / rate;
        spaced := 0;
        reserved_n := 0;
        FOREACH j IN ARRAY rows_k LOOP
            IF (cand[j]).flow_paced THEN  -- reserved: no token again, only the pace of starts below
                at := ts;
            ELSE
                reserved_n := reserved_n + 1;
                at := greatest(ts, b.blocked_until);
                IF rate IS NOT NULL AND t < 1 THEN
                    at := greatest(at, ts + (1 - t) / rate * interval '1 second');
                END IF;
                IF quota IS NOT NULL THEN
                    IF (at AT TIME ZONE 'UTC')::date > qd THEN
                        qd := (at AT TIME ZONE 'UTC')::date; used := 0;
                    END IF;
                    IF used >= quota THEN  -- the day's quota is reserved: the next day's first start
                        qd := qd + 1; used := 0;
                    END IF;
                    at := greatest(at, qd::timestamp AT TIME ZONE 'UTC');
                    used := used + 1;
                END IF;
                IF rate IS NOT NULL THEN  -- one token taken at the start, its debt counted from ts
                    el := extract(epoch FROM at - ts);
                    t := least(bsize + least(0.5, rate * carry_s), t + rate * el) - 1 - rate * el;
                END IF;
                IF at > ts THEN
                    later_i := later_i || j; later_at := later_at || at; later_paced := later_paced || true;
                    later_why := later_why || (CASE WHEN quota IS NOT NULL AND at = qd::timestamp AT TIME ZONE 'UTC'
                                                    THEN 'daily quota of key ' || k || ' reserved: starts at '
                                                    ELSE 'rate of key ' || k || ': start reserved at ' END || at::text);
                    CONTINUE;
                END IF;
            END IF;
            -- starts now, if the key's pace of starts lets it (tau: the burst and carry's
            -- tolerance); else, holding its reservation, it waits a token's time after the
            -- starts due before it (spaced: rows of one claim one token apart)
            CONTINUE WHEN rate IS NULL;
            IF ts >= tat - tau * interval '1 second' THEN
                tat := greatest(tat, ts) + interval '1 second' / rate;
            ELSE
                at := tat - tau * interval '1 second' + spaced * interval '1 second' / rate;
                spaced := spaced + 1;
                later_i := later_i || j; later_at := later_at || at; later_paced := later_paced || true;
                later_why := later_why || ('rate of key ' || k || ': reserved starts came together, spaced: starts at '
                                           || at::text);
            END IF;
        END LOOP;
        UPDATE rate_limiter_state r
           SET tokens = CASE WHEN rate IS NULL THEN r.tokens ELSE t END, burst = coalesce(bsize, r.burst),
               rate_per_second = coalesce(rate, r.rate_per_second), daily_quota = quota, updated_at = ts,
               quota_day = qd, quota_used = used, granted_total = r.granted_total + reserved_n,
               start_tat = CASE WHEN rate IS NULL THEN r.start_tat ELSE tat END
         WHERE r.ctid = bt;  -- (the row locked above: its ctid holds while locked)
    END LOOP;
    IF cardinality(later_i) = 0 THEN
        RETURN cand;
    END IF;
    -- the rows that start later: their attempt ends 'requeued' (the fence: a row some other
    -- writer ended meanwhile is not moved), and each waits in job_timers at its start
    WITH w AS (
        SELECT cand[u.i] AS r, u.start_at, u.held, u.why FROM unnest(later_i, later_at, later_paced, later_why) AS u(i, start_at, held, why)
    ), done AS (
        INSERT INTO job_done (seq, day, id, queue, actor, created_at, status, attempt)
        SELECT (w.r).seq, (w.r).day, (w.r).id, (w.r).queue, (w.r).actor, (w.r).created_at, 'requeued', (w.r).attempts + 1
          FROM w
        ON CONFLICT (seq, day) DO NOTHING
        RETURNING seq, day
    ), went AS (
        SELECT w.* FROM w JOIN done d ON d.seq = (w.r).seq AND d.day = (w.r).day
    ), timed AS (
        INSERT INTO job_timers (id, queue, actor, args, kwargs, options, payload, status, priority, run_at, attempts,
                                max_attempts, lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key,
                                flow_key, flow, flow_paced)
        SELECT (r).id, (r).queue, (r).actor, (r).args, (r).kwargs, (r).options, (r).payload, 'waiting', (r).priority, went.start_at,
               (r).attempts, (r).max_attempts, (r).lease_losses, (r).max_lease_losses, (r).message_timestamp,
               (r).created_at, (r).dedupe_key, (r).flow_key, (r).flow, went.held
          FROM went ORDER BY went.start_at
    )
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT (r).id, 'claim', 'pending', 'waiting', went.why FROM went;
    RETURN ARRAY(SELECT cand[x] FROM generate_subscripts(cand, 1) AS x WHERE NOT x = ANY(later_i) ORDER BY x);
END $$;

-- The claim's gate (job_log_claim calls it for a window that held a keyed row): rate, quota
-- and block first (a token is taken before a slot: a row parked for a slot keeps its token,
-- and its hand-off does not gate it again), then 053's slots.
CREATE FUNCTION job_log_gate(cand job_log[]) RETURNS job_log[] LANGUAGE sql AS $$
    SELECT job_log_slots(job_log_pace(cand))
$$;

-- Promotion (053's) keeps a timer's reservation on its log row.
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
                             lease_losses, max_lease_losses, message_timestamp, created_at, dedupe_key, flow_key, flow,
                             flow_paced)
        SELECT id, queue, actor, args, kwargs, options, payload, priority, attempts, max_attempts, lease_losses,
               max_lease_losses, message_timestamp, run_at, dedupe_key, flow_key, flow, flow_paced
          FROM moved ORDER BY run_at, id
    )
    SELECT max(run_at) INTO upto FROM moved;
END $$;

-- take() (037's) on a key the log's claims reserved ahead: a bucket below 0 holds the debt of
-- the starts reserved (refused until it is paid, as any empty bucket), and a quota day ahead
-- of today means today's quota is all reserved (refused; the day and its count are kept, not
-- written back to today, so the log's next reservation counts on from them).
CREATE OR REPLACE FUNCTION rate_limit_take(p_key text, p_cost integer, p_burst double precision,
                                           p_rate double precision, p_quota integer)
RETURNS TABLE (granted boolean, wait_seconds double precision, reason text,
               tokens_left double precision, used_today integer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    s        rate_limiter_state;
    t        timestamptz;
    today    date;
    refilled double precision;
    used     integer;
BEGIN
    INSERT INTO rate_limiter_state (key, tokens, burst, rate_per_second, updated_at, daily_quota)
    VALUES (p_key, p_burst, p_burst, p_rate, clock_timestamp(), p_quota)
    ON CONFLICT (key) DO NOTHING;
    SELECT * INTO s FROM rate_limiter_state WHERE key = p_key FOR UPDATE;
    IF s.override IS NOT NULL THEN
        -- (a null rate lifts the claim's rate limit; a caller of take() keeps its own)
        p_rate := coalesce((s.override->>'r')::float8, p_rate);
        p_burst := coalesce((s.override->>'b')::float8, p_burst);
        IF s.override ? 'q' THEN p_quota := (s.override->>'q')::int; END IF;
        p_cost := greatest(1, least(p_cost, floor(p_burst)::int));  -- a lowered burst still grants
    END IF;
    t := greatest(clock_timestamp(), s.updated_at);
    today := (t AT TIME ZONE 'UTC')::date;
    refilled := least(p_burst, s.tokens + p_rate * extract(epoch FROM t - s.updated_at));
    used := CASE WHEN s.quota_day = today THEN s.quota_used WHEN s.quota_day > today THEN p_quota ELSE 0 END;
    granted := false;
    IF s.blocked_until IS NOT NULL AND s.blocked_until > t THEN
        reason := 'blocked';
        wait_seconds := extract(epoch FROM s.blocked_until - t);
    ELSIF p_quota IS NOT NULL AND used + p_cost > p_quota THEN
        reason := 'quota';
        wait_seconds := extract(epoch FROM ((today + 1)::timestamp AT TIME ZONE 'UTC') - t);
    ELSIF refilled < p_cost THEN
        reason := 'rate';
        wait_seconds := (p_cost - refilled) / p_rate;
    ELSE
        granted := true;
        reason := 'ok';
        wait_seconds := 0;
        refilled := refilled - p_cost;
        used := used + p_cost;
    END IF;
    UPDATE rate_limiter_state
       SET tokens = refilled, burst = p_burst, rate_per_second = p_rate, daily_quota = p_quota,
           updated_at = t,
           quota_day = CASE WHEN s.quota_day > today THEN s.quota_day ELSE today END,
           quota_used = CASE WHEN s.quota_day > today THEN s.quota_used ELSE used END,
           granted_total = granted_total + CASE WHEN granted THEN 1 ELSE 0 END,
           denied_total = denied_total + CASE WHEN granted THEN 0 ELSE 1 END
     WHERE key = p_key;
    tokens_left := refilled;
    used_today := used;
    RETURN NEXT;
END $$;
