-- 056: jobs whose limit key carries a fairness weight live in the log (issue 38).
--
-- Before, such a job lived in job_queue as a 'waiting' row, and the keyed claim took the
-- queue's keys in turn (sql/flow.py: each key `weight` rows a turn, round robin by key name
-- from a cursor per process), stepping over every dead version a pinned horizon keeps of the
-- taken rows. Now a job whose key has a weight, or a weight and a concurrency limit (no rate
-- or daily quota: 054's; a key with no limit at all, a fairness key of weight 1, is one too),
-- is appended to job_log with its key and limits, as 053's concurrency-keyed jobs are:
--
--   park   the claim parks each such row it meets in its window in job_blocked (turn: the
--          row waits for its key's turn, not for a slot) with its priority, and gives a key
--          met for the first time a floor (job_fair_floor). The window passes on: no claim
--          reads the row in the log again.
--   turn   then (only while the level's cursor says it has rows parked for a turn: a queue
--          of plain rows never pays for it) the fair pass (job_fair_take) serves the level's
--          keys round robin by key name from the turn the last claim stopped at (job_cursor's
--          fair_key, fair_took: one cursor per queue and level, shared by every process, as
--          the claims of a queue are serialized by its claim lock), each key up to its weight
--          a turn, its parked rows in the order they were parked (priority is the level),
--          FOR UPDATE SKIP LOCKED, from its floor; the job_blocked row's delete is the fence
--          (a cancel's done row deletes it too). A row taken that also has a concurrency limit
--          goes through job_log_gate: a slot, or parked for one (turn false), 053's path on.
--   floor  each turn appends the key's last position taken (job_fair_floor, never updated):
--          the next turn reads the key's parked rows after it, so the dead index entries a
--          pinned horizon keeps of the rows taken since are passed over inside the index; the
--          key's newest floor is the first entry its descent meets. The upkeep prunes the
--          older floors, and the keys idle for a while (job_fair_prune).
--
-- Redefined from 053 (every column carried): job_slot_hand and job_blocked_sweep (a row
-- parked for a turn is not handed a slot: it has not had its turn), job_log_claim (the park
-- and the fair pass), the views jobs_log_live and jobs_log_finished (concurrency_key only
-- for a row with a concurrency limit). Not changed: job_log_gate, job_done_slot_end (it
-- drops a cancelled row's parked entry, a turn's too), job_log_drop_before (a dropped day's
-- parked rows, turns too, are appended again and parked again). The statements:
-- supervisor/broker/sql/fair.py; ARCHITECTURE.md, 'Storage "log"' and 'Flow control'.

-- turn: the row waits for its key's turn (056), not for a slot (053's rows: false).
-- priority: its level, which the fair pass serves (NULL for a row waiting for a slot).
ALTER TABLE job_blocked ADD COLUMN turn boolean NOT NULL DEFAULT false, ADD COLUMN priority integer;
-- A level's rows parked for a turn, by key, in the order they were parked.
CREATE INDEX job_blocked_turn ON job_blocked (queue, priority, key, pos) WHERE turn;
-- The hand-off's read of a key's rows parked for a slot: the rows of the same key parked for
-- a turn are not in its range.
CREATE INDEX job_blocked_slot ON job_blocked (key, pos) WHERE NOT turn;

-- Each turn a key had: the position of the last row it took (a floor for the next turn),
-- and its weight as the rows it took carried it. Append only: a key's newest row is the
-- first its descent (pos DESC) reads, whatever a pinned horizon keeps below it; the set of
-- a level's keys is a loose index scan of it, one descent a key.
CREATE TABLE job_fair_floor (
    queue    text        NOT NULL,
    priority integer     NOT NULL,
    key      text        NOT NULL,
    pos      bigint      NOT NULL,
    weight   integer     NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX job_fair_floor_key ON job_fair_floor (queue, priority, key, pos DESC);

-- A weighted key's floors by queue and key (job_done_turn_wake's probe): the newest first.
CREATE INDEX job_fair_floor_wake ON job_fair_floor (queue, key, pos DESC);

-- The end of a job that held a slot of a key with a weight (a weight and a concurrency
-- limit) wakes its queue's consumers: its key's next rows may wait for a turn, not for the
-- slot (053's hand-off only appends a row parked for a slot, which wakes them by its
-- insert), and an idle consumer claims only when woken. One probe of the key's newest
-- floor; a job that held no slot (a weight alone) fires nothing.
CREATE FUNCTION job_done_turn_wake() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM job_fair_floor f WHERE f.queue = NEW.queue AND f.key = NEW.flow_key) THEN
        PERFORM pg_notify('actor_supervisor_jobs', NEW.queue);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER job_done_turn_wake AFTER INSERT ON job_done FOR EACH ROW
    WHEN (NEW.flow_key IS NOT NULL AND NEW.flow_slot IS NOT NULL AND NEW.status <> 'released')
    EXECUTE FUNCTION job_done_turn_wake();

-- Where the level's fair pass stopped (056): whether the level has rows parked for a turn
-- (as far as the claims know: the park sets it, a pass that found none clears it), the key
-- whose turn it was and how many rows that turn took.
ALTER TABLE job_cursor ADD COLUMN fair boolean NOT NULL DEFAULT false, ADD COLUMN fair_key text,
                       ADD COLUMN fair_took integer NOT NULL DEFAULT 0;

-- Whether a row's limits make it wait for a turn: a weight, or no limit at all (a fairness
-- key of weight 1 writes {}), with no rate or quota (those are 054's).
CREATE FUNCTION job_fair_row(flow jsonb) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
    SELECT flow IS NOT NULL AND NOT flow ?| ARRAY['r', 'b', 'q'] AND (flow ? 'w' OR NOT flow ? 'c')
$$;

-- The claim's park (its caller holds the queue's claim lock): the rows of cand whose key has
-- a weight (and hold no slot: a row handed one or released holding it had its turn) are
-- parked in job_blocked for a turn, in their order, each with its move written; a key with
-- no floor at that level gets one just below its first row, with the row's weight. Returns
-- the other rows, in their order.
CREATE FUNCTION job_fair_park(cand job_log[]) RETURNS job_log[] LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM generate_subscripts(cand, 1) AS j
                    WHERE (cand[j]).flow_key IS NOT NULL AND (cand[j]).flow_held IS NOT TRUE
                      AND job_fair_row((cand[j]).flow)) THEN
        RETURN cand;
    END IF;
    WITH parked AS (
        INSERT INTO job_blocked (seq, day, key, id, queue, turn, priority)
        SELECT (cand[j]).seq, (cand[j]).day, (cand[j]).flow_key, (cand[j]).id, (cand[j]).queue, true,
               (cand[j]).priority
          FROM generate_subscripts(cand, 1) AS j
         WHERE (cand[j]).flow_key IS NOT NULL AND (cand[j]).flow_held IS NOT TRUE AND job_fair_row((cand[j]).flow)
         ORDER BY j
        RETURNING id, key, queue, priority, pos
    ), floors AS (
        INSERT INTO job_fair_floor (queue, priority, key, pos, weight)
        SELECT p.queue, p.priority, p.key, min(p.pos) - 1,
               max(coalesce(((cand[j]).flow->>'w')::int, 1))
          FROM parked p JOIN generate_subscripts(cand, 1) AS j ON (cand[j]).id = p.id
         GROUP BY p.queue, p.priority, p.key
        HAVING NOT EXISTS (SELECT 1 FROM job_fair_floor f
                            WHERE f.queue = p.queue AND f.priority = p.priority AND f.key = p.key)
    )
    -- the move written as every move is (job_events): why the job waits
    INSERT INTO job_events (job_id, who, from_status, to_status, reason)
    SELECT id, 'claim', 'pending', 'waiting', 'fairness key ' || key || ': parked until its turn'
      FROM parked;
    RETURN ARRAY(SELECT cand[j] FROM generate_subscripts(cand, 1) AS j
                  WHERE NOT ((cand[j]).flow_key IS NOT NULL AND (cand[j]).flow_held IS NOT TRUE
                             AND job_fair_row((cand[j]).flow))
                  ORDER BY j);
