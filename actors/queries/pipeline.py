"""Every SQL statement on ``watches``, ``listings``, ``price_points``,
``price_baselines`` and ``alerts``."""

# --- watches ----------------------------------------------------------------

INSERT_WATCH = """
INSERT INTO watches (name, query, source_id, target_price_cents, deal_threshold, webhook_url,
                     webhook_format, enabled, poll_interval_seconds, re_alerts)
VALUES (%(name)s, %(query)s, %(source_id)s, %(target_price_cents)s, %(deal_threshold)s, %(webhook_url)s,
        %(webhook_format)s, %(enabled)s, %(poll_interval_seconds)s, %(re_alerts)s)
RETURNING id
"""

WATCH_WITH_SOURCE = """
SELECT w.id, w.query, w.enabled, w.last_ok_at, s.id, s.name, s.search_url, s.format, s.enabled,
       s.rate_limit_per_minute, s.burst, s.daily_quota
  FROM watches w JOIN sources s ON s.id = w.source_id
 WHERE w.id = %(id)s
"""

MARK_POLLED = """
UPDATE watches
   SET last_polled_at = now(), last_ok_at = now(), last_error = NULL, failures = 0, failed_job = NULL,
       next_poll_at = NULL
 WHERE id = %(id)s
"""

# A failed poll (migration 106): the attempt and its error, and the next try after the
# watch's interval doubled once per failed poll before this one, at most %(max_backoff_s)s
# (or the interval, if longer). A scrape job's retries (%(job)s) count as one failed poll.
MARK_FAILED = """
WITH f AS (
    SELECT id, failures + CASE WHEN %(job)s::text IS NOT NULL AND failed_job = %(job)s THEN 0 ELSE 1 END AS n
      FROM watches WHERE id = %(id)s
)
UPDATE watches w
   SET last_polled_at = now(), last_error = %(error)s, failures = f.n, failed_job = %(job)s,
       next_poll_at = now() + least(w.poll_interval_seconds * power(2, least(f.n - 1, 30)),
                                    greatest(w.poll_interval_seconds, %(max_backoff_s)s)) * interval '1 second'
  FROM f
 WHERE w.id = f.id
RETURNING w.failures, w.next_poll_at
"""

# Enabled watches not polled within their interval (a failing one: not before its next
# try, MARK_FAILED), on sources that are enabled, not
# paused by the breaker (their scrapes would only be deferred) and allowed requests at
# all (a daily quota of 0), with their source's limits (each scrape carries them).
# A watch whose scrape waits for its source's token is left out: the runtime's unique
# index of live dedupe keys (jobs_dedupe_live) does not cover waiting rows yet, so the
# dedupe key alone would let a second scrape in (one scan of the queue's waiting rows).
DUE_WATCHES = """
WITH waiting AS (
    SELECT dedupe_key FROM job_queue
     WHERE queue = %(queue)s AND status = 'waiting' AND dedupe_key LIKE %(dedupe_prefix)s || '%%'
    -- storage "log" (migration 054): a scrape with its source's limits is pending in the log
    -- until a claim reserves its start, then waits in job_timers until it
    UNION ALL
    SELECT dedupe_key FROM job_timers
     WHERE queue = %(queue)s AND status = 'waiting' AND dedupe_key LIKE %(dedupe_prefix)s || '%%'
    UNION ALL
    SELECT l.dedupe_key FROM job_log_pending() l
     WHERE l.queue = %(queue)s AND l.flow_key IS NOT NULL AND l.dedupe_key LIKE %(dedupe_prefix)s || '%%'
)
SELECT w.id, w.query, s.id, s.rate_limit_per_minute, s.burst, s.daily_quota
  FROM watches w JOIN sources s ON s.id = w.source_id
 WHERE w.enabled AND s.enabled
   AND (s.paused_until IS NULL OR s.paused_until <= now())
   AND (s.daily_quota IS NULL OR s.daily_quota > 0)
   AND %(dedupe_prefix)s || w.id NOT IN (SELECT dedupe_key FROM waiting)
   AND (w.last_polled_at IS NULL
        OR w.last_polled_at < now() - coalesce(%(older_than_s)s, w.poll_interval_seconds) * interval '1 second')
   AND (w.next_poll_at IS NULL OR w.next_poll_at <= now())
 ORDER BY w.last_polled_at NULLS FIRST, w.id
 LIMIT %(limit)s
"""

