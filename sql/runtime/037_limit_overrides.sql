-- An operator's override of a limit key's limits (issue 22, "Seen and steered"): set with
-- `supervisor limits set`, PUT /api/v1/limits/{key} or the Limits page, cleared the same
-- ways. Held on the key's bucket, the one limiter table, so the claim reads it through the
-- join it makes per key already (broker/sql/flow.py `_gate`): its values (r rate per
-- second, b burst, q daily quota, c concurrency; a JSON null lifts that limit) replace
-- those the waiting row's `flow` carries, at the next claim, on every process and host.

ALTER TABLE rate_limiter_state
    ADD COLUMN override    jsonb,
    ADD COLUMN override_by text,          -- who set or cleared it last (a token's name, a CLI user)
    ADD COLUMN override_at timestamptz;

-- A bucket an override made before any claim took from it has no tokens yet: NULL reads
-- as full (least() skips a NULL, so every refill expression caps it at the burst).
ALTER TABLE rate_limiter_state ALTER COLUMN tokens DROP NOT NULL;

-- take() (supervisor/ratelimit.py) gives an operator's override the last word too: its
-- rate, burst and daily quota replace the caller's.
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
    used := CASE WHEN s.quota_day = today THEN s.quota_used ELSE 0 END;
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
           updated_at = t, quota_day = today, quota_used = used,
           granted_total = granted_total + CASE WHEN granted THEN 1 ELSE 0 END,
           denied_total = denied_total + CASE WHEN granted THEN 0 ELSE 1 END
     WHERE key = p_key;
    tokens_left := refilled;
    used_today := used;
    RETURN NEXT;
END $$;
