"""Job metrics under Dramatiq's own Prometheus names and labels, so dashboards made
for Dramatiq work unchanged.

Written through prometheus_client's multiprocess mode: each worker process writes
its own memory-mapped files in ``$PROMETHEUS_MULTIPROC_DIR`` (set by the master
before it forks), and the HTTP child sums them at scrape time. Recording is a
write into a mapped file: no lock shared with other processes, no round trip, and
a scrape never waits on a worker. Installed only when that directory is set.

The same files carry ``actor_supervisor_thread_errors_total{thread}``, written by
the broker's background-thread policy (``broker/threads.py``: the broker never
imports this package).
"""

from __future__ import annotations

import os
import time
from typing import Any

from dramatiq.middleware import Middleware

from ..defaults import METRICS_DIR_ENV

# Dramatiq's buckets (milliseconds).
DURATION_BUCKETS = (5, 10, 25, 50, 75, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000, 30000, 60000,
                    600000, 900000, float("inf"))
LABELS = ("queue_name", "actor_name")


def enabled() -> bool:
    return bool(os.environ.get(METRICS_DIR_ENV))


class JobMetrics(Middleware):
    def __init__(self) -> None:
        # Imported here: prometheus_client picks its value class from the environment
        # at import time, and the directory is only known once the process runs.
        import prometheus_client as prom

        registry = prom.CollectorRegistry()  # private: only the files matter
        self.messages = prom.Counter("dramatiq_messages_total", "The total number of messages processed.",
                                     LABELS, registry=registry)
        self.errors = prom.Counter("dramatiq_message_errors_total", "The total number of errored messages.",
                                   LABELS, registry=registry)
        self.retries = prom.Counter("dramatiq_message_retries_total", "The total number of retried messages.",
                                    LABELS, registry=registry)
        self.rejects = prom.Counter("dramatiq_message_rejects_total", "The total number of dead-lettered messages.",
                                    LABELS, registry=registry)
        self.in_progress = prom.Gauge("dramatiq_messages_inprogress", "The number of messages in progress.",
                                      LABELS, registry=registry, multiprocess_mode="livesum")
        self.durations = prom.Histogram("dramatiq_message_duration_milliseconds",
                                        "The time spent processing messages.", LABELS,
                                        buckets=DURATION_BUCKETS, registry=registry)
        self._started: dict[str, float] = {}
        # Per (queue, actor): the labelled children, looked up once (labels() takes a lock).
        self._children: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}

    def _for(self, message: Any) -> tuple[Any, Any, Any, Any]:
        key = (message.queue_name, message.actor_name)
        children = self._children.get(key)
        if children is None:
            children = (self.messages.labels(*key), self.errors.labels(*key), self.in_progress.labels(*key),
                        self.durations.labels(*key))
            self._children[key] = children
        return children

    def after_nack(self, broker: Any, message: Any) -> None:
        self.rejects.labels(message.queue_name, message.actor_name).inc()

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        if "retries" in message.options:
            self.retries.labels(message.queue_name, message.actor_name).inc()

    def before_process_message(self, broker: Any, message: Any) -> None:
        self._for(message)[2].inc()
        self._started[message.message_id] = time.monotonic()

    def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        messages, errors, in_progress, durations = self._for(message)
        started = self._started.pop(message.message_id, None)
        if started is not None:
            durations.observe((time.monotonic() - started) * 1000)
            in_progress.dec()
        messages.inc()
        if exception is not None:
            errors.inc()

    after_skip_message = after_process_message