# The catalog (CLI and config sync). Pending alerts: not yet notified.
WATCH_COLUMNS = """
w.id, w.name, w.query, s.name AS source, w.enabled, w.target_price_cents, w.deal_threshold,
w.webhook_url, w.poll_interval_seconds AS every_seconds, w.re_alerts, w.last_polled_at, w.last_ok_at,
w.last_error, w.failures,
coalesce(w.next_poll_at, w.last_polled_at + w.poll_interval_seconds * interval '1 second') AS next_poll_at, w.created_at,
(SELECT count(*) FROM alerts a WHERE a.watch_id = w.id AND NOT a.notified) AS pending_alerts
"""

WATCHES = f"""
SELECT {WATCH_COLUMNS} FROM watches w JOIN sources s ON s.id = w.source_id
 WHERE %(source)s::text IS NULL OR s.name = %(source)s
 ORDER BY w.id
"""

WATCH = f"SELECT {WATCH_COLUMNS} FROM watches w JOIN sources s ON s.id = w.source_id WHERE w.id = %(id)s"

WATCH_ID_BY_NAME = "SELECT id FROM watches WHERE name = %(name)s ORDER BY id LIMIT 1"

# Declared watches are keyed by name (the CLI's may have none).
UPDATE_WATCH_BY_NAME = """
UPDATE watches w
   SET query = %(query)s, source_id = %(source_id)s, target_price_cents = %(target_price_cents)s,
       deal_threshold = %(deal_threshold)s, webhook_url = %(webhook_url)s, enabled = %(enabled)s,
       poll_interval_seconds = %(poll_interval_seconds)s, re_alerts = %(re_alerts)s
 WHERE w.id = (SELECT id FROM watches WHERE name = %(name)s ORDER BY id LIMIT 1)
   AND (w.query, w.source_id, w.target_price_cents, w.deal_threshold, w.webhook_url, w.enabled,
        w.poll_interval_seconds, w.re_alerts)
       IS DISTINCT FROM (%(query)s, %(source_id)s, %(target_price_cents)s, %(deal_threshold)s::real,
                         %(webhook_url)s, %(enabled)s, %(poll_interval_seconds)s, %(re_alerts)s::boolean)
RETURNING w.id
"""

SET_WATCH_ENABLED = "UPDATE watches SET enabled = %(enabled)s WHERE id = %(id)s RETURNING id"

# NULL: follow the config's alerts.re_alerts_enabled.
SET_WATCH_RE_ALERTS = "UPDATE watches SET re_alerts = %(re_alerts)s WHERE id = %(id)s RETURNING id"

DELETE_WATCH = "DELETE FROM watches WHERE id = %(id)s RETURNING id"

DELETE_UNDECLARED_WATCHES = """
DELETE FROM watches WHERE name IS NULL OR NOT (name = ANY(%(names)s)) RETURNING coalesce(name, '#' || id)
"""

# --- listings -----------------------------------------------------------------

# Returns the listing id, whether it is new, its price before this upsert (so the
# caller can re-score a listing whose price moved), and whether it reappeared: it was
# last seen before the watch's previous poll, so that poll did not find it (a deal
# that disappears and comes back is judged again and may alert again: returned_at).
UPSERT_LISTING = """
WITH before AS (
    SELECT price_cents, last_seen_at FROM listings WHERE source_id = %(source_id)s AND external_id = %(external_id)s
)
INSERT INTO listings AS l (source_id, external_id, url, title, description, price_cents, currency,
                           price_type, condition_text, raw, listing_type, auction_ends_at)
VALUES (%(source_id)s, %(external_id)s, %(url)s, %(title)s, %(description)s, %(price_cents)s,
        %(currency)s, %(price_type)s, %(condition)s, %(raw)s, %(listing_type)s, %(auction_ends_at)s)
ON CONFLICT (source_id, external_id) DO UPDATE
   SET url = EXCLUDED.url, title = EXCLUDED.title, description = EXCLUDED.description,
       price_cents = EXCLUDED.price_cents, currency = EXCLUDED.currency, price_type = EXCLUDED.price_type,
       condition_text = EXCLUDED.condition_text, raw = EXCLUDED.raw, listing_type = EXCLUDED.listing_type,
       auction_ends_at = EXCLUDED.auction_ends_at, last_seen_at = now(),
       returned_at = CASE WHEN l.last_seen_at < %(previous_poll)s::timestamptz THEN now() ELSE l.returned_at END
RETURNING l.id, (xmax = 0) AS inserted, (SELECT price_cents FROM before),
          coalesce((SELECT last_seen_at FROM before) < %(previous_poll)s::timestamptz, false) AS reappeared
"""

