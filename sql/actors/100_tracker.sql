-- The tracker's missing parts (issue 10): time-score inputs on listings, a shared
-- cache of fetched pages, the one-line "empty tracker" notice, and system_state.

-- Time-score inputs: the listing's type and, for an auction, when it ends.
ALTER TABLE listings
    ADD COLUMN listing_type    text NOT NULL DEFAULT 'fixed' CHECK (listing_type IN ('auction', 'fixed')),
    ADD COLUMN auction_ends_at timestamptz,
    ADD COLUMN time_score      smallint,      -- 100 auction ending within 4 h, 80 first seen within 24 h, else 30
    ADD COLUMN composite_score real;          -- 0..100: 95% value against the baseline, 5% time
-- refresh_baselines re-scores every listing by id cursor: the primary key serves it.

-- Fetched search pages, shared by every process and host. A hit costs no
-- rate-limit token and no request; expired rows are pruned by refresh_baselines.
CREATE TABLE page_cache (
    source_id    bigint      NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    query        text        NOT NULL,
    page         integer     NOT NULL DEFAULT 1,
    url          text        NOT NULL,
    body         text        NOT NULL,
    content_type text        NOT NULL DEFAULT '',
    fetched_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (source_id, query, page)
);
CREATE INDEX page_cache_expiry ON page_cache (expires_at);

-- Fleet-wide notices logged at most once per interval (e.g. "no watches yet").
CREATE TABLE tracker_notices (
    name      text        PRIMARY KEY,
    logged_at timestamptz NOT NULL DEFAULT now()
);

-- The tracker at a glance, read in one query (`supervisor tracker state`, HTTP).
-- A baseline is warm at 5 listings (pipeline.scoring.min_samples' default).
CREATE VIEW system_state AS
SELECT
    (SELECT count(*) FROM watches)                                        AS watches_total,
    (SELECT count(*) FROM watches WHERE enabled)                          AS watches_enabled,
    (SELECT count(*) FROM sources)                                        AS sources_total,
    (SELECT count(*) FROM listings)                                       AS listings_total,
    (SELECT count(*) FROM listings WHERE extracted_at IS NULL)            AS listings_unextracted,
    (SELECT count(*) FROM listings WHERE score IS NULL)                   AS listings_unscored,
    (SELECT count(*) FROM alerts WHERE NOT notified)                      AS alerts_pending,
    (SELECT count(*) FROM price_baselines)                                AS baselines_total,
    (SELECT count(*) FROM price_baselines WHERE sample_count >= 5)        AS baselines_warm,
    (SELECT count(*) FROM price_baselines WHERE sample_count < 5)         AS baselines_cold,
    (SELECT count(DISTINCT l.product_key) FROM listings l
      WHERE l.product_key IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM price_baselines b WHERE b.product_key = l.product_key))
                                                                          AS product_keys_no_baseline,
    (SELECT count(*) FROM jobs WHERE queue = 'extraction' AND status IN ('pending', 'retryable', 'running'))
                                                                          AS extraction_queue_depth,
    (SELECT count(*) FROM page_cache WHERE expires_at > now())            AS cached_pages;
