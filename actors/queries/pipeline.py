"""Every SQL statement on ``watches``, ``listings``, ``price_points``,
``price_baselines`` and ``alerts``."""

# --- watches ----------------------------------------------------------------

INSERT_WATCH = """
INSERT INTO watches (name, query, source_id, target_price_cents, deal_threshold, webhook_url,
                     webhook_format, enabled, poll_interval_seconds)
VALUES (%(name)s, %(query)s, %(source_id)s, %(target_price_cents)s, %(deal_threshold)s, %(webhook_url)s,
        %(webhook_format)s, %(enabled)s, %(poll_interval_seconds)s)
RETURNING id
"""

WATCH_WITH_SOURCE = """
SELECT w.id, w.query, w.enabled, w.last_polled_at, s.id, s.name, s.search_url, s.format, s.enabled,
       s.rate_limit_per_minute, s.burst, s.daily_quota
  FROM watches w JOIN sources s ON s.id = w.source_id
 WHERE w.id = %(id)s
"""

MARK_POLLED = "UPDATE watches SET last_polled_at = now() WHERE id = %(id)s"

# Enabled watches not polled within their interval, on sources that are enabled
# and not paused by the breaker (their scrapes would only be deferred).
DUE_WATCHES = """
SELECT w.id
  FROM watches w JOIN sources s ON s.id = w.source_id
 WHERE w.enabled AND s.enabled
   AND (s.paused_until IS NULL OR s.paused_until <= now())
   AND (w.last_polled_at IS NULL
        OR w.last_polled_at < now() - coalesce(%(older_than_s)s, w.poll_interval_seconds) * interval '1 second')
 ORDER BY w.last_polled_at NULLS FIRST, w.id
 LIMIT %(limit)s
"""

# --- listings -----------------------------------------------------------------

# Returns the listing id, whether it is new, and its price before this upsert (so
# the caller can re-score a listing whose price moved).
UPSERT_LISTING = """
WITH before AS (
    SELECT price_cents FROM listings WHERE source_id = %(source_id)s AND external_id = %(external_id)s
)
INSERT INTO listings AS l (source_id, external_id, url, title, description, price_cents, currency,
                           price_type, condition_text, raw)
VALUES (%(source_id)s, %(external_id)s, %(url)s, %(title)s, %(description)s, %(price_cents)s,
        %(currency)s, %(price_type)s, %(condition)s, %(raw)s)
ON CONFLICT (source_id, external_id) DO UPDATE
   SET url = EXCLUDED.url, title = EXCLUDED.title, description = EXCLUDED.description,
       price_cents = EXCLUDED.price_cents, currency = EXCLUDED.currency, price_type = EXCLUDED.price_type,
       condition_text = EXCLUDED.condition_text, raw = EXCLUDED.raw, last_seen_at = now()
RETURNING l.id, (xmax = 0) AS inserted, (SELECT price_cents FROM before)
"""

LISTING_FOR_EXTRACTION = """
SELECT id, title, description, condition_text, price_cents, currency, price_type, url,
       attributes, product_key, extractor
  FROM listings WHERE id = %(id)s
"""

SAVE_EXTRACTION = """
UPDATE listings
   SET attributes = %(attributes)s, product_key = %(product_key)s, unit_price_cents = %(unit_price_cents)s,
       extractor = %(extractor)s, extracted_at = now()
 WHERE id = %(id)s
"""

SAVE_SCORE = "UPDATE listings SET score = %(score)s WHERE id = %(id)s"

ACTIVE_PRODUCT_KEYS = """
SELECT DISTINCT product_key FROM listings
 WHERE product_key IS NOT NULL AND last_seen_at > now() - %(days)s * interval '1 day'
 ORDER BY product_key
"""

# --- price points ---------------------------------------------------------------

# Same dedupe key for the same watch and source: keep one row; a stronger match
# replaces a weaker one. Returns the row only when it was inserted or replaced.
UPSERT_PRICE_POINT = """
INSERT INTO price_points AS p (watch_id, source_id, listing_id, dedupe_key, price_cents, currency,
                               price_type, observed_on, match_strength)
VALUES (%(watch_id)s, %(source_id)s, %(listing_id)s, %(dedupe_key)s, %(price_cents)s, %(currency)s,
        %(price_type)s, %(observed_on)s, %(match_strength)s)
ON CONFLICT (watch_id, source_id, dedupe_key) DO UPDATE
   SET listing_id = EXCLUDED.listing_id, price_cents = EXCLUDED.price_cents, currency = EXCLUDED.currency,
       price_type = EXCLUDED.price_type, match_strength = EXCLUDED.match_strength,
       observed_at = now()
 WHERE p.match_strength < EXCLUDED.match_strength
RETURNING p.id, (xmax = 0) AS inserted
"""

# Median unit price per day for one product; one observation per listing and day
# (the same listing seen by several watches counts once).
DAILY_SERIES = """
SELECT day, percentile_cont(0.5) WITHIN GROUP (ORDER BY unit_price)::float8, count(*)
  FROM (SELECT DISTINCT ON (p.listing_id, p.observed_on)
               p.observed_on AS day,
               p.price_cents::float8 / greatest(1, coalesce((l.attributes->>'quantity')::int, 1)) AS unit_price
          FROM price_points p JOIN listings l ON l.id = p.listing_id
         WHERE l.product_key = %(product_key)s
           AND p.price_type <> 'bid'
           AND p.observed_on > current_date - %(days)s::int
         ORDER BY p.listing_id, p.observed_on, p.match_strength DESC) AS obs
 GROUP BY day
 ORDER BY day
"""

