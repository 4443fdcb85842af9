"""Every SQL statement on ``page_cache`` (fetched search pages, shared by the fleet)."""

GET = """
SELECT url, body, content_type FROM page_cache
 WHERE source_id = %(source_id)s AND query = %(query)s AND page = %(page)s AND expires_at > now()
"""

PUT = """
INSERT INTO page_cache (source_id, query, page, url, body, content_type, fetched_at, expires_at)
VALUES (%(source_id)s, %(query)s, %(page)s, %(url)s, %(body)s, %(content_type)s, now(),
        now() + %(ttl_s)s * interval '1 second')
ON CONFLICT (source_id, query, page) DO UPDATE
   SET url = EXCLUDED.url, body = EXCLUDED.body, content_type = EXCLUDED.content_type,
       fetched_at = now(), expires_at = EXCLUDED.expires_at
"""

# Which of these (source id, query) pairs have a fresh first page.
FRESH = """
SELECT c.source_id, c.query
  FROM page_cache c
  JOIN unnest(%(source_ids)s::bigint[], %(queries)s::text[]) AS w(source_id, query)
    ON c.source_id = w.source_id AND c.query = w.query
 WHERE c.page = 1 AND c.expires_at > now()
"""

PRUNE = "DELETE FROM page_cache WHERE expires_at <= now()"
