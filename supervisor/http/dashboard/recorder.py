"""The HTTP child's recorder: history for the charts, and the "something changed" signal.

One thread. It keeps a LISTEN connection on the jobs channel (enqueues, retries and
resumes NOTIFY it) and every ``SAMPLE_SECONDS`` writes one row per live process and
per queue into ``process_samples`` / ``queue_samples`` (023_dashboard_samples.sql),
pruning rows past ``KEEP_HOURS``. Each NOTIFY or sample bumps ``version``; the
server-sent event streams watch it and tell the open pages to refresh (debounced
there). Finishing jobs sends no NOTIFY (that would cost every ack a global lock),
so completions reach the pages with the next sample.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg

from ... import backoff, db
from ...broker.consuming.listener import CHANNEL

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 10
KEEP_HOURS = 25
PRUNE_BATCH = 5000

# The period is the key, so two HTTP children sampling the same period write it once.
SAMPLE_PROCESSES = """
INSERT INTO process_samples (at, worker_id, role, host, rss_bytes, cpu_percent, jobs_in_flight)
SELECT date_bin(%(step_s)s * interval '1 second', now(), timestamptz 'epoch'), id, role, host,
       rss_bytes, cpu_percent, jobs_in_flight
  FROM workers
 WHERE stopped_at IS NULL AND heartbeat_at > now() - interval '1 minute'
ON CONFLICT DO NOTHING
"""

# Live rows now (a row waiting for its limit key as a pending one), plus the jobs that
# finished in the period before last.
SAMPLE_QUEUES = """
WITH p AS (SELECT date_bin(%(step_s)s * interval '1 second', now(), timestamptz 'epoch') AS at),
live AS (
    SELECT queue,
           count(*) FILTER (WHERE status IN ('pending', 'waiting') AND run_at <= now())   AS ready,
           count(*) FILTER (WHERE status IN ('pending', 'retryable', 'waiting') AND run_at > now()) AS scheduled,
           count(*) FILTER (WHERE status = 'running')                                    AS running,
           count(*) FILTER (WHERE status = 'retryable' AND run_at <= now())              AS retryable
      FROM jobs_live GROUP BY queue
), done AS (
    SELECT queue, count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'failed') AS failed
      FROM jobs_finished, p
     WHERE finished_at >= p.at - 2 * %(step_s)s * interval '1 second'
       AND finished_at < p.at - %(step_s)s * interval '1 second'
     GROUP BY queue
)
INSERT INTO queue_samples (at, queue, ready, scheduled, running, retryable, succeeded, failed)
SELECT p.at, queue, coalesce(ready, 0), coalesce(scheduled, 0), coalesce(running, 0), coalesce(retryable, 0),
       coalesce(succeeded, 0), coalesce(failed, 0)
  FROM live FULL JOIN done USING (queue) CROSS JOIN p
ON CONFLICT DO NOTHING
"""

PRUNE = [
    f"""DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM {table}
         WHERE at < now() - %(keep_h)s * interval '1 hour' LIMIT {PRUNE_BATCH})"""
    for table in ("process_samples", "queue_samples")
]

# Charts: one point per process or queue and bucket over the last window.
PROCESS_SERIES = """
SELECT worker_id, date_bin(%(step_s)s * interval '1 second', at, timestamptz 'epoch') AS t,
       max(rss_bytes) AS rss_bytes, max(cpu_percent) AS cpu_percent
  FROM process_samples
 WHERE at > now() - %(window_s)s * interval '1 second'
 GROUP BY 1, 2 ORDER BY 1, 2
"""

QUEUE_SERIES = """
SELECT date_bin(%(step_s)s * interval '1 second', at, timestamptz 'epoch') AS t,
       max(ready + retryable) AS waiting, max(running) AS running, max(scheduled) AS scheduled
  FROM (SELECT at, sum(ready) AS ready, sum(retryable) AS retryable, sum(running) AS running,
               sum(scheduled) AS scheduled
          FROM queue_samples WHERE at > now() - %(window_s)s * interval '1 second' GROUP BY at) AS s
 GROUP BY 1 ORDER BY 1
"""


# Jobs finished per bucket (from the rollup; shifted one period, see SAMPLE_QUEUES).
FINISHED_SERIES = """
SELECT date_bin(%(step_s)s * interval '1 second', at, timestamptz 'epoch') AS t,
       sum(succeeded) AS succeeded, sum(failed) AS failed
  FROM queue_samples
 WHERE at > now() - %(window_s)s * interval '1 second' AND (succeeded > 0 OR failed > 0)
 GROUP BY 1 ORDER BY 1
"""

# Per queue: finished and failed over the last 6 h and 24 h.
OUTCOMES_BY_QUEUE = """
SELECT queue,
       sum(succeeded + failed) FILTER (WHERE at > now() - interval '6 hours') AS finished_6h,
       sum(failed) FILTER (WHERE at > now() - interval '6 hours')             AS failed_6h,
       sum(succeeded + failed)                                                AS finished_24h,
       sum(failed)                                                            AS failed_24h
  FROM queue_samples
 WHERE at > now() - interval '24 hours'
 GROUP BY queue
"""


def sample(conn: psycopg.Connection) -> None:
    """Write this period's rows and prune old ones (each statement small)."""
    conn.execute(SAMPLE_PROCESSES, {"step_s": SAMPLE_SECONDS})
    conn.execute(SAMPLE_QUEUES, {"step_s": SAMPLE_SECONDS})
    for statement in PRUNE:
        conn.execute(statement, {"keep_h": KEEP_HOURS})


class Recorder(threading.Thread):
    def __init__(self, url: str, *, listen: bool = True) -> None:
        super().__init__(name="dashboard-recorder", daemon=True)
        self.url = url
        # False: a pooled URL with no direct one; pages then update on samples only.
        self.listen = listen
        self.version = 0  # bumped on every NOTIFY and every sample
        self._halt = threading.Event()
        self._sample_failing = False  # log the first failure of a run, not every period

    def stop(self) -> None:
        self._halt.set()

    def bump(self) -> None:
        self.version += 1  # one writer (this thread, or an action's handler); readers only compare

    def run(self) -> None:
        for delay in backoff.delays(first=0.5, cap=30.0):
            if self._halt.is_set():
                return
            try:
                self._listen_and_sample()
            except psycopg.Error as exc:
                log.warning("dashboard recorder lost %s (%s); again in %.1fs", db.redact(self.url), exc, delay)
            self._halt.wait(delay)

    def _sample(self, conn: psycopg.Connection) -> None:
        """A failed write (a read-only replica, a timeout) costs this period's rows,
        never the change signal: the LISTEN goes on."""
        try:
            sample(conn)
        except psycopg.OperationalError:
            raise  # the connection is gone: reconnect
        except psycopg.Error as exc:
            if not self._sample_failing:
                log.warning("dashboard recorder cannot write samples: %s", exc)
            self._sample_failing = True
        else:
            self._sample_failing = False

    def _listen_and_sample(self) -> None:
        kwargs = db.session_kwargs(self.url)
        if not db.is_pooled(self.url):  # a pooler refuses startup options
            kwargs["options"] = "-c statement_timeout=5000"
        with psycopg.connect(self.url, **kwargs) as conn:
            if self.listen:
                conn.execute(f"LISTEN {CHANNEL}")
            next_sample = 0.0
            while not self._halt.is_set():
                now = time.monotonic()
                if now >= next_sample:
                    self._sample(conn)
                    self.bump()
                    next_sample = now + SAMPLE_SECONDS
                for _ in conn.notifies(timeout=min(1.0, max(0.05, next_sample - now)), stop_after=1):
                    self.bump()
