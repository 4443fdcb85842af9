-- system_state counts the extraction queue's depth through the runtime's jobs_live
-- (runtime migration 027): its live rows only, through their partial indexes, instead
-- of a scan of every row of jobs, finished ones included.
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
    (SELECT count(*) FROM price_baselines WHERE sample_count >= 5)        AS baselines_warm,
    (SELECT count(*) FROM price_baselines WHERE sample_count < 5)         AS baselines_cold,
    (SELECT count(DISTINCT l.product_key) FROM listings l
      WHERE l.product_key IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM price_baselines b WHERE b.product_key = l.product_key))
                                                                          AS product_keys_no_baseline,
    (SELECT count(*) FROM jobs_live WHERE queue = 'extraction')
                                                                          AS extraction_queue_depth,
    (SELECT count(*) FROM page_cache WHERE expires_at > now())            AS cached_pages;