LISTING_FOR_EXTRACTION = """
SELECT id, title, description, condition_text, price_cents, currency, price_type, url,
       listing_type, auction_ends_at, first_seen_at, now(), attributes, product_key, extractor
  FROM listings WHERE id = %(id)s
"""

SAVE_EXTRACTION = """
UPDATE listings
   SET attributes = %(attributes)s, product_key = %(product_key)s, unit_price_cents = %(unit_price_cents)s,
       extractor = %(extractor)s, extracted_at = now()
 WHERE id = %(id)s
"""

SAVE_SCORE = """
UPDATE listings SET score = %(score)s, time_score = %(time_score)s, composite_score = %(composite)s
 WHERE id = %(id)s
"""

# refresh_baselines re-scores every listing, one page at a time by id cursor.
RESCORE_PAGE = """
SELECT l.id, l.unit_price_cents, l.listing_type, l.auction_ends_at, l.first_seen_at, b.median_cents,
       coalesce(b.sample_count, 0), now()
  FROM listings l LEFT JOIN price_baselines b ON b.product_key = l.product_key
 WHERE l.id > %(after)s
 ORDER BY l.id
 LIMIT %(limit)s
"""

SAVE_SCORES = """
UPDATE listings l
   SET score = s.score, time_score = s.time_score, composite_score = s.composite
  FROM unnest(%(ids)s::bigint[], %(scores)s::real[], %(time_scores)s::smallint[], %(composites)s::real[])
       AS s(id, score, time_score, composite)
 WHERE l.id = s.id
"""

# Re-extraction: the listings to read again (one watch's, or all; only those whose
# extraction was incomplete, migration 103), each with the watch that found it (the
# latest price point), so a new deal can alert.
LISTINGS_TO_REEXTRACT = """
SELECT DISTINCT ON (l.id) l.id, p.watch_id
  FROM listings l LEFT JOIN price_points p ON p.listing_id = l.id
 WHERE (%(watch_id)s::bigint IS NULL OR p.watch_id = %(watch_id)s)
   AND (NOT %(incomplete)s OR listing_extraction_incomplete(l.product_key, l.attributes, l.extracted_at))
 ORDER BY l.id, p.observed_at DESC NULLS LAST
"""

ACTIVE_PRODUCT_KEYS = """
SELECT DISTINCT product_key FROM listings
 WHERE product_key IS NOT NULL AND last_seen_at > now() - %(days)s * interval '1 day'
 ORDER BY product_key
"""

# Past observations of a product (the demo's seed history): a listing seen on
# that day, extracted already, and its price point for a watch.
SEED_OBSERVATION = """
WITH l AS (
    INSERT INTO listings (source_id, external_id, title, price_cents, product_key, unit_price_cents,
                          attributes, extractor, extracted_at, first_seen_at, last_seen_at)
    VALUES (%(source_id)s, %(external_id)s, %(title)s, %(price_cents)s, %(product_key)s, %(price_cents)s,
            '{}', 'history', now(), %(day)s::date + time '12:00', %(day)s::date + time '12:00')
    ON CONFLICT (source_id, external_id) DO NOTHING
    RETURNING id
)
INSERT INTO price_points (watch_id, source_id, listing_id, dedupe_key, price_cents, currency, price_type,
                          observed_on, match_strength)
SELECT %(watch_id)s, %(source_id)s, l.id, %(external_id)s, %(price_cents)s, 'USD', 'ask', %(day)s, 1 FROM l
"""

# --- price points ---------------------------------------------------------------

# One observation per dedupe key, watch, source and day (migration 102): the same
# offer seen again that day updates the row (the day's last price), a weaker match
# never replaces a stronger one. Returns the row only when it was inserted or changed.
UPSERT_PRICE_POINT = """
INSERT INTO price_points AS p (watch_id, source_id, listing_id, dedupe_key, price_cents, currency,
                               price_type, observed_on, match_strength)
VALUES (%(watch_id)s, %(source_id)s, %(listing_id)s, %(dedupe_key)s, %(price_cents)s, %(currency)s,
        %(price_type)s, %(observed_on)s, %(match_strength)s)
ON CONFLICT (watch_id, source_id, dedupe_key, observed_on) DO UPDATE
   SET listing_id = EXCLUDED.listing_id, price_cents = EXCLUDED.price_cents, currency = EXCLUDED.currency,
       price_type = EXCLUDED.price_type, match_strength = EXCLUDED.match_strength,
       observed_at = now()
 WHERE p.match_strength < EXCLUDED.match_strength
    OR (p.match_strength = EXCLUDED.match_strength
        AND (p.price_cents, p.currency, p.price_type) IS DISTINCT FROM
            (EXCLUDED.price_cents, EXCLUDED.currency, EXCLUDED.price_type))
RETURNING p.id, (xmax = 0) AS inserted
"""

