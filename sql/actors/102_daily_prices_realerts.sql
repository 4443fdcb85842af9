-- Price history records prices: one observation per listing per watch and day.
-- A key was unique for ever (`ext_<id>` carries no day), so a listing that stayed up
-- never reached the history again after its first day. The day joins the key: an
-- existing row stays the observation of the day it was made on (nothing to rewrite;
-- the old key was unique, so the wider one is too). Within a day the upsert keeps the
-- last price seen (a weaker match never replaces a stronger one); `hash_` keys carry
-- the day and price already, as scrape-worker-audit.md's dedupe rules ask.
ALTER TABLE price_points DROP CONSTRAINT IF EXISTS price_points_watch_id_source_id_dedupe_key_key;
ALTER TABLE price_points ADD CONSTRAINT price_points_daily UNIQUE (watch_id, source_id, dedupe_key, observed_on);

-- Re-alerts per watch: NULL follows the config's alerts.re_alerts_enabled; true or
-- false overrides it for this watch (`watches add|set --re-alerts/--no-re-alerts`).
ALTER TABLE watches ADD COLUMN re_alerts boolean;
