-- The tracker's state as the config sees it, for every reader of system_state (the CLI,
-- /api/v1/system/state, /metrics, psql).
--
-- Settings the view needs, synced from the config's pipeline: section by every worker
-- at start and reload (actors/catalog.py), so a baseline is "warm" at the same
-- scoring.min_samples the extraction judges by, not at a constant.
CREATE TABLE tracker_settings (
    id          boolean     PRIMARY KEY DEFAULT true CHECK (id),  -- one row
    min_samples integer     NOT NULL DEFAULT 5 CHECK (min_samples >= 1),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO tracker_settings DEFAULT VALUES;
-- The settings row, or the column defaults until a worker wrote one (never no row).
CREATE VIEW tracker_settings_now AS
SELECT coalesce((SELECT min_samples FROM tracker_settings), 5) AS min_samples;

-- A listing whose extraction left its product key short (refactor plan, decision 8):
-- no key at all, memory of unknown type (`ram:ddr?:...`), or a component the rules
-- recognised whose key still fell back to the title's words (`item:...`: capacity or
-- model missing). Such listings are priced against the wrong peers or none; they are
-- what a scheduled re-extraction reads again (at priority 1).
CREATE FUNCTION listing_extraction_incomplete(product_key text, attributes jsonb, extracted_at timestamptz)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT extracted_at IS NOT NULL
       AND (product_key IS NULL
            OR product_key LIKE 'ram:ddr?:%'
            OR (product_key LIKE 'item:%' AND attributes ? 'component'))
$$;

CREATE OR REPLACE VIEW system_state AS
SELECT
    (SELECT count(*) FROM watches)                                        AS watches_total,
    (SELECT count(*) FROM watches WHERE enabled)                          AS watches_enabled,
    (SELECT count(*) FROM sources)                                        AS sources_total,
    (SELECT count(*) FROM listings)                                       AS listings_total,
    (SELECT count(*) FROM listings WHERE extracted_at IS NULL)            AS listings_unextracted,
    (SELECT count(*) FROM listings WHERE score IS NULL)                   AS listings_unscored,
    (SELECT count(*) FROM alerts WHERE NOT notified)                      AS alerts_pending,
    (SELECT count(*) FROM price_baselines)                                AS baselines_total,
    (SELECT count(*) FROM price_baselines
      WHERE sample_count >= (SELECT min_samples FROM tracker_settings_now)) AS baselines_warm,
    (SELECT count(*) FROM price_baselines
      WHERE sample_count < (SELECT min_samples FROM tracker_settings_now))  AS baselines_cold,
    (SELECT count(DISTINCT l.product_key) FROM listings l
      WHERE l.product_key IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM price_baselines b WHERE b.product_key = l.product_key))
                                                                          AS product_keys_no_baseline,
    (SELECT count(*) FROM jobs_live WHERE queue = 'extraction')
                                                                          AS extraction_queue_depth,
    (SELECT count(*) FROM page_cache WHERE expires_at > now())            AS cached_pages,
    (SELECT count(*) FROM listings
      WHERE listing_extraction_incomplete(product_key, attributes, extracted_at))
                                                                          AS listings_incomplete_extraction;
