"""One log line per finished job: id, actor, queue, role, pid, duration, outcome,
and the fields the actor added with ``supervisor.log_fields()``.

With ``log_json`` every field is a key of the JSON line (``pid`` is on every
line already, see ``supervisor.logs``),
so a log pipeline can count outcomes and durations without parsing text.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, ClassVar

from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Middleware, Retries

from ..broker import jobfields
from ..broker.order import Before, Placement

log = logging.getLogger("supervisor.jobs")


class JobLog(Middleware):
    """One line per finished job, with the outcome Retries chose."""

    placement: ClassVar[Placement] = Before(
        Retries, "its after hooks must run after Retries', which chooses the outcome it logs")

    def __init__(self, role: str) -> None:
        self.role = role
        self.pid = os.getpid()
        self._started = threading.local()  # a message is processed on one worker thread
        jobfields.collecting = True  # supervisor.log_fields() keeps what actors add from now on

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._started.at = time.monotonic()

    def after_process_message(self, broker: Broker, message: MessageProxy, *, result: Any = None,
                              exception: BaseException | None = None) -> None:
        outcome = "succeeded" if exception is None else "failed" if message.failed else "retried"
        self._line(message, outcome, exception)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._line(message, "failed" if message.failed else "skipped", None)

    def _line(self, message: MessageProxy, outcome: str, exception: BaseException | None) -> None:
        started = getattr(self._started, "at", None)
        duration_ms = round((time.monotonic() - started) * 1000, 1) if started is not None else None
        self._started.at = None
        fields = {
            "job_id": message.message_id, "actor": message.actor_name, "queue": message.queue_name,
            "role": self.role, "duration_ms": duration_ms, "outcome": outcome,
        }
        if exception is not None:
            fields["error"] = f"{type(exception).__name__}: {exception}"
        added = jobfields.take(message.message_id)
        fields.update(added)
        log.info(
            "job %s %s queue=%s role=%s pid=%d %sms %s%s%s", message.message_id, message.actor_name,
            message.queue_name, self.role, self.pid, duration_ms, outcome,
            "".join(f" {k}={v}" for k, v in added.items()),
            f" ({fields['error']})" if exception is not None else "", extra=fields,
        )
