-- The price-tracking pipeline (DESIGN §5): where to look, what was seen, what is a deal.

CREATE TABLE sources (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  text        NOT NULL UNIQUE,
    -- '{query}' is replaced by the URL-encoded watch query.
    search_url            text        NOT NULL,
    format                text        NOT NULL DEFAULT 'auto' CHECK (format IN ('auto', 'json', 'html')),
    enabled               boolean     NOT NULL DEFAULT true,
    -- Politeness: a token bucket (rate, burst) and an optional daily quota, enforced
    -- across every process and host by rate_limiter_state.
    rate_limit_per_minute double precision NOT NULL DEFAULT 60 CHECK (rate_limit_per_minute > 0),
    burst                 integer     NOT NULL DEFAULT 1 CHECK (burst >= 1),
    daily_quota           integer     CHECK (daily_quota >= 0),          -- NULL: no daily cap
    -- Circuit breaker: consecutive failures; while paused_until is ahead, scrapes wait.
    failure_streak        integer     NOT NULL DEFAULT 0,
    paused_until          timestamptz,
    last_success_at       timestamptz,
    last_failure_at       timestamptz,
    last_error            text,
    created_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE watches (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  text,
    query                 text        NOT NULL,
    source_id             bigint      NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    -- A deal is a unit price at or under the target, or this fraction under the
    -- product's baseline median (pipeline default when both are NULL).
    target_price_cents    bigint      CHECK (target_price_cents > 0),
    deal_threshold        real        CHECK (deal_threshold > 0 AND deal_threshold < 1),
    webhook_url           text,
    webhook_format        text        NOT NULL DEFAULT 'auto' CHECK (webhook_format IN ('auto', 'discord', 'json')),
    enabled               boolean     NOT NULL DEFAULT true,
    poll_interval_seconds integer     NOT NULL DEFAULT 3600 CHECK (poll_interval_seconds > 0),
    last_polled_at        timestamptz,                                   -- NULL: never polled
    created_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX watches_due ON watches (last_polled_at NULLS FIRST) WHERE enabled;

CREATE TABLE listings (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source_id        bigint      NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    external_id      text        NOT NULL,       -- the source's id, else 'url_' + hash of the URL
    url              text,
    title            text        NOT NULL,
    description      text,
    price_cents      bigint      NOT NULL CHECK (price_cents >= 0),
    currency         text        NOT NULL DEFAULT 'USD',
    price_type       text        NOT NULL DEFAULT 'ask' CHECK (price_type IN ('ask', 'sold', 'bid')),
    condition_text   text,
    raw              jsonb,
    -- Filled by extraction.
    attributes       jsonb,
    product_key      text,
    unit_price_cents bigint,
    extractor        text,
    extracted_at     timestamptz,
    score            real,
    first_seen_at    timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source_id, external_id)
);
CREATE INDEX listings_product ON listings (product_key, last_seen_at) WHERE product_key IS NOT NULL;

CREATE TABLE price_points (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    watch_id       bigint      NOT NULL REFERENCES watches (id) ON DELETE CASCADE,
    source_id      bigint      NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    listing_id     bigint      REFERENCES listings (id) ON DELETE SET NULL,
    -- 'ext_<external id>', else 'hash_' + 16 hex of sha256(url, title, cents, day, price type).
    dedupe_key     text        NOT NULL,
    price_cents    bigint      NOT NULL,
    currency       text        NOT NULL,
    price_type     text        NOT NULL,
    observed_on    date        NOT NULL,
    match_strength real        NOT NULL DEFAULT 0 CHECK (match_strength >= 0 AND match_strength <= 1),
    observed_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (watch_id, source_id, dedupe_key)
);
CREATE INDEX price_points_listing ON price_points (listing_id, observed_on);

CREATE TABLE price_baselines (
    product_key  text        PRIMARY KEY,
    median_cents double precision NOT NULL,
    p25_cents    double precision NOT NULL,
    p75_cents    double precision NOT NULL,
    mean_cents   double precision NOT NULL,
    sample_count integer     NOT NULL,
    window_days  integer     NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE alerts (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    watch_id       bigint      NOT NULL REFERENCES watches (id) ON DELETE CASCADE,
    listing_id     bigint      NOT NULL REFERENCES listings (id) ON DELETE CASCADE,
    price_cents    bigint      NOT NULL,
    baseline_cents double precision,
    score          real,
    reason         text        NOT NULL,
    notified       boolean     NOT NULL DEFAULT false,
    notified_at    timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now()
);
-- One pending alert per watch and listing, whatever the re-alert setting; once it
-- is notified the application decides (re-alerts off by default, else a cooldown).
CREATE UNIQUE INDEX alerts_pending_unique ON alerts (watch_id, listing_id) WHERE NOT notified;
CREATE INDEX alerts_watch_listing ON alerts (watch_id, listing_id, notified_at);

-- The side-effect ledger for webhooks: the row is written (in_flight) just before
-- the request leaves and closed after. 'unknown' means the request may have been
-- received but its outcome was never recorded (worker killed, response timed out).
CREATE TABLE notification_attempts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    alert_id    bigint      NOT NULL REFERENCES alerts (id) ON DELETE CASCADE,
    job_id      uuid,
    job_attempt integer,
    target      text        NOT NULL,            -- the webhook URL with its secret redacted
    status      text        NOT NULL DEFAULT 'in_flight'
                CHECK (status IN ('in_flight', 'succeeded', 'failed', 'unknown')),
    http_status integer,
    error_text  text,
    duration_ms integer,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX notification_attempts_alert ON notification_attempts (alert_id, started_at DESC);
CREATE UNIQUE INDEX notification_attempts_one_success ON notification_attempts (alert_id)
    WHERE status = 'succeeded';
CREATE UNIQUE INDEX notification_attempts_one_in_flight ON notification_attempts (alert_id)
    WHERE status = 'in_flight';