# --- baselines ----------------------------------------------------------------

# Recompute baselines from listings seen in the window (all products, or one).
REFRESH_BASELINES = """
INSERT INTO price_baselines AS b (product_key, median_cents, p25_cents, p75_cents, mean_cents,
                                  sample_count, window_days, updated_at)
SELECT product_key,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY unit_price_cents),
       percentile_cont(0.25) WITHIN GROUP (ORDER BY unit_price_cents),
       percentile_cont(0.75) WITHIN GROUP (ORDER BY unit_price_cents),
       avg(unit_price_cents), count(*), %(days)s, now()
  FROM listings
 WHERE product_key IS NOT NULL AND unit_price_cents IS NOT NULL
   AND price_type <> 'bid'
   AND last_seen_at > now() - %(days)s * interval '1 day'
   AND (%(product_key)s::text IS NULL OR product_key = %(product_key)s)
 GROUP BY product_key
ON CONFLICT (product_key) DO UPDATE
   SET median_cents = EXCLUDED.median_cents, p25_cents = EXCLUDED.p25_cents, p75_cents = EXCLUDED.p75_cents,
       mean_cents = EXCLUDED.mean_cents, sample_count = EXCLUDED.sample_count,
       window_days = EXCLUDED.window_days, updated_at = now()
"""

BASELINE = """
SELECT median_cents, sample_count, updated_at > now() - interval '1 day' AS fresh
  FROM price_baselines WHERE product_key = %(product_key)s
"""

UPSERT_BASELINE = """
INSERT INTO price_baselines (product_key, median_cents, p25_cents, p75_cents, mean_cents, sample_count,
                             window_days)
VALUES (%(product_key)s, %(median)s, %(p25)s, %(p75)s, %(mean)s, %(samples)s, %(days)s)
ON CONFLICT (product_key) DO UPDATE
   SET median_cents = EXCLUDED.median_cents, p25_cents = EXCLUDED.p25_cents, p75_cents = EXCLUDED.p75_cents,
       mean_cents = EXCLUDED.mean_cents, sample_count = EXCLUDED.sample_count,
       window_days = EXCLUDED.window_days, updated_at = now()
"""

# --- alerts ---------------------------------------------------------------------

WATCH_FOR_SCORING = """
SELECT id, enabled, target_price_cents, deal_threshold, webhook_url FROM watches WHERE id = %(id)s
"""

# One pending alert per watch and listing (the partial unique index). A listing
# that was already notified alerts again only with re-alerts on and after the
# cooldown; %(cooldown_s)s NULL means re-alerts are off.
CREATE_ALERT = """
INSERT INTO alerts (watch_id, listing_id, price_cents, baseline_cents, score, reason)
SELECT %(watch_id)s, %(listing_id)s, %(price_cents)s, %(baseline_cents)s, %(score)s, %(reason)s
 WHERE NOT EXISTS (
        SELECT 1 FROM alerts a
         WHERE a.watch_id = %(watch_id)s AND a.listing_id = %(listing_id)s AND a.notified
           AND (%(cooldown_s)s::float8 IS NULL
                OR a.notified_at > now() - %(cooldown_s)s::float8 * interval '1 second'))
ON CONFLICT (watch_id, listing_id) WHERE NOT notified DO NOTHING
RETURNING id
"""

ALERT_FOR_DELIVERY = """
SELECT a.id, a.price_cents, a.baseline_cents, a.score, a.reason, a.notified, a.created_at,
       w.id, w.name, w.query, w.webhook_url, w.webhook_format,
       l.title, l.url, l.currency, l.condition_text, l.product_key, l.price_type
  FROM alerts a JOIN watches w ON w.id = a.watch_id JOIN listings l ON l.id = a.listing_id
 WHERE a.id = %(id)s
"""

LOCK_ALERT = "SELECT notified FROM alerts WHERE id = %(id)s FOR UPDATE"

MARK_ALERT_NOTIFIED = """
UPDATE alerts SET notified = true, notified_at = now() WHERE id = %(id)s AND NOT notified
"""

# --- the dashboard ----------------------------------------------------------

WATCHES_POLLED = """
SELECT w.id, coalesce(w.name, w.query) AS watch, s.name AS source, w.enabled, w.poll_interval_seconds,
       w.last_polled_at, w.last_polled_at + w.poll_interval_seconds * interval '1 second' AS next_poll
  FROM watches w JOIN sources s ON s.id = w.source_id
 ORDER BY w.id
"""

# Counts the tracker page shows (small tables, or indexed slices of big ones).
COUNTS = """
SELECT (SELECT count(*) FROM sources WHERE enabled)                 AS sources_enabled,
       (SELECT count(*) FROM watches WHERE enabled)                 AS watches_enabled,
       (SELECT count(*) FROM listings)                              AS listings,
       (SELECT count(*) FROM alerts WHERE NOT notified)             AS alerts_pending,
       (SELECT count(*) FROM alerts WHERE created_at > now() - interval '24 hours') AS alerts_24h
"""
