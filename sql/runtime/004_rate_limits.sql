-- Token buckets and daily quotas shared by every process and host (survive restarts).

CREATE TABLE rate_limiter_state (
    key             text             PRIMARY KEY,     -- e.g. 'source:3', 'llm:gpt-4o-mini'
    tokens          double precision NOT NULL,
    burst           double precision NOT NULL,
    rate_per_second double precision NOT NULL,
    updated_at      timestamptz      NOT NULL,
    daily_quota     integer,
    quota_day       date,                             -- UTC day that quota_used counts
    quota_used      integer          NOT NULL DEFAULT 0,
    blocked_until   timestamptz,                      -- set from a 429 Retry-After
    granted_total   bigint           NOT NULL DEFAULT 0,
    denied_total    bigint           NOT NULL DEFAULT 0
);

-- Take `cost` tokens for `key` in one statement: refill by elapsed time (capped at
-- burst), honour a 429 block and the UTC daily quota, and say how long to wait
-- when refused. The row lock serialises callers on every host; the clock is read
-- after the lock is held so concurrent callers never refill the same interval twice.
CREATE FUNCTION rate_limit_take(p_key text, p_cost integer, p_burst double precision,
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