END $$;

-- The key after `after` (NULL: the first) of a level with floors: one index descent. (An
-- ORDER BY ... LIMIT 1, not min(): on a table the statistics call tiny, min() was planned as
-- an aggregate over every floor entry after `after`, 0.4 ms a call with 700 floors, and a
-- claim calls this once per turn.)
CREATE FUNCTION job_fair_next(q text, level integer, after text) RETURNS text LANGUAGE plpgsql STABLE
SET enable_seqscan = off AS $$
BEGIN
    IF after IS NULL THEN
        RETURN (SELECT f.key FROM job_fair_floor f WHERE f.queue = q AND f.priority = level ORDER BY f.key LIMIT 1);
    END IF;
    RETURN (SELECT f.key FROM job_fair_floor f WHERE f.queue = q AND f.priority = level AND f.key > after
             ORDER BY f.key LIMIT 1);
END $$;

-- The fair pass (its caller, the claim, holds the queue's claim lock): up to `want` rows of
-- the level's keys parked for a turn, the keys in turn by name from the one the last pass
-- stopped at (cur; cur_took: rows its turn took so far, 0: the turn ended, the next key's),
-- each key up to its weight a turn, its rows after its floor in the order parked. A parked
-- row another transaction holds is passed over (SKIP LOCKED: a cancel's); one that ended
-- meanwhile (a cancel's done row) or whose day was dropped is dropped. Each turn that took
-- rows appends the key's floor. A taken row's move (waiting -> pending: its turn came) is
-- written; a row whose key has a concurrency limit too then takes a slot or is parked for one
-- (job_log_gate), and its key has no more turns in this pass. Returns the rows that may run,
-- where the turn stopped (at_key, at_took), and whether rows may be left (more: false once
-- a whole lap of the keys found none and passed none over). A key's new floor stays below a
-- row its turn passed over (held by another transaction: a cancel that may roll back).
-- (Index reads only, as job_slot_hand's: under a pinned horizon the tables hold thousands of
-- dead versions, which an ANALYZE can make look cheap to scan whole.)
CREATE FUNCTION job_fair_take(q text, level integer, want integer, cur text, cur_took integer,
                              OUT rows job_log[], OUT at_key text, OUT at_took integer, OUT more boolean)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_sort = off AS $$
DECLARE
    k text := cur;
    took integer := coalesce(cur_took, 0);  -- rows the key's turn took so far
    visit integer;  -- rows this pass took from the key in this turn
    fl bigint;
    fw integer;  -- the key's weight as its rows carry it (its floor's)
    w integer;
    asked integer;
    got job_blocked[];
    seen bigint[];
    top bigint;  -- the last position the turn took
    passed bigint;  -- the first position before it the turn passed over (held by another transaction)
    fresh job_log[];
    ran job_log[];
    capped text[] := '{}';  -- keys whose turn met a full concurrency limit: no more turns this pass
    skipped boolean := false;  -- a key passed over (full, or its rows held elsewhere): rows may wait on
    empty_from text;  -- the first key of a run of turns that took nothing: back at it, a lap found none
BEGIN
    rows := '{}';
    more := true;
    at_key := cur;
    at_took := took;
    IF k IS NULL OR took = 0 THEN  -- the last turn ended: the next key's
        k := job_fair_next(q, level, k);
        took := 0;
    END IF;
    visit := 0;
    LOOP
        EXIT WHEN want <= 0;
        IF k IS NULL THEN  -- past the last key: round again from the first
            k := job_fair_next(q, level, NULL);
            IF k IS NULL THEN
                more := false;
                EXIT;
            END IF;
        END IF;
        IF k = empty_from THEN
            more := skipped;  -- a full key's rows wait on
            EXIT;
        END IF;
        IF k = ANY(capped) THEN
            IF empty_from IS NULL THEN
                empty_from := k;
            END IF;
            at_key := k;
            at_took := 0;
            k := job_fair_next(q, level, k);
            took := 0;
            CONTINUE;
        END IF;
        SELECT f.pos, f.weight INTO fl, fw FROM job_fair_floor f
         WHERE f.queue = q AND f.priority = level AND f.key = k ORDER BY f.pos DESC LIMIT 1;
        -- (the operator's override of the weight wins: rate_limiter_state's, as the table's claim reads it)
        w := greatest(1, coalesce((SELECT (r.override->>'w')::int FROM rate_limiter_state r WHERE r.key = k), fw));
        asked := least(greatest(w - took, 1), want);
        -- (read first without a lock: a row another transaction holds, a cancel's, is passed
        -- over by the take, and the key's floor stays below it, so a cancel rolled back
        -- leaves no row parked behind the floor)
        seen := ARRAY(SELECT b.pos FROM job_blocked b
                       WHERE b.queue = q AND b.priority = level AND b.turn AND b.key = k AND b.pos > fl
                       ORDER BY b.pos LIMIT asked);
        got := ARRAY(SELECT b FROM job_blocked b
                      WHERE b.queue = q AND b.priority = level AND b.turn AND b.key = k AND b.pos > fl
                      ORDER BY b.pos LIMIT asked FOR UPDATE SKIP LOCKED);
        skipped := skipped OR cardinality(seen) > cardinality(got);  -- (rows held elsewhere wait on)
        IF cardinality(got) > 0 THEN
            -- (each by its key: a join to the array was planned as a scan of the whole primary
            -- key, dead entries and all, once the statistics said the table was small)
            DELETE FROM job_blocked x
             WHERE x.seq = ANY(ARRAY(SELECT g.seq FROM unnest(got) AS g))
               AND x.day = ANY(ARRAY(SELECT g.day FROM unnest(got) AS g));
            fresh := ARRAY(SELECT r.l FROM unnest(got) WITH ORDINALITY AS g
                            CROSS JOIN LATERAL (
                                SELECT l FROM job_log l WHERE l.seq = g.seq AND l.day = g.day
                                   AND NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = l.seq AND d.day = l.day)
                                OFFSET 0) r
                            ORDER BY g.ordinality);
            top := (SELECT max(g.pos) FROM unnest(got) AS g);
            passed := (SELECT min(p) FROM unnest(seen) AS p WHERE p < top AND p <> ALL (ARRAY(SELECT g.pos FROM unnest(got) AS g)));
            INSERT INTO job_fair_floor (queue, priority, key, pos, weight)
            VALUES (q, level, k, coalesce(passed - 1, top),
                    CASE WHEN cardinality(fresh) = 0 THEN fw
                         ELSE coalesce(((fresh[cardinality(fresh)]).flow->>'w')::int, 1) END);
            INSERT INTO job_events (job_id, who, from_status, to_status, reason)
            SELECT (x).id, 'claim', 'waiting', 'pending', 'its turn of fairness key ' || k FROM unnest(fresh) AS x;
            -- a row whose key also has a concurrency limit takes a slot, or is parked for one
            -- (job_log_gate); the key then has no more turns this pass (its rows would only
            -- move to wait for a slot, and the pass's room goes to the other keys)
            -- (only where a row has a limit the gate applies, or the key an operator's
            -- override: a weight alone needs no gate, which is two functions and a bucket
            -- read per turn)
            IF EXISTS (SELECT 1 FROM unnest(fresh) AS x WHERE (x).flow ?| ARRAY['c', 'r', 'q'])
               OR EXISTS (SELECT 1 FROM rate_limiter_state r WHERE r.key = k AND r.override IS NOT NULL) THEN
                ran := job_log_gate(fresh);
            ELSE
                ran := fresh;
            END IF;
            IF cardinality(ran) < cardinality(fresh) THEN
                capped := capped || k;
                skipped := true;
            END IF;
            rows := rows || ran;
            took := took + cardinality(fresh);
            visit := visit + cardinality(ran);
            want := want - cardinality(ran);
        END IF;
        at_key := k;
        at_took := took;
        IF cardinality(got) < asked OR took >= w OR k = ANY(capped) THEN
            -- the key's turn ends: its rows (for now), its weight, or its slots
            IF visit > 0 THEN
                empty_from := NULL;
            ELSIF empty_from IS NULL THEN
                empty_from := k;
            END IF;
            at_took := 0;
            k := job_fair_next(q, level, k);
            took := 0;
            visit := 0;
        END IF;
    END LOOP;
END $$;

-- The upkeep's prune (with the cursors'): each key's floors but its newest, and the floors of
-- a key with nothing parked for a turn whose newest is older than idle_s, under its queue's
-- claim lock (tried: a queue claiming now is pruned next time), read after the lock (a claim
-- that parked a row of the key has committed, or waits). Returns the rows deleted.
CREATE FUNCTION job_fair_prune(idle_s double precision) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    q text;
    gone bigint;
    more bigint;
BEGIN
    DELETE FROM job_fair_floor f
     WHERE EXISTS (SELECT 1 FROM job_fair_floor n
                    WHERE n.queue = f.queue AND n.priority = f.priority AND n.key = f.key AND n.pos > f.pos);
    GET DIAGNOSTICS gone = ROW_COUNT;
    FOR q IN SELECT DISTINCT f.queue FROM job_fair_floor f WHERE f.at < now() - idle_s * interval '1 second' LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(hashtext('job_log_claim'), hashtext(q));
        DELETE FROM job_fair_floor f
         WHERE f.queue = q AND f.at < now() - idle_s * interval '1 second'
           AND NOT EXISTS (SELECT 1 FROM job_blocked b
                            WHERE b.queue = f.queue AND b.priority = f.priority AND b.key = f.key AND b.turn);
        GET DIAGNOSTICS more = ROW_COUNT;
        gone := gone + more;
    END LOOP;
    RETURN gone;
END $$;

-- A slot goes to its key's oldest job parked for a slot (053's, redefined: a row parked for
-- a turn is not one; its turn comes first).
CREATE OR REPLACE FUNCTION job_slot_hand(k text, slot_tid tid, fl bigint) RETURNS uuid LANGUAGE plpgsql
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
        SELECT * INTO b FROM job_blocked x WHERE x.key = k AND NOT x.turn AND x.pos > coalesce(fl, 0)
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


-- The upkeep's sweep (053's, redefined): the rows parked for a turn are not its.
CREATE OR REPLACE FUNCTION job_blocked_sweep() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    s record;
    k text;
    lim integer;
    g integer;
    made tid;
    handed integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM job_blocked x WHERE NOT x.turn) THEN
        RETURN 0;
    END IF;
    FOR s IN SELECT c.key, c.slot, c.job_id, NULL::tid AS tid FROM job_concurrency c
              WHERE EXISTS (SELECT 1 FROM job_blocked x WHERE x.key = c.key AND NOT x.turn)
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
                   JOIN job_log l ON l.seq = x.seq AND l.day = x.day WHERE NOT x.turn
                  ORDER BY x.key, x.pos LOOP
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