# Median unit price per day for one product; one observation per listing and day
# (the same listing seen by several watches counts once; of several prices that day,
# the best match's latest).
DAILY_SERIES = """
SELECT day, percentile_cont(0.5) WITHIN GROUP (ORDER BY unit_price)::float8, count(*)
  FROM (SELECT DISTINCT ON (p.listing_id, p.observed_on)
               p.observed_on AS day,
               p.price_cents::float8 / greatest(1, coalesce((l.attributes->>'quantity')::int, 1)) AS unit_price
          FROM price_points p JOIN listings l ON l.id = p.listing_id
         WHERE l.product_key = %(product_key)s
           AND p.price_type <> 'bid'
           AND p.observed_on > current_date - %(days)s::int
         ORDER BY p.listing_id, p.observed_on, p.match_strength DESC, p.observed_at DESC) AS obs
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

# One pending alert per watch and listing, always (the partial unique index). With
# re-alerts off (the default: the watch's own `re_alerts`, else %(re_alerts)s from the
# config), a listing notified before alerts again only when its price is under the one
# last notified, or it came back (returned_at) after that notification: an auction's
# rising bid under the target is judged on every poll but alerts once. With re-alerts on,
# a listing notified within the cooldown does not alert again. A re-extraction
# (%(reextract)s) never alerts a listing that was notified before: reading it again is
# no news.
CREATE_ALERT = """
INSERT INTO alerts (watch_id, listing_id, price_cents, baseline_cents, score, reason)
SELECT w.id, %(listing_id)s, %(price_cents)s, %(baseline_cents)s, %(score)s, %(reason)s
  FROM watches w
  LEFT JOIN LATERAL (
        SELECT a.id, a.price_cents, a.notified_at FROM alerts a
         WHERE a.watch_id = w.id AND a.listing_id = %(listing_id)s AND a.notified
         ORDER BY a.notified_at DESC NULLS LAST, a.id DESC LIMIT 1) last ON true
 WHERE w.id = %(watch_id)s
   AND CASE WHEN coalesce(w.re_alerts, %(re_alerts)s::boolean)
            THEN last.id IS NULL
                 OR last.notified_at <= now() - %(cooldown_s)s::float8 * interval '1 second'
            ELSE last.id IS NULL
                 OR %(price_cents)s < last.price_cents
                 OR (SELECT l.returned_at FROM listings l WHERE l.id = %(listing_id)s) > last.notified_at
       END
   AND (NOT %(reextract)s::boolean OR last.id IS NULL)
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

# Alerts with their delivery state from the ledger (notification_attempts).
ALERTS = """
SELECT a.id, a.watch_id, w.query, l.title, a.price_cents, a.reason, a.created_at, a.notified, a.notified_at,
       att.attempts, att.last_status,
       CASE WHEN a.notified THEN 'delivered'
            WHEN w.webhook_url IS NULL THEN 'no webhook'
            ELSE coalesce(att.last_status, 'pending') END AS delivery
  FROM alerts a
  JOIN watches w ON w.id = a.watch_id
  JOIN listings l ON l.id = a.listing_id
  LEFT JOIN LATERAL (
        SELECT count(*) AS attempts,
               (array_agg(n.status ORDER BY n.id DESC))[1] AS last_status
          FROM notification_attempts n WHERE n.alert_id = a.id) att ON true
 WHERE (%(watch_id)s::bigint IS NULL OR a.watch_id = %(watch_id)s)
   AND (NOT %(pending)s OR NOT a.notified)
 ORDER BY a.id DESC
 LIMIT %(limit)s
"""

# --- the dashboard ----------------------------------------------------------

WATCHES_POLLED = """
SELECT w.id, coalesce(w.name, w.query) AS watch, s.name AS source, w.enabled, w.poll_interval_seconds,
       w.last_polled_at, w.last_error,
       coalesce(w.next_poll_at, w.last_polled_at + w.poll_interval_seconds * interval '1 second') AS next_poll
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
