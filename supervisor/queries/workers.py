"""Every SQL statement on ``workers`` (the process registry)."""

REGISTER = """
INSERT INTO workers (id, host, pid, role, queues, state)
VALUES (%(id)s, %(host)s, %(pid)s, %(role)s, %(queues)s, 'running')
ON CONFLICT (id) DO UPDATE SET state = 'running', heartbeat_at = now(), stopped_at = NULL
"""

BEAT = """
UPDATE workers
   SET heartbeat_at = now(), state = %(state)s, rss_bytes = %(rss)s, cpu_percent = %(cpu)s,
       jobs_in_flight = %(in_flight)s, jobs_done = %(done)s
 WHERE id = %(id)s
"""

STOPPED = """
UPDATE workers SET state = %(state)s, stopped_at = now(), jobs_in_flight = 0 WHERE id = %(id)s
"""

# Rows of processes that stopped (or vanished) long ago.
PRUNE = """
DELETE FROM workers
 WHERE heartbeat_at < now() - %(older_than_s)s * interval '1 second'
"""

LIST = """
SELECT id, host, pid, role, queues, state, started_at, heartbeat_at, stopped_at,
       rss_bytes, cpu_percent, jobs_in_flight, jobs_done
  FROM workers
 WHERE stopped_at IS NULL OR stopped_at > now() - interval '1 hour'
 ORDER BY host, role, started_at
"""