-- The claim (053's, redefined): a row of a key with a weight is parked for its key's turn
-- (job_fair_park), and the level's keys take turns for what the window left (job_fair_take).
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
    before integer;
    f record;  -- 056: the fair pass's rows, and where its turn stopped
    turned boolean;
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
        c.fair := coalesce(c.fair, false);
        turned := false;
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
                    -- (056: a row whose key has a fairness weight is parked first, for its key's turn)
                    before := cardinality(picked);
                    picked := job_fair_park(picked);
                    c.fair := c.fair OR cardinality(picked) < before;
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
        -- 056: the level's keys with rows parked for a turn take turns for what the window
        -- left (job_fair_take, from the turn the last claim stopped at); only while the
        -- cursor says the level has such rows, so a queue of plain rows never pays for it
        IF c.fair AND want > 0 THEN
            SELECT * INTO f FROM job_fair_take(q, level, want, c.fair_key, c.fair_took);
            turned := cardinality(f.rows) > 0 OR NOT f.more
                      OR f.at_key IS DISTINCT FROM c.fair_key OR f.at_took IS DISTINCT FROM c.fair_took;
            c.fair := f.more; c.fair_key := f.at_key; c.fair_took := f.at_took;
            taken := taken || f.rows;  -- (gated already: a row with a concurrency limit holds its slot)
            want := n - cardinality(taken);
        END IF;
        -- written only when the claim took rows of the level: an idle queue's claims
        -- append nothing (the next one moves on from the last written window)
        IF moved OR turned THEN  -- drained: the claim still wanted rows when it left the level
            INSERT INTO job_cursor (queue, priority, lo, hi, at_tx, at_seq, drained, lo_at, hi_at, fair, fair_key,
                                    fair_took)
            VALUES (q, level, c.lo, c.hi, c.at_tx, c.at_seq, want > 0, c.lo_at, c.hi_at, c.fair, c.fair_key,
                    coalesce(c.fair_took, 0));
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


-- The views (053's, redefined, every column carried): a weighted job's key is its limit key
-- (flow_key), and its concurrency key only when it carries a concurrency limit, as
-- job_queue's rows show it (a job made fair by tenant is not limited by it).
CREATE OR REPLACE VIEW jobs_log_live AS
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'running'::text AS status, l.priority, l.created_at AS run_at,
       l.attempts + 1 AS attempts, l.max_attempts, x.owner AS lease_owner, x.claimed_at, x.renewed_at AS heartbeat_at,
       x.expires_at AS lease_expires_at, l.dedupe_key, CASE WHEN l.flow ? 'c' THEN l.flow_key END AS concurrency_key, NULL::text AS last_error,
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
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, l.dedupe_key, CASE WHEN l.flow ? 'c' THEN l.flow_key END, NULL::text, NULL::jsonb,
       NULL::jsonb, l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses,
       l.message_timestamp, l.payload, l.flow_key, l.flow
  FROM job_log_pending() l
UNION ALL
SELECT t.id, t.queue, t.actor, t.args, t.kwargs, t.options, t.status, t.priority, t.run_at, t.attempts, t.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, t.dedupe_key, CASE WHEN t.flow ? 'c' THEN t.flow_key END, t.last_error,
       NULL::jsonb, NULL::jsonb, t.created_at, NULL::timestamptz, NULL::timestamptz, t.lease_losses, t.max_lease_losses,
       t.message_timestamp, t.payload, t.flow_key, t.flow
  FROM job_timers t
UNION ALL
SELECT l.id, l.queue, l.actor, l.args, l.kwargs, l.options, 'waiting', l.priority, l.created_at, l.attempts, l.max_attempts,
       NULL::text, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, l.dedupe_key, CASE WHEN l.flow ? 'c' THEN l.flow_key END, NULL::text, NULL::jsonb,
       NULL::jsonb, l.created_at, NULL::timestamptz, NULL::timestamptz, l.lease_losses, l.max_lease_losses,
       l.message_timestamp, l.payload, l.flow_key, l.flow
  -- each parked row's log row looked up by its (seq, day) (OFFSET 0: never a join the
  -- planner may run as a hash of the whole log, which every read of the view then paid)
  FROM job_blocked b CROSS JOIN LATERAL (SELECT x.* FROM job_log x WHERE x.seq = b.seq AND x.day = b.day OFFSET 0) l
 WHERE NOT EXISTS (SELECT 1 FROM job_done d WHERE d.seq = b.seq AND d.day = b.day);


CREATE OR REPLACE VIEW jobs_log_finished AS
SELECT d.id, d.queue, d.actor, (SELECT l.args FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS args,
       (SELECT l.kwargs FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS kwargs,
       (SELECT l.options FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS options,
       d.status, (SELECT l.priority FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS priority, d.created_at AS run_at, d.attempt AS attempts,
       (SELECT l.max_attempts FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_attempts,
       d.owner AS lease_owner, d.claimed_at, NULL::timestamptz AS heartbeat_at, NULL::timestamptz AS lease_expires_at,
       (SELECT l.dedupe_key FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS dedupe_key,
       CASE WHEN (SELECT l.flow FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) ? 'c' THEN d.flow_key END
           AS concurrency_key, d.last_error, d.result, d.progress, d.created_at,
       d.started_at, d.finished_at,
       coalesce(d.lease_losses, (SELECT l.lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day)) AS lease_losses,
       (SELECT l.max_lease_losses FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS max_lease_losses,
       (SELECT l.message_timestamp FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS message_timestamp,
       (SELECT l.payload FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS payload,
       d.flow_key, (SELECT l.flow FROM job_log l WHERE l.seq = d.seq AND l.day = d.day) AS flow
  FROM job_done d
 WHERE d.status IN ('succeeded', 'failed', 'cancelled');
