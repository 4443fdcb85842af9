"""Every SQL statement on ``notification_attempts`` (the webhook ledger)."""

ATTEMPTS = """
SELECT id, status, job_id, job_attempt FROM notification_attempts WHERE alert_id = %(alert_id)s ORDER BY id
"""

MARK_UNKNOWN = """
UPDATE notification_attempts
   SET status = 'unknown', finished_at = now(), error_text = %(why)s
 WHERE id = ANY(%(ids)s) AND status = 'in_flight'
"""

BEGIN = """
INSERT INTO notification_attempts (alert_id, job_id, job_attempt, target)
VALUES (%(alert_id)s, %(job_id)s, %(job_attempt)s, %(target)s)
RETURNING id
"""

# Closing an attempt another run has meanwhile declared 'unknown' is fine: the
# real outcome replaces the guess.
FINISH = """
UPDATE notification_attempts
   SET status = %(status)s, http_status = %(http_status)s, error_text = %(error)s,
       duration_ms = %(duration_ms)s, finished_at = now()
 WHERE id = %(id)s AND status IN ('in_flight', 'unknown')
RETURNING alert_id
"""

RECORD_UNSENT = """
INSERT INTO notification_attempts (alert_id, job_id, job_attempt, target, status, error_text, duration_ms,
                                   finished_at)
VALUES (%(alert_id)s, %(job_id)s, %(job_attempt)s, %(target)s, 'failed', %(error)s, %(duration_ms)s, now())
"""

# The dashboard: recent alerts with the state of their latest delivery attempt.
RECENT_ALERTS = """
SELECT a.id, w.name AS watch, a.price_cents, a.reason, a.created_at, a.notified,
       n.status AS delivery, n.http_status, n.finished_at, n.attempts
  FROM alerts a
  JOIN watches w ON w.id = a.watch_id
  LEFT JOIN LATERAL (
      SELECT status, http_status, finished_at, count(*) OVER () AS attempts
        FROM notification_attempts WHERE alert_id = a.id ORDER BY started_at DESC LIMIT 1) AS n ON true
 ORDER BY a.created_at DESC
 LIMIT %(limit)s
"""
